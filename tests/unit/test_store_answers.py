"""The stores against a misbehaving endpoint on 127.0.0.1: the vendors' real clients, small threaded servers that
answer the way a broken proxy or a hostile server might (Azure's downloads; every backend's answers read whole).
(The contract suite, moto, the GCS emulator and Azurite prove the stores against sound endpoints: tests/contract,
tests/integration/test_store_s3.py, tests/integration/test_store_clouds.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from pytest_compilecache.errors import StoreError
from pytest_compilecache.stores.azure import AzureStore

BODY = 64 << 20  # what the server offers to send: far more than asked


class _Blobs(BaseHTTPRequestHandler):
    """Properties say the blob has 10 bytes; a GET is answered as ``server.mode`` says."""

    protocol_version = "HTTP/1.1"
    server: Any

    def log_message(self, *_: object) -> None:
        pass

    def do_HEAD(self) -> None:
        self._start(200, {"Content-Length": "10"})

    def do_GET(self) -> None:
        # Claims the 10 bytes asked for, then states a far longer answer ("too-long"), or none, sending until
        # the socket closes ("no-length").
        if self.server.mode == "too-long":
            self._start(206, {"Content-Range": "bytes 0-9/10", "Content-Length": str(BODY)})
        else:
            self._start(206, {"Content-Range": "bytes 0-9/10", "Connection": "close"})
            self.close_connection = True
        chunk = b"\0" * (1 << 20)
        try:
            for _ in range(BODY >> 20):
                self.wfile.write(chunk)
                self.server.sent += len(chunk)
        except OSError:  # the client hung up: what a bounded reader does
            pass

    def _start(self, status: int, headers: dict[str, str]) -> None:
        self.send_response(status)
        common = {"ETag": '"0x1"', "Last-Modified": "Mon, 01 Jan 2024 00:00:00 GMT", "x-ms-blob-type": "BlockBlob"}
        for name, value in {**common, **headers}.items():
            self.send_header(name, value)
        self.end_headers()


def _serve(handler: type[BaseHTTPRequestHandler]) -> Iterator[Any]:
    """A threaded server of ``handler`` on 127.0.0.1 (``sent``: bytes its handler counts), for a fixture."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    server.sent = 0  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def endpoint() -> Iterator[Any]:
    yield from _serve(_Blobs)


def _store(port: int) -> AzureStore:
    connection = (
        "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=dGVzdA==;"
        f"BlobEndpoint=http://127.0.0.1:{port}/devstoreaccount1;"
    )
    return AzureStore.from_url("az://cont/p", connection_string=connection, max_attempts=1, read_timeout=5)


@pytest.mark.parametrize(
    ("mode", "sent"),
    [("too-long", rf"sent {BODY} bytes where at most (16|10) were"), ("no-length", "sent an answer of no stated")],
)
def test_an_answer_larger_than_asked_is_refused_from_its_headers(
    endpoint: Any, mode: str, sent: str, tmp_path: Path
) -> None:
    """The client reads each download answer whole into memory before our bound on the file applies: a server
    that sends more than the range asked for (or without end) would cost as much memory as it sends. Its headers decide:
    the download stops before the body is read, with one StoreError, and leaves no file behind."""
    endpoint.mode = mode
    store = _store(endpoint.server_address[1])
    for call in (lambda: store.get_head("k1", 16), lambda: store.get("k1", tmp_path / "k1.bundle", limit=10)):
        with pytest.raises(StoreError, match=rf"^az://cont/p: the endpoint {sent}"):
            call()
    assert endpoint.sent < BODY // 2  # the client hung up; it did not take the 64 MiB offered
    assert list(tmp_path.iterdir()) == []


def test_a_download_whose_first_answer_stalls_says_so() -> None:
    """The client retries a download's first answer on its own and then wraps the last error in a bare
    HttpResponseError: the warning names what happened to the last attempt, not the wrapper."""
    from azure.core.exceptions import HttpResponseError
    from azure.core.exceptions import IncompleteReadError
    from azure.core.exceptions import ServiceResponseError

    store = _store(9)
    cases = ((ServiceResponseError("timed out"), "did not answer within 5 s"), (IncompleteReadError(), "broke off"))
    for error, said in cases:
        wrapped = HttpResponseError(error, error=error)
        assert said in str(store._error(wrapped, "get k1"))


def test_a_credential_chain_that_fails_is_one_line_not_its_log(tmp_path: Path) -> None:
    """Where no logging is configured (the command line, the Action's steps), azure-identity's warnings went to
    stderr: ~12 lines an attempt listing every credential it tried. The StoreError says it in one line."""
    code = (
        "from pytest_compilecache.stores.azure import AzureStore\n"
        "store = AzureStore.from_url('az://cont/p?account=acct1', max_attempts=1)\n"
        "try:\n"
        "    store.list()\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    env = {
        **os.environ,
        # Only the environment's credential (unconfigured: it fails without a request); a managed identity, were
        # it tried, would ask 127.0.0.1 and not the cloud's metadata address.
        "AZURE_TOKEN_CREDENTIALS": "EnvironmentCredential",
        "IDENTITY_ENDPOINT": "http://127.0.0.1:9/token",
        "IDENTITY_HEADER": "x",
    }
    for name in ("AZURE_CLIENT_ID", "AZURE_TENANT_ID", "AZURE_CLIENT_SECRET", "AZURE_STORAGE_CONNECTION_STRING"):
        env.pop(name, None)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    said = "az://cont/p: list '': credentials could not be obtained (ClientAuthenticationError)"
    assert result.stdout == f"StoreError {said}\n"
    assert result.stderr == ""


# ---- answers read whole (listings, metadata, errors), every backend


class _Endless(BaseHTTPRequestHandler):
    """Answers every request 200 and sends spaces until the client hangs up: with a stated length of 100 GiB
    (``server.mode == "stated"``), or with none, ending the answer at the connection's close."""

    protocol_version = "HTTP/1.1"
    server: Any

    def log_message(self, *_: object) -> None:
        pass

    def _answer(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/xml" if "/storage/" not in self.path else "application/json")
        if self.server.mode == "stated":
            self.send_header("Content-Length", str(100 << 30))
        else:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        chunk = b" " * (1 << 20)
        try:
            while self.server.sent < 4 * BODY:  # a bound for the test's sake: 256 MiB
                self.wfile.write(chunk)
                self.server.sent += len(chunk)
        except OSError:  # the client hung up: what a capped reader does
            pass

    do_GET = do_HEAD = do_PUT = do_POST = _answer


@pytest.fixture
def endless() -> Iterator[Any]:
    yield from _serve(_Endless)


@pytest.mark.parametrize("backend", ["s3", "gs", "az"])
@pytest.mark.parametrize("mode", ["stated", "unstated"])
def test_an_answer_read_whole_is_capped_for_every_backend(
    endless: Any, monkeypatch: pytest.MonkeyPatch, backend: str, mode: str
) -> None:
    """Each SDK reads a listing's answer whole into memory: a server that states 100 GiB, or sends without end,
    cost the reviewer's session 4-14 GB (and its tests a MemoryError) and went on after the store's timeout. The
    read ends at 16 MiB with one StoreError, and the connection is closed."""
    from pytest_compilecache.stores import open_store
    from pytest_compilecache.stores.answers import MAX_ANSWER

    endless.mode = mode
    url = f"http://127.0.0.1:{endless.server_address[1]}"
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", url)
    if backend == "s3":
        store: Any = open_store("s3://bkt/p", endpoint_url=url)
        store._connection.max_attempts = 1
    elif backend == "gs":
        store = open_store("gs://bkt/p")
    else:
        connection = f"DefaultEndpointsProtocol=http;AccountName=a;AccountKey=dGVzdA==;BlobEndpoint={url}/a;"
        store = AzureStore.from_url("az://cont/p", connection_string=connection, max_attempts=1, read_timeout=5)
    with pytest.raises(StoreError, match=r"the endpoint's answer is larger than the 16777216 bytes"):
        store.list()
    assert endless.sent <= MAX_ANSWER + BODY  # what the sockets held at the hang-up, not the 256 MiB offered
