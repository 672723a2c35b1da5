"""Why tests missed, rendered: the short report's line per test that missed, the full report's reasons, the
job summary's section and the JSON report's ``why``. Pure, no I/O; explanations come from :mod:`.explain`.
Loads lazily (inside the functions that need them, so a session pays only for what it uses): ``.explain``.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from typing import Any

from .dynamo_costs import plural as _plural
from .dynamo_costs import size as _size
from .ghrunner import md_code
from .ghrunner import md_text
from .ghrunner import one_line

if TYPE_CHECKING:
    from .explain import MissExplanation
    from .explain import SessionExplanation
    from .stats import SessionStats

WHY_ROWS = 20  # terminal lines of miss explanations; the JSON report has them all
NEVER_HIT_HINT = "seed random values, pass them as inputs, or keep timestamps and paths out of the graph"


MISS_ROWS = 3  # tests named in the short report before "and N more"
FULL_REPORT = "python -m pytest_compilecache report"


BY_DESIGN = "marked compile_cache: misses by design (not counted against --compile-cache-min-hit-rate)"


def test_reason(nodeid: str, why: SessionExplanation | None) -> str:
    """Why ``nodeid`` missed, on one line: its never-hit flag, or its misses' reasons merged (the first, then
    how many more); what was not compared says so."""
    if why is None or not why.compared_with:
        return "not compared with an earlier run of this cache (a first run, or explaining off)"
    from .explain import merged

    texts = merged(_other_misses(why, nodeid))
    if nodeid in why.never_hit:  # what it can never hit first; its other graphs' reasons are still news
        more = f" (and {_plural(len(texts), 'other reason')})" if texts else ""
        return _flag_text(why, nodeid) + more
    if not texts:
        return "no reason recorded (its graphs were not captured)"
    return texts[0] + (f" (and {_plural(len(texts) - 1, 'other reason')})" if len(texts) > 1 else "")


def miss_lines(
    stats: SessionStats, why: SessionExplanation | None, json_path: str | None, limit: int = MISS_ROWS
) -> list[str]:
    """For the short report: each test that missed with its one-line reason (a few, then "and N more"), and
    where the full report is. A rerun to see the reasons would hit what this run compiled: the
    report of this run stays readable through :data:`FULL_REPORT` (and the JSON report, when written)."""
    missed = sorted((r for r in stats.records.values() if r.fxgraph["miss"]), key=lambda r: (-r.misses, r.nodeid))
    if not missed:
        return []
    lines = [
        one_line(f"missed: {r.nodeid}: {BY_DESIGN if r.by_design else test_reason(r.nodeid, why)}", 600)
        for r in missed[:limit]
    ]
    more = f"... and {_plural(len(missed) - limit, 'more test')} missed; " if len(missed) > limit else ""
    where = f', "why" in {json_path}' if json_path else ""
    lines.append(one_line(f"{more}full report: {FULL_REPORT} (or -v, --compile-cache-report=full{where})", 600))
    return lines


# ---- miss explanations


FORWARD_ONLY_NOTE = (
    "ran a training graph's forward without its backward: torch saves an AOTAutograd cache entry only once the "
    "backward is compiled, so their AOTAutograd lookups miss in every run, whatever is cached (not counted as "
    "misses: the hit rate is the FX graphs')"
)


def never_hit_text(what: str, runs: int) -> str:
    """Two runs cannot tell an edit from a value that changes by itself: say which case we are sure of (explain
    flags a test only from three runs on; a report from an earlier version may say two)."""
    if runs >= 3:
        return f"{what} took a new value in each of the last {runs} runs: this test can never hit ({NEVER_HIT_HINT})"
    return f"only {what} changed since the last run: if nothing was edited, this test can never hit ({NEVER_HIT_HINT})"


def _flag_text(why: SessionExplanation, nodeid: str) -> str:
    """``nodeid``'s never-hit flag in words, led by the function whose graph it is about where its misses name one
    (``scaled (test_model.py:14): a constant in graph statement 1 took a new value ...``)."""
    from .explain import changed_by

    what, runs = why.never_hit[nodeid]
    functions = {miss.function for miss in why.misses.get(nodeid, []) if miss.function and changed_by(miss, what)}
    text = never_hit_text(what, runs)
    return f"{functions.pop()}: {text}" if len(functions) == 1 else text


def _other_misses(why: SessionExplanation, nodeid: str) -> list[MissExplanation]:
    """``nodeid``'s explained misses, without those of the graph its never-hit flag is about (if it has one)."""
    from .explain import changed_by

    misses = why.misses.get(nodeid, [])
    flag = why.never_hit.get(nodeid)
    return [miss for miss in misses if not changed_by(miss, flag[0])] if flag else list(misses)


def _why_rows(why: SessionExplanation) -> list[tuple[str, bool, str]]:
    """(nodeid, never hits, text) per row: never-hit tests first, then each explained miss (of a never-hit test,
    those of its other graphs: a shape it changed is still worth saying)."""
    from .explain import merged

    rows = [(nodeid, True, _flag_text(why, nodeid)) for nodeid in sorted(why.never_hit)]
    for nodeid in sorted(why.misses):  # identical reasons of several graphs (one per shape) said once
        rows.extend((nodeid, False, text) for text in merged(_other_misses(why, nodeid)))
    return rows


def why_lines(why: SessionExplanation, limit: int = WHY_ROWS) -> list[str]:
    """Terminal lines for ``--compile-cache-report=full`` (or ``-v``): one per explained miss.

    ``why t.py::test_x: input 0 shape [8, 16] -> [8, 32]``; nothing when nothing was compared. A reason may
    hold text from a restored bundle: control characters are shown escaped, never sent to the terminal.
    """
    lines = [
        one_line(f"{'never hits' if never else 'why'} {nodeid}: {text}", 1000) for nodeid, never, text in _why_rows(why)
    ]
    note = forward_only_line(why)
    if not lines:
        return [note] if note else []
    head = f"why tests missed (compared with the {why.compared_with}):" if why.compared_with else "why tests missed:"
    shown = lines[:limit]
    if len(lines) > limit:
        shown.append(f"... and {len(lines) - limit} more (see --compile-cache-json)")
    return [head, *shown, *([note] if note else [])]


def forward_only_line(why: SessionExplanation) -> str:
    """Once per report: why tests that never ran a backward miss AOTAutograd in every run; ""
    when none did. Names at most two tests (the JSON report lists them all)."""
    tests = why.forward_only
    if not tests:
        return ""
    names = ", ".join(tests[:2]) + (f" and {len(tests) - 2} more" if len(tests) > 2 else "")
    return one_line(f"note: {len(tests)} test{'s' if len(tests) != 1 else ''} ({names}) {FORWARD_ONLY_NOTE}", 1000)


def why_markdown(why: SessionExplanation, budget: int) -> str:
    """A collapsed "Why these tests missed" section of at most ``budget`` UTF-8 bytes ("" when empty).

    Test ids and reasons are untrusted (a bundle's record, a test's name): escaped by ``md_code``/``md_text``.
    """
    rows = [
        f"| {md_code(nodeid)} | {'**never hits**: ' if never else ''}{md_text(text)} |"
        for nodeid, never, text in _why_rows(why)
    ]
    if not rows or budget <= 0:
        return ""
    where = f" (compared with the {md_text(why.compared_with)})" if why.compared_with else ""
    head = f"\n<details><summary>Why these tests missed{where} ({len(rows)})</summary>\n\n| test | why |\n|---|---|\n"
    tail = "\n\n</details>\n"
    body: list[str] = []
    used = _size(head) + _size(tail) + 60
    for row in rows:
        if used + _size(row) + 1 > budget:
            body.append(f"\n_{len(rows) - len(body)} more not shown (see the JSON report)._")
            break
        body.append(row)
        used += _size(row) + 1
    text = head + "\n".join(body) + tail
    return text if _size(text) <= budget else ""


def why_json(why: SessionExplanation) -> dict[str, Any]:
    """The JSON report's top-level ``why`` (schema version 1, additive).

    ``{"compared_with": "bundle"|"previous session"|null, "misses": {nodeid: [{"key", "reasons": [str]}]},
    "never_hit": {nodeid: {"what": the component that changed, "runs": runs in a row it changed}},
    "forward_only": [nodeid]}`` (tests that ran a training forward without its backward).
    """
    return why.to_json()
