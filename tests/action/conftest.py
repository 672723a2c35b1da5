"""Fixtures for the Action's tests: its Python module, a fake fingerprint, the S3 server fixtures, runner files."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

# The moto server and a fresh bucket, shared with the store's integration tests.
from tests.integration.conftest import aws_env  # noqa: F401
from tests.integration.conftest import moto_server  # noqa: F401
from tests.integration.conftest import s3_bucket  # noqa: F401

REPO = Path(__file__).resolve().parents[2]


def load_action_module() -> ModuleType:
    """The Action's Python: the ``action`` package (the repository root is on ``pythonpath``)."""
    from action import main

    return main


def parse_vars(text: str) -> dict[str, str]:
    """Parse a GITHUB_ENV / GITHUB_OUTPUT file: ``NAME=value`` lines and ``NAME<<DELIMITER`` blocks."""
    values: dict[str, str] = {}
    lines = iter(text.splitlines())
    for line in lines:
        if not line:
            continue
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            name, delimiter = line.split("<<", 1)
            body: list[str] = []
            for item in lines:
                if item == delimiter:
                    break
                body.append(item)
            else:
                raise ValueError(f"{name}: no closing {delimiter!r} in a runner file")
            values[name] = "\n".join(body)
        elif "=" in line:
            name, value = line.split("=", 1)
            values[name] = value
        else:
            raise ValueError(f"malformed line in a runner file: {line!r}")
    return values


@pytest.fixture
def action() -> ModuleType:
    return load_action_module()


@pytest.fixture
def fingerprint() -> Any:
    """Fixed facts: plans and keys without importing torch."""
    from pytest_compilecache.fingerprint import Fingerprint

    return Fingerprint({"python": "cpython 3.11", "torch": "2.13.0", "cpu_model": "test"})
