"""Two pytest sessions compiling into one shared dir at the same time (one of them with xdist workers)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.plugin.helpers import ENV_CONFTEST
from tests.plugin.helpers import MATMUL_SUITE
from tests.plugin.helpers import check_report
from tests.plugin.helpers import run_inner


@pytest.mark.slow
def test_two_sessions_at_once_share_a_dir(inner: pytest.Pytester) -> None:
    inner.makeconftest(ENV_CONFTEST)
    inner.makepyfile(test_suite=MATMUL_SUITE)
    cache = inner.path / "cache"
    shared = ["--compile-cache=shared", f"--compile-cache-dir={cache}"]
    sessions = {"plain": [], "xdist": ["-n", "2"]}

    processes = {
        name: subprocess.Popen(
            [sys.executable, "-m", "pytest", *shared, *extra, f"--basetemp={inner.path / ('tmp-' + name)}",
             f"--compile-cache-json={inner.path / (name + '.json')}"],
            cwd=inner.path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for name, extra in sessions.items()
    }
    outputs = {}
    for name, process in processes.items():
        with process:
            outputs[name] = process.communicate(timeout=300)[0]

    for name, process in processes.items():
        assert process.returncode == 0, outputs[name]
        report = json.loads((inner.path / (name + ".json")).read_text())
        check_report(report)
        assert report["totals"]["compiled_tests"] == 2
        assert report["warnings"] == []

    after = run_inner(inner, *shared, json_name="after.json")

    assert after.ret == 0, after.output
    assert (after.totals["hits"], after.totals["misses"], after.totals["hit_rate"]) == (2, 0, 1.0)
