"""Miss explanations across two real sessions run by the real plugin in a shared cache dir.

Until the integrator wires issue 12 into plugin.py/session.py, the inner project's conftest does that
wiring with the public functions the plugin will call (``probe.watch_graph_lookups``, ``graph_mark``,
``graph_delta``, ``explain.load_record``/``explain_session``/``save_record``, the proposed renderers), so
this proves the capture and the record across processes. When the plugin does it itself, drop the
conftest and keep the assertions.
"""

from __future__ import annotations

import pytest

from tests.plugin.helpers import run_inner

pytestmark = pytest.mark.slow

WIRING_CONFTEST = """
import os
from pathlib import Path

import pytest

from pytest_compilecache import explain
from pytest_compilecache import probe
from pytest_compilecache._explain_render_proposal import why_lines

_graphs = {}


def pytest_configure(config):
    probe.watch_graph_lookups()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    start = probe.graph_mark()
    try:
        return (yield)
    finally:
        _graphs[item.nodeid] = [explain.GraphLookup.from_json(g) for g in probe.graph_delta(start)]


def pytest_terminal_summary(terminalreporter, config):
    cache_dir = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])  # the plugin exported its session dir
    previous = explain.load_record(cache_dir)
    why, record = explain.explain_session(_graphs, previous, "previous session")
    explain.save_record(cache_dir, explain.carry_forward(record, previous))
    for line in why_lines(why):
        terminalreporter.write_line(line)
"""

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


def test_second_session_says_why_each_test_missed(inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    inner.makeconftest(WIRING_CONFTEST)
    inner.makepyfile(test_suite=SUITE)
    args = ("--compile-cache=shared", f"--compile-cache-dir={inner.path / 'cache'}")

    monkeypatch.setenv("INNER_ROWS", "8")
    first = run_inner(inner, *args, json_name="first.json")
    first.result.assert_outcomes(passed=3)
    assert "why tests missed" not in first.output  # nothing to compare with yet
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
