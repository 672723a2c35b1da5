"""Every environment variable the package reads or sets, named once, and one way to borrow them.

The names below are the registry: ours (``PYTEST_COMPILECACHE_*``; each option also has one, spelled by
``options.env_name``), torch's and triton's, and the compiler's. A module that needs a name imports it from
here; :data:`TOUCHED` (what a session may set for torch, all put back at its end) is derived from them. A
store backend's own variables (``AZURE_STORAGE_*``, ``STORAGE_EMULATOR_HOST``, boto3's) belong to its row of
``stores.table`` and its module. A leaf: imports nothing of ours.


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

# ---- ours
ENV_PREFIX = "PYTEST_COMPILECACHE_"
# The controller's cache-dir decision, exported for its xdist workers (``cachedir.SessionDir.to_env``).
SESSION_ENV = ENV_PREFIX + "SESSION"
# Where an xdist controller tells its workers which restore ticket to serve (a path in the session dir,
# :class:`.cachedir.ticket.RestoreTicket`).
TICKET_ENV = ENV_PREFIX + "RESTORE_TICKET"
# The Action's restore step tells the pytest session what it restored (``sync.handoff``).
HANDOFF_ENV = ENV_PREFIX + "RESTORED"
# A fingerprint computed once and handed to later processes (``fingerprint.collect``).
FINGERPRINT_ENV = ENV_PREFIX + "FINGERPRINT"
# The bundle signing key (read only by ``settings.read_signing_key``); never logged.
SIGNING_KEY_ENV = ENV_PREFIX + "SIGNING_KEY"
# The Action's post step (which uploads a bundle staged for ``store: github``) runs after a failed job only
# when this is "true" (action.yml's post-if): set by its plan step for input save-on-failure, and by a session
# whose tests passed and that staged a bundle but failed on its own account (``session.Controller``).
POST_STEP_ENV = "COMPILECACHE_SAVE_ON_FAILURE"
# The CLI's defaults for the key's salt and prefix (the plugin reads them as its options' variables).
KEY_SALT_ENV = ENV_PREFIX + "KEY_SALT"
KEY_PREFIX_ENV = ENV_PREFIX + "KEY_PREFIX"

# ---- torch's and triton's
# The variables that point torch's compile caches (and triton's) at a directory.
CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
TRITON_ENV = "TRITON_CACHE_DIR"
# Every cache off; torch 2.8+ also reads the second spelling.
DISABLE_ENV = "TORCHINDUCTOR_FORCE_DISABLE_CACHES"
DISABLE_ENVS = (DISABLE_ENV, "TORCH_COMPILE_FORCE_DISABLE_CACHES")
# The switches of torch's remote caches and where its Redis is (set before torch is imported).
REMOTE_SWITCHES = (
    "TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE",
    "TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE",
    "TORCHINDUCTOR_AUTOTUNE_REMOTE_CACHE",
)
REDIS_ENVS = ("TORCHINDUCTOR_REDIS_URL", "TORCHINDUCTOR_REDIS_HOST", "TORCHINDUCTOR_REDIS_PORT")

# torch keeps its automatic-dynamic shape profile (dynamo/code_state_<key>.pkl in the cache dir, and in the
# mega-cache) only under a job id (pytorch/pytorch#139001), read at import from the first (torch 2.7-2.15) or,
# from 2.8 on, its alias.
# ``--compile-cache-pgo=on`` sets the first to PGO_JOB_ID unless either is set.
PGO_ENVS = ("TORCH_COMPILE_JOB_ID", "TORCH_COMPILE_STICKY_PGO_KEY")
PGO_JOB_ID = "pytest-compilecache"

# How long torch waits for a file lock (its precompiled header's build lock among them) before it fails the
# compile: torch/_inductor/config.py's file_lock_timeout, read from this variable at import (default 600 s).
FILE_LOCK_TIMEOUT_ENV = "TORCHINDUCTOR_FILE_LOCK_TIMEOUT"
TORCH_FILE_LOCK_TIMEOUT = 600.0

# ---- the compiler's: variables gcc (and clang) read that can change what a compile with -include does.
COMPILER_ENVS = ("CPATH", "CPLUS_INCLUDE_PATH", "C_INCLUDE_PATH", "GCC_EXEC_PREFIX", "COMPILER_PATH")

# Every variable a session may set for torch and its workers; the session's lease puts them all back.
TOUCHED = (CACHE_ENV, TRITON_ENV, DISABLE_ENV, SESSION_ENV, *REMOTE_SWITCHES, *REDIS_ENVS, TICKET_ENV)


def torch_lock_timeout(environ: Mapping[str, str] = os.environ) -> float:
    """Seconds torch in a process started with ``environ`` waits for a file lock before it gives up."""
    try:
        value = float(environ.get(FILE_LOCK_TIMEOUT_ENV) or TORCH_FILE_LOCK_TIMEOUT)
    except ValueError:
        return TORCH_FILE_LOCK_TIMEOUT
    return value if 0 < value < float("inf") else TORCH_FILE_LOCK_TIMEOUT


def torch_job_id(environ: Mapping[str, str] = os.environ) -> str | None:
    """The job id torch keeps a shape profile under in a process started with ``environ``, or None."""
    return next((environ[name] for name in PGO_ENVS if environ.get(name)), None)


def put_back(before: dict[str, str | None], environ: MutableMapping[str, str] = os.environ) -> list[str]:
    """Set each variable of ``before`` back to its value there (None: unset); the names of those that had
    changed. The plugin reads its variables before any conftest: one a conftest changes after that would
    otherwise reach the xdist workers, which read them again, and not the session that spawns them."""
    changed = sorted(name for name, value in before.items() if environ.get(name) != value)
    for name in changed:
        value = before[name]
        if value is None:
            environ.pop(name, None)
        else:
            environ[name] = value
    return changed


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
