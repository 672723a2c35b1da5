"""S3 (and S3-compatible: MinIO, R2, moto) store: one object ``<prefix>/<key>.bundle`` per bundle.

boto3 is imported lazily, inside the methods that talk to S3, so that importing this module (and
building a store from settings) costs nothing and works without the ``s3`` extra installed until a
transfer is actually attempted. Creating an :class:`S3Store` does no network I/O, not even credential
resolution (which may query an instance metadata endpoint).

Errors: a missing object is a miss (``get`` returns ``False``); everything else (unreachable or silent
endpoint, rejected credentials, access denied, missing bucket) is a :class:`StoreError` whose message is one
line starting with :attr:`S3Store.location`. The original boto exception is chained as ``__cause__``.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import builtins
import contextlib
import os
import tempfile
import threading
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

from .._version import __version__
from ..errors import ConfigError
from ..errors import StoreError
from .answers import cap_botocore
from .base import BoundedFile
from .base import ObjectTooLarge
from .base import StoreEntry
from .base import bounded_listing
from .base import listed_key
from .base import newest_first
from .base import object_name
from .base import parse_bucket_url
from .base import shown_endpoint
from .base import validate_prefix

if TYPE_CHECKING:
    from collections.abc import Iterator

    from boto3.s3.transfer import TransferConfig

__all__ = ["S3Store"]

MiB = 1024 * 1024
OPTION = "--compile-cache-store"
# S3's bucket naming rules (3-63 chars, lower case, digits, dots, hyphens), without the rarer exclusions.
_BUCKET = r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]"
# Error codes that mean "these credentials are not accepted", as opposed to "not allowed to do this".
_BAD_CREDENTIALS = {
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "TokenRefreshRequired",
    "InvalidSecurity",
}


class S3Store:
    """Bundles in an S3 bucket under a prefix. Implements :class:`~pytest_compilecache.stores.base.Store`.

    Credentials and region come from boto3's standard chain (environment, shared config/credentials files,
    ``AWS_PROFILE``, web identity/OIDC, container and instance metadata). The endpoint is ``endpoint_url`` if
    given, else whatever boto3 resolves itself: ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` (boto3 >= 1.28)
    or the ``endpoint_url`` of the active profile, else AWS.

    Timeouts and retries are chosen so that a broken endpoint costs seconds, not the minutes of botocore's
    defaults (60 s connect, 60 s read, up to 5 attempts in ``legacy`` mode). Retries use botocore's
    ``standard`` mode: ``max_attempts`` counts the first attempt, backoff is jittered exponential (well
    under 1 s in total for 2 attempts on non-throttling errors, at most 1 + 2 s when throttled), and a
    client-wide retry quota stops retrying once most recent attempts failed. Worst case per S3 request:

    - connection refused (endpoint down): about ``max_attempts`` x a few ms plus backoff, i.e. < 1 s;
    - unroutable host (packets dropped): ``max_attempts * connect_timeout`` = 6 s with the defaults;
    - endpoint accepts but never answers: ``max_attempts * read_timeout`` = 20 s with the defaults.
      ``read_timeout`` bounds each socket read, not a whole transfer, so it must exceed the longest
      pause S3 may take before the first byte of a large response; lower it where the network is local.

    (DNS resolution is not covered by these timeouts.) An operation is one request, except ``get``: HEAD,
    then GET (ranged GETs in parallel above ``multipart_threshold``), plus one LIST on a miss; ``get_head``:
    one ranged GET (plus a LIST on a miss); ``list`` (and so ``prune``): one request per 1000 objects; a
    multipart ``put``: one request per part.
    s3transfer's own retry of interrupted downloads is turned off (``num_download_attempts=1``) so that
    retries are botocore's alone and the bound above holds.
    """

    # Read-only is a wrapper (stores.ReadOnlyStore, applied by open_store), not a mode of each backend.

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        connect_timeout: float = 3,
        read_timeout: float = 10,
        max_attempts: int = 2,
        multipart_threshold: int = 64 * MiB,
    ) -> None:
        """Store the settings only; the boto3 client is created on first use. See :meth:`from_url`."""
        _check_positive("connect_timeout", connect_timeout)
        _check_positive("read_timeout", read_timeout)
        _check_positive("multipart_threshold", multipart_threshold)
        if max_attempts < 1:
            raise ConfigError(f"{OPTION}: S3 max_attempts must be >= 1, got {max_attempts}")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.endpoint_url = endpoint_url
        self.region = region
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.max_attempts = max_attempts
        self.multipart_threshold = multipart_threshold
        self.location = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self._base = f"{self.prefix}/" if self.prefix else ""
        self._connection = _Connection(self)
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        """Stop every transfer in flight at its next chunk, and any later one (:class:`.timed.TimedStore` calls
        this when it gives up on a call): s3transfer's threads, which Python joins at exit, would otherwise send
        or fetch the rest of a bundle after the session stopped waiting, and hold up the process's exit."""
        self._cancelled.set()

    def _stop(self) -> list[Any]:
        """s3transfer subscribers that end a transfer once :meth:`cancel` was called (raising in its progress
        callback, which runs as each chunk is read or written)."""
        from s3transfer.subscribers import BaseSubscriber

        cancelled = self._cancelled

        class Stop(BaseSubscriber):  # type: ignore[misc]  # s3transfer ships no type hints
            def on_progress(self, future: Any, bytes_transferred: int, **kwargs: Any) -> None:
                if cancelled.is_set():
                    raise StoreError("the transfer was given up on (the store timeout)")

        return [Stop()]

    @classmethod
    def from_url(cls, url: str, **options: Any) -> S3Store:
        """Build a store from ``s3://bucket[/prefix]``; ``options`` are the keyword arguments of ``__init__``.

        Raises ConfigError naming ``--compile-cache-store`` for anything but a plain bucket and prefix
        (no credentials, port, query or fragment in the URL; no empty, ``.`` or ``..`` prefix segments),
        without repeating credentials or a query (:func:`.base.parse_bucket_url`).
        """
        bucket, prefix, _ = parse_bucket_url(url, "s3", "bucket", _BUCKET)
        return cls(bucket, prefix, **options)

    def __repr__(self) -> str:
        return f"S3Store({self.location!r}, endpoint_url={self.endpoint_url!r})"

    # -- Store protocol ---------------------------------------------------------------------------------

    def get(self, key: str, dest: Path, *, limit: int | None = None) -> bool:
        """Download bundle ``key`` to ``dest``; ``False`` if there is no such object.

        ``dest`` appears complete or not at all: the download goes to a temporary sibling that is
        ``os.replace``d onto it (and removed on any failure); missing parent directories are created.
        Raises StoreError on any other trouble, including a missing bucket: the HEAD that starts a download
        answers a bare 404 for a missing bucket and a missing object alike, so a miss is confirmed with one
        LIST, whose error carries a code. An object replaced during a ranged download is a StoreError too
        (s3transfer pins the ranges to the first ETag), never a file mixing two versions.

        With ``limit``, the object is sized by a HEAD first (over ``limit``: :class:`ObjectTooLarge`, no
        body requested) and every GET is pinned to that HEAD's ETag (``If-Match``), so an object replaced
        after it was listed or sized fails with 412 instead of streaming in: one GET of at most
        ``limit + 1`` bytes below ``multipart_threshold``, s3transfer's ranged GETs above it (given the size
        and ETag), into a file that refuses any byte past ``limit`` all the same.
        """
        name = self._object_name(key)
        dest = Path(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
        os.close(fd)
        tmp = Path(tmp_name)
        try:
            if limit is None:
                with self._connection.transfer_manager() as manager:
                    manager.download(self.bucket, name, str(tmp), subscribers=self._stop()).result()
            else:
                self._get_bounded(name, tmp, limit, f"{key} in {self.location}")
            os.replace(tmp, dest)
        except _boto_errors() as exc:
            if _is_missing_object(exc):
                self._connection.check_bucket(name)
                return False
            raise self._connection.error(exc, f"get {key}") from exc
        finally:
            tmp.unlink(missing_ok=True)  # a no-op after os.replace
        return True

    def _get_bounded(self, name: str, tmp: Path, limit: int, what: str) -> None:
        """:meth:`get` with a ``limit``: see there. boto errors propagate to it."""
        head = self._connection.client().head_object(Bucket=self.bucket, Key=name)
        try:
            size, etag = int(head["ContentLength"]), head.get("ETag")
        except (KeyError, TypeError, ValueError):  # a server that answers HEAD without a usable Content-Length
            raise StoreError(f"{what}: the server's HEAD gave no object size") from None
        if size > limit:
            raise ObjectTooLarge(f"{what} is {size} bytes, more than {limit}")
        pinned = {"IfMatch": etag} if etag else {}
        with open(tmp, "r+b") as fh:
            bounded = BoundedFile(fh, limit, what)
            if size == 0:
                return  # a Range on an empty object is 416; nothing to fetch
            if size < self.multipart_threshold or not etag:
                # Our own GET: s3transfer's single GET is not pinned to an ETag. Range asks for one byte
                # past the limit, and the body is read to its end, so its connection goes back to the pool.
                body = self._connection.client().get_object(
                    Bucket=self.bucket, Key=name, Range=f"bytes=0-{limit}", **pinned
                )["Body"]
                with contextlib.closing(body):
                    for chunk in iter(lambda: body.read(1024 * 1024), b""):
                        if self._cancelled.is_set():
                            raise StoreError(f"{what}: the transfer was given up on (the store timeout)")
                        bounded.write(chunk)
                return
            from s3transfer.subscribers import BaseSubscriber

            class Known(BaseSubscriber):  # type: ignore[misc]  # s3transfer ships no type hints
                def on_queued(self, future: Any, **kwargs: Any) -> None:
                    future.meta.provide_transfer_size(size)
                    pin = getattr(future.meta, "provide_object_etag", None)  # s3transfer 0.11+
                    if pin is not None:
                        pin(etag)  # s3transfer then adds If-Match to each ranged GET

            with self._connection.transfer_manager() as manager:
                manager.download(self.bucket, name, bounded, subscribers=[Known(), *self._stop()]).result()

    def get_head(self, key: str, limit: int) -> bytes | None:
        """The first ``limit`` bytes of bundle ``key`` (see :func:`.base.read_head`): one ranged GET; None
        when there is no such object (a missing bucket is a StoreError, as for :meth:`get`)."""
        name = self._object_name(key)
        try:
            try:
                response = self._connection.client().get_object(
                    Bucket=self.bucket, Key=name, Range=f"bytes=0-{limit - 1}"
                )
            except _boto_errors() as exc:
                if _error_code(exc) == "InvalidRange":  # an empty object has no byte 0
                    return b""
                raise
            body = response["Body"]
            with contextlib.closing(body):
                # An endpoint that ignores Range sends the whole object: stop reading at the limit.
                return bytes(body.read(limit))
        except _boto_errors() as exc:
            if _is_missing_object(exc):
                self._connection.check_bucket(name)
                return None
            raise self._connection.error(exc, f"get {key}") from exc

    def put(self, key: str, src: Path) -> None:
        """Upload ``src`` as bundle ``key``, replacing any previous one.

        Readers never see a partial object: S3 makes an object visible only once its PUT (or multipart
        completion) succeeded. Files above ``multipart_threshold`` go up in parts of that size, in parallel.
        Every request carries a SHA-256 checksum that S3 verifies before accepting the data.
        Raises StoreError on access denied, missing bucket, unreachable endpoint and the like.
        """
        name = self._object_name(key)
        try:
            with self._connection.transfer_manager() as manager:
                extra = {"ChecksumAlgorithm": "SHA256"}
                manager.upload(str(src), self.bucket, name, extra_args=extra, subscribers=self._stop()).result()
        except _boto_errors() as exc:
            raise self._connection.error(exc, f"put {key}") from exc

    def list(self, prefix: str = "") -> builtins.list[StoreEntry]:
        """Every bundle whose key starts with ``prefix``, newest first (ties: greater key first).

        S3 reports ``LastModified`` to the second, so ties are common; :func:`newest_first` keeps the
        order total. Objects under the store prefix that are not ``<valid key>.bundle`` are ignored.
        ConfigError for an invalid ``prefix``; StoreError for a missing bucket or any remote trouble.
        """
        validate_prefix(prefix)
        try:
            entries = builtins.list(self._iter_entries(prefix))
        except _boto_errors() as exc:
            raise self._connection.error(exc, f"list {prefix!r}") from exc
        return newest_first(entries)

    def delete(self, key: str) -> None:
        """Delete bundle ``key``; deleting a missing key is not an error (S3 DELETE is idempotent)."""
        name = self._object_name(key)
        try:
            self._connection.client().delete_object(Bucket=self.bucket, Key=name)
        except _boto_errors() as exc:
            raise self._connection.error(exc, f"delete {key}") from exc

    # -- boto3 plumbing -----------------------------------------------------------------------------------

    def _object_name(self, key: str) -> str:
        return object_name(self._base, key)

    def _iter_entries(self, prefix: str) -> Iterator[StoreEntry]:
        paginator = self._connection.client().get_paginator("list_objects_v2")
        pages = paginator.paginate(Bucket=self.bucket, Prefix=f"{self._base}{prefix}")
        # Bounded by objects and pages: botocore stops a repeated page token, not a server that makes up new ones.
        for obj in bounded_listing((page.get("Contents", ()) for page in pages), self.location):
            name, size, modified = (obj.get(field) if isinstance(obj, dict) else None for field in _ENTRY_FIELDS)
            key = listed_key(name, self._base, prefix) if isinstance(name, str) else None
            if key is None or not isinstance(size, int) or isinstance(size, bool) or not isinstance(modified, datetime):
                continue  # not a bundle we could order or restore (GCS and Azure skip such entries too)
            yield StoreEntry(key=key, size=size, modified=modified.timestamp())


_ENDPOINT_ENVS = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")  # where botocore finds an endpoint itself
_ENTRY_FIELDS = ("Key", "Size", "LastModified")  # botocore parses them: a str, an int, a datetime


class _Connection:
    """One bucket's boto3 client, made on first use (thread-safe) with the store's timeouts and retry policy,
    and the translation of boto's exceptions into one-line :class:`StoreError` messages."""

    def __init__(self, store: S3Store) -> None:
        self.bucket, self.location = store.bucket, store.location
        self.endpoint_url, self.region = store.endpoint_url, store.region
        self.connect_timeout, self.read_timeout = store.connect_timeout, store.read_timeout
        self.max_attempts, self.multipart_threshold = store.max_attempts, store.multipart_threshold
        self._client: Any = None
        self._client_lock = threading.Lock()

    def client(self) -> Any:
        """The boto3 S3 client, created once (thread-safe), with our timeouts and retry policy."""
        with self._client_lock:
            if self._client is None:
                import boto3.session
                from botocore.config import Config

                config = Config(
                    connect_timeout=self.connect_timeout,
                    read_timeout=self.read_timeout,
                    # total_max_attempts counts the first attempt; botocore's "max_attempts" key would
                    # count retries only (max_attempts=1 means 2 requests), which the tests caught.
                    retries={"total_max_attempts": self.max_attempts, "mode": "standard"},
                    user_agent_extra=f"pytest-compilecache/{__version__}",
                )
                # A private session: boto3's default session is global and not thread-safe to set up.
                session = boto3.session.Session(region_name=self.region)
                # endpoint_url=None lets botocore apply AWS_ENDPOINT_URL(_S3) and profile endpoints itself.
                self._client = session.client("s3", endpoint_url=self.endpoint_url, config=config)
                cap_botocore(self._client, self.location)  # listings and errors: never read past MAX_ANSWER
            return self._client

    def transfer_config(self) -> TransferConfig:
        from boto3.s3.transfer import TransferConfig

        return TransferConfig(
            multipart_threshold=self.multipart_threshold,
            multipart_chunksize=self.multipart_threshold,
            # Retries are botocore's (bounded above); s3transfer retrying on top would multiply them.
            num_download_attempts=1,
            # The CRT client ignores botocore's Config (timeouts, retries); keep the one we configured.
            preferred_transfer_client="classic",
        )

    def transfer_manager(self) -> Any:
        from boto3.s3.transfer import create_transfer_manager

        return create_transfer_manager(self.client(), self.transfer_config())

    def check_bucket(self, name: str) -> None:
        """Raise StoreError if the bucket is missing; called to confirm that a 404 on ``name`` is a miss.

        A LIST, not a HEAD on the bucket: a HEAD's 404 has no body either, and S3 answered 404 (not 403)
        to the object HEAD only because we hold ``s3:ListBucket``, the permission LIST needs.
        """
        try:
            self.client().list_objects_v2(Bucket=self.bucket, Prefix=name, MaxKeys=1)
        except _boto_errors() as exc:
            raise self.error(exc, "get (confirming a miss)") from exc

    def endpoint(self) -> str:
        return shown_endpoint(str(self.client().meta.endpoint_url))

    def error(self, exc: BaseException, action: str) -> StoreError:
        """A one-line StoreError for boto exception ``exc`` raised while doing ``action``."""
        from botocore import exceptions as bx
        from s3transfer.exceptions import RetriesExceededError

        if isinstance(exc, RetriesExceededError) and exc.last_exception is not None:
            exc = exc.last_exception
        if isinstance(exc, bx.ClientError):
            detail = self._describe_client_error(exc)
        elif isinstance(exc, bx.ConnectTimeoutError):
            detail = f"endpoint {self.endpoint()} unreachable (no connection within {self.connect_timeout:g} s)"
        elif isinstance(exc, bx.EndpointConnectionError):
            detail = f"endpoint {self.endpoint()} unreachable"
        elif isinstance(exc, bx.ConnectionClosedError):
            detail = f"endpoint {self.endpoint()} closed the connection"
        elif isinstance(exc, bx.ReadTimeoutError):
            detail = f"endpoint {self.endpoint()} did not answer within {self.read_timeout:g} s"
        elif isinstance(exc, bx.NoCredentialsError):
            detail = "no AWS credentials found (environment, profile, OIDC or instance role)"
        else:
            detail = _first_line(exc) or type(exc).__name__
            for given in filter(None, (self.endpoint_url, *(os.environ.get(n) for n in _ENDPOINT_ENVS))):
                detail = detail.replace(given, shown_endpoint(given))  # botocore quotes an endpoint it refuses whole
        return StoreError(f"{self.location}: {action}: {detail}")

    def _describe_client_error(self, exc: Any) -> str:
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code == "NoSuchBucket":
            return f"bucket {self.bucket} does not exist"
        if code in _BAD_CREDENTIALS:
            return f"credentials rejected ({code})"
        if code == "AccessDenied" or status == 403:
            # A HEAD response has no body: 403 may also be rejected credentials; say so.
            return "access denied" if code == "AccessDenied" else "access denied or credentials rejected (HTTP 403)"
        message = _first_line(error.get("Message") or exc)
        return f"{code or 'error'} (HTTP {status}): {message}"


def _boto_errors() -> tuple[type[BaseException], ...]:
    """What boto3 raises for remote trouble; evaluated only while an ``except`` clause is being matched.

    Local file errors (OSError) are deliberately not included: a missing ``dest`` directory or an
    unreadable ``src`` is the caller's problem, not the store's.
    """
    from botocore.exceptions import BotoCoreError
    from botocore.exceptions import ClientError
    from s3transfer import exceptions as tx

    # S3DownloadFailedError: the object changed between the ranged GETs of one download (IfMatch failed).
    return (BotoCoreError, ClientError, tx.RetriesExceededError, tx.S3DownloadFailedError, tx.S3UploadFailedError)


def _error_code(exc: BaseException) -> str | None:
    response: dict[str, Any] = getattr(exc, "response", None) or {}
    code = response.get("Error", {}).get("Code")
    return str(code) if code is not None else None


def _is_missing_object(exc: BaseException) -> bool:
    """A 404 that is not NoSuchBucket (HEAD answers a bare 404 for both; see S3Store.get)."""
    response: dict[str, Any] = getattr(exc, "response", None) or {}
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    code = response.get("Error", {}).get("Code")
    return bool(status == 404 and code != "NoSuchBucket")


def _first_line(text: object) -> str:
    lines = str(text).strip().splitlines()
    return lines[0] if lines else ""


def _check_positive(name: str, value: float) -> None:
    if not value > 0:
        raise ConfigError(f"{OPTION}: S3 {name} must be > 0, got {value!r}")
