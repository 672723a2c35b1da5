"""session.Worker and the xdist restore ticket (issue 25): the worker that takes the ticket restores; the
others do, while they wait, what their first compile would do anyway. No compile, no subprocess of pytest."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from pytest_compilecache import probe
from pytest_compilecache.cachedir.ticket import RestoreTicket
from pytest_compilecache.recorder import Recorder
from pytest_compilecache.session import Worker


def _ticket(tmp_path: Path) -> RestoreTicket:
    return RestoreTicket(str(tmp_path / ".compilecache-restore-1-abcdef.json"))


def _restoring_elsewhere(ticket: RestoreTicket, done: threading.Event, events: list[str]) -> threading.Thread:
    """Another worker: holds the ticket's lock until ``done`` (or 10 s), then writes its result and lets go."""
    taken = threading.Event()

    def run() -> None:
        lock = ticket.take(wait=True)
        assert lock is not None
        taken.set()
        done.wait(10)
        events.append("restored")
        ticket.fulfil({"restored": None, "store_trouble": None, "fingerprint": None})
        lock.release()

    thread = threading.Thread(target=run)
    thread.start()
    assert taken.wait(10)
    return thread


def test_a_waiting_worker_imports_the_compiler_while_another_restores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before issue 25's change the waiting worker sat idle, then paid torch's compiler import (about 1.5 s
    of CPU) in its first test, after the restore: now it imports it while it waits."""
    ticket, done, events = _ticket(tmp_path), threading.Event(), []

    def import_compiler() -> bool:
        events.append("compiler imported")
        done.set()  # the restore ends only once this worker used the wait
        return True

    monkeypatch.setattr(probe, "import_compiler", import_compiler, raising=False)
    other = _restoring_elsewhere(ticket, done, events)
    worker = Worker(context=None, recorder=Recorder("gw1", explain=False))  # type: ignore[arg-type]
    worker.ticket = ticket
    started = time.monotonic()
    worker.before_tests()
    other.join()
    assert events == ["compiler imported", "restored"]
    assert time.monotonic() - started < 5 and worker.ticket is None
    # A worker that comes to its first test after the restore ended has nothing to wait for: no early import.
    late = Worker(context=None, recorder=Recorder("gw2", explain=False))
    late.ticket = ticket
    late.before_tests()
    assert events == ["compiler imported", "restored"] and late.ticket is None


def test_import_compiler_never_imports_torch() -> None:
    code = "import sys; from pytest_compilecache import probe; print(probe.import_compiler(), 'torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert done.stdout.split() == ["False", "False"], done.stderr


@pytest.mark.slow
def test_import_compiler_imports_what_the_first_compile_needs() -> None:
    code = (
        "import sys, torch; from pytest_compilecache import probe; "
        "print(probe.import_compiler(), 'torch._inductor.codecache' in sys.modules, 'torch._dynamo' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    assert done.stdout.split()[-3:] == ["True", "True", "True"], done.stderr


def test_a_full_disk_during_an_xdist_restore_is_the_serial_sessions_one_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_probe: Any
) -> None:
    """Issue 44, finding 2: writing the ticket (ENOSPC; EROFS or EACCES on its lock alike) raised through the
    worker's session start: an INTERNALERROR, no test run, where a serial session warned once and went on."""
    import errno
    import json
    import re

    from pytest_compilecache import sync
    from pytest_compilecache.context import SessionContext
    from pytest_compilecache.problems import Problems
    from pytest_compilecache.session import Controller
    from pytest_compilecache.settings import Settings
    from tests.unit.test_session import FP
    from tests.unit.test_session import _record

    def full_disk(store: Any, request: sync.RestoreRequest) -> sync.RestoreResult:
        staging = f"{request.cache_dir}/.compilecache-staging-{len(calls)}"  # each process's own temp name
        calls.append(staging)
        return sync.RestoreResult("error", message=f"restore failed: [Errno 28] No space left on device: {staging!r}")

    def no_space(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.ENOSPC, "No space left on device")

    calls: list[str] = []
    monkeypatch.setattr(sync, "restore_bundle", full_disk)
    warned = {}
    for session in ("serial", "xdist"):
        settings = Settings(mode="shared", dir=str(tmp_path / session), store=str(tmp_path / "store"), min_hit_rate=0.9)
        context = SessionContext.start(settings, tmp_path / "default", inherited=None, problems=Problems())
        context._fingerprint = FP
        controller = Controller(context, Recorder("controller"), xdist=session == "xdist")
        try:
            controller.session_start()
            if session == "xdist":
                monkeypatch.setattr(RestoreTicket, "take", no_space)
                monkeypatch.setattr(RestoreTicket, "fulfil", no_space)
                for name in ("gw0", "gw1"):
                    worker_context = SessionContext(settings, context.dir, context.lease, Problems())
                    worker_context._fingerprint = FP
                    worker = Worker(worker_context, Recorder(name))
                    worker.session_start()
                    worker.before_tests()
                    controller.add_worker(name, json.loads(json.dumps(worker.output())))
            controller.stats.add_record(_record("t::a", miss=1))
            assert controller.finish() is False  # the hit-rate floor is not enforced after a failed restore
        finally:
            context.close()
        warned[session] = [re.sub(r"/[^ ]*staging-\d+", "<temp>", line) for line in controller.problems.warnings]
    assert len(calls) == 3  # serial, then each worker that could not take turns
    assert warned["xdist"] == warned["serial"]
    assert len(warned["serial"]) == 1 and warned["serial"][0].startswith("restore failed: [Errno 28]")


def test_what_a_restoring_worker_sends_its_controller_is_plain_for_execnet(tmp_path: Path) -> None:
    """The worker's payload carries its restore's report; execnet refuses str subclasses (torch's TorchVersion
    in the fingerprint's facts), which crashed the worker at its end."""
    import execnet

    from pytest_compilecache import sync
    from pytest_compilecache.context import SessionContext
    from pytest_compilecache.fingerprint import Fingerprint
    from pytest_compilecache.problems import Problems
    from pytest_compilecache.restore_phase import RestorePhase
    from pytest_compilecache.settings import Settings

    class TorchVersion(str):
        pass

    settings = Settings(mode="shared", dir=str(tmp_path / "cache"), store=str(tmp_path / "store"))
    context = SessionContext.start(settings, tmp_path / "default", inherited=None, problems=Problems())
    try:
        context._fingerprint = Fingerprint({"torch": TorchVersion("2.13.0"), "python": "cpython 3.11"})
        phase = RestorePhase(context, Recorder("gw0"))
        phase.restored = sync.RestoreResult("miss", key=TorchVersion("k"))
        report = phase.report()
        execnet.dumps(report)
        assert report["fingerprint"]["torch"] == "2.13.0"
    finally:
        context.close()
