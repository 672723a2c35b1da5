"""probe's precompiled-header watch (issue 24): every header torch looks up is checked once per process before
a kernel uses it; a rejected one is removed and torch builds it again. torch's codecache is a stand-in module
here, gcc a fake compiler (tests/unit/test_headers.py has the real gcc's reactions)."""

from __future__ import annotations

import functools
import os
import sys
import time
import types
from pathlib import Path
from typing import Any

import pytest

from pytest_compilecache import pch
from pytest_compilecache import probe
from pytest_compilecache.probe import hooks
from pytest_compilecache.probe import pch as probe_pch
from tests.unit.test_headers import FAKE_COMPILER

NAME = "c" + "a2b3c4d5e6f7" * 4 + "abc" + ".h"
GOOD = b"gpch" + b"x" * 100 + b"END"


class FakeCodecache(types.ModuleType):
    """``torch._inductor.codecache`` with a ``_precompile_header`` that acts as torch's: a ``functools.cache``
    that builds ``<dir>/<hash>.h.gch`` only when it is absent and returns ``<dir>/<hash>.h``."""

    def __init__(self, directory: Path) -> None:
        super().__init__(hooks.CODECACHE)
        self.directory = directory
        self.builds = 0

        @functools.cache
        def _precompile_header(header: str, hashable_cmd_line: str, **compile_command: Any) -> str:
            path = directory / NAME
            path.write_text(f"#include <{header}>\n")
            if not Path(str(path) + ".gch").exists():
                self.builds += 1
                Path(str(path) + ".gch").write_bytes(GOOD)
            return str(path)

        self._precompile_header = _precompile_header


@pytest.fixture
def codecache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    directory = tmp_path / "precompiled_headers"
    directory.mkdir()
    fake = FakeCodecache(directory)
    monkeypatch.setitem(sys.modules, hooks.CODECACHE, fake)
    compiler = tmp_path / "fake-g++"
    compiler.write_text(FAKE_COMPILER)
    compiler.chmod(0o755)
    monkeypatch.setenv("FAKE_CC_LOG", str(tmp_path / "cc.log"))
    seen: list[dict[str, Any]] = []

    def command(compile_command: dict[str, Any], source: str, include: str) -> list[str]:
        seen.append(compile_command)
        return [str(compiler), source, "-include", include]

    monkeypatch.setattr(probe_pch, "_header_check_command", command)
    probe.uninstall_header_watch()
    probe.watch_precompiled_headers()
    yield fake
    probe.uninstall_header_watch()


def _look_up(fake: FakeCodecache) -> str:
    """What ``CppCodeCache.load_async`` does: call the module-global function by name."""
    return str(fake._precompile_header("torch/csrc/inductor/cpp_prefix.h", "g++ -O3", vec_isa="avx512"))


def test_a_sound_header_is_checked_once_and_reported(codecache: FakeCodecache, tmp_path: Path) -> None:
    assert probe.precompiled_headers_used() == []
    path = _look_up(codecache)
    assert path == str(codecache.directory / NAME)  # torch's answer, unchanged
    assert _look_up(codecache) == path
    (use,) = probe.precompiled_headers_used()
    info = os.lstat(path + ".gch")
    assert pch.HeaderUse.from_json(use) == pch.HeaderUse(
        NAME + ".gch", "verified", info.st_size, info.st_mtime_ns, info.st_ino
    )
    assert (tmp_path / "cc.log").read_text().count("-fsyntax-only") == 1  # once per process


@pytest.mark.parametrize("damage", [GOOD[:50], b"\0" * 100], ids=["truncated", "zeroed"])
def test_a_damaged_header_is_removed_and_torch_builds_it_again(codecache: FakeCodecache, damage: bytes) -> None:
    compiled = codecache.directory / (NAME + ".gch")
    compiled.write_bytes(damage)  # already on the machine, under torch's name
    _look_up(codecache)
    assert compiled.read_bytes() == GOOD and codecache.builds == 1
    (use,) = probe.precompiled_headers_used()
    assert use["verdict"] == "rebuilt" and os.lstat(compiled).st_ino == use["ino"]
    assert NAME in use["note"] and "removed it and torch built it again" in use["note"]


def test_a_header_the_check_cannot_judge_is_left_alone_and_not_carried(
    codecache: FakeCodecache, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(probe_pch, "_header_check_command", lambda *args: [str(tmp_path / "no-compiler")])
    _look_up(codecache)
    (use,) = probe.precompiled_headers_used()
    assert use["verdict"] == "unchecked" and "not checked" in use["note"]
    assert (codecache.directory / (NAME + ".gch")).read_bytes() == GOOD
    assert pch.find_used(codecache.directory, [use]) == []


def test_our_failure_never_fails_torchs_compile(codecache: FakeCodecache, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object) -> list[str]:
        raise RuntimeError("a torch without CppBuilder")

    monkeypatch.setattr(probe_pch, "_header_check_command", broken)
    assert _look_up(codecache).endswith(NAME)
    (use,) = probe.precompiled_headers_used()
    assert use["verdict"] == "unchecked"


def test_uninstall_puts_torchs_function_back(codecache: FakeCodecache) -> None:
    assert codecache._precompile_header.cache_info().currsize == 0
    torchs = getattr(codecache._precompile_header, "__wrapped__", None)
    assert getattr(torchs, "__wrapped__", None) is not None  # ours, around torch's functools.cache
    probe.uninstall_header_watch()
    assert codecache._precompile_header is torchs


def test_every_wrapper_of_a_module_is_installed_when_torch_imports_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The graph-lookup capture and the header watch both wait for torch's codecache: one import runs both (a
    second ``sys.meta_path`` finder for the same module would never be asked)."""
    (tmp_path / "compilecache_late_module.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    called: list[str] = []

    def first() -> None:
        called.append("graphs")

    def second() -> None:
        called.append("headers")

    for install in (first, second, second):
        hooks.install_now_or_on_import("compilecache_late_module", install, pending=True)
    monkeypatch.delitem(sys.modules, "compilecache_late_module", raising=False)
    import compilecache_late_module  # type: ignore[import-not-found]

    assert compilecache_late_module.VALUE == 1
    assert called == ["graphs", "headers"]


# --------------------------------------------------------------------------- verdicts across processes


def _next_process(fake: FakeCodecache) -> None:
    """What a new pytest process (the next session, another xdist worker) starts from: torch's cache empty,
    nothing checked yet in this process; only files on disk carry over."""
    probe.uninstall_header_watch()
    fake._precompile_header.cache_clear()
    probe.watch_precompiled_headers()


def _checks(tmp_path: Path) -> int:
    log = tmp_path / "cc.log"
    return log.read_text().count("-fsyntax-only") if log.exists() else 0


@pytest.fixture
def settled(codecache: FakeCodecache, monkeypatch: pytest.MonkeyPatch) -> Path:
    """torch's header, built a moment ago and settled (its ctime older than the record's margin)."""
    compiled = codecache.directory / (NAME + ".gch")
    compiled.write_bytes(GOOD)
    monkeypatch.setattr(pch.verdicts, "SETTLED_NS", 20_000_000, raising=False)  # absent before issue 24's record
    time.sleep(0.05)
    return compiled


def test_an_accepted_header_is_not_checked_again_by_the_next_process(
    codecache: FakeCodecache, settled: Path, tmp_path: Path
) -> None:
    _look_up(codecache)
    assert _checks(tmp_path) == 1 and (codecache.directory / pch.VERDICTS).is_file()
    for _ in range(2):
        _next_process(codecache)
        _look_up(codecache)
        (use,) = probe.precompiled_headers_used()
        assert use["verdict"] == "verified" and use["ino"] == os.lstat(settled).st_ino  # still carried
    assert _checks(tmp_path) == 1, "the compiler ran again for a file it had accepted"
    assert codecache.builds == 0


def test_a_header_damaged_in_place_after_its_acceptance_is_checked_again_and_removed(
    codecache: FakeCodecache, settled: Path, tmp_path: Path
) -> None:
    _look_up(codecache)
    _next_process(codecache)
    _look_up(codecache)
    assert _checks(tmp_path) == 1  # accepted before: not checked
    before = os.lstat(settled)
    with open(settled, "r+b") as fh:  # damaged in place: same inode, same size, mtime put back
        fh.seek(-3, os.SEEK_END)
        fh.write(b"XYZ")  # the fake compiler's "cannot read PCH file"
    os.utime(settled, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.lstat(settled)
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)
    _next_process(codecache)
    _look_up(codecache)
    assert _checks(tmp_path) == 3  # checked (rejected), then torch's rebuild checked
    (use,) = probe.precompiled_headers_used()
    assert use["verdict"] == "rebuilt" and "cannot read PCH file" in use["note"], use
    assert settled.read_bytes() == GOOD and codecache.builds == 1


@pytest.mark.parametrize(
    "damage",
    [
        lambda record, good: record.write_bytes(good[: len(good) // 2]),
        lambda record, good: record.write_bytes(b"\0" * len(good)),
        lambda record, good: record.write_text('{"version": 1, "accepted": {"' + NAME + '.gch": {"file": "x"}}}'),
        lambda record, good: record.write_text('{"version": 1, "accepted": [1, 2]}'),
        lambda record, good: record.write_bytes(good.replace(b'"checks": ["', b'"checks": ["0')),
        lambda record, good: record.write_text("[" * 60000),
    ],
    ids=["truncated", "zeroed", "bad-entry", "bad-shape", "bad-key", "deep"],
)
def test_a_damaged_record_is_ignored(codecache: FakeCodecache, settled: Path, tmp_path: Path, damage) -> None:  # type: ignore[no-untyped-def]
    _look_up(codecache)
    _next_process(codecache)
    _look_up(codecache)
    assert _checks(tmp_path) == 1  # the sound record spared the check
    record = codecache.directory / pch.VERDICTS
    good = record.read_bytes()
    damage(record, good)
    _next_process(codecache)
    _look_up(codecache)
    assert _checks(tmp_path) == 2  # nothing to trust: checked, no crash
    (use,) = probe.precompiled_headers_used()
    assert use["verdict"] == "verified" and settled.read_bytes() == GOOD
    assert record.read_bytes() == good  # written again, whole


def test_a_record_of_another_file_or_through_a_link_is_never_trusted(
    codecache: FakeCodecache, settled: Path, tmp_path: Path
) -> None:
    _look_up(codecache)
    _next_process(codecache)
    _look_up(codecache)
    assert _checks(tmp_path) == 1
    record = codecache.directory / pch.VERDICTS
    elsewhere = tmp_path / "record.json"
    record.rename(elsewhere)
    record.symlink_to(elsewhere)  # a link: never followed
    _next_process(codecache)
    _look_up(codecache)
    assert _checks(tmp_path) == 2
    # The header replaced by another file (torch's rebuild, a restore): a new inode and ctime.
    os.replace(elsewhere, record)
    replacement = tmp_path / "replacement"
    replacement.write_bytes(GOOD)
    os.replace(replacement, settled)
    _next_process(codecache)
    _look_up(codecache)
    assert _checks(tmp_path) == 3


# ---- a restored header is checked while torch works out which header it wants (issues 24, 25)


def _wait_for_check(tmp_path: Path, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if _checks(tmp_path):
            return True
        time.sleep(0.01)
    return False


def test_a_restored_header_is_checked_while_torch_preprocesses(
    codecache: FakeCodecache, settled: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check of a header this process restored runs beside torch's own look-up (which preprocesses the
    header first, about as long as the check), not after it: torch's stand-in here waits for the compiler
    to have run before it answers, which only an early check can satisfy; the look-up's own check then
    finds the verdict, so the compiler runs once."""
    torchs = codecache._precompile_header
    seen: list[bool] = []

    @functools.cache
    def slow(header: str, hashable_cmd_line: str, **compile_command: Any) -> str:
        compile_command.pop("extra_flags", None)  # torch pops from what it was given
        seen.append(_wait_for_check(tmp_path))
        return str(torchs(header, hashable_cmd_line, **compile_command))

    monkeypatch.setattr(codecache, "_precompile_header", slow)
    probe.uninstall_header_watch()
    probe.watch_precompiled_headers()
    probe.check_headers_early([settled.name], settled.parent)

    codecache._precompile_header("torch/csrc/inductor/cpp_prefix.h", "g++ -O3", vec_isa="avx512", extra_flags="x")

    assert seen == [True]
    (use,) = probe.precompiled_headers_used()
    assert use["verdict"] == "verified" and _checks(tmp_path) == 1
    assert probe_pch._early_checks == []  # asked once per restore


def test_a_damaged_restored_header_is_still_removed_and_rebuilt(
    codecache: FakeCodecache, settled: Path, tmp_path: Path
) -> None:
    """The early check only remembers acceptances: a header the compiler rejects is judged again by the
    look-up's own check, which removes it and has torch build it again, as without the early check."""
    settled.write_bytes(GOOD[:50])
    probe.check_headers_early([settled.name], settled.parent)
    _look_up(codecache)
    (use,) = probe.precompiled_headers_used()
    assert use["verdict"] == "rebuilt" and settled.read_bytes() == GOOD and codecache.builds == 1
