"""The shared test doubles pass the same contract as the real things: the store contract, the probe's signatures."""

from __future__ import annotations

import inspect
from typing import Any
from typing import Callable

import pytest

from pytest_compilecache import probe
from pytest_compilecache.explain import GraphLookup
from pytest_compilecache.recorder import Recorder
from pytest_compilecache.stores import Store
from tests.contract.store_contract import StoreContract
from tests.fakes import FakeLoader
from tests.fakes import FakeProbe
from tests.fakes import MemoryBackend
from tests.fakes import MemoryStore


class TestMemoryStoreContract(StoreContract):
    @pytest.fixture
    def make_store(self) -> Callable[[], Store]:
        backend = MemoryBackend()
        return lambda: MemoryStore(backend=backend)

    @pytest.fixture
    def set_modified(self) -> Callable[[Store, str, float], None]:
        def set_modified(store: Store, key: str, when: float) -> None:
            assert isinstance(store, MemoryStore)
            store.set_modified(key, when)

        return set_modified


def _parameters(fn: Callable[..., Any]) -> list[tuple[str, Any]]:
    return [(p.name, p.kind) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize("name", FakeProbe.REPLACES)
def test_fake_probe_keeps_the_real_signatures(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    real = getattr(probe, name)
    fake = FakeProbe(monkeypatch)
    assert getattr(probe, name) == getattr(fake, name)  # installed
    assert _parameters(getattr(fake, name)) == _parameters(real)


def test_fake_probe_counts_a_test_as_torch_would(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeProbe(monkeypatch)
    recorder = Recorder("controller")
    fake.run(recorder, "t.py::test_a", GraphLookup("k1", "miss", {}), GraphLookup("k2", "hit", {}))
    fake.run(recorder, "t.py::test_none")
    record = recorder.stats.records["t.py::test_a"]
    assert (record.fxgraph["hit"], record.misses, [g.key for g in record.graphs]) == (1, 1, ["k1", "k2"])
    assert "t.py::test_none" not in recorder.stats.records and recorder.stats.tests == 2
    assert probe.dynamo_loaded() is False and probe.precompiled_header_dir() is None


def test_fake_loader_keeps_the_real_signature() -> None:
    assert _parameters(FakeLoader().__call__) == _parameters(probe.load_artifacts)
