"""Pure renderers: terminal lines, Markdown and JSON from :class:`SessionStats`. No I/O here.

``transfer`` arguments are plain dicts describing a restore or a save:
``{"outcome": "exact"|"partial"|"miss"|"saved"|"staged"|"skipped"|"error", "key", "size", "seconds", "message"}``
(``staged``: the Action's staging dir holds the bundle; actions/cache uploads it at job end), and for a restore
``description`` (what happened in words, ``sync.RestoreResult.description``).
Loads lazily (inside the functions that need them, so a session pays only for what it uses): ``.explain``.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING
from typing import Any
from typing import Mapping
from typing import Protocol
from typing import Sequence

from . import dynamo_costs
from .dynamo_costs import plural as _plural
from .dynamo_costs import size as _size
from .ghrunner import md_code
from .ghrunner import md_text
from .ghrunner import one_line

# The miss renderers, re-exported: callers render a session's report through this module.
from .miss_report import BY_DESIGN as BY_DESIGN
from .miss_report import miss_lines as miss_lines
from .miss_report import never_hit_text as never_hit_text
from .miss_report import why_json as why_json
from .miss_report import why_lines as why_lines
from .miss_report import why_markdown as why_markdown
from .stats import ItemRecord
from .stats import SessionStats
from .stats import hit_rate

if TYPE_CHECKING:
    from .explain import SessionExplanation

JSON_VERSION = 1
MARKDOWN_LIMIT = 1024 * 1024 - 4096  # GitHub rejects a step summary over 1 MiB; leave headroom
TABLE_ROWS = 30
WHY_MARKDOWN_BYTES = 64 * 1024  # the step summary's "why these tests missed" section at most


def percent(rate: float | None) -> str:
    """Rounded down, so that a session with any miss never shows 100%; a whole percent is that percent
    (``0.58 * 100`` is ``57.99...`` in floating point: the JSON's 0.58 is 58%, not 57%)."""
    if rate is None:
        return "n/a"
    return f"{min(math.floor(rate * 100 + 1e-9), 99 if rate < 1 else 100)}%"


def human_size(size: int | None) -> str:
    if size is None:
        return "-"
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"


def summary_line(stats: SessionStats, where: str) -> str:
    """``compile cache: 42 hits, 3 misses (93%), 1 bypass, 18.2 s compiling, dir shared:/path``."""
    fx = stats.total("fxgraph")
    parts = [
        _plural(fx["hit"], "hit"),
        f"{_plural(fx['miss'], 'miss')} ({percent(stats.hit_rate)})",
    ]
    if fx["bypass"]:
        parts.append(_plural(fx["bypass"], "bypass"))
    remote = stats.total("remote")
    if remote["fx_hit"] or remote["fx_miss"]:
        parts.append(f"remote {remote['fx_hit']} hit/{remote['fx_miss']} miss")
    parts.append(f"{stats.compile_seconds:.1f} s compiling")
    parts.extend(dynamo_costs.headline(stats))
    parts.extend(_gpu_parts(stats))
    parts.append(f"dir {where}")
    return "compile cache: " + ", ".join(parts)


# Where the last session's report is kept (pytest's cache, ``config.cache.set``): ``python -m pytest_compilecache
# report`` reads it back, so a run's reasons stay readable without a rerun (a rerun hits what the run compiled).
LAST_REPORT_KEY = "compilecache/last-report"
LAST_REPORT_PATH = ".pytest_cache/v/" + LAST_REPORT_KEY


# ---- the GPU layers below the FX graph


def _gpu_parts(stats: SessionStats) -> list[str]:
    """``["12 triton files from bundles", "1.5 s triton compiling", "2.3 s autotuning"]``; nothing on CPU."""
    if not stats.used_gpu:
        return []
    gpu = stats.gpu_total()
    parts = []
    if gpu["triton_bundle_files"]:
        parts.append(f"{int(gpu['triton_bundle_files'])} triton files from bundles")
    if gpu["triton_built"]:
        parts.append(f"{int(gpu['triton_built'])} triton kernels/helpers built")
    if gpu["triton_compile_seconds"]:
        parts.append(f"{gpu['triton_compile_seconds']:.1f} s triton compiling")
    if gpu["autotune_seconds"]:
        benchmarks = int(gpu["autotune_benchmarks"])
        counted = f" ({benchmarks} benchmarked)" if benchmarks else ""
        parts.append(f"{gpu['autotune_seconds']:.1f} s autotuning{counted}")
    return parts


def gpu_still_compiled_text(stats: SessionStats) -> str | None:
    """The plain statement that "all hits" did not spare the GPU its work, or None when it did (or no GPU).

    ``2 tests without an FX-graph miss still built 3 triton kernels/helpers (1.5 s compiling) and autotuned (2.3 s):
    a.py::t (3.1 s), b.py::u (0.7 s)``
    """
    tests = stats.gpu_still_compiled
    if not tests:
        return None
    triton = sum(r.gpu["triton_compile_seconds"] for r in tests)
    tuned = sum(r.gpu["autotune_seconds"] for r in tests)
    built = int(sum(r.gpu["triton_built"] for r in tests))
    named = ", ".join(f"{one_line(r.nodeid, 200)} ({r.gpu_work:.1f} s)" for r in tests[:3])
    more = f" and {len(tests) - 3} more" if len(tests) > 3 else ""
    done = [f"built {built} triton kernels/helpers ({triton:.1f} s compiling)"] if built else []
    done += [f"autotuned ({tuned:.1f} s)"] if tuned else []
    return f"{_plural(len(tests), 'test')} without an FX-graph miss still {' and '.join(done)}: {named}{more}"


def gpu_lines(stats: SessionStats) -> list[str]:
    """Terminal lines about the GPU layers worth a reader's attention (empty on CPU and when all came cached)."""
    text = gpu_still_compiled_text(stats)
    return [f"gpu: {text}"] if text else []


def gpu_table_lines(stats: SessionStats, limit: int | None = TABLE_ROWS) -> list[str]:
    """Per test with GPU activity, most GPU seconds first: triton files from bundles, autotune benchmarks
    built (kernels compiled, helpers built), autotune benchmarks (torch's count; an FX hit repeats its entry's),
    seconds compiling triton kernels and autotuning."""
    rows = sorted((r for r in stats.records.values() if r.used_gpu), key=lambda r: (-r.gpu_work, r.nodeid))
    if not rows:
        return []
    shown = rows[:limit] if limit else rows
    lines = [
        f"{'triton s':>8}  {'autotune s':>10}  {'bundled':>7}  {'built':>5}  {'benchmarks':>10}  test (GPU layers)"
    ]
    for r in shown:
        gpu = r.gpu
        lines.append(
            f"{gpu['triton_compile_seconds']:8.2f}  {gpu['autotune_seconds']:10.2f}  "
            f"{int(gpu['triton_bundle_files']):>7}  {int(gpu['triton_built']):>5}  "
            f"{int(gpu['autotune_benchmarks']):>10}  {one_line(r.nodeid, 300)}"
        )
    if len(rows) > len(shown):
        lines.append(f"... and {len(rows) - len(shown)} more (see --compile-cache-json)")
    return lines


def gpu_markdown_rows(stats: SessionStats) -> list[str]:
    """Rows of the step summary's "GPU layers per test" table (see :func:`gpu_table_lines`), escaped."""
    rows = sorted((r for r in stats.records.values() if r.used_gpu), key=lambda r: (-r.gpu_work, r.nodeid))
    return [
        f"| {r.gpu['triton_compile_seconds']:.2f} | {r.gpu['autotune_seconds']:.2f} | "
        f"{int(r.gpu['triton_bundle_files'])} | {int(r.gpu['triton_built'])} | {int(r.gpu['autotune_benchmarks'])} | "
        f"{md_code(r.nodeid)} |"
        for r in rows
    ]


# A restore that restored something, in words, when its report has no ``description`` (an older report, the
# Action's hand-off): ``partial`` is actions/cache's word for a key matched by prefix, not an incomplete restore.
_RESTORED = {
    "exact": "restored the bundle of the exact key asked for",
    "partial": "restored the newest bundle of this fingerprint",
}


def transfer_line(kind: str, info: Mapping[str, Any]) -> str:
    """One line about a restore or save, e.g. ``save: saved compilecache-v1-ab12-... (4.1 MiB, 0.3 s)``.

    A restore that restored something says so in words (its ``description``), never as actions/cache's
    ``exact``/``partial``: ``restore: restored the newest bundle of this fingerprint (run 5001, attempt 1):
    compilecache-v1-ab12-5001-1 (4.1 MiB, 0.30 s)``. The precompiled headers that travel beside the bundle (a
    store object of their own, often larger than it) are named too: ``; precompiled headers: 1 uploaded (21.0 MiB,
    0.80 s)``.
    """
    outcome = info.get("outcome", "?")
    restored = kind == "restore" and outcome in _RESTORED
    if restored:
        described = info.get("description") or _RESTORED[str(outcome)]
        bits = [f"{kind}: {one_line(str(described), 300)}" + (":" if info.get("key") else "")]
    else:
        bits = [f"{kind}: {outcome}"]
    if info.get("key"):
        bits.append(one_line(str(info["key"]), 300))
    if info.get("size") is not None:
        bits.append(f"({human_size(info.get('size'))}, {float(info.get('seconds') or 0):.2f} s)")
    if info.get("message"):
        bits.append("- " + one_line(str(info["message"])))  # may come from the environment (the Action's restore)
    return " ".join(bits) + _headers_part(kind, info.get("headers"))


def _headers_part(kind: str, headers: Any) -> str:
    """``; precompiled headers: 1 uploaded (21.0 MiB, 0.80 s)``, or how many were named but already there."""
    if not isinstance(headers, Mapping):
        return ""
    named, moved = int(headers.get("named") or 0), int(headers.get("transferred") or 0)
    if moved:
        verb = "installed" if kind == "restore" else "uploaded"
        size = human_size(int(headers.get("size") or 0))
        return f"; precompiled headers: {moved} {verb} ({size}, {float(headers.get('seconds') or 0):.2f} s)"
    if named:
        where = "already in place" if kind == "restore" else "already in the store"
        return f"; precompiled headers: {named} named, {where}"
    return ""


def table_lines(stats: SessionStats, limit: int | None = TABLE_ROWS) -> list[str]:
    """The tests that compiled, slowest first, with their cache outcomes."""
    rows = stats.compiled[:limit] if limit else stats.compiled
    if not rows:
        return []
    width = min(max(len(r.nodeid) for r in rows), 80)
    lines = [f"{'seconds':>8}  {'fx hit/miss/byp':>15}  {'aot hit/miss':>12}  {'frames':>6}  test"]
    for r in rows:
        fx = f"{r.fxgraph['hit']}/{r.fxgraph['miss']}/{r.fxgraph['bypass']}"
        aot = f"{r.aotautograd['hit']}/{r.aotautograd['miss']}"
        name = one_line(r.nodeid if len(r.nodeid) <= width else "..." + r.nodeid[-(width - 3) :])
        recompiles = f" ({_plural(r.recompiles, 'recompile')})" if r.recompiles else ""
        lines.append(f"{r.compile_seconds:8.2f}  {fx:>15}  {aot:>12}  {r.frames:>6}  {name}{recompiles}")
    hidden = len(stats.compiled) - len(rows)
    if hidden > 0:
        lines.append(f"... and {hidden} more (see --compile-cache-json)")
    idle = stats.tests - stats.compiled_tests
    if idle > 0:  # said, not dropped silently
        lines.append(f"({_plural(idle, 'other test')} compiled nothing: not listed)")
    reasons = sorted({reason for r in stats.compiled for reason in r.bypass_reasons})
    for reason in reasons[:5]:
        lines.append(f"bypass: {one_line(reason, 300)}")
    return lines + gpu_table_lines(stats, limit)


def to_json(
    stats: SessionStats,
    *,
    mode: str | None,
    cache_dir: str | None,
    restore: Mapping[str, Any] | None = None,
    save: Mapping[str, Any] | None = None,
    notes: list[str] | None = None,
    why: SessionExplanation | None = None,
) -> dict[str, Any]:
    """The documented, stable JSON report (``version`` 1; fields are only ever added).

    Per test, ``graphs`` is the number of FX-graph lookups recorded and ``why`` the explained misses
    (``[{"key", "reasons": [str]}]``); the top-level ``why`` is :func:`why_json` (None when nothing was
    compared). The lookups' components stay out of the report: they are for the next run, not for people.
    """
    return {
        "version": JSON_VERSION,
        "mode": mode,
        "cache_dir": cache_dir,
        "totals": stats.totals_json(),
        "restore": dict(restore) if restore else None,
        "save": dict(save) if save else None,
        "silent_workers": list(stats.silent_workers),
        "notes": list(notes or []),
        "tests": [_test_json(r) for r in sorted(stats.records.values(), key=lambda r: r.nodeid) if r.compiled],
        "why": why_json(why) if why is not None else None,
        "dynamo": dynamo_costs.to_json(stats),
    }


def _test_json(record: ItemRecord) -> dict[str, Any]:
    return {**record.to_json(), "graphs": len(record.graphs)}


def markdown(
    stats: SessionStats,
    *,
    where: str,
    restore: Mapping[str, Any] | None = None,
    save: Mapping[str, Any] | None = None,
    limit: int = MARKDOWN_LIMIT,
    why: SessionExplanation | None = None,
    errors: Sequence[str] = (),
) -> str:
    """Markdown for ``$GITHUB_STEP_SUMMARY``: headline, a table per layer, slowest tests and misses; ``errors``
    (what failed the session) in bold under the headline.

    Always at most ``limit`` bytes of UTF-8 (GitHub's limit is in bytes): the long lists are cut first.
    """
    compiled = stats.compiled
    head = _markdown_head(stats, where, restore, save)
    failed = [f"**compile cache FAILED**: {md_text(error)}" for error in errors]
    if failed:
        head[1:1] = ["", *failed]
    slowest = [
        f"| {r.compile_seconds:.2f} | {r.fxgraph['hit']} | {r.fxgraph['miss']} | {r.frames} | {md_code(r.nodeid)} |"
        for r in compiled
    ]
    missed = [
        f"| {r.fxgraph['miss']} | {r.aotautograd['miss']} | {md_code(r.nodeid)}"
        f"{' (marked compile_cache: misses by design)' if r.by_design else ''} | "
        f"{md_text('; '.join(r.bypass_reasons))} |"
        for r in sorted(compiled, key=lambda r: (-r.fxgraph["miss"], r.nodeid))
        if r.fxgraph["miss"] or r.fxgraph["bypass"]
    ]
    text = "\n".join(head)
    budget = limit - _size(text) - 600
    why_section = why_markdown(why, min(WHY_MARKDOWN_BYTES, budget // 3)) if why is not None else ""
    why_section += dynamo_costs.markdown(stats, min(WHY_MARKDOWN_BYTES, (budget - _size(why_section)) // 3))
    budget -= _size(why_section)
    sections = [
        (
            "Slowest compiling tests",
            "| seconds | fx hits | fx misses | frames | test |\n|---:|---:|---:|---:|---|",
            slowest,
        ),
        ("Tests that missed", "| fx misses | aot misses | test | bypass reasons |\n|---:|---:|---|---|", missed),
        (
            "GPU layers per test",
            "| triton s | autotune s | triton files from bundles | triton built | autotune benchmarks | test |\n"
            "|---:|---:|---:|---:|---:|---|",
            gpu_markdown_rows(stats),
        ),
    ]
    for title, header, rows in sections:
        if not rows:
            continue
        body: list[str] = []
        used, share = 0, max(budget // 2, 0)
        for row in rows:
            if used + _size(row) + 1 > share:
                body.append(f"\n_{len(rows) - len(body)} more rows not shown._")
                break
            body.append(row)
            used += _size(row) + 1
        text += f"\n<details><summary>{title} ({len(rows)})</summary>\n\n{header}\n"
        text += "\n".join(body) + "\n\n</details>\n"
    return _truncate(text + why_section, limit)


def _markdown_head(
    stats: SessionStats, where: str, restore: Mapping[str, Any] | None, save: Mapping[str, Any] | None
) -> list[str]:
    """The step summary's headline, its table per layer and its one-line facts (transfers, workers, GPU)."""
    fx, aot, remote = stats.total("fxgraph"), stats.total("aotautograd"), stats.total("remote")
    head = [
        f"### torch.compile cache: {percent(hit_rate(fx['hit'], fx['miss']))} hit rate",
        "",
        f"{_plural(fx['hit'], 'FX-graph hit')}, {_plural(fx['miss'], 'miss')}, {_plural(fx['bypass'], 'bypass')}; "
        f"{stats.compiled_tests} of {stats.tests} tests compiled, {stats.compile_seconds:.1f} s compiling "
        f"({md_code(where)}).",
        "",
        "| layer | hit | miss | bypass | guard miss |",
        "|---|---:|---:|---:|---:|",
        f"| FX graph | {fx['hit']} | {fx['miss']} | {fx['bypass']} | - |",
        f"| AOTAutograd | {aot['hit']} | {aot['miss']} | {aot['bypass']} | {aot['guard_miss']} |",
    ]
    if any(remote.values()):
        head.append(f"| remote FX graph | {remote['fx_hit']} | {remote['fx_miss']} | - | - |")
        head.append(f"| remote AOTAutograd | {remote['aot_hit']} | {remote['aot_miss']} | - | - |")
    head.append("")
    for kind, info in (("restore", restore), ("save", save)):
        if info:
            head.append(f"- {md_text(transfer_line(kind, info))}")
    if stats.silent_workers:
        head.append(f"- workers that sent no statistics: {md_text(', '.join(stats.silent_workers))}")
    gpu_parts = _gpu_parts(stats)
    if gpu_parts:
        head.append(f"- GPU: {md_text(', '.join(gpu_parts))}")
    still = gpu_still_compiled_text(stats)
    if still:
        head.append(f"- **GPU work despite FX hits**: {md_text(still)}")
    head.extend(dynamo_costs.uncompiled_markdown(stats))
    head.append("")
    return head


def _truncate(text: str, limit: int) -> str:
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    return data[:limit].decode("utf-8", errors="ignore")


# ---- one session's outcome, rendered


class Transfer(Protocol):
    """A restore or save result (:class:`~pytest_compilecache.sync.RestoreResult`, ``SaveResult``)."""

    def to_json(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class SessionOutcome:
    """Everything a session's reports say, typed: built once by the controller at the end, rendered here.

    ``where``: the cache dir in words; ``restored`` / ``saved``: None when none was tried; ``why``: this
    run's miss explanations (None: nothing was compared).
    """

    stats: SessionStats
    mode: str | None
    cache_dir: str | None
    where: str
    restored: Transfer | None = None
    saved: Transfer | None = None
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    why: SessionExplanation | None = None
    json_path: str | None = None  # where --compile-cache-json writes the report (for the miss hint)

    @property
    def worth_reporting(self) -> bool:
        """Something to say beyond "no test compiled": a compile, a transfer or trouble."""
        return self.stats.anything_compiled or bool(self.restored or self.saved or self.warnings or self.errors)

    def transfers(self) -> list[tuple[str, Mapping[str, Any]]]:
        return [(kind, info.to_json()) for kind, info in (("restore", self.restored), ("save", self.saved)) if info]


def session_json(outcome: SessionOutcome) -> dict[str, Any]:
    """The ``--compile-cache-json`` report: :func:`to_json` plus the session's ``warnings`` and ``errors`` (what
    failed the session: a hit rate below ``--compile-cache-min-hit-rate``, trouble under ``--compile-cache-strict``)."""
    data = to_json(
        outcome.stats,
        mode=outcome.mode,
        cache_dir=outcome.cache_dir,
        restore=outcome.restored.to_json() if outcome.restored else None,
        save=outcome.saved.to_json() if outcome.saved else None,
        notes=list(outcome.notes),
        why=outcome.why,
    )
    data["warnings"] = list(outcome.warnings)
    data["errors"] = list(outcome.errors)
    return data


def session_markdown(outcome: SessionOutcome) -> str:
    """The step summary's section for the session (:func:`markdown`)."""
    return markdown(
        outcome.stats,
        where=outcome.where,
        restore=outcome.restored.to_json() if outcome.restored else None,
        save=outcome.saved.to_json() if outcome.saved else None,
        why=outcome.why,
        errors=outcome.errors,
    )


Line = tuple[str, dict[str, bool]]  # text and the terminal markup pytest's writer takes


def session_lines(outcome: SessionOutcome, *, report: str, verbose: bool = False) -> list[Line]:
    """The terminal's "compile cache" section: ``report`` is ``short``, ``full`` or ``none`` (warnings and
    errors are shown whatever it is)."""
    lines: list[Line] = []
    if report == "none" and not (outcome.warnings or outcome.errors):
        return lines
    if report != "none" and outcome.worth_reporting:
        full = verbose or report == "full"
        lines.append((summary_line(outcome.stats, outcome.where), {}))
        if not full:
            lines.extend((line, {}) for line in miss_lines(outcome.stats, outcome.why, outcome.json_path))
        uncompiled = dynamo_costs.uncompiled_lines(outcome.stats, None if full else dynamo_costs.SHORT_ROWS)
        lines.extend((line, {"yellow": True}) for line in uncompiled)
        lines.extend((transfer_line(kind, info), {}) for kind, info in outcome.transfers())
        lines.extend((line, {"yellow": True}) for line in gpu_lines(outcome.stats))
        if outcome.stats.silent_workers:
            silent = ", ".join(outcome.stats.silent_workers)
            lines.append((f"workers that sent no statistics: {silent}", {"yellow": True}))
        if full:
            lines.extend((line, {}) for line in table_lines(outcome.stats))
            if outcome.why is not None:
                lines.extend((line, {}) for line in why_lines(outcome.why))
            lines.extend((line, {}) for line in dynamo_costs.full_lines(outcome.stats))
        lines.extend((f"note: {note}", {}) for note in outcome.notes)
    lines.extend((f"CompileCacheWarning: {message}", {"yellow": True}) for message in outcome.warnings)
    lines.extend((f"compile cache FAILED: {message}", {"red": True, "bold": True}) for message in outcome.errors)
    return lines


# ---- a session's report read back (the last one kept, or a --compile-cache-json file)


class _Recorded:
    """A restore or save as a JSON report recorded it: the :class:`Transfer` the renderers take."""

    def __init__(self, data: Mapping[str, Any]) -> None:
        self._data = dict(data)

    def to_json(self) -> dict[str, Any]:
        return dict(self._data)


def outcome_from_json(data: Any) -> SessionOutcome:
    """The :class:`SessionOutcome` a JSON report (:func:`session_json`) describes; raises (ValueError, TypeError,
    KeyError...) on anything of another shape: a caller reading a file says it is not a report of ours."""
    from .explain import SessionExplanation

    tests = data["totals"]["tests"]
    if type(tests) is not int or tests < 0:
        raise ValueError(f"totals.tests must be a whole number >= 0, not {str(tests)[:40]}")
    stats = SessionStats(tests=tests, silent_workers=[str(w) for w in data.get("silent_workers", [])])
    for record in data.get("tests", []):
        stats.add_record(ItemRecord.from_json(record))
    restore, save = data.get("restore"), data.get("save")
    if not all(part is None or isinstance(part, Mapping) for part in (restore, save)):
        raise TypeError("restore and save must be objects")
    texts = {name: tuple(str(line) for line in data.get(name, [])) for name in ("notes", "warnings", "errors")}
    return SessionOutcome(
        stats=stats,
        mode=data.get("mode"),
        cache_dir=data.get("cache_dir"),
        where=f"{data['mode']}:{data.get('cache_dir')}" if data.get("mode") else "not managed by the plugin",
        restored=_Recorded(restore) if restore else None,
        saved=_Recorded(save) if save else None,
        notes=texts["notes"],
        warnings=texts["warnings"],
        errors=texts["errors"],
        why=SessionExplanation.from_json(data["why"]) if data.get("why") is not None else None,
    )


def full_text(data: Any) -> str:
    """The terminal's full report (``--compile-cache-report=full``) of a JSON report, as text: what ``python -m
    pytest_compilecache report`` prints for the last session, without rerunning it (a rerun would hit)."""
    lines = session_lines(outcome_from_json(data), report="full")
    return "\n".join(text for text, _ in lines) or "compile cache: nothing compiled in that session"
