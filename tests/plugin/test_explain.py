"""Miss explanations across two real sessions run by the real plugin in a shared cache dir (± xdist).

The second session changes one input shape, adds a test and re-rolls a random constant baked into a graph;
the terminal table (``--compile-cache-report=full``) and the JSON report must both say so.
"""

from __future__ import annotations

import pytest

from tests.plugin.helpers import XDIST
from tests.plugin.helpers import check_report
from tests.plugin.helpers import run_inner

pytestmark = pytest.mark.slow

SUITE = """
import os
import random

import torch

ROWS = int(os.environ["INNER_ROWS"])
SCALE = random.random()  # unseeded, baked into the graph as a constant: a new graph every session


def project(x, w):
    return x @ w


def scaled(x, w):
    return (x @ w) * SCALE


def test_project():
    x, w = torch.randn(ROWS, 4), torch.randn(4, 2)
    torch.testing.assert_close(torch.compile(project)(x, w), project(x, w))


def test_same():
    x = torch.randn(3, 4)
    torch.testing.assert_close(torch.compile(lambda a: a.t() @ a)(x), x.t() @ x)


def test_random():
    x, w = torch.randn(8, 4), torch.randn(4, 2)
    torch.testing.assert_close(torch.compile(scaled)(x, w), scaled(x, w))
"""

NEW = """
import torch


def test_new():
    x = torch.randn(5, 5)
    torch.testing.assert_close(torch.compile(lambda a: a @ a)(x), x @ x)
"""


@XDIST
def test_second_session_says_why_each_test_missed(
    inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, dist: tuple[str, ...]
) -> None:
    inner.makepyfile(test_suite=SUITE)
    args = (
        "--compile-cache=shared",
        f"--compile-cache-dir={inner.path / 'cache'}",
        "--compile-cache-report=full",
        *dist,
    )

    monkeypatch.setenv("INNER_ROWS", "8")
    first = run_inner(inner, *args, json_name="first.json")
    first.result.assert_outcomes(passed=3)
    assert "why tests missed" not in first.output  # nothing to compare with yet
    assert first.report is not None and first.report["why"] is None
    assert first.record("test_project")["graphs"] >= 1 and first.record("test_project")["why"] == []
    assert (inner.path / "cache" / ".compilecache-graphs.json").is_file()

    monkeypatch.setenv("INNER_ROWS", "16")
    inner.makepyfile(test_new=NEW)
    second = run_inner(inner, *args, json_name="second.json")

    second.result.assert_outcomes(passed=4)
    second.result.stdout.fnmatch_lines_random(
        [
            "why tests missed (compared with the previous session):",
            "never hits test_suite.py::test_random: only a constant in graph statement * changed since the last run*",
            "why test_suite.py::test_project: input 0 shape [[]8, 4] -> [[]16, 4]",
            "why test_new.py::test_new: new test",
        ]
    )
    assert "test_same" not in second.output.split("why tests missed")[1]  # it hit: nothing to explain
    report = second.report
    assert report is not None
    check_report(report)
    assert report["why"]["compared_with"] == "previous session"
    project = second.record("test_project")
    assert project["why"] and any("input 0 shape [8, 4] -> [16, 4]" in r for w in project["why"] for r in w["reasons"])
    assert report["why"]["misses"]["test_new.py::test_new"][0]["reasons"] == ["new test"]
    assert report["why"]["never_hit"]["test_suite.py::test_random"]["runs"] == 2
    assert second.record("test_same")["fxgraph"]["miss"] == 0 and second.record("test_same")["why"] == []
    assert "test_suite.py::test_same" not in report["why"]["misses"]
