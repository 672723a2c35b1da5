"""The session's end, after every process reported: :class:`SavePhase`.

It explains this session's misses and keeps the graph record for the next run, saves a bundle (with the
precompiled headers the session used) within the store's time budget, and trims a capped shared dir. Like
the restore phase it only ever warns: the session's outcome is decided by the controller.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

from . import cachedir
from . import recorder as recording
from ._env import torch_job_id

if TYPE_CHECKING:
    from .explain import GraphsRecord
    from .explain import SessionExplanation
    from .recorder import Recorder
    from .restore_phase import RestorePhase
    from .session import Setup
    from .stats import SessionStats
    from .sync import SaveResult

from .restore_phase import EXPLAINED_MODES


class SavePhase:
    """What the end of the session did: ``why`` (this run's miss explanations; None when nothing was
    compared), ``graphs`` (the record the next run compares with) and ``saved`` (None: no save tried).

    ``blobs``, ``files`` and ``header_dirs`` are what the session's processes reported (their mega-cache
    blobs, the cache files they used, where their torch keeps precompiled headers).
    """

    def __init__(self, setup: Setup, recorder: Recorder, start: RestorePhase) -> None:
        self.setup = setup
        self.recorder = recorder
        self.start = start
        self.problems = setup.problems
        self.blobs: dict[str, bytes] = {}
        self.files: set[str] = set()
        self.header_dirs: set[str] = set()
        self.header_uses: list[Any] = []  # every process's checked headers (headers.HeaderUse JSON)
        self.why: SessionExplanation | None = None
        self.graphs: GraphsRecord | None = None
        self.saved: SaveResult | None = None
        self.tests_failed = False  # the session's tests failed (set by the controller before run())

    @property
    def stats(self) -> SessionStats:
        return self.recorder.stats

    def run(self) -> None:
        self.explain()
        if self.setup.saving:
            self.save()
        self.evict()

    # ---- explanations

    def explain(self) -> None:
        """Say why each miss missed (against the restore phase's baseline) and build the record the next run
        compares with.

        Only for a cache dir of ours that caches (``shared``, ``isolated``): with caches ``disabled`` every
        lookup misses by design, and without a dir there is nowhere to keep a record. Tests marked
        isolated/disabled kept no graphs. The record is written back to a shared dir (the next local
        session's baseline) and goes into the saved bundle. With ``--compile-cache-explain=off`` nothing
        happens: the dir's record stays as it was and the saved bundle carries none.
        """
        path = self.setup.dir.path
        if not self.setup.settings.explain or not path or self.setup.dir.mode not in EXPLAINED_MODES:
            return
        if recording.torch_loaded():  # no probe to load before torch is
            from . import probe  # cost: loaded once torch is

            note = probe.graph_capture_installed() if probe.dynamo_loaded() else None
            if note:
                self.problems.note(note)
        if not self.recorder.has_stats:
            return  # no test compiled anything: keep the baseline as it is for the next run
        current = {nodeid: r.graphs for nodeid, r in self.stats.records.items() if r.graphs}
        if not current:
            return  # nothing was looked up: keep the baseline as it is for the next run
        # cost: explain loads only when a test looked up a graph
        from .explain import explain_session_safely
        from .explain import save_record

        baseline = self.start.baseline
        aot_misses = {nodeid: r.aotautograd["miss"] for nodeid, r in self.stats.records.items()}
        why, self.graphs, warning = explain_session_safely(current, baseline, self.start.compared_with, aot_misses)
        if warning:  # never a failed session: one warning, and this session's graphs alone are kept
            from .ghrunner import one_line  # cost: only to warn

            self.problems.warn(one_line(warning, 500))
        if why is not None and baseline is not None:  # None: a first run (the report says null, not "{}")
            self.why = why
        for nodeid, misses in (why.misses if why is not None else {}).items():
            self.stats.records[nodeid].why = misses
        if self.why is not None:
            self._suggest_pgo(self.why)
        if self.graphs is not None and self.setup.dir.mode == "shared":
            try:
                save_record(Path(path), self.graphs)
            except OSError as exc:
                self.problems.warn(f"could not keep the graph record for the next session: {exc}")

    def _suggest_pgo(self, why: SessionExplanation) -> None:
        """A note when misses differ from the earlier graphs only in which sizes torch made symbolic, which
        depends on the order tests ran in each process, and no job id keeps torch's profile of them."""
        if self.setup.settings.pgo or torch_job_id():
            return
        from .explain import order_dependent_tests  # cost: loaded with explain_session_safely above

        tests = order_dependent_tests(why)
        if not tests:
            return
        names = ", ".join(tests[:2]) + (f" and {len(tests) - 2} more" if len(tests) > 2 else "")
        self.problems.note(
            f"{len(tests)} test{'s' if len(tests) != 1 else ''} ({names}) missed a graph that differs from the "
            "earlier one in which sizes are symbolic: torch makes a size symbolic once a process meets a second "
            "one, so this usually depends on the tests that ran before in that process (xdist's order, a random "
            f"order); {self.setup.settings.spelling('pgo')}=on (the Action's input pgo) compiles the same graphs "
            "in any order (see the docs' troubleshooting, item 3)"
        )

    # ---- the bundle

    def save(self) -> None:
        # cost: only a saving session loads sync
        from . import sync
        from .fingerprint import default_suffix

        settings, restored = self.setup.settings, self.start.restored
        # Without a result: restored by someone else (the Action, an earlier CLI step) who did not say how.
        was_restored = restored.outcome in ("exact", "partial") if restored is not None else settings.restore == "skip"
        new_gpu = self.stats.new_gpu_artifacts  # issue 27: new autotune results or triton builds are worth a bundle
        if was_restored and self.stats.hits and not self.stats.misses and not new_gpu and not self._new_headers():
            # Every graph came from the restored cache: a new bundle would only repeat the old one.
            self.saved = sync.SaveResult("skipped", message="every graph hit the restored cache; nothing new to save")
            return
        if self.start.store_trouble is not None:
            # The store failed or stalled at the restore: one warning said so; a save would wait again.
            self.saved = sync.SaveResult("skipped", message="the store failed at the restore; nothing saved")
            return
        told = os.environ.get(sync.HANDOFF_ENV) if settings.restore == "skip" else None
        policy = sync.read_save_policy(told)
        if policy.only_when_passed and self.tests_failed:
            # The Action's one policy for every store (actions/cache's): a red run saves nothing by default.
            self.saved = sync.SaveResult("skipped", message="the tests failed: nothing saved (input save-on-failure)")
            return
        try:
            fingerprint = self.setup.fingerprint()
            store = self.setup.timed_store()
        except Exception as exc:
            self.problems.warn(f"save skipped: {type(exc).__name__}: {exc}")
            return
        self.saved = sync.save(
            store,
            prefix=settings.key_prefix,
            fingerprint=fingerprint,
            suffix=settings.run_suffix or default_suffix(),
            cache_dir=self.setup.dir.path or "",
            blobs=self.blobs,
            files=sorted(self.files),
            stats=self.stats.totals_json(),
            signing_key=settings.signing_key,
            keep=settings.keep_bundles,
            max_bytes=settings.max_bundle_size,
            graphs=self.graphs.to_json() if self.graphs else None,
            header_since=self._header_since(),
            header_installed=self._restored_headers(),
            header_carried=restored.headers.carried if restored is not None else (),
            header_uses=self.header_uses,
        )
        if policy.staged and self.saved.outcome == "saved":
            # store: github: the bundle is only in the staging dir; actions/cache's post step uploads it at job end
            # (if the job succeeds), and may fail or be skipped: never say "saved" for what is not stored yet.
            note = f"{sync.STAGED_MESSAGE}; {self.saved.message}" if self.saved.message else sync.STAGED_MESSAGE
            self.saved = replace(self.saved, outcome="staged", message=note)
        if self.saved.warning:
            self.problems.warn(self.saved.warning)
        elif self.saved.message and self.saved.outcome in ("saved", "staged"):
            self.problems.note(f"save: {self.saved.message}")
        for line in self.saved.headers.warnings:
            self.problems.warn(line)

    # ---- precompiled headers

    def _new_headers(self) -> bool:
        """True when this session used a precompiled header its restored bundle does not name (a bundle saved
        on a machine that already had the header names none): then a save is worth it even when every graph
        hit. After the Action's restore, its report names what it installed or found: a header it could not
        restore (its entry evicted) and torch built again is new, so this save carries it (issue 10)."""
        since = self.start.header_since
        if since is None or self.start.restored is None:
            return False
        # cost: headers load only in a saving session
        from .headers import find_used
        from .headers import header_dir

        used = {path.name for path in find_used(header_dir(), self.header_uses, self._restored_headers())}
        return bool(used - set(self._restored_headers()))

    def _restored_headers(self) -> tuple[str, ...]:
        restored = self.start.restored
        return restored.headers.named if restored is not None else ()

    def _header_since(self) -> float | None:
        """The ``since`` for carrying headers, or None (carry none) when torch keeps them elsewhere.

        ``headers.header_dir()`` mirrors torch's path without importing torch; a process whose torch reports
        another dir (a torch that moved it, a test that changed TMPDIR before importing torch) would make
        us carry the wrong files, so then nothing is carried and a note says why.
        """
        if self.start.header_since is None:
            return None
        from .headers import header_dir  # cost: as above

        expected = str(header_dir())
        others = sorted(d for d in self.header_dirs if d != expected)
        if others:
            self.problems.note(f"precompiled headers not carried: torch keeps them in {others[0]}, not {expected}")
            return None
        return self.start.header_since

    # ---- the cache dir's size

    def evict(self) -> None:
        path, settings = self.setup.dir.path, self.setup.settings
        if self.setup.dir.mode != "shared" or not path or not settings.max_size:
            return
        try:
            used = frozenset(self.files)
            compiled = self.recorder.anything_compiled
            registration = self.setup.registration
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
