"""stores.table: one row per remote backend; open_store builds from it, the Action asks it for the extra.

No server here: building a store touches no network (tests/integration/test_store_clouds.py proves that
against listening sockets); these tests check the table, the URLs and the start-up errors.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_compilecache import ConfigError
from pytest_compilecache.errors import StoreError
from pytest_compilecache.settings import STORE_OPTIONS
from pytest_compilecache.settings import Settings
from pytest_compilecache.stores import ReadOnlyStore
from pytest_compilecache.stores import open_store
from pytest_compilecache.stores import table
from pytest_compilecache.stores.azure import AzureStore
from pytest_compilecache.stores.gcs import GCSStore
from pytest_compilecache.stores.s3 import S3Store

OPTION = "--compile-cache-store"


@pytest.mark.parametrize(
    ("url", "extra"),
    [
        ("s3://bucket/prefix", "s3"),
        ("S3://bucket", "s3"),
        ("gs://bucket/ci/cache", "gcs"),
        ("az://container/prefix", "azure"),
        (" az://container ", "azure"),  # the Action's input as typed
        ("github", None),
        ("/srv/compile-cache", None),
        ("file:///srv/compile-cache", None),
        ("C:\\cache", None),
        ("gs:bucket", None),  # not a URL of the backend: open_store refuses it
        ("ftp://host/x", None),
    ],
)
def test_extra_for_names_the_extra_a_store_needs(url: str, extra: str | None) -> None:
    assert table.extra_for(url) == extra


def test_every_row_names_a_module_a_factory_and_an_extra_that_exist() -> None:
    if sys.version_info < (3, 11):
        pytest.skip("tomllib is Python 3.11+")
    from pathlib import Path

    import tomllib

    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    extras = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]
    assert [backend.scheme for backend in table.BACKENDS] == ["s3", "gs", "az"]
    for backend in table.BACKENDS:
        factory = getattr(importlib.import_module(backend.module), backend.factory)
        assert callable(factory.from_url)
        assert backend.extra in extras, backend
        assert backend.example.startswith(f"{backend.scheme}://")
        assert backend.example in table.expected()
        assert set(backend.settings) <= set(STORE_OPTIONS)


@pytest.mark.parametrize(
    ("url", "kind", "location"),
    [
        ("s3://my-bucket/ci", S3Store, "s3://my-bucket/ci"),
        ("gs://my_bucket.example/ci/cache/", GCSStore, "gs://my_bucket.example/ci/cache"),
        ("gs://my-bucket", GCSStore, "gs://my-bucket"),
        ("gs://a1b", GCSStore, "gs://a1b"),
        (f"gs://{'b' * 63}/x", GCSStore, f"gs://{'b' * 63}/x"),
        (f"gs://{'.'.join(['c' * 63] * 3)}.d0", GCSStore, f"gs://{'.'.join(['c' * 63] * 3)}.d0"),  # 194
        ("gs://cache.10.0.0.1", GCSStore, "gs://cache.10.0.0.1"),
        ("az://my-container/ci/cache", AzureStore, "az://my-container/ci/cache"),
        ("az://my-container?account=myaccount", AzureStore, "az://my-container"),
    ],
)
def test_open_store_builds_each_backend_from_its_row(url: str, kind: type, location: str) -> None:
    store = open_store(url)
    assert isinstance(store, kind) and store.location == location
    readonly = open_store(url, readonly=True)
    assert isinstance(readonly, ReadOnlyStore) and isinstance(readonly.inner, kind)


@pytest.mark.parametrize(
    "url",
    [
        "gs://",
        "gs://Bad_Bucket/x",
        "gs://ab",
        "gs://bucket:443/x",
        "gs://bucket/x?userProject=p",
        "gs://bucket/a//b",
        "gs://bucket/a/../b",
        "gs://bucket/x#frag",
        f"gs://{'b' * 64}/x",  # over 63 without dots
        f"gs://{'c' * 63}.{'d' * 64}",  # a dot-separated part over 63
        f"gs://{'.'.join(['c' * 63] * 4)}",  # 255: over 222 with dots
        "gs://a..b",
        "gs://-bucket",
        "gs://bucket_",
        "gs://goog-cache",
        "gs://my-google-cache",
        "gs://my-g00gle-cache",
        "gs://192.168.5.4",
        "az://",
        "az://Container/x",
        "az://a--b/x",
        "az://c/x",  # under 3 characters
        "az://container/x?account=",
        "az://container/x?account=a&account=b",
        "az://container/x?other=1",
        "az://container/a/./b",
        "gs://[x/p",  # urlsplit's own ValueError (an unbalanced bracketed host), not a traceback
        "az://[c]/p",
        "s3://[b/x",
        "gs://bucket/ci\tcache",  # urlsplit would drop the tab: another prefix than the one typed
        "gs://bucket/a\x00b",
    ],
)
def test_malformed_urls_fail_at_start_naming_the_option(url: str) -> None:
    with pytest.raises(ConfigError, match=f"^{OPTION}: ") as info:
        open_store(url)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "url",
    [
        "s3://AKIAEXAMPLE:hunter2@bucket/x",
        "s3://bucket/x?X-Amz-Signature=hunter2",
        "gs://user:hunter2@bucket/x",
        "az://user:hunter2@container/x",
        "az://container/x?sig=hunter2",
        "az://container/x?account=myaccount&sig=hunter2",
    ],
)
def test_a_secret_in_a_refused_url_is_not_repeated(url: str) -> None:
    with pytest.raises(ConfigError, match=f"^{OPTION}: ") as info:
        open_store(url)
    assert "hunter2" not in str(info.value)


def test_azure_account_comes_from_the_url_or_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT_URL", "AZURE_STORAGE_ACCOUNT_NAME"):
        monkeypatch.delenv(name, raising=False)
    assert AzureStore.from_url("az://cont?account=acct1").account_url == "https://acct1.blob.core.windows.net"
    env = {"AZURE_STORAGE_ACCOUNT_NAME": "acct2"}
    assert AzureStore.from_url("az://cont", environ=env).account_url == "https://acct2.blob.core.windows.net"
    env = {"AZURE_STORAGE_ACCOUNT_URL": "http://127.0.0.1:10000/devstoreaccount1"}
    assert AzureStore.from_url("az://cont", environ=env).account_url == env["AZURE_STORAGE_ACCOUNT_URL"]
    secret = "DefaultEndpointsProtocol=https;AccountName=a;AccountKey=hunter2;EndpointSuffix=core.windows.net"
    store = AzureStore.from_url("az://cont", environ={"AZURE_STORAGE_CONNECTION_STRING": secret})
    assert store.account_url is None and "hunter2" not in repr(store) + store.location
    # Bad values fail at start, naming where they came from, without repeating a SAS.
    with pytest.raises(ConfigError, match="^--compile-cache-store: AZURE_STORAGE_ACCOUNT_NAME: 'Bad_Name'"):
        AzureStore.from_url("az://cont", environ={"AZURE_STORAGE_ACCOUNT_NAME": "Bad_Name"})
    for refused in ("https://a.example/?sig=hunter2", "https://:hunter2@a.example", "https://u:hunter2@a.example"):
        with pytest.raises(ConfigError, match="AZURE_STORAGE_ACCOUNT_URL") as info:
            AzureStore.from_url("az://cont", environ={"AZURE_STORAGE_ACCOUNT_URL": refused})
        assert "hunter2" not in str(info.value)


def test_azure_takes_the_first_account_given_and_checks_only_that_one() -> None:
    secret = "DefaultEndpointsProtocol=https;AccountName=a;AccountKey=hunter2;EndpointSuffix=core.windows.net"
    everything = {
        "AZURE_STORAGE_CONNECTION_STRING": secret,
        "AZURE_STORAGE_ACCOUNT_NAME": "Not_A_Name",  # unused below the connection string: no error
        "AZURE_STORAGE_ACCOUNT_URL": "ftp://unused",
    }
    # The URL names its account: that one, with DefaultAzureCredential.
    named = AzureStore.from_url("az://cont?account=acct1", environ=everything)
    assert named.account_url == "https://acct1.blob.core.windows.net"
    # Otherwise the connection string comes before an account name or URL in the environment.
    connected = AzureStore.from_url("az://cont", environ=everything)
    assert connected.account_url is None and connected._connection_string == secret
    by_name = {"AZURE_STORAGE_ACCOUNT_NAME": "acct2", "AZURE_STORAGE_ACCOUNT_URL": "ftp://unused"}
    assert AzureStore.from_url("az://cont", environ=by_name).account_url == "https://acct2.blob.core.windows.net"


@pytest.mark.parametrize(
    ("url", "missing", "named", "extra"),
    [
        ("s3://bucket/prefix", "boto3", "boto3", "s3"),
        ("gs://bucket/prefix", "google.cloud.storage", "google.cloud.storage", "gcs"),
        ("az://container/prefix", "azure.storage.blob", "azure.storage.blob", "azure"),
        ("az://container/prefix", "azure.identity", "azure.identity", "azure"),
    ],
)
def test_a_missing_extra_fails_at_start_naming_it(
    url: str, missing: str, named: str, extra: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, missing, None)  # what find_spec and import see when it is not installed
    with pytest.raises(ConfigError) as info:
        open_store(url)
    assert str(info.value) == f"{OPTION}: needs the {named!r} package (pip install 'pytest-compilecache[{extra}]')"


def test_a_package_whose_parent_is_missing_is_missing() -> None:
    from pytest_compilecache.settings import require_package

    with pytest.raises(ConfigError, match=r"needs the 'no_such_parent_xyz.storage' package .*\[gcs\]"):
        require_package(OPTION, "no_such_parent_xyz.storage", "gcs")  # find_spec raises for a dotted name


def test_settings_carry_backend_options_generically_to_the_backend_that_reads_them() -> None:
    endpoint = "http://127.0.0.1:9"
    settings = Settings(store="s3://bucket/x", store_options=(("s3_endpoint", endpoint),))
    store = open_store(settings)
    assert isinstance(store, S3Store) and store.endpoint_url == endpoint
    # The same options with another backend's URL: not passed (GCSStore takes no endpoint_url).
    gcs = open_store(settings._replace(store="gs://bucket/x", readonly=True))
    assert isinstance(gcs, ReadOnlyStore) and isinstance(gcs.inner, GCSStore)
    # An explicit keyword beats the setting (the CLI's --s3-endpoint, the Action's variable).
    assert open_store(settings, endpoint_url="http://127.0.0.1:8").endpoint_url == "http://127.0.0.1:8"  # type: ignore[attr-defined]


def test_the_cli_and_the_plugin_pass_a_store_only_the_options_its_backend_takes() -> None:
    import argparse

    from pytest_compilecache import cli
    from pytest_compilecache.stores import backend_keywords

    given = {"s3_endpoint": "http://127.0.0.1:9"}
    assert backend_keywords("s3://bucket/x", given) == {"endpoint_url": "http://127.0.0.1:9"}
    assert backend_keywords("gs://bucket/x", given) == backend_keywords("az://cont/x", given) == {}
    assert backend_keywords("/a/dir", given) == backend_keywords("s3://bucket/x", {"s3_endpoint": None}) == {}
    # The CLI's --s3-endpoint (or the plugin's variable behind it) beside a gs:// or az:// store: no TypeError.
    for url, kind in (
        ("gs://bucket/x", GCSStore),
        ("az://cont/x?account=acct1", AzureStore),
        ("s3://bucket/x", S3Store),
    ):
        args = argparse.Namespace(store=url, s3_endpoint=given["s3_endpoint"], store_timeout=5.0)
        assert isinstance(cli._open(args).inner, kind)


def test_a_new_backend_is_one_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the table promises: a row naming a module (here a fake one) is all open_store and extra_for need."""
    calls: list[tuple[str, dict[str, Any]]] = []

    class FakeStore:
        location = "mem://x"

        @classmethod
        def from_url(cls, url: str, **options: Any) -> FakeStore:
            calls.append((url, options))
            return cls()

    module = type(sys)("tests_fake_backend")
    module.FakeStore = FakeStore  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tests_fake_backend", module)
    row = table.Backend("mem", "tests_fake_backend", "FakeStore", "mem", ("json",), "mem://name/prefix")
    monkeypatch.setattr(table, "BACKENDS", (*table.BACKENDS, row))
    assert isinstance(open_store("mem://x/y"), FakeStore) and calls == [("mem://x/y", {})]
    assert table.extra_for("mem://x/y") == "mem"
    assert "mem://name/prefix" in table.expected()


def test_building_cloud_stores_imports_no_sdk() -> None:
    """The SDKs load at a store's first call, not when the table is read or a store is built (a fresh
    interpreter: this one has them loaded already). Looking an SDK up imports its namespace parents
    (``google``, ``google.cloud``, ``azure``, ``azure.storage``), which hold no code of their own."""
    import subprocess

    code = (
        "import sys\n"
        "from pytest_compilecache.stores.table import extra_for\n"
        "from pytest_compilecache.stores import open_store\n"
        "assert extra_for('gs://b/p') == 'gcs'\n"
        "open_store('s3://bucket/p'), open_store('gs://bucket/p'), open_store('az://container/p?account=acct')\n"
        "parents = {'google', 'google.cloud', 'azure', 'azure.storage'}\n"
        "sdks = ('boto3', 'botocore', 's3transfer', 'google', 'azure', 'requests')\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in sdks and m not in parents)\n"
        "print(loaded)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]", result.stdout


def test_an_unusable_azure_answer_is_a_store_error_and_a_listing_without_times_skips_the_blob(tmp_path: Path) -> None:
    """The Azure client raises a bare ValueError for a ranged download answered without Content-Range (a proxy
    that ignores the range) and for a token credential over http: trouble with the store (one warning), never a
    crash; its text is not repeated. A listed blob without size or time is not one to restore."""
    from types import SimpleNamespace

    store = AzureStore.from_url("az://cont/p", environ={"AZURE_STORAGE_ACCOUNT_NAME": "acct"})

    def refuse(**_: object) -> object:
        raise ValueError("Required Content-Range response header is missing or malformed.")

    store._blob = lambda name: SimpleNamespace(download_blob=refuse)  # type: ignore[method-assign]
    for call in (lambda: store.get_head("k1", 16), lambda: store.get("k1", tmp_path / "k1.bundle")):
        with pytest.raises(StoreError, match=r"^az://cont/p: get k1: .*\(ValueError\)$") as info:
            call()
        assert "Content-Range" not in str(info.value)
    assert list(tmp_path.iterdir()) == []  # no partial download left

    when = SimpleNamespace(timestamp=lambda: 1.0)
    listed = [
        SimpleNamespace(name="p/k1.bundle", size=None, last_modified=when),
        SimpleNamespace(name="p/k2.bundle", size=3, last_modified=None),
        SimpleNamespace(name="p/k3.bundle", size=3, last_modified=when),
    ]
    store._container = lambda: SimpleNamespace(list_blobs=lambda **_: SimpleNamespace(by_page=lambda: [listed]))  # type: ignore[method-assign]
    assert [entry.key for entry in store.list()] == ["k3"]


def test_a_gcs_head_stops_a_download_whose_server_ignores_the_range() -> None:
    """``get_head`` asks for ``limit`` bytes; a server or proxy that ignores the Range header sends the whole
    object (or an endless body): the download stops at the first chunk past ``limit``, never buffering it all."""
    from types import SimpleNamespace

    store = open_store("gs://bucket/ci/cache")
    assert isinstance(store, GCSStore)
    sent = []

    def ignores_the_range(file: Any, **_: object) -> None:
        for _chunk in range(10_000):  # 10 GB, were it all kept
            sent.append(file.write(b"x" * (1 << 20)))

    store._blob = lambda name: SimpleNamespace(download_to_file=ignores_the_range)  # type: ignore[method-assign]
    assert store.get_head("k1", 16) == b"x" * 16
    assert sent == []  # the first chunk already stopped it


def test_the_azure_client_retries_after_seconds_not_the_clients_default_quarter_minute() -> None:
    """azure-storage-blob waits 15 s before its first retry (then 18, 24): ~20 s an operation against an endpoint
    that is down. The store's client waits 1 s, then 3, 5, within its ``max_attempts``."""
    connection = (
        "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=dGVzdA==;"
        "BlobEndpoint=http://127.0.0.1:9/devstoreaccount1;"
    )
    store = AzureStore.from_url("az://cont/p", connection_string=connection, max_attempts=3)
    policy = store._container()._config.retry_policy
    assert (policy.initial_backoff, policy.increment_base, policy.total_retries) == (1, 2, 2)


def test_a_listing_that_never_ends_is_a_store_error_for_every_backend() -> None:
    """A server that repeats its page token, or makes up a new one for every page (botocore stops only a repeated
    one), makes the client's listing endless, with full pages or empty ones: past MAX_LISTED objects or
    MAX_PAGES pages the listing is store trouble, and the walk stops."""
    import itertools
    from types import SimpleNamespace

    from pytest_compilecache.stores.base import MAX_LISTED
    from pytest_compilecache.stores.base import MAX_PAGES

    when = SimpleNamespace(timestamp=lambda: 1.0)

    def endless(per_page: int, walked: Any) -> Any:
        for _ in itertools.count(1):
            next(walked.pages)
            yield [SimpleNamespace(name=f"p/k{next(walked.items)}.bundle", size=1, updated=when, last_modified=when)
                   for _ in range(per_page)]  # fmt: skip

    def walk(per_page: int, make: Any) -> tuple[int, int]:
        walked = SimpleNamespace(items=itertools.count(), pages=itertools.count())
        store = make(lambda: endless(per_page, walked))
        with pytest.raises(StoreError, match=r"^(gs|az|s3)://\w+/p: list: more than .* never ends"):
            store.list()
        return next(walked.items), next(walked.pages)

    def gcs(pages: Any) -> Any:
        store: Any = open_store("gs://bucket/p")
        store._client_ = lambda: SimpleNamespace(list_blobs=lambda *a, **k: SimpleNamespace(pages=pages()))
        return store

    def azure(pages: Any) -> Any:
        store: Any = AzureStore.from_url("az://cont/p", environ={"AZURE_STORAGE_ACCOUNT_NAME": "acct"})
        store._container = lambda: SimpleNamespace(list_blobs=lambda **k: SimpleNamespace(by_page=pages))
        return store

    def s3(pages: Any) -> Any:
        store: Any = open_store("s3://bucket/p")

        def listed() -> Any:
            return ({"Contents": [{"Key": i.name, "Size": 1, "LastModified": when} for i in p]} for p in pages())

        paginator = SimpleNamespace(paginate=lambda **_: listed())
        store._connection.client = lambda: SimpleNamespace(get_paginator=lambda _: paginator)
        return store

    for make in (gcs, azure, s3):
        assert walk(1000, make) == (MAX_LISTED + 1000, MAX_LISTED // 1000 + 1)  # stopped within the page past it
        assert walk(0, make) == (0, MAX_PAGES)  # empty pages: stopped by their count


def test_an_s3_listing_entry_without_its_fields_is_skipped_not_the_listing() -> None:
    """A server or proxy whose listing has an entry without Key, Size or LastModified (or a bad one): that entry
    is not one to order or restore, as GCS and Azure skip theirs; the others are listed."""
    from datetime import datetime
    from datetime import timezone
    from types import SimpleNamespace

    when = datetime(2026, 11, 30, tzinfo=timezone.utc)
    good = {"Key": "p/k1.bundle", "Size": 3, "LastModified": when}
    odd = [
        {"Key": "p/k2.bundle", "Size": 3},
        {"Size": 3, "LastModified": when},
        {"Key": "p/k3.bundle", "Size": "3", "LastModified": when},
        {"Key": "p/k4.bundle", "Size": 3, "LastModified": "yesterday"},
        "x",
    ]
    store: Any = open_store("s3://bucket/p")
    paginator = SimpleNamespace(paginate=lambda **_: iter([{"Contents": [*odd, good]}]))
    store._connection.client = lambda: SimpleNamespace(get_paginator=lambda _: paginator)
    assert [(e.key, e.size) for e in store.list()] == [("k1", 3)]


def test_an_endpoint_is_shown_without_credentials_path_or_query() -> None:
    from pytest_compilecache.stores.base import shown_endpoint

    assert shown_endpoint("http://minio:S3cr3t@127.0.0.1:9000/x?X-Amz-Security-Token=S") == "http://127.0.0.1:9000"
    assert (
        shown_endpoint("https://acct.blob.core.windows.net/?sv=1&sig=AzS3cret") == "https://acct.blob.core.windows.net"
    )
    assert shown_endpoint("localhost:9023") == "http://localhost:9023"  # STORAGE_EMULATOR_HOST's form
    assert shown_endpoint("http://[::1]:80/?sig=1") == "http://[::1]:80"
    assert shown_endpoint("") == "(unknown)"


def test_an_s3_endpoint_from_the_environment_shows_no_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--compile-cache-s3-endpoint`` refuses credentials; botocore's own variables may still carry them (a
    MinIO user and password, a token in the query): the store's trouble names the endpoint without them."""
    from tests.servers import free_port

    for endpoint in (
        f"http://minio:S3cr3tPassw0rd@127.0.0.1:{free_port()}",
        "http://127.0.0.1:1/?X-Amz-Security-Token=S3CRET x",
    ):
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
        with pytest.raises(StoreError) as info:
            open_store("s3://bucket/p").list()
        assert "S3cr3t" not in str(info.value) and "S3CRET" not in str(info.value), str(info.value)


def test_an_s3_head_without_a_size_is_store_trouble_for_that_object(tmp_path: Path) -> None:
    """A server whose HEAD has no usable Content-Length: that object cannot be read (the restore tries the next
    candidate), not an exception that ends the restore."""
    from types import SimpleNamespace

    s3 = open_store("s3://bucket/p")
    assert isinstance(s3, S3Store)
    heads: list[dict[str, str]] = [{"ETag": '"e"'}, {"ContentLength": "abc"}]
    for head in heads:

        def head_object(head: dict[str, str] = head, **_: object) -> dict[str, str]:
            return head

        client = SimpleNamespace(head_object=head_object)
        s3._connection.client = lambda client=client: client  # type: ignore[method-assign,misc]
        with pytest.raises(StoreError, match="the server's HEAD gave no object size"):
            s3.get("k1", tmp_path / "k1.bundle", limit=100)
        assert list(tmp_path.iterdir()) == []  # no partial file left


def test_a_directory_store_takes_the_home_dir_as_the_cache_dir_does(tmp_path: Path) -> None:
    """``~/store`` in an ini file (which no shell expands) or the Action's input is the home dir's, as
    ``--compile-cache-dir`` takes it; it was a dir named ``~`` below the current dir."""
    from pytest_compilecache.stores import LocalStore

    store = open_store("~/compile-store")
    assert isinstance(store, LocalStore) and store.root == Path.home() / "compile-store"
