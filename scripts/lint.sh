#!/usr/bin/env bash
# Lint, format and type checks, as CI runs them (scripts/test.sh calls this before the tests).
# Usage: bash scripts/lint.sh [--fix]   (--fix applies ruff's fixes and formatting instead of checking)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
if [ "${1:-}" = "--fix" ]; then
  "$PY" -m ruff check --fix .
  "$PY" -m ruff format .
  exit 0
fi
echo "lint: ruff check"; "$PY" -m ruff check .
echo "lint: ruff format --check"; "$PY" -m ruff format --check .
echo "lint: mypy --strict"; "$PY" -m mypy
echo "lint: shellcheck"; shellcheck scripts/*.sh .ci/run
