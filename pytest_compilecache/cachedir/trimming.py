"""Trimming a shared dir to its size cap (least recently used cache files first) and sweeping what killed
writers left; both remove only files in torch's layout, in a dir that is ours or torch's."""

from __future__ import annotations

import contextlib
import os
import re
import stat
import time
from pathlib import Path
from typing import Iterator
from typing import NamedTuple

from . import registry
from .dirs import lock
from .layout import CLOEXEC
from .layout import DIR_NOFOLLOW
from .layout import KERNEL_DIR
from .layout import KERNEL_NAME
from .layout import OUR_NAMES
from .layout import PENDING_DIR
from .layout import SESSIONS_DIR
from .layout import TORCH_DIRS
from .layout import TORCH_TEMP
from .layout import is_legacy_temp_name
from .layout import is_temp_name
from .owner import Kind
from .owner import ownership
from .owner import torch_top_entry
from .registry import Registration

# A temp file whose owner cannot be named (an ``atomic_file`` temp of an older version) is stale after
# this long: nobody writes one file for an hour, and its mtime moves while it is written.
STALE_AFTER = 3600.0
# torch's own ``.<pid>.<thread>.tmp`` names carry a pid but no host; on a dir shared over the network
# that pid may live elsewhere, so a dead-looking owner must also have stopped writing for this long.
TORCH_TEMP_GRACE = 60.0


class Trim(NamedTuple):
    """What :func:`trim` did. ``deferred`` counts other live sessions when it did nothing because of
    them; ``stopped`` is True when a session registered meanwhile and trimming stopped early."""

    kind: Kind
    removed: int = 0
    freed: int = 0
    remaining: int = 0  # bytes of cache files left
    deferred: int = 0
    stopped: bool = False

    def describe(self) -> str | None:
        """One line for the session report, or None when there is nothing to say."""
        from ..report import human_size  # cost: the renderers load at session end, not with the first hooks

        from_size = human_size(self.remaining + self.freed)
        if self.kind in ("empty", "missing"):
            return None
        if self.kind not in ("ours", "torch"):
            return f"did not trim the cache dir: it is not a compile cache this plugin manages ({self.kind})"
        if self.deferred:
            who = "session is" if self.deferred == 1 else "sessions are"
            return f"cache dir trim deferred: {self.deferred} other {who} using it ({from_size})"
        if self.removed:
            line = (
                f"trimmed the cache dir: removed {self.removed} least recently used files, {human_size(self.freed)} "
                f"({from_size} -> {human_size(self.remaining)})"
            )
            return line + (" (stopped early: another session started)" if self.stopped else "")
        return None


def trim(
    path: str,
    max_bytes: int,
    *,
    now: float | None = None,
    lock_timeout: float = 60.0,
    registration: Registration | None = None,
) -> Trim:
    """Remove least recently used cache files until ``path`` holds at most ``max_bytes`` of them.

    Takes :func:`lock` itself. Removes only cache files in torch's layout in a dir :func:`ownership` calls
    ours or torch's, nothing while another registered session is live (:attr:`Trim.deferred`; the
    caller's own ``registration`` is the only one that does not count, so a session run in-process inside
    another, ``pytest.main``, never trims under its host), and nothing changed at or after ``now``
    (default: when it starts). Each file is removed through dir fds opened without following links, and
    only if it is still the file scanned (same inode, modification and change time): a file rewritten,
    replaced or touched meanwhile is in use and stays. "Used" is the later of access and modification time.
    """
    with lock(path, timeout=lock_timeout):
        return _trim(path, max_bytes, now=now, registration=registration)


def evict(path: str, max_bytes: int, *, registration: Registration | None = None) -> tuple[int, int]:
    """:func:`trim` for a caller that already holds :func:`lock`: returns (files removed, bytes freed)."""
    result = _trim(path, max_bytes, now=None, registration=registration)
    return result.removed, result.freed


def _trim(path: str, max_bytes: int, *, now: float | None, registration: Registration | None) -> Trim:
    began = time.time() if now is None else now
    kind = ownership(path).kind
    own = registration.marker if registration is not None else None
    # The cap is on everything in the dir (markers and registrations too); only cache files go.
    total = _dir_bytes(path)
    entries = [(max(st.st_atime, st.st_mtime), st.st_size, full, st) for full, st in _managed_files(path, kind)]
    others = len(registry.live_sessions(path, excluding=own))
    if kind not in ("ours", "torch") or others:
        return Trim(kind=kind, remaining=total, deferred=others)
    removed = freed = 0
    stopped = False
    emptied: set[str] = set()
    try:
        root_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | CLOEXEC)  # the dir itself may be a link's target
    except OSError:
        return Trim(kind=kind, remaining=total)
    try:
        for _used, size, full, st in sorted(entries):
            if total - freed <= max_bytes:
                break
            if max(st.st_mtime, st.st_ctime) >= began:
                continue  # written (or renamed in) since trimming began: someone is using it
            if registry.live_sessions(path, excluding=own):
                stopped = True
                break
            if _unlink_unchanged(root_fd, os.path.relpath(full, path), st):
                removed += 1
                freed += size
                emptied.add(os.path.dirname(full))
        if not stopped:
            _drop_empty_dirs(path, root_fd, began, emptied, own)
    finally:
        os.close(root_fd)
    return Trim(kind=kind, removed=removed, freed=freed, remaining=total - freed, stopped=stopped)


def _parent_fd(root_fd: int, rel: str) -> tuple[int, str] | None:
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


def _unlink_unchanged(root_fd: int, rel: str, scanned: os.stat_result) -> bool:
    """Unlink ``rel`` if it is still exactly what was scanned (same inode, mtime and ctime); True if removed."""
    opened = _parent_fd(root_fd, rel)
    if opened is None:
        return False
    parent, name = opened
    try:
        found = os.stat(name, dir_fd=parent, follow_symlinks=False)
        same = (found.st_dev, found.st_ino, found.st_mtime_ns, found.st_ctime_ns) == (
            scanned.st_dev,
            scanned.st_ino,
            scanned.st_mtime_ns,
            scanned.st_ctime_ns,
        )
        if not same or stat.S_ISDIR(found.st_mode):
            return False  # rewritten, replaced or touched since the scan: in use
        os.unlink(name, dir_fd=parent)
        return True
    except OSError:
        return False
    finally:
        os.close(parent)


def _dir_bytes(path: str) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def _drop_empty_dirs(path: str, root_fd: int, began: float, emptied: set[str], own: str | None) -> None:
    """rmdir empty dirs of torch's layout: ones untouched since ``began`` or emptied by this trim; never with a
    live session registered (torch ``mkdir(exist_ok=True)``s a dir and then writes into it). Through dir
    fds opened without following links, as :func:`_unlink_unchanged`."""
    for root, _dirs, _files in os.walk(path, topdown=False):
        rel = os.path.relpath(root, path)
        top = rel.split(os.sep, 1)[0]
        if root == path or top in OUR_NAMES or top == "locks" or any(map(is_temp_name, rel.split(os.sep))):
            continue
        if top not in TORCH_DIRS:
            if not re.fullmatch(KERNEL_DIR, top) or not torch_top_entry(Path(path), top):
                continue  # a two-character dir holding anything but hash-named entries is not torch's
            if rel == top and root not in emptied:
                continue  # the kernel dir itself goes only when this trim emptied it (an empty "zz/" may be anyone's)
            if rel != top and not re.fullmatch(KERNEL_NAME, os.path.basename(root)):
                continue  # below a kernel dir torch makes only hash-named dirs
        opened = _parent_fd(root_fd, rel)
        if opened is None:
            continue
        parent, name = opened
        try:
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode) or (root not in emptied and max(st.st_mtime, st.st_ctime) >= began):
                continue
            if registry.live_sessions(path, excluding=own):
                return
            os.rmdir(name, dir_fd=parent)  # fails, as wanted, unless empty
            emptied.add(os.path.dirname(root))
        except OSError:
            pass
        finally:
            os.close(parent)


def touch(path: str, relpaths: list[str]) -> None:
    """Mark files as used now, so that size-capped eviction keeps what the last session needed."""
    now = time.time()
    for rel in relpaths:
        with contextlib.suppress(OSError, NotImplementedError):
            full = os.path.join(path, rel)  # a link is marked itself, never what it points at
            os.utime(full, (now, os.stat(full, follow_symlinks=False).st_mtime), follow_symlinks=False)


# ---------------------------------------------------------------------------------------------- sweep


def sweep_stale(path: str, *, now: float | None = None) -> int:
    """Remove what killed sessions left in cache dir ``path``; return how many entries went.

    Only in our or torch's dir (:func:`ownership`), at any depth, only these names: dead registrations;
    temp files and dirs named by :func:`_fs.temp_name` (a bundle's staging dir, an ``atomic_file`` temp in a
    kernel dir, a registration being made) whose owner :func:`_fs.is_stale` finds gone (``max_age``
    :data:`STALE_AFTER`); the temp names of older versions when older than :data:`STALE_AFTER`;
    torch's ``.<pid>.<thread>.tmp`` when that pid is dead and the file untouched for
    :data:`TORCH_TEMP_GRACE`, or older than :data:`STALE_AFTER`.
    """
    clock = time.time() if now is None else now
    kind = ownership(path).kind
    if kind not in ("ours", "torch"):
        return 0
    from .._fs import rmtree_at  # cost: as _stale's

    registry.live_sessions(path)  # removes dead registrations
    count = 0
    try:
        root_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | CLOEXEC)
    except OSError:
        return 0
    try:
        for dirpath, dirnames, filenames in os.walk(path):
            rel = os.path.relpath(dirpath, path)
            top = rel.split(os.sep, 1)[0]
            # Below the top, only torch's layout (and our registrations and staged blobs) is ever searched, in
            # our dirs as in torch's: a build tool's ``.x.01234567.tmp`` elsewhere has a temp-like name too.
            if rel != "." and not torch_top_entry(Path(path), top):
                dirnames[:] = []
                continue
            for name in list(dirnames) + filenames:
                if not is_temp_name(name):
                    continue  # cheap first: only temp names are ever swept
                # Through dir fds opened without following links: a dir swapped for a link meanwhile is skipped.
                opened = _parent_fd(root_fd, os.path.normpath(os.path.join(rel, name)))
                if opened is None:
                    continue
                parent, leaf = opened
                try:
                    st = os.stat(leaf, dir_fd=parent, follow_symlinks=False)
                    if not _stale(leaf, st, clock):
                        continue
                    if stat.S_ISDIR(st.st_mode):
                        if name in dirnames:
                            dirnames.remove(name)
                        rmtree_at(parent, leaf)
                    else:
                        os.unlink(leaf, dir_fd=parent)
                    count += 1
                except OSError:
                    pass
                finally:
                    os.close(parent)
    finally:
        os.close(root_fd)
    return count


def _stale(name: str, st: os.stat_result, clock: float) -> bool:
    # cost: _fs is loaded by every session with a dir of ours anyway (Controller._sweep)
    from .._fs import is_stale
    from .._fs import parse_temp_name
    from .._fs import pid_alive

    owner = parse_temp_name(name)  # ours: install's staging dirs, atomic_file's temp files, registrations
    if owner is not None:
        return is_stale(owner, now=clock, max_age=STALE_AFTER)
    age = clock - max(st.st_mtime, st.st_ctime)
    match = re.fullmatch(TORCH_TEMP, name)
    if match:
        return (age > TORCH_TEMP_GRACE and not pid_alive(int(match[1]))) or age > STALE_AFTER
    # What older versions named (their owners' host ids are not ours to compare): by age alone.
    return bool(age > STALE_AFTER and is_legacy_temp_name(name))


def _managed_files(root: str, kind: Kind) -> Iterator[tuple[str, os.stat_result]]:
    """Every file under ``root`` that belongs to the cache: what lies in torch's layout (its top-level dirs,
    the two-character kernel dirs holding hash-named files, its top-level files), in an ``ours`` dir as in a
    ``torch`` one; nothing in any other dir. Our tag proves whose dir it is, not whose each file is: a file
    someone else put in our dir (``--compile-cache-dir=/tmp`` in a fresh container) is never trimmed.

    ``locks/`` and ``*.lock`` are never yielded: removing a lock file another process holds splits the
    lock in two (a second process creates a new file and "holds" it too). Nor are temp files and dirs
    (someone is writing them; :func:`sweep_stale` removes those whose writer died).
    """
    if kind not in ("ours", "torch"):
        return
    try:
        top = list(os.scandir(root))
    except OSError:
        return
    for entry in top:
        name = entry.name
        if name in OUR_NAMES or name == "locks" or name.endswith(".lock") or is_temp_name(name):
            continue
        if entry.is_symlink():
            continue
        if entry.is_dir(follow_symlinks=False):
            kernel = bool(re.fullmatch(KERNEL_DIR, name))
            # A two-character dir is torch's only when it holds nothing but hash-named entries (what
            # ownership() asks of a torch dir, asked here of every dir: ``db/`` with a backup in it is not).
            if name in (SESSIONS_DIR, PENDING_DIR) or not torch_top_entry(Path(root), name):
                continue
            for dirpath, dirnames, filenames in os.walk(entry.path):
                if kernel and dirpath == entry.path:
                    filenames = [n for n in filenames if re.fullmatch(KERNEL_NAME, n)]
                    dirnames[:] = [n for n in dirnames if re.fullmatch(KERNEL_NAME, n)]
                dirnames[:] = [n for n in dirnames if not is_temp_name(n)]
                for filename in filenames:
                    if filename.endswith(".lock") or is_temp_name(filename):
                        continue
                    full = os.path.join(dirpath, filename)
                    with contextlib.suppress(OSError):
                        yield full, os.lstat(full)
            continue
        if not torch_top_entry(Path(root), name):
            continue
        with contextlib.suppress(OSError):
            yield entry.path, entry.stat(follow_symlinks=False)
