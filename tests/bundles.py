"""Test shortcuts over the bundle layers that the package itself has no use for."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_compilecache import bundle
from pytest_compilecache.manifest import Manifest
from pytest_compilecache.stores.base import Store
from pytest_compilecache.stores.base import bundles


@dataclass(frozen=True)
class Unpacked:
    """What :func:`unpack` did: blobs in memory, and the cache-dir files written or found identical."""

    manifest: Manifest
    blobs: dict[str, bytes]
    files: tuple[str, ...]
    unchanged: tuple[str, ...] = ()


def unpack(path: Path, cache_dir: Path, **checks: Any) -> Unpacked:
    """``bundle.verify`` into ``cache_dir``, ``bundle.install``, and the blobs in memory (the tests' shortcut)."""
    with bundle.verify(path, cache_dir=Path(cache_dir), **checks) as verified:
        installed = bundle.install(verified)
        blobs = {name: verified.blob(name) for name in verified.manifest.blob_names}
    return Unpacked(verified.manifest, blobs, installed.files, installed.unchanged)


def member_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def find_latest(store: Store, prefix: str) -> str | None:
    """Newest bundle key starting with ``prefix`` (by modified time, ties: greatest key); None if none."""
    entries = bundles(store, prefix)
    return entries[0].key if entries else None
