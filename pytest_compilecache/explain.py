"""Why a test's FX graph missed: per-lookup components, their diff in words, and tests that can never hit.

torch computes every FX-graph cache key from named components and hands them to
``FxGraphCache.load_with_key`` as ``debug_lines``, one per component:
``[<hash>] <attr>[<index>]: <readable value>`` (the graph module's code, each example input's tensor
metadata, the compile kwargs, every inductor config option, torch version, system info...). ``probe``
captures them per lookup; this module, pure and torch-free, turns them into a compact
:class:`GraphLookup`, compares a missed lookup with the most similar graph the same test looked up
in an earlier run, and says what differs in words a user can act on.

Everything here round-trips through bounded JSON: lookups travel from xdist workers on test reports,
into a bundle's manifest (``graphs``) and into ``<cache dir>/.compilecache-graphs.json``.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import re
import time
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any
from typing import Iterable
from typing import Mapping
from typing import Sequence

from ._fs import atomic_file

RECORD_NAME = ".compilecache-graphs.json"
FORMAT = 1

HASH_CHARS = 12  # 60 bits of torch's base32 component hashes: plenty to tell two values apart
VALUE_CHARS = 160  # a readable value longer than this is kept as a hash only
VALUES_PER_LOOKUP = 4000  # readable characters kept per lookup; the hashes are always kept
MAX_LOOKUPS_PER_TEST = 32
MAX_RECORD_BYTES = 2_000_000
# Components across a record's lookups once each carries the record's ``common`` ones too: what reading a
# record costs in memory (~100 bytes each, the value strings shared). A record over it is refused (issue 28.1:
# a 2.4 MB record of 8 tests expanded to 3.6 GB when every lookup copied 100,000 common components).
MAX_COMPONENTS = 200_000
MAX_GRAPH_LINES = 400  # graph code longer than this keeps its hash, not its per-line signature
CODE_TEXT_CHARS = 1500  # statement text kept per graph, from its start, to say what changed (issue 29.11)
STATEMENT_CHARS = 100  # one statement's text at most, in the record and in every reason
MAX_REASONS = 10  # reasons per miss, the last one counting the rest

GUARD = "guard_miss"  # the key was in the cache, its guards rejected this call (torch 2.13+ says so)
OUTCOMES = ("hit", "miss", GUARD)
CODE = "gm"
CONFIG_GROUPS = ("inductor_config", "inductor_config_comms")
CONFIG_OPTION = "inductor_config."  # prefix of the non-default inductor options kept by name
INPUT = "example_inputs"

_NAME = re.compile(r"[A-Za-z_][\w.]*(?:\[[^\]]*\])?\Z")
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_LITERAL = re.compile(r"'[^']*'|\"[^\"]*\"|(?<![\w.])-?\d+(?:\.\d*)?(?:e[-+]?\d+)?(?![\w])")


def _short(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()[:HASH_CHARS]


# --------------------------------------------------------------------------- the data model


@dataclass
class GraphLookup:
    """One FX-graph cache lookup: its key, ``hit``, ``miss`` or ``guard_miss``, and the key's components.

    ``components`` maps a component name (``gm``, ``example_inputs[2]``, ``fx_kwargs[is_backward]``,
    ``inductor_config``, ``inductor_config.max_autotune``, ``torch_version``...) to ``(hash, value)``:
    the hash decides equality; ``value`` is a short readable form, or None when it was large or
    unreadable. The inductor config is one digest plus, by name, only the options not at their
    default. Graph code keeps a per-line signature so a changed constant can be told from a changed
    graph.
    """

    key: str
    outcome: str
    components: dict[str, tuple[str, str | None]] = field(default_factory=dict)

    @property
    def kind(self) -> tuple[str | None, str | None]:
        """Forward/backward and training/inference: a miss is only compared with a graph of its kind."""
        return (self.value("fx_kwargs[is_backward]"), self.value("fx_kwargs[is_inference]"))

    def value(self, name: str) -> str | None:
        entry = self.components.get(name)
        return entry[1] if entry else None

    def to_json(self) -> dict[str, Any]:
        """Compact form: ``{"k": key, "o": outcome, "c": {name: hash | [hash, value]}}``."""
        comps: dict[str, Any] = {}
        for name, (digest, value) in self.components.items():
            comps[name] = digest if value is None else [digest, value]
        return {"k": self.key, "o": self.outcome, "c": comps}

    @classmethod
    def from_json(cls, data: Any) -> GraphLookup:
        """Read :meth:`to_json`'s form; raises ValueError on anything else (the input may be hostile)."""
        if not isinstance(data, Mapping):
            raise ValueError("graph lookup: not an object")
        key, outcome, comps = data.get("k"), data.get("o"), data.get("c", {})
        if not isinstance(key, str) or outcome not in OUTCOMES or not isinstance(comps, Mapping):
            raise ValueError("graph lookup: bad key, outcome or components")
        components: dict[str, tuple[str, str | None]] = {}
        for name, entry in comps.items():
            if isinstance(entry, str):
                components[str(name)] = (entry, None)
            elif isinstance(entry, list) and len(entry) == 2 and all(isinstance(x, str) for x in entry):
                components[str(name)] = (entry[0], entry[1])
            else:
                raise ValueError(f"graph lookup: bad component {name!r}")
        return cls(key=key, outcome=str(outcome), components=components)


def lookup_from_torch(
    key: str,
    outcome: str,
    debug_lines: Iterable[str],
    *,
    defaults: Mapping[str, str] | None = None,
    values: Mapping[str, str] | None = None,
) -> GraphLookup:
    """Build a compact :class:`GraphLookup` from torch's ``debug_lines`` for one lookup.

    ``defaults`` maps each inductor option to ``str()`` of its declared default: an option whose
    readable value differs is kept by name, so a config change can be named; without it the options
    are kept as one digest only. ``values``
    overrides readable values torch gives as bytes (``torch_version`` -> ``torch.__version__``).
    Lines that do not parse are ignored: torch's format is not a contract.
    """
    components: dict[str, tuple[str, str | None]] = {}
    groups: dict[str, list[str]] = {}
    budget = VALUES_PER_LOOKUP
    config_marker = CONFIG_GROUPS[0] + "["
    for line in debug_lines:
        # Fast path for the ~600 inductor options of every lookup: three string operations each.
        end = line.find("] ", 1) if isinstance(line, str) else -1
        if end > 0 and line.startswith(config_marker, end + 2):
            close = line.find("]: ", end + 2)
            if close > 0:
                index, digest, text = (
                    line[end + 2 + len(config_marker) : close],
                    line[1:end][:HASH_CHARS],
                    line[close + 3 :],
                )
                groups.setdefault(CONFIG_GROUPS[0], []).append(index + "=" + digest)
                if defaults is not None and defaults.get(index, text) != text:
                    components[CONFIG_OPTION + index] = (digest, _readable(text))
                continue
        parsed = _parse(line)
        if parsed is None:
            continue
        digest, attr, option, text = parsed
        if attr in CONFIG_GROUPS and option is not None:
            groups.setdefault(attr, []).append(f"{option}={digest}")
            if attr == "inductor_config" and defaults is not None and defaults.get(option, text) != text:
                components[CONFIG_OPTION + option] = (digest, _readable(text))
            continue
        name = attr if option is None else f"{attr}[{option}]"
        if attr == CODE:
            components[name] = (digest, _code_signature(text))
            continue
        value = (values or {}).get(name)
        if value is None:
            value = _input_value(text) if attr == INPUT else _readable(text)
        if value is not None and len(value) <= budget:
            budget -= len(value)
        else:
            value = None
        components[name] = (digest, value)
    for attr, entries in groups.items():
        components[attr] = (_short(";".join(sorted(entries))), None)
    return GraphLookup(key=key, outcome=outcome, components=components)


def _parse(line: object) -> tuple[str, str, str | None, str] | None:
    """``[<hash>] <attr>[<index>]: <value>`` -> (short hash, attr, index or None, value); None if not that.

    Plain string operations, not a regex: a lookup has ~650 lines, most of them inductor options,
    and this runs for every lookup of a session.
    """
    if not isinstance(line, str) or not line.startswith("["):
        return None
    end = line.find("] ", 1)
    if end < 0:
        return None
    rest = line[end + 2 :]
    colon = rest.find(":")
    bracket = rest.find("[", 0, colon)
    if bracket >= 0:  # an index may hold a colon (a device name): look for the one after its bracket
        colon = rest.find(":", rest.find("]", bracket))
    head, text = rest[:colon], rest[colon + 1 :]
    if colon < 0 or not _NAME.match(head):
        return None
    attr, opened, index = head.partition("[")
    return line[1:end][:HASH_CHARS], attr, index[:-1] if opened else None, text.removeprefix(" ")


def _readable(text: str) -> str | None:
    text = _ADDRESS.sub("", text).strip()
    if not text or len(text) > VALUE_CHARS or not text.isprintable():
        return None
    return text


_TENSOR_FIELDS = re.compile(r"(\w+)=((?:[^,()\[\]]|\([^()]*(?:\([^()]*\))?[^()]*\)|\[[^\]]*\])*)")


def _input_value(text: str) -> str | None:
    """``TensorMetadata(dtype=torch.float32, shape=torch.Size([8, 16]), ...)`` -> ``dtype=float32;shape=[8, 16];...``.

    Only the fields a user changes are kept (and flags only when set), so the value stays short.
    """
    if not text.startswith("TensorMetadata("):
        return _readable(text)
    fields: dict[str, str] = {}
    for name, raw in _TENSOR_FIELDS.findall(text[len("TensorMetadata(") : -1]):
        raw = raw.strip().replace("torch.", "")
        if name == "shape":
            raw = raw.removeprefix("Size(").removesuffix(")")
        elif name == "device":
            dev = re.findall(r"'([^']*)'|index=(\d+)", raw)
            raw = ":".join(a or b for a, b in dev) if dev else raw
        fields[name] = raw
    keep = ["dtype", "shape", "stride", "device", "requires_grad"]
    out = [f"{k}={fields[k]}" for k in keep if k in fields]
    if fields.get("layout", "strided") != "strided":
        out.append(f"layout={fields['layout']}")
    if fields.get("storage_offset", "0") != "0":
        out.append(f"storage_offset={fields['storage_offset']}")
    out += [f"{k}=True" for k, v in fields.items() if k.startswith("is_") and v == "True"]
    value = ";".join(out)
    return value if len(value) <= VALUE_CHARS * 2 else None


def _code_signature(code: str) -> str | None:
    """Per statement of graph code: a hash of its structure (literals masked) and a hash of its literals;
    then, from the first statement and within ``CODE_TEXT_CHARS``, each statement's short text.

    Two graphs whose statements have the same structure but different literals differ by a constant
    baked into the graph (a Python number, a string), which is what makes a test never hit when that
    constant changes every run. The text says which values and statements changed (:func:`_code_diff`).
    The form is ``"<sig> <sig> ...\n<where>\t<text>\n..."``; ``where`` is ``file.py:line`` when torch's
    graph code carries the user's source (a ``# File: ...`` comment), else empty.
    """
    statements = _statements(code)
    if len(statements) > MAX_GRAPH_LINES:
        return None
    sig = [_token(text) for text, _ in statements]
    texts: list[str] = []
    budget = CODE_TEXT_CHARS
    for text, where in statements:
        line = f"{where}\t{_compact(text)}"
        if len(line) > budget:
            break
        budget -= len(line)
        texts.append(line)
    return " ".join(sig) + "".join("\n" + line for line in texts)


_SOURCE = re.compile(r"#.*?\bFile: (?P<file>[^\t\n]*?):(?P<line>[0-9]{1,7}) in ")


def _statements(code: str) -> list[tuple[str, str]]:
    """The statements of graph code, each with the user's ``file.py:line`` it came from ("" when unknown).

    torch's text starts with the module's repr (``GraphModule()``, ``<lambda>()`` for an inference graph,
    or a multi-line repr with submodules), then ``def forward(...):`` and the body: statements start after
    the first ``def`` line (issue 29.9: a ``<lambda>()`` header counted as statement 1). A ``# File: ...``
    comment (in verbose graph code) gives the source of the statements that follow it.
    """
    lines = code.splitlines()
    start = next((i + 1 for i, line in enumerate(lines) if line.startswith("def ")), 0)
    out: list[tuple[str, str]] = []
    where = ""
    for line in lines[start:]:
        text = line.strip()
        if text.startswith("#"):
            source = _SOURCE.match(text)
            if source:
                where = f"{source['file'].rsplit('/', 1)[-1][-60:]}:{source['line']}"
            continue
        if text and not text.startswith(("def ", "class ")) and not (start == 0 and _HEADER.match(text)):
            out.append((text, "" if text.startswith("return ") else where))  # the output has no source
    return out


_HEADER = re.compile(r"[\w<>.]*\(\)\Z")  # a module repr without children: ``GraphModule()``, ``<lambda>()``


def _token(statement: str) -> str:
    literals = _LITERAL.findall(statement)
    return _short(_LITERAL.sub("#", statement))[:4] + _short("\0".join(literals))[:4]


def _compact(statement: str) -> str:
    """``mm = torch.ops.aten.mm.default(a, b);  a = None`` -> ``mm = aten.mm.default(a, b)``, at most
    ``STATEMENT_CHARS`` characters."""
    text = statement.split(";  ", 1)[0].replace("torch.ops.aten.", "aten.").replace("\t", " ")
    return text if len(text) <= STATEMENT_CHARS else text[: STATEMENT_CHARS - 3] + "..."


# Records written before statements started after the ``def`` line counted an inference graph's header.
_LEGACY_HEADER = _token("<lambda>()")


class _Code:
    """A graph code value read back: the statements' tokens and, for the first ones, where and what they are."""

    def __init__(self, value: str) -> None:
        sig, *lines = value.split("\n", MAX_GRAPH_LINES + 1)
        self.tokens = sig.split()
        if not lines and self.tokens[:1] == [_LEGACY_HEADER]:
            self.tokens = self.tokens[1:]
        if len(self.tokens) > MAX_GRAPH_LINES + 1:  # not a value we wrote: compared by its hash alone
            self.tokens, lines = [], []
        self.texts = [line.partition("\t")[::2] for line in lines[:MAX_GRAPH_LINES]]

    def text(self, index: int) -> str:
        """Statement ``index`` (0-based) as ``text (file.py:3)``, bounded; "" when not kept."""
        if not 0 <= index < len(self.texts):
            return ""
        where, text = self.texts[index]
        text = text[:STATEMENT_CHARS]
        return f"{text} ({where[:70]})" if where else text

    def literals(self, index: int) -> list[str]:
        return _LITERAL.findall(self.texts[index][1]) if 0 <= index < len(self.texts) else []


# --------------------------------------------------------------------------- comparing two lookups


def similarity(a: GraphLookup, b: GraphLookup) -> tuple[int, int, int, int]:
    """Sort key, higher is more similar: forward vs backward, then inference vs training, then the same
    graph code, then the number of equal components."""
    same = sum(1 for name, entry in a.components.items() if b.components.get(name, ("",))[0] == entry[0])
    code = a.components.get(CODE, ("a",))[0] == b.components.get(CODE, ("b",))[0]
    return (int(a.kind[0] == b.kind[0]), int(a.kind[1] == b.kind[1]), int(code), same)


def most_similar(lookup: GraphLookup, candidates: Sequence[GraphLookup]) -> GraphLookup | None:
    """The candidate most similar to ``lookup`` (the first one on a tie), or None.

    A forward graph is never compared with a backward one; a training graph is compared with an
    inference one when nothing closer exists (a ``requires_grad`` change turns one into the other).
    """
    best: GraphLookup | None = None
    best_score: tuple[int, int, int, int] | None = None
    for cand in candidates:
        score = similarity(lookup, cand)
        if score[0] and (best_score is None or score > best_score):
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
    """What changed in the graph code, in one bounded line (issue 29.11).

    Only constants: ``graph code changed: a constant in graph statement 4 (0.89 -> 0.43; mod.py:12)``.
    Otherwise how many statements were added, removed or changed, and the first that differs:
    ``graph code changed: 2 statements differ (1 added, 1 changed); first at statement 3: relu = aten.relu(mul)``.
    """
    if before is None or after is None:
        return "graph code changed"
    old, new = _Code(before), _Code(after)
    changed = _constant_statements(old, new)
    if changed:
        return f"graph code changed: {_constant_what(changed)}{_constant_detail(old, new, changed[0])}"
    return "graph code changed" + _structure_detail(old, new)


def _constant_statements(old: _Code, new: _Code) -> list[int]:
    """The statements (0-based) whose literals alone differ, when nothing else in the code differs; else []."""
    if len(old.tokens) != len(new.tokens):
        return []
    changed = [i for i, (a, b) in enumerate(zip(old.tokens, new.tokens)) if a != b]
    return changed if all(old.tokens[i][:4] == new.tokens[i][:4] for i in changed) else []


def _constant_what(changed: Sequence[int]) -> str:
    return f"{CONSTANT} {', '.join(str(i + 1) for i in changed[:5])}"


def _constant_detail(old: _Code, new: _Code, index: int) -> str:
    """`` (0.89 -> 0.43; mod.py:12)``: the first changed statement's differing literals and its source."""
    before, after = old.literals(index), new.literals(index)
    values = "; ".join(f"{a[:24]} -> {b[:24]}" for a, b in zip(before, after) if a != b)
    if len(before) != len(after) or len(values) > 120:
        values = ""
    where = new.texts[index][0][:70] if index < len(new.texts) else ""
    parts = [part for part in (values, where) if part]
    return f" ({'; '.join(parts)})" if parts else ""


def _structure_detail(old: _Code, new: _Code) -> str:
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


@dataclass
class MissExplanation:
    """Why one missed lookup of a test missed."""

    key: str
    reasons: list[str]

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "reasons": list(self.reasons)}

    @classmethod
    def from_json(cls, data: Any) -> MissExplanation:
        """Parse :meth:`to_json` output (e.g. from a JSON report); ValueError for any other shape."""
        if not isinstance(data, Mapping) or not isinstance(data.get("key"), str):
            raise ValueError(f"not a miss explanation: {data!r:.80}")
        reasons = data.get("reasons", [])
        if not isinstance(reasons, list):
            raise ValueError(f"reasons must be a list: {reasons!r:.80}")
        return cls(data["key"], [str(reason) for reason in reasons])


def explain_test(current: Sequence[GraphLookup], previous: Sequence[GraphLookup] | None) -> list[MissExplanation]:
    """Explain every miss among ``current`` against the same test's ``previous`` lookups.

    Earlier graphs matched exactly by a current lookup (same key) are set aside first, so each miss
    is compared with a graph that this run did not already account for.
    """
    misses = [lookup for lookup in current if lookup.outcome != "hit"]
    if not misses:
        return []
    if previous is None:
        return [MissExplanation(m.key, [NEW_TEST]) for m in misses]
    keys = {lookup.key for lookup in current}
    left = [p for p in previous if p.key not in keys]
    out = []
    for miss in misses:
        best = most_similar(miss, left)
        if best is None:
            same_key = any(p.key == miss.key for p in previous)
            reason = (GUARD_MISS if miss.outcome == GUARD else SAME_KEY) if same_key else NEW_GRAPH
            out.append(MissExplanation(miss.key, [reason]))
            continue
        left.remove(best)
        out.append(MissExplanation(miss.key, diff(best, miss)))
    return out


# A one-time edit of a constant changes a statement once; flagging a test as never hitting needs evidence an
# edit cannot give (issue 29.10): the same statement changing in this many consecutive runs, or changing back.
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
    def evident(self) -> bool:
        """True when no single edit explains it: many changes in a row, or a value that came back."""
        back = len(self.seen) >= 3 and self.seen[-1] in self.seen[:-2]
        return self.changes >= NEVER_HIT_CHANGES or (self.changes >= 2 and back)


_NO_STREAK = Streak("", 0)


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
        old_code, new_code = _Code(old), _Code(new)
        changed = _constant_statements(old_code, new_code)
        if changed:
            first = changed[0]
            return _constant_what(changed), old_code.tokens[first][4:], new_code.tokens[first][4:]
    return None


def never_hits(history: Sequence[Sequence[GraphLookup]]) -> str | None:
    """The statement whose constant keeps changing in a test's runs (``history``, oldest first), or None.

    A test is flagged when its misses differ from the run before only by a constant baked into the graph
    code, in the same statement, in at least ``NEVER_HIT_CHANGES`` consecutive runs, or when that constant
    came back to an earlier value (unseeded random numbers, a timestamp, a temp path): such a test can never
    hit, whatever is cached. One edit of a constant (``4.0`` -> ``4.25``) is not enough.
    """
    streak: Streak | None = None
    for before, after in zip(history, history[1:]):
        streak = (streak or _NO_STREAK).then(constant_change(before, after))
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
    is a restored bundle's.
    """

    tests: dict[str, list[GraphLookup]] = field(default_factory=dict)
    volatile: dict[str, Streak] = field(default_factory=dict)
    torch: str = ""
    truncated: int = 0
    created: float = 0.0
    from_bundle: bool = False

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
        if type(created) not in (int, float) or not math.isfinite(created):
            created = 0.0
        return cls(
            tests,
            volatile,
            torch if isinstance(torch, str) else "",
            truncated if type(truncated) is int else 0,
            float(created),
            data.get("from_bundle") is True,
        )


def _common(lookups: Iterable[GraphLookup]) -> dict[str, Any]:
    """Components equal in every lookup (custom passes, system, torch version...): stored once per record."""
    common: dict[str, Any] | None = None
    for lookup in lookups:
        comps = lookup.to_json()["c"]
        common = dict(comps) if common is None else {k: v for k, v in common.items() if comps.get(k) == v}
    return common or {}


def _without(entry: dict[str, Any], common: Mapping[str, Any]) -> dict[str, Any]:
    return {**entry, "c": {k: v for k, v in entry["c"].items() if k not in common}}


@dataclass
class SessionExplanation:
    """Every miss of a session explained, the tests flagged as never hitting, and the tests that ran a
    training graph's forward without its backward (their AOTAutograd lookups miss every run: torch saves
    an AOTAutograd entry only once the backward is compiled; issue 29.12)."""

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
    for nodeid, lookups in current.items():
        if previous is None or not lookups:
            continue
        earlier = previous.tests.get(nodeid)
        explained = explain_test(lookups, earlier)
        if explained:
            out.misses[nodeid] = explained
        if earlier is None:
            continue
        streak = previous.volatile.get(nodeid, _NO_STREAK).then(constant_change(earlier, lookups))
        if streak is None:
            continue
        record.volatile[nodeid] = streak
        if streak.evident:
            out.never_hit[nodeid] = (streak.what, streak.changes + 1)
    return out, record


def _forward_only(lookups: Sequence[GraphLookup]) -> bool:
    """A training graph's forward looked up, and no backward graph: the backward never ran in this test."""
    kinds = {lookup.kind for lookup in lookups}
    return ("False", "False") in kinds and not any(backward == "True" for backward, _ in kinds)


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
    session (issue 29.7: a ``-k`` session restored an older bundle, and the next run compared with it). An
    unreadable dir record is replaced. Raises ValueError (malformed record: the bundle may be hostile) or
    OSError; the dir is then as it was.
    """
    bundle = GraphsRecord.from_json(graphs)
    try:
        local = load_record(cache_dir)
    except (OSError, ValueError):
        local = None
    if local is not None and local.created > bundle.created:
        record = carry_forward(local, bundle)
    else:
        bundle.from_bundle = True
        record = carry_forward(bundle, local)
    save_record(cache_dir, record)
    return record


# --------------------------------------------------------------------------- what the session calls: never raises
# Nothing in explaining may fail a session (issue 28.2): records come from bundles and from a shared dir, and a
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
