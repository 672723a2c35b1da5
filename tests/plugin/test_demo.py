"""scripts/demo.sh itself: its restored run is a fresh machine (issue 29), as a CI runner is."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests import torchenv

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_demos_restored_run_is_a_fresh_machine(tmp_path: Path) -> None:
    """Issue 29: the restored run reused the cold run's TMPDIR (torch's headers and default dirs), so the demo
    never showed what CI sees. Now it starts from an empty TMPDIR and gets everything from the store."""
    work = tmp_path / "demo"
    env = torchenv.inner_env(prefixes=(*torchenv.OUTER_PREFIXES, "PYTEST_"))
    env.update(PY=sys.executable, COMPILECACHE_DEMO_DIR=str(work))
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "demo.sh")], env=env, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    cold, restored = (json.loads((work / f"{run}.json").read_text()) for run in ("cold", "restored"))
    # Two machines: each run's cache dir lies in its own TMPDIR.
    cold_tmp, restored_tmp = (Path(data["cache_dir"]).parent for data in (cold, restored))
    assert cold_tmp != restored_tmp and cold_tmp.parent.parent == restored_tmp.parent.parent == work
    assert cold["save"]["outcome"] == "saved" and cold["totals"]["misses"] > 0, cold["save"]
    # The restored machine had nothing but the store: every graph hit, and each precompiled header the bundle
    # names came from the store too (on the old demo they were still in the shared TMPDIR: none installed).
    assert restored["restore"]["outcome"] == "partial", restored["restore"]
    hits = restored["totals"]["hits"]
    assert restored["totals"]["misses"] == 0 and hits == cold["totals"]["misses"], restored["totals"]
    # Every graph the cold run looked up is found again, layer by layer (this file is in the compat subset:
    # CI checks it on the oldest and newest torch too).
    assert cold["totals"]["frames"] > 0, cold["totals"]
    assert restored["totals"]["fxgraph"]["hit"] == cold["totals"]["fxgraph"]["miss"] > 0, restored["totals"]
    assert restored["totals"]["aotautograd"]["hit"] == cold["totals"]["aotautograd"]["miss"], restored["totals"]
    headers = restored["restore"]["headers"]
    assert headers["transferred"] == headers["named"], headers
    assert f"restored: {hits} hits, 0 misses (100%)" in proc.stdout, proc.stdout[-2000:]
