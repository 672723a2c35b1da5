"""The README's minimal workflow, run under act exactly as a user would paste it (issue 30).

The workflow is read from README.md (the ``yaml`` block after the ``readme-minimal-workflow`` marker) and run
unchanged, so the copy-paste path cannot drift from what is tested. act needs three things a GitHub runner
has that this machine does not, all provided outside the workflow text:

* ``compilecache/pytest-compilecache@<the README's ref>`` is a copy of this repository's Action
  (``--local-repository``, as :mod:`tests.action.actrun` does for ``@v1``), and ``actions/cache@v5`` the
  stand-in running the real ``@actions/cache`` client against a local cache service (with the other
  stand-ins, :data:`tests.action.actrun.STAND_INS`);
* ``actions/setup-python@v7`` is a stand-in that only reports the interpreter: act in host mode runs every
  step with the ``python`` first on ``PATH``. That is a fresh venv here, which sees this interpreter's
  packages (torch, pytest, xdist) through a ``.pth`` line, so the README's ``pip install`` lines find their
  requirements already satisfied (nothing is downloaded), and the Action's default ``install: true`` installs
  the plugin into that venv, never into the venv running the tests;
* ``actions/checkout@v7`` is act's own local checkout of the workspace.

A push to main compiles cold and saves a bundle; a pull request then restores it and hits every graph.
"""

from __future__ import annotations

import re
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.action.actrun import action_copy
from tests.action.actrun import play
from tests.action.cache_server import CacheServer
from tests.action.test_act import MATMUL_SUITE
from tests.action.test_act import PYTEST_INI

REPO = Path(__file__).resolve().parents[2]
MARKER = "<!-- readme-minimal-workflow"
SETUP_PYTHON_STAND_IN = """\
name: setup-python stand-in
description: act in host mode runs steps with the python on PATH; this only says which one.
inputs:
  python-version:
    description: the version the workflow asks for
    required: false
runs:
  using: composite
  steps:
    - shell: bash
      run: |
        echo "setup-python stand-in: asked for ${{ inputs.python-version }}, using $(python --version)"
"""


def readme_workflow(text: str) -> str:
    """The ``yaml`` block that follows the marker comment in ``text`` (README.md), verbatim."""
    match = re.search(re.escape(MARKER) + r"[^\n]*\n```yaml\n(.*?\n)```\n", text, re.S)
    assert match, f"README.md has no ```yaml block after {MARKER!r}"
    return match.group(1)


def action_ref(workflow: str) -> str:
    """The ``owner/pytest-compilecache@ref`` the workflow uses: a tag or a full commit SHA, never a branch."""
    (ref,) = re.findall(r"uses:\s*(\S+/pytest-compilecache@\S+)", workflow)
    pin = ref.split("@", 1)[1]
    assert re.fullmatch(r"v\d+(\.\d+){0,2}|[0-9a-f]{40}", pin), f"the README pins the Action to {pin!r}"
    return str(ref)


def test_the_readme_block_is_found_and_pinned() -> None:
    """Fast: the extraction the act test relies on, and that the docs show the same workflow."""
    workflow = readme_workflow((REPO / "README.md").read_text())
    assert "python -m pytest" in workflow and action_ref(workflow).startswith("compilecache/")
    docs = (REPO / "docs" / "action.md").read_text()
    section = docs[docs.index("## Minimal workflow") :]
    assert f"```yaml\n{workflow}```" in section, "docs/action.md's minimal workflow differs from the README's"
    with pytest.raises(AssertionError, match="no ```yaml block"):
        readme_workflow("no marker here")
    with pytest.raises(AssertionError, match="pins the Action to 'main'"):
        action_ref("      - uses: someone/pytest-compilecache@main\n")


@pytest.fixture
def server() -> Iterator[CacheServer]:
    with CacheServer() as service:
        yield service


def fresh_python(root: Path) -> Path:
    """A venv whose ``python`` also sees this interpreter's packages (a ``.pth`` line), for the job's PATH."""
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    site = Path(
        subprocess.run(
            [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    parents = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    (site / "zz_test_parent.pth").write_text("".join(f"{path}\n" for path in parents))
    return venv / "bin"


def run_act(root: Path, workspace: Path, server: CacheServer, event: str, payload: dict[str, object]) -> str:
    """One act run of the workspace's workflow for ``event``; returns the log (asserting success)."""
    workflow = workspace / ".github" / "workflows" / "tests.yml"
    setup_python = root / "setup-python"
    setup_python.mkdir(exist_ok=True)
    (setup_python / "action.yml").write_text(SETUP_PYTHON_STAND_IN)
    (root / f"tmp-{event}").mkdir()
    result = play(
        root,
        workflow,
        event,
        server=server,
        run_id=2001 + len(list(root.glob("event-*.json"))),
        actions={"actions/setup-python@v7": setup_python, action_ref(workflow.read_text()): root / "action"},
        payload=payload,
        # a fresh runner: no precompiled header from earlier runs
        env={"TMPDIR": str(root / f"tmp-{event}")},
        python=root / "venv" / "bin" / "python",
    )
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-6000:]
    return log


@pytest.mark.action
@pytest.mark.slow
def test_the_readme_minimal_workflow_runs_as_written(tmp_path: Path, server: CacheServer) -> None:
    workflow = readme_workflow((REPO / "README.md").read_text())
    action_copy(tmp_path / "action")
    fresh_python(tmp_path)
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    subprocess.run(["git", "init", "-q", "-b", "main", str(workspace)], check=True)
    (workspace / ".github" / "workflows").mkdir(parents=True)
    (workspace / ".github" / "workflows" / "tests.yml").write_text(workflow)
    (workspace / "pytest.ini").write_text(PYTEST_INI)
    (workspace / "tests").mkdir()
    (workspace / "tests" / "test_models.py").write_text(MATMUL_SUITE)

    # A push to main: the README's install lines find everything installed, the Action installs the plugin
    # into the job's venv, the tests compile cold on 2 workers, actions/cache's post step saves the bundle.
    push = run_act(tmp_path, workspace, server, "push", {})
    assert "setup-python stand-in: asked for 3.11" in push
    cold = re.search(r"compile cache: (\d+) hits?, (\d+) miss", push)
    assert cold and cold.group(1) == "0" and int(cold.group(2)) >= 2, push[-6000:]
    (saved,) = server.keys("refs/heads/main")
    assert saved.startswith("compilecache-v1-test-")

    # A pull request: restores main's bundle, hits every graph, saves nothing.
    pull_request = {"number": 5, "pull_request": {"base": {"ref": "main"}}}
    pull = run_act(tmp_path, workspace, server, "pull_request", pull_request)
    warm = re.search(r"compile cache: (\d+) hits?, (\d+) miss", pull)
    assert warm and warm.group(2) == "0" and int(warm.group(1)) == int(cold.group(2)), pull[-6000:]
    assert server.keys() == [saved]
