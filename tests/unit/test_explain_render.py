"""report.py's miss-explanation renderers: terminal lines, bounded Markdown and JSON."""

from __future__ import annotations

from pytest_compilecache.explain import MissExplanation
from pytest_compilecache.explain import SessionExplanation
from pytest_compilecache.report import never_hit_text
from pytest_compilecache.report import why_json
from pytest_compilecache.report import why_lines
from pytest_compilecache.report import why_markdown


def _why(count: int = 2) -> SessionExplanation:
    misses = {f"t.py::test_{i}": [MissExplanation("fkey", ["input 0 shape [8, 16] -> [8, 32]"])] for i in range(count)}
    misses["t.py::test_rand"] = [MissExplanation("fk2", ["graph code changed: a constant in graph statement 3"])]
    return SessionExplanation(misses, {"t.py::test_rand": ("a constant in graph statement 3", 2)}, "previous session")


def test_why_lines_put_never_hit_tests_first_and_cut_long_lists() -> None:
    lines = why_lines(_why())
    assert lines[0] == "why tests missed (compared with the previous session):"
    assert lines[1].startswith(
        "never hits t.py::test_rand: only a constant in graph statement 3 changed since the last run: if nothing was"
    )
    assert lines[2] == "why t.py::test_0: input 0 shape [8, 16] -> [8, 32]"
    assert len(lines) == 4  # the never-hit test is not listed twice
    cut = why_lines(_why(50), limit=5)
    assert len(cut) == 7 and cut[-1] == "... and 46 more (see --compile-cache-json)"
    assert why_lines(SessionExplanation()) == []


def test_why_markdown_is_collapsed_escaped_and_bounded() -> None:
    text = why_markdown(_why(), budget=10_000)
    assert text.startswith("\n<details><summary>Why these tests missed (compared with the previous session) (3)")
    assert "| `t.py::test_rand` | **never hits**: only a constant in graph statement 3 changed since" in text
    big = why_markdown(_why(500), budget=3000)
    assert len(big.encode()) <= 3000 and "more not shown" in big
    assert why_markdown(SessionExplanation(), budget=10_000) == ""
    assert why_markdown(_why(), budget=10) == ""


def test_why_json_is_plain_data() -> None:
    data = why_json(_why(1))
    assert data["compared_with"] == "previous session"
    assert data["misses"]["t.py::test_0"] == [{"key": "fkey", "reasons": ["input 0 shape [8, 16] -> [8, 32]"]}]
    assert data["never_hit"] == {"t.py::test_rand": {"what": "a constant in graph statement 3", "runs": 2}}


def test_never_hit_text_is_sure_only_after_three_runs() -> None:
    assert never_hit_text("a constant", 3).startswith("a constant changed in each of the last 3 runs: this test can")
    assert never_hit_text("a constant", 2).startswith("only a constant changed since the last run: if nothing")
