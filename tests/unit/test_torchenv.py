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
