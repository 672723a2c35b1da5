"""The shared test doubles pass the same contract as the real backends."""

from __future__ import annotations

from typing import Callable

import pytest

from pytest_compilecache.stores import Store
from tests.contract.store_contract import StoreContract
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
