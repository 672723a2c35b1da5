#!/usr/bin/env bash
# Run the test suite on a fresh machine: installs the venv (torch, test extras), the tools the tests drive
# (redis-server, shellcheck, actionlint), then runs pytest. Extra arguments go to pytest
# (e.g. `bash scripts/test.sh -m "not slow and not integration" -n 2` for the fast subset).
#
#   bash scripts/test.sh [pytest args]                   torch 2.13.0 (CPU wheel) in .venv; lint first
#   bash scripts/test.sh --torch 2.15.0 [pytest args]    torch 2.15.0 from PyPI (CUDA build) in .venv-torch-2.15.0
#
# `-m compat` is the plugin-level subset (tests/conftest.py) that CI also runs on the oldest and newest torch.
set -euo pipefail
cd "$(dirname "$0")/.."
torch_version=""
case "${1:-}" in
  --torch) torch_version=${2:?"--torch needs a version, e.g. --torch 2.15.0"}; shift 2 ;;
  --torch=*) torch_version=${1#--torch=}; shift ;;
esac
if [ -n "$torch_version" ]; then export TORCH=$torch_version; else unset TORCH; fi
bash scripts/setup.sh test
bash scripts/install-tools.sh
venv=$(bash scripts/setup.sh --print-venv)
# Lint hook: ruff and mypy --strict run once, with the default torch (they do not depend on its version).
if [ "$venv" = .venv ] && [ -f scripts/lint.sh ]; then
  bash scripts/lint.sh
fi
# Bytecode for our own code, once: with PYTHONDONTWRITEBYTECODE set (as in many CI images) every process the
# suite starts (about 150 inner sessions, workers and Action steps) would otherwise compile it from source.
"$venv/bin/python" -m compileall -q pytest_compilecache action tests bench > /dev/null
exec "$venv/bin/python" -m pytest "$@"
