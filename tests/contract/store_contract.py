"""The contract every :class:`~pytest_compilecache.stores.Store` passes.

Use it by subclassing, in a test module of the backend::

    from tests.contract.store_contract import StoreContract

    class TestS3StoreContract(StoreContract):
        @pytest.fixture
        def make_store(self, bucket):
            return lambda: S3Store.from_url(f"s3://{bucket.name}/prefix", endpoint_url=...)

        @pytest.fixture
        def set_modified(self):          # optional: without it the tests that need it skip
            def set_modified(store, key, when): ...
            return set_modified

``make_store()`` must return a NEW store object over the SAME backing location each time it is called (the
concurrency tests use several), and that location must start empty for each test. ``set_modified(store, key,
when)`` sets a stored key's modification time to ``when`` (epoch seconds), so ordering is tested
deterministically, without sleeping; a backend that cannot do that leaves the default, which skips.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import pytest

from pytest_compilecache import ConfigError
from pytest_compilecache import StoreError
from pytest_compilecache.stores import ReadOnlyStore
from pytest_compilecache.stores import Store
from pytest_compilecache.stores import StoreEntry
from pytest_compilecache.stores import prune
from pytest_compilecache.stores.base import ObjectTooLarge
from pytest_compilecache.stores.base import read_head
from tests.bundles import find_latest

MakeStore = Callable[[], Store]
SetModified = Callable[[Store, str, float], None]
PutBytes = Callable[[Store, str, bytes], None]
GetBytes = Callable[[Store, str], "bytes | None"]

T0 = 1_700_000_000.0  # a fixed epoch: ordering never depends on the clock

INVALID_KEYS = [
    "",
    ".",
    "..",
    ".hidden",
    "a/b",
    "../escape",
    "a\\b",
    "a b",
    "a:b",
    "k\n",
    "é",
    "x" * 513,
]


def _write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def _payload(tag: str, size: int = 1000) -> bytes:
    """Distinct, recognisable bytes of a given size (covers every byte value, not just text)."""
    seed = (tag.encode() + bytes(range(256))) * (size // (256 + len(tag)) + 1)
    return seed[:size]


class StoreContract:
    """Behaviour every store shares. Subclasses provide ``make_store`` (and optionally ``set_modified``)."""

    # --- fixtures a backend provides ------------------------------------------------------------------

    @pytest.fixture
    def make_store(self) -> MakeStore:
        raise NotImplementedError("a StoreContract subclass must define the make_store fixture")

    @pytest.fixture
    def set_modified(self) -> SetModified:
        pytest.skip("this backend cannot set modification times")

    # --- helpers ---------------------------------------------------------------------------------------

    @pytest.fixture
    def store(self, make_store: MakeStore) -> Store:
        return make_store()

    @pytest.fixture
    def put_bytes(self, tmp_path: Path) -> PutBytes:
        """Put ``data`` under ``key`` (from a fresh source file each time)."""
        lock = threading.Lock()
        counter = iter(range(1_000_000))

        def put_bytes(store: Store, key: str, data: bytes) -> None:
            with lock:  # the contract calls this from several threads
                src = tmp_path / "src" / f"{next(counter)}.bin"
            store.put(key, _write(src, data))

        return put_bytes

    @pytest.fixture
    def get_bytes(self, tmp_path: Path) -> GetBytes:
        """Get ``key`` into a fresh file and return its bytes; None on a miss."""
        lock = threading.Lock()
        counter = iter(range(1_000_000))

        def get_bytes(store: Store, key: str) -> bytes | None:
            with lock:
                dest = tmp_path / "dest" / f"{next(counter)}.bin"
            return dest.read_bytes() if store.get(key, dest) else None

        return get_bytes

    # --- the contract ----------------------------------------------------------------------------------

    def test_describes_itself(self, store: Store) -> None:
        assert isinstance(store, Store)
        assert isinstance(store.location, str) and store.location
        assert not hasattr(store, "readonly") and not hasattr(store, "find_latest")  # the protocol is narrow

    def test_get_of_a_missing_key_is_a_miss(self, store: Store, tmp_path: Path) -> None:
        dest = tmp_path / "out" / "x.bundle"
        assert store.get("nothing-here", dest) is False
        assert not dest.exists()

    def test_empty_store_lists_nothing(self, store: Store) -> None:
        assert store.list() == []
        assert store.list("any-prefix") == []
        assert find_latest(store, "any-prefix") is None

    def test_put_then_get_round_trips(self, store: Store, put_bytes: PutBytes, get_bytes: GetBytes) -> None:
        big = _payload("big", 3 * 1024 * 1024 + 7)  # several copy chunks
        put_bytes(store, "k-small", b"\x00\x01\xff")
        put_bytes(store, "k-big", big)
        put_bytes(store, "k-empty", b"")
        assert get_bytes(store, "k-small") == b"\x00\x01\xff"
        assert get_bytes(store, "k-big") == big
        assert get_bytes(store, "k-empty") == b""

    def test_get_replaces_dest_and_leaves_no_temp_files(
        self, store: Store, put_bytes: PutBytes, tmp_path: Path
    ) -> None:
        put_bytes(store, "k", b"new")
        dest = _write(tmp_path / "out" / "x.bundle", b"old content, longer than the new one")
        assert store.get("k", dest) is True
        assert dest.read_bytes() == b"new"
        assert sorted(p.name for p in dest.parent.iterdir()) == ["x.bundle"]

    def test_get_with_a_limit_refuses_a_bigger_object(self, store: Store, put_bytes: PutBytes, tmp_path: Path) -> None:
        big = _payload("big", 3 * 1024 * 1024 + 7)  # several copy chunks
        put_bytes(store, "k-big", big)
        put_bytes(store, "k-small", b"12345")
        dest = tmp_path / "out" / "x.bundle"
        assert store.get("k-big", dest, limit=len(big)) is True  # exactly the limit is fine
        assert dest.read_bytes() == big
        dest.unlink()
        for key, limit in [("k-big", len(big) - 1), ("k-small", 4), ("k-small", 0)]:
            with pytest.raises(ObjectTooLarge):
                store.get(key, dest, limit=limit)
            assert list(dest.parent.iterdir()) == []  # neither the object nor a temp file is left
        assert store.get("nothing-here", dest, limit=1) is False

    def test_read_head_reads_only_the_start(self, store: Store, put_bytes: PutBytes) -> None:
        # The optional partial read (issue 28.8): every store we ship offers it, and wrappers pass it through.
        big = _payload("big", 3 * 1024 * 1024 + 7)
        put_bytes(store, "k-big", big)
        put_bytes(store, "k-small", b"12345")
        put_bytes(store, "k-empty", b"")
        for reader in (store, ReadOnlyStore(store)):
            assert read_head(reader, "k-big", 100) == big[:100]
            assert read_head(reader, "k-big", 64 * 1024 + 1) == big[: 64 * 1024 + 1]
            assert read_head(reader, "k-small", 5) == b"12345"
            assert read_head(reader, "k-small", 1000) == b"12345"  # all of it when shorter
            assert read_head(reader, "k-empty", 16) == b""
            assert read_head(reader, "nothing-here", 16) is None
        with pytest.raises(ValueError, match="limit"):
            read_head(store, "k-small", 0)
        with pytest.raises(ConfigError, match="invalid cache key"):
            read_head(store, "../escape", 16)

    def test_put_overwrites_a_key(self, store: Store, put_bytes: PutBytes, get_bytes: GetBytes) -> None:
        put_bytes(store, "k", b"first version, long")
        put_bytes(store, "k", b"second")
        assert get_bytes(store, "k") == b"second"
        assert [entry.key for entry in store.list()] == ["k"]

    def test_list_reports_keys_sizes_and_times(self, store: Store, put_bytes: PutBytes) -> None:
        put_bytes(store, "pre-a", b"12345")
        put_bytes(store, "pre-b", b"")
        put_bytes(store, "other", b"x")
        entries = {entry.key: entry for entry in store.list("pre-")}
        assert sorted(entries) == ["pre-a", "pre-b"]
        assert all(isinstance(entry, StoreEntry) for entry in entries.values())
        assert entries["pre-a"].size == 5 and entries["pre-b"].size == 0
        assert all(isinstance(entry.modified, float) for entry in entries.values())
        assert sorted(entry.key for entry in store.list()) == ["other", "pre-a", "pre-b"]

    def test_list_is_newest_first(self, store: Store, put_bytes: PutBytes, set_modified: SetModified) -> None:
        # Time order deliberately differs from key order.
        for key, age in [("p-a", 10), ("p-b", 30), ("p-c", 20)]:
            put_bytes(store, key, key.encode())
            set_modified(store, key, T0 - age)
        assert [entry.key for entry in store.list("p-")] == ["p-a", "p-c", "p-b"]
        assert [entry.modified for entry in store.list("p-")] == [T0 - 10, T0 - 20, T0 - 30]

    def test_find_latest_picks_the_newest_under_the_prefix(
        self, store: Store, put_bytes: PutBytes, set_modified: SetModified
    ) -> None:
        for key, age in [("p-1-z", 50), ("p-1-a", 5), ("p-2-new", 0), ("p-1-m", 20)]:
            put_bytes(store, key, key.encode())
            set_modified(store, key, T0 - age)
        assert find_latest(store, "p-1-") == "p-1-a"
        assert find_latest(store, "p-") == "p-2-new"
        assert find_latest(store, "p-3") is None

    def test_ties_are_broken_by_the_greatest_key(
        self, store: Store, put_bytes: PutBytes, set_modified: SetModified
    ) -> None:
        for key in ["t-b", "t-c", "t-a"]:
            put_bytes(store, key, b"x")
            set_modified(store, key, T0)
        assert find_latest(store, "t-") == "t-c"
        assert [entry.key for entry in store.list("t-")] == ["t-c", "t-b", "t-a"]

    def test_find_latest_follows_put_order(self, store: Store, put_bytes: PutBytes) -> None:
        # Needs no clock control: keys ascend with put order, so equal timestamps pick the same key.
        for index in range(3):
            put_bytes(store, f"seq-{index}", b"x")
        assert find_latest(store, "seq-") == "seq-2"

    def test_delete(self, store: Store, put_bytes: PutBytes, get_bytes: GetBytes) -> None:
        put_bytes(store, "keep", b"1")
        put_bytes(store, "drop", b"2")
        store.delete("drop")
        assert get_bytes(store, "drop") is None
        assert [entry.key for entry in store.list()] == ["keep"]
        store.delete("drop")  # deleting a missing key is fine
        store.delete("never-existed")

    def test_prune_keeps_the_newest_n(self, store: Store, put_bytes: PutBytes, set_modified: SetModified) -> None:
        for index in range(5):
            put_bytes(store, f"run-{index}", b"x")
            set_modified(store, f"run-{index}", T0 + index)
        put_bytes(store, "other-0", b"x")
        assert prune(store, "run-", keep=2) == ["run-2", "run-1", "run-0"]
        assert sorted(entry.key for entry in store.list()) == ["other-0", "run-3", "run-4"]
        assert prune(store, "run-", keep=2) == []
        assert prune(store, "run-", keep=0) == ["run-4", "run-3"]
        assert [entry.key for entry in store.list()] == ["other-0"]

    def test_prune_refuses_a_negative_keep(self, store: Store) -> None:
        with pytest.raises(ConfigError, match="keep"):
            prune(store, "run-", keep=-1)

    def test_readonly_wrapper_reads_but_refuses_writes(self, store: Store, put_bytes: PutBytes, tmp_path: Path) -> None:
        put_bytes(store, "k", b"data")
        readonly = ReadOnlyStore(store)
        assert isinstance(readonly, Store)
        assert readonly.location == store.location
        dest = tmp_path / "ro" / "k.bundle"
        assert readonly.get("k", dest) is True and dest.read_bytes() == b"data"
        assert find_latest(readonly, "") == "k"
        assert [entry.key for entry in readonly.list()] == ["k"]
        with pytest.raises(StoreError, match="read-only"):
            readonly.put("new", dest)
        with pytest.raises(StoreError, match="read-only"):
            readonly.delete("k")
        assert [entry.key for entry in store.list()] == ["k"]

    @pytest.mark.parametrize("key", INVALID_KEYS)
    def test_invalid_keys_are_refused(self, store: Store, key: str, tmp_path: Path) -> None:
        src = _write(tmp_path / "src.bin", b"x")
        for operation in (
            lambda: store.get(key, tmp_path / "dest.bin"),
            lambda: store.put(key, src),
            lambda: store.delete(key),
            lambda: ReadOnlyStore(store).put(key, src),
        ):
            with pytest.raises(ConfigError, match="invalid cache key"):
                operation()
        assert store.list() == []
        assert not (tmp_path / "dest.bin").exists()

    @pytest.mark.parametrize("prefix", ["a/b", "../", ".", "a b"])
    def test_invalid_prefixes_are_refused(self, store: Store, prefix: str) -> None:
        with pytest.raises(ConfigError, match="prefix"):
            store.list(prefix)
        with pytest.raises(ConfigError, match="prefix"):
            find_latest(store, prefix)

    def test_long_keys_are_accepted(self, store: Store, put_bytes: PutBytes, get_bytes: GetBytes) -> None:
        # 200, not the 512 validate_key allows: file systems cap a name at 255 bytes.
        key = "k" * 200
        put_bytes(store, key, b"x")
        assert get_bytes(store, key) == b"x"

    def test_concurrent_puts_never_mix(self, make_store: MakeStore, put_bytes: PutBytes, get_bytes: GetBytes) -> None:
        writers = 8
        contents = {index: _payload(f"writer-{index}", 256 * 1024 + index) for index in range(writers)}
        barrier = threading.Barrier(writers)

        def save(index: int) -> None:
            store = make_store()  # separate store objects, one backing location: like separate sessions
            barrier.wait()
            put_bytes(store, "shared", contents[index])
            put_bytes(store, f"own-{index}", contents[index])

        with ThreadPoolExecutor(writers) as pool:
            list(pool.map(save, range(writers)))  # re-raises any writer's exception

        store = make_store()
        assert get_bytes(store, "shared") in contents.values()
        for index in range(writers):
            assert get_bytes(store, f"own-{index}") == contents[index]
        expected = ["shared"] + [f"own-{index}" for index in range(writers)]
        assert sorted(entry.key for entry in store.list()) == sorted(expected)

    def test_readers_never_see_a_partial_object(
        self, make_store: MakeStore, put_bytes: PutBytes, get_bytes: GetBytes
    ) -> None:
        versions = [_payload("a", 512 * 1024), _payload("b", 700 * 1024 + 3)]
        put_bytes(make_store(), "hot", versions[0])
        rounds = 15
        barrier = threading.Barrier(4)

        def write(offset: int) -> None:
            store = make_store()
            barrier.wait()
            for index in range(rounds):
                put_bytes(store, "hot", versions[(index + offset) % 2])

        def read(_: int) -> list[bytes | None]:
            store = make_store()
            barrier.wait()
            return [get_bytes(store, "hot") for _ in range(rounds)]

        with ThreadPoolExecutor(4) as pool:
            writes = [pool.submit(write, offset) for offset in (0, 1)]
            reads = [pool.submit(read, offset) for offset in (0, 1)]
            for future in writes:
                future.result()
            seen = [data for future in reads for data in future.result()]
        assert all(data in versions for data in seen)
