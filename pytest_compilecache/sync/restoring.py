"""Restore: the newest usable bundle of a fingerprint into a cache dir, verified before a byte is used.

Outcomes (:class:`.results.RestoreResult`):

- ``exact`` / ``partial``: a bundle was verified, installed and loaded (the exact key, or the newest one of
  this lineage, ``<key prefix>-<fingerprint digest>-``).
- ``miss``: no usable bundle. Either none exists for this fingerprint (``message`` explains how the newest
  bundle under the key prefix differs, from its authenticated header only) or every candidate failed
  verification, could not be read (a link in a directory store, a file this user may not read, a
  per-object S3 error) or had a blob torch rejected (its installed files are then taken back out): each is
  listed in ``skipped`` as ``(key, reason)``. A bad or unreadable bundle in the store is the store's
  content, not a failure to reach it: it means a cold compile, and ``--fail-on-miss`` sees a miss.
- ``error``: infrastructure failure only: the store could not be reached, the cache dir could not be
  written (:class:`~pytest_compilecache.bundle.CacheDirError`), or an unexpected exception.

At most :data:`MAX_CANDIDATES` bundles are tried, newest first (the exact key before them), so one bad object
cannot hide the good ones behind it, and a store full of bad ones cannot make a restore slow. "Newest" is the
``created`` time in each bundle's authenticated header (read first, a few KiB each, for at most
:data:`MAX_HEADERS` of them), not the store's modification time, which anyone who can write the store sets
by putting an old bundle back. Loaded lazily: torch (through :mod:`.probe`, only to load blobs).
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from datetime import datetime
from datetime import timezone
from functools import partial
from pathlib import Path
from typing import Any
from typing import Callable
from typing import Iterator

from .. import bundle
from .._fs import temporary_dir
from ..bundle import DEFAULT_MAX_BYTES
from ..bundle import CacheDirError
from ..cachedir import PENDING_DIR
from ..cachedir import lock
from ..container import HEAD_PROBE
from ..container import header_size
from ..errors import BundleError
from ..errors import StoreError
from ..errors import TimedOut
from ..fingerprint import Fingerprint
from ..fingerprint import explain
from ..fingerprint import restore_prefix
from ..ghrunner import one_line
from ..manifest import Artifact
from ..manifest import Manifest
from ..stores.base import NoPartialReads
from ..stores.base import ObjectTooLarge
from ..stores.base import Store
from ..stores.base import bundles
from ..stores.base import read_head
from .precompiled import restore_precompiled
from .results import HeaderReport
from .results import RestoreOutcome
from .results import RestoreResult
from .staged import STAGED_MAX_AGE
from .staged import Loader
from .staged import load_each
from .staged import load_with_torch
from .staged import remove_staged
from .staged import staged_blobs

MAX_CANDIDATES = 3
# Headers read to order a lineage's candidates by their signed creation time (_newest_created_first): a
# lineage holds about --compile-cache-keep bundles; anyone who can write the store can also delete, so this
# bounds the cost of a crowded lineage, not an attacker.
MAX_HEADERS = 16
Candidate = tuple[str, "int | None", RestoreOutcome]  # key, listed size, outcome if it restores


@dataclass(frozen=True)
class RestoreRequest:
    """What to restore, and how (see :func:`restore_bundle`).

    ``exact_key``: tried first when stored; ``load``: loads a mega-cache blob (torch by default);
    ``headers``: fetch and install the precompiled headers the manifest names, into ``header_dir`` (default:
    torch's, which follows this process's ``TMPDIR``); ``stage_blobs``: install the blobs for another process
    to load (:func:`.staged.load_staged`) and import no torch here; ``on_installed``: called with the verified
    manifest's artifacts (its precompiled headers) once the bundle is installed, before its blobs load.
    """

    prefix: str
    fingerprint: Fingerprint
    cache_dir: str
    signing_key: bytes | None = None
    exact_key: str | None = None
    max_bytes: int = DEFAULT_MAX_BYTES
    load: Loader = load_with_torch
    max_candidates: int = MAX_CANDIDATES
    headers: bool = True
    header_dir: Path | None = None
    stage_blobs: bool = False
    on_installed: Callable[[tuple[Artifact, ...]], None] | None = None

    @property
    def lineage(self) -> str:
        return restore_prefix(self.prefix, self.fingerprint.digest())


def restore(
    store: Store,
    *,
    prefix: str,
    fingerprint: Fingerprint,
    cache_dir: str,
    signing_key: bytes | None = None,
    exact_key: str | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    load: Loader = load_with_torch,
    max_candidates: int = MAX_CANDIDATES,
    headers: bool = True,
    header_dir: Path | None = None,
    stage_blobs: bool = False,
    on_installed: Callable[[tuple[Artifact, ...]], None] | None = None,
) -> RestoreResult:
    """:func:`restore_bundle` with the request's fields as keywords (the CLI's and the Action's call)."""
    request = RestoreRequest(
        prefix, fingerprint, cache_dir, signing_key, exact_key, max_bytes, load, max_candidates, headers,
        header_dir, stage_blobs, on_installed,
    )  # fmt: skip
    return restore_bundle(store, request)


def restore_bundle(store: Store, request: RestoreRequest) -> RestoreResult:
    """Restore the best bundle into ``request.cache_dir``: the exact key if present, else the newest of this
    lineage. Never raises.

    Each candidate is verified in one streaming pass (checksums, signature when a key is set, its own key and
    lineage, fingerprint, ``max_bytes``) into a staging dir inside the cache dir, then installed all or
    nothing; a candidate that fails is skipped and the next newest tried (at most ``max_candidates``).
    Mega-cache blobs are loaded through ``request.load`` with ``TORCHINDUCTOR_CACHE_DIR`` pointing at the
    cache dir. Then, with ``request.headers``, the precompiled headers the verified manifest names are fetched
    (``<prefix>-artifact-<sha256>``), checked against its sha256 and installed (:mod:`..pch`).

    With ``stage_blobs`` nothing here imports torch: the blobs are installed with the files, all or nothing,
    into ``<cache_dir>/.compilecache-pending/`` (``result.staged`` names them, ``result.artifacts`` is empty).
    Staged blobs older than :data:`.staged.STAGED_MAX_AGE` (left by a job whose tests never ran) are removed
    first. ``on_installed`` lets the plugin start the headers' install in the background
    (:class:`.headers.HeaderInstall`, with ``headers=False``), overlapping the blobs' load.
    """
    started = time.perf_counter()

    def result(outcome: RestoreOutcome, message: str = "", **fields: Any) -> RestoreResult:
        return RestoreResult(outcome, seconds=time.perf_counter() - started, message=one_line(message), **fields)

    skipped: list[tuple[str, str]] = []
    try:
        found = _candidates(store, request.lineage, request.exact_key)
        if not found:
            return result("miss", _why_miss(store, request))
        with temporary_dir("restore") as tmp:
            for index, candidate in enumerate(_ordered(store, request, found, skipped)):
                fields = _try_candidate(store, request, candidate, Path(tmp) / f"bundle{index}", skipped)
                if fields is not None:
                    named = fields.pop("named_artifacts")
                    carried = HeaderReport()
                    if request.headers:
                        carried = restore_precompiled(store, request.prefix, named, Path(tmp), request.header_dir)
                    return result(
                        candidate[2], skipped=tuple(skipped), headers=carried, named_artifacts=named, **fields
                    )
    except (StoreError, BundleError, OSError) as exc:
        return result("error", f"restore failed: {exc}", skipped=tuple(skipped))
    except Exception as exc:  # a store SDK or torch surprise must not crash a test session either
        return result("error", f"restore failed: {type(exc).__name__}: {exc}", skipped=tuple(skipped))
    reasons = "; ".join(f"{key}: {reason}" for key, reason in skipped)
    digest = request.fingerprint.digest()
    return result("miss", f"no usable bundle for fingerprint {digest}; skipped {reasons}", skipped=tuple(skipped))


def _ordered(
    store: Store, request: RestoreRequest, found: list[Candidate], skipped: list[tuple[str, str]]
) -> Iterator[Candidate]:
    """The candidates to try, at most ``request.max_candidates``: the exact key, then the lineage by the
    signed creation time (read only when the exact key is absent or failed)."""

    def ordered() -> Iterator[Candidate]:
        yield from (c for c in found if c[2] == "exact")
        lineage_only = [c for c in found if c[2] != "exact"]
        yield from _newest_created_first(store, lineage_only, request.lineage, request.signing_key, skipped)

    return itertools.islice(ordered(), request.max_candidates)


def _try_candidate(
    store: Store, request: RestoreRequest, candidate: Candidate, path: Path, skipped: list[tuple[str, str]]
) -> dict[str, Any] | None:
    """Fetch, verify, install and load one candidate; the result's fields, or None (why is in ``skipped``).
    Raises for what no other candidate can fix (the store's budget is spent, our cache dir is unusable)."""
    key, size, _ = candidate
    max_bytes = request.max_bytes
    if size is not None and size > max_bytes:
        skipped.append((key, f"bundle is {size} bytes, more than the limit of {max_bytes} bytes"))
        return None
    # No more than the listing said: an object replaced by a bigger one since is refused after that many bytes.
    limit = max_bytes if size is None else min(size, max_bytes)
    try:
        if not store.get(key, path, limit=limit):
            skipped.append((key, "bundle vanished"))
            return None
    except ObjectTooLarge:  # replaced by a bigger object since it was listed
        said = f"the {size} bytes it was listed with" if limit < max_bytes else f"the limit of {max_bytes} bytes"
        skipped.append((key, f"bundle is more than {said}"))
        return None
    except TimedOut:
        raise  # the store's budget is spent: no other candidate can be fetched either
    except StoreError as exc:
        # This object only (a link in a directory store, a file this user cannot read, a per-object S3 error):
        # like a bundle that fails verification, it must not hide the older ones, nor make the session skip
        # the save that would put a readable bundle above it.
        skipped.append((key, one_line(f"cannot be read: {exc}", 500)))
        return None
    size = path.stat().st_size
    try:
        verified = bundle.verify(
            path,
            signing_key=request.signing_key,
            fingerprint=request.fingerprint.to_json(),
            key=key,
            lineage=request.lineage,
            cache_dir=Path(request.cache_dir),
            max_bytes=max_bytes,
        )
    except CacheDirError:
        raise  # our cache dir, not the bundle: infrastructure trouble
    except BundleError as exc:
        skipped.append((key, one_line(str(exc), 500)))
        path.unlink()
        return None
    with verified:
        path.unlink()  # the bytes are staged; do not hold two copies on disk
        fields = _install(request, key, size, verified, skipped)
    return fields


def _install(
    request: RestoreRequest, key: str, size: int, verified: bundle.Verified, skipped: list[tuple[str, str]]
) -> dict[str, Any] | None:
    """Install a verified bundle all or nothing, then load (or stage) its blobs; None (why is in ``skipped``)
    when it cannot be installed or torch rejects a blob (then its files are taken back out)."""
    cache_dir = request.cache_dir
    try:
        with lock(cache_dir):
            if request.stage_blobs:
                remove_staged(cache_dir, older_than=STAGED_MAX_AGE)
            installed = bundle.install(verified, stage_blobs=request.stage_blobs)
    except CacheDirError:
        raise
    except BundleError as exc:  # e.g. a dir where a file goes: the cache dir is as it was
        skipped.append((key, one_line(str(exc), 500)))
        return None
    manifest = verified.manifest
    if request.on_installed is not None and manifest.artifacts:
        request.on_installed(tuple(manifest.artifacts))
    if request.stage_blobs:
        artifacts, staged = {}, staged_blobs(manifest)
    else:
        try:
            artifacts, staged = load_blobs(verified, cache_dir, request.load), ()
        except BundleError as exc:  # torch rejected a blob: its files go too, and the next candidate is tried
            with lock(cache_dir):
                bundle.uninstall(verified)
            skipped.append((key, one_line(str(exc), 500)))
            return None
    files = [rel for rel in installed.files if not rel.startswith(PENDING_DIR + "/")]
    return {
        "key": key,
        "size": size,
        "files": len(files),
        "artifacts": artifacts,
        "staged": staged,
        "graphs": manifest.graphs or None,
        "named_artifacts": tuple(manifest.artifacts),
    }


def _candidates(store: Store, lineage: str, exact_key: str | None) -> list[Candidate]:
    """(key, size, outcome if it restores): the exact key first when stored, then this lineage, newest first
    by the store's modification time (:func:`_newest_created_first` orders them by their signed time)."""
    found: list[Candidate] = []
    if exact_key:
        found += [(e.key, e.size, "exact") for e in store.list(exact_key) if e.key == exact_key]
    found += [(e.key, e.size, "partial") for e in store.list(lineage) if e.key != exact_key]
    return found


def _newest_created_first(
    store: Store,
    candidates: list[Candidate],
    lineage: str,
    signing_key: bytes | None,
    skipped: list[tuple[str, str]],
) -> list[Candidate]:
    """The lineage's candidates (the store's order) ordered by the ``created`` time their authenticated
    headers carry, newest first, not by the store's modification time: an older signed bundle put back into
    the store (pruned, then replayed by anyone who can write it) is not taken for the newest.

    The headers of the :data:`MAX_HEADERS` newest entries by modification time are read (ranged reads, see
    :func:`read_head_manifest`); later entries follow in the store's order. One whose header fails its
    checks or cannot be read goes to ``skipped`` without being downloaded. A store that cannot read part of
    an object keeps the store's order. Equal times keep the store's order.
    """
    dated: list[tuple[float, int, Candidate]] = []
    refused: list[tuple[str, str]] = []
    for index, candidate in enumerate(candidates[:MAX_HEADERS]):
        key = candidate[0]
        try:
            manifest = read_head_manifest(store, key, signing_key=signing_key, lineage=lineage)
        except NoPartialReads:
            return candidates
        except TimedOut:
            raise
        except BundleError as exc:
            refused.append((key, one_line(str(exc), 500)))
            continue
        except StoreError as exc:
            refused.append((key, one_line(f"cannot be read: {exc}", 500)))
            continue
        if manifest is None:
            refused.append((key, "bundle vanished"))
            continue
        dated.append((_created(manifest), index, candidate))
    skipped.extend(refused)
    dated.sort(key=lambda item: (-item[0], item[1]))
    return [candidate for _, _, candidate in dated] + candidates[MAX_HEADERS:]


def _created(manifest: Manifest) -> float:
    """The manifest's ``created`` as epoch seconds (a time without a zone is UTC, as :func:`.bundle.pack`
    writes it); the oldest possible when it cannot be one."""
    try:
        when = datetime.fromisoformat(manifest.created)
        return (when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)).timestamp()
    except (ValueError, OverflowError, OSError):
        return float("-inf")


def load_blobs(verified: bundle.Verified, cache_dir: str, load: Loader) -> dict[str, int]:
    return load_each(((name, partial(verified.blob, name)) for name in verified.manifest.blob_names), cache_dir, load)


def _why_miss(store: Store, request: RestoreRequest) -> str:
    """Name the facts that differ from the newest bundle under the prefix (any fingerprint).

    Only the bundle's header is read (:func:`read_head_manifest`: a ranged read of a few KiB, never the
    payload, which may be hundreds of MiB of the store's time budget), and used only after its checksum, its
    signature (when a key is set) and its key are verified: no unauthenticated text reaches a log. Explaining
    is best effort: any trouble leaves a miss.
    """
    prefix, fingerprint, signing_key = request.prefix, request.fingerprint, request.signing_key
    try:
        newest = bundles(store, prefix + "-")  # artifact objects share the prefix: never explain from one
        if not newest:
            return f"no bundle under {prefix}- in {store.location}"
        latest = newest[0]
        manifest = read_head_manifest(store, latest.key, signing_key=signing_key)
        if manifest is None:
            return f"no bundle for fingerprint {fingerprint.digest()}"
    except BundleError as exc:
        return f"no bundle for fingerprint {fingerprint.digest()}; newest {latest.key} is unreadable: {exc}"
    except (StoreError, OSError) as exc:
        return f"no bundle for fingerprint {fingerprint.digest()} (could not explain: {exc})"
    differences = explain(manifest.fingerprint, fingerprint.to_json())
    return f"no bundle for fingerprint {fingerprint.digest()}; newest is {latest.key}, which differs in: " + (
        "; ".join(differences) or "nothing (same facts, older digest scheme)"
    )


def read_head_manifest(
    store: Store, key: str, *, signing_key: bytes | None, lineage: str | None = None
) -> Manifest | None:
    """The manifest of bundle ``key`` from its header alone, read with :func:`.stores.base.read_head`:
    :data:`.container.HEAD_PROBE` bytes, and once more the header's own size when it is bigger. Checked as
    :func:`.bundle.read_manifest` checks (checksum; signature with a key; the key it was saved as; ``lineage``
    when given). None when the object vanished; BundleError for a bad header; StoreError (NoPartialReads
    for a store that cannot read part of an object) or OSError otherwise."""
    data = read_head(store, key, HEAD_PROBE)
    if data is not None and len(data) == HEAD_PROBE:
        size = header_size(data)  # BundleError for a bad magic, format or length, as the full read would say
        if size > len(data):
            data = read_head(store, key, size)
    if data is None:
        return None
    with temporary_dir("restore") as tmp:
        path = Path(tmp) / "header"
        path.write_bytes(data)  # the header, and no more than HEAD_PROBE bytes of payload: read_manifest stops
        return bundle.read_manifest(path, signing_key=signing_key, key=key, lineage=lineage)
