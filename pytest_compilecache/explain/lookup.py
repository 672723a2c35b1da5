"""One FX-graph lookup as torch describes it: its key's components, parsed from torch's ``debug_lines`` into a
compact, bounded :class:`GraphLookup`, and the graph code's per-statement signature.

PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from dataclasses import field
from typing import Any
from typing import Iterable
from typing import Mapping

from ..record_fields import TORCH_FRAME

RECORD_NAME = ".compilecache-graphs.json"
FORMAT = 1

HASH_CHARS = 12  # 60 bits of torch's base32 component hashes: plenty to tell two values apart
VALUE_CHARS = 160  # a readable value longer than this is kept as a hash only
VALUES_PER_LOOKUP = 4000  # readable characters kept per lookup; the hashes are always kept
MAX_LOOKUPS_PER_TEST = 32
MAX_RECORD_BYTES = 2_000_000
# Components across a record's lookups once each carries the record's ``common`` ones too: what reading a
# record costs in memory (~100 bytes each, the value strings shared). A record over it is refused (once
# a 2.4 MB record of 8 tests expanded to 3.6 GB when every lookup copied 100,000 common components).
MAX_COMPONENTS = 200_000
MAX_GRAPH_LINES = 400  # graph code longer than this keeps its hash, not its per-line signature
CODE_TEXT_CHARS = 1500  # statement text kept per graph, from its start, to say what changed
STATEMENT_CHARS = 100  # one statement's text at most, in the record and in every reason
FUNCTION_CHARS = 200  # a compiled function's name and file:line, at most
MAX_REASONS = 10  # reasons per miss, the last one counting the rest

GUARD = "guard_miss"  # the key was in the cache, its guards rejected this call (torch 2.13+ says so)
OUTCOMES = ("hit", "miss", GUARD)
CODE = "gm"
CONFIG_GROUPS = ("inductor_config", "inductor_config_comms")
CONFIG_OPTION = "inductor_config."  # prefix of the non-default inductor options kept by name
INPUT = "example_inputs"

_NAME = re.compile(r"[A-Za-z_][\w.]*(?:\[[^\]]*\])?\Z")
_LINE = re.compile(r":[0-9]+\)\Z")  # a function's line: ``gelu (tests/test_ops.py:12)``
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
    # The compiled function whose graph this is, as torch's logs name it: ``gelu (tests/test_ops.py:12)``;
    # "" when unknown (a record written before the field, or a torch that does not say).
    function: str = ""

    @property
    def inputs(self) -> str:
        """The shapes of the graph's tensor inputs: ``[8, 16], [16]`` ("" when none is known)."""
        shapes = [_shape(value) for name, (_, value) in self.components.items() if name.startswith(INPUT + "[")]
        return ", ".join(shape for shape in shapes if shape)

    @property
    def user_function(self) -> str:
        """:attr:`function` when it names one function of the user's, else "": unknown, or torch's own frame
        (every compiled module's frame is torch's one wrapper, ``TORCH_FRAME``: it names no one function)."""
        return "" if self.function.startswith(TORCH_FRAME) else self.function

    @property
    def user_function_anywhere(self) -> str:
        """:attr:`user_function` without its line, ``gelu (tests/test_ops.py)``: an edit above a function moves it,
        and it is still that function to the test that compiles it (not to others: two tests' nested ``fn`` in
        one file differ by their lines alone)."""
        return _LINE.sub(")", self.user_function)

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
        out: dict[str, Any] = {"k": self.key, "o": self.outcome, "c": comps}
        if self.function:
            out["f"] = self.function
        return out

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
        function = data.get("f", "")
        function = function[:FUNCTION_CHARS] if isinstance(function, str) else ""
        return cls(key=key, outcome=str(outcome), components=components, function=function)


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


def _shape(value: str | None) -> str:
    """``dtype=float32;shape=[8, 16];...`` -> ``[8, 16]``; "" for an input that is not a tensor (or unknown)."""
    for part in (value or "").split(";"):
        if part.startswith("shape="):
            return part[len("shape=") :][:60]
    return ""


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
    the first ``def`` line (a ``<lambda>()`` header counted as statement 1). A ``# File: ...``
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


class Code:
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
