"""session: miss explanations wired through Recorder and Controller (issue 12). A fake probe stands in for torch.

Each test plays one or two sessions in a few milliseconds: the fake probe hands out FX-graph lookups as
torch's capture would, and the controller reads, explains and writes the graph record as in a real run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any
from typing import Iterator

import pytest

from pytest_compilecache import explain
from pytest_compilecache import sync
from pytest_compilecache.context import SessionContext
from pytest_compilecache.explain import GraphLookup
from pytest_compilecache.explain import compare
from pytest_compilecache.problems import Problems
from pytest_compilecache.record_fields import OUTSIDE
from pytest_compilecache.recorder import Recorder
from pytest_compilecache.save_phase import SavePhase
from pytest_compilecache.session import Controller
from pytest_compilecache.session import Worker
from pytest_compilecache.settings import Settings
from pytest_compilecache.stats import ItemRecord
from tests.fakes import FakeProbe
from tests.unit.test_session import FP
from tests.unit.test_session import _compiled
from tests.unit.test_session import _restored
from tests.unit.test_session import _saved


def lookup(key: str, shape: str = "[8, 16]", outcome: str = "miss", code: str = "c1") -> GraphLookup:
    return GraphLookup(
        key,
        outcome,
        {
            "gm": (code, None),
            "example_inputs[0]": ("h" + shape, f"dtype=float32;shape={shape}"),
            "fx_kwargs[is_backward]": ("b0", "False"),
            "fx_kwargs[is_inference]": ("i1", "True"),
        },
    )


@pytest.fixture(autouse=True)
def _environment() -> Iterator[None]:
    """SessionContext.start exports the session's environment: put it back after each test."""
    before = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(before)


def _controller(tmp_path: Path, **options: Any) -> Controller:
    options.setdefault("mode", "shared")
    options.setdefault("dir", str(tmp_path / "cache"))
    options.setdefault("report", "full")
    settings = Settings(**options)
    setup = SessionContext.start(
        settings, tmp_path / "default", inherited=None, problems=Problems(strict=settings.strict)
    )
    setup._fingerprint = FP
    return Controller(setup, Recorder("controller", settings.explain))


def _session(
    tmp_path: Path, fake: FakeProbe, *tests: tuple[str, list[GraphLookup]], compiled: bool = False, **options: Any
) -> Controller:
    """One session of ``tests``; ``compiled``: as if they left a kernel in the cache dir (so a save has work)."""
    controller = _controller(tmp_path, **options)
    controller.session_start()
    for nodeid, graphs in tests:
        fake.run(controller.recorder, nodeid, *graphs)
    if compiled:
        kernel = Path(controller.context.dir.path or "") / "kernel.so"
        kernel.write_bytes(nodeid.encode())
        with pytest.MonkeyPatch.context() as patch:
            _compiled(patch, fake, kernel.name)
            controller.finish()
        fake.loaded = False
        return controller
    controller.finish()
    return controller


def test_recorder_keeps_lookups_except_for_marked_tests(fake_probe: FakeProbe) -> None:
    recorder = Recorder("controller")
    fake_probe.run(recorder, "t.py::test_a", lookup("k1"))
    fake_probe.run(recorder, "t.py::test_iso", lookup("k2"), intended=True)
    fake_probe.run(recorder, "t.py::test_none")
    records = recorder.stats.records
    assert [g.key for g in records["t.py::test_a"].graphs] == ["k1"]
    assert records["t.py::test_iso"].graphs == [] and records["t.py::test_iso"].misses == 1  # counted, not kept
    assert "t.py::test_none" not in records and recorder.stats.tests == 3


def test_what_compiled_outside_every_test_is_counted_and_kept(fake_probe: FakeProbe) -> None:
    """A compile at import or collection (a module-level warm-up), or in a session fixture's teardown, is in no
    test: it is counted under its own record, whose misses are misses (a bundle must carry those graphs) and
    whose graphs the next session explains; it is not a test. What a session before this one counted in the
    same process (``pytest.main()`` twice) is not this session's."""
    fake_probe.lookups.append(lookup("earlier").to_json())  # an earlier in-process session's compile
    recorder = Recorder("controller")
    fake_probe.lookups.append(lookup("at-collection").to_json())
    fake_probe.run(recorder, "t.py::test_a", lookup("k1", outcome="hit"))
    fake_probe.run(recorder, "t.py::test_b")
    fake_probe.lookups.append(lookup("in-teardown").to_json())
    recorder.finish_outside()
    outside = recorder.stats.records[OUTSIDE]
    assert [g.key for g in outside.graphs] == ["at-collection", "in-teardown"] and outside.misses == 2
    assert recorder.stats.tests == 2 and recorder.stats.misses == 2 and recorder.stats.hits == 1
    assert recorder.stats.totals_json()["compiled_tests"] == 1
    recorder.finish_outside()  # nothing new: nothing more
    assert recorder.stats.records[OUTSIDE].misses == 2


def test_second_shared_session_says_why_and_keeps_the_record(tmp_path: Path, fake_probe: FakeProbe) -> None:
    first = _session(tmp_path, fake_probe, ("t.py::test_a", [lookup("k1")]), ("t.py::test_b", [lookup("kb")]))
    assert first.outcome().why is None and first.to_json()["why"] is None  # nothing to compare with yet
    assert not any("why" in line for line, _ in first.terminal_lines())
    record = explain.load_record(tmp_path / "cache")
    assert record is not None and sorted(record.tests) == ["t.py::test_a", "t.py::test_b"]

    second = _session(
        tmp_path, fake_probe, ("t.py::test_a", [lookup("k2", shape="[8, 32]")]), ("t.py::test_new", [lookup("kn")])
    )
    assert second.start.finish().compared_with == "previous session"
    reasons = [w.reasons for w in second.stats.records["t.py::test_a"].why]
    assert reasons == [["input 0 shape [8, 16] -> [8, 32]"]]
    data = second.to_json()
    assert data["why"]["compared_with"] == "previous session"
    assert data["why"]["misses"]["t.py::test_new"] == [{"key": "kn", "reasons": ["new test"], "inputs": "[8, 16]"}]
    test_a = next(t for t in data["tests"] if t["nodeid"] == "t.py::test_a")
    assert test_a["graphs"] == 1
    assert test_a["why"] == [{"key": "k2", "reasons": ["input 0 shape [8, 16] -> [8, 32]"], "inputs": "[8, 32]"}]
    lines = [line for line, _ in second.terminal_lines()]
    assert "why tests missed (compared with the previous session):" in lines
    assert "why t.py::test_a: input 0 shape [8, 16] -> [8, 32]" in lines
    # test_b did not run: its graphs are carried forward, so a later -k run still has its baseline.
    kept = explain.load_record(tmp_path / "cache")
    assert kept is not None and sorted(kept.tests) == ["t.py::test_a", "t.py::test_b", "t.py::test_new"]


def test_a_miss_that_only_made_a_size_symbolic_suggests_pgo(
    tmp_path: Path, fake_probe: FakeProbe, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 25: which sizes torch makes symbolic depends on the tests that ran before in a process (xdist's
    order): the report says so once and names the option, unless a job id already keeps torch's profile."""
    for name in ("TORCH_COMPILE_JOB_ID", "TORCH_COMPILE_STICKY_PGO_KEY"):
        monkeypatch.delenv(name, raising=False)

    def pgo_notes(controller: Controller) -> list[str]:
        return [note for note in controller.problems.notes if "--compile-cache-pgo=on" in note]

    _session(tmp_path, fake_probe, ("t.py::test_a", [lookup("k1")]), ("t.py::test_b", [lookup("kb")]))
    symbolic = _session(
        tmp_path, fake_probe, ("t.py::test_a", [lookup("k2", shape="[s77, 16]")]), ("t.py::test_b", [lookup("kb")])
    )
    (note,) = pgo_notes(symbolic)
    assert note.startswith("1 test (t.py::test_a) missed a graph that differs from the earlier one in which sizes")
    assert f"note: {note}" in [line for line, _ in symbolic.terminal_lines()]  # in the short report too
    # Back to the fixed size, with the option on: torch keeps its profile already, nothing to suggest.
    with_pgo = _session(tmp_path, fake_probe, ("t.py::test_a", [lookup("k3")]), pgo=True)
    assert pgo_notes(with_pgo) == []
    with_pgo.context.close()  # puts back the job id it gave torch
    assert "TORCH_COMPILE_JOB_ID" not in os.environ
    # Another fixed size is the test's own change: no note.
    assert pgo_notes(_session(tmp_path, fake_probe, ("t.py::test_a", [lookup("k4", shape="[4, 16]")]))) == []
    monkeypatch.setenv("TORCH_COMPILE_STICKY_PGO_KEY", "mine")  # the user's own job id does what the option does
    assert pgo_notes(_session(tmp_path, fake_probe, ("t.py::test_a", [lookup("k5", shape="[s0, 16]")]))) == []


def test_summary_report_hides_the_explanations(tmp_path: Path, fake_probe: FakeProbe) -> None:
    _session(tmp_path, fake_probe, ("t.py::test_a", [lookup("k1")]))
    second = _session(tmp_path, fake_probe, ("t.py::test_a", [lookup("k2", shape="[4, 16]")]), report="short")
    assert _why(second).misses
    assert not any(line.startswith("why") for line, _ in second.terminal_lines())
    assert any(line.startswith("why") for line, _ in second.terminal_lines(verbose=True))
    # ...but names the test with its one-line reason (issues 29, 41), right under the summary line, and where the
    # full report is; the full report needs neither.
    short = [line for line, _ in second.terminal_lines()]
    assert short[0].startswith("compile cache: 0 hits, 1 miss")
    assert short[1] == "missed: t.py::test_a: input 0 shape [8, 16] -> [4, 16]"
    assert short[2].startswith("full report: python -m pytest_compilecache report")
    assert not any(line.startswith(("missed:", "full report")) for line, _ in second.terminal_lines(verbose=True))


def test_a_restored_bundles_record_is_the_baseline_for_every_process(tmp_path: Path, fake_probe: FakeProbe) -> None:
    bundle_record = explain.GraphsRecord(tests={"t.py::test_a": [lookup("k1", code="old")]})
    controller = _controller(tmp_path)
    (tmp_path / "cache").mkdir(exist_ok=True)
    explain.save_record(tmp_path / "cache", explain.GraphsRecord(tests={"t.py::test_a": [lookup("k0")]}))
    controller.start._read_baseline(sync.RestoreResult("partial", key="k", graphs=bundle_record.to_json()))
    assert controller.start.finish().compared_with == "bundle" and controller.problems.warnings == []
    on_disk = explain.load_record(tmp_path / "cache")
    assert on_disk is not None and on_disk.tests["t.py::test_a"][0].key == "k1"  # replaced the local record
    # A worker reads the same record, lazily, for the live fixture.
    worker = Worker(
        SessionContext(controller.settings, controller.context.dir, controller.context.lease, Problems()),
        Recorder("gw0"),
    )
    worker.session_start()
    start = worker.recorder.start()
    fake_probe.lookups.append(lookup("k2").to_json())
    live = worker.recorder.live("t.py::test_a", start)
    assert [w.reasons for w in live.why] == [["graph code changed"]]
    assert [g.key for g in live.graphs] == ["k2"]
    assert worker.recorder.live("t.py::test_a", start, intended=True).why == []
    # A test the record has no graphs of, calling a function another test compiled: the fixture compares with that
    # test's graph, as the session's report does, rather than calling it a new test.
    from dataclasses import replace

    fake_probe.lookups.append(replace(lookup("k3", code="new"), function="f (t.py:1)").to_json())
    shared = explain.GraphsRecord(tests={"t.py::test_a": [replace(lookup("k1", code="old"), function="f (t.py:1)")]})
    worker.recorder._baseline = shared  # the record the worker read (lazily, once)
    live = worker.recorder.live("t.py::test_b", start)
    said, _ = explain.explain_session({"t.py::test_b": live.graphs}, shared, "bundle")
    assert [w.reasons for w in live.why] == [w.reasons for w in said.misses["t.py::test_b"]]
    assert [explain.NEW_TEST] not in [w.reasons for w in live.why]


def test_an_unreadable_record_is_one_warning_and_no_explanations(tmp_path: Path, fake_probe: FakeProbe) -> None:
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / explain.RECORD_NAME).write_text("{not json")
    controller = _session(tmp_path, fake_probe, ("t.py::test_a", [lookup("k1")]))
    assert len(controller.problems.warnings) == 1 and "graph record in the cache dir" in controller.problems.warnings[0]
    assert controller.outcome().why is None and controller.to_json()["why"] is None
    assert explain.load_record(tmp_path / "cache") is not None  # this session's record replaced it


def test_a_hostile_bundle_record_is_one_warning(tmp_path: Path) -> None:
    controller = _controller(tmp_path)
    hostile = {"format": 1, "tests": {"t\n::error::x": [{"k": 1}]}}
    controller.start._read_baseline(sync.RestoreResult("partial", key="k", graphs=hostile))
    assert controller.start.finish().baseline is None
    [warning] = controller.problems.warnings
    assert "of the restored bundle" in warning and "\n" not in warning
    assert not (tmp_path / "cache" / explain.RECORD_NAME).exists()


def test_isolated_without_a_bundle_explains_nothing_but_saves_the_record(
    tmp_path: Path, fake_probe: FakeProbe, monkeypatch: pytest.MonkeyPatch
) -> None:
    saved: dict[str, Any] = {}

    def save(store: Any, request: sync.SaveRequest) -> sync.SaveResult:
        saved.update(vars(request))
        return sync.SaveResult("saved", key="k")

    monkeypatch.setattr(sync, "save_bundle", save)
    controller = _session(
        tmp_path, fake_probe, ("t.py::test_a", [lookup("k1")]), mode="isolated", store=f"file://{tmp_path / 'store'}"
    )
    assert controller.outcome().why is None
    assert list(saved["graphs"]["tests"]) == ["t.py::test_a"]  # the next run restoring the bundle compares
    assert explain.GraphsRecord.from_json(saved["graphs"]).tests["t.py::test_a"][0].key == "k1"


def test_disabled_mode_explains_nothing(tmp_path: Path, fake_probe: FakeProbe) -> None:
    controller = _session(tmp_path, fake_probe, ("t.py::test_a", [lookup("k1")]), mode="disabled")
    assert controller.outcome().why is None and _record_kept(controller) is None


def test_worker_graphs_survive_the_merge_and_are_explained(tmp_path: Path, fake_probe: FakeProbe) -> None:
    _session(tmp_path, fake_probe, ("t.py::test_a", [lookup("k1", code="c1")]))
    controller = _controller(tmp_path)
    controller.session_start()
    worker = Worker(
        SessionContext(controller.settings, controller.context.dir, controller.context.lease, Problems()),
        Recorder("gw1"),
    )
    fake_probe.run(worker.recorder, "t.py::test_a", lookup("k3", code="c2"))
    controller.add_worker("gw1", json.loads(json.dumps(worker.output())))
    controller.finish()
    record = controller.stats.records["t.py::test_a"]
    assert record.worker == "gw1" and [g.key for g in record.graphs] == ["k3"]
    assert [w.reasons for w in record.why] == [["graph code changed"]]


def test_the_record_is_ours_in_an_untagged_torch_dir(tmp_path: Path, fake_probe: FakeProbe) -> None:
    """A --compile-cache-dir that torch made (no CACHEDIR.TAG) stays usable once the record is kept there."""
    from pytest_compilecache import cachedir

    assert cachedir.GRAPHS_RECORD == explain.RECORD_NAME
    (tmp_path / "cache" / "fxgraph").mkdir(parents=True)
    _session(tmp_path, fake_probe, ("t.py::test_a", [lookup("k1")]))
    assert (tmp_path / "cache" / explain.RECORD_NAME).is_file()
    assert cachedir.ownership(tmp_path / "cache").kind in ("ours", "torch")
    second = _session(tmp_path, fake_probe, ("t.py::test_a", [lookup("k2", shape="[2, 16]")]))  # not refused
    assert _why(second).misses


def _why(controller: Controller) -> explain.SessionExplanation:
    why = controller.outcome().why
    assert why is not None
    return why


def _record_kept(controller: Controller) -> Any:
    """The record the save phase would keep for the next run (None: none), with what this session started from."""
    return SavePhase(controller.context, controller.recorder).explain(controller.start.finish())[1]


def _no_capture(monkeypatch: pytest.MonkeyPatch) -> None:
    """With explaining off nothing may reach for the capture: graph_mark would install it once torch is loaded."""

    def forbidden(*args: Any) -> Any:
        raise AssertionError("the graph capture was used with --compile-cache-explain=off")

    for name in ("graph_mark", "graph_delta", "graph_capture_installed", "watch_graph_lookups"):
        monkeypatch.setattr(f"pytest_compilecache.probe.{name}", forbidden)


def test_explain_off_captures_records_and_explains_nothing(
    tmp_path: Path, fake_probe: FakeProbe, monkeypatch: pytest.MonkeyPatch
) -> None:
    _session(tmp_path, fake_probe, ("t.py::test_a", [lookup("k1")]))
    kept = (tmp_path / "cache" / explain.RECORD_NAME).read_bytes()
    _no_capture(monkeypatch)

    off = _session(tmp_path, fake_probe, ("t.py::test_a", [lookup("k2", shape="[8, 32]")]), explain=False)
    record = off.stats.records["t.py::test_a"]
    assert record.misses == 1 and record.graphs == [] and record.why == []  # counted, not captured
    assert off.start.finish().baseline is None and off.outcome().why is None and _record_kept(off) is None
    assert off.to_json()["why"] is None and off.to_json()["tests"][0]["graphs"] == 0
    assert not any("why" in line for line, _ in off.terminal_lines(verbose=True))
    assert (tmp_path / "cache" / explain.RECORD_NAME).read_bytes() == kept  # neither read into nor rewritten

    worker = Worker(
        SessionContext(off.settings, off.context.dir, off.context.lease, Problems()), Recorder("gw0", explain=False)
    )
    worker.session_start()
    assert worker.recorder.baseline_dir is None
    start = worker.recorder.start()
    fake_probe.lookups.append(lookup("k3").to_json())
    live = worker.recorder.live("t.py::test_a", start)
    assert live.misses == 1 and live.graphs == [] and live.why == []
    worker.recorder.finish("t.py::test_a", start)
    [sent] = worker.output()["records"]
    assert ItemRecord.from_json(sent).misses == 1 and not ItemRecord.from_json(sent).graphs


def test_explain_off_restores_a_bundle_with_a_record_and_saves_one_without(
    tmp_path: Path, fake_probe: FakeProbe
) -> None:
    store = f"file://{tmp_path / 'store'}"
    first = _session(
        tmp_path,
        fake_probe,
        ("t.py::test_a", [lookup("k1")]),
        compiled=True,
        store=store,
        run_suffix="1",
        dir=str(tmp_path / "a"),
    )
    assert _saved(first).outcome == "saved", first.outcome().saved

    off = _session(
        tmp_path,
        fake_probe,
        ("t.py::test_a", [lookup("k2", shape="[8, 32]")]),
        compiled=True,
        store=store,
        run_suffix="2",
        dir=str(tmp_path / "b"),
        explain=False,
    )
    assert _restored(off).outcome == "partial", off.start.finish().result  # an earlier run's key
    assert _restored(off).graphs is not None  # the bundle had a record; the restore used the rest of it
    assert (tmp_path / "b" / "kernel.so").is_file() and off.problems.warnings == []
    assert not (tmp_path / "b" / explain.RECORD_NAME).exists() and off.outcome().why is None
    assert _saved(off).outcome == "saved", off.outcome().saved

    after = _controller(tmp_path, store=store, dir=str(tmp_path / "c"))
    after.session_start()
    assert _restored(after).key == _saved(off).key
    assert _restored(after).graphs is None and after.start.finish().baseline is None  # off saved no record


def test_a_record_that_breaks_explaining_is_one_warning_and_is_replaced(tmp_path: Path, fake_probe: FakeProbe) -> None:
    """Issue 28.2: ``example_inputs[²]`` crashed the session's end, nothing was saved, and every run crashed again."""
    (tmp_path / "cache").mkdir()
    hostile = lookup("k1")
    hostile.components["example_inputs[²]"] = ("a", "x")
    explain.save_record(tmp_path / "cache", explain.GraphsRecord(tests={"t.py::test_a": [hostile]}))
    weird = lookup("k2")
    weird.components["example_inputs[²]"] = ("b", "y")
    first = _session(tmp_path, fake_probe, ("t.py::test_a", [weird]))
    assert first.problems.errors == [] and first.outcome().why is not None
    assert _why(first).misses["t.py::test_a"][0].reasons == ["input ² x -> y"]
    assert first.problems.warnings == []


def test_any_error_while_explaining_is_one_warning_and_the_session_goes_on(
    tmp_path: Path, fake_probe: FakeProbe, monkeypatch: pytest.MonkeyPatch
) -> None:
    _session(tmp_path, fake_probe, ("t.py::test_a", [lookup("k1")]))

    def broken(*args: object) -> list[str]:
        raise RuntimeError("a bug met on a hostile record")

    monkeypatch.setattr(compare, "diff", broken)  # where explaining a test finds it
    start_controller = _controller(tmp_path)
    start_controller.session_start()
    start = start_controller.recorder.start()
    fake_probe.lookups.append(lookup("k2", shape="[8, 32]").to_json())
    assert start_controller.recorder.live("t.py::test_a", start).why == []  # the fixture: no explanation, no error
    fake_probe.run(start_controller.recorder, "t.py::test_a", lookup("k2", shape="[8, 32]"))
    assert start_controller.finish() is False
    [warning] = start_controller.problems.warnings
    assert warning.startswith("no miss explanations this session: RuntimeError: a bug met")
    assert start_controller.outcome().why is None
    kept = explain.load_record(tmp_path / "cache")  # this session's graphs replace the record that broke it
    assert kept is not None and [g.key for g in kept.tests["t.py::test_a"]] == ["k2"]
    # A broken record on disk (deeply nested JSON) is one warning as well.
    (tmp_path / "cache" / explain.RECORD_NAME).write_text("[" * 100_000 + "]" * 100_000)
    third = _controller(tmp_path)
    third.session_start()
    [warning] = third.problems.warnings
    assert "graph record in the cache dir is unreadable" in warning and third.start.finish().baseline is None


def test_after_a_k_session_restored_an_older_bundle_the_baseline_is_the_last_session_that_compiled(
    tmp_path: Path, fake_probe: FakeProbe
) -> None:
    """Issue 29.7: the baseline is the most recent record, not whatever a restore installed last."""
    store = f"file://{tmp_path / 'store'}"
    saved = _session(tmp_path, fake_probe, ("t.py::test_a", [lookup("k32", "[32, 20]")]), compiled=True, store=store)
    assert _saved(saved).outcome == "saved", saved.outcome().saved
    # The last session that compiled test_a, locally (it saved no bundle): [48, 20].
    _session(tmp_path, fake_probe, ("t.py::test_a", [lookup("k48", "[48, 20]")]))
    # A -k session restores the older bundle (its record has [32, 20]) and runs another test.
    k_run = _session(tmp_path, fake_probe, ("t.py::test_b", [lookup("kb")]), compiled=True, store=store, run_suffix="2")
    assert _restored(k_run).graphs is not None
    assert k_run.start.finish().compared_with == "previous session"  # the dir's record was the newer one
    latest = _session(tmp_path, fake_probe, ("t.py::test_a", [lookup("k40", "[40, 20]")]))
    assert [w.reasons for w in latest.stats.records["t.py::test_a"].why] == [["input 0 shape [48, 20] -> [40, 20]"]]


def test_a_newer_bundle_record_replaces_the_dirs_and_keeps_the_tests_only_the_dir_had(tmp_path: Path) -> None:
    explain.save_record(tmp_path, explain.GraphsRecord(tests={"t::a": [lookup("old")], "t::b": [lookup("b")]}))
    newer = explain.GraphsRecord(tests={"t::a": [lookup("new")]}, created=10.0)
    record = explain.install_restored(tmp_path, newer.to_json())
    assert record.from_bundle and [g.key for g in record.tests["t::a"]] == ["new"] and "t::b" in record.tests
    on_disk = explain.load_record(tmp_path)
    assert on_disk is not None and on_disk.from_bundle and on_disk.created == 10.0


def test_a_test_that_hit_after_a_streak_of_changes_makes_the_run_save_its_record() -> None:
    """A run that hit everything saves nothing, so the next run would read the restored record's streak as if
    no run had come between: edits with hits between them would read as a test that can never hit. A test one
    change short of that, which ran without the change now, makes the run save its record."""
    from pytest_compilecache.explain.history import NEVER_HIT_CHANGES
    from pytest_compilecache.explain.history import Streak
    from pytest_compilecache.save_phase import _settled

    streak = Streak("a constant in graph statement 4", NEVER_HIT_CHANGES - 1, ("v1", "v2", "v3"))
    baseline = explain.GraphsRecord(tests={"t.py::test_a": [lookup("k3")]}, volatile={"t.py::test_a": streak})
    hit_now = explain.GraphsRecord(tests={"t.py::test_a": [lookup("k3", outcome="hit")]})
    assert _settled(baseline, hit_now)
    assert not _settled(baseline, explain.GraphsRecord(tests={"t.py::test_b": [lookup("kb")]}))  # did not run
    changed_again = explain.GraphsRecord(tests=hit_now.tests, volatile={"t.py::test_a": streak})
    assert not _settled(baseline, changed_again)
    young = explain.GraphsRecord(tests=baseline.tests, volatile={"t.py::test_a": Streak(streak.what, 1, ("v1", "v2"))})
    assert not _settled(young, hit_now) and not _settled(None, hit_now)
