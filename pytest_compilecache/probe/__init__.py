"""The only package that touches torch, and the only one that reads its private counters: one module per torch
surface. Everything here imports torch lazily and returns plain values, so the rest of the plugin can be tested
without torch. Private APIs are used as documented in torch 2.6-2.15 (see ``research/torch-caching-internals.md``)
and each use is guarded: a missing attribute means "not available on this torch", never a crash in a user's session.

* :mod:`.hooks` -- is torch loaded; wrapping a torch module the moment it is imported (every module below uses it)
* :mod:`.counters` -- per-test counters and compilation metrics (:func:`mark`, :func:`delta`)
* :mod:`.dynamo` -- Dynamo's own costs: recompiles and their reasons, the recompile limit, graph breaks
* :mod:`.graphs` -- every FX-graph lookup with its key's components (the miss explanations' input)
* :mod:`.pch` -- torch's precompiled headers, each checked at its first look-up
* :mod:`.triton` -- triton cache entries opened and built
* :mod:`.redis_guard` -- Redis errors of torch's remote caches, recorded instead of failing a compile
* :mod:`.config` -- torch's cache dir and config switches, isolated compiles
* :mod:`.facts` -- what this torch offers (capabilities) and what decides reuse (torch and device facts)
* :mod:`.megacache` -- torch's mega-cache and the files a warm start needs beside it

The package's names (``probe.mark``, ``probe.point_cache_dir``...) load their module on first use: a process
loads only the surfaces it touches.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING
from typing import Any

if TYPE_CHECKING:
    from .config import DISABLE_ENV as DISABLE_ENV
    from .config import REMOTE_SWITCHES as REMOTE_SWITCHES
    from .config import import_compiler as import_compiler
    from .config import isolated_compile as isolated_compile
    from .config import point_cache_dir as point_cache_dir
    from .config import put_back_config as put_back_config
    from .counters import AUTOTUNE_COUNTERS as AUTOTUNE_COUNTERS
    from .counters import AUTOTUNE_METRICS as AUTOTUNE_METRICS
    from .counters import FIRST_COMPILES as FIRST_COMPILES
    from .counters import TRITON_COMPILE_METRICS as TRITON_COMPILE_METRICS
    from .counters import ZERO as ZERO
    from .counters import Mark as Mark
    from .counters import delta as delta
    from .counters import mark as mark
    from .counters import moved as moved
    from .dynamo import fail_on_recompile_limit as fail_on_recompile_limit
    from .facts import CHILD_TIMEOUT as CHILD_TIMEOUT
    from .facts import Devices as Devices
    from .facts import capabilities as capabilities
    from .facts import capability_notes as capability_notes
    from .facts import device_facts as device_facts
    from .facts import devices_from_json as devices_from_json
    from .facts import property_values as property_values
    from .facts import read_devices as read_devices
    from .facts import read_devices_here as read_devices_here
    from .facts import remote_counts_available as remote_counts_available
    from .facts import torch_facts as torch_facts
    from .graphs import graph_capture_active as graph_capture_active
    from .graphs import graph_capture_installed as graph_capture_installed
    from .graphs import graph_delta as graph_delta
    from .graphs import graph_mark as graph_mark
    from .graphs import uninstall_graph_capture as uninstall_graph_capture
    from .graphs import watch_graph_lookups as watch_graph_lookups
    from .hooks import dynamo_loaded as dynamo_loaded
    from .hooks import torch_loaded as torch_loaded
    from .hooks import watch_dynamo as watch_dynamo
    from .megacache import artifact_counts as artifact_counts
    from .megacache import collect_used_modules as collect_used_modules
    from .megacache import load_artifacts as load_artifacts
    from .megacache import save_artifacts as save_artifacts
    from .megacache import used_files as used_files
    from .pch import check_headers_early as check_headers_early
    from .pch import precompiled_header_dir as precompiled_header_dir
    from .pch import precompiled_headers_used as precompiled_headers_used
    from .pch import uninstall_header_watch as uninstall_header_watch
    from .pch import watch_precompiled_headers as watch_precompiled_headers
    from .redis_guard import guard_remote_cache as guard_remote_cache
    from .redis_guard import point_remote_caches as point_remote_caches
    from .redis_guard import put_back_remote_caches as put_back_remote_caches
    from .redis_guard import remote_cache_errors as remote_cache_errors
    from .redis_guard import uninstall_remote_guard as uninstall_remote_guard
    from .triton import autotune_files as autotune_files
    from .triton import relocate_static_autotuners as relocate_static_autotuners
    from .triton import triton_entry_files as triton_entry_files
    from .triton import uninstall_triton_watch as uninstall_triton_watch
    from .triton import watch_triton_cache as watch_triton_cache

# Each public name and the module that holds it.
_WHERE = {
    "DISABLE_ENV": "config",
    "REMOTE_SWITCHES": "config",
    "import_compiler": "config",
    "isolated_compile": "config",
    "point_cache_dir": "config",
    "put_back_config": "config",
    "AUTOTUNE_COUNTERS": "counters",
    "FIRST_COMPILES": "counters",
    "fail_on_recompile_limit": "dynamo",
    "AUTOTUNE_METRICS": "counters",
    "Mark": "counters",
    "TRITON_COMPILE_METRICS": "counters",
    "ZERO": "counters",
    "delta": "counters",
    "mark": "counters",
    "moved": "counters",
    "CHILD_TIMEOUT": "facts",
    "Devices": "facts",
    "capabilities": "facts",
    "capability_notes": "facts",
    "device_facts": "facts",
    "devices_from_json": "facts",
    "property_values": "facts",
    "read_devices": "facts",
    "read_devices_here": "facts",
    "remote_counts_available": "facts",
    "torch_facts": "facts",
    "graph_capture_active": "graphs",
    "graph_capture_installed": "graphs",
    "graph_delta": "graphs",
    "graph_mark": "graphs",
    "uninstall_graph_capture": "graphs",
    "watch_graph_lookups": "graphs",
    "dynamo_loaded": "hooks",
    "torch_loaded": "hooks",
    "watch_dynamo": "hooks",
    "artifact_counts": "megacache",
    "collect_used_modules": "megacache",
    "load_artifacts": "megacache",
    "save_artifacts": "megacache",
    "used_files": "megacache",
    "check_headers_early": "pch",
    "precompiled_header_dir": "pch",
    "precompiled_headers_used": "pch",
    "uninstall_header_watch": "pch",
    "watch_precompiled_headers": "pch",
    "guard_remote_cache": "redis_guard",
    "point_remote_caches": "redis_guard",
    "put_back_remote_caches": "redis_guard",
    "remote_cache_errors": "redis_guard",
    "uninstall_remote_guard": "redis_guard",
    "autotune_files": "triton",
    "relocate_static_autotuners": "triton",
    "triton_entry_files": "triton",
    "uninstall_triton_watch": "triton",
    "watch_triton_cache": "triton",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # once: later reads are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
