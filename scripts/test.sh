#!/usr/bin/env bash
# Run the test suite on a fresh machine: installs the venv (torch 2.13.0 CPU, test extras), the
# redis-server the integration tests start, then runs pytest. Extra arguments go to pytest
# (e.g. `bash scripts/test.sh -m "not slow"` for the fast subset).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
bash scripts/install-tools.sh
exec .venv/bin/python -m pytest "$@"
