"""Two pytest sessions compiling into one shared dir at the same time (one of them with xdist workers)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pytest_compilecache import cachedir
from pytest_compilecache.cachedir import MIN_AGE
from pytest_compilecache.cachedir import OUR_NAMES
from tests.plugin.helpers import ENV_CONFTEST
from tests.plugin.helpers import MATMUL_SUITE
from tests.plugin.helpers import check_report
from tests.plugin.helpers import run_inner


@pytest.mark.slow
def test_two_sessions_at_once_share_a_dir(inner: pytest.Pytester) -> None:
    inner.makeconftest(ENV_CONFTEST)
    inner.makepyfile(test_suite=MATMUL_SUITE)
    cache = inner.path / "cache"
    shared = ["--compile-cache=shared", f"--compile-cache-dir={cache}"]
    sessions = {"plain": [], "xdist": ["-n", "2"]}

    processes = {
        name: subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pytest",
                *shared,
                *extra,
                f"--basetemp={inner.path / ('tmp-' + name)}",
                f"--compile-cache-json={inner.path / (name + '.json')}",
            ],
            cwd=inner.path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for name, extra in sessions.items()
    }
    outputs = {}
    for name, process in processes.items():
        with process:
            outputs[name] = process.communicate(timeout=300)[0]

    for name, process in processes.items():
        assert process.returncode == 0, outputs[name]
        report = json.loads((inner.path / (name + ".json")).read_text())
        check_report(report)
        assert report["totals"]["compiled_tests"] == 2
        assert report["warnings"] == []

    after = run_inner(inner, *shared, json_name="after.json")

    assert after.ret == 0, after.output
    assert (after.totals["hits"], after.totals["misses"], after.totals["hit_rate"]) == (2, 0, 1.0)


# Two tests with real C++ kernels (pointwise ops): torch writes a .cpp, then runs g++ on it, the window in
# which an eviction used to remove the source (issue 9, item 2).
KERNEL_SUITE = """
import torch


def wave(x):
    return torch.sin(x) + x


def ramp(x):
    return torch.relu(x) * 2 - 1


def test_wave():
    x = torch.randn(16)
    torch.testing.assert_close(torch.compile(wave)(x), wave(x))


def test_ramp():
    x = torch.randn(16)
    torch.testing.assert_close(torch.compile(ramp)(x), ramp(x))
"""

# Round 0 already failed on the code before the fix (issue 9). One round: after it the dir is checked
# trimmed of every compiled artifact, and one plain session compiles in it (a second round, on the code
# after the fix, cost ~15 s of two busy cores and re-ran the same race).
ROUNDS = 1

# How often the loop beside a compiling process sweeps and trims the dir: 20 times a second, far more often
# than back-to-back trimming sessions could (each is a pytest start-up, ~1 s of a core), at a fraction of
# their CPU, which the compiling process and the suite's other worker need.
TRIM_EVERY = 0.05


def _trim_beside(process: subprocess.Popen[str], cache: Path) -> tuple[int, list[str]]:
    """While ``process`` runs: what a trimming session does to the shared dir, in a loop. A session sweeps
    killed writers' leftovers at its start and trims the dir to its cap (here 1K) at its end
    (``context._register``, ``save_phase.evict``); this calls the same two functions, unregistered, like a
    session that is between the two. Returns how many trims ran and the lines they would report."""
    trims, notes = 0, []
    while process.poll() is None:
        cachedir.sweep_dead_writers(str(cache))
        line = cachedir.trim(str(cache), 1024).describe()
        notes += [line] if line else []
        trims += 1
        time.sleep(TRIM_EVERY)
    return trims, notes


def _trimmer(root: Path, cache: Path, report: Path) -> list[str]:
    """One trivial session on the shared dir with a 1K cap: it trims the dir at its end. Returns its notes."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "test_trivial.py",
         f"--compile-cache-dir={cache}", "--compile-cache-max-size=1K", f"--compile-cache-json={report}"],
        cwd=root, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads(report.read_text())
    assert data["warnings"] == [], data
    return list(data["notes"])


@pytest.mark.slow
def test_trims_never_break_a_compiling_session(inner: pytest.Pytester) -> None:
    """A compiling session next to a loop that sweeps and trims the same dir to 1K (:func:`_trim_beside`):
    every test passes, and after each round the dir really is trimmed; then a session compiles in the trimmed
    dir, cold and without a warning. Raise ``ROUNDS`` to hunt a race locally."""
    inner.makepyfile(test_kernels=KERNEL_SUITE, test_trivial="def test_ok():\n    pass\n")
    cache = inner.path / "cache"
    deferred = 0
    for round_ in range(ROUNDS):
        report = inner.path / f"compile-{round_}.json"
        log = inner.path / f"compile-{round_}.log"  # a file, not a pipe: a full pipe would stall the session
        with log.open("w") as out:
            compiling = subprocess.Popen(
                [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "test_kernels.py",
                 f"--compile-cache-dir={cache}", f"--compile-cache-json={report}"],
                cwd=inner.path, stdout=out, stderr=subprocess.STDOUT, text=True,
            )  # fmt: skip
            with compiling:
                trims, notes = _trim_beside(compiling, cache)
        assert compiling.returncode == 0, f"round {round_}:\n{log.read_text()[-20000:]}"
        assert trims >= 2, trims
        data = json.loads(report.read_text())
        check_report(data)
        assert data["warnings"] == []
        assert data["totals"]["misses"] >= 2, f"round {round_} did not compile cold: {data['totals']}"

        # With the compiling session gone, the next trimming session (or the last of the loop, which may
        # have begun after the compiling one withdrew) trims every kernel away: the next round is cold.
        # What torch used is kept for MIN_AGE after its last use (a process that does not register may still
        # be using it: issue 28.4); the session is over, so age it past that.
        aged = time.time() - 2 * MIN_AGE
        for entry in cache.rglob("*"):
            os.utime(entry, (aged, aged), follow_symlinks=False)
        notes += _trimmer(inner.path, cache, inner.path / "alone.json")
        assert any(note.startswith("trimmed the cache dir: removed") for note in notes), notes
        assert not list(cache.glob("*/*.so")) and not list(cache.glob("*/*.cpp"))
        # Only the dir's bookkeeping is left (our marker files and record, torch's lock files): no FX graph,
        # AOTAutograd entry or kernel, so the next session on this dir compiles cold.
        left = [p.relative_to(cache) for p in cache.rglob("*") if p.is_file()]
        assert all(str(p) in OUR_NAMES or (p.parent.name == "locks" and p.suffix == ".lock") for p in left), left
        deferred += sum("trim deferred" in note for note in notes)
    print(f"trims deferred {deferred} times")  # shown with -s; how often they overlapped

    # What the trims left (torch's locks, our lock, marker files and graph record) does not trouble the next
    # session: it compiles every kernel again, passes, and warns about nothing.
    after = run_inner(inner, "-p", "no:xdist", "test_kernels.py", f"--compile-cache-dir={cache}", json_name="end.json")
    assert after.ret == 0, after.output
    check_report(after.data)
    assert after.data["warnings"] == []
    assert after.totals["misses"] >= 2 and after.totals["hits"] == 0, after.totals


# torch alone, no plugin: compiles fresh C++ kernels one after another (each constant makes a new kernel).
TORCH_ALONE = """
import torch

for step in range(6):
    def f(x, step=step):
        return torch.sin(x) * (step + 2) + torch.cos(x)

    torch._dynamo.reset()
    x = torch.randn(8)
    torch.testing.assert_close(torch.compile(f)(x), f(x))
print("all compiled")
"""


@pytest.mark.slow
def test_trims_never_break_torch_compiling_alone(inner: pytest.Pytester) -> None:
    """Issue 28.4: torch without the plugin (it does not register) compiles into a shared dir while a loop
    trims that dir to 1K: every compile succeeds, since nothing used within MIN_AGE is trimmed."""
    inner.makepyfile(test_trivial="def test_ok():\n    pass\n")
    (inner.path / "alone.py").write_text(TORCH_ALONE)
    cache = inner.path / "cache"
    _trimmer(inner.path, cache, inner.path / "first.json")  # makes the dir (ours, tagged)
    log = inner.path / "alone.log"
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache), "TORCHINDUCTOR_FX_GRAPH_CACHE": "1"}
    with log.open("w") as out:
        compiling = subprocess.Popen(
            [sys.executable, "alone.py"], cwd=inner.path, env=env, stdout=out, stderr=subprocess.STDOUT, text=True
        )
        with compiling:
            trims, notes = _trim_beside(compiling, cache)
    assert compiling.returncode == 0 and "all compiled" in log.read_text(), log.read_text()[-20000:]
    assert trims >= 2
    # The trims did not defer (torch alone registers nothing): they found the dir over its cap and kept
    # torch's fresh files.
    assert any(note.startswith("the cache dir is over its cap") for note in notes), notes
    assert list(cache.glob("*/*.so"))  # torch's fresh kernels are all still there
