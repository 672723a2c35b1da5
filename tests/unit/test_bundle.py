"""bundle.py: round trip, manifest, and every way a bundle can be damaged or malicious. No torch here."""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
from dataclasses import replace
from datetime import datetime
from datetime import timezone
from pathlib import Path
from typing import Any
from typing import BinaryIO
from typing import Callable

import pytest

from pytest_compilecache import BundleError
from pytest_compilecache import ConfigError
from pytest_compilecache import __version__
from pytest_compilecache import bundle
from pytest_compilecache import container
from pytest_compilecache import install
from pytest_compilecache.bundle import FORMAT_VERSION
from pytest_compilecache.bundle import MAGIC
from pytest_compilecache.bundle import Manifest
from pytest_compilecache.bundle import Member
from tests.bundles import Unpacked
from tests.bundles import member_sha256
from tests.bundles import unpack
from tests.unit.conftest import write_tree

FINGERPRINT = {"torch": "2.13.0", "python": "3.11.9", "cpu": "x86_64-avx2"}
KEY = b"a signing key for tests"
BLOBS = {"controller": b"mega-cache of the controller", "gw0": bytes(range(256)) * 50}
CACHE_FILES = {
    "ab/cabc123.main.so": b"\x7fELF kernel " * 100,
    "fxgraph/xy/fxyz": b"pickled graph",
    "cpu_isa.so": b"isa probe",
    "empty.txt": b"",
}


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    return write_tree(tmp_path / "cache", CACHE_FILES)


def _pack(dest: Path, cache_dir: Path, **overrides: Any) -> Manifest:
    arguments: dict[str, Any] = {
        "key": "compilecache-v1-abc-1-1",
        "lineage": "compilecache-v1-abc-",
        "fingerprint": FINGERPRINT,
        "digest": "abc",
        "torch_version": "2.13.0",
        "blobs": BLOBS,
        "cache_dir": cache_dir,
        "files": list(CACHE_FILES),
        "stats": {"hits": 3, "tests": ["a", "b"]},
    }
    arguments.update(overrides)
    return bundle.pack(dest, **arguments)


@pytest.fixture
def packed(tmp_path: Path, cache_dir: Path) -> Path:
    dest = tmp_path / "out" / "b.bundle"
    _pack(dest, cache_dir)
    return dest


@pytest.fixture
def signed(tmp_path: Path, cache_dir: Path) -> Path:
    dest = tmp_path / "out" / "signed.bundle"
    _pack(dest, cache_dir, signing_key=KEY)
    return dest


def _tree(root: Path) -> dict[str, bytes | str]:
    """Everything under root (files with content, links with target), to compare before/after."""
    if not root.exists():
        return {}
    listing: dict[str, bytes | str] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            listing[rel] = f"-> {os.readlink(path)}"
        elif path.is_file():
            listing[rel] = path.read_bytes()
        else:
            listing[rel] = "<dir>"
    return listing


def _payload_offset(path: Path) -> int:
    data = path.read_bytes()
    manifest_len = int.from_bytes(data[12:16], "big")
    signature_len = int.from_bytes(data[48 + manifest_len : 52 + manifest_len], "big")
    return 52 + manifest_len + signature_len


def _tar_entry(
    name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE, link: str = ""
) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    return info, data


def _craft(
    dest: Path,
    entries: list[tuple[tarfile.TarInfo, bytes]],
    members: list[Member] | None = None,
    *,
    signing_key: bytes | None = None,
) -> Path:
    """A bundle built by hand with the real writer: correct checksums around an arbitrary tar.

    ``members`` defaults to what the tar holds, so only the path-safety / member-type checks can object.
    """
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:", format=tarfile.PAX_FORMAT) as archive:
        for info, data in entries:
            archive.addfile(info, io.BytesIO(data) if info.isreg() else None)
    payload = _compress(buffer.getvalue())
    if members is None:
        members = [Member(info.name, len(data), hashlib.sha256(data).hexdigest()) for info, data in entries]
    manifest = Manifest(
        format=FORMAT_VERSION,
        key="crafted",
        lineage="craft",
        fingerprint=dict(FINGERPRINT),
        digest="abc",
        plugin_version=__version__,
        torch_version="2.13.0",
        created="2025-01-01T00:00:00+00:00",
        members=tuple(members),
        stats={},
        payload_size=len(payload),
        payload_sha256=hashlib.sha256(payload).hexdigest(),
    )
    manifest_bytes = manifest.to_json_bytes()
    signature = bundle.sign(manifest_bytes, signing_key) if signing_key else ""
    _write_bundle_file(dest, manifest_bytes, signature, payload)
    return dest


def _compress(data: bytes) -> bytes:
    return container.compressor().compress(data)


def _write_bundle_file(dest: Path, manifest_bytes: bytes, signature: str, payload: bytes) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(container.header_bytes(manifest_bytes, signature) + payload)


# --- round trip and manifest -----------------------------------------------------------------------------


def test_round_trip(tmp_path: Path, cache_dir: Path) -> None:
    dest = tmp_path / "b.bundle"
    manifest = _pack(dest, cache_dir)
    target = tmp_path / "restored"
    result = unpack(dest, target, fingerprint=FINGERPRINT)
    assert isinstance(result, Unpacked)
    assert result.manifest == manifest
    assert result.blobs == BLOBS
    assert result.files == tuple(sorted(CACHE_FILES)) and result.unchanged == ()
    assert _tree(target) == {**_tree(cache_dir)}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.bundle", "cache", "restored"]  # no temp files


def test_manifest_contents(packed: Path, cache_dir: Path) -> None:
    manifest = bundle.read_manifest(packed)
    assert manifest.format == FORMAT_VERSION
    assert manifest.key == "compilecache-v1-abc-1-1"
    assert manifest.fingerprint == FINGERPRINT and manifest.digest == "abc"
    assert manifest.plugin_version == __version__ and manifest.torch_version == "2.13.0"
    created = datetime.fromisoformat(manifest.created)
    offset = created.utcoffset()
    assert offset is not None and offset.total_seconds() == 0
    assert abs((datetime.now(timezone.utc) - created).total_seconds()) < 24 * 3600
    assert manifest.stats == {"hits": 3, "tests": ["a", "b"]}
    assert manifest.blob_names == ("controller", "gw0")
    assert manifest.file_paths == tuple(sorted(CACHE_FILES))
    expected = {f"blobs/{name}.bin": data for name, data in BLOBS.items()}
    expected.update({f"files/{rel}": data for rel, data in CACHE_FILES.items()})
    assert [m.path for m in manifest.members] == sorted(expected)
    for member in manifest.members:
        assert member.size == len(expected[member.path])
        assert member.sha256 == hashlib.sha256(expected[member.path]).hexdigest()
    for rel in CACHE_FILES:
        assert f"files/{rel}" in {m.path for m in manifest.members}
        assert member_sha256(cache_dir / rel) == hashlib.sha256(CACHE_FILES[rel]).hexdigest()
    assert manifest.total_size == sum(map(len, expected.values()))
    payload = packed.read_bytes()[_payload_offset(packed) :]
    assert manifest.payload_size == len(payload)
    assert manifest.payload_sha256 == hashlib.sha256(payload).hexdigest()
    assert bundle.verify(packed).manifest == manifest
    assert not bundle.is_signed(packed)


def test_format_2_and_3_fields_round_trip(tmp_path: Path, cache_dir: Path) -> None:
    artifact = bundle.Artifact(kind="precompiled_header", name="pch-abc", sha256="a" * 64, size=21)
    idle = bundle.Artifact(kind="precompiled_header", name="pch-def", sha256="b" * 64, size=22, idle=2)
    graphs = {"fxgraph": {"k1": {"ops": 3}}, "order": ["k1"]}
    dest = tmp_path / "b.bundle"
    manifest = _pack(dest, cache_dir, artifacts=[artifact, idle], graphs=graphs)
    read = bundle.read_manifest(dest)
    assert read == manifest
    assert (read.lineage, read.artifacts, read.graphs) == ("compilecache-v1-abc-", (artifact, idle), graphs)
    # format 3: an artifact's idle count, written only when not 0
    assert [entry.get("idle") for entry in json.loads(read.to_json_bytes())["artifacts"]] == [None, 2]
    with pytest.raises(BundleError, match="'key' does not start with its 'lineage'"):
        _pack(tmp_path / "c.bundle", cache_dir, lineage="elsewhere-")
    assert not (tmp_path / "c.bundle").exists()


def test_manifest_json_is_canonical_and_round_trips(packed: Path) -> None:
    manifest = bundle.read_manifest(packed)
    raw = manifest.to_json_bytes()
    document = json.loads(raw)
    assert raw == json.dumps(document, sort_keys=True, separators=(",", ":")).encode()
    assert Manifest.from_json_bytes(raw) == manifest
    assert Manifest.from_json_bytes(raw).to_json_bytes() == raw


def _manifest_document(packed: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(bundle.read_manifest(packed).to_json_bytes())
    return document


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d.pop("key"),
        lambda d: d.update(extra=1),
        lambda d: d.update(format=1),
        lambda d: d.update(format=2),
        lambda d: d.update(format=4),
        lambda d: d.update(format=True),
        lambda d: d.update(fingerprint={"torch": 2}),
        lambda d: d.update(created="yesterday"),
        lambda d: d.update(payload_size=-1),
        lambda d: d.update(payload_sha256="ABC"),
        lambda d: d.update(stats=[]),
        lambda d: d.update(members={}),
        lambda d: d["members"].append(d["members"][0]),
        lambda d: d["members"][0].update(sha256="0" * 63),
        lambda d: d["members"][0].update(size="3"),
        lambda d: d["members"][0].pop("size"),
        lambda d: d["members"][0].update(path="files/../../etc/passwd"),
        lambda d: d["members"][0].update(path="elsewhere/x"),
        lambda d: d["members"][0].update(path="blobs/gw0.pickle"),
        lambda d: d.pop("lineage"),
        lambda d: d.update(lineage="another-prefix-"),
        lambda d: d.update(lineage=""),
        lambda d: d.update(artifacts={}),
        lambda d: d.update(artifacts=[{"kind": "precompiled_header", "name": "x", "sha256": "0" * 64}]),
        lambda d: d.update(artifacts=[{"kind": "shell_script", "name": "x", "sha256": "0" * 64, "size": 1}]),
        lambda d: d.update(artifacts=[{"kind": "precompiled_header", "name": "../x", "sha256": "0" * 64, "size": 1}]),
        lambda d: d.update(artifacts=[{"kind": "precompiled_header", "name": "x", "sha256": "0" * 64, "size": 1}] * 2),
        *(
            lambda d, bad=bad: d.update(
                artifacts=[{"kind": "precompiled_header", "name": "x", "sha256": "0" * 64, "size": 1, **bad}]
            )
            for bad in ({"idle": -1}, {"idle": True}, {"idle": "1"}, {"idle": 1001}, {"used": 0})
        ),
        lambda d: d.update(graphs=[]),
        lambda d: d.update(graphs={"g": "x" * (5 * 1024 * 1024)}),
        lambda d: d.update(payload_size=2**64),
        lambda d: d["members"].append({"path": d["members"][-1]["path"] + "/below", "size": 0, "sha256": "0" * 64}),
    ],
)
def test_malformed_manifests_are_refused(packed: Path, mutate: Callable[[dict[str, Any]], Any]) -> None:
    document = _manifest_document(packed)
    mutate(document)
    with pytest.raises(BundleError, match="bundle manifest|unsafe member|cannot both be installed"):
        Manifest.from_json_bytes(json.dumps(document).encode())


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_numbers_no_json_can_write_back_are_refused(packed: Path, number: str) -> None:
    # json.loads takes them; canonical JSON (allow_nan=False) cannot write them: a BundleError, nothing else.
    document = _manifest_document(packed)
    document["graphs"] = {"g": 1.5}
    raw = json.dumps(document).encode().replace(b"1.5", number.encode())
    with pytest.raises(BundleError, match="not valid JSON"):
        Manifest.from_json_bytes(raw)


@pytest.mark.parametrize("raw", [b"", b"not json", b"[1, 2]", b"\xff\xfe", b'"text"'])
def test_manifest_that_is_not_an_object(raw: bytes) -> None:
    with pytest.raises(BundleError, match="bundle manifest"):
        Manifest.from_json_bytes(raw)


# --- pack --------------------------------------------------------------------------------------------------


def test_pack_skips_a_file_that_vanished(tmp_path: Path, cache_dir: Path) -> None:
    manifest = _pack(tmp_path / "b.bundle", cache_dir, files=[*CACHE_FILES, "deleted/by/torch.so"])
    assert manifest.file_paths == tuple(sorted(CACHE_FILES))


@pytest.mark.parametrize("rel", ["../outside.so", "/etc/passwd", "ab/../../outside.so", "ab\\..\\x", "C:x", "", "./x"])
def test_pack_refuses_paths_escaping_the_cache_dir(tmp_path: Path, cache_dir: Path, rel: str) -> None:
    with pytest.raises(BundleError, match="escapes the cache dir"):
        _pack(tmp_path / "b.bundle", cache_dir, files=[rel])
    assert not (tmp_path / "b.bundle").exists()


def test_pack_refuses_symlinks_and_directories(tmp_path: Path, cache_dir: Path) -> None:
    outside = tmp_path / "secret.txt"
    outside.write_bytes(b"secret")
    (cache_dir / "link.so").symlink_to(outside)
    (cache_dir / "linkdir").symlink_to(tmp_path)
    with pytest.raises(BundleError, match="not a regular file"):
        _pack(tmp_path / "b.bundle", cache_dir, files=["link.so"])
    with pytest.raises(BundleError, match="escapes the cache dir"):
        _pack(tmp_path / "b.bundle", cache_dir, files=["linkdir/secret.txt"])
    with pytest.raises(BundleError, match="not a regular file"):
        _pack(tmp_path / "b.bundle", cache_dir, files=["ab"])
    assert not (tmp_path / "b.bundle").exists()


@pytest.mark.parametrize("name", ["", ".hidden", "a/b", "../x", "a b", "x\n"])
def test_pack_refuses_bad_blob_names(tmp_path: Path, cache_dir: Path, name: str) -> None:
    with pytest.raises(BundleError, match="invalid blob name"):
        _pack(tmp_path / "b.bundle", cache_dir, blobs={name: b"x"})


def test_pack_refuses_stats_that_are_not_json(tmp_path: Path, cache_dir: Path) -> None:
    with pytest.raises(BundleError, match="JSON"):
        _pack(tmp_path / "b.bundle", cache_dir, stats={"when": datetime.now(timezone.utc)})


def test_pack_never_writes_a_bundle_it_could_not_read(tmp_path: Path, cache_dir: Path) -> None:
    with pytest.raises(BundleError, match="'key'"):
        _pack(tmp_path / "b.bundle", cache_dir, key="")
    assert not (tmp_path / "b.bundle").exists()


def test_pack_with_nothing_to_pack(tmp_path: Path, cache_dir: Path) -> None:
    dest = tmp_path / "empty.bundle"
    manifest = _pack(dest, cache_dir, blobs={}, files=[])
    assert manifest.members == ()
    result = unpack(dest, tmp_path / "target")
    assert result.blobs == {} and result.files == ()


def test_pack_is_atomic(tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dest = tmp_path / "out" / "b.bundle"
    _pack(dest, cache_dir, stats={"version": "old"})
    before = dest.read_bytes()

    def failing_write(fh: BinaryIO, data: bytes) -> None:
        if not data.startswith(MAGIC):  # header written, then the disk fills up half-way through the payload
            fh.write(data[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")
        fh.write(data)

    monkeypatch.setattr(bundle, "_write_all", failing_write)
    with pytest.raises(BundleError, match="No space left"):
        _pack(dest, cache_dir, stats={"version": "new"})
    assert dest.read_bytes() == before
    with pytest.raises(BundleError, match="No space left"):
        _pack(tmp_path / "out" / "fresh.bundle", cache_dir)
    assert sorted(p.name for p in dest.parent.iterdir()) == ["b.bundle"]


def test_pack_cleans_up_on_any_exception(tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(fh: BinaryIO, data: bytes) -> None:
        fh.write(data[:3])
        raise KeyboardInterrupt

    monkeypatch.setattr(bundle, "_write_all", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _pack(tmp_path / "out" / "b.bundle", cache_dir)
    assert list((tmp_path / "out").iterdir()) == []


# --- verify: damage --------------------------------------------------------------------------------------


def test_truncated_bundles_are_refused(packed: Path) -> None:
    data = packed.read_bytes()
    offset = _payload_offset(packed)
    manifest_len = int.from_bytes(data[12:16], "big")
    cuts = [
        0,
        3,
        8,
        10,
        14,
        16,
        16 + manifest_len // 2,
        16 + manifest_len + 5,
        48 + manifest_len + 2,
        offset,
        offset + 1,
        (offset + len(data)) // 2,
        len(data) - 1,
    ]
    for cut in cuts:
        packed.write_bytes(data[:cut])
        with pytest.raises(BundleError, match="truncated"):
            bundle.verify(packed)
        if cut < offset:  # read_manifest stops before the payload
            with pytest.raises(BundleError, match="truncated"):
                bundle.read_manifest(packed)


def test_trailing_data_is_refused(packed: Path) -> None:
    packed.write_bytes(packed.read_bytes() + b"\x00")
    with pytest.raises(BundleError, match="trailing data"):
        bundle.verify(packed)


def test_every_flipped_byte_is_detected(packed: Path) -> None:
    # Each byte of an unsigned bundle is covered: header fields, manifest (its own SHA-256), payload.
    data = packed.read_bytes()
    for index in range(len(data)):
        damaged = bytearray(data)
        damaged[index] ^= 0xFF
        packed.write_bytes(damaged)
        with pytest.raises(BundleError):
            bundle.verify(packed)


def test_flipped_payload_bytes_say_checksum(packed: Path) -> None:
    data = packed.read_bytes()
    for index in range(_payload_offset(packed), len(data), 7):
        damaged = bytearray(data)
        damaged[index] ^= 0x01
        packed.write_bytes(damaged)
        with pytest.raises(BundleError, match="payload checksum mismatch"):
            bundle.verify(packed)


def test_flipped_manifest_byte_with_recomputed_checksum_fails_the_signature(signed: Path) -> None:
    # An attacker can recompute the plain SHA-256 of the manifest; only the HMAC stops a tampered manifest.
    data = bytearray(signed.read_bytes())
    manifest_len = int.from_bytes(data[12:16], "big")
    manifest_bytes = bytes(data[16 : 16 + manifest_len]).replace(b'"hits":3', b'"hits":4')
    assert len(manifest_bytes) == manifest_len
    data[16 : 16 + manifest_len] = manifest_bytes
    data[16 + manifest_len : 48 + manifest_len] = hashlib.sha256(manifest_bytes).digest()
    signed.write_bytes(data)
    assert bundle.read_manifest(signed).stats["hits"] == 4
    bundle.verify(signed)  # no key configured: the checksums alone cannot tell
    with pytest.raises(BundleError, match="signature mismatch"):
        bundle.verify(signed, signing_key=KEY)


def test_bad_magic_and_unknown_format(packed: Path) -> None:
    data = packed.read_bytes()
    packed.write_bytes(b"PK\x03\x04" + data[4:])
    with pytest.raises(BundleError, match="bad magic"):
        bundle.verify(packed)
    packed.write_bytes(MAGIC + (FORMAT_VERSION + 1).to_bytes(4, "big") + data[12:])
    with pytest.raises(BundleError, match=f"format {FORMAT_VERSION + 1} is not supported"):
        bundle.read_manifest(packed)


def test_missing_bundle_is_a_bundle_error(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="cannot read bundle"):
        bundle.verify(tmp_path / "nope.bundle")


# --- verify: signature and fingerprint --------------------------------------------------------------------


def test_signed_bundle_verifies_with_its_key(signed: Path) -> None:
    assert bundle.is_signed(signed)
    assert bundle.verify(signed, signing_key=KEY).manifest.key == "compilecache-v1-abc-1-1"


def test_wrong_key_is_refused(signed: Path) -> None:
    with pytest.raises(BundleError, match="signature mismatch"):
        bundle.verify(signed, signing_key=b"another key")


def test_unsigned_bundle_is_refused_when_a_key_is_set(packed: Path) -> None:
    with pytest.raises(BundleError, match=r"signature missing \(PYTEST_COMPILECACHE_SIGNING_KEY is set\)"):
        bundle.verify(packed, signing_key=KEY)


def test_signed_bundle_is_accepted_without_a_key(signed: Path) -> None:
    assert bundle.verify(signed).manifest == bundle.verify(signed, signing_key=KEY).manifest


def test_empty_signing_key_is_a_config_error(tmp_path: Path, cache_dir: Path, packed: Path) -> None:
    with pytest.raises(ConfigError, match="must not be empty"):
        bundle.verify(packed, signing_key=b"")
    with pytest.raises(ConfigError, match="must not be empty"):
        _pack(tmp_path / "x.bundle", cache_dir, signing_key=b"")


def test_another_fingerprint_is_refused_with_the_differences(packed: Path) -> None:
    current = {**FINGERPRINT, "torch": "2.14.1", "cuda": "12.4"}
    del current["cpu"]
    with pytest.raises(BundleError) as info:
        bundle.verify(packed, fingerprint=current)
    message = str(info.value)
    assert "torch: 2.13.0 != 2.14.1" in message
    assert "cpu: x86_64-avx2 != <absent>" in message
    assert "cuda: <absent> != 12.4" in message
    assert "python" not in message
    assert "\n" not in message
    assert bundle.verify(packed, fingerprint=dict(FINGERPRINT)).manifest.fingerprint == FINGERPRINT


# --- verify: malicious archives ---------------------------------------------------------------------------

_GOOD = "files/ok.so"


@pytest.mark.parametrize(
    ("entry", "match"),
    [
        (_tar_entry("files/../../evil.so", b"x"), "unsafe member path"),
        (_tar_entry("../evil.so", b"x"), "unsafe member path"),
        (_tar_entry("/etc/evil.so", b"x"), "unsafe member path"),
        (_tar_entry("files/ab\\..\\..\\evil.so", b"x"), "unsafe member path"),
        (_tar_entry("files//abs.so", b"x"), "unsafe member path"),
        (_tar_entry("outside.so", b"x"), "unsafe member path"),
        (_tar_entry("files/link.so", kind=tarfile.SYMTYPE, link="/etc/passwd"), "not a regular file \\(symlink\\)"),
        (_tar_entry("files/link.so", kind=tarfile.SYMTYPE, link="../../x"), "not a regular file \\(symlink\\)"),
        (_tar_entry("files/hard.so", kind=tarfile.LNKTYPE, link=_GOOD), "not a regular file \\(hardlink\\)"),
        (_tar_entry("files/dev", kind=tarfile.CHRTYPE), "not a regular file \\(device\\)"),
        (_tar_entry("files/fifo", kind=tarfile.FIFOTYPE), "not a regular file"),
        (_tar_entry("files/subdir", kind=tarfile.DIRTYPE), "not a regular file \\(directory\\)"),
    ],
    ids=[
        "dotdot-inside",
        "dotdot",
        "absolute",
        "backslash",
        "empty-part",
        "outside-files",
        "symlink-abs",
        "symlink-rel",
        "hardlink",
        "device",
        "fifo",
        "directory",
    ],
)
def test_malicious_members_are_refused(tmp_path: Path, entry: tuple[tarfile.TarInfo, bytes], match: str) -> None:
    good = _tar_entry(_GOOD, b"fine")
    dest = _craft(tmp_path / "evil.bundle", [good, entry], signing_key=KEY)
    target = tmp_path / "cache"
    with pytest.raises(BundleError, match=match):
        bundle.verify(dest, signing_key=KEY)
    with pytest.raises(BundleError, match=match):
        unpack(dest, target, signing_key=KEY)
    assert not target.exists()  # not even the cache dir is created before verification passes


@pytest.mark.parametrize(
    ("names", "match"),
    [
        (["files/ab/kernel.so", "files/ab/KERNEL.so"], "name one file"),
        (["files/caf\u00e9.so", "files/cafe\u0301.so"], "name one file"),  # NFC and NFD spellings
        (["files/ab", "files/AB/kernel.so"], "file and dir"),
    ],
    ids=["case", "normalisation", "file-and-dir"],
)
def test_members_one_file_apart_only_on_linux_are_refused(tmp_path: Path, names: list[str], match: str) -> None:
    # On a file system that ignores case or normalisation (macOS, Windows) the second would overwrite the
    # first after both were verified: a verified file would then hold another member's bytes. Signed, so only
    # the names can object.
    entries = [_tar_entry(name, name.encode()) for name in names]
    dest = _craft(tmp_path / "collide.bundle", entries, signing_key=KEY)
    target = tmp_path / "cache"
    with pytest.raises(BundleError, match=match):
        bundle.verify(dest, signing_key=KEY)
    with pytest.raises(BundleError, match=match):
        unpack(dest, target, signing_key=KEY)
    assert not target.exists()


def test_unsafe_tar_name_behind_a_safe_manifest(tmp_path: Path) -> None:
    # The manifest looks harmless; the archive's own name must still be checked.
    info, data = _tar_entry("files/../../evil.so", b"x")
    members = [Member("files/evil.so", 1, hashlib.sha256(b"x").hexdigest())]
    dest = _craft(tmp_path / "evil.bundle", [(info, data)], members)
    with pytest.raises(BundleError, match="unsafe member path"):
        bundle.verify(dest)


def test_archive_and_manifest_must_agree(tmp_path: Path) -> None:
    entry = _tar_entry(_GOOD, b"fine")
    listed = Member(_GOOD, 4, hashlib.sha256(b"fine").hexdigest())
    extra = Member("files/extra.so", 1, hashlib.sha256(b"x").hexdigest())
    cases = [
        ([entry], [listed, extra], "missing member files/extra.so"),
        ([entry, _tar_entry("files/extra.so", b"x")], [listed], "not in the manifest"),
        ([entry, entry], [listed], "appears twice"),
        ([entry], [replace(listed, size=5)], "size mismatch for files/ok.so"),
        ([entry], [replace(listed, sha256="0" * 64)], "checksum mismatch for files/ok.so"),
    ]
    for index, (entries, members, match) in enumerate(cases):
        dest = _craft(tmp_path / f"case{index}.bundle", entries, members)
        with pytest.raises(BundleError, match=match):
            bundle.verify(dest)


def test_payload_that_is_not_zstd_or_tar(tmp_path: Path) -> None:
    for payload, match in [(b"plain bytes", "not valid zstd"), (_compress(b"x" * 1024), "not a valid tar")]:
        manifest = replace(
            bundle.read_manifest(_craft(tmp_path / "base.bundle", [])),
            payload_size=len(payload),
            payload_sha256=hashlib.sha256(payload).hexdigest(),
        )
        dest = tmp_path / "bad.bundle"
        _write_bundle_file(dest, manifest.to_json_bytes(), "", payload)
        with pytest.raises(BundleError, match=match):
            bundle.verify(dest)


def test_decompression_bomb_is_refused(tmp_path: Path) -> None:
    # A tiny payload that inflates far beyond what the manifest declares.
    payload = _compress(b"\x00" * (64 * 1024 * 1024))
    manifest = replace(
        bundle.read_manifest(_craft(tmp_path / "base.bundle", [])),
        payload_size=len(payload),
        payload_sha256=hashlib.sha256(payload).hexdigest(),
    )
    dest = tmp_path / "bomb.bundle"
    _write_bundle_file(dest, manifest.to_json_bytes(), "", payload)
    with pytest.raises(BundleError, match="larger than its manifest declares"):
        bundle.verify(dest)


# --- unpack -------------------------------------------------------------------------------------------------


def _existing_cache(tmp_path: Path) -> Path:
    target = tmp_path / "target"
    (target / "ab").mkdir(parents=True)
    (target / "ab" / "cabc123.main.so").write_bytes(b"older kernel")
    (target / "unrelated.so").write_bytes(b"keep me")
    return target


@pytest.mark.parametrize("damage", ["flip-payload", "truncate", "fingerprint", "wrong-key", "unsigned"])
def test_unpack_writes_nothing_when_verification_fails(tmp_path: Path, cache_dir: Path, damage: str) -> None:
    dest = tmp_path / "b.bundle"
    _pack(dest, cache_dir, signing_key=None if damage == "unsigned" else KEY)
    data = bytearray(dest.read_bytes())
    fingerprint = dict(FINGERPRINT)
    key = KEY
    if damage == "flip-payload":
        data[-10] ^= 0xFF
    elif damage == "truncate":
        del data[-100:]
    elif damage == "fingerprint":
        fingerprint["torch"] = "2.14.1"
    elif damage == "wrong-key":
        key = b"wrong"
    dest.write_bytes(data)
    target = _existing_cache(tmp_path)
    before = _tree(target)
    with pytest.raises(BundleError):
        unpack(dest, target, signing_key=key, fingerprint=fingerprint)
    assert _tree(target) == before
    fresh = tmp_path / "fresh"
    with pytest.raises(BundleError):
        unpack(dest, fresh, signing_key=key, fingerprint=fingerprint)
    assert not fresh.exists()


def test_unpack_leaves_identical_files_alone_and_replaces_others(packed: Path, tmp_path: Path) -> None:
    target = _existing_cache(tmp_path)
    same = target / "cpu_isa.so"
    same.write_bytes(CACHE_FILES["cpu_isa.so"])
    os.utime(same, (1_000_000, 1_000_000))
    result = unpack(packed, target)
    assert result.unchanged == ("cpu_isa.so",)
    assert set(result.files) == set(CACHE_FILES) - {"cpu_isa.so"}
    assert same.stat().st_mtime == 1_000_000
    assert (target / "ab" / "cabc123.main.so").read_bytes() == CACHE_FILES["ab/cabc123.main.so"]
    assert (target / "unrelated.so").read_bytes() == b"keep me"
    assert not [p for p in target.rglob("*") if p.name.endswith(".tmp")]
    again = unpack(packed, target)
    assert again.files == () and set(again.unchanged) == set(CACHE_FILES)


def test_unpack_refuses_a_symlinked_dir_leading_out_of_the_cache(packed: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    target = tmp_path / "target"
    target.mkdir()
    (target / "ab").symlink_to(outside)  # bundle has files/ab/cabc123.main.so
    before = _tree(target)
    with pytest.raises(BundleError, match="ab is a symlink"):
        unpack(packed, target)
    assert list(outside.iterdir()) == []
    assert _tree(target) == before  # all or nothing: no other file of the bundle was written either


def test_unpack_refuses_even_a_symlinked_dir_that_stays_inside(packed: Path, tmp_path: Path) -> None:
    # No link inside the cache dir is ever followed (issue 9.4): checking where one leads is a race.
    target = tmp_path / "target"
    (target / "real").mkdir(parents=True)
    (target / "ab").symlink_to(target / "real")
    before = _tree(target)
    with pytest.raises(BundleError, match="ab is a symlink"):
        unpack(packed, target)
    assert _tree(target) == before


def test_unpack_replaces_a_file_symlink_instead_of_writing_through_it(packed: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"do not touch")
    target = tmp_path / "target"
    target.mkdir()
    (target / "cpu_isa.so").symlink_to(victim)
    unpack(packed, target)
    assert victim.read_bytes() == b"do not touch"
    assert not (target / "cpu_isa.so").is_symlink()
    assert (target / "cpu_isa.so").read_bytes() == CACHE_FILES["cpu_isa.so"]


def test_unpack_into_a_cache_dir_reached_through_a_symlink(packed: Path, tmp_path: Path) -> None:
    # e.g. /tmp -> /private/tmp on macOS: the cache dir itself may be a link.
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "alias").symlink_to(real)
    unpack(packed, tmp_path / "alias")
    assert (real / "ab" / "cabc123.main.so").exists()


def test_unpack_reports_a_directory_in_the_way(packed: Path, tmp_path: Path) -> None:
    target = tmp_path / "target"
    (target / "cpu_isa.so").mkdir(parents=True)
    (target / "fxgraph").write_bytes(b"a file where a directory should be")
    before = _tree(target)
    with pytest.raises(BundleError, match="cannot unpack"):
        unpack(packed, target)
    assert _tree(target) == before


def test_a_bundle_of_more_dirs_than_open_files_allowed_installs(tmp_path: Path) -> None:
    """torch's cache puts every entry in a dir of its own: installing holds a bounded number of dirs open, so
    a bundle of thousands of them installs under the usual limit of open files (1024 on Linux, 256 on macOS)."""
    resource = pytest.importorskip("resource")  # POSIX only, and always there on it
    files = {f"fxgraph/{n % 97:02x}/f{n:04d}/entry": bytes([n % 256]) for n in range(400)}
    source = write_tree(tmp_path / "source", files)
    dest = tmp_path / "many.bundle"
    _pack(dest, source, files=list(files))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    open_now = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else 64
    resource.setrlimit(resource.RLIMIT_NOFILE, (open_now + 200, hard))  # fewer than the bundle has dirs
    try:
        result = unpack(dest, tmp_path / "restored", fingerprint=FINGERPRINT)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert isinstance(result, Unpacked) and len(result.files) == len(files)
    assert {rel: data for rel, data in _tree(tmp_path / "restored").items() if data != "<dir>"} == files


@pytest.mark.parametrize("links", [True, False], ids=["linked backups", "no hard links"])
def test_uninstall_takes_back_exactly_what_install_did(
    tmp_path: Path, packed: Path, monkeypatch: pytest.MonkeyPatch, links: bool
) -> None:
    """A bundle whose blobs torch rejects after its files were installed: its files and dirs go, and each
    file it replaced comes back, even when its dir fds were closed meanwhile (more dirs than stay open); also
    on a file system that takes no second link to a file (the replaced file is moved aside instead)."""
    monkeypatch.setattr(install, "_OPEN_DIRS", 1)
    if not links:

        def refuse(*args: object, **kwargs: object) -> None:
            raise PermissionError(errno.EPERM, "Operation not permitted")

        monkeypatch.setattr(os, "link", refuse)
    target = write_tree(tmp_path / "target", {"ab/cabc123.main.so": b"an older kernel", "mine.txt": b"kept"})
    before = _tree(target)
    with bundle.verify(packed, fingerprint=FINGERPRINT, cache_dir=target) as verified:
        bundle.install(verified)
        assert _tree(target) != before
        bundle.uninstall(verified)
    assert {rel: data for rel, data in _tree(target).items() if not rel.startswith(".")} == before
    assert not (target / "fxgraph").exists()


def test_uninstall_leaves_what_another_session_wrote_since(tmp_path: Path, packed: Path) -> None:
    """The roll back runs after torch loaded (or rejected) the blobs, outside the cache dir's lock: a file
    another session's torch published at one of the bundle's names meanwhile is not ours, and stays."""
    target = write_tree(tmp_path / "target", {"ab/cabc123.main.so": b"an older kernel"})
    theirs = {rel: b"another session's " + rel.encode() for rel in ("ab/cabc123.main.so", "fxgraph/xy/fxyz")}
    with bundle.verify(packed, fingerprint=FINGERPRINT, cache_dir=target) as verified:
        bundle.install(verified)
        for rel, data in theirs.items():  # torch's own atomic write: a temp file renamed over the name
            (target / f"{rel}.tmp").write_bytes(data)
            os.replace(target / f"{rel}.tmp", target / rel)
        bundle.uninstall(verified)
    assert {rel: (target / rel).read_bytes() for rel in theirs} == theirs
    assert not (target / "cpu_isa.so").exists()  # the bundle's own file is taken back


def test_uninstall_leaves_a_file_written_twice_since_whose_inode_number_came_back(tmp_path: Path) -> None:
    """ext4 hands a freed inode number to the next new file: torch writing a name twice (temp file, rename)
    after the install gives the second file the number the install placed. Its times tell it apart. Twenty
    tries (on this machine's ext4 the number came back in most), and the identity check itself."""
    for attempt in range(20):
        target = write_tree(tmp_path / f"t{attempt}", {"a": b"old"})
        with install.Staging.create(target) as staging:
            with staging.writer("s1") as fh:
                fh.write(b"new!")
            staging.install([("a", "s1", 4, hashlib.sha256(b"new!").hexdigest())])
            for write in range(2):  # another session's torch, twice
                (target / f"tmp{write}").write_bytes(b"theirs %d" % write)
                os.replace(target / f"tmp{write}", target / "a")
            staging.undo()
        assert (target / "a").read_bytes() == b"theirs 1", attempt
    info = (tmp_path / "t0" / "a").stat()
    same = (info.st_dev, info.st_ino, info.st_mtime_ns, info.st_ctime_ns)
    assert install._is_placed(info, same) and install._is_placed(info, (*same[:3], None))
    assert not install._is_placed(info, (info.st_dev, info.st_ino, info.st_mtime_ns - 1, None))
    assert not install._is_placed(info, (*same[:3], info.st_ctime_ns - 1))


def test_a_killed_install_leaves_every_file_whole(tmp_path: Path, packed: Path) -> None:
    """A restore killed mid-install (SIGKILL, OOM: no roll back runs) leaves every name holding a whole
    file, the one it held or the bundle's, never nothing: the file it replaces is kept by a second link first,
    and the new one takes its name in one rename."""
    old = {rel: b"older " + rel.encode() for rel in CACHE_FILES}
    target = write_tree(tmp_path / "target", old)
    child = f"""
import os, signal
from pathlib import Path
from pytest_compilecache import bundle
verified = bundle.verify(Path({str(packed)!r}), fingerprint={FINGERPRINT!r}, cache_dir=Path({str(target)!r}))
real, calls = os.replace, []
def replace(*args, **kwargs):
    calls.append(args)
    if len(calls) == 2:  # killed before its second rename into the cache dir
        os.kill(os.getpid(), signal.SIGKILL)
    return real(*args, **kwargs)
os.replace = replace
bundle.install(verified)
"""
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr
    now = {rel: (target / rel).read_bytes() if (target / rel).is_file() else None for rel in CACHE_FILES}
    assert all(now[rel] in (old[rel], CACHE_FILES[rel]) for rel in CACHE_FILES), now
    assert set(now.values()) & set(old.values()) and set(now.values()) & set(CACHE_FILES.values()), now


def test_a_triton_group_file_is_installed_with_this_cache_dirs_paths(tmp_path: Path) -> None:
    """triton takes an entry only where the absolute paths its group file names exist: those of the runner that
    saved it. Installed, they name this cache dir's files (one the bundle lacks too: triton skips it where it is
    missing); a group file triton would not read is installed as it was, and a second restore leaves the first
    one's."""
    saved = tmp_path / "runner-a" / "cache"
    entry = "triton/KEY1"
    old = f"{saved}/{entry}"
    group = {"child_paths": {n: f"{old}/{n}" for n in ("k.json", "k.cubin", "k.ptx")}}
    files = {
        f"{entry}/k.json": b"{}",
        f"{entry}/k.cubin": b"\0cubin",
        f"{entry}/__grp__k.json": json.dumps(group).encode(),
        "triton/KEY2/__grp__x.json": b"not json",
        "triton/KEY2/x.json": b"{}",
    }
    write_tree(saved, files)
    dest = tmp_path / "k.bundle"
    _pack(dest, saved, files=list(files))

    here = tmp_path / "runner-b" / "cache"
    first = unpack(dest, here)
    written = json.loads((here / entry / "__grp__k.json").read_text())
    assert written == {"child_paths": {n: f"{here}/{entry}/{n}" for n in ("k.json", "k.cubin", "k.ptx")}}
    assert all(Path(written["child_paths"][n]).read_bytes() == files[f"{entry}/{n}"] for n in ("k.json", "k.cubin"))
    assert (here / "triton/KEY2/__grp__x.json").read_bytes() == b"not json"
    assert f"{entry}/__grp__k.json" in first.files
    assert f"{entry}/__grp__k.json" in unpack(dest, here).unchanged


def test_relocated_group_keeps_what_triton_wrote_beside_the_paths_and_no_path_leaves_the_entry() -> None:
    children = {"a.json": "/x/a.json", "../b": "/etc/passwd", "..": "/", "c/d": "/c/d", "": "/", "e\\f": "/e"}
    data = json.dumps({"child_paths": children, "other": 1}).encode()
    assert json.loads(bundle.relocated_group(data, "/here/triton/K") or b"") == {
        "child_paths": {"a.json": "/here/triton/K/a.json"},
        "other": 1,
    }
    assert bundle.relocated_group(b"[1]", "/here") is None
    assert bundle.relocated_group(b'{"child_paths": 3}', "/here") is None
    assert bundle.relocated_group(b" " * (2 << 20), "/here") is None
    assert bundle.relocated_group(b"\xff\xfe", "/here") is None  # not UTF-8
    assert bundle.relocated_group(b"[" * 200_000 + b"]" * 200_000, "/here") is None  # deeper than json goes


_TRITON_ENTRY = """
import json, sys
from triton.runtime.cache import get_cache_manager
manager = get_cache_manager("ab" * 32)
if sys.argv[1] == "write":  # as triton.compile writes a kernel: its files, then the group naming them
    paths = {name: manager.put(data, name, binary=True) for name, data in (("k.cubin", b"\\0"), ("k.json", b"{}"))}
    manager.put_group("k.json", paths)
print(json.dumps([manager.cache_dir, manager.get_group("k.json")]))
"""


@pytest.mark.slow
def test_real_triton_takes_a_restored_entry_on_another_path(tmp_path: Path) -> None:
    """triton (as installed beside torch, 3.3 to 3.9) finds a kernel restored into another cache dir than the
    one it was compiled in, after that one is gone: a fresh runner compiles no kernel the bundle carries."""
    from tests.servers import python_with_module_or_fail

    python = python_with_module_or_fail("triton")

    def triton(cache: Path, verb: str) -> Any:
        env = {**os.environ, "TRITON_CACHE_DIR": str(cache / "triton")}
        done = subprocess.run([python, "-c", _TRITON_ENTRY, verb], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    saved = tmp_path / "runner-a" / "cache"
    entry, _ = triton(saved, "write")
    files = [Path(entry, name).relative_to(saved).as_posix() for name in os.listdir(entry)]
    dest = tmp_path / "k.bundle"
    _pack(dest, saved, files=files)
    shutil.rmtree(tmp_path / "runner-a")  # the saving runner's dir is gone (an isolated one)

    here = tmp_path / "runner-b" / "cache"
    unpack(dest, here)
    entry_here, group = triton(here, "read")
    assert group == {"k.cubin": f"{entry_here}/k.cubin", "k.json": f"{entry_here}/k.json"}
