"""What one pytest process of a compile-cache session decides once, before torch is imported:
:class:`SessionContext`.

The settings, the session cache dir (an xdist worker follows its controller's), the environment exported for
torch (leased, put back at the end), the registration in a shared dir, the store to use and the fingerprint.
Both roles (:mod:`.session`) and both phases (:mod:`.restore_phase`, :mod:`.save_phase`) read it; it sits
below them, so that they pass it down and never import the roles. Nothing here imports pytest or torch.
Loads lazily (inside the functions that need them, so a session pays only for what it uses): ``.stores``, ``._fs``,
``.probe``, ``.remote``, ``.ghrunner``, ``.fingerprint``, ``.stores.timed``.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from . import cachedir
from ._env import PGO_ENVS
from ._env import PGO_JOB_ID
from ._env import REMOTE_SWITCHES
from ._env import SESSION_ENV
from ._env import TOUCHED
from ._env import EnvLease
from ._env import cache_dir_env
from .cachedir import SessionDir
from .errors import ConfigError
from .problems import Problems
from .settings import DEFAULT_PREFIX
from .settings import Settings
from .settings import unused_options

if TYPE_CHECKING:
    from .fingerprint import Fingerprint
    from .stores import Store
    from .stores.timed import TimedStore

# Modes whose cache dir keeps FX graphs, so that a miss can be compared with an earlier run's lookups.
EXPLAINED_MODES = ("shared", "isolated")


def _torch_read_switches() -> bool:
    """Whether torch's config modules that read the remote-cache switches at their import are imported."""
    return "torch._inductor.config" in sys.modules or "torch._functorch.config" in sys.modules


def _switch_torch_in_process(problems: Problems) -> None:
    """torch read its remote-cache switches at its import, before the session set them: set its config too."""
    if not _torch_read_switches():
        return
    from . import probe

    if probe.point_remote_caches():
        problems.note("torch was imported before pytest-compilecache configured the session; switched its remote "
                      "caches in-process")  # fmt: skip


def _put_back_torch_switches() -> None:
    """torch read the session's switches (at its import, or switched in-process): its config goes back."""
    if _torch_read_switches():
        from . import probe

        probe.put_back_remote_caches()


def _refuse_store_at(settings: Settings, cache_dir: str | os.PathLike[str]) -> None:
    """A directory store that is the cache dir, lies in it or holds it: ConfigError naming the store option."""
    from .stores import refuse_cache_dir

    try:
        refuse_cache_dir(settings.store or "", cache_dir)
    except ConfigError as exc:
        raise settings.respell(exc, "store") from None


class SessionContext:
    """The decisions made once per process before torch is imported; see the module docstring.

    A plain class, not a dataclass: making a dataclass costs every session with a cache dir more at import
    than the rest of this class (``bench/overhead.py``).
    """

    def __init__(
        self,
        settings: Settings,
        dir: SessionDir,
        lease: EnvLease,
        problems: Problems,
        follows_controller: bool = False,
    ) -> None:
        self.settings = settings
        self.dir = dir
        self.lease = lease
        self.problems = problems
        self.follows_controller = follows_controller
        self._fingerprint: Fingerprint | None = None
        self.registration: cachedir.Registration | None = None
        # Redis errors met by torch's remote caches (this process's; a controller's also its workers')
        self.remote_errors: list[str] = []
        # probe.point_cache_dir ran (it may have changed torch's config, which close puts back)
        self._torch_config = False
        self._switches_back = False  # close put torch's remote-cache switches back

    def __repr__(self) -> str:
        return f"SessionContext(dir={self.dir!r}, follows_controller={self.follows_controller})"

    @classmethod
    def start(
        cls, settings: Settings, default_shared: Path, *, inherited: str | None, problems: Problems
    ) -> SessionContext:
        """Decide and export the session cache dir (an xdist worker follows its controller's ``inherited``).

        Raises :class:`ConfigError` for an unusable dir, store URL or JSON report path (no I/O happens for
        the store), naming the option as the user gave it.
        """
        lease = EnvLease(TOUCHED)
        try:
            if settings.store:
                open_configured_store(settings)  # a malformed store URL fails at start-up
        except ConfigError as exc:
            raise settings.respell(exc, "store") from None
        if settings.json and not inherited:
            from ._fs import report_target

            report_target(settings.json, settings.spelling("json"))  # makes no dir
        if inherited:
            session_dir = SessionDir.from_env(inherited)
        else:
            # Every check that can refuse runs before a dir is made: a refused start leaves nothing behind.
            planned = cachedir.planned_dir(settings.effective_mode, settings.dir, default_shared)
            if settings.store and planned is not None:
                _refuse_store_at(settings, planned)
            try:
                session_dir = cachedir.decide(settings.effective_mode, settings.dir, default_shared)
            except ConfigError as exc:
                raise settings.respell(exc, "dir") from None
            if settings.store and session_dir.path and planned is None:  # a place not known before: checked now
                try:
                    _refuse_store_at(settings, session_dir.path)
                except ConfigError:
                    cachedir.remove(session_dir)  # an isolated dir made just now: a refused start leaves none
                    raise
        context = cls(settings, session_dir, lease, problems, follows_controller=bool(inherited))
        if session_dir.owned and not settings.keep:
            # Also when pytest stops before the session ends (--help, a usage error, a broken conftest).
            atexit.register(cachedir.remove, session_dir)
        if not inherited:
            context._export()
            _register(context)
        elif session_dir.mode == "isolated" and session_dir.path:
            # An xdist worker outlives a killed controller by seconds: live in the dir till then, so that no
            # later isolated session sweeps it from under the worker (cachedir.sweep_abandoned_isolated).
            with contextlib.suppress(OSError):
                context.registration = cachedir.register_session(session_dir.path)
        return context

    def release(self) -> None:
        """Withdraw the registration: this session no longer reads or writes the dir (idempotent)."""
        if self.registration is not None:
            self.registration.close()

    def _export(self) -> None:
        for unused in unused_options(self.settings):
            self.problems.note(unused)
        mode = self.dir.mode
        if self.settings.pgo and mode != "disabled":
            self._keep_shape_profile()
        if mode is None and not self.settings.redis:
            return
        self.lease.set({SESSION_ENV: self.dir.to_env()})
        if mode in ("shared", "isolated") and "torch._inductor" not in sys.modules and self.dir.path:
            # Before torch's compiler is imported the variables are all it will read: probe.point_cache_dir's
            # first step, without loading probe in a session that may never import torch.
            self.lease.set(cache_dir_env(self.dir.path))
        elif mode in ("shared", "isolated", "disabled"):
            from . import probe

            self._torch_config = True
            note = probe.point_cache_dir(self.dir.path if mode != "disabled" else None, disable=mode == "disabled")
            if note:
                self.problems.note(note)
        if self.settings.redis and mode == "disabled":  # torch turns every cache off, its remote ones too
            self.problems.note(f"{self.settings.spelling('redis')}: not used, every cache is off in a disabled session")
        elif self.settings.redis:
            self._enable_redis(self.settings.redis)

    def _keep_shape_profile(self) -> None:
        """``--compile-cache-pgo=on``: give torch a job id, so that it keeps the profile of which input sizes
        varied (its automatic-dynamic PGO) in the cache dir, and records it in every process's mega-cache blob.

        Without it, a function is compiled for its first input's sizes and again, with a symbolic size, when a
        second size comes; which graphs a process compiles then depends on the tests that ran before in it, so
        an xdist worker needs graphs that a serial run's (or another order's) bundle lacks. With the profile,
        every process compiles the varying sizes symbolically from the first call: the same graphs in any order.
        A job id the user set already is left alone (torch keeps the profile under it); one given only as the
        newer alias is copied to ``TORCH_COMPILE_JOB_ID``, which every torch reads. torch reads the id at
        import: one imported before the session is configured keeps none, and a note says so.
        """
        job, alias = (os.environ.get(name) for name in PGO_ENVS)
        if job:
            return
        if "torch.compiler.config" in sys.modules:
            self.problems.note(
                f"{self.settings.spelling('pgo')}: torch was imported before the session was configured, so "
                f"it keeps no shape profile in this process (set {PGO_ENVS[0]} before importing it)"
            )
        self.lease.set({PGO_ENVS[0]: alias or self.pgo_job_id()})

    def pgo_job_id(self) -> str:
        """The job id torch keeps the shape profile under: one per key prefix (so per lineage of bundles, and
        per file in a shared dir), the plain :data:`PGO_JOB_ID` for the default prefix as before."""
        prefix = self.settings.key_prefix
        return PGO_JOB_ID if prefix == DEFAULT_PREFIX else f"{PGO_JOB_ID}-{prefix}"

    def _enable_redis(self, url: str) -> None:
        """Turn on torch's remote caches (read at import and per compile), after checking Redis answers."""
        from . import remote

        problem = remote.check_redis(url)
        if problem:
            self.problems.warn(f"redis at {remote.redacted(url)} {problem}; remote caches stay off")
            # Off also where the environment had them on already (set by hand, for another Redis).
            self.lease.set(dict.fromkeys(REMOTE_SWITCHES, "0"))
        else:
            self.lease.set(dict(remote.redis_env(url)))
        _switch_torch_in_process(self.problems)

    @property
    def redis_on(self) -> bool:
        return bool(self.settings.redis) and os.environ.get(REMOTE_SWITCHES[0]) == "1"

    def take_remote_errors(self) -> None:
        """Keep the Redis errors of torch's remote caches in this process so far (:func:`probe.guard_remote_cache`
        switched them off and recorded them) in :attr:`remote_errors`: workers send them to the controller,
        which warns once for the whole session (:meth:`warn_remote_errors`)."""
        probe = sys.modules.get(f"{__package__}.probe")
        if probe is not None:  # its guard records them: not loaded, nothing recorded (and nothing to load)
            self.remote_errors += probe.remote_cache_errors()

    def warn_remote_errors(self) -> None:
        """One warning when torch's Redis remote caches failed in any process of the session: the compiles
        went on with the local caches."""
        errors = self.remote_errors
        if errors:
            more = f"; {len(errors)} errors in all" if len(errors) > 1 else ""
            from .ghrunner import one_line

            self.problems.warn(
                one_line(
                    f"redis remote cache failed mid-session ({errors[0]}{more}); torch's remote caches are off "
                    "for the rest of each process that met it, its compiles use the local cache dir",
                    500,
                )
            )

    def ensure_dir(self) -> None:
        """Re-make a shared dir that ``--cache-clear`` removed since start-up (racing workers are fine)."""
        if self.dir.mode == "shared" and self.dir.path and not os.path.isdir(self.dir.path):
            try:
                cachedir.make_dir(Path(self.dir.path))
            except ConfigError as exc:
                self.problems.warn(str(exc))
        if self.registration is not None:
            try:
                self.registration.renew()  # --cache-clear removed it with the dir
            except OSError as exc:
                self.problems.warn(f"could not register in the cache dir ({exc}); other sessions may trim it meanwhile")

    def header(self) -> str | None:
        if self.dir.mode is None and not self.settings.redis:
            return None
        from .remote import redacted

        extra = f", redis {redacted(self.settings.redis)}" if self.settings.redis else ""
        if self.settings.redis and not self.redis_on:
            extra += " (off: disabled session)" if self.dir.mode == "disabled" else " (ping failed, off)"
        store = f", store {self.settings.store}" if self.settings.store else ""
        where = f" ({self.dir.note})" if self.dir.note else ""
        return f"compile cache: {self.dir.describe()}{where}{store}{extra}"

    @property
    def saving(self) -> bool:
        return bool(self.settings.store) and not self.settings.readonly and self.dir.path is not None

    def fingerprint_if_known(self) -> Fingerprint | None:
        return self._fingerprint

    def adopt_fingerprint(self, facts: dict[str, str]) -> None:
        """The fingerprint a worker of this session computed (same machine, same options): the controller
        then saves without importing torch itself."""
        if self._fingerprint is None:
            from .fingerprint import Fingerprint

            self._fingerprint = Fingerprint.from_json(facts)

    def fingerprint(self) -> Fingerprint:
        if self._fingerprint is None:
            from .fingerprint import collect

            self._fingerprint = collect(salt=self.settings.key_salt)
        return self._fingerprint

    def timed_store(self) -> TimedStore:
        """The configured store, its calls bounded in all by ``--compile-cache-store-timeout``."""
        from .stores.timed import TimedStore

        settings = self.settings
        return TimedStore(
            open_configured_store(settings), settings.store_timeout, option=settings.spelling("store_timeout")
        )

    def close(self) -> None:
        """Put the environment and torch's config back as they were, withdraw the registration (idempotent;
        matters when pytest runs in-process, e.g. pytester, an IDE). Called at unconfigure, and through
        pytest's cleanup stack when the session stops before configure (a usage error, a broken conftest)."""
        self.release()
        self.lease.restore()
        if self._torch_config:  # only _export changes torch's config (through probe.point_cache_dir)
            from . import probe

            probe.put_back_config()
        if self.settings.redis and not self._switches_back:  # once: close runs again from pytest's cleanup stack
            self._switches_back = True
            _put_back_torch_switches()


def _register(context: SessionContext) -> None:
    """A shared dir's controller: sweep what killed sessions left, then mark the session live in the dir (no
    other session trims it while the registration is held). An isolated dir's: say whether the dir is kept,
    mark the session live in it, then remove the isolated dirs beside it that killed sessions left."""
    path, problems = context.dir.path, context.problems
    if context.dir.mode == "isolated" and context.dir.owned and path:
        try:
            cachedir.mark_isolated(path, kept=context.settings.keep)
            context.registration = cachedir.register_session(path)
            swept = cachedir.sweep_abandoned_isolated(path)
        except OSError as exc:
            problems.warn(f"could not register in the isolated dir ({exc}); a kill would leave it behind")
            return
        if swept:
            problems.note(f"removed {swept} isolated cache dirs that killed sessions left beside this one")
        return
    if context.dir.mode != "shared" or not path:
        return
    try:
        swept = cachedir.sweep_dead_writers(path)
        cachedir.unmark_isolated(path)  # an isolated session's leftover dir, now a shared one: never swept
        context.registration = cachedir.register_session(path)
    except OSError as exc:
        problems.warn(f"could not register in the cache dir ({exc}); other sessions may trim it meanwhile")
        return
    if swept:
        problems.note(f"removed {swept} temp files left in the cache dir by killed sessions")


def open_configured_store(settings: Settings) -> Store:
    """The store named by ``--compile-cache-store``; raises ConfigError for a malformed URL (no I/O)."""
    from .stores import open_store

    return open_store(settings)
