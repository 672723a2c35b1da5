"""session: the roles' decisions, fast (no compile, no subprocess). A fake probe stands in for torch.

The plugin-level suites (tests/plugin) prove the same behaviour end to end; these reach every warn, skip
and guard branch in milliseconds.
"""

from __future__ import annotations

import io
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any
from typing import Iterator

import pytest

from pytest_compilecache import ConfigError
from pytest_compilecache import bundle
from pytest_compilecache import cachedir
from pytest_compilecache import context as context_mod
from pytest_compilecache import ghrunner
from pytest_compilecache import probe
from pytest_compilecache import recorder as recorder_mod
from pytest_compilecache import report
from pytest_compilecache import sync
from pytest_compilecache._env import PGO_ENVS
from pytest_compilecache._env import PGO_JOB_ID
from pytest_compilecache.context import SessionContext
from pytest_compilecache.fingerprint import Fingerprint
from pytest_compilecache.fingerprint import make_key
from pytest_compilecache.fingerprint import restore_prefix
from pytest_compilecache.payload import Gathered
from pytest_compilecache.payload import Restored
from pytest_compilecache.problems import Problems
from pytest_compilecache.recorder import Recorder
from pytest_compilecache.save_phase import Saved
from pytest_compilecache.save_phase import SavePhase
from pytest_compilecache.session import Controller
from pytest_compilecache.session import Worker
from pytest_compilecache.settings import DEFAULT_PREFIX
from pytest_compilecache.settings import Settings
from pytest_compilecache.stats import ItemRecord
from pytest_compilecache.sync import HANDOFF_ENV
from pytest_compilecache.sync import read_handoff as action_restore_result
from tests.bundle_faults import FAULTS
from tests.bundle_faults import SIGNING_KEY
from tests.fakes import FakeLoader
from tests.fakes import FakeProbe
from tests.fakes import MemoryStore
from tests.unit.conftest import BLOBS
from tests.unit.conftest import CACHE_FILES
from tests.unit.conftest import PREFIX

FP = Fingerprint({"torch": "2.13.0", "python": "cpython 3.11"})


_OPEN: list[SessionContext] = []


@pytest.fixture(autouse=True)
def _session_sandbox(fake_probe: FakeProbe, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The fake probe (this process has compiled nothing, whatever other unit tests imported), no runner
    variables; every set-up made here is closed afterwards, so no exported variable leaks into later tests."""
    monkeypatch.delenv(HANDOFF_ENV, raising=False)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    yield
    while _OPEN:
        _OPEN.pop().close()


def _controller(tmp_path: Path, **options: Any) -> Controller:
    options.setdefault("mode", "shared")
    options.setdefault("dir", str(tmp_path / "cache"))
    settings = Settings(**options)
    problems = Problems(strict=settings.strict)
    setup = SessionContext.start(settings, tmp_path / "default", inherited=None, problems=problems)
    setup._fingerprint = FP
    _OPEN.append(setup)
    return Controller(setup, Recorder("controller"))


def _save(controller: Controller, restored: sync.RestoreResult | None, gathered: Gathered | None = None) -> Any:
    """The save phase's save alone, after a restore that gave ``restored``."""
    return SavePhase(controller.context, controller.recorder).save(Restored(restored), gathered or Gathered())


def _restored(controller: Controller) -> sync.RestoreResult:
    """What the controller's restore phase found (a restore or the Action's word: not None)."""
    result = controller.start.finish().result
    assert result is not None
    return result


def _saved(controller: Controller) -> sync.SaveResult:
    """What the controller's save did, once the session finished (a save was tried: not None)."""
    result = controller.outcome().saved
    assert isinstance(result, sync.SaveResult)
    return result


def _compiled(monkeypatch: pytest.MonkeyPatch, fake: FakeProbe, *files: str) -> None:
    """This process compiled: Dynamo is loaded and used ``files`` of the cache dir (no mega-cache blob)."""
    fake.loaded = True
    monkeypatch.setattr("pytest_compilecache.probe.used_files", lambda cache_dir: list(files))
    monkeypatch.setattr("pytest_compilecache.probe.save_artifacts", lambda: None)
    monkeypatch.setattr("pytest_compilecache.probe.graph_capture_installed", lambda: None)


def _record(nodeid: str, hit: int = 0, miss: int = 0) -> ItemRecord:
    record = ItemRecord(nodeid=nodeid)
    record.add({"fxgraph": {"hit": hit, "miss": miss}, "frames": 1})
    return record


def test_setup_leases_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/before")
    controller = _controller(tmp_path)
    import os

    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "cache")
    controller.context.close()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/before"
    assert "PYTEST_COMPILECACHE_SESSION" not in os.environ


def test_a_redis_that_fails_its_ping_leaves_torchs_remote_caches_off_also_where_they_were_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_compilecache import remote
    from pytest_compilecache._env import REMOTE_SWITCHES

    for switch in REMOTE_SWITCHES:
        monkeypatch.setenv(switch, "1")  # on by hand, for another Redis
    monkeypatch.setattr(remote, "check_redis", lambda url: "refused: ResponseError: DB index is out of range")
    controller = _controller(tmp_path, redis="redis://127.0.0.1:6379/99")
    import os

    assert {os.environ[switch] for switch in REMOTE_SWITCHES} == {"0"}  # torch reads "0" as off
    assert not controller.context.redis_on
    assert str(controller.context.header()).endswith("(ping failed, off)")
    (warning,) = controller.context.problems.warnings
    assert warning == "redis at redis://127.0.0.1:6379/99 refused: ResponseError: DB index is out of range; remote " + (
        "caches stay off"
    )
    controller.context.close()
    assert {os.environ[switch] for switch in REMOTE_SWITCHES} == {"1"}


def test_a_disabled_session_neither_pings_redis_nor_says_it_is_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_compilecache import remote
    from pytest_compilecache._env import REMOTE_SWITCHES

    pinged: list[str] = []
    monkeypatch.setattr(remote, "check_redis", lambda url: pinged.append(url))
    for switch in REMOTE_SWITCHES:
        monkeypatch.delenv(switch, raising=False)
    controller = _controller(tmp_path, mode="disabled", dir=None, redis="redis://127.0.0.1:6379/0")
    import os

    assert pinged == [] and not any(os.environ.get(switch) for switch in REMOTE_SWITCHES)
    assert not controller.context.redis_on
    assert str(controller.context.header()).endswith("(off: disabled session)")
    assert any("not used, every cache is off" in note for note in controller.context.problems.notes)


def test_the_session_notes_the_options_that_change_nothing(tmp_path: Path) -> None:
    controller = _controller(tmp_path, readonly=True)
    unused = [note for note in controller.context.problems.notes if "not used" in note]
    assert unused == ["--compile-cache-readonly: not used without a store (--compile-cache-store)"]


def test_pgo_gives_torch_a_job_id_unless_it_has_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--compile-cache-pgo=on: torch keeps its automatic-dynamic profile only for a job id (issue 25)."""
    import os
    import types

    for name in PGO_ENVS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delitem(sys.modules, "torch.compiler.config", raising=False)  # torch's config not imported yet
    controller = _controller(tmp_path, pgo=True)
    assert os.environ["TORCH_COMPILE_JOB_ID"] == PGO_JOB_ID
    assert not [note for note in controller.problems.notes if "--compile-cache-pgo" in note]
    controller.context.close()
    assert "TORCH_COMPILE_JOB_ID" not in os.environ  # leased: put back at the end
    # Another key prefix, another lineage: its own profile (a shared dir keeps one file per job id).
    controller = _controller(tmp_path, pgo=True, key_prefix="nightly-v1")
    assert os.environ["TORCH_COMPILE_JOB_ID"] == PGO_JOB_ID + "-nightly-v1"
    controller.context.close()
    for options in ({}, {"pgo": True, "mode": "disabled", "dir": None}):  # off (the default); no caches
        controller = _controller(tmp_path, **options)
        assert "TORCH_COMPILE_JOB_ID" not in os.environ
        controller.context.close()
    monkeypatch.setenv("TORCH_COMPILE_JOB_ID", "mine")  # the user's own id: torch keeps the profile under it
    controller = _controller(tmp_path, pgo=True)
    assert os.environ["TORCH_COMPILE_JOB_ID"] == "mine"
    controller.context.close()
    assert os.environ["TORCH_COMPILE_JOB_ID"] == "mine"
    monkeypatch.delenv("TORCH_COMPILE_JOB_ID")
    # Given as the alias only (torch 2.8+ reads it, 2.7 does not): the same id under the name every torch reads.
    monkeypatch.setenv("TORCH_COMPILE_STICKY_PGO_KEY", "mine")
    controller = _controller(tmp_path, pgo=True)
    assert os.environ["TORCH_COMPILE_JOB_ID"] == "mine"
    controller.context.close()
    assert "TORCH_COMPILE_JOB_ID" not in os.environ
    monkeypatch.delenv("TORCH_COMPILE_STICKY_PGO_KEY")
    # torch imported before the session was configured: it read no id at import, and a note says so
    monkeypatch.setitem(sys.modules, "torch.compiler.config", types.ModuleType("torch.compiler.config"))
    controller = _controller(tmp_path, pgo=True)
    assert [note for note in controller.problems.notes if "--compile-cache-pgo" in note and "imported before" in note]


def test_a_session_with_a_job_id_that_compiled_marks_torchs_profile_for_it_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch rewrites its automatic-dynamic profile only when it changes, and a read may record no access time
    (relatime, noatime): the session marks the profile of its job id used itself, or a size cap would take it for
    the least recently used file (issue 25)."""
    import os

    for name in PGO_ENVS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delitem(sys.modules, "torch.compiler.config", raising=False)
    long_ago = time.time() - 86_400
    for compiled in (False, True):
        controller = _controller(tmp_path, pgo=True)
        dynamo = Path(controller.context.dir.path or "") / "dynamo"
        dynamo.mkdir(exist_ok=True)
        ours, other = dynamo / "code_state_pytest-compilecache_None_.pkl", dynamo / "code_state_theirs_None_.pkl"
        for path in (ours, other):
            path.write_bytes(b"profile")
            os.utime(path, (long_ago, long_ago))
        if compiled:
            controller.stats.add_record(_record("t::a", miss=1))
        controller.finish()
        assert other.stat().st_atime == long_ago  # another job's profile: not this session's to mark
        assert ours.stat().st_mtime == long_ago  # its content's age is kept
        if compiled:
            assert ours.stat().st_atime > long_ago + 3600
        else:  # nothing compiled, so torch read no profile
            assert ours.stat().st_atime == long_ago
        controller.context.close()
    # The option off, the user's own id given as the alias torch 2.8+ reads: its profile is marked.
    monkeypatch.setenv("TORCH_COMPILE_STICKY_PGO_KEY", "theirs")
    controller = _controller(tmp_path)
    controller.stats.add_record(_record("t::a", miss=1))
    controller.finish()
    assert other.stat().st_atime > long_ago + 3600 and ours.stat().st_atime < other.stat().st_atime


def test_an_isolated_dir_is_removed_before_its_registration_is_withdrawn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session killed between the two would leave a dir marked for removal with no registration, which no
    sweep could prove dead: the registration goes last. A shared dir's goes after the save, as before."""
    from pytest_compilecache import cachedir as cachedir_module

    seen: list[bool] = []
    real_remove = cachedir_module.remove
    controller = _controller(tmp_path, mode="isolated", dir=str(tmp_path / "parent"))

    def remove(session_dir: Any) -> None:
        registration = controller.context.registration
        seen.append(registration is not None and registration.fd is not None)
        real_remove(session_dir)

    monkeypatch.setattr(cachedir_module, "remove", remove)
    assert controller.context.registration is not None and controller.context.dir.owned
    controller.finish()
    assert seen == [True] and controller.context.registration is not None
    assert controller.context.registration.fd is None
    assert not Path(controller.context.dir.path or "").exists()


def test_hit_rate_guard(tmp_path: Path) -> None:
    controller = _controller(tmp_path, min_hit_rate=0.9)
    controller.stats.add_record(_record("t::a", hit=1, miss=1))
    controller._check_hit_rate(None)
    assert controller.problems.errors == ["hit rate 50% is below --compile-cache-min-hit-rate=0.9"]


def test_the_hit_rate_guard_leaves_out_tests_marked_compile_cache(tmp_path: Path) -> None:
    """A test marked ``compile_cache("isolated")`` misses by design: its misses never fail the floor."""
    controller = _controller(tmp_path, min_hit_rate=0.9)
    controller.stats.add_record(_record("t::a", hit=2))
    marked = _record("t::cold", miss=3)
    marked.add({"by_design": True})
    controller.stats.add_record(marked)
    controller._check_hit_rate(None)
    assert controller.problems.errors == []
    assert controller.stats.hit_rate == 0.4 and controller.stats.unmarked_hit_rate == 1.0  # the totals count it
    controller.stats.add_record(_record("t::b", miss=2))
    controller._check_hit_rate(None)
    assert controller.problems.errors == [
        "hit rate 50% (tests marked compile_cache left out) is below --compile-cache-min-hit-rate=0.9"
    ]


def test_a_hit_rate_below_the_floor_is_in_the_json_and_the_step_summary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reason the session failed reaches every report: the JSON (and so ``report``, which reads it back) and
    the step summary, not only the terminal."""
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    path = tmp_path / "report.json"
    controller = _controller(tmp_path, min_hit_rate=0.9, json=str(path))
    controller.stats.add_record(_record("t::a", hit=1, miss=1))
    assert controller.finish() is True  # failed
    failed = "hit rate 50% is below --compile-cache-min-hit-rate=0.9"
    assert controller.problems.errors == [failed]
    data = json.loads(path.read_text())
    assert data["errors"] == [failed]
    assert f"**compile cache FAILED**: {ghrunner.md_text(failed)}" in summary.read_text()
    outcome = report.outcome_from_json(data)
    assert outcome.errors == (failed,)
    assert f"compile cache FAILED: {failed}" in report.full_text(data)


@pytest.mark.parametrize(
    ("outcome", "rate", "told"),
    [("staged", 0.5, True), ("staged", 1.0, False), ("saved", 0.5, False), ("skipped", 0.5, False)],
)
def test_a_session_that_staged_its_bundle_and_failed_its_floor_tells_the_post_step_to_upload(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, outcome: str, rate: float, told: bool
) -> None:
    """``store: github``: the post step uploads the staged bundle only after a successful job unless told
    (action.yml's ``post-if``). Tests that passed under a hit rate below the floor fail the job; a direct store
    has saved by then, and so must the post step, or every later run restores the same bundle, misses the
    same graphs and fails again. A session that met its floor, or staged nothing, tells nothing."""
    env = tmp_path / "github_env"
    env.write_text("")
    monkeypatch.setenv("GITHUB_ENV", str(env))
    result = sync.SaveResult(outcome, key="k")  # type: ignore[arg-type]
    monkeypatch.setattr(SavePhase, "run", lambda self, *args, **kwargs: Saved(result=result))
    controller = _controller(tmp_path, min_hit_rate=0.9)
    controller.stats.add_record(_record("t::a", hit=int(rate * 2), miss=2 - int(rate * 2)))
    assert controller.finish() is (rate < 0.9)
    assert (env.read_text() == "COMPILECACHE_SAVE_ON_FAILURE=true\n") is told
    assert env.read_text() in ("", "COMPILECACHE_SAVE_ON_FAILURE=true\n")


@pytest.mark.parametrize("strict", [False, True])
def test_a_failed_restore_never_fails_the_guard_unless_strict(tmp_path: Path, strict: bool) -> None:
    controller = _controller(tmp_path, min_hit_rate=0.9, strict=strict)
    controller.stats.add_record(_record("t::a", miss=2))
    controller._check_hit_rate(sync.RestoreResult("error", message="restore failed: store down"))
    assert bool(controller.problems.errors) is strict
    assert any("the restore failed" in note for note in controller.problems.notes) is not strict


def test_the_actions_failed_restore_reaches_the_guard(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(HANDOFF_ENV, json.dumps({"outcome": "error", "message": "cache down"}))
    controller = _controller(tmp_path, min_hit_rate=0.9, restore="skip")
    controller.session_start()
    assert _restored(controller).outcome == "error"
    controller.stats.add_record(_record("t::a", miss=1))
    controller._check_hit_rate(controller.start.finish().result)
    assert controller.problems.errors == []


@pytest.mark.parametrize("staged", [False, True])
def test_after_the_actions_failed_restore_the_session_saves_only_where_it_stages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, staged: bool
) -> None:
    """The Action's restore step met a direct store down (one warning): the session does not wait for it again
    at its save, nor warn a second time. With ``store: github`` it stages for the post step as before."""
    told = sync.RestoreResult("error", message="restore failed: s3://b/p: endpoint unreachable")
    monkeypatch.setenv(HANDOFF_ENV, sync.write_handoff(told, sync.SavePolicy(staged=staged)))
    controller = _controller(tmp_path, restore="skip")
    controller.session_start()
    restored = controller.start.finish()
    if staged:
        assert restored.store_trouble is None
    else:
        assert restored.store_trouble == "restore failed: s3://b/p: endpoint unreachable"
        controller.stats.add_record(_record("t::a", miss=1))
        saved = SavePhase(controller.context, controller.recorder).save(restored, Gathered())
        assert saved is not None and (saved.outcome, saved.message) == (
            "skipped",
            "the store failed at the restore; nothing saved",
        )
    assert controller.problems.warnings == []  # the Action's step said it, once


@pytest.mark.parametrize(
    ("value", "outcome"),
    [
        (None, None),
        ("", None),
        ("partial", "partial"),
        ('{"outcome": "exact", "key": "k-1"}', "exact"),
        ('{"outcome": "nonsense"}', None),
        ("[1, 2]", None),
        ("{not json", None),
    ],
)
def test_action_restore_result(value: str | None, outcome: str | None) -> None:
    result = action_restore_result(value)
    assert (result.outcome if result else None) == outcome


def _staged_by_the_action(tmp_path: Path, source: Path, cache: Path) -> sync.RestoreResult:
    """What the Action's restore step does: a staging restore into ``cache`` (no torch), told to the plugin."""
    cachedir.make_dir(cache)  # ours: the fake cache files are not named as torch names them
    store = MemoryStore()
    key = make_key(PREFIX, FP.digest(), "run-1")
    path = tmp_path / "b.bundle"
    bundle.pack(
        path, key=key, lineage=restore_prefix(PREFIX, FP.digest()), fingerprint=FP.to_json(), digest=FP.digest(),
        torch_version="2.13.0", blobs=BLOBS, cache_dir=source, files=list(CACHE_FILES), stats={},
    )  # fmt: skip
    store.put(key, path)
    loader = FakeLoader()
    result = sync.restore(store, prefix=PREFIX, fingerprint=FP, cache_dir=str(cache), stage_blobs=True, load=loader)
    assert result.outcome == "partial" and len(result.staged) == 2 and loader.blobs == []
    return result


@pytest.mark.parametrize("rejected", [False, True])
def test_the_actions_staged_blobs_are_loaded_by_the_session(
    tmp_path: Path, source: Path, monkeypatch: pytest.MonkeyPatch, rejected: bool
) -> None:
    cache = tmp_path / "cache"
    staged = _staged_by_the_action(tmp_path, source, cache)
    told = {"outcome": "partial", "key": staged.key, "staged": [list(blob) for blob in staged.staged]}
    monkeypatch.setenv(HANDOFF_ENV, json.dumps(told))
    loader = FakeLoader(error=ValueError("bad pickle") if rejected else None)
    monkeypatch.setattr("pytest_compilecache.probe.load_artifacts", loader)
    controller = _controller(tmp_path, min_hit_rate=0.9, restore="skip")

    controller.session_start()

    assert controller.start.finish().result is not None
    assert loader.blobs == [BLOBS["controller"]] if rejected else [BLOBS["controller"], BLOBS["gw0"]]
    assert loader.cache_dirs[0] == str(cache)
    assert not (cache / ".compilecache-pending").exists()  # used once
    controller.stats.add_record(_record("t::a", miss=1))
    controller._check_hit_rate(controller.start.finish().result)
    if rejected:
        assert _restored(controller).outcome == "error"
        assert controller.problems.warnings == [
            "restored bundle not loaded: torch rejected the cache artifacts of controller: ValueError: bad pickle; "
            "the tests compile cold"
        ]
        assert controller.problems.errors == []  # a failed restore never fails the guard
    else:
        assert (_restored(controller).outcome, _restored(controller).key) == (
            "partial",
            staged.key,
        )
        assert _restored(controller).artifacts == {"fx_graph": 4, "triton": 2}
        assert controller.problems.warnings == []
        assert controller.problems.errors == ["hit rate 0% is below --compile-cache-min-hit-rate=0.9"]


def test_staged_blobs_already_loaded_are_a_note(tmp_path: Path, source: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    staged = _staged_by_the_action(tmp_path, source, cache)
    assert sync.load_staged(staged, str(cache), load=FakeLoader()).artifacts  # an earlier session of the job
    told = {"outcome": "partial", "key": staged.key, "staged": [list(blob) for blob in staged.staged]}
    monkeypatch.setenv(HANDOFF_ENV, json.dumps(told))
    loader = FakeLoader()
    monkeypatch.setattr("pytest_compilecache.probe.load_artifacts", loader)
    controller = _controller(tmp_path, restore="skip")
    controller.session_start()
    assert loader.blobs == [] and controller.problems.warnings == []
    assert _restored(controller).outcome == "partial"
    assert any("nothing to load" in note for note in controller.problems.notes)


def test_a_hostile_restore_report_is_never_a_crash() -> None:
    deep = '{"outcome": "exact", "key": "k", "staged": ' + "[" * 5000 + "]" * 5000 + "}"
    assert action_restore_result(deep) is None  # RecursionError while decoding: unknown, as any bad value
    mixed = {"outcome": "exact", "key": "k", "staged": [["gw0", 3, "a" * 64], ["../x", 3, "b" * 64]]}
    result = action_restore_result(json.dumps(mixed))
    assert result is not None and [blob.name for blob in result.staged] == ["gw0"]  # the bad entry is dropped


def test_the_actions_restore_text_is_printed_as_one_inert_line() -> None:
    # The message and key come from the environment (the Action writes them; a matched key is actions/cache's).
    from pytest_compilecache.report import transfer_line

    told = {"outcome": "error", "key": "k\n::add-mask::e", "message": "restore failed: x\n::error title=I::pwned"}
    result = action_restore_result(json.dumps(told))
    assert result is not None and "\n" not in result.message and result.key is not None and "\n" not in result.key
    line = transfer_line("restore", result.to_json())
    assert line.splitlines() == [line] and line.startswith("restore: error ")
    assert "x\\n::error title=I::pwned" in line


@pytest.mark.parametrize(
    "staged",
    [
        [["controller", 3, "0" * 63]],  # short digest
        [["../x", 3, "0" * 64]],  # not a blob name
        [["controller", -1, "0" * 64]],
        [["controller", True, "0" * 64]],
        [["controller", 3]],
        "controller",
    ],
)
def test_malformed_staged_entries_are_ignored(staged: object) -> None:
    result = action_restore_result(json.dumps({"outcome": "exact", "key": "k", "staged": staged}))
    assert result is not None and result.outcome == "exact" and result.staged == ()


def test_restore_setup_trouble_is_one_warning(tmp_path: Path) -> None:
    controller = _controller(tmp_path, store=str(tmp_path / "store"))

    def broken() -> Fingerprint:
        raise RuntimeError("no compiler")

    controller.context.fingerprint = broken  # type: ignore[method-assign]
    controller.session_start()
    assert _restored(controller).outcome == "error"
    assert controller.problems.warnings == ["restore skipped: RuntimeError: no compiler"]
    assert controller.problems.errors == []


def test_save_is_skipped_when_every_graph_hit_a_restored_cache(tmp_path: Path) -> None:
    controller = _controller(tmp_path, store=str(tmp_path / "store"))
    controller.stats.add_record(_record("t::a", hit=3))
    saved = _save(controller, sync.RestoreResult("partial", key="k"))
    assert saved is not None and saved.outcome == "skipped"
    assert not (tmp_path / "store").exists()


def test_a_session_that_stopped_early_does_not_replace_the_bundle_it_restored(tmp_path: Path) -> None:
    """``-x``, ``--maxfail``, an interrupt: a bundle holds what its session used and the next run restores the
    newest, so this session's bundle would replace the restored coverage with the part that ran (a reviewer's
    full run after one went from 10 hits to 0). A session that restored nothing saves what it has."""
    (tmp_path / "cache").mkdir()
    controller = _controller(tmp_path, store=str(tmp_path / "store"))
    controller.stats.add_record(_record("t::a", miss=1))
    phase = SavePhase(controller.context, controller.recorder)
    saved = phase.save(Restored(sync.RestoreResult("partial", key="k")), Gathered(), stopped=True)
    assert saved is not None and (saved.outcome, saved.message) == (
        "skipped",
        "the session stopped early (-x, --maxfail, an interrupt): nothing saved over the restored bundle",
    )
    blobs = {"controller": b"mega-cache"}
    cold = phase.save(Restored(sync.RestoreResult("miss")), Gathered(blobs=blobs), stopped=True)
    assert cold is not None and cold.outcome == "saved", cold


def test_a_session_that_autotuned_saves_although_every_graph_hit(tmp_path: Path) -> None:
    """issue 27.5: new autotune results (first-call benchmarks, max-autotune timings) are worth a new bundle."""
    (tmp_path / "cache").mkdir()
    controller = _controller(tmp_path, store=str(tmp_path / "store"))
    record = _record("t::mm", hit=3)
    record.add({"gpu": {"autotune_seconds": 1.2, "autotune_benchmarks": 4}})
    controller.stats.add_record(record)
    blobs = {"controller": b"mega-cache with the new autotune results"}
    saved = _save(controller, sync.RestoreResult("exact", key="k"), Gathered(blobs=blobs))
    assert saved is not None and saved.outcome == "saved", saved
    lines = [line for line, _ in controller.terminal_lines()]
    assert any(line.startswith("gpu: 1 test without an FX-graph miss still autotuned") for line in lines), lines


def test_restore_skip_without_a_report_counts_as_restored(tmp_path: Path) -> None:
    controller = _controller(tmp_path, store=str(tmp_path / "store"), restore="skip")
    controller.session_start()
    controller.stats.add_record(_record("t::a", hit=3))
    saved = _save(controller, controller.start.finish().result)
    assert saved is not None and saved.outcome == "skipped"


def test_workers_output_is_merged_and_a_silent_worker_listed(tmp_path: Path) -> None:
    controller = _controller(tmp_path)
    worker_setup = SessionContext(
        controller.context.settings, controller.context.dir, controller.context.lease, Problems()
    )
    worker = Worker(worker_setup, Recorder("gw0"))
    worker.recorder.record("t::a", {"fxgraph": {"miss": 1}, "frames": 1})
    worker.recorder.record("t::b", {})
    worker_setup.problems.warn("gw0 could not re-make the dir")
    controller.add_worker("gw0", json.loads(json.dumps(worker.output())))
    controller.add_worker("gw1", None)
    assert controller.stats.tests == 2 and list(controller.stats.records) == ["t::a"]
    assert controller.stats.records["t::a"].worker == "gw0"
    assert controller.stats.silent_workers == ["gw1"]
    assert controller.problems.warnings == ["gw0 could not re-make the dir"]


def test_redis_errors_of_every_worker_and_of_the_controller_are_one_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # probe.guard_remote_cache recorded them in the process that compiled; each role hands them on once.
    errors = {
        "gw0": ["put: OutOfMemoryError: OOM", "get: the connection was lost"],
        "gw1": ["get: TimeoutError: Timeout reading from socket"],
        "controller": ["get: the connection was lost"],
    }
    process = ["gw0"]
    monkeypatch.setattr(probe, "remote_cache_errors", lambda: errors[process[0]])
    controller = _controller(tmp_path)
    for worker in ("gw0", "gw1"):
        process[0] = worker
        worker_setup = SessionContext(
            controller.context.settings, controller.context.dir, controller.context.lease, Problems()
        )
        output = json.loads(json.dumps(Worker(worker_setup, Recorder(worker)).output()))
        assert output["problems"]["warnings"] == []  # a worker hands its errors on; the controller warns
        controller.add_worker(worker, output)
    process[0] = "controller"
    controller.finish()
    # One warning for the session, whichever processes met Redis trouble (it was one per process).
    assert controller.problems.warnings == [
        "redis remote cache failed mid-session (put: OutOfMemoryError: OOM; 4 errors in all); torch's remote "
        "caches are off for the rest of each process that met it, its compiles use the local cache dir"
    ]


def test_terminal_lines(tmp_path: Path) -> None:
    controller = _controller(tmp_path, report="none")
    assert controller.terminal_lines() == []
    controller.problems.warn("store down")
    controller.problems.error("hit rate")
    lines = [line for line, _ in controller.terminal_lines()]
    assert lines == ["CompileCacheWarning: store down", "compile cache FAILED: hit rate"]


def test_github_annotations_are_escaped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_compilecache import plugin

    controller = _controller(tmp_path)
    controller.problems.warn("bad bundle\n::error title=Injected::x 100%")
    controller.problems.error("hit rate\n::add-mask::y")
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    plugin._github_commands(controller)
    assert out.getvalue().splitlines() == [
        "::warning title=compile cache::bad bundle%0A::error title=Injected::x 100%25",
        "::error title=compile cache::hit rate%0A::add-mask::y",
    ]


def test_step_summary_goes_through_the_escaping_renderer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    controller = _controller(tmp_path)
    controller._restored = Restored(
        sync.RestoreResult("miss", message="newest differs in: x\n</details><script>alert(1)</script>|")
    )
    controller.stats.add_record(_record("t::a|b", miss=1))
    controller._write_reports()
    text = summary.read_text()
    assert "<script>" not in text and "</details><script>" not in text
    assert "`t::a\\|b`" in text


def test_recorder_counts_a_test_without_torch_through_the_cold_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The per-test path of a session that never imports torch: no probe call beyond ``torch_loaded``."""
    monkeypatch.setattr("pytest_compilecache.recorder.torch_loaded", lambda: False)
    monkeypatch.setattr("pytest_compilecache.probe.mark", lambda: pytest.fail("probe.mark called without torch"))
    monkeypatch.setattr("pytest_compilecache.probe.delta", lambda start: pytest.fail("probe.delta called"))
    recorder = Recorder("controller")
    start = recorder.start()
    assert start is recorder_mod.COLD
    assert recorder.finish_cold(start)
    assert recorder.stats.tests == 1
    assert recorder.stats.records == {}


def test_recorder_records_a_test_that_imports_torch_and_compiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """A test that begins before torch is imported and compiles: counted from zero, recorded, not lost."""
    loaded = [False]
    monkeypatch.setattr("pytest_compilecache.recorder.torch_loaded", lambda: loaded[0])
    seen: list[Any] = []

    def delta(start: Any) -> dict[str, Any]:
        seen.append(start)
        return {"fxgraph": {"hit": 0, "miss": 1}, "frames": 1}

    monkeypatch.setattr("pytest_compilecache.probe.delta", delta)
    monkeypatch.setattr("pytest_compilecache.probe.graph_delta", lambda start: [])
    recorder = Recorder("controller")
    start = recorder.start()
    assert start is recorder_mod.COLD
    loaded[0] = True  # the test imports torch and compiles
    assert not recorder.finish_cold(start)
    recorder.finish("test_x.py::test_compiles", start)
    assert seen == [probe.ZERO]  # counted from zero
    assert recorder.stats.tests == 1
    assert recorder.stats.records["test_x.py::test_compiles"].fxgraph["miss"] == 1


# ---- a store that hands back a bad bundle: every fault of tests.bundle_faults.FAULTS through the restore
# (tests/integration/test_plugin_faults.py takes two of them through a real pytest session)

FAULT_KEY = make_key(DEFAULT_PREFIX, FP.digest(), "run1")
# What the one warning line says, by fault.
REASONS = {
    "truncated": "bundle is truncated",
    "flipped-byte": "payload checksum mismatch",
    "wrong-signature": "signature mismatch",
    "missing-signature": "signature missing",
    "other-fingerprint": "fingerprint differs (bundle != current): torch: 2.99.0 != 2.13.0",
    "escaping-member": "unsafe member path 'files/../../escaped.so'",
    "store-not-a-directory": "is a file, not a directory",  # became one after start-up
}


def _restored_from_a_bad_bundle(tmp_path: Path, fault: str, strict: bool) -> Controller:
    """An isolated, read-only session restoring from a directory store that holds the damaged bundle."""
    damage, env = FAULTS[fault]
    store = tmp_path / "store"
    store.mkdir()
    signing_key = SIGNING_KEY.encode() if env else None
    controller = _controller(
        tmp_path, mode="isolated", store=str(store), readonly=True, strict=strict, signing_key=signing_key
    )
    # Damaged after start-up: a store that is a file by then is store trouble (at start-up, a usage error).
    damage(store / f"{FAULT_KEY}.bundle", FP)
    controller.session_start()
    return controller


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_bad_bundle_is_one_warning_and_a_cold_start(fault: str, tmp_path: Path) -> None:
    assert set(REASONS) == set(FAULTS)
    controller = _restored_from_a_bad_bundle(tmp_path, fault, strict=False)

    result = controller.start.finish().result
    assert result is not None
    (warning,) = controller.problems.warnings
    assert REASONS[fault] in warning, warning
    assert controller.problems.errors == []
    if fault == "store-not-a-directory":  # the store itself is broken: infrastructure trouble
        assert result.outcome == "error"
    else:  # a bad bundle in a working store is refused and listed; nothing usable: a miss, cold compile
        assert result.outcome == "miss"
        assert [key for key, _ in result.skipped] == [FAULT_KEY]
        assert controller.start.finish().store_trouble is None  # the session saves a readable bundle above the bad one
    cache = controller.context.dir.path
    assert cache is not None and Path(cache).is_dir()
    assert [p.name for p in Path(cache).rglob("*") if p.name.startswith("kernel")] == []
    assert not list(tmp_path.rglob("escaped.so")) and not (tmp_path.parent / "escaped.so").exists()


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_under_strict_a_bad_bundle_fails_the_session(fault: str, tmp_path: Path) -> None:
    controller = _restored_from_a_bad_bundle(tmp_path, fault, strict=True)

    assert controller.problems.errors == controller.problems.warnings, controller.problems.errors
    (error,) = controller.problems.errors
    assert error.startswith("restore") and REASONS[fault] in error, error


def test_a_json_report_path_that_cannot_be_written_is_a_start_up_error(tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    for path, needle in [
        (tmp_path, "is a directory"),
        (a_file / "report.json", "cannot create the directory of"),
    ]:
        with pytest.raises(ConfigError, match=f"^--compile-cache-json: .*{needle}"):
            _controller(tmp_path, json=str(path))
    spelled = (("json", "PYTEST_COMPILECACHE_JSON"),)
    with pytest.raises(ConfigError, match="^PYTEST_COMPILECACHE_JSON: .* is a directory"):
        _controller(tmp_path, json=str(tmp_path), spelled=spelled)
    # A dir that can be made is made when the report is written: a start refused later leaves none behind.
    controller = _controller(tmp_path, json=str(tmp_path / "new" / "report.json"))
    assert not (tmp_path / "new").exists()
    controller.finish()
    assert (tmp_path / "new" / "report.json").is_file()


@pytest.mark.parametrize(
    ("fail", "outcome", "saves"),
    [
        pytest.param(("list",), "error", False, id="the restore failed on the store"),
        # No bundle of this fingerprint; fetching another fingerprint's newest to explain the miss failed:
        # the miss says so, and the session still saves (it used to skip every save from then on, silently).
        pytest.param(("get_head",), "miss", True, id="only explaining the miss failed"),
    ],
)
def test_only_a_restore_that_failed_on_the_store_skips_the_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail: tuple[str, ...], outcome: str, saves: bool
) -> None:
    store = MemoryStore(fail=fail)
    store.objects[make_key(PREFIX, "0" * 16, "other-1")] = (b"not read", 1.0)
    monkeypatch.setattr(context_mod, "open_configured_store", lambda settings: store)
    controller = _controller(tmp_path, store="memory://test", key_prefix=PREFIX)
    controller.session_start()
    assert _restored(controller).outcome == outcome
    assert (controller.start.finish().store_trouble is None) is saves
    assert ("could not explain" in _restored(controller).message) is saves
    assert len(controller.problems.warnings) == (0 if saves else 1)


def test_a_store_that_stalls_while_a_miss_is_explained_is_one_warning_and_no_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Listing answers, the read of another fingerprint's bundle header (to explain the miss) never does: the
    # budget is spent, so the save would wait out a second one. One warning, no save.
    release = threading.Event()

    class Stalling(MemoryStore):
        def get_head(self, key: str, limit: int) -> bytes | None:
            release.wait(30)
            return super().get_head(key, limit)

    store = Stalling()
    store.objects[make_key(PREFIX, "0" * 16, "other-1")] = (b"not read", 1.0)
    monkeypatch.setattr(context_mod, "open_configured_store", lambda settings: store)
    controller = _controller(tmp_path, store="memory://test", key_prefix=PREFIX, store_timeout=0.2)
    try:
        controller.session_start()
    finally:
        release.set()
    assert _restored(controller).outcome == "miss"
    assert controller.start.finish().store_trouble is not None
    assert controller.problems.warnings == [
        "memory://test did not finish within 0.2 s (read compilecache-v1-0000000000000000-other-1); see "
        "--compile-cache-store-timeout; nothing will be saved this session"
    ]


def test_headers_the_actions_restore_installed_are_checked_early(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issues 24, 25: what the Action's restore step installed is checked beside torch's first header look-up,
    as a restore of the session's own is (probe.check_headers_early), in torch's header dir of this process."""
    from pytest_compilecache import pch as headers
    from pytest_compilecache.probe import pch

    name = "c" + "a2b3c4d5e6f7" * 4 + "abc" + ".h.gch"
    monkeypatch.setattr(pch, "_early_checks", [])
    monkeypatch.setenv(HANDOFF_ENV, json.dumps({"outcome": "partial", "key": "k", "headers": [name, "../evil"]}))
    controller = _controller(tmp_path, restore="skip")

    controller.session_start()

    assert pch._early_checks == [headers.header_dir() / name]  # a name torch could not give is dropped


def test_an_xdist_session_interrupted_before_its_workers_reported_says_so(tmp_path: Path) -> None:
    """Ctrl-C to the whole process group: no worker reports, and the report said only "0 hits, 0 misses" and
    "nothing was compiled" of a session whose workers compiled."""
    settings = Settings(mode="shared", dir=str(tmp_path / "cache"))
    context = SessionContext.start(settings, tmp_path / "default", inherited=None, problems=Problems())
    context._fingerprint = FP
    _OPEN.append(context)
    controller = Controller(context, Recorder("controller"), xdist=True)
    controller.session_start()
    controller.finish(failed=True, stopped=True)
    said = "the session was interrupted before any xdist worker reported: the statistics leave out every test"
    assert any(note.startswith(said) for note in controller.problems.notes), controller.problems.notes


def test_a_session_that_lost_a_workers_statistics_saves_nothing(tmp_path: Path) -> None:
    """Issue 44, finding 4: a session whose xdist worker died saved a smaller bundle that lacked that worker's
    graphs; the next (green) run restored it as the newest and failed its hit-rate floor."""
    settings = Settings(mode="shared", dir=str(tmp_path / "cache"), store=str(tmp_path / "store"))
    context = SessionContext.start(settings, tmp_path / "default", inherited=None, problems=Problems())
    (tmp_path / "cache" / "kernel.so").write_bytes(b"kernel")
    context._fingerprint = FP
    _OPEN.append(context)
    controller = Controller(context, Recorder("controller"), xdist=True)
    controller.session_start()
    controller.add_worker("gw0", None)  # killed: sent nothing
    controller.add_worker("gw1", {"tests": 1, "files": ["kernel.so"], "blob": b"gw1's mega-cache"})
    controller.stats.add_record(_record("t::a", miss=1))
    controller.finish()
    saved = _saved(controller)
    assert saved.outcome == "skipped" and "gw0" in saved.message, saved
    assert not (tmp_path / "store").exists() or not list((tmp_path / "store").iterdir())
