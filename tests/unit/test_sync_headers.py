"""sync + headers: precompiled headers travel beside bundles (once per store) and come back verified.

No torch and no gcc: a "header" is bytes under one of torch's header names; the store is the shared
in-memory fake. The plugin-level proof with a real compile is tests/plugin/test_headers.py.
"""

from __future__ import annotations

import builtins
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import zstandard

from pytest_compilecache import bundle
from pytest_compilecache import cli
from pytest_compilecache import pch
from pytest_compilecache import sync
from pytest_compilecache.fingerprint import make_key
from pytest_compilecache.fingerprint import restore_prefix
from pytest_compilecache.settings import DEFAULT_PREFIX
from pytest_compilecache.stores import LocalStore
from pytest_compilecache.stores.base import is_artifact_key
from pytest_compilecache.stores.base import prune
from tests.bundles import find_latest
from tests.fakes import FakeLoader
from tests.fakes import MemoryStore
from tests.unit.conftest import A100
from tests.unit.conftest import BLOBS
from tests.unit.conftest import CACHE_FILES
from tests.unit.conftest import H100
from tests.unit.conftest import PREFIX
from tests.unit.conftest import tree

NAME = "c" + "a2b3c4d5e6f7" * 4 + "abc" + ".h.gch"
OTHER = "c" + "z" * 51 + ".h.gch"
CONTENT = b"gpch precompiled header " * 4096  # starts like a gcc PCH
OTHER_CONTENT = b"gpch a header built for another CPU " * 2048

pytestmark = pytest.mark.usefixtures("cache_env")


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    return tmp_path / "cache"


class RecordingStore(MemoryStore):
    """The memory store, also recording which keys were fetched and written."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.gets: list[str] = []
        self.puts: list[str] = []

    def get(self, key: str, dest: Path, *, limit: int | None = None) -> bool:
        self.gets.append(key)
        return super().get(key, dest, limit=limit)

    def put(self, key: str, src: Path) -> None:
        self.puts.append(key)
        super().put(key, src)


def _header(directory: Path, name: str = NAME, content: bytes = CONTENT) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_bytes(content)
    return directory / name


def _save(store: Any, source: Path, suffix: str, header_dir: Path, **kwargs: Any) -> sync.SaveResult:
    arguments: dict[str, Any] = {
        "prefix": PREFIX,
        "fingerprint": H100,
        "suffix": suffix,
        "cache_dir": str(source),
        "blobs": BLOBS,
        "files": list(CACHE_FILES),
        "stats": {"hits": 3},
        "header_since": pch.session_start(),
        "header_dir": header_dir,
    }
    arguments.update(kwargs)
    return sync.save(store, **arguments)


def _restore(store: Any, cache: Path, header_dir: Path, **kwargs: Any) -> sync.RestoreResult:
    kwargs.setdefault("load", FakeLoader())
    kwargs.setdefault("fingerprint", H100)
    return sync.restore(store, prefix=PREFIX, cache_dir=str(cache), header_dir=header_dir, **kwargs)


def _artifact_key(content: bytes = CONTENT) -> str:
    import hashlib

    return pch.object_key(PREFIX, hashlib.sha256(content).hexdigest())


def _manifest(store: MemoryStore, key: str, tmp_path: Path) -> Any:
    path = tmp_path / "check.bundle"
    path.write_bytes(store.objects[key][0])
    with bundle.verify(path) as verified:
        return verified.manifest


# ------------------------------------------------------------------------------------------------------ save


def test_a_save_uploads_a_used_header_once_and_the_manifest_names_it(tmp_path: Path, source: Path) -> None:
    store = RecordingStore()
    hdrs = tmp_path / "headers"
    _header(hdrs)
    first = _save(store, source, "run-1", hdrs)
    assert first.outcome == "saved", first.message
    assert (first.headers.named, first.headers.transferred, first.headers.size) == ((NAME,), (NAME,), len(CONTENT))
    assert first.headers.warnings == ()
    key = _artifact_key()
    assert store.puts.count(key) == 1
    # The object is the zstd of the raw header, and the signed manifest names it by name, sha256 and size.
    assert zstandard.ZstdDecompressor().decompressobj().decompress(store.objects[key][0]) == CONTENT
    (artifact,) = _manifest(store, first.key or "", tmp_path).artifacts
    assert (artifact.kind, artifact.name, artifact.size) == (pch.KIND, NAME, len(CONTENT))
    assert key.endswith(artifact.sha256)

    second = _save(store, source, "run-2", hdrs)
    assert second.outcome == "saved"
    assert (second.headers.named, second.headers.transferred) == ((NAME,), ())
    assert store.puts.count(key) == 1, "a header the store has is not uploaded again"
    assert [a.name for a in _manifest(store, second.key or "", tmp_path).artifacts] == [NAME]
    assert second.to_json()["headers"] == {
        "named": 1,
        "transferred": 0,
        "size": 0,
        "seconds": pytest.approx(second.headers.seconds, abs=0.001),
        "warnings": [],
    }


def test_a_save_without_header_since_carries_no_header(tmp_path: Path, source: Path) -> None:
    store = RecordingStore()
    hdrs = tmp_path / "headers"
    _header(hdrs)
    result = _save(store, source, "run-1", hdrs, header_since=None)
    assert result.outcome == "saved"
    assert result.headers == sync.HeaderReport()
    assert not [key for key in store.objects if is_artifact_key(key)]
    assert _manifest(store, result.key or "", tmp_path).artifacts == ()


def test_a_header_used_before_the_session_is_not_carried(tmp_path: Path, source: Path) -> None:
    store = RecordingStore()
    hdrs = tmp_path / "headers"
    old = _header(hdrs)
    os.utime(old, (1_000_000, 1_000_000))  # built and last read long before this session
    result = _save(store, source, "run-1", hdrs)
    assert result.headers.named == ()
    # ...unless this session's restore installed it (torch then found it and never rebuilt it).
    again = _save(store, source, "run-2", hdrs, header_installed=[NAME])
    assert again.headers.named == (NAME,)


def test_a_header_upload_that_fails_is_one_warning_and_the_bundle_is_saved(tmp_path: Path, source: Path) -> None:
    class NoArtifacts(RecordingStore):
        def put(self, key: str, src: Path) -> None:
            if is_artifact_key(key):
                from pytest_compilecache import StoreError

                raise StoreError("cannot put: quota exceeded\nsecond line")
            super().put(key, src)

    store = NoArtifacts()
    hdrs = tmp_path / "headers"
    _header(hdrs)
    result = _save(store, source, "run-1", hdrs)
    assert result.outcome == "saved"
    assert result.headers.named == ()
    (line,) = result.headers.warnings
    assert NAME in line and "quota exceeded" in line and "\n" not in line
    assert _manifest(store, result.key or "", tmp_path).artifacts == ()  # names only what the store holds


# --------------------------------------------------------------------------------------------------- restore


def test_a_restore_installs_the_named_header_into_torchs_dir(tmp_path: Path, source: Path, cache_dir: Path) -> None:
    store = RecordingStore()
    _header(tmp_path / "machine-a")
    saved = _save(store, source, "run-1", tmp_path / "machine-a")
    fresh = tmp_path / "machine-b" / "torchinductor_me" / "precompiled_headers"
    fresh.parent.parent.mkdir()  # the runner's TMPDIR exists; torch's dirs under it do not yet
    result = _restore(store, cache_dir, fresh)
    assert result.outcome == "partial", result.message
    assert (fresh / NAME).read_bytes() == CONTENT
    assert (result.headers.named, result.headers.transferred, result.headers.size) == ((NAME,), (NAME,), len(CONTENT))
    assert result.headers.warnings == () and result.warning is None
    data = result.to_json()["headers"]
    assert (data["named"], data["transferred"], data["size"]) == (1, 1, len(CONTENT))
    assert saved.key == result.key
    # Nothing but the header (and torch's lock dir) lands there, and no scratch file is left anywhere.
    assert sorted(p.name for p in fresh.iterdir()) == [NAME, "locks"]

    # A second restore finds it present: nothing is downloaded, it is still named (for the next save).
    store.gets.clear()
    again = _restore(store, cache_dir, fresh)
    assert (again.headers.named, again.headers.transferred) == ((NAME,), ())
    assert _artifact_key() not in store.gets


def test_restore_with_headers_off_installs_none(tmp_path: Path, source: Path, cache_dir: Path) -> None:
    store = RecordingStore()
    _header(tmp_path / "a")
    _save(store, source, "run-1", tmp_path / "a")
    fresh = tmp_path / "b"
    result = _restore(store, cache_dir, fresh, headers=False)
    assert result.outcome == "partial"
    assert not fresh.exists()
    assert _artifact_key() not in store.gets


def test_on_installed_names_the_headers_before_any_blob_loads(tmp_path: Path, source: Path, cache_dir: Path) -> None:
    """Issue 24/25: the plugin starts the headers' install from ``on_installed``, so it must come once the
    bundle is installed and before the blobs load (which imports torch): the install overlaps that import."""
    store = RecordingStore()
    _header(tmp_path / "a")
    _save(store, source, "run-1", tmp_path / "a")
    events: list[str] = []
    loader = FakeLoader()

    def load(blob: bytes) -> Any:
        events.append("load")
        return loader(blob)

    def installed(named: tuple[Any, ...]) -> None:
        assert (cache_dir / next(iter(CACHE_FILES))).is_file()  # the bundle's files are in place already
        events.append("installed " + ",".join(artifact.name for artifact in named))

    result = _restore(store, cache_dir, tmp_path / "b", headers=False, load=load, on_installed=installed)

    assert result.outcome == "partial", result.message
    assert events[0] == f"installed {NAME}" and events[1:] == ["load"] * len(BLOBS)
    assert not (tmp_path / "b").exists()  # headers=False: the caller installs them


def test_a_tampered_header_is_refused_with_one_warning_and_the_restore_succeeds(
    tmp_path: Path, source: Path, cache_dir: Path
) -> None:
    store = RecordingStore()
    _header(tmp_path / "a")
    _save(store, source, "run-1", tmp_path / "a")
    key = _artifact_key()
    evil = zstandard.ZstdCompressor().compress(b"X" + CONTENT[1:])  # same size, other bytes
    store.objects[key] = (evil, store.objects[key][1])
    fresh = tmp_path / "b"
    loader = FakeLoader()
    result = _restore(store, cache_dir, fresh, load=loader)
    assert result.outcome == "partial" and result.ok
    assert loader.blobs == list(BLOBS.values())  # the bundle itself was installed and loaded
    assert {rel: data for rel, data in tree(cache_dir).items() if rel in CACHE_FILES} == CACHE_FILES
    assert not (fresh / NAME).exists()
    assert [p.name for p in fresh.iterdir()] == ["locks"]  # no temp file, no partial header
    (line,) = result.headers.warnings
    assert NAME in line and "sha256" in line
    assert result.headers.transferred == ()


def test_a_header_missing_from_the_store_is_one_warning(tmp_path: Path, source: Path, cache_dir: Path) -> None:
    store = RecordingStore()
    _header(tmp_path / "a")
    _save(store, source, "run-1", tmp_path / "a")
    del store.objects[_artifact_key()]
    result = _restore(store, cache_dir, tmp_path / "b")
    assert result.outcome == "partial"
    (line,) = result.headers.warnings
    assert "not in the store" in line


def test_a_header_built_for_another_fingerprint_is_never_fetched(tmp_path: Path, source: Path, cache_dir: Path) -> None:
    store = RecordingStore()
    _header(tmp_path / "a100-machine", OTHER, OTHER_CONTENT)
    _header(tmp_path / "h100-machine", NAME, CONTENT)
    assert _save(store, source, "run-a", tmp_path / "a100-machine", fingerprint=A100).outcome == "saved"
    assert _save(store, source, "run-h", tmp_path / "h100-machine").outcome == "saved"
    assert {_artifact_key(CONTENT), _artifact_key(OTHER_CONTENT)} <= set(store.objects)
    fresh = tmp_path / "fresh"
    result = _restore(store, cache_dir, fresh)
    assert result.key == make_key(PREFIX, H100.digest(), "run-h")
    assert sorted(p.name for p in fresh.iterdir() if p.name != "locks") == [NAME]
    assert _artifact_key(OTHER_CONTENT) not in store.gets
    assert [key for key in store.gets if is_artifact_key(key)] == [_artifact_key(CONTENT)]


# ------------------------------------------------------------------------------------- prune and listing


def test_pruning_keeps_artifacts_and_does_not_count_them(tmp_path: Path, source: Path) -> None:
    store = RecordingStore()
    _header(tmp_path / "a")
    for run in range(1, 5):
        assert _save(store, source, f"run-{run}", tmp_path / "a", keep=2).outcome == "saved"
    lineage = restore_prefix(PREFIX, H100.digest())
    assert [e.key for e in store.list(lineage)] == [make_key(PREFIX, H100.digest(), f"run-{n}") for n in (4, 3)]
    assert _artifact_key() in store.objects  # named by both kept bundles
    # The CLI's prune over the bare prefix: the artifact is neither deleted nor one of the kept entries.
    deleted = prune(store, PREFIX, 1)
    assert deleted == [make_key(PREFIX, H100.digest(), "run-3")]
    assert _artifact_key() in store.objects
    assert prune(store, PREFIX, 0) == [make_key(PREFIX, H100.digest(), "run-4")]
    assert builtins.list(store.objects) == [_artifact_key()]  # kept: see prune's docstring


def test_listing_never_takes_an_artifact_for_a_bundle(tmp_path: Path, source: Path, cache_dir: Path) -> None:
    store = RecordingStore()
    _header(tmp_path / "a")
    saved = _save(store, source, "run-1", tmp_path / "a", fingerprint=A100)
    # An artifact written after the newest bundle (a save whose bundle put failed afterwards, say).
    other = tmp_path / "later.zst"
    other.write_bytes(zstandard.ZstdCompressor().compress(OTHER_CONTENT))
    store.put(_artifact_key(OTHER_CONTENT), other)
    assert store.list(PREFIX + "-")[0].key == _artifact_key(OTHER_CONTENT)
    assert find_latest(store, PREFIX) == saved.key
    miss = _restore(store, cache_dir, tmp_path / "b")  # H100 has no bundle: the miss explains A100's
    assert miss.outcome == "miss"
    assert saved.key and saved.key in miss.message and "artifact" not in miss.message
    assert not [key for key in store.gets if is_artifact_key(key)]


def test_artifact_keys_are_told_from_bundle_keys() -> None:
    sha = "0" * 64
    assert is_artifact_key(pch.object_key(PREFIX, sha))
    assert not is_artifact_key(make_key(PREFIX, "ab" * 8, "20260101T000000-42"))
    assert not is_artifact_key(f"{PREFIX}-artifact-{sha[:-1]}")


# ------------------------------------------------------------------------------------------------------- CLI


def test_cli_save_and_restore_carry_headers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("PYTEST_COMPILECACHE_SIGNING_KEY", "GITHUB_OUTPUT", "GITHUB_ACTIONS", "TRITON_CACHE_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "unused"))
    cache = tmp_path / "cache"
    (cache / "ab").mkdir(parents=True)
    (cache / "ab" / ("cab" + "x" * 49 + ".main.so")).write_bytes(b"kernel")  # a key torch would name
    store = tmp_path / "store"
    machine_a, machine_b = tmp_path / "tmp-a", tmp_path / "tmp-b"
    machine_a.mkdir()
    machine_b.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(machine_a))
    old = _header(pch.header_dir(), OTHER, OTHER_CONTENT)
    os.utime(old, (900_000, 900_000))
    _header(pch.header_dir())

    save = ["save", "--store", str(store), "--cache-dir", str(cache)]
    assert cli.main([*save, "--suffix", "1", "--headers-since", "1000001"]) == 0
    assert "names 1 precompiled header(s), uploaded 1" in capsys.readouterr().out
    assert cli.main([*save, "--suffix", "2", "--all-headers"]) == 0
    assert "names 2 precompiled header(s), uploaded 1" in capsys.readouterr().out
    assert cli.main([*save, "--suffix", "3"]) == 0
    assert "precompiled" not in capsys.readouterr().out  # opt-in: a dev machine's dir holds anything
    local = LocalStore(store)
    assert sum(is_artifact_key(e.key) for e in local.list(DEFAULT_PREFIX)) == 2

    monkeypatch.setattr(tempfile, "tempdir", str(machine_b))
    key2 = [e.key for e in local.list() if e.key.endswith("-2")][0]
    assert cli.main(["restore", "--store", str(store), "--cache-dir", str(tmp_path / "c2"), "--key", key2]) == 0
    assert "installed 2 precompiled header(s)" in capsys.readouterr().err
    assert sorted(p.name for p in pch.header_dir().iterdir() if p.name != "locks") == sorted([NAME, OTHER])
    assert (pch.header_dir() / NAME).read_bytes() == CONTENT


@pytest.mark.parametrize("value", ["soon", "nan", "-5", "inf"])
def test_cli_headers_since_must_be_a_time(tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["save", "--store", str(tmp_path / "s"), "--cache-dir", str(tmp_path), "--headers-since", value])
    assert exc.value.code == 2
    assert "--headers-since" in capsys.readouterr().err


# ----------------------------------------------------------------------------- the Action's store: github


def test_with_the_actions_staging_dir_the_header_rides_inside_the_runs_entry(
    tmp_path: Path, source: Path, cache_dir: Path
) -> None:
    """store: github, simulated without actions/cache: the plugin saves into the staging dir (a directory
    store), actions/cache would save ``staging/*.bundle`` as the run's entry and restore it next run, the
    Action moves it to its inbox and restores from there. The header object matches ``*.bundle``, so it
    travels inside every entry (not once per repository) and comes back verified."""
    import glob

    from action.transfer import stage_bundles

    staging = tmp_path / ".compilecache-staging"
    _header(tmp_path / "runner-1")
    saved = _save(LocalStore(staging), source, "run-1", tmp_path / "runner-1", keep=1)
    assert saved.headers.transferred == (NAME,)
    entry = sorted(Path(p).name for p in glob.glob(str(staging / "*.bundle")))  # actions/cache's `path:`
    assert entry == sorted([f"{saved.key}.bundle", f"{_artifact_key()}.bundle"])

    inbox = tmp_path / "inbox"
    stage_bundles(staging, inbox)
    fresh = tmp_path / "runner-2"
    result = _restore(LocalStore(inbox), cache_dir, fresh)
    assert result.key == saved.key
    assert result.headers.transferred == (NAME,) and result.headers.warnings == ()
    assert (fresh / NAME).read_bytes() == CONTENT


# ------------------------------------------------------------------------------------------ issue 24


def _checked(path: Path, verdict: str = "verified") -> dict[str, Any]:
    info = os.lstat(path)
    return pch.HeaderUse(path.name, verdict, info.st_size, info.st_mtime_ns, info.st_ino).to_json()


def test_a_save_carries_the_headers_its_processes_checked_whatever_the_mount_records(
    tmp_path: Path, source: Path
) -> None:
    """A header built and read before the session (its times pinned as relatime or noatime leave them) that
    the session's processes looked up and checked is carried; a damaged one they reported is not, and neither
    is a partial build left under one of gcc's temporary names."""
    store = RecordingStore()
    hdrs = tmp_path / "headers"
    used = _header(hdrs)
    hour_ago = int(time.time()) - 3600
    os.utime(used, (hour_ago, hour_ago - 3600))  # relatime: atime at its first read after the write, before now
    truncated = _header(hdrs, OTHER, CONTENT[:999])  # built now, cut short: the check failed
    (hdrs / f"{OTHER}.gpcWriteXyZ12").write_bytes(CONTENT)  # a killed build's partial file
    uses = [_checked(used), _checked(truncated, "damaged")]
    result = _save(store, source, "run-1", hdrs, header_uses=uses)
    assert (result.headers.named, result.headers.transferred, result.headers.warnings) == ((NAME,), (NAME,), ())
    assert [a.name for a in _manifest(store, result.key or "", tmp_path).artifacts] == [NAME]

    none = _save(store, source, "run-2", hdrs, header_uses=[])  # no process looked a header up
    assert none.headers.named == ()


def test_a_restore_replaces_a_zeroed_local_header_with_one_note(tmp_path: Path, source: Path, cache_dir: Path) -> None:
    store = RecordingStore()
    machine = tmp_path / "machine-a"
    _save(store, source, "run-1", machine, header_uses=[_checked(_header(machine))])
    fresh = tmp_path / "machine-b"
    _header(fresh, NAME, b"\0" * len(CONTENT))  # a crash left it zeroed: gcc would ignore it for good
    result = _restore(store, cache_dir, fresh)
    assert (fresh / NAME).read_bytes() == CONTENT
    assert result.headers.transferred == (NAME,) and result.headers.warnings == ()
    (note,) = result.headers.notes
    assert NAME in note and "replaced" in note


class _StalledHeaderStore(MemoryStore):
    """Serves everything at once but a header object, which it holds until ``go`` (a store serving it one byte
    every 5 s, as in issue 44's recipe)."""

    def __init__(self) -> None:
        super().__init__()
        self.go = threading.Event()

    def get(self, key: str, dest: Path, *, limit: int | None = None) -> bool:
        if is_artifact_key(key):
            self.go.wait(30)
        return super().get(key, dest, limit=limit)


def test_the_background_install_lets_torch_build_a_header_well_before_torch_gives_up_waiting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 44, finding 3, with torch's lock timeout scaled down to 4 s: the reservation held torch's build lock
    of the header until the download ended (up to the whole store budget, which may be a day), and torch gave
    up waiting for it: ``InductorError: Timeout: The file lock ... could not be acquired``, the test failed."""
    import filelock

    monkeypatch.setenv("TORCHINDUCTOR_FILE_LOCK_TIMEOUT", "4")
    monkeypatch.setattr("pytest_compilecache.probe.check_headers_early", lambda names, directory=None: None)
    machine, fresh = tmp_path / "machine", tmp_path / "fresh"
    artifact = pch.describe(_header(machine))
    store = _StalledHeaderStore()
    packed = tmp_path / "packed"
    with open(packed, "wb") as out:
        pch.compress(machine / NAME, out)
    store.put(_artifact_key(), packed)

    install = sync.HeaderInstall(store, PREFIX, [artifact], fresh)
    try:
        assert NAME in install._reservation.held  # torch's lock is taken before the download starts
        # torch: its build lock, waited for as long as TORCHINDUCTOR_FILE_LOCK_TIMEOUT says, then it builds
        with filelock.FileLock(str(fresh / "locks" / pch.names.lock_name(NAME)), timeout=4):
            (fresh / NAME).write_bytes(b"gpch torch built it")
    finally:
        store.go.set()
    report = install.finish()
    assert (fresh / NAME).read_bytes() == b"gpch torch built it"  # never replaced by the late download
    assert report.transferred == ()
    [warning] = report.warnings
    assert warning.startswith(f"precompiled header {NAME} not restored within 2 s") and "torch built it" in warning


def test_a_restored_header_no_compile_looks_up_leaves_the_lineage_after_idle_saves(
    tmp_path: Path, source: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A header the restore installed is named again by a save whose processes looked no header up (they
    loaded no C++ kernel), one save older each time (``idle``, signed in the manifest, carried by the restore
    result); at ``pch.IDLE_SAVES`` saves in a row it is dropped with one note, and the next restore downloads
    nothing. A session that looks it up sets it back to 0."""
    store = RecordingStore()
    machine = tmp_path / "machine-a"
    first = _save(store, source, "run-0", machine, header_uses=[_checked(_header(machine))])
    assert first.headers.named == (NAME,) and first.headers.idle == {}

    def next_runner(run: int, *, look_up: bool = False) -> tuple[sync.RestoreResult, sync.SaveResult]:
        fresh = tmp_path / f"machine-{run}"
        restored = _restore(store, tmp_path / f"cache-{run}", fresh)
        uses = [_checked(fresh / NAME)] if look_up else []
        saved = _save(
            store, source, f"run-{run}", fresh, header_uses=uses, header_installed=restored.headers.named,
            header_idle=restored.headers.idle,
        )  # fmt: skip
        assert saved.outcome == "saved", saved.message
        return restored, saved

    for run in range(1, pch.IDLE_SAVES):
        restored, saved = next_runner(run)
        assert restored.headers.named == (NAME,) and restored.headers.idle == ({NAME: run - 1} if run > 1 else {})
        (artifact,) = _manifest(store, saved.key or "", tmp_path).artifacts
        assert (artifact.name, artifact.idle) == (NAME, run) and saved.headers.idle == {NAME: run}
        assert saved.headers.notes == ()
    # Carried across a process boundary (the xdist ticket, the Action's hand-off) in the result's one codec.
    decoded = sync.RestoreResult.decode(restored.encode())
    assert decoded is not None and decoded.headers.idle == {NAME: pch.IDLE_SAVES - 2}
    # The plugin's background install (a restoring xdist worker, a plain session) reports the same count.
    monkeypatch.setattr("pytest_compilecache.probe.check_headers_early", lambda names, directory=None: None)
    named = _manifest(store, saved.key or "", tmp_path).artifacts
    background = sync.HeaderInstall(store, PREFIX, named, tmp_path / "machine-background").finish()
    assert (background.transferred, background.idle) == ((NAME,), {NAME: pch.IDLE_SAVES - 1})

    restored, dropped = next_runner(pch.IDLE_SAVES)
    assert restored.headers.idle == {NAME: pch.IDLE_SAVES - 1}
    assert dropped.headers.named == () and _manifest(store, dropped.key or "", tmp_path).artifacts == ()
    (note,) = dropped.headers.notes
    assert NAME in note and f"no compile looked it up in {pch.IDLE_SAVES} saves in a row" in note
    store.gets.clear()
    after = _restore(store, tmp_path / "cache-after", tmp_path / "machine-after")
    assert after.headers.named == () and _artifact_key() not in store.gets  # no 21 MB download any more

    # Looked up once in between: back to 0, and it stays.
    store = RecordingStore()
    _save(store, source, "run-0", machine, header_uses=[_checked(machine / NAME)])
    for run in range(1, pch.IDLE_SAVES):
        next_runner(run)
    _, used = next_runner(pch.IDLE_SAVES, look_up=True)
    (artifact,) = _manifest(store, used.key or "", tmp_path).artifacts
    assert (artifact.name, artifact.idle, used.headers.idle) == (NAME, 0, {})
