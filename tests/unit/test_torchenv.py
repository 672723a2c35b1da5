"""The environment every process the suite starts gets (tests/torchenv.py, tests/site/sitecustomize.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests import torchenv

PROBE = """
import gc, json, os, sys
print(json.dumps({
    "site": getattr(sys.modules.get("sitecustomize"), "__file__", None),
    "hooks": [getattr(hook, "__name__", "") for hook in gc.callbacks],
    "next": "NEXT_RAN" in os.environ,
}))
"""


def test_the_site_dir_goes_first_once_and_keeps_the_rest() -> None:
    site = torchenv.SITE
    assert torchenv.python_path(None) == site
    assert torchenv.python_path(os.pathsep.join(["/a", site, "/b"])) == os.pathsep.join([site, "/a", "/b"])
    env = {"PYTHONPATH": "/a"}
    torchenv.apply(env)
    torchenv.apply(env)
    assert env["PYTHONPATH"] == os.pathsep.join([site, "/a"])
    assert torchenv.inner_env({"PYTHONPATH": "/a", "TORCHINDUCTOR_X": "1"})["PYTHONPATH"] == env["PYTHONPATH"]


def test_a_started_process_freezes_survivors_and_still_runs_a_later_sitecustomize(tmp_path: Path) -> None:
    later = tmp_path / "later"
    later.mkdir()
    (later / "sitecustomize.py").write_text("import os\nos.environ['NEXT_RAN'] = '1'\n")
    env = torchenv.inner_env()
    env["PYTHONPATH"] = torchenv.python_path(os.pathsep.join([str(later), env.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    found = json.loads(done.stdout)
    assert found["site"] == str(Path(torchenv.SITE) / "sitecustomize.py")
    assert found["hooks"] == ["_freeze_survivors"]
    assert found["next"] is True


COLLECT = """
import sys

import pytest

status = pytest.main(["--collect-only", "-q", "-p", "no:xdist", "-p", "no:cacheprovider", "tests"])
print("STATUS", int(status), "TORCH_IMPORTED", "torch" in sys.modules)
"""


def test_collecting_the_suite_imports_no_torch_and_names_every_in_process_torch_test() -> None:
    """Every xdist worker collects every module: an import of torch there costs each worker seconds before its
    first test. The tests that import torch in the test process are named in torchenv.IN_PROCESS (one worker runs
    them); each prefix there must still name a test."""
    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", COLLECT],
        cwd=repo,
        env=torchenv.inner_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    lines = done.stdout.splitlines()
    # Collected without xdist too (`-p no:xdist`, as scripts/test.sh allows): tests/conftest.py's xdist hook is
    # optional.
    assert (lines[-1] if lines else "") == "STATUS 0 TORCH_IMPORTED False", done.stdout[-3000:] + done.stderr[-3000:]
    collected = [line for line in lines if "::" in line]
    assert len(collected) > 1000, done.stdout[-3000:]
    for prefix in torchenv.IN_PROCESS:
        assert any(nodeid.startswith(prefix) for nodeid in collected), prefix
