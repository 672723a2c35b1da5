"""The Action's JavaScript (action/js) through node's own test runner: its unit tests (``node --test``), which
need no npm package (the cache client and the Python side are fakes; test/python.test.js runs real processes).

The end-to-end runs with the real ``@actions/cache`` are test_act.py's; eslint and the check that the committed
``dist/`` is what ``src/`` and the lockfile build are in scripts/lint.sh.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.servers import require_binary_or_fail

JS = Path(__file__).resolve().parents[2] / "action" / "js"


def test_the_javascript_unit_tests_pass() -> None:
    node = require_binary_or_fail("node")
    files = sorted(str(path.relative_to(JS)) for path in (JS / "test").glob("*.test.js"))
    assert len(files) >= 3, files
    done = subprocess.run([node, "--test", *files], cwd=JS, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert "# fail 0" in done.stdout and "# pass 0" not in done.stdout, done.stdout[-2000:]
