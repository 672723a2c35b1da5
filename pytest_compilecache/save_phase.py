"""The session's end, after every process reported: :class:`SavePhase`.

It takes what the start found (:class:`.payload.Restored`) and what the processes gathered
(:class:`.payload.Gathered`), returns what it did (:class:`Saved`), and reads nothing else of either. It
explains this session's misses and keeps the graph record for the next run, saves a bundle (with the
precompiled headers the session used) within the store's time budget, and trims a capped shared dir. Like
the restore phase it only ever warns: the session's outcome is decided by the controller.
Loads lazily (inside the functions that need them, so a session pays only for what it uses): ``.explain``,
``.probe``, ``.ghrunner``, ``.sync``, ``.fingerprint``, ``.pch``.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING
from typing import NamedTuple
from typing import Sequence

from . import cachedir
from . import recorder as recording
from ._env import torch_job_id
from .context import EXPLAINED_MODES

if TYPE_CHECKING:
    from .context import SessionContext
    from .explain import GraphsRecord
    from .explain import SessionExplanation
    from .payload import Gathered
    from .payload import Restored
    from .recorder import Recorder
    from .selection import Selection
    from .stats import SessionStats
    from .sync import SavePolicy
    from .sync import SaveResult


class Saved(NamedTuple):
    """What the end of the session did: ``why`` (this run's miss explanations; None when nothing was
    compared), ``graphs`` (the record the next run compares with) and ``result`` (None: no save tried)."""

    why: SessionExplanation | None = None
    graphs: GraphsRecord | None = None
    result: SaveResult | None = None


class SavePhase:
    """The end of the session: :meth:`run` explains, saves and trims, and returns :class:`Saved`.

    Its parts (:meth:`explain`, :meth:`save`, :meth:`evict`) take values and return values too, so each can
    be run alone.
    """

    def __init__(self, context: SessionContext, recorder: Recorder) -> None:
        self.context = context
        self.recorder = recorder
        self.problems = context.problems

    @property
    def stats(self) -> SessionStats:
        return self.recorder.stats

    def run(
        self,
        restored: Restored,
        gathered: Gathered,
        *,
        tests_failed: bool = False,
        stopped: bool = False,
        selection: Selection | None = None,
    ) -> Saved:
        """``tests_failed``: the session's tests failed (the Action's save policy may then skip the save);
        ``stopped``: it stopped before running every test it selected; ``selection``: which tests it selected
        (None: not known). A session that stopped early, or left out tests the restored bundle covers, does not
        replace that bundle."""
        baseline, left, renew = restored.baseline, [], False
        if selection is not None and baseline is not None:
            guarded, renew = _against(baseline, selection)
            left = selection.left_out(baseline.tests) if guarded else []
        why, graphs = self.explain(restored)
        own = graphs  # the record in this session's bundle says how this session selected
        if graphs is not None and selection is not None:
            own = replace(graphs, selection=selection.signature, selected_at=graphs.created)
        result = (
            self.save(restored, gathered, own, tests_failed=tests_failed, stopped=stopped, left_out=left, renew=renew)
            if self.context.saving
            else None
        )
        self.evict(gathered)
        return Saved(why, graphs, result)

    # ---- explanations

    def explain(self, restored: Restored) -> tuple[SessionExplanation | None, GraphsRecord | None]:
        """Say why each miss missed (against the restore phase's baseline) and build the record the next run
        compares with, which keeps how the session that saved the baseline's bundle selected its tests
        (:attr:`.explain.GraphsRecord.selection`: this session may not save); return both (None: nothing
        compared, no record).

        Only for a cache dir of ours that caches (``shared``, ``isolated``): with caches ``disabled`` every
        lookup misses by design, and without a dir there is nowhere to keep a record. Tests marked
        isolated/disabled kept no graphs. The record is written back to a shared dir (the next local
        session's baseline) and goes into the saved bundle. With ``--compile-cache-explain=off`` nothing
        happens: the dir's record stays as it was and the saved bundle carries none.
        """
        path = self.context.dir.path
        if not self.context.settings.explain or not path or self.context.dir.mode not in EXPLAINED_MODES:
            return None, None
        if recording.torch_loaded():  # no probe to load before torch is
            from . import probe

            note = probe.graph_capture_installed() if probe.dynamo_loaded() else None
            if note:
                self.problems.note(note)
        if not self.recorder.has_stats:
            return None, None  # no test compiled anything: keep the baseline as it is for the next run
        current = {nodeid: r.graphs for nodeid, r in self.stats.records.items() if r.graphs}
        if not current:
            return None, None  # nothing was looked up: keep the baseline as it is for the next run
        from .explain import explain_session_safely
        from .explain import save_record

        baseline = restored.baseline
        aot_misses = {nodeid: r.aotautograd["miss"] for nodeid, r in self.stats.records.items()}
        why, graphs, warning = explain_session_safely(current, baseline, restored.compared_with, aot_misses)
        if graphs is not None and baseline is not None:
            graphs = replace(graphs, selection=baseline.selection, selected_at=baseline.saved_at)
        if warning:  # never a failed session: one warning, and this session's graphs alone are kept
            from .ghrunner import one_line

            self.problems.warn(one_line(warning, 500))
        for nodeid, misses in (why.misses if why is not None else {}).items():
            self.stats.records[nodeid].why = misses
        if baseline is None:
            why = None  # a first run (the report says null, not "{}")
        if why is not None:
            _suggest_pgo(self.context, why)
        if graphs is not None and self.context.dir.mode == "shared":
            try:
                save_record(Path(path), graphs)
            except OSError as exc:
                self.problems.warn(f"could not keep the graph record for the next session: {exc}")
        return why, graphs

    # ---- the bundle

    def save(
        self,
        restored: Restored,
        gathered: Gathered,
        graphs: GraphsRecord | None = None,
        *,
        tests_failed: bool = False,
        stopped: bool = False,
        left_out: Sequence[str] = (),
        renew: bool = False,
    ) -> SaveResult | None:
        """Save a bundle unless there is nothing new, the store failed at the restore, the session stopped early
        or left out tests the restored bundle covers (``left_out``), or the Action's policy says no; return what
        happened (None: the store or fingerprint could not even be set up, one warning). ``renew``: save even when
        every graph hit, so that the restored bundle of this session's selection does not go stale."""
        from . import sync
        from .fingerprint import default_suffix

        settled = _settled(restored.baseline, graphs) or renew
        skip = self._why_not_save(restored, gathered, tests_failed, settled, stopped, left_out)
        if skip is not None:
            return sync.SaveResult("skipped", message=skip)
        settings, result = self.context.settings, restored.result
        try:
            fingerprint = self.context.fingerprint()
            store = self.context.timed_store()
        except Exception as exc:
            self.problems.warn(f"save skipped: {type(exc).__name__}: {exc}")
            return None
        installed = _restored_headers(restored)
        request = sync.SaveRequest(
            prefix=settings.key_prefix,
            fingerprint=fingerprint,
            suffix=settings.run_suffix or default_suffix(),
            cache_dir=self.context.dir.path or "",
            blobs=gathered.blobs,
            files=sorted(gathered.files),
            stats=self.stats.totals_json(),
            signing_key=settings.signing_key,
            keep=settings.keep_bundles,
            max_bytes=settings.max_bundle_size,
            graphs=graphs.to_json() if graphs else None,
            header_since=_header_since(self.context, restored, gathered),
            header_installed=installed,
            header_carried=result.headers.carried if result is not None else (),
            header_uses=list(gathered.header_uses),
            header_idle=result.headers.idle if result is not None else {},
        )
        saved = sync.save_bundle(store, request)
        if self._policy().staged and saved.outcome == "saved":
            # store: github: the bundle is only in the staging dir; actions/cache's post step uploads it at job end
            # (if the job succeeds), and may fail or be skipped: never say "saved" for what is not stored yet.
            note = f"{sync.STAGED_MESSAGE}; {saved.message}" if saved.message else sync.STAGED_MESSAGE
            saved = replace(saved, outcome="staged", message=note)
        if saved.warning:
            self.problems.warn(saved.warning)
        elif saved.message and saved.outcome in ("saved", "staged"):
            self.problems.note(f"save: {saved.message}")
        for line in saved.headers.warnings:
            self.problems.warn(line)
        for line in saved.headers.notes:
            self.problems.note(line)
        return saved

    def _policy(self) -> SavePolicy:
        from . import sync

        told = os.environ.get(sync.HANDOFF_ENV) if self.context.settings.restore == "skip" else None
        return sync.read_save_policy(told)

    def _why_not_save(
        self,
        restored: Restored,
        gathered: Gathered,
        tests_failed: bool,
        settled: bool = False,
        stopped: bool = False,
        left_out: Sequence[str] = (),
    ) -> str | None:
        """Why this session saves nothing (a ``skipped`` result's message), or None: it saves. ``settled``:
        a test whose graph changed in the runs the restored record remembers hit now; the record must say so.
        ``stopped``: the session stopped before running every test it selected; ``left_out``: the tests of the
        restored record it did not select though they still exist (:meth:`.selection.Selection.left_out`)."""
        result = restored.result
        # Without a result: restored by someone else (the Action, an earlier CLI step) who did not say how.
        was_restored = (
            result.outcome in ("exact", "partial") if result is not None else self.context.settings.restore == "skip"
        )
        new_gpu = self.stats.new_gpu_artifacts  # new autotune results or triton builds are worth a bundle
        if (
            was_restored
            and self.stats.hits
            and not self.stats.misses
            and not new_gpu
            and not _new_headers(restored, gathered)
            and not settled
        ):
            # Every graph came from the restored cache: a new bundle would only repeat the old one.
            return "every graph hit the restored cache; nothing new to save"
        if restored.store_trouble is not None:
            # The store failed or stalled at the restore: one warning said so; a save would wait again.
            return "the store failed at the restore; nothing saved"
        if gathered.silent:
            # A worker died: its graphs and its mega-cache blob are not in this session's bundle, which the next
            # run would restore as the newest, replacing the coverage this one restored (and failing a hit-rate
            # floor on a green run).
            return f"workers that sent no statistics ({', '.join(gathered.silent)}): nothing saved"
        if stopped and was_restored:
            # A bundle holds what its session used, and the next run restores the newest: this one would replace
            # the coverage it restored with the part of the suite that ran before the stop.
            return "the session stopped early (-x, --maxfail, an interrupt): nothing saved over the restored bundle"
        if left_out and was_restored and (gathered.blobs or gathered.files):  # else: "nothing was compiled"
            # The same for a session that selected part of the suite: its bundle would hold only that part.
            from .selection import describe

            count = f"{len(left_out)} test{'s' if len(left_out) != 1 else ''}"
            return (
                f"the session left out {count} that the restored bundle covers ({describe(left_out)}: deselected, "
                "or outside what its arguments collect), and no session that selects as this one saved that bundle: "
                "nothing saved over it before it is a week old"
            )
        if self._policy().only_when_passed and tests_failed:
            # The Action's one policy for every store (actions/cache's): a red run saves nothing by default.
            return "the tests failed: nothing saved (input save-on-failure)"
        return None

    # ---- the cache dir's size

    def evict(self, gathered: Gathered) -> None:
        path, settings = self.context.dir.path, self.context.settings
        if self.context.dir.mode != "shared" or not path or not settings.max_size:
            return
        try:
            used = gathered.files
            compiled = self.recorder.anything_compiled
            registration = self.context.registration
            trimmed = cachedir.trim(path, settings.max_size, registration=registration, used=used, compiled=compiled)
        except Exception as exc:
            self.problems.warn(f"could not trim the cache dir: {exc}")
            return
        line = trimmed.describe()
        if line:
            self.problems.note(line)
        too_small = trimmed.too_small(settings.spelling("max_size"), settings.max_size)
        if too_small:
            self.problems.warn(too_small)


def _suggest_pgo(context: SessionContext, why: SessionExplanation) -> None:
    """A note when misses differ from the earlier graphs only in which sizes torch made symbolic, which
    depends on the order tests ran in each process, and no job id keeps torch's profile of them."""
    if context.settings.pgo or torch_job_id():
        return
    from .explain import order_dependent_tests

    tests = order_dependent_tests(why)
    if not tests:
        return
    names = ", ".join(tests[:2]) + (f" and {len(tests) - 2} more" if len(tests) > 2 else "")
    context.problems.note(
        f"{len(tests)} test{'s' if len(tests) != 1 else ''} ({names}) missed a graph that differs from the "
        "earlier one in which sizes are symbolic: torch makes a size symbolic once a process meets a second "
        "one, so this usually depends on the tests that ran before in that process (xdist's order, a random "
        f"order); {context.settings.spelling('pgo')}=on (the Action's input pgo) compiles the same graphs "
        "in any order (see the docs' troubleshooting, item 3)"
    )


def _header_since(context: SessionContext, restored: Restored, gathered: Gathered) -> float | None:
    """The ``since`` for carrying headers, or None (carry none) when torch keeps them elsewhere.

    ``pch.header_dir()`` mirrors torch's path without importing torch; a process whose torch reports
    another dir (a torch that moved it, a test that changed TMPDIR before importing torch) would make
    us carry the wrong files, so then nothing is carried and a note says why.
    """
    if restored.header_since is None:
        return None
    from .pch import header_dir

    expected = str(header_dir())
    others = sorted(d for d in gathered.header_dirs if d != expected)
    if others:
        context.problems.note(f"precompiled headers not carried: torch keeps them in {others[0]}, not {expected}")
        return None
    return restored.header_since


def _settled(baseline: GraphsRecord | None, graphs: GraphsRecord | None) -> bool:
    """Whether a test the restored record counts as changing in consecutive runs (one change short of "never
    hits") ran now without that change: its streak ends here. Only a saved record says so to the next run: a
    run that hit everything and saved nothing would leave the next one the old streak, and a run of edits with
    hits between them would read as a test that can never hit."""
    if baseline is None or graphs is None:
        return False
    from .explain.history import NEVER_HIT_CHANGES

    return any(
        streak.changes >= NEVER_HIT_CHANGES - 1 and nodeid in graphs.tests and nodeid not in graphs.volatile
        for nodeid, streak in baseline.volatile.items()
    )


def _against(baseline: GraphsRecord, selection: Selection) -> tuple[bool, bool]:
    """``(guarded, renew)`` for the restored bundle whose record is ``baseline``:

    * ``guarded``: kept from a session that leaves out its tests, unless that bundle's session selected as this
      one (the same job) or no such session saved it for ``STALE_SECONDS`` (nobody keeps it up to date);
    * ``renew``: this session saves although every graph hit, because the bundle is of its own selection and
      half of ``STALE_SECONDS`` old: a stable suite's bundle never looks abandoned (an upload every few days).

    A time more than a day ahead of this clock is not believed: infinitely old."""
    import time

    from .selection import STALE_SECONDS

    alike = bool(baseline.selection) and baseline.selection == selection.signature
    age = time.time() - baseline.saved_at
    age = age if age > -86400 else float("inf")
    return not alike and age <= STALE_SECONDS, alike and age > STALE_SECONDS / 2


def _new_headers(restored: Restored, gathered: Gathered) -> bool:
    """True when this session used a precompiled header its restored bundle does not name (a bundle saved
    on a machine that already had the header names none): then a save is worth it even when every graph
    hit. After the Action's restore, its report names what it installed or found: a header it could not
    restore (its entry evicted) and torch built again is new, so this save carries it."""
    if restored.header_since is None or restored.result is None:
        return False
    from .pch import find_used
    from .pch import header_dir

    installed = _restored_headers(restored)
    used = {path.name for path in find_used(header_dir(), gathered.header_uses, installed)}
    return bool(used - set(installed))


def _restored_headers(restored: Restored) -> tuple[str, ...]:
    return restored.result.headers.named if restored.result is not None else ()
