"""Every kind of graph break torch logs, counted by the plugin as torch logs it (tests/plugin/oracle.py reads the log);
and the cache counts of tests that clear torch's counters, as torch counted them (the last test).

torch logs a break in full, or only as a duplicate when one of the same kind at the same place was logged before
(a recompiled frame breaking at the same place again; PyG's ``test_compile_basic``: 4 breaks, 2 logged in full):
a break all the same. torch's own counter ``counters["graph_break"]``, which the plugin read before, does not
count a data-dependent branch (the graph is split all the same) nor a frame torch gives up on (a break in a loop:
the frame runs uncompiled); the plugin counts what torch logs. Dynamo only (``backend="eager"``): seconds.
"""

from __future__ import annotations

import json
import os
from importlib.metadata import version
from pathlib import Path

import pytest

from tests.plugin import oracle as torch_oracle
from tests.plugin.helpers import run_inner

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]

SUITE = """
import torch


@torch.compile(backend="eager", dynamic=False)
def noisy(x):
    x = x + 1
    print("between graphs")
    return x * 2


@torch.compile(backend="eager")
def branch(x):
    x = x + 1
    if x.sum() > 0:
        return x * 2
    return x - 1


@torch.compile(backend="eager")
def looped(x):
    for _ in range(2):
        x = x + 1
        print("in a loop")
    return x


def test_break():
    assert noisy(torch.ones(3)).sum() == 12


def test_same_break_again_after_a_recompile():
    assert noisy(torch.ones(5)).sum() == 20


def test_data_dependent_branch():
    assert branch(torch.ones(3)).sum() == 12


def test_break_in_a_loop():
    assert looped(torch.ones(3)).sum() == 9
"""


def test_every_graph_break_torch_logs_is_counted_with_its_reason(
    inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    inner.makepyfile(test_user=SUITE)
    monkeypatch.setenv("TORCH_LOGS", torch_oracle.TORCH_LOGS)
    monkeypatch.setenv(torch_oracle.DIR_ENV, str(inner.path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))

    run = run_inner(inner, "-p", torch_oracle.__name__)

    run.result.assert_outcomes(passed=4)
    told, said = torch_oracle.oracle(inner.path), torch_oracle.plugin(run.data)
    for nodeid in sorted(set(told) | set(said)):
        found = torch_oracle.mismatches(
            told.get(nodeid, torch_oracle.empty_oracle()), said.get(nodeid, torch_oracle.empty_plugin())
        )
        assert found == [], nodeid
    first, again = told["test_user.py::test_break"], told["test_user.py::test_same_break_again_after_a_recompile"]
    # The recompile's break is logged as a duplicate of the first test's; it is a break all the same.
    assert len(first["breaks"]) == len(again["breaks"]) == 1 and first["breaks"] == again["breaks"]
    assert said["test_user.py::test_same_break_again_after_a_recompile"]["break_count"] == 1
    # Not in torch's counter, in the plugin's report: one break each, with torch's reason. torch 2.13 and 2.15 say
    # what they did about the loop ("Failed to handle graph break gracefully": the frame runs uncompiled).
    for name, reason in [("data_dependent_branch", "Data-dependent branching"), ("break_in_a_loop", "`print`")]:
        nodeid = f"test_user.py::test_{name}"
        assert said[nodeid]["break_count"] == 1 and len(said[nodeid]["breaks"]) == 1, said[nodeid]
        assert reason in said[nodeid]["breaks"][0]
    if tuple(int(part) for part in version("torch").split(".")[:2]) >= (2, 13):
        assert said["test_user.py::test_break_in_a_loop"]["breaks"][0].startswith("Failed to handle graph break")


# Tests that clear torch's counters before and after their body, as torch's own ``TestCase`` does in ``setUp`` and
# ``tearDown`` (a unittest class here: torch's needs ``expecttest``) and "fresh Dynamo" fixtures do. The oracle is
# torch's counters read at the end of each body, written to oracle.jsonl. Matmuls: Inductor's FX-graph cache with
# extern kernels, no C++ build.
CLEARING_SUITE = """
import json
import unittest

import pytest
import torch
from torch._dynamo.utils import counters


def record(name):
    fx = {k: counters["inductor"]["fxgraph_cache_" + k] for k in ("hit", "miss", "bypass")}
    with open("oracle.jsonl", "a") as out:
        out.write(json.dumps({"test": name, "fxgraph": fx}) + "\\n")


def square(x):
    return x @ x


def cube(x):
    return (x @ x) @ x


def fresh():
    torch._dynamo.reset()
    counters.clear()


class TestCleared(unittest.TestCase):
    setUp = tearDown = staticmethod(fresh)

    def test_miss_then_hit(self):
        torch.compile(square)(torch.ones(4, 4))
        torch._dynamo.reset()  # Dynamo compiles again; Inductor's FX-graph cache has the graph: a hit
        torch.compile(square)(torch.ones(4, 4))
        record("test_clearing.py::TestCleared::test_miss_then_hit")


@pytest.fixture
def fresh_dynamo():
    fresh()
    yield
    fresh()


def test_fixture_cleared(fresh_dynamo):
    torch.compile(cube)(torch.ones(4, 4))
    record("test_clearing.py::test_fixture_cleared")
"""


def test_tests_that_clear_torchs_counters_are_counted_as_torch_counted_them(inner: pytest.Pytester) -> None:
    """Each counted 0 hits and 0 misses before, and ``--compile-cache-min-hit-rate`` passed on a cold run."""
    inner.makepyfile(test_clearing=CLEARING_SUITE)

    run = run_inner(inner, "--compile-cache=isolated", "--compile-cache-min-hit-rate=0.9")

    run.result.assert_outcomes(passed=2)
    told = [json.loads(line) for line in (inner.path / "oracle.jsonl").read_text().splitlines()]
    assert [entry["fxgraph"] for entry in told] == [
        {"hit": 1, "miss": 1, "bypass": 0},
        {"hit": 0, "miss": 1, "bypass": 0},
    ]
    tests = {test["nodeid"]: test for test in run.data["tests"]}
    for entry in told:
        assert tests[entry["test"]]["fxgraph"] == entry["fxgraph"], entry["test"]
    assert run.data["totals"]["fxgraph"]["miss"] == 2
    assert run.result.ret != 0 and "hit rate" in run.result.stdout.str()  # 1 of 3: below the floor


# A compile while pytest imports the rootdir's conftest, before the plugin's pytest_configure: in every process
# that imports it (the xdist controller and each worker). Dynamo alone (backend "eager") for the break and the
# recompile limit: no Inductor compile.
ROOT_CONFTEST = """
import torch


def _warm(x, w):
    return x @ w


torch.compile(_warm, dynamic=False)(torch.randn(91, 91), torch.randn(91, 91))


@torch.compile(backend="eager")
def _breaks(x):
    x = x + 1
    print("a graph break at the conftest's import")
    return x * 2


_breaks(torch.ones(3))


@torch.compile(backend="eager", dynamic=False)
def _limited(x):
    return x + 2


with torch._dynamo.config.patch(recompile_limit=1):
    _limited(torch.ones(1))
    _limited(torch.ones(2))
"""

# A compile while the test module is imported (collection, after the plugin's pytest_configure, before any
# test starts) that bypasses the FX-graph cache (a custom pass with no uuid): an extern matmul, no C++ build.
ONE_TEST = """
import torch
import torch._inductor.config


def _custom(graph):
    return None


with torch._inductor.config.patch(post_grad_custom_post_pass=_custom):
    torch.compile(lambda a, b: a @ b, dynamic=False)(torch.randn(95, 95), torch.randn(95, 95))


def test_one():
    torch.compile(lambda x, w: x @ w, dynamic=False)(torch.randn(93, 93), torch.randn(93, 93))
"""


def test_a_compile_in_the_root_conftest_is_counted_outside_the_tests(inner: pytest.Pytester) -> None:
    """It was taken for the session's baseline (the recorder starts after the initial conftests), and an xdist
    controller's own compiles were not collected: torch counted 2 misses where the report said 1, and with
    ``-n 1`` 1 hit and 2 misses where it said 0 and 1. Its graph (what the next run's miss is explained with),
    graph break and recompile-limit hit, and a bypass at collection with torch's reason, are there too: the
    watches were installed only at the plugin's configure, the log taps at the first test's start."""
    inner.makeconftest(ROOT_CONFTEST)
    inner.makepyfile(test_one=ONE_TEST)

    serial = run_inner(inner, f"--compile-cache-dir={inner.path / 'one'}", "-p", "no:xdist")
    # the controller compiles into a fresh dir and misses; its worker imports the conftest again and hits
    xdist = run_inner(inner, f"--compile-cache-dir={inner.path / 'two'}", "-n", "1", json_name="xdist.json")

    for run, outside, processes in (
        (serial, {"hit": 0, "miss": 1, "bypass": 1}, 1),
        (xdist, {"hit": 1, "miss": 1, "bypass": 1}, 2),
    ):
        run.result.assert_outcomes(passed=1)
        tests = {test["nodeid"]: test for test in run.data["tests"]}
        assert {nodeid: test["fxgraph"] for nodeid, test in tests.items()} == {
            "(outside tests)": outside,
            "test_one.py::test_one": {"hit": 0, "miss": 1, "bypass": 0},
        }
        before = tests["(outside tests)"]
        assert before["bypass_reasons"] == ["Unsupported post grad custom pass"]
        assert before["graph_breaks"] == processes  # the conftest's import, in every process that imports it
        assert [(hit["function"], hit["count"]) for hit in before["limit_hit"]] == [
            ("_limited (conftest.py:21)", processes)
        ]
    record = json.loads((inner.path / "one" / ".compilecache-graphs.json").read_text())
    assert "(outside tests)" in json.dumps(record)  # the conftest's graph: the next run explains its miss


INTERRUPTING = """
import torch


def test_interrupts():
    torch.compile(lambda x, w: x @ w, dynamic=False)(torch.randn(42, 42), torch.randn(42, 42))
    raise KeyboardInterrupt
"""


def test_a_test_that_interrupts_the_session_keeps_its_own_counts(inner: pytest.Pytester) -> None:
    """pytest never finishes the test that raised KeyboardInterrupt (no ``pytest_runtest_logfinish``): its compile
    was counted in ``(outside tests)``; it is the test's."""
    inner.makepyfile(test_interrupting=INTERRUPTING)

    run = run_inner(inner, "--compile-cache=isolated", "-p", "no:xdist")

    assert run.result.ret == pytest.ExitCode.INTERRUPTED
    tests = {test["nodeid"]: test["fxgraph"] for test in run.data["tests"]}
    assert tests == {"test_interrupting.py::test_interrupts": {"hit": 0, "miss": 1, "bypass": 0}}
