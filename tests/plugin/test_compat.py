"""What users on another torch see: bundles never cross torch versions (the demo's round trip on each torch
is tests/plugin/test_demo.py, also in the compat subset).

These run in the compat subset (tests/conftest.py), which CI runs on the oldest, default and newest torch.
The cross-version test needs a second interpreter with another torch: ``COMPILECACHE_OTHER_PYTHON``
(``.ci/run`` points it at another per-version venv). Without it the test skips locally and fails under CI=true.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests import torchenv
from tests.servers import require_binary_or_fail

OTHER_PYTHON_ENV = "COMPILECACHE_OTHER_PYTHON"

_OUTER_ENV_PREFIXES = (*torchenv.OUTER_PREFIXES, "PYTEST_")  # and any other pytest setting of the outer session


def _clean_env(tmp: Path) -> dict[str, str]:
    """The outer session's environment without its cache settings, with a new TMPDIR (a fresh runner)."""
    env = torchenv.inner_env(prefixes=_OUTER_ENV_PREFIXES)
    tmp.mkdir(parents=True, exist_ok=True)
    env["TMPDIR"] = str(tmp)
    return env


def _session(python: str, cwd: Path, tmp: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    report = tmp.parent / (tmp.name + ".json")
    proc = subprocess.run(
        [python, "-m", "pytest", "-p", "no:cacheprovider", f"--compile-cache-json={report}", *args],
        cwd=cwd,
        env=_clean_env(tmp),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert report.exists(), proc.stdout + proc.stderr
    return proc, json.loads(report.read_text())


def _torch_version(python: str) -> str:
    code = "import torch; print(torch.__version__)"
    return subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


# A matmul (an extern kernel, no C++ build): the bundle holds its FX entry; what matters is whose torch made it.
BUNDLED_SUITE = """
import torch


def test_compiled():
    fn = torch.compile(lambda x, w: x @ w)
    x, w = torch.randn(8, 4), torch.randn(4, 2)
    torch.testing.assert_close(fn(x, w), x @ w)
"""


@pytest.mark.slow
def test_bundle_from_another_torch_is_never_offered(inner: pytest.Pytester, tmp_path: Path) -> None:
    """Saved with this torch, restored with another: a miss whose explanation names the torch versions."""
    other = os.environ.get(OTHER_PYTHON_ENV, "")
    if not other:
        reason = f"{OTHER_PYTHON_ENV} is not set (a python with another torch; .ci/run sets it)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(reason + " (CI=true: required)", pytrace=False)
        pytest.skip(reason)
    other = require_binary_or_fail(other)
    ours, theirs = _torch_version(sys.executable), _torch_version(other)
    assert ours != theirs, f"{OTHER_PYTHON_ENV} has the same torch ({ours}): it proves nothing"
    inner.makepyfile(test_bundled=BUNDLED_SUITE)
    store = tmp_path / "store"

    saved_proc, saved = _session(sys.executable, inner.path, tmp_path / "save", f"--compile-cache-store={store}")
    assert saved_proc.returncode == 0, saved_proc.stdout + saved_proc.stderr
    assert saved["save"]["outcome"] == "saved", saved["save"]

    proc, restored = _session(other, inner.path, tmp_path / "restore", f"--compile-cache-store={store}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert restored["restore"]["outcome"] == "miss", restored["restore"]
    assert f"torch: {ours} -> {theirs}" in restored["restore"]["message"], restored["restore"]
    # Nothing from the other torch was loaded: the graph compiled cold.
    assert restored["totals"]["fxgraph"]["hit"] == 0 and restored["totals"]["misses"] > 0, restored["totals"]
