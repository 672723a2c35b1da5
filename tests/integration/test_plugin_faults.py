"""A store that hands back a bad bundle: one warning line, a cold session, the same outcome.

Bundles are crafted with the real packer and the real fingerprint of this machine, then damaged; the
plugin restores them at the start of a real pytest session (a subprocess). Every fault of
:data:`tests.bundle_faults.FAULTS` goes through the controller's restore at unit level
(tests/unit/test_session.py); here two of them, a hostile bundle and a broken store, go through the
whole plugin: the terminal's one warning line, the JSON report, ``--compile-cache-strict``'s exit status.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_compilecache.fingerprint import Fingerprint
from pytest_compilecache.fingerprint import collect
from pytest_compilecache.fingerprint import make_key
from pytest_compilecache.settings import DEFAULT_PREFIX
from tests.bundle_faults import FAULTS
from tests.bundle_faults import good_bundle

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PLAIN_SUITE = """
import os

def test_plain():
    # The restore happened before this test: the cache dir must hold nothing from the bad bundle.
    cache = os.environ["TORCHINDUCTOR_CACHE_DIR"]
    found = [n for _, _, files in os.walk(cache) for n in files if n.startswith("kernel")]
    assert found == []
"""

# A matmul (an extern kernel, no C++ build): a cold compile is all these tests need.
COMPILED_SUITE = """
import torch

def test_compiled():
    fn = torch.compile(lambda x, w: x @ w)
    x, w = torch.randn(8, 4), torch.randn(4, 2)
    torch.testing.assert_close(fn(x, w), x @ w)
"""


@pytest.fixture(scope="module")
def fingerprint() -> Fingerprint:
    return collect()


def _run(pytester: pytest.Pytester, store: Path, *extra: str) -> tuple[Any, dict[str, Any]]:
    report = pytester.path / "report.json"
    result = pytester.runpytest_subprocess(
        "-p",
        "no:cacheprovider",
        "--compile-cache=isolated",
        f"--compile-cache-store={store}",
        "--compile-cache-readonly",
        f"--compile-cache-json={report}",
        *extra,
    )
    return result, json.loads(report.read_text())


# One bundle fault (a member that climbs out of the cache dir) and one store fault; the rest at unit level.
# (A store that is a file when the session starts is a usage error: tests/plugin/test_startup.py.)
@pytest.mark.torch_independent  # refused before torch sees it
@pytest.mark.parametrize("fault", ["escaping-member"])
def test_bad_bundle_is_one_warning(
    fault: str, pytester: pytest.Pytester, fingerprint: Fingerprint, monkeypatch: pytest.MonkeyPatch
) -> None:
    damage, env = FAULTS[fault]
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    store = pytester.path / "store"
    store.mkdir()
    damage(store / (make_key(DEFAULT_PREFIX, fingerprint.digest(), "run1") + ".bundle"), fingerprint)
    pytester.makeini("[pytest]\nfilterwarnings = ignore::DeprecationWarning\n")
    pytester.makepyfile(test_plain=PLAIN_SUITE)

    result, data = _run(pytester, store)

    assert result.ret == 0, result.stdout.str()
    warnings = [line for line in result.outlines if line.startswith("CompileCacheWarning:")]
    assert len(warnings) == 1, result.stdout.str()
    # A bad bundle in a working store is refused and listed; nothing usable: a miss, cold compile.
    assert data["restore"]["outcome"] == "miss"
    key = make_key(DEFAULT_PREFIX, fingerprint.digest(), "run1")
    assert [entry["key"] for entry in data["restore"]["skipped"]] == [key]
    assert not (pytester.path / "escaped.so").exists() and not (pytester.path.parent / "escaped.so").exists()

    strict, _ = _run(pytester, store, "--compile-cache-strict")
    assert strict.ret == 1
    strict.stdout.fnmatch_lines(["*compile cache FAILED: restore*"])


@pytest.mark.slow
def test_torch_rejecting_artifacts_compiles_cold(pytester: pytest.Pytester, fingerprint: Fingerprint) -> None:
    """A bundle that verifies but whose mega-cache blob torch cannot load: warning, cold compile, pass."""
    store = pytester.path / "store"
    store.mkdir()
    good_bundle(
        store / (make_key(DEFAULT_PREFIX, fingerprint.digest(), "run1") + ".bundle"), fingerprint, blob=b"\x00" * 64
    )
    pytester.makeini("[pytest]\nfilterwarnings = ignore::DeprecationWarning\n")
    pytester.makepyfile(test_compiled=COMPILED_SUITE)

    result, data = _run(pytester, store)

    assert result.ret == 0, result.stdout.str()
    warnings = [line for line in result.outlines if line.startswith("CompileCacheWarning:")]
    assert len(warnings) == 1 and "torch rejected" in warnings[0], warnings
    assert data["totals"]["misses"] >= 1 and data["totals"]["hits"] == 0


@pytest.mark.torch_independent  # no torch in the session
def test_ctrl_c_during_the_end_of_session_save_is_pytests_interrupted(pytester: pytest.Pytester) -> None:
    """Issue 44 (also): Ctrl-C while the session saved ended in a raw traceback and rc 130."""
    pytester.makeconftest(
        "from pytest_compilecache import save_phase\n\n\n"
        "def _interrupted(self, *args, **kwargs):\n"
        "    raise KeyboardInterrupt  # what Ctrl-C raises in the main thread, here mid-save\n\n\n"
        "save_phase.SavePhase.run = _interrupted\n"
    )
    pytester.makepyfile(test_plain="def test_plain():\n    pass\n")
    cache = pytester.path / "cache"
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--compile-cache=shared", f"--compile-cache-dir={cache}", timeout=120
    )
    assert result.ret == pytest.ExitCode.INTERRUPTED, result.stdout.str() + result.stderr.str()
    assert "Traceback" not in result.stdout.str() + result.stderr.str()
    result.stderr.fnmatch_lines(["*KeyboardInterrupt*compile cache*nothing*saved*"])
    sessions = cache / ".compilecache-sessions"
    assert not sessions.exists() or not list(sessions.iterdir())  # the registration was withdrawn
