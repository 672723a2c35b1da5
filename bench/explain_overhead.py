"""What per-graph miss explanations (issue 12) cost: per lookup, and on the compiled ``examples/`` suite.

    python bench/explain_overhead.py micro [--iterations 200]
    python bench/explain_overhead.py suite [--rounds 5] [--suite examples] [--json results.json]

``micro`` compiles one tiny function, keeps torch's real ``debug_lines`` of its lookup and times what the
capture adds to every FX-graph lookup (parse, compact, to JSON), against the time of the lookup itself.
``suite`` runs ``examples/`` on a warm cache dir with the capture on and off (``bench/_explain_capture.py``,
loaded in both), interleaved round by round, and reports median CPU time (user + system of the pytest
process, less sensitive to other load than wall time) and wall time, and, measured in place in the "on"
runs, the seconds spent inside the capture and the session-end explanation as a share of the process's
CPU time (the number that noise on a shared machine does not blur). Target: within 2%.
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
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def micro(iterations: int) -> dict[str, Any]:
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="explain-micro-")
    import torch
    from torch._inductor.codecache import FxGraphCache

    from pytest_compilecache import explain
    from pytest_compilecache import probe

    original = FxGraphCache.__dict__["load_with_key"].__func__
    seen: list[tuple[str, list[str], float]] = []

    def timed(key: str, debug_lines: list[str], *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        result = original(key, debug_lines, *args, **kwargs)
        seen.append((key, list(debug_lines), time.perf_counter() - start))
        return result

    cache_class: Any = FxGraphCache
    cache_class.load_with_key = staticmethod(timed)
    fn = torch.compile(lambda x: (x * 2.0).relu().sum(0))
    with torch.no_grad():
        fn(torch.randn(8, 16))
    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(lambda x: (x * 2.0).relu().sum(0))(torch.randn(8, 16))  # a hit: the warm-run lookup
    key, lines, hit_seconds = seen[-1]
    defaults = probe._inductor_defaults()
    start = time.perf_counter()
    for _ in range(iterations):
        explain.lookup_from_torch(key, "hit", lines, defaults=defaults, values={"torch_version": "x"}).to_json()
    per_lookup = (time.perf_counter() - start) / iterations
    return {
        "debug_lines": len(lines),
        "capture_us_per_lookup": round(per_lookup * 1e6, 1),
        "lookup_hit_us": round(hit_seconds * 1e6, 1),
        "capture_vs_hit_lookup_percent": round(100 * per_lookup / hit_seconds, 2),
        "json_bytes_per_lookup": len(json.dumps(explain.lookup_from_torch(key, "hit", lines).to_json())),
    }


def _run(on: bool, cache_dir: str, record_dir: str, suite: Path) -> tuple[float, float, int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHINDUCTOR_", "TRITON_", "PYTEST_"))}
    result = Path(record_dir) / "result.json"
    env.update(
        EXPLAIN_CAPTURE="1" if on else "0",
        EXPLAIN_RECORD_DIR=record_dir,
        EXPLAIN_RESULT=str(result),
        PYTHONPATH=os.pathsep.join([str(ROOT / "bench"), str(ROOT)]),
        TORCHINDUCTOR_COMPILE_THREADS="1",
    )
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "_explain_capture"]
    cmd += ["--compile-cache=shared", f"--compile-cache-dir={cache_dir}", str(suite)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=suite, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{suite} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if on:
        data = json.loads(result.read_text())
        _SPENT.append({**data["spent"], "process_cpu_s": data["process_cpu_s"]})
        return wall, cpu, int(data["lookups"])
    return wall, cpu, 0


_SPENT: list[dict[str, float]] = []


def suite(rounds: int, path: Path) -> dict[str, Any]:
    cache_dir = tempfile.mkdtemp(prefix="explain-suite-cache-")
    record_dir = tempfile.mkdtemp(prefix="explain-suite-record-")
    _run(True, cache_dir, record_dir, path)  # warm-up: fills the cache dir and the __pycache__ files
    samples: dict[str, list[tuple[float, float]]] = {"off": [], "on": []}
    lookups = 0
    for index in range(rounds):
        for variant in ("on", "off") if index % 2 else ("off", "on"):
            wall, cpu, count = _run(variant == "on", cache_dir, record_dir, path)
            samples[variant].append((wall, cpu))
            lookups = max(lookups, count)
    out: dict[str, Any] = {"suite": str(path), "rounds": rounds, "lookups_per_run": lookups}
    for variant, values in samples.items():
        out[variant] = {
            "wall_median_s": round(statistics.median(w for w, _ in values), 3),
            "cpu_median_s": round(statistics.median(c for _, c in values), 3),
            "samples": [[round(w, 3), round(c, 3)] for w, c in values],
        }
    # Measured in place, in the "on" runs: seconds inside the capture and the session-end explanation.
    spent = _SPENT[1:]  # not the warm-up
    capture = statistics.median(s["capture"] + s["finish"] for s in spent)
    out["in_place"] = {
        "capture_s_median": round(statistics.median(s["capture"] for s in spent), 4),
        "finish_s_median": round(statistics.median(s["finish"] for s in spent), 4),
        "process_cpu_s_median": round(statistics.median(s["process_cpu_s"] for s in spent), 3),
        "percent_of_process_cpu": round(100 * capture / statistics.median(s["process_cpu_s"] for s in spent), 3),
    }
    out["cpu_ratio"] = round(out["on"]["cpu_median_s"] / out["off"]["cpu_median_s"], 4)
    out["wall_ratio"] = round(out["on"]["wall_median_s"] / out["off"]["wall_median_s"], 4)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("micro", "suite"))
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--suite", type=Path, default=ROOT / "examples", help="a directory of compiled tests")
    args = parser.parse_args()
    result = micro(args.iterations) if args.mode == "micro" else suite(args.rounds, args.suite.resolve())
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
