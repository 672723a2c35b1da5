"""The plugin's environment set-up in unusual orders, and size-capped shared dirs."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from tests.plugin.helpers import XDIST
from tests.plugin.helpers import check_report
from tests.plugin.helpers import run_inner

EARLY_PLUGIN = """
# Loaded with -p before pytest-compilecache configures anything: torch._dynamo pins the default dir.
import torch._dynamo  # noqa: F401
"""

COMPILED = """
import os
from pathlib import Path
import torch

def test_compiles_into_the_chosen_dir():
    fn = torch.compile(lambda x: torch.tanh(x) - x)
    fn(torch.randn(8))
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == os.environ["EXPECTED_DIR"]
"""


@pytest.mark.slow
def test_torch_imported_before_the_plugin(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """An earlier import pinned torch's default dir; the chosen dir still takes effect, with a note."""
    target = pytester.path / "chosen"
    monkeypatch.setenv("EXPECTED_DIR", str(target))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    pytester.makeini("[pytest]\nfilterwarnings = ignore::DeprecationWarning\n")
    pytester.makepyfile(earlytorch=EARLY_PLUGIN, test_early=COMPILED)
    pytester.syspathinsert()
    report = pytester.path / "r.json"
    result = pytester.runpytest_subprocess(
        "-p",
        "earlytorch",
        "-p",
        "no:cacheprovider",
        "--compile-cache=shared",
        f"--compile-cache-dir={target}",
        f"--compile-cache-json={report}",
    )
    assert result.ret == 0, result.stdout.str()
    data = json.loads(report.read_text())
    assert any("torch was imported before" in note for note in data["notes"]), data["notes"]
    assert data["totals"]["misses"] >= 1
    # The compiled artifacts landed in the chosen dir, not in torch's default one.
    assert list((target / "fxgraph").rglob("*")), sorted(os.listdir(target))
    # A compiled C++ kernel: "<key>.main.so" from torch 2.8, "<key>.so" on torch 2.7.
    assert list(target.glob("*/*.so"))


def test_max_size_trims_the_shared_dir(pytester: pytest.Pytester) -> None:
    cache = pytester.path / "cache"
    old = cache / "ab"
    old.mkdir(parents=True)
    # The tag pytest-compilecache writes (a dir it made; torch's layout alone would do too). Only files in
    # torch's layout are ever trimmed: kernel dirs hold hash-named files.
    (cache / "CACHEDIR.TAG").write_text(
        "Signature: 8a477f597d28d172789f06886806bc55\n# Created by pytest-compilecache.\n"
    )
    os.utime(cache / "CACHEDIR.TAG", (1, 1))  # oldest of all, and still kept: it is ours
    for index in range(20):
        entry = old / f"cab{index:02d}{'k' * 47}.so"  # torch's names: a key in the dir of its 2nd and 3rd chars
        entry.write_bytes(b"x" * 4096)
        os.utime(entry, (1_000_000 + index, 1_000_000 + index))
    pytester.makepyfile(test_plain="def test_ok():\n    pass\n")
    result = pytester.runpytest_subprocess(
        "-p",
        "no:cacheprovider",
        "--compile-cache=shared",
        f"--compile-cache-dir={cache}",
        "--compile-cache-max-size=40K",
        "--compile-cache-report=full",
    )
    assert result.ret == 0
    remaining = sorted(p.name for p in old.glob("*.so"))
    total = sum(p.stat().st_size for p in cache.rglob("*") if p.is_file())
    assert total <= 40 * 1024
    # Least recently used first: the newest entries survive.
    assert remaining and all(int(name[3:5]) >= 10 for name in remaining), remaining
    assert (cache / "CACHEDIR.TAG").exists()


# A real compile (a matmul: an extern kernel, no C++ build): torch writes and reads its FX/AOT entries.
COMPILES = """
import torch


def test_compiles():
    x = torch.randn(4, 4)
    torch.testing.assert_close(torch.compile(lambda a: a @ a)(x), x @ x)
"""


@pytest.mark.slow
def test_a_cap_smaller_than_one_session_warns(inner: pytest.Pytester) -> None:
    """Issue 29: a cap smaller than one session's files: the trim removed them (the next run hit nothing), silently.
    Now a trim never removes what was used within MIN_AGE (torch may still use it), and the cap is said too small
    when files this session used (by torch's own record of them) keep the dir over it."""
    cache, report = inner.path / "cache", inner.path / "r.json"
    inner.makepyfile(test_compiles=COMPILES)
    result = inner.runpytest_subprocess(
        "-p", "no:cacheprovider", "--compile-cache=shared", f"--compile-cache-dir={cache}",
        "--compile-cache-max-size=1K", f"--compile-cache-json={report}", timeout=300,
    )  # fmt: skip
    assert result.ret == 0, result.stdout.str()
    assert [p for p in (cache / "fxgraph").rglob("*") if p.is_file()]  # kept: this session used them now...
    warning = "--compile-cache-max-size (1.0 KiB) is smaller than what this session used: "
    result.stdout.fnmatch_lines([f"CompileCacheWarning: {warning}* it used keep the dir at*raise the cap"])  # ...said
    assert any(w.startswith(warning) for w in json.loads(report.read_text())["warnings"])


def test_bad_marker_mode_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_marked="""
import pytest

@pytest.mark.compile_cache("sometimes")
def test_x():
    pass
"""
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*compile_cache*mode must be 'isolated' or 'disabled', got 'sometimes'*", "*1 error*"])


BYPASS_SUITE = """
import torch
import torch._inductor.config as inductor_config


def a_custom_pass(graph):
    return None


def test_bypassed():
    # Inductor refuses to cache graphs compiled with a custom pass it cannot hash (before any kernel is
    # built: a matmul, an extern kernel, is enough).
    with inductor_config.patch(post_grad_custom_post_pass=a_custom_pass):
        x = torch.randn(4, 4)
        torch.testing.assert_close(torch.compile(lambda a: a @ a.t())(x), x @ x.t())
"""


@pytest.mark.slow
def test_bypasses_are_counted_with_torchs_reason(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nfilterwarnings = ignore::DeprecationWarning\n")
    pytester.makepyfile(test_bypass=BYPASS_SUITE)
    report = pytester.path / "r.json"
    result = pytester.runpytest_subprocess(
        "-p",
        "no:cacheprovider",
        "--compile-cache=isolated",
        f"--compile-cache-json={report}",
        "--compile-cache-report=full",
        "-rA",
    )
    assert result.ret == 0, result.stdout.str()
    totals = json.loads(report.read_text())["totals"]
    assert totals["fxgraph"] == {"hit": 0, "miss": 0, "bypass": 1}
    assert totals["hit_rate"] is None  # bypasses are not lookups: no rate rather than 0%
    (test,) = json.loads(report.read_text())["tests"]
    assert test["bypass_reasons"] == ["Unsupported post grad custom pass"]
    result.stdout.fnmatch_lines(["compile cache: 0 hits, 0 misses (n/a), 1 bypass,*", "bypass: Unsupported post grad*"])
    # torch's INFO record was only tapped, not shown: the user's logging configuration decides that.
    assert "Bypassing FX Graph Cache" not in result.stdout.str()


WORKER_SEES_RESTORED = """
import os
from pathlib import Path
import pytest


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session):
    # Stands for the controller's restore, which runs at session start, before the workers exist.
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        with open(os.path.join(os.environ["TORCHINDUCTOR_CACHE_DIR"], "restored-entry"), "w") as fh:
            fh.write("x")
"""


def test_workers_do_not_clear_the_restored_dir_again(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Under an outer `-n 2` the inner controller would inherit the outer worker's identity.
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
        monkeypatch.delenv(name, raising=False)
    pytester.makeconftest(WORKER_SEES_RESTORED)
    pytester.makepyfile(
        test_sees="import os\n\ndef test_sees():\n"
        "    assert os.path.exists(os.path.join(os.environ['TORCHINDUCTOR_CACHE_DIR'], 'restored-entry'))\n"
    )
    result = pytester.runpytest_subprocess("--compile-cache=shared", "--cache-clear", "-n", "2")
    assert result.ret == 0, result.stdout.str()


LONG_RUNNING = """
import os
from pathlib import Path
import pathlib
import time


def test_long_running():
    cache = pathlib.Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
    kernel = cache / "fxgraph" / "ab" / ("k" * 40)  # stands for a graph this session wrote and reads again
    kernel.parent.mkdir(parents=True, exist_ok=True)
    kernel.write_text("graph")
    pathlib.Path("ready").write_text(str(cache))
    deadline = time.time() + 120
    while not os.path.exists("go") and time.time() < deadline:
        time.sleep(0.05)
    assert kernel.exists(), "the cache file vanished while this session ran"
    assert os.listdir(cache / ".compilecache-sessions"), "the registration vanished while this session ran"
"""


@contextlib.contextmanager
def _live_session(inner: pytest.Pytester, *args: str) -> Iterator[Path]:
    """Run LONG_RUNNING's session in the background until the block ends; yield its cache dir."""
    first = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", *args, "--compile-cache=shared", "test_a.py"],
        cwd=inner.path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.time() + 60
        while not (inner.path / "ready").exists() and first.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        assert (inner.path / "ready").exists(), first.stdout.read() if first.stdout else ""
        yield Path((inner.path / "ready").read_text())
    finally:
        (inner.path / "go").write_text("")
        out, _ = first.communicate(timeout=120)
    assert first.returncode == 0, out


@pytest.mark.parametrize(
    "mode",
    [
        ["--compile-cache=shared"],
        ["--compile-cache=isolated"],
        ["-n", "2"],  # no option: and xdist hands its workers --cache-clear too
        ["--compile-cache=shared", "--compile-cache-dir=own"],
    ],
    ids=["shared", "isolated", "no-option-xdist", "shared-elsewhere"],
)
def test_cache_clear_keeps_a_shared_dir_another_session_uses(inner: pytest.Pytester, mode: list[str]) -> None:
    """--cache-clear in one session never deletes the default shared dir while another session uses it,
    whatever the clearing session's own mode and dir."""
    inner.makepyfile(test_a=LONG_RUNNING, test_b="def test_b():\n    pass\n")
    with _live_session(inner) as shared:
        stale = inner.path / ".pytest_cache" / "v" / "cache" / "lastfailed"
        stale.parent.mkdir(parents=True, exist_ok=True)
        stale.write_text("{}")

        second = inner.runpytest_subprocess("-q", *mode, "--cache-clear", "test_b.py")

        assert second.ret == 0, second.stdout.str()
        second.stdout.fnmatch_lines(["*--cache-clear kept the compile cache *: 1 other pytest session is using it*"])
        assert not stale.exists()  # the rest of pytest's cache was cleared
        assert (shared / "fxgraph" / "ab" / ("k" * 40)).exists()

    # With nobody else using it, --cache-clear clears it as pytest always did.
    again = inner.runpytest_subprocess("-q", "--compile-cache=shared", "--cache-clear", "test_b.py")
    assert again.ret == 0 and "kept the compile cache" not in again.stdout.str()
    assert not (shared / "fxgraph").exists()


def test_cache_clear_never_clears_through_a_linked_pytest_cache_dir(inner: pytest.Pytester, tmp_path: Path) -> None:
    """With another session live, the plugin clears pytest's cache itself: never through a link (as pytest)."""
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "precious").mkdir(parents=True)
    (elsewhere / "precious" / "data").write_text("keep me")
    (inner.path / ".pytest_cache").mkdir()
    (inner.path / ".pytest_cache" / "d").symlink_to(elsewhere)
    inner.makepyfile(test_a=LONG_RUNNING, test_b="def test_b():\n    pass\n")
    with _live_session(inner, "-p", "no:cacheprovider"):
        second = inner.runpytest_subprocess("-q", "--compile-cache=shared", "--cache-clear", "test_b.py")
        assert second.ret == 0, second.stdout.str()
        second.stdout.fnmatch_lines(["*--cache-clear kept the compile cache*"])
        assert (elsewhere / "precious" / "data").read_text() == "keep me"


@pytest.mark.parametrize("stop", ["--no-such-option", "broken-conftest"])
def test_a_session_stopped_before_configure_in_process_leaves_nothing_behind(inner: pytest.Pytester, stop: str) -> None:
    # In-process (pytester, an IDE) pytest calls no pytest_unconfigure when it stops before configure: the
    # plugin had already exported the cache dir and registered in it. The next session then met a phantom
    # "other session" (a --cache-clear refused, a trim deferred) and ran with the old variables.
    inner.makepyfile(test_suite="def test_ok():\n    pass\n")
    if stop == "broken-conftest":
        inner.makeconftest("raise RuntimeError('a broken conftest')\n")
    cache = inner.path / "cache"
    ours = ("PYTEST_COMPILECACHE_", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
    before = {k: v for k, v in os.environ.items() if k.startswith(ours)}
    args = ["--compile-cache=shared", f"--compile-cache-dir={cache}"]
    result = inner.runpytest_inprocess(*args, *([stop] if stop.startswith("--") else []))
    assert result.ret in (pytest.ExitCode.USAGE_ERROR, pytest.ExitCode.INTERRUPTED)
    assert {k: v for k, v in os.environ.items() if k.startswith(ours)} == before
    assert list((cache / ".compilecache-sessions").glob("*")) == []  # the registration was withdrawn


# Five tests; the third imports torch (without compiling), as a lazily importing suite would.
TORCH_MIDWAY = """
import pytest


@pytest.mark.parametrize("i", range(5))
def test_five(i):
    if i == 2:
        import torch

        assert torch.ones(1).sum().item() == 1.0
"""


@XDIST
@pytest.mark.slow  # its inner session imports torch (seconds)
def test_every_test_is_counted_when_torch_appears_midway(inner: pytest.Pytester, dist: tuple[str, ...]) -> None:
    """Tests before torch are counted by the counter, the one during which it appears and those after by
    the per-test capture that takes over: five tests, once each, serially and in each xdist worker."""
    inner.makepyfile(test_midway=TORCH_MIDWAY)

    run = run_inner(inner, *dist)

    assert run.ret == 0, run.output
    check_report(run.data)
    assert (run.totals["tests"], run.totals["compiled_tests"]) == (5, 0)
