"""What unit tests share: the fake probe (torch stands-in for the session roles) and, for the sync tests
(test_sync.py, test_sync_headers.py), recorded fingerprints, a source cache dir and the cache environment
that ``sync.restore`` points at the cache dir."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

import pytest

from pytest_compilecache._env import CACHE_ENV
from pytest_compilecache.fingerprint import Fingerprint
from pytest_compilecache.fingerprint import device_facts
from pytest_compilecache.probe import device_facts as probe_device_facts
from tests import devices
from tests.fakes import FakeProbe

PREFIX = "compilecache-v1"
BASE = {"torch": "2.13.0", "python": "cpython 3.11.7", "arch": "x86_64"}
# Recorded GPUs (tests/devices.py) through probe.device_facts, the one seam: never a GPU this machine pretends to have.
H100 = Fingerprint({**BASE, **device_facts(probe_device_facts(devices.cuda_machine(devices.H100_SXM)))})
A100 = Fingerprint({**BASE, **device_facts(probe_device_facts(devices.cuda_machine(devices.A100)))})
CACHE_FILES = {"ab/cabc.main.so": b"\x7fELF kernel", "fxgraph/xy/fxyz": b"pickled graph"}
BLOBS = {"controller": b"controller mega-cache", "gw0": b"gw0 mega-cache"}


@pytest.fixture
def cache_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """``sync.restore`` points TORCHINDUCTOR_CACHE_DIR at the cache dir; monkeypatch puts the old value back."""
    monkeypatch.setenv(CACHE_ENV, "/nonexistent/before-restore")


@pytest.fixture
def source(tmp_path: Path) -> Path:
    """A cache dir with CACHE_FILES: what a session compiled."""
    return write_tree(tmp_path / "source-cache", CACHE_FILES)


def write_tree(root: Path, files: Mapping[str, bytes]) -> Path:
    """Write ``files`` (relative path -> bytes) under ``root``; return ``root``."""
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` by relative path, with its bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def fake_probe(monkeypatch: pytest.MonkeyPatch) -> FakeProbe:
    """:class:`tests.fakes.FakeProbe` installed over ``pytest_compilecache.probe`` for this test."""
    return FakeProbe(monkeypatch)
