"""The only module that touches torch, and the only one that reads its private counters.

Everything here imports torch lazily and returns plain values, so the rest of the plugin can be
tested without torch. Private APIs are used as documented in torch 2.6-2.15 (see the notes in
``research/torch-caching-internals.md``) and each use is guarded: a missing attribute means "not
available on this torch", never a crash in a user's test session.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from typing import Iterable
from typing import Iterator
from typing import NamedTuple

from ._env import CACHE_ENV
from ._env import TRITON_ENV
from ._env import cache_dir_env

DISABLE_ENV = "TORCHINDUCTOR_FORCE_DISABLE_CACHES"

# Environment variables that turn torch's remote caches on (set before torch is imported).
REMOTE_SWITCHES = (
    "TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE",
    "TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE",
    "TORCHINDUCTOR_AUTOTUNE_REMOTE_CACHE",
)


def torch_loaded() -> bool:
    """True once the session imported torch; the plugin never imports it on its own in a plain session."""
    return "torch" in sys.modules


def dynamo_loaded() -> bool:
    return "torch._dynamo.utils" in sys.modules


def import_compiler() -> bool:
    """Import torch's compiler (``torch._inductor.codecache``, which brings dynamo and inductor) now, in a
    process whose tests already imported torch; True when it is imported. Never imports torch itself.

    For an xdist worker that would otherwise sit idle while another worker restores the session's bundle
    (issue 25): the first ``torch.compile`` pays this import anyway (about 1.5 s of CPU), and the hash of
    torch's sources every FX-graph key includes (0.2 s), so both are done while waiting. Nothing in the
    import reads the cache dir's entries; torch fixes its precompiled-header dir from TMPDIR, which the
    worker already has.
    """
    if not torch_loaded():
        return False
    try:
        codecache = importlib.import_module(_CODECACHE)
        # The hash of torch's own sources that every FX-graph key includes (cached for the process).
        torch_key = getattr(codecache, "torch_key", None)
        if callable(torch_key):
            torch_key()
    except Exception:  # a torch that cannot compile here: its first compile will say why
        return False
    return True


# --------------------------------------------------------------------------- per-phase measurement


class _BypassTap(logging.Filter):
    """Captures torch's FX-graph cache bypass reasons without changing what the user's logging shows.

    torch logs the reason at INFO ("Bypassing FX Graph Cache because '%s'"). We lower the logger's level
    so the record is created, keep the reason, and drop the record unless the user's configuration would
    have shown it anyway.
    """

    def __init__(self, user_level: int) -> None:
        super().__init__()
        self.user_level = user_level
        self.reasons: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        msg, args = record.msg, record.args
        if isinstance(msg, str) and msg.startswith("Bypassing FX Graph Cache") and isinstance(args, tuple) and args:
            self.reasons.append(str(args[0])[:200])
        return record.levelno >= self.user_level


_tap: _BypassTap | None = None


_limit_raised = False


def _prepare() -> None:
    """Once per process: tap bypass reasons once torch is imported, keep every metric once Dynamo is.

    The tap must be in place before the first compile of a test, and ``import torch`` does not import
    Dynamo (torch 2.7-2.15): waiting for Dynamo would lose the reasons of the test that first compiles.
    """
    global _tap, _limit_raised
    if _tap is None and torch_loaded():
        # torch configures its loggers while `import torch` runs: set ours after that, not before.
        logger = logging.getLogger("torch._inductor.codecache")
        _tap = _BypassTap(logger.getEffectiveLevel())
        logger.addFilter(_tap)
        if logger.getEffectiveLevel() > logging.INFO:
            logger.setLevel(logging.INFO)
    if not _limit_raised and dynamo_loaded():
        from torch._dynamo import utils

        if hasattr(utils, "set_compilation_metrics_limit"):
            # The default deque keeps 64 records; a suite compiles far more frames than that.
            utils.set_compilation_metrics_limit(10**6)
        _limit_raised = True


class Mark:
    """Counters and metric position at the start of a phase; ``triton``: triton cache entries written so far."""

    __slots__ = ("counters", "metrics", "reasons", "triton")

    def __init__(self, counters: dict[str, dict[str, int]], metrics: int, reasons: int, triton: int = 0) -> None:
        self.counters = counters
        self.metrics = metrics
        self.reasons = reasons
        self.triton = triton


ZERO = _EMPTY = Mark({}, 0, 0)  # before torch is imported: every counter at zero
_GROUPS = ("inductor", "aot_autograd")


def mark() -> Mark:
    """Cheap snapshot; before torch's Dynamo is imported there are no counters yet (they start at zero)."""
    if not torch_loaded():
        return _EMPTY
    _prepare()
    reasons = len(_tap.reasons) if _tap else 0
    if not dynamo_loaded():
        return Mark({}, 0, reasons, len(_triton_built))
    from torch._dynamo import utils

    counters = {group: dict(utils.counters[group]) for group in _GROUPS if group in utils.counters}
    return Mark(counters, len(_metrics(utils)), reasons, len(_triton_built))


def delta(start: Mark) -> dict[str, Any]:
    """What compiled since ``start``, shaped like ``ItemRecord.to_json`` (counts clamped at zero).

    Counter deltas are clamped because a test may call ``counters.clear()``; metrics after a
    ``clear_compilation_metrics()`` by the test are counted from the start of the list.
    """
    if not dynamo_loaded():
        return {}
    _prepare()
    from torch._dynamo import utils

    def moved(group: str, name: str) -> int:
        now = utils.counters[group].get(name, 0) if group in utils.counters else 0
        return max(0, now - start.counters.get(group, {}).get(name, 0))

    metrics = _metrics(utils)
    new = metrics[start.metrics :] if len(metrics) >= start.metrics else metrics
    autotune = sum(moved("inductor", name) for name in AUTOTUNE_COUNTERS)
    out: dict[str, Any] = {
        "gpu": {
            "triton_bundle_files": moved("inductor", "triton_bundler_read_and_emit_kernel"),
            "triton_built": max(0, len(_triton_built) - start.triton),
            "autotune_benchmarks": autotune,
            "triton_compile_seconds": 0.0,
            "autotune_seconds": 0.0,
        },
        "fxgraph": {k: moved("inductor", f"fxgraph_cache_{k}") for k in ("hit", "miss", "bypass")},
        "aotautograd": {
            k: moved("aot_autograd", f"autograd_cache_{k}") for k in ("hit", "miss", "bypass", "guard_miss")
        },
        "frames": 0,
        "recompiles": 0,
        "compile_seconds": 0.0,
        "remote": {"fx_hit": 0, "fx_miss": 0, "aot_hit": 0, "aot_miss": 0},
    }
    for record in new:
        _add_metric(out, record)
    if _tap is not None:
        out["bypass_reasons"] = sorted(set(_tap.reasons[start.reasons :]))
    return out


# torch's counters of autotuning benchmarks: max-autotune's choice between GEMM templates (2.7-2.15); runtime
# coordinate-descent tuning, pad_mm's padded-or-not and combo kernels (later releases, e.g. 2.13; not 2.7.1).
# An FX-graph hit adds the counts its entry recorded at compile time (codecache: ``counters["inductor"] +=
# graph.counter_deltas``), so a count alone does not prove a benchmark ran now: the seconds do (``dynamo_timed``
# columns, measured only while it runs).
AUTOTUNE_COUNTERS = ("select_algorithm_autotune", "coordesc_tuning_bench", "pad_mm_bench", "combo_autotune_bench")
# CompilationMetrics columns (2.7-2.15) summed into the GPU seconds: triton's compile (async_compile's precompile
# and wait), autotuning at compile time (select_algorithm, benchmark fusion) and at the first call (runtime
# benchmarks of a kernel's configs, recorded as an ``is_runtime`` record after the call; torch 2.7.1 declares the
# column but does not fill it: its first-call autotuning is not measured).
TRITON_COMPILE_METRICS = ("triton_compile_time_us",)
AUTOTUNE_METRICS = ("compile_time_autotune_time_us", "runtime_triton_autotune_time_us")


def _metrics(utils: Any) -> list[Any]:
    """torch's per-compile records; empty where this torch keeps none (capability_notes says so)."""
    get = getattr(utils, "get_compilation_metrics", None)
    return list(get()) if get is not None else []


_ATTEMPT = r"(\d+)/(\d+)"  # compiled by ``re`` on first use, not at import


def _us(record: Any, names: tuple[str, ...]) -> float:
    return sum(int(getattr(record, name, 0) or 0) for name in names) / 1e6


def _add_metric(out: dict[str, Any], record: Any) -> None:
    gpu = out["gpu"]
    gpu["triton_compile_seconds"] += _us(record, TRITON_COMPILE_METRICS)
    gpu["autotune_seconds"] += _us(record, AUTOTUNE_METRICS)
    frame_seconds = getattr(record, "entire_frame_compile_time_s", None)
    backward_us = getattr(record, "backward_cumulative_compile_time_us", None)
    if getattr(record, "is_runtime", False) or (frame_seconds is None and backward_us):
        # A lazily compiled backward: its own record, under its forward's compile id. Not a frame.
        out["compile_seconds"] += (backward_us or 0) / 1e6
    else:
        out["frames"] += 1
        out["compile_seconds"] += frame_seconds or 0.0
        match = re.search(_ATTEMPT, str(getattr(record, "compile_id", "") or ""))
        if getattr(record, "recompile_reason", None) or (match and int(match.group(2)) > 0):
            out["recompiles"] += 1
    remote = out["remote"]
    remote["fx_hit"] += getattr(record, "inductor_fx_remote_cache_hit_count", 0) or 0
    remote["fx_miss"] += getattr(record, "inductor_fx_remote_cache_miss_count", 0) or 0
    remote["aot_hit"] += getattr(record, "aotautograd_remote_cache_hit_count", 0) or 0
    remote["aot_miss"] += getattr(record, "aotautograd_remote_cache_miss_count", 0) or 0


def remote_counts_available() -> bool:
    """AOTAutograd remote hit counts exist in CompilationMetrics from torch 2.11."""
    from torch._dynamo.utils import CompilationMetrics

    return "aotautograd_remote_cache_hit_count" in getattr(CompilationMetrics, "__dataclass_fields__", {})


def capabilities() -> dict[str, bool]:
    """What this torch offers the plugin, probed by attribute (never by version string).

    Keys: ``fx_counters``, ``aot_counters`` (the caches whose counters per-test stats read),
    ``compilation_metrics`` (frames, recompiles, compile seconds), ``metrics_limit`` (more than 64 records
    kept), ``bypass_reasons`` (the codecache log line the bypass tap reads), ``clear_caches`` (isolated
    compiles), ``mega_cache`` (bundles carry torch's artifacts), ``remote_fx_counts``, ``remote_aot_counts``.
    Imports torch's modules: call it only when the session already imported torch.
    """
    import torch
    from torch._dynamo import utils
    from torch._inductor import codecache
    from torch._inductor import utils as inductor_utils

    fields = getattr(utils.CompilationMetrics, "__dataclass_fields__", {})
    aot_cache = False
    with contextlib.suppress(ImportError):
        from torch._functorch._aot_autograd import autograd_cache

        aot_cache = hasattr(autograd_cache, "AOTAutogradCache")
    return {
        "fx_counters": hasattr(codecache, "FxGraphCache"),
        "aot_counters": aot_cache,
        "compilation_metrics": hasattr(utils, "get_compilation_metrics"),
        "metrics_limit": hasattr(utils, "set_compilation_metrics_limit"),
        "bypass_reasons": _logs_bypass_reasons(codecache),
        "clear_caches": hasattr(inductor_utils, "clear_caches") or hasattr(inductor_utils, "clear_inductor_caches"),
        "mega_cache": all(hasattr(torch.compiler, name) for name in ("save_cache_artifacts", "load_cache_artifacts")),
        "remote_fx_counts": "inductor_fx_remote_cache_hit_count" in fields,
        "remote_aot_counts": "aotautograd_remote_cache_hit_count" in fields,
    }


def _logs_bypass_reasons(codecache: Any) -> bool:
    """The tap reads ``log.info("Bypassing FX Graph Cache because '%s'", e)`` on the codecache module's logger."""
    logger = getattr(codecache, "log", None)
    if getattr(logger, "name", None) != "torch._inductor.codecache":
        return False
    try:
        source = Path(codecache.__file__).read_text(encoding="utf-8", errors="replace")
    except (OSError, TypeError):
        return False
    return "Bypassing FX Graph Cache because" in source


# What a missing capability costs the user, in the words of the report.
_MISSING = {
    "fx_counters": "FX graph cache counters not available: per-test FX hits and misses are not measured",
    "aot_counters": "AOTAutograd cache counters not available: per-test AOTAutograd hits and misses are not measured",
    "compilation_metrics": "compilation metrics not available: frames, recompiles and compile seconds are not measured",
    "metrics_limit": "compilation metrics keep only torch's last 64 records: frame counts of long sessions are low",
    "bypass_reasons": "the FX graph cache bypass log line was not found: bypasses are counted without reasons",
    "clear_caches": "no way to clear in-memory kernels: isolated tests may reuse kernels compiled earlier",
    "mega_cache": "no mega-cache API (torch.compiler.save_cache_artifacts): bundles carry no torch artifacts",
}
_MISSING_REMOTE = {
    "remote_fx_counts": "remote FX graph cache counts not available",
    "remote_aot_counts": "AOTAutograd remote cache counts not available (remote FX-graph counts only)",
}


def capability_notes(*, remote: bool = False) -> list[str]:
    """One report note per capability this torch lacks, e.g. "torch 2.7.1: AOTAutograd remote cache counts ...".

    Empty when the session never imported torch (nothing is imported then) or when everything is there.
    ``remote``: a Redis remote cache is on, so missing remote counts matter too. Reads, changes nothing.
    """
    if not dynamo_loaded():
        return []
    import torch

    missing = dict(_MISSING, **_MISSING_REMOTE) if remote else _MISSING
    found = capabilities()
    return [f"torch {torch.__version__}: {text}" for key, text in missing.items() if not found[key]]


# --------------------------------------------------------------------------- cache dirs


def point_cache_dir(cache_dir: str | None, *, disable: bool = False) -> str | None:
    """Make torch use ``cache_dir`` (absolute) from now on; return a note when torch was imported earlier.

    Environment variables are enough before torch is imported. After, torch's in-memory code caches
    still hold kernels from the old dir, so we clear them; some paths are fixed at import (Dynamo's
    precompile cache, precompiled headers), which the note names.
    """
    if cache_dir is not None:
        os.environ.update(cache_dir_env(cache_dir))
    if disable:
        os.environ[DISABLE_ENV] = "1"
    if "torch._inductor" not in sys.modules:
        if disable:  # torch will read the variable at import, and keep what it read for the process
            _config_before.setdefault(_READ_AT_IMPORT, True)
        return None
    note = "torch was imported before pytest-compilecache configured the session"
    with contextlib.suppress(Exception):
        from torch._inductor import config as inductor_config

        if not _clear_inductor_caches():
            return note + "; could not clear its in-memory kernels (no clear_caches), compiles may use the old dir"
        if disable:
            _config_before.setdefault("force_disable_caches", inductor_config.force_disable_caches)
            inductor_config.force_disable_caches = True
        return note + "; switched its cache dir in-process (Dynamo's precompile cache stays where it was)"
    return note + "; could not switch its cache dir in-process, compiles may use the old dir"


# What point_cache_dir changed in torch's config, for put_back_config: inductor config values as they were
# before (torch already imported), or _READ_AT_IMPORT (torch not imported yet, but told by the variable).
_config_before: dict[str, Any] = {}
_READ_AT_IMPORT = "(force_disable_caches read from the environment at import)"
_FORCE_DISABLE_ENVS = (DISABLE_ENV, "TORCH_COMPILE_FORCE_DISABLE_CACHES")  # torch 2.8+ reads either


def put_back_config() -> None:
    """Undo what :func:`point_cache_dir` changed in torch's config, after the lease put the environment back:
    after a ``disabled`` session run in-process (pytester, an IDE), later sessions cache again.

    torch reads ``TORCHINDUCTOR_FORCE_DISABLE_CACHES`` once, at import, and keeps it: 2.8+ as a forced
    value of its config entry (``torch.compiler.config``, which a plain assignment does not override), 2.7
    as a module attribute. When torch was imported while the session's variable was set, the value is read
    again from the environment as it is now.
    """
    changed = dict(_config_before)
    _config_before.clear()
    config = sys.modules.get("torch._inductor.config")
    if not changed or config is None:
        return
    with contextlib.suppress(Exception):
        for name, value in changed.items():
            if name != _READ_AT_IMPORT:
                setattr(config, name, value)
        if _READ_AT_IMPORT in changed:
            _reread_force_disable_caches(config)


def _reread_force_disable_caches(config: Any) -> None:
    compiler_config = sys.modules.get("torch.compiler.config")
    entry = getattr(compiler_config, "_config", {}).get("force_disable_caches")
    if entry is not None and hasattr(entry, "env_value_force"):  # torch 2.8+
        from torch.utils import _config_module

        unset = _config_module._UNSET_SENTINEL
        values = (_config_module._read_env_variable(name) for name in _FORCE_DISABLE_ENVS)
        entry.env_value_force = next((value for value in values if value is not None), unset)
    else:  # torch 2.7: a module attribute computed at import
        config.force_disable_caches = os.environ.get(DISABLE_ENV) == "1"


@contextlib.contextmanager
def isolated_compile(disable: bool = False) -> Iterator[str]:
    """A true cold compile for one test: a fresh dir, torch's in-memory caches cleared, all put back after.

    Yields the temporary cache dir. Switching only the environment variable would silently reuse
    kernels held in memory, hence the ``clear_caches`` and ``torch._dynamo.reset`` on both sides.
    """
    import torch
    from torch._inductor import config as inductor_config

    saved = {name: os.environ.get(name) for name in (CACHE_ENV, TRITON_ENV)}
    tmp = tempfile.mkdtemp(prefix="compilecache-test-")
    collect_used_modules()
    torch._dynamo.reset()
    _clear_inductor_caches()
    os.environ.update(cache_dir_env(tmp))
    try:
        with inductor_config.patch(force_disable_caches=disable, fx_graph_remote_cache=False):
            yield tmp
    finally:
        torch._dynamo.reset()
        _clear_inductor_caches()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        shutil.rmtree(tmp, ignore_errors=True)


def _clear_inductor_caches() -> bool:
    """Forget the kernels torch holds in memory; False when this torch offers no way to (see capability_notes).

    ``torch._inductor.utils.clear_caches`` from torch 2.8; torch 2.7 calls the same function
    ``clear_inductor_caches`` (kept as an alias later).
    """
    from torch._inductor import utils

    clear = getattr(utils, "clear_caches", None) or getattr(utils, "clear_inductor_caches", None)
    if clear is None:
        return False
    clear()
    return True


# --------------------------------------------------------------------------- what a warm start needs

_used: set[str] = set()


def collect_used_modules() -> None:
    """Remember every compiled C++ module loaded so far; ``clear_caches`` would forget them."""
    if "torch._inductor.codecache" not in sys.modules:
        return
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        # Kernel modules are "<key>.kernel" (or a cpp_wrapper entry name) loaded from <cache>/<xx>/<key>.so.
        if path and path.endswith(".so") and os.sep + "torch" + os.sep not in path:
            _used.add(os.path.abspath(path))


def used_files(cache_dir: str) -> list[str]:
    """Relative paths of the files under ``cache_dir`` a warm start needs beside the mega-cache blob.

    On CPU that is every compiled kernel this process loaded (``<key>.main.so``) and the CPU ISA probe
    libraries (``<key>.so`` whose source is an ISA check), which torch builds in the cache dir and which
    the mega-cache does not carry. On GPU (issue 27): every triton cache entry this process looked up
    (:func:`watch_triton_cache`: triton's gcc-built helpers such as ``cuda_utils.so``, the launchers triton 3.3
    builds per kernel signature, and the kernels themselves, which torch's bundle does not carry when triton
    bundling is off or the kernel is a user's ``@triton.jit`` called outside a compiled graph), and the
    autotuning results torch keeps in ``<cache>/cache/`` (max-autotune's GEMM timings, pad_mm's).
    """
    collect_used_modules()
    root = os.path.abspath(cache_dir)
    found: set[str] = set()
    for path in _used:
        if path.startswith(root + os.sep) and os.path.isfile(path):
            found.add(os.path.relpath(path, root))
    for so in Path(root).glob("*/*.so"):
        if not so.name.endswith(".main.so") and _is_isa_probe(so):
            found.add(os.path.relpath(so, root))
    triton = os.path.join(root, "triton") + os.sep
    for directory in sorted(_triton_dirs):
        if directory.startswith(triton) and os.sep not in directory[len(triton) :]:
            found.update(os.path.relpath(path, root) for path in triton_entry_files(directory))
    found.update(os.path.relpath(path, root) for path in autotune_files(root))
    return sorted(p.replace(os.sep, "/") for p in found)


def triton_entry_files(directory: str) -> list[str]:
    """The files of one triton cache entry (``<triton cache>/<key>/``) worth carrying, absolute: regular files,
    not triton's ``lock`` nor its temp files (``tmp.pid_*``), no links. Empty when the dir is not there or is
    itself a link (whatever it points to is not ours to carry)."""
    if os.path.islink(directory):
        return []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return []
    return sorted(
        entry.path
        for entry in entries
        if entry.is_file(follow_symlinks=False) and entry.name != "lock" and not entry.name.startswith("tmp.")
    )


def autotune_files(root: str) -> list[str]:
    """torch's local autotuning results, absolute: the files of ``<cache>/cache/`` (one JSON per system hash:
    ``CacheBase.get_local_cache_path``, 2.7-2.15), which the mega-cache does not carry."""
    return triton_entry_files(os.path.join(root, "cache"))


# Every triton cache dir this process opened (absolute), through triton's FileCacheManager: kernels compiled or
# found, gcc-built helpers and launchers alike. Loaded helpers never appear in sys.modules (triton loads them
# with importlib.util.module_from_spec), so this is how used_files learns of them.
_triton_dirs: set[str] = set()
# One entry per triton cache entry this process wrote: a kernel compiled (triton writes its group file last, on
# a miss only) or a helper library built (a ``.so`` put). torch's bundler writes kernel files itself, not through
# the manager: a kernel from an FX entry's bundle is not counted. Each is work a warm cache should have spared.
_triton_built: list[str] = []
_triton_watch: str | None = None  # None: not tried yet; "" installed; otherwise why not
_TRITON_CACHE = "triton.runtime.cache"


def watch_triton_cache() -> None:
    """Remember every triton cache dir this process opens from now on; never imports triton or torch.

    Wraps ``triton.runtime.cache.FileCacheManager.__init__`` (triton 3.x: ``(key, override=False, dump=False)``,
    setting ``cache_dir``), now if triton is imported, else as soon as it is. Call once per process.
    """
    _install_now_or_on_import(_TRITON_CACHE, _install_triton_watch, pending=_triton_watch is None)


def _install_triton_watch() -> None:
    global _triton_watch
    if _triton_watch is not None:
        return
    try:
        manager: Any = importlib.import_module(_TRITON_CACHE).FileCacheManager
        original = manager.__dict__["__init__"]
    except Exception as exc:  # another triton layout: its files are not carried, the compile is unaffected
        _triton_watch = f"triton cache entries are not carried with this triton ({type(exc).__name__})"
        return

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        with contextlib.suppress(Exception):
            if isinstance(self.cache_dir, str) and self.cache_dir:
                _triton_dirs.add(os.path.abspath(self.cache_dir))

    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    manager.__init__ = __init__
    for name, built in (("put", _a_library), ("put_group", lambda args, kwargs: True)):
        if callable(manager.__dict__.get(name)):
            setattr(manager, name, _counting(manager.__dict__[name], built))
    _triton_watch = ""


def _a_library(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """``put(data, filename, binary=True)`` of a ``.so``: a helper or launcher triton built with the C compiler."""
    filename = args[1] if len(args) > 1 else kwargs.get("filename")
    return isinstance(filename, str) and filename.endswith(".so")


def _counting(original: Any, built: Any) -> Any:
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        with contextlib.suppress(Exception):
            if built(args, kwargs):
                _triton_built.append(str(self.cache_dir))
        return result

    call.__wrapped__ = original  # type: ignore[attr-defined]
    return call


def uninstall_triton_watch() -> None:
    """Put triton's own ``FileCacheManager.__init__`` back and forget the dirs (tests; a session never needs to)."""
    global _triton_watch
    manager: Any = getattr(sys.modules.get(_TRITON_CACHE), "FileCacheManager", None)
    for name in ("__init__", "put", "put_group"):
        original = getattr(manager.__dict__.get(name), "__wrapped__", None) if manager is not None else None
        if original is not None:
            setattr(manager, name, original)
    _triton_watch = None
    _triton_dirs.clear()
    _triton_built.clear()


def _is_isa_probe(so: Path) -> bool:
    source = so.with_suffix(".cpp")
    try:
        with open(source, "rb") as fh:
            return b"_chk_kernel" in fh.read(4096)
    except OSError:
        return False


def save_artifacts() -> bytes | None:
    """torch's mega-cache blob for this process. Call once per process, at session end.

    A second call in the same process makes a later load drop artifacts (torch 2.8-2.15).
    """
    if not dynamo_loaded():
        return None
    import torch
    import torch._inductor.codecache  # noqa: F401  (torch 2.7 needs it imported, pytorch#154463)

    if not hasattr(torch.compiler, "save_cache_artifacts"):
        return None  # no mega-cache on this torch: capability_notes says so
    result = torch.compiler.save_cache_artifacts()
    return None if result is None else bytes(result[0])


def load_artifacts(blob: bytes) -> dict[str, int]:
    """Write one mega-cache blob into the current cache dir; return artifact counts per type.

    Raises whatever torch raises on bad content: callers guard it (a pickle error is possible).
    """
    import torch
    import torch._dynamo  # noqa: F401
    import torch._inductor.codecache  # noqa: F401

    with _profiles_unwritten_where_unread():
        info = torch.compiler.load_cache_artifacts(blob)
    if info is None:
        raise ValueError("torch rejected the cache artifacts")
    return artifact_counts(info)


@contextlib.contextmanager
def _profiles_unwritten_where_unread() -> Iterator[None]:
    """While loading a blob: where this process keeps no local shape profiles, skip writing the blob's.

    A blob saved with a job id (``--compile-cache-pgo``) holds torch's automatic-dynamic profile. Where local
    profiles are off (``TORCH_DYNAMO_AUTOMATIC_DYNAMIC_LOCAL_PGO=0``, a setting ``config.patch`` cannot
    override) torch has no path to write it to and raises, losing the rest of the blob. Nothing in this process
    would read the profile, so its write is skipped: torch asks ``pgo.write_local_impl`` (a module global in
    every supported torch) for the write, and gets a stand-in for as long as the load takes."""
    from torch._dynamo import pgo

    if pgo.code_state_path("compilecache") is not None:  # local profiles on: torch writes it as usual
        yield
        return
    original = pgo.write_local_impl

    def unwritten(cache_key: str, pickled_code: bytes) -> tuple[str, int]:
        return "", len(pickled_code)

    pgo.write_local_impl = unwritten
    try:
        yield
    finally:
        pgo.write_local_impl = original


def artifact_counts(info: Any) -> dict[str, int]:
    """Artifact counts per type from torch's ``CacheInfo``: ``{"inductor": 3, "aot_autograd": 1, ...}``.

    torch 2.8+ keeps ``artifacts``, a dict by type name; torch 2.7 has one list field per type
    (``inductor_artifacts``...), whose names give the same type names.
    """
    artifacts = getattr(info, "artifacts", None)
    if isinstance(artifacts, dict):
        return {str(kind): len(keys) for kind, keys in artifacts.items()}
    counts: dict[str, int] = {}
    for name, keys in vars(info).items():
        if name.endswith("_artifacts") and isinstance(keys, list) and keys:
            counts[name[: -len("_artifacts")]] = len(keys)
    return counts


# --------------------------------------------------------------------------- fingerprint facts


def torch_facts() -> dict[str, str]:
    """What about this torch install decides whether compiled artifacts can be reused here."""
    import torch

    facts = {
        "torch": torch.__version__,
        "torch_git": str(getattr(torch.version, "git_version", "") or ""),
        # Kernel .so keys embed absolute include paths into torch and Python.
        "torch_path": os.path.dirname(os.path.abspath(torch.__file__)),
        "cpu_capability": _safe(lambda: torch.backends.cpu.get_cpu_capability()),
        # The FX key depends on the thread count (torch 2.13+).
        "threads": str(torch.get_num_threads()),
        "cxx": _safe(_compiler_version),
        "torch_tree": _safe(_torch_key),
    }
    return facts


def _safe(fn: Any) -> str:
    try:
        return str(fn())
    except Exception as exc:  # a fact we cannot read is recorded as such, not a crash
        return f"unknown ({type(exc).__name__})"


def _compiler_version() -> str:
    from torch._inductor import cpp_builder

    info = cpp_builder.get_compiler_version_info(cpp_builder.get_cpp_compiler())
    match = re.search(r"(gcc|clang) version [^\s_]+(?: \([^)]*\))?", info)
    return match.group(0) if match else info[-120:]


def _torch_key() -> str:
    from torch._inductor.codecache import torch_key

    return str(torch_key().hex())[:16]


class Devices(NamedTuple):
    """What torch and triton key compiled GPU code on, as read from one process (the seam tests fill in).

    ``properties`` are torch's device-property objects (``torch.cuda.get_device_properties``) of every
    visible GPU, or objects with the same attributes (``name``, ``major``, ``minor``,
    ``multi_processor_count``, ``gcnArchName``; on CUDA builds torch sets ``gcnArchName`` to the name).
    ``triton_key``: a short hash of triton's ``triton_key()`` (its files' content hash, which torch's FX key
    uses), "" when no GPU made it matter.
    """

    cuda: str
    hip: str
    triton: str
    triton_key: str
    properties: list[Any]


def device_facts(devices: Devices | None = None) -> dict[str, Any]:
    """Recorded device facts: ``{"cuda", "hip", "triton", "triton_key", "gpus": [{"name", "capability", "sms"}]}``.

    ``capability`` is what the compiled code was built for: ``major.minor`` on CUDA (triton's kernel key and
    ``-arch=sm_XY``), the ``gcnArchName`` on ROCm (what torch's FX key reads there); ``sms`` the multiprocessor
    count, which generated kernels bake in (MIG slices and cut-down parts share a name). ``devices=None``
    reads this machine through :func:`read_devices` (never initialises CUDA in this process).
    """
    found = read_devices() if devices is None else devices
    return {
        "cuda": found.cuda,
        "hip": found.hip,
        "triton": found.triton,
        "triton_key": found.triton_key,
        "gpus": [_gpu_fact(props, rocm=bool(found.hip)) for props in found.properties],
    }


def _gpu_fact(props: Any, *, rocm: bool) -> dict[str, Any]:
    # On CUDA builds gcnArchName is the device name again (torch/cuda/_utils.py), never the capability.
    arch = str(getattr(props, "gcnArchName", "") or "") if rocm else ""
    return {
        "name": str(props.name),
        "capability": arch or f"{props.major}.{props.minor}",
        "sms": int(props.multi_processor_count),
    }


# Run in a short-lived child: reading device properties initialises CUDA in the process that asks, after
# which CUDA fails in forked children (``pytest --forked``, fork-based multiprocessing) and the process holds
# a GPU context. The child prints the same attributes the property objects have.
_PROPERTY_NAMES = ("name", "major", "minor", "multi_processor_count", "gcnArchName")
_CHILD = """
import json, sys
sys.path.insert(0, sys.argv[1])
from pytest_compilecache import probe
devices = probe.read_devices_here()
print(json.dumps(devices._replace(properties=[probe.property_values(p) for p in devices.properties])._asdict()))
"""
CHILD_TIMEOUT = 120.0


def read_devices() -> Devices:
    """This machine's :class:`Devices`, without initialising CUDA in this process.

    A CPU-only torch build, or NVML (AMD SMI on ROCm) counting no visible GPU: no GPUs, nothing spawned.
    CUDA already initialised here (the tests used the GPU in this process): read here. Otherwise a
    short-lived child process reads them (about one ``import torch``); a child that fails is recorded as an
    unknown GPU, never a crash.
    """
    import torch

    none = _no_devices(torch)
    if not (none.cuda or none.hip) or _visible_gpus(torch, rocm=bool(none.hip)) == 0:
        return none
    if torch.cuda.is_initialized():
        return read_devices_here()
    return _read_devices_in_child(none)


def _visible_gpus(torch: Any, *, rocm: bool) -> int:
    """NVML's (AMD SMI's) count of the GPUs ``CUDA_VISIBLE_DEVICES`` leaves; -1 when it cannot tell.

    torch's own ``device_count`` uses the same private helpers so that it does not initialise CUDA (2.4-2.15).
    """
    count = getattr(torch.cuda, "_device_count_amdsmi" if rocm else "_device_count_nvml", None)
    if count is None:
        return -1
    try:
        with warnings.catch_warnings():  # "Can't initialize NVML" is a warning torch raises, not our news
            warnings.simplefilter("ignore")
            found = int(count())
    except Exception:
        return -1
    if found < 0 and not rocm and sys.platform == "linux" and not os.path.exists("/proc/driver/nvidia"):
        return 0  # no NVIDIA driver loaded: CUDA would find no device either
    return found


def read_devices_here() -> Devices:
    """Read the visible GPUs in this process. Initialises CUDA here: call it only where CUDA is in use anyway
    (or in the short-lived child)."""
    import torch

    none = _no_devices(torch)
    if not torch.cuda.is_available():
        return none
    properties = [torch.cuda.get_device_properties(index) for index in range(torch.cuda.device_count())]
    return none._replace(triton_key=_safe(_triton_key) if properties else "", properties=properties)


def _no_devices(torch: Any) -> Devices:
    """The versions torch was built with and triton's version; no GPUs yet."""
    triton = ""
    with contextlib.suppress(Exception):
        # Through importlib: triton comes only with CUDA/ROCm builds, so type checks cannot rely on its stubs.
        triton = str(importlib.import_module("triton").__version__)
    return Devices(str(torch.version.cuda or ""), str(getattr(torch.version, "hip", None) or ""), triton, "", [])


def _triton_key() -> str:
    """A short hash of ``triton_key()``: the content hash of triton's sources and ``libtriton``, which torch's FX
    key uses instead of the version (triton is rebuilt without a version change). Found where torch finds it: its
    ``triton_compat`` (2.8-2.15), else triton's own modules (``runtime.cache`` from 3.4, ``compiler.compiler``)."""
    for module in ("torch._inductor.runtime.triton_compat", "triton.runtime.cache", "triton.compiler.compiler"):
        with contextlib.suppress(ImportError):
            key = getattr(importlib.import_module(module), "triton_key", None)
            if callable(key):
                return hashlib.sha256(str(key()).encode()).hexdigest()[:16]
    raise ImportError("no triton_key() in this torch or triton")


def property_values(props: Any) -> dict[str, Any]:
    """The attributes of one device-property object the facts use, as plain JSON values."""
    return {name: getattr(props, name, None) for name in _PROPERTY_NAMES}


def devices_from_json(data: Any) -> Devices:
    """Rebuild :class:`Devices` from what the child printed (properties as attribute objects).

    Raises ValueError when the printed JSON has another shape."""
    if not isinstance(data, dict) or not isinstance(data.get("properties"), list):
        raise ValueError(f"device query printed {str(data)[:100]!r}")
    properties = []
    for values in data["properties"]:
        if not isinstance(values, dict) or not isinstance(values.get("name"), str):
            raise ValueError(f"device query printed a malformed device {str(values)[:100]!r}")
        properties.append(SimpleNamespace(**{name: values.get(name) for name in _PROPERTY_NAMES}))
    text = {name: str(data.get(name) or "") for name in ("cuda", "hip", "triton", "triton_key")}
    return Devices(properties=properties, **text)


def _read_devices_in_child(none: Devices) -> Devices:
    package_parent = str(Path(__file__).resolve().parent.parent)
    try:
        done = subprocess.run(
            [sys.executable, "-c", _CHILD, package_parent],
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT,
            check=False,
        )
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"exit status {done.returncode}: {last[:160]}")
        child = devices_from_json(json.loads(done.stdout.strip().splitlines()[-1]))
        return none._replace(triton_key=child.triton_key, properties=child.properties)  # versions: this process's
    except Exception as exc:  # a fact we cannot read is recorded as such, not a crash
        unknown = SimpleNamespace(name=f"unknown ({type(exc).__name__})", major="?", minor="?", multi_processor_count=0)
        return none._replace(triton_key="unknown", properties=[unknown])


# --------------------------------------------------------------------------- per-graph lookups (issue 12)

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
    # cost: explain loads with the first FX-graph lookup, not with the plugin
    from .explain import lookup_from_torch

    info = result[1] if isinstance(result, tuple) and len(result) == 2 else {}
    state = info.get("cache_state") if isinstance(info, dict) else None
    if state not in ("hit", "miss") or not isinstance(key, str) or not isinstance(debug_lines, list):
        return
    if state == "miss" and info.get("cache_status_detailed") == "guard_miss":
        state = "guard_miss"  # the entry exists; its symbolic-shape guards failed (torch 2.13+ says so)
    lookup = lookup_from_torch(key, state, debug_lines, defaults=_inductor_defaults(), values=_torch_values())
    _lookups.append(lookup.to_json())


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


_CODECACHE = "torch._inductor.codecache"


class _InstallOnImport:
    """A ``sys.meta_path`` entry that calls ``install`` right after torch imports module ``module``.

    torch imports ``torch._inductor.codecache`` (and ``remote_cache``) lazily, at the first compile,
    inside a test; without this the first test's lookups would pass before we could wrap anything. It
    answers only for that one module name (one string comparison per import otherwise) and removes itself
    once used.
    """

    def __init__(self, module: str, install: Any) -> None:
        self.module = module
        self.installs = [install]  # one entry per module: the first finder to answer is the only one asked

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != self.module:
            return None
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)
        import importlib.util

        spec = importlib.util.find_spec(name)
        loader = getattr(spec, "loader", None)
        exec_module = getattr(loader, "exec_module", None)
        if spec is None or exec_module is None:
            return spec

        installs = self.installs

        def exec_and_install(module: Any) -> None:
            exec_module(module)
            for install in installs:
                with contextlib.suppress(Exception):
                    install()

        loader.exec_module = exec_and_install  # type: ignore[union-attr]
        return spec


def watch_graph_lookups() -> None:
    """Capture every FX-graph lookup of this process from now on; never imports torch.

    Call once per process (the plugin's configure step, in every xdist worker). Installs now when
    torch's codecache is already imported, else as soon as it is.
    """
    _install_now_or_on_import(_CODECACHE, graph_capture_installed, pending=_graph_capture is None)


def _install_now_or_on_import(module: str, install: Any, *, pending: bool) -> None:
    if module in sys.modules:
        install()
        return
    if not pending:
        return
    hook = next((f for f in sys.meta_path if isinstance(f, _InstallOnImport) and f.module == module), None)
    if hook is None:
        sys.meta_path.insert(0, _InstallOnImport(module, install))
    elif install not in hook.installs:
        hook.installs.append(install)  # another wrapper of the same module (graph lookups, headers)


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
    return list(_lookups[start:]) if start <= len(_lookups) else list(_lookups)


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


# --------------------------------------------------------------------------- Redis remote cache guard

_REMOTE_CACHE = "torch._inductor.remote_cache"
_remote_guard: str | None = None  # None: not tried yet; "" installed; otherwise why not
_remote_errors: list[str] = []
_remote_off = False  # set by the guard at the first Redis error: every later call in this process is skipped


def guard_remote_cache() -> None:
    """From now on, a Redis error in torch's remote caches switches them off for this process and is recorded
    (:func:`remote_cache_errors`) instead of failing the compile; never imports torch.

    torch's ``RedisRemoteCacheBackend`` (2.7-2.15) turns itself off on ``ConnectionError`` alone: a timeout,
    a full Redis (``OOM``), a read-only replica or a paused primary raise out of ``torch.compile`` and fail
    the test (``AOTAutogradCache.save`` calls ``put`` without a ``try``). The wrapper catches every
    ``redis.exceptions.RedisError`` the way torch catches ``ConnectionError`` (the backend's client is
    dropped, later calls are misses), and also records the lost connections torch swallows silently. Call
    once per process where the session turned Redis on (the controller and every xdist worker).
    """
    _install_now_or_on_import(_REMOTE_CACHE, _install_remote_guard, pending=_remote_guard is None)


def remote_cache_errors() -> list[str]:
    """Take the Redis errors recorded since the last call (one line each; empty when none, or no guard)."""
    taken = list(_remote_errors)
    del _remote_errors[: len(taken)]
    return taken


def _install_remote_guard() -> None:
    global _remote_guard
    if _remote_guard is not None:
        return
    try:
        import redis
        from torch._inductor.remote_cache import RedisRemoteCacheBackend

        originals = {name: RedisRemoteCacheBackend.__dict__[name] for name in ("_get", "_put")}
        failure: type[BaseException] = redis.exceptions.RedisError
    except Exception as exc:  # no redis client (then torch has no Redis cache either) or another torch layout
        _remote_guard = f"Redis errors are not guarded on this torch ({type(exc).__name__})"
        return

    def guarded(name: str, original: Any) -> Any:
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            global _remote_off
            if _remote_off:
                return None  # a miss, or a put not made: torch builds a new backend per compile, so the
                # switch is the process's, not one backend's (else each compile waits out the timeout again)
            if getattr(self, "_redis", None) is None:
                return original(self, *args, **kwargs)  # off already: torch's own early return
            try:
                result = original(self, *args, **kwargs)
            except failure as exc:
                self._redis = None  # what torch does on ConnectionError: no more calls from this backend
                _remote_off = True
                _remote_errors.append(f"{name.strip('_')}: {type(exc).__name__}: {' '.join(str(exc).split())[:160]}")
                return None
            if getattr(self, "_redis", None) is None:  # torch caught a ConnectionError and switched off
                _remote_off = True
                _remote_errors.append(f"{name.strip('_')}: the connection was lost")
            return result

        call.__wrapped__ = original  # type: ignore[attr-defined]
        return call

    backend: Any = RedisRemoteCacheBackend
    for name, original in originals.items():
        setattr(backend, name, guarded(name, original))
    _remote_guard = ""


def uninstall_remote_guard() -> None:
    """Put torch's own ``_get``/``_put`` back (tests; a session never needs to)."""
    global _remote_guard, _remote_off
    module = sys.modules.get(_REMOTE_CACHE)
    backend = getattr(module, "RedisRemoteCacheBackend", None)
    for name in ("_get", "_put"):
        original = getattr(getattr(backend, name, None), "__wrapped__", None)
        if original is not None:
            setattr(backend, name, original)
    _remote_guard = None
    _remote_off = False
    _remote_errors.clear()


# --------------------------------------------------------------------------- precompiled headers


def precompiled_header_dir() -> str | None:
    """torch's precompiled-header dir in this process, or None where this torch has none (2.7) or is not loaded.

    Reads ``torch._inductor.codecache._HEADER_DIR`` (2.8-2.15) only when torch already imported that module, so
    it never costs an import. ``headers.header_dir()`` computes the same path without torch; call this at
    session end, in each process that compiled, to check that the two agree before carrying headers (a
    mismatch means a torch that moved the dir: carry nothing rather than the wrong files).
    """
    codecache = sys.modules.get("torch._inductor.codecache")
    if codecache is None or not callable(getattr(codecache, "_precompile_header", None)):
        return None
    directory = getattr(codecache, "_HEADER_DIR", None)
    return directory if isinstance(directory, str) else None


_header_watch: str | None = None  # None: not tried yet; "" installed; otherwise why not
_header_uses: dict[str, dict[str, Any]] = {}  # header name -> its HeaderUse JSON, for this process
_early_checks: list[Path] = []  # headers this process's restore installs, to check early (check_headers_early)


def watch_precompiled_headers() -> None:
    """From now on, check every precompiled header torch looks up in this process before a kernel uses it,
    and remember it for :func:`precompiled_headers_used`; never imports torch.

    Call once per process (the plugin's configure step, in every xdist worker). Installs now when torch's
    codecache is already imported, else as soon as it is. See :mod:`.headers` (issue 24) for why.
    """
    _install_now_or_on_import(_CODECACHE, _install_header_watch, pending=_header_watch is None)


def precompiled_headers_used() -> list[dict[str, Any]]:
    """The headers torch looked up in this process so far, each checked once (``headers.HeaderUse`` JSON)."""
    return [dict(use) for use in _header_uses.values()]


def check_headers_early(names: Iterable[str], directory: Path | None = None) -> None:
    """Headers a restore is installing (or installed) for this process: their compiled ``.gch``/``.pch``
    names, in ``directory`` (default: torch's header dir for this process, :func:`.headers.header_dir`).

    At torch's first header look-up in this process they are checked in a thread, under the flags of that
    look-up, while torch works out which header it wants (it preprocesses the header and hashes the result:
    about as long as the check), and each acceptance goes into the header dir's record
    (:data:`.headers.VERDICTS`). The look-up's own check, after torch has answered, then finds the verdict (or
    waits for it: checks of one file take turns) instead of running the compiler on the critical path. A
    rejection is not remembered, so a damaged header is still found, removed and rebuilt by that check.
    Never imports torch; a name torch could not give a header is ignored."""
    from . import pch as headers  # cost: only in a process that restored headers

    target = directory or headers.header_dir()
    _early_checks[:] = [target / name for name in names if headers.is_header_name(name)]


def _start_early_checks(compile_command: dict[str, Any]) -> None:
    """Check the headers :func:`check_headers_early` named, in a thread, each once installed (best effort)."""
    import threading  # cost: only in a process that restored headers

    paths = list(_early_checks)
    _early_checks.clear()

    def run() -> None:
        from . import pch as headers

        def command(source: Path, include: Path) -> list[str]:
            return _header_check_command(compile_command, str(source), str(include))

        for path in paths:
            with contextlib.suppress(Exception):  # advisory: the look-up's own check decides
                if headers.wait_while_built(path) and path.name not in _header_uses:
                    headers.check(path, command, remember=True)

    threading.Thread(target=run, name="compilecache-header-check", daemon=True).start()


def _install_header_watch() -> None:
    """Wrap ``codecache._precompile_header(header, hashable_cmd_line, **compile_command) -> path`` (2.8-2.15).

    torch calls it, by its module-global name, from ``CppCodeCache.load_async`` for every kernel key not yet
    loaded in this process and uses the returned ``<dir>/<hash>.h`` with ``-include``; it is a
    ``functools.cache``, and builds the header only when the compiled file is absent. The wrapper returns
    torch's answer unchanged, after the first look-up of each header in this process has checked it.
    """
    global _header_watch
    if _header_watch is not None:
        return
    codecache = sys.modules.get(_CODECACHE)
    original = getattr(codecache, "_precompile_header", None)
    if codecache is None or not callable(original) or not callable(getattr(original, "__wrapped__", None)):
        _header_watch = "this torch precompiles no header"  # 2.7: nothing to check or carry
        return

    def _precompile_header(header: Any, hashable_cmd_line: Any, **compile_command: Any) -> Any:
        if _early_checks:  # torch pops from compile_command: the thread gets its own copy
            with contextlib.suppress(Exception):
                _start_early_checks(dict(compile_command))
        path = original(header, hashable_cmd_line, **compile_command)
        with contextlib.suppress(Exception):  # a failure of ours never fails torch's compile
            _check_header(
                path, lambda: original.__wrapped__(header, hashable_cmd_line, **compile_command), compile_command
            )
        return path

    _precompile_header.__wrapped__ = original  # type: ignore[attr-defined]
    for name in ("cache_info", "cache_clear"):  # still torch's functools.cache to anyone who asks
        if hasattr(original, name):
            setattr(_precompile_header, name, getattr(original, name))
    setattr(codecache, "_precompile_header", _precompile_header)  # noqa: B010 (a module typed as ModuleType)
    compile_cpp = getattr(codecache, "_worker_compile_cpp", None)
    if callable(compile_cpp) and getattr(compile_cpp, "__wrapped__", None) is None:
        _worker_compile_cpp.__wrapped__ = compile_cpp  # type: ignore[attr-defined]
        setattr(codecache, "_worker_compile_cpp", _worker_compile_cpp)  # noqa: B010
    _header_watch = ""


def _worker_compile_cpp(lock_path: str, cpp_builders: Any) -> None:
    """torch's ``codecache._worker_compile_cpp(lock_path, cpp_builders)`` (2.8-2.15), which builds a kernel in
    this process or in a compile worker (this function is pickled there by name): a failure whose compiler
    complains about a precompiled header it names drops that header's verdict and removes it
    (:func:`.pch.after_compile_error`), so that the next look-up checks it and torch builds it again."""
    codecache = sys.modules.get(_CODECACHE) or importlib.import_module(_CODECACHE)
    current = getattr(codecache, "_worker_compile_cpp", None)
    original = getattr(current, "__wrapped__", current)  # a compile worker: torch's own, never wrapped there
    try:
        original(lock_path, cpp_builders)  # type: ignore[misc]
    except Exception as exc:
        with contextlib.suppress(Exception):  # a failure of ours never hides torch's
            from . import pch

            where = precompiled_header_dir()
            for use in pch.after_compile_error(str(exc), Path(where) if where else None):
                _header_uses[use.name] = use.to_json()
        raise


def uninstall_header_watch() -> None:
    """Put torch's own ``_precompile_header`` back and forget what was recorded (tests)."""
    global _header_watch
    codecache = sys.modules.get(_CODECACHE)
    original = getattr(getattr(codecache, "_precompile_header", None), "__wrapped__", None)
    if codecache is not None and original is not None and getattr(original, "__wrapped__", None) is not None:
        setattr(codecache, "_precompile_header", original)  # noqa: B010
    compile_cpp = getattr(getattr(codecache, "_worker_compile_cpp", None), "__wrapped__", None)
    if codecache is not None and compile_cpp is not None:
        setattr(codecache, "_worker_compile_cpp", compile_cpp)  # noqa: B010
    _header_watch = None
    _header_uses.clear()
    _early_checks.clear()


def _compiled_header(path: str) -> Path | None:
    """The compiled file beside torch's ``<hash>.h``: ``.gch`` (gcc) or ``.pch`` (clang), whichever exists."""
    for suffix in (".gch", ".pch"):
        candidate = Path(path + suffix)
        if candidate.is_file() and not candidate.is_symlink():
            return candidate
    return None


def _check_header(path: Any, rebuild: Any, compile_command: dict[str, Any]) -> None:
    """Check the header at ``path`` once per process (and once per file across processes: a file the
    compiler accepted before, unchanged, is not compiled against again, ``headers.VERDICTS``); when the
    compiler rejects it, remove it and have torch build it again (``rebuild``: torch's uncached
    ``_precompile_header``), then check that one."""
    # cost: headers loads with the first header torch looks up, not with the plugin
    from . import pch as headers

    compiled = _compiled_header(str(path)) if isinstance(path, str) else None
    if compiled is None or compiled.name in _header_uses:
        return

    def command(source: Path, include: Path) -> list[str]:
        return _header_check_command(compile_command, str(source), str(include))

    def verdict() -> tuple[str | None, os.stat_result]:
        info = os.lstat(compiled)
        return headers.check(compiled, command, remember=True), info  # an accepted file is checked once

    name = compiled.name
    try:
        reason, info = verdict()
    except Exception as exc:  # no compiler, a timeout, a torch whose builder API moved: proves nothing
        _header_uses[name] = {
            "name": name,
            "verdict": "unchecked",
            "note": f"precompiled header {name} not checked (so not carried): {exc}",
        }
        return
    if reason is None:
        _header_uses[name] = _use(name, "verified", info)
        return
    what = f"precompiled header {name} rejected by the compiler ({reason})"
    if not headers.remove_if_unchanged(compiled, info):
        _header_uses[name] = _use(name, "damaged", info, f"{what}; could not remove it (torch holds its lock)")
        return
    try:
        rebuild()
        again, info = verdict()
    except Exception as exc:  # torch's build failed, or the check could not run: nothing to carry
        note = f"{what}; removed it, then: {type(exc).__name__}: {exc}"
        _header_uses[name] = {"name": name, "verdict": "unchecked", "note": note}
        return
    if again is None:
        _header_uses[name] = _use(name, "rebuilt", info, f"{what}; removed it and torch built it again")
    else:
        _header_uses[name] = _use(name, "damaged", info, f"{what}; torch's new build is rejected too ({again})")


def _use(name: str, verdict: str, info: os.stat_result, note: str = "") -> dict[str, Any]:
    return {
        "name": name,
        "verdict": verdict,
        "size": info.st_size,
        "mtime_ns": info.st_mtime_ns,
        "ino": info.st_ino,
        "note": note,
    }


def _header_check_command(compile_command: dict[str, Any], source: str, include: str) -> list[str]:
    """torch's own command line for compiling ``source`` with ``-include <include>`` under the options it
    precompiled the header with (``CppTorchDeviceOptions(**compile_command)``, as ``load_async`` builds the
    kernel that uses it), as an argv."""
    import shlex

    from torch._inductor.cpp_builder import CppBuilder
    from torch._inductor.cpp_builder import CppTorchDeviceOptions

    # extra_flags: link inputs torch strips before precompiling too; the mode flags: ours decides the mode.
    dropped = ("extra_flags", "compile_only", "precompiling", "preprocessing")
    options = {key: value for key, value in compile_command.items() if key not in dropped}
    build_option = CppTorchDeviceOptions(**options, compile_only=True)
    build_option.precompiled_header = include
    output = str(Path(source).with_suffix(""))
    return shlex.split(CppBuilder(name=output, sources=source, BuildOption=build_option).get_command_line())
