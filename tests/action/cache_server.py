"""A small GitHub Actions cache service on 127.0.0.1, for the real ``@actions/cache`` client (v2 protocol).

The client (npm ``@actions/cache`` 5.x, the one ``actions/cache@v5`` bundles) reaches it when the job has
``ACTIONS_CACHE_SERVICE_V2=true``, ``ACTIONS_RESULTS_URL=<this server>/`` and ``ACTIONS_RUNTIME_TOKEN``:

* ``POST /twirp/github.actions.results.api.v1.CacheService/<method>`` with JSON bodies (proto field names):
  ``CreateCacheEntry {key, version}`` -> ``{ok, signed_upload_url}``;
  ``FinalizeCacheEntryUpload {key, version, size_bytes}`` -> ``{ok, entry_id}``;
  ``GetCacheEntryDownloadURL {key, restore_keys, version}`` -> ``{ok, signed_download_url, matched_key}``.
  Errors are twirp errors: an HTTP status and ``{"code": ..., "msg": ...}``.
* The signed upload URL is used through the Azure Blob SDK (``BlockBlobClient.uploadFile``): one ``PUT``
  with ``x-ms-blob-type: BlockBlob`` up to 128 MiB, else ``PUT ?comp=block&blockid=...`` per block and a
  ``PUT ?comp=blocklist`` XML body. The URL looks like Azurite's (``/<account>/<container>/<blob>``), which
  is how the SDK parses an IP-address endpoint.
* The signed download URL is not an Azure host, so the client downloads it with one plain ``GET``.

The rules GitHub's service enforces, as far as a client can observe them:

* **Immutable keys**: a second ``CreateCacheEntry`` for a key and version that exist (or are being
  uploaded) in the writer's scope is refused (409 ``already_exists``); the client logs it as
  "Unable to reserve cache ... another job may be creating this cache" and saves nothing.
* **Versions**: an entry matches only a lookup with the same ``version`` (the client's hash of the
  ``path`` list and the compression method): a different ``path`` string never restores it.
* **Restore order**: in each readable scope in turn (the job's own first, then the others in token
  order): the primary key exactly, then each restore key in order, exact match first, else the newest
  entry whose key starts with it. Only finalized entries are visible.
* **Scopes** are conveyed the way GitHub conveys them: the runtime token is a JWT whose ``ac`` claim is a
  JSON list ``[{"Scope": "refs/heads/main", "Permission": 3}, ...]`` (permission bits: 1 read, 2 write).
  Entries are written into the one scope with write permission (a job with no writable scope, like
  GitHub's read-only tokens for untrusted triggers, cannot reserve) and read from every readable scope.
  :func:`scopes_for` makes the list a job gets on GitHub: a push to a branch reads and writes that branch
  and reads the default branch; a pull request reads and writes ``refs/pull/N/merge`` and reads its base
  branch; a merge-queue run writes its temporary ``gh-readonly-queue/...`` branch, which no other run reads.
  Tokens are HMAC-signed by the server (:meth:`CacheServer.token`): the client treats them as opaque.

Fault injection for the tests: :attr:`CacheServer.fail_downloads` answers every blob ``GET`` with 403 (a
download that fails after the lookup found an entry); :attr:`CacheServer.fail_lookups` answers every
``GetCacheEntryDownloadURL`` with 500 (an outage of the service: the client retries it, then gives up);
:attr:`CacheServer.refuse_lookups` answers it with that 4xx status and a twirp error at once (the client
does not retry: it logs the error and reports no entry); :attr:`CacheServer.refuse_creates` answers every
``CreateCacheEntry`` with that status (429: the service's limit on new entries per minute; the client logs it
and saves nothing); :attr:`CacheServer.refuse_connections` makes
:attr:`CacheServer.results_url` a port on 127.0.0.1 that refuses every connection (bound, never listening).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import itertools
import json
import re
import secrets
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass
from dataclasses import field
from http.server import BaseHTTPRequestHandler
from http.server import ThreadingHTTPServer
from types import TracebackType
from typing import Any

__all__ = ["CacheEntry", "CacheServer", "scopes_for"]

TWIRP = "/twirp/github.actions.results.api.v1.CacheService/"
READ, WRITE = 1, 2
# The twirp error code of each HTTP status a refusal uses (twirp's spec maps codes to statuses).
TWIRP_CODES = {
    400: "invalid_argument",
    401: "unauthenticated",
    403: "permission_denied",
    404: "bad_route",
    429: "resource_exhausted",
}
# The container and account names in signed blob URLs; the SDK reads them from the path of an IP endpoint.
ACCOUNT, CONTAINER = "devstoreaccount1", "actions-cache"


def scopes_for(event: str, ref: str, *, default_branch: str = "main", base_ref: str = "") -> list[dict[str, Any]]:
    """The ``ac`` claim GitHub puts in a job's runtime token, as documented for cache access.

    ``ref`` is the job's ``GITHUB_REF``; ``base_ref`` the pull request's base branch (``GITHUB_BASE_REF``).
    """
    default = f"refs/heads/{default_branch}"
    if event in ("pull_request", "pull_request_review", "pull_request_review_comment"):
        return [
            {"Scope": ref, "Permission": READ | WRITE},
            {"Scope": f"refs/heads/{base_ref or default_branch}", "Permission": READ},
        ]
    scopes = [{"Scope": ref, "Permission": READ | WRITE}]
    if ref != default:
        scopes.append({"Scope": default, "Permission": READ})
    return scopes


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass
class CacheEntry:
    """One cache entry; ``data`` is None until the blob is uploaded, ``finalized`` after the client says so."""

    id: int
    scope: str
    key: str
    version: str
    created: float
    data: bytes | None = None
    blocks: dict[str, bytes] = field(default_factory=dict)
    finalized: bool = False


class TwirpError(Exception):
    def __init__(self, status: int, code: str, msg: str) -> None:
        super().__init__(msg)
        self.status, self.code, self.msg = status, code, msg


class CacheServer:
    """The service, run in a thread of this process; a context manager. ``url`` ends with ``/``."""

    def __init__(self) -> None:
        self.entries: list[CacheEntry] = []
        self.requests: list[tuple[str, str]] = []  # (method, path) in arrival order, for the tests
        self.lookup_agents: list[str] = []  # the User-Agent of each GetCacheEntryDownloadURL, in arrival order
        self.fail_downloads = False
        self.fail_lookups = False
        self.refuse_lookups: int | None = None  # a 4xx status for every lookup
        self.refuse_creates: int | None = None  # a 4xx status for every CreateCacheEntry
        self.refuse_connections = False
        self._refusing: socket.socket | None = None
        self._secret = secrets.token_bytes(32)
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._clock = itertools.count()
        server = self
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), type("Handler", (_Handler,), {"service": server}))
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/"
        # A short poll: stop() waits for the loop to notice (0.5 s a server by default, on every test's clock).
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="cache-server", daemon=True
        )
        self._thread.start()

    @property
    def results_url(self) -> str:
        """What a job gets as ``ACTIONS_RESULTS_URL``: :attr:`url`, or with :attr:`refuse_connections` a port
        that refuses connections (bound and never listening, so no other process can take it meanwhile)."""
        if not self.refuse_connections:
            return self.url
        if self._refusing is None:
            self._refusing = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self._refusing.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{self._refusing.getsockname()[1]}/"

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()
        if self._refusing is not None:
            self._refusing.close()

    def __enter__(self) -> CacheServer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # ---- tokens

    def token(self, scopes: list[dict[str, Any]]) -> str:
        """A runtime token carrying ``scopes`` (see :func:`scopes_for`) in its ``ac`` claim."""
        header = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
        payload = _b64(json.dumps({"ac": json.dumps(scopes), "iat": int(time.time())}).encode())
        signature = _b64(hmac.new(self._secret, f"{header}.{payload}".encode(), hashlib.sha256).digest())
        return f"{header}.{payload}.{signature}"

    def _scopes(self, authorization: str | None) -> list[dict[str, Any]]:
        token = (authorization or "").removeprefix("Bearer ").strip()
        parts = token.split(".")
        if len(parts) != 3:
            raise TwirpError(401, "unauthenticated", "no runtime token")
        expected = hmac.new(self._secret, f"{parts[0]}.{parts[1]}".encode(), hashlib.sha256).digest()
        try:
            if hmac.compare_digest(_unb64(parts[2]), expected):
                return list(json.loads(json.loads(_unb64(parts[1]))["ac"]))
        except (ValueError, KeyError):
            pass
        raise TwirpError(401, "unauthenticated", "invalid runtime token")

    def _signature(self, entry_id: int, action: str) -> str:
        return _b64(hmac.new(self._secret, f"{action}:{entry_id}".encode(), hashlib.sha256).digest())

    # ---- the three RPCs

    def create(self, scopes: list[dict[str, Any]], body: dict[str, Any]) -> dict[str, Any]:
        if self.refuse_creates is not None:
            code = TWIRP_CODES.get(self.refuse_creates, "failed_precondition")
            raise TwirpError(self.refuse_creates, code, "injected refusal: too many cache entries created")
        key, version = str(body.get("key") or ""), str(body.get("version") or "")
        if not key or not version:
            raise TwirpError(400, "invalid_argument", "key and version are required")
        writable = [s["Scope"] for s in scopes if s["Permission"] & WRITE]
        if not writable:
            raise TwirpError(403, "permission_denied", "cache write is not permitted with this token")
        with self._lock:
            if any(e.scope == writable[0] and e.key == key and e.version == version for e in self.entries):
                raise TwirpError(409, "already_exists", "cache entry with the same key, version, and scope exists")
            entry = CacheEntry(next(self._ids), writable[0], key, version, created=next(self._clock))
            self.entries.append(entry)
        url = f"{self.url}{ACCOUNT}/{CONTAINER}/{entry.id}?sig={self._signature(entry.id, 'w')}"
        return {"ok": True, "signed_upload_url": url}

    def finalize(self, scopes: list[dict[str, Any]], body: dict[str, Any]) -> dict[str, Any]:
        key, version = str(body.get("key") or ""), str(body.get("version") or "")
        writable = [s["Scope"] for s in scopes if s["Permission"] & WRITE]
        with self._lock:
            entry = next(
                (
                    e
                    for e in self.entries
                    if writable and e.scope == writable[0] and e.key == key and e.version == version and not e.finalized
                ),
                None,
            )
            if entry is None or entry.data is None:
                raise TwirpError(404, "not_found", f"no uploaded cache entry to finalize for key {key}")
            if int(body.get("size_bytes") or 0) != len(entry.data):
                raise TwirpError(400, "invalid_argument", "size_bytes does not match the uploaded blob")
            entry.finalized = True
        return {"ok": True, "entry_id": str(entry.id)}

    def lookup(self, scopes: list[dict[str, Any]], body: dict[str, Any]) -> dict[str, Any]:
        if self.fail_lookups:
            raise TwirpError(500, "internal", "injected outage of the cache service")
        if self.refuse_lookups is not None:
            code = TWIRP_CODES.get(self.refuse_lookups, "failed_precondition")
            raise TwirpError(self.refuse_lookups, code, "injected refusal of the cache service")
        key, version = str(body.get("key") or ""), str(body.get("version") or "")
        restore_keys = [str(k) for k in body.get("restore_keys") or []]
        entry = self.find([s["Scope"] for s in scopes if s["Permission"] & READ], key, restore_keys, version)
        if entry is None:
            return {"ok": False}
        url = f"{self.url}download/{entry.id}?sig={self._signature(entry.id, 'r')}"
        return {"ok": True, "signed_download_url": url, "matched_key": entry.key}

    def find(self, readable: list[str], key: str, restore_keys: list[str], version: str) -> CacheEntry | None:
        """The entry a lookup restores (see the module doc for the order), or None."""
        with self._lock:
            live = [e for e in self.entries if e.finalized and e.version == version]
        for scope in readable:
            in_scope = sorted((e for e in live if e.scope == scope), key=lambda e: e.created, reverse=True)
            for wanted in (key, *restore_keys):
                exact = [e for e in in_scope if e.key == wanted]
                if exact:
                    return exact[0]
                if wanted != key:
                    prefixed = [e for e in in_scope if e.key.startswith(wanted)]
                    if prefixed:
                        return prefixed[0]
        return None

    def keys(self, scope: str | None = None) -> list[str]:
        """Keys of finalized entries (in ``scope`` if given), oldest first."""
        with self._lock:
            return [e.key for e in self.entries if e.finalized and (scope is None or e.scope == scope)]

    def entry(self, key: str) -> CacheEntry:
        return next(e for e in self.entries if e.key == key and e.finalized)

    def members(self, key: str) -> list[str]:
        """The file names (last path component) inside the finalized entry ``key``: the client uploads a
        tar archive, zstd-compressed (``--long=30``) where the runner has zstd, else gzip."""
        import gzip
        import io
        import tarfile

        data = self.entry(key).data or b""
        if data[:4] == b"\x28\xb5\x2f\xfd":  # zstd magic
            import zstandard

            raw = zstandard.ZstdDecompressor(max_window_size=1 << 31).stream_reader(io.BytesIO(data)).read()
        else:
            raw = gzip.decompress(data)
        with tarfile.open(fileobj=io.BytesIO(raw)) as archive:
            return sorted(member.name.rsplit("/", 1)[-1] for member in archive.getmembers() if member.isfile())

    # ---- blobs

    def put_blob(self, entry_id: int, query: dict[str, str], headers: Any, body: bytes) -> int:
        entry = self._entry(entry_id, query, "w")
        comp = query.get("comp", "")
        with self._lock:
            if entry.finalized:
                return 409
            if comp == "block":
                entry.blocks[query["blockid"]] = body
            elif comp == "blocklist":
                ids = re.findall(rb"<(?:Latest|Committed|Uncommitted)>([^<]*)</", body)
                entry.data = b"".join(entry.blocks[i.decode()] for i in ids)
                entry.blocks.clear()
            elif headers.get("x-ms-blob-type") == "BlockBlob":
                entry.data = body
            else:
                return 400
        return 201

    def get_blob(self, entry_id: int, query: dict[str, str]) -> bytes:
        entry = self._entry(entry_id, query, "r")
        if self.fail_downloads or entry.data is None:
            raise TwirpError(403, "permission_denied", "download refused")
        return entry.data

    def _entry(self, entry_id: int, query: dict[str, str], action: str) -> CacheEntry:
        if not hmac.compare_digest(query.get("sig", ""), self._signature(entry_id, action)):
            raise TwirpError(403, "permission_denied", "bad signature")
        with self._lock:
            found = next((e for e in self.entries if e.id == entry_id), None)
        if found is None:
            raise TwirpError(404, "not_found", "no such blob")
        return found


class _Handler(BaseHTTPRequestHandler):
    service: CacheServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet: the tests read service.requests
        pass

    def _reply(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, data: dict[str, Any]) -> None:
        self._reply(status, json.dumps(data).encode(), {"Content-Type": "application/json"})

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _split(self) -> tuple[str, dict[str, str]]:
        parsed = urllib.parse.urlsplit(self.path)
        return parsed.path, dict(urllib.parse.parse_qsl(parsed.query))

    def do_POST(self) -> None:
        path, _ = self._split()
        self.service.requests.append(("POST", path))
        body = self._body()
        methods = {
            "CreateCacheEntry": self.service.create,
            "FinalizeCacheEntryUpload": self.service.finalize,
            "GetCacheEntryDownloadURL": self.service.lookup,
        }
        name = path.removeprefix(TWIRP)
        if name == "GetCacheEntryDownloadURL":
            self.service.lookup_agents.append(self.headers.get("User-Agent", ""))
        if not path.startswith(TWIRP) or name not in methods:
            self._json(404, {"code": "bad_route", "msg": f"no handler for {path}"})
            return
        try:
            self._json(200, methods[name](self.service._scopes(self.headers.get("Authorization")), json.loads(body)))
        except TwirpError as exc:
            self._json(exc.status, {"code": exc.code, "msg": exc.msg})

    def do_PUT(self) -> None:
        path, query = self._split()
        self.service.requests.append(("PUT", path))
        body = self._body()
        match = re.fullmatch(rf"/{ACCOUNT}/{CONTAINER}/(\d+)", path)
        if not match:
            self._reply(404)
            return
        try:
            status = self.service.put_blob(int(match.group(1)), query, self.headers, body)
        except TwirpError as exc:
            status = exc.status
        md5 = base64.b64encode(hashlib.md5(body).digest()).decode()
        self._reply(
            status,
            headers={
                "ETag": f'"0x{secrets.token_hex(8)}"',
                "Content-MD5": md5,
                "x-ms-request-id": secrets.token_hex(8),
                "x-ms-version": "2025-01-05",
                "x-ms-request-server-encrypted": "true",
                "Last-Modified": time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime()),
            },
        )

    def do_GET(self) -> None:
        path, query = self._split()
        self.service.requests.append((self.command, path))
        match = re.fullmatch(r"/download/(\d+)", path)
        if not match:
            self._reply(404)
            return
        try:
            data = self.service.get_blob(int(match.group(1)), query)
        except TwirpError as exc:
            self._reply(exc.status, exc.msg.encode())
            return
        self._reply(200, data, {"Content-Type": "application/octet-stream"})

    do_HEAD = do_GET
