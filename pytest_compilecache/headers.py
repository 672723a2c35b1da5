"""torch's precompiled C++ headers: find the ones a session used, carry them, install them on a fresh runner.

Why this exists. On CPU, torch (2.8+, ``torch/_inductor/codecache.py``) compiles every C++ kernel with
``-include <dir>/<hash>.h``, where ``<hash>.h.gch`` is a ~150 MB precompiled header built by
``_precompile_header``. That function runs once per process for every header it is asked for (it is a
``functools.cache``), from ``CppCodeCache.load_async`` for every kernel key not yet in memory, *before* the
kernel binary is looked up on disk: it preprocesses the header (``g++ -E``), hashes the result (``openssl
sha512``), names the file after the hash of the command line, the preprocessed text and the compiler version,
and compiles it unless the file exists. So a fresh CI runner whose cache dir was fully restored still spends
seconds of g++ on a header it needs for no kernel at all. The header's path is part of no kernel or FX key.

Where the headers go (the design decision). torch keeps them in
``_HEADER_DIR = <tempfile.gettempdir()>/torchinductor_<user>/precompiled_headers``, fixed when
``codecache`` is imported and deliberately outside ``TORCHINDUCTOR_CACHE_DIR`` (torch's comment: the headers
"need to be global"). We restore into that same directory rather than pointing torch at a directory inside
the cache dir, because:

* it needs no private torch state: :func:`header_dir` mirrors ``default_cache_dir()`` without importing torch,
  and pointing torch elsewhere would mean rewriting ``codecache._HEADER_DIR`` in every process before its
  first compile, which the plugin cannot do for xdist workers' subprocesses, tests that spawn Python, or
  torch's own compile workers;
* it works the same on every torch that has the feature, and is a no-op on those that do not (2.7: nothing
  ever appears in the directory, so nothing is found, described or installed);
* a header is tied to the compiler, the flags and the torch install, all of which its name already hashes,
  so one directory can hold several without conflict, and a header that does not match is simply never
  looked up;
* the cache dir stays what torch and the bundles expect (no 150 MB file inside every whole-dir archive).

What we never do there: follow a symlink, or write a name that is not torch's (``c`` + 51 base32 chars +
``.h.gch``/``.h.pch``). Only the compiled file travels: torch writes the tiny ``<hash>.h`` itself (its content
is a single ``#include`` line) before it looks for the compiled file.

Which headers a session used (issue 24). Not from access times: ``relatime`` (Linux's default, GitHub's
runners) records a read only once a day and ``noatime`` never. Every process the plugin runs in wraps torch's
``_precompile_header`` (:func:`.probe.watch_precompiled_headers`): each header torch looks up there is
checked once by that process, with torch's own flags for it, and reported (:class:`HeaderUse`, through the
xdist worker payload). torch's compile workers never look a header up (the parent passes its path), so
nothing is lost there; a header the restore installed (this session's, or the Action's, named in
``PYTEST_COMPILECACHE_RESTORED``) is named again even when no process looked it up.

Only a header the compiler accepts is carried or left installed. gcc's reaction to a damaged ``.gch`` is
anything from silently ignoring it (all zeros, junk after a valid start: every kernel then parses the text
header, and torch never rebuilds the file) to "cannot read PCH file" (truncated) or an internal compiler error
(changed bytes): fatal for every C++ kernel on that machine, since neither torch nor gcc ever replaces an
existing header. :func:`check` compiles a one-line file with ``-include`` of the header under torch's exact
flags and no text header to fall back on, so only a loaded PCH compiles (about half a second for a ~150 MB
header). A header that fails is removed under torch's build lock, and torch builds it again in the same
process, with one note (:func:`remove_if_unchanged`). An accepted header is remembered in a small record
beside it (:data:`VERDICTS`), keyed by the file's identity (device, inode, size, mtime, ctime), the check's
argv and the compiler binary: the next process that looks up that very file runs no compiler, so warm runs
and every xdist worker after the first pay nothing; any change to the file or the check means a new check.
A save uploads only headers some process of the
session checked and that have not changed since; a restore replaces a local header of the manifest's name
that is no PCH at all (zeroed, junk) with the verified one. Partial files of a killed build under temporary
names are never candidates: only torch's final names are. Limits: gcc loads a PCH lazily, so bytes changed
deep inside that a one-line file never touches pass the check (the sha256 guards them in transit); a header
looked up only by a process without the plugin (a test that spawns Python, torch's subprocess FX-compile
mode) is not carried, since nothing checked it.

This module never imports torch: everything here is files, hashes and one compiler run per check. Transport
is zstd (level 3, ~150 MB to ~21 MB in about a second), streamed in both directions so memory stays bounded.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import contextlib
import getpass
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import tempfile
import time
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any
from typing import BinaryIO
from typing import Callable
from typing import Iterable
from typing import Iterator
from typing import Mapping
from typing import Protocol
from typing import Sequence

from ._fs import atomic_file
from ._fs import temporary_dir
from ._fs import try_flock
from .errors import HeaderError
from .manifest import Artifact


class _Listed(Protocol):
    @property
    def key(self) -> str: ...
    @property
    def size(self) -> int: ...


class Store(Protocol):
    """What carrying headers needs of a store (:class:`.stores.base.Store` is one): named here, so that the
    headers, which the probe uses, depend on no store module."""

    def get(self, key: str, dest: Path, *, limit: int | None = None) -> bool: ...
    def put(self, key: str, src: Path) -> None: ...
    def list(self, prefix: str = "") -> Sequence[_Listed]: ...


__all__ = [
    "KIND",
    "OK_VERDICTS",
    "VERDICTS",
    "HeaderError",
    "HeaderTransfer",
    "HeaderUse",
    "check",
    "compress",
    "describe",
    "find_built",
    "find_used",
    "header_artifact",
    "header_dir",
    "header_notes",
    "header_uses",
    "install_header",
    "is_damaged_copy",
    "is_header_name",
    "looks_complete",
    "object_key",
    "Reservation",
    "remove_if_unchanged",
    "reserve_headers",
    "restore_headers",
    "save_headers",
    "session_start",
    "verify_header_copy",
]

KIND = "precompiled_header"
"""The ``kind`` of a precompiled-header artifact in a bundle manifest."""

# torch's code_hash(): "c" + the first 51 characters of the lower-case base32 SHA-256 (2.5-2.15), then
# ".h" and the compiler's extension: ".gch" for gcc, ".pch" for clang (cpp_builder's
# __get_precompiled_header_flags).
_NAME = re.compile(r"c[a-z2-7]{51}\.h\.(?:gch|pch)")
_KEY_CHARS = re.compile(r"[A-Za-z0-9._-]+")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_CHUNK = 1 << 20
ZSTD_LEVEL = 3
MAX_SIZE = 4 << 30
"""The largest header we describe or install (a real one is ~150 MB); larger is refused, not truncated."""
# What every complete PCH starts with: gcc's "gpch" + its format version, clang's "CPCH".
_MAGIC = {".gch": b"gpch", ".pch": b"CPCH"}
CHECK_TIMEOUT = 120.0
"""Seconds :func:`check` gives the compiler (a sound ~150 MB header takes about half a second)."""
OK_VERDICTS = ("verified", "rebuilt")
""":attr:`HeaderUse.verdict` values of a header the compiler accepted (checked, or built again after failing)."""


def header_artifact(data: Artifact | Mapping[str, Any]) -> Artifact:
    """A bundle manifest's artifact entry (a :class:`.manifest.Artifact`, or its JSON) checked as a precompiled
    header: torch's name, a sha256, a size up to :data:`MAX_SIZE`. Raises HeaderError naming what is wrong: a
    signed manifest says which bytes to fetch, not that its entries have a header's shape."""
    fields: Mapping[str, Any] = data.to_json() if isinstance(data, Artifact) else data
    kind, name, digest, size = (fields.get(key) for key in ("kind", "name", "sha256", "size"))
    if kind != KIND:
        raise HeaderError(f"not a {KIND} artifact: kind={kind!r}")
    if not isinstance(name, str) or not is_header_name(name):
        raise HeaderError(f"not a precompiled-header name: {name!r}")
    if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
        raise HeaderError(f"bad sha256 for {name}: {digest!r}")
    if not isinstance(size, int) or isinstance(size, bool) or not 0 < size <= MAX_SIZE:
        raise HeaderError(f"bad size for {name}: {size!r}")
    return Artifact(kind=KIND, name=name, sha256=digest, size=size)


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


@dataclass(frozen=True)
class HeaderUse:
    """One header a process of this session looked up through torch, as that process reports it (plain JSON
    in the xdist worker payload).

    ``verdict``: ``verified`` (the compiler accepted it), ``rebuilt`` (it failed the check, was removed and
    torch built it again, which then passed), ``damaged`` (it failed and could not be replaced) or
    ``unchecked`` (the check could not run: no compiler, a timeout). ``size``, ``mtime_ns`` and ``ino``
    identify the file the verdict is about: a save carries it only while the file is still that one.
    ``note``: one line for the session's notes, or empty.
    """

    name: str
    verdict: str
    size: int = 0
    mtime_ns: int = 0
    ino: int = 0
    note: str = ""

    @property
    def accepted(self) -> bool:
        return self.verdict in OK_VERDICTS

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "verdict": self.verdict,
            "size": self.size,
            "mtime_ns": self.mtime_ns,
            "ino": self.ino,
            "note": self.note,
        }

    @classmethod
    def from_json(cls, data: object) -> HeaderUse | None:
        """The report, or None for anything malformed (a worker's payload is ours, but never trusted blindly)."""
        if not isinstance(data, Mapping):
            return None
        name, verdict, note = data.get("name"), data.get("verdict"), data.get("note", "")
        numbers = [data.get(key, 0) for key in ("size", "mtime_ns", "ino")]
        if not isinstance(name, str) or not is_header_name(name) or not isinstance(verdict, str):
            return None
        if verdict not in (*OK_VERDICTS, "damaged", "unchecked") or not isinstance(note, str):
            return None
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in numbers):
            return None
        size, mtime_ns, ino = numbers
        return cls(name, verdict, size, mtime_ns, ino, note.splitlines()[0][:300] if note else "")

    def matches(self, info: os.stat_result) -> bool:
        """True when ``info`` (an lstat) is the very file this verdict is about."""
        return (info.st_size, info.st_mtime_ns, info.st_ino) == (self.size, self.mtime_ns, self.ino)


def header_uses(reports: Iterable[object]) -> list[HeaderUse]:
    """The valid :class:`HeaderUse` reports among ``reports`` (JSON dicts from every process), malformed ones
    dropped."""
    return [use for use in map(HeaderUse.from_json, reports) if use is not None]


def header_notes(reports: Iterable[object]) -> list[str]:
    """One note per header that some process found damaged (removed and rebuilt, or left) or could not
    check, in name order: xdist workers that met the same header say so once."""
    notes: dict[str, str] = {}
    for use in header_uses(reports):
        if use.note and use.name not in notes:
            notes[use.name] = use.note
    return [notes[name] for name in sorted(notes)]


def find_used(directory: Path, uses: Iterable[object], installed: Iterable[str] = ()) -> list[Path]:
    """The compiled headers in ``directory`` this session used and may carry, sorted by name.

    ``uses``: the :class:`HeaderUse` reports (JSON) of every process of the session. A header counts when some
    process's compiler check accepted it and the file is still the one it checked (same size, mtime, inode),
    or when this session's restore installed or found it (``installed``: names; the bytes were checked
    against a verified manifest, and no kernel may have needed it). Nothing here reads access times.

    Skipped: symlinks, names that are not torch's, empty files, headers whose build lock another process holds
    right now (torch is writing it in place), and a reported header that changed since its check. A missing
    dir is an empty list.
    """
    if os.name == "nt":  # torch precompiles no header on Windows (codecache asserts it)
        return []
    accepted: dict[str, list[HeaderUse]] = {}
    for use in header_uses(uses):
        if use.accepted:
            accepted.setdefault(use.name, []).append(use)
    keep = set(installed)
    found: list[Path] = []
    for name in sorted(set(accepted) | {name for name in keep if is_header_name(name)}):
        path = Path(directory) / name
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISREG(info.st_mode) or info.st_size == 0:
            continue
        if name not in keep and not any(use.matches(info) for use in accepted[name]):
            continue  # replaced since every check of it: not the file the compiler accepted
        if not _being_built(Path(directory), name):
            found.append(path)
    return found


def find_built(directory: Path, since: float) -> list[Path]:
    """Headers whose file was written since ``since`` (mtime: recorded on every mount), for a save with no
    process reports (the CLI's ``--headers-since``); ``since=0`` takes every header. Same skips as
    :func:`find_used`, plus files that do not start like a PCH (:func:`looks_complete` is all such a save can
    check: it has no compiler flags)."""
    if os.name == "nt":
        return []
    try:
        names = sorted(entry.name for entry in os.scandir(directory) if is_header_name(entry.name))
    except OSError:
        return []
    found: list[Path] = []
    for name in names:
        path = Path(directory) / name
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISREG(info.st_mode) or info.st_size == 0 or info.st_mtime < since:
            continue
        if looks_complete(path) and not _being_built(Path(directory), name):
            found.append(path)
    return found


def looks_complete(path: Path) -> bool:
    """True when ``path`` starts with its compiler's PCH magic. Cheap and flag-free: it catches a zeroed or
    junk file, not a truncated one or one damaged inside; :func:`check` does that."""
    magic = _MAGIC.get(path.suffix, b"")
    try:
        with _open_regular(path) as fh:
            return bool(magic) and fh.read(len(magic)) == magic
    except (OSError, HeaderError):
        return False


def check(
    path: Path,
    command: Callable[[Path, Path], Sequence[str]],
    timeout: float = CHECK_TIMEOUT,
    *,
    remember: bool = False,
) -> str | None:
    """Compile a one-line file with ``-include`` of the header at ``path``; None when the compiler accepted
    it, else the compiler's first line about it.

    ``command(source, include)`` gives the argv that compiles ``source`` with ``-include <include>`` under the
    flags torch uses with this header (:func:`.probe.watch_precompiled_headers` builds it from torch's own
    command line); ``-fsyntax-only -Winvalid-pch`` are added. ``include`` is a name in a private temp dir
    whose ``.gch``/``.pch`` is a link to ``path`` and whose text header does not exist: a PCH the compiler
    will not use (not a PCH, other flags) cannot fall back to parsing text, so every rejection is an error,
    and so is a truncated file ("cannot read PCH file") or an internal compiler error. Raises HeaderError
    (one line) when the check could not run at all (no compiler, a timeout): that proves nothing either way.

    ``remember``: use the header dir's record of accepted headers (:data:`VERDICTS`, issue 24). A header the
    record says this very file was accepted by this very check (same argv, same compiler binary) is accepted
    without running the compiler; an acceptance is added to the record. Rejections are never remembered.
    Processes that check the same file at once (xdist workers meeting a header just restored) take turns
    (a lock on the header file itself), so the later ones find the first one's verdict instead of running
    the compiler again.
    """
    with temporary_dir("tmp") as tmp:  # ours by name: a killed check's dir is swept like our other temp dirs
        include = Path(tmp) / "compilecache_check.h"
        os.symlink(os.path.abspath(path), str(include) + path.suffix)
        source = Path(tmp) / "compilecache_check.cpp"
        source.write_text("int compilecache_check_pch;\n")
        argv = [*command(source, include), "-fsyntax-only", "-Winvalid-pch"]
        record = _Verdicts.of(path, argv, tmp) if remember else None
        with _one_check_at_a_time(path if record is not None else None):
            if record is not None and record.accepted():
                return None
            try:
                done = subprocess.run(
                    argv, cwd=tmp, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout, check=False
                )
            except subprocess.TimeoutExpired:
                raise HeaderError(f"the compiler did not finish checking {path.name} in {timeout:g} s") from None
            except OSError as exc:
                raise HeaderError(f"cannot run {argv[0]} to check {path.name}: {exc.strerror or exc}") from None
            if done.returncode == 0 and record is not None:
                record.add()  # before the next process in line reads the record
    if done.returncode == 0:
        return None
    text = done.stderr.decode("utf-8", "replace").replace(str(include) + path.suffix, path.name)
    text = text.replace(str(include), path.name[: -len(path.suffix)]).replace(tmp + os.sep, "")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    # The line naming the header (gcc's reason for not using it), else the fatal one (a truncated file, an
    # internal compiler error), else the first.
    for marks in ((path.name,), ("internal compiler error", "fatal error"), ("",)):
        picked = next((line for line in lines if any(mark in line for mark in marks)), None)
        if picked is not None:
            return picked[:200]
    return f"exit status {done.returncode}"


VERDICTS = ".compilecache-verdicts.json"
"""The record of headers the compiler accepted, kept in torch's header dir beside them (:func:`check`)."""
# Where the record lives, and why there. Beside the headers it describes, not in the session's cache dir:
# a header is a file of torch's header dir (per TMPDIR and user), shared by every cache dir, every mode
# (isolated sessions too) and the Action's split restore/save; the record lives and dies with those files
# (a fresh runner has neither). Ownership is proved before the record is read or written (_owned_dir):
# the header dir and its parent are plain dirs of this user that no one else may write to, and the
# record is a regular file of this user, never followed through a link. The name is ours (torch's names are
# "c" + base32 hashes, and torch never lists the dir: it opens names it computes), so it is never a file
# torch could mean; it stays small (one entry per header still present, a few checks each).
_VERDICTS_MAX_BYTES = 1 << 16
_VERDICTS_MAX_HEADERS = 64
_VERDICTS_MAX_CHECKS = 8  # per header: the argv/compiler pairs it was accepted under
# A file whose ctime is this close to the check's start is checked but not remembered (git's "racily clean"
# entries, the same cure): file systems stamp times from a coarse clock, one kernel tick (1-10 ms) on ext4,
# xfs, btrfs or tmpfs, so a write in the same tick as the recorded ctime would leave it unchanged. Where the
# stamps are coarser (whole seconds: ext3, FAT's two), twice the stamp's own granule is waited for instead
# (_settled). So a header is remembered by the first check that starts this long after its last change: a
# header torch has just built, or a restore has just installed, is remembered by the next process.
SETTLED_NS = 50_000_000
# Variables gcc (and clang) read that can change what a compile with -include does.
_COMPILER_ENV = ("CPATH", "CPLUS_INCLUDE_PATH", "C_INCLUDE_PATH", "GCC_EXEC_PREFIX", "COMPILER_PATH")


@contextlib.contextmanager
def _one_check_at_a_time(path: Path | None) -> Iterator[None]:
    """Hold an exclusive ``flock`` on the header file itself while it is checked (nothing when ``path`` is
    None or cannot be opened): no file of ours is made for it, torch never locks the compiled file (its
    build lock is a separate file), and a header replaced meanwhile is a new file, checked on its own."""
    import fcntl  # POSIX only, like torch's precompiled headers

    fd = -1
    if path is not None:
        with contextlib.suppress(OSError):
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        if fd >= 0:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_EX)  # a check takes at most CHECK_TIMEOUT; a dead holder lets go
        yield
    finally:
        if fd >= 0:
            os.close(fd)


def _file_identity(info: os.stat_result) -> list[int]:
    """What says "this very file, unchanged": device, inode, size, mtime and ctime (ns). The ctime is the one
    a user process cannot set (``utime`` sets only atime and mtime; every write, chmod or rename moves ctime
    to now), so a header rewritten in place with its size and mtime put back still reads as changed."""
    return [info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns]


def _settled(ctime_ns: int, start_ns: int) -> bool:
    """True when a write after ``start_ns`` must stamp a ctime other than ``ctime_ns`` (see SETTLED_NS)."""
    granule = 1
    while granule < 1_000_000_000 and ctime_ns % (granule * 10) == 0:
        granule *= 10  # stamps in whole ms, s: the file system's granule (or, rarely, a round time)
    return start_ns - ctime_ns > max(SETTLED_NS, 2 * granule)


def _compiler_identity(program: str) -> list[Any] | None:
    """The binary ``program`` runs as (looked up on PATH, as ``subprocess`` does), links resolved, with its
    identity; None when it cannot be found. An upgrade of the compiler replaces that file (new inode, ctime)."""
    found = shutil.which(program)
    if found is None:
        return None
    real = os.path.realpath(found)
    try:
        info = os.stat(real)
    except OSError:
        return None
    return [real, *_file_identity(info)]


def _owned_dir(directory: Path) -> bool:
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
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != getuid() or info.st_mode & stat.S_IWOTH:
            return False
        if info.st_mode & stat.S_IWGRP and info.st_gid != os.getgid():
            return False
    return True


@dataclass
class _Verdicts:
    """One check's view of the header dir's record: this header's file identity and this check's key."""

    directory: Path
    name: str
    file: list[int]
    key: str
    start_ns: int

    @classmethod
    def of(cls, path: Path, argv: Sequence[str], tmp: str) -> _Verdicts | None:
        """None when no record can be used: a dir whose ownership is not proved, a compiler not found.

        A file changed less than :data:`SETTLED_NS` ago (torch has just built it) is given the rest of that
        time first, so that the verdict about to be reached can be remembered (a few ms, once per file).
        """
        directory = path.parent
        compiler = _compiler_identity(argv[0]) if argv else None
        if compiler is None or not is_header_name(path.name) or not _owned_dir(directory):
            return None
        for _ in range(2):
            start_ns = time.time_ns()  # before the lstat: a write after it must stamp another ctime
            try:
                info = os.lstat(path)
            except OSError:
                return None
            young = SETTLED_NS - (start_ns - info.st_ctime_ns)
            if _settled(info.st_ctime_ns, start_ns) or not 0 < young <= SETTLED_NS:
                break  # settled, or a coarse file system's stamp: not worth waiting for
            time.sleep(young / 1e9 + 0.001)
        if not stat.S_ISREG(info.st_mode):
            return None
        # The check's private dir differs on every run: the key is the argv with it replaced.
        words = [word.replace(tmp, "<check>") for word in argv]
        env = [os.environ.get(name) for name in _COMPILER_ENV]
        key = hashlib.sha256(json.dumps([words, compiler, env]).encode("utf-8", "replace")).hexdigest()
        return cls(directory, path.name, _file_identity(info), key, start_ns)

    def accepted(self) -> bool:
        """True when the record says this very file was accepted by this very check before."""
        entry = _read_verdicts(self.directory).get(self.name)
        return entry is not None and entry["file"] == self.file and self.key in entry["checks"]

    def add(self) -> None:
        """Remember that the compiler accepted this file, if it is still the file checked and settled.

        Best effort: a record that cannot be written costs a check next time, nothing else. Entries of headers
        gone or changed since are dropped on the way (the record is bounded by what the dir holds). Two
        processes adding at once may lose one's entry: that process's header is checked once more later.
        """
        path = self.directory / self.name
        try:
            now = os.lstat(path)
        except OSError:
            return
        if _file_identity(now) != self.file or not _settled(now.st_ctime_ns, self.start_ns):
            return
        recorded = _read_verdicts(self.directory)
        entries: dict[str, dict[str, Any]] = {}
        for name, entry in recorded.items():
            try:
                if name != self.name and _file_identity(os.lstat(self.directory / name)) == entry["file"]:
                    entries[name] = entry
            except OSError:
                continue  # gone: torch removed it, or we did (rejected)
        old = recorded.get(self.name)
        checks = old["checks"] if old is not None and old["file"] == self.file else []
        checks = [key for key in checks if key != self.key][-(_VERDICTS_MAX_CHECKS - 1) :] + [self.key]
        entries[self.name] = {"file": self.file, "checks": checks}
        kept = dict(list(entries.items())[-_VERDICTS_MAX_HEADERS:])
        data = json.dumps({"version": 1, "accepted": kept}, sort_keys=True).encode()
        if len(data) > _VERDICTS_MAX_BYTES or not _owned_dir(self.directory):
            return
        with contextlib.suppress(OSError), atomic_file(self.directory / VERDICTS, fsync=False, mode=0o600) as out:
            out.write(data)


def _read_verdicts(directory: Path) -> dict[str, dict[str, Any]]:
    """The record's entries (name -> ``{"file": [5 ints], "checks": [sha256 hex, ...]}``); an empty record for
    anything missing, foreign (a link, another user's, not a regular file), too large or malformed."""
    try:
        fd = os.open(directory / VERDICTS, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return {}
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_size > _VERDICTS_MAX_BYTES:
            return {}
        data = json.loads(os.read(fd, _VERDICTS_MAX_BYTES + 1))
    except (OSError, ValueError, RecursionError):
        return {}
    finally:
        os.close(fd)
    accepted = data.get("accepted") if isinstance(data, dict) and data.get("version") == 1 else None
    if not isinstance(accepted, dict):
        return {}
    entries: dict[str, dict[str, Any]] = {}
    for name, entry in accepted.items():
        if not isinstance(name, str) or not is_header_name(name) or not isinstance(entry, dict):
            continue
        file, checks = entry.get("file"), entry.get("checks")
        if not (isinstance(file, list) and len(file) == 5 and all(type(n) is int for n in file)):
            continue
        if not (isinstance(checks, list) and all(isinstance(c, str) and _SHA256.fullmatch(c) for c in checks)):
            continue
        entries[name] = {"file": file, "checks": checks[-_VERDICTS_MAX_CHECKS:]}
    return entries


def remove_if_unchanged(path: Path, info: os.stat_result) -> bool:
    """Remove the header at ``path`` when it is still the file ``info`` (an lstat) describes; True if removed.

    For a header the compiler rejected: torch then builds it again (it builds whenever the file is absent).
    Taken under torch's own build lock, without waiting: False, nothing removed, when torch holds it (it is
    building that very file) or the file was replaced since (another process repaired it already).
    """
    directory = path.parent
    if not is_header_name(path.name):
        return False
    with _build_lock(directory, path.name) as held:
        if not held:
            return False
        try:
            now = os.lstat(path)
        except OSError:
            return False
        if not stat.S_ISREG(now.st_mode) or (now.st_size, now.st_mtime_ns, now.st_ino) != (
            info.st_size,
            info.st_mtime_ns,
            info.st_ino,
        ):
            return False
        os.unlink(path)
        return True


def describe(path: Path) -> Artifact:
    """Hash one header file (streamed) into its manifest entry; HeaderError when it cannot be read."""
    if not is_header_name(path.name):
        raise HeaderError(f"not a precompiled-header name: {path.name!r}")
    digest = hashlib.sha256()
    size = 0
    try:
        with _open_regular(path) as fh:
            for chunk in iter(lambda: fh.read(_CHUNK), b""):
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


def compress(path: Path, dest: BinaryIO, expected: Artifact | None = None) -> int:
    """Stream ``path`` as one zstd frame (level 3) into ``dest``; return the compressed byte count.

    With ``expected``, the bytes read are hashed on the way and HeaderError is raised when they are not the
    described ones (torch or another session replaced the file between :func:`describe` and now); the
    caller then discards ``dest``.
    """
    import zstandard  # only when a header moves: the plugin imports this module in every saving session

    digest = hashlib.sha256()
    size = 0
    compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
    try:
        with _open_regular(path) as src:
            writer = compressor.stream_writer(dest, closefd=False)
            for chunk in iter(lambda: src.read(_CHUNK), b""):
                digest.update(chunk)
                size += len(chunk)
                writer.write(chunk)
            writer.flush(zstandard.FLUSH_FRAME)
            written = writer.tell()
    except OSError as exc:
        raise HeaderError(f"cannot read {path}: {exc.strerror or exc}") from None
    if expected is not None and (digest.hexdigest(), size) != (expected.sha256, expected.size):
        raise HeaderError(f"{path.name} changed while it was being packed")
    return int(written)


def install_header(artifact: Artifact, compressed: BinaryIO, directory: Path) -> bool:
    """Install one verified header from its zstd stream into ``directory``; True when a file was added.

    Returns False, touching nothing, when a file that may be sound is already there (torch's or ours: never
    overwritten) or when torch holds the header's build lock right now (it is building that very file). A
    regular file of that name that is no PCH at all (:func:`is_damaged_copy`: zeroed, junk) is replaced. The
    stream is decompressed into a temp sibling, hashed and size-checked on the way (at most ``artifact.size``
    bytes are ever written), and published with ``os.replace`` only when both match: a reader sees the old
    file, or the whole verified file. Raises HeaderError (one line) for a bad name, a symlinked or foreign
    directory, a stream that is not zstd, or content that is not the artifact's; the directory is then
    unchanged.
    """
    if not is_header_name(artifact.name) or artifact.kind != KIND:
        raise HeaderError(f"not a precompiled-header artifact: {artifact.name!r}")
    if os.name == "nt":
        raise HeaderError("torch precompiles no header on Windows")
    _ensure_dir(directory)
    dest = directory / artifact.name
    if os.path.lexists(dest) and not is_damaged_copy(dest):
        return False
    with _build_lock(directory, artifact.name) as held:
        return held and _install_locked(artifact, compressed, dest)


def _install_locked(artifact: Artifact, compressed: BinaryIO, dest: Path) -> bool:
    """:func:`install_header`'s work, under torch's build lock for the header (held by the caller)."""
    if os.path.lexists(dest) and not is_damaged_copy(dest):
        return False
    try:
        with atomic_file(dest, fsync=False) as out:
            _copy_verified(artifact, compressed, out)
    except OSError as exc:
        raise HeaderError(f"cannot install {artifact.name}: {exc.strerror or exc}") from None
    return True


class Reservation:
    """torch's build locks of the headers a restore is about to install, held until each is in place.

    Taken before the install starts (:func:`reserve_headers`), so that the restore can go on in the
    background (issue 25): any process, this one included, whose compile looks such a header up meanwhile
    waits in torch's own lock (``_worker_compile_cpp``), then finds the installed file and builds nothing.
    The locks are ``flock``s: a process that forks meanwhile would hold them on in its child, so a child
    closes its copies at once (``os.register_at_fork``), and a process that dies lets go of them.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.held: dict[str, int] = {}  # header name -> fd of its build lock, held

    def release(self, name: str | None = None) -> None:
        """Let go of ``name``'s lock (every lock when None); idempotent."""
        for key in [name] if name is not None else list(self.held):
            fd = self.held.pop(key, None) if key is not None else None
            if fd is not None:
                _RESERVED.discard(fd)
                os.close(fd)  # the flock goes with the last fd of the open file


_RESERVED: set[int] = set()  # every held reservation fd of this process, closed in a forked child
_FORK_HOOK: list[bool] = []


def _close_reserved_in_child() -> None:
    for fd in list(_RESERVED):
        with contextlib.suppress(OSError):
            os.close(fd)
    _RESERVED.clear()


def reserve_headers(entries: Iterable[Artifact], directory: Path | None = None) -> Reservation:
    """Take torch's build lock, without waiting, of every header among ``entries`` that a restore will
    install into ``directory`` (default: torch's): absent, or a damaged copy (:func:`is_damaged_copy`).

    A header whose lock torch holds (it is building it) or that cannot be locked is not reserved: the
    restore then installs it, or not, as :func:`install_header` decides. Never raises; pass the result to
    :func:`restore_headers`, which releases each lock once its header is in place (or failed).
    """
    target = directory or header_dir()
    reservation = Reservation(target)
    if os.name == "nt":
        return reservation
    if not _FORK_HOOK:
        os.register_at_fork(after_in_child=_close_reserved_in_child)
        _FORK_HOOK.append(True)
    for entry in entries:
        try:
            artifact = header_artifact(entry)
            _ensure_dir(target)
            dest = target / artifact.name
            if os.path.lexists(dest) and not is_damaged_copy(dest) or artifact.name in reservation.held:
                continue
            fd = _take_build_lock(target, artifact.name)
        except HeaderError:
            continue  # restore_headers says what is wrong with it
        if fd is not None:
            reservation.held[artifact.name] = fd
            _RESERVED.add(fd)
    return reservation


def is_damaged_copy(path: Path) -> bool:
    """True when ``path`` is a regular file (never a link) that does not start like a PCH: a zeroed file, or
    junk. Nothing cheaper than the compiler tells a truncated one from a sound one (two gcc builds of the same
    header differ in size and bytes); the processes that look the header up check it (:func:`check`)."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(info.st_mode) and not looks_complete(path)


def verify_header_copy(artifact: Artifact, compressed: BinaryIO) -> None:
    """Check that a zstd stream holds exactly ``artifact`` (size and sha256) without writing it anywhere.

    For a header object that is about to be stored again under its content key (the Action's header entry,
    saved by ``actions/cache`` from a file this run did not install from); :func:`install_header` verifies on its
    own. Raises HeaderError (one line) when the stream is not zstd or its content is not the artifact's.
    """
    with open(os.devnull, "wb") as sink:
        _copy_verified(artifact, compressed, sink)


def object_key(prefix: str, sha256: str) -> str:
    """The store key of an artifact's content: ``<prefix>-artifact-<sha256>``, one object per content.

    Content-addressed, so a save uploads it only when the store lacks the key and every bundle naming the same
    bytes shares it. Raises ValueError for a prefix or digest a store key cannot hold (``[A-Za-z0-9._-]``).
    ``artifact`` is not a hex word, so no such key starts with a bundle's ``<prefix>-<hex digest>`` restore
    prefix; but a listing or prune over the bare ``<prefix>`` sees these objects too: prune bundles by their
    own prefix, and drop an artifact only when no kept bundle's manifest names its sha256.
    """
    if not _SHA256.fullmatch(sha256):
        raise ValueError(f"not a sha256 hex digest: {sha256!r}")
    key = f"{prefix}-artifact-{sha256}"
    if not _KEY_CHARS.fullmatch(key):
        raise ValueError(f"store keys allow only [A-Za-z0-9._-]: {prefix!r}")
    return key


@dataclass
class HeaderTransfer:
    """What :func:`save_headers` or :func:`restore_headers` did, for the report; ``errors`` are warning lines."""

    artifacts: list[Artifact] = field(default_factory=list)
    transferred: list[str] = field(default_factory=list)  # names uploaded (save) or installed (restore)
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # restore: damaged local headers replaced


def save_headers(
    store: Store,
    prefix: str,
    since: float,
    installed: Iterable[str],
    scratch: Path,
    directory: Path | None = None,
    carried: Iterable[str] = (),
    uses: Iterable[object] | None = None,
) -> HeaderTransfer:
    """Controller, at session end: describe the headers the session used and upload those the store lacks.

    ``uses``: every process's :class:`HeaderUse` reports: the headers uploaded are those a compiler check
    accepted (:func:`find_used`); a header only ``installed`` (restored, named again though no process
    looked it up) is named only when its exact content is already stored or ``carried``, never uploaded
    unchecked. Without ``uses`` (the CLI: no process to ask), headers written since ``since``
    (:func:`find_built`) and ``installed`` ones are carried when they start like a PCH, all it can check.

    ``artifacts`` are what the bundle manifest must name (``[a.to_json() for a in artifacts]``); a header that
    could not be read or uploaded is left out of it with one line in ``errors``, never failing the save.
    Each upload is one zstd object under :func:`object_key`, skipped when the store already has that key
    (content-addressed: once per store) or when the key is in ``carried``: objects that travel outside this
    store (the Action's own ``actions/cache`` entry for the header, keyed by that object key), which the
    manifest still names. ``scratch`` is a private temp dir of the caller's.
    """
    result = HeaderTransfer()
    elsewhere = set(carried)
    target = directory or header_dir()
    if uses is None:
        restored = find_used(target, (), installed)
        checked = {path.name for path in [*find_built(target, since), *restored] if looks_complete(path)}
        candidates = sorted({*(target / name for name in checked), *restored})
    else:
        reports = list(uses)
        checked = {path.name for path in find_used(target, reports)}
        candidates = find_used(target, reports, installed)
    for path in candidates:
        try:
            artifact = describe(path)
            key = object_key(prefix, artifact.sha256)
            stored = key in elsewhere or any(entry.key == key for entry in store.list(key))
            if not stored and path.name not in checked:
                raise HeaderError("changed since the restore installed it, and no process checked it")
            if not stored:
                packed = scratch / key
                try:
                    with open(packed, "wb") as out:
                        compress(path, out, artifact)
                    store.put(key, packed)
                finally:
                    with contextlib.suppress(OSError):
                        packed.unlink()
                result.transferred.append(artifact.name)
            result.artifacts.append(artifact)
        except Exception as exc:  # a store or file problem costs this header, not the save
            result.errors.append(f"precompiled header {path.name} not saved: {_one_line(exc)}")
    return result


def restore_headers(
    store: Store,
    prefix: str,
    entries: Iterable[Artifact],
    scratch: Path,
    directory: Path | None = None,
    reservation: Reservation | None = None,
) -> HeaderTransfer:
    """Controller, at session start, before any test: install the headers a verified manifest names.

    ``entries`` are the manifest's artifacts (other kinds are ignored; each header's entry is checked with
    :func:`header_artifact`); the manifest must already be verified
    (checksums, signature), since its sha256 is what every downloaded byte is checked against. A header
    already present is not downloaded. Every failure (a bad entry, a store miss, content that does not match)
    is one line in ``errors`` and leaves the header dir as it was: torch then builds the header itself.
    ``transferred`` lists the installed names; ``artifacts`` every valid entry, installed or already present:
    pass ``[a.name for a in result.artifacts]`` to :func:`find_used` as ``installed`` at session end, so the
    next bundle names them again even though no kernel build read them.

    ``reservation`` (:func:`reserve_headers`, same ``directory``): the headers whose build lock it holds are
    installed under it, and each lock is let go once its header is in place or failed; all are let go on
    return, whatever happens.
    """
    try:
        return _restore_headers(store, prefix, entries, scratch, directory or header_dir(), reservation)
    finally:
        if reservation is not None:
            reservation.release()


def _restore_headers(
    store: Store, prefix: str, entries: Iterable[Artifact], scratch: Path, target: Path, reservation: Reservation | None
) -> HeaderTransfer:
    result = HeaderTransfer()
    for entry in entries:
        if entry.kind != KIND:
            continue
        try:
            artifact = header_artifact(entry)
            result.artifacts.append(artifact)
            damaged = is_damaged_copy(target / artifact.name)
            if os.path.lexists(target / artifact.name) and not damaged:
                continue  # torch's or an earlier restore's: the processes that look it up check it
            key = object_key(prefix, artifact.sha256)
            packed = scratch / key
            try:
                # Sized before it is fetched: a store object is anyone's who can write the store, and only
                # the manifest's size (verified with the bundle) bounds what a header can take packed.
                listed = [found.size for found in store.list(key) if found.key == key]
                if not listed:
                    raise HeaderError(f"{key} is not in the store")
                if listed[0] > packed_bound(artifact.size):
                    raise HeaderError(f"{key} is {listed[0]} bytes: more than a {artifact.size}-byte header packs to")
                if not store.get(key, packed, limit=packed_bound(artifact.size)):
                    raise HeaderError(f"{key} is not in the store")
                with open(packed, "rb") as fh:
                    reserved = reservation is not None and artifact.name in reservation.held
                    if (
                        _install_locked(artifact, fh, target / artifact.name)
                        if reserved
                        else install_header(artifact, fh, target)
                    ):
                        result.transferred.append(artifact.name)
                        if damaged:
                            result.notes.append(
                                f"precompiled header {artifact.name} was damaged (not a PCH); replaced with the "
                                "bundle's verified copy"
                            )
            finally:
                with contextlib.suppress(OSError):
                    packed.unlink()
        except Exception as exc:  # infrastructure trouble: torch builds the header as it would without us
            result.errors.append(f"precompiled header {entry.name!r} not restored: {_one_line(exc)}")
        finally:
            if reservation is not None:
                reservation.release(entry.name)  # in place, or failed: torch may look it up (or build it)
    return result


def _one_line(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if not isinstance(exc, HeaderError) else text


# --------------------------------------------------------------------------- internals


def _open_regular(path: Path) -> BinaryIO:
    """Open a regular file for reading without following a symlink at its last component."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise HeaderError(f"{path} is not a regular file")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _ensure_dir(directory: Path) -> None:
    """Create torch's header dir (and its parent) like torch would; refuse symlinks and other users' dirs.

    ``torchinductor_<user>`` sits in a shared TMPDIR: a dir planted there by someone else (or a link to
    elsewhere) must not receive code that gcc will load.
    """
    for path in (directory.parent, directory):
        try:
            os.mkdir(path)
        except FileExistsError:
            pass
        except OSError as exc:
            raise HeaderError(f"cannot create {path}: {exc.strerror or exc}") from None
        info = os.lstat(path)
        if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
            raise HeaderError(f"{path} is not a plain directory; not installing precompiled headers there")
        if hasattr(os, "getuid") and info.st_uid != os.getuid():
            raise HeaderError(f"{path} belongs to another user; not installing precompiled headers there")


@contextlib.contextmanager
def _build_lock(directory: Path, name: str):  # type: ignore[no-untyped-def]
    """torch's own lock for this header (``locks/<hash>.lock``, a ``filelock`` flock), taken without waiting.

    Yields False when torch holds it: torch is building this very header and will publish it itself.
    """
    fd = _take_build_lock(directory, name)
    if fd is None:
        yield False
        return
    try:
        yield True
    finally:
        os.close(fd)  # drops the flock: no other fd of ours refers to this open file


def _take_build_lock(directory: Path, name: str) -> int | None:
    """The fd of torch's build lock for ``name``, flocked without waiting; None when another holds it."""
    locks = directory / "locks"
    try:
        os.makedirs(locks, exist_ok=True)
        fd = os.open(locks / _lock_name(name), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666)
    except OSError as exc:
        raise HeaderError(f"cannot lock {name}: {exc.strerror or exc}") from None
    try:
        taken = try_flock(fd)
    except OSError as exc:
        os.close(fd)
        raise HeaderError(f"cannot lock {name}: {exc.strerror or exc}") from None
    if not taken:
        os.close(fd)
        return None
    return fd


def _being_built(directory: Path, name: str) -> bool:
    """True when torch's build lock for this header exists and another process holds it (never creates it)."""
    try:
        fd = os.open(directory / "locks" / _lock_name(name), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False  # no lock file: torch never started building this header here
    try:
        return not try_flock(fd, shared=True)
    except OSError:
        return True  # a lock we cannot even probe: treat it as held, never install under it
    finally:
        os.close(fd)  # closing drops the probe's own lock, if it got one


def wait_while_built(path: Path, timeout: float = CHECK_TIMEOUT) -> bool:
    """Wait while torch's build lock of header ``path`` is held (torch building it, or a restore installing
    it: :class:`Reservation`), polling, at most ``timeout`` seconds; True when ``path`` is then a regular file."""
    deadline = time.monotonic() + timeout
    while _being_built(path.parent, path.name) and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _lock_name(name: str) -> str:
    # torch: os.path.join(_HEADER_LOCK_DIR, f"{header_hash}.lock"); header_hash is the name before ".h".
    return name.split(".", 1)[0] + ".lock"


def _copy_verified(artifact: Artifact, compressed: BinaryIO, out: BinaryIO) -> None:
    import zstandard

    digest = hashlib.sha256()
    size = 0
    try:
        reader = zstandard.ZstdDecompressor().stream_reader(compressed, closefd=False)
        while True:
            chunk = reader.read(_CHUNK)
            if not chunk:
                break
            size += len(chunk)
            if size > artifact.size:
                raise HeaderError(f"{artifact.name}: more bytes than the manifest's {artifact.size}")
            digest.update(chunk)
            out.write(chunk)
    except zstandard.ZstdError as exc:
        raise HeaderError(f"{artifact.name}: not a zstd stream ({exc})") from None
    if size != artifact.size or digest.hexdigest() != artifact.sha256:
        raise HeaderError(f"{artifact.name}: content does not match the manifest's sha256; not installed")


def session_start() -> float:
    """The ``since`` to pass to :func:`find_used` later: now, less a second for coarse file-system clocks."""
    return time.time() - 1.0
