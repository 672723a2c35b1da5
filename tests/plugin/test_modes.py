"""The three modes, the marker and the fixture, each in one process and with two xdist workers.

Every test here compiles for real on the CPU (seconds each), hence ``slow``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.plugin.helpers import ENV_CONFTEST
from tests.plugin.helpers import MATMUL_SUITE
from tests.plugin.helpers import TRAINING_MATMUL_SUITE
from tests.plugin.helpers import XDIST
from tests.plugin.helpers import check_report
from tests.plugin.helpers import read_envlog
from tests.plugin.helpers import run_inner

pytestmark = [XDIST, pytest.mark.slow]

GITHUB_SUMMARY_LIMIT = 1024 * 1024


def _workers(dist: tuple[str, ...]) -> set[str]:
    """Where the two tests of a two-test suite run: xdist hands one to each worker."""
    return {"gw0", "gw1"} if dist else {"controller"}


def test_shared_cold_then_warm(inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, dist: tuple[str, ...]) -> None:
    inner.makepyfile(test_suite=TRAINING_MATMUL_SUITE)
    cache = inner.path / "cache"
    summary = inner.path / "step-summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    args = ("--compile-cache=shared", f"--compile-cache-dir={cache}", "--compile-cache-min-hit-rate=0.9", *dist)

    cold = run_inner(inner, *args, json_name="cold.json")

    # Every test passed, yet the session fails: the hit rate is under the floor.
    cold.result.assert_outcomes(passed=2)
    assert cold.ret == pytest.ExitCode.TESTS_FAILED
    cold.result.stdout.fnmatch_lines(["compile cache FAILED: hit rate 0% is below --compile-cache-min-hit-rate=0.9"])
    check_report(cold.data)
    assert (cold.data["mode"], cold.data["cache_dir"]) == ("shared", str(cache))
    assert cold.totals["hits"] == 0
    assert cold.totals["misses"] > 0
    assert {t["worker"] for t in cold.data["tests"]} == _workers(dist)

    warm = run_inner(inner, *args, "--compile-cache-report=full", json_name="warm.json")

    assert warm.ret == pytest.ExitCode.OK, warm.output
    check_report(warm.data)
    assert warm.totals["fxgraph"]["miss"] == 0
    assert warm.totals["hits"] == cold.totals["misses"]
    assert warm.totals["aotautograd"]["hit"] == cold.totals["aotautograd"]["miss"] > 0
    assert warm.totals["hit_rate"] == 1.0
    warm.result.stdout.fnmatch_lines([f"compile cache: {warm.totals['hits']} hits, 0 misses (100%)*dir shared:*"])
    assert f"dir shared:{cache}" in warm.result.stdout.str()
    # The full report's table: one row per compiled test, all FX lookups hits.
    warm.result.stdout.fnmatch_lines(
        ["* seconds  fx hit/miss/byp  aot hit/miss  frames  test", "* 1/0/0 * 1/0 * 1  test_suite.py::test_activation"],
    )

    # Both sessions appended to the step summary, in order.
    text = summary.read_text()
    assert len(text.encode()) < GITHUB_SUMMARY_LIMIT
    headlines = [line for line in text.splitlines() if line.startswith("### ")]
    assert headlines == ["### torch.compile cache: 0% hit rate", "### torch.compile cache: 100% hit rate"]
    warm_part = text[text.index(headlines[1]) :]
    fx, aot = warm.totals["fxgraph"], warm.totals["aotautograd"]
    assert f"| FX graph | {fx['hit']} | 0 | 0 | - |" in warm_part
    assert f"| AOTAutograd | {aot['hit']} | 0 | {aot['bypass']} | {aot['guard_miss']} |" in warm_part
    assert "<details><summary>Slowest compiling tests (2)</summary>" in warm_part


# The fixture's suite, run beside MATMUL_SUITE in one isolated session: its own graphs (other shapes than
# MATMUL_SUITE's, so no test hits what another compiled in the same dir).
STATS_SUITE = """
import pathlib

import torch


def project(x, w):
    return x @ w


def gram(x):
    return x.t() @ x


def outer(x):
    return x @ x.t()


def test_reads_its_own_compile(compile_cache_stats):
    assert compile_cache_stats.frames == 0
    torch.compile(project)(torch.randn(5, 3), torch.randn(3, 2))
    assert compile_cache_stats.frames >= 1
    pathlib.Path(__file__).with_name("seen-misses.txt").write_text(str(compile_cache_stats.fxgraph["miss"]))


def test_no_recompile(compile_cache_stats):
    compiled = torch.compile(gram, dynamic=False)
    compiled(torch.randn(7, 3))
    compiled(torch.randn(7, 3))
    assert compile_cache_stats.frames == 1
    assert compile_cache_stats.recompiles == 0


def test_shape_change_recompiles(compile_cache_stats):
    compiled = torch.compile(outer, dynamic=False)
    compiled(torch.randn(8, 4))
    compiled(torch.randn(6, 4))
    assert compile_cache_stats.recompiles >= 1
"""


def test_isolated_compiles_cold_every_time_in_one_dir(
    inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, dist: tuple[str, ...]
) -> None:
    inner.makeconftest(ENV_CONFTEST)
    inner.makepyfile(test_suite=MATMUL_SUITE)

    first = run_inner(inner, "--compile-cache=isolated", *dist, json_name="first.json")

    assert first.ret == 0, first.output
    check_report(first.data)
    assert first.data["mode"] == "isolated"
    assert (first.totals["hits"], first.totals["misses"]) == (0, 2)
    session_dir = first.data["cache_dir"]
    assert not os.path.exists(session_dir)
    # Workers compile into their controller's dir, not into fresh dirs of their own.
    env = read_envlog(inner.path)
    assert {env[t]["worker"] for t in ("project", "gram")} == _workers(dist)
    assert {t["worker"] for t in first.data["tests"]} == _workers(dist)
    assert {env[t]["TORCHINDUCTOR_CACHE_DIR"] for t in ("project", "gram")} == {session_dir}

    if dist:
        # What the second session shows is the controller's (the kept dir, the summary switched off) or each
        # process's own (the fixture reads its process's counts): once, in one process. The first session
        # showed that workers compile into the dir their controller chose.
        return

    # Again, into a kept dir under a parent of our choosing, with the fixture's suite beside the first and a
    # step summary that is switched off (one session for three claims: each session costs a torch import).
    inner.makepyfile(test_stats=STATS_SUITE)
    summary = inner.path / "step-summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    parent = inner.path / "isolated"
    second = run_inner(
        inner,
        "--compile-cache=isolated",
        f"--compile-cache-dir={parent}",
        "--compile-cache-keep",
        "--compile-cache-summary=off",
        json_name="second.json",
    )

    second.result.assert_outcomes(passed=5)
    assert second.ret == 0, second.output
    check_report(second.data)
    assert second.totals["hits"] == 0
    assert [second.record(t)["fxgraph"]["miss"] for t in ("test_project", "test_gram")] == [1, 1]
    kept = Path(second.data["cache_dir"])
    assert kept.parent == parent
    assert kept != Path(session_dir)
    assert (kept / "CACHEDIR.TAG").is_file()
    assert any(p.is_file() for p in (kept / "fxgraph").rglob("*"))

    # --compile-cache-summary=off: a session worth a summary writes none.
    assert second.totals["compiled_tests"] == 5
    assert not summary.exists()

    # The compile_cache_stats fixture: each test reads its own counts, as the report records them.
    seen = int((inner.path / "seen-misses.txt").read_text())
    assert seen == second.record("test_reads_its_own_compile")["fxgraph"]["miss"] == 1
    assert second.record("test_no_recompile")["recompiles"] == 0
    assert second.record("test_shape_change_recompiles")["recompiles"] >= 1


def test_disabled_makes_no_cache_lookups(inner: pytest.Pytester, dist: tuple[str, ...]) -> None:
    inner.makeconftest(ENV_CONFTEST)
    inner.makepyfile(test_suite=MATMUL_SUITE)

    run = run_inner(inner, "--compile-cache=disabled", *dist)

    assert run.ret == 0, run.output
    check_report(run.data)
    assert (run.data["mode"], run.data["cache_dir"]) == ("disabled", None)
    assert run.totals["frames"] == 2  # both tests compiled...
    fx, aot = run.totals["fxgraph"], run.totals["aotautograd"]
    assert fx["hit"] + fx["miss"] == 0  # ...without asking a cache
    assert aot["hit"] + aot["miss"] == 0
    env = read_envlog(inner.path)
    assert [env[t]["TORCHINDUCTOR_FORCE_DISABLE_CACHES"] for t in ("project", "gram")] == ["1", "1"]


MARKER_SUITE = """
import pytest
import torch


def project(x, w):
    return x @ w


def compile_project():
    x, w = torch.randn(8, 4), torch.randn(4, 2)
    torch.testing.assert_close(torch.compile(project)(x, w), project(x, w))


def test_twin():
    compile_project()


@pytest.mark.compile_cache("isolated")
def test_marked(env_log):
    env_log("during-marked")
    compile_project()


def test_later(env_log):
    env_log("later")
"""


def test_isolated_marker_compiles_cold_in_a_warm_dir(inner: pytest.Pytester, dist: tuple[str, ...]) -> None:
    inner.makeconftest(ENV_CONFTEST)
    inner.makepyfile(test_suite=MARKER_SUITE)
    cache = inner.path / "cache"
    shared = ("--compile-cache=shared", f"--compile-cache-dir={cache}")
    warm_up = run_inner(inner, *shared, "-k", "test_twin", json_name="warm-up.json")
    assert (warm_up.ret, warm_up.totals["misses"]) == (0, 1), warm_up.output

    run = run_inner(inner, *shared, *dist)

    assert run.ret == 0, run.output
    check_report(run.data)
    assert run.record("test_twin")["fxgraph"] == {"hit": 1, "miss": 0, "bypass": 0}
    assert run.record("test_marked")["fxgraph"] == {"hit": 0, "miss": 1, "bypass": 0}
    env = read_envlog(inner.path)
    fresh = env["during-marked"]["TORCHINDUCTOR_CACHE_DIR"]
    assert fresh not in (None, str(cache))
    assert not os.path.exists(fresh)
    # Put back right after the marked test, in its own process, and for whatever runs next.
    assert env["after-test_marked"]["TORCHINDUCTOR_CACHE_DIR"] == str(cache)
    assert env["after-test_marked"]["worker"] == env["during-marked"]["worker"]
    assert env["later"]["TORCHINDUCTOR_CACHE_DIR"] == str(cache)
