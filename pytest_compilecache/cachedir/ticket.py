"""The xdist restore ticket: one session's restore, handed by its controller to whichever worker takes it first.

``<cache dir>/.compilecache-ticket-<host>-<pid>-<time>-<random>`` (a temp name of the controller's,
:func:`.._fs.temp_name`) holds what the restoring worker reported once it restored (:meth:`RestoreTicket.fulfil`);
its ``.lock`` sibling is held while one does, so the others wait (:meth:`RestoreTicket.take`). A worker that dies
mid-restore releases the lock with its process, and the next worker restores. The controller removes both files
at the end. Their names are our temp names, so the ownership check knows them as ours (a torch dir holding them
is still torch's) and the leftovers of a controller that died are swept like any temp file of a dead owner
(:mod:`.sweep`).

What the file holds is plain JSON the phases write and read (:mod:`.restore_phase` with the result codec of
:mod:`.sync`); nothing here knows its fields.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

from .._env import TICKET_ENV

if TYPE_CHECKING:
    from filelock import BaseFileLock


class RestoreTicket:
    """One session's restore, served by the first worker that takes it; see the module docstring."""

    def __init__(self, path: str) -> None:
        self.path = path

    @classmethod
    def new(cls, cache_dir: str) -> RestoreTicket:
        from .._fs import temp_name  # cost: only an xdist controller with a store

        return cls(os.path.join(cache_dir, temp_name("ticket", lead=".")))

    @classmethod
    def from_env(cls, cache_dir: str | None) -> RestoreTicket | None:
        """The controller's ticket, when it is a ticket's name in this session's dir (nothing else is trusted)."""
        from .._fs import parse_temp_name  # cost: only an xdist worker of a session with a store

        value = os.environ.get(TICKET_ENV, "")
        if not value or not cache_dir or os.path.dirname(value) != cache_dir:
            return None
        name = os.path.basename(value)
        owner = parse_temp_name(name)
        ok = owner is not None and owner.kind == "ticket" and name.startswith(".") and not name.endswith(".lock")
        return cls(value) if ok else None

    def take(self, *, wait: bool) -> BaseFileLock | None:
        """The ticket's lock, held (release it when done); None when another process holds it and ``wait``
        is false. Waiting is bounded by the store's own time limit in the restoring worker. OSError when the
        lock cannot be made (a full disk, a read-only dir)."""
        from filelock import FileLock  # cost: as above
        from filelock import Timeout

        lock = FileLock(self.path + ".lock", timeout=-1 if wait else 0)
        try:
            lock.acquire()
        except Timeout:
            return None
        return lock

    def result(self) -> dict[str, Any] | None:
        """What the restoring worker wrote; None when no worker restored (yet), or the file is not ours."""
        try:
            with open(self.path, "rb") as fh:
                data = json.loads(fh.read(1 << 20))
        except (OSError, ValueError, RecursionError):
            return None
        return data if isinstance(data, dict) else None

    def fulfil(self, data: dict[str, Any]) -> None:
        """Write what the restore did (atomically); OSError when it cannot be written."""
        from .._fs import atomic_file  # cost: as above

        with atomic_file(Path(self.path), fsync=False) as fh:
            fh.write(json.dumps(data).encode())

    def remove(self) -> None:
        for path in (self.path, self.path + ".lock"):
            try:
                os.unlink(path)
            except OSError:
                pass
