"""What the Action's restore step costs a job: loading torch's artifacts in the step, or staging them.

Before, the restore step (its own Python process) verified and installed the bundle and loaded torch's
mega-cache blobs into the cache dir, which meant importing torch (and Inductor) in that process, a second
time per job: the pytest step imports torch again. Now the step installs the blobs, verified, as files in
the cache dir (``sync.restore(stage_blobs=True)``) and the pytest process, which imports torch anyway,
loads them (``sync.load_staged``). This script measures both ways on one real bundle:

1. compiles a small function in a fresh process and saves a bundle (real mega-cache blobs and kernels)
   into a directory store;
2. ``--rounds`` times, alternating: the restore as its own process, loading the blobs (``load``, the old
   step) and staging them (``stage``, the new one), into an empty cache dir each time; CPU time (user +
   system) and wall time of each process;
3. the part that moved into the pytest process: ``load_staged`` timed inside a process that has already
   imported torch and Inductor, as the pytest process has by the first compile.

    python bench/action_restore.py [--rounds 5] [--json out.json]

Prints medians; ``old step`` vs ``new step + load in pytest`` is what a job saves per restored bundle.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMPILE = """
import sys
import torch
from pytest_compilecache import sync
from pytest_compilecache.fingerprint import collect
from pytest_compilecache.probe import save_artifacts
from pytest_compilecache.stores import open_store

def f(x, w):
    return torch.sin(x @ w) + x @ w

fn = torch.compile(f)
fn(torch.randn(8, 4), torch.randn(4, 4))
blob = save_artifacts()
assert blob, "no mega-cache on this torch"
result = sync.save(open_store(sys.argv[1]), prefix="bench", fingerprint=collect(), suffix="run-1",
                   cache_dir=sys.argv[2], blobs={"controller": blob}, files=[], stats={})
assert result.outcome == "saved", result.message
print(result.size)
"""

RESTORE = """
import json, sys
from pytest_compilecache import sync
from pytest_compilecache.fingerprint import Fingerprint
from pytest_compilecache.stores import open_store

store, cache_dir, facts, stage = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4] == "stage"
result = sync.restore(open_store(store, readonly=True), prefix="bench", fingerprint=Fingerprint(facts),
                      cache_dir=cache_dir, stage_blobs=stage, headers=False)
assert result.outcome in ("exact", "partial"), result.message
print(json.dumps({"staged": [list(b) for b in result.staged], "torch": "torch" in sys.modules}))
"""

LOAD_IN_PYTEST = """
import json, sys, time
import torch, torch._dynamo, torch._inductor.codecache  # what the pytest process has imported by then
from pytest_compilecache import sync

staged = tuple(sync.StagedBlob(*entry) for entry in json.loads(sys.argv[2]))
started = time.perf_counter()
cpu = time.process_time()
result = sync.load_staged(sync.RestoreResult("partial", key="k", staged=staged), sys.argv[1])
assert result.outcome == "partial" and result.artifacts, result
print(json.dumps({"wall": time.perf_counter() - started, "cpu": time.process_time() - cpu}))
"""


def _cpu_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run(args: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """(wall s, CPU s, stdout) of one child process."""
    cpu, wall = _cpu_children(), time.perf_counter()
    done = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, check=False)
    wall, cpu = time.perf_counter() - wall, _cpu_children() - cpu
    if done.returncode != 0:
        sys.exit(f"failed: {' '.join(args[:2])}\n{done.stderr[-3000:]}")
    return wall, cpu, done.stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path)
    options = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="compilecache-bench-restore-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHINDUCTOR_", "PYTEST_"))}
    env.update(TORCHINDUCTOR_CACHE_DIR=str(work / "cold"), TORCHINDUCTOR_COMPILE_THREADS="1")
    store = work / "store"
    _, _, size = _run(["-c", COMPILE, str(store), str(work / "cold")], env)
    facts = _run(["-m", "pytest_compilecache", "fingerprint", "--json"], env)[2]
    fingerprint = json.dumps(json.loads(facts)["facts"])
    samples: dict[str, list[tuple[float, float]]] = {"load": [], "stage": [], "load_in_pytest": []}
    for index in range(options.rounds):
        for way in ("load", "stage") if index % 2 == 0 else ("stage", "load"):
            cache = work / f"cache-{way}-{index}"
            wall, cpu, out = _run(["-c", RESTORE, str(store), str(cache), fingerprint, way], env)
            told = json.loads(out)
            assert told["torch"] == (way == "load"), told  # the point: staging imports no torch
            samples[way].append((wall, cpu))
            if way == "stage":
                inner = json.loads(_run(["-c", LOAD_IN_PYTEST, str(cache), json.dumps(told["staged"])], env)[2])
                samples["load_in_pytest"].append((inner["wall"], inner["cpu"]))
    medians = {
        way: {"wall": statistics.median(w for w, _ in rows), "cpu": statistics.median(c for _, c in rows)}
        for way, rows in samples.items()
    }
    print(f"bundle {int(size) / 1024:.0f} KiB, {options.rounds} rounds, medians (wall / CPU seconds):")
    rows = [
        ("old restore step (loads torch's artifacts itself)", "load"),
        ("new restore step (stages them, no torch)", "stage"),
        ("+ load_staged in the pytest process (torch there)", "load_in_pytest"),
    ]
    for label, way in rows:
        print(f"  {label:<50} {medians[way]['wall']:6.2f} / {medians[way]['cpu']:.2f}")
    saved = medians["load"]["cpu"] - medians["stage"]["cpu"] - medians["load_in_pytest"]["cpu"]
    print(f"  CPU saved per restored job: {saved:.2f} s")
    if options.json:
        options.json.write_text(
            json.dumps({"medians": medians, "samples": samples, "bundle_bytes": int(size)}, indent=2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
