"""Stores move bundle files by key. One protocol (:class:`Store`), one module per backend, one factory.

``open_store`` turns the ``--compile-cache-store`` value into a store:

* ``file:///abs/path`` (or ``file://localhost/abs/path``) or a plain path -> :class:`LocalStore`
  (a relative plain path is resolved against the current directory);
* ``s3://bucket[/prefix]`` -> ``pytest_compilecache.stores.s3.S3Store.from_url`` (imported lazily, so boto3
  is only needed by those who use S3);
* anything else -> :class:`ConfigError` naming the option and the value.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import importlib
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any
from typing import Union
from urllib.parse import unquote
from urllib.parse import urlsplit

from ..errors import ConfigError
from ..settings import require_package
from .base import ObjectTooLarge
from .base import Store
from .base import StoreEntry
from .base import newest_first
from .base import prune
from .base import validate_key
from .base import validate_prefix
from .local import LocalStore
from .readonly import ReadOnlyStore

if TYPE_CHECKING:
    from ..settings import Settings

__all__ = [
    "LocalStore",
    "ObjectTooLarge",
    "ReadOnlyStore",
    "Store",
    "StoreEntry",
    "newest_first",
    "open_store",
    "prune",
    "validate_key",
    "validate_prefix",
]

OPTION = "--compile-cache-store"
_EXPECTED = "expected file:///absolute/path, a directory path, or s3://bucket/prefix"
# Two or more characters before ":" so that a Windows drive ("C:\\cache") stays a plain path.
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):")


def _bad(url: str, why: str) -> ConfigError:
    return ConfigError(f"{OPTION}: {why}: {url!r} ({_EXPECTED})")


def _local_from_url(url: str) -> LocalStore:
    parts = urlsplit(url)
    # "file://relative/x" parses "relative" as a host: refuse it rather than guess.
    absolute = parts.path.startswith("/") and not parts.query and not parts.fragment
    if parts.netloc not in ("", "localhost") or not absolute:
        raise _bad(url, "file URLs must be absolute (file:///path)")
    return _local(Path(unquote(parts.path)), url)


def _local(path: Path, url: str) -> LocalStore:
    """A directory store at ``path``; one that is, or lies under, a file stops at start-up (a ConfigError),
    not at the first restore. A path that does not exist yet is fine: the first save makes it."""
    for existing in (path, *path.parents):
        if existing.exists():
            if not existing.is_dir():
                where = "is a file" if existing == path else f"lies under the file {existing}"
                raise ConfigError(f"{OPTION}: {url!r} {where}, not a directory")
            break
    return LocalStore(path)


def _s3_from_url(url: str, options: dict[str, Any]) -> Store:
    if not urlsplit(url).netloc:
        raise _bad(url, "S3 URLs need a bucket")
    require_package(OPTION, "boto3", "s3")
    try:
        s3 = importlib.import_module("pytest_compilecache.stores.s3")
    except ModuleNotFoundError as exc:
        raise ConfigError(f"{OPTION}: S3 support is not available ({exc})") from exc
    store: Store = s3.S3Store.from_url(url, **options)
    return store


def open_store(target: Union[str, os.PathLike[str], Settings], *, readonly: bool = False, **options: Any) -> Store:
    """Build the store that ``target`` names; wrap it in :class:`ReadOnlyStore` when ``readonly``.

    ``target`` is a store URL or path, or the plugin's :class:`~pytest_compilecache.settings.Settings`
    (then its ``store``, ``readonly`` and ``s3_endpoint`` are used: the one place that maps options to a
    store). ``options`` are backend-specific and passed to ``S3Store.from_url`` (``endpoint_url``...); the
    local store takes none. Raises :class:`ConfigError` (naming ``--compile-cache-store``) for an unusable
    value, and for a directory store that is, or lies under, a file: construction stats the path (no more;
    the first save makes the dir) and touches no network.
    """
    if not isinstance(target, (str, os.PathLike)):
        settings = target
        if settings.s3_endpoint:
            options.setdefault("endpoint_url", settings.s3_endpoint)
        return open_store(settings.store or "", readonly=readonly or settings.readonly, **options)
    url = os.fspath(target)
    if not isinstance(url, str) or not url.strip():
        raise _bad(str(url), "empty store")
    if url != url.strip():
        raise _bad(url, "leading or trailing spaces")
    match = _SCHEME.match(url)
    store: Store
    if match is None:
        store = _local(Path(url), url)
    else:
        scheme, rest = match.group(1).lower(), url[match.end() :]
        if scheme == "file" and rest.startswith("//"):
            store = _local_from_url(url)
        elif scheme == "s3" and rest.startswith("//"):
            store = _s3_from_url(url, options)
        else:
            raise _bad(url, "unsupported store")
    return ReadOnlyStore(store) if readonly else store
