"""Session cache dirs: ``shared`` (persistent), ``isolated`` (fresh, removed at the end), ``disabled``.

The controller decides the dir once and exports it through environment variables before anything
imports torch and before xdist starts workers; workers inherit the environment and follow it (they
find the decision in :data:`SESSION_ENV`, so an ``isolated`` worker never makes a second fresh dir).

What this module may delete, and when (the contract every caller relies on):

* **Ownership.** A dir is *ours* when its ``CACHEDIR.TAG`` carries our signature (we created it with
  :func:`make_dir` or :func:`decide`); it is *torch's* when it is untagged but every top-level entry is
  part of torch's cache layout (``fxgraph/``, ``aotautograd/``, the two-character kernel dirs holding
  only what torch writes there, ``triton/``, ...: see :func:`ownership`) or one of our own markers and
  leftovers (a killed restore's staging dir). Anything else that is not empty is *foreign*. Nothing here
  ever deletes a file in a foreign dir, nor, in ours or torch's, a file torch does not write (by its name
  in its place, :mod:`.layout`); an isolated dir is removed at the end only when it is ours.
* **A foreign dir is refused** (:func:`refuse_foreign`, :class:`ConfigError` naming the option) by every
  entry point that writes a cache dir: ``--compile-cache-dir`` in ``shared`` mode, the CLI's ``restore
  --cache-dir``: a project root, ``$HOME``, ``/tmp`` or a workspace would otherwise get torch's kernel dirs
  sprayed among the user's files and could never be trimmed. ``isolated`` mode only creates a fresh
  tagged dir inside the given parent, so any writable parent is fine there.
* **Live sessions.** Each session that uses a shared dir registers in it (:func:`register_session`: a
  file in ``.compilecache-sessions/``, readable by every user of the dir, holding an ``flock`` for the
  session's life, so a killed session's registration is visibly dead; one that cannot be read counts as
  live). :func:`trim` never runs while another registered session is live (torch may be about to load
  any file, or have checked that a ``.cpp`` exists just before compiling it); it reports itself deferred
  instead. While it runs it re-reads the registrations before every removal and stops when a session
  appears, and it never removes a file changed since it began.
* **Processes that do not register** (torch alone compiling into ``/tmp/torchinductor_$USER``): a trim
  never removes a file used or written within :data:`MIN_AGE`, nothing in a kernel dir where a build or
  a write is in flight (torch's ``<key>_CxxBuild/`` dir, a temp file), a kernel's files only together
  (sources first), a triton kernel dir only whole (renamed away in one step), and a young empty dir never.
* **Stale leftovers.** :func:`sweep_dead_writers` removes temp files of dead owners (ours and torch's) and dead
  registrations, only in our or torch's dir and only by their known names.
* **Killed isolated sessions.** An isolated session registers in its dir too (so do its xdist workers), and
  :func:`sweep_abandoned_isolated` removes a sibling dir a killed one left only when all of it is proved: this
  user's, ours, marked by its session to be removed (a regular file naming that very dir), holding only torch's
  and our entries, unchanged for :data:`.sweep.ISOLATED_GRACE_SECONDS`, and every registration dead as
  :func:`.registry.abandoned` proves it (its lock tried through the inode its writer locked; another host tag's
  only where writer and sweep both see a local disk). Anything unreadable keeps the dir.
* **Paths torch can build in.** torch runs its C++ compiler on a command line it splits with
  :func:`shlex.split` without quoting paths, so a cache dir containing whitespace, quotes or a backslash
  breaks every compile. :func:`unsafe_dir_reason` names such a path; an explicit ``--compile-cache-dir`` with
  one is a :class:`ConfigError`, a default location with one falls back to a safe dir under the system
  temp dir, and :attr:`SessionDir.note` says where and why.

The package, one file per concern: :mod:`.layout` (the names: ours, torch's, temp names), :mod:`.owner`
(whose dir, the one refusal rule), :mod:`.dirs` (the dir for each mode, paths torch can build in, the lock),
:mod:`.registry` (live sessions), :mod:`.trimming` (trim, evict, touch, shape_profiles), :mod:`.sweep` (leftovers).
Callers import from here (:mod:`.trimming` loads on first use).
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING
from typing import Any

from ..options import SESSION_ENV
from .dirs import SessionDir
from .dirs import clear_pytest_cache_keeping
from .dirs import decide
from .dirs import default_shared_dir
from .dirs import default_shared_for
from .dirs import fallback_dir
from .dirs import fresh_dir
from .dirs import lock
from .dirs import make_dir
from .dirs import mark_isolated
from .dirs import planned_dir
from .dirs import remove
from .dirs import remove_dir
from .dirs import safe_temp_dir
from .dirs import unmark_isolated
from .dirs import unsafe_dir_reason
from .layout import GRAPHS_RECORD
from .layout import LOCK_NAME
from .layout import OUR_NAMES
from .layout import PENDING_DIR
from .layout import SESSIONS_DIR
from .layout import TEMP_PREFIX
from .layout import TORCH_DIRS
from .layout import TORCH_FILES
from .layout import carried_file
from .owner import Kind
from .owner import Ownership
from .owner import ownership
from .owner import refuse_foreign
from .registry import UNKNOWN_SESSION
from .registry import LiveSession
from .registry import Registration
from .registry import live_owners
from .registry import live_sessions
from .registry import register_session
from .sweep import STALE_AFTER
from .sweep import TORCH_TEMP_GRACE
from .sweep import sweep_abandoned_isolated
from .sweep import sweep_dead_writers

if TYPE_CHECKING:
    from .trimming import MIN_AGE
    from .trimming import Trim
    from .trimming import evict
    from .trimming import shape_profiles
    from .trimming import touch
    from .trimming import trim

__all__ = [
    "GRAPHS_RECORD", "LOCK_NAME", "MIN_AGE", "OUR_NAMES", "PENDING_DIR", "SESSIONS_DIR", "SESSION_ENV", "STALE_AFTER",
    "TEMP_PREFIX", "TORCH_DIRS", "TORCH_FILES", "TORCH_TEMP_GRACE", "UNKNOWN_SESSION", "Kind", "LiveSession",
    "Ownership", "Registration", "SessionDir", "Trim", "carried_file", "clear_pytest_cache_keeping", "decide", "evict",
    "default_shared_dir", "default_shared_for", "fallback_dir", "fresh_dir", "live_owners", "live_sessions",
    "lock", "make_dir", "mark_isolated", "ownership", "planned_dir", "refuse_foreign", "register_session",
    "remove", "remove_dir", "safe_temp_dir", "shape_profiles", "sweep_abandoned_isolated", "sweep_dead_writers",
    "touch", "trim", "unmark_isolated", "unsafe_dir_reason",
]  # fmt: skip


# Loaded on first use (PEP 562): a session without a size cap and without compiles never trims or touches,
# and the session start should not pay for the module. Not cached in this namespace: the submodule stays
# the one home of each name (a harness that unloads modules, like pytester, never sees a stale one).
_LAZY = {
    "MIN_AGE": "trimming", "Trim": "trimming", "evict": "trimming", "shape_profiles": "trimming",
    "touch": "trimming", "trim": "trimming",
}  # fmt: skip


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
