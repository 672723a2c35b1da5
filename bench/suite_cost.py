"""What this repository's test suite costs, where the CPU goes, and how fast the machine was meanwhile.

The suite's budget (docs/development.md) is a wall time on a 2-core machine, and the suite is CPU-bound: its
wall time is its CPU-seconds over the cores it keeps busy. This script runs the suite once and reports both,
with what decides them:

* the wall time and the CPU-seconds of pytest and everything it started, and how many cores that kept busy;
* every Python process the run started (through a ``sitecustomize`` on ``PYTHONPATH``): how many there were,
  how many imported torch, and their own CPU; what is left is other programs (gcc, act, node, the servers);
  which test started each one that imported torch, by file and by test (the suite's cost is mostly torch
  imports, so this is where to look first);
* per test (a pytest plugin in the process that runs the test): its wall time and the CPU of its process
  and of the children it reaped, summed by file, the costliest tests, and the tests that waited (wall time
  not spent on a CPU: sleeps, timeouts, servers, or a core the other worker's processes held);
* the machine's speed, measured in the same run: the CPU one fresh process takes to import torch, Dynamo
  and Inductor (what every inner session pays before it compiles anything; median of ``--probes`` before and
  after the suite), and a fixed Python loop timed every 15 s through the run (its median). Runs at different
  hours compare by these: the same code takes a quarter longer at a slow hour on a shared machine.

    .venv/bin/python bench/suite_cost.py                          # the full suite with -n 2
    .venv/bin/python bench/suite_cost.py --json cost.json -- -m "not slow and not integration"
    .venv/bin/python bench/suite_cost.py --budget 720             # exit 1 when pytest took over 720 s

Arguments after ``--`` go to pytest (default: none; ``-n 2`` is added unless they choose ``-n``). Run it from
the venv that ``scripts/test.sh`` uses, with the tools ``scripts/install-tools.sh`` installs on ``PATH`` and
``CI=true`` as CI runs the suite. Processes whose environment a test rebuilds without ``PYTHONPATH`` are not
counted as Python processes; their CPU still counts in the totals and in their test's row. A child that is
not reaped by the end of its test counts in the row of the test during which its parent reaped it.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

# Every Python process of the run (PYTHONPATH): one line at exit, written in one os.write to a file opened
# with O_APPEND, so lines from concurrent processes never interleave. Imports nothing a test might look for.
# It takes the place of any sitecustomize the venv has (a plain venv has none).
SITECUSTOMIZE = """\
import atexit, os, resource, sys

# Which outer test started this process: pytest sets PYTEST_CURRENT_TEST in the test's environment, and the
# processes a test starts inherit it, unless the test rebuilt their environment (act's jobs): then the cwd,
# which is under the test's tmp_path.
_SUITE_COST_TEST = (os.environ.get("PYTEST_CURRENT_TEST") or "").rsplit(" ", 1)[0]
try:
    _SUITE_COST_CWD = os.getcwd()
except OSError:
    _SUITE_COST_CWD = ""


def _suite_cost_exit():
    path = os.environ.get("SUITE_COST_PROCS")
    if not path:
        return
    own = resource.getrusage(resource.RUSAGE_SELF)
    line = "%.3f\\t%d\\t%s\\t%s\\n" % (
        own.ru_utime + own.ru_stime,
        "torch" in sys.modules,
        _SUITE_COST_TEST.replace("\\t", " "),
        _SUITE_COST_CWD.replace("\\t", " ").replace("\\n", " "),
    )
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
    except OSError:
        pass


atexit.register(_suite_cost_exit)
"""

# The per-test plugin, loaded with -p in the outer session and so in its xdist workers: rows of (nodeid, wall,
# own CPU, reaped children's CPU) around each test's whole protocol, in the process that runs it.
PLUGIN = """\
import json, os, resource, time

import pytest

_rows = []


def _cpu():
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    wall, (own, children) = time.monotonic(), _cpu()
    try:
        return (yield)
    finally:
        own_end, children_end = _cpu()
        _rows.append([item.nodeid, time.monotonic() - wall, own_end - own, children_end - children])


def pytest_sessionfinish(session):
    folder = os.environ.get("SUITE_COST_TESTS")
    if folder and _rows:
        name = "%s-%d.json" % (os.environ.get("PYTEST_XDIST_WORKER", "main"), os.getpid())
        with open(os.path.join(folder, name), "w") as handle:
            json.dump(_rows, handle)
"""

TORCH_IMPORT = "import torch, torch._dynamo, torch._inductor.codecache"
SAMPLER = """
import sys, time
while True:
    started = time.process_time()
    total = 0
    for i in range(1_500_000):
        total += i * i
    with open(sys.argv[1], "a") as handle:
        handle.write("%.4f\\n" % (time.process_time() - started))
    time.sleep(15)
"""


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def torch_import_cpu(python: str, probes: int) -> list[float]:
    """CPU-seconds of ``probes`` fresh processes that import torch, Dynamo and Inductor, one after another."""
    found = []
    for _ in range(probes):
        before = children_cpu()
        subprocess.run([python, "-c", TORCH_IMPORT], check=True, capture_output=True, timeout=300)
        found.append(children_cpu() - before)
    return found


def run_suite(python: str, pytest_args: list[str], work: Path) -> dict[str, Any]:
    """Run pytest in ROOT with the probes on PYTHONPATH; its exit status, wall time and the tree's CPU."""
    probe = work / "probe"
    probe.mkdir()
    (probe / "sitecustomize.py").write_text(SITECUSTOMIZE)
    (probe / "suite_cost_probe.py").write_text(PLUGIN)
    (work / "tests").mkdir()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(probe), env.get("PYTHONPATH", "")]))
    env["SUITE_COST_PROCS"] = str(work / "procs.tsv")
    env["SUITE_COST_TESTS"] = str(work / "tests")
    workers = (
        [] if any(arg.startswith(("-n", "--numprocesses")) or arg == "no:xdist" for arg in pytest_args) else ["-n", "2"]
    )
    speed = work / "loop.txt"
    sampler = subprocess.Popen([sys.executable, "-c", SAMPLER, str(speed)])
    try:
        before, started = children_cpu(), time.monotonic()
        done = subprocess.run(
            [python, "-m", "pytest", *workers, "-p", "suite_cost_probe", *pytest_args], cwd=ROOT, env=env, check=False
        )
        wall, cpu = time.monotonic() - started, children_cpu() - before
    finally:
        sampler.kill()
        sampler.wait()
    loops = [float(line) for line in speed.read_text().split()] if speed.exists() else []
    return {"status": done.returncode, "wall": wall, "cpu": cpu, "loop": loops, "args": [*workers, *pytest_args]}


def read_processes(path: Path) -> list[dict[str, Any]]:
    """One ``{"cpu", "torch", "test"}`` per Python process: its own CPU-seconds, whether it had imported torch,
    and the outer test that started it (:func:`started_by`)."""
    processes = []
    for line in path.read_text(encoding="utf-8").splitlines() if path.exists() else []:
        own, torch, test, cwd = (line.split("\t") + ["", ""])[:4]
        processes.append({"cpu": float(own), "torch": torch == "1", "test": started_by(test, cwd)})
    return processes


def started_by(test: str, cwd: str) -> str:
    """The outer test's node id; else, for a process whose environment a test rebuilt, ``tmp:`` and the name of
    the test's ``tmp_path`` (the test's name, cut to 30 characters) its cwd is under; else ``(pytest)``: the
    suite's own processes (its xdist workers)."""
    if test:
        return test
    parts = Path(cwd).parts
    for index, part in enumerate(parts[:-1]):
        if re.fullmatch(r"popen-gw\d+|pytest-\d+", part) and not re.fullmatch(r"popen-gw\d+", parts[index + 1]):
            return "tmp:" + parts[index + 1]
    return "(pytest)"


def read_tests(folder: Path) -> list[dict[str, Any]]:
    rows = []
    for path in sorted(folder.glob("*.json")):
        for nodeid, wall, own, children in json.loads(path.read_text()):
            rows.append({"nodeid": nodeid, "wall": wall, "cpu": own + children, "worker": path.stem.rsplit("-", 1)[0]})
    return rows


def summarize(
    suite: dict[str, Any], processes: list[dict[str, Any]], tests: list[dict[str, Any]], probes: list[float]
) -> dict[str, Any]:
    """The figures the report prints: totals, processes, per-file and per-test CPU, the machine's speed."""
    python_cpu = sum(p["cpu"] for p in processes)
    torch_processes = [p for p in processes if p["torch"]]
    torch_by_test = collections.Counter(p["test"] for p in torch_processes)
    torch_by_file = collections.Counter(p["test"].split("::")[0] for p in torch_processes)
    by_file: collections.Counter[str] = collections.Counter()
    by_worker: dict[str, dict[str, float]] = {}
    for row in tests:
        by_file[row["nodeid"].split("::")[0]] += row["cpu"]
        worker = by_worker.setdefault(row["worker"], {"tests": 0, "wall_s": 0.0, "cpu_s": 0.0})
        worker["tests"] += 1
        worker["wall_s"] += row["wall"]
        worker["cpu_s"] += row["cpu"]
    import_cpu = statistics.median(probes) if probes else None
    return {
        "pytest": {
            "args": suite["args"],
            "status": suite["status"],
            "wall_s": round(suite["wall"], 1),
            "cpu_s": round(suite["cpu"], 1),
            "cores_busy": round(suite["cpu"] / suite["wall"], 2) if suite["wall"] else None,
        },
        "machine": {
            "torch_import_cpu_s": round(import_cpu, 2) if import_cpu else None,
            "torch_import_samples": [round(x, 2) for x in probes],
            "loop_s_median": round(statistics.median(suite["loop"]), 4) if suite["loop"] else None,
            "loop_samples": len(suite["loop"]),
            "wall_in_torch_imports": round(suite["wall"] / import_cpu, 1) if import_cpu else None,
        },
        "processes": {
            "python": len(processes),
            "python_cpu_s": round(python_cpu, 1),
            "imported_torch": len(torch_processes),
            "imported_torch_cpu_s": round(sum(p["cpu"] for p in torch_processes), 1),
            "other_programs_cpu_s": round(suite["cpu"] - python_cpu, 1),
            "imported_torch_by_file": dict(torch_by_file.most_common()),
            "imported_torch_by_test": dict(torch_by_test.most_common()),
        },
        "tests": len(tests),
        "by_worker": {
            name: {key: round(value, 1) for key, value in figures.items()}
            for name, figures in sorted(by_worker.items())
        },
        "by_file": {name: round(cpu, 1) for name, cpu in sorted(by_file.items(), key=lambda kv: -kv[1])},
        "costliest": [
            {**row, "wall": round(row["wall"], 1), "cpu": round(row["cpu"], 1)}
            for row in sorted(tests, key=lambda r: -r["cpu"])[:25]
        ],
        # Wall time a test did not spend on a CPU: idle (a sleep, a timeout, a server's answer) or waiting for a
        # core while the other worker's processes ran.
        "waiting": [
            {**row, "wall": round(row["wall"], 1), "cpu": round(row["cpu"], 1), "idle": round(idle, 1)}
            for idle, row in sorted(((r["wall"] - r["cpu"], r) for r in tests), key=lambda pair: -pair[0])[:25]
            if idle >= 0.5
        ],
    }


def render(result: dict[str, Any], top: int) -> str:
    run, machine, procs = result["pytest"], result["machine"], result["processes"]
    share = procs["imported_torch_cpu_s"] / run["cpu_s"] if run["cpu_s"] else 0.0
    lines = [
        f"pytest {' '.join(run['args'])}: exit status {run['status']}, {result['tests']} tests",
        f"  wall {run['wall_s']:.0f} s, {run['cpu_s']:,.0f} CPU-s: {run['cores_busy']} cores busy",
        f"  machine: {TORCH_IMPORT!r} takes {machine['torch_import_cpu_s']} CPU-s in a fresh process "
        f"(median of {len(machine['torch_import_samples'])}); the fixed loop {machine['loop_s_median']} s "
        f"(median of {machine['loop_samples']}); the wall time is {machine['wall_in_torch_imports']} such imports",
        f"  processes: {procs['python']} Python, {procs['imported_torch']} of them imported torch: "
        f"{procs['imported_torch_cpu_s']:,.0f} CPU-s ({share:.0%} of the run); other programs (gcc, act, node, "
        f"servers) {procs['other_programs_cpu_s']:,.0f} CPU-s",
        *(
            f"  worker {name}: {int(w['tests'])} tests, {w['wall_s']:.0f} s in tests, {w['cpu_s']:.0f} CPU-s"
            for name, w in result["by_worker"].items()
        ),
        "  processes that imported torch, by file:",
        *(f"    {n:8d}  {name}" for name, n in list(procs["imported_torch_by_file"].items())[:top]),
        "  processes that imported torch, by test:",
        *(f"    {n:8d}  {name}" for name, n in list(procs["imported_torch_by_test"].items())[:top]),
        "  CPU-s by file:",
        *(f"    {cpu:8.1f}  {name}" for name, cpu in list(result["by_file"].items())[:top]),
        "  costliest tests (CPU-s, wall s):",
        *(f"    {row['cpu']:8.1f} {row['wall']:7.1f}  {row['nodeid']}" for row in result["costliest"][:top]),
        "  tests that waited (wall s less CPU-s, wall s):",
        *(f"    {row['idle']:8.1f} {row['wall']:7.1f}  {row['nodeid']}" for row in result["waiting"][:top]),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--python", default=sys.executable, help="the venv's interpreter (default: this one)")
    parser.add_argument("--probes", type=int, default=3, help="torch imports timed before and after the suite")
    parser.add_argument("--top", type=int, default=15, help="rows of the per-file and per-test tables")
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument("--budget", type=float, help="exit 1 when pytest's wall time is over this many seconds")
    parser.add_argument("pytest_args", nargs="*", help="after --: arguments for pytest")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="suite-cost-") as tmp:
        work = Path(tmp)
        probes = torch_import_cpu(args.python, args.probes)
        suite = run_suite(args.python, args.pytest_args, work)
        probes += torch_import_cpu(args.python, args.probes)
        result = summarize(suite, read_processes(work / "procs.tsv"), read_tests(work / "tests"), probes)
    print(render(result, args.top))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    if args.budget is not None and suite["wall"] > args.budget:
        print(f"over budget: {suite['wall']:.0f} s > {args.budget:.0f} s")
        return 1
    return int(suite["status"])


if __name__ == "__main__":
    sys.exit(main())
