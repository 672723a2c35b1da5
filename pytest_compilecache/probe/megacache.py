"""torch's mega-cache (save and load the artifacts of a process) and the files a warm start needs beside it.

PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Any
from typing import Iterator

from .hooks import dynamo_loaded
from .triton import autotune_files
from .triton import triton_dirs
from .triton import triton_entry_files

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
    the mega-cache does not carry. On GPU: every triton cache entry this process looked up
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
    for directory in sorted(triton_dirs):
        if directory.startswith(triton) and os.sep not in directory[len(triton) :]:
            found.update(os.path.relpath(path, root) for path in triton_entry_files(directory))
    found.update(os.path.relpath(path, root) for path in autotune_files(root))
    return sorted(p.replace(os.sep, "/") for p in found)


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
    import torch._inductor.codecache  # noqa: F401  (torch 2.7 needs it imported, pytorch/pytorch#154463)

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
