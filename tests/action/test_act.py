"""The Action end to end, the way a runner runs it: nektos/act, the real ``@actions/cache`` client (bundled in the
Action's action/js/dist), a local cache service with GitHub's rules (see :mod:`tests.action.actrun` and
:mod:`tests.action.cache_server`). Every healthy run shows no warning annotation (:func:`shown_annotations`).

Every test here starts act and runs real jobs (a compiled suite: two tiny matmul models); they are marked
``action`` and ``slow``: ``pytest -m action`` selects them.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_compilecache import pch as headers
from tests import torchenv
from tests.action.actrun import ACTION
from tests.action.actrun import COLLECT
from tests.action.actrun import Act
from tests.action.actrun import action_copy
from tests.action.cache_server import CacheServer
from tests.action.cache_server import scopes_for
from tests.markdown import shown
from tests.plugin.helpers import settle_as_relatime_leaves_it

pytestmark = [pytest.mark.action, pytest.mark.slow]

PYTEST_INI = """\
[pytest]
addopts = -ra -p no:cacheprovider
filterwarnings =
    ignore::DeprecationWarning
"""

COMPILED_SUITE = """\
import torch


def test_matmul_relu():
    def fn(x, w):
        return torch.relu(x @ w)

    x, w = torch.randn(8, 8), torch.randn(8, 8)
    torch.testing.assert_close(torch.compile(fn)(x, w), fn(x, w))


def test_matmul_tanh():
    def fn(x, w):
        return torch.tanh(x @ w) + 1

    x, w = torch.randn(8, 8), torch.randn(8, 8)
    torch.testing.assert_close(torch.compile(fn)(x, w), fn(x, w))
"""

# One more compiled graph, for a run that restores and still saves a new bundle.
ANOTHER_GRAPH = """\
import torch


def test_matmul_sigmoid():
    def fn(x, w):
        return torch.sigmoid(x @ w) * 2

    x, w = torch.randn(8, 8), torch.randn(8, 8)
    torch.testing.assert_close(torch.compile(fn)(x, w), fn(x, w))
"""

# Two matmuls alone: TorchInductor calls extern kernels, so the FX graphs are cached and restored with no C++
# build and no precompiled header. For the scenarios about the Action's flow rather than what it carries.
MATMUL_SUITE = """\
import torch


def test_project():
    x, w = torch.randn(8, 4), torch.randn(4, 2)
    torch.testing.assert_close(torch.compile(lambda a, b: a @ b)(x, w), x @ w)


def test_gram():
    x = torch.randn(8, 4)
    torch.testing.assert_close(torch.compile(lambda a: a.t() @ a)(x), x.t() @ x)
"""

# A suite that never imports torch: for the scenarios about the restore alone (what the job does after a failed
# restore is proved by the outage test's compiled suite; here the job's pytest step costs no torch import).
PLAIN_SUITE = """\

def test_plain():
    assert sorted([2, 1]) == [1, 2]
"""

FAILING_TEST = """\

def test_fails():
    assert False, "this job's tests fail"
"""


def job(name: str, steps: str, *, matrix: str = "") -> str:
    """One job of a test workflow: the checkout, ``steps`` (YAML, indented as steps), then Collect.

    ``matrix``: one line of ``strategy.matrix`` (``shard: [0, 1]``): Collect names each leg's files."""
    strategy = f"    strategy:\n      matrix:\n        {matrix}\n" if matrix else ""
    checkout = "      - uses: actions/checkout@v7\n"
    return f"  {name}:\n    runs-on: ubuntu-latest\n{strategy}    steps:\n{checkout}{steps}{COLLECT}"


def workflow(
    *,
    jobs: tuple[str, ...] = ("test",),
    with_: str = "",
    uses: str = ACTION,
    tests: str = "python -m pytest -q",
    on: str = "[push, pull_request, merge_group]",
    matrix: str = "",
) -> str:
    """A workflow of ``jobs`` (same steps each): the Action (``id: cc``), the tests, Collect."""
    steps = f"""\
      - id: cc
        uses: {uses}
        with:
          install: "false"
{with_}
      - name: Tests
        id: tests
        run: {tests}
"""
    return f"on: {on}\njobs:\n" + "".join(job(name, steps, matrix=matrix) for name in jobs)


@pytest.fixture(scope="module")
def action_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return action_copy(tmp_path_factory.mktemp("action") / "pytest-compilecache")


@pytest.fixture
def server() -> Iterator[CacheServer]:
    with CacheServer() as service:
        yield service


@pytest.fixture
def act(tmp_path: Path, server: CacheServer, action_dir: Path) -> Act:
    runner = Act(tmp_path, server, action_dir)
    runner.write("pytest.ini", PYTEST_INI)
    runner.write("test_models.py", COMPILED_SUITE)
    return runner


def assert_succeeded(run: Any, job: str = "test") -> None:
    assert run.returncode == 0, run.log[-6000:]
    steps = run.steps(job)
    assert steps["cc"]["outcome"] == "success", run.log[-6000:]


def totals(run: Any, job: str = "test") -> dict[str, Any]:
    return dict(run.report(job)["totals"])


def fresh_runner(act: Act) -> dict[str, str]:
    """A new TMPDIR for one act run: torch keeps its precompiled header there, and a GitHub runner starts
    without one (act in host mode otherwise shares this machine's, which other runs filled)."""
    path = act.root / f"tmp-{act.runs + 1}"  # the next run's number
    path.mkdir()
    return {"TMPDIR": str(path)}


def runner_with_a_header_built_earlier(act: Act) -> tuple[dict[str, str], Path]:
    """The next run's environment (its own TMPDIR) on a runner that already holds torch's precompiled header,
    and that header: an earlier process (no job of this workflow) built it, and its times are as ``relatime``
    leaves them (:func:`~tests.plugin.helpers.settle_as_relatime_leaves_it`). The job's processes must find it
    by asking torch, not by access times."""
    env = fresh_runner(act)
    tmp = Path(env["TMPDIR"])
    code = "import torch\nx = torch.randn(8)\ntorch.compile(lambda a: torch.sin(a) + a)(x)\n"
    earlier = {**torchenv.inner_env(), "TMPDIR": str(tmp), "TORCHINDUCTOR_CACHE_DIR": str(act.root / "earlier")}
    subprocess.run([sys.executable, "-c", code], env=earlier, check=True, timeout=300, capture_output=True)
    (header,) = [path for path in headers.header_dir(tmp).iterdir() if headers.is_header_name(path.name)]
    settle_as_relatime_leaves_it(header)  # act and the Action's first steps take seconds before pytest starts
    return env, header


def shown_annotations(run: Any) -> list[str]:
    """The warning and error annotations of the run: every workflow command ``::warning``/``::error`` in its log
    (act echoes each step's output lines; GitHub would show each as a yellow or red annotation)."""
    return [line for line in run.log.splitlines() if re.search(r"::(warning|error)[ :]", line)]


def header_objects(server: CacheServer, key: str) -> list[str]:
    """The precompiled-header objects (``<prefix>-artifact-<sha256>.bundle``) inside the entry ``key``."""
    return [name for name in server.members(key) if "-artifact-" in name]


# ---- store: github


def test_push_push_pull_request_merge_group_and_a_failed_download(act: Act, server: CacheServer) -> None:
    """One lineage through the events that matter (one test: every job costs a torch import and act)."""
    # push to the default branch: a miss, compile, the plugin writes a bundle, actions/cache's post step saves it.
    # Every run is a runner of its own (its own TMPDIR). This first one already holds torch's precompiled header
    # (built before the job, its times as relatime leaves them: issue 24); the later ones start without one.
    env, built_earlier = runner_with_a_header_built_earlier(act)
    pinned = built_earlier.stat()
    first = act.run(workflow(), "push", env=env)
    assert_succeeded(first)
    out = first.outputs()
    assert out["restore-outcome"] == "miss"
    assert totals(first)["misses"] >= 2 and totals(first)["hits"] == 0
    # Fix 5: the job id is in the lineage. Fixes 1, 2 and 6: actions/cache@v5's post step found the bundle
    # through the literal workspace-relative path, under the version the restore computes.
    assert out["key"].startswith("compilecache-v1-test-")
    assert server.keys("refs/heads/main") == [out["key"]]
    # Issue 42: the post step says what it saved, in the log and the job summary; a miss shows no annotation.
    assert f"save: bundle entry {out['key']}: saved (" in first.log
    assert f"| bundle entry | saved: `{out['key']}`" in first.summary()
    assert shown_annotations(first) == []
    # The first run of a fingerprint: no header entry yet, so the header object rides in the bundle entry.
    assert first.report()["save"]["headers"]["named"] == 1
    (header,) = header_objects(server, out["key"])
    header_key = header[: -len(".bundle")]
    assert header_key.startswith("compilecache-v1-test-artifact-")
    # The header it carries is the one built before the job, which torch used as it was (not rebuilt).
    assert header_key.endswith(hashlib.sha256(built_earlier.read_bytes()).hexdigest())
    assert (built_earlier.stat().st_mtime_ns, built_earlier.stat().st_ino) == (pinned.st_mtime_ns, pinned.st_ino)

    # push again, one new test: the newest entry of the lineage (partial: another run's key). Issue 10: the
    # restore names the header entry's key; it misses, so the header comes from the bundle entry's copy and
    # the post step saves it under that exact key; the new bundle names the header but does not carry it.
    act.write("test_more.py", ANOTHER_GRAPH)
    second = act.run(workflow(), "push", env=fresh_runner(act))
    assert_succeeded(second)
    out2 = second.outputs()
    assert (out2["restore-outcome"], out2["matched-key"], out2["cache-hit"]) == ("partial", out["key"], "false")
    assert totals(second)["misses"] >= 1 and totals(second)["hits"] >= 2
    assert f"from the bundle entry; saved as {header_key} at job end" in second.log
    # Issue 42: the post step uploads both entries and says so: the real result, not a promise.
    assert f"| bundle entry | saved: `{out2['key']}`" in second.summary()
    assert f"| header entry | saved: `{header_key}`" in second.summary()
    assert shown_annotations(second) == []
    assert second.report()["save"]["headers"] == {**second.report()["save"]["headers"], "named": 1, "transferred": 0}
    assert sorted(server.keys()) == sorted([out["key"], header_key, out2["key"]])
    assert header_objects(server, out2["key"]) == []  # ~21 MiB less in every later bundle entry
    assert server.members(header_key) == [header]

    # pull_request: reads its base branch's entries, saves nothing (the post step has nothing to do); the
    # header comes from its own entry (exact key).
    pull = act.run(
        workflow(),
        "pull_request",
        payload={"number": 7, "pull_request": {"base": {"ref": "main"}}},
        env=fresh_runner(act),
    )
    assert_succeeded(pull)
    assert (pull.outputs()["restore-outcome"], pull.outputs()["matched-key"]) == ("partial", out2["key"])
    # Where the second push's upload shows: the next restore names the run whose entry it found.
    assert "(the newest saved: run 1002 attempt 1)" in shown(pull.summary())
    assert totals(pull)["misses"] == 0
    assert f"installed, from its cache entry {header_key}" in pull.log
    assert "nothing: save: auto restores only on pull_request" in shown(pull.summary())
    assert shown_annotations(pull) == [] and "torch.compile cache: save" not in pull.log
    assert sorted(server.keys()) == sorted([out["key"], header_key, out2["key"]])

    # merge_group (fix 3): restore only, though its token could write its temporary queue branch. Its lookup
    # finds main's newest entry, whose download then fails (fix 7): error, not miss (a lookup that found nothing
    # would be a miss), and min-hit-rate is not applied (fix 9; that it then cannot fail a job whose graphs all
    # compile cold is the outage test's, whose suite compiles). Its tests import no torch: one torch import less.
    server.fail_downloads = True
    act.write("test_flow.py", PLAIN_SUITE)
    queue = "refs/heads/gh-readonly-queue/main/pr-7-0123456789abcdef"
    merge = act.run(
        workflow(with_='          min-hit-rate: "0.9"', tests="python -m pytest -q test_flow.py"),
        "merge_group",
        scopes=scopes_for("merge_group", queue),
        payload={"merge_group": {"head_ref": queue, "base_ref": "refs/heads/main"}},
    )
    assert_succeeded(merge)
    assert merge.outputs()["restore-outcome"] == "error"
    summary = shown(merge.summary())
    assert "merge_group runs never save" in summary
    # Issue 42: the client's own reason, from its log, in the summary and the one annotation.
    assert "error: the cache client restored nothing: Failed to restore: " in summary
    assert "min-hit-rate 0.9 not applied: the restore failed" in summary
    (warning,) = shown_annotations(merge)
    assert "the cache client restored nothing: Failed to restore: " in warning
    assert merge.steps()["tests"]["outcome"] == "success"
    assert sorted(server.keys()) == sorted([out["key"], header_key, out2["key"]])


def test_an_outage_of_the_lookup_is_an_error_and_lifts_min_hit_rate_and_a_refused_upload_is_a_failure(
    act: Act, server: CacheServer
) -> None:
    """Issue 26: the cache service answers the lookup with 500 (the client retries it, then logs and gives up):
    outcome ``error``, one warning, ``min-hit-rate`` not applied (the summary says why), the job green; and one
    lookup per restore, so the retries are paid once. Issue 42: the service then refuses the new entry (429, the
    limit on new entries per minute): the post step says ``failed`` with the service's own reason, in one
    warning and the summary, and the job stays green."""
    act.write("test_models.py", MATMUL_SUITE)
    server.fail_lookups = True
    server.refuse_creates = 429
    run = act.run(workflow(with_='          min-hit-rate: "0.9"'), "push")
    assert run.returncode == 0, run.log[-6000:]
    steps = run.steps()
    assert (steps["cc"]["outcome"], steps["tests"]["outcome"]) == ("success", "success")
    assert run.outputs()["restore-outcome"] == "error"
    assert totals(run)["misses"] >= 2 and totals(run)["hits"] == 0
    summary = shown(run.summary())
    assert "error: the cache client restored nothing: Failed to restore: " in summary
    assert "Failed to make request after 5 attempts" in summary
    assert "min-hit-rate 0.9 not applied: the restore failed" in summary
    assert len(server.lookup_agents) == 5, server.lookup_agents  # one lookup, the client's 5 attempts
    key = run.outputs()["key"]
    assert "| bundle entry | failed: Failed to reserve cache: " in summary and "(429) Too Many Requests" in summary
    assert server.keys() == [] and "Job succeeded" in run.log
    restore_warning, save_warning = shown_annotations(run)
    assert "::warning title=compile cache::the cache client restored nothing: " in restore_warning
    assert f"::warning title=compile cache::save bundle entry {key}: failed: " in save_warning


@pytest.mark.parametrize(
    ("fault", "said"),
    [
        ("connection refused", "ECONNREFUSED"),
        (403, "(403) Forbidden: injected refusal of the cache service"),
        (429, "Rate limited: Failed request: (429) Too Many Requests: injected refusal of the cache service"),
    ],
)
def test_a_lookup_refused_at_once_is_an_error_not_a_miss(
    act: Act, server: CacheServer, fault: int | str, said: str
) -> None:
    """Issue 26: a service that refuses at once (no retries: the client logs the error and returns as for a miss)
    is not a miss. Issue 42: the Action's JavaScript reads the client's own words from its log (no probe step):
    outcome ``error``, one warning (the client's own is a plain line), ``min-hit-rate`` not applied, the job
    green."""
    act.write("test_models.py", PLAIN_SUITE)
    if fault == "connection refused":
        server.refuse_connections = True
    else:
        server.refuse_lookups = int(fault)
    run = act.run(workflow(with_='          min-hit-rate: "0.9"'), "push")
    assert run.returncode == 0, run.log[-6000:]
    steps = run.steps()
    assert (steps["cc"]["outcome"], steps["tests"]["outcome"]) == ("success", "success")
    assert run.outputs()["restore-outcome"] == "error"
    assert "@actions/cache: Failed to restore: " in run.log  # the client's own line, kept, not an annotation
    summary = shown(run.summary())
    assert "error: the cache client restored nothing: Failed to restore: " in summary and said in summary
    assert "min-hit-rate 0.9 not applied: the restore failed" in summary
    (warning,) = shown_annotations(run)
    assert warning.count("::warning title=compile cache::the cache client restored nothing") == 1 and said in warning
    if fault != "connection refused":  # one lookup, not retried
        assert len(server.lookup_agents) == 1, server.lookup_agents


# The user's own composite action that wraps pytest-compilecache and pytest, forwarding the outputs it uses.
USERS_COMPOSITE = f"""\
name: tests
description: the user's own composite action that wraps pytest-compilecache
outputs:
  key: {{value: "${{{{ steps.compile-cache.outputs.key }}}}"}}
  matched-key: {{value: "${{{{ steps.compile-cache.outputs.matched-key }}}}"}}
  report: {{value: "${{{{ steps.compile-cache.outputs.report }}}}"}}
runs:
  using: composite
  steps:
    - id: compile-cache
      uses: {ACTION}
      with:
        install: "false"
    - shell: bash
      run: python -m pytest -q unit
"""


def test_a_red_job_saves_only_with_save_on_failure_and_the_next_push_restores_it(act: Act, server: CacheServer) -> None:
    """The cache never decides the job's outcome. Issue 42: with ``save-on-failure: true`` a red job saves to
    ``store: github`` too (the post step runs after a failed job when told: action.yml's ``post-if``), and the
    next push restores it; without it (the default, as actions/cache) a red job saves nothing (issue 26: one
    policy for every store), and its post step does not run, unless the tests passed and only the plugin's
    own hit-rate floor failed the job."""
    act.write("test_models.py", MATMUL_SUITE)
    act.write("test_failing.py", FAILING_TEST)
    opted = act.run(workflow(with_='          save-on-failure: "true"'), "push")
    assert opted.returncode != 0
    steps = opted.steps()
    assert (steps["cc"]["outcome"], steps["tests"]["outcome"]) == ("success", "failure")
    assert opted.outputs()["restore-outcome"] == "miss" and len(server.lookup_agents) == 1
    assert totals(opted)["misses"] >= 2  # the plugin reported despite the failure
    key = opted.outputs()["key"]
    assert server.keys() == [key] and f"| bundle entry | saved: `{key}`" in opted.summary()
    assert shown_annotations(opted) == []

    act.write("test_more.py", OTHER_LEG_SUITE)  # one new graph (no C++ build): something the red job could save
    red = act.run(workflow(), "push")
    assert red.returncode != 0 and red.steps()["tests"]["outcome"] == "failure"
    assert (red.outputs()["restore-outcome"], red.outputs()["matched-key"]) == ("partial", key)
    assert totals(red)["misses"] >= 1 and totals(red)["hits"] >= 2
    save = red.report()["save"]
    assert (save["outcome"], save["message"]) == ("skipped", "the tests failed: nothing saved (input save-on-failure)")
    assert "Run Post compilecache/pytest-compilecache@v1" not in red.log  # post-if: the job failed
    assert server.keys() == [key]

    # The tests pass but miss the graph the red job could not save, under min-hit-rate: the plugin staged its
    # bundle and fails the job on its floor. It tells post-if, so the post step uploads what a direct store
    # would have saved by then; the next run restores it instead of failing on the same misses for good.
    (act.workspace / "test_failing.py").unlink()
    floor = act.run(workflow(with_='          min-hit-rate: "0.9"'), "push")
    assert floor.returncode != 0 and floor.steps()["tests"]["outcome"] == "failure"
    assert (floor.outputs()["restore-outcome"], floor.outputs()["matched-key"]) == ("partial", key)
    assert floor.report()["save"]["outcome"] == "staged" and floor.report()["errors"]
    assert "Run Post compilecache/pytest-compilecache@v1" in floor.log
    assert sorted(server.keys()) == sorted([key, floor.outputs()["key"]])


# ---- store: s3


@pytest.mark.integration
def test_s3_store_push_then_pull_request(act: Act, server: CacheServer, s3_bucket: Any) -> None:
    store = f"s3://{s3_bucket.name}/ci/cache"
    env = {
        "AWS_ENDPOINT_URL": s3_bucket.endpoint_url,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }

    def bundles() -> list[str]:
        listing = s3_bucket.client.list_objects_v2(Bucket=s3_bucket.name, Prefix="ci/cache/")
        return sorted(item["Key"] for item in listing.get("Contents", []))

    # The Action's flow with an S3 store: matmuls need no C++ build, so no header (the plugin's S3 header
    # objects are tested in tests/integration/test_store_s3.py).
    act.write("test_models.py", MATMUL_SUITE)
    first = act.run(workflow(with_=f"          store: {store}"), "push", env=env)
    assert_succeeded(first)
    key = first.outputs()["key"]
    assert bundles() == [f"ci/cache/{key}.bundle"]
    pull = act.run(
        workflow(with_=f"          store: {store}"),
        "pull_request",
        env=env,
        payload={"number": 2, "pull_request": {"base": {"ref": "main"}}},
    )
    assert_succeeded(pull)
    assert (pull.outputs()["restore-outcome"], pull.outputs()["matched-key"]) == ("partial", key)
    assert totals(pull)["misses"] == 0
    assert bundles() == [f"ci/cache/{key}.bundle"]
    assert server.requests == []  # actions/cache was never involved
    # Issue 26, a red run on S3: the Action hands the plugin one save policy for every store
    # (tests/action/test_main.py::test_one_save_policy_for_every_store), which a real session follows
    # (test_the_plugin_saves_nothing_after_failed_tests_when_told); the red job under act is store github's.


# ---- jobs and matrix legs with one fingerprint (issue 26, point 1)

# A matrix leg's own graph: a matmul with a transposed operand (an extern kernel: no C++ build).
OTHER_LEG_SUITE = """\
import torch


def test_cross():
    x, w = torch.randn(4, 8), torch.randn(4, 2)
    torch.testing.assert_close(torch.compile(lambda a, b: a.t() @ b)(x, w), x.t() @ w)
"""

# Input pgo, seen from the pytest step: the plugin read PYTEST_COMPILECACHE_PGO from GITHUB_ENV and gave torch
# its job id before any test imported torch; the id names the leg's key prefix (its lineage's own profile).
PGO_SEEN = """\
import os


def test_the_plugin_gave_torch_a_job_id():
    prefix = os.environ["PYTEST_COMPILECACHE_KEY_PREFIX"]
    assert os.environ.get("TORCH_COMPILE_JOB_ID") == "pytest-compilecache-" + prefix
"""

# Job "unit" runs the Action inside the user's composite action (tests in unit/); job "models" uses it directly,
# with input pgo, in two legs of strategy.matrix (each runs its own file of legs/ and the pgo check).
JOBS_AND_LEGS = workflow(
    jobs=("models",),
    on="[push]",
    matrix="shard: [0, 1]",
    with_='          pgo: "true"',
    tests="python -m pytest -q legs/test_leg${{ matrix.shard }}.py legs/test_pgo.py",
).replace("jobs:\n", "jobs:\n" + job("unit", "      - id: cc\n        uses: ./.github/actions/tests\n"), 1)


def test_jobs_and_matrix_legs_with_one_fingerprint_keep_their_own_lineages(act: Act, server: CacheServer) -> None:
    """Three lineages of one fingerprint in one workflow, over two pushes: a job whose Action runs inside a user's
    composite action, and the two legs of a ``strategy.matrix`` job. Each saves and restores its own entry (and
    its own precompiled-header entry where it builds C++): a leg reaches its key through the Action's
    ``matrix-leg`` input, whose default (``toJSON(matrix)``) act evaluates as GitHub does (it does not in a
    composite step's ``env:``). The legs run with input ``pgo`` (their tests see torch's job id), which every
    bundle then carries: the second push still hits every graph."""
    # A C++ build in "unit" and in leg 0 (a header to save per lineage), matmuls alone in leg 1.
    act.write("unit/test_unit_models.py", MATMUL_SUITE)
    act.write("unit/test_unit_more.py", ANOTHER_GRAPH)
    act.write("legs/test_leg0.py", MATMUL_SUITE + ANOTHER_GRAPH.replace("import torch\n", "", 1))
    act.write("legs/test_leg1.py", OTHER_LEG_SUITE)
    act.write("legs/test_pgo.py", PGO_SEEN)
    act.write(".github/actions/tests/action.yml", USERS_COMPOSITE)
    jobs = ("unit", "models-0", "models-1")
    first = act.run(JOBS_AND_LEGS, "push", env=fresh_runner(act))
    assert first.returncode == 0, first.log[-6000:]
    keys = {job: first.outputs(job)["key"] for job in jobs}
    assert keys["unit"].startswith("compilecache-v1-unit-"), keys
    assert keys["models-0"].startswith("compilecache-v1-models-") and keys["models-1"].startswith(
        "compilecache-v1-models-"
    ), keys
    assert keys["models-0"] != keys["models-1"], keys
    assert sorted(server.keys()) == sorted(keys.values())  # a first run's header rides in its bundle entry
    assert "Unable to reserve cache" not in first.log

    # Every graph hits, and the headers came with the bundle entries: nothing new, so no bundle is written and
    # the post step saves no empty entry, and says why (issue 42: no warning on a healthy warm push); each
    # lineage that built C++ saves its own header entry.
    second = act.run(JOBS_AND_LEGS, "push", env=fresh_runner(act))
    assert second.returncode == 0, second.log[-6000:]
    assert second.outputs("unit")["matched-key"] == keys["unit"]  # what the user's composite action forwards
    for job in jobs:
        out = second.outputs(job)
        if job != "unit":
            assert (out["restore-outcome"], out["matched-key"]) == ("partial", keys[job]), (job, out)
        assert totals(second, job)["misses"] == 0 and totals(second, job)["hits"] >= 1, totals(second, job)
        assert second.report(job)["save"]["outcome"] == "skipped", (job, second.report(job)["save"])
        assert f"save: bundle entry {out['key']}: not needed: " in second.log
    assert totals(second, "unit")["hits"] >= 3 and totals(second, "models-0")["hits"] >= 3
    assert shown_annotations(second) == [] and "Path Validation Error" not in second.log
    assert "100% hit rate" in second.summary()
    # <lineage>-<digest>-<run id>-<attempt>: the header entries' lineages, unit's and leg 0's (leg 1 built no C++)
    saved = server.keys()
    lineages = sorted(key.split("-artifact-")[0] for key in saved if "-artifact-" in key)
    assert lineages == sorted(keys[job].rsplit("-", 3)[0] for job in ("unit", "models-0")), (lineages, keys)
