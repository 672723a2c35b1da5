"""stats.py: ItemRecord arithmetic and JSON round trip, SessionStats merging, totals and ordering."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pytest_compilecache.record_fields import AOT_FIELDS
from pytest_compilecache.record_fields import FX_FIELDS
from pytest_compilecache.record_fields import REMOTE_FIELDS
from pytest_compilecache.stats import ItemRecord
from pytest_compilecache.stats import SessionStats
from pytest_compilecache.stats import hit_rate


def _record(
    nodeid: str, *, hit: int = 0, miss: int = 0, bypass: int = 0, seconds: float = 0.0, **extra: Any
) -> ItemRecord:
    record = ItemRecord(nodeid, worker=extra.pop("worker", "controller"))
    record.add({"fxgraph": {"hit": hit, "miss": miss, "bypass": bypass}, "compile_seconds": seconds, **extra})
    return record


PHASE = {
    "fxgraph": {"hit": 2, "miss": 1, "bypass": 1},
    "aotautograd": {"hit": 1, "miss": 1, "bypass": 0, "guard_miss": 3},
    "remote": {"fx_hit": 1, "fx_miss": 0, "aot_hit": 0, "aot_miss": 1},
    "frames": 2,
    "recompiles": 1,
    "compile_seconds": 0.25,
    "bypass_reasons": ["unsupported op", "non-deterministic"],
}


def test_a_new_record_is_empty_and_did_not_compile() -> None:
    record = ItemRecord("t.py::test")
    assert record.fxgraph == dict.fromkeys(FX_FIELDS, 0)
    assert record.aotautograd == dict.fromkeys(AOT_FIELDS, 0)
    assert record.remote == dict.fromkeys(REMOTE_FIELDS, 0)
    assert record.compiled is False
    assert record.misses == 0


def test_add_sums_phases_and_dedupes_bypass_reasons() -> None:
    record = ItemRecord("t.py::test")
    record.add(PHASE)
    record.add(PHASE)
    record.add({"bypass_reasons": ["unsupported op", "third"]})
    assert record.fxgraph == {"hit": 4, "miss": 2, "bypass": 2}
    assert record.aotautograd == {"hit": 2, "miss": 2, "bypass": 0, "guard_miss": 6}
    assert record.remote == {"fx_hit": 2, "fx_miss": 0, "aot_hit": 0, "aot_miss": 2}
    assert (record.frames, record.recompiles) == (4, 2)
    assert record.compile_seconds == pytest.approx(0.5)
    assert record.bypass_reasons == ["unsupported op", "non-deterministic", "third"]
    assert record.misses == 2
    assert record.compiled is True


def test_add_tolerates_partial_and_null_deltas() -> None:
    record = ItemRecord("t.py::test")
    record.add({})
    record.add({"fxgraph": {"hit": None, "miss": 1, "unknown_field": 7}, "aotautograd": None})
    assert record.fxgraph == {"hit": 0, "miss": 1, "bypass": 0}
    assert "unknown_field" not in record.fxgraph


@pytest.mark.parametrize(
    "delta",
    [
        {"frames": 1},
        {"compile_seconds": 0.01},
        {"fxgraph": {"bypass": 1}},
        {"aotautograd": {"guard_miss": 1}},
        # A test whose only GPU work is first-call autotuning, recorded after its compile (issue 27.5).
        {"gpu": {"autotune_seconds": 0.4}},
        {"gpu": {"triton_built": 1}},
    ],
)
def test_any_compile_activity_counts_as_compiled(delta: dict[str, Any]) -> None:
    record = ItemRecord("t.py::test")
    record.add(delta)
    assert record.compiled is True


def test_json_round_trip_through_real_json() -> None:
    record = ItemRecord("t.py::test[a|b]", worker="gw3")
    record.add(PHASE)
    data = json.loads(json.dumps(record.to_json()))
    again = ItemRecord.from_json(data)
    assert again == record
    assert again.to_json() == record.to_json()
    assert set(data) == {
        "nodeid",
        "worker",
        "fxgraph",
        "aotautograd",
        "remote",
        "frames",
        "recompiles",
        "graph_breaks",
        "compile_seconds",
        "bypass_reasons",
        "graph_break_reasons",
        "recompiled",
        "limit_hit",
        "graphs",
        "why",
    }  # no "gpu": this record used none (issue 41)


def test_every_field_of_the_schema_is_recorded_round_tripped_and_shown_live() -> None:
    """The per-test record's fields live in one place (record_fields): the record, its JSON, probe's empty delta
    and the live fixture all follow it, so a new field cannot be forgotten in one of them."""
    from pytest_compilecache import record_fields
    from pytest_compilecache.stats import CompileCacheStats

    names = [*record_fields.COUNT_GROUPS, "gpu", *record_fields.COUNTS, *record_fields.SECONDS]
    names += [*record_fields.TEXTS, *record_fields.ENTRIES]
    delta: dict[str, Any] = {**record_fields.empty_delta(), "graph_break_reasons": ["a"], "bypass_reasons": ["b"]}
    delta.update(recompiled=[{"function": "f (t.py:1)", "reason": "r", "first": ""}], limit_hit=[{"function": "g"}])
    delta.update(gpu={"autotune_seconds": 1.0}, frames=2, graph_breaks=1)
    record = ItemRecord("t.py::test")
    record.add(delta)
    live = CompileCacheStats("t.py::test", lambda: delta)
    for name in names:
        assert hasattr(record, name), name
        assert name in record.to_json(), name
        assert getattr(live, name) == getattr(record, name), name
    assert set(record_fields.empty_delta()) <= set(names)
    assert ItemRecord.from_json(record.to_json()) == record
    assert record.recompiled == [{"function": "f (t.py:1)", "reason": "r", "first": "", "count": 1}]


def test_to_json_rounds_seconds_and_copies() -> None:
    record = _record("t", hit=1, seconds=1 / 3)
    data = record.to_json()
    assert data["compile_seconds"] == 0.3333
    data["fxgraph"]["hit"] = 99
    data["bypass_reasons"].append("mutated")
    assert record.fxgraph["hit"] == 1
    assert record.bypass_reasons == []


def test_from_json_defaults_the_worker() -> None:
    assert ItemRecord.from_json({"nodeid": "t"}).worker == "controller"


@pytest.mark.parametrize(("hits", "misses", "expected"), [(0, 0, None), (3, 1, 0.75), (0, 4, 0.0), (5, 0, 1.0)])
def test_hit_rate(hits: int, misses: int, expected: float | None) -> None:
    assert hit_rate(hits, misses) == expected


def test_empty_session() -> None:
    stats = SessionStats(tests=12)
    assert stats.hit_rate is None
    assert stats.compiled == []
    assert stats.anything_compiled is False
    totals = stats.totals_json()
    assert totals["hit_rate"] is None
    assert totals["tests"] == 12
    assert totals["compiled_tests"] == 0


def test_bypasses_alone_leave_no_hit_rate() -> None:
    stats = SessionStats()
    stats.add_record(_record("a", bypass=4))
    assert stats.anything_compiled is True
    assert stats.hit_rate is None


def test_totals_across_records() -> None:
    stats = SessionStats(tests=3)
    stats.add_record(_record("a", hit=3, miss=1, seconds=1.0, frames=2))
    stats.add_record(_record("b", hit=1, miss=3, bypass=1, seconds=0.5, recompiles=2))
    stats.add_record(ItemRecord("c"))  # ran, compiled nothing
    assert stats.total("fxgraph") == {"hit": 4, "miss": 4, "bypass": 1}
    assert (stats.hits, stats.misses) == (4, 4)
    assert stats.hit_rate == 0.5
    assert stats.compile_seconds == pytest.approx(1.5)
    totals = stats.totals_json()
    assert totals["compiled_tests"] == 2
    assert totals["frames"] == 2
    assert totals["recompiles"] == 2
    assert totals["hit_rate"] == 0.5
    assert totals["compile_seconds"] == 1.5
    assert json.loads(json.dumps(totals)) == totals


def test_unknown_layer_is_an_error() -> None:
    with pytest.raises(KeyError):
        SessionStats().total("triton")


def test_compiled_is_slowest_first_then_by_nodeid() -> None:
    stats = SessionStats()
    for nodeid, seconds in [("m", 1.0), ("z", 3.0), ("a", 1.0), ("idle", 0.0), ("b", 2.0)]:
        stats.add_record(_record(nodeid, hit=1, seconds=seconds) if seconds else ItemRecord(nodeid))
    assert [r.nodeid for r in stats.compiled] == ["z", "b", "a", "m"]


def test_same_nodeid_from_reruns_accumulates() -> None:
    stats = SessionStats()
    stats.add_record(_record("t", hit=1, seconds=0.5, bypass_reasons=["x"]))
    stats.add_record(_record("t", miss=2, seconds=0.25, bypass_reasons=["x", "y"]))
    assert list(stats.records) == ["t"]
    record = stats.records["t"]
    assert record.fxgraph == {"hit": 1, "miss": 2, "bypass": 0}
    assert record.compile_seconds == pytest.approx(0.75)
    assert record.bypass_reasons == ["x", "y"]


def test_merge_worker_records_sent_as_json() -> None:
    """The controller rebuilds records that xdist workers serialised; the result equals a local merge."""
    local = SessionStats()
    merged = SessionStats()
    for worker, nodeid, hit in [("gw0", "a", 1), ("gw1", "b", 2), ("gw0", "c", 3)]:
        record = _record(nodeid, hit=hit, miss=1, seconds=0.1, worker=worker)
        local.add_record(_record(nodeid, hit=hit, miss=1, seconds=0.1, worker=worker))
        wire = json.dumps([record.to_json()])
        for data in json.loads(wire):
            merged.add_record(ItemRecord.from_json(data))
    assert merged.totals_json() == local.totals_json()
    assert {r.nodeid: r.worker for r in merged.records.values()} == {"a": "gw0", "b": "gw1", "c": "gw0"}
    assert merged.hits == 6


def test_silent_workers_are_recorded_not_fatal() -> None:
    stats = SessionStats(tests=4)
    stats.add_record(_record("a", hit=1, worker="gw0"))
    stats.silent_workers.append("gw1")
    assert stats.silent_workers == ["gw1"]
    assert stats.totals_json()["hits"] == 1
    assert SessionStats().silent_workers == []  # not a shared default


def test_live_stats_expose_graphs_and_why() -> None:
    from pytest_compilecache.explain import GraphLookup
    from pytest_compilecache.explain import MissExplanation
    from pytest_compilecache.stats import CompileCacheStats

    lookup = GraphLookup("fk", "miss", {"gm": ("abc", None)})
    delta = {"fxgraph": {"miss": 1}, "graphs": [lookup.to_json(), {"k": 1}]}  # a malformed lookup is dropped
    seen: list[ItemRecord] = []

    def explain(record: ItemRecord) -> list[MissExplanation]:
        seen.append(record)
        return [MissExplanation(g.key, ["new test"]) for g in record.graphs]

    live = CompileCacheStats("t.py::test", lambda: delta, explain)
    assert live.graphs == [lookup]
    assert live.why == [MissExplanation("fk", ["new test"])]
    assert CompileCacheStats("t.py::test", lambda: delta).why == []  # nothing to compare with
    record = ItemRecord.from_json(json.loads(json.dumps(live.snapshot().to_json())))
    assert (record.graphs, record.why) == ([lookup], [MissExplanation("fk", ["new test"])])


def test_a_report_record_with_a_graph_count_reads_back() -> None:
    """The JSON report has ``"graphs": <count>``; ``cli report`` reads it back through ``from_json``."""
    data = {"nodeid": "t::a", "fxgraph": {"miss": 1}, "frames": 1, "graphs": 2, "why": [{"key": "k", "reasons": ["r"]}]}
    record = ItemRecord.from_json(data)
    assert record.graphs == [] and [(w.key, w.reasons) for w in record.why] == [("k", ["r"])]


# --------------------------------------------------------------------------- GPU layers (issue 27.5)

# One test's GPU deltas as probe.delta shapes them: all FX lookups hit, then triton compiled and autotuned anyway.
ALL_HITS_YET_TUNED = {
    "fxgraph": {"hit": 2},
    "gpu": {
        "triton_bundle_files": 0,
        "autotune_benchmarks": 3,
        "triton_compile_seconds": 1.5,
        "autotune_seconds": 2.25,
    },
}
FROM_THE_BUNDLE = {"fxgraph": {"hit": 2}, "gpu": {"triton_bundle_files": 12, "autotune_benchmarks": 3}}


def test_gpu_layers_add_up_and_round_trip() -> None:
    record = ItemRecord("t.py::test_mm")
    record.add(ALL_HITS_YET_TUNED)
    record.add(ALL_HITS_YET_TUNED)
    assert record.gpu == {
        "triton_bundle_files": 0,
        "triton_built": 0,
        "autotune_benchmarks": 6,
        "triton_compile_seconds": 3.0,
        "autotune_seconds": 4.5,
    }
    data = json.loads(json.dumps(record.to_json()))
    assert data["gpu"]["autotune_benchmarks"] == 6 and isinstance(data["gpu"]["autotune_benchmarks"], int)
    assert ItemRecord.from_json(data).gpu == record.gpu
    assert ItemRecord.from_json({"nodeid": "old.py::t"}).gpu["autotune_seconds"] == 0.0  # a report without "gpu"


def test_all_hits_that_still_compiled_on_the_gpu_are_named() -> None:
    stats = SessionStats()
    for nodeid, delta in (("a.py::tuned", ALL_HITS_YET_TUNED), ("b.py::cached", FROM_THE_BUNDLE)):
        record = ItemRecord(nodeid)
        record.add(delta)
        stats.add_record(record)
    assert stats.hit_rate == 1.0
    assert [r.nodeid for r in stats.gpu_still_compiled] == ["a.py::tuned"]
    # Replayed autotune counts of a cached test are not new work; measured seconds are.
    assert stats.new_gpu_artifacts is True
    assert stats.totals_json()["gpu"] == {
        "triton_bundle_files": 12,
        "triton_built": 0,
        "autotune_benchmarks": 6,
        "triton_compile_seconds": 1.5,
        "autotune_seconds": 2.25,
    }
    only_cached = SessionStats()
    record = ItemRecord("b.py::cached")
    record.add(FROM_THE_BUNDLE)
    only_cached.add_record(record)
    assert only_cached.new_gpu_artifacts is False and only_cached.gpu_still_compiled == []


def test_the_live_fixture_shows_the_gpu_layers() -> None:
    from pytest_compilecache.stats import CompileCacheStats

    live = CompileCacheStats("t.py::test_mm", lambda: ALL_HITS_YET_TUNED)
    assert live.gpu["autotune_seconds"] == 2.25 and live.gpu["triton_bundle_files"] == 0


def test_triton_entries_built_are_new_artifacts_even_without_seconds() -> None:
    # A kernel triton compiled afresh under an FX hit (its bundle was not emitted: a half-trimmed dir, bundling
    # off) or a helper library rebuilt: new to the cache, and worth a save.
    stats = SessionStats()
    record = ItemRecord("t.py::test_user_kernel")
    record.add({"fxgraph": {"hit": 1}, "gpu": {"triton_built": 2}})
    stats.add_record(record)
    assert stats.new_gpu_artifacts is True
    assert [r.nodeid for r in stats.gpu_still_compiled] == ["t.py::test_user_kernel"]


def test_triton_compile_seconds_alone_are_not_gpu_work() -> None:
    # torch books its wait for parallel C++ compiles as triton_compile_time_us: CPU sessions have it too.
    record = ItemRecord("t.py::test_cpu")
    record.add({"fxgraph": {"hit": 1}, "frames": 1, "gpu": {"triton_compile_seconds": 0.0003}})
    stats = SessionStats()
    stats.add_record(record)
    assert not record.used_gpu and not stats.used_gpu and not stats.new_gpu_artifacts
    assert stats.gpu_still_compiled == []
