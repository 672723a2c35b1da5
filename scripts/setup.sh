#!/usr/bin/env bash
# Set up a fresh machine for pytest-compilecache: a venv with the CPU build of torch and the plugin.
# Usage: source-free; other scripts call it. Idempotent and quiet when everything is there.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
EXTRAS=${1:-}

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
PIP="$VENV/bin/python -m pip --disable-pip-version-check -q"
# Pin torch: an unpinned torch downloads a multi-GB CUDA build; the package itself declares a range.
$PIP install "torch==2.13.0" numpy 2> >(grep -v "^WARNING: Location" >&2)
if [ -n "$EXTRAS" ]; then
  $PIP install -e ".[$EXTRAS]" 2> >(grep -v "^WARNING: Location" >&2)
else
  $PIP install -e . 2> >(grep -v "^WARNING: Location" >&2)
fi
