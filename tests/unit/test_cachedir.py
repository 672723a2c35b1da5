"""cachedir/: the session dir for each mode, atomic tagged creation, LRU eviction and touch()."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from typing import Callable

import pytest

from pytest_compilecache import ConfigError
from pytest_compilecache import _fs
from pytest_compilecache import cachedir
from pytest_compilecache.cachedir import LOCK_NAME
from pytest_compilecache.cachedir import SessionDir
from pytest_compilecache.cachedir.layout import shape_profile

T0 = 1_700_000_000  # fixed epoch seconds: eviction order never depends on the clock


def _dir_size(path: str) -> int:
    """Bytes of every file under ``path`` (what evict() measures against its cap)."""
    return sum(os.lstat(os.path.join(root, name)).st_size for root, _, files in os.walk(path) for name in files)


def _is_tagged(path: Path) -> bool:
    tag = (path / "CACHEDIR.TAG").read_text()
    return tag.startswith("Signature: 8a477f597d28d172789f06886806bc55") and (path / ".gitignore").read_text().endswith(
        "*\n"
    )


# ------------------------------------------------------------------------------------------------- decide()


@pytest.mark.parametrize("mode", [None, "disabled"])
def test_no_dir_for_passive_and_disabled(tmp_path: Path, mode: str | None) -> None:
    session = cachedir.decide(mode, str(tmp_path / "configured"), tmp_path / "default")
    assert session == SessionDir(mode=mode, path=None, owned=False)
    assert list(tmp_path.iterdir()) == []


def test_shared_defaults_inside_pytest_cache(tmp_path: Path) -> None:
    default = tmp_path / ".pytest_cache" / "compilecache"
    session = cachedir.decide("shared", None, default)
    assert session == SessionDir(mode="shared", path=str(default), owned=False)
    assert _is_tagged(default)
    assert session.describe() == f"shared:{default}"


def test_the_default_dir_made_first_makes_pytests_cache_dir_as_pytest_would(tmp_path: Path) -> None:
    """pytest writes .pytest_cache/.gitignore only when it makes that dir itself: made by us first, without one,
    what pytest writes there later (v/cache/lastfailed) showed in ``git status``."""
    pytest_cache = tmp_path / "repo" / ".pytest_cache"
    cachedir.decide("shared", None, pytest_cache / "d" / "compilecache")
    assert (pytest_cache / ".gitignore").read_text().splitlines()[-1] == "*"
    assert (pytest_cache / "CACHEDIR.TAG").read_text().startswith("Signature: 8a477f597d28d172789f06886806bc55\n")
    assert sorted(p.name for p in pytest_cache.iterdir()) == [".gitignore", "CACHEDIR.TAG", "README.md", "d"]
    assert not list(pytest_cache.parent.glob(".pytest-cache-new-*"))
    (lastfailed := pytest_cache / "v" / "cache" / "lastfailed").parent.mkdir(parents=True)
    lastfailed.write_text("{}")
    subprocess.run(["git", "init", "-q", str(pytest_cache.parent)], check=True)
    status = subprocess.run(["git", "status", "--porcelain"], cwd=pytest_cache.parent, capture_output=True, text=True)
    assert status.stdout == ""
    # pytest's own dir, already there, is left as it is.
    own = tmp_path / "other" / ".pytest_cache"
    own.mkdir(parents=True)
    cachedir.decide("shared", None, own / "d" / "compilecache")
    assert sorted(p.name for p in own.iterdir()) == ["d"]


def test_shared_uses_the_configured_dir_and_reuses_it(tmp_path: Path) -> None:
    configured = tmp_path / "a" / "b"
    first = cachedir.decide("shared", str(configured), tmp_path / "default")
    (configured / "entry").write_text("kept")
    second = cachedir.decide("shared", str(configured), tmp_path / "default")
    assert first == second
    assert first.path == str(configured)
    assert (configured / "entry").read_text() == "kept"
    assert not (tmp_path / "default").exists()
    # no temp sibling is left behind by the atomic creation
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["b"]


def test_shared_expands_the_home_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    session = cachedir.decide("shared", "~/cc", tmp_path / "default")
    assert session.path == str(tmp_path / "cc")


def test_shared_makes_a_relative_dir_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    session = cachedir.decide("shared", "rel/cc", tmp_path / "default")
    assert session.path == str(tmp_path / "rel" / "cc")


def test_isolated_makes_a_fresh_owned_dir_each_time(tmp_path: Path) -> None:
    parent = tmp_path / "parent"
    first = cachedir.decide("isolated", str(parent), tmp_path / "default")
    second = cachedir.decide("isolated", str(parent), tmp_path / "default")
    assert first.owned and second.owned
    assert first.path != second.path
    for session in (first, second):
        assert session.path is not None
        path = Path(session.path)
        assert path.parent == parent
        assert path.name.startswith("compilecache-")
        assert _is_tagged(path)
    cachedir.remove(first)
    assert not Path(str(first.path)).exists()
    assert Path(str(second.path)).is_dir()


def test_remove_leaves_dirs_it_does_not_own(tmp_path: Path) -> None:
    session = cachedir.decide("shared", str(tmp_path / "shared"), tmp_path / "default")
    cachedir.remove(session)
    cachedir.remove(SessionDir(mode="isolated", path=str(tmp_path / "shared"), owned=False))
    assert (tmp_path / "shared").is_dir()


@pytest.mark.parametrize("mode", ["shared", "isolated"])
def test_unusable_dir_names_the_option(tmp_path: Path, mode: str) -> None:
    # A regular file in the way: unwritable even for root, unlike chmod.
    blocker = tmp_path / "file"
    blocker.write_text("not a dir")
    with pytest.raises(ConfigError, match=r"^--compile-cache-dir: .*file"):
        cachedir.decide(mode, str(blocker / "sub"), tmp_path / "default")
    assert blocker.read_text() == "not a dir"


def test_a_file_as_the_shared_dir_names_the_option(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match=r"^--compile-cache-dir: .*not a writable directory"):
        cachedir.decide("shared", str(blocker), tmp_path / "default")


def test_make_dir_when_another_session_won_the_race(tmp_path: Path) -> None:
    target = tmp_path / "cc"
    target.mkdir()
    (target / "theirs").write_text("x")
    assert cachedir.make_dir(target) == target
    assert sorted(p.name for p in target.iterdir()) == ["theirs"]  # an existing dir is used as it is
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cc"]


def test_session_dir_travels_through_the_environment() -> None:
    session = SessionDir(mode="isolated", path="/tmp/compilecache-x", owned=True)
    again = SessionDir.from_env(session.to_env())
    assert (again.mode, again.path) == ("isolated", "/tmp/compilecache-x")
    assert again.owned is False  # a worker never removes the controller's dir


def test_describe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    assert SessionDir(mode=None, path=None).describe() == "unmanaged:torch default"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/elsewhere")
    assert SessionDir(mode=None, path=None).describe() == "unmanaged:/elsewhere"
    assert SessionDir(mode="disabled", path=None).describe() == "disabled"


# ---------------------------------------------------------------------------------------- evict(), touch()


def fx(name: str) -> str:
    """Where torch's FX-graph cache writes an entry (``fxgraph/<key[1:3]>/<key>/<entry>``, both hashes), one
    place per ``name``: only files in torch's places are ever trimmed."""
    digest = base64.b32encode(hashlib.sha256(name.encode()).digest()).decode().lower()
    key = "f" + digest[:51]
    return f"fxgraph/{key[1:3]}/{key}/{digest[1:52]}"


# aotautograd/<key>/<entry>, names from a real torch 2.13 run
AOT_ENTRY = (
    "aotautograd/auoymoijvmjyooomit354da75jwansovzwmihmmyoztnjqxv47jc/"
    "bu33q4jfx6pfnzuyv7ykh74vna55vzu63mgzkobronx2oxd4fz5"
)


def _file(root: Path, rel: str, size: int, atime: float, mtime: float | None = None) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    os.utime(path, (atime, atime if mtime is None else mtime))
    return path


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    root = cachedir.make_dir(tmp_path / "cache")
    (root / LOCK_NAME).write_text("")
    for marker in ("CACHEDIR.TAG", ".gitignore", LOCK_NAME):
        os.utime(root / marker, (T0 - 10_000, T0 - 10_000))  # the oldest files of all
    return root


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def test_evict_removes_least_recently_used_first(cache: Path) -> None:
    _file(cache, fx("aa/old"), 100, T0)
    _file(cache, fx("bb/mid"), 100, T0 + 10)
    _file(cache, fx("cc/new"), 100, T0 + 20)
    markers = sum(os.path.getsize(cache / m) for m in ("CACHEDIR.TAG", ".gitignore", LOCK_NAME))
    removed, freed = cachedir.evict(str(cache), markers + 150)
    assert (removed, freed) == (2, 200)
    assert _files(cache) == {"CACHEDIR.TAG", ".gitignore", LOCK_NAME, fx("cc/new")}
    # emptied subdirectories are gone as well
    assert not (cache / "fxgraph" / "aa").exists() and not (cache / "fxgraph" / "bb").exists()
    assert _dir_size(str(cache)) == markers + 100


def test_evict_uses_the_later_of_access_and_modification(cache: Path) -> None:
    _file(cache, fx("x/read_recently"), 100, atime=T0 + 100, mtime=T0)
    _file(cache, fx("x/written_recently"), 100, atime=T0, mtime=T0 + 50)
    _file(cache, fx("x/untouched"), 100, atime=T0 + 10, mtime=T0 + 10)
    cachedir.evict(str(cache), _dir_size(str(cache)) - 1)
    assert fx("x/untouched") not in _files(cache)
    assert {fx("x/read_recently"), fx("x/written_recently")} <= _files(cache)


def test_evict_under_the_cap_does_nothing(cache: Path) -> None:
    _file(cache, fx("sub/a"), 10, T0)
    (cache / "aotautograd" / "empty").mkdir(parents=True)
    os.utime(cache / "aotautograd" / "empty", (T0, T0))  # long empty: a fresh one may be about to be written into
    before = _files(cache)
    assert cachedir.evict(str(cache), 10**9) == (0, 0)
    assert _files(cache) == before
    assert not (cache / "aotautograd").exists()  # empty dirs of torch's layout are always tidied
    assert cache.is_dir()


def test_evict_keeps_markers_even_at_zero(cache: Path) -> None:
    _file(cache, fx("a"), 10, T0)
    _file(cache, fx("deep/er/b"), 10, T0)
    removed, freed = cachedir.evict(str(cache), 0)
    assert (removed, freed) == (2, 20)
    assert _files(cache) == {"CACHEDIR.TAG", ".gitignore", LOCK_NAME}
    assert [p.name for p in cache.iterdir() if p.is_dir()] == []


def test_files_of_yours_in_torchs_dirs_are_never_trimmed(cache: Path) -> None:
    """Only a file in the place torch writes one is torch's: notes, a repository or results put under
    ``fxgraph/`` or ``aotautograd/`` stay, even at a cap of 0."""
    yours = {"fxgraph/NOTES.md", "fxgraph/.git/config", "fxgraph/deep/CACHEDIR.TAG",
             "aotautograd/my-experiment/results.csv", fx("x").rsplit("/", 1)[0] + "/notes.txt"}  # fmt: skip
    for rel in yours:
        _file(cache, rel, 10, T0)
    _file(cache, fx("a"), 10, T0)
    _file(cache, AOT_ENTRY, 10, T0)
    _file(cache, AOT_ENTRY.rsplit("/", 1)[0].replace("auoy", "a5zo") + "/entry", 10, T0)  # torch 2.7.1's name
    assert cachedir.evict(str(cache), 0) == (3, 30)
    assert _files(cache) == {"CACHEDIR.TAG", ".gitignore", LOCK_NAME, *yours}


def test_our_tag_does_not_make_every_file_in_the_dir_ours(tmp_path: Path) -> None:
    # An empty dir given as the cache dir gets our tag (--compile-cache-dir=/tmp in a fresh container);
    # what others put there later is not the cache's and is never trimmed, nor are dirs outside torch's layout.
    root = cachedir.make_dir(tmp_path / "tmp")
    layout = _torch_layout(root)
    others = {"NOTES.md": b"notes", "other-app/data.db": b"db", "pytest-of-me/pytest-7/result.txt": b"r"}
    for rel, data in others.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    (root / "other-app" / "empty").mkdir()
    result = cachedir.trim(str(root), 0)
    assert (result.kind, result.removed) == ("ours", len(layout) - 1)  # all of torch's but its lock file
    for rel, data in others.items():
        assert (root / rel).read_bytes() == data
    assert (root / "other-app" / "empty").is_dir()


def test_touch_protects_files_from_eviction(cache: Path) -> None:
    _file(cache, fx("used/by_last_session"), 100, T0)
    _file(cache, fx("unused"), 100, T0 + 10)
    written = int(T0) * 10**9 + 123_456_789  # a float of seconds would lose the last digits
    os.utime(cache / fx("used/by_last_session"), ns=(written, written))
    cachedir.touch(str(cache), [fx("used/by_last_session"), "vanished/meanwhile"])
    stat = os.stat(cache / fx("used/by_last_session"))
    assert stat.st_atime > T0 + 10
    assert stat.st_mtime_ns == written  # content age is kept, to the nanosecond
    cachedir.evict(str(cache), _dir_size(str(cache)) - 1)
    assert fx("used/by_last_session") in _files(cache)
    assert fx("unused") not in _files(cache)


@pytest.mark.parametrize(
    ("name", "job_id", "theirs"),
    [
        ("code_state_pytest-compilecache_None_.pkl", "pytest-compilecache", True),
        ("code_state_ci_3_tagged.pkl", "ci", True),  # a distributed rank and a cache_key_tag
        ("code_state_a_b_None_.pkl", "a:b", True),  # torch makes <>:"/\\|?* a "_"
        ("code_state_ci_nightly_None_.pkl", "ci", False),  # another job id that starts with this one
        ("code_state_ci_None_.pkl.lock", "ci", False),
        ("code_state_ci_None_.pkl.tmp", "ci", False),
        ("entry", "ci", False),
    ],
)
def test_shape_profile_names_the_profile_torch_keeps_for_a_job_id(name: str, job_id: str, theirs: bool) -> None:
    assert shape_profile(name, job_id) is theirs


def test_a_shape_profile_marked_used_outlives_older_files_under_a_cap(cache: Path) -> None:
    profile = _file(cache, "dynamo/code_state_ci_None_.pkl", 100, T0)  # read by every session, rewritten by none
    _file(cache, "dynamo/code_state_other_None_.pkl", 100, T0 + 5)
    _file(cache, fx("aa/newer"), 100, T0 + 10)
    assert cachedir.shape_profiles(str(cache), "ci") == ["dynamo/code_state_ci_None_.pkl"]
    assert cachedir.shape_profiles(str(cache / "fxgraph"), "ci") == []  # no dynamo/ there
    cachedir.touch(str(cache), cachedir.shape_profiles(str(cache), "ci"))
    cachedir.evict(str(cache), _dir_size(str(cache)) - 150)
    assert profile.is_file() and profile.stat().st_mtime == T0
    assert {fx("aa/newer"), "dynamo/code_state_other_None_.pkl"} & _files(cache) == set()


def test_lock_is_a_file_lock_inside_the_dir(tmp_path: Path) -> None:
    with cachedir.lock(str(tmp_path), timeout=5) as held:
        assert held.is_locked
    assert (tmp_path / LOCK_NAME).exists()


def test_a_link_planted_as_the_lock_file_is_never_followed(tmp_path: Path) -> None:
    """Whoever can write a shared cache dir cannot make the lock truncate a file elsewhere."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / LOCK_NAME).symlink_to(victim)
    with pytest.raises(OSError), cachedir.lock(str(cache), timeout=1):
        pass
    assert victim.read_text() == "precious"


# ------------------------------------------------------------------------------------------- ownership()

KEY = "c3g2mqobe6g24e353lemr6cpzfcmocdsk5rbq3mousrlfxbh7zgy"  # a real torch 2.13 kernel key
TRITON_KEY = "4QDT2XNNBLC5IBCOBWMDKNTIDWAVBOHOVQG2FWDX6NQSJTCT6YHQ"  # triton 3's shape: base32 of a sha256


def _torch_layout(root: Path) -> set[str]:
    """What torch 2.13 leaves after compiling a pointwise op on CPU (names from a real run)."""
    files = {
        f"{KEY[1:3]}/{KEY}.cpp": 300, f"{KEY[1:3]}/{KEY}.so": 900, f"dg/cdg3{KEY[4:]}.py": 200,
        f"4n/c4n{KEY[3:]}.main.cpp": 100, fx("xd/fxkey/entry"): 400, AOT_ENTRY: 50,
        f"locks/{KEY}.lock": 0, f"triton/0/{TRITON_KEY}/triton_poi_fused_0.json": 10,
    }  # fmt: skip
    for rel, size in files.items():
        _file(root, rel, size, T0)
    return set(files)


def test_ownership_kinds(tmp_path: Path) -> None:
    assert cachedir.ownership(tmp_path / "missing").kind == "missing"
    (tmp_path / "empty").mkdir()
    assert cachedir.ownership(tmp_path / "empty").kind == "empty"
    assert cachedir.ownership(cachedir.make_dir(tmp_path / "ours")).kind == "ours"
    _torch_layout(tmp_path / "torch")
    assert cachedir.ownership(tmp_path / "torch").kind == "torch"
    # A dir the Action's restore step filled: torch's layout and the blobs it staged for the pytest step.
    _file(tmp_path / "torch", ".compilecache-pending/" + "a" * 64 + ".bin", 10, T0)
    assert cachedir.ownership(tmp_path / "torch").kind == "torch"
    project = tmp_path / "project"
    _torch_layout(project)
    (project / "NOTES.md").write_text("notes")
    assert cachedir.ownership(project) == cachedir.Ownership("foreign", ("NOTES.md",))


@pytest.mark.parametrize(
    "rel",
    [
        "go/bin/tool",  # a two-character dir that does not hold torch's hash-named files
        "ab/README",
        "CACHEDIR.TAG/x",  # our marker's name, but a dir
    ],
)
def test_ownership_of_look_alikes_is_foreign(tmp_path: Path, rel: str) -> None:
    _file(tmp_path, rel, 1, T0)
    assert cachedir.ownership(tmp_path).kind == "foreign"


def test_a_generic_cachedir_tag_is_not_ours(tmp_path: Path) -> None:
    # pytest's and cargo's cache dirs carry the same CACHEDIR.TAG signature: only our line makes a dir ours.
    (tmp_path / "CACHEDIR.TAG").write_text("Signature: 8a477f597d28d172789f06886806bc55\n# created by pytest.\n")
    (tmp_path / "v").mkdir()
    assert cachedir.ownership(tmp_path).kind == "foreign"


def test_a_link_in_place_of_a_torch_dir_is_foreign(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "fxgraph").symlink_to(tmp_path / "elsewhere")
    assert cachedir.ownership(tmp_path / "cache").kind == "foreign"


def _user_files(root: Path) -> dict[str, bytes]:
    _file(root, "NOTES.md", 6, T0)
    _file(root, "src/model.bin", 2000, T0)
    _file(root, ".git/objects/ab/cdef0123456789abcdef0123456789abcdef01", 30, T0)
    _file(root, "ab/user-file", 5, T0)
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_a_foreign_shared_dir_is_refused_and_left_alone(tmp_path: Path) -> None:
    before = _user_files(tmp_path / "project")
    with pytest.raises(ConfigError, match=r"^--compile-cache-dir: .*project is not a compile cache.*(NOTES\.md|ab)"):
        cachedir.decide("shared", str(tmp_path / "project"), tmp_path / "default")
    project = tmp_path / "project"
    after = {str(p.relative_to(project)): p.read_bytes() for p in project.rglob("*") if p.is_file()}
    assert after == before  # not even a tag or a probe file was written


def test_a_foreign_dir_is_a_fine_parent_for_isolated_dirs(tmp_path: Path) -> None:
    before = _user_files(tmp_path)
    session = cachedir.decide("isolated", str(tmp_path), tmp_path / "default")
    assert session.path is not None and Path(session.path).parent == tmp_path
    cachedir.remove(session)
    assert {str(p.relative_to(tmp_path)): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_a_torch_dir_is_used_as_it_is(tmp_path: Path) -> None:
    layout = _torch_layout(tmp_path / "torchinductor_me")
    session = cachedir.decide("shared", str(tmp_path / "torchinductor_me"), tmp_path / "default")
    assert session.path == str(tmp_path / "torchinductor_me")
    assert _files(tmp_path / "torchinductor_me") == layout  # not tagged: it is torch's, not ours


def test_an_empty_dir_becomes_ours(tmp_path: Path) -> None:
    (tmp_path / "given").mkdir()
    cachedir.decide("shared", str(tmp_path / "given"), tmp_path / "default")
    assert cachedir.ownership(tmp_path / "given").kind == "ours"
    assert _is_tagged(tmp_path / "given")


def test_remove_needs_our_tag_even_when_owned(tmp_path: Path) -> None:
    (tmp_path / "untagged").mkdir()
    (tmp_path / "untagged" / "file").write_text("x")
    cachedir.remove(SessionDir(mode="isolated", path=str(tmp_path / "untagged"), owned=True))
    assert (tmp_path / "untagged" / "file").exists()


# ------------------------------------------------------------------------------------------------ trim()


def test_trim_in_a_torch_dir_removes_only_torch_files(tmp_path: Path) -> None:
    root = tmp_path / "torchinductor_me"
    layout = _torch_layout(root)
    result = cachedir.trim(str(root), 0)
    assert result.kind == "torch"
    kept = _files(root)
    # every cache file went but torch's lock files (removing a held lock file would split the lock)
    assert kept == {f"locks/{KEY}.lock", cachedir.LOCK_NAME}
    assert result.removed == len(layout) - 1
    assert result.freed == 300 + 900 + 200 + 100 + 400 + 50 + 10
    assert result.describe() == f"trimmed the cache dir: removed {len(layout) - 1} least recently used files, " + (
        "1.9 KiB (1.9 KiB -> 0 B)"
    )


def test_trim_never_touches_a_foreign_dir(tmp_path: Path) -> None:
    """The issue's recipe, at unit level: a project root given as the dir, a 1K cap."""
    before = _user_files(tmp_path)
    _torch_layout(tmp_path)  # torch did write its kernel dirs there
    result = cachedir.trim(str(tmp_path), 1024)
    assert (result.kind, result.removed, result.freed) == ("foreign", 0, 0)
    assert result.describe() is not None and "not a compile cache" in result.describe()  # type: ignore[operator]
    for rel, data in before.items():
        assert (tmp_path / rel).read_bytes() == data
    assert cachedir.evict(str(tmp_path), 0) == (0, 0)


def test_trim_keeps_what_changed_after_it_began(cache: Path) -> None:
    _file(cache, fx("aa/entry"), 100, T0)
    changed = os.stat(cache / fx("aa/entry")).st_ctime  # utime changes ctime: "now"
    result = cachedir.trim(str(cache), 0, now=changed)
    assert (result.removed, result.freed) == (0, 0)
    assert fx("aa/entry") in _files(cache)
    assert cachedir.trim(str(cache), 0).removed == 1


def _other_session(path: Path) -> subprocess.Popen[str]:
    """Another live process registered in ``path`` (until its stdin closes, or it is killed)."""
    code = (
        "import sys\nfrom pytest_compilecache import cachedir\n"
        f"cachedir.register_session({str(path)!r})\nprint('registered', flush=True)\nsys.stdin.read()\n"
    )
    process = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    line = process.stdout.readline()
    process.stdout.close()
    assert line == "registered\n"
    return process


def _end(process: subprocess.Popen[str], *, kill: bool = False) -> None:
    if kill:
        process.kill()
    assert process.stdin is not None
    with contextlib.suppress(BrokenPipeError):
        process.stdin.close()
    process.wait(timeout=60)


def test_trim_is_deferred_while_another_session_is_live(cache: Path) -> None:
    _file(cache, fx("aa/entry"), 100, T0)
    (cache / "fxgraph" / "empty").mkdir()
    os.utime(cache / "fxgraph" / "empty", (T0, T0))  # long empty: a fresh one is kept, as torch may use it now
    other = _other_session(cache)
    try:
        result = cachedir.trim(str(cache), 0)
        assert (result.removed, result.deferred) == (0, 1)
        assert result.describe() is not None and "deferred: 1 other session is using it" in result.describe()  # type: ignore[operator]
        assert fx("aa/entry") in _files(cache)
        assert (cache / "fxgraph" / "empty").is_dir()  # torch may be about to write into it
    finally:
        _end(other)
    after = cachedir.trim(str(cache), 0)
    assert (after.removed, after.deferred) == (1, 0)
    assert not (cache / "fxgraph").exists()


def test_a_killed_sessions_registration_does_not_block_trimming(cache: Path) -> None:
    _file(cache, fx("aa/entry"), 100, T0)
    other = _other_session(cache)
    assert len(cachedir.live_sessions(str(cache))) == 1
    _end(other, kill=True)
    assert cachedir.live_sessions(str(cache)) == []  # the lock died with it...
    assert os.listdir(cache / cachedir.SESSIONS_DIR) == []  # ...and its marker is cleared away
    assert cachedir.trim(str(cache), 0).removed == 1


def test_own_registration_does_not_defer_own_trim(cache: Path) -> None:
    _file(cache, fx("aa/entry"), 100, T0)
    with cachedir.register_session(str(cache)) as registration:
        assert [s.pid for s in cachedir.live_sessions(str(cache))] == [os.getpid()]
        assert cachedir.live_sessions(str(cache), excluding=registration.marker) == []
        assert cachedir.trim(str(cache), 0, registration=registration).removed == 1
        assert os.path.exists(registration.marker)
    assert not os.path.exists(registration.marker)
    assert cachedir.trim(str(cache), 0).removed == 0  # registrations are never trimmed, nor counted as cache


def test_a_cap_that_removes_what_this_session_used_says_so(cache: Path) -> None:
    # Issue 29: a cap smaller than one session's files removed them all silently; the next run hit nothing.
    _file(cache, fx("aa/before"), 100, T0)  # last used before the session began
    _file(cache, fx("bb/used"), 100, T0 + 100)  # used (read or written) by the session
    _file(cache, fx("cc/also"), 100, T0 + 200)
    with cachedir.register_session(str(cache), start=T0 + 50) as registration:
        result = cachedir.trim(str(cache), 0, registration=registration)
        assert (result.removed, result.session_files) == (3, 2)
        assert result.too_small("--compile-cache-max-size", 1024) == (
            "--compile-cache-max-size (1.0 KiB) is smaller than what this session used: the trim removed 2 files "
            "it used, which the next run compiles again; raise the cap"
        )
    _file(cache, fx("aa/before"), 100, T0)
    with cachedir.register_session(str(cache), start=T0 + 50) as registration:
        quiet = cachedir.trim(str(cache), 0, registration=registration)
    assert (quiet.removed, quiet.session_files, quiet.too_small("c", 1)) == (1, 0, None)  # older files only
    _file(cache, fx("aa/before"), 100, T0 + 100)
    assert cachedir.trim(str(cache), 0).session_files == 0  # no session to compare with
    # Files the session used within MIN_AGE are kept (torch may still use them): the dir stays over the cap.
    _file(cache, fx("dd/fresh"), 100, time.time())
    _file(cache, fx("ee/others"), 100, time.time())  # used just now, but by another process
    with cachedir.register_session(str(cache), start=T0 + 50) as registration:
        kept = cachedir.trim(str(cache), 0, registration=registration, used=frozenset({fx("dd/fresh")}))
    assert (kept.removed, kept.session_kept) == (0, 1)
    assert "1 file it used keep the dir at" in (kept.too_small("--compile-cache-max-size", 10) or "")
    with cachedir.register_session(str(cache), start=T0 + 50) as registration:
        theirs = cachedir.trim(str(cache), 0, registration=registration)  # this session used nothing
    assert (theirs.session_kept, theirs.too_small("c", 10)) == (0, None)
    with cachedir.register_session(str(cache), start=T0 + 50) as registration:  # it compiled: recent files count
        compiled = cachedir.trim(str(cache), 0, registration=registration, compiled=True)
    assert compiled.session_kept == 2


def test_a_session_run_in_process_never_trims_under_its_host(cache: Path) -> None:
    # pytest.main() inside a test: two sessions of one process share the dir; each one's own registration
    # is the only one its trim may ignore (every registration of the process was ignored before).
    _file(cache, fx("aa/entry"), 100, T0)
    with cachedir.register_session(str(cache)), cachedir.register_session(str(cache)) as inner:
        result = cachedir.trim(str(cache), 0, registration=inner)
        assert (result.removed, result.deferred) == (0, 1)
    assert (cache / fx("aa/entry")).exists()


def test_a_planted_link_for_the_registrations_is_never_followed(tmp_path: Path) -> None:
    cache = cachedir.make_dir(tmp_path / "cc")
    _file(cache, fx("aa/entry"), 100, T0)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    victim = elsewhere / "1-0000abcd-1-0"  # a marker's name, unlocked: it would be swept as a dead session's
    victim.write_text("not ours")
    (cache / cachedir.SESSIONS_DIR).symlink_to(elsewhere)
    assert cachedir.live_sessions(str(cache)) == [cachedir.UNKNOWN_SESSION]  # who knows: nothing is trimmed
    assert cachedir.trim(str(cache), 0).removed == 0
    assert cachedir.sweep_dead_writers(str(cache), now=T0 + 10 * cachedir.STALE_AFTER) == 0
    with pytest.raises(OSError):
        cachedir.register_session(str(cache))  # no marker written through the link
    assert os.listdir(elsewhere) == [victim.name] and victim.read_text() == "not ours"


def test_trim_stops_when_a_session_registers_meanwhile(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for index in range(5):
        _file(cache, fx(f"aa/e{index}"), 10, T0 + index)
    checks = iter([[], [], [], [cachedir.LiveSession(1, T0, True)]])  # before: the count; then per removal
    monkeypatch.setattr(cachedir.registry, "live_sessions", lambda path, excluding=None: next(checks))
    result = cachedir.trim(str(cache), 0)
    assert (result.removed, result.freed, result.stopped) == (2, 20, True)
    assert {fx(f"aa/e{i}") for i in (2, 3, 4)} <= _files(cache)
    assert result.describe() is not None and "stopped early" in result.describe()  # type: ignore[operator]


def _during_trim(monkeypatch: pytest.MonkeyPatch, act: Callable[[], None]) -> None:
    """Run ``act`` inside trim, after its scan and right before its first removal (where a peer could act)."""
    calls = {"n": 0}

    def live_sessions(path: str, excluding: str | None = None) -> list[cachedir.LiveSession]:
        calls["n"] += 1
        if calls["n"] == 2:  # 1: the count before trimming; 2: the check before the first removal
            act()
        return []

    monkeypatch.setattr(cachedir.registry, "live_sessions", live_sessions)


def test_trim_keeps_a_file_replaced_after_its_scan(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # torch's write_atomic renames a new file over the old one: the name is the same, the file is not.
    target = _file(cache, fx("aa/entry"), 100, T0)

    def rewrite() -> None:
        fresh = target.with_name(".entry.tmp")
        fresh.write_bytes(b"y" * 100)
        os.utime(fresh, (T0, T0))  # even with an old time: another inode, so not the file scanned
        os.replace(fresh, target)

    _during_trim(monkeypatch, rewrite)
    result = cachedir.trim(str(cache), 0)
    assert result.removed == 0
    assert target.read_bytes() == b"y" * 100


def test_trim_never_follows_a_dir_swapped_for_a_link(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = "id_ed25519_" + "a" * 20
    _file(cache, f"fxgraph/zz/{name}", 100, T0)
    outside = tmp_path / "home" / ".ssh"
    outside.mkdir(parents=True)
    (outside / name).write_text("secret")

    def swap() -> None:
        os.rename(cache / "fxgraph" / "zz", cache / "fxgraph" / "aside")
        (cache / "fxgraph" / "zz").symlink_to(outside)

    _during_trim(monkeypatch, swap)
    cachedir.trim(str(cache), 0)
    assert (outside / name).read_text() == "secret"
    assert outside.is_dir()


# ---------------------------------------------------------------------------------------- sweep_dead_writers()


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait(timeout=60)
    return process.pid


def _fs_name(dead: int, kind: str, lead: str) -> str:
    """What ``_fs.temp_name(kind, lead)`` returned in process ``dead`` on this host."""
    name = _fs.temp_name(kind, lead=lead)  # type: ignore[arg-type]
    owner = _fs.parse_temp_name(name)
    assert owner is not None and owner.pid == os.getpid()
    return name.replace(f"-{owner.host}-{owner.pid}-", f"-{owner.host}-{dead}-")


def test_sweep_removes_dead_owners_temp_files_only(cache: Path) -> None:
    dead, host = _dead_pid(), "0123abcd"  # older versions' names carried a host id of their own
    ours_dead = {
        "ab/" + _fs_name(dead, "tmp", ".k.so."),  # _fs.atomic_file of a killed unpack, in a kernel dir
        _fs_name(dead, "staging", ".") + "/files/x",  # install's staging dir of a killed restore
        f"{cachedir.SESSIONS_DIR}/" + _fs_name(dead, "tmp", "."),  # a registration killed while being made
    }
    legacy = {
        f"ab/.k.so.{dead}-{host}.abcd_123.tmp",  # atomic_file's name in older versions
        f"{cachedir.TEMP_PREFIX}{dead}-{host}-123-staging/files/x",  # an older version's staging dir
        f"ab/.k.so.{os.getpid()}-{host}.abcd_123.tmp",
        "ab/.k.so.abcdefgh.tmp",  # older still: no owner at all
    }
    torch_dead = f"ab/.{dead}.140234.tmp"  # torch's write_atomic in a killed process
    torch_alive = f"ab/.{os.getpid()}.140234.tmp"
    fs_alive = "ab/" + _fs.temp_name("tmp", lead=".k2.so.")  # this live process's own write in progress
    # Look-alikes: never swept (in torch's fxgraph/: a kernel dir holding them would not be torch's at all).
    never = {f"fxgraph/aa/.{dead}.1.tmp.fresh", "fxgraph/aa/user.tmp", f"fxgraph/aa/.{dead}-{host}.abcdefgh.tmp.x"}
    for rel in ours_dead | legacy | never | {torch_dead, torch_alive, fs_alive}:
        _file(cache, rel, 1, T0)
    now = time.time()
    # What a killed owner on this host left goes at once (it cannot come back)...
    assert cachedir.sweep_dead_writers(str(cache), now=now) == 3
    assert not _files(cache) & ours_dead and not [p for p in cache.iterdir() if "compilecache-staging" in p.name]
    # ...torch's names carry no host: the dead-looking pid may live elsewhere, so the file must also have
    # stopped changing (ctime cannot be set back: the sweep's clock moves forward instead)...
    assert cachedir.sweep_dead_writers(str(cache), now=now + cachedir.TORCH_TEMP_GRACE + 1) == 1
    assert torch_dead not in _files(cache)
    # ...older versions' names, and torch's of a live pid untouched for an hour, only by age.
    assert legacy <= _files(cache)
    assert cachedir.sweep_dead_writers(str(cache), now=now + cachedir.STALE_AFTER + 1) == len(legacy) + 1
    # A name of _fs.temp_name whose owner lives is kept for a day (then its pid may have been reused).
    assert fs_alive in _files(cache)
    assert cachedir.sweep_dead_writers(str(cache), now=now + _fs.MAX_AGE_ALIVE + 1) == 1
    assert _files(cache) - {"CACHEDIR.TAG", ".gitignore", cachedir.LOCK_NAME} == never


def test_sweep_never_enters_a_foreign_dir(tmp_path: Path) -> None:
    dead = _dead_pid()
    _user_files(tmp_path)
    _file(tmp_path, f"src/.{dead}.1.tmp", 1, T0)
    _file(tmp_path, f".k.so.{os.getpid()}-0123abcd.abcdefgh.tmp", 1, T0)
    _file(tmp_path, _fs_name(dead, "tmp", ".k.so."), 1, T0)
    assert cachedir.sweep_dead_writers(str(tmp_path), now=time.time() + 10 * cachedir.STALE_AFTER) == 0
    assert (tmp_path / f"src/.{dead}.1.tmp").exists()


def test_sweep_clears_a_killed_sessions_registration(cache: Path) -> None:
    other = _other_session(cache)
    _end(other, kill=True)
    assert len(os.listdir(cache / cachedir.SESSIONS_DIR)) == 1
    cachedir.sweep_dead_writers(str(cache))
    assert os.listdir(cache / cachedir.SESSIONS_DIR) == []


def test_registering_and_probing_leave_only_the_marker(tmp_path: Path) -> None:
    """make_dir's write probe and a registration's temp name are _fs names, gone once they are done."""
    root = cachedir.make_dir(tmp_path / "cc")
    with cachedir.register_session(str(root)):
        assert [name for name in os.listdir(root) if "compilecache-tmp" in name] == []
        (marker,) = os.listdir(root / cachedir.SESSIONS_DIR)
        assert _fs.parse_temp_name(marker) is None and marker.startswith(f"{os.getpid()}-{_fs.host_tag()}-")


# ------------------------------------------------------------------------------- paths torch can build in


@pytest.mark.parametrize("char", [" ", "\t", "'", '"', "\\", "\n"])
def test_unsafe_paths_are_named(char: str) -> None:
    assert cachedir.unsafe_dir_reason(f"/home/me/my{char}project") is not None


@pytest.mark.parametrize("char", ["$", "#", ";", "&", "(", "*", ":", ",", "=", "@", "+", "~", "%", "é", "!"])
def test_characters_torch_builds_with_are_safe(char: str) -> None:
    # Each one compiled and ran a C++ kernel with torch 2.13 on CPU (see the module docstring).
    assert cachedir.unsafe_dir_reason(f"/home/me/my{char}project") is None


@pytest.mark.parametrize("mode", ["shared", "isolated"])
def test_an_explicit_dir_with_a_space_is_refused(tmp_path: Path, mode: str) -> None:
    with pytest.raises(ConfigError, match=r"^--compile-cache-dir: .*my cache contains a space"):
        cachedir.decide(mode, str(tmp_path / "my cache"), tmp_path / "default")
    assert not (tmp_path / "my cache").exists()


def test_a_default_dir_with_a_space_falls_back(tmp_path: Path) -> None:
    default = tmp_path / "my project" / ".pytest_cache" / "d" / "compilecache"
    session = cachedir.decide("shared", None, default)
    assert session.path is not None and cachedir.unsafe_dir_reason(session.path) is None
    assert session.path == str(cachedir.fallback_dir(default))
    assert session.note is not None and str(default) in session.note and session.path in session.note
    assert "contains a space" in session.note
    assert not default.exists()
    again = cachedir.decide("shared", None, default)  # the same project gets the same dir back
    other = cachedir.decide("shared", None, tmp_path / "other project" / "cc")
    assert again.path == session.path != other.path
    root = Path(session.path).parent
    assert root.name == f"pytest-compilecache-{os.getuid()}"
    assert stat.S_IMODE(root.stat().st_mode) == 0o700


def test_an_isolated_default_in_a_temp_dir_with_a_space_falls_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spaced = tmp_path / "temp dir"
    spaced.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spaced))
    session = cachedir.decide("isolated", None, tmp_path / "default")
    assert session.path is not None and cachedir.unsafe_dir_reason(session.path) is None
    assert session.note is not None and "temp dir" in session.note
    cachedir.remove(session)
    assert not Path(session.path).exists()


def test_a_planted_fallback_root_is_not_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = tmp_path / "tmp"
    base.mkdir()
    (base / f"pytest-compilecache-{os.getuid()}").symlink_to(tmp_path)  # someone else's link in /tmp
    monkeypatch.setattr(tempfile, "tempdir", str(base))
    root = cachedir.fallback_dir(Path("/x y")).parent
    assert root != base / f"pytest-compilecache-{os.getuid()}"
    assert not root.is_symlink()


# ------------------------------------------------------------------------------------------ renew()


def test_a_registration_renews_itself_after_its_dir_was_cleared(tmp_path: Path) -> None:
    root = cachedir.make_dir(tmp_path / "cc")
    registration = cachedir.register_session(str(root))
    first = registration.marker
    registration.renew()
    assert registration.marker == first  # still in place: nothing to do
    shutil.rmtree(root)  # --cache-clear removed .pytest_cache and the dir in it
    cachedir.make_dir(root)
    registration.renew()
    assert registration.marker != first and os.path.exists(registration.marker)
    assert len(cachedir.live_sessions(str(root))) == 1
    registration.close()
    registration.renew()  # closed: stays closed
    assert os.listdir(root / cachedir.SESSIONS_DIR) == []


def test_trim_leaves_temp_files_to_the_sweep(cache: Path) -> None:
    """A temp file is being written by someone (or waits for sweep_dead_writers): trimming never takes it, nor its
    siblings in a kernel dir (torch is writing there: issue 28.4)."""
    folder = KEY[1:3]
    temps = {
        f"{folder}/.k.so.abcdefgh.tmp", f"{folder}/.{os.getpid()}.1.tmp",
        _fs.temp_name("staging", lead=".") + "/files/x",
    }  # fmt: skip
    for rel in temps:
        _file(cache, rel, 100, T0)
    _file(cache, f"{folder}/{KEY}.so", 100, T0)  # a kernel beside a write in flight
    _file(cache, f"dg/cdg3{KEY[4:]}.so", 100, T0)  # a kernel alone in its dir
    result = cachedir.trim(str(cache), 0)
    assert (result.removed, result.freed) == (1, 100)
    assert temps | {f"{folder}/{KEY}.so"} <= _files(cache)


def test_fresh_dir_is_tagged_and_removed_only_while_tagged(tmp_path: Path) -> None:
    fresh = cachedir.fresh_dir(tmp_path, prefix="compilecache-test-")
    assert fresh.parent == tmp_path and fresh.name.startswith("compilecache-test-") and _is_tagged(fresh)
    (fresh / "CACHEDIR.TAG").unlink()  # no longer provably ours
    assert cachedir.remove_dir(fresh) is False and fresh.is_dir()
    again = cachedir.fresh_dir(tmp_path)
    assert cachedir.remove_dir(again) is True and not again.exists()


def test_fresh_dir_defaults_to_a_temp_dir_torch_can_build_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spaced = tmp_path / "temp dir"
    spaced.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spaced))
    fresh = cachedir.fresh_dir()
    assert cachedir.unsafe_dir_reason(str(fresh)) is None and " " not in str(fresh)
    parent, note = cachedir.safe_temp_dir()
    assert fresh.parent == parent and note is not None and str(spaced) in note
    assert cachedir.remove_dir(fresh)


def test_try_flock_tells_a_held_lock_from_a_free_one(tmp_path: Path) -> None:
    """The one non-blocking flock probe (registrations here, torch's header build locks in pch.locks)."""
    from pytest_compilecache._fs import try_flock

    path = tmp_path / "lock"
    path.touch()
    first, second = os.open(path, os.O_RDWR), os.open(path, os.O_RDWR)
    try:
        assert try_flock(first)  # free: taken
        assert not try_flock(second)  # another open file holds it: neither kind is granted
        assert not try_flock(second, shared=True)
        os.close(first)
        first = -1
        assert try_flock(second, shared=True)  # released with its file
    finally:
        for fd in (first, second):
            if fd >= 0:
                os.close(fd)
    closed = os.open(path, os.O_RDONLY)
    os.close(closed)
    with pytest.raises(OSError):
        try_flock(closed)  # a bad descriptor is an error, not "held"


def test_host_tags_tell_machines_apart_even_in_their_initial_pid_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every machine's initial pid namespace reads the same; with one host name, two machines sharing a
    # network dir had one tag, so each took the other's live temp files for a dead local process's.
    import builtins
    import socket

    monkeypatch.setattr(socket, "gethostname", lambda: "runner")
    monkeypatch.setattr(os, "readlink", lambda path: "pid:[4026531836]")
    real_open, read_boot_id = builtins.open, _fs.boot_id.__wrapped__
    tags, boots = [], []
    for boot in ("11111111-aaaa-bbbb-cccc-dddddddddddd", "22222222-aaaa-bbbb-cccc-dddddddddddd", "not an id"):

        def fake_open(path: Any, *args: Any, boot: str = boot, **kwargs: Any) -> Any:
            if str(path) == "/proc/sys/kernel/random/boot_id":
                return io.BytesIO(boot.encode() + b"\n")
            return real_open(path, *args, **kwargs)

        monkeypatch.setattr(builtins, "open", fake_open)
        boots.append(read_boot_id())
        monkeypatch.setattr(_fs, "boot_id", lambda boot=boots[-1]: boot)
        tags.append(_fs.host_tag.__wrapped__())
    assert boots == ["11111111-aaaa-bbbb-cccc-dddddddddddd", "22222222-aaaa-bbbb-cccc-dddddddddddd", ""]
    assert len(set(tags)) == 3


def test_tagging_never_writes_through_a_planted_link(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    target = tmp_path / "dir"
    target.mkdir()
    (target / "CACHEDIR.TAG").symlink_to(victim)  # planted after the dir was found empty
    with pytest.raises(OSError):
        cachedir.owner.tag(target)
    assert victim.read_text() == "precious"
    (target / "CACHEDIR.TAG").unlink()
    (target / "CACHEDIR.TAG").write_text("a session racing us tagged it first")
    cachedir.owner.tag(target)  # no error: left as it is
    assert (target / ".gitignore").is_file()


def test_touch_marks_a_link_never_its_target(cache: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.write_text("x")
    os.utime(outside, (T0, T0))
    (cache / "fxgraph").mkdir()
    (cache / "fxgraph" / "link").symlink_to(outside)
    cachedir.touch(str(cache), ["fxgraph/link"])
    assert os.stat(outside).st_atime == T0


def test_a_two_character_dir_that_is_not_a_kernel_dir_is_neither_trimmed_nor_swept(tmp_path: Path) -> None:
    # In a dir we tagged (an empty /tmp handed to us), ``db/`` with a hash-like backup name and a build
    # tool's temp-like names elsewhere are not torch's: no trim and no sweep takes them.
    root = cachedir.make_dir(tmp_path / "tmp")
    kept = {
        "db/postgres_data_backup_2024.sql": T0,
        "db/README": T0,
        "myproject/.report.abcd1234.tmp": T0,
        "myproject/build/.4242.1.tmp": T0,
    }
    for rel, when in kept.items():
        _file(root, rel, 10, when)
    (root / "db" / "empty").mkdir()
    (root / "zz").mkdir()  # empty, kernel-dir-like: someone's; a trim removes only dirs it emptied itself
    assert cachedir.trim(str(root), 0).removed == 0
    assert (root / "zz").is_dir()
    assert cachedir.sweep_dead_writers(str(root), now=T0 + 10 * cachedir.STALE_AFTER + time.time()) == 0
    assert set(kept) <= _files(root) and (root / "db" / "empty").is_dir()


def test_empty_hash_dirs_left_by_an_interrupted_trim_go_next_time(cache: Path) -> None:
    # A trim stopped between emptying ab/<hash>/ and removing it leaves it empty; the next trim removes it
    # (inside a dir that holds only hash-named entries), while an empty two-character dir it did not empty stays.
    leftover = cache / "ab" / ("cab" + "h" * 49)
    leftover.mkdir(parents=True)
    os.utime(leftover, (T0, T0))  # left long ago: an empty dir torch has just made is kept (issue 28.4)
    (cache / "zz").mkdir()
    cachedir.trim(str(cache), 0)
    assert not leftover.exists() and not (cache / "ab").exists()  # ab/ emptied by removing its last dir
    assert (cache / "zz").is_dir()


def test_a_killed_restores_staging_dir_is_ours_and_swept(tmp_path: Path) -> None:
    # Issue 28.5: a restore SIGKILLed into a new dir leaves only its staging dir; the dir is still a cache dir
    # (not "foreign", which pytest refuses), and the leftover goes once its owner is provably dead.
    cache = tmp_path / "cache"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)
    staging = cache / f".compilecache-staging-{_fs.host_tag()}-{pid}-{int(time.time())}-abcd1234"
    _file(staging, f"{KEY[1:3]}/{KEY}.so", 10, T0)
    assert cachedir.ownership(cache).kind == "torch"
    cachedir.refuse_foreign(cache, "--cache-dir")  # no error
    assert cachedir.decide("shared", str(cache), tmp_path / "default").path == str(cache)
    assert cachedir.sweep_dead_writers(str(cache)) == 1
    assert not staging.exists()


# ---------------------------------------------------------------- trimming beside processes that do not register


def test_trim_keeps_what_was_used_or_written_recently(cache: Path) -> None:
    # Issue 28.4: torch alone (no registration) compiling into the dir: what it wrote or read within the last
    # MIN_AGE may be in use, whatever the cap says.
    now = time.time()
    fresh = _file(cache, f"{KEY[1:3]}/{KEY}.main.cpp", 100, now - 60)  # written a minute ago, being compiled
    read = _file(cache, fx("aa/read"), 100, atime=now - 60, mtime=T0)  # old, but loaded a minute ago
    _file(cache, fx("aa/old"), 100, T0)
    result = cachedir.trim(str(cache), 0)
    assert (result.removed, result.freed) == (1, 100)
    assert fresh.exists() and read.exists()
    assert cachedir.trim(str(cache), 0, min_age=30).removed == 2  # a caller may ask for a shorter age


def test_trim_spares_a_kernel_dir_while_torch_builds_in_it(cache: Path) -> None:
    # cpp_builder compiles <key>.main.cpp with its working dir <key>.main_CxxBuild/ beside it: the source, and
    # every sibling, stays until the build is over (the `ld: cannot open output file` / missing .main.cpp failures).
    folder = KEY[1:3]
    source = _file(cache, f"{folder}/{KEY}.main.cpp", 100, T0)
    sibling = _file(cache, f"{folder}/c{folder}{'q' * 49}.so", 100, T0)
    (cache / folder / f"{KEY}.main_CxxBuild").mkdir()
    assert cachedir.trim(str(cache), 0).removed == 0
    assert source.exists() and sibling.exists() and (cache / folder).is_dir()
    (cache / folder / f"{KEY}.main_CxxBuild").rmdir()  # the build is over
    assert cachedir.trim(str(cache), 0).removed == 2


def test_trim_removes_a_kernels_files_together_sources_first(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = KEY[1:3]
    _file(cache, f"{folder}/{KEY}.so", 100, T0)
    _file(cache, f"{folder}/{KEY}.cpp", 100, T0 + 5)
    _file(cache, fx("aa/newer"), 100, T0 + 10)
    order: list[str] = []
    unlink = os.unlink

    def record(name: str, *, dir_fd: int | None = None) -> None:
        order.append(name)
        unlink(name, dir_fd=dir_fd)

    monkeypatch.setattr(os, "unlink", record)
    removed, freed = cachedir.evict(str(cache), _dir_size(str(cache)) - 50)  # one file's worth would do
    assert (removed, freed) == (2, 200)  # the key's two files, never one without the other
    assert order == [f"{KEY}.cpp", f"{KEY}.so"]  # torch finding the source gone writes it again
    assert fx("aa/newer") in _files(cache)


def test_trim_never_takes_user_files_that_look_like_torchs(cache: Path) -> None:
    # Issue 28.6: a plugin-made dir (our tag) holding a user's files under torch-like names.
    users = {
        "cache/my_important_data.bin", "db/backup_2024_01_01_full.sql", "cache/notes/readme.txt",
        "dynamo/my_model.pt", "precompiled_headers/stdafx.h", "ab/abcdefghijklmnopqrstuvwxyz0123456789.so",
    }  # fmt: skip
    for rel in users:
        _file(cache, rel, 100, T0)
    torchs = {f"cache/{'0' * 64}", f"cache/inductor_on_disk_cache/{'a' * 32}", f"dynamo/code_state_{'b' * 20}.pkl"}
    for rel in torchs:
        _file(cache, rel, 100, T0)
    result = cachedir.trim(str(cache), 0)
    assert result.removed == len(torchs)
    assert users <= _files(cache) and not torchs & _files(cache)
    # Untagged, the same look-alike makes a dir foreign (refused), not torch's.
    _file(cache.parent / "untagged", "db/backup_2024_01_01_full.sql", 1, T0)
    assert cachedir.ownership(cache.parent / "untagged").kind == "foreign"


@pytest.mark.parametrize("layout", ["triton/0", "triton"])
def test_trim_removes_a_triton_kernel_dir_whole_or_not_at_all(cache: Path, layout: str) -> None:
    """Half a kernel dir makes triton's lookup fail, and torch's bundler never refills a non-empty dir. In torch's
    own layout (``triton/<device>/<key>/``) and the plugin's (it points TRITON_CACHE_DIR at ``<dir>/triton``:
    ``triton/<key>/``, where kernels were never trimmed yet counted against the cap)."""

    def kernel(key: str, when: float) -> Path:
        folder = cache / layout / key
        for name, size in (("__grp__k.json", 10), ("k.cubin", 300), ("k.json", 20)):
            _file(folder, name, size, when + size)  # files of one dir differ in age: not removed one by one
        os.utime(folder, (when, when))
        return folder

    old = kernel("A" * 52, T0)
    busy = kernel("B" * 52, T0)
    (busy / "tmp.pid_123_abcdef").mkdir()  # triton's put in flight
    young = kernel("C" * 52, T0)
    os.utime(young / "k.json", (time.time(), time.time()))
    removed, freed = cachedir.evict(str(cache), _dir_size(str(cache)) - 100)  # one file's worth would do
    assert (removed, freed) == (3, 330)
    assert not old.exists()
    assert sorted(p.name for p in busy.iterdir()) == ["__grp__k.json", "k.cubin", "k.json", "tmp.pid_123_abcdef"]
    assert sorted(p.name for p in young.iterdir()) == ["__grp__k.json", "k.cubin", "k.json"]


def test_registrations_are_readable_by_every_user_whatever_the_umask(tmp_path: Path) -> None:
    # Issue 28.4: under umask 077 the marker was 0600, so another user's trim could not see a live session.
    cache = cachedir.make_dir(tmp_path / "cache")
    os.chmod(cache, 0o1777)  # a dir several users share
    previous = os.umask(0o077)
    try:
        with cachedir.register_session(str(cache)) as registration:
            marker = os.stat(registration.marker).st_mode
            folder = os.stat(cache / cachedir.SESSIONS_DIR).st_mode
    finally:
        os.umask(previous)
    assert marker & 0o777 == 0o644
    assert folder & 0o1777 == 0o1777  # readable, and writable as the cache dir is, by every user


def test_a_registration_that_cannot_be_read_counts_as_live(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with cachedir.register_session(str(cache)) as registration:
        real_open = os.open

        def denied(name: str, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
            if name == os.path.basename(registration.marker):
                raise PermissionError(13, "Permission denied")  # another user's 0600 marker
            return real_open(name, flags, mode, dir_fd=dir_fd)

        monkeypatch.delitem(cachedir.registry._OWN, registration.marker)  # as if another process's
        monkeypatch.setattr(os, "open", denied)
        assert len(cachedir.live_sessions(str(cache))) == 1
        monkeypatch.undo()


def test_a_trim_that_keeps_only_recent_files_says_why(cache: Path) -> None:
    _file(cache, f"{KEY[1:3]}/{KEY}.so", 100, time.time() - 60)
    result = cachedir.trim(str(cache), 0)
    assert (result.removed, result.recent) == (0, 1)
    line = result.describe()
    assert line is not None and "over its cap" in line and "used within the last 1 hour(s)" in line


# ---- the xdist restore ticket in the cache dir (issue 44, finding 1)


def test_a_restore_ticket_leaves_a_torch_dir_torchs(tmp_path: Path) -> None:
    """A second session on a dir torch filled, while the first one's workers restore, was refused: the ticket's
    files were no name the ownership check knew."""
    from pytest_compilecache.cachedir.ticket import RestoreTicket

    cache = tmp_path / "torch"
    (cache / "fxgraph").mkdir(parents=True)
    ticket = RestoreTicket.new(str(cache))
    lock = ticket.take(wait=False)
    assert lock is not None
    try:
        ticket.fulfil({"restored": None})
        assert len(os.listdir(cache)) == 3  # fxgraph, the ticket and its lock
        assert cachedir.ownership(cache).kind == "torch"
        cachedir.refuse_foreign(cache)  # not refused
        assert cachedir.sweep_dead_writers(str(cache)) == 0  # its controller (this process) lives
    finally:
        lock.release()
    ticket.remove()
    assert os.listdir(cache) == ["fxgraph"]


def test_a_dead_controllers_ticket_is_swept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A SIGKILLed controller left its ticket: every later session on the dir exited 4 until someone deleted it."""
    from pytest_compilecache.cachedir.ticket import RestoreTicket

    cache = tmp_path / "torch"
    (cache / "fxgraph").mkdir(parents=True)
    dead = _dead_pid()
    with monkeypatch.context() as patch:
        patch.setattr(os, "getpid", lambda: dead)
        ticket = RestoreTicket.new(str(cache))
    lock = ticket.take(wait=False)
    assert lock is not None
    lock.release()
    ticket.fulfil({"restored": None})
    assert cachedir.sweep_dead_writers(str(cache)) == 2
    assert os.listdir(cache) == ["fxgraph"]


def test_an_older_versions_ticket_is_ours_and_swept_by_age(tmp_path: Path) -> None:
    cache = tmp_path / "torch"
    (cache / "fxgraph").mkdir(parents=True)
    for name in (".compilecache-restore-123-0123456789ab.json", ".compilecache-restore-123-0123456789ab.json.lock"):
        (cache / name).write_text("{}")
    assert cachedir.ownership(cache).kind == "torch"
    assert cachedir.sweep_dead_writers(str(cache)) == 0  # young: its controller may live
    assert cachedir.sweep_dead_writers(str(cache), now=time.time() + 2 * cachedir.STALE_AFTER) == 2
    assert os.listdir(cache) == ["fxgraph"]


def test_an_unusable_default_dir_is_named_as_the_default_not_as_an_option_the_user_never_gave(tmp_path: Path) -> None:
    """Issue 44 (also): a read-only default dir's usage error named --compile-cache-dir."""
    blocked = tmp_path / "file"
    blocked.write_text("not a dir")
    with pytest.raises(ConfigError) as raised:
        cachedir.decide("shared", None, blocked / "d" / "compilecache")
    message = str(raised.value)
    assert not message.startswith("--compile-cache-dir:"), message
    assert message.startswith(f"the default compile cache dir {blocked / 'd' / 'compilecache'}"), message
    assert "choose another with --compile-cache-dir" in message
    with pytest.raises(ConfigError, match="^--compile-cache-dir: "):  # given: named as given
        cachedir.decide("shared", str(blocked / "x"), tmp_path / "default")


@pytest.mark.parametrize("host", ["here", "a peer container"])
def test_a_registered_sessions_temp_entries_are_kept_however_old(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, host: str
) -> None:
    """A session of hours keeps its restore ticket and its lock: its held registration proves its owner alive,
    which an entry's age (a day here, an hour for another host tag: a container with its own pid namespace)
    only guesses. Once the registration is gone, the age rule takes them."""
    cache = cachedir.make_dir(tmp_path / "cache")
    tag = _fs.host_tag() if host == "here" else "deadbeef"
    made = int(time.time()) - 25 * 3600
    ticket = f".compilecache-ticket-{tag}-{os.getpid()}-{made}-abcdefgh"
    names = [ticket, ticket + ".lock"]
    for name in names:
        (cache / name).write_text("in use")
    with monkeypatch.context() as patch:  # a peer's registration carries its own host tag
        patch.setattr(_fs, "host_tag", lambda: tag)
        registration = cachedir.register_session(str(cache))
    try:
        assert cachedir.sweep_dead_writers(str(cache)) == 0
        assert _fs.sweep_our_temps(cache, live=cachedir.live_owners(str(cache))) == []
        assert sorted(p.name for p in cache.iterdir() if p.name.startswith(".compilecache-ticket")) == sorted(names)
    finally:
        registration.close()
    assert cachedir.sweep_dead_writers(str(cache)) == 2  # no registration: the age says it
    assert not any(p.name.startswith(".compilecache-ticket") for p in cache.iterdir())


def test_a_dir_named_like_an_old_temp_file_is_someone_elses(tmp_path: Path) -> None:
    """Older versions and torch's write_atomic wrote files under these names (one old staging dir aside): a
    user's dir so named, in an owned dir or in torch's layout, is kept with all it holds, however old."""
    cache = cachedir.make_dir(tmp_path / "cache")
    theirs = [cache / ".write-test-results", cache / "cache" / ".report.20240101.tmp", cache / "fxgraph" / ".1.2.tmp"]
    for folder in theirs:
        folder.mkdir(parents=True)
        (folder / "important.txt").write_text("keep")
    old_file = cache / "cache" / ".x.abcdefgh.tmp"  # an old atomic write's file: swept by age
    old_file.write_text("partial")
    long_ago = time.time() - 3 * 3600
    for path in [*theirs, old_file]:
        os.utime(path, (long_ago, long_ago))
    later = time.time() + 3 * 3600  # the ctime is fresh: sweep as if hours had passed
    assert cachedir.sweep_dead_writers(str(cache), now=later) == 1
    assert not old_file.exists() and all((folder / "important.txt").read_text() == "keep" for folder in theirs)


_DIES_REGISTERED = "import sys\nfrom pytest_compilecache import cachedir\ncachedir.register_session(sys.argv[1])\n"


def test_only_an_abandoned_isolated_dir_is_swept(tmp_path: Path) -> None:
    """Removed: a sibling named as fresh_dir names them, ours, marked to be removed, every registration of
    this host dead (its process exited without withdrawing it). Kept: one marked kept, one whose session is
    live, one being made (no registration yet), a user's dir named alike, a link to an abandoned one."""

    registrations = []

    def isolated(kept: bool = False, registered: str = "dead") -> Path:
        path = cachedir.fresh_dir(tmp_path)
        cachedir.mark_isolated(str(path), kept=kept)
        if registered == "dead":
            subprocess.run([sys.executable, "-c", _DIES_REGISTERED, str(path)], check=True, timeout=60)
        elif registered == "live":
            registrations.append(cachedir.register_session(str(path)))
        return path

    abandoned, kept, made, live = (
        isolated(),
        isolated(kept=True),
        isolated(registered="none"),
        isolated(registered="live"),
    )
    users = tmp_path / "compilecache-mine"
    users.mkdir()
    (users / "notes.txt").write_text("mine")
    shutil.copytree(abandoned / ".compilecache-sessions", users / ".compilecache-sessions")
    (users / ".compilecache-isolated").write_text("removed at the end\n")
    (tmp_path / "compilecache-link").symlink_to(abandoned)
    for path in (abandoned, kept, made, live, users):
        _age(path, cachedir.sweep.ISOLATED_GRACE_SECONDS + 60)
    own = cachedir.fresh_dir(tmp_path)

    assert cachedir.registry.abandoned(str(abandoned)) and not cachedir.registry.abandoned(str(live))
    (marker,) = (abandoned / ".compilecache-sessions").iterdir()
    said = marker.read_text()
    marker.write_text(said.replace('"ino": ', '"ino": 1'))  # seen through another inode (an overlay of the dir)
    assert not cachedir.registry.abandoned(str(abandoned))
    marker.write_text(said)
    _age(abandoned, cachedir.sweep.ISOLATED_GRACE_SECONDS + 60)
    assert cachedir.sweep_abandoned_isolated(str(own)) == 1
    assert not abandoned.exists()
    assert all(path.exists() for path in (kept, made, live, users, own)) and (users / "notes.txt").exists()
    for registration in registrations:
        registration.close()


def _age(path: Path, seconds: float) -> None:
    """Make everything in ``path`` look last modified ``seconds`` ago."""
    when = time.time() - seconds
    for folder, dirs, files in os.walk(path):
        for name in (*dirs, *files):
            os.utime(os.path.join(folder, name), (when, when), follow_symlinks=False)
    os.utime(path, (when, when))


_HOLDS_REGISTERED = (
    "import sys, time\nfrom pytest_compilecache import cachedir\ncachedir.register_session(sys.argv[1])\n"
    "print('ready', flush=True)\ntime.sleep(120)\n"
)


def test_an_isolated_dir_someone_may_still_use_or_that_is_not_all_ours_is_not_swept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kept: a dir whose session another live process holds (an xdist worker outliving its controller registers
    too), one with a dead and a live registration, one modified within the grace period (a test's subprocess may
    still write there), one holding a file a user put there, a copy of an abandoned dir (its mark names the
    original), and another user's. Each would be swept were it not for that one reason."""

    def abandoned(dead: bool = True) -> Path:
        path = cachedir.fresh_dir(tmp_path)
        cachedir.mark_isolated(str(path), kept=False)
        if dead:
            subprocess.run([sys.executable, "-c", _DIES_REGISTERED, str(path)], check=True, timeout=60)
        (path / "fxgraph").mkdir()
        return path

    held, mixed, recent, with_users_file, original = (abandoned(dead=i != 0) for i in range(5))
    holder = subprocess.Popen([sys.executable, "-c", _HOLDS_REGISTERED, str(held)], stdout=subprocess.PIPE, text=True)
    second = subprocess.Popen([sys.executable, "-c", _HOLDS_REGISTERED, str(mixed)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "ready\n"
        assert second.stdout is not None and second.stdout.readline() == "ready\n"
        (with_users_file / "notes.txt").write_text("mine")
        copy = tmp_path / (original.name + "x")
        shutil.copytree(original, copy, symlinks=True)
        for path in (held, mixed, with_users_file, original, copy):
            _age(path, cachedir.sweep.ISOLATED_GRACE_SECONDS + 60)
        _age(recent, cachedir.sweep.ISOLATED_GRACE_SECONDS - 600)
        own = cachedir.fresh_dir(tmp_path)
        monkeypatch.setattr(os, "geteuid", lambda: os.getuid() + 1)  # as another user: none of these is its own
        assert cachedir.sweep_abandoned_isolated(str(own)) == 0
        monkeypatch.undo()
        assert cachedir.sweep_abandoned_isolated(str(own)) == 1  # only the original: the one to remove
        assert not original.exists()
        assert all(p.exists() for p in (held, mixed, recent, with_users_file, copy))
    finally:
        for process in (holder, second):
            process.kill()
            process.wait(timeout=60)
            if process.stdout is not None:
                process.stdout.close()


_ELSEWHERE = (
    "import sys, time\nfrom pytest_compilecache import _fs, cachedir\n"
    "_fs.host_tag = lambda: 'deadbeef'\n_fs.boot_id = lambda: sys.argv[2]\n"
    "cachedir.registry.on_local_disk = lambda path: sys.argv[4] == 'local'\n"
    "cachedir.register_session(sys.argv[1])\nprint('ready', flush=True)\nif sys.argv[3] == 'hold':\n"
    "    time.sleep(120)\n"
)


@pytest.mark.parametrize("kernel", ["this kernel", "an earlier boot"])
def test_a_dir_left_by_another_container_or_before_a_reboot_is_swept_where_its_lock_is_provably_free(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kernel: str
) -> None:
    """A registration of another host tag (a container with its own host name and pid namespace, or this machine
    before a reboot) was never taken for dead, so such dirs stayed for good. Where its writer and the sweep both
    see a local disk, what it records says whose lock it was: this kernel's, through this very inode, is tried (a
    live peer container's dir is kept); an earlier boot's are all free. Elsewhere (a network filesystem, a VM's
    shared dir, FUSE: another machine's lock need not show here), through another inode (an overlay or loopback
    view), or recorded otherwise: kept."""
    boot = _fs.boot_id() if kernel == "this kernel" else "01234567-89ab-cdef-0123-456789abcdef"
    assert _fs.boot_id() and boot != "deadbeef" and _fs.host_tag() != "deadbeef"
    assert cachedir.registry.on_local_disk(str(tmp_path)), "this test needs a temp dir on a local disk"

    def left(hold: str, disk: str = "local") -> tuple[Path, subprocess.Popen[str]]:
        path = cachedir.fresh_dir(tmp_path)
        cachedir.mark_isolated(str(path), kept=False)
        script = [sys.executable, "-c", _ELSEWHERE, str(path), boot, hold, disk]
        process = subprocess.Popen(script, stdout=subprocess.PIPE, text=True)
        assert process.stdout is not None and process.stdout.readline() == "ready\n"
        return path, process

    (dead, died), (live, holder), (remote, client) = left("exit"), left("hold"), left("exit", disk="nfs")
    try:
        for process in (died, client):
            process.wait(timeout=60)
        (marker,) = (dead / ".compilecache-sessions").iterdir()
        assert marker.name.split("-")[1] == "deadbeef"  # another host tag: the rule before took it for live
        said = json.loads(marker.read_text())
        assert said["local"] is True and (said["dev"], said["ino"]) == (marker.stat().st_dev, marker.stat().st_ino)
        assert json.loads(next((remote / ".compilecache-sessions").iterdir()).read_text())["local"] is False
        for path in (dead, live, remote):
            _age(path, cachedir.sweep.ISOLATED_GRACE_SECONDS + 60)
        assert not cachedir.registry.abandoned(str(remote))  # its writer saw no local disk
        own = cachedir.fresh_dir(tmp_path)
        with monkeypatch.context() as patch:
            patch.setattr(cachedir.registry, "on_local_disk", lambda path: False)
            assert not cachedir.registry.abandoned(str(dead))
        for change in ({"local": False}, {"ino": said["ino"] + 1}, {"dev": said["dev"] + 1}, {"boot": "x"}):
            marker.write_text(json.dumps({**said, **change}))  # a writer on NFS; another inode (FUSE, a loopback)
            assert not cachedir.registry.abandoned(str(dead)), change
        marker.write_text(json.dumps(said))
        with monkeypatch.context() as patch:
            patch.setattr(_fs, "boot_id", lambda: "")  # no boot id here: no kernel can be told apart
            assert not cachedir.registry.abandoned(str(dead))
        assert cachedir.registry.abandoned(str(dead)) and not cachedir.registry.abandoned(str(live))
        assert cachedir.sweep_abandoned_isolated(str(own)) == 0  # the marker was just written: within the grace
        _age(dead, cachedir.sweep.ISOLATED_GRACE_SECONDS + 60)
        assert cachedir.sweep_abandoned_isolated(str(own)) == 1
        assert not dead.exists() and live.exists() and remote.exists()
    finally:
        holder.kill()
        holder.wait(timeout=60)
        for process in (died, holder, client):
            if process.stdout is not None:
                process.stdout.close()
    (marker,) = (live / ".compilecache-sessions").iterdir()
    for hostile in ('{"pid": 1, "boot": "not an id", "local": true}', "[" * 4096, '{"local": true, "boot": 1}', "[]"):
        marker.write_text(hostile)  # what it records is checked: never trusted, never a crash
        assert not cachedir.registry.abandoned(str(live))


def test_the_mount_table_says_which_paths_lie_on_a_local_disk(tmp_path: Path) -> None:
    """The mount of the path's own device with the longest mount point above it decides (a mount hidden under a
    later one is another device); escaped and undecodable mount points are read as the kernel writes them; links
    are resolved; a network, FUSE or unknown filesystem is not a local disk."""
    dev = os.stat(tmp_path).st_dev
    here = b"%d:%d" % (os.major(dev), os.minor(dev))
    root = os.fsencode(tmp_path)
    odd = [b"caf\xe9", "a\u2028b".encode(), b"with space", b"nfs", b"nfsx", b"data", b"data/sub"]
    for name in odd:
        os.makedirs(os.path.join(root, name), exist_ok=True)
    (tmp_path / "link").symlink_to(tmp_path / "nfs")
    table = tmp_path / "mountinfo"
    table.write_bytes(
        b"27 1 " + here + b" / / rw,relatime - ext4 /dev/vda rw\n"
        b"30 27 " + here + b" / " + root + b"/nfs rw - nfs4 server:/export rw\n"
        b"31 27 " + here + b" / " + root + b"/with\\040space rw - fuse.sshfs host:/ rw\n"
        b"32 27 " + here + b" / " + root + b"/caf\xe9 rw - cifs //host/share rw\n"
        b"33 27 "
        + here
        + b" / "
        + root
        + "/a\u2028b rw - 9p share rw\n".encode()
        + b"34 27 0:999 / "
        + root
        + b"/data/sub rw - ext4 /dev/vdb rw\n"
        b"35 27 " + here + b" / " + root + b"/data rw - nfs server:/data rw\n"
        b"garbage\n"
    )

    def local(name: bytes) -> bool:
        return cachedir.registry.on_local_disk(os.fsdecode(os.path.join(root, name)), mountinfo=str(table))

    assert local(b"nfsx") and local(b"")
    assert not any(local(name) for name in (b"nfs", b"with space", b"caf\xe9", "a\u2028b".encode(), b"link"))
    assert not local(b"data/sub")  # the ext4 mounted there is hidden under the NFS mount of /data
    assert not cachedir.registry.on_local_disk(str(tmp_path), mountinfo=str(tmp_path / "none"))
    assert not cachedir.registry.on_local_disk(str(tmp_path / "no such dir"), mountinfo=str(table))


def test_a_mark_planted_in_a_sibling_never_blocks_or_breaks_the_sweep(tmp_path: Path) -> None:
    """The temp dir is everyone's: a FIFO or a dir under the mark's name in a look-alike sibling is not a mark,
    and reading it never blocks the session (a FIFO's open would wait for a writer) nor raises."""
    import signal

    for kind in ("fifo", "dir"):
        sibling = tmp_path / f"compilecache-{kind}"
        sibling.mkdir()
        if kind == "fifo":
            os.mkfifo(sibling / ".compilecache-isolated")
        else:
            (sibling / ".compilecache-isolated").mkdir()
    own = cachedir.fresh_dir(tmp_path)

    class Blocked(BaseException):  # not an OSError, which the sweep would take for an unreadable mark
        pass

    def stuck(*_: Any) -> None:
        raise Blocked("the sweep blocked on a planted FIFO")

    previous = signal.signal(signal.SIGALRM, stuck)
    signal.alarm(5)
    try:
        assert cachedir.sweep_abandoned_isolated(str(own)) == 0
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert (tmp_path / "compilecache-fifo").exists() and (tmp_path / "compilecache-dir").exists()


def test_an_xdist_worker_lives_in_its_controllers_isolated_dir(tmp_path: Path) -> None:
    """A worker outlives a SIGKILLed controller by seconds (execnet shuts it down): registered in the dir, it keeps
    a later isolated session from sweeping the dir from under it, and withdraws at its end."""
    from pytest_compilecache.context import SessionContext
    from pytest_compilecache.problems import Problems
    from pytest_compilecache.settings import Settings

    parent = tmp_path / "isolated"
    controller = SessionContext.start(
        Settings(mode="isolated", dir=str(parent)), tmp_path / "default", inherited=None, problems=Problems()
    )
    path = controller.dir.path
    assert path is not None
    decision = cachedir.SessionDir(mode="isolated", path=path, owned=True).to_env()
    settings = Settings(mode="isolated")
    worker = SessionContext.start(settings, tmp_path / "default", inherited=decision, problems=Problems())
    sessions = Path(path) / ".compilecache-sessions"
    try:
        assert worker.registration is not None
        controller.release()  # the controller's registration gone (as if killed): the worker's still holds the dir
        assert len(list(sessions.iterdir())) == 1
        worker.release()
        assert list(sessions.iterdir()) == []
    finally:
        worker.close()
        controller.close()


def test_a_removal_stopped_midway_leaves_a_dir_still_proved_ours(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Torch's entries go before our markers (tag, isolated mark, registrations): a session killed while removing
    its dir leaves one that the next isolated session can still prove ours and sweep."""
    path = cachedir.fresh_dir(tmp_path)
    cachedir.mark_isolated(str(path), kept=False)
    registration = cachedir.register_session(str(path))
    registration.close()
    for name in ("fxgraph", "triton", "aotautograd"):
        (path / name).mkdir()

    def stop(entry: str, *args: Any, **kwargs: Any) -> None:
        if os.path.basename(entry) == "triton":
            raise KeyboardInterrupt  # the kill, midway
        real(entry, *args, **kwargs)

    real = shutil.rmtree
    monkeypatch.setattr(shutil, "rmtree", stop)
    with pytest.raises(KeyboardInterrupt):
        cachedir.remove_dir(path)
    monkeypatch.undo()
    assert {"CACHEDIR.TAG", ".compilecache-isolated", "triton"} <= {p.name for p in path.iterdir()}
    assert cachedir.ownership(path).kind == "ours"


def test_a_leftover_isolated_dir_a_shared_session_took_over_is_never_swept(tmp_path: Path) -> None:
    """A user points --compile-cache-dir (shared) at a kept or leftover isolated dir: the shared session takes the
    isolated mark out, so a later isolated session never sweeps the user's shared cache, killed or not."""
    from pytest_compilecache.context import SessionContext
    from pytest_compilecache.problems import Problems
    from pytest_compilecache.settings import Settings

    leftover = cachedir.fresh_dir(tmp_path)
    cachedir.mark_isolated(str(leftover), kept=False)
    shared = SessionContext.start(
        Settings(mode="shared", dir=str(leftover)), tmp_path / "default", inherited=None, problems=Problems()
    )
    try:
        assert shared.registration is not None
        assert not (leftover / ".compilecache-isolated").exists()
    finally:
        shared.close()
