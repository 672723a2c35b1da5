"""Atomic file writes and the names of everything temporary this package creates, with their sweeper.

Every temp file or dir we create carries its owner in its name::

    [.]<what>compilecache-<kind>-<host>-<pid>-<time>-<random>[.tmp|.lock]

``kind`` is ``staging`` (a bundle being installed into a cache dir), ``save`` / ``restore`` (scratch dirs in
TMPDIR), ``tmp`` (an atomic write in progress) or ``ticket`` (an xdist controller's restore ticket in its
cache dir, and its ``.lock``, :mod:`.cachedir.ticket`); ``host`` is a short hash of the host name and pid
namespace, ``pid`` the owner's process id and ``time`` its creation time in epoch seconds. A process killed
by SIGKILL cannot clean up, so :func:`sweep_our_temps` removes entries of that shape whose owner is provably
gone (same host, dead pid) or, made on another host, older than ``max_age`` (see :func:`is_stale`).
Nothing without such a name is ever touched: we never delete what we cannot prove is ours.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import os
import re
import shutil
import socket
import stat
import tempfile
import time
from pathlib import Path
from typing import BinaryIO
from typing import Iterator
from typing import Literal
from typing import NamedTuple

__all__ = [
    "TempName",
    "atomic_file",
    "host_tag",
    "is_stale",
    "parse_temp_name",
    "pid_alive",
    "sweep_our_temps",
    "temp_dir",
    "temp_name",
    "try_flock",
]

TempKind = Literal["staging", "save", "restore", "tmp", "ticket"]
DEFAULT_MAX_AGE = 3600.0
MAX_AGE_ALIVE = 24 * 3600.0

# A string: ``re`` compiles it on first use (a session that never sweeps never pays for it).
_TEMP = (
    r"^(?P<lead>.*?)compilecache-(?P<kind>staging|save|restore|tmp|ticket)-(?P<host>[0-9a-f]{8})-(?P<pid>[0-9]{1,10})"
    r"-(?P<time>[0-9]{1,12})-(?P<rand>[0-9a-z]{8})(?:\.tmp|\.lock)?$"
)


@functools.cache  # once per process: every temp name (a bundle install writes one per file) carries it
def host_tag() -> str:
    """Hash of the host name, the boot and the pid namespace: equal tags mean our pids name the same processes.

    The pid namespace alone is not enough: every Linux machine's initial one reads ``pid:[4026531836]``, so
    two machines of one host name sharing a network dir would take each other's pids for their own (and
    sweep a live peer's temp files). The boot id tells machines (and reboots) apart; containers of one
    machine share it and differ in their namespace, unless they share the pid space too (``--pid=host``),
    when they do see each other's processes.
    """
    namespace = ""
    with contextlib.suppress(OSError):
        namespace = os.readlink("/proc/self/ns/pid")  # containers sharing a host name and a volume differ here
    text = f"{socket.gethostname()}\0{namespace}\0{boot_id()}"
    return hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()[:8]


@functools.cache
def boot_id() -> str:
    """The running kernel's boot id, "" where there is none (not Linux). Every container of a machine reads the
    same one (it is not namespaced) and a reboot makes a new one: equal ids mean one running kernel, whose
    locks every process on it sees, whatever its host name or pid namespace."""
    with contextlib.suppress(OSError, UnicodeDecodeError), open("/proc/sys/kernel/random/boot_id", "rb") as fh:
        said = fh.read(64).decode("ascii").strip()
        return said if re.fullmatch(r"[0-9a-f-]{16,40}", said) else ""
    return ""


def temp_name(kind: TempKind, lead: str = "") -> str:
    """A fresh, unique name for a temp entry of ``kind``, owned by this process (see the module docstring)."""
    suffix = ".tmp" if kind == "tmp" else ""
    # Unique, not secret: os.urandom directly (``secrets`` would load hmac and random's SystemRandom in every
    # session with a cache dir); the slight modulo bias does not matter for uniqueness.
    rand = "".join("0123456789abcdefghijklmnopqrstuvwxyz"[byte % 36] for byte in os.urandom(8))
    return f"{lead}compilecache-{kind}-{host_tag()}-{os.getpid()}-{int(time.time())}-{rand}{suffix}"


class TempName(NamedTuple):
    """What a temp entry's name says about its owner."""

    kind: str
    host: str
    pid: int
    created: float


def parse_temp_name(name: str) -> TempName | None:
    """The owner encoded in ``name``, or None when it is not a name :func:`temp_name` made."""
    match = re.fullmatch(_TEMP, name)
    if match is None:
        return None
    return TempName(match["kind"], match["host"], int(match["pid"]), float(match["time"]))


def pid_alive(pid: int) -> bool:
    """Does process ``pid`` exist on this host (in this pid namespace)? This process counts as alive."""
    if pid <= 0:
        return False
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists, owned by someone else
        return True
    return True


def is_stale(owner: TempName, *, now: float | None = None, max_age: float = DEFAULT_MAX_AGE) -> bool:
    """True when the owner is provably gone.

    Made here (same host and pid namespace): its pid is dead, or the entry is older than
    :data:`MAX_AGE_ALIVE` (the pid was reused). Made elsewhere: older than ``max_age``. A live owner's entry is
    never stale before a day, so a slow download or a long restore is never swept from under its owner.
    """
    age = (time.time() if now is None else now) - owner.created
    if owner.host == host_tag():
        return age > MAX_AGE_ALIVE or not pid_alive(owner.pid)
    return age > max_age


def file_identity(info: os.stat_result) -> tuple[int, int, int, int]:
    """What says "this very file, unchanged since": device, inode, mtime and ctime (ns). A freed inode number
    goes to the next file at once (ext4), so the inode alone is not enough; the ctime is the stamp no process
    can set back (``utime`` sets atime and mtime only, every write, chmod or rename moves ctime to now)."""
    return (info.st_dev, info.st_ino, info.st_mtime_ns, info.st_ctime_ns)


def rmtree_at(dir_fd: int, name: str) -> None:
    """Remove dir ``name`` of the dir open as ``dir_fd`` and all below it, following no link (a link is
    unlinked, never entered); OSError when ``name`` itself cannot be removed.

    ``shutil.rmtree(name, dir_fd=...)`` does the same from Python 3.11 on; this works on every version we
    support.
    """
    for _top, dirs, files, fd in os.fwalk(name, topdown=False, dir_fd=dir_fd):
        for entry in files:
            with contextlib.suppress(OSError):
                os.unlink(entry, dir_fd=fd)
        for entry in dirs:
            try:
                os.rmdir(entry, dir_fd=fd)
            except NotADirectoryError:  # a link to a dir: fwalk lists it with the dirs and never enters it
                with contextlib.suppress(OSError):
                    os.unlink(entry, dir_fd=fd)
            except OSError:
                pass
    os.rmdir(name, dir_fd=dir_fd)


def sweep_our_temps(
    directory: str | os.PathLike[str],
    *,
    max_age: float = DEFAULT_MAX_AGE,
    live: frozenset[tuple[int, str]] = frozenset(),
) -> list[str]:
    """Remove the stale temp entries directly inside ``directory``; return the names removed.

    Only names made by :func:`temp_name` are considered (see :func:`is_stale`), never one whose ``(pid, host
    tag)`` is in ``live`` (the owners a registration proves alive, whatever the entry's age); a symlink is
    unlinked, never followed, and dirs are removed with :func:`rmtree_at` relative to a dir fd (which does not
    follow links).
    Best effort: a missing dir or an entry that cannot be removed is skipped silently.
    """
    removed: list[str] = []
    try:
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return removed
    try:
        for name in sorted(os.listdir(dir_fd)):
            owner = parse_temp_name(name)
            if owner is None or (owner.pid, owner.host) in live or not is_stale(owner, max_age=max_age):
                continue
            try:
                info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                if stat.S_ISDIR(info.st_mode):
                    rmtree_at(dir_fd, name)
                else:
                    os.unlink(name, dir_fd=dir_fd)
            except OSError:
                continue
            removed.append(name)
    finally:
        os.close(dir_fd)
    return removed


def temp_dir(kind: TempKind, parent: str | os.PathLike[str] | None = None) -> str:
    """Create a private temp dir named by :func:`temp_name` (in TMPDIR by default); return its path."""
    base = os.fspath(parent) if parent is not None else tempfile.gettempdir()
    while True:
        path = os.path.join(base, temp_name(kind))
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            continue
        return path


@contextlib.contextmanager
def temporary_dir(kind: TempKind, parent: str | os.PathLike[str] | None = None) -> Iterator[str]:
    """:func:`temp_dir` as a context manager: removed on exit, whatever happens."""
    path = temp_dir(kind, parent)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def report_target(path: str, option: str) -> Path:
    """``path`` for a report written later (the plugin's JSON at session end, the CLI's ``--json``): a path
    that cannot be written (tried now, by making a file beside it, or in the nearest dir on its way that
    exists) is a ConfigError naming ``option`` now, before any work, not a warning after it. Makes no dir:
    the writer makes the missing ones, so a start refused for another reason leaves none behind."""
    from .errors import ConfigError

    target = Path(path)
    if target.is_dir():
        raise ConfigError(f"{option}: {path} is a directory")
    existing = target.parent
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"{option}: cannot create the directory of {path}: {existing} is not a directory")
    # Tried, not asked: ``os.access`` says yes to root everywhere (a CI container's /sys, a read-only mount).
    # The report is written as :func:`atomic_file` writes: a temp sibling renamed over ``path``, so making
    # (and removing) such a sibling is the whole check; what ``path`` itself allows does not matter.
    probe = existing / temp_name("tmp", lead=f".{target.name[:120]}.")
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
    except OSError as exc:
        raise ConfigError(f"{option}: {path} is not writable ({exc.strerror or exc})") from None
    with contextlib.suppress(OSError):
        os.unlink(probe)
    return target


@contextlib.contextmanager
def atomic_file(dest: Path, *, fsync: bool = True, mode: int = 0o644) -> Iterator[BinaryIO]:
    """Yield a writer on a temp sibling of ``dest``; on success publish it with ``os.replace``.

    The temp file is ``.<name>.compilecache-tmp-<host>-<pid>-<time>-<random>.tmp`` in the same directory (so
    the rename is atomic, other readers skip it by its leading dot, and :func:`sweep_our_temps` can remove it
    after a SIGKILL). On any exception, including KeyboardInterrupt, the temp file is removed and ``dest`` is
    untouched. ``os.replace`` swaps the directory entry, so an existing symlink at ``dest`` is replaced, never
    written through. ``mode`` is applied explicitly: these files are caches, not secrets.
    """
    dest = Path(dest)
    while True:
        # The owner suffix takes about 55 bytes: cut a long name so the temp name stays under NAME_MAX (255).
        tmp = dest.parent / temp_name("tmp", lead=f".{dest.name[:120]}.")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_BINARY", 0), 0o600)
        except FileExistsError:
            continue
        break
    try:
        with os.fdopen(fd, "wb") as writer:
            yield writer
            writer.flush()
            if fsync:
                os.fsync(writer.fileno())
            os.fchmod(writer.fileno(), mode)  # the file we made, not whatever its name points at by now
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


_HELD_LOCKS: set[int] = set()  # fds of this process's flocks that a forked child must not keep
_FORK_HOOK: list[bool] = []


def _close_held_locks_in_child() -> None:
    for fd in list(_HELD_LOCKS):
        with contextlib.suppress(OSError):
            os.close(fd)  # the child's copy: the parent's lock stays, and goes when the parent closes its fd
    _HELD_LOCKS.clear()


def hold_lock(fd: int) -> int:
    """Note ``fd``, on which this process holds an ``flock``, so that a process forked while it is held (a
    forked test, torch's ``fork`` compile workers) closes its copy at once: an flock belongs to the open file,
    so the child's inherited fd would otherwise hold the lock for as long as the child lives. Returns ``fd``."""
    if not _FORK_HOOK and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_close_held_locks_in_child)
        _FORK_HOOK.append(True)
    _HELD_LOCKS.add(fd)
    return fd


def let_go(fd: int) -> None:
    """Close ``fd`` from :func:`hold_lock`: the lock goes with it."""
    _HELD_LOCKS.discard(fd)
    os.close(fd)


def try_flock(fd: int, *, shared: bool = False) -> bool:
    """Take an ``flock`` on ``fd`` without waiting: True when taken, False when another process holds a
    conflicting one; any other failure raises OSError. POSIX only, like torch's own locks."""
    import fcntl  # imported here so the module loads anywhere

    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True
