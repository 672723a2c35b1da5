#!/usr/bin/env bash
# Set up a venv for pytest-compilecache: torch, the plugin (editable) and optional extras.
# Usage: bash scripts/setup.sh [EXTRAS]              -> .venv, torch 2.13.0, the CPU build
#        TORCH=2.15.0 bash scripts/setup.sh [EXTRAS]   -> .venv-torch-2.15.0, torch 2.15.0 (CPU build)
#        TORCH_INDEX=pypi bash scripts/setup.sh        -> torch from pip's configured index instead (PyPI's
#                                                         default build: CUDA on Linux, with nvidia-* and triton)
#        TORCH_INDEX=https://download.pytorch.org/whl/cu126 bash scripts/setup.sh   -> another build
#        bash scripts/setup.sh --print-venv            -> prints the venv's path for $TORCH, changes nothing
#        VENV=DIR bash scripts/setup.sh --no-project   -> torch only, without this checkout (the package check)
# The CPU build comes from PyTorch's CPU index. Where that index cannot be reached within a few seconds (a
# machine with only a PyPI mirror), torch comes from pip's configured index; either way the script says
# which build it installed. Idempotent and quiet: a venv whose stamp matches (torch version, index, extras,
# pyproject.toml) is left alone.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
DEFAULT_TORCH=2.13.0
CPU_INDEX=https://download.pytorch.org/whl/cpu
TORCH=${TORCH:-$DEFAULT_TORCH}
TORCH_INDEX=${TORCH_INDEX:-$CPU_INDEX}
PROBE_SECONDS=${PROBE_SECONDS:-5}  # how long the index may take to answer before pip's own index is used
EXTRAS=${1:-}
if [ "$TORCH" = "$DEFAULT_TORCH" ]; then
  VENV=${VENV:-.venv}
else
  VENV=${VENV:-.venv-torch-$TORCH}
fi
case "$TORCH" in
  *[!0-9.]* | "") echo "setup.sh: TORCH must be an exact release like 2.15.0, got '$TORCH'" >&2; exit 2 ;;
esac
case "$TORCH_INDEX" in
  pypi | http://* | https://* | file://*) ;;
  *) echo "setup.sh: TORCH_INDEX must be 'pypi' or an index URL, got '$TORCH_INDEX'" >&2; exit 2 ;;
esac
if [ "$EXTRAS" = --print-venv ]; then
  echo "$VENV"
  exit 0
fi

stamp="$VENV/.compilecache-setup"
want="torch=$TORCH index=$TORCH_INDEX extras=$EXTRAS pyproject=$(cksum < pyproject.toml)"
if [ -x "$VENV/bin/python" ] && [ -f "$stamp" ]; then
  have=$(cat "$stamp")
  [ "$have" = "$want" ] && exit 0
  # No extras asked for (scripts/demo.sh): a venv set up with extras for the same torch and pyproject.toml
  # has everything, so demo.sh and test.sh do not reinstall the project in turn.
  if [ -z "$EXTRAS" ] && [ "${have/ extras=* pyproject=/ extras= pyproject=}" = "$want" ] && [[ $have != *extras=--no-project* ]]; then
    exit 0
  fi
fi

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
rm -f "$stamp"
PY="$VENV/bin/python"
pip_install() { "$PY" -m pip --disable-pip-version-check -q install "$@" 2> >(grep -v "^WARNING: Location" >&2); }

# Pin torch exactly: the package itself declares a range, the venv tests one release. Not through pip's
# cache: a second copy of the wheels (~3 GB for a CUDA build) is what fills a CI runner's disk.
source="pip's configured index"
if [ "$TORCH_INDEX" != pypi ]; then
  # One bounded request first: pip would retry an unreachable index for minutes.
  if timeout "$((PROBE_SECONDS + 1))" "$PY" -c 'import sys, urllib.request
urllib.request.urlopen(sys.argv[1].rstrip("/") + "/torch/", timeout=float(sys.argv[2])).close()' \
    "$TORCH_INDEX" "$PROBE_SECONDS" 2>/dev/null; then
    source=$TORCH_INDEX
  else
    echo "setup.sh: $TORCH_INDEX did not answer within ${PROBE_SECONDS} s: torch comes from pip's configured index" >&2
  fi
fi
if [ "$source" = "$TORCH_INDEX" ]; then
  pip_install --no-cache-dir --index-url "$TORCH_INDEX" "torch==$TORCH"
else
  pip_install --no-cache-dir "torch==$TORCH"
fi
pip_install numpy
# pip's editable build writes pytest_compilecache.egg-info into the checkout: where set-ups run at once (.ci/run
# installs the other torch releases while the main venv is made), one writes it at a time (flock, where it exists).
if [ "$EXTRAS" = --no-project ]; then
  :
else
  {
    if command -v flock >/dev/null 2>&1; then flock 9; fi
    pip_install -e ".${EXTRAS:+[$EXTRAS]}"
  } 9<pyproject.toml
fi
# Which build: a local version label (+cpu, +cu126) names it; PyPI's Linux default carries nvidia-* packages.
"$PY" - "$source" <<'PYEOF'
import importlib.metadata as metadata, sys
version = metadata.version("torch")
if "+" in version:
    build = "CPU" if version.endswith("+cpu") else version.split("+", 1)[1].upper()
elif any((dist.metadata["Name"] or "").lower().startswith("nvidia-") for dist in metadata.distributions()):
    build = "CUDA"
else:
    build = "default"
print(f"setup.sh: torch {version} ({build} build) from {sys.argv[1]}")
PYEOF
echo "$want" > "$stamp"
