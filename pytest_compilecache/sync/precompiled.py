"""The precompiled headers' part of a restore and a save, as :class:`.results.HeaderReport` lines.

Precompiled headers (:mod:`..pch`) travel beside the bundle, not in it: a save uploads each header the
session used once per store (``<prefix>-artifact-<sha256>``) and its manifest names them; a restore, after
the bundle is verified and installed, installs the named ones into torch's header dir, inline
(:func:`restore_precompiled`) or in the background (:class:`HeaderInstall`). A header that cannot be carried
is one line in ``headers.warnings`` and never changes the outcome: torch builds it, as it would without us.
Loads lazily (inside the functions that need them, so a session pays only for what it uses): ``threading``,
``..probe``, ``dataclasses``.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any
from typing import Iterable
from typing import Mapping

from .. import pch
from .._env import FILE_LOCK_TIMEOUT_ENV
from .._env import torch_lock_timeout
from .._fs import temporary_dir
from ..ghrunner import one_line
from ..manifest import Artifact
from ..stores.base import Store
from .results import HeaderReport


def restore_precompiled(
    store: Store,
    prefix: str,
    named: Iterable[Artifact],
    scratch: Path,
    directory: Path | None,
    reservation: pch.Reservation | None = None,
) -> HeaderReport:
    """Install the headers a verified manifest names; any trouble is a warning line, never an exception."""
    if not named:
        return HeaderReport()  # most bundles (GPU-only suites, torch 2.7): no import, no work
    started = time.perf_counter()
    try:
        transfer = pch.restore_headers(store, prefix, named, scratch, directory, reservation)
    except Exception as exc:  # e.g. zstandard missing: the bundle is installed, torch builds the headers
        return HeaderReport(warnings=(one_line(f"precompiled headers not restored: {type(exc).__name__}: {exc}"),))
    return HeaderReport.of(transfer, time.perf_counter() - started)


def save_precompiled(
    store: Store,
    prefix: str,
    since: float,
    installed: Iterable[str],
    scratch: Path,
    directory: Path | None,
    carried: Iterable[str] = (),
    uses: Iterable[Any] | None = None,
    idle: Mapping[str, int] | None = None,
) -> tuple[HeaderReport, list[Artifact]]:
    """Upload the session's headers the store lacks; return the report and the manifest entries."""
    started = time.perf_counter()
    try:
        transfer = pch.save_headers(store, prefix, since, installed, scratch, directory, carried, uses, idle)
    except Exception as exc:  # the bundle is worth saving without its headers
        return HeaderReport(warnings=(one_line(f"precompiled headers not saved: {type(exc).__name__}: {exc}"),)), []
    return HeaderReport.of(transfer, time.perf_counter() - started), list(transfer.artifacts)


class HeaderInstall:
    """The precompiled headers a restored bundle names, installed in the background.

    After ``restore(..., headers=False)``: torch's build lock of every header to install is taken now
    (:func:`..pch.reserve_headers`), then a thread downloads and installs them while the caller goes on
    (an xdist worker lets the others start their tests; a plain session collects). Any process whose compile
    looks such a header up meanwhile waits in torch's own lock until it is in place, and builds nothing; this
    process checks them beside its first header look-up (:func:`.probe.check_headers_early`).
    :meth:`finish` waits for the thread and returns what :func:`restore` would have put in ``headers``.

    The locks are held at most :func:`reservation_limit` seconds, well before torch would give up waiting
    for one (``TORCHINDUCTOR_FILE_LOCK_TIMEOUT``) and fail the compile: a download still going on then goes
    on without them (torch builds the header meanwhile, or the download installs it if torch has not begun),
    and a header torch built instead is one warning.
    """

    def __init__(self, store: Store, prefix: str, named: Iterable[Artifact], directory: Path | None = None) -> None:
        import threading

        from .. import probe

        self._named = tuple(named)
        self._report = HeaderReport()
        self._reservation = pch.reserve_headers(self._named, directory)
        self._limit = reservation_limit()
        self._gave_up: tuple[str, ...] = ()
        self._timer = threading.Timer(self._limit, self._give_up)
        self._timer.daemon = True
        self._timer.start()
        # checked while torch works out which header it wants, off the first compile's path
        probe.check_headers_early([artifact.name for artifact in self._named], self._reservation.directory)
        self._thread = threading.Thread(
            target=self._run, args=(store, prefix, directory), name="compilecache-headers", daemon=True
        )
        self._thread.start()

    @property
    def named(self) -> tuple[Artifact, ...]:
        """The headers this install was started for: the manifest entries of the bundle that named them."""
        return self._named

    def _run(self, store: Store, prefix: str, directory: Path | None) -> None:
        try:
            with temporary_dir("restore") as tmp:
                self._report = restore_precompiled(store, prefix, self._named, Path(tmp), directory, self._reservation)
        except Exception as exc:  # the scratch dir: torch builds the headers as it would without us
            self._report = HeaderReport(warnings=(one_line(f"precompiled headers not restored: {exc}"),))
        finally:
            self._timer.cancel()
            self._reservation.release()

    def _give_up(self) -> None:
        with self._reservation.guard:
            self._gave_up = tuple(sorted(self._reservation.held))
            self._reservation.release()

    def finish(self) -> HeaderReport:
        """Wait for the install (bounded by the store's own time limit) and say what it did."""
        from dataclasses import replace

        self._thread.join()
        report = self._report
        told = " ".join(report.warnings)
        late = [name for name in self._gave_up if name not in report.transferred and name not in told]
        if not late:
            return report
        timeout = torch_lock_timeout()
        directory = self._reservation.directory
        lines = tuple(
            f"precompiled header {name} not restored within {self._limit:g} s (torch waits at most {timeout:g} s "
            f"for its build lock, {FILE_LOCK_TIMEOUT_ENV}): "
            + ("torch built it" if (directory / name).exists() else "torch builds it")
            for name in late
        )
        return replace(report, warnings=(*report.warnings, *lines))


# The longest the background install holds torch's build lock of a header (a ~150 MB header packs to ~21 MB:
# seconds on a CI runner), and never more than half of torch's own wait for it.
RESERVATION_MAX = 60.0


def reservation_limit() -> float:
    """Seconds :class:`HeaderInstall` holds torch's build locks at most: :data:`RESERVATION_MAX`, or half of
    ``TORCHINDUCTOR_FILE_LOCK_TIMEOUT`` when that is shorter."""
    return min(RESERVATION_MAX, torch_lock_timeout() / 2)
