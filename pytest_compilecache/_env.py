"""One way to borrow environment variables and give them back exactly as they were.

Every place that swaps variables torch reads (the session's cache dir and remote-cache switches, a
test's isolated compile, loading mega-cache blobs into a given dir) leases them here, so that a pytest
run in-process (pytester, IDEs) leaves the environment as it found it.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import os
from typing import Iterable
from typing import Iterator
from typing import Mapping
from typing import MutableMapping

# The variables that point torch's compile caches (and triton's) at a directory.
CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
TRITON_ENV = "TRITON_CACHE_DIR"

# torch keeps its automatic-dynamic shape profile (dynamo/code_state_<key>.pkl in the cache dir, and in the
# mega-cache) only under a job id, read at import from the first (torch 2.7-2.15) or, from 2.8 on, its alias.
# ``--compile-cache-pgo=on`` sets the first to PGO_JOB_ID unless either is set.
PGO_ENVS = ("TORCH_COMPILE_JOB_ID", "TORCH_COMPILE_STICKY_PGO_KEY")
PGO_JOB_ID = "pytest-compilecache"

# How long torch waits for a file lock (its precompiled header's build lock among them) before it fails the
# compile: torch/_inductor/config.py's file_lock_timeout, read from this variable at import (default 600 s).
FILE_LOCK_TIMEOUT_ENV = "TORCHINDUCTOR_FILE_LOCK_TIMEOUT"
TORCH_FILE_LOCK_TIMEOUT = 600.0


def torch_lock_timeout(environ: Mapping[str, str] = os.environ) -> float:
    """Seconds torch in a process started with ``environ`` waits for a file lock before it gives up."""
    try:
        value = float(environ.get(FILE_LOCK_TIMEOUT_ENV) or TORCH_FILE_LOCK_TIMEOUT)
    except ValueError:
        return TORCH_FILE_LOCK_TIMEOUT
    return value if 0 < value < float("inf") else TORCH_FILE_LOCK_TIMEOUT


# Where an xdist controller tells its workers which restore ticket to serve (a path in the session dir,
# :class:`.cachedir.ticket.RestoreTicket`).
TICKET_ENV = "PYTEST_COMPILECACHE_RESTORE_TICKET"


def torch_job_id(environ: Mapping[str, str] = os.environ) -> str | None:
    """The job id torch keeps a shape profile under in a process started with ``environ``, or None."""
    return next((environ[name] for name in PGO_ENVS if environ.get(name)), None)


def cache_dir_env(cache_dir: str) -> dict[str, str]:
    """What makes torch use ``cache_dir``: all it reads before it is imported (after, see
    ``probe.point_cache_dir``)."""
    return {CACHE_ENV: cache_dir, TRITON_ENV: os.path.join(cache_dir, "triton")}


class EnvLease:
    """Remembers the values of ``names`` now; :meth:`restore` puts exactly those values back.

    Usable as a context manager. Setting a variable through :meth:`set` that was not named up front
    adds it to the lease, so nothing set through a lease is ever left behind.
    """

    def __init__(self, names: Iterable[str], environ: MutableMapping[str, str] = os.environ) -> None:
        self._environ = environ
        self._saved: dict[str, str | None] = {}
        for name in names:
            self._remember(name)

    def _remember(self, name: str) -> None:
        if name not in self._saved:
            self._saved[name] = self._environ.get(name)

    def set(self, values: Mapping[str, str | None]) -> None:
        """Set (or, for None, unset) each variable, remembering its old value first."""
        for name, value in values.items():
            self._remember(name)
            if value is None:
                self._environ.pop(name, None)
            else:
                self._environ[name] = value

    def restore(self) -> None:
        """Put every leased variable back as it was when first remembered (idempotent)."""
        for name, value in self._saved.items():
            if value is None:
                self._environ.pop(name, None)
            else:
                self._environ[name] = value

    def __enter__(self) -> EnvLease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()

    def __iter__(self) -> Iterator[str]:
        return iter(self._saved)
