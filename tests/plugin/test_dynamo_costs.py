"""Dynamo's costs per test against torch's own logs, on a user-shaped suite run by the real plugin (± xdist).

The oracle is torch's logging: ``TORCH_LOGS=recompiles,graph_breaks`` makes torch log each recompile with its
guard failures and each graph break with its reason, and torch always warns when a frame hits the recompile
limit. The inner conftest tags every record torch logs with the test that was running in that process; the
plugin's JSON report must name, per test, the same recompiles (function and first guard failure), the same
number of graph breaks with the same reasons, and the same frames that hit the limit. The suite compiles with
``backend="eager"`` (Dynamo only, no inductor): seconds, not minutes. Part of ``-m compat`` (tests/plugin), so
CI checks the oldest and newest torch too.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.plugin.helpers import XDIST
from tests.plugin.helpers import check_report
from tests.plugin.helpers import run_inner

pytestmark = pytest.mark.slow

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

# Every record torch logs, with the test running in this process when it was logged: one JSON line each, one
# file per process (xdist workers included). Attached to "torch._dynamo", where Dynamo's loggers end (torch
# propagates no further).
ORACLE_CONFTEST = """
import json
import logging
import os

import torch

_running = ["(no test)"]
_path = os.path.join(os.path.dirname(__file__), "oracle-%s.jsonl" % os.environ.get("PYTEST_XDIST_WORKER", "main"))


class _Tagged(logging.Handler):
    def emit(self, record):
        with open(_path, "a") as fh:
            fh.write(json.dumps({"test": _running[0], "logger": record.name, "message": record.getMessage()}) + "\\n")


logging.getLogger("torch._dynamo").addHandler(_Tagged(logging.DEBUG))


def pytest_runtest_logstart(nodeid, location):
    _running[0] = nodeid
"""

_RECOMPILING = r"Recompiling function (\S+) in .*?\n.*?triggered by the following guard failure\(s\):\n\s*- (.*)"
# torch logs a break again each time it retraces the frame, marked "(user stack suppressed due to duplicate graph
# break)": the same break, which its counter counts once (seen on kornia's canny, a loop retraced three times).
_GRAPH_BREAK = r"\AGraph break in user code at"
_LIMIT = r"torch._dynamo hit config\.\w+ \(\d+\)\n\s*function: '([^']+)'"


def _oracle(root: Path) -> dict[str, dict[str, Any]]:
    """Per test, what torch logged: recompiles as (function, first guard failure), graph breaks as their
    reasons' first lines, and the functions that hit the recompile limit."""
    found: dict[str, dict[str, Any]] = {}
    for path in sorted(root.glob("oracle-*.jsonl")):
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            facts = found.setdefault(entry["test"], {"recompiles": [], "breaks": [], "limits": []})
            message = entry["message"]
            recompile = re.search(_RECOMPILING, message)
            if recompile:
                reason = re.sub(r"\A\d+/\d+: ", "", recompile.group(2).strip())
                facts["recompiles"].append((recompile.group(1), " ".join(reason.split())))
            elif re.search(_GRAPH_BREAK, message):
                facts["breaks"].append(" ".join(message.split("Graph Break Reason: ", 1)[1].split()))
            limit = re.search(_LIMIT, message)
            if limit:
                facts["limits"].append(limit.group(1))
    return found


def _plugin(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per test, the same facts as the plugin's JSON report says them."""
    found = {}
    for test in report["tests"]:
        recompiles = [
            (entry["function"].split(" (")[0], entry["reason"])
            for entry in test["recompiled"]
            for _ in range(entry["count"])
        ]
        found[test["nodeid"]] = {
            "recompiles": recompiles,
            "breaks": test["graph_break_reasons"],
            "break_count": test["graph_breaks"],
            "limits": [hit["function"].split(" (")[0] for hit in test["limit_hit"]],
        }
    return found


@XDIST
def test_recompiles_limits_and_graph_breaks_per_test_equal_torchs_own_logs(
    inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, dist: tuple[str, ...]
) -> None:
    inner.makepyfile(test_user=SUITE)
    inner.makeconftest(ORACLE_CONFTEST)
    monkeypatch.setenv("TORCH_LOGS", "recompiles,graph_breaks")

    run = run_inner(inner, *dist)

    run.result.assert_outcomes(passed=5)
    assert run.report is not None
    check_report(run.report)
    oracle, plugin = _oracle(inner.path), _plugin(run.report)
    for nodeid in sorted(set(oracle) | set(plugin)):
        told = oracle.get(nodeid, {"recompiles": [], "breaks": [], "limits": []})
        said = plugin.get(nodeid, {"recompiles": [], "breaks": [], "break_count": 0, "limits": []})
        assert Counter(said["recompiles"]) == Counter(told["recompiles"]), nodeid
        assert said["break_count"] == len(told["breaks"]), nodeid
        assert len(said["breaks"]) == len(set(told["breaks"])), nodeid  # distinct reasons, each torch's own
        for ours in said["breaks"]:  # "<what failed>: <torch's explanation>", both in torch's logged reason
            assert any(all(part in theirs for part in ours.split(": ", 1)) for theirs in told["breaks"]), ours
        assert said["limits"] == told["limits"], nodeid
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


def test_the_opt_in_fails_the_test_whose_frame_would_run_uncompiled(inner: pytest.Pytester) -> None:
    inner.makepyfile(test_user=SUITE)

    run = run_inner(inner, "--compile-cache-fail-on-eager-fallback")

    run.result.assert_outcomes(passed=4, failed=1)
    run.result.stdout.fnmatch_lines(["FAILED test_user.py::test_limit_falls_back_to_eager - *"])
    assert run.report is not None
    [hit] = run.report["dynamo"]["ran_uncompiled"]
    assert hit["nodeid"] == "test_user.py::test_limit_falls_back_to_eager"
