"""The names in a cache dir: our markers, torch's cache layout and the temp names of writers in flight.

A leaf of the package: name tests, and :func:`parent_fd`, the walk without links that every removal takes;
nothing of ours but :mod:`.._fs` (loaded lazily).
Loads lazily (inside the functions that need them, so a session pays only for what it uses): ``.._fs``.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import os
import re

LOCK_NAME = ".compilecache.lock"
SESSIONS_DIR = ".compilecache-sessions"
TEMP_PREFIX = ".compilecache-tmp-"  # what older versions' temp names start with (see _OUR_TEMP)
# GRAPHS_RECORD: explain.RECORD_NAME, the graphs the next session explains its misses against;
# ours in any dir (so an untagged torch dir that holds it is not "foreign" next time), never trimmed.
GRAPHS_RECORD = ".compilecache-graphs.json"
# PENDING_DIR: a restored bundle's mega-cache blobs, installed there by a restore in another process (the
# Action's restore step) for the next pytest session to load into torch and remove (sync.load_staged).
PENDING_DIR = ".compilecache-pending"
# ISOLATED_MARK: in an isolated session's dir, what should become of it when the session is gone: REMOVED (the
# default: a later isolated session removes it when a kill kept its own session from doing so) or KEPT.
ISOLATED_MARK = ".compilecache-isolated"
REMOVED, KEPT = "removed at the end\n", "kept (--compile-cache-keep)\n"


def isolated_mark(name: str, removed: bool) -> bytes:
    """What :data:`ISOLATED_MARK` holds in isolated dir ``name``: whether it is removed at its end, and its name (a
    copy or a renamed dir is not the one its session marked)."""
    return f"{REMOVED if removed else KEPT}{name}\n".encode()


OUR_NAMES = frozenset(
    {"CACHEDIR.TAG", ".gitignore", LOCK_NAME, SESSIONS_DIR, GRAPHS_RECORD, PENDING_DIR, ISOLATED_MARK}
)

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
TORCH_TEMP = r"\.(\d+)\.\d+\.tmp"  # codecache.write_atomic
TORCH_TOP_FILE = r"tmp[a-z0-9_]{8}\.py|configs_[A-Za-z0-9_]+\.json"  # wrapper.py, cutlass
# Our temp names are _fs.temp_name's. Older versions of the plugin named them TEMP_PREFIX + <pid>-<host> +
# anything, ``.<name>.<pid>-<host>.<random>.tmp`` (atomic_file) or ``.<name>.<random>.tmp``: still ours,
# swept by age alone.
_OUR_TEMP = re.escape(TEMP_PREFIX) + r"(\d+)-([0-9a-f]{8})-.*"
_ATOMIC_TEMP = r"\..+\.(\d+)-([0-9a-f]{8})\.[a-z0-9_]{8}\.tmp"
_ATOMIC_TEMP_OLD = r"\..+\.[a-z0-9_]{8}\.tmp"
# An xdist controller's restore ticket before it had a temp name (0.3.0.dev): ``.json`` and its ``.lock``.
_TICKET_OLD = r"\.compilecache-restore-\d+-[0-9a-f]{12}\.json(?:\.lock)?"

CLOEXEC = getattr(os, "O_CLOEXEC", 0)
DIR_NOFOLLOW = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | CLOEXEC


def parent_fd(root_fd: int, rel: str) -> tuple[int, str] | None:
    """An fd of ``rel``'s parent dir, reached from ``root_fd`` one component at a time without following a
    link, and ``rel``'s last name; None when a component vanished, is a link or is not a dir. Whatever is
    swapped in on the way afterwards, what is removed through that fd is inside the cache dir."""
    parts = rel.split(os.sep)
    fd = os.dup(root_fd)
    for part in parts[:-1]:
        try:
            child = os.open(part, DIR_NOFOLLOW, dir_fd=fd)
        except OSError:
            os.close(fd)
            return None
        os.close(fd)
        fd = child
    return fd, parts[-1]


def is_temp_name(name: str) -> bool:
    """A name someone is writing under (ours or torch's ``write_atomic``), never a finished cache file."""
    # (swept by _fs.sweep_dead_writers) are ours too.
    if name in OUR_NAMES or (
        "compilecache-" not in name and not name.endswith(".tmp") and not name.startswith(".write-test-")
    ):
        return False  # our fixed names, or none of what every pattern below needs: no pattern compiled or run
    from .._fs import parse_temp_name

    return bool(parse_temp_name(name) is not None or re.fullmatch(TORCH_TEMP, name) or is_legacy_temp_name(name))


def is_legacy_staging_dir(name: str) -> bool:
    """The one legacy temp name that was a dir (an older version's staging dir); every other was a file."""
    return bool(re.fullmatch(_OUR_TEMP, name))


def is_legacy_temp_name(name: str) -> bool:
    """A temp name of an older version of the plugin (its owner's host id is not comparable to ours)."""
    return bool(
        re.fullmatch(_OUR_TEMP, name)
        or re.fullmatch(_ATOMIC_TEMP, name)
        or re.fullmatch(_ATOMIC_TEMP_OLD, name)
        or re.fullmatch(_TICKET_OLD, name)
        or name.startswith(".write-test-")  # make_dir's probe before 0.2
    )


# ---------------------------------------------------------------------------------- what torch writes
# Each file torch writes below its cache dir, by the dir it writes it in (torch 2.6-2.15, triton 2.x-3.x).
# A file is torch's by its name in its place, never by its shape alone: ``db/backup_2024_01_01_full.sql`` or
# ``cache/my_important_data.bin`` in a dir of ours is someone's file, and trimming leaves it alone.

# codecache.get_path: ``<key[1:3]>/<key>.<ext>``; keys (cache_key.py) are a sha256 as lowercase base32, 51
# characters, with a one-letter prefix for code ("c") and graphs ("f"), or hex. Extensions: py, cpp, h, so,
# main.cpp, main.so, o, json, txt, cubin, ...; AOTInductor adds ``<key>_compile_flags.json`` and the like.
_KERNEL_FILE = r"([a-z0-9]{32,64})[._][A-Za-z0-9_.]{1,48}"
_KEY = r"[a-z0-9]{32,64}"
# An FX-graph or AOTAutograd entry in its key's dir: the content's hash, or ``entry`` (AOTAutograd in older
# releases: 2.7.1 writes it, 2.13 a hash).
_ENTRY = r"[a-z0-9]{32,64}|entry"
# cpp_builder.CppBuilder.build: ``<name>_CxxBuild/``, the compiler's working dir, next to its output while it
# runs (removed after): the kernel dir's files are being built.
_BUILD_DIR = r"([a-z0-9]{32,64})(?:\.main)?_CxxBuild"
# triton's FileCacheManager: ``triton/<device>/<key>/`` holds one kernel's files (the binary, its metadata, the
# ``__grp__`` file naming them all): base32 of a sha256 (triton 3), hex (triton 2). Its ``put`` writes through
# a ``tmp.pid_<pid>_<random>/`` dir inside the key dir.
_TRITON_DEVICE = r"\d{1,4}"
_TRITON_KEY = r"[A-Z2-7]{52}|[0-9a-f]{64}"
# cache/: codecache.LocalCache's ``cache/<system hash>`` (hex 64, max-autotune timings), cache.py's and
# runtime/caching's ``cache/<name>/<sha256[:32]>``.
_CACHE_FILE = r"[0-9a-f]{32}|[0-9a-f]{64}"
# dynamo/: pgo.py's ``code_state_<key>.pkl``; package.py's ``<key>/entry``.
_DYNAMO_FILE = r"code_state_[A-Za-z0-9_.\-]+\.pkl"
# torch's characters that pgo.py replaces in a profile's name (code_state_<job id>:<rank>:<tag>.pkl).
_PROFILE_UNSAFE = r'[<>:"/\\|?*]'
# precompiled_headers/: codecache's ``<hash>.h`` and the compiler's ``<hash>.h.gch`` / ``.h.pch``.
_HEADER_FILE = r"[a-z0-9]{32,64}\.h(?:\.gch|\.pch)?"


def kernel_key(folder: str, name: str) -> str | None:
    """The key of ``folder/name`` when it is a file torch writes in a kernel dir (``<key>.<ext>`` in the dir of
    the key's 2nd and 3rd characters, not a lock), else None. Files of one key belong together."""
    match = re.fullmatch(_KERNEL_FILE, name)
    if match is None or match[1][1:3] != folder or name.endswith(".lock"):
        return None
    return match[1]


def kernel_build(folder: str, name: str) -> bool:
    """Is ``folder/name`` torch's C++ build dir, present while a build in that kernel dir runs?"""
    match = re.fullmatch(_BUILD_DIR, name)
    return match is not None and match[1][1:3] == folder


def kernel_entry(folder: str, name: str) -> bool:
    """Could ``folder/name`` be torch's, in a two-character kernel dir? (its files, its key-named dirs, a build
    in flight, a temp file)."""
    if kernel_key(folder, name) is not None or kernel_build(folder, name) or is_temp_name(name):
        return True
    return bool(re.fullmatch(_KEY, name)) and name[1:3] == folder


def triton_kernel_dir(device: str | None, name: str) -> bool:
    """Is ``triton/<device>/<name>`` (torch's own layout) or, with ``device`` None, ``triton/<name>`` (the
    plugin's: it points ``TRITON_CACHE_DIR`` at ``<cache dir>/triton``) one of triton's kernel dirs (removed
    whole, or not at all)?"""
    return (device is None or bool(re.fullmatch(_TRITON_DEVICE, device))) and bool(re.fullmatch(_TRITON_KEY, name))


def triton_device_dir(name: str) -> bool:
    """Is ``triton/<name>`` a device's dir of torch's own layout (``triton/0/``)?"""
    return bool(re.fullmatch(_TRITON_DEVICE, name))


def torch_file(top: str, rel_parts: list[str]) -> bool:
    """Is the file ``<top>/<rel_parts...>`` one torch writes there? For the torch dirs whose files are trimmed
    one by one, each by its name in its place: ``fxgraph/<key[1:3]>/<key>/<entry>`` and
    ``aotautograd/<key>/<entry>`` (keys are hashes; an entry is a hash or ``entry``), ``cache/``, ``dynamo/`` and
    ``precompiled_headers/``. Never a lock or a temp file."""
    name = rel_parts[-1]
    if name.endswith(".lock") or is_temp_name(name):
        return False
    if top == "fxgraph":  # codecache.FxGraphCache._get_tmp_dir_for_key, then the entry
        return (
            len(rel_parts) == 3
            and bool(re.fullmatch(_KEY, rel_parts[1]))
            and rel_parts[1][1:3] == rel_parts[0]
            and bool(re.fullmatch(_ENTRY, name))
        )
    if top == "aotautograd":  # autograd_cache.AOTAutogradCache._get_tmp_dir_for_key, then the entry
        return len(rel_parts) == 2 and bool(re.fullmatch(_KEY, rel_parts[0]) and re.fullmatch(_ENTRY, name))
    if top == "cache":
        return len(rel_parts) <= 2 and bool(re.fullmatch(_CACHE_FILE, name))
    if top == "dynamo":
        return (len(rel_parts) == 1 and bool(re.fullmatch(_DYNAMO_FILE, name))) or (
            len(rel_parts) == 2 and name == "entry"
        )
    if top == "precompiled_headers":
        return len(rel_parts) == 1 and bool(re.fullmatch(_HEADER_FILE, name))
    return False


_BEST_CONFIG = r"[0-9a-f]{64}\.best_config"  # autotune_cache: sha256 of the kernel's file name and torch's key


def carried_file(rel: str) -> bool:
    """Is ``rel`` (``/``-separated, below a cache dir) a file of torch's or triton's that a warm start needs and
    the CLI's ``save`` carries: an FX or AOTAutograd entry, a compiled kernel (``<dir>/<key>.so``), a best
    config, torch's local autotuning results (``cache/``), a file of a triton kernel dir (the plugin's
    ``triton/<key>/`` or torch's ``triton/<device>/<key>/``)? Never a lock, a temp file, a user's file or ours."""
    parts = rel.split("/")
    top, name = parts[0], parts[-1]
    if name.endswith(".lock") or name == "lock" or is_temp_name(name) or name.startswith("tmp."):
        return False
    if top in ("fxgraph", "aotautograd", "cache"):
        return torch_file(top, parts[1:])
    if top == "triton":
        return (len(parts) == 3 and triton_kernel_dir(None, parts[1])) or (
            len(parts) == 4 and triton_kernel_dir(parts[1], parts[2])
        )
    if len(parts) == 2 and re.fullmatch(KERNEL_DIR, top):
        return (name.endswith(".so") and kernel_key(top, name) is not None) or bool(re.fullmatch(_BEST_CONFIG, name))
    return len(parts) == 1 and bool(re.fullmatch(_BEST_CONFIG, name))


def shape_profile(name: str, job_id: str) -> bool:
    """Is ``dynamo/<name>`` torch's automatic-dynamic profile for ``job_id`` (``TORCH_COMPILE_JOB_ID``)?

    torch names it ``code_state_<job id>:<rank>:<tag>.pkl`` with ``<>:"/\\|?*`` made ``_``, the rank ``None``
    or a number, so a job id that merely starts with this one (``ci-nightly`` for ``ci``) is not taken for it;
    one that is this one plus ``_<number>`` or ``_None`` can be (that profile is then marked used too)."""
    if not re.fullmatch(_DYNAMO_FILE, name):
        return False
    prefix = re.sub(_PROFILE_UNSAFE, "_", f"code_state_{job_id}:")
    return name.startswith(prefix) and bool(re.fullmatch(r"(?:None|\d+)_.*\.pkl", name[len(prefix) :]))
