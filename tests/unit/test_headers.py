"""headers.py: finding, describing, packing and installing torch's precompiled headers (no torch needed)."""

from __future__ import annotations

import fcntl
import getpass
import hashlib
import io
import os
import tempfile
import time
from pathlib import Path

import pytest
import zstandard

from pytest_compilecache import headers
from pytest_compilecache.headers import HeaderArtifact
from pytest_compilecache.headers import HeaderError

NAME = "c" + "a2b3c4d5e6f7" * 4 + "abc" + ".h.gch"  # 1 + 51 chars, as torch's code_hash names it
OTHER = "c" + "z" * 51 + ".h.gch"


def make_header(directory: Path, name: str = NAME, content: bytes = b"gch" * 1000) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_bytes(content)
    return path


def packed(path: Path) -> tuple[HeaderArtifact, io.BytesIO]:
    artifact = headers.describe(path)
    buf = io.BytesIO()
    headers.compress(path, buf, artifact)
    buf.seek(0)
    return artifact, buf


def test_names_are_torchs_and_nothing_else() -> None:
    assert len(NAME) == 52 + len(".h.gch")
    assert headers.is_header_name(NAME)
    assert headers.is_header_name(NAME.replace(".gch", ".pch"))
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
        assert not headers.is_header_name(bad), bad


def test_header_dir_follows_tmpdir_not_the_cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "elsewhere"))
    monkeypatch.setattr(getpass, "getuser", lambda: "ci:user")
    assert headers.header_dir() == tmp_path / "torchinductor_ci_user" / "precompiled_headers"


def test_header_dir_without_a_user_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_user() -> str:
        raise KeyError("uid not in passwd")

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(getpass, "getuser", no_user)
    assert headers.header_dir().parent.name == f"torchinductor_uid_{os.getuid()}"


def test_find_used_picks_built_read_and_installed_headers(tmp_path: Path) -> None:
    old = time.time() - 3600
    built = make_header(tmp_path, "c" + "b" * 51 + ".h.gch")
    read = make_header(tmp_path, "c" + "r" * 51 + ".h.gch")
    installed = make_header(tmp_path, "c" + "i" * 51 + ".h.gch")
    stale = make_header(tmp_path, "c" + "s" * 51 + ".h.gch")
    os.utime(read, (time.time(), old))
    for path in (installed, stale):
        os.utime(path, (old, old))
    (tmp_path / ("c" + "t" * 51 + ".h")).write_text("#include <x.h>\n")  # torch's text header: never carried
    (tmp_path / "locks").mkdir()
    (tmp_path / ("c" + "e" * 51 + ".h.gch")).write_bytes(b"")  # a build in progress or failed
    os.symlink(built, tmp_path / ("c" + "l" * 51 + ".h.gch"))
    since = time.time() - 60
    assert headers.find_used(tmp_path, since, installed=[installed.name]) == [built, installed, read]


def test_find_used_skips_a_header_being_built(tmp_path: Path) -> None:
    path = make_header(tmp_path)
    (tmp_path / "locks").mkdir()
    with open(tmp_path / "locks" / (NAME.split(".")[0] + ".lock"), "w") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)  # torch's FileLock while gcc writes the file in place
        assert headers.find_used(tmp_path, 0.0) == []
    assert headers.find_used(tmp_path, 0.0) == [path]


def test_find_used_on_a_missing_dir(tmp_path: Path) -> None:
    assert headers.find_used(tmp_path / "absent", 0.0) == []


def test_describe_hashes_the_raw_file(tmp_path: Path) -> None:
    content = os.urandom(3 << 20)
    artifact = headers.describe(make_header(tmp_path, content=content))
    assert artifact == HeaderArtifact(name=NAME, sha256=hashlib.sha256(content).hexdigest(), size=len(content))
    assert artifact.to_json() == {
        "kind": "precompiled_header",
        "name": NAME,
        "sha256": artifact.sha256,
        "size": len(content),
    }
    assert HeaderArtifact.from_json(artifact.to_json()) == artifact


def test_describe_refuses_links_and_foreign_names(tmp_path: Path) -> None:
    target = make_header(tmp_path / "real")
    (tmp_path / "d").mkdir()
    os.symlink(target, tmp_path / "d" / NAME)
    with pytest.raises(HeaderError, match="cannot read"):
        headers.describe(tmp_path / "d" / NAME)
    with pytest.raises(HeaderError, match="not a precompiled-header name"):
        headers.describe(make_header(tmp_path, "notes.txt"))


@pytest.mark.parametrize(
    "change, match",
    [
        ({"kind": "cpp-so"}, "not a precompiled_header artifact"),
        ({"name": "../" + NAME}, "not a precompiled-header name"),
        ({"sha256": "ABC"}, "bad sha256"),
        ({"size": 0}, "bad size"),
        ({"size": True}, "bad size"),
        ({"size": "12"}, "bad size"),
    ],
)
def test_manifest_entries_are_validated(change: dict[str, object], match: str) -> None:
    entry = {"kind": "precompiled_header", "name": NAME, "sha256": "0" * 64, "size": 12, **change}
    with pytest.raises(HeaderError, match=match):
        HeaderArtifact.from_json(entry)


def test_compress_is_zstd_and_install_round_trips(tmp_path: Path) -> None:
    content = os.urandom(1 << 20) + b"\0" * (4 << 20)
    artifact, buf = packed(make_header(tmp_path / "a", content=content))
    assert zstandard.ZstdDecompressor().stream_reader(io.BytesIO(buf.getvalue())).read() == content
    assert len(buf.getvalue()) < len(content) // 2
    dest = headers.header_dir(tmp_path)  # the TMPDIR exists; torch's dirs under it do not yet
    assert headers.install(artifact, buf, dest) is True
    assert (dest / NAME).read_bytes() == content
    assert sorted(p.name for p in dest.iterdir()) == [NAME, "locks"]  # no temp file left behind
    assert headers.find_used(dest, time.time() - 60) == [dest / NAME]


def test_compress_notices_a_file_replaced_since_describe(tmp_path: Path) -> None:
    path = make_header(tmp_path)
    artifact = headers.describe(path)
    path.write_bytes(b"rebuilt by torch")
    with pytest.raises(HeaderError, match="changed while it was being packed"):
        headers.compress(path, io.BytesIO(), artifact)


def test_install_never_overwrites(tmp_path: Path) -> None:
    artifact, buf = packed(make_header(tmp_path / "a", content=b"carried"))
    dest = tmp_path / "hdr"
    existing = make_header(dest, content=b"torch built this one")
    assert headers.install(artifact, buf, dest) is False
    assert existing.read_bytes() == b"torch built this one"


def test_install_leaves_a_link_at_the_destination_alone(tmp_path: Path) -> None:
    artifact, buf = packed(make_header(tmp_path / "a"))
    dest = tmp_path / "hdr"
    dest.mkdir()
    os.symlink(tmp_path / "target", dest / NAME)
    assert headers.install(artifact, buf, dest) is False
    assert not (tmp_path / "target").exists()


@pytest.mark.parametrize(
    "damage, match",
    [
        (lambda a: HeaderArtifact(a.name, "0" * 64, a.size), "does not match"),
        (lambda a: HeaderArtifact(a.name, a.sha256, a.size - 1), "more bytes than"),
        (lambda a: HeaderArtifact(a.name, a.sha256, a.size + 1), "does not match"),
    ],
)
def test_install_refuses_content_that_is_not_the_manifests(tmp_path: Path, damage, match: str) -> None:  # type: ignore[no-untyped-def]
    artifact, buf = packed(make_header(tmp_path / "a"))
    dest = tmp_path / "hdr"
    with pytest.raises(HeaderError, match=match):
        headers.install(damage(artifact), buf, dest)
    assert sorted(p.name for p in dest.iterdir()) == ["locks"]


def test_install_refuses_a_stream_that_is_not_zstd(tmp_path: Path) -> None:
    artifact = headers.describe(make_header(tmp_path / "a"))
    dest = tmp_path / "hdr"
    with pytest.raises(HeaderError, match="not a zstd stream"):
        headers.install(artifact, io.BytesIO(b"raw bytes, not zstd" * 100), dest)
    assert not (dest / NAME).exists()


def test_install_refuses_a_symlinked_header_dir(tmp_path: Path) -> None:
    artifact, buf = packed(make_header(tmp_path / "a"))
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "torchinductor_u").mkdir()
    os.symlink(tmp_path / "elsewhere", tmp_path / "torchinductor_u" / "precompiled_headers")
    with pytest.raises(HeaderError, match="not a plain directory"):
        headers.install(artifact, buf, tmp_path / "torchinductor_u" / "precompiled_headers")
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_install_refuses_foreign_names(tmp_path: Path) -> None:
    artifact, buf = packed(make_header(tmp_path / "a"))
    with pytest.raises(HeaderError, match="not a precompiled-header artifact"):
        headers.install(HeaderArtifact("evil.so", artifact.sha256, artifact.size), buf, tmp_path / "hdr")
    assert not (tmp_path / "hdr").exists()


def test_install_skips_a_header_torch_is_building(tmp_path: Path) -> None:
    artifact, buf = packed(make_header(tmp_path / "a"))
    dest = tmp_path / "hdr"
    (dest / "locks").mkdir(parents=True)
    with open(dest / "locks" / (NAME.split(".")[0] + ".lock"), "w") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)  # what torch's FileLock does while it builds the header
        assert headers.install(artifact, buf, dest) is False
    assert not (dest / NAME).exists()
    assert headers.install(artifact, buf, dest) is True


def test_object_keys_are_content_addressed_and_store_safe() -> None:
    digest = hashlib.sha256(b"x").hexdigest()
    assert headers.object_key("compilecache-v1", digest) == f"compilecache-v1-artifact-{digest}"
    with pytest.raises(ValueError, match="sha256"):
        headers.object_key("p", "../" + digest)
    with pytest.raises(ValueError, match=r"\[A-Za-z0-9._-\]"):
        headers.object_key("a/b", digest)


def test_save_then_restore_through_a_store(tmp_path: Path) -> None:
    from pytest_compilecache.stores.local import LocalStore

    store = LocalStore(tmp_path / "store")
    machine = headers.header_dir(tmp_path / "a")
    content = os.urandom(1 << 16) * 8
    make_header(machine, content=content)
    (tmp_path / "scratch").mkdir()
    saved = headers.save_headers(store, "pfx", time.time() - 60, [], tmp_path / "scratch", machine)
    assert (saved.transferred, saved.errors) == ([NAME], [])
    key = headers.object_key("pfx", saved.artifacts[0].sha256)
    assert [entry.key for entry in store.list("pfx")] == [key]
    again = headers.save_headers(store, "pfx", time.time() - 60, [], tmp_path / "scratch", machine)
    assert (again.artifacts, again.transferred) == (saved.artifacts, [])  # once per store

    (tmp_path / "b").mkdir()  # the fresh machine's TMPDIR
    fresh = headers.header_dir(tmp_path / "b")
    entries = [a.to_json() for a in saved.artifacts] + [{"kind": "cpp-so", "name": "x.so"}]
    restored = headers.restore_headers(store, "pfx", entries, tmp_path / "scratch", fresh)
    assert (restored.transferred, restored.errors) == ([NAME], [])
    assert (fresh / NAME).read_bytes() == content
    present = headers.restore_headers(store, "pfx", entries, tmp_path / "scratch", fresh)
    assert (present.artifacts, present.transferred, present.errors) == (saved.artifacts, [], [])
    assert list((tmp_path / "scratch").iterdir()) == []


def test_restore_problems_are_warning_lines_and_change_nothing(tmp_path: Path) -> None:
    from pytest_compilecache.stores.local import LocalStore

    store = LocalStore(tmp_path / "store")
    (tmp_path / "scratch").mkdir()
    artifact, buf = packed(make_header(tmp_path / "a"))
    (tmp_path / "b").mkdir()
    fresh = headers.header_dir(tmp_path / "b")
    missing = headers.restore_headers(store, "pfx", [artifact.to_json()], tmp_path / "scratch", fresh)
    assert missing.transferred == [] and len(missing.errors) == 1 and "not in the store" in missing.errors[0]
    other = tmp_path / "other.zst"
    other.write_bytes(zstandard.ZstdCompressor().compress(b"tampered"))
    store.put(headers.object_key("pfx", artifact.sha256), other)
    tampered = headers.restore_headers(store, "pfx", [artifact.to_json()], tmp_path / "scratch", fresh)
    assert tampered.transferred == [] and "does not match" in tampered.errors[0]
    bad = headers.restore_headers(store, "pfx", [{**artifact.to_json(), "name": "../x.h.gch"}], tmp_path, fresh)
    assert "not a precompiled-header name" in bad.errors[0]
    assert not (fresh / NAME).exists()


def test_a_header_object_larger_than_its_header_can_pack_is_never_downloaded(tmp_path: Path) -> None:
    from pytest_compilecache.stores.local import LocalStore

    store = LocalStore(tmp_path / "store")
    (tmp_path / "scratch").mkdir()
    artifact, _ = packed(make_header(tmp_path / "a"))
    huge = tmp_path / "huge"
    huge.write_bytes(b"\0" * (headers.packed_bound(artifact.size) + 1))
    store.put(headers.object_key("pfx", artifact.sha256), huge)
    fetched: list[str] = []
    real_get = store.get

    def get(key: str, dest: Path, *, limit: int | None = None) -> bool:
        fetched.append(key)
        return real_get(key, dest, limit=limit)

    store.get = get  # type: ignore[method-assign]
    (tmp_path / "b").mkdir()
    fresh = headers.header_dir(tmp_path / "b")
    result = headers.restore_headers(store, "pfx", [artifact.to_json()], tmp_path / "scratch", fresh)
    assert result.transferred == [] and "more than a" in result.errors[0], result.errors
    assert fetched == []  # refused from its listed size, before a byte moved
    assert list((tmp_path / "scratch").iterdir()) == []


def test_verify_checks_a_stream_without_writing_it(tmp_path: Path) -> None:
    artifact, buf = packed(make_header(tmp_path / "a"))
    headers.verify(artifact, buf)  # the header's own bytes: no error
    other, other_buf = packed(make_header(tmp_path / "b", content=b"other" * 100))
    with pytest.raises(HeaderError, match="does not match"):
        headers.verify(artifact, other_buf)
    with pytest.raises(HeaderError, match="not a zstd stream"):
        headers.verify(artifact, io.BytesIO(b"plain bytes"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]


def test_save_headers_leaves_carried_keys_to_their_own_transport(tmp_path: Path) -> None:
    from pytest_compilecache.stores.local import LocalStore

    store = LocalStore(tmp_path / "store")
    machine = headers.header_dir(tmp_path / "a")
    key = headers.object_key("pfx", headers.describe(make_header(machine)).sha256)
    (tmp_path / "scratch").mkdir()
    saved = headers.save_headers(store, "pfx", time.time() - 60, [], tmp_path / "scratch", machine, carried=[key])
    assert ([a.name for a in saved.artifacts], saved.transferred, saved.errors) == ([NAME], [], [])
    assert store.list("pfx") == []
