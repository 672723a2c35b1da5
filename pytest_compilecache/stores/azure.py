"""Azure Blob Storage store: one block blob ``<prefix>/<key>.bundle`` per bundle, ``az://container[/prefix]``.

The vendor's clients (``azure-storage-blob`` and ``azure-identity``, the ``azure`` extra), imported lazily
inside the methods that talk to Azure: importing this module and building a store cost nothing and touch
no network. The account and its credentials come from the first of these that is given:

1. the store URL's ``?account=NAME`` (``https://NAME.blob.core.windows.net``), with ``DefaultAzureCredential``
   (environment, workload identity / ``azure/login`` OIDC, managed identity, the Azure CLI);
2. ``AZURE_STORAGE_CONNECTION_STRING`` (an account key or a SAS in a connection string; Azurite's too);
3. ``AZURE_STORAGE_ACCOUNT_NAME``, or else ``AZURE_STORAGE_ACCOUNT_URL`` for another endpoint, with
   ``DefaultAzureCredential``.

Only the one used is checked: a malformed variable that a connection string makes unused is no error.

Neither is needed to build a store: their absence is a StoreError at the first call (one warning and a
cold compile, as a store that is down). Errors: a missing blob is a miss (``get`` returns ``False``);
everything else (endpoint down or silent, no or rejected credentials, access denied, missing container) is
a :class:`StoreError` whose one-line message starts with :attr:`AzureStore.location` and is written from
the error's kind, HTTP status and Azure error code only: never from a response's text, a URL (a SAS is a
query string) or the connection string. The client's exception is chained as ``__cause__``.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import builtins
import logging
import os
import re
import threading
from pathlib import Path
from typing import Any
from typing import Callable
from typing import Mapping
from urllib.parse import urlsplit

from .._version import __version__
from ..errors import ConfigError
from ..errors import StoreError
from .answers import capped_requests_session
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

__all__ = ["AzureStore"]

CONNECTION_STRING_ENV = "AZURE_STORAGE_CONNECTION_STRING"
ACCOUNT_URL_ENV = "AZURE_STORAGE_ACCOUNT_URL"
ACCOUNT_NAME_ENV = "AZURE_STORAGE_ACCOUNT_NAME"
# Container names: 3-63 lower case letters, digits and single hyphens, starting and ending with a letter or digit.
_CONTAINER = r"(?!.*--)[a-z0-9][a-z0-9-]{1,61}[a-z0-9]"
_ACCOUNT = r"[a-z0-9]{3,24}"
_PARALLEL = 4  # blocks moved at once by a big upload or download (the client's chunks: 4 MiB and up)
_MISSING_CONTAINER = {"ContainerNotFound", "ContainerBeingDeleted"}
_BAD_CREDENTIALS = {"AuthenticationFailed", "InvalidAuthenticationInfo", "NoAuthenticationInformation"}
_QUIET = logging.NullHandler()  # one instance: adding it again is a no-op


class AzureStore:
    """Bundles in an Azure Blob container under a prefix. Implements :class:`~pytest_compilecache.stores.base.Store`.

    Each request waits at most ``connect_timeout`` to connect and ``read_timeout`` per socket read, in at
    most ``max_attempts`` attempts (the client's exponential retry in between). Uploads are block blobs,
    visible only once committed whole; each request's body is checked against its MD5 (``validate_content``).
    A download with a ``limit`` is pinned to the ETag it sized (``If-Match``), so a blob replaced meanwhile
    fails instead of mixing two versions.
    """

    def __init__(
        self,
        container: str,
        prefix: str = "",
        *,
        account_url: str | None = None,
        connection_string: str | None = None,
        connect_timeout: float = 3,
        read_timeout: float = 10,
        max_attempts: int = 2,
    ) -> None:
        """Store the settings only; the client is made on first use. See :meth:`from_url`."""
        for name, value in (("connect_timeout", connect_timeout), ("read_timeout", read_timeout)):
            if not value > 0:
                raise ConfigError(f"{OPTION}: Azure {name} must be > 0, got {value!r}")
        if max_attempts < 1:
            raise ConfigError(f"{OPTION}: Azure max_attempts must be >= 1, got {max_attempts}")
        self.container = container
        self.prefix = prefix.strip("/")
        self.account_url = account_url
        self._connection_string = connection_string  # a secret: in no message, repr or log
        self.connect_timeout, self.read_timeout, self.max_attempts = connect_timeout, read_timeout, max_attempts
        self.location = f"az://{container}/{self.prefix}" if self.prefix else f"az://{container}"
        self._base = f"{self.prefix}/" if self.prefix else ""
        self._client: Any = None
        self._lock = threading.Lock()

    @classmethod
    def from_url(cls, url: str, *, environ: Mapping[str, str] | None = None, **options: Any) -> AzureStore:
        """Build a store from ``az://container[/prefix][?account=NAME]`` and the environment (see the module
        doc); ``options`` are the keyword arguments of ``__init__``. ConfigError naming
        ``--compile-cache-store`` for a malformed URL, account name or account URL."""
        environ = os.environ if environ is None else environ
        container, prefix, query = parse_bucket_url(url, "az", "container", _CONTAINER, query=("account",))
        if "connection_string" not in options and "account_url" not in options:
            if query.get("account"):
                options["account_url"] = _account_name_url(query["account"], "account=")
            elif environ.get(CONNECTION_STRING_ENV):
                options["connection_string"] = environ[CONNECTION_STRING_ENV]
            elif environ.get(ACCOUNT_NAME_ENV):
                options["account_url"] = _account_name_url(environ[ACCOUNT_NAME_ENV], ACCOUNT_NAME_ENV)
            elif environ.get(ACCOUNT_URL_ENV):
                options["account_url"] = _account_url(environ[ACCOUNT_URL_ENV])
        return cls(container, prefix, **options)

    def __repr__(self) -> str:
        return f"AzureStore({self.location!r}, account_url={self.account_url!r})"

    # -- Store protocol ---------------------------------------------------------------------------------

    def get(self, key: str, dest: Path, *, limit: int | None = None) -> bool:
        """Download bundle ``key`` to ``dest`` (a temp sibling replaced onto it); ``False`` on a miss.

        The client pins every chunk after the first to the first one's ETag, so a blob replaced during a
        download is a StoreError, never a file mixing two versions. With ``limit``, the blob's properties
        are read first: over ``limit`` it is :class:`ObjectTooLarge` before any byte of it moves; then the
        download is pinned to that ETag (``If-Match``), into a file that refuses any byte past ``limit``
        all the same. A missing container is a StoreError (Azure says which is missing, even on a HEAD).
        """
        from azure.core import MatchConditions

        name = self._name(key)
        dest = Path(dest)
        what = f"{key} in {self.location}"
        with temp_sibling(dest) as tmp:
            try:
                blob = self._blob(name)
                pinned: dict[str, Any] = {}
                if limit is not None:
                    properties = blob.get_blob_properties()
                    if int(properties.size) > limit:
                        raise ObjectTooLarge(f"{what} is {properties.size} bytes, more than {limit}")
                    pinned = {"etag": properties.etag, "match_condition": MatchConditions.IfNotModified}
                download = blob.download_blob(
                    max_concurrency=_PARALLEL, raw_response_hook=_answer_check(self.location, limit), **pinned
                )
                with open(tmp, "r+b") as fh:
                    download.readinto(fh if limit is None else BoundedFile(fh, limit, what))
            except _azure_errors() as exc:
                if _is_missing_blob(exc):
                    return False
                raise self._error(exc, f"get {key}") from exc
            os.replace(tmp, dest)
        return True

    def get_head(self, key: str, limit: int) -> bytes | None:
        """The first ``limit`` bytes of bundle ``key`` (see :func:`.base.read_head`): one ranged GET; None
        when there is no such blob (a missing container is a StoreError, as for :meth:`get`)."""
        name = self._name(key)
        try:
            hook = _answer_check(self.location, limit)
            data = self._blob(name).download_blob(offset=0, length=limit, raw_response_hook=hook).readall()
        except _azure_errors() as exc:
            if _error_code(exc) == "InvalidRange":  # an empty blob has no byte 0
                return b""
            if _is_missing_blob(exc):
                return None
            raise self._error(exc, f"get {key}") from exc
        return bytes(data[:limit])

    def put(self, key: str, src: Path) -> None:
        """Upload ``src`` as bundle ``key``, replacing any previous one: a block blob, committed whole, so
        readers see the old blob or the new one, never part of one."""
        name = self._name(key)
        with open(src, "rb") as fh:  # a missing source is the caller's OSError, not the store's trouble
            try:
                blob = self._blob(name)
                blob.upload_blob(fh, overwrite=True, validate_content=True, max_concurrency=_PARALLEL)
            except _azure_errors() as exc:
                raise self._error(exc, f"put {key}") from exc

    def list(self, prefix: str = "") -> builtins.list[StoreEntry]:
        """Every bundle whose key starts with ``prefix``, newest first; blobs under the store prefix that are
        not ``<valid key>.bundle`` are ignored. StoreError for a missing container or any remote trouble."""
        validate_prefix(prefix)
        entries = []
        try:
            listing = self._container().list_blobs(name_starts_with=f"{self._base}{prefix}")
            for item in bounded_listing(listing.by_page(), self.location):
                key = listed_key(item.name, self._base, prefix)
                if key is None or item.size is None or item.last_modified is None:  # not a blob we could restore
                    continue
                entries.append(StoreEntry(key=key, size=int(item.size), modified=item.last_modified.timestamp()))
        except _azure_errors() as exc:
            raise self._error(exc, f"list {prefix!r}") from exc
        return newest_first(entries)

    def delete(self, key: str) -> None:
        """Delete bundle ``key``; a missing key is fine, a missing container is a StoreError."""
        name = self._name(key)
        try:
            self._blob(name).delete_blob()
        except _azure_errors() as exc:
            if not _is_missing_blob(exc):
                raise self._error(exc, f"delete {key}") from exc

    # -- the client ---------------------------------------------------------------------------------------

    def _container(self) -> Any:
        """The container's client, made once (thread-safe), with our timeouts and retry budget."""
        with self._lock:
            if self._client is None:
                from azure.storage.blob import ContainerClient
                from azure.storage.blob import ExponentialRetry

                settings: dict[str, Any] = {
                    "connection_timeout": self.connect_timeout,
                    "read_timeout": self.read_timeout,
                    # The client's default waits 15 s (then 18, 24) before a retry: ~20 s an operation against an
                    # endpoint that is down. 1 s, then 3, 5 (+-1) instead, about what the S3 store waits.
                    "retry_policy": ExponentialRetry(
                        initial_backoff=1, increment_base=2, retry_total=self.max_attempts - 1, random_jitter_range=1
                    ),
                    "user_agent": f"pytest-compilecache/{__version__}",
                    # listings and errors are read whole: never past MAX_ANSWER (downloads are streamed, and checked)
                    "session": capped_requests_session(self.location),
                }
                if self._connection_string:
                    try:
                        self._client = ContainerClient.from_connection_string(
                            self._connection_string, self.container, **settings
                        )
                    except ValueError:  # the client's words may quote the string: ours name it only
                        unusable = f"{CONNECTION_STRING_ENV} is not a usable connection string"
                        raise StoreError(f"{self.location}: {unusable}") from None
                elif self.account_url:
                    from azure.identity import DefaultAzureCredential

                    # Where no logging is configured (the command line, the Action's steps), Python prints the
                    # credential chain's warnings to stderr: ~12 lines an attempt, where our StoreError says it
                    # in one. A NullHandler ends only that fallback; configured handlers still get every record.
                    logging.getLogger("azure.identity").addHandler(_QUIET)
                    credential = DefaultAzureCredential()
                    self._client = ContainerClient(self.account_url, self.container, credential=credential, **settings)
                else:
                    raise StoreError(
                        f"{self.location}: no Azure account: set {CONNECTION_STRING_ENV}, {ACCOUNT_NAME_ENV} or "
                        f"{ACCOUNT_URL_ENV}, or add ?account=NAME to the store URL"
                    )
            return self._client

    def _name(self, key: str) -> str:
        return object_name(self._base, key)

    def _blob(self, name: str) -> Any:
        """Called inside each operation's ``try``: the client is made on first use."""
        return self._container().get_blob_client(name)

    def _error(self, exc: BaseException, action: str) -> StoreError:
        """A one-line StoreError for ``exc`` met while doing ``action``: kind, status and error code only."""
        return StoreError(f"{self.location}: {action}: {self._describe(exc)}")

    def _describe(self, exc: BaseException) -> str:
        from azure.core import exceptions as ax

        inner = getattr(exc, "inner_exception", None)
        if isinstance(exc, ax.HttpResponseError) and exc.status_code is None and isinstance(inner, ax.AzureError):
            # The client's own retries of a download's first answer end in an HttpResponseError wrapping the
            # last error (a read that timed out, an answer that broke off): that one says what happened.
            return self._describe(inner)
        if isinstance(exc, ax.IncompleteReadError):
            return f"endpoint {self._endpoint()} broke off its answer"
        code = _error_code(exc)
        status = getattr(exc, "status_code", None)
        endpoint = self._endpoint()
        if code in _MISSING_CONTAINER:
            return f"container {self.container} does not exist"
        if isinstance(exc, ax.ClientAuthenticationError) and status is None:
            return f"credentials could not be obtained ({type(exc).__name__})"
        if code in _BAD_CREDENTIALS or status == 401:
            return f"credentials rejected ({code or 'HTTP 401'})"
        if status == 403:
            return f"access denied ({code or 'HTTP 403'})"
        if isinstance(exc, ax.HttpResponseError) and status is not None:
            return f"{code or 'error'} (HTTP {status})"
        if isinstance(exc, ax.ServiceResponseError):
            return f"endpoint {endpoint} did not answer within {self.read_timeout:g} s"
        if isinstance(exc, ax.ServiceRequestError):
            return f"endpoint {endpoint} unreachable"
        if type(exc) is ValueError:  # its text is the client's; not repeated, in case it quotes a setting
            return "the client refused the answer or a setting (ValueError)"
        return type(exc).__name__

    def _endpoint(self) -> str:
        """The blob endpoint's scheme, host and port: no path or query (a SAS token is a query string)."""
        return shown_endpoint(self._client.url if self._client is not None else (self.account_url or ""))


def _answer_check(location: str, cap: int | None) -> Callable[[Any], None]:
    """A ``raw_response_hook`` for a download's requests. The client reads each answer whole into memory
    (the first one before :meth:`AzureStore.get` sees a byte), so a server that sends more than the range
    asked for, or sends without end, would cost as much memory as it sends. From the answer's headers,
    before its body is read: a successful answer must state its length (``Content-Length``), at most the
    range it answers (``x-ms-range``) and at most ``cap`` bytes, else a StoreError that ends the download
    unretried."""

    def check(response: Any) -> None:
        answer = response.http_response
        if not 200 <= answer.status_code < 300:
            return  # an error answer: the client reads and reports it
        bounds = [_range_size(response.http_request.headers.get("x-ms-range")), cap]
        most = min((bound for bound in bounds if bound is not None), default=None)
        stated = answer.headers.get("Content-Length", "")
        if most is not None and not (stated.isdigit() and int(stated) <= most):
            answer.close()
            sent = f"{stated} bytes" if stated.isdigit() else "an answer of no stated length"
            raise StoreError(f"{location}: the endpoint sent {sent} where at most {most} were asked for")

    return check


def _range_size(header: str | None) -> int | None:
    """The number of bytes ``x-ms-range: bytes=START-END`` asks for; None for no (or an open) range."""
    match = re.fullmatch(r"bytes=(\d+)-(\d+)", header or "")
    return int(match[2]) - int(match[1]) + 1 if match else None


def _account_name_url(account: str, where: str) -> str:
    """The blob endpoint of storage account ``account`` (from ``where``), else ConfigError naming ``where``."""
    if not re.fullmatch(_ACCOUNT, account):
        raise ConfigError(f"{OPTION}: {where}: {account!r} is not a storage account name (3-24 a-z 0-9)")
    return f"https://{account}.blob.core.windows.net"


def _account_url(value: str) -> str:
    """``AZURE_STORAGE_ACCOUNT_URL``: an http(s) URL without credentials or query (a SAS goes into the
    connection string), else ConfigError naming the variable (never repeating a query that may be a SAS)."""
    try:
        parts = urlsplit(value.strip())
    except ValueError:  # an invalid bracketed host: "https://[bad"
        parts = urlsplit("")
    credentials = parts.username is not None or parts.password is not None or "@" in parts.netloc
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or credentials:
        shown = f"{parts.scheme}://{parts.hostname}" if parts.hostname else "(not a URL)"
        raise ConfigError(
            f"{OPTION}: {ACCOUNT_URL_ENV} must be an http(s)://host[/account] URL without a query or credentials, "
            f"got {shown}..."
        )
    return value.strip()


def _azure_errors() -> tuple[type[BaseException], ...]:
    """What the client raises for remote trouble (credential errors included); evaluated only while an
    ``except`` clause is matched. Local file errors (OSError) are the caller's, not the store's. The client also
    raises a bare ValueError for an answer it cannot use (a ranged download answered without ``Content-Range``)
    and for a token credential over plain http: trouble with this store, never a crash of the session."""
    from azure.core.exceptions import AzureError

    return (AzureError, ValueError)


def _error_code(exc: BaseException) -> str | None:
    code = getattr(exc, "error_code", None)
    if code is None:
        response = getattr(exc, "response", None)
        code = getattr(response, "headers", {}).get("x-ms-error-code") if response is not None else None
    code = getattr(code, "value", code)  # the client's StorageErrorCode enum, or the header's text
    return str(code) if code else None


def _is_missing_blob(exc: BaseException) -> bool:
    """A 404 for the blob itself; Azure says ContainerNotFound for a missing container, even on a HEAD."""
    from azure.core.exceptions import ResourceNotFoundError

    return isinstance(exc, ResourceNotFoundError) and _error_code(exc) not in _MISSING_CONTAINER
