"""Every FX-graph cache lookup of this process, with its key's components (for the miss explanations).

Loads lazily (inside the functions that need them, so a session pays only for what it uses): ``inspect``,
``torch._inductor.codecache``, ``..explain``, ``torch._inductor``, ``torch``.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

from . import dynamo
from .hooks import CODECACHE
from .hooks import install_now_or_on_import

# --------------------------------------------------------------------------- per-graph lookups

# Every FX-graph lookup this process made, as compact JSON (``explain.GraphLookup.to_json``), in order.
# torch funnels each lookup through ``FxGraphCache.load_with_key(key, debug_lines, ...)`` (2.7-2.15):
# a direct compile and an AOTAutograd cache hit alike, with the key's components already computed, so
# wrapping it costs nothing when nothing compiles and one small parse per lookup when something does.
_lookups: list[dict[str, Any]] = []
_graph_capture: str | None = None  # None: not tried yet; "" installed; otherwise why not


def graph_capture_installed() -> str | None:
    """Install the per-lookup capture once torch's codecache is imported; return a note when unavailable.

    Returns None once installed (or while torch's codecache is not imported yet: nothing to capture),
    and a one-line note when this torch has no usable ``FxGraphCache.load_with_key``. The original is
    called unchanged; a failure while recording a lookup is swallowed, never the compile's.
    """
    global _graph_capture
    if _graph_capture is not None:
        return _graph_capture or None
    if "torch._inductor.codecache" not in sys.modules:
        return None
    try:
        import inspect

        from torch._inductor.codecache import FxGraphCache

        original = FxGraphCache.__dict__["load_with_key"]
        func = original.__func__ if isinstance(original, staticmethod) else None
        params = list(inspect.signature(func).parameters)[:2] if func is not None else []
        if params != ["key", "debug_lines"]:
            _graph_capture = "this torch has no FxGraphCache.load_with_key(key, debug_lines, ...): no miss explanations"
            return _graph_capture
    except Exception as exc:  # an older or newer torch without the API: explain nothing, say so once
        _graph_capture = f"per-graph miss explanations unavailable on this torch ({type(exc).__name__})"
        return _graph_capture

    original_func: Any = func

    def load_with_key(key: Any, debug_lines: Any, *args: Any, **kwargs: Any) -> Any:
        result = original_func(key, debug_lines, *args, **kwargs)
        with contextlib.suppress(Exception):
            _record_lookup(key, debug_lines, result)
        return result

    load_with_key.__wrapped__ = original_func  # type: ignore[attr-defined]
    cache_class: Any = FxGraphCache
    cache_class.load_with_key = staticmethod(load_with_key)
    _graph_capture = ""
    return None


def _record_lookup(key: Any, debug_lines: Any, result: Any) -> None:
    from ..explain import lookup_from_torch

    info = result[1] if isinstance(result, tuple) and len(result) == 2 else {}
    state = info.get("cache_state") if isinstance(info, dict) else None
    if state not in ("hit", "miss") or not isinstance(key, str) or not isinstance(debug_lines, list):
        return
    if state == "miss" and info.get("cache_status_detailed") == "guard_miss":
        state = "guard_miss"  # the entry exists; its symbolic-shape guards failed (torch 2.13+ says so)
    lookup = lookup_from_torch(key, state, debug_lines, defaults=_inductor_defaults(), values=_torch_values())
    data = lookup.to_json()
    compiling = dynamo.compile_id()
    if compiling is not None:  # named at the test's end, once the frame's compile is recorded (graph_delta)
        data[_COMPILE_ID] = compiling
    _lookups.append(data)


_COMPILE_ID = "i"  # a lookup's compile id until graph_delta names its function (``f``, GraphLookup.function)


_defaults: dict[str, str] | None = None


def _inductor_defaults() -> dict[str, str] | None:
    """``str()`` of each inductor option's declared default (``config._config``, 2.6-2.15), once per process."""
    global _defaults
    if _defaults is None:
        _defaults = {}
        with contextlib.suppress(Exception):
            from torch._inductor import config as inductor_config

            entries = getattr(inductor_config, "_config", {})
            _defaults = {name: str(entry.default) for name, entry in entries.items()}
    return _defaults or None


def _torch_values() -> dict[str, str]:
    import torch

    return {"torch_version": str(torch.__version__)}


def watch_graph_lookups() -> None:
    """Capture every FX-graph lookup of this process from now on; never imports torch.

    Call once per process (the plugin's configure step, in every xdist worker). Installs now when
    torch's codecache is already imported, else as soon as it is.
    """
    install_now_or_on_import(CODECACHE, graph_capture_installed, pending=_graph_capture is None)


def graph_capture_active() -> bool:
    """True once the capture wraps torch's ``load_with_key`` in this process."""
    return _graph_capture == ""


def graph_mark() -> int:
    """Position in this process's list of lookups; installs the capture when torch's codecache is loaded."""
    graph_capture_installed()
    return len(_lookups)


def graph_delta(start: int) -> list[dict[str, Any]]:
    """The lookups (``GraphLookup.to_json`` dicts) made since ``graph_mark()`` returned ``start``."""
    graph_capture_installed()
    found = list(_lookups[start:]) if start <= len(_lookups) else list(_lookups)
    if any(_COMPILE_ID in lookup for lookup in found):
        _name_functions(found)
    return found


def _name_functions(lookups: list[dict[str, Any]]) -> None:
    """Name the compiled function of each lookup (``f``) from torch's record of its frame's compile."""
    records = dynamo.compilation_records(sys.modules.get("torch._dynamo.utils"))
    ids = {str(lookup[_COMPILE_ID]) for lookup in lookups if _COMPILE_ID in lookup}
    names = dynamo.functions_of(ids, records) if records is not None else {}
    for lookup in lookups:
        name = names.get(str(lookup.get(_COMPILE_ID)))
        if name:  # else kept for a later call (GraphLookup.from_json reads no "i")
            lookup["f"] = name
            del lookup[_COMPILE_ID]


def uninstall_graph_capture() -> None:
    """Put torch's own ``load_with_key`` back (tests; a session never needs to)."""
    global _graph_capture
    codecache = sys.modules.get("torch._inductor.codecache")
    if codecache is not None:
        current = codecache.FxGraphCache.__dict__.get("load_with_key")
        wrapped = getattr(getattr(current, "__func__", None), "__wrapped__", None)
        if wrapped is not None:
            codecache.FxGraphCache.load_with_key = staticmethod(wrapped)
    _graph_capture = None
