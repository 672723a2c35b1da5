"""The record of headers the compiler accepted (:data:`VERDICTS`), kept beside them in torch's header dir, so
that a header checked once is not checked again while it is the very same file under the very same check.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from typing import Iterator
from typing import Sequence

from .._env import COMPILER_ENVS
from .._fs import atomic_file
from .._fs import hold_lock
from .._fs import let_go
from .names import SHA256
from .names import is_header_name
from .names import owned_dir

VERDICTS = ".compilecache-verdicts.json"
"""The record of headers the compiler accepted, kept in torch's header dir beside them (:func:`check`)."""
# Where the record lives, and why there. Beside the headers it describes, not in the session's cache dir:
# a header is a file of torch's header dir (per TMPDIR and user), shared by every cache dir, every mode
# (isolated sessions too) and the Action's split restore/save; the record lives and dies with those files
# (a fresh runner has neither). Ownership is proved before the record is read or written (owned_dir):
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
_COMPILER_ENV = COMPILER_ENVS


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
            hold_lock(fd)  # a process forked meanwhile (torch's fork workers, a forked test) must not keep it
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_EX)  # a check takes at most CHECK_TIMEOUT; a dead holder lets go
        yield
    finally:
        if fd >= 0:
            let_go(fd)


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
        if compiler is None or not is_header_name(path.name) or not owned_dir(directory):
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
        if len(data) > _VERDICTS_MAX_BYTES or not owned_dir(self.directory):
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
        if not (isinstance(checks, list) and all(isinstance(c, str) and SHA256.fullmatch(c) for c in checks)):
            continue
        entries[name] = {"file": file, "checks": checks[-_VERDICTS_MAX_CHECKS:]}
    return entries


def forget(directory: Path, name: str) -> bool:
    """Drop header ``name`` from the record in ``directory`` (its next look-up checks it again); True when the
    record held it. Best effort, with the ownership checks of every write of the record."""
    recorded = _read_verdicts(directory)
    if name not in recorded or not owned_dir(directory):
        return False
    kept = {other: entry for other, entry in recorded.items() if other != name}
    data = json.dumps({"version": 1, "accepted": kept}, sort_keys=True).encode()
    with contextlib.suppress(OSError), atomic_file(directory / VERDICTS, fsync=False, mode=0o600) as out:
        out.write(data)
    return True
