"""A wall-clock budget around a store: a slow store costs at most the budget, then a :class:`StoreError`.

Timeouts in a backend bound each socket read (S3's ``read_timeout``), not a request: an endpoint that
trickles a byte every few seconds, or reads an upload at a crawl, holds a call for hours. :class:`TimedStore`
runs each call in a daemon thread and stops waiting when the budget its calls share is spent. A call given
up on keeps running in the background until it ends or the process exits; a store with a ``cancel()`` (S3,
whose transfer threads Python would join at exit) is told to stop at once, at its next chunk. A ``get``
writes to a private temp name beside its ``dest``, published only when the call returns in time: one given up
on never publishes ``dest``, and removes what it wrote when it ends (a process killed meanwhile leaves a temp
name that :func:`.._fs.sweep_our_temps` knows). A ``put`` given up on may still complete: the store then holds
the whole object (every backend publishes atomically), which the caller was told had failed.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import builtins
import contextlib
import os
import threading
import time
from pathlib import Path
from typing import Any
from typing import Callable
from typing import TypeVar

from .._fs import temp_name
from ..errors import StoreError
from ..errors import TimedOut
from .base import NoPartialReads
from .base import ObjectTooLarge
from .base import Store
from .base import StoreEntry
from .base import read_head

_T = TypeVar("_T")


class TimedStore:
    """``inner`` whose calls together take at most ``seconds`` of wall time.

    Only time inside the store's calls counts: packing, verifying or installing a bundle between two calls
    is the machine's work, not the store's. A call given up on spends what was left. ``option`` names the
    setting in the timeout message, as the user gives it (the plugin's flag or ini key, the CLI's
    ``--store-timeout``, the Action's variable).

    ``trouble`` is the first infrastructure failure met (a :class:`StoreError` other than
    :class:`ObjectTooLarge` and :class:`NoPartialReads`, a timeout included), or None: a caller that saw
    the store fail or stall once can skip the next operation instead of paying the same wait again.
    """

    def __init__(
        self,
        inner: Store,
        seconds: float,
        *,
        option: str = "--compile-cache-store-timeout",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.inner = inner
        self.location = inner.location
        self.seconds = seconds
        self.option = option
        self.trouble: str | None = None
        self.spent = 0.0  # seconds inside calls so far
        self._clock = clock

    @property
    def exhausted(self) -> bool:
        """True once the calls have spent the whole budget (a call given up on spends what was left)."""
        return self.spent >= self.seconds

    def __repr__(self) -> str:
        return f"TimedStore({self.inner!r}, {self.seconds:g} s)"

    def get(self, key: str, dest: Path, *, limit: int | None = None) -> bool:
        """The inner ``get`` within what is left of the budget, into a private name beside ``dest`` that only a
        call returning in time publishes (the module docstring)."""
        dest = Path(dest)
        private = dest.parent / temp_name("tmp", lead=f".{dest.name[:120]}.")
        lock = threading.Lock()
        state = {"ended": False, "abandoned": False}

        def fetch() -> bool:
            try:
                return self.inner.get(key, private, limit=limit)
            finally:
                with lock:  # exactly one of this and the caller's timeout removes a late download
                    state["ended"] = True
                    if state["abandoned"]:
                        _remove(private)

        try:
            found = self._call(f"get {key}", fetch)
        except TimedOut:
            with lock:
                state["abandoned"] = True
                if state["ended"]:
                    _remove(private)
            raise
        except BaseException:
            _remove(private)
            raise
        if found:
            os.replace(private, dest)
        else:
            _remove(private)
        return found

    def get_head(self, key: str, limit: int) -> bytes | None:
        """The inner ``get_head`` (:func:`.base.read_head`) within what is left of the budget; a store
        without one is :class:`.base.NoPartialReads` at once, costing nothing."""
        if getattr(self.inner, "get_head", None) is None:
            return read_head(self.inner, key, limit)  # raises NoPartialReads
        return self._call(f"read {key}", lambda: read_head(self.inner, key, limit))

    def put(self, key: str, src: Path) -> None:
        """The inner ``put`` within what is left of the budget."""
        self._call(f"put {key}", lambda: self.inner.put(key, src))

    def list(self, prefix: str = "") -> builtins.list[StoreEntry]:
        """The inner ``list`` within what is left of the budget."""
        return self._call("list", lambda: self.inner.list(prefix))

    def delete(self, key: str) -> None:
        """The inner ``delete`` within what is left of the budget."""
        self._call(f"delete {key}", lambda: self.inner.delete(key))

    def _call(self, what: str, call: Callable[[], _T]) -> _T:
        left = self.seconds - self.spent
        if left <= 0:
            raise self._timed_out(what)
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["value"] = call()
            except BaseException as exc:  # handed to the caller, or dropped with a call given up on
                box["error"] = exc

        worker = threading.Thread(target=run, name="compilecache-store", daemon=True)
        started = self._clock()
        worker.start()
        worker.join(left)
        if worker.is_alive():
            self.spent = self.seconds
            cancel = getattr(self.inner, "cancel", None)  # a store whose transfers can stop (S3): told to
            if callable(cancel):
                with contextlib.suppress(Exception):
                    cancel()
            raise self._timed_out(what)
        self.spent += self._clock() - started
        error = box.get("error")
        if error is not None:
            harmless = (ObjectTooLarge, NoPartialReads)  # the object's size, the store's kind: no trouble
            if isinstance(error, StoreError) and not isinstance(error, harmless) and self.trouble is None:
                self.trouble = str(error)
            raise error
        value: _T = box["value"]
        return value

    def _timed_out(self, what: str) -> TimedOut:
        error = TimedOut(f"{self.location} did not finish within {self.seconds:g} s ({what}); see {self.option}")
        if self.trouble is None:
            self.trouble = str(error)
        return error


def _remove(path: Path) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)
