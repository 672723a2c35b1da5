"""What the plugin costs a test suite that never imports torch.

Generates a throw-away project of trivial tests and times ``python -m pytest -q -p no:cacheprovider`` on it
in three variants, interleaved round by round so that drift in machine load hits all of them alike:

* ``active``    -- ``--compile-cache=shared --compile-cache-dir=<tmp>``: the plugin manages a cache dir;
* ``installed`` -- no options: the plugin is loaded (entry point) and only records statistics;
* ``baseline``  -- ``-p no:compilecache``: the plugin is not loaded at all.

Prints the median wall time of each variant, the ratios to the baseline (target: within 2%) and whether
torch got imported in any run (it must not be). ``--json PATH`` writes everything, samples included.

    python bench/overhead.py [--tests 2000] [--rounds 5] [--json results.json] [--fail-above 2.0]
    python bench/overhead.py --instructions [--tests 2000] [--sizes 3]
    python bench/overhead.py --instructions --wheel          # the figure the targets are stated in
    python bench/overhead.py --instructions --wheel --first-session   # a fresh runner's first session

The project is one file of ``--tests`` parametrized cases (``--layout single``, the default: the smallest
denominator, so the plugin's fixed cost shows most) or files of 100 tests each (``--layout files``).
``--wheel`` builds a wheel from this checkout and installs it, with this interpreter's pytest version, into a
fresh venv, and measures with that venv: the plugin as users install it, not an editable checkout.
Targets (instructions, single file, wheel): installed at most +1%, active at most +2%.

``--first-session`` counts the first session after an install: pytest's assertion-rewriting hook keeps pycs
of its own (not the ones the installer wrote) for every module it loads of a plugin's distribution, so on a
fresh runner, and in every session with ``PYTHONDONTWRITEBYTECODE``, whatever it loads of ours is compiled
from source. Counting a first session without this flag gives a different figure (2026-11-27: +1.65% loaded
where the steady state gave +0.48%, before the entry point stopped loading the hooks through that hook).

``--no-bytecode`` runs everything with ``PYTHONDONTWRITEBYTECODE=1``, as many CI images set it.

``--instructions`` counts instructions under valgrind instead (one run per variant and suite size, sizes
``--tests``, +50, +100...; the median over the sizes is the figure to compare, see render_instructions).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

VARIANTS = ("baseline", "installed", "active")
# --no-bytecode: every run with PYTHONDONTWRITEBYTECODE=1, as in many CI images (pytest then writes none of the
# pycs of its assertion-rewriting hook, and rewrites every module it handles in every session).
NO_BYTECODE = False
TARGET_PERCENT = 2.0
TESTS_PER_FILE = 100

# Written into the generated project: reports, at interpreter exit (after every pytest hook), whether torch
# was imported. The same file is present in every variant, so it costs them all the same.
CONFTEST = """\
import atexit
import os
import sys


def _report_torch():
    with open(os.environ["BENCH_TORCH_FLAG"], "w") as fh:
        fh.write("1" if "torch" in sys.modules else "0")


atexit.register(_report_torch)
"""


SINGLE_FILE = """\
import pytest


@pytest.mark.parametrize("i", range({tests}))
def test_trivial(i):
    assert i + 1 > i
"""


def make_project(root: Path, tests: int, layout: str = "single") -> None:
    """``tests`` trivial tests (one parametrized file, or files of TESTS_PER_FILE), a conftest.py and an
    empty pytest.ini (rootdir)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "pytest.ini").write_text("[pytest]\n")
    (root / "conftest.py").write_text(CONFTEST)
    if layout == "single":
        (root / "test_many.py").write_text(SINGLE_FILE.format(tests=tests))
        return
    for start in range(0, tests, TESTS_PER_FILE):
        count = min(TESTS_PER_FILE, tests - start)
        body = "".join(f"def test_{start + i}():\n    assert {start + i} + 1 > {start + i}\n\n\n" for i in range(count))
        (root / f"test_gen_{start // TESTS_PER_FILE:04d}.py").write_text(body.rstrip() + "\n")


def variant_args(variant: str, cache_dir: Path) -> list[str]:
    if variant == "active":
        return ["--compile-cache=shared", f"--compile-cache-dir={cache_dir}"]
    if variant == "installed":
        return []
    if variant == "baseline":
        return ["-p", "no:compilecache"]
    raise ValueError(variant)


def wheel_python(work: Path, python: str) -> str:
    """A fresh venv holding a wheel built from this checkout and ``python``'s pytest version; its interpreter."""
    repo = Path(__file__).resolve().parent.parent
    version = subprocess.run(
        [python, "-c", "import pytest; print(pytest.__version__)"], capture_output=True, text=True, check=True
    ).stdout.strip()
    venv, dist = work / "venv", work / "dist"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([python, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(repo)], check=True)
    wheels = sorted(dist.glob("pytest_compilecache-*.whl"))
    subprocess.run([*pip, f"pytest=={version}", str(wheels[-1])], check=True)
    return str(venv / "bin" / "python")


def clean_env(flag: Path) -> dict[str, str]:
    """The caller's environment without anything that would configure pytest or the plugin differently."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("PYTEST_", "TORCHINDUCTOR_", "TRITON_")) and name != "PYTHONWARNINGS"
    }
    env["BENCH_TORCH_FLAG"] = str(flag)
    env["PYTHONDONTWRITEBYTECODE"] = "1" if NO_BYTECODE else "0"
    return env


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(python: str, project: Path, variant: str, cache_dir: Path, tests: int) -> tuple[float, float, bool]:
    """One timed pytest run: (wall seconds, CPU seconds, torch imported). Exits loudly if the run was not clean.

    CPU time (user + system of the child) is reported next to wall time: it is far less sensitive to
    other load on a shared machine.
    """
    flag = project / ".torch-flag"
    flag.unlink(missing_ok=True)
    command = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *variant_args(variant, cache_dir)]
    cpu_before = _children_cpu()
    started = time.perf_counter()
    done = subprocess.run(command, cwd=project, env=clean_env(flag), capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    cpu = _children_cpu() - cpu_before
    tail = done.stdout.strip().splitlines()[-1:] or [""]
    if done.returncode != 0 or not re.search(rf"\b{tests} passed\b", tail[0]):
        sys.exit(f"{variant}: pytest failed (exit {done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    if variant == "active" and not (cache_dir / "CACHEDIR.TAG").is_file():
        sys.exit(f"active: the plugin did not create {cache_dir}: is pytest-compilecache installed in {python}?")
    return elapsed, cpu, flag.read_text() == "1"


def measure(python: str, tests: int, rounds: int, warmup: int, keep: bool, layout: str = "single") -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="compilecache-bench-"))
    try:
        project, cache_dir = work / "project", work / "compile-cache"
        make_project(project, tests, layout)
        samples: dict[str, list[float]] = {v: [] for v in VARIANTS}
        cpu_samples: dict[str, list[float]] = {v: [] for v in VARIANTS}
        torch_imported = dict.fromkeys(VARIANTS, False)
        for round_index in range(warmup + rounds):
            # Rotate the order each round so that no variant always runs first (cold page cache, turbo).
            order = VARIANTS[round_index % 3 :] + VARIANTS[: round_index % 3]
            timings = []
            for variant in order:
                seconds, cpu, imported = run_once(python, project, variant, cache_dir, tests)
                torch_imported[variant] |= imported
                timings.append(f"{variant} {seconds:.3f} s ({cpu:.3f} s CPU)")
                if round_index >= warmup:
                    samples[variant].append(seconds)
                    cpu_samples[variant].append(cpu)
            label = "warm-up" if round_index < warmup else f"round {round_index - warmup + 1}/{rounds}"
            print(f"  {label}: " + ", ".join(timings), file=sys.stderr)
    finally:
        if keep:
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    medians = {v: statistics.median(samples[v]) for v in VARIANTS}
    cpu_medians = {v: statistics.median(cpu_samples[v]) for v in VARIANTS}
    return {
        "tests": tests,
        "layout": layout,
        "rounds": rounds,
        "warmup": warmup,
        "python": python,
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "samples_s": samples,
        "median_s": medians,
        "ratio_to_baseline": {v: medians[v] / medians["baseline"] for v in VARIANTS},
        "cpu_samples_s": cpu_samples,
        "cpu_median_s": cpu_medians,
        "cpu_ratio_to_baseline": {v: cpu_medians[v] / cpu_medians["baseline"] for v in VARIANTS},
        "torch_imported": torch_imported,
        "target_percent": TARGET_PERCENT,
    }


def render(results: dict[str, Any]) -> str:
    lines = [
        f"plugin overhead: {results['tests']} trivial tests, median of {results['rounds']} interleaved runs",
        f"{'variant':<10} {'wall s':>8} {'min s':>7} {'max s':>7} {'vs base':>8} {'CPU s':>7} {'vs base':>8}",
    ]
    for variant in VARIANTS:
        runs = results["samples_s"][variant]
        ratio = results["ratio_to_baseline"][variant]
        cpu_ratio = results["cpu_ratio_to_baseline"][variant]
        lines.append(
            f"{variant:<10} {results['median_s'][variant]:8.3f} {min(runs):7.3f} {max(runs):7.3f} "
            f"{(ratio - 1) * 100:+7.1f}% {results['cpu_median_s'][variant]:7.3f} {(cpu_ratio - 1) * 100:+7.1f}%"
        )
    for variant in ("installed", "active"):
        over = (results["ratio_to_baseline"][variant] - 1) * 100
        cpu_over = (results["cpu_ratio_to_baseline"][variant] - 1) * 100
        verdict = "within" if over <= TARGET_PERCENT else "OVER"
        lines.append(
            f"{variant}: wall {over:+.1f}%, CPU {cpu_over:+.1f}% ({verdict} the {TARGET_PERCENT:.0f}% wall-time target)"
        )
    imported = [v for v, yes in results["torch_imported"].items() if yes]
    lines.append("torch imported: " + (", ".join(imported) if imported else "no (in no variant)"))
    return "\n".join(lines)


def _pytest_pycs(python: str) -> list[Path]:
    """The pycs pytest's assertion-rewriting hook wrote for the plugin's modules in ``python``'s install."""
    where = subprocess.run(
        [python, "-c", "import os, pytest_compilecache as p; print(os.path.dirname(p.__file__))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return sorted(Path(where).rglob("__pycache__/*-pytest-*.pyc"))


def count_instructions(python: str, tests: int, layout: str = "single", first: bool = False) -> dict[str, int]:
    """Instructions executed per variant under valgrind's callgrind: repeatable, whatever the load.

    One run each (slow: about 250x; the variants run side by side); the numbers do not depend on what else
    the machine is doing. ``first``: every counted run is the first session after an install, as on a fresh
    CI runner: the pycs pytest's rewriting hook keeps for the plugin's modules (not the ones the installer
    wrote) are deleted first, so whatever that hook loads is parsed and compiled from source.
    """
    work = Path(tempfile.mkdtemp(prefix="compilecache-bench-ir-"))
    try:
        project = work / "project"
        make_project(project, tests, layout)
        for variant in VARIANTS:  # warm-up: write __pycache__ (assertion rewriting) outside the count
            warmup = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *variant_args(variant, work / "cache")]
            env = clean_env(project / ".torch-flag")
            subprocess.run(warmup, cwd=project, env=env, capture_output=True, check=False)
        if first:
            for pyc in _pytest_pycs(python):
                pyc.unlink()
        running = {}
        for variant in VARIANTS:
            command = [
                "valgrind",
                "--tool=callgrind",
                "--callgrind-out-file=/dev/null",
                python,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                *variant_args(variant, work / f"cache-{variant}"),
            ]
            # A fixed hash seed: dict layouts (and so instruction counts) vary with it from run to run.
            # PYTHONDONTWRITEBYTECODE: with ``first``, no run leaves the pycs another would then find.
            env = {
                **clean_env(project / f".torch-flag-{variant}"),
                "PYTHONHASHSEED": "0",
                **({"PYTHONDONTWRITEBYTECODE": "1"} if first else {}),
            }
            running[variant] = subprocess.Popen(
                command, cwd=project, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
            )
        counts = {}
        for variant, process in running.items():
            _, stderr = process.communicate()
            match = re.search(r"Collected : (\d+)", stderr)
            if process.returncode != 0 or not match:
                sys.exit(f"{variant}: callgrind run failed:\n{stderr[-2000:]}")
            counts[variant] = int(match.group(1))
        return counts
    finally:
        shutil.rmtree(work, ignore_errors=True)


def render_instructions(runs: dict[int, dict[str, int]], first: bool = False) -> str:
    """Per variant: the median overhead over the suite sizes counted, and each size's.

    One count is exact for its code and size, but where Python's cyclic garbage collector runs depends on
    every allocation, so a change anywhere moves a full collection (tens of millions of instructions) in or
    out of one run; a few sizes apart see it at different phases, and their median is what to compare.
    """
    sizes = ", ".join(map(str, runs))
    when = ", the first session after an install" if first else ""
    lines = [f"plugin overhead: instructions executed (valgrind callgrind), suites of {sizes} tests{when}"]
    for variant in VARIANTS:
        percents = [(counts[variant] / counts["baseline"] - 1) * 100 for counts in runs.values()]
        each = ", ".join(f"{p:+.2f}%" for p in percents)
        lines.append(f"{variant:<10} median {statistics.median(percents):+.2f}%  ({each})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tests", type=int, default=2000, help="number of generated tests (default 2000)")
    parser.add_argument("--rounds", type=int, default=5, help="timed runs per variant (default 5)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds first (default 1)")
    parser.add_argument("--python", default=sys.executable, help="interpreter with pytest and the plugin")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the generated project")
    parser.add_argument(
        "--fail-above",
        type=float,
        metavar="PERCENT",
        help="exit 1 when the active or installed median is slower than this",
    )
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="count instructions under valgrind callgrind instead of timing (repeatable)",
    )
    parser.add_argument(
        "--sizes",
        type=int,
        default=3,
        metavar="K",
        help="with --instructions: count K suites of --tests, +50, +100... tests and report the median (default 3)",
    )
    parser.add_argument(
        "--first-session",
        action="store_true",
        help="with --instructions: count the first session after an install (no pyc of pytest's rewriting hook)",
    )
    parser.add_argument("--layout", choices=("single", "files"), default="single", help="see above (default single)")
    parser.add_argument(
        "--wheel", action="store_true", help="measure a wheel built from this checkout, in a fresh venv"
    )
    parser.add_argument(
        "--no-bytecode",
        action="store_true",
        help="run everything with PYTHONDONTWRITEBYTECODE=1, as many CI images set it",
    )
    args = parser.parse_args(argv)
    global NO_BYTECODE
    NO_BYTECODE = args.no_bytecode
    if args.wheel:
        args.python = wheel_python(Path(tempfile.mkdtemp(prefix="compilecache-bench-wheel-")), args.python)
    if args.instructions:
        if args.sizes < 1:
            parser.error("--sizes must be at least 1")
        sizes = [args.tests + 50 * index for index in range(args.sizes)]
        runs = {size: count_instructions(args.python, size, args.layout, args.first_session) for size in sizes}
        print(render_instructions(runs, args.first_session))
        if args.json:
            data = {"instructions": {str(size): counts for size, counts in runs.items()}}
            Path(args.json).write_text(json.dumps(data, indent=2) + "\n")
        return 0
    if args.tests < 1 or args.rounds < 1 or args.warmup < 0:
        parser.error("--tests and --rounds must be at least 1, --warmup at least 0")
    results = measure(args.python, args.tests, args.rounds, args.warmup, args.keep, args.layout)
    print(render(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    if any(results["torch_imported"].values()):
        return 1
    if args.fail_above is not None:
        worst = max(results["ratio_to_baseline"][v] for v in ("installed", "active"))
        if (worst - 1) * 100 > args.fail_above:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
