"""Google Cloud Storage store: one object ``<prefix>/<key>.bundle`` per bundle, ``gs://bucket[/prefix]``.

The vendor's client (``google-cloud-storage``, the ``gcs`` extra), imported lazily inside the methods that
talk to GCS: importing this module and building a store cost nothing and touch no network, not even the
credential lookup (which may ask a metadata server). Credentials are Google's Application Default
Credentials (``GOOGLE_APPLICATION_CREDENTIALS``, ``gcloud auth application-default login``, workload
identity federation, the metadata server); ``STORAGE_EMULATOR_HOST`` points the client at an emulator,
without credentials, as the client itself does.

Errors: a missing object is a miss (``get`` returns ``False``); everything else (endpoint down or silent,
no or rejected credentials, access denied, missing bucket) is a :class:`StoreError` whose one-line message
starts with :attr:`GCSStore.location` and is written from the error's kind and HTTP status, never from the
text of a response or a credential. The client's exception is chained as ``__cause__``.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import builtins
import os
import threading
from pathlib import Path
from typing import Any

from .._version import __version__
from ..errors import ConfigError
from ..errors import StoreError
from .answers import cap_requests_session
from .base import OPTION
from .base import BoundedFile
from .base import ObjectTooLarge
from .base import StoreEntry
from .base import bounded_listing
from .base import listed_key
from .base import newest_first
from .base import object_name
from .base import parse_bucket_url
from .base import shown_endpoint
from .base import temp_sibling
from .base import validate_prefix

__all__ = ["GCSStore"]

# GCS bucket names (https://cloud.google.com/storage/docs/buckets#naming): lower case letters, digits, "-", "_"
# and "."; starting and ending with a letter or digit; 3-63 characters, or up to 222 with dots where each
# dot-separated part is 1-63; not an IP address, no "goog" prefix, no "google" (nor "g00gle") inside.
_BUCKET = (
    r"(?=.{3,222}$)(?!.*[^.]{64})(?!.*\.\.)(?!goog)(?!.*g[o0][o0]gle)(?!\d+\.\d+\.\d+\.\d+$)"
    r"[a-z0-9][a-z0-9._-]*[a-z0-9]"
)


class GCSStore:
    """Bundles in a GCS bucket under a prefix. Implements :class:`~pytest_compilecache.stores.base.Store`.

    Each request waits at most ``connect_timeout`` to connect and ``read_timeout`` per socket read; the
    client's retries (transient errors, 429 and 5xx, dropped connections) stop after ``retry_deadline``
    seconds in all. An upload is visible only once complete (GCS never shows a partial object); a download
    with a ``limit`` is pinned to the generation it sized, so an object replaced meanwhile fails instead of
    mixing two versions; both are checked by the client against GCS's CRC32C.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        connect_timeout: float = 3,
        read_timeout: float = 10,
        retry_deadline: float = 10,
    ) -> None:
        """Store the settings only; the client is made on first use. See :meth:`from_url`."""
        for name, value in (("connect_timeout", connect_timeout), ("read_timeout", read_timeout)):
            if not value > 0:
                raise ConfigError(f"{OPTION}: GCS {name} must be > 0, got {value!r}")
        if not retry_deadline >= 0:
            raise ConfigError(f"{OPTION}: GCS retry_deadline must be >= 0, got {retry_deadline!r}")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.connect_timeout, self.read_timeout, self.retry_deadline = connect_timeout, read_timeout, retry_deadline
        self.location = f"gs://{bucket}/{self.prefix}" if self.prefix else f"gs://{bucket}"
        self._base = f"{self.prefix}/" if self.prefix else ""
        self._client: Any = None
        self._lock = threading.Lock()

    @classmethod
    def from_url(cls, url: str, **options: Any) -> GCSStore:
        """Build a store from ``gs://bucket[/prefix]``; ``options`` are the keyword arguments of ``__init__``.
        ConfigError naming ``--compile-cache-store`` for anything else."""
        bucket, prefix, _ = parse_bucket_url(url, "gs", "bucket", _BUCKET)
        return cls(bucket, prefix, **options)

    def __repr__(self) -> str:
        return f"GCSStore({self.location!r})"

    # -- Store protocol ---------------------------------------------------------------------------------

    def get(self, key: str, dest: Path, *, limit: int | None = None) -> bool:
        """Download bundle ``key`` to ``dest`` (a temp sibling replaced onto it); ``False`` on a miss.

        One GET, checked by the client against the object's CRC32C. With ``limit``, the object's metadata
        is read first: over ``limit`` it is :class:`ObjectTooLarge` before any byte of it moves; then the
        GET is pinned to that generation (GCS answers 412 if it was replaced meanwhile), into a file that
        refuses any byte past ``limit`` all the same (an emulator may not pin). A missing bucket is a
        StoreError, not a miss (confirmed with one listing).
        """
        name = self._name(key)
        dest = Path(dest)
        what = f"{key} in {self.location}"
        with temp_sibling(dest) as tmp:
            try:
                blob = self._blob(name)
                pinned: dict[str, Any] = {}
                if limit is not None:
                    blob.reload(**self._call())
                    if int(blob.size or 0) > limit:
                        raise ObjectTooLarge(f"{what} is {blob.size} bytes, more than {limit}")
                    pinned["if_generation_match"] = blob.generation
                with open(tmp, "r+b") as fh:
                    target = fh if limit is None else BoundedFile(fh, limit, what)
                    blob.download_to_file(target, **pinned, **self._call())
            except _gcs_errors() as exc:
                if _is_not_found(exc):
                    self._check_bucket("get (confirming a miss)")
                    return False
                raise self._error(exc, f"get {key}") from exc
            os.replace(tmp, dest)
        return True

    def get_head(self, key: str, limit: int) -> bytes | None:
        """The first ``limit`` bytes of bundle ``key`` (see :func:`.base.read_head`): one ranged GET; None
        when there is no such object (a missing bucket is a StoreError, as for :meth:`get`)."""
        from google.api_core.exceptions import RequestRangeNotSatisfiable

        name = self._name(key)
        head = _Head(limit)
        try:
            try:
                self._blob(name).download_to_file(head, start=0, end=limit - 1, checksum=None, **self._call())
            except RequestRangeNotSatisfiable:  # an empty object has no byte 0
                return b""
            except _HeadFull:  # a server that ignores Range sends it all: the download stops at the head
                pass
            return bytes(head.data)
        except _gcs_errors() as exc:
            if _is_not_found(exc):
                self._check_bucket("get (confirming a miss)")
                return None
            raise self._error(exc, f"get {key}") from exc

    def put(self, key: str, src: Path) -> None:
        """Upload ``src`` as bundle ``key``, replacing any previous one; readers see the old object or the
        new one, never part of one. Checked by GCS against the CRC32C the client computes."""
        name = self._name(key)
        try:
            self._blob(name).upload_from_filename(str(src), checksum="crc32c", **self._call())
        except _gcs_errors() as exc:
            raise self._error(exc, f"put {key}") from exc

    def list(self, prefix: str = "") -> builtins.list[StoreEntry]:
        """Every bundle whose key starts with ``prefix``, newest first; objects under the store prefix that
        are not ``<valid key>.bundle`` are ignored. StoreError for a missing bucket or any remote trouble."""
        validate_prefix(prefix)
        entries = []
        try:
            listing = self._client_().list_blobs(self.bucket, prefix=f"{self._base}{prefix}", **self._call())
            for blob in bounded_listing(listing.pages, self.location):
                key = listed_key(blob.name, self._base, prefix)
                if key is None or blob.updated is None:  # an answer without the object's time: not one to order
                    continue
                entries.append(StoreEntry(key=key, size=int(blob.size or 0), modified=blob.updated.timestamp()))
        except _gcs_errors() as exc:
            raise self._error(exc, f"list {prefix!r}") from exc
        return newest_first(entries)

    def delete(self, key: str) -> None:
        """Delete bundle ``key``; a missing key is fine, a missing bucket is a StoreError."""
        name = self._name(key)
        try:
            self._blob(name).delete(**self._call())
        except _gcs_errors() as exc:
            if _is_not_found(exc):
                self._check_bucket("delete (confirming a miss)")
                return
            raise self._error(exc, f"delete {key}") from exc

    # -- the client ---------------------------------------------------------------------------------------

    def _client_(self) -> Any:
        """The GCS client, made once (thread-safe). Credentials: ADC, or none with ``STORAGE_EMULATOR_HOST``;
        no project is needed to read and write objects, so none is looked up."""
        with self._lock:
            if self._client is None:
                from google.api_core.client_info import ClientInfo
                from google.cloud import storage

                info = ClientInfo(user_agent=f"pytest-compilecache/{__version__}")  # type: ignore[no-untyped-call]
                client = storage.Client(project=os.environ.get("GOOGLE_CLOUD_PROJECT"), client_info=info)
                # google-cloud-storage 3.x fetches each bucket's metadata for its telemetry in a background
                # thread: a request (and permission, storage.buckets.get) we never asked for, outside the store's
                # timeout and retry budget. Its cache off means no fetch (the client checks it before each one).
                if getattr(client, "_bucket_metadata_cache", None) is not None:
                    client._bucket_metadata_cache = None
                cap_requests_session(client._http, self.location)  # listings and errors: never past MAX_ANSWER
                self._client = client
            return self._client

    def _name(self, key: str) -> str:
        return object_name(self._base, key)

    def _blob(self, name: str) -> Any:
        """Called inside each operation's ``try``: making the client looks credentials up, whose failure is
        a StoreError like any other trouble."""
        return self._client_().bucket(self.bucket).blob(name)

    def _call(self) -> dict[str, Any]:
        """The keyword arguments that bound every request: timeouts and the retry deadline."""
        from google.cloud.storage.retry import DEFAULT_RETRY

        retry = DEFAULT_RETRY.with_timeout(self.retry_deadline) if self.retry_deadline else None  # 0: one attempt
        return {"timeout": (self.connect_timeout, self.read_timeout), "retry": retry}

    def _check_bucket(self, action: str) -> None:
        """Raise StoreError if the bucket is missing: a 404 on an object means a miss only when the bucket is
        there. A listing (``storage.objects.list``, which reading the store needs anyway) says which."""
        try:
            next(iter(self._client_().list_blobs(self.bucket, max_results=1, **self._call())), None)
        except _gcs_errors() as exc:
            raise self._error(exc, action) from exc

    def _error(self, exc: BaseException, action: str) -> StoreError:
        """A one-line StoreError for ``exc`` met while doing ``action``, from its kind and status only."""
        return StoreError(f"{self.location}: {action}: {self._describe(exc)}")

    def _describe(self, exc: BaseException) -> str:
        from google.api_core import exceptions as gx
        from google.auth import exceptions as ax

        if isinstance(exc, gx.RetryError) and exc.cause is not None:
            exc = exc.cause
        endpoint = shown_endpoint(os.environ.get("STORAGE_EMULATOR_HOST") or "https://storage.googleapis.com")
        if isinstance(exc, gx.NotFound):
            return f"bucket {self.bucket} does not exist"
        if isinstance(exc, gx.Unauthorized):
            return "credentials rejected (HTTP 401)"
        if isinstance(exc, gx.Forbidden):
            return "access denied (HTTP 403)"
        if isinstance(exc, gx.GoogleAPICallError):
            return f"HTTP {exc.code} ({type(exc).__name__})"
        if isinstance(exc, ax.DefaultCredentialsError):
            return "no Google credentials found (Application Default Credentials)"
        if isinstance(exc, ax.GoogleAuthError):
            return f"credentials could not be used ({type(exc).__name__})"
        if _is_timeout(exc):
            return f"endpoint {endpoint} did not answer within {self.read_timeout:g} s"
        if _is_connection_error(exc):
            return f"endpoint {endpoint} unreachable"
        return type(exc).__name__


class _HeadFull(Exception):
    """Raised by :class:`_Head` to stop a download once it holds its ``limit`` bytes."""


class _Head:
    """A file for the client's download that keeps the first ``limit`` bytes and then stops it: a server or proxy
    that ignores the Range header never brings more than a chunk past ``limit`` into memory."""

    def __init__(self, limit: int) -> None:
        self.limit, self.data = limit, bytearray()

    def write(self, chunk: bytes) -> int:
        room = self.limit - len(self.data)
        self.data += chunk[:room]
        if len(chunk) > room:
            raise _HeadFull
        return len(chunk)

    def tell(self) -> int:
        return len(self.data)

    def flush(self) -> None:
        pass


def _gcs_errors() -> tuple[type[BaseException], ...]:
    """What the client raises for remote trouble; evaluated only while an ``except`` clause is matched.
    Local file errors (OSError) are not among them: they are the caller's, not the store's."""
    import requests
    from google.api_core.exceptions import GoogleAPIError
    from google.auth.exceptions import GoogleAuthError
    from google.cloud.storage.exceptions import DataCorruption
    from google.cloud.storage.exceptions import InvalidResponse

    return (GoogleAPIError, GoogleAuthError, InvalidResponse, DataCorruption, requests.RequestException)


def _is_not_found(exc: BaseException) -> bool:
    from google.api_core.exceptions import NotFound

    return isinstance(exc, NotFound)


def _is_timeout(exc: BaseException) -> bool:
    import requests

    return isinstance(exc, (requests.Timeout, TimeoutError)) or "timed out" in str(exc).lower()


def _is_connection_error(exc: BaseException) -> bool:
    import requests
    from google.auth.exceptions import TransportError

    return isinstance(exc, (requests.ConnectionError, TransportError, ConnectionError))
