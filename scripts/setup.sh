#!/usr/bin/env bash
# Set up a venv for pytest-compilecache: torch, the plugin (editable) and optional extras.
# Usage: bash scripts/setup.sh [EXTRAS]            -> .venv, torch 2.13.0 (the CPU wheel where one is provided)
#        TORCH=2.15.0 bash scripts/setup.sh [EXTRAS] -> .venv-torch-2.15.0, torch 2.15.0 from PyPI (default
#                                                     CUDA build: brings the nvidia packages and triton)
#        bash scripts/setup.sh --print-venv          -> prints the venv's path for $TORCH, changes nothing
# Idempotent and quiet: a venv whose stamp matches (torch version, extras, pyproject.toml) is left alone.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
DEFAULT_TORCH=2.13.0
TORCH=${TORCH:-$DEFAULT_TORCH}
EXTRAS=${1:-}
if [ "$TORCH" = "$DEFAULT_TORCH" ]; then
  VENV=${VENV:-.venv}
else
  VENV=${VENV:-.venv-torch-$TORCH}
fi
case "$TORCH" in
  *[!0-9.]* | "") echo "setup.sh: TORCH must be an exact release like 2.15.0, got '$TORCH'" >&2; exit 2 ;;
esac
if [ "$EXTRAS" = --print-venv ]; then
  echo "$VENV"
  exit 0
fi

stamp="$VENV/.compilecache-setup"
want="torch=$TORCH extras=$EXTRAS pyproject=$(cksum < pyproject.toml)"
if [ -x "$VENV/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
rm -f "$stamp"
PIP="$VENV/bin/python -m pip --disable-pip-version-check -q"
# Pin torch exactly: the package itself declares a range, the venv tests one release.
if [ "$TORCH" = "$DEFAULT_TORCH" ]; then
  # An unpinned build downloads a multi-GB CUDA build; the local CPU wheel (find-links) is preferred where present.
  $PIP install "torch==$TORCH" numpy 2> >(grep -v "^WARNING: Location" >&2)
else
  # The default PyPI build (CUDA), as most users install it: pip brings triton and the nvidia packages.
  # Not through pip's cache: a second copy of ~3 GB of wheels per release is what fills a CI runner's disk.
  $PIP install --no-cache-dir "torch==$TORCH" numpy 2> >(grep -v "^WARNING: Location" >&2)
fi
if [ -n "$EXTRAS" ]; then
  $PIP install -e ".[$EXTRAS]" 2> >(grep -v "^WARNING: Location" >&2)
else
  $PIP install -e . 2> >(grep -v "^WARNING: Location" >&2)
fi
echo "$want" > "$stamp"
