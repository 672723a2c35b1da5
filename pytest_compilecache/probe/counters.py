"""torch's per-phase counters and compilation metrics: :func:`mark` at a test's start, :func:`delta` at its end.

torch counts cache hits and misses in ``torch._dynamo.utils.counters`` (a ``defaultdict`` of ``Counter``), which
tests may clear: torch's own ``TestCase`` clears it in ``setUp`` and again in ``tearDown``, as do "fresh Dynamo"
fixtures, so what a test counted may be gone before its end. :func:`count_through_clears` makes each group's
Counter also add every change of a counter read here to running totals kept beside ``counters`` (on its
``default_factory``): a clear drops the counts, not the totals, and a test's count is the totals' change.

PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import collections
import itertools
import logging
import re
from typing import Any

from ..record_fields import AOT_FIELDS
from ..record_fields import FX_FIELDS
from ..record_fields import empty_delta
from . import dynamo
from .hooks import CODECACHE
from .hooks import dynamo_loaded
from .hooks import tap_log
from .hooks import torch_loaded
from .triton import triton_built

# --------------------------------------------------------------------------- per-phase measurement


class _BypassReasons:
    """torch's FX-graph cache bypass reasons, read from its INFO line ("Bypassing FX Graph Cache because '%s'")
    through a :class:`~.hooks.LogTap`: what the user's logging shows stays as it was."""

    def __init__(self) -> None:
        self.reasons: list[str] = []

    def read(self, record: logging.LogRecord) -> None:
        msg, args = record.msg, record.args
        if isinstance(msg, str) and msg.startswith("Bypassing FX Graph Cache") and isinstance(args, tuple) and args:
            self.reasons.append(str(args[0])[:200])


_tap: _BypassReasons | None = None


_limit_raised = False


def _prepare() -> None:
    """Once per process: tap bypass reasons once torch is imported, keep every metric once Dynamo is.

    The tap must be in place before the first compile of a test, and ``import torch`` does not import
    Dynamo (torch 2.7-2.15): waiting for Dynamo would lose the reasons of the test that first compiles.
    """
    if _tap is None and torch_loaded():
        tap_logs()
    if not _limit_raised and dynamo_loaded():
        keep_every_record()


def tap_logs() -> None:
    """Keep torch's bypass reasons and recompile-limit warnings from now on (each tap once per process)."""
    global _tap
    if _tap is None:
        _tap = _BypassReasons()
        tap_log(CODECACHE, logging.INFO, _tap.read)
    dynamo.tap_limit_warnings()


def keep_every_record() -> None:
    """Keep every compilation record torch makes from now on (torch keeps the last 64 by default), and count
    every cache hit and miss through clears (:func:`count_through_clears`). Runs when Dynamo is imported."""
    global _limit_raised
    from torch._dynamo import utils

    if hasattr(utils, "set_compilation_metrics_limit"):
        # The default deque keeps 64 records; a suite compiles far more frames than that.
        utils.set_compilation_metrics_limit(10**6)
    count_through_clears(utils.counters)
    _limit_raised = True


# torch's counters of autotuning benchmarks: max-autotune's choice between GEMM templates (2.7-2.15); runtime
# coordinate-descent tuning, pad_mm's padded-or-not and combo kernels (later releases, e.g. 2.13; not 2.7.1).
# An FX-graph hit adds the counts its entry recorded at compile time (codecache: ``counters["inductor"] +=
# graph.counter_deltas``), so a count alone does not prove a benchmark ran now: the seconds do (``dynamo_timed``
# columns, measured only while it runs).
AUTOTUNE_COUNTERS = ("select_algorithm_autotune", "coordesc_tuning_bench", "pad_mm_bench", "combo_autotune_bench")
TRITON_BUNDLES = "triton_bundler_read_and_emit_kernel"
# The counters read here: FX-graph and AOTAutograd cache outcomes, triton bundles, autotuning benchmarks. Each name
# belongs to one group of torch's ``counters`` (``inductor`` or ``aot_autograd``), so a total per name is a total
# per counter.
_READ = frozenset(
    (
        *(f"fxgraph_cache_{name}" for name in FX_FIELDS),
        *(f"autograd_cache_{name}" for name in AOT_FIELDS),
        TRITON_BUNDLES,
        *AUTOTUNE_COUNTERS,
    )
)


class _Counting(collections.Counter[str]):
    """A group of torch's ``counters``: a ``Counter`` that also adds each change of a counter in :data:`_READ`
    to ``totals``. A copy (torch's pattern matcher puts one back) adds to the same totals; pickled (torch pickles
    deltas, which are plain Counters, but to be sure) it is a plain ``Counter``."""

    totals: dict[str, int]

    def __setitem__(self, key: str, value: Any) -> None:
        if key in _READ:
            try:
                self.totals[key] = self.totals.get(key, 0) + int(value - dict.get(self, key, 0))
            except (TypeError, ValueError):  # a value that is no number: torch's business, not a count
                pass
        dict.__setitem__(self, key, value)

    def copy(self) -> _Counting:
        return _counting(self.totals, self)

    def __reduce__(self) -> Any:
        return (collections.Counter, (dict(self),))


def _counting(totals: dict[str, int], values: Any = ()) -> _Counting:
    counter = _Counting()
    counter.totals = totals
    dict.update(counter, values)
    return counter


class _Factory:
    """``counters.default_factory`` once counted through clears: makes each group's :class:`_Counting`, and holds
    the running totals (``totals``), which a ``counters.clear()`` does not touch."""

    def __init__(self) -> None:
        self.totals: dict[str, int] = {}

    def __call__(self) -> _Counting:
        return _counting(self.totals)


def count_through_clears(counters: Any) -> dict[str, int] | None:
    """Make ``counters`` (torch's ``defaultdict(Counter)``) keep running totals of the counters in :data:`_READ`
    through clears, and return them: the counts so far, then every change. Idempotent. None where its
    ``default_factory`` is not torch's ``Counter`` (another tool replaced it): then counts are read as they stand."""
    factory = getattr(counters, "default_factory", None)
    if isinstance(factory, _Factory):
        return factory.totals
    if factory is not collections.Counter:
        return None
    made = _Factory()
    for group, counter in list(counters.items()):
        if isinstance(counter, collections.Counter) and not isinstance(counter, _Counting):
            counters[group] = _counting(made.totals, counter)
    for counter in counters.values():
        for name in _READ.intersection(counter):
            made.totals[name] = made.totals.get(name, 0) + int(counter[name])
    counters.default_factory = made
    return made.totals


def _totals(counters: Any) -> tuple[dict[str, int], Any]:
    """The counters read here as running totals, and what holds them (a :class:`_Factory`, or ``counters``
    itself where they could not be counted through clears: then a cleared count reads as a lower one)."""
    totals = count_through_clears(counters)
    if totals is not None:
        return dict(totals), counters.default_factory
    now: dict[str, int] = {}
    for counter in list(counters.values()):
        for name in _READ.intersection(counter):
            now[name] = now.get(name, 0) + int(counter[name])
    return now, counters


class Mark:
    """Counters and metric position at the start of a phase: ``counters``, the running totals of the counters read
    here (:func:`count_through_clears`), and ``source``, what held them; ``triton``: triton cache entries written
    so far; ``limits``: recompile-limit warnings so far; ``breaks``: graph breaks torch logged so far."""

    __slots__ = ("breaks", "counters", "limits", "metrics", "reasons", "source", "triton")

    def __init__(
        self,
        counters: dict[str, int],
        metrics: int,
        reasons: int,
        triton: int = 0,
        limits: int = 0,
        breaks: int = 0,
        source: Any = None,
    ) -> None:
        self.counters = counters
        self.source = source
        self.metrics = metrics
        self.reasons = reasons
        self.triton = triton
        self.limits = limits
        self.breaks = breaks


ZERO = _EMPTY = Mark({}, 0, 0)  # before torch is imported: every counter at zero


def mark() -> Mark:
    """Cheap snapshot; before torch's Dynamo is imported there are no counters yet (they start at zero)."""
    if not torch_loaded():
        return _EMPTY
    _prepare()
    reasons = len(_tap.reasons) if _tap else 0
    if not dynamo_loaded():
        return Mark({}, 0, reasons, len(triton_built), dynamo.limit_mark(), dynamo.breaks_mark())
    from torch._dynamo import utils

    counters, source = _totals(utils.counters)
    limits, breaks = dynamo.limit_mark(), dynamo.breaks_mark()
    return Mark(counters, _metrics_count(utils), reasons, len(triton_built), limits, breaks, source)


def moved(start: Mark | None, now: Mark) -> bool:
    """Whether anything compiled (a counter, a compile record) between ``start`` (None: torch's import) and
    ``now``: two comparisons, no delta. Graph breaks and limit warnings come with a compile record."""
    if start is None:
        return bool(now.counters) or now.metrics > 0
    return now.counters != start.counters or now.metrics != start.metrics


def delta(start: Mark) -> dict[str, Any]:
    """What compiled since ``start``, shaped like ``ItemRecord.to_json``.

    Counts are the change of the running totals (:func:`count_through_clears`): what a test counted is counted
    also where it (or its set-up or tear-down, as torch's ``TestCase``) cleared torch's counters. Where ``counters``
    itself was replaced since ``start`` (a test's monkeypatch), or could not be counted through clears and reads
    lower than at ``start``, what it holds now is what counts. Metrics after a ``clear_compilation_metrics()``
    by the test are counted from the start of the list. A compile attempt that failed (``fail_type``: the
    recompile limit, a frame Dynamo skipped) is no compiled frame; its seconds count, and it is a recompile when
    torch's recompiles log says so (it logs the attempt).
    """
    if not dynamo_loaded():
        return {}
    _prepare()
    from torch._dynamo import utils

    now, source = _totals(utils.counters)
    same = start.source is None or start.source is source

    def moved(name: str) -> int:
        before = start.counters.get(name, 0) if same else 0
        count = now.get(name, 0)
        return count - before if count >= before else count

    new = _metrics_since(utils, start.metrics)
    out = empty_delta()
    gpu = out["gpu"]
    gpu["triton_bundle_files"] = moved(TRITON_BUNDLES)
    gpu["triton_built"] = max(0, len(triton_built) - start.triton)
    gpu["autotune_benchmarks"] = sum(moved(name) for name in AUTOTUNE_COUNTERS)
    out["fxgraph"] = {k: moved(f"fxgraph_cache_{k}") for k in FX_FIELDS}
    out["aotautograd"] = {k: moved(f"autograd_cache_{k}") for k in AOT_FIELDS}
    for record in new:
        _add_metric(out, record)
    if dynamo.breaks_mark() != start.breaks:
        out["graph_breaks"], reasons = dynamo.graph_breaks(start.breaks)
        if reasons:
            out["graph_break_reasons"] = reasons
    warned = dynamo.limit_hits(start.limits)
    limit_hit = _ran_uncompiled(warned, new)
    if limit_hit:
        out["limit_hit"] = limit_hit
    if "recompiled" in out:  # named also where torch raised at the limit (the test failed: it must say which frame)
        _name_unnamed(out["recompiled"], new, warned)
    if _tap is not None:
        out["bypass_reasons"] = sorted(set(_tap.reasons[start.reasons :]))
    return out


# CompilationMetrics columns (2.7-2.15) summed into the GPU seconds: triton's compile (async_compile's precompile
# and wait), autotuning at compile time (select_algorithm, benchmark fusion) and at the first call (runtime
# benchmarks of a kernel's configs, recorded as an ``is_runtime`` record after the call; torch 2.7.1 declares the
# column but does not fill it: its first-call autotuning is not measured).
TRITON_COMPILE_METRICS = ("triton_compile_time_us",)
AUTOTUNE_METRICS = ("compile_time_autotune_time_us", "runtime_triton_autotune_time_us")


def _metrics_since(utils: Any, start: int) -> list[Any]:
    """The records after the first ``start`` (all of them after a ``clear_compilation_metrics()`` by the test),
    without copying the earlier ones: a test that compiled nothing costs no walk through the session's records."""
    records = dynamo.compilation_records(utils)
    count = len(records) if records is not None else start
    if records is None or count == start:
        return []
    try:
        return list(itertools.islice(records, start, None)) if count > start else list(records)
    except RuntimeError:  # a compile in another thread appended meanwhile ("deque mutated during iteration")
        return list(utils.get_compilation_metrics())[start:]


def _metrics_count(utils: Any) -> int:
    """How many records :func:`_metrics_since` would return, without copying them (every test's start asks);
    -1 where this torch keeps none."""
    records = dynamo.compilation_records(utils)
    return len(records) if records is not None else -1


_ATTEMPT = r"(\d+)/(\d+)"  # compiled by ``re`` on first use, not at import
# The functions whose frames a delta compiled for the first time: not a statistic, but what the recorder needs to
# name the earlier test that compiled a frame a later test recompiled (it takes the key out of the delta).
FIRST_COMPILES = "first_compiles"


def _name_unnamed(recompiled: list[dict[str, Any]], records: list[Any], limit_hit: list[dict[str, str]]) -> None:
    """A compile that failed (the one that hit the recompile limit: torch records it without ``co_name``) takes
    its function from a record of the same frame, else from the limit warning of the same test."""
    frames = {_frame(record): dynamo.record_function(record) for record in records if getattr(record, "co_name", None)}
    for entry in recompiled:
        frame = entry.pop(_FRAME, None)
        if not entry["function"]:
            hits = {hit["function"] for hit in limit_hit}
            entry["function"] = frames.get(frame) or (hits.pop() if len(hits) == 1 else "")


# fail_type of a compile that hit the recompile limit: torch raises it (fail_on_recompile_limit_hit, fullgraph) ...
_LIMIT_RAISED = "FailOnRecompileLimitHit"
# ... or torch compiles the frame no more (RUN_ONLY: its compiled code where the guards pass, else eager; 2.7:
# RecompileLimitExceeded; 2.13: Unsupported, with its gb_type)
_LIMIT_SKIPPED = ("RecompileLimitExceeded", "CacheLimitExceeded")
_LIMIT_REASON = "recompile limit exceeded"


def _ran_uncompiled(hits: list[dict[str, str]], records: list[Any]) -> list[dict[str, str]]:
    """The recompile-limit warnings whose frames then ran uncompiled: not those where torch raised instead
    (the test failed with ``FailOnRecompileLimitHit``). Each warning precedes its failed compile's record, so
    the n-th warning is the n-th such record's; when they cannot be paired, a test where torch raised keeps
    none (its failure says it)."""
    outcomes = []
    for record in records:
        fail_type = getattr(record, "fail_type", None) or ""
        reason = str(getattr(record, "fail_reason", None) or "").lower()
        if fail_type == _LIMIT_RAISED or fail_type in _LIMIT_SKIPPED or _LIMIT_REASON in reason:
            outcomes.append(fail_type != _LIMIT_RAISED)
    if len(outcomes) == len(hits):
        return [hit for hit, skipped in zip(hits, outcomes) if skipped]
    return hits if all(outcomes) else []


def _frame(record: Any) -> str:
    return str(getattr(record, "compile_id", "") or "").partition("/")[0]


_FRAME = "frame"  # an entry's frame id, until _name_unnamed has read it


def _us(record: Any, names: tuple[str, ...]) -> float:
    return sum(int(getattr(record, name, 0) or 0) for name in names) / 1e6


def _add_metric(out: dict[str, Any], record: Any) -> None:
    gpu = out["gpu"]
    gpu["triton_compile_seconds"] += _us(record, TRITON_COMPILE_METRICS)
    gpu["autotune_seconds"] += _us(record, AUTOTUNE_METRICS)
    frame_seconds = getattr(record, "entire_frame_compile_time_s", None)
    backward_us = getattr(record, "backward_cumulative_compile_time_us", None)
    if getattr(record, "is_runtime", False) or (frame_seconds is None and backward_us):
        # A lazily compiled backward: its own record, under its forward's compile id. Not a frame.
        out["compile_seconds"] += (backward_us or 0) / 1e6
    else:
        failed = bool(getattr(record, "fail_type", None))  # an attempt that compiled nothing: no frame compiled
        out["frames"] += 0 if failed else 1
        out["compile_seconds"] += frame_seconds or 0.0
        match = re.search(_ATTEMPT, str(getattr(record, "compile_id", "") or ""))
        reason = getattr(record, "recompile_reason", None)
        if reason or (match and int(match.group(2)) > 0):  # as torch's recompiles log: attempts, failed ones too
            out["recompiles"] += 1
            entry = {"function": dynamo.record_function(record), "reason": dynamo.guard_failure(reason)}
            entry[_FRAME] = _frame(record)
            out.setdefault("recompiled", []).append(entry)
        elif match and not failed:  # the frame's first compile: the recorder remembers which test paid it
            out.setdefault(FIRST_COMPILES, []).append(dynamo.record_function(record))
    remote = out["remote"]
    remote["fx_hit"] += getattr(record, "inductor_fx_remote_cache_hit_count", 0) or 0
    remote["fx_miss"] += getattr(record, "inductor_fx_remote_cache_miss_count", 0) or 0
    remote["aot_hit"] += getattr(record, "aotautograd_remote_cache_hit_count", 0) or 0
    remote["aot_miss"] += getattr(record, "aotautograd_remote_cache_miss_count", 0) or 0
