"""restore / save: the one orchestration of store + bundle + torch that the plugin, CLI and Action share.

Neither function raises for infrastructure trouble: they return a :class:`Transfer` whose ``outcome`` is
``error`` and whose ``message`` is the one line to warn with. Callers decide whether that fails anything
(``--compile-cache-strict``).
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import asdict
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any
from typing import Callable
from typing import Mapping

from . import BundleError
from . import StoreError
from .fingerprint import Fingerprint
from .fingerprint import explain
from .fingerprint import make_key
from .fingerprint import restore_prefix
from .stores.base import find_latest


@dataclass
class Transfer:
    """What a restore or save did. ``outcome``: exact, partial, miss, saved, skipped or error."""

    outcome: str
    key: str | None = None
    size: int | None = None
    seconds: float = 0.0
    message: str = ""
    files: int = 0
    artifacts: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.outcome != "error"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["seconds"] = round(self.seconds, 3)
        return data


Loader = Callable[[bytes], Mapping[str, int]]


def _load_with_torch(blob: bytes) -> Mapping[str, int]:
    from . import probe

    return probe.load_artifacts(blob)


def restore(
    store: Any,
    *,
    prefix: str,
    fingerprint: Fingerprint,
    cache_dir: str,
    signing_key: bytes | None = None,
    exact_key: str | None = None,
    load: Loader = _load_with_torch,
) -> Transfer:
    """Restore the best bundle into ``cache_dir``: ``exact_key`` if present, else the newest for this fingerprint.

    Nothing is written to ``cache_dir`` unless the whole bundle verified (checksums, signature,
    fingerprint). Mega-cache blobs are loaded through ``load`` (torch by default) with
    ``TORCHINDUCTOR_CACHE_DIR`` pointing at ``cache_dir``.
    """
    started = time.perf_counter()
    digest = fingerprint.digest()
    try:
        key, outcome = _find(store, prefix, digest, exact_key)
        if key is None:
            why = _why_miss(store, prefix, fingerprint)
            return Transfer("miss", seconds=time.perf_counter() - started, message=why)
        with tempfile.TemporaryDirectory(prefix="compilecache-restore-") as tmp:
            path = Path(tmp) / "bundle"
            if not store.get(key, path):
                return Transfer("miss", key=key, seconds=time.perf_counter() - started, message="bundle vanished")
            size = path.stat().st_size
            unpacked = _unpack(path, cache_dir, signing_key, fingerprint)
        artifacts = _load_blobs(unpacked.blobs, cache_dir, load)
    except (StoreError, BundleError, OSError) as exc:
        return Transfer("error", seconds=time.perf_counter() - started, message=f"restore failed: {exc}")
    except Exception as exc:  # a store SDK or torch surprise must not crash a test session either
        return Transfer("error", seconds=time.perf_counter() - started,
                        message=f"restore failed: {type(exc).__name__}: {exc}")
    return Transfer(
        outcome, key=key, size=size, seconds=time.perf_counter() - started,
        files=len(unpacked.files), artifacts=dict(artifacts),
    )


def _find(store: Any, prefix: str, digest: str, exact_key: str | None) -> tuple[str | None, str]:
    if exact_key and any(entry.key == exact_key for entry in store.list(exact_key)):
        return exact_key, "exact"
    return find_latest(store, restore_prefix(prefix, digest)), "partial"


def _unpack(path: Path, cache_dir: str, signing_key: bytes | None, fingerprint: Fingerprint) -> Any:
    from . import bundle
    from .cachedir import lock

    # Verify before the lock: a rejected bundle must not leave even a lock file in the cache dir.
    bundle.verify(path, signing_key=signing_key, fingerprint=fingerprint.to_json())
    os.makedirs(cache_dir, exist_ok=True)
    with lock(cache_dir):
        return bundle.unpack(path, Path(cache_dir), signing_key=signing_key, fingerprint=fingerprint.to_json())


def _load_blobs(blobs: Mapping[str, bytes], cache_dir: str, load: Loader) -> dict[str, int]:
    from .probe import CACHE_ENV

    previous = os.environ.get(CACHE_ENV)
    os.environ[CACHE_ENV] = cache_dir
    totals: dict[str, int] = {}
    try:
        for name in sorted(blobs):
            try:
                counts = load(blobs[name])
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


def _why_miss(store: Any, prefix: str, fingerprint: Fingerprint) -> str:
    """Name the facts that differ from the newest bundle under the prefix (any fingerprint).

    Explaining is best effort: trouble while fetching the other bundle leaves the outcome a miss.
    """
    try:
        return _explain_miss(store, prefix, fingerprint)
    except (StoreError, OSError) as exc:
        return f"no bundle for fingerprint {fingerprint.digest()} (could not explain: {exc})"


def _explain_miss(store: Any, prefix: str, fingerprint: Fingerprint) -> str:
    from . import bundle

    latest = find_latest(store, prefix + "-")
    if latest is None:
        return f"no bundle under {prefix}- in {store.location}"
    with tempfile.TemporaryDirectory(prefix="compilecache-explain-") as tmp:
        path = Path(tmp) / "bundle"
        if not store.get(latest, path):
            return f"no bundle for fingerprint {fingerprint.digest()}"
        try:
            manifest = bundle.read_manifest(path)
        except BundleError as exc:
            return f"no bundle for fingerprint {fingerprint.digest()}; newest {latest} is unreadable: {exc}"
    differences = explain(manifest.fingerprint, fingerprint.to_json())
    return f"no bundle for fingerprint {fingerprint.digest()}; newest is {latest}, which differs in: " + (
        "; ".join(differences) or "nothing (same facts, older digest scheme)"
    )


def save(
    store: Any,
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
) -> Transfer:
    """Pack this session's artifacts into one bundle, put it in the store, prune old bundles."""
    from . import bundle
    from .stores.base import prune

    started = time.perf_counter()
    key = make_key(prefix, fingerprint.digest(), suffix)
    if not blobs and not files:
        return Transfer("skipped", key=key, message="nothing was compiled")
    try:
        with tempfile.TemporaryDirectory(prefix="compilecache-save-") as tmp:
            path = Path(tmp) / "bundle"
            manifest = bundle.pack(
                path, key=key, fingerprint=fingerprint.to_json(), digest=fingerprint.digest(),
                torch_version=fingerprint.facts.get("torch", "unknown"), blobs=blobs,
                cache_dir=Path(cache_dir), files=files, stats=stats, signing_key=signing_key,
            )
            size = path.stat().st_size
            store.put(key, path)
    except (StoreError, BundleError, OSError) as exc:
        return Transfer("error", key=key, seconds=time.perf_counter() - started, message=f"save failed: {exc}")
    except Exception as exc:  # see restore
        return Transfer("error", key=key, seconds=time.perf_counter() - started,
                        message=f"save failed: {type(exc).__name__}: {exc}")
    message = ""
    try:
        prune(store, restore_prefix(prefix, fingerprint.digest()), keep)
    except Exception as exc:  # the bundle is stored; only the clean-up failed
        message = f"could not prune old bundles: {exc}"
    return Transfer("saved", key=key, size=size, seconds=time.perf_counter() - started,
                    files=len(manifest.file_paths), message=message)
