from __future__ import annotations

import os

import pytest

from tests import torchenv
from tests.plugin.helpers import INNER_INI


@pytest.fixture
def inner(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A pytester project with its own pytest.ini and an environment free of the outer session's settings."""
    pytester.makeini(INNER_INI)
    for name in list(os.environ):
        if name.startswith(torchenv.OUTER_PREFIXES):
            monkeypatch.delenv(name)
    for name, value in torchenv.TORCH_SETTINGS.items():
        monkeypatch.setenv(name, value)
    return pytester
