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
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import atexit
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

from . import cachedir
from . import recorder as recording
from ._env import PGO_ENVS
from ._env import PGO_JOB_ID
from ._env import EnvLease
from ._env import cache_dir_env
from ._env import torch_job_id
from .cachedir import SessionDir
from .errors import ConfigError
from .options import SESSION_ENV
from .problems import Problems
from .restore_phase import EXPLAINED_MODES
from .restore_phase import TICKET_ENV
from .restore_phase import RestorePhase
from .restore_phase import RestoreTicket
from .save_phase import SavePhase
from .settings import Settings

if TYPE_CHECKING:
    from .fingerprint import Fingerprint
    from .payload import ProcessOutput
    from .recorder import Recorder
    from .report import SessionOutcome
    from .stats import SessionStats
    from .stores import Store
    from .stores.timed import TimedStore
    from .sync import RestoreResult
    from .sync import SaveResult

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
    TICKET_ENV,
)


class Setup:
    """The decisions made once per process before torch is imported; see the module docstring.

    A plain class, not a dataclass: making a dataclass costs every session with a cache dir more at import
    than the rest of this class (``bench/overhead.py``).
    """

    def __init__(
        self,
        settings: Settings,
        dir: SessionDir,
        lease: EnvLease,
        problems: Problems,
        follows_controller: bool = False,
    ) -> None:
        self.settings = settings
        self.dir = dir
        self.lease = lease
        self.problems = problems
        self.follows_controller = follows_controller
        self._fingerprint: Fingerprint | None = None
        self.registration: cachedir.Registration | None = None
        # Redis errors met by torch's remote caches (this process's; a controller's also its workers')
        self.remote_errors: list[str] = []
        # probe.point_cache_dir ran (it may have changed torch's config, which close puts back)
        self._torch_config = False

    def __repr__(self) -> str:
        return f"Setup(dir={self.dir!r}, follows_controller={self.follows_controller})"

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
            swept = cachedir.sweep_dead_writers(self.dir.path)
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
        if self.settings.pgo and mode != "disabled":
            self._keep_shape_profile()
        if mode is None and not self.settings.redis:
            return
        self.lease.set({SESSION_ENV: self.dir.to_env()})
        if mode in ("shared", "isolated") and "torch._inductor" not in sys.modules and self.dir.path:
            # Before torch's compiler is imported the variables are all it will read: probe.point_cache_dir's
            # first step, without loading probe in a session that may never import torch.
            self.lease.set(cache_dir_env(self.dir.path))
        elif mode in ("shared", "isolated", "disabled"):
            from . import probe  # cost: torch's compiler is imported already, or caching is disabled

            self._torch_config = True
            note = probe.point_cache_dir(self.dir.path if mode != "disabled" else None, disable=mode == "disabled")
            if note:
                self.problems.note(note)
        if self.settings.redis:
            self._enable_redis(self.settings.redis)

    def _keep_shape_profile(self) -> None:
        """``--compile-cache-pgo=on``: give torch a job id, so that it keeps the profile of which input sizes
        varied (its automatic-dynamic PGO) in the cache dir, and records it in every process's mega-cache blob.

        Without it, a function is compiled for its first input's sizes and again, with a symbolic size, when a
        second size comes; which graphs a process compiles then depends on the tests that ran before in it, so
        an xdist worker needs graphs that a serial run's (or another order's) bundle lacks. With the profile,
        every process compiles the varying sizes symbolically from the first call: the same graphs in any order.
        A job id the user set already is left alone (torch keeps the profile under it); one given only as the
        newer alias is copied to ``TORCH_COMPILE_JOB_ID``, which every torch reads. torch reads the id at
        import: one imported before the session is configured keeps none, and a note says so.
        """
        job, alias = (os.environ.get(name) for name in PGO_ENVS)
        if job:
            return
        if "torch.compiler.config" in sys.modules:
            self.problems.note(
                f"{self.settings.spelling('pgo')}: torch was imported before the session was configured, so "
                f"it keeps no shape profile in this process (set {PGO_ENVS[0]} before importing it)"
            )
        self.lease.set({PGO_ENVS[0]: alias or PGO_JOB_ID})

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
        probe = sys.modules.get(f"{__package__}.probe")
        if probe is not None:  # its guard records them: not loaded, nothing recorded (and nothing to load)
            self.remote_errors += probe.remote_cache_errors()

    def warn_remote_errors(self) -> None:
        """One warning when torch's Redis remote caches failed in any process of the session: the compiles
        went on with the local caches."""
        errors = self.remote_errors
        if errors:
            more = f"; {len(errors)} errors in all" if len(errors) > 1 else ""
            from .ghrunner import one_line  # cost: only when Redis failed

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

    def fingerprint_if_known(self) -> Fingerprint | None:
        return self._fingerprint

    def adopt_fingerprint(self, facts: dict[str, str]) -> None:
        """The fingerprint a worker of this session computed (same machine, same options): the controller
        then saves without importing torch itself."""
        if self._fingerprint is None:
            from .fingerprint import Fingerprint  # cost: as below

            self._fingerprint = Fingerprint.from_json(facts)

    def fingerprint(self) -> Fingerprint:
        if self._fingerprint is None:
            # cost: only a session with a store fingerprints
            from .fingerprint import collect

            self._fingerprint = collect(salt=self.settings.key_salt)
        return self._fingerprint

    def timed_store(self) -> TimedStore:
        """The configured store, its calls bounded in all by ``--compile-cache-store-timeout``."""
        # cost: as above
        from .stores.timed import TimedStore

        settings = self.settings
        return TimedStore(
            open_configured_store(settings), settings.store_timeout, option=settings.spelling("store_timeout")
        )

    def close(self) -> None:
        """Put the environment and torch's config back as they were, withdraw the registration (idempotent;
        matters when pytest runs in-process, e.g. pytester, an IDE). Called at unconfigure, and through
        pytest's cleanup stack when the session stops before configure (a usage error, a broken conftest)."""
        self.release()
        self.lease.restore()
        if self._torch_config:  # only _export changes torch's config (through probe.point_cache_dir)
            from . import probe  # cost: loaded by _export already

            probe.put_back_config()


class Worker:
    """An xdist worker: records tests; at the end hands everything to the controller."""

    def __init__(self, setup: Setup, recorder: Recorder) -> None:
        self.setup = setup
        self.recorder = recorder
        self.ticket: RestoreTicket | None = None  # the controller's restore, until served
        self.restore: RestorePhase | None = None  # this worker's restore for the controller, if it took the ticket

    def session_start(self) -> None:
        """Follow the controller's dir; take its restore ticket if no other worker has (then restore now)."""
        self.setup.ensure_dir()
        if self.setup.settings.explain and self.setup.dir.mode in EXPLAINED_MODES:
            self.recorder.baseline_dir = self.setup.dir.path  # the controller has installed its baseline there
        self.ticket = RestoreTicket.from_env(self.setup.dir.path)
        self._serve_ticket(wait=False)

    def before_tests(self) -> None:
        """After collection, before the first test: wait for the worker that restores, if another one does."""
        self._serve_ticket(wait=True)

    def _serve_ticket(self, *, wait: bool) -> None:
        ticket = self.ticket
        if ticket is None:
            return
        lock = ticket.take(wait=False)
        if lock is None and wait:
            # Another worker is restoring: import what this worker's first compile needs meanwhile (the
            # tests imported torch), instead of waiting idle and paying the import after (issue 25).
            from . import probe  # cost: only a worker that waits for another's restore

            probe.import_compiler()
            lock = ticket.take(wait=True)
        if lock is None:
            return  # another worker restores: wait for it before the first test
        try:
            if ticket.result() is None:
                self.restore = RestorePhase(self.setup, self.recorder)
                self.restore.restore_for(ticket)
        finally:
            lock.release()
        self.ticket = None

    def output(self) -> dict[str, Any]:
        """The payload for the controller (:class:`ProcessOutput` as JSON, sent through ``workeroutput``)."""
        if self.restore is not None:
            self.restore.finish_headers()  # the worker that restored: its headers' report, in the ticket too
        self.setup.take_remote_errors()
        from .payload import ProcessOutput  # cost: at the end, in each worker

        return ProcessOutput.collect(self.setup, self.recorder).to_json()


class Controller:
    """A plain session or an xdist controller: the start phase, the workers' merge, the end phase, the report."""

    def __init__(self, setup: Setup, recorder: Recorder, *, xdist: bool = False) -> None:
        """``xdist``: workers will run the tests (one of them restores, :class:`RestoreTicket`)."""
        self.setup = setup
        self.recorder = recorder
        self.problems = setup.problems
        self.start = RestorePhase(setup, recorder, delegate=xdist)
        self.end = SavePhase(setup, recorder, self.start)
        self.workers: list[str] = []

    @property
    def settings(self) -> Settings:
        return self.setup.settings

    @property
    def stats(self) -> SessionStats:
        return self.recorder.stats

    def session_start(self) -> None:
        """Before the first compile and before xdist starts workers (:class:`RestorePhase`)."""
        self.start.run()

    def add_worker(self, worker: str, sent: Any) -> None:
        """Merge what a worker sent; a worker that sent nothing (it crashed) is listed, not fatal."""
        self.workers.append(worker)
        from .payload import ProcessOutput  # cost: at the end, in the controller of workers

        output = ProcessOutput.from_json(sent)
        if output is None:
            self.stats.silent_workers.append(worker)
            return
        self._merge(worker, output)

    def _merge(self, name: str, output: ProcessOutput) -> None:
        self.stats.tests += output.tests
        for record in output.records:
            self.stats.add_record(record)
        self.problems.merge(output.problems)
        self.setup.remote_errors += output.remote_errors
        self._take_artifacts(name, output)

    def _take_artifacts(self, name: str, output: ProcessOutput) -> None:
        if output.blob:
            self.end.blobs[name] = output.blob
        self.end.files.update(output.files)
        if output.header_dir is not None:
            self.end.header_dirs.add(output.header_dir)
        self.end.header_uses += output.headers

    def _touch_shape_profile(self) -> None:
        """With a job id (``--compile-cache-pgo``, or the user's own), every process that compiled read torch's
        profile for it, which torch rewrites only when it changes: mark it used, so a size cap keeps it."""
        job_id, path = torch_job_id(), self.setup.dir.path
        # compiled: through dynamo, which reads the profile
        if job_id and path and self.setup.dir.mode == "shared" and self.recorder.anything_compiled:
            cachedir.touch(path, cachedir.shape_profiles(path, job_id))

    def finish(self, failed: bool = False) -> bool:
        """Save, trim, write reports; return True when the session must fail (hit rate, strict).

        ``failed``: the tests failed (the Action's save policy may then skip the save).
        """
        self.end.tests_failed = failed
        self.start.finish_headers()  # a plain session's restore installed its headers in the background
        if not self.workers and recording.torch_loaded():  # a plain session whose tests imported torch
            from .payload import ProcessOutput  # cost: only a session that may have compiled

            self._take_artifacts("controller", ProcessOutput.collect(self.setup, self.recorder))
        self.start.collect_ticket()
        if self.end.header_uses:
            from .headers import header_notes  # cost: headers load only where torch looked a header up

            for note in header_notes(self.end.header_uses):
                self.problems.note(note)
        if self.setup.dir.path and self.end.files:
            cachedir.touch(self.setup.dir.path, sorted(self.end.files))
        self._touch_shape_profile()
        if recording.torch_loaded():  # probe.capability_notes says nothing for a session that never imported torch
            from . import probe  # cost: loaded once torch is

            for note in probe.capability_notes(remote=bool(self.settings.redis)):
                self.problems.note(note)
        self.setup.take_remote_errors()
        self.setup.warn_remote_errors()
        self.end.run()
        self.setup.release()  # done with the dir: other sessions may trim it now
        self._write_reports()
        if not self.settings.keep:
            cachedir.remove(self.setup.dir)
        self._check_hit_rate()
        return bool(self.problems.errors)

    def _check_hit_rate(self) -> None:
        floor = self.settings.min_hit_rate
        if floor is None or not self.recorder.has_stats:
            return  # no floor, or nothing looked up (no rate)
        rate = self.stats.hit_rate
        if rate is None or rate >= floor:
            return
        from .report import percent  # cost: the renderers load only when there is something to render

        message = f"hit rate {percent(rate)} is below --compile-cache-min-hit-rate={floor:g}"
        restored = self.start.restored
        if restored is not None and (not restored.ok or bool(restored.skipped)) and not self.settings.strict:
            # The restore failed or refused bad bundles (here or in the Action): infrastructure trouble.
            self.problems.note(message + " (the restore failed: not failing the session)")
        else:
            self.problems.error(message)

    # ---- reports

    def outcome(self) -> SessionOutcome:
        """What the session did, typed, for the renderers in :mod:`report`."""
        from .report import SessionOutcome  # cost: as above

        return SessionOutcome(
            stats=self.stats,
            mode=self.setup.dir.mode,
            cache_dir=self.setup.dir.path,
            where=self.setup.dir.describe(),
            restored=self.start.restored,
            saved=self.end.saved,
            notes=tuple(self.problems.notes),
            warnings=tuple(self.problems.warnings),
            errors=tuple(self.problems.errors),
            why=self.end.why,
            json_path=self.settings.json,
        )

    def _worth_reporting(self) -> bool:
        """As :attr:`report.SessionOutcome.worth_reporting`, without loading the statistics or the renderers."""
        if self.start.restored or self.end.saved or self.problems.warnings:
            return True
        return self.recorder.anything_compiled

    def to_json(self) -> dict[str, Any]:
        from .report import session_json  # cost: as above

        return session_json(self.outcome())

    def _write_reports(self) -> None:
        """The JSON report (``--compile-cache-json``) and the step summary (``$GITHUB_STEP_SUMMARY``)."""
        target = os.environ.get("GITHUB_STEP_SUMMARY")
        summary = self.settings.summary != "off" and bool(target)
        if not self.settings.json and not summary:
            return
        from . import report  # cost: as above

        outcome = self.outcome()
        if self.settings.json:
            self._write_json(Path(self.settings.json), report.session_json(outcome))
        if summary and target and outcome.worth_reporting:
            from .ghrunner import append_summary  # cost: only a session in a CI job writes a summary

            try:
                append_summary(target, report.session_markdown(outcome))
            except OSError as exc:
                self.problems.warn(f"could not append to GITHUB_STEP_SUMMARY: {exc.strerror}")

    def _write_json(self, path: Path, data: dict[str, Any]) -> None:
        import json  # cost: only a session that writes a JSON report

        from ._fs import atomic_file  # cost: as above

        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with atomic_file(path, fsync=False) as fh:
                fh.write((json.dumps(data, indent=2) + "\n").encode())
        except OSError as exc:
            self.problems.warn(f"could not write --compile-cache-json={path}: {exc.strerror}")

    def terminal_lines(self, verbose: bool = False) -> list[tuple[str, dict[str, bool]]]:
        """The "compile cache" section: pure rendering of what the session did (printed by the plugin)."""
        trouble = bool(self.problems.warnings or self.problems.errors)
        if not trouble and (self.settings.report == "none" or not self._worth_reporting()):
            return []  # nothing to say: the renderers are not even loaded
        from .report import session_lines  # cost: as above

        return session_lines(self.outcome(), report=self.settings.report, verbose=verbose)

    # ---- compatibility for callers that read the phases' results directly

    @property
    def restored(self) -> RestoreResult | None:
        return self.start.restored

    @property
    def saved(self) -> SaveResult | None:
        return self.end.saved


def open_configured_store(settings: Settings) -> Store:
    """The store named by ``--compile-cache-store``; raises ConfigError for a malformed URL (no I/O)."""
    # cost: stores load only in a session with a store
    from .stores import open_store

    return open_store(settings)
