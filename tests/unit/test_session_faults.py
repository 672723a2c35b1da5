"""A store that hands back a bad bundle, at unit level: every fault of :data:`tests.bundle_faults.FAULTS`
through the controller's restore (the same code a session runs at its start), in milliseconds.

One warning and nothing from the bundle in the cache dir: a miss that lists the refused bundle, or an error
when the store itself is broken; under ``strict`` the same warning is an error that fails the session.
tests/integration/test_plugin_faults.py takes two of these faults through a real pytest session.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable
from typing import Iterator

import pytest

from pytest_compilecache.fingerprint import Fingerprint
from pytest_compilecache.fingerprint import make_key
from pytest_compilecache.problems import Problems
from pytest_compilecache.session import Controller
from pytest_compilecache.session import Recorder
from pytest_compilecache.session import Setup
from pytest_compilecache.settings import DEFAULT_PREFIX
from pytest_compilecache.settings import Settings
from tests.bundle_faults import FAULTS
from tests.bundle_faults import SIGNING_KEY
from tests.fakes import FakeProbe

FP = Fingerprint({"torch": "2.13.0", "python": "cpython 3.11.7", "arch": "x86_64"})
KEY = make_key(DEFAULT_PREFIX, FP.digest(), "run1")
# What the one warning line says, by fault.
REASONS = {
    "truncated": "bundle is truncated",
    "flipped-byte": "payload checksum mismatch",
    "wrong-signature": "signature mismatch",
    "missing-signature": "signature missing",
    "other-fingerprint": "fingerprint differs (bundle != current): torch: 2.99.0 != 2.13.0",
    "escaping-member": "unsafe member path 'files/../../escaped.so'",
    "store-not-a-directory": "restore failed: cannot list",
}


@pytest.fixture
def restore(tmp_path: Path, fake_probe: FakeProbe) -> Iterator[Callable[[str, bool], Controller]]:
    """``restore(fault, strict)``: a directory store holding the damaged bundle, an isolated read-only
    session restoring from it; returns the controller after its ``session_start``."""
    opened: list[Setup] = []

    def run(fault: str, strict: bool) -> Controller:
        damage, env = FAULTS[fault]
        store = tmp_path / f"store-{strict}"
        store.mkdir()
        damage(store / f"{KEY}.bundle", FP)
        signing_key = SIGNING_KEY.encode() if env else None
        settings = Settings(mode="isolated", store=str(store), readonly=True, strict=strict, signing_key=signing_key)
        setup = Setup.start(settings, tmp_path / "default", inherited=None, problems=Problems(strict=strict))
        opened.append(setup)
        setup._fingerprint = FP
        controller = Controller(setup, Recorder("controller"))
        controller.session_start()
        return controller

    yield run
    for setup in opened:
        setup.close()


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_bad_bundle_is_one_warning_and_a_cold_start(
    fault: str, restore: Callable[[str, bool], Controller], tmp_path: Path
) -> None:
    assert set(REASONS) == set(FAULTS)
    controller = restore(fault, False)

    result = controller.restored
    assert result is not None
    (warning,) = controller.problems.warnings
    assert REASONS[fault] in warning, warning
    assert controller.problems.errors == []
    if fault == "store-not-a-directory":  # the store itself is broken: infrastructure trouble
        assert result.outcome == "error"
    else:  # a bad bundle in a working store is refused and listed; nothing usable: a miss, cold compile
        assert result.outcome == "miss"
        assert [key for key, _ in result.skipped] == [KEY]
    cache = controller.setup.dir.path
    assert cache is not None and Path(cache).is_dir()
    assert [p.name for p in Path(cache).rglob("*") if p.name.startswith("kernel")] == []
    assert not list(tmp_path.rglob("escaped.so")) and not (tmp_path.parent / "escaped.so").exists()


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_under_strict_a_bad_bundle_fails_the_session(fault: str, restore: Callable[[str, bool], Controller]) -> None:
    controller = restore(fault, True)

    assert controller.problems.errors == controller.problems.warnings, controller.problems.errors
    (error,) = controller.problems.errors
    assert error.startswith("restore") and REASONS[fault] in error, error
