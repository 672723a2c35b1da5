"""Dynamo's costs per test against torch's own logs, on a user-shaped suite run by the real plugin (± xdist).

The oracle is torch's logging: ``TORCH_LOGS=recompiles,graph_breaks`` makes torch log each recompile with its
guard failures and each graph break with its reason, and torch always warns when a frame hits the recompile
limit. The tap (tests/plugin/oracle.py, loaded with ``-p``) tags every record torch logs with the test that was
running in that process; the plugin's JSON report must name, per test, the same recompiles (function and first
guard failure), the same number of graph breaks with the same reasons, and the same frames that hit the limit;
``oracle.mismatches``, which bench/dynamo_oracle.py runs on outside suites, must agree. The suite compiles with
``backend="eager"`` (Dynamo only, no inductor): seconds, not minutes. Part of ``-m compat`` (tests/plugin), so
CI checks the oldest and newest torch too.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.version import Version

from tests.plugin import oracle as torch_oracle
from tests.plugin.helpers import XDIST
from tests.plugin.helpers import check_report
from tests.plugin.helpers import run_inner

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]  # the repository: the inner session imports the tap from it

SUITE = """
import torch


@torch.compile(backend="eager", dynamic=False)
def scale(x):
    return x * 2


@torch.compile(backend="eager", dynamic=False)
def times(x):
    return x * 3


@torch.compile(backend="eager")
def noisy(x):
    x = x + 1
    print("between graphs")
    return x * 2


def test_first_shape():
    assert scale(torch.ones(4)).sum() == 8


def test_second_shape():
    assert scale(torch.ones(8)).sum() == 16


def test_limit_falls_back_to_eager():
    with torch._dynamo.config.patch(recompile_limit=2):
        for n in range(1, 5):
            assert times(torch.ones(n)).sum() == 3 * n


def test_graph_break():
    assert noisy(torch.ones(3)).sum() == 12


def test_no_compile():
    assert torch.ones(2).sum() == 2
"""


@XDIST
def test_recompiles_limits_and_graph_breaks_per_test_equal_torchs_own_logs(
    inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, dist: tuple[str, ...]
) -> None:
    inner.makepyfile(test_user=SUITE)
    monkeypatch.setenv("TORCH_LOGS", torch_oracle.TORCH_LOGS)
    monkeypatch.setenv(torch_oracle.DIR_ENV, str(inner.path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))

    run = run_inner(inner, "-p", torch_oracle.__name__, *dist)

    run.result.assert_outcomes(passed=5)
    assert run.report is not None
    check_report(run.report)
    oracle, plugin = torch_oracle.oracle(inner.path), torch_oracle.plugin(run.report)
    for nodeid in sorted(set(oracle) | set(plugin)):
        told = oracle.get(nodeid, torch_oracle.empty_oracle())
        said = plugin.get(nodeid, torch_oracle.empty_plugin())
        assert Counter(said["recompiles"]) == Counter(told["recompiles"]), nodeid
        assert said["break_count"] == len(told["breaks"]), nodeid
        assert len(said["breaks"]) == len(set(told["breaks"])), nodeid  # distinct reasons, each torch's own
        for ours in said["breaks"]:  # "<what failed>: <torch's explanation>", both in torch's logged reason
            assert any(all(part in theirs for part in ours.split(": ", 1)) for theirs in told["breaks"]), ours
        assert said["limits"] == told["limits"], nodeid
        assert torch_oracle.mismatches(told, said) == [], nodeid  # the bench's comparison, FX and AOT counts too
    # The suite's shape, so that the comparison above compared something.
    limit = plugin["test_user.py::test_limit_falls_back_to_eager"]
    assert limit["limits"] == ["times"] and len(limit["recompiles"]) == 2
    assert plugin["test_user.py::test_graph_break"]["break_count"] == 1
    assert "test_user.py::test_no_compile" not in plugin
    # The short report names the test whose frame ran uncompiled; the totals add up.
    uncompiled = "ran uncompiled: test_user.py::test_limit_falls_back_to_eager: times (test_user.py:*) hit"
    run.result.stdout.fnmatch_lines([uncompiled + " recompile_limit = 2*"])
    dynamo = run.report["dynamo"]
    assert (
        dynamo["recompiles"] == run.report["totals"]["recompiles"] == sum(len(p["recompiles"]) for p in plugin.values())
    )
    assert dynamo["graph_breaks"] == run.report["totals"]["graph_breaks"] == 1
    assert [hit["nodeid"] for hit in dynamo["ran_uncompiled"]] == ["test_user.py::test_limit_falls_back_to_eager"]
    # A second shape in another test names the test that compiled the frame first (one process ran both: always
    # without xdist; with it, when both ran on one worker).
    records = {test["nodeid"]: test for test in run.report["tests"]}
    second = records.get("test_user.py::test_second_shape", {"recompiled": []})
    assert {entry["first"] for entry in second["recompiled"]} <= {"test_user.py::test_first_shape"}
    assert second["recompiled"] or dist
    limited = records["test_user.py::test_limit_falls_back_to_eager"]["recompiled"]
    assert {entry["first"] for entry in limited} == {"test_user.py::test_limit_falls_back_to_eager"}

    # Issue 41, finding 1: this run's full report stays readable afterwards, without a rerun.
    kept = subprocess.run(
        [sys.executable, "-m", "pytest_compilecache", "report"], cwd=inner.path, capture_output=True, text=True
    )
    assert kept.returncode == 0, kept.stderr
    assert "dynamo costs by test (" in kept.stdout
    assert "test_user.py::test_graph_break: 1 graph break: " in kept.stdout


# The frame reaches the limit in a test other than the one that compiled it: that test's records of the frame
# carry no name (torch records the compile it raised at without one).
LIMIT_IN_A_LATER_TEST = """
import torch


@torch.compile(backend="eager", dynamic=False)
def thrice(x):
    return x * 3


def test_sizes_one_and_two():
    with torch._dynamo.config.patch(recompile_limit=2):
        thrice(torch.ones(1))
        thrice(torch.ones(2))


def test_size_three():
    with torch._dynamo.config.patch(recompile_limit=2):
        thrice(torch.ones(3))
"""


def test_the_opt_in_fails_the_test_whose_frame_would_run_uncompiled(inner: pytest.Pytester) -> None:
    inner.makepyfile(test_user=SUITE, test_later=LIMIT_IN_A_LATER_TEST)

    run = run_inner(inner, "--compile-cache-fail-on-eager-fallback")

    run.result.assert_outcomes(passed=5, failed=2)
    run.result.stdout.fnmatch_lines(["FAILED test_user.py::test_limit_falls_back_to_eager - *"])
    assert run.report is not None
    # torch raised instead of running the frame uncompiled: the failure says so, the report does not repeat it.
    assert run.report["dynamo"]["ran_uncompiled"] == []
    assert "ran uncompiled" not in run.result.stdout.str()
    # The failed test's recompiles still name their frame (torch records the one it raised at without a name).
    records = {test["nodeid"]: test for test in run.report["tests"]}
    recompiled = records["test_user.py::test_limit_falls_back_to_eager"]["recompiled"]
    assert recompiled and all(entry["function"].startswith("times (test_user.py:") for entry in recompiled), recompiled
    # torch 2.13 and 2.15 record the compile they raised at (2.7 records none: no record, nothing to name).
    later = records.get("test_later.py::test_size_three", {"recompiled": []})["recompiled"]
    assert all(entry["function"].startswith("thrice (test_later.py:") for entry in later), later
    assert later or Version(version("torch")).release[:2] < (2, 13), records
