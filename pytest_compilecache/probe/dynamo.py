"""Dynamo's own costs, per test: which function a compile was for, each recompile with torch's guard-failure
reason, frames that hit torch's recompile limit (torch compiles them no more), graph breaks with torch's
reasons. torch's logs (``TORCH_LOGS=recompiles,graph_breaks``) say the same per process; this ties them to a test.

Read from what torch keeps anyway: ``CompilationMetrics`` (``compile_id``, ``co_name``, ``co_filename``,
``co_firstlineno``, ``recompile_reason``: 2.7-2.15), each graph break torch logs (``log_graph_break``) and
the warning ``torch._dynamo hit config.<limit> (<value>)`` that ``convert_frame`` logs once per frame when it gives
up (2.7-2.15). Each read is guarded: a field this torch lacks is an empty value, never an error.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import re
import sys
from typing import Any
from typing import Callable
from typing import Sequence

from ..record_fields import TEXT_CHARS
from ..record_fields import TORCH_FRAME
from .hooks import install_now_or_on_import
from .hooks import tap_log

_CONVERT_FRAME = "torch._dynamo.convert_frame"
_DYNAMO_CONFIG = "torch._dynamo.config"
_LIMIT_MESSAGE = "torch._dynamo hit config."
_COMPILE_ID = r"\A\s*\d+/\d+:\s*"  # "0/1: " before torch's guard-failure reason
_TORCH_FUNCTION = r"\A'(?P<name>.*)' \((?P<file>.*):(?P<line>\d+)\)\Z"  # how convert_frame names a function


def function_text(name: Any, filename: Any, line: Any) -> str:
    """``gelu (tests/test_ops.py:12)``: a code object's name and where it starts, the path relative to the
    working directory when it is under it (as a user reads their own tests), else as torch gives it; a frame of
    torch's own files (a compiled module's wrapper) is ``torch's inner (torch/_dynamo/external_utils.py:67)``
    (:data:`~pytest_compilecache.record_fields.TORCH_FRAME`)."""
    path = str(filename or "?")
    torch_file = getattr(sys.modules.get("torch"), "__file__", None)
    if isinstance(torch_file, str):  # a frame of torch's own files: see TORCH_FRAME
        torch_dir, where = os.path.dirname(os.path.abspath(torch_file)), os.path.abspath(path)
        if where.startswith(torch_dir + os.sep):
            inside = os.path.join("torch", os.path.relpath(where, torch_dir))
            return f"{TORCH_FRAME}{name} ({inside}:{line})"[:TEXT_CHARS]
    with contextlib.suppress(ValueError):
        relative = os.path.relpath(path)
        if not relative.startswith(".."):
            path = relative
    return f"{name} ({path}:{line})"[:TEXT_CHARS]


def one_line(text: Any) -> str:
    """torch's reason on one line: its first, spaces collapsed, bounded."""
    first = str(text or "").strip().split("\n", 1)[0]
    return " ".join(first.split())[:TEXT_CHARS]


def guard_failure(reason: Any) -> str:
    """``0/0: tensor 'x' size mismatch at index 0. expected 4, actual 8`` -> without the compile id, one line."""
    return one_line(re.sub(_COMPILE_ID, "", str(reason or "")))


def compile_id() -> str | None:
    """The compile id (``"3/1"``) of the frame Dynamo is compiling now, None outside a compile."""
    guards = sys.modules.get("torch._guards")
    current = getattr(getattr(guards, "CompileContext", None), "current_compile_id", None)
    found = current() if callable(current) else None
    return None if found is None else str(found)


def compilation_records(utils: Any) -> Sequence[Any] | None:
    """torch's compilation records, oldest first, without copying them: the deque ``_compilation_metrics`` that
    ``get_compilation_metrics()`` copies whole at every call (2.7-2.15; every test's start and end asks), else
    what that returns; None where this torch keeps none. Read, never changed."""
    get = getattr(utils, "get_compilation_metrics", None)
    if get is None:
        return None
    kept = getattr(utils, "_compilation_metrics", None)  # replaced, not resized, by set_compilation_metrics_limit
    return kept if isinstance(kept, collections.deque) else list(get())


def record_function(record: Any) -> str:
    """The function a ``CompilationMetrics`` record compiled, "" when it does not say."""
    name = getattr(record, "co_name", None)
    if not name:
        return ""
    return function_text(name, getattr(record, "co_filename", None), getattr(record, "co_firstlineno", None))


def functions_of(ids: set[str], records: Sequence[Any]) -> dict[str, str]:
    """compile id -> :func:`record_function` for the ``ids`` among ``records`` (the newest first, as the ids
    asked for are those of the test that just ran)."""
    found: dict[str, str] = {}
    for record in reversed(records):
        key = str(getattr(record, "compile_id", "") or "")
        if key in ids and key not in found:
            found[key] = record_function(record)
            if len(found) == len(ids):
                break
    return found


# --------------------------------------------------------------------------- graph breaks


# What torch did about a break before the break it met ("<what torch did>:\n\n<the exception's message>").
_WHAT_TORCH_DID = ("Encountered graph break that we cannot resume from", "Failed to handle graph break gracefully")
# "<what torch was doing>:\n\n<the exception's message>" ("Encountered graph break when attempting to trace CALL: ...")
_DOING = ("Encountered ", "Failed to handle ")


def graph_break_reason(reason: Any) -> str:
    """The reason torch logs for a graph break, on one line: the exception's first line and, where torch adds one,
    its explanation (``Failed to trace builtin operator: Dynamo does not know how to trace builtin operator
    `print` ...``), after what torch did about it when it did more than split the graph ("Failed to handle graph
    break gracefully: ...": the whole frame then runs uncompiled)."""
    text = str(reason or "")
    did = next((did for did in _WHAT_TORCH_DID if text.startswith(did)), None)
    if text.startswith(_DOING) and ":\n\n" in text:  # the exception's message, after what torch was doing
        text = text.split(":\n\n", 1)[1]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return one_line(did or "")
    explained = next((line[len("Explanation:") :].strip() for line in lines if line.startswith("Explanation:")), "")
    said = f"{lines[0]}: {explained}" if explained else lines[0]
    return one_line(f"{did}: {said}" if did and not said.startswith(did) else said)


# Every graph break torch logged in this process, as :func:`graph_break_reason` words it.
_breaks: list[str] = []
_SYMBOLIC_CONVERT = "torch._dynamo.symbolic_convert"
_TAPPED = "__compilecache_tapped__"


def tap_graph_breaks() -> None:
    """Count every graph break torch logs (``TORCH_LOGS=graph_breaks`` shows each), from the moment Dynamo's
    tracer is imported. ``counters["graph_break"]`` misses some that split a graph all the same:
    a data-dependent branch (``generic_jump``), a break torch cannot resume from, a frame it gives up on (a break
    in a loop: the frame then runs uncompiled). So the tap wraps torch's ``log_graph_break`` instead: a method
    of ``InstructionTranslatorBase`` that logs an exception once (``exc.logged``, 2.8-2.15), a module function
    called once per break on 2.7. The wrapper only records the reason, then calls torch's own. Installed by
    :func:`.hooks.watch_dynamo` the moment torch imports the tracer; once per process."""
    module = sys.modules.get(_SYMBOLIC_CONVERT)
    owner = getattr(module, "InstructionTranslatorBase", None)
    if callable(getattr(owner, "log_graph_break", None)):
        original = owner.log_graph_break  # type: ignore[union-attr]
        if getattr(original, _TAPPED, False):
            return

        def method(self: Any, *args: Any, **kwargs: Any) -> Any:  # (code_options, reason, exc), passed on as given
            with contextlib.suppress(Exception):  # ours must never fail torch's compile
                exc = kwargs["exc"] if "exc" in kwargs else (args[2] if len(args) > 2 else None)
                if not getattr(exc, "logged", False):  # torch logs it now (it returns at once for a logged one)
                    _breaks.append(graph_break_reason(kwargs.get("reason", args[1] if len(args) > 1 else "")))
            return original(self, *args, **kwargs)

        setattr(method, _TAPPED, True)
        owner.log_graph_break = method  # type: ignore[union-attr]
    elif callable(getattr(module, "log_graph_break", None)):
        function = module.log_graph_break  # type: ignore[union-attr]
        if getattr(function, _TAPPED, False):
            return

        def logged(*args: Any, **kwargs: Any) -> Any:  # (code_options, reason, ...), passed on as given
            with contextlib.suppress(Exception):
                _breaks.append(graph_break_reason(kwargs.get("reason", args[1] if len(args) > 1 else "")))
            return function(*args, **kwargs)

        setattr(logged, _TAPPED, True)
        module.log_graph_break = logged  # type: ignore[union-attr]


def breaks_mark() -> int:
    return len(_breaks)


def graph_breaks(start: int) -> tuple[int, list[str]]:
    """Graph breaks torch logged since :func:`breaks_mark` returned ``start``: how many, and their distinct
    reasons in the order first met."""
    new = _breaks[start:]
    return len(new), list(dict.fromkeys(reason for reason in new if reason))


# --------------------------------------------------------------------------- the recompile limit


class _LimitHits:
    """Each ``torch._dynamo hit config.<limit>`` warning of ``convert_frame`` as a plain entry, read through a
    :class:`~.hooks.LogTap`: also where the user silenced Dynamo's warnings (``TORCH_LOGS="-dynamo"``), and the
    user still sees exactly what their logging shows."""

    def __init__(self) -> None:
        self.hits: list[dict[str, str]] = []

    def read(self, record: logging.LogRecord) -> None:
        msg, args = record.msg, record.args
        if isinstance(msg, str) and msg.startswith(_LIMIT_MESSAGE) and isinstance(args, tuple) and len(args) >= 3:
            self.hits.append(_limit_entry(args))


def _limit_entry(args: tuple[Any, ...]) -> dict[str, str]:
    """``(limit_type, value, "'fn' (file:line)", last reason, ...)`` -> ``{"function", "limit", "reason"}``."""
    match = re.match(_TORCH_FUNCTION, str(args[2]))
    function = function_text(match["name"], match["file"], match["line"]) if match else one_line(args[2])
    return {
        "function": function,
        "limit": f"{args[0]} = {args[1]}",
        "reason": guard_failure(args[3] if len(args) > 3 else ""),
    }


_limit_tap: _LimitHits | None = None


def tap_limit_warnings() -> None:
    """Once torch is imported: keep every "hit the recompile limit" warning from now on (once per process)."""
    global _limit_tap
    if _limit_tap is None:
        _limit_tap = _LimitHits()
        tap_log(_CONVERT_FRAME, logging.WARNING, _limit_tap.read)


def limit_mark() -> int:
    return len(_limit_tap.hits) if _limit_tap is not None else 0


def limit_hits(start: int) -> list[dict[str, str]]:
    """The frames that hit the recompile limit since :func:`limit_mark` returned ``start``."""
    return [dict(hit) for hit in _limit_tap.hits[start:]] if _limit_tap is not None else []


def fail_on_recompile_limit() -> Callable[[], None]:
    """Make a frame that hits the recompile limit fail its test (torch raises ``FailOnRecompileLimitHit``)
    instead of running uncompiled: torch's own ``fail_on_recompile_limit_hit`` (2.7-2.15), set now if Dynamo's
    config is imported, else as soon as it is. Returns the function that puts torch's value back."""
    before: list[Any] = []

    def install() -> None:
        config: Any = sys.modules.get(_DYNAMO_CONFIG)
        if config is not None and not before and hasattr(config, "fail_on_recompile_limit_hit"):
            before.append(config.fail_on_recompile_limit_hit)
            config.fail_on_recompile_limit_hit = True

    def put_back() -> None:
        config: Any = sys.modules.get(_DYNAMO_CONFIG)
        if config is not None and before:
            config.fail_on_recompile_limit_hit = before.pop()

    install_now_or_on_import(_DYNAMO_CONFIG, install, pending=True)
    return put_back
