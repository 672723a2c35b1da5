"""pch: finding, describing, packing and installing torch's precompiled headers (no torch needed)."""

from __future__ import annotations

import fcntl
import getpass
import hashlib
import io
import os
import random
import subprocess
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import pytest
import zstandard

from pytest_compilecache import pch
from pytest_compilecache.manifest import Artifact
from pytest_compilecache.pch import HeaderError
from pytest_compilecache.stores.local import LocalStore

NAME = "c" + "a2b3c4d5e6f7" * 4 + "abc" + ".h.gch"  # 1 + 51 chars, as torch's code_hash names it
OTHER = "c" + "z" * 51 + ".h.gch"


def make_header(directory: Path, name: str = NAME, content: bytes = b"gpch" + b"gch" * 1000) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_bytes(content)
    return path


def checked(path: Path, verdict: str = "verified") -> dict[str, object]:
    """What a process that looked the header up and checked it reports (probe's HeaderUse JSON)."""
    info = os.lstat(path)
    return pch.HeaderUse(path.name, verdict, info.st_size, info.st_mtime_ns, info.st_ino).to_json()


def packed(path: Path) -> tuple[Artifact, io.BytesIO]:
    artifact = pch.describe(path)
    buf = io.BytesIO()
    pch.compress(path, buf, artifact)
    buf.seek(0)
    return artifact, buf


def test_names_are_torchs_and_nothing_else() -> None:
    assert len(NAME) == 52 + len(".h.gch")
    assert pch.is_header_name(NAME)
    assert pch.is_header_name(NAME.replace(".gch", ".pch"))
    for bad in (
        NAME[:-4],
        NAME + ".tmp",
        "../" + NAME,
        NAME.upper(),
        "x" + NAME[1:],
        NAME.replace("a", "1", 1),
        "." + NAME,
        "locks",
        "",
    ):
        assert not pch.is_header_name(bad), bad


def test_header_dir_follows_tmpdir_not_the_cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "elsewhere"))
    monkeypatch.setattr(getpass, "getuser", lambda: "ci:user")
    assert pch.header_dir() == tmp_path / "torchinductor_ci_user" / "precompiled_headers"


def test_header_dir_without_a_user_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_user() -> str:
        raise KeyError("uid not in passwd")

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(getpass, "getuser", no_user)
    assert pch.header_dir().parent.name == f"torchinductor_uid_{os.getuid()}"


@pytest.mark.parametrize("mount", ["relatime", "noatime"])
def test_find_used_takes_checked_and_installed_headers_and_never_reads_times(tmp_path: Path, mount: str) -> None:
    """Which headers a session used comes from the processes' reports, not from access times: a header built
    and read long before the session, whose atime no read changes now (relatime after its first read,
    noatime always), is found because a process checked it; one built during the session but reported by
    no process is not (no process of this session can vouch for it)."""
    day_ago = time.time() - 86400
    # relatime leaves the atime at the first read after the last write; noatime at the write itself.
    atime = day_ago + 60 if mount == "relatime" else day_ago
    checked_old = make_header(tmp_path, "c" + "o" * 51 + ".h.gch")
    checked_old.read_bytes()  # read during the session: this machine's mount may record it or not...
    os.utime(checked_old, (atime, day_ago))  # ...so pin the times as that mount leaves them
    installed = make_header(tmp_path, "c" + "i" * 51 + ".h.gch")
    os.utime(installed, (day_ago, day_ago))
    unreported = make_header(tmp_path, "c" + "u" * 51 + ".h.gch")  # built now, by no process we know of
    changed = make_header(tmp_path, "c" + "x" * 51 + ".h.gch")
    report_of_changed = checked(changed)
    changed.write_bytes(b"gpch rewritten since the check")
    os.utime(changed, ns=(1, 2))  # even with old times: another size and mtime than the file checked
    rejected = make_header(tmp_path, "c" + "r" * 51 + ".h.gch")
    (tmp_path / ("c" + "t" * 51 + ".h")).write_text("#include <x.h>\n")  # torch's text header: never carried
    (tmp_path / "locks").mkdir()
    empty = tmp_path / ("c" + "e" * 51 + ".h.gch")
    empty.write_bytes(b"")  # a build in progress or failed
    link = tmp_path / ("c" + "l" * 51 + ".h.gch")
    os.symlink(checked_old, link)
    uses = [
        checked(checked_old),
        checked(rejected, "damaged"),
        report_of_changed,
        checked(empty),
        {**checked(checked_old), "name": link.name},
        {"name": "../evil.h.gch", "verdict": "verified"},
        "junk",
    ]
    found = pch.find_used(tmp_path, uses, installed=[installed.name, "../x"])
    assert found == [installed, checked_old]
    # An installed header this session's compiler rejected (torch held its lock, so it is still there) or could
    # not check is not named again: before, the restore's word outweighed the session's own report.
    for verdict in ("damaged", "unchecked"):
        assert pch.find_used(tmp_path, [*uses, checked(installed, verdict)], installed=[installed.name]) == [
            checked_old
        ]
    assert os.stat(checked_old).st_atime == pytest.approx(atime, abs=1)  # nothing here depended on it
    assert unreported.exists()


def test_find_used_skips_a_header_being_built(tmp_path: Path) -> None:
    path = make_header(tmp_path)
    (tmp_path / "locks").mkdir()
    with open(tmp_path / "locks" / (NAME.split(".")[0] + ".lock"), "w") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)  # torch's FileLock while gcc writes the file in place
        assert pch.find_used(tmp_path, [checked(path)]) == []
    assert pch.find_used(tmp_path, [checked(path)]) == [path]


def test_find_used_on_a_missing_dir(tmp_path: Path) -> None:
    assert pch.find_used(tmp_path / "absent", [], ["x"]) == []
    assert pch.find_built(tmp_path / "absent", 0.0) == []


def test_find_built_takes_headers_written_since_that_start_like_a_pch(tmp_path: Path) -> None:
    """The CLI's save has no process to ask: mtime (recorded on every mount) and the PCH magic."""
    new = make_header(tmp_path, "c" + "n" * 51 + ".h.gch")
    old = make_header(tmp_path, "c" + "o" * 51 + ".h.gch")
    os.utime(old, (time.time(), 1_000_000))  # read now, built long ago
    zeroed = make_header(tmp_path, "c" + "z" * 51 + ".h.gch", content=b"\0" * 4096)
    clang = make_header(tmp_path, "c" + "c" * 51 + ".h.pch", content=b"CPCH" + b"\0" * 64)
    assert pch.find_built(tmp_path, time.time() - 60) == [clang, new]
    assert pch.find_built(tmp_path, 0.0) == [clang, new, old]
    assert zeroed.exists()


def test_header_use_reports_are_validated_and_notes_said_once() -> None:
    good = pch.HeaderUse(NAME, "rebuilt", 10, 20, 30, "precompiled header x rejected; rebuilt")
    assert pch.HeaderUse.from_json(good.to_json()) == good
    for bad in (
        {**good.to_json(), "verdict": "fine"},
        {**good.to_json(), "size": -1},
        {**good.to_json(), "ino": True},
        {**good.to_json(), "name": NAME + ".tmp"},
        {**good.to_json(), "note": 3},
        [NAME],
    ):
        assert pch.HeaderUse.from_json(bad) is None, bad
    other = pch.HeaderUse(OTHER, "unchecked", note="precompiled header y not checked")
    reports = [good.to_json(), {**good.to_json(), "note": "the same header, from another worker"}, other.to_json()]
    assert pch.header_notes(reports) == [good.note, other.note]
    assert pch.header_notes([pch.HeaderUse(NAME, "verified").to_json()]) == []


def test_describe_hashes_the_raw_file(tmp_path: Path) -> None:
    content = os.urandom(3 << 20)
    artifact = pch.describe(make_header(tmp_path, content=content))
    assert artifact == Artifact(pch.KIND, NAME, hashlib.sha256(content).hexdigest(), len(content))
    assert artifact.to_json() == {
        "kind": "precompiled_header",
        "name": NAME,
        "sha256": artifact.sha256,
        "size": len(content),
    }
    assert pch.header_artifact(artifact.to_json()) == pch.header_artifact(artifact) == artifact


def test_describe_refuses_links_and_foreign_names(tmp_path: Path) -> None:
    target = make_header(tmp_path / "real")
    (tmp_path / "d").mkdir()
    os.symlink(target, tmp_path / "d" / NAME)
    with pytest.raises(HeaderError, match="cannot read"):
        pch.describe(tmp_path / "d" / NAME)
    with pytest.raises(HeaderError, match="not a precompiled-header name"):
        pch.describe(make_header(tmp_path, "notes.txt"))


@pytest.mark.parametrize(
    "change, match",
    [
        ({"kind": "cpp-so"}, "not a precompiled_header artifact"),
        ({"name": "../" + NAME}, "not a precompiled-header name"),
        ({"sha256": "ABC"}, "bad sha256"),
        ({"size": 0}, "bad size"),
        ({"size": True}, "bad size"),
        ({"size": "12"}, "bad size"),
        ({"idle": -1}, "bad idle count"),
        ({"idle": True}, "bad idle count"),
        ({"idle": 1001}, "bad idle count"),
    ],
)
def test_manifest_entries_are_validated(change: dict[str, object], match: str) -> None:
    entry = {"kind": "precompiled_header", "name": NAME, "sha256": "0" * 64, "size": 12, **change}
    with pytest.raises(HeaderError, match=match):
        pch.header_artifact(entry)
    with pytest.raises(HeaderError, match=match):
        pch.header_artifact(Artifact(**entry))  # type: ignore[arg-type]


def test_compress_is_zstd_and_install_round_trips(tmp_path: Path) -> None:
    content = b"gpch" + os.urandom(1 << 20) + b"\0" * (4 << 20)
    artifact, buf = packed(make_header(tmp_path / "a", content=content))
    assert zstandard.ZstdDecompressor().stream_reader(io.BytesIO(buf.getvalue())).read() == content
    assert len(buf.getvalue()) < len(content) // 2
    dest = pch.header_dir(tmp_path)  # the TMPDIR exists; torch's dirs under it do not yet
    assert pch.install_header(artifact, buf, dest) is True
    assert (dest / NAME).read_bytes() == content
    assert sorted(p.name for p in dest.iterdir()) == [NAME, "locks"]  # no temp file left behind
    assert pch.find_used(dest, [], installed=[NAME]) == [dest / NAME]


def test_compress_notices_a_file_replaced_since_describe(tmp_path: Path) -> None:
    path = make_header(tmp_path)
    artifact = pch.describe(path)
    path.write_bytes(b"rebuilt by torch")
    with pytest.raises(HeaderError, match="changed while it was being packed"):
        pch.compress(path, io.BytesIO(), artifact)


def test_install_never_overwrites_a_pch(tmp_path: Path) -> None:
    artifact, buf = packed(make_header(tmp_path / "a", content=b"gpch carried"))
    dest = tmp_path / "hdr"
    existing = make_header(dest, content=b"gpch torch built this one")  # its size differs: gcc's builds do too
    assert pch.install_header(artifact, buf, dest) is False
    assert existing.read_bytes() == b"gpch torch built this one"


@pytest.mark.parametrize("local", [b"\0" * 4096, b"", b"junk" * 100])
def test_install_replaces_a_local_file_that_is_no_pch(tmp_path: Path, local: bytes) -> None:
    """A zeroed file under torch's name is one gcc silently ignores forever (torch never rebuilds an existing
    header): the verified copy replaces it, atomically."""
    artifact, buf = packed(make_header(tmp_path / "a"))
    dest = tmp_path / "hdr"
    make_header(dest, content=local)
    assert pch.is_damaged_copy(dest / NAME)
    assert pch.install_header(artifact, buf, dest) is True
    assert (dest / NAME).read_bytes() == (tmp_path / "a" / NAME).read_bytes()
    assert sorted(p.name for p in dest.iterdir()) == [NAME, "locks"]


def test_install_leaves_a_link_at_the_destination_alone(tmp_path: Path) -> None:
    artifact, buf = packed(make_header(tmp_path / "a"))
    dest = tmp_path / "hdr"
    dest.mkdir()
    os.symlink(tmp_path / "target", dest / NAME)
    assert pch.install_header(artifact, buf, dest) is False
    assert not (tmp_path / "target").exists()


@pytest.mark.parametrize(
    "damage, match",
    [
        (lambda a: Artifact(a.kind, a.name, "0" * 64, a.size), "does not match"),
        (lambda a: Artifact(a.kind, a.name, a.sha256, a.size - 1), "more bytes than"),
        (lambda a: Artifact(a.kind, a.name, a.sha256, a.size + 1), "does not match"),
    ],
)
def test_install_refuses_content_that_is_not_the_manifests(tmp_path: Path, damage, match: str) -> None:  # type: ignore[no-untyped-def]
    artifact, buf = packed(make_header(tmp_path / "a"))
    dest = tmp_path / "hdr"
    with pytest.raises(HeaderError, match=match):
        pch.install_header(damage(artifact), buf, dest)
    assert sorted(p.name for p in dest.iterdir()) == ["locks"]


def test_install_refuses_a_stream_that_is_not_zstd(tmp_path: Path) -> None:
    artifact = pch.describe(make_header(tmp_path / "a"))
    dest = tmp_path / "hdr"
    with pytest.raises(HeaderError, match="not a zstd stream"):
        pch.install_header(artifact, io.BytesIO(b"raw bytes, not zstd" * 100), dest)
    assert not (dest / NAME).exists()


def test_install_refuses_a_symlinked_header_dir(tmp_path: Path) -> None:
    artifact, buf = packed(make_header(tmp_path / "a"))
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "torchinductor_u").mkdir()
    os.symlink(tmp_path / "elsewhere", tmp_path / "torchinductor_u" / "precompiled_headers")
    with pytest.raises(HeaderError, match="not a plain directory"):
        pch.install_header(artifact, buf, tmp_path / "torchinductor_u" / "precompiled_headers")
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_install_refuses_a_header_dir_other_users_may_write_to(tmp_path: Path) -> None:
    """A ``torchinductor_<user>`` made under ``umask 0`` in a shared TMPDIR: anyone could put or swap a header
    there, so nothing is installed into it (and nothing carried from it: the next test)."""
    artifact, buf = packed(make_header(tmp_path / "a"))
    dest = tmp_path / "torchinductor_u" / "precompiled_headers"
    dest.mkdir(parents=True)
    dest.chmod(0o777)
    with pytest.raises(HeaderError, match="can be written by other users"):
        pch.install_header(artifact, buf, dest)
    assert list(dest.iterdir()) == []
    dest.chmod(0o755)
    dest.parent.chmod(0o777)
    with pytest.raises(HeaderError, match="torchinductor_u can be written by other users"):
        pch.install_header(artifact, buf, dest)


def test_install_makes_the_header_dir_only_this_user_may_write_to_whatever_the_umask(tmp_path: Path) -> None:
    artifact, buf = packed(make_header(tmp_path / "a"))
    dest = tmp_path / "torchinductor_u" / "precompiled_headers"
    umask = os.umask(0)
    try:
        assert pch.install_header(artifact, buf, dest) is True
    finally:
        os.umask(umask)
    made = [dest.parent, dest, dest / "locks", *(dest / "locks").iterdir()]
    assert [oct(path.stat().st_mode & 0o777) for path in made] == ["0o755", "0o755", "0o755", "0o644"]


def test_install_refuses_a_lock_dir_other_users_may_write_to(tmp_path: Path) -> None:
    """torch's ``locks`` dir beside the headers, made by a umask-0 process: another user could hold a
    header's build lock (torch waits on it) or remove it (breaking the exclusion between torch's build and
    our install), so nothing is installed under it."""
    artifact, buf = packed(make_header(tmp_path / "a"))
    dest = tmp_path / "torchinductor_u" / "precompiled_headers"
    (dest / "locks").mkdir(parents=True)
    (dest / "locks").chmod(0o777)
    with pytest.raises(HeaderError, match="locks can be written by other users"):
        pch.install_header(artifact, buf, dest)
    assert list(dest.iterdir()) == [dest / "locks"] and list((dest / "locks").iterdir()) == []


def test_save_carries_nothing_from_a_header_dir_other_users_may_write_to(tmp_path: Path) -> None:
    from pytest_compilecache.stores.local import LocalStore

    store = LocalStore(tmp_path / "store")
    machine = pch.header_dir(tmp_path / "a")
    uses = [checked(make_header(machine))]
    machine.chmod(0o777)
    (tmp_path / "scratch").mkdir()
    saved = pch.save_headers(store, "pfx", time.time() - 60, [], tmp_path / "scratch", machine, uses=uses)
    assert (saved.artifacts, saved.transferred) == ([], [])
    assert len(saved.errors) == 1 and "other users may write to it" in saved.errors[0]
    assert store.list("pfx") == []
    machine.chmod(0o755)
    again = pch.save_headers(store, "pfx", time.time() - 60, [], tmp_path / "scratch", machine, uses=uses)
    assert (again.transferred, again.errors) == ([NAME], [])


def test_install_refuses_a_symlinked_dir_of_locks(tmp_path: Path) -> None:
    artifact, buf = packed(make_header(tmp_path / "a"))
    dest, elsewhere = tmp_path / "hdr", tmp_path / "elsewhere"
    dest.mkdir()
    elsewhere.mkdir()
    os.symlink(elsewhere, dest / "locks")
    with pytest.raises(HeaderError, match="locks is not a plain directory"):
        pch.install_header(artifact, buf, dest)
    assert list(elsewhere.iterdir()) == [] and not (dest / NAME).exists()


def test_install_refuses_foreign_names(tmp_path: Path) -> None:
    artifact, buf = packed(make_header(tmp_path / "a"))
    with pytest.raises(HeaderError, match="not a precompiled-header artifact"):
        pch.install_header(Artifact(pch.KIND, "evil.so", artifact.sha256, artifact.size), buf, tmp_path / "hdr")
    assert not (tmp_path / "hdr").exists()


def test_install_skips_a_header_torch_is_building(tmp_path: Path) -> None:
    artifact, buf = packed(make_header(tmp_path / "a"))
    dest = tmp_path / "hdr"
    (dest / "locks").mkdir(parents=True)
    with open(dest / "locks" / (NAME.split(".")[0] + ".lock"), "w") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)  # what torch's FileLock does while it builds the header
        assert pch.install_header(artifact, buf, dest) is False
    assert not (dest / NAME).exists()
    assert pch.install_header(artifact, buf, dest) is True


def test_object_keys_are_content_addressed_and_store_safe() -> None:
    digest = hashlib.sha256(b"x").hexdigest()
    assert pch.object_key("compilecache-v1", digest) == f"compilecache-v1-artifact-{digest}"
    with pytest.raises(ValueError, match="sha256"):
        pch.object_key("p", "../" + digest)
    with pytest.raises(ValueError, match=r"\[A-Za-z0-9._-\]"):
        pch.object_key("a/b", digest)


def test_save_then_restore_through_a_store(tmp_path: Path) -> None:
    from pytest_compilecache.stores.local import LocalStore

    store = LocalStore(tmp_path / "store")
    machine = pch.header_dir(tmp_path / "a")
    content = b"gpch" + os.urandom(1 << 16) * 8
    uses = [checked(make_header(machine, content=content))]
    (tmp_path / "scratch").mkdir()
    saved = pch.save_headers(store, "pfx", time.time() - 60, [], tmp_path / "scratch", machine, uses=uses)
    assert (saved.transferred, saved.errors) == ([NAME], [])
    key = pch.object_key("pfx", saved.artifacts[0].sha256)
    assert [entry.key for entry in store.list("pfx")] == [key]
    again = pch.save_headers(store, "pfx", time.time() - 60, [], tmp_path / "scratch", machine, uses=uses)
    assert (again.artifacts, again.transferred) == (saved.artifacts, [])  # once per store

    (tmp_path / "b").mkdir()  # the fresh machine's TMPDIR
    fresh = pch.header_dir(tmp_path / "b")
    entries = [*saved.artifacts, Artifact("cpp-so", "x.so", "0" * 64, 1)]
    restored = pch.restore_headers(store, "pfx", entries, tmp_path / "scratch", fresh)
    assert (restored.transferred, restored.errors) == ([NAME], [])
    assert (fresh / NAME).read_bytes() == content
    present = pch.restore_headers(store, "pfx", entries, tmp_path / "scratch", fresh)
    assert (present.artifacts, present.transferred, present.errors) == (saved.artifacts, [], [])
    assert list((tmp_path / "scratch").iterdir()) == []


def test_restore_problems_are_warning_lines_and_change_nothing(tmp_path: Path) -> None:
    from pytest_compilecache.stores.local import LocalStore

    store = LocalStore(tmp_path / "store")
    (tmp_path / "scratch").mkdir()
    artifact, buf = packed(make_header(tmp_path / "a"))
    (tmp_path / "b").mkdir()
    fresh = pch.header_dir(tmp_path / "b")
    missing = pch.restore_headers(store, "pfx", [artifact], tmp_path / "scratch", fresh)
    assert missing.transferred == [] and len(missing.errors) == 1 and "not in the store" in missing.errors[0]
    other = tmp_path / "other.zst"
    other.write_bytes(zstandard.ZstdCompressor().compress(b"tampered"))
    store.put(pch.object_key("pfx", artifact.sha256), other)
    tampered = pch.restore_headers(store, "pfx", [artifact], tmp_path / "scratch", fresh)
    assert tampered.transferred == [] and "does not match" in tampered.errors[0]
    bad = pch.restore_headers(store, "pfx", [replace(artifact, name="../x.h.gch")], tmp_path, fresh)
    assert "not a precompiled-header name" in bad.errors[0]
    assert not (fresh / NAME).exists()


def test_a_store_that_fails_is_one_line_for_all_its_headers(tmp_path: Path) -> None:
    from tests.fakes import MemoryStore

    store = MemoryStore(fail=("list",))
    (tmp_path / "scratch").mkdir()
    first = pch.describe(make_header(tmp_path / "a"))
    second = replace(first, name="c" + "u" * 51 + ".h.gch", sha256="1" * 64)
    (tmp_path / "b").mkdir()
    down = pch.restore_headers(store, "pfx", [first, second], tmp_path / "scratch", pch.header_dir(tmp_path / "b"))
    assert down.transferred == [] and len(down.errors) == 1, down.errors
    assert down.errors[0].endswith("; 1 more not tried (torch builds them)")
    assert store.calls.count("list") == 1  # one wait, not one per header
    assert [a.name for a in down.artifacts] == [first.name, second.name]  # the bundle still names both


def test_a_header_object_larger_than_its_header_can_pack_is_never_downloaded(tmp_path: Path) -> None:
    from pytest_compilecache.stores.local import LocalStore

    store = LocalStore(tmp_path / "store")
    (tmp_path / "scratch").mkdir()
    artifact, _ = packed(make_header(tmp_path / "a"))
    huge = tmp_path / "huge"
    huge.write_bytes(b"\0" * (pch.packed_bound(artifact.size) + 1))
    store.put(pch.object_key("pfx", artifact.sha256), huge)
    fetched: list[str] = []
    real_get = store.get

    def get(key: str, dest: Path, *, limit: int | None = None) -> bool:
        fetched.append(key)
        return real_get(key, dest, limit=limit)

    store.get = get  # type: ignore[method-assign]
    (tmp_path / "b").mkdir()
    fresh = pch.header_dir(tmp_path / "b")
    result = pch.restore_headers(store, "pfx", [artifact], tmp_path / "scratch", fresh)
    assert result.transferred == [] and "more than a" in result.errors[0], result.errors
    assert fetched == []  # refused from its listed size, before a byte moved
    assert list((tmp_path / "scratch").iterdir()) == []


def test_verify_checks_a_stream_without_writing_it(tmp_path: Path) -> None:
    artifact, buf = packed(make_header(tmp_path / "a"))
    pch.verify_header_copy(artifact, buf)  # the header's own bytes: no error
    other, other_buf = packed(make_header(tmp_path / "b", content=b"other" * 100))
    with pytest.raises(HeaderError, match="does not match"):
        pch.verify_header_copy(artifact, other_buf)
    with pytest.raises(HeaderError, match="not a zstd stream"):
        pch.verify_header_copy(artifact, io.BytesIO(b"plain bytes"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]


def test_save_headers_leaves_carried_keys_to_their_own_transport(tmp_path: Path) -> None:
    from pytest_compilecache.stores.local import LocalStore

    store = LocalStore(tmp_path / "store")
    machine = pch.header_dir(tmp_path / "a")
    path = make_header(machine)
    key = pch.object_key("pfx", pch.describe(path).sha256)
    (tmp_path / "scratch").mkdir()
    saved = pch.save_headers(
        store, "pfx", time.time() - 60, [], tmp_path / "scratch", machine, carried=[key], uses=[checked(path)]
    )
    assert ([a.name for a in saved.artifacts], saved.transferred, saved.errors) == ([NAME], [], [])
    assert store.list("pfx") == []


def test_save_uploads_only_headers_a_process_checked(tmp_path: Path) -> None:
    from pytest_compilecache.stores.local import LocalStore

    store = LocalStore(tmp_path / "store")
    machine = pch.header_dir(tmp_path / "a")
    good = make_header(machine, "c" + "g" * 51 + ".h.gch")
    bad = make_header(machine, "c" + "b" * 51 + ".h.gch", content=b"gpch" + b"\0" * 100)  # a truncated one
    unchecked = make_header(machine, "c" + "u" * 51 + ".h.gch")  # the check could not run
    restored = make_header(machine, "c" + "r" * 51 + ".h.gch", content=b"gpch restored")  # looked up by nobody
    uses = [checked(good), checked(bad, "damaged"), checked(unchecked, "unchecked")]
    (tmp_path / "scratch").mkdir()
    saved = pch.save_headers(store, "pfx", 0.0, [restored.name], tmp_path / "scratch", machine, uses=uses)
    assert saved.transferred == [good.name], saved
    assert [a.name for a in saved.artifacts] == [good.name]
    (error,) = saved.errors  # the restored one is not in the store: never uploaded unchecked
    assert restored.name in error and "no process checked it" in error
    key = pch.object_key("pfx", pch.describe(restored).sha256)
    with open(tmp_path / "obj", "wb") as out:
        pch.compress(restored, out)
    store.put(key, tmp_path / "obj")  # the object the restore fetched it from
    again = pch.save_headers(store, "pfx", 0.0, [restored.name], tmp_path / "scratch", machine, uses=uses)
    assert ([a.name for a in again.artifacts], again.transferred, again.errors) == (
        sorted([good.name, restored.name]),
        [],
        [],
    )


def test_restore_replaces_a_local_header_that_is_no_pch_with_one_note(tmp_path: Path) -> None:
    from pytest_compilecache.stores.local import LocalStore

    store = LocalStore(tmp_path / "store")
    (tmp_path / "scratch").mkdir()
    source = make_header(tmp_path / "a")
    artifact = pch.describe(source)
    with open(tmp_path / "obj", "wb") as out:
        pch.compress(source, out)
    store.put(pch.object_key("pfx", artifact.sha256), tmp_path / "obj")
    fresh = pch.header_dir(tmp_path / "b")
    make_header(fresh, content=b"\0" * artifact.size)  # zeroed in place: gcc would ignore it for good
    result = pch.restore_headers(store, "pfx", [artifact], tmp_path / "scratch", fresh)
    assert (result.transferred, result.errors) == ([NAME], [])
    (note,) = result.notes
    assert NAME in note and "replaced" in note
    assert (fresh / NAME).read_bytes() == source.read_bytes()
    sound = make_header(tmp_path / "c" / "hdr", content=b"gpch another build of the same header")
    kept = pch.restore_headers(store, "pfx", [artifact], tmp_path / "scratch", sound.parent)
    assert (kept.transferred, kept.notes) == ([], [])  # a PCH: the processes that look it up check it
    assert sound.read_bytes() == b"gpch another build of the same header"


FAKE_COMPILER = """#!/bin/sh
# A compiler that behaves as gcc does with -include X: X.gch is used when it is a whole PCH ("gpch", "END"
# last), rejected when it is no PCH (then X itself is read, which the check leaves absent), fatal when cut.
while [ $# -gt 0 ]; do
  case "$1" in -include) shift; inc=$1 ;; esac
  echo "$1" >> "$FAKE_CC_LOG"
  shift
done
head -c 4 "$inc.gch" | grep -q gpch || {
  echo "cc1plus: warning: $inc.gch: not a PCH file [-Winvalid-pch]" >&2
  [ -f "$inc" ] && exit 0
  echo "<command-line>: fatal error: $inc: No such file or directory" >&2; exit 1; }
tail -c 3 "$inc.gch" | grep -q END || { echo "<command-line>: fatal error: cannot read PCH file" >&2; exit 1; }
exit 0
"""


@pytest.fixture
def fake_compiler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    compiler = tmp_path / "fake-g++"
    compiler.write_text(FAKE_COMPILER)
    compiler.chmod(0o755)
    monkeypatch.setenv("FAKE_CC_LOG", str(tmp_path / "cc.log"))

    def command(source: Path, include: Path) -> list[str]:
        return [str(compiler), str(source), "-O3", "-include", str(include)]

    return command


@pytest.mark.parametrize(
    "content, reason",
    [
        (b"gpch" + b"x" * 100 + b"END", None),
        (b"gpch" + b"x" * 50, "cannot read PCH file"),  # truncated
        (b"\0" * 200, f"{NAME}: not a PCH file"),  # zeroed: with a text header to fall back on, gcc says nothing
    ],
)
def test_check_accepts_only_a_pch_the_compiler_loads(tmp_path: Path, fake_compiler, content: bytes, reason) -> None:  # type: ignore[no-untyped-def]
    path = make_header(tmp_path / "hdr", content=content)
    (tmp_path / "hdr" / NAME[: -len(".gch")]).write_text("#include <vector>\n")  # torch's text header
    got = pch.check(path, fake_compiler)
    assert got == reason if reason is None else reason in str(got), got
    argv = (tmp_path / "cc.log").read_text().split()
    assert argv[-2:] == ["-fsyntax-only", "-Winvalid-pch"] and "-O3" in argv
    assert str(tmp_path / "hdr") not in " ".join(argv)  # a private dir: no text header there to fall back on
    assert path.read_bytes() == content


def test_check_that_cannot_run_proves_nothing(tmp_path: Path) -> None:
    path = make_header(tmp_path)
    with pytest.raises(HeaderError, match="cannot run"):
        pch.check(path, lambda source, include: [str(tmp_path / "no-such-compiler"), str(source)])
    with pytest.raises(HeaderError, match="did not finish"):
        pch.check(path, lambda source, include: ["sh", "-c", "sleep 5", "sh"], timeout=0.2)


def test_remove_if_unchanged_takes_torchs_lock_and_only_the_file_checked(tmp_path: Path) -> None:
    path = make_header(tmp_path)
    info = os.lstat(path)
    (tmp_path / "locks").mkdir()
    with open(tmp_path / "locks" / (NAME.split(".")[0] + ".lock"), "w") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)  # torch is building it right now
        assert pch.remove_if_unchanged(path, info) is False
    path.write_bytes(b"gpch repaired by another process")
    assert pch.remove_if_unchanged(path, info) is False
    assert pch.remove_if_unchanged(path, os.lstat(path)) is True
    assert not path.exists()
    assert pch.remove_if_unchanged(path, info) is False  # gone already


@pytest.fixture(scope="module")
def real_pch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real gcc PCH of a small header (``<vector>``), built with ``-O2 -DCHECKED=1``."""
    import shutil
    import subprocess

    if shutil.which("g++") is None:
        pytest.fail("g++ is needed (torch compiles C++ kernels with it)")
    directory = tmp_path_factory.mktemp("pch")
    text = directory / NAME[: -len(".gch")]
    text.write_text("#include <vector>\n")
    build = ["g++", "-O2", "-DCHECKED=1", "-x", "c++-header", str(text), "-o", str(directory / NAME)]
    subprocess.run(build, check=True)
    return directory / NAME


def _gxx(*flags: str):  # type: ignore[no-untyped-def]
    return lambda source, include: ["g++", str(source), *flags, "-include", str(include)]


@pytest.mark.parametrize(
    "damage, reason",
    [
        (lambda data: data, None),
        (lambda data: data[: len(data) // 2], "cannot read PCH file"),
        (lambda data: b"\0" * len(data), "not a PCH file"),
        # Seeded junk: gcc's words for random bytes vary (once in a while it reports only the missing text header).
        (lambda data: data[:4096] + random.Random(4096).randbytes(len(data) - 4096), "not used because"),
    ],
    ids=["sound", "truncated", "zeroed", "junk-after-a-valid-start"],
)
def test_check_with_gcc(real_pch: Path, tmp_path: Path, damage, reason) -> None:  # type: ignore[no-untyped-def]
    """What gcc really does with each damage, under the flags the header was built with: every one that torch's
    kernel builds would trip on (fatal) or silently ignore (a slow compile forever) fails the check."""
    path = make_header(tmp_path, content=damage(real_pch.read_bytes()))
    got = pch.check(path, _gxx("-O2", "-DCHECKED=1"))
    assert got == reason if reason is None else reason in str(got), got


def test_check_with_gcc_under_other_flags_fails(real_pch: Path) -> None:
    got = pch.check(real_pch, _gxx("-O0"))  # gcc would not use it for such a compile: fails, never falls back
    assert got is not None and NAME in got


SECOND_PROCESS = """
import sys
from pathlib import Path

from pytest_compilecache import pch

compiler = sys.argv[2]
print(pch.check(Path(sys.argv[1]), lambda s, i: [compiler, str(s), "-O3", "-include", str(i)], remember=True))
"""


def test_an_accepted_header_costs_the_next_process_no_compiler_run(  # type: ignore[no-untyped-def]
    tmp_path: Path, fake_compiler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 24: every pytest process checked every header it used, warm runs too (about 0.4 s of CPU per
    header). The header dir's record remembers an acceptance for this very file, argv and compiler."""
    import subprocess
    import sys

    path = make_header(tmp_path / "torchinductor_u" / "precompiled_headers", content=b"gpch" + b"x" * 100 + b"END")
    monkeypatch.setattr(pch.verdicts, "SETTLED_NS", 20_000_000, raising=False)  # absent before issue 24's record
    time.sleep(0.05)
    log = tmp_path / "cc.log"
    assert pch.check(path, fake_compiler, remember=True) is None
    calls = log.read_text()
    compiler = fake_compiler(Path("s"), Path("i"))[0]
    second = subprocess.run(
        [sys.executable, "-c", SECOND_PROCESS, str(path), compiler], capture_output=True, text=True, check=True
    )
    assert second.stdout.strip() == "None", second.stderr
    assert log.read_text() == calls, "the second process ran the compiler"
    # Other flags: checked again. The same flags again: remembered too.
    for _ in range(2):
        assert pch.check(path, lambda s, i: [*fake_compiler(s, i), "-O0"], remember=True) is None
    assert log.read_text().count("-O0") == 1
    # Another compiler under the same name (an upgrade replaces the file): checked again.
    replaced = tmp_path / "new-g++"
    replaced.write_text(FAKE_COMPILER)
    replaced.chmod(0o755)
    os.replace(replaced, compiler)
    checks = log.read_text().count("-fsyntax-only")
    assert pch.check(path, fake_compiler, remember=True) is None
    assert log.read_text().count("-fsyntax-only") == checks + 1
    # Without remember (the default), the record is neither read nor written.
    assert pch.check(path, fake_compiler) is None
    assert log.read_text().count("-fsyntax-only") == checks + 2


def test_a_rejection_is_never_remembered_and_a_foreign_dir_keeps_no_record(  # type: ignore[no-untyped-def]
    tmp_path: Path, fake_compiler, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pch.verdicts, "SETTLED_NS", 0, raising=False)  # absent before issue 24's record
    directory = tmp_path / "torchinductor_u" / "precompiled_headers"
    cut = make_header(directory, content=b"gpch" + b"x" * 100)
    time.sleep(0.05)
    for _ in range(2):
        assert "cannot read PCH file" in str(pch.check(cut, fake_compiler, remember=True))
    assert not (directory / pch.VERDICTS).exists()
    cut.unlink()
    directory.chmod(0o777)  # others may write here: nothing they leave is trusted, nothing is written
    sound = make_header(directory, content=b"gpch" + b"x" * 100 + b"END")
    time.sleep(0.05)
    for _ in range(2):
        assert pch.check(sound, fake_compiler, remember=True) is None
    assert not (directory / pch.VERDICTS).exists()
    assert (tmp_path / "cc.log").read_text().count("-fsyntax-only") == 4


def test_a_verdict_is_remembered_only_once_a_later_write_must_change_the_ctime() -> None:
    second = 1_000_000_000
    base = 1_700_000_000 * second + 123_456_789  # a stamp in ns: the granule is the kernel's tick
    assert not pch.verdicts._settled(base, base + 10_000_000)  # the same tick, maybe: a write would stamp the same
    assert pch.verdicts._settled(base, base + pch.SETTLED_NS + 1)
    whole = 1_700_000_000 * second  # whole seconds (ext3, FAT): a write within 2 s may stamp the same
    assert not pch.verdicts._settled(whole, whole + second)
    assert pch.verdicts._settled(whole, whole + 2 * second + 1)


SLOW_COMPILER = FAKE_COMPILER.replace("while [ $# -gt 0 ]; do", "sleep 0.5\nwhile [ $# -gt 0 ]; do", 1)


def test_processes_checking_one_header_at_once_run_the_compiler_once(tmp_path: Path) -> None:
    """Issue 25: xdist workers of a fresh runner meet the header the restore installed at the same moment;
    the later ones wait for the first one's verdict instead of running the compiler again."""
    import subprocess
    import sys

    compiler = tmp_path / "slow-g++"
    compiler.write_text(SLOW_COMPILER)
    compiler.chmod(0o755)
    path = make_header(tmp_path / "torchinductor_u" / "precompiled_headers", content=b"gpch" + b"x" * 100 + b"END")
    time.sleep(0.1)  # installed a moment before the workers look it up
    log = tmp_path / "cc.log"
    env = {**os.environ, "FAKE_CC_LOG": str(log)}
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", SECOND_PROCESS, str(path), str(compiler)],
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        for _ in range(3)
    ]
    outputs = [worker.communicate(timeout=60) for worker in workers]
    assert [out.strip() for out, _ in outputs] == ["None"] * 3, outputs
    assert log.read_text().count("-fsyntax-only") == 1


def test_a_header_built_a_moment_ago_is_remembered_by_its_first_check(tmp_path: Path, fake_compiler) -> None:  # type: ignore[no-untyped-def]
    """torch checks the header it has just built within milliseconds: the check waits the few ms the file
    needs to settle (SETTLED_NS), so that its verdict can be remembered for the next processes."""
    path = make_header(tmp_path / "torchinductor_u" / "precompiled_headers", content=b"gpch" + b"x" * 100 + b"END")
    for _ in range(3):
        assert pch.check(path, fake_compiler, remember=True) is None
    assert (tmp_path / "cc.log").read_text().count("-fsyntax-only") == 1


def _stored_header(tmp_path: Path) -> tuple[LocalStore, Artifact, bytes]:
    """A store holding one header object (as a save put it there) and that header's manifest entry."""

    store = LocalStore(tmp_path / "store")
    content = b"gpch" + os.urandom(1 << 16) * 8
    uses = [checked(make_header(pch.header_dir(tmp_path / "a"), content=content))]
    (tmp_path / "scratch").mkdir()
    saved = pch.save_headers(
        store, "pfx", time.time() - 60, [], tmp_path / "scratch", pch.header_dir(tmp_path / "a"), uses=uses
    )
    return store, saved.artifacts[0], content


def test_a_compile_that_looks_a_reserved_header_up_waits_for_its_install(tmp_path: Path) -> None:
    """Issue 25: the restore installs the headers in the background while the tests start. torch's build
    lock, taken first (reserve_headers), holds any compile that looks the header up (torch's
    _worker_compile_cpp: FileLock, then "build unless the file exists") until the verified file is in place."""
    import threading

    from filelock import FileLock

    store, artifact, content = _stored_header(tmp_path)
    (tmp_path / "b").mkdir()
    fresh = pch.header_dir(tmp_path / "b")
    reservation = pch.reserve_headers([artifact], fresh)
    assert list(reservation.held) == [NAME]
    seen: list[bool] = []

    def torch_looks_it_up() -> None:
        with FileLock(str(fresh / "locks" / (NAME.split(".")[0] + ".lock")), timeout=30):
            seen.append((fresh / NAME).exists())  # torch builds the header only when this is False

    torch = threading.Thread(target=torch_looks_it_up)
    torch.start()
    time.sleep(0.3)
    assert seen == [] and not (fresh / NAME).exists()  # waiting in torch's own lock
    restored = pch.restore_headers(store, "pfx", [artifact], tmp_path / "scratch", fresh, reservation)
    torch.join(30)
    assert seen == [True] and (restored.transferred, restored.errors) == ([NAME], [])
    assert (fresh / NAME).read_bytes() == content and reservation.held == {}
    assert not pch.locks.being_built(fresh, NAME)  # let go
    # Nothing left to install: nothing reserved.
    assert pch.reserve_headers([artifact], fresh).held == {}


def test_a_reservation_is_never_held_on_by_a_forked_child(tmp_path: Path) -> None:
    """A test that forks (a DataLoader worker) while the install runs must not keep torch's build lock
    held after the install lets go: every later compile of the machine would wait for that child."""
    store, artifact, _ = _stored_header(tmp_path)
    (tmp_path / "b").mkdir()
    fresh = pch.header_dir(tmp_path / "b")
    reservation = pch.reserve_headers([artifact], fresh)
    child = os.fork()
    if child == 0:  # the child lives on, doing nothing of ours
        time.sleep(3)
        os._exit(0)
    try:
        time.sleep(0.2)
        pch.restore_headers(store, "pfx", [artifact], tmp_path / "scratch", fresh, reservation)
        assert not pch.locks.being_built(fresh, NAME), "the forked child still holds torch's build lock"
    finally:
        os.kill(child, 9)
        os.waitpid(child, 0)


def test_no_header_lock_is_held_on_by_a_process_forked_while_it_was_held(tmp_path: Path) -> None:
    """torch's build lock (taken to install or remove a header) and a check's lock on the header file, each
    held in a thread while the process forks (torch's fork compile workers, a forked test): once this process
    lets go, the child must not hold it on, or later checks and compiles wait for as long as it lives."""
    from pytest_compilecache import _fs
    from pytest_compilecache.pch import verdicts

    (tmp_path / "b").mkdir()
    directory = pch.header_dir(tmp_path / "b")
    pch.locks.ensure_dir(directory)
    header = directory / NAME
    header.write_bytes(b"gch")
    children = []
    try:
        with pch.locks.build_lock(directory, NAME) as held, verdicts._one_check_at_a_time(header):
            assert held and pch.locks.being_built(directory, NAME)
            child = os.fork()
            if child == 0:  # the child lives on, doing nothing of ours
                time.sleep(5)
                os._exit(0)
            children.append(child)
            time.sleep(0.2)
        assert not pch.locks.being_built(directory, NAME), "the forked child still holds torch's build lock"
        fd = os.open(header, os.O_RDONLY)
        try:
            assert _fs.try_flock(fd), "the forked child still holds the check's lock on the header"
        finally:
            os.close(fd)
    finally:
        for child in children:
            os.kill(child, 9)
            os.waitpid(child, 0)


def test_a_failed_install_lets_go_of_the_reservation(tmp_path: Path) -> None:
    from pytest_compilecache.stores.local import LocalStore

    _, artifact, _ = _stored_header(tmp_path)
    (tmp_path / "b").mkdir()
    fresh = pch.header_dir(tmp_path / "b")
    reservation = pch.reserve_headers([artifact], fresh)
    empty = LocalStore(tmp_path / "empty")
    failed = pch.restore_headers(empty, "pfx", [artifact], tmp_path / "scratch", fresh, reservation)
    assert "not in the store" in failed.errors[0] and reservation.held == {}
    assert not pch.locks.being_built(fresh, NAME) and not (fresh / NAME).exists()  # torch builds it


def test_a_compile_failure_naming_a_header_drops_its_verdict_and_removes_it(  # type: ignore[no-untyped-def]
    tmp_path: Path, fake_compiler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 44, finding 5: a damaged header whose record still matched (forged here; corruption that leaves the
    metadata alone does the same) was never checked again, and every kernel compile failed, session after
    session, with no note. A compile failure that names it drops its verdict, and removes a file the compiler
    could not read: later kernels of the process parse the text header, the next session's torch builds it."""
    import json

    monkeypatch.setattr(pch.verdicts, "SETTLED_NS", 0, raising=False)
    directory = tmp_path / "torchinductor_u" / "precompiled_headers"
    path = make_header(directory, content=b"gpch" + b"x" * 100 + b"END")
    time.sleep(0.05)
    assert pch.check(path, fake_compiler, remember=True) is None
    with open(path, "r+b") as fh:  # cut in place: the same inode
        fh.truncate(50)
    record = json.loads((directory / pch.VERDICTS).read_text())
    info = os.lstat(path)
    record["accepted"][path.name]["file"] = [info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns]
    (directory / pch.VERDICTS).write_text(json.dumps(record))  # forged: it describes the cut file
    checks = (tmp_path / "cc.log").read_text().count("-fsyntax-only")
    assert pch.check(path, fake_compiler, remember=True) is None  # the record vouches for the damaged file
    assert (tmp_path / "cc.log").read_text().count("-fsyntax-only") == checks

    # torch's CppCompileError: the command (which names the header's text file in -include), then gcc's output
    command = f"g++ /c/k.cpp -O3 -include {directory}/{path.name[: -len('.gch')]} -c -o /c/k.o"
    unrelated = f"C++ compile error\n\nCommand:\n{command}\n\nOutput:\n/c/k.cpp:3:1: error: expected ';'"
    assert pch.after_compile_error(unrelated, directory) == []  # the kernel's own error: the header is fine
    clang = command.replace("g++", "clang++") + " -Xclang -fno-validate-pch -relocatable-pch -Xclang -fno-pch-timestamp"
    clangs = f"C++ compile error\n\nCommand:\n{clang}\n\nOutput:\n/c/k.cpp:3:1: error: expected ';'"
    assert pch.after_compile_error(clangs, directory) == []  # torch's clang flags name PCH: not a complaint
    assert path.name in json.loads((directory / pch.VERDICTS).read_text())["accepted"]
    text = f"C++ compile error\n\nCommand:\n{command}\n\nOutput:\ncc1plus: error: while reading precompiled header: x"
    [use] = pch.after_compile_error(text, directory)
    assert (use.name, use.verdict) == (path.name, "unchecked") and "removed" in use.note
    assert pch.find_used(directory, [use.to_json()]) == []  # never carried
    assert not path.exists()
    assert path.name not in json.loads((directory / pch.VERDICTS).read_text())["accepted"]


def test_a_compiled_header_that_breaks_a_compile_silently_is_found_by_compiling_without_it(tmp_path: Path) -> None:
    """A compiled header that passes the check but breaks a kernel whose compiler names no header (damaged deep
    inside, or built from another text: gcc does not compare it with the text header): the compile that
    succeeds without it says it was the header's doing, which is then removed, and never carried."""
    import shutil
    import subprocess

    if shutil.which("g++") is None:
        pytest.fail("g++ is needed (torch compiles C++ kernels with it)")
    directory = tmp_path / "precompiled_headers"
    directory.mkdir()
    text = directory / NAME[: -len(".gch")]
    text.write_text("int declared_here(int x) { return x + 1; }\n")
    (tmp_path / "other.h").write_text("int declared_elsewhere(int);\n")
    built = ["g++", "-fPIC", "-x", "c++-header", str(tmp_path / "other.h"), "-o", str(directory / NAME)]
    subprocess.run(built, check=True)  # a sound PCH, of another text: gcc uses it silently
    kernel = tmp_path / "k.cpp"
    kernel.write_text("int kernel(int x) { return declared_here(x); }\n")
    command = ["g++", str(kernel), "-shared", "-fPIC", "-include", str(text), "-o", str(tmp_path / "k.so")]
    assert subprocess.run(command, capture_output=True).returncode != 0  # what torch met
    assert pch.after_compile_error("k.cpp:1:30: error: 'declared_here' was not declared", directory) == []

    kernel.write_text("int kernel(int x) { return declared_here(x) }\n")  # the kernel's own error too
    assert pch.after_silent_compile_error(command, directory) == []
    assert (directory / NAME).exists()  # it fails without the header as well: not the header's doing
    assert pch.after_silent_compile_error([c for c in command if c not in ("-include", str(text))], directory) == []

    kernel.write_text("int kernel(int x) { return declared_here(x); }\n")
    [use] = pch.after_silent_compile_error(command, directory)
    assert (use.name, use.verdict) == (NAME, "unchecked") and "succeeds without it; removed" in use.note
    assert not (directory / NAME).exists() and text.exists()  # the text header stays: torch builds it again
    assert not (tmp_path / "k.so").exists()  # the second compile wrote only in its own temp dir
    assert not list(directory.glob("*.so")) and pch.find_used(directory, [use.to_json()]) == []


def test_a_kernel_compile_that_failed_once_blames_no_header(tmp_path: Path) -> None:
    """A compile that failed for a passing reason (a compiler killed for memory, a full disk) and then succeeds,
    header and all, leaves the header where other processes use it: it is run as it was before anything is
    blamed."""
    directory = tmp_path / "precompiled_headers"
    directory.mkdir()
    text = directory / NAME[: -len(".gch")]
    text.write_text("int declared_here(int x);\n")
    (directory / NAME).write_bytes(b"gpch" + b"sound enough")
    runs = tmp_path / "runs"
    flaky = tmp_path / "flaky-g++"  # fails its first run only, whatever it compiles
    flaky.write_text(f"#!/bin/sh\necho run >> {runs}\n[ $(wc -l < {runs}) -gt 1 ]\n")
    flaky.chmod(0o755)
    command = [str(flaky), "k.cpp", "-include", str(text), "-o", str(tmp_path / "k.so")]
    assert subprocess.run(command).returncode != 0  # what torch met
    assert pch.after_silent_compile_error(command, directory) == []
    assert (directory / NAME).read_bytes() == b"gpch" + b"sound enough"
    assert runs.read_text().count("run") == 2  # torch's, then the one as it was; none without the header


def test_torchs_failed_kernel_compile_reaches_the_cure_in_the_process_that_compiles(  # type: ignore[no-untyped-def]
    tmp_path: Path, fake_compiler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probe wraps ``codecache._worker_compile_cpp`` (called by its module-global name, in this process or,
    pickled by name, in a compile worker): torch's error passes through unchanged, after the cure."""
    import sys

    from pytest_compilecache import probe
    from pytest_compilecache.probe import hooks
    from pytest_compilecache.probe import pch as probe_pch
    from tests.unit.test_probe_headers import NAME as TEXT_HEADER
    from tests.unit.test_probe_headers import FakeCodecache

    directory = tmp_path / "precompiled_headers"
    directory.mkdir()
    fake = FakeCodecache(directory)
    fake._HEADER_DIR = str(directory)  # type: ignore[attr-defined]
    output = "cc1plus: error: while reading precompiled header: No such file or directory"

    def _worker_compile_cpp(lock_path: str, cpp_builders: object) -> None:
        raise RuntimeError(f"C++ compile error\n\nCommand:\ng++ k.cpp -include {directory / TEXT_HEADER}\n\n{output}")

    fake._worker_compile_cpp = _worker_compile_cpp  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, hooks.CODECACHE, fake)
    monkeypatch.setattr(probe_pch, "_header_check_command", lambda cc, s, i: fake_compiler(Path(s), Path(i)))
    probe.uninstall_header_watch()
    probe.watch_precompiled_headers()
    try:
        fake._precompile_header("torch/csrc/inductor/cpp_prefix.h", "g++ -O3")  # looked up and checked: sound
        assert (directory / (TEXT_HEADER + ".gch")).exists()
        with pytest.raises(RuntimeError, match="while reading precompiled header"):
            fake._worker_compile_cpp("k.lock", ())
        assert not (directory / (TEXT_HEADER + ".gch")).exists()
        (use,) = probe.precompiled_headers_used()
        assert use["verdict"] == "unchecked" and "made a kernel compile fail" in use["note"], use

        # A failure that names no header: each builder's own command runs again without it.
        output = "k.cpp:1:30: error: 'declared_here' was not declared in this scope"
        asked: list[list[str]] = []

        def without(command: list[str], where: Path | None) -> list[pch.HeaderUse]:
            asked.append(command)
            return [pch.HeaderUse("c" + "x" * 51 + ".h.gch", "unchecked", note="made a kernel compile fail")]

        class Builder:
            def get_command_line(self) -> str:
                return f"g++ 'k k.cpp' -include {directory / TEXT_HEADER} -o k.so"

        monkeypatch.setattr(pch, "after_silent_compile_error", without)
        with pytest.raises(RuntimeError, match="was not declared"):
            fake._worker_compile_cpp("k.lock", [Builder()])
        assert asked == [["g++", "k k.cpp", "-include", str(directory / TEXT_HEADER), "-o", "k.so"]]
        assert {u["name"] for u in probe.precompiled_headers_used()} >= {"c" + "x" * 51 + ".h.gch"}
    finally:
        probe.uninstall_header_watch()
    assert fake._worker_compile_cpp is _worker_compile_cpp
