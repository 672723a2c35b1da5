"""Cache-dir I/O that no symlink can redirect: reading cache files to pack, staging and installing bundles.

Every path below the cache dir is walked one component at a time with ``os.open(..., dir_fd=...,
O_NOFOLLOW | O_DIRECTORY)``; files are created, opened and renamed relative to those dir fds. So no symlink
inside the cache dir is ever followed, and swapping a dir for a symlink between a check and a use (a
``renameat2`` exchange) makes the operation fail instead of writing or reading outside. The cache dir itself
may be reached through a symlink (``/tmp`` -> ``/private/tmp``): it is opened once, by path.

Installing is all or nothing: a verified bundle's files are streamed into a :class:`Staging` dir inside the
cache dir (``.compilecache-staging-<host>-<pid>-<time>-<random>``), the tree is checked for installability,
then each file is renamed into place; replaced files are first moved into the staging dir, so any failure
rolls back to exactly the tree found, and the staging dir is removed on close.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
import time
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import BinaryIO
from typing import Callable
from typing import Iterable
from typing import Iterator

from ._fs import file_identity
from ._fs import rmtree_at
from ._fs import temp_name
from .errors import BundleError
from .errors import CacheDirError

__all__ = [
    "CacheDirError", "Installed", "Staging", "cache_file_size", "open_cache_file", "open_root", "read_cache_file",
    "remove_files_in",
]  # fmt: skip

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | _CLOEXEC | getattr(os, "O_BINARY", 0)
_CHUNK = 1024 * 1024
_OPEN_DIRS = 64
# errnos of a file system that will not take a second link to a file (FAT, protected_hardlinks, link limit)
_NO_LINKS = (errno.EPERM, errno.EACCES, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK)


@dataclass(frozen=True)
class Installed:
    """What :meth:`Staging.install` did: files written, and files left alone because identical ones were there."""

    files: tuple[str, ...]
    unchanged: tuple[str, ...] = ()


def _why(exc: OSError) -> str:
    return exc.strerror or str(exc)


def open_root(cache_dir: Path, *, create: bool) -> tuple[int, list[Path]]:
    """Open the cache dir (following links in its own path); return its fd and the dirs created for it.

    With ``create`` the dir and missing parents are made; the created ones are returned (outermost first)
    so that a failed restore can remove them again. OSError propagates.
    """
    cache_dir = Path(os.path.abspath(cache_dir))
    created: list[Path] = []
    if create:
        missing: list[Path] = []
        current = cache_dir
        while not os.path.lexists(current):
            missing.append(current)
            current = current.parent
        for path in reversed(missing):
            try:
                os.mkdir(path)
            except FileExistsError:
                continue
            created.append(path)
    return os.open(cache_dir, os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC), created


def _describe(dir_fd: int, name: str) -> str:
    try:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return "is missing"
    if stat.S_ISLNK(info.st_mode):
        return "is a symlink (links are never followed inside the cache dir)"
    if not stat.S_ISDIR(info.st_mode):
        return "is not a directory"
    return "cannot be opened"


def _open_dir(dir_fd: int, name: str) -> int:
    return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)


def open_cache_file(root_fd: int, rel: str) -> int | None:
    """Open ``rel`` under the cache dir for reading, following no link; None when it (or a parent) vanished.

    A symlink anywhere on the way, or something that is not a regular file, is a :class:`BundleError`.
    """
    parts = rel.split("/")
    fd = os.dup(root_fd)
    try:
        for index, part in enumerate(parts[:-1]):
            try:
                child = _open_dir(fd, part)
            except FileNotFoundError:
                return None
            except OSError as exc:
                where = "/".join(parts[: index + 1])
                if exc.errno in (errno.ELOOP, errno.ENOTDIR) and "symlink" in _describe(fd, part):
                    raise BundleError(f"cache file path {rel!r} escapes the cache dir (through a symlink)") from None
                raise BundleError(f"cannot read cache file {rel!r}: {where} {_describe(fd, part)}") from None
            os.close(fd)
            fd = child
        try:
            file_fd = os.open(parts[-1], _READ_FLAGS, dir_fd=fd)
        except FileNotFoundError:
            return None  # torch deleted it meanwhile: not an error.
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EMLINK) or "symlink" in _describe(fd, parts[-1]):
                raise BundleError(f"cache file {rel!r} is not a regular file (symlink)") from None
            raise BundleError(f"cannot read cache file {rel!r}: {_why(exc)}") from exc
        if not stat.S_ISREG(os.fstat(file_fd).st_mode):
            os.close(file_fd)
            raise BundleError(f"cache file {rel!r} is not a regular file")
        os.set_blocking(file_fd, True)
        return file_fd
    finally:
        os.close(fd)


@dataclass
class _Step:
    parent: str  # rel dir ("" for the root)
    name: str
    backup: str | None  # staging name holding the file this step replaces (a second link to it), if any
    # The new file's identity (st_dev, st_ino, st_mtime_ns, then st_ctime_ns once at its name: the rename sets
    # it): an inode number a file system hands to the next new file matches no longer.
    placed: tuple[int, int, int, int | None] | None = None


@dataclass
class Staging:
    """A private dir inside the cache dir holding verified bytes until they are installed (or dropped).

    Create with :meth:`create`; always :meth:`close` (also a context manager). Slots are flat names chosen
    by the caller (``f000001``); nothing in the staging dir is ever reached through a link.
    """

    cache_dir: Path
    root_fd: int
    fd: int
    name: str
    created: list[Path]
    installed: bool = False
    # Open dir fds by rel path, at most _OPEN_DIRS (least recently used closed first): a bundle of thousands
    # of dirs must not run into the open-files limit (1024 on Linux by default, 256 on macOS).
    _dirs: dict[str, int] = field(default_factory=dict)
    # The last install's steps and new dirs, until close: what undo() takes back.
    _steps: list[_Step] = field(default_factory=list)
    _made: list[tuple[str, str]] = field(default_factory=list)

    @classmethod
    def create(cls, cache_dir: Path) -> Staging:
        """Make ``<cache_dir>/.compilecache-staging-...`` (and the cache dir if missing); BundleError on failure."""
        try:
            root_fd, created = open_root(Path(cache_dir), create=True)
        except OSError as exc:
            raise CacheDirError(f"cannot create cache dir {cache_dir}: {_why(exc)}") from exc
        try:
            name = temp_name("staging", lead=".")
            os.mkdir(name, 0o700, dir_fd=root_fd)
            fd = _open_dir(root_fd, name)
        except OSError as exc:
            os.close(root_fd)
            _remove_created(created)
            raise CacheDirError(f"cannot stage into cache dir {cache_dir}: {_why(exc)}") from exc
        return cls(Path(cache_dir), root_fd, fd, name, created)

    def __enter__(self) -> Staging:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def writer(self, slot: str) -> BinaryIO:
        """A new file ``slot`` in the staging dir, for writing."""
        fd = os.open(slot, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC, 0o644, dir_fd=self.fd)
        return os.fdopen(fd, "wb")

    def read(self, slot: str) -> bytes:
        """The content of ``slot`` (a staged mega-cache blob)."""
        fd = os.open(slot, _READ_FLAGS, dir_fd=self.fd)
        with os.fdopen(fd, "rb") as fh:
            return fh.read()

    def name_max(self) -> int:
        """Longest file name this file system takes (``NAME_MAX``; 255 where unknown)."""
        with contextlib.suppress(OSError, ValueError):
            return int(os.fpathconf(self.root_fd, "PC_NAME_MAX"))
        return 255

    def check_installable(self, rels: Iterable[str]) -> None:
        """Refuse, before anything is written, a file whose place is taken by a dir, a link or a file on the way.

        Also names longer than this file system takes. The tree may still change before :meth:`install`,
        which therefore checks again (and rolls back).
        """
        name_max = self.name_max()
        for rel in rels:
            parts = rel.split("/")
            if any(len(part.encode("utf-8")) > name_max for part in parts):
                raise BundleError(f"cannot unpack {rel}: a name is longer than this file system allows")
            fd = os.dup(self.root_fd)
            try:
                for index, part in enumerate(parts):
                    last = index == len(parts) - 1
                    try:
                        info = os.stat(part, dir_fd=fd, follow_symlinks=False)
                    except FileNotFoundError:
                        break
                    where = "/".join(parts[: index + 1])
                    if last:
                        if stat.S_ISDIR(info.st_mode):
                            raise BundleError(f"cannot unpack {rel}: a directory is in the way")
                        break
                    if stat.S_ISLNK(info.st_mode):
                        raise BundleError(f"refusing to unpack {rel}: {where} is a symlink (links are never followed)")
                    if not stat.S_ISDIR(info.st_mode):
                        raise BundleError(f"cannot unpack {rel}: {where} is not a directory")
                    child = _open_dir(fd, part)
                    os.close(fd)
                    fd = child
            except OSError as exc:
                raise BundleError(f"cannot unpack {rel}: {_why(exc)}") from exc
            finally:
                os.close(fd)

    def install(self, files: Iterable[tuple[str, str, int, str]]) -> Installed:
        """Move staged files into place: ``(rel, slot, size, sha256)`` each. All or nothing (BundleError).

        A file already there with the same size and SHA-256 is left alone (its mtime too); anything else at
        the target (an older file, a symlink) is replaced by a rename, never written through, and kept in the
        staging dir by a second link until :meth:`close`: every name holds a whole file at every moment, also
        after a kill midway. :meth:`undo` and a failure's roll back touch only names still holding the file
        this install placed.
        """
        steps: list[_Step] = []
        made: list[tuple[str, str]] = []
        written: list[str] = []
        unchanged: list[str] = []
        try:
            for rel, slot, size, sha256 in files:
                parent_rel, _, name = rel.rpartition("/")
                parent_fd = self._parent(parent_rel, made)
                try:
                    info = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
                except FileNotFoundError:
                    info = None
                step = _Step(parent_rel, name, None)
                if info is not None:
                    if stat.S_ISDIR(info.st_mode):
                        raise BundleError(f"cannot unpack {rel}: a directory is in the way")
                    if stat.S_ISREG(info.st_mode) and info.st_size == size and _same(parent_fd, name, sha256):
                        unchanged.append(rel)
                        continue
                    step.backup = _keep(parent_fd, name, self.fd, f"old{len(steps):06d}")
                steps.append(step)
                new = os.stat(slot, dir_fd=self.fd, follow_symlinks=False)
                step.placed = (*file_identity(new)[:3], None)  # before: an interrupt after it
                # One rename: the name holds the old file or the new one at every moment, also for a reader
                # and after a kill (a killed install leaves every file whole, each the old or the new one).
                os.replace(slot, name, src_dir_fd=self.fd, dst_dir_fd=parent_fd)
                step.placed = _placed(parent_fd, name, step.placed)
                written.append(rel)
        except BaseException as exc:
            self._roll_back(steps, made)
            if isinstance(exc, OSError):
                raise CacheDirError(f"cannot unpack into {self.cache_dir}: {_why(exc)}") from exc
            raise
        self.installed = True
        self._steps, self._made = steps, made
        return Installed(tuple(written), tuple(unchanged))

    def undo(self) -> None:
        """Take the last :meth:`install` back, best effort: its new files out, the files it replaced back in,
        its new dirs removed. For a bundle whose blobs torch then rejected: its files must not stay without
        them. Only before :meth:`close` (the replaced files wait in the staging dir until then)."""
        if not self.installed or self.fd < 0:
            return
        self._roll_back(self._steps, self._made)
        self._steps, self._made = [], []
        self.installed = False

    def _parent(self, parent_rel: str, made: list[tuple[str, str]], create: bool = True) -> int:
        """Fd of the dir ``parent_rel`` (with ``create``, made as needed and recorded in ``made``); links refused."""
        if not parent_rel:
            return self.root_fd
        parts = parent_rel.split("/")
        fd = self.root_fd
        for end in range(1, len(parts) + 1):
            rel = "/".join(parts[:end])
            if rel in self._dirs:
                fd = self._dirs[rel] = self._dirs.pop(rel)  # now the most recently used
                continue
            grand_rel, name = "/".join(parts[: end - 1]), parts[end - 1]
            try:
                try:
                    child = _open_dir(fd, name)
                except FileNotFoundError:
                    if not create:
                        raise
                    try:
                        os.mkdir(name, 0o755, dir_fd=fd)
                        made.append((grand_rel, name))
                    except FileExistsError:
                        pass  # torch made it meanwhile: fine, it is opened below without following links
                    child = _open_dir(fd, name)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise BundleError(f"refusing to unpack into {rel}: it {_describe(fd, name)}") from None
                raise
            self._dirs[rel] = child
            fd = child
        chain = {"/".join(parts[:end]) for end in range(1, len(parts) + 1)}
        evict = [rel for rel in self._dirs if rel not in chain][: max(0, len(self._dirs) - _OPEN_DIRS)]
        for rel in evict:  # least recently used first; the chain just walked stays open
            os.close(self._dirs.pop(rel))
        return fd

    def _dir_fd(self, rel: str) -> int | None:
        """Fd of the existing dir ``rel`` for a roll back ("" is the root): reopened, without links, when it
        is no longer among the open ones; None when it cannot be."""
        if not rel:
            return self.root_fd
        if rel not in self._dirs:
            with contextlib.suppress(OSError, BundleError):
                self._parent(rel, [], create=False)
        return self._dirs.get(rel)

    def _roll_back(self, steps: list[_Step], made: list[tuple[str, str]]) -> None:
        # Best effort, in reverse: put every replaced file back, take every new file out, remove new dirs.
        # A name is touched only while it still holds the very file this install placed there (or, for a
        # step that placed nothing, is empty): another session's file, written there since, stays.
        for step in reversed(steps):
            parent_fd = self._dir_fd(step.parent)
            if parent_fd is None:
                continue
            try:
                now: os.stat_result | None = os.stat(step.name, dir_fd=parent_fd, follow_symlinks=False)
            except FileNotFoundError:
                now = None
            except OSError:
                continue
            if now is not None and not _is_placed(now, step.placed):
                continue  # not ours (any more): never removed, never replaced
            with contextlib.suppress(OSError):
                if step.backup is not None:  # one rename: the name is never empty on the way back either
                    os.replace(step.backup, step.name, src_dir_fd=self.fd, dst_dir_fd=parent_fd)
                elif now is not None:
                    os.unlink(step.name, dir_fd=parent_fd)
        for parent_rel, name in reversed(made):
            closing = self._dirs.pop("/".join(filter(None, (parent_rel, name))), None)
            if closing is not None:
                os.close(closing)
            parent_fd = self._dir_fd(parent_rel)
            if parent_fd is not None:
                with contextlib.suppress(OSError):
                    os.rmdir(name, dir_fd=parent_fd)

    def close(self) -> None:
        """Remove the staging dir (and a cache dir created for it, when nothing was installed). Idempotent."""
        if self.fd < 0:
            return
        for fd in self._dirs.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._dirs.clear()
        with contextlib.suppress(OSError):
            os.close(self.fd)
        self.fd = -1
        with contextlib.suppress(OSError):
            rmtree_at(self.root_fd, self.name)
        with contextlib.suppress(OSError):
            os.close(self.root_fd)
        if not self.installed:
            _remove_created(self.created)


def _placed(parent_fd: int, name: str, new: tuple[int, int, int, int | None]) -> tuple[int, int, int, int | None]:
    """The identity of the file just renamed to ``name``, its ctime added; one that never matches where another
    file took the name already."""
    try:
        info = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    except OSError:
        return new
    if file_identity(info)[:3] != new[:3]:
        return (-1, -1, -1, -1)
    return file_identity(info)


def _is_placed(info: os.stat_result, placed: tuple[int, int, int, int | None] | None) -> bool:
    """Whether ``info`` is the file an install placed (:func:`_placed`)."""
    if placed is None or file_identity(info)[:3] != placed[:3]:
        return False
    return placed[3] is None or placed[3] == info.st_ctime_ns


def _keep(parent_fd: int, name: str, staging_fd: int, backup: str) -> str:
    """Keep the file at ``name`` (never followed) as ``backup`` in the staging dir for a roll back: a second
    link to it, so that ``name`` is never empty; moved there where the file system refuses the link."""
    try:
        os.link(name, backup, src_dir_fd=parent_fd, dst_dir_fd=staging_fd, follow_symlinks=False)
    except OSError as exc:
        if exc.errno not in _NO_LINKS:
            raise
        os.replace(name, backup, src_dir_fd=parent_fd, dst_dir_fd=staging_fd)
    return backup


def _remove_created(created: list[Path]) -> None:
    for path in reversed(created):
        with contextlib.suppress(OSError):
            os.rmdir(path)  # only if still empty: never removes what someone else put there


def _same(parent_fd: int, name: str, sha256: str) -> bool:
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=parent_fd)
    except OSError:
        return False
    digest = hashlib.sha256()
    with os.fdopen(fd, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest() == sha256


@contextlib.contextmanager
def cache_root(cache_dir: Path) -> Iterator[int]:
    """The cache dir's fd for reading files to pack; BundleError when it cannot be opened."""
    try:
        fd, _ = open_root(Path(cache_dir), create=False)
    except OSError as exc:
        raise BundleError(f"cannot read cache dir {cache_dir}: {_why(exc)}") from exc
    try:
        yield fd
    finally:
        os.close(fd)


def cache_file_size(cache_dir: Path, rel: str) -> int | None:
    """Size of the regular file ``rel`` under the cache dir (reached without links), or None when absent.
    BundleError as :func:`open_cache_file` (a link on the way, not a regular file)."""
    with cache_root(cache_dir) as root_fd:
        fd = open_cache_file(root_fd, rel)
        if fd is None:
            return None
        try:
            return os.fstat(fd).st_size
        finally:
            os.close(fd)


def read_cache_file(cache_dir: Path, rel: str, limit: int) -> bytes | None:
    """At most ``limit`` bytes of the regular file ``rel`` under the cache dir (reached without links), or
    None when absent. BundleError as :func:`open_cache_file`."""
    with cache_root(cache_dir) as root_fd:
        fd = open_cache_file(root_fd, rel)
        if fd is None:
            return None
        with os.fdopen(fd, "rb") as fh:
            return fh.read(limit)


def remove_files_in(
    cache_dir: str, folder: str, matches: Callable[[str], bool], *, older_than: float | None = None
) -> None:
    """Remove the regular files of ``cache_dir/folder`` whose names ``matches`` (and, with ``older_than``,
    whose modification is at least that many seconds old); then ``folder`` when it is empty. Best effort, and
    no link is followed: ``folder`` is opened relative to the cache dir with ``O_NOFOLLOW`` (a link there is
    left alone) and each file is examined and removed relative to that fd."""
    flags = os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC
    try:
        root_fd = os.open(cache_dir, flags)
    except OSError:
        return
    try:
        try:
            dir_fd = os.open(folder, flags | os.O_NOFOLLOW, dir_fd=root_fd)
        except OSError:
            return  # none, or a link: leave it alone
        now = time.time()
        try:
            for name in os.listdir(dir_fd):
                if not matches(name):
                    continue
                with contextlib.suppress(OSError):
                    info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                    if not stat.S_ISREG(info.st_mode):
                        continue
                    if older_than is not None and now - info.st_mtime < older_than:
                        continue
                    os.unlink(name, dir_fd=dir_fd)
        finally:
            os.close(dir_fd)
        with contextlib.suppress(OSError):
            os.rmdir(folder, dir_fd=root_fd)
    finally:
        os.close(root_fd)
