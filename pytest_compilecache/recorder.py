"""Per-test statistics of one process: :class:`Recorder`, the plugin's hot path.

Loaded by the plugin once torch appears (or in a session given an option), so at import it loads nothing
else of ours: :mod:`probe` and :mod:`stats` load when torch is imported (or a report needs the
statistics). While torch is not imported a test costs one dict lookup and one counter.
Loads lazily (inside the functions that need them, so a session pays only for what it uses): ``.stats``, ``.probe``,
``.explain``, ``.record_fields``.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any
from typing import Mapping
from typing import NamedTuple

if TYPE_CHECKING:
    from .explain import GraphsRecord
    from .explain import MissExplanation
    from .probe import Mark
    from .stats import CompileCacheStats
    from .stats import ItemRecord
    from .stats import SessionStats

_MODULES = sys.modules


def torch_loaded() -> bool:
    """True once the session imported torch (the same test as ``probe.torch_loaded``, without loading probe)."""
    return "torch" in _MODULES


class Start(NamedTuple):
    """Where a test started: torch's counters (None: before torch was imported, i.e. all zero) and the
    position in this process's FX-graph lookups (None: explaining is off)."""

    mark: Mark | None
    graphs: int | None


# The start of every test that begins before torch is imported: no counters yet, no FX-graph lookups.
COLD = Start(None, 0)
COLD_UNEXPLAINED = Start(None, None)  # the same with explaining off


class Recorder:
    """Per-test statistics of one process: the hot path is :meth:`start` / :meth:`finish` per test.

    While torch is not imported both are a few attribute reads (no explain import, no parsing). The
    ``baseline`` is the earlier run's graph record the live ``compile_cache_stats.why`` compares with:
    set by the controller after its restore, read lazily from ``baseline_dir`` by a worker. With
    ``explain=False`` (``--compile-cache-explain=off``) it never touches the graph capture: no lookups are
    taken, none recorded, nothing explained.
    """

    def __init__(self, worker: str, explain: bool = True, since_import: bool = False) -> None:
        self.worker = worker
        self.explain = explain
        self.cold_tests = 0  # tests counted by finish_cold, not yet in stats
        self._stats: SessionStats | None = None
        self.baseline_dir: str | None = None
        self._baseline: GraphsRecord | None = None
        self._baseline_read = False
        # function -> the test whose frame compiled it first in this process: a later recompile names it
        self._first_compiled: dict[str, str] = {}
        # Where the last recorded test ended; before the first, where this session began: torch's counters are
        # per process, and an earlier session in this process (pytest.main() twice, an IDE) counted its own.
        # ``since_import``: torch was imported by this session (its conftests), so all it counted is this session's.
        self._since: Start | None = self._here() if torch_loaded() and not since_import else None
        self.running: tuple[str, Start] | None = None  # the test running now and its start (PerTestHooks)

    @property
    def has_stats(self) -> bool:
        """Whether anything beyond a count was recorded (the statistics were made)."""
        return self._stats is not None

    @property
    def anything_compiled(self) -> bool:
        """Whether a recorded test went through Dynamo or a compile cache (without making the statistics)."""
        return self._stats is not None and self._stats.anything_compiled

    @property
    def stats(self) -> SessionStats:
        """This process's statistics (made on first use: a session that never compiles may never need them)."""
        stats = self._stats
        if stats is None:
            from .stats import SessionStats

            stats = self._stats = SessionStats()
        if self.cold_tests:
            stats.tests += self.cold_tests
            self.cold_tests = 0
        return stats

    def start(self) -> Start:
        """Where a test starts; :data:`COLD` (no probe call) while torch is not imported."""
        if not torch_loaded():
            return COLD if self.explain else COLD_UNEXPLAINED
        here = self._here()
        self._outside(here)
        return here

    def _here(self) -> Start:
        from . import probe

        # graph_mark() would install the capture once torch's codecache is loaded: not when explaining is off.
        return Start(probe.mark(), probe.graph_mark() if self.explain else None)

    def finish_outside(self) -> None:
        """Record what compiled since the last test ended (a ``pytest_sessionfinish`` hook, a compile at
        collection when no test ran): at the process's end, before its statistics are read. A session fixture's
        teardown is not here: pytest runs it inside the last test's teardown, which counts it. A test pytest
        never finished (it raised ``KeyboardInterrupt``, called ``pytest.exit``) is recorded as itself first."""
        if self.running is not None:
            nodeid, start = self.running
            self.running = None
            self.finish(nodeid, start)
        if torch_loaded():
            self._outside(self._here())

    def _outside(self, here: Start) -> None:
        """What compiled between the last test's end and ``here``, outside every test (a compile at import or
        collection, in a hook or between tests), is recorded as :data:`.record_fields.OUTSIDE`: its misses are misses (a
        bundle must carry those graphs), though no test paid them."""
        since = self._since if self._since is not None else (COLD if self.explain else COLD_UNEXPLAINED)
        self._since = here
        from . import probe

        if here.mark is None or not probe.moved(since.mark, here.mark):
            return  # nothing compiled since the last test ended: the common case, two comparisons
        from .record_fields import OUTSIDE

        self._keep(OUTSIDE, self._delta(OUTSIDE, since, intended=False))

    def finish_cold(self, start: Start) -> bool:
        """Count a test that cannot have compiled: it began :data:`COLD` and torch is still not imported.

        The per-test path of a session that never imports torch (no node id, no probe call). False: the
        test may have compiled, call :meth:`finish`.
        """
        if start.mark is not None or torch_loaded():
            return False
        self.cold_tests += 1
        return True

    def finish(self, nodeid: str, start: Start, intended: bool = False) -> None:
        """Record the test that began at ``start``; ``intended``: marked isolated/disabled, so its misses are
        by design and its graphs are neither kept nor explained."""
        delta = self._delta(nodeid, start, intended)
        if delta and intended:
            delta["by_design"] = True
        self.record(nodeid, delta)
        self._since = self._here()

    def _delta(self, nodeid: str, start: Start, intended: bool) -> dict[str, Any]:
        from . import probe

        delta = probe.delta(start.mark if start.mark is not None else probe.ZERO)
        if probe.FIRST_COMPILES in delta or "recompiled" in delta:  # only a test that compiled a frame
            self._name_first_compilers(nodeid, delta)
        if start.graphs is None:  # explaining is off
            return delta
        graphs = probe.graph_delta(start.graphs)
        if graphs and not intended:
            delta["graphs"] = graphs
        return delta

    def _name_first_compilers(self, nodeid: str, delta: dict[str, Any]) -> None:
        """Remember the functions this test compiled first; name, in each recompile, the test that compiled its
        frame first (in this process: each xdist worker compiles for itself)."""
        from . import probe
        from .record_fields import TORCH_FRAME

        for function in delta.pop(probe.FIRST_COMPILES, ()):
            if not function.startswith(TORCH_FRAME):  # every compiled module's wrapper: no one function
                self._first_compiled.setdefault(function, nodeid)
        for entry in delta.get("recompiled", ()):
            entry["first"] = self._first_compiled.get(entry.get("function", ""), "")

    def record(self, nodeid: str, delta: Mapping[str, Any]) -> None:
        """Count one finished test and keep its record when it compiled."""
        self.stats.tests += 1
        self._keep(nodeid, delta)

    def _keep(self, nodeid: str, delta: Mapping[str, Any]) -> None:
        """Keep ``delta`` as ``nodeid``'s record when it compiled."""
        if delta:
            from .stats import ItemRecord

            record = ItemRecord(nodeid=nodeid, worker=self.worker)
            record.add(delta)
            if record.compiled:
                self.stats.add_record(record)

    def live(self, nodeid: str, start: Start | None, intended: bool = False) -> CompileCacheStats:
        """The ``compile_cache_stats`` fixture's object for a test that started at ``start``.

        Its ``why`` compares the test's misses so far with the same test's graphs in the baseline.
        """
        from .stats import CompileCacheStats

        if start is None:
            return CompileCacheStats(nodeid, dict)
        explain = self._why if self.explain and not intended else None
        return CompileCacheStats(nodeid, lambda: self._delta(nodeid, start, intended), explain)

    def _why(self, record: ItemRecord) -> list[MissExplanation]:
        baseline = self.baseline()
        if baseline is None:
            return []
        from .explain import earlier_graphs
        from .explain import explain_test_safely

        return explain_test_safely(record.graphs, earlier_graphs(baseline, record.nodeid, record.graphs))

    def baseline(self) -> GraphsRecord | None:
        """The earlier run's graph record; None when there is none or it is unreadable (the controller warns)."""
        if not self._baseline_read:
            self._baseline_read = True
            if self.baseline_dir:
                from .explain import load_record

                try:
                    self._baseline = load_record(Path(self.baseline_dir))
                except (OSError, ValueError):
                    self._baseline = None
        return self._baseline

    def set_baseline(self, record: GraphsRecord | None) -> None:
        self._baseline, self._baseline_read = record, True


class PerTestHooks:
    """This process's per-test hooks (a pytest plugin object, registered once torch appears, a test is marked or
    a test asks for its statistics): the recorder, the marked tests and the running test's start. Until torch is
    imported a test costs one lookup and one attribute here."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self.marked: dict[str, str] = {}  # node id -> "isolated" / "disabled" (pytest_collection_modifyitems)
        self.current: Start | None = None  # the running test's start, for the compile_cache_stats fixture
        self.isolation: Any = None  # the running marked test's isolation (a context manager), entered
        self.cold = COLD if recorder.explain else COLD_UNEXPLAINED  # Recorder.start before torch is imported

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        if self.marked or "torch" in _MODULES:
            self._start(nodeid)
        else:  # torch was looked up but is not imported (e.g. importorskip): one lookup, one attribute
            self.current = self.cold

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        if self.current is self.cold and self.isolation is None and "torch" not in _MODULES:
            self.recorder.cold_tests += 1  # Recorder.finish_cold, inlined: the test cannot have compiled
        else:
            self._finish(nodeid)

    def _start(self, nodeid: str) -> None:
        mode = self.marked.get(nodeid) if self.marked else None
        if mode is not None:
            from . import probe

            self.isolation = probe.isolated_compile(disable=mode == "disabled")
            self.isolation.__enter__()
        self.current = self.recorder.start()
        self.recorder.running = (nodeid, self.current)

    def _finish(self, nodeid: str) -> None:
        start, recorder, isolation = self.current, self.recorder, self.isolation
        if start is None:
            return
        self.current = recorder.running = None
        if isolation is not None:
            self.isolation = None
            isolation.__exit__(None, None, None)
        if isolation is not None or not recorder.finish_cold(start):
            recorder.finish(nodeid, start, intended=isolation is not None)
