"""A whole session explained, and the entry points the session calls, which never raise.

PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any
from typing import Mapping
from typing import Sequence

from .compare import MissExplanation
from .compare import explain_test
from .compare import symbolic_one_side
from .history import NO_STREAK
from .history import GraphsRecord
from .history import carry_forward
from .history import constant_change
from .history import install_restored
from .history import load_record
from .lookup import GraphLookup


@dataclass
class SessionExplanation:
    """Every miss of a session explained, the tests flagged as never hitting, and the tests that ran a
    training graph's forward without its backward (their AOTAutograd lookups miss every run: torch saves
    an AOTAutograd entry only once the backward is compiled)."""

    misses: dict[str, list[MissExplanation]] = field(default_factory=dict)
    # nodeid -> (what changed, in how many runs in a row, this run included): 3 or more.
    never_hit: dict[str, tuple[str, int]] = field(default_factory=dict)
    compared_with: str = ""  # "bundle", "previous session" or "" (nothing to compare with)
    forward_only: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "compared_with": self.compared_with or None,
            "misses": {k: [m.to_json() for m in v] for k, v in self.misses.items()},
            "never_hit": {k: {"what": what, "runs": runs} for k, (what, runs) in self.never_hit.items()},
            "forward_only": list(self.forward_only),
        }

    @classmethod
    def from_json(cls, data: Any) -> SessionExplanation:
        """Parse :meth:`to_json` output (the JSON report's top-level ``why``); ValueError for any other shape."""
        if not isinstance(data, Mapping):
            raise ValueError(f"why must be an object: {data!r:.80}")
        compared_with, misses, never_hit = data.get("compared_with"), data.get("misses", {}), data.get("never_hit", {})
        if not isinstance(compared_with, (str, type(None))) or not isinstance(misses, Mapping):
            raise ValueError("why: compared_with must be a string and misses an object")
        if not isinstance(never_hit, Mapping):
            raise ValueError("why: never_hit must be an object")
        out = cls(compared_with=compared_with or "")
        for nodeid, items in misses.items():
            if not isinstance(items, list):
                raise ValueError(f"why: the misses of {nodeid!r:.80} must be a list")
            out.misses[str(nodeid)] = [MissExplanation.from_json(item) for item in items]
        for nodeid, flag in never_hit.items():
            what, runs = (flag.get("what"), flag.get("runs")) if isinstance(flag, Mapping) else (None, None)
            if not isinstance(what, str) or type(runs) is not int:
                raise ValueError(f"why: never_hit of {nodeid!r:.80} must be {{what: str, runs: int}}")
            out.never_hit[str(nodeid)] = (what, runs)
        forward_only = data.get("forward_only", [])
        if not isinstance(forward_only, list) or not all(isinstance(n, str) for n in forward_only):
            raise ValueError("why: forward_only must be a list of test ids")
        out.forward_only = list(forward_only)
        return out


def explain_session(
    current: Mapping[str, Sequence[GraphLookup]],
    previous: GraphsRecord | None,
    compared_with: str = "",
    now: float | None = None,
    aot_misses: Mapping[str, int] | None = None,
) -> tuple[SessionExplanation, GraphsRecord]:
    """Explain this session's misses against ``previous`` and build the record the next run compares with.

    Returns the explanation and the new record (this session's graphs, with the ``volatile`` streaks
    updated, made at ``now``, by default the current time). Without ``previous`` nothing is explained (a
    first run has nothing to compare with). ``aot_misses`` (AOTAutograd misses per test), when given,
    keeps out of ``forward_only`` the tests whose AOTAutograd lookups hit (another test ran the backward).
    """
    out = SessionExplanation(compared_with=compared_with if previous is not None else "")
    created = time.time() if now is None else now
    record = GraphsRecord(tests={k: list(v) for k, v in current.items() if v}, created=created)
    out.forward_only = sorted(
        nodeid
        for nodeid, lookups in current.items()
        if _forward_only(lookups) and (aot_misses is None or aot_misses.get(nodeid, 0) > 0)
    )
    by_function = graphs_by_function(previous) if previous is not None else {}
    for nodeid, lookups in current.items():
        if previous is None or not lookups:
            continue
        earlier = previous.tests.get(nodeid)
        explained = explain_test(lookups, earlier_graphs(previous, nodeid, lookups, by_function))
        if explained:
            out.misses[nodeid] = explained
        if earlier is None:
            continue
        streak = previous.volatile.get(nodeid, NO_STREAK).then(constant_change(earlier, lookups))
        if streak is None:
            continue
        record.volatile[nodeid] = streak
        if streak.evident:
            out.never_hit[nodeid] = (streak.what, streak.changes + 1)
        elif streak.came_back:
            _say_it_came_back(explained, streak.what)
    return out, record


def earlier_graphs(
    previous: GraphsRecord,
    nodeid: str,
    lookups: Sequence[GraphLookup],
    by_function: Mapping[str, Sequence[GraphLookup]] | None = None,
) -> list[GraphLookup] | None:
    """What ``nodeid``'s ``lookups`` are compared with: its own graphs of the earlier run and, for each function of
    the user's it compiled and has no earlier graph of (at any line), other tests' earlier graphs of that function
    (the test that compiles a shared function first pays the lookup, and which one that is depends on the tests
    selected and on xdist); None when there is neither (a new test). :func:`~.compare.explain_test` compares a
    miss of a function with that function's graphs only. ``by_function`` (:func:`graphs_by_function` of
    ``previous``) saves a session explaining many tests from reading the whole record for each. The session's
    report and the ``compile_cache_stats`` fixture (while the test runs) both ask this, so both say the same."""
    own = previous.tests.get(nodeid)
    have = {lookup.user_function_anywhere for lookup in own or ()}
    wanted = [g.user_function for g in lookups if g.user_function and g.user_function_anywhere not in have]
    if wanted and by_function is None:
        by_function = graphs_by_function(previous)
    borrowed = [graph for function in dict.fromkeys(wanted) for graph in (by_function or {}).get(function, ())]
    return [*own, *borrowed] if own is not None else borrowed or None


def graphs_by_function(previous: GraphsRecord) -> dict[str, list[GraphLookup]]:
    """The earlier run's graphs by the function of the user's they are of (:attr:`GraphLookup.user_function`):
    torch's own frames (every compiled module's wrapper, ``TORCH_FRAME``) are no function, never matched across
    tests."""
    out: dict[str, list[GraphLookup]] = {}
    for graphs in previous.tests.values():
        for lookup in graphs:
            if lookup.user_function:
                out.setdefault(lookup.function, []).append(lookup)
    return out


CAME_BACK = (
    "back to the value of an earlier run: that graph was compiled then but is not in this cache (a bundle holds "
    "the graphs its own run used); it hits from the next run on, while the value stays"
)


def _say_it_came_back(explained: list[MissExplanation], what: str) -> None:
    """Add :data:`CAME_BACK` to each miss whose constant came back (an edit and its revert): every graph
    of the test that holds it (one per shape) says the same, and is said once."""
    for miss in explained:
        if changed_by(miss, what):
            miss.reasons.append(CAME_BACK)


def changed_by(miss: MissExplanation, what: str) -> bool:
    """True when ``miss`` says its graph code changed in ``what`` (a streak's ``a constant in graph statement 1``):
    "statement 1" is not "statement 12", so the reason must end there or go on with " (".
    """
    said = "graph code changed: " + what
    return any(reason == said or reason.startswith(said + " (") for reason in miss.reasons)


def _forward_only(lookups: Sequence[GraphLookup]) -> bool:
    """A training graph's forward looked up, and no backward graph: the backward never ran in this test."""
    kinds = {lookup.kind for lookup in lookups}
    return ("False", "False") in kinds and not any(backward == "True" for backward, _ in kinds)


def order_dependent_tests(why: SessionExplanation) -> list[str]:
    """Tests with a miss whose graph differs from the earlier one in which sizes are symbolic.

    torch compiles a function for the sizes of its first call and again, with a symbolic size, once the same
    process meets a second size; so such a miss usually comes from the tests that ran before it in that process
    (xdist's order, a random order), which ``--compile-cache-pgo`` makes irrelevant. A test newly marked dynamic
    looks the same: callers say "usually"."""
    return sorted(
        nodeid
        for nodeid, misses in why.misses.items()
        if nodeid not in why.never_hit and any(symbolic_one_side(r) for miss in misses for r in miss.reasons)
    )


# --------------------------------------------------------------------------- what the session calls: never raises
# Nothing in explaining may fail a session: records come from bundles and from a shared dir, and a
# bug met on one of them would otherwise repeat in every run until someone removed it. Each entry point below
# turns any exception into one warning line and carries on without explanations.


def _trouble(what: str, exc: BaseException) -> str:
    expected = isinstance(exc, (OSError, ValueError)) and type(exc) is not UnicodeDecodeError and str(exc)
    return (f"{what}: {exc}" if expected else f"{what}: {type(exc).__name__}: {exc}")[:500]


def explain_test_safely(
    current: Sequence[GraphLookup], previous: Sequence[GraphLookup] | None
) -> list[MissExplanation]:
    """:func:`explain_test` for the ``compile_cache_stats`` fixture: no explanations rather than an exception
    in the user's test (the controller's :func:`explain_session_safely` warns once at the end)."""
    try:
        return explain_test(current, previous)
    except Exception:  # noqa: BLE001 -- see above
        return []


def explain_session_safely(
    current: Mapping[str, Sequence[GraphLookup]],
    previous: GraphsRecord | None,
    compared_with: str = "",
    aot_misses: Mapping[str, int] | None = None,
) -> tuple[SessionExplanation | None, GraphsRecord | None, str | None]:
    """:func:`explain_session` then :func:`carry_forward`: ``(explanation, record to keep, warning)``.

    Never raises. When explaining fails, the explanation is None and the record is this session's graphs
    alone (so a record that broke explaining is replaced, not kept for the next run), with one warning line.
    """
    try:
        why, record = explain_session(current, previous, compared_with, aot_misses=aot_misses)
        return why, carry_forward(record, previous), None
    except Exception as exc:  # noqa: BLE001 -- see above
        warning = _trouble("no miss explanations this session", exc)
    try:
        return None, explain_session(current, None)[1], warning
    except Exception:  # noqa: BLE001 -- see above
        return None, None, warning


def read_baseline(cache_dir: Path, graphs: Mapping[str, Any] | None) -> tuple[GraphsRecord | None, str | None]:
    """The record this session's misses are explained against: ``(record or None, warning or None)``.

    ``graphs`` is a restored bundle's record (installed into ``cache_dir`` for every process to read); without
    one, the dir's record. Never raises: a record that cannot be read or installed is one warning.
    """
    try:
        if graphs:
            return install_restored(cache_dir, graphs), None
        return load_record(cache_dir), None
    except Exception as exc:  # noqa: BLE001 -- see above
        where = "of the restored bundle" if graphs else "in the cache dir"
        return None, _trouble(f"no miss explanations: the graph record {where} is unreadable", exc)
