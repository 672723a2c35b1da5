"""Atomic file writes: the one way this package publishes a file (bundles, stored bundles, unpacked
cache entries, reports). Readers see the old file or the whole new one, never a part of it."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import BinaryIO
from typing import Iterator


@contextlib.contextmanager
def atomic_file(dest: Path, *, fsync: bool = True, mode: int = 0o644) -> Iterator[BinaryIO]:
    """Yield a writer on a temp sibling of ``dest``; on success publish it with ``os.replace``.

    The temp file is ``.<name>.<random>.tmp`` in the same directory (so the rename is atomic and other
    readers can skip it by its leading dot). On any exception, including KeyboardInterrupt, the temp file
    is removed and ``dest`` is untouched. ``os.replace`` swaps the directory entry, so an existing symlink
    at ``dest`` is replaced, never written through. ``mode`` replaces mkstemp's 0600: these files are
    caches, not secrets, and may be shared between users of a directory.
    """
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    try:
        with os.fdopen(fd, "wb") as writer:
            yield writer
            writer.flush()
            if fsync:
                os.fsync(writer.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
