"""session: the controller carries precompiled headers only where torch keeps them (no torch, no compile)."""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import pytest

from pytest_compilecache import pch
from pytest_compilecache import sync
from pytest_compilecache.context import SessionContext
from pytest_compilecache.payload import Gathered
from pytest_compilecache.problems import Problems
from pytest_compilecache.recorder import Recorder
from pytest_compilecache.save_phase import SavePhase
from pytest_compilecache.session import Controller
from pytest_compilecache.session import Worker
from pytest_compilecache.stores import LocalStore
from pytest_compilecache.stores.base import is_artifact_key
from tests.fakes import FakeProbe
from tests.unit.test_session import _compiled
from tests.unit.test_session import _controller
from tests.unit.test_session import _record
from tests.unit.test_session import _saved
from tests.unit.test_session import _session_sandbox  # noqa: F401 - test_session's autouse sandbox, here too

NAME = "c" + "a2b3c4d5e6f7" * 4 + "abc" + ".h.gch"


@pytest.fixture(autouse=True)
def _own_tmpdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's TMPDIR, so torch's header dir (pch.header_dir()) is private to it."""
    runner = tmp_path / "runner-tmp"
    runner.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(runner))
    return runner


def _header_built_now() -> Path:
    """torch built the header this session."""
    directory = pch.header_dir()
    directory.mkdir(parents=True, exist_ok=True)
    (directory / NAME).write_bytes(b"gpch" * 1000)
    return directory / NAME


def _used(*uses: dict[str, object], files: tuple[str, ...] = ("x",)) -> Gathered:
    """What the processes gathered: the cache files they used and the headers they checked."""
    return Gathered(files=frozenset(files), header_uses=uses)


def _checked(path: Path, verdict: str = "verified", note: str = "") -> dict[str, object]:
    info = path.lstat()
    return pch.HeaderUse(path.name, verdict, info.st_size, info.st_mtime_ns, info.st_ino, note).to_json()


def _saved_artifacts(store: Path) -> list[str]:
    return [entry.key for entry in LocalStore(store).list() if is_artifact_key(entry.key)]


def test_a_saving_session_carries_the_header_it_built(
    tmp_path: Path, fake_probe: FakeProbe, monkeypatch: pytest.MonkeyPatch
) -> None:
    controller = _controller(tmp_path, store=str(tmp_path / "store"))
    controller.session_start()
    assert controller.start.finish().header_since is not None
    fake_probe.header_uses = [_checked(_header_built_now())]  # this process looked it up and checked it
    fake_probe.header_dir = str(pch.header_dir())
    controller.stats.add_record(_record("t::a", miss=1))
    _compiled(monkeypatch, fake_probe, "x")  # something compiled
    (Path(controller.context.dir.path or "") / "x").write_bytes(b"kernel")
    controller.finish()
    saved = _saved(controller)
    assert saved.outcome == "saved", saved
    assert saved.headers.named == (NAME,)
    assert len(_saved_artifacts(tmp_path / "store")) == 1
    assert controller.to_json()["save"]["headers"]["named"] == 1


def test_a_worker_reports_torchs_header_dir(tmp_path: Path, fake_probe: FakeProbe) -> None:
    controller = _controller(tmp_path)
    worker = Worker(
        SessionContext(controller.context.settings, controller.context.dir, controller.context.lease, Problems()),
        Recorder("gw0"),
    )
    fake_probe.header_dir = "/somewhere/else"
    output = worker.output()
    assert output["header_dir"] == "/somewhere/else"
    controller.add_worker("gw0", output)
    controller.add_worker("gw1", {**output, "header_dir": None})  # a worker that compiled no C++
    assert Gathered.fold(controller._outputs).header_dirs == {"/somewhere/else"}


def test_a_worker_whose_torch_keeps_headers_elsewhere_means_no_headers_and_a_note(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    controller = _controller(tmp_path, store=str(tmp_path / "store"))
    controller.session_start()
    _header_built_now()
    controller.add_worker("gw0", {"tests": 1, "files": ["x"], "header_dir": str(tmp_path / "moved")})
    controller.add_worker("gw1", {"tests": 1, "header_dir": str(pch.header_dir())})
    (Path(controller.context.dir.path or "") / "x").write_bytes(b"kernel")
    controller.stats.add_record(_record("t::a", miss=1))
    saved = SavePhase(controller.context, controller.recorder).save(
        controller.start.finish(), Gathered.fold(controller._outputs)
    )
    assert saved is not None and saved.outcome == "saved"
    assert saved.headers == sync.HeaderReport()
    assert _saved_artifacts(tmp_path / "store") == []
    (note,) = [n for n in controller.problems.notes if "precompiled headers" in n]
    assert str(tmp_path / "moved") in note
    assert controller.problems.warnings == []


def test_a_read_only_session_does_not_track_headers(tmp_path: Path) -> None:
    controller = _controller(tmp_path, store=str(tmp_path / "store"), readonly=True)
    controller.session_start()
    assert controller.start.finish().header_since is None


def _save(controller: Controller, restored: sync.RestoreResult, gathered: Gathered) -> sync.SaveResult | None:
    """The save phase's save after a restore that gave ``restored`` (the session's start time kept)."""
    start = controller.start.finish()._replace(result=restored)
    return SavePhase(controller.context, controller.recorder).save(start, gathered)


def _outcome(saved: sync.SaveResult | None) -> str | None:
    return saved.outcome if saved is not None else None


def test_all_hits_still_save_when_the_session_used_a_header_the_bundle_does_not_name(tmp_path: Path) -> None:
    controller = _controller(tmp_path, store=str(tmp_path / "store"))
    controller.session_start()
    plain = sync.RestoreResult("partial", key="k")  # a bundle that names no header
    controller.stats.add_record(_record("t::a", hit=3))
    (Path(controller.context.dir.path or "") / "x").write_bytes(b"kernel")
    assert _outcome(_save(controller, plain, _used())) == "skipped"  # no header used: skipped

    # torch built the header this session: the next fresh runner should not either
    used = _used(_checked(_header_built_now()))
    saved = _save(controller, plain, used)
    assert _outcome(saved) == "saved"
    assert saved is not None and saved.headers.named == (NAME,)

    named = sync.HeaderReport(named=(NAME,))
    already = sync.RestoreResult("partial", key="k", headers=named)  # already named: skip again
    assert _outcome(_save(controller, already, used)) == "skipped"


def test_restore_warns_once_per_header_that_did_not_come(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    controller = _controller(tmp_path, store=str(tmp_path / "store"))
    lines = ("precompiled header 'a' not restored: x", "precompiled header 'b' not restored: y")

    def fake_restore(*args: object, **kwargs: object) -> sync.RestoreResult:
        return sync.RestoreResult("partial", key="k", headers=sync.HeaderReport(warnings=lines))

    monkeypatch.setattr(sync, "restore_bundle", fake_restore)
    controller.session_start()
    assert controller.problems.warnings == list(lines)
    restored = controller.start.finish().result
    assert restored is not None and restored.outcome == "partial"


def test_the_actions_restore_report_may_name_the_headers_it_installed() -> None:
    from pytest_compilecache.sync import read_handoff as action_restore_result

    value = json.dumps({"outcome": "partial", "key": "k", "headers": [NAME, "../evil", 3]})
    assert action_restore_result(value) is not None
    result = action_restore_result(json.dumps({"outcome": "partial", "key": "k", "headers": [NAME, "../evil"]}))
    assert result is not None and result.headers.named == (NAME,)
    old = action_restore_result(json.dumps({"outcome": "exact", "key": "k"}))  # an Action that does not say
    assert old is not None and old.headers.named == ()
    odd = action_restore_result(value)  # not all strings: ignored as a whole
    assert odd is not None and odd.headers.named == ()


def test_after_the_actions_restore_a_header_it_could_not_install_is_new(tmp_path: Path) -> None:
    """restore=skip (the Action restored): its report names what it installed; a header it could not (its
    entry evicted) that torch built again makes the session save, so the next run carries it (issue 10)."""
    controller = _controller(tmp_path, store=str(tmp_path / "store"), restore="skip")
    controller.session_start()
    none_installed = sync.RestoreResult("partial", key="k")  # the Action installed no header
    controller.stats.add_record(_record("t::a", hit=3))
    (Path(controller.context.dir.path or "") / "x").write_bytes(b"kernel")
    used = _used(_checked(_header_built_now()))
    assert _outcome(_save(controller, none_installed, used)) == "saved"
    installed = sync.RestoreResult("partial", key="k", headers=sync.HeaderReport(named=(NAME,)))
    assert _outcome(_save(controller, installed, used)) == "skipped"  # the Action installed it: nothing new


def test_a_header_the_actions_header_entry_carries_is_named_not_uploaded(tmp_path: Path) -> None:
    from pytest_compilecache.sync import read_handoff as action_restore_result

    path = _header_built_now()
    key = pch.object_key("compilecache-v1", pch.describe(path).sha256)
    value = json.dumps({"outcome": "partial", "key": "k", "headers": [], "header_key": key})
    restored = action_restore_result(value)
    assert restored is not None and restored.headers.carried == (key,)
    controller = _controller(tmp_path, store=str(tmp_path / "store"), restore="skip", key_prefix="compilecache-v1")
    controller.session_start()
    controller.stats.add_record(_record("t::a", miss=1))
    (Path(controller.context.dir.path or "") / "x").write_bytes(b"kernel")
    used = _used(_checked(_header_built_now()))  # built again this session: used
    saved = _save(controller, restored, used)
    assert saved is not None and saved.outcome == "saved", saved
    assert saved.headers.named == (NAME,) and saved.headers.transferred == ()
    assert _saved_artifacts(tmp_path / "store") == []  # the bundle names it; the header entry has it

    elsewhere = pch.object_key("compilecache-v1", "0" * 64)
    other = action_restore_result(json.dumps({"outcome": "partial", "key": "k", "header_key": elsewhere}))
    assert other is not None
    _save(controller, other, used)  # another header's entry: this one goes into the store as before
    assert _saved_artifacts(tmp_path / "store") == [key]


def test_a_restored_header_no_process_looked_up_ages_and_leaves_after_idle_saves(tmp_path: Path) -> None:
    """The save counts on from the restore's idle counts (here the Action's hand-off): a restored header no
    process looked up is named one save older, and dropped with one note at ``pch.IDLE_SAVES``; sync's tests
    follow the count through real restores and manifests."""
    from pytest_compilecache.sync import read_handoff as action_restore_result

    path = _header_built_now()  # the restore installed it
    store = tmp_path / "store"
    key = pch.object_key("compilecache-v1", pch.describe(path).sha256)
    store.mkdir()
    with open(store / f"{key}.bundle", "wb") as out:
        pch.compress(path, out)  # the object the restore fetched it from
    controller = _controller(tmp_path, store=str(store), restore="skip", key_prefix="compilecache-v1")
    controller.session_start()
    controller.stats.add_record(_record("t::a", miss=1))  # a new graph, no C++: no header looked up
    (Path(controller.context.dir.path or "") / "x").write_bytes(b"kernel")
    for idle, named, said in ((0, (NAME,), False), (pch.IDLE_SAVES - 1, (), True)):
        headers = {"named": [NAME], "idle": {NAME: idle} if idle else {}}
        restored = action_restore_result(json.dumps({"outcome": "partial", "key": "k", "headers": headers}))
        assert restored is not None and restored.headers.idle == headers["idle"]
        saved = _save(controller, restored, _used())
        assert saved is not None and saved.outcome == "saved", saved
        assert (saved.headers.named, saved.headers.idle) == (named, {} if said else {NAME: 1})
        notes = [note for note in controller.problems.notes if NAME in note and "no longer carried" in note]
        assert len(notes) == int(said), controller.problems.notes


def test_each_worker_reports_the_headers_it_checked_and_the_controller_carries_them(tmp_path: Path) -> None:
    """xdist: the header is found from the workers' reports, not from the file's times (pinned here as relatime
    and noatime leave them: built and read before the session), and a damage a worker repaired is one note."""
    controller = _controller(tmp_path, store=str(tmp_path / "store"))
    controller.session_start()
    path = _header_built_now()
    os.utime(path, (time.time() - 3600, time.time() - 7200))
    use = _checked(path)
    repaired = {**use, "verdict": "rebuilt", "note": f"precompiled header {NAME} rejected by the compiler (x)"}
    where = str(pch.header_dir())
    controller.add_worker("gw0", {"tests": 1, "files": ["x"], "header_dir": where, "headers": [use]})
    controller.add_worker("gw1", {"tests": 1, "header_dir": where, "headers": [repaired, "junk"]})
    controller.add_worker("gw2", {"tests": 1, "headers": {"not": "a list"}})
    (Path(controller.context.dir.path or "") / "x").write_bytes(b"kernel")
    controller.stats.add_record(_record("t::a", miss=1))
    controller.finish()
    saved = _saved(controller)
    assert saved.headers.named == (NAME,), saved
    assert _saved_artifacts(tmp_path / "store") != []
    assert [n for n in controller.problems.notes if NAME in n] == [repaired["note"]]
    assert controller.problems.warnings == []


def test_a_worker_sends_the_headers_its_process_checked(tmp_path: Path, fake_probe: FakeProbe) -> None:
    controller = _controller(tmp_path)
    worker = Worker(
        SessionContext(controller.context.settings, controller.context.dir, controller.context.lease, Problems()),
        Recorder("gw0"),
    )
    fake_probe.header_uses = [pch.HeaderUse(NAME, "verified", 1, 2, 3).to_json()]
    assert worker.output()["headers"] == fake_probe.header_uses


def test_a_session_with_a_store_sweeps_what_a_killed_header_install_left_in_torchs_dir(tmp_path: Path) -> None:
    """Issue 44, finding 6: a session SIGKILLed while its background install wrote a header left the partial
    file (up to ~150 MB) under a temp name in torch's header dir, and no later session removed it."""
    import subprocess
    import sys

    from pytest_compilecache import _fs

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    directory = _header_built_now().parent
    name = _fs.temp_name("tmp", lead=f".{NAME}.")
    owner = _fs.parse_temp_name(name)
    assert owner is not None
    leftover = directory / name.replace(f"-{owner.pid}-", f"-{int(dead.stdout)}-")
    leftover.write_bytes(b"gpch half a header")
    live = directory / _fs.temp_name("tmp", lead=f".{NAME}.")  # this process's: an install going on
    live.write_bytes(b"gpch")
    controller = _controller(tmp_path, store=str(tmp_path / "store"))
    controller.session_start()
    assert not leftover.exists()
    assert live.exists() and (directory / NAME).exists()  # torch's header and a live writer's file stay


def test_the_headers_installed_are_the_restored_bundles_after_torch_rejected_a_newer_ones_blobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The newest bundle's files are installed (its headers' install starts then, beside its blobs' load),
    torch rejects its blobs, and the next candidate is restored: the headers installed and reported are that
    restored bundle's, not those of the bundle taken back out."""
    from pytest_compilecache.manifest import Artifact

    controller = _controller(tmp_path, store=str(tmp_path / "store"))
    names = ("c" + "a" * 51, "c" + "b" * 51)
    rejected, restored = (Artifact("precompiled_header", name, "0" * 64, 10) for name in names)
    events: list[str] = []

    class RecordingInstall:
        def __init__(self, store: object, prefix: str, named: tuple[Artifact, ...], directory: object = None) -> None:
            self.named = tuple(named)
            self.names = tuple(artifact.name for artifact in named)
            events.append(f"start {self.names}")

        def finish(self) -> sync.HeaderReport:
            events.append(f"finish {self.names}")
            return sync.HeaderReport(named=self.names, transferred=self.names)

    def fake_restore(store: object, request: sync.RestoreRequest) -> sync.RestoreResult:
        assert request.on_installed is not None
        request.on_installed((rejected,))  # the newest candidate's files are in: its headers start
        request.on_installed((restored,))  # its blobs were rejected; the next candidate's files are in
        return sync.RestoreResult("partial", key="k", named_artifacts=(restored,))

    monkeypatch.setattr(sync, "HeaderInstall", RecordingInstall)
    monkeypatch.setattr(sync, "restore_bundle", fake_restore)
    controller.session_start()
    result = controller.start.finish().result
    assert result is not None and result.headers.named == (restored.name,)
    assert events == [f"start {(rejected.name,)}", f"finish {(rejected.name,)}", f"start {(restored.name,)}",
                      f"finish {(restored.name,)}"]  # fmt: skip


@pytest.mark.parametrize("outcome", ["partial", "miss"])
def test_a_rejected_bundles_headers_are_not_reported_when_the_restored_one_names_none_or_none_restored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, outcome: str
) -> None:
    """The bundle restored after the rejected one names no header (its manifest has none: no second
    ``on_installed``), or every candidate was rejected: the rejected bundle's install is finished and said
    nothing of, so the next save is not told those headers were restored."""
    from pytest_compilecache.manifest import Artifact

    controller = _controller(tmp_path, store=str(tmp_path / "store"))
    rejected = Artifact("precompiled_header", "c" + "a" * 51, "0" * 64, 10)
    events: list[str] = []

    class RecordingInstall:
        def __init__(self, store: object, prefix: str, named: tuple[Artifact, ...], directory: object = None) -> None:
            self.named = tuple(named)
            events.append("start")

        def finish(self) -> sync.HeaderReport:
            events.append("finish")
            return sync.HeaderReport(named=tuple(a.name for a in self.named))

    def fake_restore(store: object, request: sync.RestoreRequest) -> sync.RestoreResult:
        assert request.on_installed is not None
        request.on_installed((rejected,))
        return sync.RestoreResult(outcome, key="k" if outcome == "partial" else None)  # type: ignore[arg-type]

    monkeypatch.setattr(sync, "HeaderInstall", RecordingInstall)
    monkeypatch.setattr(sync, "restore_bundle", fake_restore)
    controller.session_start()
    result = controller.start.finish().result
    assert result is not None and result.headers.named == () and events == ["start", "finish"]
