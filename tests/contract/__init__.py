"""Contract suites shared by every implementation of a protocol (see ``store_contract``)."""

from __future__ import annotations

import pytest

# The contract's asserts live outside test modules: ask pytest to rewrite them for readable failures.
pytest.register_assert_rewrite("tests.contract.store_contract")
