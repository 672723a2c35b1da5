"""A session's graphs, kept for the next run (bounded), and the streaks that say a test can never hit.

PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from dataclasses import field
from dataclasses import replace
from pathlib import Path
from typing import Any
from typing import Iterable
from typing import Mapping
from typing import Sequence

from .._fs import atomic_file
from .compare import CONSTANT
from .compare import constant_statements
from .compare import constant_what
from .compare import diff
from .compare import most_similar
from .lookup import CODE
from .lookup import FORMAT
from .lookup import MAX_COMPONENTS
from .lookup import MAX_LOOKUPS_PER_TEST
from .lookup import MAX_RECORD_BYTES
from .lookup import RECORD_NAME
from .lookup import Code
from .lookup import GraphLookup

# A test can never hit when its graph changes by itself, as no edit does: the same statement takes a new value in
# this many consecutive runs, none seen before (a value that comes back is an edit and its revert).
NEVER_HIT_CHANGES = 3
SEEN_VALUES = 8  # values of the changing statement remembered, to see it change back


@dataclass(frozen=True)
class Streak:
    """How one test's graph changed in consecutive runs: ``what`` changed (``a constant in graph statement 4``)
    ``changes`` times in a row, taking the values (literal hashes) in ``seen``, oldest first."""

    what: str
    changes: int
    seen: tuple[str, ...] = ()

    def then(self, change: tuple[str, str, str] | None) -> Streak | None:
        """This streak after one more run: ``change`` is (what, old value, new value), None when it did not."""
        if change is None:
            return None
        what, old, new = change
        if what == self.what and self.seen[-1:] == (old,):
            return Streak(what, self.changes + 1, (*self.seen, new)[-SEEN_VALUES:])
        return Streak(what, 1, (old, new))

    @property
    def came_back(self) -> bool:
        """The last run's value is one an earlier run of the streak had: an edit and its revert, most often."""
        return len(self.seen) >= 3 and self.seen[-1] in self.seen[:-2]

    @property
    def evident(self) -> bool:
        """True when no edit explains it: a new value in each of many runs in a row. A value that comes back
        is what an edit and its revert look like: values that change by themselves (unseeded random
        numbers, timestamps, temp paths) do not repeat."""
        return self.changes >= NEVER_HIT_CHANGES and len(set(self.seen)) == len(self.seen)


NO_STREAK = Streak("", 0)


def constant_change(before: Sequence[GraphLookup], after: Sequence[GraphLookup]) -> tuple[str, str, str] | None:
    """When a run's misses differ from the run before only by a constant in the graph code: (what, the
    statement's old value, its new value), values as literal hashes; else None (no miss, or another change)."""
    misses = [lookup for lookup in after if lookup.outcome != "hit"]
    for miss in misses:
        best = most_similar(miss, before)
        if best is None or best.key == miss.key:
            continue
        reasons = diff(best, miss)
        old, new = best.value(CODE), miss.value(CODE)
        if len(reasons) != 1 or not reasons[0].startswith("graph code changed: " + CONSTANT) or not old or not new:
            continue
        old_code, new_code = Code(old), Code(new)
        changed = constant_statements(old_code, new_code)
        if changed:
            first = changed[0]
            return constant_what(changed), old_code.tokens[first][4:], new_code.tokens[first][4:]
    return None


def never_hits(history: Sequence[Sequence[GraphLookup]]) -> str | None:
    """The statement whose constant keeps changing in a test's runs (``history``, oldest first), or None.

    A test is flagged when its misses differ from the run before only by a constant baked into the graph
    code, in the same statement, with a value never seen before, in at least ``NEVER_HIT_CHANGES`` consecutive
    runs (unseeded random numbers, a timestamp, a temp path): such a test can never hit, whatever is cached.
    One edit of a constant (``4.0`` -> ``4.25``) is not enough, and a value that comes back (a revert) is no
    such streak."""
    streak: Streak | None = None
    for before, after in zip(history, history[1:]):
        streak = (streak or NO_STREAK).then(constant_change(before, after))
    return streak.what if streak is not None and streak.evident else None


# --------------------------------------------------------------------------- a session's graphs, bounded


@dataclass
class GraphsRecord:
    """The graphs each test looked up in one run, and how many runs in a row a constant changed.

    Kept in a bundle manifest's ``graphs`` field and in ``<cache dir>/.compilecache-graphs.json``.
    ``volatile`` maps a test to its :class:`Streak` (``[what changed, changes in a row, values seen]``):
    the memory ``never_hits`` needs without keeping whole histories. ``created`` is when the session that
    made it ended (Unix time; 0 for a record older than the field): of a restored bundle's record and the
    cache dir's, the newer one is the baseline (:func:`install_restored`). ``from_bundle``: the dir's record
    is a restored bundle's. ``selection``: how the session that saved the bundle this record goes with selected
    its tests (a short hash, :meth:`.selection.Where.signature`; "" when not known), and ``selected_at`` when
    that session made its record (0: not known): a later session that selects alike may replace the bundle.
    """

    tests: dict[str, list[GraphLookup]] = field(default_factory=dict)
    volatile: dict[str, Streak] = field(default_factory=dict)
    torch: str = ""
    truncated: int = 0
    created: float = 0.0
    from_bundle: bool = False
    selection: str = ""
    selected_at: float = 0.0

    @property
    def saved_at(self) -> float:
        """When the session whose ``selection`` this record keeps made its record (a record from before
        ``selected_at``: when it was made)."""
        return self.selected_at or self.created

    def to_json(self, max_bytes: int = MAX_RECORD_BYTES) -> dict[str, Any]:
        """Bounded: at most ``MAX_LOOKUPS_PER_TEST`` lookups per test, about ``max_bytes`` in all and
        ``MAX_COMPONENTS`` components once read back (:meth:`from_json` refuses more).

        Tests past the byte budget are left out (``truncated`` counts them): their next miss reads
        ``new test``, which is honest about what we kept.
        """
        tests: dict[str, Any] = {}
        common = _common(g for lookups in self.tests.values() for g in lookups[:MAX_LOOKUPS_PER_TEST])
        size = 200 + len(json.dumps(common))
        components = 0
        dropped = self.truncated
        for nodeid in sorted(self.tests):
            entry = [_without(g.to_json(), common) for g in self.tests[nodeid][:MAX_LOOKUPS_PER_TEST]]
            cost = len(json.dumps(entry, separators=(",", ":"))) + len(nodeid) + 8
            count = sum(len(common) + len(e["c"]) for e in entry)
            if size + cost > max_bytes or components + count > MAX_COMPONENTS:
                dropped += 1
                continue
            size += cost
            components += count
            tests[nodeid] = entry
        volatile = {k: [v.what, v.changes, list(v.seen)] for k, v in self.volatile.items() if k in tests}
        return {
            "format": FORMAT,
            "torch": self.torch,
            "created": self.created,
            **({"from_bundle": True} if self.from_bundle else {}),
            **({"selection": self.selection} if self.selection else {}),
            **({"selected_at": self.selected_at} if self.selected_at else {}),
            "common": common,
            "tests": tests,
            "volatile": volatile,
            "truncated": dropped,
        }

    @classmethod
    def from_json(cls, data: Any) -> GraphsRecord:
        """Read :meth:`to_json`'s form; raises ValueError on anything malformed (a bundle may be hostile).

        Memory stays proportional to ``MAX_COMPONENTS``: a record whose lookups would hold more components
        (the ``common`` ones counted in every lookup) is refused, and the common values are parsed once and
        shared by every lookup rather than copied. ValueError is the only exception, whatever ``data`` is.
        """
        try:
            return cls._from_json(data)
        except ValueError:
            raise
        except Exception as exc:  # noqa: BLE001 -- a reader of hostile data: any surprise is a malformed record
            raise ValueError(f"graphs record: {type(exc).__name__}: {exc}"[:300]) from exc

    @classmethod
    def _from_json(cls, data: Any) -> GraphsRecord:
        if not isinstance(data, Mapping) or data.get("format") != FORMAT:
            raise ValueError("graphs record: unknown format")
        tests_in, volatile_in = data.get("tests", {}), data.get("volatile", {})
        if not isinstance(tests_in, Mapping) or not isinstance(volatile_in, Mapping):
            raise ValueError("graphs record: bad tests or volatile")
        common = data.get("common", {})
        if not isinstance(common, Mapping):
            raise ValueError("graphs record: bad common components")
        for nodeid, entries in tests_in.items():
            if not isinstance(entries, list) or not all(
                isinstance(e, Mapping) and isinstance(e.get("c", {}), Mapping) for e in entries
            ):
                raise ValueError(f"graphs record: bad entry for {nodeid!r:.80}")
        # Counted before anything is built: memory is bounded by MAX_COMPONENTS, whatever the record says.
        expanded = sum(
            len(common) + len(e.get("c", {})) for entries in tests_in.values() for e in entries[:MAX_LOOKUPS_PER_TEST]
        )
        if expanded > MAX_COMPONENTS:
            raise ValueError(f"graphs record: {expanded} components in its lookups, more than {MAX_COMPONENTS}")
        shared = GraphLookup.from_json({"k": "", "o": "hit", "c": common}).components  # parsed once, shared
        tests: dict[str, list[GraphLookup]] = {}
        for nodeid, entries in tests_in.items():
            lookups = []
            for e in entries[:MAX_LOOKUPS_PER_TEST]:
                lookup = GraphLookup.from_json(e)
                lookup.components = {**shared, **lookup.components}
                lookups.append(lookup)
            tests[str(nodeid)] = lookups
        volatile: dict[str, Streak] = {}
        for nodeid, entry in volatile_in.items():
            if not isinstance(entry, list) or len(entry) not in (2, 3) or not isinstance(entry[0], str):
                continue
            seen = entry[2] if len(entry) == 3 and isinstance(entry[2], list) else []
            if type(entry[1]) is int and 0 < entry[1] <= 10**6 and all(isinstance(v, str) for v in seen):
                volatile[str(nodeid)] = Streak(entry[0][:200], entry[1], tuple(v[:16] for v in seen[-SEEN_VALUES:]))
        truncated, torch, created = data.get("truncated", 0), data.get("torch", ""), data.get("created", 0)
        selection, selected_at = data.get("selection", ""), _seconds(data.get("selected_at", 0))
        created = _seconds(created)
        return cls(
            tests,
            volatile,
            torch if isinstance(torch, str) else "",
            truncated if type(truncated) is int else 0,
            float(created),
            data.get("from_bundle") is True,
            selection[:64] if isinstance(selection, str) else "",
            float(selected_at),
        )


def _seconds(value: Any) -> float:
    """A Unix time read from a record: 0.0 unless a finite number (an integer too large for a float too)."""
    if type(value) not in (int, float):
        return 0.0
    try:
        return float(value) if math.isfinite(value) else 0.0
    except OverflowError:
        return 0.0


def _common(lookups: Iterable[GraphLookup]) -> dict[str, Any]:
    """Components equal in every lookup (custom passes, system, torch version...): stored once per record."""
    common: dict[str, Any] | None = None
    for lookup in lookups:
        comps = lookup.to_json()["c"]
        common = dict(comps) if common is None else {k: v for k, v in common.items() if comps.get(k) == v}
    return common or {}


def _without(entry: dict[str, Any], common: Mapping[str, Any]) -> dict[str, Any]:
    return {**entry, "c": {k: v for k, v in entry["c"].items() if k not in common}}


def carry_forward(record: GraphsRecord, previous: GraphsRecord | None) -> GraphsRecord:
    """Keep ``previous``'s graphs of the tests this session did not run (a ``-k`` run forgets nothing)."""
    if previous is None:
        return record
    for nodeid, lookups in previous.tests.items():
        if nodeid not in record.tests:
            record.tests[nodeid] = lookups
            if nodeid in previous.volatile:
                record.volatile[nodeid] = previous.volatile[nodeid]
    return record


def load_record(cache_dir: Path) -> GraphsRecord | None:
    """The previous session's record in ``cache_dir``; None when absent. Raises ValueError/OSError when unreadable."""
    path = Path(cache_dir) / RECORD_NAME
    if not path.is_file() or path.is_symlink():
        return None
    if path.stat().st_size > MAX_RECORD_BYTES * 2:
        raise ValueError(f"{path} is larger than {MAX_RECORD_BYTES * 2} bytes")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except RecursionError as exc:  # deeply nested JSON: anyone can write this file
        raise ValueError(f"{path} is nested too deeply") from exc
    return GraphsRecord.from_json(data)


def save_record(cache_dir: Path, record: GraphsRecord) -> Path:
    """Write ``record`` to ``<cache_dir>/.compilecache-graphs.json`` atomically (readers see old or new)."""
    path = Path(cache_dir) / RECORD_NAME
    data = json.dumps(record.to_json(), separators=(",", ":"), sort_keys=True).encode("utf-8")
    with atomic_file(path, fsync=False) as fh:
        fh.write(data)
    return path


def install_restored(cache_dir: Path, graphs: Mapping[str, Any]) -> GraphsRecord:
    """Make the newer of a restored bundle's verified ``graphs`` and ``cache_dir``'s record the dir's record,
    for every process to read, and return it.

    The newer one (by ``created``; the bundle's on a tie) is kept whole and the other adds only the tests it
    lacks: a shared dir whose last session compiled after the bundle was made keeps explaining against that
    session (a ``-k`` session restored an older bundle, and the next run compared with it). An
    unreadable dir record is replaced. Raises ValueError (malformed record: the bundle may be hostile) or
    OSError; the dir is then as it was.
    """
    bundle = GraphsRecord.from_json(graphs)
    try:
        local = load_record(cache_dir)
    except (OSError, ValueError):
        local = None
    if local is not None and local.created > bundle.created:
        # The dir's record is newer (a session here compiled since), but the bundle is what was restored: how
        # its session selected is what a save would replace.
        record = replace(carry_forward(local, bundle), selection=bundle.selection, selected_at=bundle.saved_at)
    else:
        bundle.from_bundle = True
        record = carry_forward(bundle, local)
    save_record(cache_dir, record)
    return record
