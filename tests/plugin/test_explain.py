"""Miss explanations across real sessions run by the real plugin in a shared cache dir (± xdist).

A first session records what each test looked up; a second with ``--compile-cache-explain=off`` misses and
says nothing, captures nothing and keeps that record; a third changes one input shape, adds a test and
re-rolls a random constant baked into a graph, and the terminal table (``--compile-cache-report=full``) and
the JSON report must both say so, compared with the first.
"""

from __future__ import annotations

import json

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


def scaled(b, x, w):
    return torch.addmm(b, x, w, alpha=SCALE)  # one extern kernel: no C++ build


def test_project():
    x, w = torch.randn(ROWS, 4), torch.randn(4, 2)
    torch.testing.assert_close(torch.compile(project)(x, w), project(x, w))


def test_same():
    x = torch.randn(3, 4)
    torch.testing.assert_close(torch.compile(lambda a: a.t() @ a)(x), x.t() @ x)


def test_random():
    b, x, w = torch.randn(8, 2), torch.randn(8, 4), torch.randn(4, 2)
    torch.testing.assert_close(torch.compile(scaled)(b, x, w), scaled(b, x, w))
"""

NEW = """
import torch


def test_new():
    x = torch.randn(5, 5)
    torch.testing.assert_close(torch.compile(lambda a: a @ a)(x), x @ x)
"""


# Each process writes, at its session end, whether the capture was wrapped around torch's lookup or waiting for
# torch's codecache to be imported: "off" must leave torch untouched in every process, xdist workers included.
CAPTURE_CONFTEST = """
import json
import os
import sys


def pytest_sessionfinish(session):
    codecache = sys.modules.get("torch._inductor.codecache")
    wrapped = codecache is not None and hasattr(codecache.FxGraphCache.load_with_key, "__wrapped__")
    # the graph capture waiting for torch's codecache (other watches, e.g. triton's cache or the headers', may wait)
    watching = any(
        type(f).__name__ == "_InstallOnImport"
        and any(getattr(i, "__name__", "") == "graph_capture_installed" for i in getattr(f, "installs", ()))
        for f in sys.meta_path
    )
    name = os.environ.get("PYTEST_XDIST_WORKER", "controller")
    state = {"codecache": codecache is not None, "wrapped": wrapped, "watching": watching}
    (session.config.rootpath / f"capture-{name}.json").write_text(json.dumps(state))
"""


def _capture_states(root: pytest.Pytester) -> list[dict[str, bool]]:
    paths = sorted(root.path.glob("capture-*.json"))
    states = [json.loads(path.read_text()) for path in paths]
    for path in paths:
        path.unlink()
    return states


@XDIST
def test_explain_off_captures_nothing_and_the_next_session_says_why_each_test_missed(
    inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, dist: tuple[str, ...]
) -> None:
    inner.makepyfile(test_suite=SUITE)
    inner.makeconftest(CAPTURE_CONFTEST)
    record = inner.path / "cache" / ".compilecache-graphs.json"
    args = (
        "--compile-cache=shared",
        f"--compile-cache-dir={inner.path / 'cache'}",
        "--compile-cache-report=full",
        *dist,
    )

    monkeypatch.setenv("INNER_ROWS", "8")
    first = run_inner(inner, *args, json_name="first.json")  # on by default: the baseline record
    first.result.assert_outcomes(passed=3)
    assert "why tests missed" not in first.output  # nothing to compare with yet
    assert first.report is not None and first.report["why"] is None
    assert first.record("test_project")["graphs"] >= 1 and first.record("test_project")["why"] == []
    assert record.is_file()
    assert any(state["wrapped"] for state in _capture_states(inner))
    kept = record.read_bytes()

    monkeypatch.setenv("INNER_ROWS", "16")
    off = run_inner(inner, *args, "--compile-cache-explain=off", json_name="off.json")
    off.result.assert_outcomes(passed=3)
    assert off.record("test_project")["fxgraph"]["miss"] >= 1  # it missed, and says nothing about why
    assert "why tests missed" not in off.output and "why test_suite.py" not in off.output
    assert off.data["why"] is None
    assert off.record("test_project")["graphs"] == 0 and off.record("test_project")["why"] == []
    assert record.read_bytes() == kept  # not rewritten: the next session compares with the first
    states = _capture_states(inner)
    assert len(states) == (3 if dist else 1) and any(state["codecache"] for state in states)
    assert not any(state["wrapped"] or state["watching"] for state in states), states

    monkeypatch.setenv("INNER_ROWS", "32")  # 16 rows hit now: the off session compiled them
    inner.makepyfile(test_new=NEW)
    second = run_inner(inner, *args, json_name="second.json")  # explain on again, by default

    second.result.assert_outcomes(passed=4)
    second.result.stdout.fnmatch_lines_random(
        [
            "why tests missed (compared with the previous session):",
            # each names the compiled function and its graph's input shapes, in the order the graph takes them
            # (torch 2.7 lifts scaled's three inputs in another order than 2.13 and 2.15)
            "why test_suite.py::test_random: scaled (test_suite.py:*), inputs [[]?, ?[]], [[]?, ?[]], [[]?, ?[]]: "
            "graph code changed: a constant in graph statement * (0.* -> 0.*)",
            "why test_suite.py::test_project: project (test_suite.py:*), inputs [[]32, 4], [[]4, 2]: "
            "input 0 shape [[]8, 4] -> [[]32, 4]",
            "why test_new.py::test_new: <lambda> (test_new.py:*), inputs [[]5, 5]: new test",
        ]
    )
    assert "test_same" not in second.output.split("why tests missed")[1]  # it hit: nothing to explain
    report = second.report
    assert report is not None
    check_report(report)
    assert report["why"]["compared_with"] == "previous session"
    project = second.record("test_project")
    assert project["why"] and any("input 0 shape [8, 4] -> [32, 4]" in r for w in project["why"] for r in w["reasons"])
    assert report["why"]["misses"]["test_new.py::test_new"][0]["reasons"] == ["new test"]
    assert report["why"]["never_hit"] == {}  # one change could be an edit: never-hit needs more runs (issue 29.10)
    assert second.record("test_same")["fxgraph"]["miss"] == 0 and second.record("test_same")["why"] == []
    assert "test_suite.py::test_same" not in report["why"]["misses"]


FORWARD_ONLY = """
import torch


def test_forward_only():
    x, w = torch.randn(8, 4), torch.randn(4, 2, requires_grad=True)
    torch.compile(lambda a: a @ w)(x)  # a training graph (w requires grad), and no backward
"""


def test_a_forward_only_test_hits_fx_misses_aot_every_run_and_the_full_report_says_why_once(
    inner: pytest.Pytester,
) -> None:
    """Issue 29.12 on a real session: not counted as a miss, and explained once."""
    inner.makepyfile(test_fw=FORWARD_ONLY)
    args = ("--compile-cache=shared", f"--compile-cache-dir={inner.path / 'cache'}", "--compile-cache-report=full")
    run_inner(inner, *args, json_name="first.json").result.assert_outcomes(passed=1)
    second = run_inner(inner, *args, json_name="second.json")
    second.result.assert_outcomes(passed=1)
    record = second.record("test_forward_only")
    assert record["fxgraph"]["hit"] >= 1 and record["fxgraph"]["miss"] == 0
    assert record["aotautograd"]["miss"] >= 1 and record["aotautograd"]["hit"] == 0  # torch saved no AOT entry
    notes = [line for line in second.output.splitlines() if "without its backward" in line]
    assert len(notes) == 1 and notes[0].startswith("note: 1 test (test_fw.py::test_forward_only) ran a training")
    assert second.data["why"]["forward_only"] == ["test_fw.py::test_forward_only"]
    check_report(second.data)
