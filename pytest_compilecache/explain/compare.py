"""Comparing a missed lookup with the most similar earlier one: what differs, in words a user can act on.

PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Any
from typing import Iterable
from typing import Mapping
from typing import Sequence

from .lookup import CODE
from .lookup import CONFIG_GROUPS
from .lookup import CONFIG_OPTION
from .lookup import GUARD
from .lookup import INPUT
from .lookup import MAX_REASONS
from .lookup import Code
from .lookup import GraphLookup

# --------------------------------------------------------------------------- comparing two lookups


def similarity(a: GraphLookup, b: GraphLookup) -> tuple[int, int, int, int, int]:
    """Sort key, higher is more similar: forward vs backward, then the same function of the user's
    (:attr:`GraphLookup.user_function`; at another line, next), then inference vs training, then the same graph
    code, then the number of equal components."""
    same = sum(1 for name, entry in a.components.items() if b.components.get(name, ("",))[0] == entry[0])
    code = a.components.get(CODE, ("a",))[0] == b.components.get(CODE, ("b",))[0]
    function = 2 if a.user_function and a.function == b.function else int(_moved(a, b))
    return (int(a.kind[0] == b.kind[0]), function, int(a.kind[1] == b.kind[1]), int(code), same)


def comparable(lookup: GraphLookup, earlier: GraphLookup) -> bool:
    """May ``lookup`` be compared with ``earlier`` at all? Never a forward graph with a backward one, and never a
    graph of one function of the user's with a graph of another function (torch's own frames included): only
    with a graph of that function (at any line: :attr:`GraphLookup.user_function_anywhere`) or of an unknown one
    (a record older than the field). A lookup of no known function (unknown, or torch's own frame) may be
    compared with any graph of its kind."""
    if lookup.kind[0] != earlier.kind[0]:
        return False
    return not lookup.user_function or not earlier.function or _moved(lookup, earlier)


def _moved(a: GraphLookup, b: GraphLookup) -> bool:
    return bool(a.user_function) and a.user_function_anywhere == b.user_function_anywhere


def most_similar(lookup: GraphLookup, candidates: Sequence[GraphLookup]) -> GraphLookup | None:
    """The :func:`comparable` candidate most similar to ``lookup`` (the first one on a tie), or None.

    A forward graph is never compared with a backward one, nor a function's graph with another function's; a
    training graph is compared with an inference one when nothing closer exists (a ``requires_grad`` change
    turns one into the other).
    """
    best: GraphLookup | None = None
    best_score: tuple[int, int, int, int, int] | None = None
    for cand in candidates:
        if not comparable(lookup, cand):
            continue
        score = similarity(lookup, cand)
        if best_score is None or score > best_score:
            best, best_score = cand, score
    return best


NEW_TEST = "new test"
NEW_GRAPH = "new graph in this test"
SAME_KEY = "same key as before: the entry was not in the cache (not saved, not restored, or evicted)"
GUARD_MISS = "same key, but the cached graph's shape guards failed (a dynamic size outside what it covers)"


_SYMBOL = re.compile(r"(?<![\w.])s\d+(?![\w.])")  # a size torch made symbolic: s0, s77


def symbolic_one_side(reason: str) -> bool:
    """Does ``reason`` (one of :func:`diff`'s input lines) show a size symbolic on one side and not on the other?

    ``input 5 shape [8] -> [s77, 3, s53, s0]``; ``input 2 ('s77',) -> dtype=float32;shape=[2, 3, 16, 16];...``
    (a symbolic size passed to the graph as an input of its own, where the other graph had a tensor)."""
    if not reason.startswith("input ") or " -> " not in reason:
        return False
    before, _, after = reason.partition(" -> ")
    return bool(_SYMBOL.search(before)) != bool(_SYMBOL.search(after))


def explain_miss(lookup: GraphLookup, candidates: Sequence[GraphLookup] | None) -> list[str]:
    """Why ``lookup`` missed, against the most similar of ``candidates`` (the same test's earlier lookups).

    ``candidates`` is None when the earlier run did not have this test at all (``new test``); an empty
    list, or no graph of the same kind, gives ``new graph in this test``.
    """
    if candidates is None:
        return [NEW_TEST]
    best = most_similar(lookup, candidates)
    if best is None:
        return [NEW_GRAPH]
    return diff(best, lookup)


def diff(old: GraphLookup, new: GraphLookup) -> list[str]:
    """The components that differ from ``old`` to ``new``, in words, most actionable first."""
    if old.key == new.key:
        return [GUARD_MISS if new.outcome == GUARD else SAME_KEY]
    inputs: list[str] = []
    code: list[str] = []
    config: list[str] = []
    other: list[str] = []
    toolchain: list[str] = []
    old_inputs = sum(1 for n in old.components if n.startswith(INPUT + "["))
    new_inputs = sum(1 for n in new.components if n.startswith(INPUT + "["))
    if old_inputs != new_inputs:
        inputs.append(f"number of graph inputs {old_inputs} -> {new_inputs}")
    options: list[str] = []
    config_changed = False
    for name in _ordered(set(old.components) | set(new.components)):
        before, after = old.components.get(name), new.components.get(name)
        if before is not None and after is not None and before[0] == after[0]:
            continue
        if name.startswith(CONFIG_OPTION):
            options.append(name[len(CONFIG_OPTION) :])
            continue
        if before is None or after is None:
            if name.startswith(INPUT + "[") or name in CONFIG_GROUPS:
                continue  # counted above / named through the options
            other.append(f"{_label(name)} {'added' if before is None else 'removed'}")
            continue
        if name.startswith(INPUT + "["):
            inputs.extend(_input_diff(name[len(INPUT) + 1 : -1], before[1], after[1]))
        elif name == CODE:
            code.append(_code_diff(before[1], after[1]))
        elif name in CONFIG_GROUPS:
            config_changed = True
        elif name in ("torch_version", "system_info") or name.startswith("system_info["):
            what = "torch version" if name == "torch_version" else "system (compiler, devices or drivers)"
            change = _change(before[1], after[1]) if name == "torch_version" else ""
            if change and before[1] == after[1]:
                what, change = "torch build (same version, other source)", ""
            if f"{what} changed" not in toolchain and not (change and f"{what} {change}" in toolchain):
                toolchain.append(f"{what} {change}" if change else f"{what} changed")
        else:
            change = _change(before[1], after[1])
            other.append(f"{_label(name)} {change}" if change else f"{_label(name)} changed")
    if before_kind := _grad_flip(old, new):
        # A training graph's forward takes detached inputs, so no input's requires_grad differs in the
        # key: the graph kind does, and the graph code with it (a consequence, not a second cause).
        inputs.insert(0, before_kind)
        code.clear()
        other = [line for line in other if not line.startswith("compile option is_inference ")]
    if config_changed:  # the digest decides; the names say what we can tell
        config.append("inductor config changed" + (": " + ", ".join(sorted(options)) if options else ""))
    reasons = inputs + code + config + other + toolchain
    if len(reasons) > MAX_REASONS:  # 300 inputs that all changed are one story: bounded in every output
        reasons = [*reasons[: MAX_REASONS - 1], f"... and {len(reasons) - MAX_REASONS + 1} more differences"]
    return reasons or ["key changed, but no recorded component differs (the record may be truncated)"]


def _grad_flip(old: GraphLookup, new: GraphLookup) -> str | None:
    before, after = old.kind[1], new.kind[1]
    if old.kind[0] != "False" or before == after or {before, after} != {"True", "False"}:
        return None
    if before == "True":
        return "requires_grad False -> True (an input or parameter now requires grad: a training graph)"
    return "requires_grad True -> False (nothing requires grad now, or no_grad: an inference graph)"


_ORDER = {INPUT: 0, CODE: 1}


_INPUT_INDEX = re.compile(r"[0-9]{1,9}\]\Z")  # ASCII digits only: "²".isdigit() is True, int("²") raises


def _ordered(names: Iterable[str]) -> list[str]:
    def rank(name: str) -> tuple[int, int, str]:
        attr, _, index = name.partition("[")
        number = int(index[:-1]) if attr == INPUT and _INPUT_INDEX.match(index) else 0
        return (_ORDER.get(attr, 2), number, name)

    return sorted(names, key=rank)


_LABELS = {
    "fx_kwargs": "compile option",
    "deterministic_algorithms_settings": "deterministic algorithms settings",
    "cuda_matmul_settings": "matmul precision settings",
    "default_dtype": "default dtype",
    "cpp_runtime_thread_count": "thread count",
    "user_defined_triton_source": "user Triton kernel source",
    "cache_key_tag": "cache key tag",
}


def _label(name: str) -> str:
    attr, _, index = name.partition("[")
    label = _LABELS.get(attr, attr.strip("_").replace("_", " "))
    return f"{label} {index[:-1]}" if index else label


def _change(before: str | None, after: str | None) -> str:
    if before is None or after is None or len(before) + len(after) > 120:
        return ""
    return f"{before} -> {after}"


def _input_diff(index: str, before: str | None, after: str | None) -> list[str]:
    if before is None or after is None:
        return [f"input {index} changed"]
    old, new = _fields(before), _fields(after)
    if not old or not new:  # a tensor on one side at most: e.g. a size made symbolic, passed as an input itself
        change = _change(before, after) or _change(_brief(before, old), _brief(after, new))
        return [f"input {index} {change}" if change else f"input {index} changed"]
    out = [f"input {index} {name} {old.get(name, '-')} -> {new.get(name, '-')}" for name in _union(old, new)]
    if old.get("shape") != new.get("shape"):
        out = [line for line in out if " stride " not in line]  # a new shape implies new strides
    return out or [f"input {index} changed"]


def _brief(value: str, fields: Mapping[str, str]) -> str:
    """A tensor input by its dtype and shape alone (``tensor float32 [2, 3, 16, 16]``), any other as it is."""
    return f"tensor {fields.get('dtype', '?')} {fields['shape']}" if "shape" in fields else value


def _fields(value: str) -> dict[str, str]:
    if "=" not in value:
        return {}
    return dict(part.split("=", 1) for part in value.split(";") if "=" in part)


def _union(old: Mapping[str, str], new: Mapping[str, str]) -> list[str]:
    names = list(old) + [n for n in new if n not in old]
    return [n for n in names if old.get(n) != new.get(n)]


CONSTANT = "a constant in graph statement"


def _code_diff(before: str | None, after: str | None) -> str:
    """What changed in the graph code, in one bounded line.

    Only constants: ``graph code changed: a constant in graph statement 4 (0.89 -> 0.43; mod.py:12)``.
    Otherwise how many statements were added, removed or changed, and the first that differs:
    ``graph code changed: 2 statements differ (1 added, 1 changed); first at statement 3: relu = aten.relu(mul)``.
    """
    if before is None or after is None:
        return "graph code changed"
    old, new = Code(before), Code(after)
    changed = constant_statements(old, new)
    if changed:
        return f"graph code changed: {constant_what(changed)}{_constant_detail(old, new, changed[0])}"
    return "graph code changed" + _structure_detail(old, new)


def constant_statements(old: Code, new: Code) -> list[int]:
    """The statements (0-based) whose literals alone differ, when nothing else in the code differs; else []."""
    if len(old.tokens) != len(new.tokens):
        return []
    changed = [i for i, (a, b) in enumerate(zip(old.tokens, new.tokens)) if a != b]
    return changed if all(old.tokens[i][:4] == new.tokens[i][:4] for i in changed) else []


def constant_what(changed: Sequence[int]) -> str:
    return f"{CONSTANT} {', '.join(str(i + 1) for i in changed[:5])}"


def _constant_detail(old: Code, new: Code, index: int) -> str:
    """`` (0.89 -> 0.43; mod.py:12)``: the first changed statement's differing literals and its source."""
    before, after = old.literals(index), new.literals(index)
    values = "; ".join(f"{a[:24]} -> {b[:24]}" for a, b in zip(before, after) if a != b)
    if len(before) != len(after) or len(values) > 120:
        values = ""
    where = new.texts[index][0][:70] if index < len(new.texts) else ""
    parts = [part for part in (values, where) if part]
    return f" ({'; '.join(parts)})" if parts else ""


def _structure_detail(old: Code, new: Code) -> str:
    if not old.tokens and not new.tokens:
        return ""
    matcher = difflib.SequenceMatcher(None, old.tokens, new.tokens, autojunk=False)
    added = removed = changed = 0
    first: tuple[str, int, int] | None = None
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        changed += min(i2 - i1, j2 - j1)
        added += max(0, (j2 - j1) - (i2 - i1))
        removed += max(0, (i2 - i1) - (j2 - j1))
        first = first or (tag, i1, j1)
    if first is None:
        return ""
    total = added + removed + changed
    counts = ", ".join(f"{n} {word}" for n, word in ((added, "added"), (removed, "removed"), (changed, "changed")) if n)
    kind, i, j = first
    if kind == "delete":
        text = old.text(i)
        where = f"first at statement {i + 1} (removed)" + (f": {text}" if text else "")
    else:
        text = new.text(j)
        where = f"first at statement {j + 1}" + (f": {text}" if text else "")
    return f": {total} statement{'s differ' if total != 1 else ' differs'} ({counts}); {where}"


# --------------------------------------------------------------------------- one test, many lookups


def merged(misses: Sequence[MissExplanation]) -> list[str]:
    """One text per distinct set of reasons of a test's misses, naming the graphs that share it:
    ``gelu (t.py:12), 2 graphs (inputs [4]; [8]): graph code changed: a constant in graph statement 6 (1.75 -> 2.0)``
    (each shape's graph missed for the same reason: said once)."""
    groups: dict[tuple[str, ...], list[MissExplanation]] = {}
    for miss in misses:
        groups.setdefault(tuple(miss.reasons), []).append(miss)
    out = []
    for reasons, group in groups.items():
        functions = ", ".join(dict.fromkeys(m.function for m in group if m.function))
        inputs = "; ".join(dict.fromkeys(m.inputs for m in group if m.inputs))
        which = f"{len(group)} graphs" + (f" (inputs {inputs})" if inputs else "") if len(group) > 1 else ""
        which = which or (f"inputs {inputs}" if inputs and functions else "")  # a lone graph: with its function
        head = ", ".join(part for part in (functions, which) if part)
        out.append(f"{head}: {'; '.join(reasons)}" if head else "; ".join(reasons))
    return out


@dataclass
class MissExplanation:
    """Why one missed lookup of a test missed, and which graph it was: the compiled ``function``
    (:attr:`GraphLookup.function`) and the shapes of its tensor ``inputs`` (:attr:`GraphLookup.inputs`), "" unknown."""

    key: str
    reasons: list[str]
    function: str = ""
    inputs: str = ""

    @classmethod
    def of(cls, lookup: GraphLookup, reasons: list[str]) -> MissExplanation:
        return cls(lookup.key, reasons, lookup.function, lookup.inputs)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"key": self.key, "reasons": list(self.reasons)}
        out.update({name: value for name, value in (("function", self.function), ("inputs", self.inputs)) if value})
        return out

    @classmethod
    def from_json(cls, data: Any) -> MissExplanation:
        """Parse :meth:`to_json` output (e.g. from a JSON report); ValueError for any other shape."""
        if not isinstance(data, Mapping) or not isinstance(data.get("key"), str):
            raise ValueError(f"not a miss explanation: {data!r:.80}")
        reasons = data.get("reasons", [])
        if not isinstance(reasons, list):
            raise ValueError(f"reasons must be a list: {reasons!r:.80}")
        function, inputs = (str(data.get(name) or "")[:300] for name in ("function", "inputs"))
        return cls(data["key"], [str(reason) for reason in reasons], function, inputs)


def explain_test(current: Sequence[GraphLookup], previous: Sequence[GraphLookup] | None) -> list[MissExplanation]:
    """Explain every miss among ``current`` against ``previous``: the same test's earlier lookups, and other tests'
    earlier graphs of the functions it compiled that it had no graph of (:func:`~.session.earlier_graphs`).

    A miss whose key an earlier graph has is that graph (its entry was not in the cache, or its guards
    failed), whatever else the test compiled. Earlier graphs matched exactly by a current lookup (same key) are
    set aside first, so each other miss is compared with a graph that this run did not already account for.
    A graph missed more than once (each worker of ``--dist each`` runs the test, and merges its lookups into
    the same test's) is explained once.
    A miss of a function of the user's is compared with earlier graphs of that function only (:func:`comparable`);
    a miss of no known function, with the earlier graphs of no function the test's lookups name: those are
    their own function's, and another test's graphs are never of anything else.
    """
    once: dict[str, GraphLookup] = {}
    for lookup in current:
        if lookup.outcome != "hit":
            once.setdefault(lookup.key, lookup)
    misses = list(once.values())
    if not misses:
        return []
    if previous is None:
        return [MissExplanation.of(m, [NEW_TEST]) for m in misses]
    keys = {lookup.key for lookup in current}
    named = {lookup.user_function_anywhere for lookup in current} - {""}
    left = [p for p in previous if p.key not in keys]
    earlier_keys = {p.key for p in previous}
    out = []
    for miss in misses:
        if miss.key in earlier_keys:  # the very graph of an earlier run: no other graph explains it better
            out.append(MissExplanation.of(miss, [GUARD_MISS if miss.outcome == GUARD else SAME_KEY]))
            continue
        pool = left if miss.user_function else [p for p in left if p.user_function_anywhere not in named]
        best = most_similar(miss, pool)
        if best is None:
            out.append(MissExplanation.of(miss, [NEW_GRAPH]))
            continue
        left.remove(best)
        out.append(MissExplanation.of(miss, diff(best, miss)))
    return out


# A one-time edit of a constant changes a statement once; flagging a test as never hitting needs evidence an
