"""Session cache dirs: ``shared`` (persistent), ``isolated`` (fresh, removed at the end), ``disabled``.

The controller decides the dir once and exports it through environment variables before anything
imports torch and before xdist starts workers; workers inherit the environment and follow it (they
find the decision in :data:`SESSION_ENV`, so an ``isolated`` worker never makes a second fresh dir).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from . import ConfigError

SESSION_ENV = "PYTEST_COMPILECACHE_SESSION"
LOCK_NAME = ".compilecache.lock"
_TAG = "Signature: 8a477f597d28d172789f06886806bc55\n# Created by pytest-compilecache.\n"


@dataclass(frozen=True)
class SessionDir:
    """The session's decision. ``path`` is None in ``disabled`` mode and when the plugin is passive."""

    mode: str | None
    path: str | None
    owned: bool = False  # made by this session: removed at the end (isolated, without --compile-cache-keep)

    def to_env(self) -> str:
        """For the workers; the pid lets a worker tell its controller from an outer session's."""
        return json.dumps({"mode": self.mode, "path": self.path, "pid": os.getpid()})

    @staticmethod
    def parent_pid(value: str) -> int | None:
        try:
            return int(json.loads(value).get("pid"))
        except (ValueError, TypeError, AttributeError):
            return None

    @classmethod
    def from_env(cls, value: str) -> SessionDir:
        data = json.loads(value)
        return cls(mode=data["mode"], path=data["path"], owned=False)

    def describe(self) -> str:
        if self.mode is None:
            return "unmanaged:" + os.environ.get("TORCHINDUCTOR_CACHE_DIR", "torch default")
        return f"{self.mode}:{self.path}" if self.path else str(self.mode)


def decide(mode: str | None, configured_dir: str | None, default_shared: Path) -> SessionDir:
    """Create (if needed) and return the session cache dir for ``mode``. Raises ConfigError if unusable."""
    if mode is None or mode == "disabled":
        return SessionDir(mode=mode, path=None)
    if mode == "shared":
        path = Path(configured_dir).expanduser() if configured_dir else default_shared
        return SessionDir(mode=mode, path=str(make_dir(path.absolute())))
    parent = Path(configured_dir).expanduser().absolute() if configured_dir else Path(tempfile.gettempdir())
    try:
        parent.mkdir(parents=True, exist_ok=True)
        fresh = tempfile.mkdtemp(prefix="compilecache-", dir=parent)
    except OSError as exc:
        raise ConfigError(f"--compile-cache-dir: cannot create an isolated dir in {parent}: {exc.strerror}") from None
    _tag(Path(fresh))
    return SessionDir(mode=mode, path=fresh, owned=True)


def make_dir(path: Path) -> Path:
    """Create ``path`` atomically with a CACHEDIR.TAG and a ``*`` .gitignore; verify it is writable.

    Two sessions may race here: the loser's rename fails with the directory already in place, which is
    the outcome it wanted (the same approach as pytest's ``_make_cachedir``).
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
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-test-"):
            pass
    except OSError as exc:
        raise ConfigError(f"--compile-cache-dir: {path} is not a writable directory ({exc.strerror})") from None
    if not path.is_dir():
        raise ConfigError(f"--compile-cache-dir: {path} is not a directory")
    return path


def _tag(path: Path) -> None:
    (path / "CACHEDIR.TAG").write_text(_TAG)
    (path / ".gitignore").write_text("# Created by pytest-compilecache.\n*\n")


def remove(session: SessionDir) -> None:
    if session.owned and session.path:
        shutil.rmtree(session.path, ignore_errors=True)


def lock(path: str, timeout: float = 60.0):  # type: ignore[no-untyped-def]
    """An inter-process lock for the plugin's own writes into a shared dir (unpack, eviction)."""
    from filelock import FileLock

    return FileLock(os.path.join(path, LOCK_NAME), timeout=timeout)


def touch(path: str, relpaths: list[str]) -> None:
    """Mark files as used now, so that size-capped eviction keeps what the last session needed."""
    now = time.time()
    for rel in relpaths:
        with contextlib.suppress(OSError):
            os.utime(os.path.join(path, rel), (now, os.stat(os.path.join(path, rel)).st_mtime))


def evict(path: str, max_bytes: int) -> tuple[int, int]:
    """Delete least recently used files until ``path`` holds at most ``max_bytes``.

    "Used" is the later of access and modification time. Returns (files removed, bytes freed). Our own
    marker files stay. Runs under :func:`lock` so two sessions do not evict at once.
    """
    entries = []
    keep = {"CACHEDIR.TAG", ".gitignore", LOCK_NAME}
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            with contextlib.suppress(OSError):
                st = os.lstat(full)
                total += st.st_size
                if not (root == path and name in keep):
                    entries.append((max(st.st_atime, st.st_mtime), st.st_size, full))
    removed = freed = 0
    for _used, size, full in sorted(entries):
        if total - freed <= max_bytes:
            break
        with contextlib.suppress(OSError):
            os.unlink(full)
            removed += 1
            freed += size
    _drop_empty_dirs(path)
    return removed, freed


def _drop_empty_dirs(path: str) -> None:
    for root, _dirs, _files in os.walk(path, topdown=False):
        if root != path:
            with contextlib.suppress(OSError):  # fails, as wanted, unless empty
                os.rmdir(root)
