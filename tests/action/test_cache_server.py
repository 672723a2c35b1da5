"""The test cache service keeps GitHub's rules (the act tests rely on them): spoken to over HTTP as the client does."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from tests.action.cache_server import TWIRP
from tests.action.cache_server import CacheServer
from tests.action.cache_server import scopes_for

MAIN = scopes_for("push", "refs/heads/main")
FEATURE = scopes_for("push", "refs/heads/feature")
PULL = scopes_for("pull_request", "refs/pull/7/merge", base_ref="main")


@pytest.fixture
def server() -> Iterator[CacheServer]:
    with CacheServer() as service:
        yield service


def rpc(server: CacheServer, token: str, method: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        f"{server.url.rstrip('/')}{TWIRP}{method}",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(json.loads(response.read()))
    except urllib.error.HTTPError as exc:
        return exc.code, dict(json.loads(exc.read()))


def save(server: CacheServer, scopes: list[dict[str, Any]], key: str, data: bytes = b"x", version: str = "v1") -> int:
    token = server.token(scopes)
    status, created = rpc(server, token, "CreateCacheEntry", {"key": key, "version": version})
    if status != 200:
        return status
    upload = urllib.request.Request(
        created["signed_upload_url"], data=data, method="PUT", headers={"x-ms-blob-type": "BlockBlob"}
    )
    with urllib.request.urlopen(upload, timeout=10) as response:
        assert response.status == 201
    status, done = rpc(
        server, token, "FinalizeCacheEntryUpload", {"key": key, "version": version, "size_bytes": str(len(data))}
    )
    assert status == 200 and done["ok"]
    return status


def lookup(
    server: CacheServer, scopes: list[dict[str, Any]], key: str, restore_keys: list[str], version: str = "v1"
) -> str | None:
    status, found = rpc(
        server,
        server.token(scopes),
        "GetCacheEntryDownloadURL",
        {"key": key, "restore_keys": restore_keys, "version": version},
    )
    assert status == 200
    if not found.get("ok"):
        return None
    with urllib.request.urlopen(found["signed_download_url"], timeout=10) as response:
        response.read()
    return str(found["matched_key"])


def test_keys_are_immutable(server: CacheServer) -> None:
    assert save(server, MAIN, "k-1") == 200
    assert save(server, MAIN, "k-1") == 409
    assert save(server, MAIN, "k-1", version="v2") == 200  # another version is another entry


def test_restore_keys_match_by_prefix_newest_first_and_the_version_must_match(server: CacheServer) -> None:
    for key in ("k-a-1", "k-a-2", "k-b-3"):
        save(server, MAIN, key)
    assert lookup(server, MAIN, "k-a-9", ["k-a-"]) == "k-a-2"
    assert lookup(server, MAIN, "k-a-1", ["k-"]) == "k-a-1"  # the primary key exactly, first
    assert lookup(server, MAIN, "k-a-9", ["k-"]) == "k-b-3"
    assert lookup(server, MAIN, "k-a-9", ["k-a-"], version="v2") is None


def test_scopes(server: CacheServer) -> None:
    save(server, MAIN, "k-main")
    save(server, FEATURE, "k-feature")
    assert lookup(server, PULL, "x", ["k-"]) == "k-main"  # a pull request reads its base branch
    assert lookup(server, FEATURE, "x", ["k-"]) == "k-feature"  # its own branch first
    assert lookup(server, MAIN, "x", ["k-"]) == "k-main"  # never another branch's
    save(server, PULL, "k-pull")
    assert server.keys("refs/pull/7/merge") == ["k-pull"] and lookup(server, MAIN, "x", ["k-p"]) is None
    read_only = [{"Scope": "refs/heads/main", "Permission": 1}]
    assert save(server, read_only, "k-ro") == 403


def test_tokens_are_checked_and_failed_downloads_can_be_injected(server: CacheServer) -> None:
    status, _ = rpc(server, "not.a.token", "GetCacheEntryDownloadURL", {"key": "k", "version": "v1"})
    assert status == 401
    save(server, MAIN, "k-1")
    server.fail_downloads = True
    with pytest.raises(urllib.error.HTTPError):
        lookup(server, MAIN, "k-1", [])


@pytest.mark.parametrize("compression", ["zstd", "gzip"])
def test_members_lists_the_files_an_entry_holds(server: CacheServer, compression: str) -> None:
    import gzip
    import io
    import tarfile

    import zstandard

    from tests.action.cache_server import CacheEntry

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as archive:
        for name in ("../work/.compilecache-staging/b.bundle", "../work/.compilecache-staging/a-artifact-0.bundle"):
            info = tarfile.TarInfo(name)
            info.size = 3
            archive.addfile(info, io.BytesIO(b"abc"))
        folder = tarfile.TarInfo("../work/.compilecache-staging")
        folder.type = tarfile.DIRTYPE
        archive.addfile(folder)  # a dir entry is no file
    raw = buf.getvalue()
    data = zstandard.ZstdCompressor().compress(raw) if compression == "zstd" else gzip.compress(raw)
    server.entries.append(CacheEntry(1, "refs/heads/main", "k", "v", 0.0, data=data, finalized=True))
    assert server.members("k") == ["a-artifact-0.bundle", "b.bundle"]


def test_an_outage_of_the_lookup_can_be_injected(server: CacheServer) -> None:
    save(server, MAIN, "k-1")
    server.fail_lookups = True
    status, body = rpc(server, server.token(MAIN), "GetCacheEntryDownloadURL", {"key": "k-1", "version": "v1"})
    assert (status, body["code"]) == (500, "internal")
    server.fail_lookups = False
    assert lookup(server, MAIN, "k-1", []) == "k-1"


@pytest.mark.parametrize(
    ("status", "code"), [(403, "permission_denied"), (404, "bad_route"), (429, "resource_exhausted")]
)
def test_a_refusal_of_the_lookup_can_be_injected(server: CacheServer, status: int, code: str) -> None:
    import sys

    save(server, MAIN, "k-1")
    server.refuse_lookups = status
    refused = rpc(server, server.token(MAIN), "GetCacheEntryDownloadURL", {"key": "k-1", "version": "v1"})
    assert (refused[0], refused[1]["code"]) == (status, code)
    server.refuse_lookups = None
    assert lookup(server, MAIN, "k-1", []) == "k-1"
    agent = f"Python-urllib/{sys.version_info[0]}.{sys.version_info[1]}"
    assert server.lookup_agents == [agent, agent]  # every lookup's User-Agent, in order


def test_refused_connections_can_be_injected(server: CacheServer) -> None:
    import socket

    assert server.results_url == server.url
    server.refuse_connections = True
    url = server.results_url
    assert url != server.url and url == server.results_url  # one port, held while the server lives
    port = int(url.rstrip("/").rsplit(":", 1)[1])
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5)


def test_a_refusal_of_new_entries_can_be_injected(server: CacheServer) -> None:
    server.refuse_creates = 429
    assert save(server, MAIN, "k-1") == 429
    assert server.keys() == []
    server.refuse_creates = None
    assert save(server, MAIN, "k-1") == 200 and server.keys() == ["k-1"]
