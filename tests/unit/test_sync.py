"""sync.py: restore / save orchestration over an in-memory store and a fake torch loader. No torch here."""

from __future__ import annotations

import hashlib
import json
import os
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from pytest_compilecache import StoreError
from pytest_compilecache import bundle
from pytest_compilecache import container
from pytest_compilecache import sync
from pytest_compilecache.errors import TimedOut
from pytest_compilecache.fingerprint import Fingerprint
from pytest_compilecache.fingerprint import make_key
from pytest_compilecache.fingerprint import restore_prefix
from pytest_compilecache.manifest import FORMAT_VERSION
from pytest_compilecache.stores import LocalStore
from pytest_compilecache.stores import ReadOnlyStore
from pytest_compilecache.stores import Store
from pytest_compilecache.stores.timed import TimedStore
from tests.fakes import FakeLoader
from tests.fakes import MemoryStore
from tests.unit.conftest import A100
from tests.unit.conftest import BLOBS
from tests.unit.conftest import CACHE_FILES
from tests.unit.conftest import H100
from tests.unit.conftest import PREFIX
from tests.unit.conftest import tree
from tests.unit.conftest import write_tree


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    root = tmp_path / "cache"
    root.mkdir()
    (root / "already-here").write_bytes(b"from an earlier session")
    return root


pytestmark = pytest.mark.usefixtures("cache_env")


def _put_bundle(
    store: MemoryStore,
    tmp_path: Path,
    source: Path,
    fp: Fingerprint,
    suffix: str,
    *,
    signing_key: bytes | None = None,
    blobs: dict[str, bytes] = BLOBS,
    graphs: dict[str, Any] | None = None,
) -> str:
    key = make_key(PREFIX, fp.digest(), suffix)
    path = tmp_path / "packed" / f"{key}.bundle"
    path.parent.mkdir(exist_ok=True)
    bundle.pack(
        path,
        key=key,
        lineage=restore_prefix(PREFIX, fp.digest()),
        fingerprint=fp.to_json(),
        digest=fp.digest(),
        torch_version=fp.facts["torch"],
        blobs=blobs,
        cache_dir=source,
        files=list(CACHE_FILES),
        stats={"hits": 1},
        signing_key=signing_key,
        graphs=graphs,
    )
    store.put(key, path)
    return key


def _restore(store: Store, cache_dir: Path, fp: Fingerprint = H100, **kwargs: Any) -> sync.RestoreResult:
    kwargs.setdefault("load", FakeLoader())
    return sync.restore(store, prefix=PREFIX, fingerprint=fp, cache_dir=str(cache_dir), **kwargs)


# ------------------------------------------------------------------------------------------------ restore


def test_exact_restore(tmp_path: Path, source: Path, cache_dir: Path) -> None:
    store = MemoryStore()
    exact = _put_bundle(store, tmp_path, source, H100, "run-1")
    _put_bundle(store, tmp_path, source, H100, "run-2")  # newer, but the exact key wins
    loader = FakeLoader()
    transfer = _restore(store, cache_dir, exact_key=exact, load=loader)
    assert transfer.outcome == "exact"
    assert transfer.ok
    assert transfer.key == exact
    assert transfer.size == len(store.objects[exact][0])
    assert transfer.files == len(CACHE_FILES)
    assert transfer.artifacts == {"fx_graph": 4, "triton": 2}  # summed over both blobs
    assert loader.blobs == [BLOBS["controller"], BLOBS["gw0"]]  # sorted by name
    assert loader.cache_dirs == [str(cache_dir), str(cache_dir)]
    files = tree(cache_dir)
    assert {rel: files[rel] for rel in CACHE_FILES} == CACHE_FILES
    assert files["already-here"] == b"from an earlier session"


def test_partial_restore_takes_the_newest_for_this_fingerprint(tmp_path: Path, source: Path, cache_dir: Path) -> None:
    store = MemoryStore()
    _put_bundle(store, tmp_path, source, H100, "run-1")
    newest = _put_bundle(store, tmp_path, source, H100, "run-2")
    _put_bundle(store, tmp_path, source, A100, "run-3")  # newer still, but another fingerprint
    transfer = _restore(store, cache_dir, exact_key=make_key(PREFIX, H100.digest(), "run-9"))
    assert (transfer.outcome, transfer.key) == ("partial", newest)
    assert set(CACHE_FILES) <= set(tree(cache_dir))


def test_restore_without_exact_key_is_partial(tmp_path: Path, source: Path, cache_dir: Path) -> None:
    store = MemoryStore()
    key = _put_bundle(store, tmp_path, source, H100, "run-1")
    transfer = _restore(store, cache_dir)
    assert (transfer.outcome, transfer.key) == ("partial", key)


def test_second_restore_of_identical_files_writes_nothing_new(tmp_path: Path, source: Path, cache_dir: Path) -> None:
    store = MemoryStore()
    key = _put_bundle(store, tmp_path, source, H100, "run-1")
    assert _restore(store, cache_dir, exact_key=key).files == len(CACHE_FILES)
    again = _restore(store, cache_dir, exact_key=key)
    assert (again.outcome, again.files) == ("exact", 0)


def test_miss_in_an_empty_store(cache_dir: Path) -> None:
    before = tree(cache_dir)
    loader = FakeLoader()
    transfer = _restore(MemoryStore(), cache_dir, load=loader)
    assert transfer.outcome == "miss"
    assert transfer.ok and transfer.warning is None
    assert transfer.key is None
    assert transfer.message == f"no bundle under {PREFIX}- in memory://test"
    assert loader.blobs == []
    assert tree(cache_dir) == before


def test_miss_explains_how_the_newest_bundle_differs(tmp_path: Path, source: Path, cache_dir: Path) -> None:
    store = MemoryStore()
    _put_bundle(store, tmp_path, source, Fingerprint({**A100.facts, "torch": "2.12.0"}), "run-1")
    newest = _put_bundle(store, tmp_path, source, A100, "run-2")
    before = tree(cache_dir)
    transfer = _restore(store, cache_dir)
    assert transfer.outcome == "miss"
    assert transfer.message == (
        f"no bundle for fingerprint {H100.digest()}; newest is {newest}, which differs in: "
        "gpus: NVIDIA A100-SXM4-80GB (8.0, 108 SMs) -> NVIDIA H100 80GB HBM3 (9.0, 132 SMs)"
    )
    assert tree(cache_dir) == before


def test_miss_with_an_unreadable_newest_bundle(cache_dir: Path) -> None:
    store = MemoryStore()
    store.objects[make_key(PREFIX, A100.digest(), "run-1")] = (b"not a bundle", 1.0)
    transfer = _restore(store, cache_dir)
    assert transfer.outcome == "miss"
    assert "is unreadable: not a pytest-compilecache bundle" in transfer.message


@pytest.mark.parametrize("use_exact_key", [True, False])
def test_store_error_is_one_line_and_writes_nothing(
    tmp_path: Path, source: Path, cache_dir: Path, use_exact_key: bool
) -> None:
    store = MemoryStore()
    key = _put_bundle(store, tmp_path, source, H100, "run-1")
    store.fail.add("list")
    before = tree(cache_dir)
    loader = FakeLoader()
    transfer = _restore(store, cache_dir, exact_key=key if use_exact_key else None, load=loader)
    assert "list" in store.calls
    assert transfer.outcome == "error"
    assert not transfer.ok
    assert transfer.message == "restore failed: cannot list at memory://test: connection reset"
    assert "\n" not in transfer.message
    assert tree(cache_dir) == before
    assert sorted(p.name for p in cache_dir.iterdir()) == ["already-here"]
    assert loader.blobs == []


class Unreadable(MemoryStore):
    """Objects whose keys are in ``broken`` fail at ``get`` (a link in a directory store, a per-object S3
    error); the rest of the store works."""

    def __init__(self, error: type[StoreError] = StoreError) -> None:
        super().__init__()
        self.broken: set[str] = set()
        self.error = error

    def get(self, key: str, dest: Path, *, limit: int | None = None) -> bool:
        if key in self.broken:
            self.calls.append("get")
            raise self.error(f"cannot get {key} from {self.location}: Permission denied")
        return super().get(key, dest, limit=limit)


@pytest.mark.parametrize("use_exact_key", [True, False])
def test_an_unreadable_newest_object_falls_back_to_the_next(
    tmp_path: Path, source: Path, cache_dir: Path, use_exact_key: bool
) -> None:
    # Issue 28.3: the newest object failing at get() made the restore an error (and the session skip its
    # save), so one unreadable object kept every later session cold. It is skipped like a bad bundle.
    store = Unreadable()
    older = _put_bundle(store, tmp_path, source, H100, "run-1")
    newest = _put_bundle(store, tmp_path, source, H100, "run-2")
    store.broken.add(newest)
    transfer = _restore(store, cache_dir, exact_key=newest if use_exact_key else None)
    assert (transfer.outcome, transfer.key) == ("partial", older)
    assert transfer.skipped == ((newest, f"cannot be read: cannot get {newest} from memory://test: Permission denied"),)
    assert transfer.warning is not None and "could not be read" in transfer.warning
    assert {rel: tree(cache_dir)[rel] for rel in CACHE_FILES} == CACHE_FILES


def test_only_unreadable_objects_are_a_miss_not_an_error(tmp_path: Path, source: Path, cache_dir: Path) -> None:
    store = Unreadable()
    key = _put_bundle(store, tmp_path, source, H100, "run-1")
    store.broken.add(key)
    before = tree(cache_dir)
    transfer = _restore(store, cache_dir)
    assert transfer.outcome == "miss" and transfer.ok
    assert [k for k, _ in transfer.skipped] == [key]
    assert tree(cache_dir) == before


def test_a_store_out_of_time_at_get_is_still_an_error(tmp_path: Path, source: Path, cache_dir: Path) -> None:
    # A spent budget is the store stalling, not one bad object: no other candidate could be fetched either.
    store = Unreadable(error=TimedOut)
    older = _put_bundle(store, tmp_path, source, H100, "run-1")
    newest = _put_bundle(store, tmp_path, source, H100, "run-2")
    store.broken |= {older, newest}
    transfer = _restore(store, cache_dir)
    assert transfer.outcome == "error"
    assert store.calls.count("get") == 1


def test_a_symlink_in_a_directory_store_is_skipped(tmp_path: Path, source: Path, cache_dir: Path) -> None:
    directory = tmp_path / "store"
    store = LocalStore(directory)
    memory = MemoryStore()
    older = _put_bundle(memory, tmp_path, source, H100, "run-1")
    store.put(older, tmp_path / "packed" / f"{older}.bundle")
    linked = _put_bundle(memory, tmp_path, source, H100, "run-2")
    (directory / f"{linked}.bundle").symlink_to(tmp_path / "packed" / f"{linked}.bundle")
    os.utime(directory / f"{older}.bundle", (1_700_000_000, 1_700_000_000))  # the link is the newest
    # Not listed (a link is no stored object), so it takes none of the restore's candidates; read, it is refused.
    assert [entry.key for entry in store.list(PREFIX)] == [older]
    transfer = sync.restore(store, prefix=PREFIX, fingerprint=H100, cache_dir=str(cache_dir), load=FakeLoader())
    assert (transfer.outcome, transfer.key, transfer.skipped) == ("partial", older, ())
    with pytest.raises(StoreError, match="a symlink, not a stored object"):
        store.get(linked, tmp_path / "read.bundle")


def test_store_error_leaves_a_missing_cache_dir_missing(tmp_path: Path) -> None:
    cache_dir = tmp_path / "not-yet"
    transfer = _restore(MemoryStore(fail=("list",)), cache_dir)
    assert transfer.outcome == "error"
    assert not cache_dir.exists()


def test_a_bundle_whose_blobs_torch_rejects_is_skipped_and_leaves_nothing(
    tmp_path: Path, source: Path, cache_dir: Path
) -> None:
    # A bundle that verifies but whose blob torch cannot load (another torch build, a forged unsigned bundle)
    # is refused like one that fails verification: its files are taken back out, the older bundle restores.
    store = MemoryStore()
    older = _put_bundle(store, tmp_path, source, H100, "run-1")
    forged = write_tree(tmp_path / "forged-cache", {**{rel: data + b" forged" for rel, data in CACHE_FILES.items()},
                                                     "fxgraph/zz/only-in-forged": b"x"})  # fmt: skip
    bad_blobs = {"controller": b"not a mega-cache", "gw0": BLOBS["gw0"]}
    newer = _put_bundle(store, tmp_path, forged, H100, "run-2", blobs=bad_blobs)
    (cache_dir / "ab").mkdir()
    (cache_dir / "ab" / "cabc.main.so").write_bytes(b"an older kernel")  # replaced, then put back
    before = tree(cache_dir)
    loader = FakeLoader(error=ValueError("bad pickle\nsecond line"), rejects=b"not a mega-cache")

    transfer = _restore(store, cache_dir, load=loader)

    assert (transfer.outcome, transfer.key) == ("partial", older)
    assert [key for key, _ in transfer.skipped] == [newer]
    assert transfer.skipped[0][1].startswith("torch rejected the cache artifacts of controller: ValueError: bad pickle")
    lock = {".compilecache.lock": b""}  # the restore's lock, which every install takes
    assert tree(cache_dir) == {**before, **CACHE_FILES, **lock}  # nothing of the rejected bundle is left
    assert not (cache_dir / "fxgraph" / "zz").exists()

    # The only bundle rejected: a miss that names it, and the cache dir exactly as it was.
    store = MemoryStore()
    key = _put_bundle(store, tmp_path, forged, H100, "run-3", blobs=bad_blobs)
    before = tree(cache_dir)
    transfer = _restore(store, cache_dir, exact_key=key, load=loader)
    assert transfer.outcome == "miss" and [k for k, _ in transfer.skipped] == [key], transfer
    assert transfer.artifacts == {}
    assert tree(cache_dir) == before and not (cache_dir / "fxgraph" / "zz").exists()


def test_signature_is_checked_on_restore(tmp_path: Path, source: Path, cache_dir: Path) -> None:
    store = MemoryStore()
    key = _put_bundle(store, tmp_path, source, H100, "run-1", signing_key=b"the right key")
    loader = FakeLoader()
    transfer = _restore(store, cache_dir, exact_key=key, signing_key=b"a wrong key", load=loader)
    # A bad bundle is the store's content, not infrastructure trouble: a miss that names what was skipped.
    assert transfer.outcome == "miss"
    assert [k for k, _ in transfer.skipped] == [key]
    assert "signature mismatch" in transfer.skipped[0][1]
    assert "signature mismatch" in transfer.message
    assert loader.blobs == []
    assert not any(rel in tree(cache_dir) for rel in CACHE_FILES)  # verified before anything is written
    good = _restore(store, cache_dir, exact_key=key, signing_key=b"the right key")
    assert good.outcome == "exact"


def test_tampered_bundle_is_an_error_and_writes_no_cache_files(tmp_path: Path, source: Path, cache_dir: Path) -> None:
    store = MemoryStore()
    key = _put_bundle(store, tmp_path, source, H100, "run-1")
    data, when = store.objects[key]
    store.objects[key] = (data[:-1] + bytes([data[-1] ^ 0xFF]), when)
    before = tree(cache_dir)
    transfer = _restore(store, cache_dir, exact_key=key)
    assert transfer.outcome == "miss"
    assert "checksum mismatch" in transfer.message
    assert transfer.skipped == ((key, "bundle payload checksum mismatch"),)
    assert tree(cache_dir) == before
    assert sorted(p.name for p in cache_dir.iterdir()) == ["already-here"]  # no staging dir left


# ------------------------------------------------------------------ staged blobs (the Action's restore step)


def _staged(cache_dir: Path) -> dict[str, bytes]:
    return {rel: data for rel, data in tree(cache_dir).items() if rel.startswith(".compilecache-pending/")}


def test_staging_restore_installs_the_blobs_for_a_later_process_and_loads_nothing(
    tmp_path: Path, source: Path, cache_dir: Path
) -> None:
    store = MemoryStore()
    key = _put_bundle(store, tmp_path, source, H100, "run-1")
    loader = FakeLoader()
    transfer = _restore(store, cache_dir, exact_key=key, load=loader, stage_blobs=True)
    assert (transfer.outcome, transfer.files, transfer.artifacts) == ("exact", len(CACHE_FILES), {})
    assert loader.blobs == []  # no torch in this process
    digests = {name: hashlib.sha256(data).hexdigest() for name, data in BLOBS.items()}
    assert transfer.staged == tuple(sync.StagedBlob(name, len(BLOBS[name]), digests[name]) for name in sorted(BLOBS))
    assert _staged(cache_dir) == {bundle.pending_path(digests[name]): data for name, data in BLOBS.items()}
    files = tree(cache_dir)
    assert {rel: files[rel] for rel in CACHE_FILES} == CACHE_FILES

    # The process that runs the tests loads them, with the cache dir pointed at, and removes them.
    later = FakeLoader()
    loaded = sync.load_staged(transfer, str(cache_dir), load=later)
    assert (loaded.outcome, loaded.artifacts, loaded.key) == ("exact", {"fx_graph": 4, "triton": 2}, key)
    assert later.blobs == [BLOBS["controller"], BLOBS["gw0"]]
    assert later.cache_dirs == [str(cache_dir), str(cache_dir)]
    assert _staged(cache_dir) == {} and not (cache_dir / ".compilecache-pending").exists()

    # A second session of the same job finds nothing left to load: a note, not an error.
    again = sync.load_staged(transfer, str(cache_dir), load=FakeLoader())
    assert again.outcome == "exact" and again.artifacts == {}
    assert "not in" in again.message and again.warning is None


def test_staged_blobs_partly_missing_are_loaded_and_the_rest_named(
    tmp_path: Path, source: Path, cache_dir: Path
) -> None:
    transfer = _restore(store_with(MemoryStore(), tmp_path, source), cache_dir, stage_blobs=True)
    gone = transfer.staged[1]
    (cache_dir / bundle.pending_path(gone.sha256)).unlink()
    loader = FakeLoader()
    loaded = sync.load_staged(transfer, str(cache_dir), load=loader)
    assert loaded.outcome == "partial" and loader.blobs == [BLOBS[transfer.staged[0].name]]
    assert loaded.message == f"staged blob(s) {gone.name} not found in {cache_dir}: their graphs compile cold"


def test_a_note_about_the_cache_dir_is_one_inert_line(tmp_path: Path, source: Path) -> None:
    odd = tmp_path / "##[error]cache"
    transfer = _restore(store_with(MemoryStore(), tmp_path, source), odd, stage_blobs=True)
    elsewhere = tmp_path / "other\n::error::x"
    elsewhere.mkdir()
    loaded = sync.load_staged(transfer, str(elsewhere), load=FakeLoader())
    assert "\n" not in loaded.message and "##[" not in loaded.message.replace("##\\[", "")
    assert "nothing to load" in loaded.message


def test_staged_blob_that_changed_is_never_loaded(tmp_path: Path, source: Path, cache_dir: Path) -> None:
    store = MemoryStore()
    transfer = _restore(store_with(store, tmp_path, source), cache_dir, stage_blobs=True)
    victim = transfer.staged[0]
    (cache_dir / bundle.pending_path(victim.sha256)).write_bytes(b"x" * victim.size)  # same size, other bytes
    loader = FakeLoader()
    loaded = sync.load_staged(transfer, str(cache_dir), load=loader)
    assert loaded.outcome == "error" and not loaded.ok
    assert (
        loaded.warning == f"restored bundle not loaded: staged blob {victim.name} changed since the restore verified it"
    )
    assert loader.blobs == []  # checked before torch saw a byte
    assert _staged(cache_dir) == {}  # used once, loaded or not


def test_staged_blob_behind_a_symlink_is_refused(tmp_path: Path, source: Path, cache_dir: Path) -> None:
    transfer = _restore(store_with(MemoryStore(), tmp_path, source), cache_dir, stage_blobs=True)
    victim = transfer.staged[0]
    outside = tmp_path / "outside.bin"
    outside.write_bytes(BLOBS[victim.name])  # even the right bytes: a link is never followed
    staged = cache_dir / bundle.pending_path(victim.sha256)
    staged.unlink()
    staged.symlink_to(outside)
    loader = FakeLoader()
    loaded = sync.load_staged(transfer, str(cache_dir), load=loader)
    assert loaded.outcome == "error" and "symlink" in loaded.message
    assert loader.blobs == []
    assert outside.read_bytes() == BLOBS[victim.name]
    assert staged.is_symlink()  # not ours to remove: only regular files a restore staged are


def test_torch_rejecting_staged_blobs_is_an_error_outcome(tmp_path: Path, source: Path, cache_dir: Path) -> None:
    transfer = _restore(store_with(MemoryStore(), tmp_path, source), cache_dir, stage_blobs=True)
    loaded = sync.load_staged(transfer, str(cache_dir), load=FakeLoader(error=ValueError("bad pickle")))
    assert loaded.outcome == "error"
    assert (
        loaded.message
        == "restored bundle not loaded: torch rejected the cache artifacts of controller: ValueError: bad pickle"
    )
    assert _staged(cache_dir) == {}


def test_staging_restore_removes_only_old_staged_blobs(tmp_path: Path, source: Path, cache_dir: Path) -> None:
    pending = cache_dir / ".compilecache-pending"
    pending.mkdir()
    old, recent, foreign = pending / ("a" * 64 + ".bin"), pending / ("b" * 64 + ".bin"), pending / "notes.txt"
    for path in (old, recent, foreign):
        path.write_bytes(b"left behind")
    stale = time.time() - sync.STAGED_MAX_AGE - 60
    os.utime(old, (stale, stale))
    os.utime(foreign, (stale, stale))
    transfer = _restore(store_with(MemoryStore(), tmp_path, source), cache_dir, stage_blobs=True)
    assert transfer.outcome == "partial"
    assert not old.exists()  # a job whose tests never ran left it
    assert recent.exists() and foreign.exists()  # another job's, and not a name a restore stages


def test_bundle_files_under_the_plugins_own_names_are_refused(tmp_path: Path, cache_dir: Path) -> None:
    # In any case: on a file system that ignores case (macOS, Windows) ``CacheDir.TAG`` is the tag and
    # ``.COMPILECACHE.LOCK`` the lock.
    source = tmp_path / "hostile-source"
    (source / ".compilecache-pending").mkdir(parents=True)
    planted = ".compilecache-pending/" + "c" * 64 + ".bin"
    (source / planted).write_bytes(b"planted")
    for name in ("CACHEDIR.TAG", "CacheDir.TAG", ".COMPILECACHE.LOCK", ".CompileCache-Graphs.json"):
        (source / name).write_text("Signature: 8a477f597d28d172789f06886806bc55\n")
    before = tree(cache_dir)
    for index, rel in enumerate(
        (planted, "CACHEDIR.TAG", "CacheDir.TAG", ".COMPILECACHE.LOCK", ".CompileCache-Graphs.json")
    ):
        key = make_key(PREFIX, H100.digest(), f"run-{index}")
        path = tmp_path / f"{index}.bundle"
        bundle.pack(
            path, key=key, lineage=restore_prefix(PREFIX, H100.digest()), fingerprint=H100.to_json(),
            digest=H100.digest(), torch_version="2.13.0", blobs=BLOBS, cache_dir=source, files=[rel], stats={},
        )  # fmt: skip
        store = MemoryStore()
        store.put(key, path)
        transfer = _restore(store, cache_dir, stage_blobs=True)
        assert transfer.outcome == "miss" and len(transfer.skipped) == 1, (rel, transfer)
        assert "the plugin's own name" in transfer.skipped[0][1], rel
    assert {rel: data for rel, data in tree(cache_dir).items() if rel != ".compilecache.lock"} == before


def store_with(store: MemoryStore, tmp_path: Path, source: Path) -> MemoryStore:
    _put_bundle(store, tmp_path, source, H100, "run-1")
    return store


def test_transfer_json() -> None:
    transfer = sync.SaveResult("saved", key="k", size=3, seconds=0.123456, files=2, artifacts={"fx_graph": 1})
    data = json.loads(json.dumps(transfer.to_json()))
    assert data == {
        "outcome": "saved",
        "key": "k",
        "size": 3,
        "seconds": 0.123,
        "message": "",
        "files": 2,
        "artifacts": {"fx_graph": 1},
        "skipped": [],
        "headers": {"named": 0, "transferred": 0, "size": 0, "seconds": 0.0, "warnings": []},
    }


# --------------------------------------------------------------------------------------------------- save


def _save(store: Any, source: Path, suffix: str, **kwargs: Any) -> sync.SaveResult:
    arguments: dict[str, Any] = {
        "prefix": PREFIX,
        "fingerprint": H100,
        "suffix": suffix,
        "cache_dir": str(source),
        "blobs": BLOBS,
        "files": list(CACHE_FILES),
        "stats": {"hits": 3},
    }
    arguments.update(kwargs)
    return sync.save(store, **arguments)


def test_save_then_restore_round_trip(tmp_path: Path, source: Path) -> None:
    store = MemoryStore()
    transfer = _save(store, source, "run-1")
    key = make_key(PREFIX, H100.digest(), "run-1")
    assert (transfer.outcome, transfer.key, transfer.files) == ("saved", key, len(CACHE_FILES))
    assert transfer.size == len(store.objects[key][0])
    stored = tmp_path / "stored.bundle"
    stored.write_bytes(store.objects[key][0])
    manifest = bundle.verify(stored, fingerprint=H100.to_json()).manifest
    assert manifest.lineage == restore_prefix(PREFIX, H100.digest())
    assert (manifest.key, manifest.digest, manifest.torch_version) == (key, H100.digest(), "2.13.0")
    assert manifest.stats == {"hits": 3}
    fresh = tmp_path / "fresh"
    loader = FakeLoader()
    restored = _restore(store, fresh, exact_key=key, load=loader)
    assert restored.outcome == "exact"
    assert {rel: data for rel, data in tree(fresh).items() if rel in CACHE_FILES} == CACHE_FILES
    assert loader.blobs == [BLOBS["controller"], BLOBS["gw0"]]


def test_restore_returns_the_bundles_graph_record_only_after_verification(tmp_path: Path, source: Path) -> None:
    store = MemoryStore()
    graphs = {"format": 1, "tests": {"t.py::test_a": [{"k": "fkey", "o": "miss", "c": {"gm": "abc"}}]}}
    _save(store, source, "run-1", graphs=graphs)
    restored = _restore(store, tmp_path / "fresh", load=FakeLoader())
    assert restored.outcome == "partial" and restored.graphs == graphs
    assert "graphs" not in restored.to_json()  # the report says what was restored, not the record
    _save(store, source, "run-2")  # newer, without a record
    assert _restore(store, tmp_path / "again", load=FakeLoader()).graphs is None
    key = make_key(PREFIX, H100.digest(), "run-3")
    _save(store, source, "run-3", graphs=graphs)
    data, when = store.objects[key]
    store.objects[key] = (data[:-1] + bytes([data[-1] ^ 0xFF]), when)  # tampered: refused with its record
    refused = _restore(store, tmp_path / "third", load=FakeLoader())
    assert refused.skipped[0][0] == key and refused.graphs is None  # run-2 restored, which has none


def test_save_prunes_to_keep_for_this_fingerprint_only(tmp_path: Path, source: Path) -> None:
    store = MemoryStore()
    other = _put_bundle(store, tmp_path, source, A100, "run-0")
    for run in range(1, 5):
        assert _save(store, source, f"run-{run}", keep=2).outcome == "saved"
    mine = [entry.key for entry in store.list(restore_prefix(PREFIX, H100.digest()))]
    assert mine == [make_key(PREFIX, H100.digest(), "run-4"), make_key(PREFIX, H100.digest(), "run-3")]
    assert other in store.objects


def test_projects_that_sign_with_their_own_keys_never_prune_each_others_bundles(source: Path) -> None:
    """Two repositories sharing a store, the default key prefix and a fingerprint: each save prunes only the
    bundles signed with its own key (an unsigned one, or another key's, is not proven ours)."""
    store = MemoryStore()
    for run in range(3):
        assert _save(store, source, f"a-{run}", keep=3, signing_key=b"project A").outcome == "saved"
    for run in range(3):
        assert _save(store, source, f"b-{run}", keep=2, signing_key=b"project B").outcome == "saved"
    left = sorted(key.rsplit("-", 2)[-2] + "-" + key.rsplit("-", 1)[-1] for key in store.objects)
    assert left == ["a-0", "a-1", "a-2", "b-1", "b-2"]


def test_save_with_nothing_compiled_is_skipped(source: Path) -> None:
    store = MemoryStore()
    transfer = _save(store, source, "run-1", blobs={}, files=[])
    assert transfer.outcome == "skipped"
    assert transfer.message == "nothing was compiled"
    assert store.objects == {}
    assert store.calls == []


@pytest.mark.parametrize("operation", ["put"])
def test_save_store_error_is_one_line(source: Path, operation: str) -> None:
    store = MemoryStore(fail=(operation,))
    transfer = _save(store, source, "run-1")
    assert transfer.outcome == "error"
    assert transfer.key == make_key(PREFIX, H100.digest(), "run-1")
    assert transfer.message == f"save failed: cannot {operation} at memory://test: connection reset"


def test_save_skips_files_torch_deleted_meanwhile(tmp_path: Path, source: Path) -> None:
    store = MemoryStore()
    transfer = _save(store, source, "run-1", files=[*CACHE_FILES, "fxgraph/zz/vanished"])
    assert transfer.outcome == "saved"
    stored = tmp_path / "stored.bundle"
    stored.write_bytes(store.objects[str(transfer.key)][0])
    assert bundle.read_manifest(stored).file_paths == tuple(sorted(CACHE_FILES))


def test_save_from_a_missing_cache_dir_is_an_error(tmp_path: Path) -> None:
    store = MemoryStore()
    transfer = _save(store, tmp_path / "gone", "run-1")
    assert transfer.outcome == "error"
    assert transfer.message.startswith("save failed: cannot read cache dir ")
    assert "\n" not in transfer.message
    assert store.objects == {}


def test_save_to_a_read_only_store_is_an_error(source: Path) -> None:
    inner = MemoryStore()
    transfer = _save(ReadOnlyStore(inner), source, "run-1")
    assert transfer.outcome == "error"
    assert transfer.message.startswith("save failed: store is read-only: cannot put ")
    assert inner.objects == {}


# ------------------------------------------------------------------------ lineage, fallback, bad bundles


def test_a_bundle_signed_for_one_shard_is_refused_under_another_shards_key(
    tmp_path: Path, source: Path, cache_dir: Path
) -> None:
    store = MemoryStore()
    shard0 = _put_bundle(store, tmp_path, source, H100, "run-1", signing_key=b"key")
    shard1_key = make_key(PREFIX + "-shard1", H100.digest(), "run-1")
    store.objects[shard1_key] = store.objects.pop(shard0)  # copied by someone who can write the store
    before = tree(cache_dir)
    transfer = sync.restore(
        store,
        prefix=PREFIX + "-shard1",
        fingerprint=H100,
        cache_dir=str(cache_dir),
        signing_key=b"key",
        load=FakeLoader(),
    )
    assert transfer.outcome == "miss"
    assert transfer.skipped == (
        (shard1_key, f"bundle was saved as {shard0!r}, not as {shard1_key!r} (copied under another key?)"),
    )
    assert tree(cache_dir) == before


def test_restore_falls_back_past_bad_newer_bundles(tmp_path: Path, source: Path, cache_dir: Path) -> None:
    store = MemoryStore()
    good = _put_bundle(store, tmp_path, source, H100, "run-1", signing_key=b"key")
    unsigned = _put_bundle(store, tmp_path, source, H100, "run-2")  # newer, but not signed
    garbage = make_key(PREFIX, H100.digest(), "run-3")
    store.put(garbage, _write(tmp_path / "garbage", b"not a bundle"))
    loader = FakeLoader()
    transfer = _restore(store, cache_dir, signing_key=b"key", load=loader)
    assert (transfer.outcome, transfer.key) == ("partial", good)
    assert [key for key, _ in transfer.skipped] == [garbage, unsigned]
    assert "bad magic" in transfer.skipped[0][1] and "signature missing" in transfer.skipped[1][1]
    assert transfer.to_json()["skipped"] == [{"key": k, "reason": r} for k, r in transfer.skipped]
    assert transfer.warning is not None and transfer.warning.startswith("restore skipped 2 bundle(s) that failed ")
    assert loader.blobs == [BLOBS["controller"], BLOBS["gw0"]]
    assert {rel: tree(cache_dir)[rel] for rel in CACHE_FILES} == CACHE_FILES


def test_exact_key_that_fails_falls_back_to_partial(tmp_path: Path, source: Path, cache_dir: Path) -> None:
    store = MemoryStore()
    older = _put_bundle(store, tmp_path, source, H100, "run-1")
    exact = _put_bundle(store, tmp_path, source, H100, "run-2")
    data, when = store.objects[exact]
    store.objects[exact] = (data[:-5], when)
    transfer = _restore(store, cache_dir, exact_key=exact)
    assert (transfer.outcome, transfer.key) == ("partial", older)
    assert transfer.skipped == ((exact, "bundle is truncated"),)


def test_restore_tries_at_most_three_candidates(tmp_path: Path, source: Path, cache_dir: Path) -> None:
    store = MemoryStore()
    _put_bundle(store, tmp_path, source, H100, "run-0")  # good, but behind three bad ones
    for run in range(1, 5):  # a sound header (read first, to order them), a damaged payload
        key = _put_bundle(store, tmp_path, source, H100, f"run-{run}")
        store.objects[key] = (store.objects[key][0][:-5], store.objects[key][1])
    transfer = _restore(store, cache_dir)
    assert transfer.outcome == "miss"
    assert [key for key, _ in transfer.skipped] == [make_key(PREFIX, H100.digest(), f"run-{r}") for r in (4, 3, 2)]
    assert store.calls.count("get") == 3
    assert transfer.message.startswith(f"no usable bundle for fingerprint {H100.digest()}; skipped ")
    assert "\n" not in transfer.message


class _Clock:
    """Stands in for ``datetime`` in bundle.py: ``pack`` stamps ``created`` with ``now``."""

    def __init__(self, when: str) -> None:
        self.when = datetime.fromisoformat(when)

    def now(self, tz: Any = None) -> datetime:
        return self.when


def test_a_pruned_signed_bundle_put_back_does_not_restore_as_the_newest(
    tmp_path: Path, source: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 28.9: candidates were ordered by the store's modification time, so an older signed bundle of the
    # lineage, pruned and then put back by anyone who can write the store, restored as the newest.
    store = MemoryStore()
    monkeypatch.setattr(bundle, "datetime", _Clock("2026-11-01T10:00:00+00:00"))
    old = _put_bundle(store, tmp_path, source, H100, "run-1", signing_key=b"key")
    replay = store.objects[old][0]
    monkeypatch.setattr(bundle, "datetime", _Clock("2026-11-02T10:00:00+00:00"))
    new = _put_bundle(store, tmp_path, source, H100, "run-2", signing_key=b"key")
    store.delete(old)  # pruned
    store.put(old, _write(tmp_path / "replayed", replay))  # and put back: now the newest by store time
    assert [entry.key for entry in store.list()][:2] == [old, new]
    transfer = _restore(store, cache_dir, signing_key=b"key")
    assert (transfer.outcome, transfer.key, transfer.skipped) == ("partial", new, ())
    # The newest by its signed time wins whatever the keys say; equal times keep the store's order.
    monkeypatch.setattr(bundle, "datetime", _Clock("2026-11-02T10:00:00"))  # no zone: UTC, as pack writes
    same = _put_bundle(store, tmp_path, source, H100, "run-0", signing_key=b"key")
    assert _restore(store, cache_dir, signing_key=b"key").key == same


def test_an_exact_hit_reads_no_other_header(tmp_path: Path, source: Path, cache_dir: Path) -> None:
    store = MemoryStore()
    exact = _put_bundle(store, tmp_path, source, H100, "run-1")
    _put_bundle(store, tmp_path, source, H100, "run-2")
    assert _restore(store, cache_dir, exact_key=exact).outcome == "exact"
    assert "get_head" not in store.calls  # ordering the lineage is for when the exact key is absent or fails


def test_a_bad_header_is_skipped_without_downloading_the_bundle(tmp_path: Path, source: Path, cache_dir: Path) -> None:
    store = MemoryStore()
    good = _put_bundle(store, tmp_path, source, H100, "run-1", signing_key=b"key")
    unsigned = _put_bundle(store, tmp_path, source, H100, "run-2")
    transfer = _restore(store, cache_dir, signing_key=b"key")
    assert (transfer.outcome, transfer.key) == ("partial", good)
    assert transfer.skipped == ((unsigned, "bundle signature missing (PYTEST_COMPILECACHE_SIGNING_KEY is set)"),)
    assert store.calls.count("get") == 1  # the good one only


def test_a_malformed_newest_object_alone_is_a_miss_not_an_error(cache_dir: Path) -> None:
    store = MemoryStore()
    key = make_key(PREFIX, H100.digest(), "run-1")
    store.objects[key] = (b"PTCCBNDL" + FORMAT_VERSION.to_bytes(4, "big") + b"\xff" * 10, 1.0)
    transfer = _restore(store, cache_dir)
    assert transfer.outcome == "miss" and transfer.ok
    assert transfer.skipped == ((key, "bundle manifest length 4294967295 is out of range"),)


def test_bundles_over_max_bytes_are_skipped_without_download(tmp_path: Path, source: Path, cache_dir: Path) -> None:
    store = MemoryStore()
    key = _put_bundle(store, tmp_path, source, H100, "run-1")
    transfer = _restore(store, cache_dir, max_bytes=100)
    assert transfer.outcome == "miss"
    assert transfer.skipped == (
        (key, f"bundle is {len(store.objects[key][0])} bytes, more than the limit of 100 bytes"),
    )
    assert "get" not in store.calls


def test_a_bundle_that_grew_after_it_was_listed_is_skipped_and_an_older_one_restored(
    tmp_path: Path, source: Path, cache_dir: Path
) -> None:
    class Racing(MemoryStore):
        """Lists the newest bundle as it was; by the time it is fetched, someone replaced it with 1 MiB."""

        def get(self, key: str, dest: Path, *, limit: int | None = None) -> bool:
            if key == newer:
                self.objects[newer] = (b"\0" * (1 << 20), self.objects[newer][1])
            return super().get(key, dest, limit=limit)

    store = Racing()
    older = _put_bundle(store, tmp_path, source, H100, "run-1")
    newer = _put_bundle(store, tmp_path, source, H100, "run-2")
    listed = {entry.key: entry.size for entry in MemoryStore.list(store)}
    loader = FakeLoader()
    # the default size limit (2 GiB) is far over what the newer one became: the size it was listed with bounds it
    transfer = _restore(store, cache_dir, load=loader)
    assert (transfer.outcome, transfer.key) == ("partial", older)
    assert transfer.skipped == ((newer, f"bundle is more than the {listed[newer]} bytes it was listed with"),)
    assert loader.blobs  # the older bundle's artifacts went to torch


def test_an_old_format_bundle_is_a_cold_start(tmp_path: Path, cache_dir: Path) -> None:
    store = MemoryStore()
    key = make_key(PREFIX, H100.digest(), "run-1")
    store.objects[key] = (b"PTCCBNDL" + (1).to_bytes(4, "big") + b"\x00" * 64, 1.0)
    transfer = _restore(store, cache_dir)
    assert transfer.outcome == "miss"
    assert "bundle format 1 is not supported" in transfer.skipped[0][1]


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


# ------------------------------------------------------------------------ miss explanations (issue 9.3)

INJECTED = {**A100.facts, "gpus": "x\n::error title=Injected::owned"}


def test_miss_explanation_reads_only_the_header(tmp_path: Path, source: Path, cache_dir: Path) -> None:
    store = MemoryStore()
    newest = _put_bundle(store, tmp_path, source, A100, "run-1")
    data, when = store.objects[newest]
    store.objects[newest] = (data[:-200], when)  # the payload is damaged: the header alone must do
    transfer = _restore(store, cache_dir)
    assert transfer.outcome == "miss"
    gpus = "gpus: NVIDIA A100-SXM4-80GB (8.0, 108 SMs) -> NVIDIA H100 80GB HBM3 (9.0, 132 SMs)"
    assert f"which differs in: {gpus}" in transfer.message


def test_miss_explanation_uses_no_unauthenticated_text(tmp_path: Path, source: Path, cache_dir: Path) -> None:
    store = MemoryStore()
    newest = _put_bundle(store, tmp_path, source, Fingerprint(INJECTED), "run-1")  # unsigned
    transfer = _restore(store, cache_dir, signing_key=b"key")
    assert transfer.outcome == "miss"
    assert transfer.message == (
        f"no bundle for fingerprint {H100.digest()}; newest {newest} is unreadable: "
        "bundle signature missing (PYTEST_COMPILECACHE_SIGNING_KEY is set)"
    )
    assert "Injected" not in transfer.message


def test_miss_explanation_is_one_line_even_with_hostile_facts(tmp_path: Path, source: Path, cache_dir: Path) -> None:
    store = MemoryStore()
    _put_bundle(store, tmp_path, source, Fingerprint(INJECTED), "run-1", signing_key=b"key")
    transfer = _restore(store, cache_dir, signing_key=b"key")
    assert transfer.outcome == "miss"
    assert "\n" not in transfer.message and "x\\n::error" in transfer.message


def test_miss_explanation_checks_the_key_the_bundle_was_saved_as(tmp_path: Path, source: Path, cache_dir: Path) -> None:
    store = MemoryStore()
    original = _put_bundle(store, tmp_path, source, A100, "run-1")
    moved = make_key(PREFIX, A100.digest(), "run-2")
    store.objects[moved] = store.objects.pop(original)
    transfer = _restore(store, cache_dir)
    assert transfer.outcome == "miss"
    assert f"newest {moved} is unreadable: bundle was saved as {original!r}" in transfer.message


class Counting(MemoryStore):
    """Counts the object bytes each read hands back, as a network would carry them."""

    def __init__(self) -> None:
        super().__init__()
        self.carried = 0

    def get(self, key: str, dest: Path, *, limit: int | None = None) -> bool:
        found = super().get(key, dest, limit=limit)
        self.carried += Path(dest).stat().st_size if found else 0
        return found

    def get_head(self, key: str, limit: int) -> bytes | None:
        data = super().get_head(key, limit)
        self.carried += len(data or b"")
        return data


def test_miss_explanation_reads_the_header_not_the_bundle(tmp_path: Path, source: Path, cache_dir: Path) -> None:
    # Issue 28.8: the whole newest bundle of another fingerprint was downloaded (300 MiB measured) to read its
    # header, spending the store budget the session's own save needed. A ranged read of the header now.
    store = Counting()
    newest = _put_bundle(store, tmp_path, source, A100, "run-1", blobs={"controller": os.urandom(4 << 20)})
    transfer = _restore(store, cache_dir)
    assert transfer.outcome == "miss"
    assert (
        "which differs in: gpus: NVIDIA A100-SXM4-80GB (8.0, 108 SMs) -> NVIDIA H100 80GB HBM3 (9.0, 132 SMs)"
        in transfer.message
    )
    assert "get" not in store.calls and store.calls.count("get_head") == 1
    assert store.carried == container.HEAD_PROBE < len(store.objects[newest][0]) // 60


def test_a_header_bigger_than_the_first_read_takes_one_more(tmp_path: Path, source: Path, cache_dir: Path) -> None:
    store = Counting()
    graphs = {"format": 1, "pad": "x" * (3 * container.HEAD_PROBE)}  # a big graphs record: a big header
    newest = _put_bundle(store, tmp_path, source, A100, "run-1", signing_key=b"key", graphs=graphs)
    transfer = _restore(store, cache_dir, signing_key=b"key")
    assert "which differs in: gpus: " in transfer.message, transfer.message
    assert store.calls.count("get_head") == 2 and "get" not in store.calls
    header = container.header_size(store.objects[newest][0])
    assert store.carried == container.HEAD_PROBE + min(header, len(store.objects[newest][0]))


def test_a_store_that_cannot_read_part_of_an_object_explains_nothing(cache_dir: Path) -> None:
    class Whole(MemoryStore):
        get_head = None  # type: ignore[assignment]  # no partial reads: never download a bundle to explain

    store = Whole()
    store.objects[make_key(PREFIX, A100.digest(), "run-1")] = (b"would be a big bundle", 1.0)
    timed = TimedStore(store, 60.0)
    transfer = _restore(timed, cache_dir)
    assert transfer.outcome == "miss"
    assert transfer.message == (
        f"no bundle for fingerprint {H100.digest()} (could not explain: memory://test cannot read part of an object)"
    )
    assert "get" not in store.calls and timed.trouble is None


# ----------------------------------------------------------------------------------------- save limits


def test_save_leaves_out_files_no_bundle_can_carry(tmp_path: Path, source: Path) -> None:
    os.close(os.open(os.path.join(os.fsencode(source), b"bad\xff.so"), os.O_CREAT | os.O_WRONLY))
    store = MemoryStore()
    transfer = _save(store, source, "run-1", files=[*CACHE_FILES, os.fsdecode(b"bad\xff.so")])
    assert transfer.outcome == "saved"
    assert transfer.skipped == (("bad\\udcff.so", "not valid UTF-8"),)
    assert transfer.message == "left out 1 cache file(s) no bundle can carry"
    assert transfer.to_json()["skipped"] == [{"key": "bad\\udcff.so", "reason": "not valid UTF-8"}]
    restored = _restore(store, tmp_path / "fresh", exact_key=transfer.key)
    assert restored.outcome == "exact"  # the bundle save wrote is one restore accepts


def test_save_refuses_a_bundle_restore_would_refuse(source: Path) -> None:
    store = MemoryStore()
    transfer = _save(store, source, "run-1", max_bytes=10)
    assert transfer.outcome == "error"
    assert transfer.message.startswith("save failed: bundle would be ")
    assert store.objects == {}


def test_restore_reads_the_bundle_once_and_leaves_no_staging(
    tmp_path: Path, source: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_compilecache import container

    store = MemoryStore()
    key = _put_bundle(store, tmp_path, source, H100, "run-1")
    stored = tmp_path / "stored.bundle"
    stored.write_bytes(store.objects[key][0])
    payload_size = bundle.read_manifest(stored).payload_size
    read = [0]
    original = container.PayloadReader.read

    def counting(self: container.PayloadReader, size: int = -1) -> bytes:
        data = original(self, size)
        read[0] += len(data)
        return data

    monkeypatch.setattr(container.PayloadReader, "read", counting)
    assert _restore(store, cache_dir, exact_key=key).outcome == "exact"
    assert read[0] == payload_size  # verified and installed in one pass (it was read twice before)
    assert not [p for p in cache_dir.iterdir() if p.name.startswith(".compilecache-staging-")]


def test_a_cache_dir_that_cannot_be_created_is_an_error_not_a_miss(tmp_path: Path, source: Path) -> None:
    store = MemoryStore()
    _put_bundle(store, tmp_path, source, H100, "run-1")
    (tmp_path / "a-file").write_bytes(b"")
    transfer = _restore(store, tmp_path / "a-file" / "cache")
    assert transfer.outcome == "error"
    assert transfer.message.startswith("restore failed: cannot create cache dir ")
    assert transfer.skipped == ()


# ---- the one codec of a restore's result (the xdist ticket, the Action's hand-off)

HEADER = "c" + "a2b3c4d5e6f7" * 4 + "abc" + ".h.gch"


def _full_result() -> sync.RestoreResult:
    return sync.RestoreResult(
        "partial",
        key="p-abc-run-1",
        size=1234,
        seconds=1.5,
        message="restored",
        files=7,
        artifacts={"fx_graph": 4, "triton": 2},
        skipped=(("p-abc-run-0", "failed verification"),),
        staged=(sync.StagedBlob("controller", 10, "0" * 64),),
        headers=sync.HeaderReport(
            named=(HEADER,), transferred=(HEADER,), size=99, seconds=0.5, warnings=("w",), carried=("k",),
            notes=("n",),
        ),
        graphs={"format": 1, "tests": {}},
    )  # fmt: skip


def test_every_crossing_of_a_restore_result_uses_one_codec_and_keeps_every_field() -> None:
    """The ticket and the hand-off carried different subsets of the result before (the hand-off lost the size,
    the files, the artifacts, the bad bundles skipped): now both carry what encode writes."""
    from dataclasses import replace

    result = _full_result()
    between_processes = replace(result, graphs=None)  # the record stays in the cache dir; never crosses
    assert sync.RestoreResult.decode(json.loads(json.dumps(result.encode()))) == between_processes
    assert sync.read_handoff(sync.write_handoff(result)) == between_processes
    told = json.loads(sync.write_handoff(result, sync.SavePolicy(only_when_passed=True)))
    assert {k: v for k, v in told.items() if k != "save_when"} == result.encode()


@pytest.mark.parametrize(
    "hostile",
    [
        {"outcome": "exact", "key": 5},
        {"outcome": "exact", "key": ["a"], "size": "big", "files": -1, "seconds": "x", "artifacts": {"a": "b"}},
        {"outcome": "partial", "skipped": [["a"], [1, 2], "x"], "staged": [["../x", 1, "0" * 64], [1, 2, 3]]},
        {"outcome": "miss", "headers": {"named": ["../evil"], "warnings": "not a list", "size": True}},
        {"outcome": "error", "message": "a\n::error::x", "headers": [HEADER, 3]},
    ],
)
def test_a_hostile_result_decodes_to_its_safe_fields_and_renders(hostile: dict[str, Any]) -> None:
    """Issue 44 (also): a ticket whose key was not a string parsed, then crashed the report."""
    from pytest_compilecache.report import SessionOutcome
    from pytest_compilecache.report import session_json
    from pytest_compilecache.report import session_lines
    from pytest_compilecache.report import session_markdown
    from pytest_compilecache.stats import SessionStats

    result = sync.RestoreResult.decode(hostile)
    assert result is not None and (result.key is None or isinstance(result.key, str))
    assert all("\n" not in line for line in (result.message, *result.headers.warnings))
    assert result.staged == () and all(name == HEADER for name in result.headers.named)
    outcome = SessionOutcome(stats=SessionStats(), mode="shared", cache_dir="/c", where="/c", restored=result)
    json.dumps(session_json(outcome))
    session_markdown(outcome)
    session_lines(outcome, report="full")
    assert sync.RestoreResult.decode({"outcome": "nonsense"}) is None and sync.RestoreResult.decode([1]) is None
