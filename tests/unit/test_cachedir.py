"""cachedir.py: the session dir for each mode, atomic tagged creation, LRU eviction and touch()."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pytest_compilecache import ConfigError
from pytest_compilecache import cachedir
from pytest_compilecache.cachedir import LOCK_NAME
from pytest_compilecache.cachedir import SessionDir

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
    _file(cache, "fxgraph/aa/old", 100, T0)
    _file(cache, "fxgraph/bb/mid", 100, T0 + 10)
    _file(cache, "new", 100, T0 + 20)
    markers = sum(os.path.getsize(cache / m) for m in ("CACHEDIR.TAG", ".gitignore", LOCK_NAME))
    removed, freed = cachedir.evict(str(cache), markers + 150)
    assert (removed, freed) == (2, 200)
    assert _files(cache) == {"CACHEDIR.TAG", ".gitignore", LOCK_NAME, "new"}
    # emptied subdirectories are gone as well
    assert not (cache / "fxgraph").exists()
    assert _dir_size(str(cache)) == markers + 100


def test_evict_uses_the_later_of_access_and_modification(cache: Path) -> None:
    _file(cache, "read_recently", 100, atime=T0 + 100, mtime=T0)
    _file(cache, "written_recently", 100, atime=T0, mtime=T0 + 50)
    _file(cache, "untouched", 100, atime=T0 + 10, mtime=T0 + 10)
    cachedir.evict(str(cache), _dir_size(str(cache)) - 1)
    assert "untouched" not in _files(cache)
    assert {"read_recently", "written_recently"} <= _files(cache)


def test_evict_under_the_cap_does_nothing(cache: Path) -> None:
    _file(cache, "sub/a", 10, T0)
    (cache / "empty_but_ours").mkdir()
    before = _files(cache)
    assert cachedir.evict(str(cache), 10**9) == (0, 0)
    assert _files(cache) == before
    assert not (cache / "empty_but_ours").exists()  # empty dirs are always tidied
    assert cache.is_dir()


def test_evict_keeps_markers_even_at_zero(cache: Path) -> None:
    _file(cache, "a", 10, T0)
    _file(cache, "deep/er/b", 10, T0)
    _file(cache, "deep/CACHEDIR.TAG", 10, T0)  # only the top-level markers are ours
    removed, freed = cachedir.evict(str(cache), 0)
    assert (removed, freed) == (3, 30)
    assert _files(cache) == {"CACHEDIR.TAG", ".gitignore", LOCK_NAME}
    assert [p.name for p in cache.iterdir() if p.is_dir()] == []


def test_touch_protects_files_from_eviction(cache: Path) -> None:
    _file(cache, "used/by_last_session", 100, T0)
    _file(cache, "unused", 100, T0 + 10)
    cachedir.touch(str(cache), ["used/by_last_session", "vanished/meanwhile"])
    stat = os.stat(cache / "used/by_last_session")
    assert stat.st_atime > T0 + 10
    assert stat.st_mtime == T0  # content age is kept
    cachedir.evict(str(cache), _dir_size(str(cache)) - 1)
    assert "used/by_last_session" in _files(cache)
    assert "unused" not in _files(cache)


def test_lock_is_a_file_lock_inside_the_dir(tmp_path: Path) -> None:
    with cachedir.lock(str(tmp_path), timeout=5) as held:
        assert held.is_locked
    assert (tmp_path / LOCK_NAME).exists()
