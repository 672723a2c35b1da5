"""What per-graph miss explanations (issue 12) cost: per lookup, and on a whole compiled suite.

    python bench/explain_overhead.py micro [--iterations 200]
    python bench/explain_overhead.py per-test [--frames 60] [--iterations 20000] [--rounds 5] [--revisions REV ...]
    python bench/explain_overhead.py suite [--rounds 5] [--suite bench/suite] [--json results.json]

``micro`` compiles one tiny function, keeps torch's real ``debug_lines`` of its lookup and times what the
capture adds to every FX-graph lookup (parse, compact, to JSON), against the time of the lookup itself.

``per-test`` measures what every test pays whether it compiles or not: the per-phase snapshot and difference of
torch's counters (``probe.mark`` and ``probe.delta``) for a phase that compiles nothing, in a process that has
already compiled ``--frames`` frames (``backend="eager"``), each with a graph break and a recompile. It times the
real functions, then the same with the Dynamo-cost accounting (graph breaks, recompile-limit warnings) stubbed
out, interleaved round by round: the difference is what that accounting adds to a test that neither recompiles
nor breaks a graph. Target: zero, within the noise of the two medians. ``--revisions`` times the same calls of
earlier git revisions too, each in a fresh process (a temporary worktree), then this working tree's.

``suite`` runs a suite dir (default ``examples/``) under the real plugin on one warm shared cache dir,
``--compile-cache-explain=on`` against ``--compile-cache-explain=off``, interleaved round by round in
alternating order after one warm-up run of each. It reports the median CPU time (user + system of the
whole pytest process tree, less sensitive to other load than wall time; also the pytest process's own),
the median wall time, both as a ratio of medians on/off and as the median of each round's on/off ratio
(the two runs of a round share the machine's load). Each run must pass and say what it did: the JSON
report of an ``on`` run lists graphs, an ``off`` run's none. A timer (this file, loaded with
``-p explain_overhead`` in both variants; it only wraps, the plugin does the work) also measures in place
the seconds an ``on`` run spends in the per-lookup capture (``probe.graphs._record_lookup``), reading the earlier
record (``restore_phase.RestorePhase._read_baseline``) and explaining at the end (``save_phase.SavePhase.explain``),
as a share of the run's CPU time: the number that noise on a shared machine does not blur. Target: within 2%.
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
TIMINGS_ENV = "EXPLAIN_OVERHEAD_TIMINGS"  # where the in-place timer writes its seconds (suite mode)


def micro(iterations: int) -> dict[str, Any]:
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="explain-micro-")
    import torch
    from torch._inductor.codecache import FxGraphCache

    from pytest_compilecache import explain
    from pytest_compilecache.probe import graphs

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
    defaults = graphs._inductor_defaults()
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


def per_test(frames: int, iterations: int, rounds: int) -> dict[str, Any]:
    """In this process, with whichever ``pytest_compilecache`` it imports (``--revisions`` points it at others)."""
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="explain-per-test-")
    import torch

    from pytest_compilecache import probe

    watch = getattr(probe, "watch_dynamo", None)  # the session's start (earlier revisions have none)
    if watch is not None:
        watch()
    probe.mark()  # taps torch's logs, as at a session's first test
    dynamo: Any = sys.modules.get("pytest_compilecache.probe.dynamo")
    torch._dynamo.utils.set_compilation_metrics_limit(10**6)  # as a session does (earlier revisions: later)
    namespace: dict[str, Any] = {"torch": torch}
    for index in range(frames):  # distinct code objects: one frame each, a break each, a recompile each
        body = f"    x = x + {index}\n    torch._dynamo.graph_break(msg='break {index}')\n    return x * 2"
        exec(f"def f{index}(x):\n{body}", namespace)
        compiled = torch.compile(namespace[f"f{index}"], backend="eager", dynamic=False)
        for size in (2, 3):
            compiled(torch.ones(size))

    def timed() -> float:
        start = time.perf_counter()
        for _ in range(iterations):
            probe.delta(probe.mark())
        return (time.perf_counter() - start) / iterations * 1e6

    # What a mark and a delta cost without the graph-break and limit accounting (revisions that have it).
    stubbable = hasattr(dynamo, "breaks_mark") and hasattr(dynamo, "limit_mark")
    real_breaks_mark: Any = getattr(dynamo, "breaks_mark", None)
    real_limit_mark: Any = getattr(dynamo, "limit_mark", None)
    samples: dict[str, list[float]] = {"real": [], "stubbed": []}
    for index in range(rounds):
        for variant in ("real", "stubbed") if index % 2 else ("stubbed", "real"):
            if variant == "stubbed" and not stubbable:
                continue
            if variant == "stubbed":
                dynamo.breaks_mark = dynamo.limit_mark = lambda: 0
            try:
                samples[variant].append(timed())
            finally:
                if stubbable:
                    dynamo.breaks_mark, dynamo.limit_mark = real_breaks_mark, real_limit_mark
    out: dict[str, Any] = {
        "package": str(Path(probe.__file__).parents[1]),
        "frames_compiled": frames,
        "compilation_records": len(torch._dynamo.utils.get_compilation_metrics()),
        "graph_break_reasons": len(torch._dynamo.utils.counters["graph_break"]),
        "mark_and_delta_us": round(statistics.median(samples["real"]), 2),
    }
    if stubbable:
        stubbed = statistics.median(samples["stubbed"])
        out["without_dynamo_cost_accounting_us"] = round(stubbed, 2)
        out["dynamo_cost_accounting_us"] = round(out["mark_and_delta_us"] - stubbed, 2)
    out["samples_us"] = {name: [round(value, 2) for value in values] for name, values in samples.items() if values}
    return out


def per_test_revisions(revisions: list[str], frames: int, iterations: int, rounds: int) -> dict[str, Any]:
    """:func:`per_test` in a fresh process for each git revision (a temporary worktree) and for this working
    tree, one after the other, under the same settings."""
    results: dict[str, Any] = {}
    argv = [sys.executable, __file__, "per-test", f"--frames={frames}", f"--iterations={iterations}"]
    with tempfile.TemporaryDirectory(prefix="explain-per-test-revisions-") as scratch:
        for name in [*revisions, "working tree"]:
            tree = ROOT
            if name != "working tree":
                tree = Path(scratch) / name.replace("/", "_")
                add = ["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(tree), name]
                subprocess.run(add, check=True)
            try:
                env = {**os.environ, "PYTHONPATH": str(tree)}
                proc = subprocess.run([*argv, f"--rounds={rounds}"], env=env, capture_output=True, text=True)
                if proc.returncode != 0:
                    raise SystemExit(f"{name}: per-test failed:\n{proc.stderr[-2000:]}")
                results[name] = json.loads(proc.stdout)
            finally:
                if tree != ROOT:
                    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)
    return {"load_average": [round(x, 2) for x in os.getloadavg()], "per_revision": results}


def _run(on: bool, cache_dir: str, work: Path, suite: Path) -> dict[str, Any]:
    """One pytest run of ``suite`` with the real plugin; its wall and process-tree CPU seconds, and what it did."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHINDUCTOR_", "TRITON_", "PYTEST_"))}
    report, timings = work / "report.json", work / "timings.json"
    for path in (report, timings):
        path.unlink(missing_ok=True)
    env.update(
        {TIMINGS_ENV: str(timings)},
        PYTHONPATH=os.pathsep.join([str(ROOT / "bench"), str(ROOT)]),
        TORCHINDUCTOR_COMPILE_THREADS="1",
    )
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "explain_overhead"]
    cmd += ["--compile-cache=shared", f"--compile-cache-dir={cache_dir}", f"--compile-cache-json={report}"]
    cmd += [f"--compile-cache-explain={'on' if on else 'off'}", str(suite)]
    # RUSAGE_CHILDREN grows by everything pytest and its own reaped children (g++, compile workers) used.
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=suite, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{suite} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    data = json.loads(report.read_text())
    spent = json.loads(timings.read_text())
    lookups = sum(int(test.get("graphs", 0)) for test in data["tests"])
    if on != (lookups > 0) or on != (spent["lookups"] > 0):
        raise SystemExit(f"explain={'on' if on else 'off'} recorded {lookups} lookups ({spent['lookups']} captured)")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    totals = data["totals"]["fxgraph"]
    return {"wall": wall, "cpu": cpu, "lookups": lookups, "hits": totals["hit"], "misses": totals["miss"], **spent}


def suite(rounds: int, path: Path) -> dict[str, Any]:
    load_before = [round(x, 2) for x in os.getloadavg()]  # other work on the machine blurs wall times
    cache_dir = tempfile.mkdtemp(prefix="explain-suite-cache-")
    work = Path(tempfile.mkdtemp(prefix="explain-suite-work-"))
    for warm_up in (True, False):  # fills the cache dir, the graph record and the __pycache__ files
        _run(warm_up, cache_dir, work, path)
    runs: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    for index in range(rounds):
        for variant in ("on", "off") if index % 2 else ("off", "on"):
            runs[variant].append(_run(variant == "on", cache_dir, work, path))
    out: dict[str, Any] = {"suite": str(path), "rounds": rounds, "lookups_per_run": runs["on"][0]["lookups"]}
    for variant, values in runs.items():
        out[variant] = {
            "wall_median_s": round(statistics.median(r["wall"] for r in values), 3),
            "cpu_median_s": round(statistics.median(r["cpu"] for r in values), 3),
            "pytest_process_cpu_median_s": round(statistics.median(r["process_cpu"] for r in values), 3),
            "fx_hits_misses": sorted({(r["hits"], r["misses"]) for r in values}),
            "samples_wall_cpu": [[round(r["wall"], 3), round(r["cpu"], 3)] for r in values],
        }
    out["cpu_ratio"] = round(out["on"]["cpu_median_s"] / out["off"]["cpu_median_s"], 4)
    out["wall_ratio"] = round(out["on"]["wall_median_s"] / out["off"]["wall_median_s"], 4)
    # The two runs of a round ran back to back, under much the same load: the median of their ratios.
    pairs = list(zip(runs["on"], runs["off"]))
    out["paired_cpu_ratio_median"] = round(statistics.median(on["cpu"] / off["cpu"] for on, off in pairs), 4)
    out["paired_wall_ratio_median"] = round(statistics.median(on["wall"] / off["wall"] for on, off in pairs), 4)
    on = runs["on"]
    out["in_place"] = {
        "capture_s_median": round(statistics.median(r["capture"] for r in on), 4),
        "explain_s_median": round(statistics.median(r["explain"] for r in on), 4),
        "baseline_s_median": round(statistics.median(r["baseline"] for r in on), 4),
        "percent_of_run_cpu_median": round(
            statistics.median(100 * (r["capture"] + r["explain"] + r["baseline"]) / r["cpu"] for r in on), 3
        ),
    }
    out["load_average"] = {"before": load_before, "after": [round(x, 2) for x in os.getloadavg()]}
    return out


# ---- the in-place timer: a pytest plugin module (``-p explain_overhead``), loaded in both variants


_spent: dict[str, float] = {"capture": 0.0, "explain": 0.0, "baseline": 0.0, "lookups": 0}


def _timed(name: str, func: Any) -> Any:
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return func(*args, **kwargs)
        finally:
            _spent[name] += time.perf_counter() - start
            if name == "capture":
                _spent["lookups"] += 1

    return timed


def pytest_configure(config: Any) -> None:
    """Wrap the two places the plugin spends time on explanations; the plugin itself is unchanged."""
    if not os.environ.get(TIMINGS_ENV):
        return
    from pytest_compilecache import restore_phase
    from pytest_compilecache import save_phase
    from pytest_compilecache.probe import graphs

    graphs._record_lookup = _timed("capture", graphs._record_lookup)  # the capture calls it through the module
    end: Any = save_phase.SavePhase
    end.explain = _timed("explain", end.explain)
    start: Any = restore_phase.RestorePhase
    start._read_baseline = _timed("baseline", start._read_baseline)


def pytest_unconfigure(config: Any) -> None:
    target = os.environ.get(TIMINGS_ENV)
    if target:
        Path(target).write_text(json.dumps({**_spent, "process_cpu": time.process_time()}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("micro", "per-test", "suite"))
    parser.add_argument("--iterations", type=int, help="micro: 200, per-test: 20000")
    parser.add_argument("--frames", type=int, default=60, help="per-test: frames compiled before timing")
    parser.add_argument("--revisions", nargs="*", default=[], help="per-test: git revisions to time beside this tree")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--suite", type=Path, default=ROOT / "examples", help="a directory of compiled tests")
    args = parser.parse_args()
    if args.mode == "micro":
        result = micro(args.iterations or 200)
    elif args.mode == "per-test" and args.revisions:
        result = per_test_revisions(args.revisions, args.frames, args.iterations or 20000, args.rounds)
    elif args.mode == "per-test":
        result = per_test(args.frames, args.iterations or 20000, args.rounds)
    else:
        result = suite(args.rounds, args.suite.resolve())
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
