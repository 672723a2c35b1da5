"""The triton cache entries this process opened and built (through triton's ``FileCacheManager``).

Never imports triton or torch on its own.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from typing import Any

from .hooks import install_now_or_on_import


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
triton_dirs: set[str] = set()
# One entry per triton cache entry this process wrote: a kernel compiled (triton writes its group file last, on
# a miss only) or a helper library built (a ``.so`` put). torch's bundler writes kernel files itself, not through
# the manager: a kernel from an FX entry's bundle is not counted. Each is work a warm cache should have spared.
triton_built: list[str] = []
_triton_watch: str | None = None  # None: not tried yet; "" installed; otherwise why not
_TRITON_CACHE = "triton.runtime.cache"


def watch_triton_cache() -> None:
    """Remember every triton cache dir this process opens from now on; never imports triton or torch.

    Wraps ``triton.runtime.cache.FileCacheManager.__init__`` (triton 3.x: ``(key, override=False, dump=False)``,
    setting ``cache_dir``), now if triton is imported, else as soon as it is. Call once per process.
    """
    install_now_or_on_import(_TRITON_CACHE, _install_triton_watch, pending=_triton_watch is None)


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
                triton_dirs.add(os.path.abspath(self.cache_dir))

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
                triton_built.append(str(self.cache_dir))
        return result

    call.__wrapped__ = original  # type: ignore[attr-defined]
    return call


# torch (2.8+) keeps, in an FX entry, the kernels it can launch without triton's launcher: pickled autotuners
# holding the absolute path of the kernel's module in the cache dir that compiled it, where it looks up (and
# saves) the kernel's best config. Restored into another dir (an isolated one, another runner's), they looked
# there and found nothing: the fresh runner benchmarked the kernel's configs again and saved the result outside
# its own cache dir. Each is moved to this cache dir as it is loaded, as torch moves its kernel files.
_TRITON_BUNDLER = "torch._inductor.triton_bundler"
_relocating: str | None = None  # None: not tried yet; "" installed; otherwise why not


def relocate_static_autotuners() -> None:
    """Move every statically launched autotuner torch loads from an FX entry from now on to this process's cache
    dir (:func:`relocate_autotuner`); never imports torch. Call once per process."""
    install_now_or_on_import(_TRITON_BUNDLER, _install_relocation, pending=_relocating is None)


def _install_relocation() -> None:
    global _relocating
    if _relocating is not None:
        return
    try:
        bundler: Any = importlib.import_module(_TRITON_BUNDLER).TritonBundler
        original = bundler.__dict__["load_autotuners"].__func__  # a classmethod (torch 2.8-2.15)
        from torch._inductor.runtime.cache_dir_utils import cache_dir
    except Exception as exc:  # torch 2.7 has no static autotuners; another layout: nothing to move
        _relocating = f"static autotuners are not moved with this torch ({type(exc).__name__})"
        return

    def load_autotuners(cls: Any, static_autotuners: Any) -> Any:
        with contextlib.suppress(Exception):
            root = cache_dir() if static_autotuners else ""  # torch's own call (it makes the dir): only if needed
            for result in static_autotuners or ():
                relocate_autotuner(getattr(result, "kernel", None), root)
        return original(cls, static_autotuners)

    load_autotuners.__wrapped__ = original  # type: ignore[attr-defined]
    bundler.load_autotuners = classmethod(load_autotuners)
    _relocating = ""


def relocate_autotuner(kernel: Any, root: str) -> None:
    """Point ``kernel`` (torch's ``CachingAutotuner``) at cache dir ``root``: its module's path
    (``<dir>/<shard>/<name>.py``, where its best config is looked up) and its local best-config file, each
    where it is under ``root``. Anything else is left as it is."""
    moved = _under(root, getattr(kernel, "filename", None))
    if moved is not None:
        kernel.filename = moved
    autotune_cache: Any = getattr(getattr(kernel, "save_cache_hook", None), "__self__", None)
    local = getattr(autotune_cache, "local_cache", None)
    if isinstance(local, tuple) and len(local) == 2:
        moved = _under(root, local[1])
        if moved is not None:
            autotune_cache.local_cache = (local[0], moved)


def _under(root: str, path: Any) -> str | None:
    """``<dir>/<shard>/<name>`` (absolute, in another dir than ``root``) as ``<root>/<shard>/<name>``."""
    if not isinstance(path, str) or not os.path.isabs(path):
        return None
    shard, name = os.path.split(os.path.dirname(path))[1], os.path.basename(path)
    if not shard or not name or os.path.dirname(os.path.dirname(path)) == os.path.normpath(root):
        return None
    return os.path.join(root, shard, name)


def uninstall_triton_watch() -> None:
    """Put triton's own ``FileCacheManager.__init__`` back and forget the dirs (tests; a session never needs to)."""
    global _triton_watch
    manager: Any = getattr(sys.modules.get(_TRITON_CACHE), "FileCacheManager", None)
    for name in ("__init__", "put", "put_group"):
        original = getattr(manager.__dict__.get(name), "__wrapped__", None) if manager is not None else None
        if original is not None:
            setattr(manager, name, original)
    _triton_watch = None
    triton_dirs.clear()
    triton_built.clear()
    global _relocating
    bundler: Any = getattr(sys.modules.get(_TRITON_BUNDLER), "TritonBundler", None)
    wrapped = getattr(getattr(bundler, "load_autotuners", None), "__wrapped__", None) if bundler else None
    if wrapped is not None:
        bundler.load_autotuners = classmethod(wrapped)
    _relocating = None
