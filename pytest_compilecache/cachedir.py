"""Session cache dirs: ``shared`` (persistent), ``isolated`` (fresh, removed at the end), ``disabled``.

The controller decides the dir once and exports it through environment variables before anything
imports torch and before xdist starts workers; workers inherit the environment and follow it (they
find the decision in :data:`SESSION_ENV`, so an ``isolated`` worker never makes a second fresh dir).

What this module may delete, and when (the contract every caller relies on):

* **Ownership.** A dir is *ours* when its ``CACHEDIR.TAG`` carries our signature (we created it with
  :func:`make_dir` or :func:`decide`); it is *torch's* when it is untagged but every top-level entry is
  part of torch's cache layout (``fxgraph/``, ``aotautograd/``, the two-character kernel dirs holding
  torch's hash-named files, ``triton/``, ...: see :func:`ownership`) or one of our own markers. Anything
  else that is not empty is *foreign*. Nothing here ever deletes a file in a foreign dir, nor a file
  outside torch's layout in torch's dir; an isolated dir is removed at the end only when it is ours.
* **A foreign ``--compile-cache-dir`` is refused at start-up** (:class:`ConfigError` naming the option),
  in ``shared`` mode: a project root, ``$HOME``, ``/tmp`` or a workspace would otherwise get torch's
  kernel dirs sprayed among the user's files and could never be trimmed. ``isolated`` mode only creates
  a fresh tagged dir inside the given parent, so any writable parent is fine there.
* **Live sessions.** Each session that uses a shared dir registers in it (:func:`register_session`: a
  file in ``.compilecache-sessions/`` holding an ``flock`` for the session's life, so a killed session's
  registration is visibly dead). :func:`trim` never runs while another registered session is live
  (torch may be about to load any file, or have checked that a ``.cpp`` exists just before compiling
  it); it reports itself deferred instead. While it runs it re-reads the registrations before every
  removal and stops when a session appears, and it never removes a file changed since it began (nor a
  dir, unless this trim emptied it).
  Processes that do not register (torch run without the plugin) are protected only by that last rule.
* **Stale leftovers.** :func:`sweep_stale` removes temp files of dead owners (ours and torch's) and dead
  registrations, only in our or torch's dir and only by their known names.
* **Paths torch can build in.** torch runs its C++ compiler on a command line it splits with
  :func:`shlex.split` without quoting paths, so a cache dir containing whitespace, quotes or a backslash
  breaks every compile. :func:`unsafe_reason` names such a path; an explicit ``--compile-cache-dir`` with
  one is a :class:`ConfigError`, a default location with one falls back to a safe dir under the system
  temp dir, and :attr:`SessionDir.note` says where and why.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import math
import os
import re
import shutil
import socket
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator
from typing import Literal
from typing import NamedTuple

from .errors import ConfigError
from .settings import SESSION_ENV

LOCK_NAME = ".compilecache.lock"
SESSIONS_DIR = ".compilecache-sessions"
TEMP_PREFIX = ".compilecache-tmp-"  # what older versions' temp names start with (see _OUR_TEMP)
_TAG = "Signature: 8a477f597d28d172789f06886806bc55\n# Created by pytest-compilecache.\n"
_GITIGNORE = "# Created by pytest-compilecache.\n*\n"

# A temp file whose owner cannot be named (an ``atomic_file`` temp of an older version) is stale after
# this long: nobody writes one file for an hour, and its mtime moves while it is written.
STALE_AFTER = 3600.0
# torch's own ``.<pid>.<thread>.tmp`` names carry a pid but no host; on a dir shared over the network
# that pid may live elsewhere, so a dead-looking owner must also have stopped writing for this long.
TORCH_TEMP_GRACE = 60.0


# ---------------------------------------------------------------------------------------- the decision


class SessionDir(NamedTuple):
    """The session's decision. ``path`` is None in ``disabled`` mode and when the plugin is passive.

    ``note`` is set when the dir is not where the user would look for it (a default location torch
    cannot build in was replaced): one sentence for the session header.
    """

    mode: str | None
    path: str | None
    owned: bool = False  # made by this session: removed at the end (isolated, without --compile-cache-keep)
    note: str | None = None

    def to_env(self) -> str:
        """For the workers; the pid lets a worker tell its controller from an outer session's."""
        return json.dumps({"mode": self.mode, "path": self.path, "pid": os.getpid()})

    @staticmethod
    def parent_pid(value: str) -> int | None:
        try:
            return int(json.loads(value).get("pid"))
        except (ValueError, TypeError, AttributeError, RecursionError):
            return None

    @classmethod
    def from_env(cls, value: str) -> SessionDir:
        try:
            data = json.loads(value)
            mode, path = data["mode"], data["path"]
        except (ValueError, KeyError, TypeError, RecursionError):
            raise ConfigError(f"{SESSION_ENV}: not the controller's decision: {value[:200]!r}") from None
        if mode not in (None, "shared", "isolated", "disabled") or not isinstance(path, (str, type(None))):
            raise ConfigError(f"{SESSION_ENV}: not the controller's decision: {value[:200]!r}")
        return cls(mode=mode, path=path, owned=False)

    def describe(self) -> str:
        if self.mode is None:
            return "unmanaged:" + os.environ.get("TORCHINDUCTOR_CACHE_DIR", "torch default")
        return f"{self.mode}:{self.path}" if self.path else str(self.mode)


def decide(mode: str | None, configured_dir: str | None, default_shared: Path) -> SessionDir:
    """Create (if needed) and return the session cache dir for ``mode``. Raises ConfigError if unusable.

    ``configured_dir`` is ``--compile-cache-dir`` (the dir itself when shared, the parent of a fresh dir
    when isolated). It must be a path torch can build in and, when shared, a new, empty, ours or torch's
    dir. A default location torch cannot build in is replaced by :func:`fallback_dir` (shared) or a safe
    temp dir (isolated), with the reason in :attr:`SessionDir.note`.
    """
    if mode is None or mode == "disabled":
        return SessionDir(mode=mode, path=None)
    note = None
    if mode == "shared":
        if configured_dir:
            path = Path(configured_dir).expanduser().absolute()
            _require_safe(path)
        else:
            path = default_shared.absolute()
            if unsafe_reason(str(path)):
                fallback = fallback_dir(path)
                note = f"the default dir {path} {unsafe_reason(str(path))}; using {fallback} instead"
                path = fallback
        _refuse_foreign(path)
        return SessionDir(mode=mode, path=str(make_dir(path)), note=note)
    if configured_dir:
        parent = Path(configured_dir).expanduser().absolute()
        _require_safe(parent)
    else:
        parent, note = safe_temp_dir()
    try:
        parent.mkdir(parents=True, exist_ok=True)
        fresh = fresh_dir(parent)
    except OSError as exc:
        raise ConfigError(f"--compile-cache-dir: cannot create an isolated dir in {parent}: {exc.strerror}") from None
    return SessionDir(mode=mode, path=str(fresh), owned=True, note=note)


def safe_temp_dir() -> tuple[Path, str | None]:
    """The system temp dir, or (when torch cannot build in it) a private one elsewhere and why."""
    parent = Path(tempfile.gettempdir()).absolute()
    reason = unsafe_reason(str(parent))
    if not reason:
        return parent, None
    safe = _private_temp_root()
    return safe, f"the temp dir {parent} {reason}; using {safe} instead"


def fresh_dir(parent: Path | None = None, prefix: str = "compilecache-") -> Path:
    """A new, empty, tagged cache dir in ``parent`` (default: :func:`safe_temp_dir`); remove it with
    :func:`remove_dir`. For a per-test cold compile as much as for an isolated session. Raises OSError."""
    where = safe_temp_dir()[0] if parent is None else parent
    fresh = Path(tempfile.mkdtemp(prefix=prefix, dir=where))
    _tag(fresh)
    return fresh


def make_dir(path: Path) -> Path:
    """Create ``path`` atomically with a CACHEDIR.TAG and a ``*`` .gitignore; verify it is writable.

    An existing empty dir is tagged (the user handed it to us and nothing in it is anyone's); an existing
    non-empty dir is used as it is (:func:`decide` refuses a foreign one first). Two sessions may race
    here: the loser's rename fails with the directory already in place, which is the outcome it wanted
    (the same approach as pytest's ``_make_cachedir``).
    """
    try:
        if not path.is_dir():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=".compilecache-new-", dir=path.parent))
            try:
                _tag(tmp)
                with contextlib.suppress(FileExistsError, OSError):
                    os.rename(tmp, path)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        elif not any(path.iterdir()):
            _tag(path)
        from ._fs import temp_name  # cost: loaded by every session with a dir anyway (its sweep)

        probe = path / temp_name("tmp", lead=".")
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
        os.unlink(probe)
    except OSError as exc:
        raise ConfigError(f"--compile-cache-dir: {path} is not a writable directory ({exc.strerror})") from None
    if not path.is_dir():
        raise ConfigError(f"--compile-cache-dir: {path} is not a directory")
    return path


def _tag(path: Path) -> None:
    """Write our markers as new files, never through an existing name (a link planted since the dir was found
    empty); a regular file already there (a session racing us to tag the same empty dir) is left as it is."""
    for name, text in (("CACHEDIR.TAG", _TAG), (".gitignore", _GITIGNORE)):
        try:
            fd = os.open(path / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC, 0o644)
        except FileExistsError:
            if stat.S_ISREG(os.lstat(path / name).st_mode):
                continue
            raise
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)


def remove(session: SessionDir) -> None:
    """Remove an isolated dir this session made, at the end; only when it still carries our tag."""
    if session.owned and session.path:
        remove_dir(session.path)


def remove_dir(path: str | os.PathLike[str]) -> bool:
    """Remove a dir made by :func:`fresh_dir` (or :func:`decide`): only while it carries our tag, and
    without following links in it. Returns whether it was removed."""
    if ownership(path).kind != "ours":
        return False
    shutil.rmtree(path, ignore_errors=True)
    return not os.path.lexists(path)


def lock(path: str, timeout: float = 60.0):  # type: ignore[no-untyped-def]
    """An inter-process lock for the plugin's own writes into a shared dir (unpack, eviction).

    Not reentrant: a second ``lock(path)`` in the same thread waits for the first (do not call
    :func:`trim` while holding it; :func:`evict` is the variant for callers that hold it).
    """
    from filelock import FileLock

    return FileLock(os.path.join(path, LOCK_NAME), timeout=timeout)


# ------------------------------------------------------------------------------------------- ownership

Kind = Literal["ours", "torch", "empty", "missing", "foreign"]

# torch 2.6-2.15: every name ``torch/_inductor`` (codecache, cpp_builder, runtime/*, autoheuristic,
# compiler_bisector, aoti_eager, codegen/cutlass), ``_functorch/_aot_autograd/autograd_cache`` and
# ``_dynamo`` (package, pgo) join onto ``cache_dir()``, plus Triton's dir and the precompiled headers
# (which torch keeps under its default dir, the one a user may point us at).
TORCH_DIRS = frozenset(
    {
        "fxgraph", "aotautograd", "dynamo", "triton", "locks", "cache", "gcc", "unhashed_kernel_inputs",
        "torch_cutlass", "aoti_eager", "autoheuristic", "bisect", "precompiled_headers",
        "cutedsl_compile_cache",
    }
)  # fmt: skip
TORCH_FILES = frozenset({"memoizer_cache.json", "memoizer_cache.lock"})
# GRAPHS_RECORD: explain.RECORD_NAME, the graphs the next session explains its misses against (issue 12);
# ours in any dir (so an untagged torch dir that holds it is not "foreign" next time), never trimmed.
GRAPHS_RECORD = ".compilecache-graphs.json"
# PENDING_DIR: a restored bundle's mega-cache blobs, installed there by a restore in another process (the
# Action's restore step) for the next pytest session to load into torch and remove (sync.load_staged).
PENDING_DIR = ".compilecache-pending"
OUR_NAMES = frozenset({"CACHEDIR.TAG", ".gitignore", LOCK_NAME, SESSIONS_DIR, GRAPHS_RECORD, PENDING_DIR})
# codecache.get_path: ``<key[1:3]>/<key>.<ext>``; keys are lowercase base32 (or hex) hashes.
# Patterns are kept as strings: ``re`` compiles each on first use and caches it. Compiled at import they
# would cost every session, and most never look at them (bench/overhead.py --instructions).
_KERNEL_DIR = r"[a-z0-9]{2}"
_KERNEL_NAME = r"[a-z0-9_]{20,}(\.[A-Za-z0-9_]+)*"
_TORCH_TEMP = r"\.(\d+)\.\d+\.tmp"  # codecache.write_atomic
_TORCH_TOP_FILE = r"tmp[a-z0-9_]{8}\.py|configs_[A-Za-z0-9_]+\.json"  # wrapper.py, cutlass
# Our temp names are _fs.temp_name's. Older versions of the plugin named them TEMP_PREFIX + <pid>-<host> +
# anything, ``.<name>.<pid>-<host>.<random>.tmp`` (atomic_file) or ``.<name>.<random>.tmp``: still ours,
# swept by age alone.
_OUR_TEMP = re.escape(TEMP_PREFIX) + r"(\d+)-([0-9a-f]{8})-.*"
_ATOMIC_TEMP = r"\..+\.(\d+)-([0-9a-f]{8})\.[a-z0-9_]{8}\.tmp"
_ATOMIC_TEMP_OLD = r"\..+\.[a-z0-9_]{8}\.tmp"


class Ownership(NamedTuple):
    """Whose dir this is. ``foreign`` lists (up to three of) the entries that are nobody's cache."""

    kind: Kind
    foreign: tuple[str, ...] = ()


def ownership(path: str | os.PathLike[str]) -> Ownership:
    """Classify ``path``: ``ours`` (our CACHEDIR.TAG), ``torch`` (only torch's layout and our markers),
    ``empty``, ``missing`` or ``foreign``. Reads names only; follows no link but ``path`` itself."""
    root = Path(path)
    try:
        names = sorted(os.listdir(root))
    except FileNotFoundError:
        return Ownership("missing")
    except NotADirectoryError:
        return Ownership("foreign", (root.name,))
    if _tagged(root):
        return Ownership("ours")
    if not names:
        return Ownership("empty")
    foreign = [name for name in names if not _torch_top_entry(root, name)]
    if foreign:
        return Ownership("foreign", tuple(foreign[:3]))
    return Ownership("torch")


def _tagged(root: Path) -> bool:
    tag = root / "CACHEDIR.TAG"
    try:
        if not stat.S_ISREG(os.lstat(tag).st_mode):
            return False
        with open(tag, encoding="utf-8", errors="replace") as fh:
            return fh.read(len(_TAG) + 1) == _TAG
    except OSError:
        return False


def _torch_top_entry(root: Path, name: str) -> bool:
    """Is ``root/name`` part of torch's cache layout or one of our own markers? (no link counts)."""
    try:
        st = os.lstat(root / name)
    except OSError:
        return True  # vanished meanwhile: it was a temp file
    if stat.S_ISLNK(st.st_mode):
        return False
    if stat.S_ISDIR(st.st_mode):
        if name in TORCH_DIRS or name in (SESSIONS_DIR, PENDING_DIR):
            return True
        return bool(re.fullmatch(_KERNEL_DIR, name)) and _kernel_dir_contents_ok(root / name)
    return name in OUR_NAMES or name in TORCH_FILES or bool(re.fullmatch(_TORCH_TOP_FILE, name)) or _is_temp_name(name)


def _kernel_dir_contents_ok(folder: Path) -> bool:
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return False
    return all(re.fullmatch(_KERNEL_NAME, e.name) or _is_temp_name(e.name) for e in entries if not e.is_symlink())


def _is_temp_name(name: str) -> bool:
    # cost: _fs loads only when a cache dir of ours is inspected. Bundle staging dirs and save/restore temps
    # (swept by _fs.sweep_stale) are ours too.
    from ._fs import parse_temp_name

    return bool(parse_temp_name(name) is not None or re.fullmatch(_TORCH_TEMP, name) or _is_legacy_temp_name(name))


def _is_legacy_temp_name(name: str) -> bool:
    return bool(
        re.fullmatch(_OUR_TEMP, name)
        or re.fullmatch(_ATOMIC_TEMP, name)
        or re.fullmatch(_ATOMIC_TEMP_OLD, name)
        or name.startswith(".write-test-")  # make_dir's probe before 0.2
    )


def _refuse_foreign(path: Path) -> None:
    found = ownership(path)
    if found.kind != "foreign" or not path.is_dir():  # not a dir at all: make_dir says so
        return
    shown = ", ".join(found.foreign)
    raise ConfigError(
        f"--compile-cache-dir: {path} is not a compile cache: it already holds files that are neither "
        f"pytest-compilecache's nor torch's ({shown}). The plugin would write torch's kernel dirs among "
        f"them and could never trim the dir safely; give it a new or empty directory, e.g. "
        f"{path / '.compilecache'}"
    )


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
        if name in OUR_NAMES or name == "locks" or name.endswith(".lock") or _is_temp_name(name):
            continue
        if entry.is_symlink():
            continue
        if entry.is_dir(follow_symlinks=False):
            kernel = bool(re.fullmatch(_KERNEL_DIR, name))
            # A two-character dir is torch's only when it holds nothing but hash-named entries (what
            # ownership() asks of a torch dir, asked here of every dir: ``db/`` with a backup in it is not).
            if name in (SESSIONS_DIR, PENDING_DIR) or not _torch_top_entry(Path(root), name):
                continue
            for dirpath, dirnames, filenames in os.walk(entry.path):
                if kernel and dirpath == entry.path:
                    filenames = [n for n in filenames if re.fullmatch(_KERNEL_NAME, n)]
                    dirnames[:] = [n for n in dirnames if re.fullmatch(_KERNEL_NAME, n)]
                dirnames[:] = [n for n in dirnames if not _is_temp_name(n)]
                for filename in filenames:
                    if filename.endswith(".lock") or _is_temp_name(filename):
                        continue
                    full = os.path.join(dirpath, filename)
                    with contextlib.suppress(OSError):
                        yield full, os.lstat(full)
            continue
        if not _torch_top_entry(Path(root), name):
            continue
        with contextlib.suppress(OSError):
            yield entry.path, entry.stat(follow_symlinks=False)


# ------------------------------------------------------------------------------- paths torch can use

# torch joins paths into its C++ compiler's command line unquoted and splits it with shlex.split
# (torch/_inductor/cpp_builder.py, _run_compile_cmd), so whitespace, quotes and backslashes in the cache
# dir break the build ("g++: fatal error: input file '/tmp/x' is the same as output file").
_UNSAFE = {" ": "a space", "\t": "a tab", "\n": "a newline", "'": "a quote", '"': "a quote", "\\": "a backslash"}


def unsafe_reason(path: str) -> str | None:
    """Why torch's C++ build cannot work in ``path`` ("contains a space"), or None when it can."""
    for char, what in _UNSAFE.items():
        if char in path:
            return f"contains {what}, which torch's C++ compiler command line cannot take (torch does not quote it)"
    if any(ord(c) < 32 or ord(c) == 127 for c in path):
        return "contains a control character, which torch's C++ compiler command line cannot take"
    return None


def _require_safe(path: Path) -> None:
    reason = unsafe_reason(str(path))
    if reason:
        raise ConfigError(f"--compile-cache-dir: {path} {reason}; choose a path without it")


def fallback_dir(original: Path) -> Path:
    """Where a default shared dir that torch cannot build in goes: a per-user dir under the system temp
    dir, one subdir per original path (so two projects never share by accident)."""
    digest = hashlib.sha256(str(original).encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return _private_temp_root() / digest


def _private_temp_root() -> Path:
    """``<temp>/pytest-compilecache-<uid>``, made 0700 and checked to be ours (not a planted link): the
    first of the system temp dir, /tmp, /var/tmp whose path torch can build in."""
    uid = os.getuid() if hasattr(os, "getuid") else 0
    candidates = [tempfile.gettempdir(), "/tmp", "/var/tmp"]
    for base in candidates:
        if unsafe_reason(base) or not os.path.isdir(base):
            continue
        root = Path(base).absolute() / f"pytest-compilecache-{uid}"
        with contextlib.suppress(FileExistsError):
            root.mkdir(mode=0o700)
        st = os.lstat(root)
        if stat.S_ISDIR(st.st_mode) and st.st_uid == uid and not st.st_mode & 0o022:
            return root
    raise ConfigError(
        "--compile-cache-dir: no temp dir torch can build in (TMPDIR has a space or similar, and /tmp and "
        "/var/tmp are unusable); set --compile-cache-dir to a path without spaces or quotes"
    )


# --------------------------------------------------------------------------------------- registration


_MARKER = r"(\d+)-([0-9a-f]{8})-(\d+)-(\d+)"  # <pid>-<host>-<start, ns>-<n>
_SERIAL = itertools.count()
_OWN: dict[str, Registration] = {}  # this process's live registrations, by marker path


@dataclass
class Registration:
    """A live session's mark in a cache dir: a file holding an ``flock`` until :meth:`close` (or death)."""

    path: str
    marker: str
    start: float
    fd: int | None

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
    root = os.open(path, os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC)
    try:
        if create:
            with contextlib.suppress(FileExistsError):
                os.mkdir(SESSIONS_DIR, 0o755, dir_fd=root)
        try:
            folder = os.open(SESSIONS_DIR, _DIR_NOFOLLOW, dir_fd=root)
        except FileNotFoundError:
            folder = None
        try:
            yield folder
        finally:
            if folder is not None:
                os.close(folder)
    finally:
        os.close(root)


def _create_marker(path: str, begun: float) -> tuple[str, int]:
    from ._fs import host_tag
    from ._fs import temp_name

    with _sessions_dir(path, create=True) as folder:
        if folder is None:  # pragma: no cover - just made
            raise FileNotFoundError(os.path.join(path, SESSIONS_DIR))
        tmp = temp_name("tmp", lead=".")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC, 0o644, dir_fd=folder)
        try:
            import fcntl  # POSIX only, like torch's C++ cache; imported here so the module loads anywhere

            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "start": begun}).encode())
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
            from ._fs import host_tag  # cost: only a shared dir with registrations gets here

            live = []
            for name in names:
                match = re.fullmatch(_MARKER, name)
                marker = os.path.join(path, SESSIONS_DIR, name)
                if not match or marker == excluding:
                    continue
                if marker in _OWN or _held(folder, name, remove_if_dead=True):
                    live.append(LiveSession(int(match[1]), int(match[3]) / 1e9, match[2] == host_tag()))
            return live
    except FileNotFoundError:
        return []  # no cache dir (yet)
    except OSError:
        return [UNKNOWN_SESSION]


def _held(folder: int, name: str, *, remove_if_dead: bool) -> bool:
    """Is marker ``name`` locked by a live process? A dead one's is removed (while we hold its lock)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder)
    except OSError:
        return False  # gone: its owner closed it
    try:
        from ._fs import try_flock  # cost: loaded only when a peer's registration is probed

        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False  # not a marker we write: neither a session nor ours to remove
        if not try_flock(fd):
            return True
        if remove_if_dead:
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=folder)
        return False
    finally:
        os.close(fd)


# -------------------------------------------------------------------------------------------- trimming


class Trim(NamedTuple):
    """What :func:`trim` did. ``deferred`` counts other live sessions when it did nothing because of
    them; ``stopped`` is True when a session registered meanwhile and trimming stopped early."""

    kind: Kind
    removed: int = 0
    freed: int = 0
    remaining: int = 0  # bytes of cache files left
    deferred: int = 0
    stopped: bool = False
    # Removed files that the registered session (``trim(registration=...)``) used since it began: a cap too
    # small for one session, whose next run compiles them again.
    session_files: int = 0

    def too_small(self, option: str, cap: int) -> str | None:
        """The warning when the cap (``option`` as the user gave it, ``cap`` bytes) removed files this session
        used, or None."""
        from .report import human_size  # cost: as describe()

        if not self.session_files:
            return None
        files = f"{self.session_files} file{'s' if self.session_files != 1 else ''}"
        return (
            f"{option} ({human_size(cap)}) is smaller than what this session used: the trim removed {files} it used, "
            "which the next run compiles again; raise the cap"
        )

    def describe(self) -> str | None:
        """One line for the session report, or None when there is nothing to say."""
        from .report import human_size  # cost: the renderers load at session end, not with the first hooks

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
    others = len(live_sessions(path, excluding=own))
    if kind not in ("ours", "torch") or others:
        return Trim(kind=kind, remaining=total, deferred=others)
    removed = freed = session_files = 0
    # A second of slack: file times come from the kernel's coarse clock, which lags time.time().
    since = registration.start - 1.0 if registration is not None else math.inf
    stopped = False
    emptied: set[str] = set()
    try:
        root_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC)  # the dir itself may be a link's target
    except OSError:
        return Trim(kind=kind, remaining=total)
    try:
        for used, size, full, st in sorted(entries):
            if total - freed <= max_bytes:
                break
            if max(st.st_mtime, st.st_ctime) >= began:
                continue  # written (or renamed in) since trimming began: someone is using it
            if live_sessions(path, excluding=own):
                stopped = True
                break
            if _unlink_unchanged(root_fd, os.path.relpath(full, path), st):
                removed += 1
                freed += size
                session_files += used >= since
                emptied.add(os.path.dirname(full))
        if not stopped:
            _drop_empty_dirs(path, root_fd, began, emptied, own)
    finally:
        os.close(root_fd)
    return Trim(
        kind=kind, removed=removed, freed=freed, remaining=total - freed, stopped=stopped, session_files=session_files
    )


_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIR_NOFOLLOW = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC


def _parent_fd(root_fd: int, rel: str) -> tuple[int, str] | None:
    """An fd of ``rel``'s parent dir, reached from ``root_fd`` one component at a time without following a
    link, and ``rel``'s last name; None when a component vanished, is a link or is not a dir. Whatever is
    swapped in on the way afterwards, what is removed through that fd is inside the cache dir."""
    parts = rel.split(os.sep)
    fd = os.dup(root_fd)
    for part in parts[:-1]:
        try:
            child = os.open(part, _DIR_NOFOLLOW, dir_fd=fd)
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
        if root == path or top in OUR_NAMES or top == "locks" or any(map(_is_temp_name, rel.split(os.sep))):
            continue
        if top not in TORCH_DIRS:
            if not re.fullmatch(_KERNEL_DIR, top) or not _torch_top_entry(Path(path), top):
                continue  # a two-character dir holding anything but hash-named entries is not torch's
            if rel == top and root not in emptied:
                continue  # the kernel dir itself goes only when this trim emptied it (an empty "zz/" may be anyone's)
            if rel != top and not re.fullmatch(_KERNEL_NAME, os.path.basename(root)):
                continue  # below a kernel dir torch makes only hash-named dirs
        opened = _parent_fd(root_fd, rel)
        if opened is None:
            continue
        parent, name = opened
        try:
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode) or (root not in emptied and max(st.st_mtime, st.st_ctime) >= began):
                continue
            if live_sessions(path, excluding=own):
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
    from ._fs import rmtree_at  # cost: as _stale's

    live_sessions(path)  # removes dead registrations
    count = 0
    try:
        root_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC)
    except OSError:
        return 0
    try:
        for dirpath, dirnames, filenames in os.walk(path):
            rel = os.path.relpath(dirpath, path)
            top = rel.split(os.sep, 1)[0]
            # Below the top, only torch's layout (and our registrations and staged blobs) is ever searched, in
            # our dirs as in torch's: a build tool's ``.x.01234567.tmp`` elsewhere has a temp-like name too.
            if rel != "." and not _torch_top_entry(Path(path), top):
                dirnames[:] = []
                continue
            for name in list(dirnames) + filenames:
                if not _is_temp_name(name):
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
    from ._fs import is_stale
    from ._fs import parse_temp_name
    from ._fs import pid_alive

    owner = parse_temp_name(name)  # ours: install's staging dirs, atomic_file's temp files, registrations
    if owner is not None:
        return is_stale(owner, now=clock, max_age=STALE_AFTER)
    age = clock - max(st.st_mtime, st.st_ctime)
    match = re.fullmatch(_TORCH_TEMP, name)
    if match:
        return (age > TORCH_TEMP_GRACE and not pid_alive(int(match[1]))) or age > STALE_AFTER
    # What older versions named (their owners' host ids are not ours to compare): by age alone.
    return bool(age > STALE_AFTER and _is_legacy_temp_name(name))
