"""Proposed renderers for issue 12's miss explanations, to move into ``report.py`` (pure, no I/O).

Kept apart so that the integrator, who owns ``report.py``, can move them as they are: each takes a
:class:`~pytest_compilecache.explain.SessionExplanation` and returns text or plain JSON.
"""

from __future__ import annotations

from typing import Any

from .explain import SessionExplanation

WHY_ROWS = 20  # terminal lines of explanations; the JSON report has them all
NEVER_HIT_HINT = "seed random values, pass them as inputs, or keep timestamps and paths out of the graph"


def never_hit_text(what: str, runs: int) -> str:
    """Two runs cannot tell an edit from a value that changes by itself: say which case we are sure of."""
    if runs >= 3:
        return f"{what} changed in each of the last {runs} runs: this test can never hit ({NEVER_HIT_HINT})"
    return f"only {what} changed since the last run: if nothing was edited, this test can never hit ({NEVER_HIT_HINT})"


def why_lines(why: SessionExplanation, limit: int = WHY_ROWS) -> list[str]:
    """Terminal lines for ``--compile-cache-report=full``: one per explained miss, never-hit tests first.

    ``why t.py::test_x: input 0 shape [8, 16] -> [8, 32]``; nothing when nothing was compared.
    """
    lines = [f"never hits {nodeid}: {never_hit_text(*flag)}" for nodeid, flag in sorted(why.never_hit.items())]
    for nodeid in sorted(why.misses):
        if nodeid in why.never_hit:
            continue
        for miss in why.misses[nodeid]:
            lines.append(f"why {nodeid}: {'; '.join(miss.reasons)}")
    if not lines:
        return []
    head = f"why tests missed (compared with the {why.compared_with}):" if why.compared_with else "why tests missed:"
    shown = lines[:limit]
    if len(lines) > limit:
        shown.append(f"... and {len(lines) - limit} more (see --compile-cache-json)")
    return [head, *shown]


def why_markdown(why: SessionExplanation, budget: int) -> str:
    """A collapsed "Why these tests missed" section of at most ``budget`` UTF-8 bytes ("" when empty)."""
    rows: list[str] = []
    for nodeid, flag in sorted(why.never_hit.items()):
        rows.append(f"| `{_cell(nodeid)}` | **never hits**: {_cell(never_hit_text(*flag))} |")
    for nodeid in sorted(why.misses):
        if nodeid in why.never_hit:
            continue
        for miss in why.misses[nodeid]:
            rows.append(f"| `{_cell(nodeid)}` | {_cell('; '.join(miss.reasons))} |")
    if not rows or budget <= 0:
        return ""
    where = f" (compared with the {why.compared_with})" if why.compared_with else ""
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
    """The JSON report's additive ``why`` field (schema version 1).

    ``{"compared_with": "bundle"|"previous session"|null, "misses": {nodeid: [{"key", "reasons": [str]}]},
    "never_hit": {nodeid: {"what": component that changed, "runs": runs in a row it changed}}}``.
    """
    return why.to_json()


def _size(text: str) -> int:
    return len(text.encode("utf-8"))


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("`", "'").replace("\n", " ")
