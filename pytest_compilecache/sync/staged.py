"""Staged blobs: restored in one process, loaded in another.

The Action's restore step imports no torch: it installs a bundle's mega-cache blobs into
``<cache dir>/.compilecache-pending/`` (``restore(stage_blobs=True)``) and the pytest process loads them
(:func:`load_staged`), checked against the verified manifest's sizes and SHA-256s first.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Callable
from typing import Iterable
from typing import Mapping

from .. import bundle
from .._env import CACHE_ENV
from ..cachedir import PENDING_DIR
from ..cachedir import lock
from ..errors import BundleError
from ..ghrunner import one_line
from ..install import cache_file_size
from ..install import read_cache_file
from ..install import remove_files_in
from ..manifest import BLOBS_DIR
from ..manifest import Manifest
from .results import RestoreResult
from .results import StagedBlob

Loader = Callable[[bytes], Mapping[str, int]]


def load_with_torch(blob: bytes) -> Mapping[str, int]:
    from .. import probe  # cost: only a process that loads blobs

    return probe.load_artifacts(blob)


def load_each(blobs: Iterable[tuple[str, Callable[[], bytes]]], cache_dir: str, load: Loader) -> dict[str, int]:
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


_STAGED_NAME = re.compile(r"[0-9a-f]{64}\.bin")


def staged_blobs(manifest: Manifest) -> tuple[StagedBlob, ...]:
    members = {m.path: m for m in manifest.members}
    return tuple(
        StagedBlob(name, members[f"{BLOBS_DIR}{name}.bin"].size, members[f"{BLOBS_DIR}{name}.bin"].sha256)
        for name in manifest.blob_names
    )


def load_staged(result: RestoreResult, cache_dir: str, load: Loader = load_with_torch) -> RestoreResult:
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
                artifacts = load_each(reads, cache_dir, load)
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
                remove_staged(cache_dir, names={f"{blob.sha256}.bin" for blob in result.staged})
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


def remove_staged(cache_dir: str, *, names: set[str] | None = None, older_than: float | None = None) -> None:
    """Remove staged blob files of the pending dir: those in ``names``, or those older than ``older_than``
    seconds; then the dir when empty. Only regular files named ``<sha256>.bin`` inside the pending dir are
    touched, and no link is followed (:func:`install.remove_files_in`)."""

    def matches(name: str) -> bool:
        return bool(_STAGED_NAME.fullmatch(name)) and (names is None or name in names)

    remove_files_in(cache_dir, PENDING_DIR, matches, older_than=older_than)
