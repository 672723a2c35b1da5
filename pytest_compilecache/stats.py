"""Per-test compile records and their merge across xdist workers.

Plain data only: everything here round-trips through JSON, because records travel from xdist
workers to the controller on pytest's ``TestReport`` objects.
Loads lazily (inside the functions that need them, so a session pays only for what it uses): ``.explain``.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from dataclasses import field
from typing import TYPE_CHECKING
from typing import Any
from typing import Callable
from typing import Mapping

if TYPE_CHECKING:  # imported where a record has graphs: a session that never compiles never imports explain
    from .explain import GraphLookup
    from .explain import MissExplanation

from .record_fields import AOT_FIELDS
from .record_fields import COUNT_GROUPS
from .record_fields import COUNTS
from .record_fields import ENTRIES
from .record_fields import FX_FIELDS
from .record_fields import GPU_SECONDS
from .record_fields import GPU_SIGNALS
from .record_fields import OUTSIDE
from .record_fields import REMOTE_FIELDS
from .record_fields import SECONDS
from .record_fields import TEXTS
from .record_fields import counts as _counts
from .record_fields import gpu as _gpu
from .record_fields import gpu_json as _gpu_json
from .record_fields import merge_entries
from .record_fields import merge_texts

MAX_GRAPHS = 64  # lookups kept per test: a test that compiles more is rare, and the rest add no reason


def _add(into: dict[str, int], other: Mapping[str, int]) -> None:
    for name, value in other.items():
        into[name] = into.get(name, 0) + value


@dataclass
class ItemRecord:
    """What one test item compiled, summed over its setup, call and teardown phases.

    Its statistics are the fields :mod:`.record_fields` lists (``fxgraph``, ``aotautograd``, ``remote``, ``gpu``,
    the counts, seconds, texts and entries there); ``graphs`` and ``why`` are the miss explanations' part.
    """

    nodeid: str
    worker: str = "controller"
    fxgraph: dict[str, int] = field(default_factory=lambda: _counts(FX_FIELDS))
    aotautograd: dict[str, int] = field(default_factory=lambda: _counts(AOT_FIELDS))
    remote: dict[str, int] = field(default_factory=lambda: _counts(REMOTE_FIELDS))
    gpu: dict[str, float] = field(default_factory=lambda: _gpu())
    frames: int = 0
    recompiles: int = 0
    graph_breaks: int = 0
    compile_seconds: float = 0.0
    bypass_reasons: list[str] = field(default_factory=list)
    graph_break_reasons: list[str] = field(default_factory=list)
    recompiled: list[dict[str, Any]] = field(default_factory=list)
    limit_hit: list[dict[str, Any]] = field(default_factory=list)
    # Every FX-graph lookup of this test with its key's components, capped; and, once the controller compared
    # them with an earlier run, why each miss missed.
    graphs: list[GraphLookup] = field(default_factory=list)
    why: list[MissExplanation] = field(default_factory=list)
    # Marked ``@pytest.mark.compile_cache("isolated"/"disabled")``: its misses are by design, never explained, and
    # left out of the rate ``--compile-cache-min-hit-rate`` checks (the totals still count them, as torch does).
    by_design: bool = False

    @property
    def compiled(self) -> bool:
        """True when anything went through Dynamo or a compile cache during this test."""
        lookups = sum(self.fxgraph.values()) + sum(self.aotautograd.values())
        return bool(self.frames or lookups or self.compile_seconds or self.used_gpu or self.limit_hit)

    @property
    def used_gpu(self) -> bool:
        """True when triton or autotuning took part in this test (see :data:`GPU_SIGNALS`)."""
        return any(self.gpu[name] for name in GPU_SIGNALS)

    @property
    def gpu_rebuilt(self) -> bool:
        """True when this test built triton cache entries or benchmarked autotuning: work a warm cache spares."""
        return bool(self.gpu["triton_built"] or self.gpu["autotune_seconds"])

    @property
    def gpu_work(self) -> float:
        """Seconds this test spent compiling triton kernels or autotuning (0.0 when its GPU code all came cached)."""
        return sum(self.gpu[name] for name in GPU_SECONDS)

    @property
    def misses(self) -> int:
        return self.fxgraph["miss"]

    def add(self, delta: Mapping[str, Any]) -> None:
        """Add one phase's delta (a dict shaped like :meth:`to_json`) to this record."""
        for group, fields in COUNT_GROUPS.items():
            _add(getattr(self, group), _counts(fields, delta.get(group)))
        for name, value in _gpu(delta.get("gpu")).items():
            self.gpu[name] += value
        for name in COUNTS:
            setattr(self, name, getattr(self, name) + int(delta.get(name, 0) or 0))
        for name in SECONDS:
            setattr(self, name, getattr(self, name) + float(delta.get(name, 0.0) or 0.0))
        for name in TEXTS:
            merge_texts(getattr(self, name), delta.get(name))
        for name in ENTRIES:
            merge_entries(getattr(self, name), delta.get(name))
        if delta.get("by_design") is True:
            self.by_design = True
        graphs, why = delta.get("graphs"), delta.get("why")
        if graphs or why:
            # The JSON report has a count in "graphs" (its reader, ``cli report``, comes through here): no lookups.
            self._add_graphs(graphs if isinstance(graphs, list) else (), why if isinstance(why, list) else ())

    def _add_graphs(self, graphs: Any, why: Any) -> None:
        from .explain import GraphLookup
        from .explain import MissExplanation

        for graph in graphs:
            if len(self.graphs) < MAX_GRAPHS:
                with contextlib.suppress(ValueError):  # a malformed lookup from a worker is dropped, not fatal
                    self.graphs.append(graph if isinstance(graph, GraphLookup) else GraphLookup.from_json(graph))
        for item in why:
            with contextlib.suppress(ValueError):  # a malformed explanation is dropped, not fatal
                self.why.append(item if isinstance(item, MissExplanation) else MissExplanation.from_json(item))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"nodeid": self.nodeid, "worker": self.worker}
        out.update({group: dict(getattr(self, group)) for group in COUNT_GROUPS})
        if self.used_gpu:  # no all-zero block on CPU; a reader takes a missing block as zeros
            out["gpu"] = _gpu_json(self.gpu)
        out.update({name: getattr(self, name) for name in COUNTS})
        out.update({name: round(getattr(self, name), 4) for name in SECONDS})
        out.update({name: list(getattr(self, name)) for name in TEXTS})
        out.update({name: [dict(entry) for entry in getattr(self, name)] for name in ENTRIES})
        out["graphs"] = [g.to_json() for g in self.graphs]
        out["why"] = [w.to_json() for w in self.why]
        if self.by_design:
            out["by_design"] = True
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ItemRecord:
        record = cls(nodeid=str(data["nodeid"]), worker=str(data.get("worker", "controller")))
        record.add(data)
        return record


def hit_rate(hits: int, misses: int) -> float | None:
    """FX-graph hits / (hits + misses); None when nothing was looked up (no rate, not 0%)."""
    total = hits + misses
    return hits / total if total else None


@dataclass
class SessionStats:
    """Every item record of a session, merged across workers, plus facts about the session."""

    records: dict[str, ItemRecord] = field(default_factory=dict)
    tests: int = 0
    silent_workers: list[str] = field(default_factory=list)

    def add_record(self, record: ItemRecord) -> None:
        """Merge a record; a nodeid seen twice (reruns) accumulates."""
        existing = self.records.get(record.nodeid)
        if existing is None:
            self.records[record.nodeid] = record
        else:
            existing.add(record.to_json())

    @property
    def compiled(self) -> list[ItemRecord]:
        """Records of tests that compiled, slowest first."""
        items = [r for r in self.records.values() if r.compiled]
        return sorted(items, key=lambda r: (-r.compile_seconds, r.nodeid))

    def total(self, layer: str) -> dict[str, int]:
        out = _counts(COUNT_GROUPS[layer])
        for record in self.records.values():
            _add(out, getattr(record, layer))
        return out

    def sum(self, name: str) -> float:
        """One of :data:`.record_fields.COUNTS` or ``SECONDS`` summed over the session's tests."""
        return float(sum(getattr(record, name) for record in self.records.values()))

    @property
    def hits(self) -> int:
        return self.total("fxgraph")["hit"]

    @property
    def misses(self) -> int:
        return self.total("fxgraph")["miss"]

    @property
    def hit_rate(self) -> float | None:
        return hit_rate(self.hits, self.misses)

    @property
    def unmarked_hit_rate(self) -> float | None:
        """The FX-graph hit rate of the tests not marked ``compile_cache`` (:attr:`ItemRecord.by_design`): what
        ``--compile-cache-min-hit-rate`` checks. None when they looked nothing up."""
        kept = [record.fxgraph for record in self.records.values() if not record.by_design]
        return hit_rate(sum(counts["hit"] for counts in kept), sum(counts["miss"] for counts in kept))

    @property
    def compile_seconds(self) -> float:
        return sum(r.compile_seconds for r in self.records.values())

    def gpu_total(self) -> dict[str, float]:
        out = _gpu()
        for record in self.records.values():
            for name, value in record.gpu.items():
                out[name] += value
        return out

    @property
    def gpu_still_compiled(self) -> list[ItemRecord]:
        """Tests without an FX-graph miss or bypass that still built triton kernels or helpers, or autotuned:
        "100% hits" that did not spare the GPU its work. Most GPU seconds first."""
        found = [
            r for r in self.records.values() if r.gpu_rebuilt and not r.fxgraph["miss"] and not r.fxgraph["bypass"]
        ]
        return sorted(found, key=lambda r: (-r.gpu_work, r.nodeid))

    @property
    def new_gpu_artifacts(self) -> bool:
        """True when this session benchmarked autotuning choices (their results, best configs and max-autotune
        timings, are new to the cache dir) or built triton cache entries (kernels, helper libraries): a save is
        worth it even when every FX-graph lookup hit."""
        return any(r.gpu_rebuilt for r in self.records.values())

    @property
    def used_gpu(self) -> bool:
        return any(r.used_gpu for r in self.records.values())

    @property
    def anything_compiled(self) -> bool:
        return any(r.compiled for r in self.records.values())

    @property
    def compiled_tests(self) -> int:
        """How many tests compiled: the ``(outside tests)`` row (compiles at import, collection or in a session
        hook) is not a test."""
        return sum(1 for nodeid, r in self.records.items() if r.compiled and nodeid != OUTSIDE)

    def totals_json(self) -> dict[str, Any]:
        rate = self.hit_rate
        out: dict[str, Any] = {"tests": self.tests, "compiled_tests": self.compiled_tests}
        out.update({group: self.total(group) for group in COUNT_GROUPS})
        if self.used_gpu:  # as in ItemRecord.to_json
            out["gpu"] = _gpu_json(self.gpu_total())
        out.update({name: int(self.sum(name)) for name in COUNTS})
        out.update(
            {
                "hits": self.hits,
                "misses": self.misses,
                "hit_rate": None if rate is None else round(rate, 4),
                "compile_seconds": round(self.compile_seconds, 3),
            }
        )
        return out


class CompileCacheStats:
    """What the current test has compiled so far, read live: the ``compile_cache_stats`` fixture.

    Every attribute read takes a fresh snapshot (counter deltas since the test started), so a test can
    compile, then assert on what that compile did::

        def test_warm(compile_cache_stats):
            model(x)
            assert compile_cache_stats.fxgraph["miss"] == 0, compile_cache_stats.bypass_reasons
    """

    __slots__ = ("_explain", "_nodeid", "_snapshot")

    def __init__(
        self,
        nodeid: str,
        snapshot: Callable[[], Mapping[str, Any]],
        explain: Callable[[ItemRecord], list[MissExplanation]] | None = None,
    ) -> None:
        """``explain`` says why the record's misses missed (against the earlier run); None: nothing to compare."""
        self._nodeid = nodeid
        self._snapshot = snapshot
        self._explain = explain

    def snapshot(self) -> ItemRecord:
        """The record so far, as a detached :class:`ItemRecord`."""
        record = ItemRecord(nodeid=self._nodeid)
        record.add(self._snapshot())
        if self._explain is not None and record.graphs:
            record.why = self._explain(record)
        return record

    @property
    def graphs(self) -> list[GraphLookup]:
        """Every FX-graph lookup so far, with its key and the key's components (see ``explain``)."""
        return self.snapshot().graphs

    @property
    def why(self) -> list[MissExplanation]:
        """Why each miss so far missed, against the earlier run (bundle or previous session); [] if none::

        assert compile_cache_stats.misses == 0, compile_cache_stats.why
        """
        return self.snapshot().why

    @property
    def nodeid(self) -> str:
        return self._nodeid

    @property
    def fxgraph(self) -> dict[str, int]:
        """FX-graph cache lookups: ``hit``, ``miss``, ``bypass``."""
        return self.snapshot().fxgraph

    @property
    def aotautograd(self) -> dict[str, int]:
        """AOTAutograd cache lookups: ``hit``, ``miss``, ``bypass``, ``guard_miss``."""
        return self.snapshot().aotautograd

    @property
    def remote(self) -> dict[str, int]:
        """Lookups that went to a remote (Redis) cache: ``fx_hit``, ``fx_miss``, ``aot_hit``, ``aot_miss``."""
        return self.snapshot().remote

    @property
    def gpu(self) -> dict[str, float]:
        """The GPU layers so far: ``triton_bundle_files``, ``autotune_benchmarks``, ``triton_compile_seconds``,
        ``autotune_seconds``; a warm GPU test asserts ``compile_cache_stats.gpu["autotune_seconds"] == 0``."""
        return self.snapshot().gpu

    @property
    def frames(self) -> int:
        return self.snapshot().frames

    @property
    def recompiles(self) -> int:
        return self.snapshot().recompiles

    @property
    def compile_seconds(self) -> float:
        return self.snapshot().compile_seconds

    @property
    def bypass_reasons(self) -> list[str]:
        return self.snapshot().bypass_reasons

    @property
    def graph_breaks(self) -> int:
        """Graph breaks torch counted so far; ``graph_break_reasons`` says why (its distinct reasons)."""
        return self.snapshot().graph_breaks

    @property
    def graph_break_reasons(self) -> list[str]:
        return self.snapshot().graph_break_reasons

    @property
    def recompiled(self) -> list[dict[str, Any]]:
        """Each recompile so far: ``{"function", "reason", "first", "count"}`` (torch's guard-failure reason; the
        test that compiled the frame first)."""
        return self.snapshot().recompiled

    @property
    def limit_hit(self) -> list[dict[str, Any]]:
        """Frames that hit torch's recompile limit so far (torch compiles them no more)::

        assert not compile_cache_stats.limit_hit, compile_cache_stats.limit_hit
        """
        return self.snapshot().limit_hit

    @property
    def misses(self) -> int:
        """FX-graph misses (the number a warm cache drives to zero)."""
        return self.snapshot().misses

    @property
    def compiled(self) -> bool:
        return self.snapshot().compiled

    def __repr__(self) -> str:
        return f"CompileCacheStats({self.snapshot()!r})"
