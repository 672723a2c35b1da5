"""The session's start, before the first compile and before xdist starts workers: :class:`RestorePhase`.

It sweeps what killed sessions left, restores the newest matching bundle (or takes the Action's word for
its own restore and loads the blobs it staged), and reads the graph record this session's misses will be
explained against. Infrastructure trouble becomes warnings in the session's :class:`Problems`; nothing here
fails the session.

Under xdist the controller does not restore itself (that would cost it a torch import, and every worker
would wait for it): it writes no bundle, only a :class:`RestoreTicket` name into the environment, and the
first worker to take the ticket restores while the others start up, collect, and wait for it only before
their first test. The controller reads what that worker did at the end.
Loads lazily (inside the functions that need them, so a session pays only for what it uses): ``.payload``, ``.pch``,
``json``, ``dataclasses``, ``.sync``, ``.ghrunner``, ``.probe``, ``.cachedir``, ``.explain``, ``._fs``.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any
from typing import Iterable
from typing import Mapping

from ._env import TICKET_ENV
from .cachedir.ticket import RestoreTicket
from .context import EXPLAINED_MODES

if TYPE_CHECKING:
    from .context import SessionContext
    from .explain import GraphsRecord
    from .manifest import Artifact
    from .payload import Restored
    from .problems import Problems
    from .recorder import Recorder
    from .stores.timed import TimedStore
    from .sync import HeaderInstall
    from .sync import RestoreResult


class RestorePhase:
    """The start of the session: :meth:`run` before the first compile, :meth:`finish` at the end returns what
    it found (:class:`.payload.Restored`, a frozen value the save phase and the report read).

    Between the two the restore may still be going on elsewhere: the bundle's precompiled headers install in
    a background thread, and under xdist a worker restores for the controller (:class:`RestoreTicket`).
    """

    def __init__(self, context: SessionContext, recorder: Recorder, *, delegate: bool = False) -> None:
        self.context = context
        self.recorder = recorder
        self.delegate = delegate  # an xdist controller: a worker restores (RestoreTicket)
        self.ticket: RestoreTicket | None = None
        self.problems = context.problems
        self.restored: RestoreResult | None = None
        self.store_trouble: str | None = None
        self.header_since: float | None = None
        self.baseline: GraphsRecord | None = None
        self.compared_with = ""
        self._headers: HeaderInstall | None = None  # the restored bundle's headers, being installed
        self._store: TimedStore | None = None
        self._served: RestoreTicket | None = None
        self._finished: Restored | None = None

    def finish(self, reported: Iterable[Mapping[str, Any]] = ()) -> Restored:
        """Wait for what is still going on (the headers' install, the worker that took the ticket) and return
        what the session's start found. ``reported``: what workers that restored sent in their payload
        (:meth:`report`), read when the ticket could not be (a full disk). Idempotent: the value is made once."""
        if self._finished is None:
            from .payload import Restored

            self.finish_headers()
            self.collect_ticket(reported)
            self._finished = Restored(
                self.restored, self.store_trouble, self.header_since, self.baseline, self.compared_with
            )
        return self._finished

    def run(self) -> None:
        self.context.ensure_dir()
        self._sweep()
        if self.context.saving:
            from .pch import session_start

            self.header_since = session_start()
        if self.context.settings.restore == "skip":
            self._take_actions_word()
        elif self.context.settings.store and self.context.dir.path:
            if self.delegate:
                self.ticket = RestoreTicket.new(self.context.dir.path)
                self.context.lease.set({TICKET_ENV: self.ticket.path})
                return  # the baseline is read at the end, when the ticket says what was restored
            self._restore()
        self._read_baseline(self.restored)

    # ---- the xdist hand-over

    def restore_for(self, ticket: RestoreTicket) -> None:
        """In the worker that took ``ticket``: restore as a controller would, install the bundle's graph
        record for every process, and write what happened for the controller (and the other workers).

        The bundle's precompiled headers are still being installed when this returns (the other workers may
        start their tests meanwhile; torch's own lock holds any compile that looks such a header up):
        :meth:`finish_headers` at the worker's end completes the ticket."""
        self._served = ticket  # from now on the controller says what happened (_tell), not this worker
        self._restore()
        self._read_baseline(self.restored)
        self._fulfil(ticket)

    def report(self) -> dict[str, Any]:
        """What this worker's restore for its controller did, as the ticket holds it (plain JSON values)."""
        import json

        restored = self.restored
        fingerprint = self.context.fingerprint_if_known()
        data = {
            "restored": restored.encode() if restored is not None else None,
            "store_trouble": self.store_trouble,
            "fingerprint": fingerprint.to_json() if fingerprint is not None else None,
        }
        # Plain JSON values only: execnet (workeroutput) refuses str subclasses such as torch's TorchVersion.
        plain: dict[str, Any] = json.loads(json.dumps(data))
        return plain

    def _fulfil(self, ticket: RestoreTicket) -> None:
        try:
            ticket.fulfil(self.report())
        except OSError:
            # A full or read-only dir: the other workers find no result and restore themselves (and meet the
            # same trouble); the controller reads this one from the worker's payload (report()).
            pass

    def _forget_headers(self) -> None:
        """Wait for the header install of a bundle that was not restored (torch rejected its blobs), and drop
        it: its headers are sound (verified), but its report is not the restored bundle's."""
        if self._headers is not None:
            self._headers.finish()
            self._headers = None

    def finish_headers(self) -> None:
        """Wait for the restored bundle's headers to be in place (:class:`.sync.HeaderInstall`) and add what
        happened to the restore's result and the session's problems; in the worker that restored for its
        controller, write the ticket again. Call before the result is read at the session's end."""
        install, self._headers = self._headers, None
        if install is None or self.restored is None:
            return
        from dataclasses import replace

        report = install.finish()
        self.restored = replace(self.restored, headers=report)
        store = self._store
        stalled = store is not None and store.exhausted and self.store_trouble is None
        if stalled and store is not None:
            self.store_trouble = store.trouble  # the headers spent the store's whole budget: it is stalling
        if self._served is not None:
            self._fulfil(self._served)  # the controller tells it all
            return
        for line in report.warnings:
            self.problems.warn(line)
        for line in report.notes:
            self.problems.note(line)
        if stalled and not report.warnings:
            self.problems.warn(f"{self.store_trouble}; nothing will be saved this session")

    def collect_ticket(self, reported: Iterable[Mapping[str, Any]] = ()) -> None:
        """At the end, in the controller: what the worker that took the ticket restored (the ticket, else what
        such a worker sent; nothing when no worker did: then the session counts as one without a restore),
        said once (:meth:`_tell`), then the explanation baseline."""
        if self.ticket is None:
            return
        data = self.ticket.result() or next(iter(reported), None) or {}
        self.ticket.remove()
        from .sync import RestoreResult

        self.restored = RestoreResult.decode(data.get("restored"))
        trouble = data.get("store_trouble")
        from .ghrunner import one_line

        self.store_trouble = one_line(trouble) if isinstance(trouble, str) else None
        facts = data.get("fingerprint")
        if isinstance(facts, dict) and all(isinstance(v, str) for v in facts.values()):
            self.context.adopt_fingerprint(facts)
        self._tell()
        self._read_baseline(self.restored)

    def _restore(self) -> None:
        from . import sync

        settings = self.context.settings
        try:
            fingerprint = self.context.fingerprint()
            store = self.context.timed_store()
        except Exception as exc:  # a store or fingerprint that cannot even be set up: infrastructure trouble
            restored = sync.RestoreResult("error", message=f"restore skipped: {type(exc).__name__}: {exc}")
        else:
            self._store = store
            unready: list[str] = []

            def install_headers(named: tuple[Artifact, ...]) -> None:
                # Before the bundle's blobs load (which imports torch): the install overlaps that import, and
                # torch's build lock of each header, held until it is in place, keeps any compile waiting.
                self._forget_headers()  # an earlier one's: torch rejected the blobs of that bundle
                try:
                    self._headers = sync.HeaderInstall(store, settings.key_prefix, named)
                except Exception as exc:  # e.g. torch's lock dir cannot be made: torch builds the headers
                    from .ghrunner import one_line

                    unready.append(one_line(f"precompiled headers not restored: {type(exc).__name__}: {exc}"))

            request = sync.RestoreRequest(
                prefix=settings.key_prefix,
                fingerprint=fingerprint,
                cache_dir=self.context.dir.path or "",
                signing_key=settings.signing_key,
                max_bytes=settings.max_bundle_size,
                headers=False,  # installed in the background, from install_headers
                on_installed=install_headers,
            )
            restored = sync.restore_bundle(store, request)
            if self._headers is not None and self._headers.named != restored.named_artifacts:
                self._forget_headers()  # a rejected bundle's, and the one restored (if any) names none
            if unready:
                from dataclasses import replace

                headers = replace(restored.headers, warnings=(*restored.headers.warnings, *unready))
                restored = replace(restored, headers=headers)
            # A restore that failed on the store skips the save (it would wait again), and so does one whose
            # store spent the whole budget on the side (explaining a miss, fetching headers): it is stalling.
            # A store error met only while explaining a miss is part of the miss's message, not a failure.
            if restored.outcome == "error" or store.exhausted:
                self.store_trouble = store.trouble
        self.restored = restored
        if self._served is None:
            self._tell()

    def _tell(self) -> None:
        """Say what the restore found, once per session: where it restored, or, under xdist, in the controller
        from the ticket (never in the worker that restored: workers that restored one after another, or one
        that died after writing the ticket, make the one warning a serial session makes)."""
        restored = self.restored
        if restored is None:
            return
        if restored.warning:
            self.problems.warn(restored.warning)
        for line in restored.headers.warnings:
            self.problems.warn(line)
        for line in restored.headers.notes:
            self.problems.note(line)
        if self.store_trouble and not restored.warning and not restored.headers.warnings:
            self.problems.warn(f"{self.store_trouble}; nothing will be saved this session")  # the one warning

    def _take_actions_word(self) -> None:
        """The Action restored before pytest (``--compile-cache-restore=skip``): read what it said, and load
        the mega-cache blobs its restore step installed but left for this process (that step imports no
        torch; this one will). A blob that changed or that torch rejects is one warning, and the session
        counts as one after a failed restore (cold compile, the hit-rate floor not enforced)."""
        from . import sync

        value = os.environ.get(sync.HANDOFF_ENV)
        told = sync.read_handoff(value)
        self.restored = told
        if told is not None and told.outcome == "error" and not sync.read_save_policy(value).staged:
            # The Action's restore met this session's store itself (s3://, gs://, az://, a directory) and said so
            # in its one warning: a save to it would wait for it again and warn a second time. (With store:
            # github the session only stages; the Action's post step meets the cache service.)
            self.store_trouble = told.message or "the Action's restore failed"
        if told is not None and told.headers.named:
            from . import probe

            # the headers the Action's restore step installed: checked early, as a restore of ours does
            probe.check_headers_early(told.headers.named)
        if told is None or not told.staged or not self.context.dir.path:
            return
        self.restored = sync.load_staged(told, self.context.dir.path)
        if self.restored.outcome == "error":
            self.problems.warn(f"{self.restored.message}; the tests compile cold")
        elif self.restored.message != told.message:
            self.problems.note(self.restored.message)

    def _read_baseline(self, restored: RestoreResult | None) -> None:
        record = explanation_baseline(self.context, restored, self.problems)
        # The record says whether it is a restored bundle's (installed here, by the worker that restored for an
        # xdist controller, or by the Action's restore step) or a local session's: the dir keeps the newer.
        from_bundle = record is not None and record.from_bundle
        self.baseline, self.compared_with = record, ("bundle" if from_bundle else "previous session")
        self.recorder.set_baseline(record)

    def _sweep(self) -> None:
        sweep_leftovers(self.context)


def explanation_baseline(
    context: SessionContext, restored: RestoreResult | None, problems: Problems
) -> GraphsRecord | None:
    """The earlier run's graphs, kept as ``<cache dir>/.compilecache-graphs.json`` for every process.

    Of a restored bundle's record (verified with the bundle) and the dir's, the newer is the baseline
    (:func:`explain.install_restored`); without one, a shared dir's record is the previous local session's.
    A fresh isolated dir has none unless a bundle brought it, so a cold isolated session explains nothing:
    every miss there is intended. An unreadable record is one warning and no explanations (the session's
    own record replaces it at the end).
    """
    path = context.dir.path
    if not context.settings.explain or not path or context.dir.mode not in EXPLAINED_MODES:
        return None  # off: a restored bundle's record is not installed, nothing is compared
    from .cachedir import GRAPHS_RECORD

    graphs = restored.graphs if restored is not None else None
    record: GraphsRecord | None = None
    if graphs or os.path.isfile(os.path.join(path, GRAPHS_RECORD)):
        from .explain import read_baseline

        record, warning = read_baseline(Path(path), graphs)  # never raises: trouble is one warning
        if warning:
            from .ghrunner import one_line

            problems.warn(one_line(warning, 500))
    return record


def sweep_leftovers(context: SessionContext) -> None:
    """Remove the bundle temps (staging dirs, save/restore dirs) whose owner is gone: in the cache dir,
    and in the temp dir when this session moves bundles. torch's own temp files in the cache dir are
    swept when the session registers (:meth:`.context.SessionContext.start`). With a store, also what a
    killed header install left in torch's header dir."""
    places = [context.dir.path, tempfile.gettempdir() if context.settings.store else None]
    if not any(places):
        return
    from ._fs import sweep_our_temps
    from .cachedir import live_owners

    for where in places:
        if where:
            try:
                # In the cache dir, a registered session's ticket and staging entries are in use, however old.
                sweep_our_temps(where, live=live_owners(where) if where == context.dir.path else frozenset())
            except OSError:  # best effort: the next session tries again
                pass
    if context.settings.store:
        # A session killed while it installed a precompiled header left the partial file in torch's dir.
        from .pch import sweep_leftovers as sweep_header_leftovers

        try:
            sweep_header_leftovers()
        except OSError:
            pass
