"""stores/timed.py: a wall-clock budget shared by a store's calls; the store contract holds through it."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Callable

import pytest

from pytest_compilecache import StoreError
from pytest_compilecache.errors import TimedOut
from pytest_compilecache.stores import ObjectTooLarge
from pytest_compilecache.stores import Store
from pytest_compilecache.stores import StoreEntry
from pytest_compilecache.stores import prune
from pytest_compilecache.stores.timed import TimedStore
from tests.contract.store_contract import StoreContract
from tests.fakes import MemoryBackend
from tests.fakes import MemoryStore


class TestTimedStoreContract(StoreContract):
    """Wrapped, a store behaves as it does alone (a budget no call reaches)."""

    @pytest.fixture
    def make_store(self) -> Callable[[], Store]:
        backend = MemoryBackend()
        return lambda: TimedStore(MemoryStore(backend=backend), 60.0)

    @pytest.fixture
    def set_modified(self) -> Callable[[Store, str, float], None]:
        def set_modified(store: Store, key: str, when: float) -> None:
            assert isinstance(store, TimedStore) and isinstance(store.inner, MemoryStore)
            store.inner.set_modified(key, when)

        return set_modified


class Stalling(MemoryStore):
    """A memory store whose ``list`` blocks until ``release`` is set (an endpoint trickling its answer)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.listed = threading.Event()

    def list(self, prefix: str = "") -> list[StoreEntry]:
        self.listed.set()
        self.release.wait(30)
        return super().list(prefix)


def test_a_call_that_outlasts_the_budget_is_given_up_and_the_budget_stays_spent(tmp_path: Path) -> None:
    inner = Stalling()
    store = TimedStore(inner, 0.2)
    with pytest.raises(TimedOut, match=r"memory://test did not finish within 0.2 s \(list\)"):
        store.list()
    assert inner.listed.is_set()
    assert store.trouble is not None and "did not finish within 0.2 s" in store.trouble
    # Spent: the next call is refused at once, before it reaches the store.
    calls = len(inner.calls)
    with pytest.raises(TimedOut, match=r"\(get k\)"):
        store.get("k", tmp_path / "k")
    assert len(inner.calls) == calls
    inner.release.set()  # the call given up on ends in the background; nothing reaches the caller


def test_trouble_records_the_first_store_failure_but_not_a_refused_size(tmp_path: Path) -> None:
    inner = MemoryStore()
    store = TimedStore(inner, 60.0)
    source = tmp_path / "src"
    source.write_bytes(b"0123456789")
    store.put("k", source)
    with pytest.raises(ObjectTooLarge):
        store.get("k", tmp_path / "dest", limit=4)  # the object's fault, not the store's
    assert store.trouble is None
    assert store.get("k", tmp_path / "dest", limit=10) is True and (tmp_path / "dest").read_bytes() == b"0123456789"
    inner.fail = {"list"}
    with pytest.raises(StoreError, match="connection reset"):
        store.list()
    assert store.trouble == "cannot list at memory://test: connection reset"
    with pytest.raises(ValueError):  # anything else the inner store raises reaches the caller as it was
        store._call("boom", lambda: int("x"))


def test_only_time_inside_the_stores_calls_counts(tmp_path: Path) -> None:
    now = [0.0]
    inner = MemoryStore()
    store = TimedStore(inner, 10.0, clock=lambda: now[0])
    now[0] = 1000.0  # packing a big bundle before the first call: the machine's time, not the store's
    assert store.list() == []
    assert store.spent == 0.0

    class Slow(MemoryStore):
        def list(self, prefix: str = "") -> list[StoreEntry]:
            now[0] += 4.0  # each listing takes 4 s of the clock
            return super().list(prefix)

    slow = TimedStore(Slow(), 10.0, clock=lambda: now[0])
    slow.list()
    now[0] += 500.0  # verifying and installing between two calls
    slow.list()
    assert slow.spent == 8.0
    slow.list()  # starts with 2 s left and returns (the clock is a fake: the thread is not cut off)
    with pytest.raises(TimedOut):
        slow.list()  # 12 s spent: refused before the store is called


def test_the_timeout_message_names_the_setting_as_the_caller_spells_it() -> None:
    stalling = Stalling()
    store = TimedStore(stalling, 0.05, option="--store-timeout")
    with pytest.raises(TimedOut, match=r"did not finish within 0.05 s \(list\); see --store-timeout$"):
        store.list()
    stalling.release.set()
    assert "see --compile-cache-store-timeout" in str(TimedStore(MemoryStore(), 1.0)._timed_out("list"))


class StallingGet(MemoryStore):
    """A memory store whose ``get`` blocks until ``release`` is set, then writes its ``dest`` as stores do."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.ended = threading.Event()

    def get(self, key: str, dest: Path, *, limit: int | None = None) -> bool:
        self.release.wait(30)
        try:
            return super().get(key, dest, limit=limit)
        finally:
            self.ended.set()


def test_a_get_given_up_on_never_publishes_its_dest(tmp_path: Path) -> None:
    inner = StallingGet()
    source = tmp_path / "src"
    source.write_bytes(b"bundle bytes")
    inner.put("k", source)
    download = tmp_path / "download"
    download.mkdir()
    store = TimedStore(inner, 0.2)
    with pytest.raises(TimedOut, match=r"\(get k\)"):
        store.get("k", download / "k.bundle")
    inner.release.set()  # the download given up on now finishes in the background
    assert inner.ended.wait(10)
    for _ in range(200):  # its clean-up runs right after the inner call returns
        if not list(download.iterdir()):
            break
        threading.Event().wait(0.01)
    assert list(download.iterdir()) == []  # no dest, no private temp left

    prompt = StallingGet()
    prompt.put("k", source)
    prompt.release.set()
    done = TimedStore(prompt, 10.0)  # in time: published at dest, nothing else beside it
    assert done.get("k", download / "k.bundle") is True
    assert [p.name for p in download.iterdir()] == ["k.bundle"] and (
        download / "k.bundle"
    ).read_bytes() == b"bundle bytes"
    assert done.get("missing", download / "m.bundle") is False and [p.name for p in download.iterdir()] == ["k.bundle"]


def test_prune_keeps_what_it_cannot_read_and_stops_when_the_budget_is_spent(tmp_path: Path) -> None:
    """An object whose first bytes the store will not hand back is not proven a bundle: it is kept, and the
    prune goes on (a link in a directory store is refused so). A spent budget stops the prune there."""
    store = MemoryStore()
    for n in range(3):
        source = tmp_path / f"b{n}"
        source.write_bytes(b"MAGIC and the rest")
        store.put(f"p-{n}", source)
        store.set_modified(f"p-{n}", 1000.0 + n)
    store.fail = {"get_head"}
    assert prune(store, "p", 1, magic=b"MAGIC") == []
    assert sorted(entry.key for entry in store.list()) == ["p-0", "p-1", "p-2"]

    class Spent(MemoryStore):
        def get_head(self, key: str, limit: int) -> bytes | None:
            raise TimedOut("the budget is spent")

    spent = Spent(backend=store.backend)
    with pytest.raises(TimedOut):
        prune(spent, "p", 1, magic=b"MAGIC")


@pytest.mark.slow
def test_an_s3_transfer_given_up_on_stops_sending(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """s3transfer's threads, which Python joins at exit, sent the rest of a bundle after the timeout gave up on
    it (a slow store held up the end of the session as long): the store is told to stop, and the upload ends at
    its next chunk. A real boto3 client against a 127.0.0.1 server that reads 256 KiB/s for 2 s (past the 1 s
    budget), then as fast as it can: a client still sending then sends it all."""
    import socket
    import time
    from types import SimpleNamespace

    from pytest_compilecache.stores.readonly import ReadOnlyStore
    from pytest_compilecache.stores.s3 import S3Store

    server = socket.create_server(("127.0.0.1", 0))
    got: dict[str, int] = {}

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                head += conn.recv(1)
            lines = [line.split(b":", 1) for line in head.split(b"\r\n")[1:] if b":" in line]
            headers = {name.strip().lower(): value.strip() for name, value in lines}
            if headers.get(b"expect", b"").lower() == b"100-continue":
                conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
            got["want"], got["got"] = int(headers.get(b"content-length", b"0")), 0
            slow_until = time.monotonic() + 2
            while got["got"] < got["want"]:
                data = conn.recv(65536)
                if not data:
                    break  # the client stopped sending
                got["got"] += len(data)
                if time.monotonic() < slow_until:
                    time.sleep(len(data) / 262144)

    handler = threading.Thread(target=serve, daemon=True)
    handler.start()
    for name, value in (
        ("AWS_ACCESS_KEY_ID", "k"),
        ("AWS_SECRET_ACCESS_KEY", "s"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
    ):
        monkeypatch.setenv(name, value)
    src = tmp_path / "bundle"
    src.write_bytes(b"\0" * (32 << 20))  # one part (below the 64 MiB threshold); more than any socket buffers
    s3 = S3Store("bucket", endpoint_url=f"http://127.0.0.1:{server.getsockname()[1]}")
    told: list[str] = []
    ReadOnlyStore(SimpleNamespace(location="x", cancel=lambda: told.append("cancel"))).cancel()
    assert told == ["cancel"]  # a read-only store (a restore's) passes the word on
    store = TimedStore(s3, 1.0)
    with pytest.raises(TimedOut):
        store.put("k1", src)
    handler.join(120)
    server.close()
    assert 0 < got["got"] < got["want"] == 32 << 20, got  # the client hung up midway
