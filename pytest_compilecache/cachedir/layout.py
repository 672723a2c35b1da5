"""The names in a cache dir: our markers, torch's cache layout and the temp names of writers in flight.

A leaf of the package: pure name tests, no I/O, nothing of ours but :mod:`.._fs` (loaded lazily).
"""

from __future__ import annotations

import os
import re

LOCK_NAME = ".compilecache.lock"
SESSIONS_DIR = ".compilecache-sessions"
TEMP_PREFIX = ".compilecache-tmp-"  # what older versions' temp names start with (see _OUR_TEMP)
# GRAPHS_RECORD: explain.RECORD_NAME, the graphs the next session explains its misses against (issue 12);
# ours in any dir (so an untagged torch dir that holds it is not "foreign" next time), never trimmed.
GRAPHS_RECORD = ".compilecache-graphs.json"
# PENDING_DIR: a restored bundle's mega-cache blobs, installed there by a restore in another process (the
# Action's restore step) for the next pytest session to load into torch and remove (sync.load_staged).
PENDING_DIR = ".compilecache-pending"
OUR_NAMES = frozenset({"CACHEDIR.TAG", ".gitignore", LOCK_NAME, SESSIONS_DIR, GRAPHS_RECORD, PENDING_DIR})

# torch 2.6-2.15: every name ``torch/_inductor`` (codecache, cpp_builder, runtime/*, autoheuristic,
# compiler_bisector, aoti_eager, codegen/cutlass), ``_functorch/_aot_autograd/autograd_cache`` and
# ``_dynamo`` (package, pgo) join onto ``cache_dir()``, plus Triton's dir and the precompiled headers
# (which torch keeps under its default dir, the one a user may point us at).
TORCH_DIRS = frozenset(
    {
        "fxgraph", "aotautograd", "dynamo", "triton", "locks", "cache", "gcc", "unhashed_kernel_inputs",
        "torch_cutlass", "aoti_eager", "autoheuristic", "bisect", "precompiled_headers",
        "cutedsl_compile_cache",
    }
)  # fmt: skip
TORCH_FILES = frozenset({"memoizer_cache.json", "memoizer_cache.lock"})
# codecache.get_path: ``<key[1:3]>/<key>.<ext>``; keys are lowercase base32 (or hex) hashes.
# Patterns are kept as strings: ``re`` compiles each on first use and caches it. Compiled at import they
# would cost every session, and most never look at them (bench/overhead.py --instructions).
KERNEL_DIR = r"[a-z0-9]{2}"
KERNEL_NAME = r"[a-z0-9_]{20,}(\.[A-Za-z0-9_]+)*"
TORCH_TEMP = r"\.(\d+)\.\d+\.tmp"  # codecache.write_atomic
TORCH_TOP_FILE = r"tmp[a-z0-9_]{8}\.py|configs_[A-Za-z0-9_]+\.json"  # wrapper.py, cutlass
# Our temp names are _fs.temp_name's. Older versions of the plugin named them TEMP_PREFIX + <pid>-<host> +
# anything, ``.<name>.<pid>-<host>.<random>.tmp`` (atomic_file) or ``.<name>.<random>.tmp``: still ours,
# swept by age alone.
_OUR_TEMP = re.escape(TEMP_PREFIX) + r"(\d+)-([0-9a-f]{8})-.*"
_ATOMIC_TEMP = r"\..+\.(\d+)-([0-9a-f]{8})\.[a-z0-9_]{8}\.tmp"
_ATOMIC_TEMP_OLD = r"\..+\.[a-z0-9_]{8}\.tmp"

CLOEXEC = getattr(os, "O_CLOEXEC", 0)
DIR_NOFOLLOW = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | CLOEXEC


def is_temp_name(name: str) -> bool:
    """A name someone is writing under (ours or torch's ``write_atomic``), never a finished cache file."""
    # cost: _fs loads only when a cache dir of ours is inspected. Bundle staging dirs and save/restore temps
    # (swept by _fs.sweep_stale) are ours too.
    from .._fs import parse_temp_name

    return bool(parse_temp_name(name) is not None or re.fullmatch(TORCH_TEMP, name) or is_legacy_temp_name(name))


def is_legacy_temp_name(name: str) -> bool:
    """A temp name of an older version of the plugin (its owner's host id is not comparable to ours)."""
    return bool(
        re.fullmatch(_OUR_TEMP, name)
        or re.fullmatch(_ATOMIC_TEMP, name)
        or re.fullmatch(_ATOMIC_TEMP_OLD, name)
        or name.startswith(".write-test-")  # make_dir's probe before 0.2
    )
