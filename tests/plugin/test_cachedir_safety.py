"""The cache dir through the real plugin: never deleting what is not a cache, leftovers of killed sessions,
and paths torch's C++ build cannot take (issue 9, items 1, 9 and 11)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pytest_compilecache import cachedir
from tests.plugin.helpers import INNER_INI
from tests.plugin.helpers import check_report

TRIVIAL = "def test_ok():\n    pass\n"
OLD = 1577836800  # 2020-01-01, as `touch -d 2020-01-01` in the recipe


def _snapshot(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` but pytester's own (``stdout``, ``stderr``, basetemp ``runpytest-<n>/``)."""
    files = {str(p.relative_to(root)): p for p in sorted(root.rglob("*")) if p.is_file()}
    pytesters = ("stdout", "stderr", "runpytest-")
    return {rel: p.read_bytes() for rel, p in files.items() if not rel.startswith(pytesters)}


def _user_project(root: Path) -> dict[str, bytes]:
    """The issue's recipe: a git checkout with notes and a model file, both last changed in 2020."""
    (root / ".git" / "objects" / "ab").mkdir(parents=True, exist_ok=True)
    (root / ".git" / "objects" / "ab" / "cdef0123456789abcdef0123456789abcdef01").write_bytes(b"x\x9c" + os.urandom(40))
    (root / "src").mkdir(exist_ok=True)
    (root / "NOTES.md").write_text("notes\n")
    (root / "src" / "model.bin").write_bytes(os.urandom(200_000))
    for rel in ("NOTES.md", "src/model.bin", ".git/objects/ab/cdef0123456789abcdef0123456789abcdef01"):
        os.utime(root / rel, (OLD, OLD))
    return _snapshot(root)


def test_the_project_root_as_the_dir_is_refused_and_nothing_is_deleted(inner: pytest.Pytester) -> None:
    inner.makepyfile(test_x=TRIVIAL)
    before = _user_project(inner.path)

    result = inner.runpytest_subprocess(
        "-p", "no:cacheprovider", "--compile-cache-dir=.", "--compile-cache-max-size=1K", timeout=120
    )

    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --compile-cache-dir: * is not a compile cache*(.git, NOTES.md, *)*"])
    assert _snapshot(inner.path) == before  # not a file removed, changed or added (no tag, no kernel dir)


def test_home_as_the_dir_is_refused_and_nothing_is_deleted(
    inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = inner.path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("secret\n")
    (home / ".bashrc").write_text("export PS1='$ '\n")
    (home / "go" / "bin").mkdir(parents=True)  # a two-character dir, like torch's kernel dirs
    (home / "go" / "bin" / "tool").write_bytes(b"\x7fELF")
    _user_project(home / "work")
    for path in home.rglob("*"):
        os.utime(path, (OLD, OLD), follow_symlinks=False)
    before = _snapshot(home)
    monkeypatch.setenv("HOME", str(home))
    inner.makepyfile(test_x=TRIVIAL)

    for spelling in ("~", str(home), "$HOME"):
        arg = os.path.expandvars(spelling)
        result = inner.runpytest_subprocess(
            "-p", "no:cacheprovider", f"--compile-cache-dir={arg}", "--compile-cache-max-size=1K", timeout=120
        )
        assert result.ret == pytest.ExitCode.USAGE_ERROR, spelling
        result.stderr.fnmatch_lines([f"ERROR: --compile-cache-dir: {home} is not a compile cache*"])
    assert _snapshot(home) == before


def test_a_subdir_as_the_error_suggests_is_used_and_trimmed_alone(inner: pytest.Pytester) -> None:
    """Following the advice works: the new dir becomes ours, and trimming it leaves the project alone."""
    inner.makepyfile(test_x=TRIVIAL)
    before = _user_project(inner.path)
    cache = inner.path / ".compilecache"
    report = inner.path / "report.json"

    first = inner.runpytest_subprocess("-p", "no:cacheprovider", f"--compile-cache-dir={cache}", timeout=120)
    assert first.ret == 0, first.stdout.str()
    torch_file = cache / "ab" / ("cab" + "x" * 49 + ".so")  # stands for a kernel from an earlier run
    torch_file.parent.mkdir()
    torch_file.write_bytes(b"k" * 4096)
    os.utime(torch_file, (OLD, OLD))

    second = inner.runpytest_subprocess(
        "-p", "no:cacheprovider", f"--compile-cache-dir={cache}", "--compile-cache-max-size=1K",
        f"--compile-cache-json={report}", timeout=120,
    )  # fmt: skip

    assert second.ret == 0, second.stdout.str()
    assert not torch_file.exists()
    data = json.loads(report.read_text())
    check_report(data)
    trimmed = "trimmed the cache dir: removed 1 least recently used files, 4.0 KiB"
    assert any(note.startswith(trimmed) for note in data["notes"]), data["notes"]
    assert {k: v for k, v in _snapshot(inner.path).items() if k in before} == before


@pytest.mark.parametrize("mode", ["shared", "isolated"])
def test_an_explicit_dir_torch_cannot_build_in_is_refused(inner: pytest.Pytester, mode: str) -> None:
    inner.makepyfile(test_x=TRIVIAL)
    result = inner.runpytest_subprocess(
        "-p", "no:cacheprovider", f"--compile-cache={mode}", f"--compile-cache-dir={inner.path / 'my cache'}",
        timeout=120,
    )  # fmt: skip
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["ERROR: --compile-cache-dir: */my cache contains a space, which torch's C++ compiler command line*"]
    )
    assert not (inner.path / "my cache").exists()


KILLED = """
import os, sys, time
from pytest_compilecache import _fs, cachedir

path = sys.argv[1]
cachedir.register_session(path)
os.makedirs(os.path.join(path, "ab"), exist_ok=True)
# What a session killed mid-restore leaves: an unpack's temp file, a staging dir, torch's own temp file.
open(os.path.join(path, "ab", _fs.temp_name("tmp", lead=".k.so.")), "wb").write(b"x" * 1000)
os.makedirs(os.path.join(path, _fs.temp_name("staging", lead="."), "files"))
open(os.path.join(path, "ab", f".{os.getpid()}.140000000000.tmp"), "wb").write(b"y")
print("ready", flush=True)
time.sleep(600)
"""


def test_the_next_session_sweeps_what_a_killed_one_left(inner: pytest.Pytester) -> None:
    inner.makepyfile(test_x=TRIVIAL)
    cache = inner.path / "cache"
    shared = ["-p", "no:cacheprovider", f"--compile-cache-dir={cache}"]
    assert inner.runpytest_subprocess(*shared, timeout=120).ret == 0
    victim = subprocess.Popen([sys.executable, "-c", KILLED, str(cache)], stdout=subprocess.PIPE, text=True)
    with victim:
        assert victim.stdout is not None and victim.stdout.readline() == "ready\n"
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=60)
    assert len(os.listdir(cache / ".compilecache-sessions")) == 1  # the dead session's registration
    assert len([p for p in cache.rglob(".*.tmp")] + list(cache.glob(".compilecache-staging-*"))) == 3
    report = inner.path / "report.json"

    result = inner.runpytest_subprocess(*shared, f"--compile-cache-json={report}", timeout=120)

    assert result.ret == 0, result.stdout.str()
    left = sorted(str(p.relative_to(cache)) for p in cache.rglob("*"))
    # torch's temp file has a pid but no host: it waits out a grace period (see cachedir.sweep_dead_writers).
    torch_temp = [name for name in left if name.endswith(".140000000000.tmp")]
    assert left == sorted(["CACHEDIR.TAG", ".gitignore", ".compilecache-sessions", "ab", *torch_temp]), left
    assert len(torch_temp) == 1
    notes = json.loads(report.read_text())["notes"]
    assert "removed 2 temp files left in the cache dir by killed sessions" in notes, notes


SPACE_SUITE = """
import torch


def activation(x):
    return torch.sin(x) + x


def test_activation():
    x = torch.randn(8)
    torch.testing.assert_close(torch.compile(activation)(x), activation(x))
"""


@pytest.mark.slow
def test_a_rootdir_with_a_space_still_compiles(inner: pytest.Pytester) -> None:
    """torch's C++ build fails in a dir with a space; the default shared dir moves to a safe place."""
    project = inner.path / "my project"
    project.mkdir()
    (project / "pytest.ini").write_text(INNER_INI)
    (project / "test_space.py").write_text(SPACE_SUITE)
    report = inner.path / "report.json"

    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:xdist", "--compile-cache=shared", f"--compile-cache-json={report}"],
        cwd=project, capture_output=True, text=True, timeout=600,
    )  # fmt: skip

    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads(report.read_text())
    check_report(data)
    assert data["totals"]["compiled_tests"] == 1
    cache_dir = data["cache_dir"]
    assert " " not in cache_dir and Path(cache_dir).parent.name == f"pytest-compilecache-{os.getuid()}"
    assert list(Path(cache_dir).glob("*/*.so")), "no C++ kernel was built in the fallback dir"
    default = project / ".pytest_cache" / "d" / "compilecache"
    assert f"compile cache: shared:{cache_dir} (the default dir {default} contains a space" in result.stdout


def test_a_dead_controllers_restore_ticket_neither_blocks_nor_stays(inner: pytest.Pytester) -> None:
    """Issue 44, finding 1: the ticket files a SIGKILLed xdist controller left in a dir torch filled made every
    later session on it exit 4 ("is not a compile cache"), until someone deleted them."""
    from pytest_compilecache import _fs

    cache = inner.path / "torch-made"
    (cache / "fxgraph").mkdir(parents=True)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    name = _fs.temp_name("ticket", lead=".")
    owner = _fs.parse_temp_name(name)
    assert owner is not None
    ticket = cache / name.replace(f"-{owner.pid}-", f"-{int(dead.stdout)}-")
    older = cache / ".compilecache-restore-123-0123456789ab.json"  # as 0.3.0.dev named it: ours, swept by age
    for path in (ticket, Path(f"{ticket}.lock"), older, Path(f"{older}.lock")):
        path.write_text("{}")
    inner.makepyfile(test_x=TRIVIAL)
    result = inner.runpytest_subprocess("-p", "no:cacheprovider", f"--compile-cache-dir={cache}", timeout=120)
    assert result.ret == pytest.ExitCode.OK, result.stdout.str() + result.stderr.str()
    assert not ticket.exists() and not Path(f"{ticket}.lock").exists()
    assert older.exists()  # young: its controller may still be running


SLEEPER = """
import pathlib
import time


def test_waits_to_be_killed():
    pathlib.Path("ready").write_text("")
    time.sleep(60)
"""


def test_the_next_isolated_session_removes_the_dir_a_killed_one_left(inner: pytest.Pytester) -> None:
    """An isolated session removes its dir at its end, unless it is killed (SIGKILL, or SIGTERM: no exit handler
    runs): such dirs piled up in the temp dir. The next isolated session with the same parent removes it; never a
    dir a session asked to keep, nor one whose session lives."""
    inner.makepyfile(test_sleeper=SLEEPER)
    parent = inner.path / "isolated"
    isolated = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--compile-cache=isolated"]
    kept = subprocess.run(
        [*isolated, f"--compile-cache-dir={parent}", "--compile-cache-keep", "-k", "nothing"],
        cwd=inner.path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert kept.returncode == pytest.ExitCode.NO_TESTS_COLLECTED, kept.stdout
    with subprocess.Popen([*isolated, f"--compile-cache-dir={parent}"], cwd=inner.path) as victim:
        for _ in range(600):
            if (inner.path / "ready").exists():
                break
            victim.poll()
            assert victim.returncode is None
            time.sleep(0.1)
        victim.kill()
        victim.wait(timeout=60)
    left = sorted(path.name for path in parent.iterdir())
    kept_dirs = [name for name in left if (parent / name / ".compilecache-isolated").read_text().startswith("kept")]
    assert len(left) == 2 and len(kept_dirs) == 1  # the kept dir, and the killed session's
    # Swept only once nothing in it changed for the grace period (a process it started may still write there).
    when = time.time() - cachedir.sweep.ISOLATED_GRACE_SECONDS - 60
    for name in left:
        for folder, dirs, files in os.walk(parent / name):
            for entry in (*dirs, *files):
                os.utime(os.path.join(folder, entry), (when, when), follow_symlinks=False)
        os.utime(parent / name, (when, when))

    inner.makepyfile(test_sleeper=TRIVIAL)
    report = inner.path / "report.json"
    result = inner.runpytest_subprocess(
        "-p", "no:cacheprovider", "--compile-cache=isolated", f"--compile-cache-dir={parent}",
        f"--compile-cache-json={report}", timeout=120,
    )  # fmt: skip

    assert result.ret == 0, result.stdout.str()
    assert sorted(path.name for path in parent.iterdir()) == kept_dirs
    notes = json.loads(report.read_text())["notes"]
    assert "removed 1 isolated cache dirs that killed sessions left beside this one" in notes, notes
