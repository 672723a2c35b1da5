"""A store that is a local (or network-mounted) directory of ``<key>.bundle`` files.

PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import builtins
import errno
import os
import shutil
import stat
from pathlib import Path
from typing import Any
from typing import BinaryIO
from typing import Callable

from .._fs import MAX_AGE_ALIVE
from .._fs import atomic_file
from .._fs import sweep_our_temps
from ..errors import StoreError
from .base import BUNDLE_SUFFIX
from .base import ObjectTooLarge
from .base import StoreEntry
from .base import newest_first
from .base import validate_key
from .base import validate_prefix

__all__ = ["LocalStore"]

# Temp files start with "." (never a valid key) and end in ".tmp": list() can never mistake them for keys.
_TEMP_PREFIX = "."


def _copy_stream(src: Any, dst: BinaryIO) -> None:
    shutil.copyfileobj(src, dst, 1024 * 1024)


class _Bounded:
    """A reader that raises :class:`ObjectTooLarge` once more than ``limit`` bytes came through it."""

    def __init__(self, inner: BinaryIO, limit: int, key: str) -> None:
        self.inner, self.left, self.limit, self.key = inner, limit, limit, key

    def read(self, size: int = -1) -> bytes:
        data = self.inner.read(self.left + 1 if size < 0 or size > self.left + 1 else size)
        self.left -= len(data)
        if self.left < 0:
            raise ObjectTooLarge(f"{self.key} grew past {self.limit} bytes while it was read")
        return data


def _why(exc: OSError) -> str:
    return exc.strerror or str(exc)


class LocalStore:
    """``<root>/<key>.bundle`` files. Construction touches nothing; ``root`` is created on the first put.

    Writes go to a temp sibling in ``root`` and are published with ``os.replace``, so concurrent sessions
    saving the same or different keys never expose a partial file (last writer wins for the same key).
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(os.path.abspath(root))
        self.location = self.root.as_uri()
        # Seam for tests (e.g. a writer that fails with ENOSPC); a plain attribute, no mocking needed.
        self._copy: Callable[[Any, BinaryIO], None] = _copy_stream

    def __repr__(self) -> str:
        return f"LocalStore({self.location!r})"

    def _path(self, key: str) -> Path:
        return self.root / f"{validate_key(key)}{BUNDLE_SUFFIX}"

    def get(self, key: str, dest: Path, *, limit: int | None = None) -> bool:
        """Copy ``key`` to ``dest`` through a temp sibling (creating ``dest``'s parent); False on a miss.

        A missing key or a missing root is a miss; any other OSError is a StoreError. With ``limit``, a file
        of more than ``limit`` bytes (at open, or grown while copied) is :class:`ObjectTooLarge`, nothing kept.
        """
        src = self._path(key)
        dest = Path(dest)
        try:
            # Open first: once open, a concurrent put replacing the file does not affect what we read. A link,
            # a FIFO or a device in the store is refused: only regular files are objects (a FIFO would block
            # forever, a link to /dev/zero never end).
            with _open_object(src) as reader:
                size = os.fstat(reader.fileno()).st_size
                if limit is not None and size > limit:
                    raise ObjectTooLarge(f"{key} in {self.location} is {size} bytes, more than {limit}")
                dest.parent.mkdir(parents=True, exist_ok=True)
                with atomic_file(dest) as writer:
                    self._copy(reader if limit is None else _Bounded(reader, limit, key), writer)
        except OSError as exc:
            self._miss_or_raise(key, src, exc)
            return False
        return True

    def get_head(self, key: str, limit: int) -> bytes | None:
        """The first ``limit`` bytes of ``key`` (see :func:`.base.read_head`); None on a miss. Links and
        other non-regular files are refused as by :meth:`get` (StoreError)."""
        src = self._path(key)
        try:
            with _open_object(src) as reader:
                return reader.read(limit)
        except OSError as exc:
            self._miss_or_raise(key, src, exc)
            return None

    def _miss_or_raise(self, key: str, src: Path, exc: OSError) -> None:
        """Return when ``exc`` says the object ``src`` itself does not exist (a miss); raise StoreError for
        anything else (a missing parent of the destination, a link, permissions...)."""
        if isinstance(exc, FileNotFoundError) and exc.filename is not None and Path(exc.filename) == src:
            return
        raise StoreError(f"cannot get {key} from {self.location}: {_why(exc)}") from exc

    def put(self, key: str, src: Path) -> None:
        """Copy ``src`` in as ``key`` (temp sibling in ``root`` + ``os.replace``); StoreError on failure."""
        final = self._path(key)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            with open(src, "rb") as reader, atomic_file(final) as writer:
                self._copy(reader, writer)
        except OSError as exc:
            raise StoreError(f"cannot put {key} to {self.location}: {_why(exc)}") from exc
        self._sweep()

    def _sweep(self) -> None:
        """Remove what killed saves left: our temp files (named by :func:`atomic_file`) whose writer is provably
        gone (dead on this host, or a day old; ``_fs.is_stale``). Nothing else in the dir is touched."""
        sweep_our_temps(self.root, max_age=MAX_AGE_ALIVE)

    def list(self, prefix: str = "") -> builtins.list[StoreEntry]:
        """Entries under ``prefix``, newest first; a missing root is empty; temp and foreign files and links ignored."""
        validate_prefix(prefix)
        entries: builtins.list[StoreEntry] = []
        try:
            with os.scandir(self.root) as scan:
                for item in scan:
                    entry = _entry(item, prefix)
                    if entry is not None:
                        entries.append(entry)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise StoreError(f"cannot list {self.location}: {_why(exc)}") from exc
        return newest_first(entries)

    def delete(self, key: str) -> None:
        """Remove ``key``; a missing key is fine."""
        try:
            self._path(key).unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise StoreError(f"cannot delete {key} from {self.location}: {_why(exc)}") from exc
        self._sweep()  # prune deletes through here


def _entry(item: os.DirEntry[str], prefix: str) -> StoreEntry | None:
    name = item.name
    if not name.endswith(BUNDLE_SUFFIX) or name.startswith(_TEMP_PREFIX):
        return None
    key = name[: -len(BUNDLE_SUFFIX)]
    if not key.startswith(prefix):
        return None
    try:
        validate_key(key)
        if not item.is_file(follow_symlinks=False):  # a link is no stored object: get refuses it too
            return None
        info = item.stat(follow_symlinks=False)
    except FileNotFoundError:
        return None  # deleted (pruned) meanwhile
    except ValueError:
        return None  # not one of ours (ConfigError is a ValueError)
    return StoreEntry(key=key, size=info.st_size, modified=info.st_mtime)


def _open_object(path: Path) -> BinaryIO:
    """Open a stored object for reading: a regular file reached without following a link at its name."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if os.path.islink(path):
            raise OSError(exc.errno, "a symlink, not a stored object") from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
