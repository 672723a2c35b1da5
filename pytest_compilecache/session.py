"""What one pytest process does for the plugin: the controller's and the workers' roles.

The hooks in :mod:`plugin` call into :class:`CompileCacheSession`; it owns the session cache dir, the
statistics, the restore and the save. It knows nothing of pytest's objects (it gets plain values).
"""

from __future__ import annotations

import atexit
import json
import os
import sys
from pathlib import Path
from typing import Any
from typing import Mapping

from . import ConfigError
from . import cachedir
from . import report
from ._fs import atomic_file
from .cachedir import SESSION_ENV
from .cachedir import SessionDir
from .settings import Settings
from .stats import ItemRecord
from .stats import SessionStats

_TOUCHED_ENV = (
    "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TORCHINDUCTOR_FORCE_DISABLE_CACHES", SESSION_ENV,
    "TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE", "TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE",
    "TORCHINDUCTOR_AUTOTUNE_REMOTE_CACHE", "TORCHINDUCTOR_REDIS_URL", "TORCHINDUCTOR_REDIS_HOST",
    "TORCHINDUCTOR_REDIS_PORT",
)


class CompileCacheSession:
    """The plugin's state in one process (the controller, a worker, or a plain session)."""

    def __init__(self, settings: Settings, session_dir: SessionDir, saved_env: dict[str, str | None]) -> None:
        self.settings = settings
        self.dir = session_dir
        self.saved_env = saved_env
        self.is_worker = False
        self.stats = SessionStats()
        self.notes: list[str] = []
        self.warnings: list[str] = []
        self.errors: list[str] = []
        self.restored: dict[str, Any] | None = None
        self.saved: dict[str, Any] | None = None
        self.blobs: dict[str, bytes] = {}
        self.files: set[str] = set()
        self.workers: list[str] = []
        self.marked: dict[str, str] = {}  # nodeid -> "isolated" | "disabled", from the marker
        self._fingerprint: Any = None

    # ---- start

    @classmethod
    def start(cls, settings: Settings, default_shared: Path, inherited: str | None = None) -> CompileCacheSession:
        """Decide and export the session cache dir (a worker follows its controller's ``inherited`` one)."""
        saved = {name: os.environ.get(name) for name in _TOUCHED_ENV}
        if settings.store:
            open_configured_store(settings)  # a malformed store URL fails at start-up; no I/O happens here
        if inherited:
            session_dir = SessionDir.from_env(inherited)
        else:
            session_dir = cachedir.decide(settings.effective_mode, settings.dir, default_shared)
        session = cls(settings, session_dir, saved)
        if session_dir.owned and not settings.keep:
            # Also when pytest stops before the session ends (--help, a usage error, a broken conftest).
            atexit.register(cachedir.remove, session_dir)
        if not inherited:
            session._export()
        return session

    def _export(self) -> None:
        from . import probe

        mode = self.dir.mode
        if mode is None and not self.settings.redis:
            return
        os.environ[SESSION_ENV] = self.dir.to_env()
        note = None
        if mode in ("shared", "isolated"):
            note = probe.point_cache_dir(self.dir.path)
        elif mode == "disabled":
            note = probe.point_cache_dir(None, disable=True)
        if note:
            self.notes.append(note)
        if self.settings.redis:
            self._enable_redis(self.settings.redis)

    def _enable_redis(self, url: str) -> None:
        """Turn on torch's remote caches (read at import and per compile), after checking Redis answers."""
        from . import remote

        problem = remote.check_redis(url)
        if problem:
            self.warn(f"redis at {remote.redacted(url)} unreachable ({problem}); remote caches stay off")
            return
        os.environ.update(remote.redis_env(url))

    def ensure_dir(self) -> None:
        if self.dir.mode == "shared" and self.dir.path and not os.path.isdir(self.dir.path):
            try:
                cachedir.make_dir(Path(self.dir.path))
            except ConfigError as exc:
                self.warn(str(exc))

    def header(self) -> str | None:
        if self.dir.mode is None and not self.settings.redis:
            return None
        from .remote import redacted

        extra = f", redis {redacted(self.settings.redis)}" if self.settings.redis else ""
        if self.settings.redis and not os.environ.get("TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE"):
            extra += " (unreachable, off)"
        store = f", store {self.settings.store}" if self.settings.store else ""
        return f"compile cache: {self.dir.describe()}{store}{extra}"

    def close(self) -> None:
        """Put the environment back as it was (matters when pytest runs in-process, e.g. pytester)."""
        for name, value in self.saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

    def warn(self, message: str) -> None:
        """Infrastructure trouble: one line, the session goes on cold (or fails later, if strict)."""
        self.warnings.append(message)
        if self.settings.strict:
            self.errors.append(message)

    # ---- bundles

    @property
    def saving(self) -> bool:
        return bool(self.settings.store) and not self.settings.readonly and self.dir.path is not None

    def fingerprint(self) -> Any:
        if self._fingerprint is None:
            from .fingerprint import collect

            self._fingerprint = collect(salt=self.settings.key_salt)
        return self._fingerprint

    def _store(self) -> Any:
        return open_configured_store(self.settings)

    def restore(self) -> None:
        """Controller, at session start: restore the newest matching bundle into the session dir."""
        if not self.settings.store or self.settings.restore == "skip" or not self.dir.path:
            return
        from . import sync

        try:
            store = self._store()
            self.fingerprint()
        except Exception as exc:  # a store or fingerprint that cannot even be set up: infrastructure trouble
            self.warn(f"restore skipped: {type(exc).__name__}: {exc}")
            self.restored = {"outcome": "error", "message": str(exc)}
            return
        result = sync.restore(
            store, prefix=self.settings.key_prefix, fingerprint=self.fingerprint(),
            cache_dir=self.dir.path, signing_key=self.settings.signing_key,
        )
        self.restored = result.to_json()
        if not result.ok:
            self.warn(result.message)

    # ---- statistics

    def record(self, nodeid: str, delta: Mapping[str, Any]) -> None:
        """Count one finished test and keep its record when it compiled (the per-test hot path)."""
        self.stats.tests += 1
        if delta:
            record = ItemRecord(nodeid=nodeid, worker=self.worker_id)
            record.add(delta)
            if record.compiled:
                self.stats.add_record(record)

    @property
    def worker_id(self) -> str:
        return os.environ.get("PYTEST_XDIST_WORKER", "controller")

    def worker_output(self) -> dict[str, Any]:
        """A worker's payload for the controller: records, test count, mega-cache blob, files used."""
        from . import probe

        loaded = probe.dynamo_loaded()
        return {
            "tests": self.stats.tests,
            "records": [r.to_json() for r in self.stats.records.values()],
            "blob": probe.save_artifacts() if self.saving and loaded else None,
            "files": probe.used_files(self.dir.path) if self.dir.path and loaded else [],
        }

    def add_worker_output(self, worker: str, output: Mapping[str, Any] | None) -> None:
        """Merge what a worker sent; a worker that sent nothing (it crashed) is listed, not fatal."""
        self.workers.append(worker)
        if not output:
            self.stats.silent_workers.append(worker)
            return
        self.stats.tests += int(output.get("tests", 0))
        for data in output.get("records") or []:
            self.stats.add_record(ItemRecord.from_json(data))
        if output.get("blob"):
            self.blobs[worker] = bytes(output["blob"])
        self.files.update(output.get("files") or [])

    # ---- finish (controller)

    def finish(self, verbose: bool = False) -> bool:
        """Save, evict, write reports; return True when the session must fail (hit rate, strict)."""
        from . import probe

        if not self.workers and probe.dynamo_loaded():
            own = self.worker_output()
            if own["blob"]:
                self.blobs["controller"] = own["blob"]
            self.files.update(own["files"])
        if self.dir.path and self.files:
            cachedir.touch(self.dir.path, sorted(self.files))
        if self.settings.redis and probe.dynamo_loaded() and not probe.remote_counts_available():
            self.notes.append("this torch reports remote FX-graph counts only (AOTAutograd remote counts need 2.11+)")
        if self.saving:
            self._save()
        self._evict()
        self._write_json()
        self._write_step_summary()
        if not self.settings.keep:
            cachedir.remove(self.dir)
        rate, floor = self.stats.hit_rate, self.settings.min_hit_rate
        if floor is not None and rate is not None and rate < floor:
            message = f"hit rate {report.percent(rate)} is below --compile-cache-min-hit-rate={floor:g}"
            if self.restored and self.restored.get("outcome") == "error" and not self.settings.strict:
                # The restore failed: a cold run is infrastructure trouble, which never fails a session.
                self.notes.append(message + " (the restore failed: not failing the session)")
            else:
                self.errors.append(message)
        return bool(self.errors)

    def _save(self) -> None:
        from . import sync
        from .fingerprint import default_suffix

        restored = self.settings.restore == "skip" or (
            self.restored is not None and self.restored.get("outcome") in ("exact", "partial")
        )
        if restored and self.stats.hits and not self.stats.misses:
            # Every graph came from the restored cache: a new bundle would only repeat the old one.
            self.saved = {"outcome": "skipped", "message": "every graph hit the restored cache; nothing new to save"}
            return
        try:
            store = self._store()
            self.fingerprint()
        except Exception as exc:
            self.warn(f"save skipped: {type(exc).__name__}: {exc}")
            return
        result = sync.save(
            store, prefix=self.settings.key_prefix, fingerprint=self.fingerprint(),
            suffix=self.settings.run_suffix or default_suffix(), cache_dir=self.dir.path or "",
            blobs=self.blobs, files=sorted(self.files), stats=self.stats.totals_json(),
            signing_key=self.settings.signing_key, keep=self.settings.keep_bundles,
        )
        self.saved = result.to_json()
        if not result.ok:
            self.warn(result.message)

    def _evict(self) -> None:
        if self.dir.mode != "shared" or not self.dir.path or not self.settings.max_size:
            return
        try:
            with cachedir.lock(self.dir.path):
                removed, freed = cachedir.evict(self.dir.path, self.settings.max_size)
        except Exception as exc:
            self.warn(f"could not trim the cache dir: {exc}")
            return
        if removed:
            self.notes.append(f"trimmed the cache dir: {removed} files, {report.human_size(freed)} least recently used")

    def _json(self) -> dict[str, Any]:
        data = report.to_json(
            self.stats, mode=self.dir.mode, cache_dir=self.dir.path, restore=self.restored,
            save=self.saved, notes=self.notes,
        )
        data["warnings"] = list(self.warnings)
        return data

    def _write_json(self) -> None:
        if not self.settings.json:
            return
        path = Path(self.settings.json)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with atomic_file(path, fsync=False) as fh:
                fh.write((json.dumps(self._json(), indent=2) + "\n").encode())
        except OSError as exc:
            self.warn(f"could not write --compile-cache-json={path}: {exc.strerror}")

    def _write_step_summary(self) -> None:
        target = os.environ.get("GITHUB_STEP_SUMMARY")
        if self.settings.summary == "off" or not target or not self._worth_reporting():
            return
        text = report.markdown(self.stats, where=self.dir.describe(), restore=self.restored, save=self.saved)
        try:
            with open(target, "a", encoding="utf-8") as fh:
                fh.write(text + "\n")
        except OSError as exc:
            self.warn(f"could not append to GITHUB_STEP_SUMMARY: {exc.strerror}")

    def _worth_reporting(self) -> bool:
        return self.stats.anything_compiled or bool(self.restored or self.saved or self.warnings)

    # ---- terminal

    def terminal_lines(self, verbose: bool = False) -> list[tuple[str, dict[str, bool]]]:
        lines: list[tuple[str, dict[str, bool]]] = []
        if self.settings.report == "none" and not (self.warnings or self.errors):
            return lines
        if self.settings.report != "none" and self._worth_reporting():
            lines.append((report.summary_line(self.stats, self.dir.describe()), {}))
            for kind, info in (("restore", self.restored), ("save", self.saved)):
                if info:
                    lines.append((report.transfer_line(kind, info), {}))
            if self.stats.silent_workers:
                silent = ", ".join(self.stats.silent_workers)
                lines.append((f"workers that sent no statistics: {silent}", {"yellow": True}))
            if verbose or self.settings.report == "full":
                lines.extend((line, {}) for line in report.table_lines(self.stats))
            lines.extend((f"note: {note}", {}) for note in self.notes)
        for message in self.warnings:
            lines.append((f"CompileCacheWarning: {message}", {"yellow": True}))
            if os.environ.get("GITHUB_ACTIONS") == "true":
                sys.stdout.write(f"::warning title=compile cache::{message}\n")
        for message in self.errors:
            lines.append((f"compile cache FAILED: {message}", {"red": True, "bold": True}))
        return lines


def open_configured_store(settings: Settings) -> Any:
    """The store named by ``--compile-cache-store``; raises ConfigError for a malformed URL (no I/O)."""
    from .stores import open_store

    options = {"endpoint_url": settings.s3_endpoint} if settings.s3_endpoint else {}
    return open_store(settings.store or "", readonly=settings.readonly, **options)


class LiveRecord:
    """The ``compile_cache_stats`` fixture: what the current test has compiled so far, read live.

    Every attribute read (``fxgraph``, ``aotautograd``, ``frames``, ``recompiles``, ``misses``...) takes a
    fresh snapshot, so a test can compile, then assert on what that compile did.
    """

    def __init__(self, nodeid: str, start: Any) -> None:
        self._nodeid = nodeid
        self._start = start

    def snapshot(self) -> ItemRecord:
        from . import probe

        record = ItemRecord(nodeid=self._nodeid)
        if self._start is not None:
            record.add(probe.delta(self._start))
        return record

    def __getattr__(self, name: str) -> Any:
        return getattr(self.snapshot(), name)
