"""Check the plugin's per-test report against torch's own logs and counters on an outside suite.

Runs a suite you did not write (kornia's, PyG's compile tests...) once, with the plugin and the oracle's tap
(tests/plugin/oracle.py, loaded with ``-p``: nothing in the suite is edited) and ``TORCH_LOGS=recompiles,
graph_breaks``, then compares test by test what the plugin's JSON report says with what torch logged and counted
while that test ran: recompiles (function and first guard failure), graph breaks (count and distinct reasons),
frames that hit the recompile limit, and FX-graph and AOTAutograd cache hits, misses and bypasses
(``counters["inductor"]["fxgraph_cache_*"]``, ``counters["aot_autograd"]["autograd_cache_*"]``). It prints each
mismatch, the totals by both sides and one summary line; the exit status is 0 when they agree, 1 on a mismatch,
2 when the session wrote no report. Every graph break torch logs counts, also those its own counter
``counters["graph_break"]`` leaves out (data-dependent branches, frames it gives up on).

Usage::

    python bench/dynamo_oracle.py SUITE_DIR [-n 2] [--python PY] [--mode isolated] [--out DIR] [--json OUT]
        [-- PYTEST_ARGS...]

``SUITE_DIR`` is where pytest runs (the suite's rootdir); ``PYTEST_ARGS`` select the tests, e.g.
``-- test/nn -k compile``. ``--python`` is an interpreter with torch, pytest, the plugin (and pytest-xdist for
``-n``) installed. ``--mode`` is the plugin's ``--compile-cache`` (default ``isolated``: a fresh cache dir, so
a rerun has the same hits and misses; ``none`` leaves torch's cache configuration alone). ``--out`` keeps the
report, the tap's files and pytest's output (``pytest.log``) in DIR; by default they go to a temporary folder
that is removed. Example, PyG's compile tests on two workers::

    FULL_TEST=1 python bench/dynamo_oracle.py /path/to/pytorch_geometric -n 2 --python venv/bin/python \\
        -- test/nn test/utils test/test_isinstance.py -k compile
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.plugin import oracle  # noqa: E402  (the repository's root, put first above)

LAYERS = tuple(oracle.COUNTERS)


TAP = "compilecache_oracle_tap"  # the tap's name in the suite's session: outside suites have a "tests" package too


def run_suite(args: argparse.Namespace, out: Path) -> int:
    """Run the suite once with the plugin and the tap; pytest's output goes to ``out/pytest.log``.

    The tap (tests/plugin/oracle.py: the standard library only) is copied under a name of its own into a folder
    put on the suite's ``PYTHONPATH``: ``-p tests.plugin.oracle`` would import the suite's own ``tests`` package
    (``python -m pytest`` puts the working directory first), and the repository's root would lend it ours."""
    (out / "tap").mkdir(exist_ok=True)
    shutil.copyfile(oracle.__file__, out / "tap" / f"{TAP}.py")
    command = [args.python, "-m", "pytest", "-p", TAP, f"--compile-cache-json={out / 'report.json'}"]
    if args.mode != "none":
        command.append(f"--compile-cache={args.mode}")
    if args.workers:
        command += ["-n", str(args.workers)]
    command += args.pytest_args
    env = dict(os.environ, TORCH_LOGS=oracle.TORCH_LOGS)
    env[oracle.DIR_ENV] = str(out)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(out / "tap"), os.environ.get("PYTHONPATH")]))
    print("running:", " ".join(command), f"(in {args.suite})", flush=True)
    with open(out / "pytest.log", "w", encoding="utf-8") as log:
        done = subprocess.run(command, cwd=args.suite, env=env, stdout=log, stderr=subprocess.STDOUT, check=False)
    lines = (out / "pytest.log").read_text(encoding="utf-8", errors="replace").splitlines()
    print(f"pytest exited {done.returncode}: {lines[-1] if lines else '(no output)'}")
    return done.returncode


def totals(facts: dict[str, dict[str, Any]], said: bool) -> dict[str, Any]:
    """Recompiles, graph breaks, limit hits and counter sums over every test, by one side."""
    found: dict[str, Any] = {
        "recompiles": sum(len(f["recompiles"]) for f in facts.values()),
        "graph_breaks": sum(f["break_count"] if said else len(f["breaks"]) for f in facts.values()),
        "limit_hits": sum(len(f["limits"]) for f in facts.values()),
    }
    for layer, (_, _, fields) in oracle.COUNTERS.items():
        found[layer] = {field: sum(f[layer].get(field, 0) for f in facts.values()) for field in fields}
    return found


def counts_text(counts: dict[str, Any]) -> str:
    layers = ", ".join(
        f"{layer} " + "/".join(f"{value} {field}" for field, value in counts[layer].items()) for layer in LAYERS
    )
    return (
        f"{counts['recompiles']} recompiles, {counts['graph_breaks']} graph breaks, "
        f"{counts['limit_hits']} limit hits, {layers}"
    )


def compare(report: dict[str, Any], root: Path) -> dict[str, Any]:
    """The comparison, as plain data: per-test mismatches, both sides' totals, what was logged outside tests."""
    told, said = oracle.oracle(root), oracle.plugin(report)
    outside = told.pop(oracle.NO_TEST, None)
    tests = {
        nodeid: oracle.mismatches(told.get(nodeid, oracle.empty_oracle()), said.get(nodeid, oracle.empty_plugin()))
        for nodeid in sorted(set(told) | set(said))
    }
    return {
        "tests": report["totals"]["tests"],
        "compiled_tests": report["totals"]["compiled_tests"],
        "torch": totals(told, said=False),
        "plugin": totals(said, said=True),
        "mismatches": {nodeid: found for nodeid, found in tests.items() if found},
        "outside_tests": outside,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("suite", type=Path, help="where pytest runs (the suite's rootdir)")
    parser.add_argument("-n", "--workers", type=int, default=0, help="pytest-xdist workers (0: none)")
    parser.add_argument("--python", default=sys.executable, help="the interpreter with torch and the plugin")
    parser.add_argument("--mode", default="isolated", help="--compile-cache for the run; none: leave it unset")
    parser.add_argument("--out", type=Path, help="keep the report, the tap's files and pytest.log here")
    parser.add_argument("--json", type=Path, help="write the comparison as JSON here")
    argv = sys.argv[1:] if argv is None else argv
    # Everything after "--" is pytest's, split off by hand: argparse would give a "*" positional nothing.
    cut = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:cut])
    args.pytest_args = argv[cut + 1 :]
    with tempfile.TemporaryDirectory(prefix="dynamo-oracle-") as scratch:
        out = (args.out or Path(scratch)).resolve()
        out.mkdir(parents=True, exist_ok=True)
        for stale in [out / "report.json", *out.glob(oracle.FILES)]:
            stale.unlink(missing_ok=True)
        run_suite(args, out)
        if not (out / "report.json").exists():
            print(f"no report: the session wrote no {out / 'report.json'}", file=sys.stderr)
            return 2
        result = compare(json.loads((out / "report.json").read_text()), out)
    for nodeid, found in result["mismatches"].items():
        print(f"MISMATCH {nodeid}:")
        for line in found:
            print(f"  {line}")
    if result["outside_tests"]:
        print(f"logged outside any test (not compared): {result['outside_tests']}")
    print(f"torch:  {counts_text(result['torch'])}")
    print(f"plugin: {counts_text(result['plugin'])}")
    mismatched = result["mismatches"]
    print(
        f"oracle: {result['tests']} tests compared, {result['compiled_tests']} compiled, "
        f"{counts_text(result['plugin'])}; "
        f"{sum(len(found) for found in mismatched.values())} mismatches in {len(mismatched)} tests"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 1 if mismatched else 0


if __name__ == "__main__":
    sys.exit(main())
