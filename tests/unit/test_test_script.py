"""scripts/test.sh runs pytest on 2 workers unless its arguments or TEST_WORKERS say otherwise (issue 30).

test.sh runs in a copy of the repository's scripts/ whose setup.sh and install-tools.sh are stand-ins and whose
venv's ``python`` records its arguments: only the command line test.sh builds is under test here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    (tmp_path / "scripts").mkdir()
    shutil.copy2(REPO / "scripts" / "test.sh", tmp_path / "scripts" / "test.sh")
    (tmp_path / "scripts" / "setup.sh").write_text('[ "${1:-}" = --print-venv ] && echo .venv\nexit 0\n')
    (tmp_path / "scripts" / "install-tools.sh").write_text("exit 0\n")
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text('#!/bin/sh\n[ "$2" = pytest ] && echo "$@" > "$(dirname "$0")/../pytest-args"\nexit 0\n')
    python.chmod(0o755)
    return tmp_path


def pytest_args(checkout: Path, *args: str, **env: str) -> str:
    environ = {k: v for k, v in os.environ.items() if k not in ("TEST_WORKERS", "TORCH")}
    result = subprocess.run(
        ["bash", str(checkout / "scripts" / "test.sh"), *args],
        env={**environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return (checkout / ".venv" / "pytest-args").read_text().strip()


def test_two_workers_by_default(checkout: Path) -> None:
    assert pytest_args(checkout) == "-m pytest -n 2"
    assert pytest_args(checkout, "-m", "not slow") == "-m pytest -n 2 -m not slow"


def test_the_arguments_or_test_workers_choose(checkout: Path) -> None:
    assert pytest_args(checkout, "-n", "0") == "-m pytest -n 0"
    assert pytest_args(checkout, "-n4") == "-m pytest -n4"
    assert pytest_args(checkout, "--numprocesses=3") == "-m pytest --numprocesses=3"
    assert pytest_args(checkout, "-p", "no:xdist") == "-m pytest -p no:xdist"
    assert pytest_args(checkout, TEST_WORKERS="4") == "-m pytest -n 4"


def test_lint_runs_unless_a_run_before_linted(checkout: Path) -> None:
    """.ci/run's second call (the suite's slow part, after lint and the fast subset) says SKIP_LINT=1."""
    linted = checkout / "linted"
    (checkout / "scripts" / "lint.sh").write_text(f'echo "$PY" >> "{linted}"\n')
    pytest_args(checkout, SKIP_LINT="1")
    assert not linted.exists()
    pytest_args(checkout)
    assert linted.read_text() == ".venv/bin/python\n"
