"""Stores move bundle files by key. One protocol (:class:`Store`), one module per backend, one factory.

``open_store`` turns the ``--compile-cache-store`` value into a store:

* ``file:///abs/path`` (or ``file://localhost/abs/path``) or a plain path -> :class:`LocalStore`
  (``~`` is the home dir; a relative plain path is resolved against the current directory);
* ``s3://``, ``gs://``, ``az://`` ... -> the backend of that scheme in :mod:`.table` (its module imported
  lazily, so its SDK is only needed by those who use it; without it, a ConfigError naming the extra);
* anything else -> :class:`ConfigError` naming the option and the value.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any
from typing import Mapping
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
from .table import Backend
from .table import backend_for
from .table import expected
from .table import scheme_of

if TYPE_CHECKING:
    from ..settings import Settings

__all__ = [
    "LocalStore",
    "ObjectTooLarge",
    "ReadOnlyStore",
    "Store",
    "StoreEntry",
    "backend_keywords",
    "newest_first",
    "open_store",
    "prune",
    "refuse_cache_dir",
    "validate_key",
    "validate_prefix",
]

OPTION = "--compile-cache-store"


def _bad(url: str, why: str) -> ConfigError:
    return ConfigError(f"{OPTION}: {why}: {url!r} ({expected()})")


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
    if "\x00" in str(path):
        raise _bad(url, "a NUL character in the path")
    for existing in (path, *path.parents):
        if existing.exists():
            if not existing.is_dir():
                where = "is a file" if existing == path else f"lies under the file {existing}"
                raise ConfigError(f"{OPTION}: {url!r} {where}, not a directory")
            break
    return LocalStore(path)


def _remote(backend: Backend, url: str, options: dict[str, Any]) -> Store:
    """The store of ``backend`` at ``url``: its module imported (which imports no SDK) and its ``from_url``
    called, which checks the URL and reads the backend's own options (URL query, its environment variables)
    without touching the network; then its packages looked up: a missing one is a ConfigError naming the
    extra. So a malformed URL is named as such whether or not the extra is installed."""
    try:
        factory = getattr(importlib.import_module(backend.module), backend.factory)
    except ImportError as exc:
        raise ConfigError(f"{OPTION}: {backend.example} support is not available ({exc})") from exc
    store: Store = factory.from_url(url, **options)
    for module in backend.requires:
        require_package(OPTION, module, backend.extra)
    return store


def backend_keywords(url: str, given: Mapping[str, Any]) -> dict[str, Any]:
    """The ``from_url`` keywords that the backend serving ``url`` takes from ``given`` (plugin-level option
    names, ``Settings.store_options``' and the CLI's: ``{"s3_endpoint": ...}``), as its row of :mod:`.table`
    maps them; options another backend reads, and unset ones, are left out (a ``gs://`` store takes no S3
    endpoint)."""
    backend = backend_for(url)
    return {keyword: given[name] for name, keyword in (backend.settings if backend else {}).items() if given.get(name)}


def refuse_cache_dir(url: str, cache_dir: str | os.PathLike[str], what: str = "the cache dir") -> None:
    """Refuse a directory store that is the cache dir, lies inside it or holds it: a :class:`ConfigError` naming
    :data:`OPTION` (callers respell it as the user gave it). A restore would unpack torch's kernel dirs among the
    bundles, a save put bundles among torch's files; the next session then refuses the dir as someone else's.
    ``what`` names ``cache_dir`` otherwise (another dir the caller empties: the Action's staging dirs). A remote
    store, or a ``url`` that names no store, passes (opening it says what is wrong)."""
    if backend_for(url) is not None:  # a remote store: nothing to open again here
        return
    try:
        store = open_store(url)
    except ConfigError:
        return
    if not isinstance(store, LocalStore):
        return
    root, cache = os.path.realpath(store.root), os.path.realpath(cache_dir)
    if root == cache or root.startswith(cache + os.sep) or cache.startswith(root + os.sep):
        where = "is" if root == cache else ("lies in" if len(root) > len(cache) else "holds")
        raise ConfigError(
            f"{OPTION}: {url!r} {where} {what} {cache_dir}: give the store a directory of its own (bundles and "
            "torch's files never share one)"
        )


def open_store(target: Union[str, os.PathLike[str], Settings], *, readonly: bool = False, **options: Any) -> Store:
    """Build the store that ``target`` names; wrap it in :class:`ReadOnlyStore` when ``readonly``.

    ``target`` is a store URL or path, or the plugin's :class:`~pytest_compilecache.settings.Settings`
    (then its ``store``, ``readonly`` and ``store_options`` are used: the one place that maps options to a
    store; each backend takes the ``store_options`` its row of :mod:`.table` names). ``options`` are
    backend-specific keywords of its ``from_url`` (S3's ``endpoint_url``...); the local store takes none.
    Raises :class:`ConfigError` (naming ``--compile-cache-store``) for an unusable value, a backend whose
    extra is not installed, and a directory store that is, or lies under, a file: construction stats the
    path (no more; the first save makes the dir) and touches no network.
    """
    if not isinstance(target, (str, os.PathLike)):
        settings = target
        for keyword, value in backend_keywords(settings.store or "", dict(settings.store_options)).items():
            options.setdefault(keyword, value)
        return open_store(settings.store or "", readonly=readonly or settings.readonly, **options)
    url = os.fspath(target)
    if not isinstance(url, str) or not url.strip():
        raise _bad(str(url), "empty store")
    if url != url.strip():
        raise _bad(url, "leading or trailing spaces")
    scheme = scheme_of(url)
    store: Store
    backend = backend_for(url)
    if scheme is None:
        store = _local(Path(url).expanduser(), url)  # ~ as --compile-cache-dir takes it (an ini value is not expanded)
    elif scheme == "file" and url[len(scheme) + 1 :].startswith("//"):
        store = _local_from_url(url)
    elif backend is not None:
        store = _remote(backend, url, options)
    else:
        raise _bad(url, "unsupported store")
    return ReadOnlyStore(store) if readonly else store
