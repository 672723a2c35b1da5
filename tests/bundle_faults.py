"""Bad bundles for the fault tests: crafted with the real packer for a given fingerprint, then damaged.

Shared by the unit-level fault tests (tests/unit/test_session.py: every fault, through the controller's
restore, in milliseconds) and the plugin-level ones (tests/integration/test_plugin_faults.py: two of them
through a real pytest session). ``FAULTS`` maps a fault's name to the function that writes it at a bundle's
path in a directory store, and to the environment the session runs with (a signing key where it matters).
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path
from typing import Callable

import zstandard

from pytest_compilecache import bundle
from pytest_compilecache import container
from pytest_compilecache.fingerprint import Fingerprint
from pytest_compilecache.fingerprint import restore_prefix
from pytest_compilecache.settings import DEFAULT_PREFIX

SIGNING_KEY = "our key"


def good_bundle(
    path: Path,
    fp: Fingerprint,
    *,
    key: bytes | None = None,
    facts: dict[str, str] | None = None,
    blob: bytes = b"not a real mega-cache blob",
) -> Path:
    """A valid bundle at ``path`` (its key: the file's stem) for ``fp``, or for other ``facts``: one fake kernel
    file and one mega-cache ``blob``, signed with ``key`` when given. Returns ``path``."""
    cache = path.parent / "src-cache"
    (cache / "ke").mkdir(parents=True, exist_ok=True)
    (cache / "ke" / "kernel.main.so").write_bytes(b"\x7fELF not really")
    bundle.pack(
        path,
        key=path.stem,
        fingerprint=facts or fp.to_json(),
        digest=fp.digest(),
        torch_version="2.13.0",
        blobs={"controller": blob},
        cache_dir=cache,
        files=["ke/kernel.main.so"],
        stats={},
        signing_key=key,
        lineage=restore_prefix(DEFAULT_PREFIX, fp.digest()),
    )
    return path


def _truncate(path: Path, fp: Fingerprint) -> None:
    data = good_bundle(path, fp).read_bytes()
    path.write_bytes(data[: len(data) - 40])


def _flip(path: Path, fp: Fingerprint) -> None:
    data = bytearray(good_bundle(path, fp).read_bytes())
    data[-20] ^= 0x01
    path.write_bytes(bytes(data))


def _unsigned(path: Path, fp: Fingerprint) -> None:
    good_bundle(path, fp)


def _wrongly_signed(path: Path, fp: Fingerprint) -> None:
    good_bundle(path, fp, key=b"someone else's key")


def _other_fingerprint(path: Path, fp: Fingerprint) -> None:
    good_bundle(path, fp, facts={**fp.to_json(), "torch": "2.99.0"})


def _escaping_member(path: Path, fp: Fingerprint) -> None:
    """A bundle whose tar member climbs out of the cache dir, with a manifest that agrees with it."""
    payload = b"pwned"
    tar_buf = io.BytesIO()
    with tarfile.open(fileobj=tar_buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("files/../../escaped.so")
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    compressed = zstandard.ZstdCompressor().compress(tar_buf.getvalue())
    manifest = bundle.Manifest(
        format=bundle.FORMAT_VERSION,
        key=path.stem,
        fingerprint=fp.to_json(),
        digest=fp.digest(),
        plugin_version="0",
        torch_version="2.13.0",
        created="2026-01-01T00:00:00+00:00",
        members=(bundle.Member("files/../../escaped.so", len(payload), hashlib.sha256(payload).hexdigest()),),
        stats={},
        payload_size=len(compressed),
        payload_sha256=hashlib.sha256(compressed).hexdigest(),
        lineage=restore_prefix(DEFAULT_PREFIX, fp.digest()),
    )
    raw = manifest.to_json_bytes()
    path.write_bytes(container.header_bytes(raw, "") + compressed)


def _store_is_a_file(path: Path, fp: Fingerprint) -> None:
    store = path.parent
    for child in store.iterdir():
        child.unlink()
    store.rmdir()
    store.write_text("not a directory")


FAULTS: dict[str, tuple[Callable[[Path, Fingerprint], None], dict[str, str]]] = {
    "truncated": (_truncate, {}),
    "flipped-byte": (_flip, {}),
    "wrong-signature": (_wrongly_signed, {"PYTEST_COMPILECACHE_SIGNING_KEY": SIGNING_KEY}),
    "missing-signature": (_unsigned, {"PYTEST_COMPILECACHE_SIGNING_KEY": SIGNING_KEY}),
    "other-fingerprint": (_other_fingerprint, {}),
    "escaping-member": (_escaping_member, {}),
    "store-not-a-directory": (_store_is_a_file, {}),
}
