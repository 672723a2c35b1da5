"""Fuzzing the bundle reader (issue 9.6): whatever the bytes, the only exception is BundleError.

Seeded and bounded: a few thousand cases of byte flips, truncations, insertions, manifests edited with a
recomputed checksum, tars mutated under a correct payload checksum, and structured hostile tars (links,
devices, GNU long names, global and sparse pax headers, odd names and sizes). Each case is read with
``read_manifest`` and ``verify`` into a cache dir, which must be exactly as before afterwards.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import tarfile
from pathlib import Path
from typing import Any
from typing import Callable

import pytest
import zstandard

from pytest_compilecache import BundleError
from pytest_compilecache import bundle
from pytest_compilecache import container
from pytest_compilecache.manifest import FORMAT_VERSION
from pytest_compilecache.manifest import Manifest
from pytest_compilecache.manifest import Member

# Override for a longer campaign: COMPILECACHE_FUZZ_SEED=7 COMPILECACHE_FUZZ_CASES=5000 pytest this file.
SEED = int(os.environ.get("COMPILECACHE_FUZZ_SEED", "20261122"))
CASES_PER_KIND = int(os.environ.get("COMPILECACHE_FUZZ_CASES", "400"))
KEY = b"fuzz key"


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() if p.is_file() else b"<dir>" for p in root.rglob("*")}


def _manifest(members: list[Member], payload: bytes) -> Manifest:
    return Manifest(
        format=FORMAT_VERSION,
        key="p-d-1",
        lineage="p-d-",
        fingerprint={"torch": "2.13.0"},
        digest="d",
        plugin_version="0",
        torch_version="2.13.0",
        created="2026-01-01T00:00:00+00:00",
        members=tuple(members),
        stats={},
        payload_size=len(payload),
        payload_sha256=hashlib.sha256(payload).hexdigest(),
    )


def _container(manifest_bytes: bytes, payload: bytes) -> bytes:
    return container.header_bytes(manifest_bytes, "") + payload


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, bytes]:
    """A real signed bundle and its raw (uncompressed) tar."""
    root = tmp_path_factory.mktemp("fuzz-base")
    cache = root / "cache"
    for rel, data in {
        "ab/k.main.so": b"\x7fELF" * 300,
        "fxgraph/x/y": b"graph",
        "isa.so": b"",
        "z": b"z" * 700,
    }.items():
        (cache / rel).parent.mkdir(parents=True, exist_ok=True)
        (cache / rel).write_bytes(data)
    dest = root / "b.bundle"
    bundle.pack(
        dest,
        key="p-d-1",
        lineage="p-d-",
        fingerprint={"torch": "2.13.0"},
        digest="d",
        torch_version="2.13.0",
        blobs={"controller": b"blob" * 100},
        cache_dir=cache,
        files=["ab/k.main.so", "fxgraph/x/y", "isa.so", "z"],
        stats={"hits": 1},
        signing_key=KEY,
    )
    data = dest.read_bytes()
    manifest = bundle.read_manifest(dest)
    reader = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data[len(data) - manifest.payload_size :]))
    raw = reader.read()
    return data, raw


def _flip(rng: random.Random, data: bytes, raw: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        index = rng.randrange(min(len(out), 600)) if rng.random() < 0.5 else rng.randrange(len(out))
        out[index] ^= 1 << rng.randrange(8)
    return bytes(out)


def _truncate(rng: random.Random, data: bytes, raw: bytes) -> bytes:
    return data[: rng.randrange(len(data))]


def _splice(rng: random.Random, data: bytes, raw: bytes) -> bytes:
    at = rng.randrange(len(data))
    if rng.random() < 0.5:
        return data[:at] + rng.randbytes(rng.randint(1, 64)) + data[at:]
    return data[:at] + data[at + rng.randint(1, 64) :]


def _hostile_value(rng: random.Random) -> Any:
    return rng.choice(
        [
            -1,
            2**70,
            True,
            None,
            1.5,
            "",
            "\ud800",
            "x" * 300,
            "../../etc",
            "files/a/../../b",
            [],
            {},
            [[[[]]]],
            {"path": "files/x", "size": 1, "sha256": "0" * 64},
            "files/a\x00b",
            "blobs/.bin",
            "\n::error::x",
        ]
    )


def _edit_manifest(rng: random.Random, data: bytes, raw: bytes) -> bytes:
    manifest_len = int.from_bytes(data[12:16], "big")
    document = json.loads(data[16 : 16 + manifest_len])
    payload = data[52 + manifest_len + int.from_bytes(data[48 + manifest_len : 52 + manifest_len], "big") :]
    for _ in range(rng.randint(1, 3)):
        target: Any = document
        if rng.random() < 0.4 and document.get("members"):
            target = rng.choice(document["members"]) if isinstance(document["members"], list) else document
        if not isinstance(target, dict) or not target:
            continue
        field = rng.choice(sorted(target))
        choice = rng.random()
        if choice < 0.15:
            del target[field]
        elif choice < 0.25:
            target[rng.choice(["extra", "\ud800", ""])] = 1
        elif choice < 0.35:
            depth = rng.choice([40, 5000])
            target[field] = json.loads("[" * depth + "]" * depth) if depth < 1000 else None
        else:
            target[field] = _hostile_value(rng)
    text = json.dumps(document)
    if rng.random() < 0.1:
        text = '{"a":' * 20000 + "1" + "}" * 20000
    return _container(text.encode("utf-8", "surrogatepass"), payload)


def _with_raw_tar(raw: bytes, members: list[Member] | None = None) -> bytes:
    payload = container.compressor().compress(raw)
    return _container(_manifest(members or [], payload).to_json_bytes(), payload)


def _members_of(raw: bytes) -> list[Member]:
    members = []
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as archive:
        for info in archive:
            extracted = archive.extractfile(info)
            content = extracted.read() if extracted is not None else b""
            members.append(Member(info.name, len(content), hashlib.sha256(content).hexdigest()))
    return members


def _mutate_tar(rng: random.Random, data: bytes, raw: bytes) -> bytes:
    # Mutations inside the tar under a correct payload checksum: only the tar reader can object.
    out = bytearray(raw)
    for _ in range(rng.randint(1, 6)):
        index = rng.randrange(min(len(out), 4096)) if rng.random() < 0.7 else rng.randrange(len(out))
        out[index] = rng.randrange(256)
    if rng.random() < 0.2:
        out = out[: rng.randrange(len(out))]
    return _with_raw_tar(bytes(out), _members_of(raw))


_NAMES = [
    "files/ok.so",
    "files/../x",
    "/abs",
    "files//x",
    "blobs/x.bin",
    "blobs/.bin",
    "files/" + "n" * 300,
    "files/\udcff",
    "files/a",
    "files/a/b",
    "files/ünï.so",
    "files/x\\y",
    "C:/x",
    "files/.",
    "files/ok.so",
]
_TYPES = [
    tarfile.REGTYPE,
    tarfile.AREGTYPE,
    tarfile.SYMTYPE,
    tarfile.LNKTYPE,
    tarfile.DIRTYPE,
    tarfile.CHRTYPE,
    tarfile.BLKTYPE,
    tarfile.FIFOTYPE,
    tarfile.CONTTYPE,
    tarfile.GNUTYPE_LONGNAME,
    tarfile.XGLTYPE,
    tarfile.GNUTYPE_SPARSE,
    b"Z",
]


def _hostile_tar(rng: random.Random, data: bytes, raw: bytes) -> bytes:
    buffer = io.BytesIO()
    fmt = rng.choice([tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT])
    members: list[Member] = []
    with tarfile.open(fileobj=buffer, mode="w:", format=fmt, encoding="utf-8", errors="surrogateescape") as archive:
        for _ in range(rng.randint(1, 5)):
            info = tarfile.TarInfo(rng.choice(_NAMES))
            info.type = rng.choice(_TYPES)
            info.linkname = rng.choice(["", "/etc/passwd", "../../x", "files/ok.so"])
            content = rng.randbytes(rng.randint(0, 50)) if info.type in (tarfile.REGTYPE, tarfile.AREGTYPE) else b""
            info.size = len(content)
            if rng.random() < 0.2:
                info.pax_headers = rng.choice(
                    [
                        {"size": "99999999999"},
                        {"GNU.sparse.map": "1,x"},
                        {"path": "files/\x00"},
                        {"hdrcharset": "BINARY"},
                    ]
                )
            try:
                archive.addfile(info, io.BytesIO(content) if content else None)
            except (ValueError, UnicodeError):
                continue  # tarfile itself refuses to write this one
            members.append(Member("files/ok.so", len(content), hashlib.sha256(content).hexdigest()))
    listed = members[:1] if rng.random() < 0.5 else []
    return _with_raw_tar(buffer.getvalue(), listed)


KINDS: dict[str, Callable[[random.Random, bytes, bytes], bytes]] = {
    "flip": _flip,
    "truncate": _truncate,
    "splice": _splice,
    "manifest": _edit_manifest,
    "tar-bytes": _mutate_tar,
    "hostile-tar": _hostile_tar,
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_only_bundle_errors(kind: str, base: tuple[bytes, bytes], tmp_path: Path) -> None:
    data, raw = base
    rng = random.Random(f"{SEED}-{kind}")
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "keep.so").write_bytes(b"keep")
    before = _tree(cache)
    path = tmp_path / "case.bundle"
    outcomes: dict[str, int] = {}
    for case in range(CASES_PER_KIND):
        path.write_bytes(KINDS[kind](rng, data, raw))
        for reader in ("read_manifest", "verify", "verify-signed"):
            try:
                if reader == "read_manifest":
                    bundle.read_manifest(path)
                else:
                    key = KEY if reader == "verify-signed" else None
                    bundle.verify(path, signing_key=key, cache_dir=cache, max_bytes=1 << 20).close()
                outcomes["accepted"] = outcomes.get("accepted", 0) + 1
            except BundleError:
                outcomes["refused"] = outcomes.get("refused", 0) + 1
            except Exception as exc:  # the point of the test: nothing else may escape
                pytest.fail(f"{kind} case {case} ({reader}): {type(exc).__name__}: {exc}")
            assert _tree(cache) == before, f"{kind} case {case} ({reader}) changed the cache dir"
    assert outcomes.get("refused", 0) > CASES_PER_KIND  # the mutations did reach the reader
