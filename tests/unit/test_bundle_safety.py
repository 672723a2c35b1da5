"""Hostile bundles, races and killed processes (issue 9, items 4, 5, 6, 8, 9): bundle, install and _fs."""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from pytest_compilecache import BundleError
from pytest_compilecache import _fs
from pytest_compilecache import bundle
from pytest_compilecache import container
from pytest_compilecache.manifest import FORMAT_VERSION
from pytest_compilecache.manifest import Manifest
from pytest_compilecache.manifest import Member
from tests.bundles import unpack

FINGERPRINT = {"torch": "2.13.0"}
KEY = b"a signing key for tests"


def _tree(root: Path) -> dict[str, bytes | str]:
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


def _pack(dest: Path, cache_dir: Path, files: list[str], **overrides: Any) -> Manifest:
    arguments: dict[str, Any] = {
        "key": "p-d-1",
        "lineage": "p-d-",
        "fingerprint": FINGERPRINT,
        "digest": "d",
        "torch_version": "2.13.0",
        "blobs": {},
        "cache_dir": cache_dir,
        "files": files,
        "stats": {},
    }
    arguments.update(overrides)
    return bundle.pack(dest, **arguments)


def _manifest(members: list[Member], payload: bytes, **fields: Any) -> Manifest:
    values: dict[str, Any] = {
        "format": FORMAT_VERSION,
        "key": "p-d-1",
        "lineage": "p-d-",
        "fingerprint": dict(FINGERPRINT),
        "digest": "d",
        "plugin_version": "0",
        "torch_version": "2.13.0",
        "created": "2026-01-01T00:00:00+00:00",
        "members": tuple(members),
        "stats": {},
        "payload_size": len(payload),
        "payload_sha256": hashlib.sha256(payload).hexdigest(),
    }
    values.update(fields)
    return Manifest(**values)


def _write(dest: Path, manifest_bytes: bytes, payload: bytes, signature: str = "") -> Path:
    dest.write_bytes(container.header_bytes(manifest_bytes, signature) + payload)
    return dest


def _raw_tar(entries: list[tuple[tarfile.TarInfo, bytes]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:", format=tarfile.PAX_FORMAT) as archive:
        for info, data in entries:
            archive.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return buffer.getvalue()


def _file(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def _crafted(dest: Path, files: dict[str, bytes]) -> Path:
    payload = container.compressor().compress(_raw_tar([_file(f"files/{n}", d) for n, d in files.items()]))
    members = [Member(f"files/{n}", len(d), hashlib.sha256(d).hexdigest()) for n, d in files.items()]
    return _write(dest, _manifest(members, payload).to_json_bytes(), payload)


# --- layers: the header alone, one pass ------------------------------------------------------------------


def test_read_manifest_reads_no_payload_and_checks_the_signature(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    (cache / "ab").mkdir(parents=True)
    (cache / "ab" / "k.so").write_bytes(b"kernel")
    packed = tmp_path / "b.bundle"
    manifest = _pack(packed, cache, ["ab/k.so"], signing_key=KEY)
    data = packed.read_bytes()
    offset = len(data) - manifest.payload_size
    packed.write_bytes(data[:offset] + b"garbage")  # the payload is not even there
    assert bundle.read_manifest(packed, signing_key=KEY, key="p-d-1", lineage="p-d-") == manifest
    with pytest.raises(BundleError, match="signature mismatch"):
        bundle.read_manifest(packed, signing_key=b"another key")
    with pytest.raises(BundleError, match="saved as 'p-d-1', not as 'p-d-2'"):
        bundle.read_manifest(packed, key="p-d-2")
    with pytest.raises(BundleError, match="lineage"):
        bundle.read_manifest(packed, lineage="q-d-")
    unsigned = tmp_path / "u.bundle"
    _pack(unsigned, cache, ["ab/k.so"])
    with pytest.raises(BundleError, match="signature missing"):
        bundle.read_manifest(unsigned, signing_key=KEY)


def test_unpack_reads_and_hashes_the_payload_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "big.so").write_bytes(os.urandom(3 * 1024 * 1024))
    packed = tmp_path / "b.bundle"
    manifest = _pack(packed, cache, ["big.so"], blobs={"controller": os.urandom(1024 * 1024)})
    read = [0]
    original = container.PayloadReader.read

    def counting(self: container.PayloadReader, size: int = -1) -> bytes:
        data = original(self, size)
        read[0] += len(data)
        return data

    monkeypatch.setattr(container.PayloadReader, "read", counting)
    result = unpack(packed, tmp_path / "target")
    assert read[0] == manifest.payload_size
    assert result.files == ("big.so",)


def test_verified_bundle_that_is_never_installed_leaves_nothing(tmp_path: Path) -> None:
    packed = _crafted(tmp_path / "b.bundle", {"a.so": b"a"})
    target = tmp_path / "target"
    with bundle.verify(packed, cache_dir=target) as verified:
        assert [p.name.startswith(".compilecache-staging-") for p in target.iterdir()] == [True]
        assert verified.manifest.file_paths == ("a.so",)
    assert not target.exists()  # created for the staging dir, removed again with it


# --- item 8: all or nothing ------------------------------------------------------------------------------


def test_file_and_dir_of_the_same_name_are_refused_by_verify(tmp_path: Path) -> None:
    packed = _crafted(tmp_path / "b.bundle", {"a": b"file", "a/b": b"inside"})
    with pytest.raises(BundleError, match="files/a and files/a/b cannot both be installed"):
        bundle.verify(packed)


def test_name_longer_than_the_file_system_allows_is_refused_by_verify(tmp_path: Path) -> None:
    long = "x" * 256
    packed = _crafted(tmp_path / "b.bundle", {"ok.so": b"ok", long: b"long"})
    target = tmp_path / "target"
    target.mkdir()
    with pytest.raises(BundleError, match="name too long"):
        unpack(packed, target)
    assert _tree(target) == {}


def test_a_path_too_deep_is_refused_by_verify(tmp_path: Path) -> None:
    packed = _crafted(tmp_path / "b.bundle", {"/".join(["a"] * 1500): b"deep"})
    with pytest.raises(BundleError, match="too many components"):
        unpack(packed, tmp_path / "target")
    assert not (tmp_path / "target").exists()


def test_a_failure_half_way_through_install_rolls_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    packed = _crafted(tmp_path / "b.bundle", {"a.so": b"new a", "b/c.so": b"new c", "d.so": b"new d"})
    target = tmp_path / "target"
    target.mkdir()
    (target / "a.so").write_bytes(b"old a")
    (target / "keep.so").write_bytes(b"keep")
    before = _tree(target)
    calls = [0]
    real_replace = os.replace

    def failing_replace(*args: Any, **kwargs: Any) -> None:
        calls[0] += 1
        if calls[0] == 3:  # after a.so (its old file kept by a link, the new one renamed in) and b/c.so: d.so fails
            raise OSError(errno.EIO, "Input/output error")
        real_replace(*args, **kwargs)

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(BundleError, match="Input/output error"):
        unpack(packed, target)
    assert _tree(target) == before


def test_unpack_into_a_missing_cache_dir_that_fails_leaves_no_dir(tmp_path: Path) -> None:
    packed = _crafted(tmp_path / "b.bundle", {"a.so": b"a"})
    data = bytearray(packed.read_bytes())
    data[-3] ^= 1
    packed.write_bytes(data)
    with pytest.raises(BundleError, match="payload checksum mismatch"):
        unpack(packed, tmp_path / "deep" / "er" / "cache")
    assert not (tmp_path / "deep").exists()


# --- item 6: only BundleError ----------------------------------------------------------------------------


def test_deeply_nested_manifest_is_a_bundle_error(tmp_path: Path) -> None:
    deep = b'{"a":' * 100_000 + b"1" + b"}" * 100_000
    with pytest.raises(BundleError, match="nested too deeply"):
        Manifest.from_json_bytes(deep)
    payload = container.compressor().compress(_raw_tar([]))
    document = json.loads(_manifest([], payload).to_json_bytes())
    document["stats"] = json.loads('{"a":' * 50 + "1" + "}" * 50)
    packed = _write(tmp_path / "b.bundle", json.dumps(document).encode(), payload)
    with pytest.raises(BundleError, match="nested deeper"):
        bundle.verify(packed)


def test_lone_surrogates_are_a_bundle_error(tmp_path: Path) -> None:
    payload = container.compressor().compress(_raw_tar([]))
    document = json.loads(_manifest([], payload).to_json_bytes())
    document["members"] = [{"path": "files/\ud800.so", "size": 0, "sha256": "0" * 64}]
    with pytest.raises(BundleError, match="surrogate"):
        bundle.verify(_write(tmp_path / "a.bundle", json.dumps(document).encode(), payload))
    # The same through the tar: a pax header carrying a name that is not UTF-8.
    info = tarfile.TarInfo("files/\udcff.so")
    raw = _raw_tar([(info, b"")])
    payload = container.compressor().compress(raw)
    members = [Member("files/x.so", 0, hashlib.sha256(b"").hexdigest())]
    packed = _write(tmp_path / "b.bundle", _manifest(members, payload).to_json_bytes(), payload)
    with pytest.raises(BundleError):
        unpack(packed, tmp_path / "target")


def test_bad_pax_sparse_header_is_a_bundle_error(tmp_path: Path) -> None:
    info = tarfile.TarInfo("files/x.so")
    info.size = 4
    info.pax_headers = {"GNU.sparse.map": "1,2,x", "GNU.sparse.major": "1"}
    payload = container.compressor().compress(_raw_tar([(info, b"data")]))
    members = [Member("files/x.so", 4, hashlib.sha256(b"data").hexdigest())]
    packed = _write(tmp_path / "b.bundle", _manifest(members, payload).to_json_bytes(), payload)
    with pytest.raises(BundleError, match="sparse"):
        bundle.verify(packed)


@pytest.mark.parametrize("size", ["\u00b2", "\u0664", "9" * 5000, "-1", " 4"])
def test_pax_size_that_is_not_plain_ascii_digits_is_a_bundle_error(tmp_path: Path, size: str) -> None:
    # str.isdigit() takes "²" and Arabic-Indic digits, which int() refuses or reads; 5000 digits pass
    # isdigit() but exceed int()'s limit: each is a BundleError, never a ValueError that ends the restore.
    info = tarfile.TarInfo("files/x.so")
    info.size = 4
    info.pax_headers = {"size": size}
    payload = container.compressor().compress(_raw_tar([(info, b"data")]))
    members = [Member("files/x.so", 4, hashlib.sha256(b"data").hexdigest())]
    packed = _write(tmp_path / "b.bundle", _manifest(members, payload).to_json_bytes(), payload)
    with pytest.raises(BundleError, match="bad pax size"):
        bundle.verify(packed)


def test_a_long_flat_manifest_list_is_checked_in_bounded_memory() -> None:
    # The depth check pushes containers only: a million scalars cost one pass, not a stack entry each.
    import tracemalloc

    payload = container.compressor().compress(_raw_tar([]))
    document = json.loads(_manifest([], payload).to_json_bytes())
    document["stats"] = {"values": [0] * 250_000}
    raw = json.dumps(document).encode()
    tracemalloc.start()
    try:
        assert Manifest.from_json_bytes(raw).stats["values"][-1] == 0
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # A stack entry per scalar took ~70 bytes each (17 MiB here); the list itself and its parse take ~6 MiB.
    assert peak < 10 * 1024 * 1024, peak


def test_symlink_loop_in_the_cache_dir_is_a_bundle_error_on_pack(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "loop").symlink_to(cache / "loop")
    with pytest.raises(BundleError, match="symlink"):
        _pack(tmp_path / "b.bundle", cache, ["loop/x.so"])
    with pytest.raises(BundleError, match="symlink"):
        _pack(tmp_path / "b.bundle", cache, ["loop"])
    assert not (tmp_path / "b.bundle").exists()


def test_pack_leaves_out_names_no_bundle_can_carry(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "ok.so").write_bytes(b"ok")
    os.close(os.open(os.path.join(os.fsencode(cache), b"\xff.so"), os.O_CREAT | os.O_WRONLY))
    (cache / "tab\there.so").write_bytes(b"odd")
    names = sorted(os.listdir(cache))  # as a caller gets them: "\udcff.so" (surrogate escape)
    notes: list[tuple[str, str]] = []
    packed = tmp_path / "b.bundle"
    manifest = _pack(packed, cache, names, on_skip=lambda name, reason: notes.append((name, reason)))
    assert manifest.file_paths == ("ok.so",)
    assert sorted(reason for _, reason in notes) == ["control character", "not valid UTF-8"]
    assert all(name.isascii() for name, _ in notes)
    assert unpack(packed, tmp_path / "target").files == ("ok.so",)  # its reader accepts it


# --- item 5: bounded memory and size -----------------------------------------------------------------------


def _bomb(dest: Path, size: int) -> Path:
    """A bundle of ``size`` zero bytes in one member: a few tens of KB on disk, with a correct manifest."""
    header = tarfile.TarInfo("files/zeros.so")
    header.size = size
    raw_header = header.tobuf(tarfile.PAX_FORMAT)
    out = io.BytesIO()
    digest = hashlib.sha256()
    zeros = bytes(container.CHUNK)
    with container.compressor().stream_writer(out, closefd=False) as writer:
        writer.write(raw_header)
        for start in range(0, size, len(zeros)):
            chunk = zeros[: min(len(zeros), size - start)]
            writer.write(chunk)
            digest.update(chunk)
        writer.write(bytes(-size % 512 + 2 * 512))
    payload = out.getvalue()
    members = [Member("files/zeros.so", size, digest.hexdigest())]
    return _write(dest, _manifest(members, payload).to_json_bytes(), payload)


@pytest.mark.slow
def test_a_tiny_bundle_declaring_a_gigabyte_is_verified_in_bounded_memory(tmp_path: Path) -> None:
    packed = _bomb(tmp_path / "bomb.bundle", 1024**3)
    assert packed.stat().st_size < 100_000
    script = textwrap.dedent(
        f"""
        import resource, sys
        from pathlib import Path
        from pytest_compilecache import bundle
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        with bundle.verify(Path({str(packed)!r})) as verified:
            assert verified.manifest.total_size == 1024**3
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print((after - before) // 1024)
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    grown_mib = int(result.stdout.strip())
    assert grown_mib < 100, f"verifying a 1 GiB bundle grew the peak RSS by {grown_mib} MiB"


def test_max_bytes_caps_the_unpacked_size_before_reading_the_payload(tmp_path: Path) -> None:
    packed = _bomb(tmp_path / "bomb.bundle", 64 * 1024 * 1024)
    with pytest.raises(BundleError, match="more than the limit of 1048576 bytes"):
        bundle.verify(packed, max_bytes=1024 * 1024, cache_dir=tmp_path / "target")
    assert not (tmp_path / "target").exists()
    with pytest.raises(BundleError, match=r"bundle is \d+ bytes, more than the limit of 100 bytes"):
        bundle.verify(packed, max_bytes=100)


def test_a_huge_pax_header_is_refused_without_reading_it(tmp_path: Path) -> None:
    block = bytearray(tarfile.TarInfo("files/x").tobuf(tarfile.USTAR_FORMAT))
    block[156:157] = b"x"
    block[124:136] = b"%011o\x00" % (1024**3)
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\x00 " % sum(block)
    payload = container.compressor().compress(bytes(block) + bytes(1024**2))
    packed = _write(tmp_path / "b.bundle", _manifest([], payload).to_json_bytes(), payload)
    with pytest.raises(BundleError, match="pax header of 1073741824 bytes"):
        bundle.verify(packed)


# --- item 4: races -------------------------------------------------------------------------------------------


_SWAPPER = """
import ctypes, os, sys
renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
a, b = os.fsencode(sys.argv[1]), os.fsencode(sys.argv[2])
if renameat2(-100, a, -100, b, 2) != 0:  # AT_FDCWD, RENAME_EXCHANGE
    sys.exit(f"renameat2: errno {ctypes.get_errno()}")
print("ready", flush=True)
while True:
    renameat2(-100, a, -100, b, 2)
"""


class _Swapper:
    """Exchanges ``a`` (a real dir) and ``b`` (a symlink out of the cache) as fast as it can, in another
    process (truly concurrent: a thread would mostly wait for the GIL and hide the race)."""

    def __init__(self, a: Path, b: Path) -> None:
        self.args = [sys.executable, "-c", _SWAPPER, str(a), str(b)]

    def __enter__(self) -> _Swapper:
        self.process = subprocess.Popen(self.args, stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        assert self.process.stdout.readline() == "ready\n", "renameat2 RENAME_EXCHANGE is not available"
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.process.kill()
        self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="renameat2 is Linux-only")
def test_a_symlink_swapped_in_during_unpack_never_writes_outside(tmp_path: Path) -> None:
    packed = _crafted(tmp_path / "b.bundle", {"ab/kernel.so": b"bundle bytes"})
    outside = tmp_path / "outside"
    outside.mkdir()
    target = tmp_path / "target"
    (target / "ab").mkdir(parents=True)
    (target / "evil").symlink_to(outside)
    outcomes: dict[str, int] = {}
    with _Swapper(target / "ab", target / "evil"):
        for _ in range(2000):
            try:
                unpack(packed, target)
                outcomes["ok"] = outcomes.get("ok", 0) + 1
            except BundleError:
                outcomes["refused"] = outcomes.get("refused", 0) + 1
            assert list(outside.iterdir()) == []
    assert sum(outcomes.values()) == 2000
    assert outcomes.get("refused", 0) > 0  # the swap did land between steps: the race was exercised
    assert list(outside.iterdir()) == []
    assert not [p for p in target.iterdir() if p.name.startswith(".compilecache-staging-")]


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="renameat2 is Linux-only")
def test_a_symlink_swapped_in_during_pack_never_packs_an_outside_file(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = b"outside secret"
    (outside / "kernel.so").write_bytes(secret)
    cache = tmp_path / "cache"
    (cache / "ab").mkdir(parents=True)
    (cache / "ab" / "kernel.so").write_bytes(b"cache bytes")
    (cache / "evil").symlink_to(outside)
    secret_sha = hashlib.sha256(secret).hexdigest()
    packed_count = refused = 0
    with _Swapper(cache / "ab", cache / "evil"):
        for index in range(2000):
            dest = tmp_path / "out" / "b.bundle"
            try:
                manifest = _pack(dest, cache, ["ab/kernel.so"])
            except BundleError:
                refused += 1
                continue
            packed_count += 1
            assert secret_sha not in {m.sha256 for m in manifest.members}, index
    assert packed_count > 0 and refused > 0  # (today's main packed the outside file after ~500 tries)


# --- item 9: temp names and the sweeper ---------------------------------------------------------------------


def test_temp_names_carry_the_owner_and_the_sweeper_spares_live_and_foreign_entries(tmp_path: Path) -> None:
    mine = tmp_path / _fs.temp_name("staging", lead=".")
    mine.mkdir()
    owner = _fs.parse_temp_name(mine.name)
    assert owner is not None and owner.pid == os.getpid() and owner.kind == "staging"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    stale = mine.name.replace(f"-{os.getpid()}-", f"-{dead_pid}-")
    (tmp_path / stale).mkdir()
    (tmp_path / stale / "inner").write_bytes(b"x")
    old = _fs.temp_name("save").split("-")
    old[2], old[-2] = "0badc0de", str(int(time.time()) - 7200)  # another host: only its age tells
    (tmp_path / "-".join(old)).mkdir()
    recent = _fs.temp_name("save").split("-")
    recent[2], recent[-2] = "0badc0de", str(int(time.time()) - 600)
    (tmp_path / "-".join(recent)).mkdir()
    alive = _fs.temp_name("restore").split("-")
    alive[-2] = str(int(time.time()) - 7200)  # ours, still running after two hours: kept
    (tmp_path / "-".join(alive)).mkdir()
    atomic = tmp_path / _fs.temp_name("tmp", lead=".k.so.").replace(f"-{os.getpid()}-", f"-{dead_pid}-")
    atomic.write_bytes(b"partial")
    link = tmp_path / _fs.temp_name("restore").replace(f"-{os.getpid()}-", f"-{dead_pid}-")
    link.symlink_to(tmp_path / "victim")
    (tmp_path / "victim").mkdir()
    (tmp_path / "victim" / "data").write_bytes(b"not ours")
    (tmp_path / "compilecache-save-notours").mkdir()
    (tmp_path / ".k.so.abc.tmp").write_bytes(b"torch's, not ours")
    removed = _fs.sweep_our_temps(tmp_path)
    assert sorted(removed) == sorted([stale, "-".join(old), atomic.name, link.name])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [mine.name, "victim", "compilecache-save-notours", ".k.so.abc.tmp", "-".join(recent), "-".join(alive)]
    )
    assert (tmp_path / "victim" / "data").read_bytes() == b"not ours"


_KILLED = """
import os, sys, time
from pathlib import Path
from pytest_compilecache import _fs, sync
from pytest_compilecache.fingerprint import Fingerprint
from pytest_compilecache.stores.base import StoreEntry

work = Path(sys.argv[2])
fp = Fingerprint({"torch": "2.13.0"})

class Store:
    location = "memory://killed"
    readonly = False
    def list(self, prefix=""):
        return [StoreEntry(k, p.stat().st_size, 1.0) for k, p in sorted(objects.items()) if k.startswith(prefix)]
    def get(self, key, dest, *, limit=None):
        Path(dest).write_bytes(objects[key].read_bytes())
        return True
    def put(self, key, src):
        with _fs.atomic_file(work / "store" / key) as fh:  # a partial object, as a store writes one
            fh.write(Path(src).read_bytes()[:100])
            fh.flush()
            (work / "ready").touch()
            time.sleep(600)
    def delete(self, key):
        pass
    def find_latest(self, prefix):
        return None

objects = {}
if sys.argv[1] == "save":
    sync.save(Store(), prefix="p", fingerprint=fp, suffix="1", cache_dir=str(work / "source"),
              blobs={"controller": os.urandom(4096)}, files=["k.so"], stats={})
else:
    objects["p-" + fp.digest() + "-1"] = work / "good.bundle"
    def load(blob):
        (work / "ready").touch()
        time.sleep(600)
    sync.restore(Store(), prefix="p", fingerprint=fp, cache_dir=str(work / "cache"), load=load)
"""


def test_killed_save_and_restore_leave_nothing_after_the_next_sweep(tmp_path: Path) -> None:
    from pytest_compilecache import sync
    from pytest_compilecache.fingerprint import Fingerprint

    work = tmp_path / "work"
    temp = tmp_path / "tmpdir"
    for path in (work / "store", work / "source", work / "cache", temp):
        path.mkdir(parents=True)
    (work / "source" / "k.so").write_bytes(os.urandom(2048))
    (work / "cache" / "kept.so").write_bytes(b"from before")
    fp = Fingerprint({"torch": "2.13.0"})

    class Holder:
        location = "memory://holder"
        readonly = False
        stored: dict[str, bytes] = {}

        def put(self, key: str, src: Path) -> None:
            self.stored[key] = Path(src).read_bytes()

        def get(self, key: str, dest: Path, *, limit: int | None = None) -> bool:
            return False

        def find_latest(self, prefix: str) -> str | None:
            return None

        def list(self, prefix: str = "") -> list[Any]:
            return []

        def delete(self, key: str) -> None:
            pass

    holder = Holder()
    assert (
        sync.save(
            holder,
            prefix="p",
            fingerprint=fp,
            suffix="1",
            cache_dir=str(work / "source"),
            blobs={"controller": b"blob"},
            files=["k.so"],
            stats={},
        ).outcome
        == "saved"
    )
    (work / "good.bundle").write_bytes(next(iter(holder.stored.values())))
    before = {name: _tree(path) for name, path in [("store", work / "store"), ("cache", work / "cache")]}

    for mode in ("save", "restore"):
        (work / "ready").unlink(missing_ok=True)
        env = {**os.environ, "TMPDIR": str(temp)}
        process = subprocess.Popen([sys.executable, "-c", _KILLED, mode, str(work)], env=env)
        deadline = time.monotonic() + 120
        while not (work / "ready").exists():
            assert process.poll() is None, f"{mode} ended before it was killed"
            assert time.monotonic() < deadline
            time.sleep(0.05)
        process.send_signal(signal.SIGKILL)
        process.wait()
        garbage = (
            list(temp.iterdir())
            + [p for p in (work / "store").iterdir()]
            + [p for p in (work / "cache").iterdir() if p.name != "kept.so"]
        )
        assert garbage, f"a killed {mode} left nothing to sweep: the test proves nothing"
        for directory in (temp, work / "store", work / "cache"):
            _fs.sweep_our_temps(directory)
        assert list(temp.iterdir()) == []
        # The restore wrote its files before torch loaded the blob: those stay (they are complete).
        assert _tree(work / "store") == before["store"]
        leftovers = {n for n in _tree(work / "cache") if n not in ("kept.so", "k.so", ".compilecache.lock")}
        assert leftovers == set(), leftovers
