"""report.py's miss-explanation renderers: terminal lines, bounded Markdown and JSON."""

from __future__ import annotations

from pytest_compilecache.explain import MissExplanation
from pytest_compilecache.explain import SessionExplanation
from pytest_compilecache.report import MARKDOWN_LIMIT
from pytest_compilecache.report import markdown
from pytest_compilecache.report import never_hit_text
from pytest_compilecache.report import why_json
from pytest_compilecache.report import why_lines
from pytest_compilecache.report import why_markdown
from pytest_compilecache.stats import ItemRecord
from pytest_compilecache.stats import SessionStats


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


def test_a_never_hit_test_still_says_why_its_other_graphs_missed() -> None:
    """The flag is about one graph (its constant keeps changing); another graph of the test that missed for a shape
    it changed is still said, in every renderer, and the short report counts it."""
    from pytest_compilecache.miss_report import test_reason

    flagged = MissExplanation("k1", ["graph code changed: a constant in graph statement 1 (0.25 -> 0.75)"], "scaled")
    shaped = MissExplanation("k2", ["input 0 shape [5, 4] -> [6, 4]"], "shaped (t.py:9)")
    twelve = MissExplanation("k3", ["graph code changed: a constant in graph statement 12 (5 -> 6)"], "g (t.py:20)")
    why = SessionExplanation(
        {"t.py::test_scaled": [flagged, shaped, twelve]},
        {"t.py::test_scaled": ("a constant in graph statement 1", 4)},
        "bundle",
    )
    lines = why_lines(why)
    # the flag names the function whose graph it is about, as every other reason does
    assert lines[1].startswith("never hits t.py::test_scaled: scaled: a constant in graph statement 1 took a new")
    assert lines[2:] == [
        "why t.py::test_scaled: shaped (t.py:9): input 0 shape [5, 4] -> [6, 4]",
        "why t.py::test_scaled: g (t.py:20): graph code changed: a constant in graph statement 12 (5 -> 6)",
    ]
    section = why_markdown(why, 10_000)
    assert "(3)</summary>" in section and "shape \\[5, 4\\] -\\> \\[6, 4\\]" in section and "statement 12" in section
    assert test_reason("t.py::test_scaled", why).endswith("(and 2 other reasons)")
    assert test_reason("t.py::test_scaled", why).startswith("scaled: a constant in graph statement 1 took a new")
    assert "| **never hits**: scaled\\: a constant in graph statement 1" in section


def test_never_hit_text_is_sure_only_after_three_runs() -> None:
    # `runs` counts the runs, each with its own value: 3 runs are 2 changes (a constant that changed 3 times in a
    # row took a new value in each of the last 4 runs).
    assert never_hit_text("a constant", 3).startswith("a constant took a new value in each of the last 3 runs: this")
    assert never_hit_text("a constant", 2).startswith("only a constant changed since the last run: if nothing")


def test_why_text_from_a_hostile_bundle_is_inert() -> None:
    hostile = "shape [1] -> [2]\n::error::x </details><script>alert(1)</script> [a](http://x) `code` |cell"
    why = SessionExplanation({"t.py::test_`x`|y": [MissExplanation("k", [hostile])]}, {}, "bundle")
    text = why_markdown(why, budget=10_000)
    assert "<script>" not in text and "</details><script>" not in text and "](http" not in text.replace("\\]", "")
    assert "``t.py::test_`x`\\|y``" in text  # md_code: a fence longer than any backtick run inside
    assert text.count("\n") == why_markdown(SessionExplanation({"t::a": [MissExplanation("k", ["r"])]}), 10_000).count(
        "\n"
    )  # the reason's newline stays inside its row
    [_, line] = why_lines(why)
    assert "\n" not in line and line.startswith("why t.py::test_`x`|y: shape [1] -> [2]\\n::error::x")


def test_the_whole_step_summary_stays_under_the_limit_with_explanations() -> None:
    stats = SessionStats()
    for i in range(3000):
        record = ItemRecord(nodeid=f"tests/test_{i}.py::test_{'x' * 80}")
        record.add({"fxgraph": {"miss": 1}, "frames": 1, "compile_seconds": 0.5})
        stats.add_record(record)
    stats.tests = 3000
    why = _why(3000)
    text = markdown(stats, where="shared:/c", why=why)
    assert len(text.encode()) <= MARKDOWN_LIMIT
    assert "Why these tests missed (compared with the previous session) (3001)" in text
    assert text.rstrip().endswith("</details>") and "more not shown (see the JSON report)" in text
    small = markdown(stats, where="shared:/c", why=why, limit=50_000)
    assert len(small.encode()) <= 50_000 and "Why these tests missed" in small
    assert "Why these tests missed" not in markdown(stats, where="shared:/c")


def test_the_forward_only_note_is_said_once_in_the_full_report() -> None:
    """Issue 29.12: tests that never ran a backward miss AOTAutograd in every run; say why, once."""
    why = _why()
    why.forward_only = ["t.py::test_conv", "t.py::test_gcn", "t.py::test_sage"]
    lines = why_lines(why)
    notes = [line for line in lines if "AOTAutograd" in line]
    assert notes == [
        "note: 3 tests (t.py::test_conv, t.py::test_gcn and 1 more) ran a training graph's forward without its "
        "backward: torch saves an AOTAutograd cache entry only once the backward is compiled, so their AOTAutograd "
        "lookups miss in every run, whatever is cached (not counted as misses: the hit rate is the FX graphs')"
    ]
    assert lines[-1] == notes[0]
    alone = SessionExplanation(forward_only=["t.py::test_conv"], compared_with="bundle")
    assert [line[:40] for line in why_lines(alone)] == ["note: 1 test (t.py::test_conv) ran a tra"]
    assert why_json(alone)["forward_only"] == ["t.py::test_conv"]
