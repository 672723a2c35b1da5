"""dynamo_costs: recompiles, frames that ran uncompiled and graph breaks, rendered for the terminal, JSON, Markdown."""

from __future__ import annotations

from typing import Any

from pytest_compilecache import dynamo_costs
from pytest_compilecache import report
from pytest_compilecache.stats import ItemRecord
from pytest_compilecache.stats import SessionStats
from tests.markdown import shown

LIMIT = {"function": "times (t.py:9)", "limit": "recompile_limit = 8", "reason": "tensor 'x' size mismatch"}
RECOMPILE = {"function": "scale (t.py:4)", "reason": "tensor 'x' size mismatch at index 0. expected 4, actual 8"}


def _stats(*deltas: tuple[str, dict[str, Any]], tests: int = 6) -> SessionStats:
    stats = SessionStats(tests=tests)
    for nodeid, delta in deltas:
        record = ItemRecord(nodeid)
        record.add({"frames": 1, **delta})
        stats.add_record(record)
    return stats


COSTLY = _stats(
    ("t.py::test_first", {}),
    ("t.py::test_second", {"recompiles": 1, "recompiled": [{**RECOMPILE, "first": "t.py::test_first"}]}),
    ("t.py::test_limit", {"recompiles": 2, "recompiled": [{**RECOMPILE, "first": "t.py::test_limit"}] * 2}),
    ("t.py::test_limit", {"limit_hit": [LIMIT]}),
    ("t.py::test_print", {"graph_breaks": 2, "graph_break_reasons": ["Failed to trace builtin operator: print"]}),
)


def test_a_session_that_neither_recompiled_nor_broke_a_graph_renders_nothing() -> None:
    calm = _stats(("t.py::a", {}), ("t.py::b", {"frames": 3}))
    assert dynamo_costs.headline(calm) == []
    assert dynamo_costs.uncompiled_lines(calm) == dynamo_costs.full_lines(calm) == []
    assert dynamo_costs.markdown(calm, 10_000) == "" and dynamo_costs.uncompiled_markdown(calm) == []
    assert dynamo_costs.to_json(calm) == {"recompiles": 0, "graph_breaks": 0, "ran_uncompiled": [], "top": []}


def test_the_summary_line_counts_them_and_the_short_report_names_the_frame_that_ran_uncompiled() -> None:
    assert report.summary_line(COSTLY, "shared:/c").endswith(
        "0.0 s compiling, 3 recompiles, 2 graph breaks, 1 frame ran uncompiled, dir shared:/c"
    )
    [line] = dynamo_costs.uncompiled_lines(COSTLY)
    assert line.startswith(
        "ran uncompiled: t.py::test_limit: times (t.py:9) hit recompile_limit = 8 (last guard failure: tensor 'x' "
        "size mismatch); from then on torch compiles it no more in this process"
    )
    outcome = report.SessionOutcome(stats=COSTLY, mode="shared", cache_dir="/c", where="shared:/c")
    assert [text for text, _ in report.session_lines(outcome, report="short")][1] == line
    many = _stats(*[(f"t.py::test_{i}", {"limit_hit": [LIMIT]}) for i in range(5)])
    assert dynamo_costs.uncompiled_lines(many)[-1] == (
        "... and 2 more frames ran uncompiled (python -m pytest_compilecache report)"
    )


def test_the_full_report_lists_each_cost_of_the_costliest_tests_first() -> None:
    assert dynamo_costs.full_lines(COSTLY) == [
        "dynamo costs by test (3 recompiles, 2 graph breaks, 1 frame ran uncompiled):",
        "  t.py::test_limit: ran uncompiled: times (t.py:9) hit recompile_limit = 8 (last guard failure: tensor 'x' "
        "size mismatch)",
        "  t.py::test_limit: recompiled scale (t.py:4) x2: tensor 'x' size mismatch at index 0. expected 4, actual 8 "
        "(first compiled by this test)",
        "  t.py::test_print: 2 graph breaks: Failed to trace builtin operator: print",
        "  t.py::test_second: recompiled scale (t.py:4): tensor 'x' size mismatch at index 0. expected 4, actual 8 "
        "(first compiled by t.py::test_first)",
    ]


def test_json_and_markdown_carry_the_totals_and_the_top_offenders() -> None:
    data = report.to_json(COSTLY, mode="shared", cache_dir="/c")["dynamo"]
    assert (data["recompiles"], data["graph_breaks"]) == (3, 2)
    assert data["ran_uncompiled"] == [{"nodeid": "t.py::test_limit", **LIMIT, "count": 1}]
    assert [top["nodeid"] for top in data["top"]] == ["t.py::test_limit", "t.py::test_print", "t.py::test_second"]
    text = shown(report.markdown(COSTLY, where="shared:/c"))
    assert "- **ran uncompiled**: `t.py::test_limit`: times (t.py:9) hit recompile_limit = 8" in text
    assert "Recompiles, graph breaks, frames that ran uncompiled (3 recompiles, 2 graph breaks, 1 frame" in text
    assert dynamo_costs.markdown(COSTLY, 300).count("more not shown") == 1  # bounded, the markup kept whole
