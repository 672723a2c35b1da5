"""The plugin carries torch's precompiled header through a store: a fresh runner never builds it.

Machine ``a`` (its own TMPDIR) compiles the training suite from an empty cache dir, builds the header and
saves a bundle to a directory store; the header goes in as its own content-addressed object. Fresh machines
(new TMPDIR, empty cache dir, same store) restore: the header is in their header dir before the first test
runs, the JSON report counts it, and gcc never builds it (torch still preprocesses it in every process: that
is how it looks the file up). One fresh machine runs plainly in ``shared`` mode, one with ``-n 2`` in
``isolated`` mode. gcc is watched through the ``g++`` shim of tests/plugin/test_headers.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from pytest_compilecache import headers
from pytest_compilecache.stores import LocalStore
from pytest_compilecache.stores.base import is_artifact_key
from tests.plugin.helpers import TRAINING_SUITE
from tests.plugin.test_headers import SHIM
from tests.plugin.test_headers import header_builds
from tests.plugin.test_headers import torch_builds_precompiled_headers

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not torch_builds_precompiled_headers(), reason="this torch builds no precompiled header"),
]

# Runs first without xdist (-p no:randomly, file order): what the header dir holds before any compile.
PROBE = """
import json
import os

from pytest_compilecache import headers


def test_header_dir_before_compiling(request):
    directory = headers.header_dir()
    names = sorted(p.name for p in directory.iterdir() if headers.is_header_name(p.name)) if directory.is_dir() else []
    (request.config.rootpath / ("probe-" + os.environ["PROBE_LABEL"] + ".json")).write_text(json.dumps(names))
"""


def test_a_fresh_runner_gets_the_header_from_the_store(
    inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    shims = tmp_path / "shims"
    shims.mkdir()
    (shims / "g++").write_text(SHIM)
    (shims / "g++").chmod(0o755)
    inner.makepyfile(test_0_probe=PROBE, test_training=TRAINING_SUITE)
    store = tmp_path / "store"
    real_path = os.environ["PATH"]

    def machine(name: str, *args: str) -> tuple[dict[str, Any], str, list[str]]:
        root = tmp_path / name
        (root / "tmp").mkdir(parents=True)
        log, report = root / "g++.log", root / "report.json"
        monkeypatch.setenv("TMPDIR", str(root / "tmp"))
        monkeypatch.setenv("PATH", f"{shims}:{real_path}")
        monkeypatch.setenv("HEADER_TEST_REALPATH", real_path)
        monkeypatch.setenv("HEADER_TEST_LOG", str(log))
        monkeypatch.setenv("PROBE_LABEL", name)
        result = inner.runpytest_subprocess(
            "-p", "no:randomly", f"--compile-cache-dir={root / 'cache'}", f"--compile-cache-store={store}",
            f"--compile-cache-json={report}", *args, timeout=600,
        )  # fmt: skip
        result.assert_outcomes(passed=3)
        probe = inner.path / f"probe-{name}.json"
        before = json.loads(probe.read_text()) if probe.exists() else []
        return json.loads(report.read_text()), log.read_text() if log.exists() else "", before

    first, log, before = machine("a", "--compile-cache=shared")
    assert before == []
    assert header_builds(log), "machine a must build the header for this test to mean anything: " + log
    saved = first["save"]
    assert saved["outcome"] == "saved", saved
    assert saved["headers"]["named"] >= 1 and saved["headers"]["transferred"] == saved["headers"]["named"]
    built = sorted(
        p.name for p in headers.header_dir(tmp_path / "a" / "tmp").iterdir() if headers.is_header_name(p.name)
    )
    artifacts = [e.key for e in LocalStore(store).list() if is_artifact_key(e.key)]
    assert len(artifacts) == saved["headers"]["named"]

    report, log, before = machine("b", "--compile-cache=shared")
    restored = report["restore"]
    assert restored["outcome"] in ("exact", "partial"), restored
    assert restored["headers"]["transferred"] == saved["headers"]["named"], restored
    assert restored["headers"]["warnings"] == [] and report["warnings"] == []
    assert before and set(before) <= set(built), (before, built)  # installed before the first test ran
    assert header_builds(log) == [], "torch rebuilt a header the restore installed: " + log
    assert " -E " in log, "torch looked the header up (it preprocesses it first) and found it"

    report, log, _ = machine("c", "--compile-cache=isolated", "-n", "2")
    restored = report["restore"]
    assert restored["outcome"] in ("exact", "partial"), restored
    assert restored["headers"]["transferred"] == saved["headers"]["named"], restored
    assert header_builds(log) == [], "an xdist worker rebuilt a header the controller installed: " + log
    installed = headers.header_dir(tmp_path / "c" / "tmp")
    assert {p.name for p in installed.iterdir() if headers.is_header_name(p.name)} == set(before)
