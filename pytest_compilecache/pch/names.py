"""The names of torch's precompiled headers: which files are headers, where torch keeps them, how a manifest
names one (:data:`KIND`, :func:`header_artifact`), how a store keys its content (:func:`object_key`), and the
cheap file checks (:func:`looks_complete`, :func:`describe`). A leaf of the package.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import getpass
import hashlib
import os
import re
import stat
import tempfile
import time
from pathlib import Path
from typing import Any
from typing import BinaryIO
from typing import Mapping

from ..errors import HeaderError
from ..manifest import MAX_IDLE
from ..manifest import Artifact

KIND = "precompiled_header"
"""The ``kind`` of a precompiled-header artifact in a bundle manifest."""

# torch's code_hash(): "c" + the first 51 characters of the lower-case base32 SHA-256 (2.5-2.15), then
# ".h" and the compiler's extension: ".gch" for gcc, ".pch" for clang (cpp_builder's
# __get_precompiled_header_flags).
_NAME = re.compile(r"c[a-z2-7]{51}\.h\.(?:gch|pch)")
_KEY_CHARS = re.compile(r"[A-Za-z0-9._-]+")
SHA256 = re.compile(r"[0-9a-f]{64}")
CHUNK = 1 << 20
MAX_SIZE = 4 << 30
"""The largest header we describe or install (a real one is ~150 MB); larger is refused, not truncated."""
# What every complete PCH starts with: gcc's "gpch" + its format version, clang's "CPCH".
_MAGIC = {".gch": b"gpch", ".pch": b"CPCH"}
CHECK_TIMEOUT = 120.0
"""Seconds :func:`check` gives the compiler (a sound ~150 MB header takes about half a second)."""


def header_artifact(data: Artifact | Mapping[str, Any]) -> Artifact:
    """A bundle manifest's artifact entry (a :class:`.manifest.Artifact`, or its JSON) checked as a precompiled
    header: torch's name, a sha256, a size up to :data:`MAX_SIZE`, an ``idle`` count (default 0). Raises
    HeaderError naming what is wrong: a signed manifest says which bytes to fetch, not that its entries have a
    header's shape."""
    fields: Mapping[str, Any] = data.to_json() if isinstance(data, Artifact) else data
    kind, name, digest, size = (fields.get(key) for key in ("kind", "name", "sha256", "size"))
    idle = fields.get("idle", 0)
    if kind != KIND:
        raise HeaderError(f"not a {KIND} artifact: kind={kind!r}")
    if not isinstance(name, str) or not is_header_name(name):
        raise HeaderError(f"not a precompiled-header name: {name!r}")
    if not isinstance(digest, str) or not SHA256.fullmatch(digest):
        raise HeaderError(f"bad sha256 for {name}: {digest!r}")
    if not isinstance(size, int) or isinstance(size, bool) or not 0 < size <= MAX_SIZE:
        raise HeaderError(f"bad size for {name}: {size!r}")
    if not isinstance(idle, int) or isinstance(idle, bool) or not 0 <= idle <= MAX_IDLE:
        raise HeaderError(f"bad idle count for {name}: {idle!r}")
    return Artifact(kind=KIND, name=name, sha256=digest, size=size, idle=idle)


def is_header_name(name: str) -> bool:
    """True for the file names torch gives compiled headers (and nothing else: no dirs, no dots, no links)."""
    return bool(_NAME.fullmatch(name))


def header_dir(tmp: str | os.PathLike[str] | None = None) -> Path:
    """torch's precompiled-header dir for this process, computed as torch does, without importing torch.

    ``<tempfile.gettempdir()>/torchinductor_<user>/precompiled_headers`` (``default_cache_dir()`` in
    ``torch/_inductor/runtime/cache_dir_utils.py``, 2.8-2.15). It follows ``TMPDIR``, never
    ``TORCHINDUCTOR_CACHE_DIR``. Call it in the process whose environment the tests run with: xdist workers
    inherit the controller's ``TMPDIR``, so the controller's answer is theirs. ``tmp`` gives the answer for
    a process whose TMPDIR is ``tmp`` instead (a benchmark's simulated fresh runner).
    """
    try:
        user = getpass.getuser()
    except (KeyError, ModuleNotFoundError, OSError):
        getuid = getattr(os, "getuid", None)
        user = f"uid_{getuid()}" if callable(getuid) else "unknown_user"
    user = re.sub(r'[\\/:*?"<>|]', "_", user)
    return Path(tmp if tmp is not None else tempfile.gettempdir()) / f"torchinductor_{user}" / "precompiled_headers"


def looks_complete(path: Path) -> bool:
    """True when ``path`` starts with its compiler's PCH magic. Cheap and flag-free: it catches a zeroed or
    junk file, not a truncated one or one damaged inside; :func:`check` does that."""
    magic = _MAGIC.get(path.suffix, b"")
    try:
        with open_regular(path) as fh:
            return bool(magic) and fh.read(len(magic)) == magic
    except (OSError, HeaderError):
        return False


def is_damaged_copy(path: Path) -> bool:
    """True when ``path`` is a regular file (never a link) that does not start like a PCH: a zeroed file, or
    junk. Nothing cheaper than the compiler tells a truncated one from a sound one (two gcc builds of the same
    header differ in size and bytes); the processes that look the header up check it (:func:`check`)."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(info.st_mode) and not looks_complete(path)


def describe(path: Path) -> Artifact:
    """Hash one header file (streamed) into its manifest entry; HeaderError when it cannot be read."""
    if not is_header_name(path.name):
        raise HeaderError(f"not a precompiled-header name: {path.name!r}")
    digest = hashlib.sha256()
    size = 0
    try:
        with open_regular(path) as fh:
            for chunk in iter(lambda: fh.read(CHUNK), b""):
                digest.update(chunk)
                size += len(chunk)
                if size > MAX_SIZE:
                    raise HeaderError(f"{path.name} is larger than {MAX_SIZE} bytes")
    except OSError as exc:
        raise HeaderError(f"cannot read {path}: {exc.strerror or exc}") from None
    if size == 0:
        raise HeaderError(f"{path.name} is empty")
    return Artifact(kind=KIND, name=path.name, sha256=digest.hexdigest(), size=size)


def packed_bound(size: int) -> int:
    """The most bytes a ``size``-byte header can take as :func:`compress` writes it (zstd's worst case, for
    data that does not compress, is a little over ``size``)."""
    return size + size // 64 + (1 << 16)


def object_key(prefix: str, sha256: str) -> str:
    """The store key of an artifact's content: ``<prefix>-artifact-<sha256>``, one object per content.

    Content-addressed, so a save uploads it only when the store lacks the key and every bundle naming the same
    bytes shares it. Raises ValueError for a prefix or digest a store key cannot hold (``[A-Za-z0-9._-]``).
    ``artifact`` is not a hex word, so no such key starts with a bundle's ``<prefix>-<hex digest>`` restore
    prefix; but a listing or prune over the bare ``<prefix>`` sees these objects too: prune bundles by their
    own prefix, and drop an artifact only when no kept bundle's manifest names its sha256.
    """
    if not SHA256.fullmatch(sha256):
        raise ValueError(f"not a sha256 hex digest: {sha256!r}")
    key = f"{prefix}-artifact-{sha256}"
    if not _KEY_CHARS.fullmatch(key):
        raise ValueError(f"store keys allow only [A-Za-z0-9._-]: {prefix!r}")
    return key


def open_regular(path: Path) -> BinaryIO:
    """Open a regular file for reading without following a symlink at its last component."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise HeaderError(f"{path} is not a regular file")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def others_may_write(info: os.stat_result) -> bool:
    """True when a user other than this one may write into the dir ``info`` (an ``lstat``) describes: writable by
    all, or by a group other than this user's primary group (a umask of 002 with per-user groups is fine). Such a
    dir (a ``torchinductor_<user>`` made under ``umask 0`` in a shared TMPDIR) can hold a header someone else put
    there: nothing is installed into it or carried from it."""
    mode = info.st_mode
    return bool(mode & stat.S_IWOTH or (mode & stat.S_IWGRP and info.st_gid != os.getgid()))


def owned_dir(directory: Path) -> bool:
    """The header dir and its parent are plain dirs (no links) of this user that no other user can write to
    (group-writable only for the user's own primary group: a umask of 002 with per-user groups)."""
    getuid = getattr(os, "getuid", None)
    if getuid is None:
        return False
    for path in (directory, directory.parent):
        try:
            info = os.lstat(path)
        except OSError:
            return False
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != getuid() or others_may_write(info):
            return False
    return True


def lock_name(name: str) -> str:
    # torch: os.path.join(_HEADER_LOCK_DIR, f"{header_hash}.lock"); header_hash is the name before ".h".
    return name.split(".", 1)[0] + ".lock"


def session_start() -> float:
    """The ``since`` to pass to :func:`find_used` later: now, less a second for coarse file-system clocks."""
    return time.time() - 1.0
