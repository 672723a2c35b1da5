"""Save: pack this session's artifacts into one bundle bound to its key and lineage, put it, prune old ones.

Loaded lazily: nothing (a save imports no torch: the mega-cache blobs were taken by each process).
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from dataclasses import field
from functools import partial
from pathlib import Path
from typing import Any
from typing import Iterable
from typing import Mapping

from .. import bundle
from .._fs import temporary_dir
from ..bundle import DEFAULT_MAX_BYTES
from ..errors import BundleError
from ..errors import StoreError
from ..errors import TimedOut
from ..fingerprint import Fingerprint
from ..fingerprint import make_key
from ..fingerprint import restore_prefix
from ..ghrunner import one_line
from ..manifest import Artifact
from ..manifest import Manifest
from ..stores.base import Store
from ..stores.base import prune
from .precompiled import save_precompiled
from .results import HeaderReport
from .results import SaveResult


@dataclass(frozen=True)
class SaveRequest:
    """What to save, and how (see :func:`save_bundle`).

    ``blobs``: each process's mega-cache blob by name; ``files``: the cache files (relative to ``cache_dir``)
    the session used; ``stats``: the session's totals for the manifest; ``keep``: bundles of the lineage
    kept after pruning; ``graphs``: the graph record the next run explains its misses against.
    ``header_since`` (the session's start, :func:`..pch.session_start`; None: carry no precompiled
    header): the headers in ``header_dir`` (default torch's) that the session's processes looked up and
    checked (``header_uses``: their :class:`..pch.HeaderUse` JSON reports; without them, the CLI's case,
    those written since ``header_since``), or named in ``header_installed`` (what the restore installed or
    found), are uploaded once per store and named in the manifest. Headers whose object key is in
    ``header_carried`` travel by other means (the Action's header entry): named, not uploaded.
    ``header_idle``: the restored manifest's idle counts of the installed headers (:data:`..pch.IDLE_SAVES`).
    """

    prefix: str
    fingerprint: Fingerprint
    suffix: str
    cache_dir: str
    blobs: Mapping[str, bytes]
    files: list[str]
    stats: Mapping[str, Any]
    signing_key: bytes | None = None
    keep: int = 3
    max_bytes: int = DEFAULT_MAX_BYTES
    graphs: Mapping[str, Any] | None = None
    header_since: float | None = None
    header_installed: Iterable[str] = ()
    header_dir: Path | None = None
    header_carried: Iterable[str] = ()
    header_uses: Iterable[object] | None = None
    header_idle: Mapping[str, int] = field(default_factory=dict)


def save(
    store: Store,
    *,
    prefix: str,
    fingerprint: Fingerprint,
    suffix: str,
    cache_dir: str,
    blobs: Mapping[str, bytes],
    files: list[str],
    stats: Mapping[str, Any],
    signing_key: bytes | None = None,
    keep: int = 3,
    max_bytes: int = DEFAULT_MAX_BYTES,
    graphs: Mapping[str, Any] | None = None,
    header_since: float | None = None,
    header_installed: Iterable[str] = (),
    header_dir: Path | None = None,
    header_carried: Iterable[str] = (),
    header_uses: Iterable[object] | None = None,
    header_idle: Mapping[str, int] | None = None,
) -> SaveResult:
    """:func:`save_bundle` with the request's fields as keywords (the CLI's call)."""
    request = SaveRequest(
        prefix, fingerprint, suffix, cache_dir, blobs, files, stats, signing_key, keep, max_bytes, graphs,
        header_since, header_installed, header_dir, header_carried, header_uses, dict(header_idle or {}),
    )  # fmt: skip
    return save_bundle(store, request)


def save_bundle(store: Store, request: SaveRequest) -> SaveResult:
    """Pack, put and prune; never raises.

    A bundle that restores would refuse (over ``max_bytes``) is not stored (``error``). Cache files whose
    names no bundle can carry are left out and listed in ``skipped``. A precompiled header that cannot be
    carried is a line in ``headers.warnings`` and left out. Pruning keeps every artifact
    (:func:`.stores.base.prune`).
    """
    started = time.perf_counter()
    digest = request.fingerprint.digest()
    key = make_key(request.prefix, digest, request.suffix)
    if not request.blobs and not request.files:
        return SaveResult("skipped", key=key, message="nothing was compiled")
    skipped: list[tuple[str, str]] = []

    def failed(message: str) -> SaveResult:
        return SaveResult(
            "error", key=key, seconds=time.perf_counter() - started, message=one_line(message), skipped=tuple(skipped)
        )

    carried = HeaderReport()
    try:
        with temporary_dir("save") as tmp:
            named: list[Artifact] = []
            if request.header_since is not None:
                carried, named = save_precompiled(
                    store, request.prefix, request.header_since, request.header_installed, Path(tmp),
                    request.header_dir, request.header_carried, request.header_uses, request.header_idle,
                )  # fmt: skip
            path = Path(tmp) / "bundle"
            manifest = _pack(request, key, path, named, skipped)
            size = path.stat().st_size
            too_big = max(size, manifest.total_size)
            if too_big > request.max_bytes:
                limit = request.max_bytes
                return failed(f"save failed: bundle would be {too_big} bytes, more than the limit of {limit} bytes")
            store.put(key, path)
    except (StoreError, BundleError, OSError) as exc:
        return failed(f"save failed: {exc}")
    except Exception as exc:  # see restore
        return failed(f"save failed: {type(exc).__name__}: {exc}")
    notes = [f"left out {len(skipped)} cache file(s) no bundle can carry"] if skipped else []
    try:
        ours = None if request.signing_key is None else partial(_signed_by, store, request.signing_key)
        prune(store, restore_prefix(request.prefix, digest), request.keep, magic=bundle.MAGIC, proven=ours)
    except Exception as exc:  # the bundle is stored; only the clean-up failed
        notes.append(f"could not prune old bundles: {exc}")
    return SaveResult(
        "saved",
        key=key,
        size=size,
        seconds=time.perf_counter() - started,
        files=len(manifest.file_paths),
        message=one_line("; ".join(notes)),
        skipped=tuple(skipped),
        headers=carried,
    )


def _pack(
    request: SaveRequest, key: str, path: Path, named: list[Artifact], skipped: list[tuple[str, str]]
) -> Manifest:
    fingerprint = request.fingerprint
    digest = fingerprint.digest()
    return bundle.pack(
        path,
        key=key,
        lineage=restore_prefix(request.prefix, digest),
        fingerprint=fingerprint.to_json(),
        digest=digest,
        torch_version=fingerprint.facts.get("torch", "unknown"),
        blobs=request.blobs,
        cache_dir=Path(request.cache_dir),
        files=request.files,
        stats=request.stats,
        signing_key=request.signing_key,
        graphs=request.graphs,
        artifacts=named,
        on_skip=lambda name, reason: skipped.append((name, reason)),
    )


def _signed_by(store: Store, signing_key: bytes, key: str) -> bool:
    """Whether bundle ``key``'s header is signed with ``signing_key`` (its header alone is read): one that is not,
    or cannot be read, is another project's to prune."""
    from .restoring import read_head_manifest

    try:
        return read_head_manifest(store, key, signing_key=signing_key) is not None
    except TimedOut:
        raise  # the budget is spent: the prune stops here
    except (BundleError, StoreError, OSError):
        return False
