from __future__ import annotations

import os

import pytest

from tests.plugin.helpers import INNER_INI

# Variables of the outer environment that would change what an inner session does (a CI step summary, a
# cache dir, an outer xdist worker's identity).
_OUTER_ENV_PREFIXES = ("PYTEST_COMPILECACHE_", "TORCHINDUCTOR_", "TRITON_", "PYTEST_XDIST_", "GITHUB_")


@pytest.fixture
def inner(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A pytester project with its own pytest.ini and an environment free of the outer session's settings."""
    pytester.makeini(INNER_INI)
    for name in list(os.environ):
        if name.startswith(_OUTER_ENV_PREFIXES):
            monkeypatch.delenv(name)
    # One compile thread: no pool of compile subprocesses (each would import torch on our two cores).
    monkeypatch.setenv("TORCHINDUCTOR_COMPILE_THREADS", "1")
    return pytester
