"""GCSStore and AzureStore against real emulator processes (gcp-storage-emulator, Azurite), a port with
nothing listening and a silent server.

Failure tests assert behaviour (a one-line StoreError naming the cause, no secret in it, nothing left at
``dest``) and keep a generous wall-clock bound only as a hang guard, never as the thing being measured.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pytest_compilecache import StoreError
from pytest_compilecache.stores import Store
from pytest_compilecache.stores import open_store
from pytest_compilecache.stores.azure import AzureStore
from pytest_compilecache.stores.base import ObjectTooLarge
from pytest_compilecache.stores.gcs import GCSStore
from tests.bundles import find_latest
from tests.contract.store_contract import StoreContract
from tests.integration.conftest import CloudBucket
from tests.servers import AZURITE_ACCOUNT
from tests.servers import AzuriteServer
from tests.servers import SilentServer
from tests.servers import free_port

pytestmark = pytest.mark.integration

MiB = 1024 * 1024
HANG_GUARD_S = 30.0  # every failure below is configured to fail in about a second

Operation = Callable[[Store, Path], object]
OPERATIONS: dict[str, Operation] = {
    "get": lambda store, tmp: store.get("k1", tmp / "dest.bundle"),
    "get_head": lambda store, tmp: store.get_head("k1", 16),  # type: ignore[attr-defined]
    "put": lambda store, tmp: store.put("k1", _write(tmp / "src.bundle", b"payload")),
    "list": lambda store, tmp: store.list(""),
    "delete": lambda store, tmp: store.delete("k1"),
}


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _fails_fast(operation: Operation, store: Store, tmp_path: Path) -> str:
    """Run ``operation``, which must raise StoreError within the hang guard; return the one-line message."""
    started = time.monotonic()
    with pytest.raises(StoreError) as info:
        operation(store, tmp_path)
    assert time.monotonic() - started < HANG_GUARD_S
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{store.location}: ")
    assert [p.name for p in tmp_path.iterdir() if "dest" in p.name] == []  # nothing at dest, no temp file
    return message


def _azure_connection(endpoint: str, key: str = "dGVzdA==") -> str:
    return f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={key};BlobEndpoint={endpoint};"


def _store(bucket: CloudBucket, **options: Any) -> Store:
    store: Store = open_store(bucket.url, **options)
    return store


# -- the contract -----------------------------------------------------------------------------------------


class _CloudContract(StoreContract):
    """Both clouds set an object's modification time themselves (no API changes it), so the four
    clock-controlled ordering tests do not apply; the order of real server times is
    test_a_newer_object_wins_over_a_greater_key's."""

    test_list_is_newest_first = None  # type: ignore[assignment]
    test_find_latest_picks_the_newest_under_the_prefix = None  # type: ignore[assignment]
    test_ties_are_broken_by_the_greatest_key = None  # type: ignore[assignment]
    test_prune_keeps_the_newest_n = None  # type: ignore[assignment]


class TestGCSStoreContract(_CloudContract):
    @pytest.fixture
    def make_store(self, gcs_bucket: CloudBucket) -> Callable[[], Store]:
        return lambda: _store(gcs_bucket)


class TestAzureStoreContract(_CloudContract):
    @pytest.fixture
    def make_store(self, azure_container: CloudBucket) -> Callable[[], Store]:
        return lambda: _store(azure_container)


# -- what the contract cannot see -------------------------------------------------------------------------


def test_objects_are_prefix_key_bundle_and_foreign_ones_are_ignored(cloud_bucket: CloudBucket, tmp_path: Path) -> None:
    store = _store(cloud_bucket)
    store.put("k1", _write(tmp_path / "src", b"x"))
    assert cloud_bucket.object_names() == ["ci/cache/k1.bundle"]
    for foreign in ("ci/cache/notes.txt", "ci/cache/sub/k2.bundle", "ci/cache/.hidden.bundle", "ci/other/k3.bundle"):
        store_foreign(cloud_bucket, foreign)
    assert [entry.key for entry in store.list()] == ["k1"]
    assert open_store(cloud_bucket.url.rsplit("/", 1)[0]).list() == []  # k1 is not a key directly under "ci"


def store_foreign(bucket: CloudBucket, name: str) -> None:
    """An object put behind the store's back."""
    if bucket.cloud == "gcs":
        bucket.client.blob(name).upload_from_string(b"y")
    else:
        bucket.client.upload_blob(name, b"y")


def test_a_newer_object_wins_over_a_greater_key(cloud_bucket: CloudBucket, tmp_path: Path) -> None:
    store = _store(cloud_bucket)
    store.put("p-z", _write(tmp_path / "z", b"older"))
    older = store.list("p-z")[0].modified
    # Azure's times have one-second resolution: re-put until the server's clock has moved on. Decided by the
    # server's own times, so it cannot flake; the deadline only guards a hang.
    deadline = time.monotonic() + HANG_GUARD_S
    while not store.list("p-a") or store.list("p-a")[0].modified <= older:
        assert time.monotonic() < deadline
        store.put("p-a", _write(tmp_path / "a", b"newer"))
        time.sleep(0.1)
    assert [entry.key for entry in store.list("p-")] == ["p-a", "p-z"]
    assert find_latest(store, "p-") == "p-a"


def test_an_object_replaced_after_it_was_listed_is_bounded_by_the_limit(
    cloud_bucket: CloudBucket, tmp_path: Path
) -> None:
    store = _store(cloud_bucket)
    store.put("k", _write(tmp_path / "src", b"0123456789"))
    (listed,) = store.list()
    store.put("k", _write(tmp_path / "src", os.urandom(MiB)))
    with pytest.raises(ObjectTooLarge):
        store.get("k", tmp_path / "dest.bundle", limit=listed.size)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


@pytest.mark.parametrize("name", sorted(OPERATIONS))
def test_a_missing_bucket_is_a_store_error_and_is_never_created(
    name: str, cloud_bucket: CloudBucket, tmp_path: Path
) -> None:
    missing = f"missing-{uuid.uuid4().hex[:12]}"
    store = open_store(cloud_bucket.url.replace(cloud_bucket.name, missing))
    message = _fails_fast(OPERATIONS[name], store, tmp_path)
    what = "bucket" if cloud_bucket.cloud == "gcs" else "container"
    assert message.endswith(f"{what} {missing} does not exist"), message
    assert open_store(cloud_bucket.url).list() == []  # the real one is untouched
    with pytest.raises(StoreError):
        store.list()  # and the missing one was not made


# -- unreachable and silent endpoints ---------------------------------------------------------------------


def _unreachable(cloud: str, endpoint: str, monkeypatch: pytest.MonkeyPatch, **options: Any) -> Store:
    if cloud == "gcs":
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", endpoint)
        return GCSStore.from_url("gs://bucket/p", retry_deadline=0, **options)
    connection = _azure_connection(f"{endpoint}/{AZURITE_ACCOUNT}")
    return AzureStore.from_url("az://container/p", connection_string=connection, max_attempts=1, **options)


@pytest.mark.parametrize("cloud", ["gcs", "azure"])
@pytest.mark.parametrize("name", sorted(OPERATIONS))
def test_an_endpoint_down_is_a_store_error(
    name: str, cloud: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"
    message = _fails_fast(OPERATIONS[name], _unreachable(cloud, endpoint, monkeypatch), tmp_path)
    assert message.endswith(f"endpoint {endpoint} unreachable"), message


@pytest.mark.parametrize("cloud", ["gcs", "azure"])
@pytest.mark.parametrize("name", ["get", "list", "put"])
def test_a_silent_endpoint_times_out_after_the_read_timeout(
    name: str, cloud: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with SilentServer() as silent:
        store = _unreachable(cloud, silent.endpoint_url, monkeypatch, read_timeout=1)
        message = _fails_fast(OPERATIONS[name], store, tmp_path)
        assert message.endswith(f"endpoint {silent.endpoint_url} did not answer within 1 s"), message
        assert silent.connections == 1  # one attempt: the retry budget is the store's, not the client's


@pytest.mark.parametrize("cloud", ["gcs", "azure"])
def test_creating_a_store_does_no_network_io(cloud: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with SilentServer() as silent:
        _unreachable(cloud, silent.endpoint_url, monkeypatch)
        time.sleep(0.2)  # the listener thread polls every 0.1 s
        assert silent.connections == 0


# -- credentials: never in a message ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["get", "get_head", "put", "list", "delete"])
def test_a_rejected_azure_key_is_a_store_error_that_does_not_repeat_it(
    name: str, azurite: AzuriteServer, azure_container: CloudBucket, tmp_path: Path
) -> None:
    wrong = "d3Jvbmcta2V5LW5vdC10aGUtcmVhbC1vbmU="
    connection = _azure_connection(azurite.blob_endpoint, key=wrong)
    store = AzureStore.from_url(azure_container.url, connection_string=connection, max_attempts=1)
    message = _fails_fast(OPERATIONS[name], store, tmp_path)
    assert "credentials rejected" in message or "access denied" in message, message
    assert wrong not in message + repr(store) and azurite.key not in message


def test_no_azure_account_is_a_store_error_naming_what_to_set(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for variable in ("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT_URL", "AZURE_STORAGE_ACCOUNT_NAME"):
        monkeypatch.delenv(variable, raising=False)
    store = open_store("az://container/p")  # fine at start: a job without the secret compiles cold
    message = _fails_fast(OPERATIONS["list"], store, tmp_path)
    assert "AZURE_STORAGE_CONNECTION_STRING" in message and "?account=NAME" in message


def test_a_malformed_azure_connection_string_is_a_store_error_that_does_not_repeat_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", "AccountKey=hunter2-but-no-account")
    message = _fails_fast(OPERATIONS["get"], open_store("az://container/p"), tmp_path)
    assert "AZURE_STORAGE_CONNECTION_STRING" in message and "hunter2" not in message


def test_no_google_credentials_is_a_store_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "no-such-key.json"))
    message = _fails_fast(OPERATIONS["list"], open_store("gs://bucket/p"), tmp_path)
    assert message.endswith("no Google credentials found (Application Default Credentials)"), message
