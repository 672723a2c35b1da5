"""What the plugin does in one pytest process: one of two roles over a context decided once.

* :class:`~.context.SessionContext` (decided in the first hook, before anything imports torch; see
  :mod:`.context`) is shared by both roles.
* :class:`Controller` - a plain session or an xdist controller: runs the restore phase before the first
  compile, folds what workers send, then at the end runs the save phase, writes the JSON and the step
  summary and decides whether the session fails (hit-rate guard, strict). The phases pass values
  (:class:`.payload.Restored`, :class:`.payload.Gathered`, :class:`.save_phase.Saved`), never each other.
* :class:`Worker` - an xdist worker: records its tests and sends records, its mega-cache blob and the
  files it used to the controller; it never saves or writes a report, and restores only when it takes
  its controller's ticket.

Both roles record through a :class:`Recorder` (statistics + probe) and report trouble through one
:class:`~pytest_compilecache.problems.Problems`. Nothing here imports pytest (the hooks in
:mod:`plugin` pass plain values) or torch (only :mod:`probe` does, lazily).
Loads lazily (inside the functions that need them, so a session pays only for what it uses): ``.probe``,
``.payload``, ``.pch``, ``.report``, ``.ghrunner``, ``json``, ``._fs``.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

from . import cachedir
from . import recorder as recording
from ._env import torch_job_id
from .cachedir.ticket import RestoreTicket
from .context import EXPLAINED_MODES
from .context import SessionContext
from .restore_phase import RestorePhase
from .save_phase import Saved
from .save_phase import SavePhase
from .settings import Settings

if TYPE_CHECKING:
    from .payload import ProcessOutput
    from .payload import Restored
    from .recorder import Recorder
    from .report import SessionOutcome
    from .selection import ControllerWatch
    from .selection import SelectionWatch
    from .selection import Where
    from .stats import SessionStats
    from .sync import RestoreResult


class Worker:
    """An xdist worker: records tests; at the end hands everything to the controller."""

    def __init__(self, context: SessionContext, recorder: Recorder) -> None:
        self.context = context
        self.recorder = recorder
        self.ticket: RestoreTicket | None = None  # the controller's restore, until served
        self.restore: RestorePhase | None = None  # this worker's restore for the controller, if it took the ticket
        self.selection: SelectionWatch | None = None  # what it deselected, when the session saves (plugin)

    def watch_selection(self, where: Where) -> SelectionWatch:
        """The plugin that records what this worker deselects (registered by the plugin when the session saves)."""
        from .selection import SelectionWatch

        self.selection = SelectionWatch()
        return self.selection

    def session_start(self) -> None:
        """Follow the controller's dir; take its restore ticket if no other worker has (then restore now)."""
        self.context.ensure_dir()
        if self.context.settings.explain and self.context.dir.mode in EXPLAINED_MODES:
            self.recorder.baseline_dir = self.context.dir.path  # the controller has installed its baseline there
        self.ticket = RestoreTicket.from_env(self.context.dir.path)
        self._serve_ticket(wait=False)

    def before_tests(self) -> None:
        """After collection, before the first test: wait for the worker that restores, if another one does."""
        self._serve_ticket(wait=True)

    def _serve_ticket(self, *, wait: bool) -> None:
        ticket = self.ticket
        if ticket is None:
            return
        try:
            lock = ticket.take(wait=False)
            if lock is None and wait:
                # Another worker is restoring: import what this worker's first compile needs meanwhile (the
                # tests imported torch), instead of waiting idle and paying the import after.
                from . import probe

                probe.import_compiler()
                lock = ticket.take(wait=True)
        except OSError:
            # The ticket's lock cannot be made (a full disk, a read-only dir): restore as a serial session
            # would, without taking turns; the controller reads the result from this worker's payload.
            self._restore(ticket)
            return
        if lock is None:
            return  # another worker restores: wait for it before the first test
        try:
            if ticket.result() is None:
                self._restore(ticket)
        finally:
            lock.release()
        self.ticket = None

    def _restore(self, ticket: RestoreTicket) -> None:
        self.ticket = None
        self.restore = RestorePhase(self.context, self.recorder)
        self.restore.restore_for(ticket)

    def output(self) -> dict[str, Any]:
        """The payload for the controller (:class:`ProcessOutput` as JSON, sent through ``workeroutput``)."""
        if self.restore is not None:
            self.restore.finish_headers()  # the worker that restored: its headers' report, in the ticket too
        self.context.take_remote_errors()
        from .payload import ProcessOutput

        output = ProcessOutput.collect(self.context, self.recorder)
        if self.restore is not None:
            output.restore = self.restore.report()
        worker = self.recorder.worker
        if self.selection is not None and (worker == "gw0" or not worker.startswith("gw")):
            # Every worker collects the same tests (xdist stops a session whose workers differ), so one list is
            # enough, and a session whose gw0 sent nothing saves nothing (Gathered.silent). Workers named
            # otherwise (--tx ...//id=) each send theirs.
            output.deselected = sorted(self.selection.deselected)
            output.ignored = sorted(self.selection.ignored)
            output.rules = list(self.selection.rules)
        return output.to_json()


class Controller:
    """A plain session or an xdist controller: the start phase, the workers' merge, the end phase, the report."""

    def __init__(self, context: SessionContext, recorder: Recorder, *, xdist: bool = False) -> None:
        """``xdist``: workers will run the tests (one of them restores, :class:`RestoreTicket`)."""
        self.context = context
        self.recorder = recorder
        self.problems = context.problems
        self.start = RestorePhase(context, recorder, delegate=xdist)
        self.workers: list[str] = []
        self._outputs: list[tuple[str, ProcessOutput | None]] = []  # each process's, folded at the end
        self._restored: Restored | None = None  # what the start found (RestorePhase.finish), at the end
        self._saved = Saved()  # what the end did (SavePhase.run)
        self._selection: tuple[Where, SelectionWatch | ControllerWatch] | None = None  # when it saves

    def watch_selection(self, where: Where) -> SelectionWatch | ControllerWatch:
        """The plugin that records which tests the session selects (registered by the plugin when the session
        saves): a save then never replaces a restored bundle with part of the suite (:mod:`.selection`)."""
        from .selection import ControllerWatch
        from .selection import SelectionWatch

        watch = ControllerWatch() if self.start.delegate else SelectionWatch()
        self._selection = (where, watch)
        return watch

    @property
    def settings(self) -> Settings:
        return self.context.settings

    @property
    def stats(self) -> SessionStats:
        return self.recorder.stats

    def session_start(self) -> None:
        """Before the first compile and before xdist starts workers (:class:`RestorePhase`)."""
        self.start.run()

    def add_worker(self, worker: str, sent: Any) -> None:
        """Merge what a worker sent; a worker that sent nothing (it crashed) is listed, not fatal."""
        self.workers.append(worker)
        from .payload import ProcessOutput

        output = ProcessOutput.from_json(sent)
        self._outputs.append((worker, output))
        if output is None:
            self.stats.silent_workers.append(worker)
            return
        self.stats.tests += output.tests
        for record in output.records:
            self.stats.add_record(record)
        self.problems.merge(output.problems)
        self.context.remote_errors += output.remote_errors

    def _touch_shape_profile(self) -> None:
        """With a job id (``--compile-cache-pgo``, or the user's own), every process that compiled read torch's
        profile for it, which torch rewrites only when it changes: mark it used, so a size cap keeps it."""
        job_id, path = torch_job_id(), self.context.dir.path
        # compiled: through dynamo, which reads the profile
        if job_id and path and self.context.dir.mode == "shared" and self.recorder.anything_compiled:
            cachedir.touch(path, cachedir.shape_profiles(path, job_id))

    def finish(self, failed: bool = False, stopped: bool = False) -> bool:
        """Save, trim, write reports; return True when the session must fail (hit rate, strict).

        ``failed``: the tests failed (the Action's save policy may then skip the save); ``stopped``: the session
        stopped before running every test it selected (``-x``, ``--maxfail``, an interrupt). KeyboardInterrupt
        (Ctrl-C during the save) passes through, with the dir's registration withdrawn; no report is written.
        """
        # A plain session's restore installed its headers in the background; an xdist controller's worker
        # restored for it (the ticket): wait for the one, read the other.
        reported = [output.restore for _, output in self._outputs if output is not None and output.restore]
        self._restored = self.start.finish(reported)
        from .payload import Gathered
        from .payload import ProcessOutput

        if stopped and self.start.delegate and not self.workers:  # Ctrl-C reached the workers too, before they sent
            self.problems.note("the session was interrupted before any xdist worker reported: the statistics leave "
                               "out every test the workers ran")  # fmt: skip
        if recording.torch_loaded():  # a plain session whose tests imported torch; a controller whose conftests did
            self._outputs.append(("controller", ProcessOutput.collect(self.context, self.recorder)))
        gathered = Gathered.fold(self._outputs)
        if gathered.header_uses:
            from .pch import header_notes

            for note in header_notes(gathered.header_uses):
                self.problems.note(note)
        if self.context.dir.path and gathered.files:
            cachedir.touch(self.context.dir.path, sorted(gathered.files))
        self._touch_shape_profile()
        if recording.torch_loaded():  # probe.capability_notes says nothing for a session that never imported torch
            from . import probe

            for note in probe.capability_notes(remote=bool(self.settings.redis)):
                self.problems.note(note)
        self.context.take_remote_errors()
        self.context.warn_remote_errors()
        selection = None
        if self._selection is not None:
            where, watch = self._selection
            selection = where.selection(watch, gathered.deselected, gathered.ignored, gathered.rules)
        try:
            self._saved = SavePhase(self.context, self.recorder).run(
                self._restored, gathered, tests_failed=failed, stopped=stopped, selection=selection
            )
        finally:  # Ctrl-C mid-save too: every write of the save is atomic, nothing partial is left
            removed = self.context.dir.owned and not self.settings.keep
            if not removed:  # an isolated dir keeps it till it is gone: killed between, the sweep proves it dead
                self.context.release()  # done with the dir: other sessions may trim it now
        self._check_hit_rate(self._restored.result)  # before the reports, which name a failed floor
        self._let_the_post_step_upload()
        self._write_reports()
        if not self.settings.keep:
            cachedir.remove(self.context.dir)
        self.context.release()
        return bool(self.problems.errors)

    def _let_the_post_step_upload(self) -> None:
        """A bundle staged for the Action's post step (``store: github``) is uploaded only when the job succeeds
        (action.yml's ``post-if``) or the job says so. A session whose tests passed but that fails on its own
        account (its hit-rate floor, a strict store) says so in ``GITHUB_ENV``: a direct store has saved by
        then, and without the upload every later run would restore the same bundle, miss the same graphs and
        fail again."""
        if self._saved.result is None or self._saved.result.outcome != "staged" or not self.problems.errors:
            return
        from . import ghrunner
        from ._env import POST_STEP_ENV

        try:
            ghrunner.append_vars(os.environ.get("GITHUB_ENV"), {POST_STEP_ENV: "true"})
        except OSError as exc:
            self.problems.warn(f"the staged bundle will not be uploaded: cannot write GITHUB_ENV: {exc}")

    def _check_hit_rate(self, restored: RestoreResult | None) -> None:
        """``restored``: the restore's result (None: none was attempted)."""
        floor = self.settings.min_hit_rate
        if floor is None or not self.recorder.has_stats:
            return  # no floor, or nothing looked up (no rate)
        rate = self.stats.unmarked_hit_rate  # a test marked compile_cache misses by design
        if rate is None or rate >= floor:
            return
        from .report import percent

        marked = " (tests marked compile_cache left out)" if any(r.by_design for r in self.stats.compiled) else ""
        message = f"hit rate {percent(rate)}{marked} is below --compile-cache-min-hit-rate={floor:g}"
        if restored is not None and (not restored.ok or bool(restored.skipped)) and not self.settings.strict:
            # The restore failed or refused bad bundles (here or in the Action): infrastructure trouble.
            self.problems.note(message + " (the restore failed: not failing the session)")
        else:
            self.problems.error(message)

    # ---- reports

    def outcome(self) -> SessionOutcome:
        """What the session did, typed, for the renderers in :mod:`report`."""
        from .report import SessionOutcome

        return SessionOutcome(
            stats=self.stats,
            mode=self.context.dir.mode,
            cache_dir=self.context.dir.path,
            where=self.context.dir.describe(),
            restored=self._restored.result if self._restored is not None else None,
            saved=self._saved.result,
            notes=tuple(self.problems.notes),
            warnings=tuple(self.problems.warnings),
            errors=tuple(self.problems.errors),
            why=self._saved.why,
            json_path=self.settings.json,
        )

    def _worth_reporting(self) -> bool:
        """As :attr:`report.SessionOutcome.worth_reporting`, without loading the statistics or the renderers."""
        if (self._restored is not None and self._restored.result) or self._saved.result:
            return True
        if self.problems.warnings or self.problems.errors:
            return True
        return self.recorder.anything_compiled

    def keep_report(self, cache: Any) -> None:
        """This session's full report in pytest's ``cache`` (``config.cache``; None without pytest's cache
        provider): ``python -m pytest_compilecache report`` prints it later without a rerun, which would hit what
        this run compiled."""
        if cache is not None:
            from .report import LAST_REPORT_KEY

            cache.set(LAST_REPORT_KEY, self.to_json())

    def to_json(self) -> dict[str, Any]:
        from .report import session_json

        return session_json(self.outcome())

    def _write_reports(self) -> None:
        """The JSON report (``--compile-cache-json``) and the step summary (``$GITHUB_STEP_SUMMARY``)."""
        target = os.environ.get("GITHUB_STEP_SUMMARY")
        summary = self.settings.summary != "off" and bool(target)
        if not self.settings.json and not summary:
            return
        from . import report

        outcome = self.outcome()
        if self.settings.json:
            self._write_json(Path(self.settings.json), report.session_json(outcome))
        if summary and target and outcome.worth_reporting:
            from .ghrunner import append_summary

            try:
                append_summary(target, report.session_markdown(outcome))
            except OSError as exc:
                self.problems.warn(f"could not append to GITHUB_STEP_SUMMARY: {exc.strerror}")

    def _write_json(self, path: Path, data: dict[str, Any]) -> None:
        import json

        from ._fs import atomic_file

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
        from .report import session_lines

        return session_lines(self.outcome(), report=self.settings.report, verbose=verbose)
