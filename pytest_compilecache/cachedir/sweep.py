"""Sweeping what killed writers left in a cache dir: temp files and dirs of dead owners (ours and torch's) and
dead registrations, only in our or torch's dir and only by their known names.
Loads lazily (inside the functions that need them, so a session pays only for what it uses): ``.._fs``.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import os
import re
import stat
import time
from pathlib import Path

from . import registry
from .layout import CLOEXEC
from .layout import ISOLATED_MARK
from .layout import TORCH_TEMP
from .layout import is_legacy_staging_dir
from .layout import is_legacy_temp_name
from .layout import is_temp_name
from .layout import isolated_mark
from .layout import parent_fd
from .owner import foreign_entries
from .owner import ownership
from .owner import torch_top_entry

# A temp file whose owner cannot be named (an ``atomic_file`` temp of an older version) is stale after
# this long: nobody writes one file for an hour, and its mtime moves while it is written.
STALE_AFTER = 3600.0
# torch's own ``.<pid>.<thread>.tmp`` names carry a pid but no host; on a dir shared over the network
# that pid may live elsewhere, so a dead-looking owner must also have stopped writing for this long.
TORCH_TEMP_GRACE = 60.0


def sweep_dead_writers(path: str, *, now: float | None = None) -> int:
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
    from .._fs import rmtree_at

    live = registry.live_owners(path)  # removes dead registrations on the way
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
                opened = parent_fd(root_fd, os.path.normpath(os.path.join(rel, name)))
                if opened is None:
                    continue
                parent, leaf = opened
                try:
                    st = os.stat(leaf, dir_fd=parent, follow_symlinks=False)
                    if not _stale(leaf, st, clock, live):
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


def _stale(name: str, st: os.stat_result, clock: float, live: frozenset[tuple[int, str]] = frozenset()) -> bool:
    from .._fs import is_stale
    from .._fs import parse_temp_name
    from .._fs import pid_alive

    owner = parse_temp_name(name)  # ours: install's staging dirs, atomic_file's temp files, registrations
    if owner is not None:  # a registered live owner's entry is in use, however old (a session of hours)
        return (owner.pid, owner.host) not in live and is_stale(owner, now=clock, max_age=STALE_AFTER)
    age = clock - max(st.st_mtime, st.st_ctime)
    # torch's write_atomic and older versions of the plugin wrote files under these names (one kind of old
    # staging dir aside): a dir of such a name is someone else's.
    if stat.S_ISDIR(st.st_mode) and not is_legacy_staging_dir(name):
        return False
    match = re.fullmatch(TORCH_TEMP, name)
    if match:
        return (age > TORCH_TEMP_GRACE and not pid_alive(int(match[1]))) or age > STALE_AFTER
    # What older versions named (their owners' host ids are not ours to compare): by age alone.
    return bool(age > STALE_AFTER and is_legacy_temp_name(name))


def sweep_abandoned_isolated(own: str) -> int:
    """Remove the isolated dirs beside ``own`` (an isolated session's dir) that killed sessions left; return how
    many went. A session removes its isolated dir at its end, unless it was killed (SIGKILL, SIGTERM: no exit
    handler runs): such dirs piled up in the temp dir. Only a sibling that proves all of it: named as
    :func:`.dirs.fresh_dir` names them, a dir and not a link, tagged ours, marked by its session to be removed
    (:data:`ISOLATED_MARK`, not ``--compile-cache-keep``), and holding registrations that are all provably dead
    (:func:`.registry.abandoned`: through the inode each locked; this host's, or on a local disk this kernel's
    or an earlier boot's). A dir being
    made has no registration yet: never taken."""
    from .dirs import remove_dir

    parent, removed = os.path.dirname(own), 0
    try:
        names = os.listdir(parent)
    except OSError:
        return 0
    for name in names:
        path = os.path.join(parent, name)
        if path == own or not name.startswith("compilecache-") or not _this_users(path):
            continue
        if (
            _marked_removed(path, name)
            and ownership(path).kind == "ours"
            and _only_torch_and_ours(path)
            and registry.abandoned(path)
            and _untouched_for(path, ISOLATED_GRACE_SECONDS)
            and remove_dir(path)
        ):
            removed += 1
    return removed


# A killed session's dir is swept only once nothing in it changed for this long: a process it started (an xdist
# worker execnet shuts down seconds later, a test's subprocess) may still write there. Modification times only.
ISOLATED_GRACE_SECONDS = 3600


def _marked_removed(path: str, name: str) -> bool:
    """``path`` is a dir (not a link) whose :data:`ISOLATED_MARK`, a regular file, says :data:`REMOVED` for a dir
    of this ``name``: a copy or a renamed dir is not the one its session marked."""
    try:  # never blocks on a FIFO planted under the mark's name (the temp dir is everyone's)
        fd = os.open(os.path.join(path, ISOLATED_MARK), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | CLOEXEC)
    except OSError:  # none, a link, or ``path`` itself a link to a dir (O_NOFOLLOW checks the last name only)
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode) or os.path.islink(path):
            return False
        return os.read(fd, 512) == isolated_mark(name, True)
    except OSError:
        return False
    finally:
        os.close(fd)


def _this_users(path: str) -> bool:
    """Made by this user (root sweeps no other user's dirs)."""
    try:
        return os.lstat(path).st_uid == os.geteuid()
    except (OSError, AttributeError):  # gone; no uids (Windows)
        return False


def _only_torch_and_ours(path: str) -> bool:
    """A file a user put into the dir keeps it (and the file)."""
    try:
        return not foreign_entries(path)
    except OSError:
        return False


def _untouched_for(path: str, seconds: float, limit: int = 200_000) -> bool:
    """Nothing in ``path`` (links not followed) was modified in the last ``seconds``; False past ``limit`` entries."""
    since, seen = time.time() - seconds, 0
    for folder, dirs, files in os.walk(path, followlinks=False):
        for name in [*dirs, *files, ""]:
            seen += 1
            try:
                if seen > limit or os.lstat(os.path.join(folder, name)).st_mtime > since:
                    return False
            except FileNotFoundError:
                continue
            except OSError:
                return False
    return True
