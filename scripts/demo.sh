#!/usr/bin/env bash
# The main job: run the examples/ suite of compiled tests through the plugin twice (cold, then warm,
# restored from a bundle into a fresh dir) and show the report.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PY=.venv/bin/python
WORK=.compilecache-demo
rm -rf "$WORK" && mkdir -p "$WORK"
export TMPDIR="$PWD/$WORK/tmp" && mkdir -p "$TMPDIR"

for run in cold restored; do
  echo
  echo "=============================== $run run ==============================="
  # isolated: every run starts from an empty cache dir, as on a fresh CI machine; the store carries
  # the bundle from the first run to the second.
  "$PY" -m pytest examples -p no:cacheprovider \
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
    restore = (data.get("restore") or {}).get("outcome", "-")
    print(f"{run:>5}: {t['hits']} hits, {t['misses']} misses ({rate}), {t['compile_seconds']:.1f} s compiling, restore: {restore}")
PYEOF
echo "JSON reports: $WORK/cold.json $WORK/restored.json; bundles: $WORK/store"
