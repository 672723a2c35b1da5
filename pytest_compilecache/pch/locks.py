"""torch's build lock of each header (``locks/<hash>.lock``, a ``filelock`` flock): taken without waiting to
install or remove a header, held ahead of a background install (:class:`Reservation`), and torch's header dir
made as torch would, refusing links and other users' dirs (:func:`ensure_dir`).
Loads lazily (inside the functions that need them, so a session pays only for what it uses): ``threading``.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from pathlib import Path
from typing import Iterable

from .._fs import hold_lock
from .._fs import let_go
from .._fs import try_flock
from ..errors import HeaderError
from ..manifest import Artifact
from .names import CHECK_TIMEOUT
from .names import header_artifact
from .names import header_dir
from .names import is_damaged_copy
from .names import lock_name
from .names import others_may_write


def ensure_dir(directory: Path) -> None:
    """Create torch's header dir (and its parent) like torch would; refuse symlinks, other users' dirs and dirs
    other users may write to (:func:`.names.others_may_write`).

    ``torchinductor_<user>`` sits in a shared TMPDIR: a dir planted there by someone else (or a link to
    elsewhere) must not receive code that gcc will load.
    """
    for path in (directory.parent, directory):
        try:
            os.mkdir(path, 0o755)  # never writable by others, whatever the umask (torch's own makedirs uses it)
        except FileExistsError:
            pass
        except OSError as exc:
            raise HeaderError(f"cannot create {path}: {exc.strerror or exc}") from None
        info = os.lstat(path)
        if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
            raise HeaderError(f"{path} is not a plain directory; not installing precompiled headers there")
        if hasattr(os, "getuid") and info.st_uid != os.getuid():
            raise HeaderError(f"{path} belongs to another user; not installing precompiled headers there")
        if others_may_write(info):
            raise HeaderError(f"{path} can be written by other users; not installing precompiled headers there")


@contextlib.contextmanager
def build_lock(directory: Path, name: str):  # type: ignore[no-untyped-def]
    """torch's own lock for this header (``locks/<hash>.lock``, a ``filelock`` flock), taken without waiting.

    Yields False when torch holds it: torch is building this very header and will publish it itself.
    """
    fd = take_build_lock(directory, name)
    if fd is None:
        yield False
        return
    try:
        yield True
    finally:
        let_go(fd)  # drops the flock: no other fd of ours refers to this open file


def take_build_lock(directory: Path, name: str) -> int | None:
    """The fd of torch's build lock for ``name``, flocked without waiting; None when another holds it."""
    locks = directory / "locks"
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(locks, 0o755)  # never writable by others, whatever the umask, as ensure_dir's dirs
        info = os.lstat(locks)  # torch's dir of locks, never a link to elsewhere: no file is made through one
        if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
            raise HeaderError(f"cannot lock {name}: {locks} is not a plain directory")
        # Another user who may create, hold or remove these locks could keep torch waiting or break the
        # exclusion between torch's build and our install: such a dir gets no header from us.
        if hasattr(os, "getuid") and info.st_uid != os.getuid():
            raise HeaderError(f"cannot lock {name}: {locks} belongs to another user")
        if others_may_write(info):
            raise HeaderError(f"cannot lock {name}: {locks} can be written by other users")
        fd = os.open(locks / lock_name(name), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
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
    return hold_lock(fd)


def being_built(directory: Path, name: str) -> bool:
    """True when torch's build lock for this header exists and another process holds it (never creates it)."""
    try:
        fd = os.open(directory / "locks" / lock_name(name), os.O_RDONLY | os.O_NOFOLLOW)
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
    while being_built(path.parent, path.name) and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


class Reservation:
    """torch's build locks of the headers a restore is about to install, held until each is in place.

    Taken before the install starts (:func:`reserve_headers`), so that the restore can go on in the
    background: any process, this one included, whose compile looks such a header up meanwhile
    waits in torch's own lock (``_worker_compile_cpp``), then finds the installed file and builds nothing.
    The locks are ``flock``s: a process that forks meanwhile would hold them on in its child, so a child
    closes its copies at once (:func:`~.._fs.hold_lock`), and a process that dies lets go of them.
    """

    def __init__(self, directory: Path) -> None:
        import threading

        self.directory = directory
        self.held: dict[str, int] = {}  # header name -> fd of its build lock, held
        # Held while a header is installed under its reserved lock, and to let go of locks from another thread
        # (giving up on a slow download): a lock is never let go in the middle of an install.
        self.guard = threading.RLock()

    def release(self, name: str | None = None) -> None:
        """Let go of ``name``'s lock (every lock when None); idempotent."""
        with self.guard:
            for key in [name] if name is not None else list(self.held):
                fd = self.held.pop(key, None) if key is not None else None
                if fd is not None:
                    let_go(fd)  # the flock goes with the last fd of the open file


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
    for entry in entries:
        try:
            artifact = header_artifact(entry)
            ensure_dir(target)
            dest = target / artifact.name
            if os.path.lexists(dest) and not is_damaged_copy(dest) or artifact.name in reservation.held:
                continue
            fd = take_build_lock(target, artifact.name)
        except HeaderError:
            continue  # restore_headers says what is wrong with it
        if fd is not None:
            reservation.held[artifact.name] = fd
    return reservation
