"""xdist workers that do not report back: the controller says so and the session goes on."""

from __future__ import annotations

import pytest

from tests.markdown import shown
from tests.plugin.helpers import ENV_CONFTEST
from tests.plugin.helpers import MATMUL_SUITE
from tests.plugin.helpers import check_report
from tests.plugin.helpers import run_inner

# Runs after the plugin's own sessionfinish has filled workeroutput, before xdist sends it (xdist's
# hook is a wrapper): gw0 then reaches the controller without the plugin's payload, like a worker whose
# plugin never finished.
SILENCE_GW0 = """
import pytest


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session):
    config = session.config
    if getattr(config, "workerinput", {}).get("workerid") == "gw0":
        del config.workeroutput["compilecache"]
"""


@pytest.mark.slow
def test_silent_worker_is_reported_not_a_crash(inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    inner.makeconftest(ENV_CONFTEST + SILENCE_GW0)
    inner.makepyfile(test_suite=MATMUL_SUITE)
    summary = inner.path / "step-summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))

    run = run_inner(inner, "--compile-cache=shared", f"--compile-cache-dir={inner.path / 'cache'}", "-n", "2")

    assert run.ret == 0, run.output
    run.result.assert_outcomes(passed=2)
    check_report(run.data)
    assert run.data["silent_workers"] == ["gw0"]
    run.result.stdout.fnmatch_lines(["workers that sent no statistics: gw0"])
    assert "- workers that sent no statistics: gw0" in shown(summary.read_text())
