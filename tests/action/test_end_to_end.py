"""action.yml end to end, as the runner runs it: the composite's steps, then ``pytest -n 2``, then post steps.

Each job starts on a fresh runner (RUNNER_TEMP emptied, a new run id) and shares only the store: the fake
GitHub cache (:class:`~tests.action.runner.FakeActionsCache`) or a bucket on a real moto server. The
compiled suite is two tiny functions: one cold compile each, a few seconds on two cores.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from typing import Mapping

import pytest

from tests.action.runner import FakeActionsCache
from tests.action.runner import Job
from tests.action.runner import StepResult

REPO = Path(__file__).resolve().parents[2]

PYTEST_INI = """\
[pytest]
addopts = -ra -p no:cacheprovider
filterwarnings =
    ignore::DeprecationWarning
"""

COMPILED_SUITE = '''\
import torch


def test_sin():
    def fn(x):
        return torch.sin(x) * 2 + 1

    x = torch.randn(16)
    torch.testing.assert_close(torch.compile(fn)(x), fn(x))


def test_relu():
    def fn(x):
        return torch.relu(x) - x.cos()

    x = torch.randn(16)
    torch.testing.assert_close(torch.compile(fn)(x), fn(x))
'''

PLAIN_SUITE = """\
def test_nothing_to_compile():
    assert 1 + 1 == 2
"""


def make_suite(path: Path, source: str) -> Path:
    path.mkdir(parents=True)
    (path / "pytest.ini").write_text(PYTEST_INI)
    (path / "test_suite.py").write_text(source)
    return path


@dataclass
class JobRun:
    job: Job
    action: StepResult
    tests: StepResult | None

    @property
    def outputs(self) -> dict[str, str]:
        return self.action.outputs

    def report(self) -> dict[str, Any]:
        """The plugin's JSON report (written by the pytest step where the Action told it to)."""
        return dict(json.loads(Path(self.action.outputs["report"]).read_text()))

    def totals(self) -> dict[str, Any]:
        return dict(self.report()["totals"])


def run_job(
    root: Path, cache: FakeActionsCache, suite: Path, *, event: str, run_id: int,
    with_: Mapping[str, str] | None = None, env: Mapping[str, str] | None = None, tests: bool = True,
) -> JobRun:
    """``uses: ./`` (install: false: the plugin is installed here), ``python -m pytest -n 2``, job end."""
    venv_bin = str(Path(sys.executable).parent)
    job = Job(
        root=root, cache=cache, event=event, run_id=run_id, workspace=suite,
        env={"PATH": venv_bin + os.pathsep + os.environ["PATH"], **(env or {})},
    )
    action = job.use(str(REPO), {"install": "false", **(with_ or {})}, name="pytest-compilecache")
    result = job.run("python -m pytest -n 2 -q", name="tests", timeout=900) if tests and not job.failed else None
    job.finish()
    return JobRun(job=job, action=action, tests=result)


def step(run: JobRun, name: str) -> StepResult:
    return next(s for s in run.job.steps if s.name.startswith(name))


def assert_passed(run: JobRun) -> None:
    assert run.action.outcome == "success", "\n".join(f"{s.name}: {s.outcome}\n{s.stdout}" for s in run.job.steps)
    assert run.tests is not None and run.tests.outcome == "success", run.tests and run.tests.stdout
    assert run.job.warnings() == []


@pytest.fixture
def cache(tmp_path: Path) -> FakeActionsCache:
    return FakeActionsCache(tmp_path / "github-cache")


# ---- fast: the plumbing, without compiling


def test_a_run_that_compiles_nothing_saves_no_empty_entry(tmp_path: Path, cache: FakeActionsCache) -> None:
    suite = make_suite(tmp_path / "suite", PLAIN_SUITE)
    run = run_job(tmp_path, cache, suite, event="push", run_id=11)
    assert_passed(run)
    digest = run.outputs["key"].split("-")[2]
    assert run.outputs == {
        "cache-hit": "false",
        "restore-outcome": "miss",
        "matched-key": "",
        "key": f"compilecache-v1-{digest}-11-1",
        "cache-dir": str(run.job.temp / "compilecache-dir"),
        "report": str(run.job.temp / "compilecache-report.json"),
    }
    env = run.job.job_env
    assert env["PYTEST_COMPILECACHE_STORE"] == str(run.job.temp / "compilecache-staging")
    assert env["PYTEST_COMPILECACHE_RESTORE"] == "skip"
    assert env["PYTEST_COMPILECACHE_RUN_SUFFIX"] == "11-1"
    assert step(run, "Restore the compile cache (actions/cache/restore").outcome == "skipped"
    assert run.report()["save"]["outcome"] == "skipped"
    # The plugin wrote no bundle, so the staging dir is absent and actions/cache saves nothing.
    assert "Path Validation Error" in step(run, "Post Restore the compile cache").stdout
    assert cache.keys() == []
    assert "### torch.compile cache: restore" in run.job.summary


def test_cache_trouble_does_not_fail_the_job(
    tmp_path: Path, cache: FakeActionsCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: Any, **kwargs: Any) -> None:
        raise ConnectionError("cache service unavailable")

    monkeypatch.setattr(cache, "restore", broken)
    suite = make_suite(tmp_path / "suite", PLAIN_SUITE)
    run = run_job(tmp_path, cache, suite, event="pull_request", run_id=12)
    restore_step = step(run, "Restore the compile cache (actions/cache/restore")
    assert restore_step.outcome == "failure" and restore_step.commands == [("error", "cache service unavailable")]
    restore_step.commands.clear()  # continue-on-error: the job goes on
    assert_passed(run)
    assert run.outputs["restore-outcome"] == "miss"
    assert run.job.job_env["PYTEST_COMPILECACHE_READONLY"] == "true"
    assert "PYTEST_COMPILECACHE_STORE" not in run.job.job_env


def test_an_invalid_input_fails_the_job(tmp_path: Path, cache: FakeActionsCache) -> None:
    suite = make_suite(tmp_path / "suite", PLAIN_SUITE)
    run = run_job(tmp_path, cache, suite, event="push", run_id=13, with_={"mode": "warm"})
    assert run.action.outcome == "failure" and run.job.failed
    assert any("input mode: invalid value 'warm'" in m for m in run.job.warnings())
    assert step(run, "Unpack the compile cache").outcome == "skipped"


# ---- slow: real compiles, real bundles


@pytest.mark.slow
def test_github_store_push_push_pull_request(tmp_path: Path, cache: FakeActionsCache) -> None:
    suite = make_suite(tmp_path / "suite", COMPILED_SUITE)

    first = run_job(tmp_path, cache, suite, event="push", run_id=101)
    assert_passed(first)
    assert first.outputs["restore-outcome"] == "miss"
    totals = first.totals()
    assert totals["misses"] >= 2 and totals["hits"] == 0
    assert first.report()["save"]["key"] == first.outputs["key"]
    assert cache.keys() == [first.outputs["key"]]

    second = run_job(tmp_path, cache, suite, event="push", run_id=102)
    assert_passed(second)
    assert second.outputs["restore-outcome"] == "partial"
    assert second.outputs["matched-key"] == first.outputs["key"]
    totals = second.totals()
    assert totals["misses"] == 0 and totals["hits"] >= 2
    # Every graph hit the restored bundle: nothing new to save, so no new cache entry.
    assert second.report()["save"]["outcome"] == "skipped"
    assert cache.keys() == [first.outputs["key"]]
    summary = second.job.summary
    assert "### torch.compile cache: restore" in summary and f"partial: `{first.outputs['key']}`" in summary
    assert "### torch.compile cache: 100% hit rate" in summary
    assert summary.index("restore") < summary.index("100% hit rate")

    pull = run_job(tmp_path, cache, suite, event="pull_request", run_id=103)
    assert_passed(pull)
    assert pull.outputs["restore-outcome"] == "partial"
    assert pull.outputs["matched-key"] == first.outputs["key"]
    assert pull.totals()["misses"] == 0
    assert pull.report()["save"] is None
    assert "nothing: save: auto restores only on pull_request" in pull.job.summary
    assert cache.keys() == [first.outputs["key"]]  # no new entry


@pytest.mark.slow
@pytest.mark.integration
def test_s3_store_push_then_pull_request(tmp_path: Path, cache: FakeActionsCache, s3_bucket: Any) -> None:
    suite = make_suite(tmp_path / "suite", COMPILED_SUITE)
    store = f"s3://{s3_bucket.name}/ci/cache"
    env = {"AWS_ENDPOINT_URL": s3_bucket.endpoint_url}

    def bundles() -> list[str]:
        listing = s3_bucket.client.list_objects_v2(Bucket=s3_bucket.name, Prefix="ci/cache/")
        return sorted(item["Key"] for item in listing.get("Contents", []))

    first = run_job(tmp_path, cache, suite, event="push", run_id=201, with_={"store": store}, env=env)
    assert_passed(first)
    assert first.outputs["restore-outcome"] == "miss"
    assert first.totals()["misses"] >= 2
    assert first.job.job_env["PYTEST_COMPILECACHE_STORE"] == store
    assert bundles() == [f"ci/cache/{first.outputs['key']}.bundle"]

    pull = run_job(tmp_path, cache, suite, event="pull_request", run_id=202, with_={"store": store}, env=env)
    assert_passed(pull)
    assert pull.outputs["restore-outcome"] == "partial"
    assert pull.outputs["matched-key"] == first.outputs["key"]
    assert pull.totals()["misses"] == 0 and pull.totals()["hits"] >= 2
    assert "### torch.compile cache: 100% hit rate" in pull.job.summary
    assert f"| store | `{store}` |" in pull.job.summary
    assert bundles() == [f"ci/cache/{first.outputs['key']}.bundle"]  # nothing saved from the pull request
    assert cache.keys() == []  # and actions/cache was never involved
