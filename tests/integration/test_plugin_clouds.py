"""The plugin with gs:// and az:// stores, against gcp-storage-emulator and Azurite.

Each session runs in a subprocess through pytester, compiling a tiny function (a matmul: an extern kernel, no
C++ build) for real on the CPU; the credentials reach it the way they reach a CI job, through the environment.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import CloudBucket
from tests.servers import AzuriteServer
from tests.servers import GCSEmulator

pytestmark = [pytest.mark.slow, pytest.mark.integration]

SUITE = """
import torch

def test_compiled():
    fn = torch.compile(lambda x, w: x @ w)
    x, w = torch.randn(8, 4), torch.randn(4, 2)
    torch.testing.assert_close(fn(x, w), x @ w)
"""


def _session(pytester: pytest.Pytester, name: str, *args: str) -> tuple[Any, dict[str, Any]]:
    report = pytester.path / f"{name}.json"
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--compile-cache=isolated", f"--compile-cache-json={report}", *args
    )
    return result, json.loads(report.read_text())


@pytest.fixture
def suite(gcs_emulator: GCSEmulator, azurite: AzuriteServer, pytester: pytest.Pytester) -> pytest.Pytester:
    """The suite; both emulators are started first, so their clients' modules are loaded before pytester
    snapshots sys.modules (see conftest._load_client_modules)."""
    pytester.makeini("[pytest]\nfilterwarnings = ignore::DeprecationWarning\n")
    pytester.makepyfile(test_suite=SUITE)
    return pytester


def test_a_cold_run_saves_and_a_fresh_machine_restores_with_no_miss(
    suite: pytest.Pytester, cloud_bucket: CloudBucket, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Issue 43's done-when, for gs:// and az:// alike."""
    store = f"--compile-cache-store={cloud_bucket.url}"
    cold, first = _session(suite, "cold", store)
    assert cold.ret == 0, cold.stdout.str()[-3000:]
    assert first["totals"]["misses"] >= 1 and first["save"]["outcome"] == "saved", first["save"]
    assert cloud_bucket.object_names() == [f"ci/cache/{first['save']['key']}.bundle"]

    # A fresh machine: another TMPDIR, another empty isolated dir, read-only.
    fresh = tmp_path / "fresh-machine-tmp"
    fresh.mkdir()
    monkeypatch.setenv("TMPDIR", str(fresh))
    warm, second = _session(suite, "warm", store, "--compile-cache-readonly")
    assert warm.ret == 0, warm.stdout.str()[-3000:]
    assert (second["restore"]["outcome"], second["restore"]["key"]) == ("partial", first["save"]["key"])
    assert second["totals"]["misses"] == 0 and second["totals"]["hits"] >= 1
    assert second["cache_dir"] != first["cache_dir"]
    assert second["save"] is None  # read-only: nothing new in the bucket
    assert len(cloud_bucket.object_names()) == 1


def test_a_rejected_azure_key_is_one_warning_and_never_printed(
    suite: pytest.Pytester, azurite: AzuriteServer, azure_container: CloudBucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store's trouble through the whole plugin: one warning, the session passes, and neither key (the
    one given nor the account's) is in its output or report. A suite that compiles nothing: the restore
    runs at the start whatever the tests do (that trouble means a cold compile: test_plugin_remote.py)."""
    suite.makepyfile(test_suite="def test_plain():\n    pass\n")
    wrong = "aHVudGVyMi1ub3QtdGhlLWtleS1henVyaXRlLWtub3dz"
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite.connection_string.replace(azurite.key, wrong))
    result, data = _session(suite, "rejected", f"--compile-cache-store={azure_container.url}")
    assert result.ret == 0
    result.assert_outcomes(passed=1)
    warnings = [line for line in result.outlines if line.startswith("CompileCacheWarning:")]
    # Azure says AuthenticationFailed (credentials rejected); Azurite says AuthorizationFailure (access denied).
    assert len(warnings) == 1 and ("credentials rejected" in warnings[0] or "access denied" in warnings[0])
    assert warnings[0].startswith(f"CompileCacheWarning: restore failed: {azure_container.url}: "), warnings
    assert data["restore"]["outcome"] == "error"
    everything = result.stdout.str() + result.stderr.str() + json.dumps(data)
    assert wrong not in everything and azurite.key not in everything
    assert azure_container.object_names() == []
