"""A guard around torch's Redis remote caches: a Redis error is recorded and switches them off for the process;
and their switches in torch's config, where torch read them before the session set them.

PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

from .._env import REMOTE_SWITCHES
from .hooks import install_now_or_on_import

# --------------------------------------------------------------------------- Redis remote cache guard

_REMOTE_CACHE = "torch._inductor.remote_cache"
_remote_guard: str | None = None  # None: not tried yet; "" installed; otherwise why not
_remote_errors: list[str] = []
_remote_off = False  # set by the guard at the first Redis error: every later call in this process is skipped


def guard_remote_cache() -> None:
    """From now on, a Redis error in torch's remote caches switches them off for this process and is recorded
    (:func:`remote_cache_errors`) instead of failing the compile; never imports torch.

    torch's ``RedisRemoteCacheBackend`` (2.7-2.15) turns itself off on ``ConnectionError`` alone: a timeout,
    a full Redis (``OOM``), a read-only replica or a paused primary raise out of ``torch.compile`` and fail
    the test (``AOTAutogradCache.save`` calls ``put`` without a ``try``). The wrapper catches every
    ``redis.exceptions.RedisError`` the way torch catches ``ConnectionError`` (the backend's client is
    dropped, later calls are misses), and also records the lost connections torch swallows silently. Call
    once per session where it turned Redis on (the controller and every xdist worker): a later session in the
    same process (``pytest.main`` again) tries Redis again.
    """
    global _remote_off
    _remote_off = False
    install_now_or_on_import(_REMOTE_CACHE, _install_remote_guard, pending=_remote_guard is None)


def remote_cache_errors() -> list[str]:
    """Take the Redis errors recorded since the last call (one line each; empty when none, or no guard)."""
    taken = list(_remote_errors)
    del _remote_errors[: len(taken)]
    return taken


def _install_remote_guard() -> None:
    global _remote_guard
    if _remote_guard is not None:
        return
    try:
        import redis
        from torch._inductor.remote_cache import RedisRemoteCacheBackend

        originals = {name: RedisRemoteCacheBackend.__dict__[name] for name in ("_get", "_put")}
        failure: type[BaseException] = redis.exceptions.RedisError
    except Exception as exc:  # no redis client (then torch has no Redis cache either) or another torch layout
        _remote_guard = f"Redis errors are not guarded on this torch ({type(exc).__name__})"
        return

    def guarded(name: str, original: Any) -> Any:
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            global _remote_off
            if _remote_off:
                return None  # a miss, or a put not made: torch builds a new backend per compile, so the
                # switch is the process's, not one backend's (else each compile waits out the timeout again)
            if getattr(self, "_redis", None) is None:
                return original(self, *args, **kwargs)  # off already: torch's own early return
            try:
                result = original(self, *args, **kwargs)
            except failure as exc:
                self._redis = None  # what torch does on ConnectionError: no more calls from this backend
                _remote_off = True
                _remote_errors.append(f"{name.strip('_')}: {type(exc).__name__}: {' '.join(str(exc).split())[:160]}")
                return None
            if getattr(self, "_redis", None) is None:  # torch caught a ConnectionError and switched off
                _remote_off = True
                _remote_errors.append(f"{name.strip('_')}: the connection was lost")
            return result

        call.__wrapped__ = original  # type: ignore[attr-defined]
        return call

    backend: Any = RedisRemoteCacheBackend
    for name, original in originals.items():
        setattr(backend, name, guarded(name, original))
    _remote_guard = ""


def uninstall_remote_guard() -> None:
    """Put torch's own ``_get``/``_put`` back (tests; a session never needs to)."""
    global _remote_guard, _remote_off
    module = sys.modules.get(_REMOTE_CACHE)
    backend = getattr(module, "RedisRemoteCacheBackend", None)
    for name in ("_get", "_put"):
        original = getattr(getattr(backend, name, None), "__wrapped__", None)
        if original is not None:
            setattr(backend, name, original)
    _remote_guard = None
    _remote_off = False
    _remote_errors.clear()


# --------------------------------------------------------------------------- torch's switches, in-process

# torch's config entries that its remote-cache switches set when the module is imported, and the variable each
# reads: a session that sets the variables after the import (torch imported before pytest configured the
# session) sets these too, and puts them back at its end; so does one during which torch was imported.
_SWITCHED = (
    ("torch._inductor.config", "fx_graph_remote_cache", REMOTE_SWITCHES[0]),
    ("torch._functorch.config", "enable_remote_autograd_cache", REMOTE_SWITCHES[1]),
    ("torch._inductor.config", "autotune_remote_cache", REMOTE_SWITCHES[2]),
)
_switched_before: dict[tuple[str, str], Any] = {}


def _tristate(variable: str) -> bool | None:
    """What torch makes of a switch at import ("1" on, "0" off, else its own default, None)."""
    value = os.environ.get(variable)
    return True if value == "1" else False if value == "0" else None


def point_remote_caches() -> bool:
    """Where torch read its remote-cache switches at import already, set its config to what the environment
    says now (the session's switches); True when any entry was set. The values before are kept for
    :func:`put_back_remote_caches`."""
    changed = False
    for module_name, name, variable in _SWITCHED:
        config = sys.modules.get(module_name)
        if config is None or not hasattr(config, name):
            continue
        with contextlib.suppress(Exception):
            _switched_before.setdefault((module_name, name), getattr(config, name))
            setattr(config, name, _tristate(variable))
            changed = True
    return changed


def put_back_remote_caches() -> None:
    """After the session's lease put the variables back: each entry :func:`point_remote_caches` set goes
    back to its value before, and each torch read while the session's switches were set (imported during
    the session) to what the variables say now, so that a later session in the process (pytester, an IDE)
    does not keep using the Redis."""
    for module_name, name, variable in _SWITCHED:
        config = sys.modules.get(module_name)
        key = (module_name, name)
        before = _switched_before.pop(key, None) if key in _switched_before else _tristate(variable)
        if config is not None and hasattr(config, name):
            with contextlib.suppress(Exception):
                setattr(config, name, before)
