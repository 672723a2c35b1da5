"""restore / save: the one orchestration of store + bundle + torch that the plugin, CLI and Action share.

Neither function raises for infrastructure trouble: they return a typed result (:class:`RestoreResult`,
:class:`SaveResult`) whose ``message`` is the one line to warn with. Callers decide whether that fails
anything (``--compile-cache-strict``).

Restore outcomes:

- ``exact`` / ``partial``: a bundle was verified, installed and loaded (the exact key, or the newest one of
  this lineage, ``<key prefix>-<fingerprint digest>-``).
- ``miss``: no usable bundle. Either none exists for this fingerprint (``message`` explains how the newest
  bundle under the key prefix differs, from its authenticated header only) or every candidate failed
  verification or could not be read (a link in a directory store, a file this user may not read, a
  per-object S3 error): each is listed in ``skipped`` as ``(key, reason)``. A bad or unreadable bundle in the
  store is the store's content, not a failure to reach it: it means a cold compile, and ``--fail-on-miss``
  sees a miss.
- ``error``: infrastructure failure only: the store could not be reached, the cache dir could not be
  written (:class:`~pytest_compilecache.bundle.CacheDirError`), torch rejected verified artifacts, or an
  unexpected exception.

At most :data:`MAX_CANDIDATES` bundles are tried, newest first (the exact key before them), so one bad object
cannot hide the good ones behind it, and a store full of bad ones cannot make a restore slow. "Newest" is the
``created`` time in each bundle's authenticated header (read first, a few KiB each, for at most
:data:`MAX_HEADERS` of them), not the store's modification time, which anyone who can write the store sets
by putting an old bundle back.

Precompiled headers (:mod:`.headers`) travel beside the bundle, not in it: a save uploads each header the
session used once per store (``<prefix>-artifact-<sha256>``) and its manifest names them; a restore, after
the bundle is verified and installed, installs the named ones into torch's header dir. A header that cannot
be carried is one line in ``headers.warnings`` (:class:`HeaderReport`) and never changes the outcome: torch
builds it, as it would without us.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import hashlib
import itertools
import os
import re
import time
from dataclasses import dataclass
from dataclasses import field
from dataclasses import replace
from datetime import datetime
from datetime import timezone
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any
from typing import Callable
from typing import Generic
from typing import Iterable
from typing import Iterator
from typing import Literal
from typing import Mapping
from typing import NamedTuple
from typing import TypeVar

from . import bundle
from . import headers
from . import probe
from ._env import CACHE_ENV
from ._fs import temporary_dir
from .bundle import DEFAULT_MAX_BYTES
from .bundle import CacheDirError
from .cachedir import PENDING_DIR
from .cachedir import lock
from .container import HEAD_PROBE
from .container import header_size
from .errors import BundleError
from .errors import StoreError
from .errors import TimedOut
from .fingerprint import Fingerprint
from .fingerprint import explain
from .fingerprint import key_origin
from .fingerprint import make_key
from .fingerprint import restore_prefix
from .ghrunner import one_line
from .install import cache_file_size
from .install import read_cache_file
from .install import remove_files_in
from .manifest import BLOB_NAME
from .manifest import BLOBS_DIR
from .manifest import Artifact
from .manifest import Manifest
from .stores.base import NoPartialReads
from .stores.base import ObjectTooLarge
from .stores.base import Store
from .stores.base import bundles
from .stores.base import prune
from .stores.base import read_head

if TYPE_CHECKING:
    from .headers import HeaderTransfer

__all__ = [
    "MAX_CANDIDATES",
    "MAX_HEADERS",
    "HeaderReport",
    "RestoreResult",
    "SaveResult",
    "StagedBlob",
    "load_staged",
    "restore",
    "restore_outputs",
    "save",
]

MAX_CANDIDATES = 3
# Headers read to order a lineage's candidates by their signed creation time (_newest_created_first): a
# lineage holds about --compile-cache-keep bundles; anyone who can write the store can also delete, so this
# bounds the cost of a crowded lineage, not an attacker.
MAX_HEADERS = 16
RestoreOutcome = Literal["exact", "partial", "miss", "error"]
SaveOutcome = Literal["saved", "staged", "skipped", "error"]
Outcome = TypeVar("Outcome", RestoreOutcome, SaveOutcome)
Loader = Callable[[bytes], Mapping[str, int]]
Candidate = tuple[str, "int | None", RestoreOutcome]  # key, listed size, outcome if it restores


class StagedBlob(NamedTuple):
    """A mega-cache blob a restore installed for a later process to load (``restore(stage_blobs=True)``):
    its name (``controller``, ``gw0``...), size and SHA-256, from the verified manifest."""

    name: str
    size: int
    sha256: str


@dataclass(frozen=True)
class HeaderReport:
    """The precompiled headers a restore or save carried (see :mod:`.headers`).

    ``named``: the headers the bundle's manifest names (restore: every valid entry, installed or already
    present; pass them to the save as ``installed``); ``transferred``: those installed (restore) or uploaded
    (save, only those the store lacked); ``size``: raw bytes of ``transferred``; ``warnings``: one line per
    header that could not be carried; ``carried``: object keys (``<prefix>-artifact-<sha256>``) that travel
    outside the bundle's store (the Action's own ``actions/cache`` entry per header): a save names those
    headers in its manifest but does not upload them (restore, from the Action's report only).
    """

    named: tuple[str, ...] = ()
    transferred: tuple[str, ...] = ()
    size: int = 0
    seconds: float = 0.0
    warnings: tuple[str, ...] = ()
    carried: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()  # restore: a damaged local header replaced with the verified one

    @classmethod
    def of(cls, transfer: HeaderTransfer, seconds: float) -> HeaderReport:
        sizes = {artifact.name: artifact.size for artifact in transfer.artifacts}
        return cls(
            named=tuple(artifact.name for artifact in transfer.artifacts),
            transferred=tuple(transfer.transferred),
            size=sum(sizes.get(name, 0) for name in transfer.transferred),
            seconds=seconds,
            warnings=tuple(one_line(line) for line in transfer.errors),
            notes=tuple(one_line(line) for line in transfer.notes),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "named": len(self.named),
            "transferred": len(self.transferred),
            "size": self.size,
            "seconds": round(self.seconds, 3),
            "warnings": list(self.warnings),
        }


@dataclass(frozen=True)
class _Transfer(Generic[Outcome]):
    """What a restore and a save report alike. ``skipped``: ``(key, reason)`` pairs (restore: bundles that
    failed verification; save: cache files left out of the bundle, names no bundle can carry)."""

    outcome: Outcome
    key: str | None = None
    size: int | None = None
    seconds: float = 0.0
    message: str = ""
    files: int = 0
    artifacts: Mapping[str, int] = field(default_factory=dict)
    skipped: tuple[tuple[str, str], ...] = ()
    headers: HeaderReport = field(default_factory=HeaderReport)

    @property
    def ok(self) -> bool:
        return self.outcome != "error"

    def to_json(self) -> dict[str, Any]:
        """The report's ``restore`` or ``save`` object: the fields of format 1 plus ``skipped`` (a list of
        {key, reason}) and ``headers`` (:meth:`HeaderReport.to_json`: named, installed or uploaded, their
        bytes, seconds, warnings)."""
        return {
            "outcome": self.outcome,
            "key": self.key,
            "size": self.size,
            "seconds": round(self.seconds, 3),
            "message": self.message,
            "files": self.files,
            "artifacts": dict(self.artifacts),
            "skipped": [{"key": key, "reason": reason} for key, reason in self.skipped],
            "headers": self.headers.to_json(),
        }


@dataclass(frozen=True)
class RestoreResult(_Transfer[RestoreOutcome]):
    """What a restore did (see the module docstring for the outcomes). ``skipped``: bundles that failed
    verification or could not be read, as ``(key, reason)``."""

    # The restored bundle's ``graphs`` record (issue 12), read from its manifest after verification:
    # untrusted JSON to parse with ``explain.GraphsRecord.from_json``; None when the bundle has none.
    graphs: Mapping[str, Any] | None = field(default=None, repr=False)
    # The verified manifest's artifact entries (precompiled headers), for a caller that restored with
    # ``headers=False`` to fetch them by other means (the Action's header entry, see action/main.py).
    named_artifacts: tuple[Artifact, ...] = field(default=(), repr=False)
    # The mega-cache blobs installed for a later process to load (``stage_blobs``): see :func:`load_staged`.
    staged: tuple[StagedBlob, ...] = ()

    @property
    def description(self) -> str:
        """What happened, in plain words for people (``outcome`` stays for programs): ``partial`` is the
        newest bundle of this fingerprint, often the very one its last run saved, not an incomplete restore
        (actions/cache's word for a key matched by prefix), e.g. "restored the newest bundle of this
        fingerprint (run 5001, attempt 1)"."""
        origin = key_origin(self.key) if self.key else None
        which = f" ({origin})" if origin else ""
        if self.outcome == "exact":
            return f"restored the bundle of the exact key asked for{which}"
        if self.outcome == "partial":
            return f"restored the newest bundle of this fingerprint{which}"
        if self.outcome == "miss":
            return "restored nothing: no usable bundle of this fingerprint"
        return "restored nothing: the restore failed"

    def to_json(self) -> dict[str, Any]:
        """:meth:`_Transfer.to_json` plus ``description`` (:attr:`description`)."""
        return {**super().to_json(), "description": self.description}

    @property
    def warning(self) -> str | None:
        """The one line to warn with, or None: the error, or the bad bundles skipped (whatever the outcome).

        Headers that could not be restored are not in it: each is its own line in ``headers.warnings``.
        """
        if self.outcome == "error":
            return self.message
        if self.skipped:
            reasons = "; ".join(f"{key}: {reason}" for key, reason in self.skipped)
            why = "failed verification or could not be read"
            return one_line(f"restore skipped {len(self.skipped)} bundle(s) that {why}: {reasons}")
        return None


@dataclass(frozen=True)
class SaveResult(_Transfer[SaveOutcome]):
    """What a save did: ``saved``, ``skipped`` (nothing to save) or ``error``. ``skipped``: cache files left
    out of the bundle as ``(name, reason)`` (names no bundle can carry)."""

    @property
    def warning(self) -> str | None:
        """The one line to warn with (an error), or None; files left out are a note, in ``message``; headers
        that could not be saved are each a line in ``headers.warnings``."""
        return self.message if self.outcome == "error" else None


def restore_outputs(result: RestoreResult) -> dict[str, str]:
    """What a restore reports to a CI job's later steps (the CLI's ``--github-output`` and the Action):
    ``restore-outcome`` (exact, partial, miss or error), ``cache-hit`` (``true`` only for the exact key) and
    ``matched-key`` (the restored key; empty unless something was restored)."""
    restored = result.outcome in ("exact", "partial")
    return {
        "restore-outcome": result.outcome,
        "cache-hit": str(result.outcome == "exact").lower(),
        "matched-key": (result.key or "") if restored else "",
    }


# --- the Action -> plugin hand-off --------------------------------------------------------------------------

# The Action restores before pytest runs (``--compile-cache-restore=skip``) and tells the plugin in this
# variable how that went, so that a failed restore never fails the session through the hit-rate guard.
HANDOFF_ENV = "PYTEST_COMPILECACHE_RESTORED"
_HANDOFF_OUTCOMES = ("exact", "partial", "miss", "error")


class SavePolicy(NamedTuple):
    """How the Action wants the session's save: ``only_when_passed`` (no save after failed tests: input
    ``save-on-failure`` false, actions/cache's convention) and ``staged`` (the store is the Action's staging
    dir, which actions/cache uploads at job end: the save is then reported as ``staged``, never ``saved``)."""

    only_when_passed: bool = False
    staged: bool = False


# Nothing in the job learns how the upload went: actions/cache's post step runs after every step (the runner
# queues post steps once the main steps are done), so the next run's restore is where it shows.
STAGED_MESSAGE = (
    "staged for upload at job end (actions/cache uploads it after the last step if the job succeeds; "
    "the next run's restore reports the result)"
)


def write_handoff(result: RestoreResult, policy: SavePolicy | None = None) -> str:
    """The value of :data:`HANDOFF_ENV` for ``result`` (compact JSON), read back by :func:`read_handoff` and
    :func:`read_save_policy`.

    ``{"outcome", "key", "message", "headers": [names], "header_key"?, "staged"?: [[name, size, sha256]],
    "save_when"?: "passed"|"always", "save_staged"?: true}``: the outcome and why, the precompiled headers the
    restore installed or found (so the save names them again where the file system records no reads), the
    object key of a header carried by the Action's own cache entry (the save names it but uploads no copy),
    the mega-cache blobs left for pytest to load, and the save policy of a saving run.
    """
    import json  # cost: only the Action and a restoring session hand off

    told: dict[str, Any] = {
        "outcome": result.outcome,
        "key": result.key,
        "message": result.warning or result.message or None,
        "headers": list(result.headers.named),
    }
    if result.headers.carried:
        told["header_key"] = result.headers.carried[0]
    if result.staged:
        told["staged"] = [list(blob) for blob in result.staged]
    if policy is not None:
        told["save_when"] = "passed" if policy.only_when_passed else "always"
        if policy.staged:
            told["save_staged"] = True
    return json.dumps(told, separators=(",", ":"))


def read_save_policy(value: str | None) -> SavePolicy:
    """The save policy :func:`write_handoff` wrote; the defaults (save whatever the tests did, for real)
    when absent or malformed."""
    import json  # cost: as above

    try:
        data = json.loads(value or "")
    except (ValueError, RecursionError):
        return SavePolicy()
    if not isinstance(data, dict):
        return SavePolicy()
    return SavePolicy(only_when_passed=data.get("save_when") == "passed", staged=data.get("save_staged") is True)


def read_handoff(value: str | None) -> RestoreResult | None:
    """What :func:`write_handoff` wrote (anyone's text: never a crash); None when unknown or malformed.

    Every string is made one line (no newline in it can start a runner command when printed); header names
    must be names torch gives headers, staged entries must have the exact shape, anything else is dropped.
    """
    import json  # cost: as above

    if not value:
        return None
    try:
        data = json.loads(value)
        outcome = data["outcome"] if isinstance(data, dict) else data
    except (ValueError, KeyError, TypeError, RecursionError):
        outcome, data = value.strip(), {}
    if not isinstance(data, dict):
        data = {}
    if outcome not in _HANDOFF_OUTCOMES:
        return None
    message = one_line(str(data.get("message") or ""))
    key = one_line(data["key"], 300) if isinstance(data.get("key"), str) else None
    names = data.get("headers")
    named: tuple[str, ...] = ()
    if isinstance(names, list) and all(isinstance(name, str) for name in names):
        named = tuple(name for name in names if headers.is_header_name(name))
    carried = data.get("header_key")
    keys = (carried,) if isinstance(carried, str) and carried else ()
    entries = data.get("staged") if outcome in ("exact", "partial") else None
    entries = entries if isinstance(entries, list) else []
    staged = tuple(StagedBlob(*entry) for entry in entries if _staged_entry(entry))
    header_report = HeaderReport(named=named, carried=keys)
    return RestoreResult(outcome, key=key, message=message, headers=header_report, staged=staged)


def _staged_entry(entry: object) -> bool:
    """``[name, size, sha256]`` with a blob name a bundle may carry, a size and a hex SHA-256."""
    if not (isinstance(entry, list) and len(entry) == 3):
        return False
    name, size, sha256 = entry
    return (
        isinstance(name, str)
        and BLOB_NAME.fullmatch(name) is not None
        and isinstance(size, int)
        and not isinstance(size, bool)
        and size >= 0
        and isinstance(sha256, str)
        and len(sha256) == 64
        and all(c in "0123456789abcdef" for c in sha256)
    )


def _load_with_torch(blob: bytes) -> Mapping[str, int]:
    return probe.load_artifacts(blob)


# --- restore ---------------------------------------------------------------------------------------------


def restore(
    store: Store,
    *,
    prefix: str,
    fingerprint: Fingerprint,
    cache_dir: str,
    signing_key: bytes | None = None,
    exact_key: str | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    load: Loader = _load_with_torch,
    max_candidates: int = MAX_CANDIDATES,
    headers: bool = True,
    header_dir: Path | None = None,
    stage_blobs: bool = False,
    on_installed: Callable[[tuple[Artifact, ...]], None] | None = None,
) -> RestoreResult:
    """Restore the best bundle into ``cache_dir``: ``exact_key`` if present, else the newest of this lineage.

    Each candidate is verified in one streaming pass (checksums, signature when a key is set, its own key and
    lineage, fingerprint, ``max_bytes``) into a staging dir inside ``cache_dir``, then installed all or
    nothing; a candidate that fails is skipped and the next newest tried (at most ``max_candidates``).
    Mega-cache blobs are loaded through ``load`` (torch by default) with ``TORCHINDUCTOR_CACHE_DIR`` pointing
    at ``cache_dir``. Then, with ``headers``, the precompiled headers the verified manifest names are fetched
    (``<prefix>-artifact-<sha256>``), checked against its sha256 and installed into ``header_dir`` (default:
    torch's, :func:`.headers.header_dir`, which follows this process's ``TMPDIR``: restore in the environment
    the tests run with). Never raises.

    With ``stage_blobs`` nothing here imports torch: the blobs are installed with the files, all or nothing,
    into ``<cache_dir>/.compilecache-pending/`` (``result.staged`` names them, ``result.artifacts`` is empty)
    for the process that runs the tests to load with :func:`load_staged` (the Action's restore step, which
    would otherwise pay a torch import of its own). Staged blobs older than :data:`STAGED_MAX_AGE` (left by
    a job whose tests never ran) are removed first.

    ``on_installed`` is called with the artifacts the verified manifest names (its precompiled headers) as
    soon as the bundle is installed, before its blobs are loaded, which imports torch: the plugin starts the
    headers' install there (:class:`HeaderInstall`, with ``headers=False``), so that it overlaps that import.
    """
    started = time.perf_counter()
    lineage = restore_prefix(prefix, fingerprint.digest())

    def result(outcome: RestoreOutcome, message: str = "", **fields: Any) -> RestoreResult:
        return RestoreResult(outcome, seconds=time.perf_counter() - started, message=one_line(message), **fields)

    skipped: list[tuple[str, str]] = []
    try:
        found = _candidates(store, lineage, exact_key)
        if not found:
            return result("miss", _why_miss(store, prefix, fingerprint, signing_key, max_bytes))

        def ordered() -> Iterator[Candidate]:
            yield from (c for c in found if c[2] == "exact")
            # Only when the exact key is absent or failed: the lineage's headers, read to order it.
            lineage_only = [c for c in found if c[2] != "exact"]
            yield from _newest_created_first(store, lineage_only, lineage, signing_key, skipped)

        candidates = itertools.islice(ordered(), max_candidates)
        with temporary_dir("restore") as tmp:
            for index, (key, size, outcome) in enumerate(candidates):
                if size is not None and size > max_bytes:
                    skipped.append((key, f"bundle is {size} bytes, more than the limit of {max_bytes} bytes"))
                    continue
                path = Path(tmp) / f"bundle{index}"
                try:
                    if not store.get(key, path, limit=max_bytes):
                        skipped.append((key, "bundle vanished"))
                        continue
                except ObjectTooLarge:  # replaced by a bigger object since it was listed
                    skipped.append((key, f"bundle is more than the limit of {max_bytes} bytes"))
                    continue
                except TimedOut:
                    raise  # the store's budget is spent: no other candidate can be fetched either
                except StoreError as exc:
                    # This object only (a link in a directory store, a file this user cannot read, a per-object
                    # S3 error): like a bundle that fails verification, it must not hide the older ones, nor
                    # make the session skip the save that would put a readable bundle above it.
                    skipped.append((key, one_line(f"cannot be read: {exc}", 500)))
                    continue
                size = path.stat().st_size
                try:
                    verified = bundle.verify(
                        path,
                        signing_key=signing_key,
                        fingerprint=fingerprint.to_json(),
                        key=key,
                        lineage=lineage,
                        cache_dir=Path(cache_dir),
                        max_bytes=max_bytes,
                    )
                except CacheDirError:
                    raise  # our cache dir, not the bundle: infrastructure trouble
                except BundleError as exc:
                    skipped.append((key, one_line(str(exc), 500)))
                    path.unlink()
                    continue
                with verified:
                    path.unlink()  # the bytes are staged; do not hold two copies on disk
                    try:
                        with lock(cache_dir):
                            if stage_blobs:
                                _remove_staged(cache_dir, older_than=STAGED_MAX_AGE)
                            installed = bundle.install(verified, stage_blobs=stage_blobs)
                    except CacheDirError:
                        raise
                    except BundleError as exc:  # e.g. a dir where a file goes: the cache dir is as it was
                        skipped.append((key, one_line(str(exc), 500)))
                        continue
                    if on_installed is not None and verified.manifest.artifacts:
                        on_installed(tuple(verified.manifest.artifacts))
                    if stage_blobs:
                        artifacts, staged = {}, _staged_blobs(verified.manifest)
                    else:
                        artifacts, staged = _load_blobs(verified, cache_dir, load), ()
                    named = verified.manifest.artifacts
                    graphs = verified.manifest.graphs or None
                    files = [rel for rel in installed.files if not rel.startswith(PENDING_DIR + "/")]
                carried = _restore_headers(store, prefix, named, Path(tmp), header_dir) if headers else HeaderReport()
                return result(
                    outcome,
                    key=key,
                    size=size,
                    files=len(files),
                    artifacts=artifacts,
                    staged=staged,
                    skipped=tuple(skipped),
                    headers=carried,
                    graphs=graphs,
                    named_artifacts=tuple(named),
                )
    except (StoreError, BundleError, OSError) as exc:
        return result("error", f"restore failed: {exc}", skipped=tuple(skipped))
    except Exception as exc:  # a store SDK or torch surprise must not crash a test session either
        return result("error", f"restore failed: {type(exc).__name__}: {exc}", skipped=tuple(skipped))
    reasons = "; ".join(f"{key}: {reason}" for key, reason in skipped)
    return result(
        "miss", f"no usable bundle for fingerprint {fingerprint.digest()}; skipped {reasons}", skipped=tuple(skipped)
    )


def _restore_headers(
    store: Store,
    prefix: str,
    named: Iterable[Artifact],
    scratch: Path,
    directory: Path | None,
    reservation: headers.Reservation | None = None,
) -> HeaderReport:
    """Install the headers a verified manifest names; any trouble is a warning line, never an exception."""
    if not named:
        return HeaderReport()  # most bundles (GPU-only suites, torch 2.7): no import, no work
    started = time.perf_counter()
    try:
        transfer = headers.restore_headers(store, prefix, named, scratch, directory, reservation)
    except Exception as exc:  # e.g. zstandard missing: the bundle is installed, torch builds the headers
        return HeaderReport(warnings=(one_line(f"precompiled headers not restored: {type(exc).__name__}: {exc}"),))
    return HeaderReport.of(transfer, time.perf_counter() - started)


class HeaderInstall:
    """The precompiled headers a restored bundle names, installed in the background (issue 25).

    After ``restore(..., headers=False)``: torch's build lock of every header to install is taken now
    (:func:`.headers.reserve_headers`), then a thread downloads and installs them while the caller goes on
    (an xdist worker lets the others start their tests; a plain session collects). Any process whose compile
    looks such a header up meanwhile waits in torch's own lock until it is in place, and builds nothing; this
    process checks them beside its first header look-up (:func:`.probe.check_headers_early`).
    :meth:`finish` waits for the thread and returns what :func:`restore` would have put in ``headers``.
    """

    def __init__(self, store: Store, prefix: str, named: Iterable[Artifact], directory: Path | None = None) -> None:
        import threading  # cost: only a session that restores headers

        self._named = tuple(named)
        self._report = HeaderReport()
        self._reservation = headers.reserve_headers(self._named, directory)
        # checked while torch works out which header it wants, off the first compile's path
        probe.check_headers_early([artifact.name for artifact in self._named], self._reservation.directory)
        self._thread = threading.Thread(
            target=self._run, args=(store, prefix, directory), name="compilecache-headers", daemon=True
        )
        self._thread.start()

    def _run(self, store: Store, prefix: str, directory: Path | None) -> None:
        try:
            with temporary_dir("restore") as tmp:
                self._report = _restore_headers(store, prefix, self._named, Path(tmp), directory, self._reservation)
        except Exception as exc:  # the scratch dir: torch builds the headers as it would without us
            self._report = HeaderReport(warnings=(one_line(f"precompiled headers not restored: {exc}"),))
        finally:
            self._reservation.release()

    def finish(self) -> HeaderReport:
        """Wait for the install (bounded by the store's own time limit) and say what it did."""
        self._thread.join()
        return self._report


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
    the store (pruned, then replayed by anyone who can write it) is not taken for the newest (issue 28.9).

    The headers of the :data:`MAX_HEADERS` newest entries by modification time are read (ranged reads, see
    :func:`_read_head_manifest`); later entries follow in the store's order. One whose header fails its
    checks or cannot be read goes to ``skipped`` without being downloaded. A store that cannot read part of
    an object keeps the store's order. Equal times keep the store's order.
    """
    dated: list[tuple[float, int, Candidate]] = []
    refused: list[tuple[str, str]] = []
    for index, candidate in enumerate(candidates[:MAX_HEADERS]):
        key = candidate[0]
        try:
            manifest = _read_head_manifest(store, key, signing_key=signing_key, lineage=lineage)
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


def _load_blobs(verified: bundle.Verified, cache_dir: str, load: Loader) -> dict[str, int]:
    return _load_each(((name, partial(verified.blob, name)) for name in verified.manifest.blob_names), cache_dir, load)


def _load_each(blobs: Iterable[tuple[str, Callable[[], bytes]]], cache_dir: str, load: Loader) -> dict[str, int]:
    """Load ``(name, read)`` blobs one at a time with ``TORCHINDUCTOR_CACHE_DIR`` at ``cache_dir``; sum the
    counts. BundleError when torch rejects one."""
    previous = os.environ.get(CACHE_ENV)
    os.environ[CACHE_ENV] = cache_dir
    totals: dict[str, int] = {}
    try:
        for name, read in blobs:
            blob = read()  # one blob in memory at a time
            try:
                counts = load(blob)
            except Exception as exc:  # torch may raise anything on content it cannot use (pickle errors...)
                why = f"{type(exc).__name__}: {exc}"
                raise BundleError(f"torch rejected the cache artifacts of {name}: {why}") from None
            for kind, count in counts.items():
                totals[kind] = totals.get(kind, 0) + count
    finally:
        if previous is None:
            os.environ.pop(CACHE_ENV, None)
        else:
            os.environ[CACHE_ENV] = previous
    return totals


# --- staged blobs: restored in one process, loaded in another ---------------------------------------------

_STAGED_NAME = re.compile(r"[0-9a-f]{64}\.bin")


def _staged_blobs(manifest: Manifest) -> tuple[StagedBlob, ...]:
    members = {m.path: m for m in manifest.members}
    return tuple(
        StagedBlob(name, members[f"{BLOBS_DIR}{name}.bin"].size, members[f"{BLOBS_DIR}{name}.bin"].sha256)
        for name in manifest.blob_names
    )


def load_staged(result: RestoreResult, cache_dir: str, load: Loader = _load_with_torch) -> RestoreResult:
    """Load the blobs a restore in another process staged (``result.staged``) into torch, then remove them.

    For the process that runs the tests, after the Action's restore step (``restore(stage_blobs=True)``).
    Each blob is read from ``<cache_dir>/.compilecache-pending/<sha256>.bin`` without following links and
    checked against the size and SHA-256 the verified manifest gave (``result.staged``, passed between the
    processes in the environment) before torch sees a byte. Returns ``result`` with the artifact counts
    added; a blob that changed, or that torch rejects, makes the outcome ``error`` (the tests compile cold:
    the FX-graph entries are missing; the installed kernel files are harmless). Blobs not found (an earlier
    session loaded them, or this session uses another cache dir than the restore did) are no error:
    ``message`` says so and nothing is loaded. The blobs named are removed afterwards, loaded or not: a
    staged blob is used once. Never raises.
    """
    if not result.staged:
        return result
    started = time.perf_counter()
    root = Path(cache_dir)

    def failed(why: str) -> RestoreResult:
        message = one_line(f"restored bundle not loaded: {why}")
        return replace(result, outcome="error", message=message, seconds=result.seconds + time.perf_counter() - started)

    try:
        with lock(cache_dir):
            try:
                present = [blob for blob in result.staged if _staged_size(root, blob) is not None]
                if not present:
                    message = one_line(
                        f"the restore's {len(result.staged)} mega-cache blob(s) are not in {cache_dir} "
                        "(loaded by an earlier session, or the restore used another cache dir): nothing to load"
                    )
                    return replace(result, message=message)
                reads = ((blob.name, partial(_read_staged, root, blob)) for blob in present)
                artifacts = _load_each(reads, cache_dir, load)
                missing = [blob.name for blob in result.staged if blob not in present]
                if missing:
                    note = f"staged blob(s) {', '.join(missing)} not found in {cache_dir}: their graphs compile cold"
                    return replace(
                        result,
                        artifacts=artifacts,
                        message=one_line(note),
                        seconds=result.seconds + time.perf_counter() - started,
                    )
            finally:
                _remove_staged(cache_dir, names={f"{blob.sha256}.bin" for blob in result.staged})
    except (BundleError, OSError) as exc:
        return failed(str(exc))
    except Exception as exc:  # torch or the file system surprising us must not crash a test session either
        return failed(f"{type(exc).__name__}: {exc}")
    return replace(result, artifacts=artifacts, seconds=result.seconds + time.perf_counter() - started)


# A staged blob waits for the pytest step of the same job: one older than this was left by a job whose tests
# never ran (cancelled, a failed step before them) and is removed by the next restore.
STAGED_MAX_AGE = 24 * 3600.0


def _staged_size(root: Path, blob: StagedBlob) -> int | None:
    """Size of the staged file of ``blob`` (a regular file, reached without links), or None when absent."""
    return cache_file_size(root, bundle.pending_path(blob.sha256))


def _read_staged(root: Path, blob: StagedBlob) -> bytes:
    data = read_cache_file(root, bundle.pending_path(blob.sha256), blob.size + 1)
    if data is None:
        raise BundleError(f"staged blob {blob.name} vanished before it was loaded")
    if len(data) != blob.size or hashlib.sha256(data).hexdigest() != blob.sha256:
        raise BundleError(f"staged blob {blob.name} changed since the restore verified it")
    return data


def _remove_staged(cache_dir: str, *, names: set[str] | None = None, older_than: float | None = None) -> None:
    """Remove staged blob files of the pending dir: those in ``names``, or those older than ``older_than``
    seconds; then the dir when empty. Only regular files named ``<sha256>.bin`` inside the pending dir are
    touched, and no link is followed (:func:`install.remove_files_in`)."""

    def matches(name: str) -> bool:
        return bool(_STAGED_NAME.fullmatch(name)) and (names is None or name in names)

    remove_files_in(cache_dir, PENDING_DIR, matches, older_than=older_than)


def _why_miss(store: Store, prefix: str, fingerprint: Fingerprint, signing_key: bytes | None, max_bytes: int) -> str:
    """Name the facts that differ from the newest bundle under the prefix (any fingerprint).

    Only the bundle's header is read (:func:`_read_head_manifest`: a ranged read of a few KiB, never the
    payload, which may be hundreds of MiB of the store's time budget), and used only after its checksum, its
    signature (when a key is set) and its key are verified: no unauthenticated text reaches a log. Explaining
    is best effort: any trouble leaves a miss.
    """
    try:
        newest = bundles(store, prefix + "-")  # artifact objects share the prefix: never explain from one
        if not newest:
            return f"no bundle under {prefix}- in {store.location}"
        latest = newest[0]
        manifest = _read_head_manifest(store, latest.key, signing_key=signing_key)
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


def _read_head_manifest(
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


# --- save ------------------------------------------------------------------------------------------------


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
) -> SaveResult:
    """Pack this session's artifacts into one bundle bound to its key and lineage, put it, prune old ones.

    A bundle that restores would refuse (over ``max_bytes``) is not stored (``error``). Cache files whose
    names no bundle can carry are left out and listed in ``skipped``. With ``header_since`` (the session's
    start, :func:`.headers.session_start`), the precompiled headers in ``header_dir`` (default torch's) that
    the session's processes looked up and checked (``header_uses``: their :class:`.headers.HeaderUse` JSON
    reports; without them, the CLI's case, those written since ``header_since``), or named in
    ``header_installed`` (what the restore installed or found), are uploaded once per store and named in the
    manifest; one that cannot be is a line in ``headers.warnings`` and left out. Headers whose object key is
    in ``header_carried`` travel by other means (the Action's header entry): named, not uploaded. Pruning
    keeps every artifact (:func:`.stores.base.prune`). Never raises.
    """
    started = time.perf_counter()
    digest = fingerprint.digest()
    key = make_key(prefix, digest, suffix)
    if not blobs and not files:
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
            if header_since is not None:
                carried, named = _save_headers(
                    store, prefix, header_since, header_installed, Path(tmp), header_dir, header_carried, header_uses
                )
            path = Path(tmp) / "bundle"
            manifest = bundle.pack(
                path,
                key=key,
                lineage=restore_prefix(prefix, digest),
                fingerprint=fingerprint.to_json(),
                digest=digest,
                torch_version=fingerprint.facts.get("torch", "unknown"),
                blobs=blobs,
                cache_dir=Path(cache_dir),
                files=files,
                stats=stats,
                signing_key=signing_key,
                graphs=graphs,
                artifacts=named,
                on_skip=lambda name, reason: skipped.append((name, reason)),
            )
            size = path.stat().st_size
            too_big = max(size, manifest.total_size)
            if too_big > max_bytes:
                return failed(f"save failed: bundle would be {too_big} bytes, more than the limit of {max_bytes} bytes")
            store.put(key, path)
    except (StoreError, BundleError, OSError) as exc:
        return failed(f"save failed: {exc}")
    except Exception as exc:  # see restore
        return failed(f"save failed: {type(exc).__name__}: {exc}")
    notes = [f"left out {len(skipped)} cache file(s) no bundle can carry"] if skipped else []
    try:
        prune(store, restore_prefix(prefix, digest), keep)
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


def _save_headers(
    store: Store,
    prefix: str,
    since: float,
    installed: Iterable[str],
    scratch: Path,
    directory: Path | None,
    carried: Iterable[str] = (),
    uses: Iterable[object] | None = None,
) -> tuple[HeaderReport, list[Artifact]]:
    """Upload the session's headers the store lacks; return the report and the manifest entries."""
    started = time.perf_counter()
    try:
        transfer = headers.save_headers(store, prefix, since, installed, scratch, directory, carried, uses)
    except Exception as exc:  # the bundle is worth saving without its headers
        return HeaderReport(warnings=(one_line(f"precompiled headers not saved: {type(exc).__name__}: {exc}"),)), []
    return HeaderReport.of(transfer, time.perf_counter() - started), list(transfer.artifacts)
