"""Trimming a shared dir to its size cap (least recently used cache files first) and sweeping what killed
writers left; both remove only files in torch's layout, in a dir that is ours or torch's.
Loads lazily (inside the functions that need them, so a session pays only for what it uses): ``.._fs``,
``..report``.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import stat
import time
from pathlib import Path
from typing import NamedTuple

from . import registry
from .dirs import lock
from .layout import CLOEXEC
from .layout import DIR_NOFOLLOW
from .layout import KERNEL_DIR
from .layout import OUR_NAMES
from .layout import PENDING_DIR
from .layout import SESSIONS_DIR
from .layout import TORCH_DIRS
from .layout import TORCH_FILES
from .layout import TORCH_TOP_FILE
from .layout import is_temp_name
from .layout import kernel_build
from .layout import kernel_entry
from .layout import kernel_key
from .layout import parent_fd
from .layout import shape_profile
from .layout import torch_file
from .layout import triton_device_dir
from .layout import triton_kernel_dir
from .owner import Kind
from .owner import ownership
from .owner import torch_top_entry
from .registry import Registration


class Trim(NamedTuple):
    """What :func:`trim` did. ``deferred`` counts other live sessions when it did nothing because of
    them; ``stopped`` is True when a session registered meanwhile and trimming stopped early."""

    kind: Kind
    removed: int = 0
    freed: int = 0
    remaining: int = 0  # bytes of cache files left
    deferred: int = 0
    stopped: bool = False
    recent: int = 0  # files kept although the dir is over its cap: used within MIN_AGE (or being built)
    # Files the calling session used: removed (used since its registration began, a session longer than
    # MIN_AGE: its next run compiles them again), and kept although the dir stays over its cap (``used``).
    session_files: int = 0
    session_kept: int = 0

    def too_small(self, option: str, cap: int) -> str | None:
        """The warning when the cap (``option`` as the user gave it, ``cap`` bytes) is smaller than what this
        session used: the trim removed files it used, or they keep the dir over the cap; None otherwise."""
        from ..report import human_size

        def plural(count: int) -> str:
            return f"{count} file{'s' if count != 1 else ''}"

        if self.session_files:
            return (
                f"{option} ({human_size(cap)}) is smaller than what this session used: the trim removed "
                f"{plural(self.session_files)} it used, which the next run compiles again; raise the cap"
            )
        if self.session_kept and self.remaining > cap:
            return (
                f"{option} ({human_size(cap)}) is smaller than what this session used: {plural(self.session_kept)} "
                f"it used keep the dir at {human_size(self.remaining)} (no trim removes files in use); raise the cap"
            )
        return None

    def describe(self) -> str | None:
        """One line for the session report, or None when there is nothing to say."""
        from ..report import human_size

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
        if self.recent:
            return (
                f"the cache dir is over its cap ({from_size}) but trimmed nothing: its {self.recent} remaining files "
                f"were used within the last {MIN_AGE / 3600:g} hour(s), and torch may still be using them"
            )
        return None


def trim(
    path: str,
    max_bytes: int,
    *,
    now: float | None = None,
    lock_timeout: float = 60.0,
    registration: Registration | None = None,
    min_age: float | None = None,
    used: frozenset[str] = frozenset(),
    compiled: bool = False,
) -> Trim:
    """Remove least recently used cache files until ``path`` holds at most ``max_bytes`` of them.

    Takes :func:`lock` itself. Removes only files torch writes, by their names in their places
    (:mod:`.layout`), in a dir :func:`ownership` calls ours or torch's, and:

    * nothing while another registered session is live (:attr:`Trim.deferred`; the caller's own
      ``registration`` is the only one that does not count, so a session run in-process inside another,
      ``pytest.main``, never trims under its host);
    * for processes that do not register (torch alone compiling into ``/tmp/torchinductor_$USER``): nothing
      used or written in the last ``min_age`` seconds (default :data:`MIN_AGE`; "used" is the later of access
      and modification), nothing in a kernel dir while a build or a write is in flight there (torch's
      ``<key>_CxxBuild/`` dir, a temp file), and the files of one kernel key together, sources first;
    * a triton kernel dir (``triton/<device>/<key>/``) whole or not at all: it is renamed away in one step,
      then removed, so triton never finds half of it;
    * nothing changed at or after ``now`` (default: when it starts). Each file is removed through dir fds
      opened without following links, and only if it is still the file scanned (same inode, modification
      and change time): a file rewritten, replaced or touched meanwhile is in use and stays.

    Empty dirs go as :func:`_drop_empty_dirs` says. ``used``: the cache files (relative paths) the calling
    session used, for :attr:`Trim.session_kept` (the files in use that keep the dir over its cap); ``compiled``:
    it compiled, so the files used since its ``registration`` began count as its own too (torch's FX and
    AOTAutograd entries are not in ``used``); a session that compiled nothing claims no other's files.
    """
    with lock(path, timeout=lock_timeout):
        return _trim(path, max_bytes, now=now, registration=registration, min_age=min_age, used=used, compiled=compiled)


def evict(path: str, max_bytes: int, *, registration: Registration | None = None) -> tuple[int, int]:
    """:func:`trim` for a caller that already holds :func:`lock`: returns (files removed, bytes freed)."""
    result = _trim(path, max_bytes, now=None, registration=registration, min_age=None)
    return result.removed, result.freed


def _trim(
    path: str,
    max_bytes: int,
    *,
    now: float | None,
    registration: Registration | None,
    min_age: float | None,
    used: frozenset[str] = frozenset(),
    compiled: bool = False,
) -> Trim:
    began = time.time() if now is None else now
    settled = began - (MIN_AGE if min_age is None else min_age)  # what changed after this may be in use
    kind = ownership(path).kind
    own = registration.marker if registration is not None else None
    # The cap is on everything in the dir (markers and registrations too); only cache files go.
    total = _dir_bytes(path)
    scan = _Scan(path)
    if kind in ("ours", "torch"):
        scan.run()
    others = len(registry.live_sessions(path, excluding=own))
    if kind not in ("ours", "torch") or others:
        return Trim(kind=kind, remaining=total, deferred=others)
    removed = freed = recent = session_files = session_kept = 0
    # A second of slack: file times come from the kernel's coarse clock, which lags time.time().
    since = registration.start - 1.0 if registration is not None else math.inf
    stopped = False
    emptied: set[str] = set()
    try:
        root_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | CLOEXEC)  # the dir itself may be a link's target
    except OSError:
        return Trim(kind=kind, remaining=total)
    try:
        for unit in sorted(scan.units, key=lambda u: (u.used, u.files[0][0] if u.files else "")):
            if total - freed <= max_bytes:
                break
            if unit.used > settled or unit.changed >= began:
                recent += len(unit.files)
                ours = (compiled and unit.used >= since) or any(rel in used for rel, _ in unit.files)
                session_kept += len(unit.files) if ours else 0
                continue  # used, written or renamed in recently: someone may be using it
            if registry.live_sessions(path, excluding=own):
                stopped = True
                break
            count, size = _remove_unit(root_fd, unit)
            removed += count
            freed += size
            session_files += count if unit.used >= since else 0
            if count:
                emptied.add(os.path.dirname(unit.folder or unit.files[0][0]))
        if not stopped:
            _drop_empty_dirs(path, root_fd, settled, emptied, own)
    finally:
        os.close(root_fd)
    remaining = total - freed
    mine = {"session_files": session_files, "session_kept": session_kept}
    return Trim(kind, removed, freed, remaining, stopped=stopped, recent=recent, **mine)


# Nothing used or written more recently than this is trimmed: a process that does not register (torch alone)
# may be about to load it or to build from it. An hour covers the longest C++ or triton build, autotuning
# included; a dir over its cap sheds the newer files at a later trim.
MIN_AGE = 3600.0


class _Unit(NamedTuple):
    """What goes together: one file, the files of one kernel key (sources first) or a triton kernel dir."""

    used: float  # the latest access or modification of any of its files
    changed: float  # the latest modification or change of any of them (and of a triton kernel dir itself)
    size: int
    files: tuple[tuple[str, os.stat_result], ...]  # relative to the cache dir, in removal order
    folder: str | None = None  # a triton kernel dir: renamed away whole, then removed


def _unit(
    files: list[tuple[str, os.stat_result]], folder: str | None = None, extra: os.stat_result | None = None
) -> _Unit:
    stats = [st for _, st in files]
    changed = [*stats, extra] if extra is not None else stats
    return _Unit(
        used=max(max(st.st_atime, st.st_mtime) for st in stats),
        changed=max(max(st.st_mtime, st.st_ctime) for st in changed),
        size=sum(st.st_size for st in stats),
        files=tuple(files),
        folder=folder,
    )


# Removed first within a kernel key: a source torch finds gone it writes again; an output gone while its source
# is there would make torch build from a source this trim is about to remove.
_SOURCES = (".cpp", ".h", ".py")


class _Scan:
    """The units a trim may remove, found without following links."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.units: list[_Unit] = []

    def run(self) -> None:
        try:
            top = list(os.scandir(self.root))
        except OSError:
            return
        for entry in top:
            name = entry.name
            if name in OUR_NAMES or name == "locks" or name.endswith(".lock") or is_temp_name(name):
                continue
            if entry.is_symlink():
                continue
            if entry.is_dir(follow_symlinks=False):
                if name in (SESSIONS_DIR, PENDING_DIR):
                    continue
                if re.fullmatch(KERNEL_DIR, name):
                    self._kernel_dir(name)
                elif name == "triton":
                    self._triton(name)
                elif name in TORCH_DIRS:
                    self._files(name)
                continue
            if name in TORCH_FILES or re.fullmatch(TORCH_TOP_FILE, name):
                with contextlib.suppress(OSError):
                    self.units.append(_unit([(name, entry.stat(follow_symlinks=False))]))

    def _lstat(self, rel: str) -> os.stat_result | None:
        try:
            return os.lstat(os.path.join(self.root, rel))
        except OSError:
            return None

    def _kernel_dir(self, folder: str) -> None:
        """The files of each kernel key, together; nothing while a build or a write is in flight here."""
        groups: dict[str, list[tuple[str, os.stat_result]]] = {}
        try:
            entries = list(os.scandir(os.path.join(self.root, folder)))
        except OSError:
            return
        for entry in entries:
            if is_temp_name(entry.name) or kernel_build(folder, entry.name):
                return  # torch is writing or building here: its sibling files are in use
            key = kernel_key(folder, entry.name)
            if key is None or not entry.is_file(follow_symlinks=False):
                continue
            with contextlib.suppress(OSError):
                groups.setdefault(key, []).append((f"{folder}/{entry.name}", entry.stat(follow_symlinks=False)))
        for files in groups.values():
            files.sort(key=lambda item: (not item[0].endswith(_SOURCES), item[0]))
            self.units.append(_unit(files))

    def _triton(self, top: str) -> None:
        """Each triton kernel dir, whole: ``triton/<key>/`` where the plugin pointed triton at ``triton/``, and
        ``triton/<device>/<key>/``, torch's own layout. One with a write in flight (triton's ``tmp.pid_*`` dir,
        anything that is not a regular file) is left alone."""
        for name in _names(os.path.join(self.root, top)):
            if triton_kernel_dir(None, name):
                self._triton_kernel(f"{top}/{name}")
            elif triton_device_dir(name):
                for key in _names(os.path.join(self.root, top, name)):
                    if triton_kernel_dir(name, key):
                        self._triton_kernel(f"{top}/{name}/{key}")

    def _triton_kernel(self, rel: str) -> None:
        dir_st = self._lstat(rel)
        if dir_st is None or not stat.S_ISDIR(dir_st.st_mode):
            return
        files: list[tuple[str, os.stat_result]] = []
        try:
            for entry in list(os.scandir(os.path.join(self.root, rel))):
                st = entry.stat(follow_symlinks=False)
                if not stat.S_ISREG(st.st_mode) or is_temp_name(entry.name):
                    return
                files.append((f"{rel}/{entry.name}", st))
        except OSError:
            return
        if files:
            self.units.append(_unit(files, folder=rel, extra=dir_st))

    def _files(self, top: str) -> None:
        """Each file torch writes below ``top`` (:func:`.layout.torch_file`), one by one."""
        for dirpath, dirnames, filenames in os.walk(os.path.join(self.root, top)):
            rel_dir = os.path.relpath(dirpath, self.root)
            dirnames[:] = [n for n in dirnames if not is_temp_name(n)]  # os.walk lists links to dirs, never enters
            parts = rel_dir.split(os.sep)[1:]
            for filename in filenames:
                if not torch_file(top, [*parts, filename]):
                    continue
                rel = os.path.join(rel_dir, filename)
                with contextlib.suppress(OSError):
                    st = os.lstat(os.path.join(self.root, rel))
                    if stat.S_ISREG(st.st_mode):
                        self.units.append(_unit([(rel, st)]))


def _names(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _remove_unit(root_fd: int, unit: _Unit) -> tuple[int, int]:
    """Remove ``unit``; return (files removed, bytes freed). A triton dir is renamed to a temp name of ours in
    one step (triton then finds it absent, never half there), then removed; files one by one, stopping at the
    first one changed since the scan (it is in use: the rest of its key stays with it)."""
    if unit.folder is None:
        removed = freed = 0
        for rel, st in unit.files:
            if not _unlink_unchanged(root_fd, rel, st):
                break
            removed += 1
            freed += st.st_size
        return removed, freed
    opened = parent_fd(root_fd, unit.folder)
    if opened is None:
        return 0, 0
    parent, name = opened
    try:
        from .._fs import rmtree_at
        from .._fs import temp_name

        inside = os.open(name, DIR_NOFOLLOW, dir_fd=parent)
        try:
            for rel, st in unit.files:
                if not _same(os.stat(os.path.basename(rel), dir_fd=inside, follow_symlinks=False), st):
                    return 0, 0
            if len(os.listdir(inside)) != len(unit.files):
                return 0, 0  # a file arrived since the scan: triton is writing here
        finally:
            os.close(inside)
        away = temp_name("tmp", lead=".")
        os.rename(name, away, src_dir_fd=parent, dst_dir_fd=parent)
        rmtree_at(parent, away)
        return len(unit.files), unit.size
    except OSError:
        return 0, 0
    finally:
        os.close(parent)


def _same(found: os.stat_result, scanned: os.stat_result) -> bool:
    from .._fs import file_identity

    return file_identity(found) == file_identity(scanned)


def _unlink_unchanged(root_fd: int, rel: str, scanned: os.stat_result) -> bool:
    """Unlink ``rel`` if it is still exactly what was scanned (same inode, mtime and ctime); True if removed."""
    opened = parent_fd(root_fd, rel)
    if opened is None:
        return False
    parent, name = opened
    try:
        found = os.stat(name, dir_fd=parent, follow_symlinks=False)
        if not _same(found, scanned) or stat.S_ISDIR(found.st_mode):
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


# Below these, torch names every dir itself: an empty one nobody changed for MIN_AGE is torch's leftover.
_TIDIED = ("fxgraph", "aotautograd", "triton")


def _drop_empty_dirs(path: str, root_fd: int, settled: float, emptied: set[str], own: str | None) -> None:
    """rmdir empty dirs of torch's layout: ones this trim emptied, and (below fxgraph/, aotautograd/, triton/
    and in kernel dirs) ones nobody changed since ``settled``; a young one is kept, since torch, registered
    or not, ``mkdir(exist_ok=True)``s a dir and then writes into it. A kernel dir goes only when this trim
    emptied it (an empty ``zz/`` may be anyone's), a build dir never (torch removes it; the compiler may be
    running in it). Never with a live session registered. Through dir fds opened without following links,
    as :func:`_unlink_unchanged`."""
    for root, _dirs, _files in os.walk(path, topdown=False):
        rel = os.path.relpath(root, path)
        parts = rel.split(os.sep)
        top = parts[0]
        if root == path or top in OUR_NAMES or top == "locks" or any(map(is_temp_name, parts)):
            continue
        if top not in TORCH_DIRS:
            if not re.fullmatch(KERNEL_DIR, top) or not torch_top_entry(Path(path), top):
                continue  # a two-character dir holding anything but torch's entries is not torch's
            if rel == top and rel not in emptied:
                continue  # the kernel dir itself goes only when this trim emptied it
            if rel != top and (not kernel_entry(top, parts[1]) or kernel_build(top, parts[1])):
                continue  # below a kernel dir torch makes only key-named dirs (and build dirs, its own to remove)
        elif top not in _TIDIED and rel not in emptied:
            continue  # cache/, dynamo/, ...: a dir there is gone only when this trim emptied it
        opened = parent_fd(root_fd, rel)
        if opened is None:
            continue
        parent, name = opened
        try:
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode) or (rel not in emptied and st.st_mtime > settled):
                continue
            if registry.live_sessions(path, excluding=own):
                return
            os.rmdir(name, dir_fd=parent)  # fails, as wanted, unless empty
            emptied.add(os.path.dirname(rel) or ".")
        except OSError:
            pass
        finally:
            os.close(parent)


def touch(path: str, relpaths: list[str]) -> None:
    """Mark files as used now, so that size-capped eviction keeps what the last session needed."""
    now = time.time_ns()
    for rel in relpaths:
        with contextlib.suppress(OSError, NotImplementedError):
            full = os.path.join(path, rel)  # a link is marked itself, never what it points at
            mtime = os.stat(full, follow_symlinks=False).st_mtime_ns  # to the nanosecond: its content's age is kept
            os.utime(full, ns=(now, mtime), follow_symlinks=False)


def shape_profiles(path: str, job_id: str) -> list[str]:
    """The automatic-dynamic profiles torch keeps for ``job_id`` in the cache dir ``path`` (relative paths).

    A session that compiled with a job id read its profile in every process, but torch rewrites it only when
    it changes, and a read may leave no access time (``relatime``, ``noatime``): the session marks it used
    itself (:func:`touch`), or a size cap would take it for the least recently used file."""
    try:
        names = os.listdir(os.path.join(path, "dynamo"))
    except OSError:
        return []
    return [f"dynamo/{name}" for name in sorted(names) if shape_profile(name, job_id)]
