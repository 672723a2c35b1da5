#!/usr/bin/env bash
# The package as users get it: build the sdist and the wheel, check them (twine check --strict,
# check-wheel-contents), install the wheel alone into a fresh venv (no editable install, this checkout not
# on sys.path; torch as scripts/setup.sh installs it), run a copy of examples/ twice with
# --compile-cache=shared and check that the second run hits every FX graph the first one compiled.
# Usage: bash scripts/check-package.sh [DIST_DIR]   (default: dist/, emptied first; .ci/run and the release
# workflow run it; the release workflow publishes what it leaves in DIST_DIR)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
DIST=${1:-dist}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/compilecache-package.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
unset PYTHONPATH  # the checkout must not be importable in the fresh venv

echo "package: python -m build -> $DIST/"
rm -rf "$DIST" build/lib
"$PY" -m build --sdist --wheel --outdir "$DIST" . > "$WORK/build.log" 2>&1 || { cat "$WORK/build.log"; exit 1; }
ls "$DIST"
echo "package: twine check --strict"; "$PY" -m twine check --strict "$DIST"/*
echo "package: check-wheel-contents"; "$PY" -m check_wheel_contents --toplevel pytest_compilecache "$DIST"/*.whl

echo "package: a fresh venv with torch and the wheel alone"
VENV="$WORK/venv" bash scripts/setup.sh --no-project
"$WORK/venv/bin/python" -m pip install --disable-pip-version-check -q "$DIST"/*.whl \
  2> >(grep -v "^WARNING: Location" >&2)
cp -R examples "$WORK/examples"
cd "$WORK/examples"
"$WORK/venv/bin/python" - "$OLDPWD" <<'PYEOF'
import sys, pathlib, pytest_compilecache
checkout = pathlib.Path(sys.argv[1]).resolve()
where = pathlib.Path(pytest_compilecache.__file__).resolve()
assert "site-packages" in where.parts and checkout not in where.parents, f"not the wheel: {where}"
assert not any(p and pathlib.Path(p).resolve() == checkout for p in sys.path), "the checkout is on sys.path"
print(f"package: pytest_compilecache {pytest_compilecache.__version__} from {where.parent}")
PYEOF
for run in 1 2; do
  "$WORK/venv/bin/python" -m pytest -q --compile-cache=shared --compile-cache-json="$WORK/run$run.json"
done
"$WORK/venv/bin/python" - "$WORK/run1.json" "$WORK/run2.json" <<'PYEOF'
import json, sys
first, second = (json.load(open(path))["totals"] for path in sys.argv[1:])
assert first["misses"] > 0 and first["hits"] == 0, f"the first run should compile cold: {first}"
assert second["misses"] == 0 and second["hits"] == first["misses"], f"the second run should hit every graph: {second}"
print(f"package: first run {first['misses']} misses, second run {second['hits']} hits, 0 misses: ok")
PYEOF
