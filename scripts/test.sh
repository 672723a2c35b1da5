#!/usr/bin/env bash
# Run the test suite on a fresh machine: installs the venv (torch 2.13.0 CPU, test extras), the
# redis-server the integration tests start, then runs pytest. Extra arguments go to pytest
# (e.g. `bash scripts/test.sh -m "not slow"` for the fast subset).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
if ! command -v redis-server >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" = "0" ] || SUDO="sudo"
  $SUDO apt-get install -y -q redis-server >/dev/null 2>&1 || { $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q redis-server >/dev/null; }
fi
if [ -f scripts/install-linters.sh ]; then bash scripts/install-linters.sh; fi
exec .venv/bin/python -m pytest "$@"
