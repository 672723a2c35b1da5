"""LocalStore: the store contract, plus what only a directory can get wrong; the factory; key rules."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import types
from pathlib import Path
from typing import Any
from typing import BinaryIO
from typing import Callable

import pytest

from pytest_compilecache import ConfigError
from pytest_compilecache import StoreError
from pytest_compilecache.stores import LocalStore
from pytest_compilecache.stores import ReadOnlyStore
from pytest_compilecache.stores import Store
from pytest_compilecache.stores import StoreEntry
from pytest_compilecache.stores import open_store
from pytest_compilecache.stores import validate_key
from pytest_compilecache.stores import validate_prefix
from pytest_compilecache.stores.base import ObjectTooLarge
from tests.bundles import find_latest
from tests.contract.store_contract import MakeStore
from tests.contract.store_contract import SetModified
from tests.contract.store_contract import StoreContract

REPO_ROOT = Path(__file__).resolve().parents[2]


def _set_local_modified(store: Store, key: str, when: float) -> None:
    inner = store.inner if isinstance(store, ReadOnlyStore) else store
    assert isinstance(inner, LocalStore)
    os.utime(inner.root / f"{key}.bundle", (when, when))


class TestLocalStoreContract(StoreContract):
    @pytest.fixture
    def make_store(self, tmp_path: Path) -> MakeStore:
        return lambda: LocalStore(tmp_path / "store")

    @pytest.fixture
    def set_modified(self) -> SetModified:
        return _set_local_modified


def _put(store: LocalStore, tmp_path: Path, key: str, data: bytes) -> None:
    src = tmp_path / f"src-{key}.bin"
    src.write_bytes(data)
    store.put(key, src)


def _failing_copy(src: BinaryIO, dst: BinaryIO) -> None:
    dst.write(src.read(10))  # some bytes reach the temp file first, as on a disk that fills up mid-copy
    raise OSError(errno.ENOSPC, "No space left on device")


# --- a directory of files --------------------------------------------------------------------------------


def test_construction_and_reads_do_not_touch_the_disk(tmp_path: Path) -> None:
    root = tmp_path / "not" / "yet"
    store = LocalStore(root)
    assert store.get("k", tmp_path / "dest.bin") is False
    assert store.list() == [] and find_latest(store, "") is None
    store.delete("k")
    assert not (tmp_path / "not").exists()
    _put(store, tmp_path, "k", b"x")
    assert (root / "k.bundle").read_bytes() == b"x"


def test_location_is_a_file_uri(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    assert store.location == (tmp_path / "store").as_uri()
    assert store.location.startswith("file:///")
    assert "LocalStore" in repr(store)


def test_root_that_is_a_file_is_a_store_error(tmp_path: Path) -> None:
    root = tmp_path / "store"
    root.write_bytes(b"not a directory")
    store = LocalStore(root)
    src = tmp_path / "src.bin"
    src.write_bytes(b"x")
    with pytest.raises(StoreError, match="cannot get k"):
        store.get("k", tmp_path / "dest.bin")
    with pytest.raises(StoreError, match="cannot list"):
        store.list()
    with pytest.raises(StoreError, match="cannot list"):
        find_latest(store, "")
    with pytest.raises(StoreError, match="cannot put k"):
        store.put("k", src)
    with pytest.raises(StoreError, match="cannot delete k"):
        store.delete("k")


def _as_unprivileged(check: Callable[[], None]) -> None:
    """Run ``check`` where permissions apply: as is, or (as root, who ignores them) in a child as nobody."""
    if os.geteuid() != 0:
        check()
        return
    pid = os.fork()
    if pid == 0:  # the child: drop to nobody, report through the exit status only
        code = 1
        try:
            os.setgid(65534)
            os.setuid(65534)
            check()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the check failed as an unprivileged user"


def test_unreadable_root_is_a_store_error(tmp_path: Path) -> None:
    # Outside pytest's basetemp, which only root may enter: the store root's own mode must be the reason.
    base = Path(tempfile.mkdtemp(prefix="compilecache-perm-"))
    base.chmod(0o755)
    root = base / "store"
    store = LocalStore(root)
    _put(store, tmp_path, "k", b"x")
    root.chmod(0)

    def check() -> None:
        with pytest.raises(StoreError):
            store.get("k", Path(tempfile.gettempdir()) / f"compilecache-dest-{os.getpid()}.bin")
        with pytest.raises(StoreError):
            store.list()

    try:
        _as_unprivileged(check)
    finally:
        root.chmod(0o755)
        shutil.rmtree(base)


def test_missing_source_is_a_store_error(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    with pytest.raises(StoreError, match="cannot put k"):
        store.put("k", tmp_path / "missing.bin")
    assert store.list() == []


def test_full_disk_on_put_leaves_the_old_object_and_no_temp_file(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    _put(store, tmp_path, "k", b"old bundle")
    store._copy = _failing_copy
    with pytest.raises(StoreError, match="No space left"):
        _put(store, tmp_path, "k", b"new bundle, never fully written")
    with pytest.raises(StoreError, match="No space left"):
        _put(store, tmp_path, "other", b"new bundle, never fully written")
    assert sorted(p.name for p in store.root.iterdir()) == ["k.bundle"]
    assert (store.root / "k.bundle").read_bytes() == b"old bundle"


def test_full_disk_on_get_leaves_no_dest_and_no_temp_file(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    _put(store, tmp_path, "k", b"bundle bytes")
    store._copy = _failing_copy
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(StoreError, match="No space left"):
        store.get("k", out / "k.bundle")
    assert list(out.iterdir()) == []


def test_an_object_growing_while_it_is_read_stops_at_the_limit(tmp_path: Path) -> None:
    # Sized at open (5 bytes, under the limit), then appended to by someone who can write the store: the
    # copy reads at most one byte past the limit, and nothing is kept.
    store = LocalStore(tmp_path / "store")
    _put(store, tmp_path, "k", b"small")
    copied: list[int] = []

    def growing_copy(reader: Any, writer: Any) -> None:
        with open(store.root / "k.bundle", "ab") as grow:
            grow.write(b"x" * (8 << 20))
        while chunk := reader.read(64 * 1024):
            copied.append(len(chunk))
            writer.write(chunk)

    store._copy = growing_copy
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(ObjectTooLarge, match="grew past 1000 bytes"):
        store.get("k", out / "k.bundle", limit=1000)
    assert sum(copied) <= 1000 and list(out.iterdir()) == []


@pytest.mark.parametrize("kind", ["symlink", "fifo"])
def test_get_refuses_an_object_that_is_not_a_regular_file(tmp_path: Path, kind: str) -> None:
    # A link (to /dev/zero, a secret) would be copied without end or leak; a FIFO would block forever.
    store = LocalStore(tmp_path / "store")
    (tmp_path / "store").mkdir()
    path = tmp_path / "store" / "k-1.bundle"
    if kind == "symlink":
        outside = tmp_path / "outside"
        outside.write_bytes(b"secret")
        path.symlink_to(outside)
    else:
        os.mkfifo(path)
    with pytest.raises(StoreError, match="symlink|not a regular file"):
        store.get("k-1", tmp_path / "dest")
    assert not (tmp_path / "dest").exists()


def test_temp_and_foreign_files_are_ignored(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    _put(store, tmp_path, "real", b"x")
    for name in [".real.bundle.a1b2.tmp", "real.bundle.tmp", ".hidden.bundle", "bad key.bundle", "notes.txt"]:
        (store.root / name).write_bytes(b"junk")
    (store.root / "dir.bundle").mkdir()
    assert [entry.key for entry in store.list()] == ["real"]
    assert find_latest(store, "") == "real"
    assert find_latest(store, "dir") is None


def test_two_processes_put_at_once(tmp_path: Path) -> None:
    root = tmp_path / "store"
    script = textwrap.dedent(
        """
        import sys
        from pathlib import Path
        from pytest_compilecache.stores import LocalStore
        store, tag = LocalStore(Path(sys.argv[1])), sys.argv[2]
        src = Path(sys.argv[1]).parent / f"src-{tag}.bin"
        src.write_bytes(tag.encode() * 100_000)
        for index in range(30):
            store.put("shared", src)
            store.put(f"own-{tag}-{index}", src)
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    processes = [
        subprocess.Popen([sys.executable, "-c", script, str(root), tag], env=env, stderr=subprocess.PIPE)
        for tag in ("a", "b")
    ]
    for process in processes:
        _, stderr = process.communicate(timeout=120)
        assert process.returncode == 0, stderr.decode()
    store = LocalStore(root)
    assert (root / "shared.bundle").read_bytes() in (b"a" * 100_000, b"b" * 100_000)
    assert len(store.list("own-")) == 60
    assert sorted(p.name for p in root.iterdir() if not p.name.endswith(".bundle")) == []


# --- the factory -----------------------------------------------------------------------------------------


def test_open_store_file_url(tmp_path: Path) -> None:
    store = open_store((tmp_path / "a b").as_uri())
    assert isinstance(store, LocalStore)
    assert store.root == tmp_path / "a b"
    localhost = open_store(f"file://localhost{tmp_path}")
    assert isinstance(localhost, LocalStore) and localhost.root == tmp_path


def test_open_store_plain_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    absolute = open_store(str(tmp_path / "abs"))
    assert isinstance(absolute, LocalStore) and absolute.root == tmp_path / "abs"
    as_path = open_store(tmp_path / "abs")
    assert isinstance(as_path, LocalStore) and as_path.root == tmp_path / "abs"
    monkeypatch.chdir(tmp_path)
    relative = open_store("rel/store")
    assert isinstance(relative, LocalStore) and relative.root == tmp_path / "rel" / "store"
    assert not (tmp_path / "rel").exists()


def test_open_store_readonly_wraps(tmp_path: Path) -> None:
    store = open_store(str(tmp_path), readonly=True)
    assert isinstance(store, ReadOnlyStore) and isinstance(store.inner, LocalStore)
    assert store.location == tmp_path.as_uri()


@pytest.mark.parametrize(
    "url",
    [
        "",
        "   ",
        "file://relative/dir",
        "file:relative",
        "file:///abs?x=1",
        "file:///tmp/a%00b",  # else every file call fails later with a ValueError, not at start-up
        "/tmp/a\x00b",
        "ftp://host/x",
        "gs://",
        "az://x",
        "s3://",
        "s3:bucket",
        "http://example.com/x",
    ],
)
def test_open_store_refuses_bad_values(url: str) -> None:
    with pytest.raises(ConfigError) as info:
        open_store(url)
    message = str(info.value)
    assert "--compile-cache-store" in message
    assert repr(url) in message


def test_open_store_dispatches_s3_lazily(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, dict[str, Any]]] = []

    class FakeS3Store:
        location = "s3://bucket/prefix"
        readonly = False

        @classmethod
        def from_url(cls, url: str, **options: Any) -> FakeS3Store:
            calls.append((url, options))
            return cls()

    fake = types.ModuleType("pytest_compilecache.stores.s3")
    fake.S3Store = FakeS3Store  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pytest_compilecache.stores.s3", fake)
    store = open_store("s3://bucket/prefix", endpoint_url="http://127.0.0.1:9")
    assert isinstance(store, FakeS3Store)
    assert calls == [("s3://bucket/prefix", {"endpoint_url": "http://127.0.0.1:9"})]
    readonly = open_store("S3://bucket", readonly=True)
    assert isinstance(readonly, ReadOnlyStore) and isinstance(readonly.inner, FakeS3Store)


# --- keys ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["a", "A-z_0.9", "compilecache-v1-0123abcd-42-1", "_x", "-x", "x" * 512])
def test_valid_keys(key: str) -> None:
    assert validate_key(key) == key


@pytest.mark.parametrize("key", ["", ".x", "..", "a/b", "a/../b", "a\\b", "a b", "ü", "x" * 513, "a\x00b"])
def test_invalid_keys(key: str) -> None:
    with pytest.raises(ConfigError, match="invalid cache key"):
        validate_key(key)


def test_prefixes() -> None:
    assert validate_prefix("") == ""
    assert validate_prefix("compilecache-v1-") == "compilecache-v1-"
    for prefix in ["a/", ".", "../x", "x" * 513]:
        with pytest.raises(ConfigError, match="prefix"):
            validate_prefix(prefix)


def test_a_killed_saves_partial_file_goes_with_a_later_save_or_prune(tmp_path: Path) -> None:
    # Issue 28.5: a save SIGKILLed mid-copy leaves its temp sibling (26 MB measured) that nothing removed.
    from pytest_compilecache import _fs
    from pytest_compilecache.stores import prune

    store = LocalStore(tmp_path / "store")
    src = tmp_path / "bundle"
    src.write_bytes(b"b" * 100)
    store.put("p-1", src)
    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True).stdout)
    now = int(time.time())
    killed = store.root / f".p-2.bundle.compilecache-tmp-{_fs.host_tag()}-{dead}-{now}-abcdefgh.tmp"
    live = store.root / f".p-3.bundle.compilecache-tmp-{_fs.host_tag()}-{os.getpid()}-{now}-abcdefgh.tmp"
    elsewhere = store.root / f".p-4.bundle.compilecache-tmp-0badc0de-{dead}-{now}-abcdefgh.tmp"  # another host
    others = [store.root / ".notes.tmp", store.root / "README"]
    for path in [killed, live, elsewhere, *others]:
        path.write_bytes(b"partial")
    store.put("p-5", src)
    assert not killed.exists()
    assert live.exists() and elsewhere.exists() and all(p.exists() for p in others)  # not provably stale
    killed.write_bytes(b"partial")
    assert prune(store, "p-", 1) == ["p-1"]
    assert not killed.exists() and live.exists()


def test_a_listing_is_checked_not_trusted(tmp_path: Path) -> None:
    """What the remote backends list through (listed_key), and what prune deletes (bundles): a server or proxy
    that ignores the prefix filter hands back objects outside the prefix; they are neither counted nor deleted."""
    from pytest_compilecache.stores.base import bundles
    from pytest_compilecache.stores.base import listed_key
    from pytest_compilecache.stores.base import prune
    from tests.fakes import MemoryStore

    assert listed_key("ci/pfx-1.bundle", "ci/", "pfx-") == "pfx-1"
    for name in ("ci/other-1.bundle", "elsewhere/pfx-1.bundle", "ci/sub/pfx-1.bundle", "ci/pfx-1.tmp", "ci/.bundle"):
        assert listed_key(name, "ci/", "pfx-") is None, name

    class IgnoresPrefix(MemoryStore):
        def list(self, prefix: str = "") -> list[StoreEntry]:
            return super().list("")

    store = IgnoresPrefix()
    source = tmp_path / "b"
    source.write_bytes(b"x")
    for key in ("pfx-1", "pfx-2", "other-1", "other-2"):
        store.put(key, source)
    assert {entry.key for entry in bundles(store, "pfx-")} == {"pfx-1", "pfx-2"}
    assert len(prune(store, "pfx-", 1)) == 1
    assert {entry.key for entry in store.list()} >= {"other-1", "other-2"}
