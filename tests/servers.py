"""Real server processes for integration tests, all bound to 127.0.0.1 on free ports: moto's S3,
redis-server, gcp-storage-emulator (GCS) and Azurite (Azure Blob).

Every ``start_*`` helper returns a handle whose ``stop()`` terminates the process and waits for it,
so no ``ResourceWarning`` for a still-running child reaches ``filterwarnings = error``. The handles
are also context managers. A missing binary or module skips locally and fails in CI
(see :func:`require_binary_or_fail`): a CI job that silently skips its integration tests proves nothing.

Also here: :class:`SilentServer`, a TCP server that accepts and never answers (read timeouts), and
:func:`free_port`, a port with nothing listening (an endpoint that is down).
"""

from __future__ import annotations

import importlib.util
import os
import selectors
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import IO
from typing import NoReturn
from typing import TypeVar

import pytest

__all__ = [
    "AZURITE_ACCOUNT",
    "AzuriteServer",
    "GCSEmulator",
    "MotoServer",
    "RedisServer",
    "SilentServer",
    "free_port",
    "require_binary_or_fail",
    "require_module_or_fail",
    "start_azurite",
    "start_gcs_emulator",
    "start_moto_server",
    "start_redis_server",
]

LOOPBACK = "127.0.0.1"
ROOT = Path(__file__).resolve().parents[1]
REDIS_SERVER = "/usr/bin/redis-server"
# Generous: a cold moto import (flask, werkzeug, every service's URL map) takes a few seconds on a busy runner.
STARTUP_TIMEOUT_S = 60.0


def _missing(reason: str) -> NoReturn:
    """Skip locally; fail when ``CI=true``, where a missing server is a broken job, not an option."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason} (CI=true: integration servers are required)", pytrace=False)
    pytest.skip(reason)


def require_binary_or_fail(name: str) -> str:
    """Return the absolute path of executable ``name`` (a bare name or a path), or skip/fail (see module doc)."""
    found = shutil.which(name)
    if found is None:
        _missing(f"{name} is not installed")
    return found


def require_module_or_fail(name: str) -> None:
    """Return if Python module ``name`` is importable in this interpreter, else skip/fail (see module doc)."""
    try:
        spec = importlib.util.find_spec(name)
    except ModuleNotFoundError:  # a parent package is missing
        spec = None
    if spec is None:
        _missing(f"Python module {name} is not installed")


def python_with_module_or_fail(name: str) -> str:
    """An interpreter that imports ``name``: this one, else ``COMPILECACHE_OTHER_PYTHON`` (a venv with another
    torch, which CI sets: the CUDA builds of torch bring triton, the CPU one does not); else skip/fail."""
    for python in (sys.executable, os.environ.get("COMPILECACHE_OTHER_PYTHON", "")):
        found = python and subprocess.run([python, "-c", f"import {name}"], capture_output=True, check=False)
        if found and found.returncode == 0:
            return python
    _missing(f"no interpreter here imports {name} (set COMPILECACHE_OTHER_PYTHON to one that does)")


def free_port() -> int:
    """A loopback TCP port with nothing listening on it right now (the OS picks it; we close it at once).

    Connecting to it is refused. Another process could claim it later; on a test host that is rare
    enough, and the servers below retry their start on a fresh port when they lose that race.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        port: int = sock.getsockname()[1]
    return port


class _Process:
    """A child process with its output in a log file, stopped for good by :meth:`stop`."""

    def __init__(self, argv: list[str], workdir: Path) -> None:
        self.workdir = workdir
        self.log_path = workdir / "server.log"
        # A file, not a pipe: nobody reads a pipe, and a full pipe would block the server mid-test.
        self._log: IO[bytes] = self.log_path.open("wb")
        self._proc = subprocess.Popen(
            argv, cwd=workdir, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT
        )

    def exited(self) -> bool:
        return self._proc.poll() is not None

    def log_tail(self, limit: int = 2000) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-limit:]

    def stop(self, kill: bool = False) -> None:
        """Terminate (or kill), wait (kill after 10 s), close the log. Idempotent."""
        if self._proc.poll() is None:
            self._proc.kill() if kill else self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._log.close()


def _start(
    argv: tuple[str, ...], ready: Callable[[int], bool], name: str
) -> tuple[_Process, int, tempfile.TemporaryDirectory[str]]:
    """Run ``argv + (port,)`` until ``ready(port)``; retry twice on a fresh port if the process dies first."""
    last = ""
    for _attempt in range(3):
        port = free_port()
        tmp = tempfile.TemporaryDirectory(prefix=f"{name}-")
        proc = _Process([*argv, str(port)], Path(tmp.name))
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline and not proc.exited():
            if ready(port):
                return proc, port, tmp
            time.sleep(0.1)
        last = proc.log_tail()
        proc.stop()
        tmp.cleanup()
    raise RuntimeError(f"{name} did not start on 127.0.0.1; last output:\n{last}")


_H = TypeVar("_H", bound="_Handle")


class _Handle:
    """Context-manager plumbing shared by the server handles."""

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self: _H) -> _H:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _http_answers(port: int) -> bool:
    """True once something on ``port`` answers an HTTP request with a status line."""
    try:
        with socket.create_connection((LOOPBACK, port), timeout=1) as sock:
            sock.sendall(b"GET /moto-api/ HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            return sock.recv(16).startswith(b"HTTP/")
    except OSError:
        return False


class MotoServer(_Handle):
    """A ``moto.server`` process: every AWS API, HTTP, on ``endpoint_url``. State is process-wide."""

    def __init__(self, proc: _Process, port: int, tmp: tempfile.TemporaryDirectory[str]) -> None:
        self._proc, self.port, self._tmp = proc, port, tmp
        self.endpoint_url = f"http://{LOOPBACK}:{port}"

    def enforce_auth(self) -> None:
        """From now on every request must be signed with an access key of an IAM user created on this
        server, and is checked against that user's policies (moto's ``INITIAL_NO_AUTH_ACTION_COUNT``,
        set to 0 through its ``/moto-api/reset-auth`` endpoint). Process-wide: use a dedicated server.
        """
        request = urllib.request.Request(
            f"{self.endpoint_url}/moto-api/reset-auth",
            data=b"0",
            method="POST",
            # Not form-encoded: moto reads the raw body, which Flask leaves empty for form posts.
            headers={"Content-Type": "text/plain"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()

    def stop(self) -> None:
        self._proc.stop()
        self._tmp.cleanup()


def start_moto_server() -> MotoServer:
    """Start ``python -m moto.server`` (this interpreter, so it is the venv's moto) and wait until it answers.

    Skips, or fails under ``CI=true``, when moto's server extra is not installed.
    """
    for module in ("moto", "moto.server", "flask", "flask_cors"):
        require_module_or_fail(module)
    argv = (sys.executable, "-m", "moto.server", "-H", LOOPBACK, "-p")
    return MotoServer(*_start(argv, _http_answers, "moto-server"))


def _http_answers_at(path: str) -> Callable[[int], bool]:
    """A readiness check: something on the port answers ``GET path`` with an HTTP status line."""

    def ready(port: int) -> bool:
        try:
            with socket.create_connection((LOOPBACK, port), timeout=1) as sock:
                sock.sendall(f"GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n".encode())
                return sock.recv(16).startswith(b"HTTP/")
        except OSError:
            return False

    return ready


class GCSEmulator(_Handle):
    """A ``gcp-storage-emulator`` process (Google Cloud Storage's JSON API, in memory) at ``endpoint_url``:
    clients reach it through ``STORAGE_EMULATOR_HOST``, without credentials. State is process-wide."""

    def __init__(self, proc: _Process, port: int, tmp: tempfile.TemporaryDirectory[str]) -> None:
        self._proc, self.port, self._tmp = proc, port, tmp
        self.endpoint_url = f"http://{LOOPBACK}:{port}"

    def stop(self) -> None:
        self._proc.stop()
        self._tmp.cleanup()


def start_gcs_emulator() -> GCSEmulator:
    """Start ``gcp-storage-emulator`` (the venv's, from the test extra) in memory and wait until it answers.
    Skips, or fails under ``CI=true``, when it is not installed."""
    require_module_or_fail("gcp_storage_emulator")
    argv = (sys.executable, "-m", "gcp_storage_emulator", "start", "--in-memory", "-q", "-H", LOOPBACK, "--port")
    return GCSEmulator(*_start(argv, _http_answers_at("/storage/v1/b"), "gcs-emulator"))


# Azurite's well-known development account: published by Microsoft, accepted by Azurite only.
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


class AzuriteServer(_Handle):
    """An ``azurite-blob`` process (Azure Blob Storage, in memory) at ``blob_endpoint``; ``connection_string``
    holds the development account's key, as a CI secret would hold a real one."""

    def __init__(self, proc: _Process, port: int, tmp: tempfile.TemporaryDirectory[str]) -> None:
        self._proc, self.port, self._tmp = proc, port, tmp
        self.blob_endpoint = f"http://{LOOPBACK}:{port}/{AZURITE_ACCOUNT}"
        self.key = AZURITE_KEY
        self.connection_string = (
            f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
            f"BlobEndpoint={self.blob_endpoint};"
        )

    def stop(self) -> None:
        # Killed: on SIGTERM Azurite waits for its clients' pooled keep-alive connections to close (seconds).
        self._proc.stop(kill=True)
        self._tmp.cleanup()


def start_azurite() -> AzuriteServer:
    """Start ``azurite-blob`` (npm; scripts/install-tools.sh puts it in .tools/azurite) in memory, wait until
    it answers. Skips, or fails under ``CI=true``, when it (or node) is not installed."""
    local = ROOT / ".tools" / "azurite" / "node_modules" / ".bin" / "azurite-blob"
    path = str(local) if local.exists() else require_binary_or_fail("azurite-blob")
    require_binary_or_fail("node")
    # --skipApiVersionCheck: the client may speak a newer API version than this Azurite knows; what the tests
    # use (blobs, ranges, conditions, listing) is the same in both. "--blobPort" goes last: _start appends it.
    argv = (path, "--inMemoryPersistence", "--skipApiVersionCheck", "--silent", "--blobHost", LOOPBACK, "--blobPort")
    return AzuriteServer(*_start(argv, _http_answers_at(f"/{AZURITE_ACCOUNT}?comp=list"), "azurite"))


def _redis_pings(port: int) -> bool:
    """True once a Redis server on ``port`` answers ``PING`` (raw RESP: no client library needed here)."""
    try:
        with socket.create_connection((LOOPBACK, port), timeout=1) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer(_Handle):
    """A ``redis-server`` process without persistence; ``url`` is ``redis://127.0.0.1:PORT/0``."""

    def __init__(self, proc: _Process, port: int, tmp: tempfile.TemporaryDirectory[str]) -> None:
        self._proc, self.port, self._tmp = proc, port, tmp
        self.host = LOOPBACK
        self.url = f"redis://{LOOPBACK}:{port}/0"

    def stop(self) -> None:
        self._proc.stop()
        self._tmp.cleanup()


def start_redis_server(binary: str = REDIS_SERVER) -> RedisServer:
    """Start ``redis-server`` bound to loopback, no RDB/AOF (``--dir`` is a temp dir anyway), wait for PING."""
    path = require_binary_or_fail(binary)
    # "--port" goes last: _start appends the port number to the argv.
    argv = (path, "--bind", LOOPBACK, "--save", "", "--appendonly", "no", "--daemonize", "no", "--port")
    return RedisServer(*_start(argv, _redis_pings, "redis-server"))


def _drain(sock: socket.socket) -> bool:
    """Read and discard; False once the peer has closed or reset (a timed-out client resets)."""
    try:
        return bool(sock.recv(65536))
    except OSError:
        return False


class SilentServer(_Handle):
    """A loopback TCP server that accepts connections, reads and discards what it is sent, never answers.

    A client therefore connects at once and then waits for its *read* timeout, which is what the
    tests want to provoke. ``connections`` counts accepted connections, so a test can assert how many
    attempts a client made instead of asserting on wall time.
    """

    def __init__(self) -> None:
        self._listener = socket.create_server((LOOPBACK, 0), backlog=64)
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self.endpoint_url = f"http://{LOOPBACK}:{self.port}"
        self.connections = 0
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="silent-server", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(self._listener, selectors.EVENT_READ)
            while not self._stopping.is_set():
                for event, _mask in selector.select(timeout=0.1):
                    sock = event.fileobj
                    assert isinstance(sock, socket.socket)
                    if sock is self._listener:
                        conn, _addr = sock.accept()
                        conn.setblocking(False)
                        self.connections += 1
                        selector.register(conn, selectors.EVENT_READ)
                    # Drain, so a client uploading a body never blocks on a full send buffer.
                    elif not _drain(sock):
                        selector.unregister(sock)
                        sock.close()
            for key in list(selector.get_map().values()):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                selector.unregister(sock)
                sock.close()

    def stop(self) -> None:
        """Stop serving and close every socket. Idempotent."""
        self._stopping.set()
        self._thread.join(timeout=10)
