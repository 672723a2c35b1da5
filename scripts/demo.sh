#!/usr/bin/env bash
# The main job: run the examples/ suite of compiled tests through the plugin twice, cold and then on a
# fresh machine restored from the bundle the cold run saved (as in CI), and show the report.
# Usage: bash scripts/demo.sh   (sets up .venv first; PY=/path/to/python uses that python instead, and
#        COMPILECACHE_DEMO_DIR=DIR writes the runs there instead of .compilecache-demo)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PY:-}" ]; then
  bash scripts/setup.sh
  PY=.venv/bin/python
fi
WORK=${COMPILECACHE_DEMO_DIR:-.compilecache-demo}
rm -rf "$WORK" && mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)

for run in cold restored; do
  echo
  echo "=============================== $run run ==============================="
  # Each run is a fresh machine: its own empty TMPDIR (torch's default cache dir and its precompiled
  # headers live there) and, with isolated, an empty cache dir inside it. Only the store carries
  # anything from the cold run to the restored one, as actions/cache or S3 does between CI runs.
  machine="$WORK/$run-machine"
  mkdir -p "$machine/tmp"
  echo "fresh machine: TMPDIR=$machine/tmp (empty); only the store $WORK/store carries over"
  TMPDIR="$machine/tmp" "$PY" -m pytest examples -p no:cacheprovider \
    --compile-cache=isolated --compile-cache-store="$WORK/store" \
    --compile-cache-report=full --compile-cache-json="$WORK/$run.json"
done

echo
echo "================================ summary ================================"
"$PY" - "$WORK" <<'PYEOF'
import json, sys
work = sys.argv[1]
for run in ("cold", "restored"):
    data = json.load(open(f"{work}/{run}.json"))
    t = data["totals"]
    rate = "n/a" if t["hit_rate"] is None else f"{t['hit_rate']:.0%}"
    restore = data.get("restore") or {}
    what = restore.get("description") or restore.get("outcome", "-")
    headers = (restore.get("headers") or {}).get("transferred", 0)
    print(f"{run:>8}: {t['hits']} hits, {t['misses']} misses ({rate}), {t['compile_seconds']:.1f} s compiling")
    print(f"{'':>8}  restore: {what}; {headers} precompiled header(s) installed")
PYEOF
echo "JSON reports: $WORK/cold.json $WORK/restored.json; bundles: $WORK/store"
