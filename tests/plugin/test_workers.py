"""xdist workers that do not report back: the controller says so, the session goes on and saves nothing."""

from __future__ import annotations

import pytest

from tests.markdown import shown
from tests.plugin.helpers import ENV_CONFTEST
from tests.plugin.helpers import MATMUL_SUITE
from tests.plugin.helpers import check_report
from tests.plugin.helpers import run_inner

# A test that SIGKILLs the worker running it: xdist reports it as crashed and goes on, and that worker never sends
# its statistics.
KILLED_WORKER = """
import os
import signal


def test_dies():
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.slow
def test_a_session_whose_worker_was_killed_says_so_and_saves_nothing(
    inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker SIGKILLed mid-session took its graphs and its mega-cache blob with it: a bundle of this session
    would lack them, and the next run would restore it as the newest, replacing the coverage of a complete one
    (and failing a green run's hit-rate floor). Whichever worker dies, the session goes on, names it in the
    terminal, the JSON and the step summary, and saves nothing."""
    inner.makeconftest(ENV_CONFTEST)
    inner.makepyfile(test_suite=MATMUL_SUITE, test_killed=KILLED_WORKER)
    store = inner.path / "store"
    store.mkdir()
    summary = inner.path / "step-summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))

    run = run_inner(inner, "--compile-cache=shared", f"--compile-cache-dir={inner.path / 'cache'}",
                    f"--compile-cache-store={store}", "-n", "2", "-p", "no:randomly")  # fmt: skip

    run.result.assert_outcomes(passed=2, failed=1)
    check_report(run.data)
    [dead] = run.data["silent_workers"]
    run.result.stdout.fnmatch_lines(
        [f"worker '{dead}' crashed while running*", f"workers that sent no statistics: {dead}"]
    )
    assert f"- workers that sent no statistics: {dead}" in shown(summary.read_text())
    assert run.data["save"]["outcome"] == "skipped", run.data["save"]
    assert "workers that sent no statistics" in run.data["save"]["message"], run.data["save"]
    assert list(store.iterdir()) == []


# Records, in every process at its very end, whether torch was imported there (the controller writes
# "controller"); the flag files land beside the inner project.
TORCH_FLAG = """
import atexit
import os
import sys


def _flag():
    name = os.environ.get("PYTEST_XDIST_WORKER", "controller")
    with open(os.path.join(os.environ["TORCH_FLAG_DIR"], name), "w") as fh:
        fh.write("1" if "torch" in sys.modules else "0")


atexit.register(_flag)
"""


@pytest.mark.slow
def test_a_restoring_xdist_controller_never_imports_torch(
    inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With -n 2 the restore runs in one worker (the controller hands it a ticket): the controller imports
    no torch, the other worker waits for the restore before its first test, and every graph hits. A later -k
    run that missed saves nothing over the bundle it restored."""
    inner.makeconftest(ENV_CONFTEST + TORCH_FLAG)
    inner.makepyfile(test_suite=MATMUL_SUITE)
    flags = inner.path / "flags"
    flags.mkdir()
    monkeypatch.setenv("TORCH_FLAG_DIR", str(flags))
    store = inner.path / "store"

    def fresh(name: str) -> list[str]:  # a fresh machine: an empty cache dir of its own, the same store
        return ["--compile-cache=shared", f"--compile-cache-dir={inner.path / name}", f"--compile-cache-store={store}"]

    # The first machine runs serially (an xdist session that saves to a store: tests/plugin/test_headers.py).
    cold = run_inner(inner, *fresh("cold"))
    assert cold.ret == 0, cold.output
    assert cold.data["save"]["outcome"] == "saved", cold.data["save"]
    assert cold.data["restore"]["outcome"] == "miss", cold.data["restore"]
    for flag in flags.iterdir():
        flag.unlink()

    warm = run_inner(inner, *fresh("restored"), "-n", "2")

    assert warm.ret == 0, warm.output
    check_report(warm.data)
    assert warm.data["restore"]["outcome"] in ("exact", "partial"), warm.data["restore"]
    assert warm.data["restore"]["key"] == cold.data["save"]["key"]
    assert warm.totals["misses"] == 0 and warm.totals["hits"] == 2, warm.totals
    assert {t["worker"] for t in warm.data["tests"]} == {"gw0", "gw1"}, warm.data["tests"]
    assert (flags / "controller").read_text() == "0", "the controller imported torch"
    assert {p.name for p in flags.iterdir()} == {"controller", "gw0", "gw1"}
    # Every graph hit the restored cache: nothing new, nothing saved, and no ticket left in the dir.
    assert warm.data["save"]["outcome"] == "skipped", warm.data["save"]
    assert not list((inner.path / "restored").glob(".compilecache-restore-*")), "the restore ticket was left"

    # A -k run whose test changed: it missed, and a save would replace the restored bundle (the newest, which the
    # next run restores) with a bundle of test_project alone. The workers say what they deselected.
    bundles = sorted(p.name for p in store.iterdir())
    changed = MATMUL_SUITE.replace("torch.randn(8, 4), torch.randn(4, 2)", "torch.randn(6, 4), torch.randn(4, 2)")
    inner.makepyfile(test_suite=changed)
    subset = run_inner(inner, *fresh("subset"), "-n", "2", "-k", "test_project")
    assert subset.ret == 0, subset.output
    assert subset.totals["misses"] == 1, subset.totals
    assert subset.data["save"]["outcome"] == "skipped", subset.data["save"]
    message = subset.data["save"]["message"]
    assert message.startswith("the session left out 1 test that the restored bundle covers (test_suite.py::test_gram:")
    assert sorted(p.name for p in store.iterdir()) == bundles
    serial = run_inner(inner, *fresh("serial-subset"), "test_suite.py::test_project")  # the same, without xdist
    assert serial.ret == 0, serial.output
    assert serial.totals["misses"] == 1 and serial.data["save"]["outcome"] == "skipped", serial.data["save"]
    assert "left out 1 test" in serial.data["save"]["message"], serial.data["save"]
    assert sorted(p.name for p in store.iterdir()) == bundles


# One function meets two batch sizes. In one process torch compiles it for the first size, then again with a
# symbolic size (automatic dynamic shapes); a process that meets only the second compiles a static graph of
# its own, which a serial run's bundle does not hold (issue 25: xdist hands tests to workers in any order).
# A matmul: an extern kernel, so the three fresh cache dirs cost no C++ build (nor torch's ISA dry-compiles).
TWO_SIZES = """
import torch


def scale(x):
    return x @ x.t()


compiled = torch.compile(scale)


def test_small_batch():
    x = torch.randn(4, 16)
    torch.testing.assert_close(compiled(x), scale(x))


def test_large_batch():
    x = torch.randn(8, 16)
    torch.testing.assert_close(compiled(x), scale(x))
"""


@pytest.mark.slow
def test_with_pgo_a_serial_runs_bundle_serves_a_worker_that_meets_one_size(inner: pytest.Pytester) -> None:
    """``--compile-cache-pgo=on``: the serial run's bundle carries torch's shape profile, so an xdist worker
    that runs only the second size compiles the symbolic graph the bundle holds, as the serial run did, and
    hits. The control: without the option the same run compiles a static graph of its own, a miss."""
    inner.makeconftest(ENV_CONFTEST)
    inner.makepyfile(test_sizes=TWO_SIZES)
    store = inner.path / "store"

    def fresh(name: str, *more: str) -> list[str]:  # an empty cache dir of its own, the same store
        return ["--compile-cache=shared", f"--compile-cache-dir={inner.path / name}", f"--compile-cache-store={store}",
                "-p", "no:randomly", *more]  # fmt: skip

    cold = run_inner(inner, *fresh("cold", "--compile-cache-pgo=on"))
    assert cold.ret == 0, cold.output
    assert cold.totals["misses"] == 2 and cold.data["save"]["outcome"] == "saved", (cold.totals, cold.data["save"])

    one = ("--compile-cache-readonly", "-k", "large")
    worker = run_inner(inner, *fresh("worker", "--compile-cache-pgo=on", "-n", "2", *one))
    assert worker.ret == 0, worker.output
    check_report(worker.data)
    assert worker.data["restore"]["key"] == cold.data["save"]["key"], worker.data["restore"]
    assert worker.totals["misses"] == 0 and worker.totals["hits"] == 1, worker.totals

    control = run_inner(inner, *fresh("control", *one))
    assert control.ret == 0, control.output
    assert control.data["restore"]["key"] == cold.data["save"]["key"], control.data["restore"]
    assert control.totals["misses"] == 1, control.totals


# A worker that ends with exit status 2 (a test raised KeyboardInterrupt; pytest.exit does the same): xdist calls
# pytest_testnodedown for it twice, with the same output.
INTERRUPTED_WORKER = """
import time


def test_a():
    pass


def test_interrupts():
    time.sleep(0.5)  # the other worker's tests have finished by then
    raise KeyboardInterrupt


def test_c():
    pass


def test_d():
    pass
"""


def test_a_worker_xdist_reports_twice_is_counted_once(inner: pytest.Pytester) -> None:
    """Its statistics were merged twice: its tests (and, where they compiled, its hits and misses) counted double."""
    inner.makepyfile(test_interrupted=INTERRUPTED_WORKER)

    run = run_inner(inner, "--compile-cache=isolated", "-n", "2")

    outcomes = run.result.parseoutcomes()
    assert outcomes["failed"] == 1 and outcomes["passed"] >= 1
    assert run.data["totals"]["tests"] == outcomes["passed"]  # the tests that finished, each once
