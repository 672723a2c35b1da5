"""What each test paid Dynamo beyond the cache, rendered: recompiles with torch's guard-failure reasons, frames that
hit torch's recompile limit (torch compiled them no more), graph breaks with torch's reasons.

Pure renderers over the per-test records (:class:`.stats.ItemRecord`'s ``recompiled``, ``limit_hit``,
``graph_breaks``, ``graph_break_reasons``): terminal lines, Markdown, JSON. No I/O. Nothing here costs a session
whose tests neither recompiled nor broke a graph: every renderer returns nothing for them.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from typing import Any
from typing import Iterable

from .ghrunner import md_code
from .ghrunner import md_text
from .ghrunner import one_line

if TYPE_CHECKING:
    from .stats import ItemRecord
    from .stats import SessionStats

SHORT_ROWS = 3  # tests named in the short report before "and N more"
TOP_ROWS = 10  # offenders listed in the full report and the JSON report's ``top``
UNCOMPILED = "ran uncompiled"
UNCOMPILED_NOTE = (
    "from then on torch compiles it no more in this process: inputs its compiled code does not accept run "
    "uncompiled, and tests pass without testing compiled code (--compile-cache-fail-on-eager-fallback fails them "
    "instead)"
)


def plural(count: int, word: str) -> str:
    """``1 hit``, ``2 misses``, ``3 graph breaks``."""
    return f"{count} {word if count == 1 else word + ('es' if word.endswith('s') else 's')}"


def _costly(stats: SessionStats) -> list[ItemRecord]:
    """Tests that recompiled, broke a graph or hit the recompile limit: the costliest first."""
    found = [r for r in stats.records.values() if r.recompiles or r.graph_breaks or r.limit_hit]
    return sorted(found, key=lambda r: (-len(r.limit_hit), -(r.recompiles + r.graph_breaks), r.nodeid))


def uncompiled(stats: SessionStats) -> list[tuple[str, dict[str, Any]]]:
    """(test, entry) for each frame that hit the recompile limit, in test order."""
    return [(r.nodeid, hit) for r in sorted(stats.records.values(), key=lambda r: r.nodeid) for hit in r.limit_hit]


def uncompiled_text(hit: dict[str, Any]) -> str:
    """``times (t.py:9) hit recompile_limit = 8 (last guard failure: ...)``."""
    reason = f" (last guard failure: {hit['reason']})" if hit.get("reason") else ""
    return f"{hit.get('function', '?')} hit {hit.get('limit', 'the recompile limit')}{reason}"


def recompile_text(entry: dict[str, Any], nodeid: str) -> str:
    """``recompiled scale (t.py:4): tensor 'x' size mismatch ... (first compiled by t.py::test_a)``."""
    first = entry.get("first") or ""
    by = " (first compiled by this test)" if first == nodeid else (f" (first compiled by {first})" if first else "")
    times = f" x{entry['count']}" if entry.get("count", 1) > 1 else ""
    reason = entry.get("reason") or "reason unknown on this torch"
    return f"recompiled {entry.get('function') or '?'}{times}: {reason}{by}"


def test_texts(record: ItemRecord) -> list[str]:
    """Everything one test paid Dynamo, one text each: frames that ran uncompiled, recompiles, graph breaks."""
    texts = [f"{UNCOMPILED}: {uncompiled_text(hit)}" for hit in record.limit_hit]
    texts += [recompile_text(entry, record.nodeid) for entry in record.recompiled]
    if record.graph_breaks:
        reasons = "; ".join(record.graph_break_reasons) or "reasons unknown"
        texts.append(f"{plural(record.graph_breaks, 'graph break')}: {reasons}")
    return texts


def headline(stats: SessionStats) -> list[str]:
    """The summary line's parts: ``["2 recompiles", "1 graph break", "1 frame ran uncompiled"]`` (empty: none)."""
    recompiles, breaks = int(stats.sum("recompiles")), int(stats.sum("graph_breaks"))
    limits = len(uncompiled(stats))
    parts = [plural(recompiles, "recompile")] if recompiles else []
    parts += [plural(breaks, "graph break")] if breaks else []
    parts += [f"{plural(limits, 'frame')} {UNCOMPILED}"] if limits else []
    return parts


def uncompiled_lines(stats: SessionStats, limit: int | None = SHORT_ROWS) -> list[str]:
    """For the short report: each test whose frame hit the recompile limit (a few, then "and N more")."""
    hits = uncompiled(stats)
    if not hits:
        return []
    shown = hits[:limit] if limit else hits
    lines = [
        one_line(f"{UNCOMPILED}: {nodeid}: {uncompiled_text(hit)}; {UNCOMPILED_NOTE}", 1000) for nodeid, hit in shown
    ]
    if len(hits) > len(shown):
        more = plural(len(hits) - len(shown), "more frame")
        lines.append(f"... and {more} {UNCOMPILED} (python -m pytest_compilecache report)")
    return lines


def full_lines(stats: SessionStats, limit: int = TOP_ROWS) -> list[str]:
    """For the full report: the tests that paid Dynamo most, each cost on its own line (empty: none did)."""
    costly = _costly(stats)
    if not costly:
        return []
    lines = [f"dynamo costs by test ({', '.join(headline(stats))}):"]
    for record in costly[:limit]:
        lines.extend(one_line(f"  {record.nodeid}: {text}", 1000) for text in test_texts(record))
    if len(costly) > limit:
        lines.append(f"  ... and {plural(len(costly) - limit, 'more test')} (see --compile-cache-json)")
    return lines


def markdown(stats: SessionStats, budget: int) -> str:
    """A collapsed "Recompiles, graph breaks, frames that ran uncompiled" section of at most ``budget`` bytes."""
    costly = _costly(stats)
    if not costly or budget <= 0:
        return ""
    rows = [f"| {md_code(r.nodeid)} | {md_text('; '.join(test_texts(r)), 1500)} |" for r in costly]
    title = f"Recompiles, graph breaks, frames that ran uncompiled ({md_text(', '.join(headline(stats)))})"
    head = f"\n<details><summary>{title}</summary>\n\n| test | what Dynamo did |\n|---|---|\n"
    return _bounded(head, rows, "\n\n</details>\n", budget)


def uncompiled_markdown(stats: SessionStats) -> list[str]:
    """The step summary's bold lines for frames that ran uncompiled (a few, then "and N more")."""
    hits = uncompiled(stats)
    lines = [f"- **{UNCOMPILED}**: {md_code(n)}: {md_text(uncompiled_text(h))}" for n, h in hits[:SHORT_ROWS]]
    if len(hits) > SHORT_ROWS:
        lines.append(f"- ... and {plural(len(hits) - SHORT_ROWS, 'more frame')} {UNCOMPILED}")
    return lines


def to_json(stats: SessionStats) -> dict[str, Any]:
    """The JSON report's top-level ``dynamo``: totals, the frames that ran uncompiled, and the top offenders.

    ``{"recompiles": n, "graph_breaks": n, "ran_uncompiled": [{"nodeid", "function", "limit", "reason"}],
    "top": [{"nodeid", "recompiles", "graph_breaks", "ran_uncompiled"}]}``; each test's own entries are in its
    record (``recompiled``, ``limit_hit``, ``graph_break_reasons``).
    """
    return {
        "recompiles": int(stats.sum("recompiles")),
        "graph_breaks": int(stats.sum("graph_breaks")),
        "ran_uncompiled": [{"nodeid": nodeid, **hit} for nodeid, hit in uncompiled(stats)],
        "top": [
            {
                "nodeid": r.nodeid,
                "recompiles": r.recompiles,
                "graph_breaks": r.graph_breaks,
                "ran_uncompiled": len(r.limit_hit),
            }
            for r in _costly(stats)[:TOP_ROWS]
        ],
    }


def _bounded(head: str, rows: Iterable[str], tail: str, budget: int) -> str:
    rows = list(rows)
    body: list[str] = []
    used = size(head) + size(tail) + 60
    for row in rows:
        if used + size(row) + 1 > budget:
            body.append(f"\n_{len(rows) - len(body)} more not shown (see the JSON report)._")
            break
        body.append(row)
        used += size(row) + 1
    text = head + "\n".join(body) + tail
    return text if size(text) <= budget else ""


def size(text: str) -> int:
    """Bytes of ``text`` in UTF-8 (GitHub's summary limits are in bytes)."""
    return len(text.encode("utf-8"))
