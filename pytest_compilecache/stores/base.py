"""The :class:`Store` protocol every backend implements, key validation, :func:`bundles` and :func:`prune`.

A store moves opaque bundle files by key; it knows nothing about their content or about pytest.
A miss is a value (``False`` / ``None`` / ``[]``), never an exception; trouble reaching or writing the
store is a :class:`StoreError`, which callers turn into one warning and a cold compile.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import builtins
import contextlib
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any
from typing import BinaryIO
from typing import Callable
from typing import Protocol
from typing import runtime_checkable
from urllib.parse import parse_qsl
from urllib.parse import urlsplit

from ..errors import ConfigError
from ..errors import NoPartialReads
from ..errors import ObjectTooLarge
from ..errors import StoreError
from ..errors import TimedOut

if TYPE_CHECKING:
    from collections.abc import Iterable
    from collections.abc import Iterator

__all__ = [
    "BoundedFile",
    "NoPartialReads",
    "ObjectTooLarge",
    "Store",
    "StoreEntry",
    "bundles",
    "is_artifact_key",
    "newest_first",
    "prune",
    "parse_bucket_url",
    "read_head",
    "temp_sibling",
    "validate_key",
    "validate_prefix",
]

MAX_KEY_LENGTH = 512
_KEY = re.compile(rf"^[A-Za-z0-9_-][A-Za-z0-9._-]{{0,{MAX_KEY_LENGTH - 1}}}$")
_PREFIX = re.compile(rf"^[A-Za-z0-9._-]{{0,{MAX_KEY_LENGTH}}}$")
# headers.object_key(): "<prefix>-artifact-<sha256>". Spelled here too so that listing code never imports
# headers (and its hashing) just to tell an artifact object from a bundle.
_ARTIFACT_KEY = re.compile(r".*-artifact-[0-9a-f]{64}")


@dataclass(frozen=True)
class StoreEntry:
    """One stored object: its key, size in bytes and modification time (epoch seconds)."""

    key: str
    size: int
    modified: float


@runtime_checkable
class Store(Protocol):
    """Moves bundle files by key. Keys are checked with :func:`validate_key` (``ConfigError``)."""

    location: str
    """Human-readable location, e.g. ``file:///path`` or ``s3://bucket/prefix``."""

    def get(self, key: str, dest: Path, *, limit: int | None = None) -> bool:
        """Download ``key`` to ``dest`` atomically (temp sibling + replace, parent dirs created); False on a miss.

        With ``limit``, an object of more than ``limit`` bytes raises :class:`ObjectTooLarge` and leaves
        nothing at ``dest``, after transferring at most about ``limit`` bytes of it.
        """
        ...

    def put(self, key: str, src: Path) -> None:
        """Upload ``src`` as ``key`` atomically: no reader ever sees a partial object."""
        ...

    def list(self, prefix: str = "") -> builtins.list[StoreEntry]:
        """Entries whose key starts with ``prefix``, newest first (see :func:`newest_first`)."""
        ...

    def delete(self, key: str) -> None:
        """Remove ``key``; a missing key is fine."""
        ...


def read_head(store: Store, key: str, limit: int) -> bytes | None:
    """The first ``limit`` bytes of ``key`` (all of it when shorter); None on a miss.

    An optional capability, outside the :class:`Store` protocol: a backend that can read the start of an
    object without the rest (a file seek, an HTTP ``Range``) offers it as ``get_head(key, limit)`` with these
    semantics, transferring at most about ``limit`` bytes; wrappers pass it through. For a bundle's header
    (:func:`~pytest_compilecache.container.header_size`): explaining a miss from another fingerprint's
    bundle, ordering candidates by their signed time. :class:`NoPartialReads` when the store has none;
    ConfigError for a bad key; ValueError for a ``limit`` under 1; StoreError for trouble, as ``get``.
    """
    get_head = getattr(store, "get_head", None)
    if get_head is None:
        raise NoPartialReads(f"{store.location} cannot read part of an object")
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"read_head: limit must be a whole number >= 1, got {limit!r}")
    data = get_head(key, limit)
    return None if data is None else bytes(data[:limit])


def validate_key(key: str) -> str:
    """Return ``key`` if it is 1..512 chars of ``[A-Za-z0-9._-]`` not starting with ``.``; else ConfigError.

    This keeps keys safe as file names and object names everywhere: no ``/``, no ``..``, no hidden files.
    """
    if not isinstance(key, str) or not _KEY.fullmatch(key):
        raise ConfigError(
            f"invalid cache key {key!r}: use 1-{MAX_KEY_LENGTH} characters from [A-Za-z0-9._-], not starting with '.'"
        )
    return key


def validate_prefix(prefix: str) -> str:
    """Return ``prefix`` if it could start a valid key (possibly empty); else ConfigError."""
    if not isinstance(prefix, str) or not _PREFIX.fullmatch(prefix) or prefix.startswith("."):
        raise ConfigError(
            f"invalid cache key prefix {prefix!r}: use up to {MAX_KEY_LENGTH} characters from "
            "[A-Za-z0-9._-], not starting with '.'"
        )
    return prefix


def newest_first(entries: builtins.list[StoreEntry]) -> builtins.list[StoreEntry]:
    """Sort newest first; equal times put the greater key first, so the order is total and stable."""
    return sorted(entries, key=lambda entry: (entry.modified, entry.key), reverse=True)


def is_artifact_key(key: str) -> bool:
    """True for a content-addressed artifact object (``<prefix>-artifact-<sha256>``), which is not a bundle.

    Artifacts (torch's precompiled headers, :mod:`~pytest_compilecache.pch`) share the key prefix with
    the bundles that name them; everything that picks or counts bundles by a prefix skips them.
    """
    return bool(_ARTIFACT_KEY.fullmatch(key))


def bundles(store: Store, prefix: str) -> builtins.list[StoreEntry]:
    """The bundle entries under ``prefix``, newest first: ``store.list`` without artifact objects, and without
    any entry outside ``prefix`` that a store's listing let through (what :func:`prune` deletes is checked here,
    not trusted)."""
    return [entry for entry in store.list(prefix) if entry.key.startswith(prefix) and not is_artifact_key(entry.key)]


def prune(
    store: Store,
    prefix: str,
    keep: int,
    *,
    magic: bytes = b"",
    rest: str | None = None,
    proven: Callable[[str], bool] | None = None,
) -> builtins.list[str]:
    """Keep the newest ``keep`` bundles under ``prefix``, delete the older ones; return the deleted keys.

    ``prefix`` is whole parts of a key: a key prefix (``compilecache-v1``) or a lineage
    (``compilecache-v1-<digest>-``); ``-`` is added when it does not end with one, so ``projA`` never takes
    ``projAB-...``. With ``rest`` (a regular expression), only keys whose part after ``prefix`` matches it in
    full count: the CLI's for a key prefix is ``<digest>-<suffix>``, so that ``proj`` never takes a longer key
    prefix's ``proj-gpu-<digest>-...``. An empty prefix (every project's bundles) is a ConfigError. With
    ``magic`` (the bundle format's first bytes), only objects whose first bytes prove them bundles count (a ranged
    read, :func:`read_head`): the newest ``keep`` of them are kept, the older ones deleted; one that does not,
    or whose first bytes cannot be read (a store without partial reads, an object the store refuses to read,
    such as a link in a directory store), is left alone and takes no kept bundle's place. ``proven`` (a check of
    a key's bundle that reads more than its first bytes, e.g. that its header is signed with this project's key)
    takes the place of ``magic``'s: one it does not prove is left alone the same way, so two projects that share
    a store, a prefix and a fingerprint but sign with their own keys never prune each other's bundles.

    Artifact objects (:func:`is_artifact_key`) are never deleted nor counted, whatever the prefix: they are
    content-addressed and shared by every bundle of the prefix that names their sha256 (also by bundles of
    other fingerprints and lineages than the one being pruned), so proving that no kept bundle names one
    would mean downloading every kept bundle. One exists per distinct header (compiler, flags and torch
    build: ~21 MiB each), so they grow with upgrades, not with runs; clear them with the store's own tools
    (or an expiry rule on ``*-artifact-*``) when the toolchain changes. A bundle that names a missing
    artifact still restores: that header is a warning and torch builds it.

    ``keep`` must be >= 0 (ConfigError otherwise). StoreError from the store propagates, e.g. read-only.
    """
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 0:
        raise ConfigError(f"prune: keep must be a non-negative whole number, got {keep!r}")
    if not prefix:
        raise ConfigError("prune: the prefix must not be empty (it would take every project's bundles in the store)")
    prefix = prefix if prefix.endswith("-") else prefix + "-"
    shape = None if rest is None else re.compile(re.escape(prefix) + f"(?:{rest})")
    deleted: builtins.list[str] = []
    kept = 0
    for entry in bundles(store, prefix):
        if shape is not None and not shape.fullmatch(entry.key):
            continue
        if not (proven(entry.key) if proven is not None else not magic or _starts_with(store, entry.key, magic)):
            continue  # not proven a bundle (ours): neither kept in a bundle's place nor deleted
        if kept < keep:
            kept += 1
            continue
        store.delete(entry.key)
        deleted.append(entry.key)
    return deleted


def _starts_with(store: Store, key: str, magic: bytes) -> bool:
    try:
        return read_head(store, key, len(magic)) == magic
    except TimedOut:
        raise  # the budget is spent: the prune stops here
    except StoreError:  # NoPartialReads, or an object this store will not read: not proven ours, kept
        return False


# --- shared by the remote backends -------------------------------------------------------------------------

OPTION = "--compile-cache-store"
BUNDLE_SUFFIX = ".bundle"


def object_name(base: str, key: str) -> str:
    """The object that holds bundle ``key`` in a remote store whose URL prefix is ``base`` (with its ``/``):
    ``<base><key>.bundle``; ConfigError for an invalid key. :func:`listed_key` reads such a name back."""
    return f"{base}{validate_key(key)}{BUNDLE_SUFFIX}"


# Objects one listing may walk under a store's prefix: far more than a store of bundles and headers holds, and a
# bound on a listing that never ends (a server that repeats its page token, or makes up a new one each page).
MAX_LISTED = 100_000


# Pages a listing may take: a full one holds 1000 objects (S3, GCS) or 5000 (Azure), so MAX_LISTED objects
# need a hundred; a server may send short or empty pages, but not this many.
MAX_PAGES = 1000 + MAX_LISTED // 100


def bounded_listing(pages: Iterable[Iterable[Any]], location: str) -> Iterator[Any]:
    """The items of ``pages`` (a client's paged listing, page by page), or StoreError past :data:`MAX_LISTED`
    items or :data:`MAX_PAGES` pages: a server that repeats its page token, or makes up a new one for every
    page, empty pages too, makes the client's listing endless."""
    listed = 0
    for count, page in enumerate(pages, 1):
        for item in page:
            listed += 1
            if listed > MAX_LISTED:
                break
            yield item
        if listed > MAX_LISTED or count >= MAX_PAGES:
            raise StoreError(
                f"{location}: list: more than {MAX_LISTED} objects or {MAX_PAGES} pages, or a listing that never "
                "ends (a server repeating or making up its page token)"
            )


def shown_endpoint(url: str) -> str:
    """``url`` (an endpoint from the environment, a profile or a connection string) as a message may show it:
    its scheme, host and port, never a user, password, path or query (an access key, a SAS token)."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    try:
        host, port = parts.hostname, parts.port
    except ValueError:  # a port that is no number
        host, port = parts.hostname, None
    if not host:
        return "(unknown)"
    shown = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{shown}" + (f":{port}" if port is not None else "")


def listed_key(name: str, base: str, prefix: str) -> str | None:
    """The key of the object ``name`` that a listing under ``base + prefix`` returned (``base``: the store URL's
    prefix with its ``/``), or None when it is not ``<base><a valid key starting with prefix>.bundle``. A listing
    is checked, not trusted: a server or proxy that ignores the prefix filter hands back objects that are not
    this store's to count or delete; ``<base>sub/x.bundle`` is not ours either (``/`` is not valid in a key)."""
    if not name.startswith(base) or not name.endswith(BUNDLE_SUFFIX):
        return None
    key = name[len(base) : -len(BUNDLE_SUFFIX)]
    if not key.startswith(prefix):
        return None
    try:
        validate_key(key)
    except ValueError:  # ConfigError is a ValueError
        return None
    return key


def parse_bucket_url(
    url: str, scheme: str, name: str, pattern: str, *, query: tuple[str, ...] = ()
) -> tuple[str, str, dict[str, str]]:
    """``(bucket, prefix, query)`` of ``<scheme>://<bucket>[/prefix][?k=v]``; else a ConfigError naming
    ``--compile-cache-store``. ``name`` says what the bucket is called (bucket, container) and ``pattern``
    what it may be; ``query`` the keys a backend reads from the URL (each at most once). No credentials,
    ports, fragments, or empty, ``.`` or ``..`` prefix segments: secrets belong in the environment."""
    expected = f"expected {scheme}://{name}[/prefix]"
    if any(ord(ch) < 0x20 or ch == "\x7f" for ch in url):
        # urlsplit would drop a tab or newline silently (another prefix than the one typed) and keep a NUL.
        raise ConfigError(f"{OPTION}: the {scheme}:// URL holds a control character; {expected}")
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # an unbalanced or invalid bracketed host: "gs://[x/p"
        raise ConfigError(f"{OPTION}: not a valid {scheme}:// URL ({exc}); {expected}") from None
    prefix = parts.path.strip("/")
    try:
        given = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError:
        given = [("", "")]
    problem = None
    if parts.scheme.lower() != scheme:
        problem = f"the scheme must be {scheme}://"
    elif parts.username or parts.password or ":" in parts.netloc:
        problem = "credentials and ports do not belong in the URL (use the environment)"
    elif not re.fullmatch(pattern, parts.netloc):
        problem = f"{parts.netloc!r} is not a valid {name} name"
    elif parts.fragment:
        problem = "fragments are not supported"
    elif any(key not in query for key, _ in given):
        # The keys only: a value may be a secret (a SAS's sig=...).
        keys = ", ".join(sorted({key or "(empty)" for key, _ in given if key not in query}))
        allowed = f"only {', '.join(query)}" if query else "none"
        problem = f"unsupported query key {keys} (allowed: {allowed})"
    elif any(not value for _, value in given) or len({key for key, _ in given}) < len(given):
        problem = f"each of {', '.join(query)} once, with a value"
    elif prefix and any(segment in ("", ".", "..") for segment in prefix.split("/")):
        problem = f"the prefix {parts.path!r} has an empty, '.' or '..' segment"
    if problem:
        # Credentials and the query are left out of the message: whatever they hold is not repeated into a log.
        shown = f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}{parts.path}"
        raise ConfigError(f"{OPTION}: {shown!r} is not a valid {scheme}:// URL ({problem}); {expected}")
    return parts.netloc, prefix, dict(given)


@contextlib.contextmanager
def temp_sibling(dest: Path) -> Iterator[Path]:
    """A new empty temp file next to ``dest`` (its parents made) for a download that the caller
    ``os.replace``s onto ``dest`` once complete; removed on the way out whatever happened (a no-op after the
    replace), so a failed or refused download leaves neither ``dest`` nor a partial file."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
    finally:
        tmp.unlink(missing_ok=True)


class BoundedFile:
    """A seekable file for an SDK's writes (ranged parts land at their offsets) that refuses any byte past
    ``limit``: :class:`ObjectTooLarge`, which fails the transfer."""

    def __init__(self, fh: BinaryIO, limit: int, what: str) -> None:
        self.fh, self.limit, self.what = fh, limit, what

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self.fh.seek(offset, whence)

    def tell(self) -> int:
        return self.fh.tell()

    def flush(self) -> None:
        self.fh.flush()

    def write(self, data: bytes) -> int:
        if self.fh.tell() + len(data) > self.limit:
            raise ObjectTooLarge(f"{self.what} is more than {self.limit} bytes")
        return self.fh.write(data)
