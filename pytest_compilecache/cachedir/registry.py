"""The live-session registry of a shared dir: each session that uses it holds an ``flock`` on a marker in
``.compilecache-sessions/`` for its life, so a killed session's registration is visibly dead and removed.
Loads lazily (inside the functions that need them, so a session pays only for what it uses): ``.._fs``, ``fcntl``.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import contextlib
import errno
import functools
import itertools
import json
import os
import re
import socket
import stat
import time
from typing import Callable
from typing import Iterator
from typing import NamedTuple

from .layout import CLOEXEC
from .layout import DIR_NOFOLLOW
from .layout import SESSIONS_DIR

_MARKER = r"(\d+)-([0-9a-f]{8})-(\d+)-(\d+)"  # <pid>-<host>-<start, ns>-<n>
_SERIAL = itertools.count()
_OWN: dict[str, Registration] = {}  # this process's live registrations, by marker path


class Registration:
    """A live session's mark in a cache dir: a file holding an ``flock`` until :meth:`close` (or death).

    A plain class, not a dataclass: every session with a shared dir makes one (a dataclass costs at import).
    """

    def __init__(self, path: str, marker: str, start: float, fd: int | None) -> None:
        self.path = path
        self.marker = marker
        self.start = start
        self.fd = fd

    def __repr__(self) -> str:
        return f"Registration(path={self.path!r}, marker={self.marker!r}, start={self.start}, fd={self.fd})"

    def close(self) -> None:
        """Withdraw the registration (idempotent): unlink the marker, then release the lock."""
        if self.fd is None:
            return
        _OWN.pop(self.marker, None)
        with contextlib.suppress(OSError), _sessions_dir(self.path, create=False) as folder:
            if folder is not None:
                os.unlink(os.path.basename(self.marker), dir_fd=folder)
        os.close(self.fd)
        self.fd = None

    def renew(self) -> None:
        """Register again if the marker was removed meanwhile (``--cache-clear`` deletes a shared dir
        under ``.pytest_cache`` after the session registered in it, and :func:`make_dir` makes it anew)."""
        if self.fd is None or os.path.exists(self.marker):
            return
        _OWN.pop(self.marker, None)
        os.close(self.fd)
        self.fd = None
        self.marker, self.fd = _create_marker(self.path, self.start)
        _OWN[self.marker] = self

    def __enter__(self) -> Registration:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


class LiveSession(NamedTuple):
    pid: int
    start: float
    here: bool  # on this host
    host: str = ""  # its host tag (:func:`.._fs.host_tag`): with ``pid``, the owner its temp names carry


def register_session(path: str, *, start: float | None = None) -> Registration:
    """Register this process as a live user of cache dir ``path`` until the registration is closed.

    The marker is created under a temp name, locked, then renamed into place, so every visible marker
    is locked from the start (a peer never mistakes a new one for a dead one). ``start`` (default now)
    is when the session began using the dir. Raises OSError when the dir is not writable.
    """
    begun = time.time() if start is None else start
    marker, fd = _create_marker(path, begun)
    registration = Registration(path=path, marker=marker, start=begun, fd=fd)
    _OWN[marker] = registration
    return registration


@contextlib.contextmanager
def _sessions_dir(path: str, *, create: bool) -> Iterator[int | None]:
    """An fd of ``path``'s registrations dir, opened without following a link; None when there is none.

    OSError when it is a link or not a dir (planted: registrations are never read or written through it).
    """
    root = os.open(path, os.O_RDONLY | os.O_DIRECTORY | CLOEXEC)
    try:
        made = False
        if create:
            with contextlib.suppress(FileExistsError):
                os.mkdir(SESSIONS_DIR, 0o755, dir_fd=root)
                made = True
        try:
            folder = os.open(SESSIONS_DIR, DIR_NOFOLLOW, dir_fd=root)
        except FileNotFoundError:
            folder = None
        if made and folder is not None:
            # Not the umask's: every user of the cache dir must see the registrations (a marker another user's
            # trim cannot read is a live session it cannot see), and may register where they may write.
            with contextlib.suppress(OSError):
                os.fchmod(folder, 0o755 | (os.fstat(root).st_mode & 0o1022))
        try:
            yield folder
        finally:
            if folder is not None:
                os.close(folder)
    finally:
        os.close(root)


def _create_marker(path: str, begun: float) -> tuple[str, int]:
    from .._fs import boot_id
    from .._fs import host_tag
    from .._fs import temp_name

    with _sessions_dir(path, create=True) as folder:
        if folder is None:  # pragma: no cover - just made
            raise FileNotFoundError(os.path.join(path, SESSIONS_DIR))
        tmp = temp_name("tmp", lead=".")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | CLOEXEC, 0o644, dir_fd=folder)
        try:
            os.fchmod(fd, 0o644)  # readable by every user of the dir whatever the umask (077 makes it 0600)
            import fcntl  # POSIX only, like torch's C++ cache; imported here so the module loads anywhere

            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            seen = os.fstat(fd)  # what a peer container's sweep compares (abandoned): this very inode, a local disk
            said = {"pid": os.getpid(), "host": socket.gethostname(), "start": begun, "boot": boot_id(),
                    "dev": seen.st_dev, "ino": seen.st_ino, "local": on_local_disk(path)}  # fmt: skip
            os.write(fd, json.dumps(said).encode())
            name = f"{os.getpid()}-{host_tag()}-{int(begun * 1e9)}-{next(_SERIAL)}"
            os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=folder)
            raise
    return os.path.join(path, SESSIONS_DIR, name), fd


# What live_sessions reports when the registrations cannot be read (a link or a file planted in their place):
# someone may be live, so nothing is trimmed; the session that meets it cannot register either.
UNKNOWN_SESSION = LiveSession(pid=0, start=0.0, here=False)


def live_owners(path: str) -> frozenset[tuple[int, str]]:
    """``(pid, host tag)`` of every session registered in ``path`` whose registration is held: temp entries
    such an owner's name carries are in use, whatever their age (a session of hours, a peer container whose
    pid namespace differs)."""
    return frozenset((session.pid, session.host) for session in live_sessions(path) if session.host)


def live_sessions(path: str, *, excluding: str | None = None) -> list[LiveSession]:
    """The sessions registered in ``path`` whose registration is still held (alive); dead ones are removed on
    the way. This process's own registrations count too (a session run in-process inside another is
    another session), except the marker ``excluding`` (the caller's own). Registrations are read and
    removed through the dir's fd, never through a link: a registrations dir that is a link or not a dir
    reports :data:`UNKNOWN_SESSION`."""
    try:
        with _sessions_dir(path, create=False) as folder:
            if folder is None:
                return []
            names = os.listdir(folder)
            from .._fs import host_tag

            live = []
            for name in names:
                match = re.fullmatch(_MARKER, name)
                marker = os.path.join(path, SESSIONS_DIR, name)
                if not match or marker == excluding:
                    continue
                if marker in _OWN or _held(folder, name):
                    live.append(LiveSession(int(match[1]), int(match[3]) / 1e9, match[2] == host_tag(), match[2]))
            return live
    except FileNotFoundError:
        return []  # no cache dir (yet)
    except OSError:
        return [UNKNOWN_SESSION]


def abandoned(path: str) -> bool:
    """True when ``path`` holds registrations and every one is provably dead: the sessions that used it were
    killed (a session that ended withdrew its own). Removes nothing.

    A registration's lock is tried only through the very inode its writer locked (the ``dev`` and ``ino`` it
    records): an overlay, FUSE or NFS loopback view of the dir shows other inodes, whose locks are not the
    writer's. One of another host tag (a container with its own host name and pid namespace, this machine before
    a reboot) is tried only where both its writer and this process see a local disk (:func:`on_local_disk`: no
    other machine, VM or network client reaches the dir, whose locks would not show here). None at all, one
    still held, one that cannot be read, one of an older version that records none of this: False."""
    from .._fs import host_tag

    try:
        with _sessions_dir(path, create=False) as folder:
            if folder is None:
                return False
            markers = [match for match in map(re.compile(_MARKER).fullmatch, os.listdir(folder)) if match]
            seen_local = functools.cache(lambda: on_local_disk(path))  # asked once, for another host tag only
            for match in markers:
                name = match[0]
                if os.path.join(path, SESSIONS_DIR, name) in _OWN:
                    return False
                if not _dead(folder, name, here=match[2] == host_tag(), local=seen_local):
                    return False
            return bool(markers)
    except OSError:
        return False


def _dead(folder: int, name: str, *, here: bool, local: Callable[[], bool]) -> bool:
    """Whether marker ``name`` proves its writer dead (:func:`abandoned`): it records the very inode this process
    opens, and, when not of this host tag (``here``), a kernel seen here on a local disk (``local``); then its
    lock, tried on that very file, is free. Any doubt (a hostile or older marker, a failure): False."""
    from .._fs import try_flock

    try:
        fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder)
    except OSError:
        return False
    try:
        seen = os.fstat(fd)
        said = json.loads(os.read(fd, 4096)) if stat.S_ISREG(seen.st_mode) else None
        if not isinstance(said, dict):
            return False
        if _number(said.get("dev")) != seen.st_dev or _number(said.get("ino")) != seen.st_ino:
            return False
        if not here and not (_another_kernel_seen_here(said) and local()):
            return False
        return try_flock(fd)  # taken: nobody holds it (closing the fd lets it go again)
    except (OSError, ValueError, RecursionError):  # a hostile marker: kept, never a crash
        return False
    finally:
        os.close(fd)


def _another_kernel_seen_here(said: dict[str, object]) -> bool:
    """Whether a marker of another host tag is this kernel's (another container) or an earlier boot's, on a disk
    its writer too saw as local (no lock survives a reboot; this kernel's locks show here)."""
    from .._fs import boot_id

    kernel = said.get("boot")
    valid = isinstance(kernel, str) and re.fullmatch(r"[0-9a-f-]{16,40}", kernel)
    return said.get("local") is True and bool(valid) and bool(boot_id())


def _number(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# Filesystems of a disk (or memory) only the running machine mounts. Not: nfs, cifs/smb3, 9p, virtiofs, fuse
# (sshfs, ...), ceph, gfs2/ocfs2 (cluster filesystems): another machine may hold a lock there now.
LOCAL_FILESYSTEMS = frozenset(
    {b"ext2", b"ext3", b"ext4", b"xfs", b"btrfs", b"f2fs", b"bcachefs", b"zfs", b"tmpfs", b"ramfs", b"overlay"}
)


def on_local_disk(path: str, mountinfo: str = "/proc/self/mountinfo") -> bool:
    """Whether dir ``path`` lies on one of :data:`LOCAL_FILESYSTEMS`, as the kernel's mount table says: the mount
    whose device is the one ``path`` is on (a mount hidden under a later one is another device) with the
    longest mount point above it. False when unknown."""
    try:
        with open(mountinfo, "rb") as fh:
            table = fh.read()
        real = os.fsencode(os.path.realpath(path))
        device = os.stat(real).st_dev
    except OSError:
        return False
    best, kind = b"", b""
    for line in table.split(b"\n"):  # only a newline ends a line (the kernel escapes it in a mount point)
        fields, _, after = line.partition(b" - ")
        parts = fields.split(b" ")
        if len(parts) < 5 or not after or parts[2] != b"%d:%d" % (os.major(device), os.minor(device)):
            continue
        point = re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m[1], 8) & 0xFF]), parts[4])
        inside = real == point or real.startswith(point.rstrip(b"/") + b"/")
        if inside and len(point) >= len(best):
            best, kind = point, after.split(b" ", 1)[0]
    return kind in LOCAL_FILESYSTEMS


def _held(folder: int, name: str) -> bool:
    """Is marker ``name`` locked by a live process? A dead one's is removed (while we hold its lock)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder)
    except OSError as exc:  # gone (its owner closed it), or a link or socket planted there: no session's
        # Otherwise another user's, unreadable (an older version's, umask 077), or no fd left: may be live.
        return exc.errno not in (errno.ENOENT, errno.ELOOP, errno.ENXIO)
    try:
        from .._fs import try_flock

        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False  # not a marker we write: neither a session nor ours to remove
        if not try_flock(fd):
            return True
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=folder)
        return False
    finally:
        os.close(fd)
