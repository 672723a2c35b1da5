"""What the plugin does in one pytest process: a set-up decided once, then one of two roles.

* :class:`Setup` - decided in the first hook, before anything imports torch: the settings, the session
  cache dir (a worker follows its controller's), the environment it exports (leased, put back at the
  end), the store it will use. Shared by both roles.
* :class:`Controller` - a plain session or an xdist controller: restores the bundle before the first
  compile, merges what workers send, then at the end saves, trims, writes the JSON and the step summary
  and decides whether the session fails (hit-rate guard, strict).
* :class:`Worker` - an xdist worker: records its tests and sends records, its mega-cache blob and the
  files it used to the controller; it never restores, saves or writes a report.

Both roles record through a :class:`Recorder` (statistics + probe) and report trouble through one
:class:`~pytest_compilecache.problems.Problems`. Nothing here imports pytest (the hooks in
:mod:`plugin` pass plain values) or torch (only :mod:`probe` does, lazily).
"""

from __future__ import annotations

import atexit
import json
import os
import tempfile
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any
from typing import Mapping
from typing import NamedTuple

from . import ConfigError
from . import cachedir
from . import probe
from ._env import EnvLease
from .cachedir import SESSION_ENV
from .cachedir import SessionDir
from .ghrunner import append_summary
from .ghrunner import one_line
from .problems import Problems
from .settings import Settings
from .stats import CompileCacheStats
from .stats import ItemRecord
from .stats import SessionStats

if TYPE_CHECKING:
    from .explain import GraphsRecord
    from .explain import MissExplanation
    from .explain import SessionExplanation
    from .fingerprint import Fingerprint
    from .stores import Store
    from .stores.timed import TimedStore
    from .sync import RestoreResult
    from .sync import SaveResult

# Modes whose cache dir keeps FX graphs, so that a miss can be compared with an earlier run's lookups.
EXPLAINED_MODES = ("shared", "isolated")
# Every variable the plugin may set for torch; the lease puts them all back at the end.
TOUCHED_ENV = (
    "TORCHINDUCTOR_CACHE_DIR",
    "TRITON_CACHE_DIR",
    "TORCHINDUCTOR_FORCE_DISABLE_CACHES",
    SESSION_ENV,
    "TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE",
    "TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE",
    "TORCHINDUCTOR_AUTOTUNE_REMOTE_CACHE",
    "TORCHINDUCTOR_REDIS_URL",
    "TORCHINDUCTOR_REDIS_HOST",
    "TORCHINDUCTOR_REDIS_PORT",
)
# The Action restores before pytest runs (``--compile-cache-restore=skip``) and tells the plugin how
# that went, so that a failed restore never fails the session through the hit-rate guard.
ACTION_RESTORE_ENV = "PYTEST_COMPILECACHE_RESTORED"


@dataclass
class Setup:
    """The decisions made once per process before torch is imported; see the module docstring."""

    settings: Settings
    dir: SessionDir
    lease: EnvLease
    problems: Problems
    follows_controller: bool = False
    _fingerprint: Fingerprint | None = field(default=None, repr=False)
    registration: cachedir.Registration | None = field(default=None, repr=False)
    # Redis errors met by torch's remote caches (this process's; a controller's also its workers')
    remote_errors: list[str] = field(default_factory=list, repr=False)

    @classmethod
    def start(cls, settings: Settings, default_shared: Path, *, inherited: str | None, problems: Problems) -> Setup:
        """Decide and export the session cache dir (an xdist worker follows its controller's ``inherited``).

        Raises :class:`ConfigError` for an unusable dir, store URL or JSON report path (no I/O happens for
        the store), naming the option as the user gave it.
        """
        lease = EnvLease(TOUCHED_ENV)
        try:
            if settings.store:
                open_configured_store(settings)  # a malformed store URL fails at start-up
        except ConfigError as exc:
            raise settings.respell(exc, "store") from None
        if settings.json and not inherited:
            from ._fs import report_target  # cost: only a session that writes a JSON report loads _fs

            report_target(settings.json, settings.spelling("json"))
        if inherited:
            session_dir = SessionDir.from_env(inherited)
        else:
            try:
                session_dir = cachedir.decide(settings.effective_mode, settings.dir, default_shared)
            except ConfigError as exc:
                raise settings.respell(exc, "dir") from None
        setup = cls(settings, session_dir, lease, problems, follows_controller=bool(inherited))
        if session_dir.owned and not settings.keep:
            # Also when pytest stops before the session ends (--help, a usage error, a broken conftest).
            atexit.register(cachedir.remove, session_dir)
        if not inherited:
            setup._export()
            setup._register()
        return setup

    def _register(self) -> None:
        """A shared dir's controller: sweep what killed sessions left, then mark this session live in the
        dir (no other session trims it while the registration is held)."""
        if self.dir.mode != "shared" or not self.dir.path:
            return
        try:
            swept = cachedir.sweep_stale(self.dir.path)
            self.registration = cachedir.register_session(self.dir.path)
        except OSError as exc:
            self.problems.warn(f"could not register in the cache dir ({exc}); other sessions may trim it meanwhile")
            return
        if swept:
            self.problems.note(f"removed {swept} temp files left in the cache dir by killed sessions")

    def release(self) -> None:
        """Withdraw the registration: this session no longer reads or writes the dir (idempotent)."""
        if self.registration is not None:
            self.registration.close()

    def _export(self) -> None:
        mode = self.dir.mode
        if mode is None and not self.settings.redis:
            return
        self.lease.set({SESSION_ENV: self.dir.to_env()})
        note = None
        if mode in ("shared", "isolated"):
            note = probe.point_cache_dir(self.dir.path)
        elif mode == "disabled":
            note = probe.point_cache_dir(None, disable=True)
        if note:
            self.problems.note(note)
        if self.settings.redis:
            self._enable_redis(self.settings.redis)

    def _enable_redis(self, url: str) -> None:
        """Turn on torch's remote caches (read at import and per compile), after checking Redis answers."""
        from . import remote  # cost: a session without Redis never loads remote

        problem = remote.check_redis(url)
        if problem:
            self.problems.warn(f"redis at {remote.redacted(url)} unreachable ({problem}); remote caches stay off")
            return
        self.lease.set(dict(remote.redis_env(url)))

    @property
    def redis_on(self) -> bool:
        return bool(self.settings.redis) and bool(os.environ.get("TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE"))

    def take_remote_errors(self) -> None:
        """Keep the Redis errors of torch's remote caches in this process so far (:func:`probe.guard_remote_cache`
        switched them off and recorded them) in :attr:`remote_errors`: workers send them to the controller,
        which warns once for the whole session (:meth:`warn_remote_errors`)."""
        self.remote_errors += probe.remote_cache_errors()

    def warn_remote_errors(self) -> None:
        """One warning when torch's Redis remote caches failed in any process of the session: the compiles
        went on with the local caches."""
        errors = self.remote_errors
        if errors:
            more = f"; {len(errors)} errors in all" if len(errors) > 1 else ""
            self.problems.warn(
                one_line(
                    f"redis remote cache failed mid-session ({errors[0]}{more}); torch's remote caches are off "
                    "for the rest of each process that met it, its compiles use the local cache dir",
                    500,
                )
            )

    def ensure_dir(self) -> None:
        """Re-make a shared dir that ``--cache-clear`` removed since start-up (racing workers are fine)."""
        if self.dir.mode == "shared" and self.dir.path and not os.path.isdir(self.dir.path):
            try:
                cachedir.make_dir(Path(self.dir.path))
            except ConfigError as exc:
                self.problems.warn(str(exc))
        if self.registration is not None:
            try:
                self.registration.renew()  # --cache-clear removed it with the dir
            except OSError as exc:
                self.problems.warn(f"could not register in the cache dir ({exc}); other sessions may trim it meanwhile")

    def header(self) -> str | None:
        if self.dir.mode is None and not self.settings.redis:
            return None
        from .remote import redacted  # cost: as above

        extra = f", redis {redacted(self.settings.redis)}" if self.settings.redis else ""
        if self.settings.redis and not self.redis_on:
            extra += " (unreachable, off)"
        store = f", store {self.settings.store}" if self.settings.store else ""
        where = f" ({self.dir.note})" if self.dir.note else ""
        return f"compile cache: {self.dir.describe()}{where}{store}{extra}"

    @property
    def saving(self) -> bool:
        return bool(self.settings.store) and not self.settings.readonly and self.dir.path is not None

    def fingerprint(self) -> Fingerprint:
        if self._fingerprint is None:
            # cost: only a session with a store fingerprints
            from .fingerprint import collect

            self._fingerprint = collect(salt=self.settings.key_salt)
        return self._fingerprint

    def close(self) -> None:
        """Put the environment and torch's config back as they were, withdraw the registration (idempotent;
        matters when pytest runs in-process, e.g. pytester, an IDE). Called at unconfigure, and through
        pytest's cleanup stack when the session stops before configure (a usage error, a broken conftest)."""
        self.release()
        self.lease.restore()
        probe.put_back_config()


class Start(NamedTuple):
    """Where a test started: torch's counters and the position in this process's FX-graph lookups (None:
    explaining is off)."""

    mark: probe.Mark
    graphs: int | None


# The start of every test that begins before torch is imported: no counters yet, no FX-graph lookups.
COLD_MARK = probe.Mark({}, 0, 0)
COLD = Start(COLD_MARK, 0)
COLD_UNEXPLAINED = Start(COLD_MARK, None)  # the same with explaining off


class Recorder:
    """Per-test statistics of one process: the hot path is :meth:`start` / :meth:`finish` per test.

    While torch is not imported both are a few attribute reads (no explain import, no parsing). The
    ``baseline`` is the earlier run's graph record the live ``compile_cache_stats.why`` compares with:
    set by the controller after its restore, read lazily from ``baseline_dir`` by a worker. With
    ``explain=False`` (``--compile-cache-explain=off``) it never touches the graph capture: no lookups are
    taken, none recorded, nothing explained.
    """

    def __init__(self, worker: str, explain: bool = True) -> None:
        self.worker = worker
        self.explain = explain
        self.stats = SessionStats()
        self.baseline_dir: str | None = None
        self._baseline: GraphsRecord | None = None
        self._baseline_read = False

    def start(self) -> Start:
        """Where a test starts; :data:`COLD` (no probe call) while torch is not imported."""
        if not probe.torch_loaded():
            return COLD if self.explain else COLD_UNEXPLAINED
        # graph_mark() would install the capture once torch's codecache is loaded: not when explaining is off.
        return Start(probe.mark(), probe.graph_mark() if self.explain else None)

    def finish_cold(self, start: Start) -> bool:
        """Count a test that cannot have compiled: it began :data:`COLD` and torch is still not imported.

        The per-test path of a session that never imports torch (no node id, no probe call). False: the
        test may have compiled, call :meth:`finish`.
        """
        if start.mark is not COLD_MARK or probe.torch_loaded():
            return False
        self.stats.tests += 1
        return True

    def finish(self, nodeid: str, start: Start, intended: bool = False) -> None:
        """Record the test that began at ``start``; ``intended``: marked isolated/disabled, so its misses are
        by design and its graphs are neither kept nor explained."""
        self.record(nodeid, self._delta(start, intended))

    @staticmethod
    def _delta(start: Start, intended: bool) -> dict[str, Any]:
        delta = probe.delta(start.mark)
        if start.graphs is None:  # explaining is off
            return delta
        graphs = probe.graph_delta(start.graphs)
        if graphs and not intended:
            delta["graphs"] = graphs
        return delta

    def record(self, nodeid: str, delta: Mapping[str, Any]) -> None:
        """Count one finished test and keep its record when it compiled."""
        self.stats.tests += 1
        if delta:
            record = ItemRecord(nodeid=nodeid, worker=self.worker)
            record.add(delta)
            if record.compiled:
                self.stats.add_record(record)

    def live(self, nodeid: str, start: Start | None, intended: bool = False) -> CompileCacheStats:
        """The ``compile_cache_stats`` fixture's object for a test that started at ``start``.

        Its ``why`` compares the test's misses so far with the same test's graphs in the baseline.
        """
        if start is None:
            return CompileCacheStats(nodeid, dict)
        explain = self._why if self.explain and not intended else None
        return CompileCacheStats(nodeid, lambda: self._delta(start, intended), explain)

    def _why(self, record: ItemRecord) -> list[MissExplanation]:
        baseline = self.baseline()
        if baseline is None:
            return []
        # cost: explain loads only when there is something to explain
        from .explain import explain_test

        return explain_test(record.graphs, baseline.tests.get(record.nodeid))

    def baseline(self) -> GraphsRecord | None:
        """The earlier run's graph record; None when there is none or it is unreadable (the controller warns)."""
        if not self._baseline_read:
            self._baseline_read = True
            if self.baseline_dir:
                # cost: as above
                from .explain import load_record

                try:
                    self._baseline = load_record(Path(self.baseline_dir))
                except (OSError, ValueError):
                    self._baseline = None
        return self._baseline

    def set_baseline(self, record: GraphsRecord | None) -> None:
        self._baseline, self._baseline_read = record, True

    @staticmethod
    def artifacts(setup: Setup) -> tuple[bytes | None, list[str]]:
        """This process's mega-cache blob (only when saving) and the cache-dir files it used.

        Call at most once per process: a second ``save_cache_artifacts`` spoils later loads (torch 2.8+).
        """
        if not probe.dynamo_loaded():
            return None, []
        blob = probe.save_artifacts() if setup.saving else None
        files = probe.used_files(setup.dir.path) if setup.dir.path else []
        return blob, files


class Worker:
    """An xdist worker: records tests; at the end hands everything to the controller."""

    def __init__(self, setup: Setup, recorder: Recorder) -> None:
        self.setup = setup
        self.recorder = recorder

    def session_start(self) -> None:
        self.setup.ensure_dir()
        if self.setup.settings.explain and self.setup.dir.mode in EXPLAINED_MODES:
            self.recorder.baseline_dir = self.setup.dir.path  # the controller has installed its baseline there

    def _remote_errors(self) -> list[str]:
        self.setup.take_remote_errors()
        return list(self.setup.remote_errors)

    def output(self) -> dict[str, Any]:
        """The payload for the controller (plain JSON-able values, sent through ``workeroutput``)."""
        blob, files = Recorder.artifacts(self.setup)
        return {
            "tests": self.recorder.stats.tests,
            "records": [r.to_json() for r in self.recorder.stats.records.values()],
            "blob": blob,
            "files": files,
            "problems": self.setup.problems.to_json(),
            "remote_errors": self._remote_errors(),
            # Where torch in this process keeps precompiled headers (None: torch did not compile C++ here);
            # the controller carries headers only when every process agrees with its own computed dir.
            "header_dir": probe.precompiled_header_dir(),
            # The headers torch looked up here, each checked once by this process (issue 24).
            "headers": probe.precompiled_headers_used(),
        }


class Controller:
    """A plain session or an xdist controller; see the module docstring."""

    def __init__(self, setup: Setup, recorder: Recorder) -> None:
        self.setup = setup
        self.recorder = recorder
        self.problems = setup.problems
        self.restored: RestoreResult | None = None
        self.saved: SaveResult | None = None
        self.blobs: dict[str, bytes] = {}
        self.files: set[str] = set()
        self.workers: list[str] = []
        self.header_since: float | None = None  # the session start, for finding the headers it used
        self.header_dirs: set[str] = set()  # torch's header dirs reported by the processes that compiled
        self.header_uses: list[Any] = []  # every process's checked headers (headers.HeaderUse JSON)
        # Miss explanations (issue 12): the earlier run's graphs, what they are, this run's verdict and record.
        self.baseline: GraphsRecord | None = None
        self.compared_with = ""
        self.why: SessionExplanation | None = None
        self.graphs: GraphsRecord | None = None
        self.store_trouble: str | None = None  # the store failed or stalled at the restore (then no save)

    @property
    def settings(self) -> Settings:
        return self.setup.settings

    @property
    def stats(self) -> SessionStats:
        return self.recorder.stats

    # ---- start

    def session_start(self) -> None:
        """Before the first compile and before xdist starts workers: restore the newest matching bundle, then
        read the graph record this session's misses will be explained against (:meth:`_read_baseline`).

        Also sweeps what killed sessions left behind (our temp files and staging dirs whose owner is gone)
        from the cache dir and the temp dir.
        """
        self._restore()
        self._read_baseline()

    def _restore(self) -> None:
        self.setup.ensure_dir()
        self._sweep()
        if self.setup.saving:
            # cost: headers, sync and stores load only in a session with a store
            from .headers import session_start

            self.header_since = session_start()
        if self.settings.restore == "skip":
            self.restored = action_restore_result(os.environ.get(ACTION_RESTORE_ENV))
            if self.restored is not None and self.restored.staged and self.setup.dir.path:
                self._load_staged(self.restored)
            return
        if not self.settings.store or not self.setup.dir.path:
            return
        # cost: as above
        from . import sync

        try:
            fingerprint = self.setup.fingerprint()
            store = self._timed_store()
        except Exception as exc:  # a store or fingerprint that cannot even be set up: infrastructure trouble
            self.restored = sync.RestoreResult("error", message=f"restore skipped: {type(exc).__name__}: {exc}")
        else:
            self.restored = sync.restore(
                store,
                prefix=self.settings.key_prefix,
                fingerprint=fingerprint,
                cache_dir=self.setup.dir.path,
                signing_key=self.settings.signing_key,
                max_bytes=self.settings.max_bundle_size,
            )
            # A restore that failed on the store skips the save (it would wait again), and so does one whose
            # store spent the whole budget on the side (explaining a miss, fetching headers): it is stalling.
            # A store error met only while explaining a miss is part of the miss's message, not a failure.
            if self.restored.outcome == "error" or store.exhausted:
                self.store_trouble = store.trouble
        if self.restored.warning:
            self.problems.warn(self.restored.warning)
        for line in self.restored.headers.warnings:
            self.problems.warn(line)
        for line in self.restored.headers.notes:
            self.problems.note(line)
        if self.store_trouble and not self.restored.warning and not self.restored.headers.warnings:
            self.problems.warn(f"{self.store_trouble}; nothing will be saved this session")  # the one warning

    def _load_staged(self, restored: RestoreResult) -> None:
        """Load the mega-cache blobs the Action's restore step installed but left for this process (that step
        imports no torch; this one will): a blob that changed or that torch rejects is one warning, and the
        session counts as one after a failed restore (cold compile, the hit-rate floor not enforced)."""
        # cost: as above
        from . import sync

        self.restored = sync.load_staged(restored, self.setup.dir.path or "")
        if self.restored.outcome == "error":
            self.problems.warn(f"{self.restored.message}; the tests compile cold")
        elif self.restored.message != restored.message:
            self.problems.note(self.restored.message)

    def _read_baseline(self) -> None:
        """The earlier run's graphs, kept as ``<cache dir>/.compilecache-graphs.json`` for every process.

        A restored bundle's record (verified with the bundle) replaces the dir's; without one, a shared dir's
        record is the previous local session's. A fresh isolated dir has none unless a bundle brought it, so a
        cold isolated session explains nothing: every miss there is intended. An unreadable record is one
        warning and no explanations (the session's own record replaces it at the end).
        """
        path = self.setup.dir.path
        if not self.settings.explain or not path or self.setup.dir.mode not in EXPLAINED_MODES:
            return  # off: a restored bundle's record is not installed, nothing is compared
        graphs = self.restored.graphs if self.restored is not None else None
        record: GraphsRecord | None = None
        try:
            if graphs:
                # cost: explain loads only when there is a record to read
                from .explain import install_restored

                record = install_restored(Path(path), graphs)
            elif os.path.isfile(os.path.join(path, cachedir.GRAPHS_RECORD)):
                from .explain import load_record  # cost: as above

                record = load_record(Path(path))
        except (OSError, ValueError) as exc:
            where = "of the restored bundle" if graphs else "in the cache dir"
            self.problems.warn(one_line(f"no miss explanations: the graph record {where} is unreadable: {exc}", 500))
            record = None
        # The Action restores before pytest (--compile-cache-restore=skip) and leaves the bundle's record here.
        by_action = self.settings.restore == "skip" and self.restored is not None and self.restored.ok
        from_bundle = bool(graphs) or (by_action and self.restored is not None and self.restored.outcome != "miss")
        self.baseline, self.compared_with = record, ("bundle" if from_bundle else "previous session")
        self.recorder.set_baseline(record)

    def _sweep(self) -> None:
        """Remove the bundle temps (staging dirs, save/restore dirs) whose owner is gone: in the cache dir,
        and in the temp dir when this session moves bundles. torch's own temp files in the cache dir are
        swept by :func:`cachedir.sweep_stale` when the session registers."""
        # cost: a session without a cache dir of ours never loads _fs
        from ._fs import sweep_stale

        places = [self.setup.dir.path, tempfile.gettempdir() if self.settings.store else None]
        for where in places:
            if where:
                try:
                    sweep_stale(where)
                except OSError:  # best effort: the next session tries again
                    pass

    # ---- workers

    def add_worker(self, worker: str, output: Mapping[str, Any] | None) -> None:
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
        if isinstance(output.get("header_dir"), str):
            self.header_dirs.add(output["header_dir"])
        if isinstance(output.get("headers"), list):
            self.header_uses += output["headers"]
        self.problems.merge(output.get("problems"))
        errors = output.get("remote_errors")
        if isinstance(errors, list):
            self.setup.remote_errors += [error for error in errors if isinstance(error, str)]

    # ---- finish

    def finish(self) -> bool:
        """Save, trim, write reports; return True when the session must fail (hit rate, strict)."""
        if not self.workers:
            blob, files = Recorder.artifacts(self.setup)
            if blob:
                self.blobs["controller"] = blob
            self.files.update(files)
            own = probe.precompiled_header_dir()
            if own is not None:
                self.header_dirs.add(own)
        self.header_uses += probe.precompiled_headers_used()
        if self.header_uses:
            # cost: headers load only where torch looked a header up
            from .headers import header_notes

            for note in header_notes(self.header_uses):
                self.problems.note(note)
        if self.setup.dir.path and self.files:
            cachedir.touch(self.setup.dir.path, sorted(self.files))
        for note in probe.capability_notes(remote=bool(self.settings.redis)):
            self.problems.note(note)
        self.setup.take_remote_errors()
        self.setup.warn_remote_errors()
        self._explain()
        if self.setup.saving:
            self._save()
        self._evict()
        self.setup.release()  # done with the dir: other sessions may trim it now
        self._write_json()
        self._write_step_summary()
        if not self.settings.keep:
            cachedir.remove(self.setup.dir)
        self._check_hit_rate()
        return bool(self.problems.errors)

    def _explain(self) -> None:
        """Say why each miss missed (against :attr:`baseline`) and build the record the next run compares with.

        Only for a cache dir of ours that caches (``shared``, ``isolated``): with caches ``disabled`` every
        lookup misses by design, and without a dir there is nowhere to keep a record. Tests marked
        isolated/disabled kept no graphs (:meth:`Recorder.finish`). The record is written back to a shared dir
        (the next local session's baseline) and goes into the saved bundle (:meth:`_save`). With
        ``--compile-cache-explain=off`` nothing happens: the dir's record stays as it was and the saved bundle
        carries none.
        """
        path = self.setup.dir.path
        if not self.settings.explain or not path or self.setup.dir.mode not in EXPLAINED_MODES:
            return
        if probe.dynamo_loaded():
            note = probe.graph_capture_installed()
            if note:
                self.problems.note(note)
        current = {nodeid: r.graphs for nodeid, r in self.stats.records.items() if r.graphs}
        if not current:
            return  # nothing was looked up: keep the baseline as it is for the next run
        # cost: explain loads only when a test looked up a graph
        from .explain import carry_forward
        from .explain import explain_session
        from .explain import save_record

        why, record = explain_session(current, self.baseline, self.compared_with)
        if self.baseline is not None:  # None: a first run, nothing compared (the report says null, not "{}")
            self.why = why
        for nodeid, misses in why.misses.items():
            self.stats.records[nodeid].why = misses
        self.graphs = carry_forward(record, self.baseline)
        if self.setup.dir.mode == "shared":
            try:
                save_record(Path(path), self.graphs)
            except OSError as exc:
                self.problems.warn(f"could not keep the graph record for the next session: {exc}")

    def _check_hit_rate(self) -> None:
        rate, floor = self.stats.hit_rate, self.settings.min_hit_rate
        if floor is None or rate is None or rate >= floor:
            return
        from . import report  # cost: the renderers load only when there is something to render

        message = f"hit rate {report.percent(rate)} is below --compile-cache-min-hit-rate={floor:g}"
        cold_by_trouble = self.restored is not None and (not self.restored.ok or bool(self.restored.skipped))
        if cold_by_trouble and not self.settings.strict:
            # The restore failed or refused bad bundles (here or in the Action): infrastructure trouble.
            self.problems.note(message + " (the restore failed: not failing the session)")
        else:
            self.problems.error(message)

    def _save(self) -> None:
        # cost: only a saving session loads sync
        from . import sync
        from .fingerprint import default_suffix

        if self.restored is not None:
            restored = self.restored.outcome in ("exact", "partial")
        else:  # restored by someone else (the Action, an earlier CLI step) who did not say how it went
            restored = self.settings.restore == "skip"
        if restored and self.stats.hits and not self.stats.misses and not self._new_headers():
            # Every graph came from the restored cache: a new bundle would only repeat the old one.
            self.saved = sync.SaveResult("skipped", message="every graph hit the restored cache; nothing new to save")
            return
        if self.store_trouble is not None:
            # The store failed or stalled at the restore: one warning said so; a save would wait again.
            self.saved = sync.SaveResult("skipped", message="the store failed at the restore; nothing saved")
            return
        try:
            fingerprint = self.setup.fingerprint()
            store = self._timed_store()
        except Exception as exc:
            self.problems.warn(f"save skipped: {type(exc).__name__}: {exc}")
            return
        self.saved = sync.save(
            store,
            prefix=self.settings.key_prefix,
            fingerprint=fingerprint,
            suffix=self.settings.run_suffix or default_suffix(),
            cache_dir=self.setup.dir.path or "",
            blobs=self.blobs,
            files=sorted(self.files),
            stats=self.stats.totals_json(),
            signing_key=self.settings.signing_key,
            keep=self.settings.keep_bundles,
            max_bytes=self.settings.max_bundle_size,
            graphs=self.graphs.to_json() if self.graphs else None,
            header_since=self._header_since(),
            header_installed=self._restored_headers(),
            header_carried=self.restored.headers.carried if self.restored is not None else (),
            header_uses=self.header_uses,
        )
        if self.saved.warning:
            self.problems.warn(self.saved.warning)
        elif self.saved.message and self.saved.outcome == "saved":
            self.problems.note(f"save: {self.saved.message}")
        for line in self.saved.headers.warnings:
            self.problems.warn(line)

    def _timed_store(self) -> TimedStore:
        """The configured store, its calls bounded in all by ``--compile-cache-store-timeout``."""
        # cost: as above
        from .stores.timed import TimedStore

        settings = self.settings
        return TimedStore(
            open_configured_store(settings), settings.store_timeout, option=settings.spelling("store_timeout")
        )

    def _new_headers(self) -> bool:
        """True when this session used a precompiled header its restored bundle does not name (a bundle saved
        on a machine that already had the header names none): then a save is worth it even when every graph
        hit. After the Action's restore, its report names what it installed or found: a header it could not
        restore (its entry evicted) and torch built again is new, so this save carries it (issue 10)."""
        if self.header_since is None or self.restored is None:
            return False
        # cost: headers load only in a saving session
        from .headers import find_used
        from .headers import header_dir

        used = {path.name for path in find_used(header_dir(), self.header_uses, self._restored_headers())}
        return bool(used - set(self._restored_headers()))

    def _restored_headers(self) -> tuple[str, ...]:
        return self.restored.headers.named if self.restored is not None else ()

    def _header_since(self) -> float | None:
        """The ``since`` for carrying headers, or None (carry none) when torch keeps them elsewhere.

        ``headers.header_dir()`` mirrors torch's path without importing torch; a process whose torch reports
        another dir (a torch that moved it, a test that changed TMPDIR before importing torch) would make
        us carry the wrong files, so then nothing is carried and a note says why.
        """
        if self.header_since is None:
            return None
        # cost: as above
        from .headers import header_dir

        expected = str(header_dir())
        others = sorted(d for d in self.header_dirs if d != expected)
        if others:
            self.problems.note(f"precompiled headers not carried: torch keeps them in {others[0]}, not {expected}")
            return None
        return self.header_since

    def _evict(self) -> None:
        path = self.setup.dir.path
        if self.setup.dir.mode != "shared" or not path or not self.settings.max_size:
            return
        try:
            trimmed = cachedir.trim(path, self.settings.max_size, registration=self.setup.registration)
        except Exception as exc:
            self.problems.warn(f"could not trim the cache dir: {exc}")
            return
        line = trimmed.describe()
        if line:
            self.problems.note(line)

    def to_json(self) -> dict[str, Any]:
        from . import report  # cost: as above

        data = report.to_json(
            self.stats,
            mode=self.setup.dir.mode,
            cache_dir=self.setup.dir.path,
            restore=self.restored.to_json() if self.restored else None,
            save=self.saved.to_json() if self.saved else None,
            notes=self.problems.notes,
            why=self.why,
        )
        data["warnings"] = list(self.problems.warnings)
        return data

    def _write_json(self) -> None:
        if not self.settings.json:
            return
        path = Path(self.settings.json)
        from ._fs import atomic_file  # cost: a session that writes no JSON report never loads _fs

        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with atomic_file(path, fsync=False) as fh:
                fh.write((json.dumps(self.to_json(), indent=2) + "\n").encode())
        except OSError as exc:
            self.problems.warn(f"could not write --compile-cache-json={path}: {exc.strerror}")

    def _write_step_summary(self) -> None:
        target = os.environ.get("GITHUB_STEP_SUMMARY")
        if self.settings.summary == "off" or not target or not self._worth_reporting():
            return
        from . import report  # cost: as above

        text = report.markdown(
            self.stats,
            where=self.setup.dir.describe(),
            restore=self.restored.to_json() if self.restored else None,
            save=self.saved.to_json() if self.saved else None,
            why=self.why,
        )
        try:
            append_summary(target, text)
        except OSError as exc:
            self.problems.warn(f"could not append to GITHUB_STEP_SUMMARY: {exc.strerror}")

    def _worth_reporting(self) -> bool:
        return self.stats.anything_compiled or bool(self.restored or self.saved or self.problems.warnings)

    # ---- terminal

    def terminal_lines(self, verbose: bool = False) -> list[tuple[str, dict[str, bool]]]:
        """The "compile cache" section: pure rendering of what the session did (printed by the plugin)."""
        lines: list[tuple[str, dict[str, bool]]] = []
        settings, problems = self.settings, self.problems
        if settings.report == "none" and not (problems.warnings or problems.errors):
            return lines
        if settings.report != "none" and self._worth_reporting():
            from . import report  # cost: as above

            lines.append((report.summary_line(self.stats, self.setup.dir.describe()), {}))
            for kind, info in (("restore", self.restored), ("save", self.saved)):
                if info:
                    lines.append((report.transfer_line(kind, info.to_json()), {}))
            if self.stats.silent_workers:
                silent = ", ".join(self.stats.silent_workers)
                lines.append((f"workers that sent no statistics: {silent}", {"yellow": True}))
            if verbose or settings.report == "full":
                lines.extend((line, {}) for line in report.table_lines(self.stats))
                if self.why is not None:
                    lines.extend((line, {}) for line in report.why_lines(self.why))
            lines.extend((f"note: {note}", {}) for note in problems.notes)
        lines.extend((f"CompileCacheWarning: {message}", {"yellow": True}) for message in problems.warnings)
        lines.extend((f"compile cache FAILED: {message}", {"red": True, "bold": True}) for message in problems.errors)
        return lines


def open_configured_store(settings: Settings) -> Store:
    """The store named by ``--compile-cache-store``; raises ConfigError for a malformed URL (no I/O)."""
    # cost: stores load only in a session with a store
    from .stores import open_store

    return open_store(settings)


def action_restore_result(value: str | None) -> RestoreResult | None:
    """What the Action's restore step reported (JSON in :data:`ACTION_RESTORE_ENV`); None when unknown."""
    # cost: as above
    from . import sync

    if not value:
        return None
    try:
        data = json.loads(value)
        outcome = data["outcome"] if isinstance(data, dict) else data
    except (ValueError, KeyError, TypeError, RecursionError):  # anyone's text: never a crash
        outcome, data = value.strip(), {}
    if outcome not in ("exact", "partial", "miss", "error"):
        return None
    # Text from the environment: one line each, so no newline in it can start a runner command when printed.
    message = one_line(str(data.get("message") or "")) if isinstance(data, dict) else ""
    key = one_line(data["key"], 300) if isinstance(data, dict) and isinstance(data.get("key"), str) else None
    # "headers": the precompiled-header names the Action's restore installed or found (optional), so this
    # session's save names them again even where the file system records no reads (noatime).
    names = data.get("headers") if isinstance(data, dict) else None
    named: tuple[str, ...] = ()
    if isinstance(names, list) and all(isinstance(name, str) for name in names):
        # cost: as above
        from .headers import is_header_name

        named = tuple(name for name in names if is_header_name(name))
    # "header_key": the object key of the header that the Action's own actions/cache entry carries (verified
    # there, saved under that exact key): this session's save names that header but does not upload it.
    carried = data.get("header_key") if isinstance(data, dict) else None
    keys = (carried,) if isinstance(carried, str) and carried else ()
    headers = sync.HeaderReport(named=named, carried=keys)
    # "staged": [[name, size, sha256], ...], the mega-cache blobs the Action installed for this process to load
    # (its restore imports no torch); only after a restore, and only entries of that exact shape.
    staged: tuple[sync.StagedBlob, ...] = ()
    entries = data.get("staged") if isinstance(data, dict) and outcome in ("exact", "partial") else None
    if isinstance(entries, list):  # a malformed entry is dropped; load_staged reports blobs it cannot find
        staged = tuple(sync.StagedBlob(*entry) for entry in entries if _staged_entry(entry))
    return sync.RestoreResult(outcome, key=key, message=message, headers=headers, staged=staged)


def _staged_entry(entry: object) -> bool:
    """``[name, size, sha256]`` with a blob name a bundle may carry, a size and a hex SHA-256."""
    from .manifest import BLOB_NAME  # cost: as above

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
