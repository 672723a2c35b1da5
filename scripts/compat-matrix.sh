#!/usr/bin/env bash
# Run the plugin-level subset (`-m compat`, tests/conftest.py) on torch releases one after another, each in its
# own venv (PyPI's default CUDA build, running on the CPU), and print one line per release.
#
#   bash scripts/compat-matrix.sh                 the declared releases CI does not run (2.8-2.12, 2.14)
#   bash scripts/compat-matrix.sh 2.10.0 2.14.1   these releases
#   KEEP_VENVS=1 bash scripts/compat-matrix.sh    keep the venvs this run makes (5-6 GB each); by default
#                                                 each is removed after its run (venvs that existed stay)
#
# CI (`.ci/run`) runs the full suite on 2.13.0 and this subset on the oldest and newest declared release;
# this script covers the rest before a release (about 7 minutes per torch on 2 cores: 1-2 to install, 5-6 to
# test). The cross-version test restores with the default venv's interpreter (torch 2.13.0), which
# `bash scripts/setup.sh test` makes. Logs: .compat-matrix/<release>.log. Exit status 1 if any release failed.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -gt 0 ]; then
  releases=("$@")
else
  # The newest patch of each declared minor that .ci/run does not test (pyproject.toml: torch>=2.7,<2.16).
  releases=(2.8.0 2.9.1 2.10.0 2.11.0 2.12.1 2.14.1)
fi
bash scripts/setup.sh test
other="$PWD/.venv/bin/python"
mkdir -p .compat-matrix
failed=0
for release in "${releases[@]}"; do
  log=".compat-matrix/$release.log"
  venv=$(TORCH=$release bash scripts/setup.sh --print-venv)
  made=""
  [ -e "$venv" ] || made=1
  started=$SECONDS
  if COMPILECACHE_OTHER_PYTHON="$other" bash scripts/test.sh --torch "$release" -m compat -n 2 > "$log" 2>&1; then
    status=passed
  else
    status=FAILED
    failed=1
  fi
  summary=$(grep -E "^=+ .*(passed|failed|error).* in [0-9.]+s" "$log" | tail -1 | tr -d '=' | sed 's/^ *//; s/ *$//')
  echo "torch $release: $status ($((SECONDS - started)) s) ${summary:-see $log}"
  if [ -n "$made" ] && [ -z "${KEEP_VENVS:-}" ]; then
    rm -rf "$venv"
  fi
done
exit $failed
