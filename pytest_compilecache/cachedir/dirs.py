"""The session's dir for each mode (``shared``, ``isolated``, ``disabled``), made atomically and tagged, in a
path torch can build in; the lock for the plugin's own writes into it.
Loads lazily (inside the functions that need them, so a session pays only for what it uses): ``.._fs``,
``filelock``.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Callable
from typing import NamedTuple

from .._env import CACHE_ENV
from ..errors import ConfigError
from ..options import SESSION_ENV
from .layout import DIR_NOFOLLOW
from .layout import LOCK_NAME
from .owner import ownership
from .owner import refuse_foreign
from .owner import tag
from .registry import live_sessions


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
            return "unmanaged:" + os.environ.get(CACHE_ENV, "torch default")
        return f"{self.mode}:{self.path}" if self.path else str(self.mode)


def default_shared_dir(pytest_cache_dir: Path) -> Path:
    """The default shared dir inside pytest's cache dir (``d/compilecache``), where ``--cache-clear`` and pytest's
    ``.gitignore`` apply to it."""
    return pytest_cache_dir / "d" / "compilecache"


def default_shared_for(pytest_cache_dir: str, rootpath: Path) -> Path:
    """:func:`default_shared_dir` in pytest's cache dir as its ini value ``cache_dir`` names it (``~`` and
    variables expanded, relative to the rootdir: as pytest's own ``resolve_from_str``)."""
    base = Path(os.path.expandvars(os.path.expanduser(pytest_cache_dir)))
    return default_shared_dir(base if base.is_absolute() else rootpath / base)


def planned_dir(mode: str | None, configured_dir: str | None, default_shared: Path) -> Path | None:
    """The dir :func:`decide` will use, made of nothing: for a check that must refuse before any dir is made.
    Isolated: ``<a fresh dir>`` in the configured parent. None where the place is not known before (a default
    isolated parent, a default shared dir torch cannot build in, no dir)."""
    if mode == "shared":
        path = Path(configured_dir).expanduser().absolute() if configured_dir else default_shared.absolute()
        return None if not configured_dir and unsafe_dir_reason(str(path)) else path
    if mode == "isolated" and configured_dir:
        return Path(configured_dir).expanduser().absolute() / "<a fresh dir>"
    return None


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
            if unsafe_dir_reason(str(path)):
                fallback = fallback_dir(path)
                note = f"the default dir {path} {unsafe_dir_reason(str(path))}; using {fallback} instead"
                path = fallback
        if configured_dir:
            refuse_foreign(path)
            return SessionDir(mode=mode, path=str(make_dir(path)), note=note)
        try:
            if note is None and path == default_shared_dir(path.parent.parent):  # in pytest's cache dir
                with contextlib.suppress(OSError):  # make_dir says what is wrong with the place
                    _make_pytest_cache_dir(path.parent.parent)
            refuse_foreign(path)
            return SessionDir(mode=mode, path=str(make_dir(path)), note=note)
        except ConfigError as exc:  # the user gave no dir: name the default, and the option that picks another
            flag = "--compile-cache-dir: "
            why = str(exc)[len(flag) :] if str(exc).startswith(flag) else str(exc)
            why = why[len(str(path)) :].lstrip() if why.startswith(str(path)) else why
            raise ConfigError(
                f"the default compile cache dir {path} {why}; choose another with --compile-cache-dir"
            ) from None
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
    reason = unsafe_dir_reason(str(parent))
    if not reason:
        return parent, None
    safe = _private_temp_root()
    return safe, f"the temp dir {parent} {reason}; using {safe} instead"


def mark_isolated(path: str, *, kept: bool) -> None:
    """Say in isolated session dir ``path`` what becomes of it once its session is gone (:data:`.layout.KEPT` or
    :data:`.layout.REMOVED`: a later isolated session removes it, :func:`.sweep.sweep_abandoned_isolated`)."""
    from .layout import ISOLATED_MARK
    from .layout import isolated_mark

    fd = os.open(os.path.join(path, ISOLATED_MARK), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as fh:
        fh.write(isolated_mark(os.path.basename(os.path.normpath(path)), not kept))


def unmark_isolated(path: str) -> None:
    """Take :func:`mark_isolated`'s mark out of ``path``, a dir a shared session now uses (a kept or leftover
    isolated dir the user pointed ``--compile-cache-dir`` at): no isolated session sweeps it then."""
    from .layout import ISOLATED_MARK

    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(path, ISOLATED_MARK))


def fresh_dir(parent: Path | None = None, prefix: str = "compilecache-") -> Path:
    """A new, empty, tagged cache dir in ``parent`` (default: :func:`safe_temp_dir`); remove it with
    :func:`remove_dir`. For a per-test cold compile as much as for an isolated session. Raises OSError."""
    where = safe_temp_dir()[0] if parent is None else parent
    fresh = Path(tempfile.mkdtemp(prefix=prefix, dir=where))
    tag(fresh)
    return fresh


# What pytest puts in its cache dir when it makes it (pytest writes them only then), in our words.
_PYTEST_CACHE_FILES = {
    ".gitignore": "# Created by pytest-compilecache, for pytest's cache dir.\n*\n",
    "CACHEDIR.TAG": "Signature: 8a477f597d28d172789f06886806bc55\n# pytest's cache dir, made by pytest-compilecache.\n",
    "README.md": "# pytest cache directory #\n\nMade by pytest-compilecache before pytest: **do not** commit it.\n",
}


def _make_pytest_cache_dir(base: Path) -> None:
    """Make pytest's cache dir ``base`` (``.pytest_cache``) as pytest would, when the default shared dir is
    about to be made in it first: pytest writes its ``.gitignore`` only when it makes the dir itself, so what
    it writes later there (``v/cache/lastfailed``) would otherwise show in ``git status``. Atomic, as
    :func:`make_dir`; a dir already there (pytest's, or another session's) is left as it is."""
    if os.path.lexists(base):
        return

    def fill(tmp: Path) -> None:
        umask = os.umask(0o022)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)  # not mkdtemp's 0o700: the permissions pytest's own dir would have
        for name, text in _PYTEST_CACHE_FILES.items():
            (tmp / name).write_text(text, encoding="utf-8")

    _make_atomically(base, ".pytest-cache-new-", fill)


def _make_atomically(path: Path, prefix: str, fill: Callable[[Path], None]) -> None:
    """Make dir ``path`` whole or not at all: ``fill`` a temp dir beside it, then rename it into place. Two
    sessions may race here: the loser's rename fails with the directory already in place, which is the
    outcome it wanted (the same approach as pytest's ``_make_cachedir``). Raises OSError."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=path.parent))
    try:
        fill(tmp)
        with contextlib.suppress(OSError):  # lost a race: the dir is there
            os.rename(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def make_dir(path: Path) -> Path:
    """Create ``path`` atomically with a CACHEDIR.TAG and a ``*`` .gitignore; verify it is writable.

    An existing empty dir is tagged (the user handed it to us and nothing in it is anyone's); an existing
    non-empty dir is used as it is (:func:`decide` refuses a foreign one first). Two sessions may race
    here (:func:`_make_atomically`).
    """
    try:
        if not path.is_dir():
            _make_atomically(path, ".compilecache-new-", tag)
        elif not any(path.iterdir()):
            tag(path)
        from .._fs import temp_name

        probe = path / temp_name("tmp", lead=".")
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
        os.unlink(probe)
    except OSError as exc:
        raise ConfigError(f"--compile-cache-dir: {path} is not a writable directory ({exc.strerror})") from None
    if not path.is_dir():
        raise ConfigError(f"--compile-cache-dir: {path} is not a directory")
    return path


def remove(session: SessionDir) -> None:
    """Remove an isolated dir this session made, at the end; only when it still carries our tag."""
    if session.owned and session.path:
        remove_dir(session.path)


def remove_dir(path: str | os.PathLike[str]) -> bool:
    """Remove a dir made by :func:`fresh_dir` (or :func:`decide`): only while it carries our tag, and
    without following links in it. Returns whether it was removed."""
    if ownership(path).kind != "ours":
        return False
    from .layout import ISOLATED_MARK
    from .layout import SESSIONS_DIR

    # Torch's files first, our markers last: a removal killed midway leaves a dir still proved ours.
    last = ("CACHEDIR.TAG", ISOLATED_MARK, SESSIONS_DIR)
    with contextlib.suppress(OSError):
        for name in sorted(os.listdir(path), key=lambda name: name in last):
            entry = os.path.join(path, name)
            if os.path.isdir(entry) and not os.path.islink(entry):
                shutil.rmtree(entry, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(entry)
    shutil.rmtree(path, ignore_errors=True)
    return not os.path.lexists(path)


def lock(path: str, timeout: float = 60.0):  # type: ignore[no-untyped-def]
    """An inter-process lock for the plugin's own writes into a shared dir (unpack, eviction).

    Not reentrant: a second ``lock(path)`` in the same thread waits for the first (do not call
    :func:`trim` while holding it; :func:`evict` is the variant for callers that hold it).
    """
    from filelock import FileLock

    return FileLock(os.path.join(path, LOCK_NAME), timeout=timeout)


# ------------------------------------------------------------------------------- paths torch can use

# torch joins paths into its C++ compiler's command line unquoted and splits it with shlex.split
# (torch/_inductor/cpp_builder.py, _run_compile_cmd), so whitespace, quotes and backslashes in the cache
# dir break the build ("g++: fatal error: input file '/tmp/x' is the same as output file").
_UNSAFE = {" ": "a space", "\t": "a tab", "\n": "a newline", "'": "a quote", '"': "a quote", "\\": "a backslash"}


def unsafe_dir_reason(path: str) -> str | None:
    """Why torch's C++ build cannot work in ``path`` ("contains a space"), or None when it can."""
    for char, what in _UNSAFE.items():
        if char in path:
            return f"contains {what}, which torch's C++ compiler command line cannot take (torch does not quote it)"
    if any(ord(c) < 32 or ord(c) == 127 for c in path):
        return "contains a control character, which torch's C++ compiler command line cannot take"
    return None


def _require_safe(path: Path) -> None:
    reason = unsafe_dir_reason(str(path))
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
        if unsafe_dir_reason(base) or not os.path.isdir(base):
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


def clear_pytest_cache_keeping(path: str, *, excluding: str | None) -> str | None:
    """``--cache-clear`` while other sessions use the default shared dir ``path``
    (``<pytest's cache>/d/compilecache``): clear the rest of pytest's cache here (its ``v/`` and ``d/``
    entries, what ``Cache.clear_cache`` removes) and keep ``path``. Returns the warning that says so, or None
    when no other live session uses it (``excluding`` the caller's own registration): then nothing is
    removed and pytest may clear all. A link among those entries is removed itself, never followed (as
    pytest's own clearing)."""
    others = len(live_sessions(path, excluding=excluding)) if os.path.isdir(path) else 0
    if not others:
        return None
    from .._fs import rmtree_at

    base = Path(path).parent.parent  # <cache_dir>/d/compilecache
    for prefix in ("v", "d"):  # what pytest's Cache.clear_cache removes; a link is left alone, as pytest does
        try:
            fd = os.open(base / prefix, DIR_NOFOLLOW)
        except OSError:
            continue
        try:
            for name in os.listdir(fd):
                if prefix == "d" and name == Path(path).name:
                    continue
                try:  # best effort, as pytest's own clearing: another process may be clearing too
                    if stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                        rmtree_at(fd, name)
                    else:
                        os.unlink(name, dir_fd=fd)
                except OSError:
                    pass
        finally:
            os.close(fd)
    who = "session is" if others == 1 else "sessions are"
    return (
        f"--cache-clear kept the compile cache {path}: {others} other pytest {who} using it "
        "(the rest of pytest's cache was cleared)"
    )
