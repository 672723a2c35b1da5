"""scripts/test.sh runs pytest on 2 workers unless its arguments or TEST_WORKERS say otherwise (issue 30).

test.sh runs in a copy of the repository's scripts/ whose setup.sh and install-tools.sh are stand-ins and whose
venv's ``python`` records its arguments: only the command line test.sh builds is under test here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
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


def run_test_script(checkout: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k not in ("TEST_WORKERS", "TORCH")}
    return subprocess.run(
        ["bash", str(checkout / "scripts" / "test.sh"), *args],
        env={**environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def pytest_args(checkout: Path, *args: str, **env: str) -> str:
    result = run_test_script(checkout, *args, **env)
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


def test_the_tools_install_while_the_venv_is_made(checkout: Path) -> None:
    """Each stand-in waits for the other to have started: test.sh passes only if it runs them side by side."""
    scripts = checkout / "scripts"
    wait_for = 'for _ in $(seq 100); do [ -f "{0}" ] && break; sleep 0.1; done; [ -f "{0}" ] || exit 7\n'
    (scripts / "setup.sh").write_text(
        '[ "${1:-}" = --print-venv ] && echo .venv && exit 0\n'
        f'touch "{checkout}/venv-started"\n' + wait_for.format(checkout / "tools-started") + 'echo "setup: $1"\n'
    )
    (scripts / "install-tools.sh").write_text(
        f'touch "{checkout}/tools-started"\n' + wait_for.format(checkout / "venv-started")
    )
    result = run_test_script(checkout)
    assert result.returncode == 0, result.stderr
    assert "setup: test,docs" in result.stderr  # setup.sh's lines are shown once both are done
    assert (checkout / ".venv" / "pytest-args").is_file()


def test_a_failed_setup_fails_the_run_and_shows_why(checkout: Path) -> None:
    (checkout / "scripts" / "setup.sh").write_text(
        '[ "${1:-}" = --print-venv ] && echo .venv && exit 0\necho "pip: no matching distribution" >&2\nexit 3\n'
    )
    result = run_test_script(checkout)
    assert result.returncode == 3
    assert "pip: no matching distribution" in result.stderr
    assert not (checkout / ".venv" / "pytest-args").exists()


def test_a_failed_tool_install_stops_the_venvs_setup_too(checkout: Path) -> None:
    pid_file = checkout / "setup-pid"
    (checkout / "scripts" / "setup.sh").write_text(
        f'[ "${{1:-}}" = --print-venv ] && echo .venv && exit 0\necho $$ > "{pid_file}"\nexec sleep 60\n'
    )
    (checkout / "scripts" / "install-tools.sh").write_text(
        f'for _ in $(seq 100); do [ -s "{pid_file}" ] && break; sleep 0.1; done\nexit 4\n'
    )
    result = run_test_script(checkout)
    assert result.returncode == 4
    assert not (checkout / ".venv" / "pytest-args").exists()
    pid = int(pid_file.read_text())
    for _ in range(100):  # killed by test.sh's exit (a zombie until something reaps it)
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                break
        except (FileNotFoundError, ProcessLookupError):
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"setup.sh (pid {pid}) still runs after test.sh failed")
