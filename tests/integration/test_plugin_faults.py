"""A store that hands back a bad bundle: one warning line, a cold session, the same outcome.

Bundles are crafted with the real packer and the real fingerprint of this machine, then damaged; the
plugin restores them at the start of a real pytest session (a subprocess).
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Any
from typing import Callable

import pytest
import zstandard

from pytest_compilecache import bundle
from pytest_compilecache import container
from pytest_compilecache.fingerprint import Fingerprint
from pytest_compilecache.fingerprint import collect
from pytest_compilecache.fingerprint import make_key
from pytest_compilecache.fingerprint import restore_prefix
from pytest_compilecache.settings import DEFAULT_PREFIX

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PLAIN_SUITE = """
import os

def test_plain():
    # The restore happened before this test: the cache dir must hold nothing from the bad bundle.
    cache = os.environ["TORCHINDUCTOR_CACHE_DIR"]
    found = [n for _, _, files in os.walk(cache) for n in files if n.startswith("kernel")]
    assert found == []
"""

# A matmul (an extern kernel, no C++ build): a cold compile is all these tests need.
COMPILED_SUITE = """
import torch

def test_compiled():
    fn = torch.compile(lambda x, w: x @ w)
    x, w = torch.randn(8, 4), torch.randn(4, 2)
    torch.testing.assert_close(fn(x, w), x @ w)
"""


@pytest.fixture(scope="module")
def fingerprint() -> Fingerprint:
    return collect()


def _good(
    path: Path,
    fp: Fingerprint,
    *,
    key: bytes | None = None,
    facts: dict[str, str] | None = None,
    blob: bytes = b"not a real mega-cache blob",
) -> Path:
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
    data = _good(path, fp).read_bytes()
    path.write_bytes(data[: len(data) - 40])


def _flip(path: Path, fp: Fingerprint) -> None:
    data = bytearray(_good(path, fp).read_bytes())
    data[-20] ^= 0x01
    path.write_bytes(bytes(data))


def _unsigned(path: Path, fp: Fingerprint) -> None:
    _good(path, fp)


def _wrongly_signed(path: Path, fp: Fingerprint) -> None:
    _good(path, fp, key=b"someone else's key")


def _other_fingerprint(path: Path, fp: Fingerprint) -> None:
    _good(path, fp, facts={**fp.to_json(), "torch": "2.99.0"})


def _escaping_member(path: Path, fp: Fingerprint) -> None:
    """A bundle whose tar member climbs out of the cache dir, with a manifest that agrees with it."""
    payload = b"pwned"
    tar_buf = io.BytesIO()
    with tarfile.open(fileobj=tar_buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("files/../../escaped.so")
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    compressed = zstandard.ZstdCompressor().compress(tar_buf.getvalue())
    import hashlib

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
    "wrong-signature": (_wrongly_signed, {"PYTEST_COMPILECACHE_SIGNING_KEY": "our key"}),
    "missing-signature": (_unsigned, {"PYTEST_COMPILECACHE_SIGNING_KEY": "our key"}),
    "other-fingerprint": (_other_fingerprint, {}),
    "escaping-member": (_escaping_member, {}),
    "store-not-a-directory": (_store_is_a_file, {}),
}


def _run(pytester: pytest.Pytester, store: Path, *extra: str) -> tuple[Any, dict[str, Any]]:
    report = pytester.path / "report.json"
    result = pytester.runpytest_subprocess(
        "-p",
        "no:cacheprovider",
        "--compile-cache=isolated",
        f"--compile-cache-store={store}",
        "--compile-cache-readonly",
        f"--compile-cache-json={report}",
        *extra,
    )
    return result, json.loads(report.read_text())


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_bad_bundle_is_one_warning(
    fault: str, pytester: pytest.Pytester, fingerprint: Fingerprint, monkeypatch: pytest.MonkeyPatch
) -> None:
    damage, env = FAULTS[fault]
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    store = pytester.path / "store"
    store.mkdir()
    damage(store / (make_key(DEFAULT_PREFIX, fingerprint.digest(), "run1") + ".bundle"), fingerprint)
    pytester.makeini("[pytest]\nfilterwarnings = ignore::DeprecationWarning\n")
    pytester.makepyfile(test_plain=PLAIN_SUITE)

    result, data = _run(pytester, store)

    assert result.ret == 0, result.stdout.str()
    warnings = [line for line in result.outlines if line.startswith("CompileCacheWarning:")]
    assert len(warnings) == 1, result.stdout.str()
    if fault == "store-not-a-directory":  # the store itself is broken: infrastructure trouble
        assert data["restore"]["outcome"] == "error"
    else:  # a bad bundle in a working store is refused and listed; nothing usable: a miss, cold compile
        assert data["restore"]["outcome"] == "miss"
        assert [entry["key"] for entry in data["restore"]["skipped"]] == [
            make_key(DEFAULT_PREFIX, fingerprint.digest(), "run1")
        ]
    assert not (pytester.path / "escaped.so").exists() and not (pytester.path.parent / "escaped.so").exists()

    strict, _ = _run(pytester, store, "--compile-cache-strict")
    assert strict.ret == 1
    strict.stdout.fnmatch_lines(["*compile cache FAILED: restore*"])


@pytest.mark.slow
def test_torch_rejecting_artifacts_compiles_cold(pytester: pytest.Pytester, fingerprint: Fingerprint) -> None:
    """A bundle that verifies but whose mega-cache blob torch cannot load: warning, cold compile, pass."""
    store = pytester.path / "store"
    store.mkdir()
    _good(store / (make_key(DEFAULT_PREFIX, fingerprint.digest(), "run1") + ".bundle"), fingerprint, blob=b"\x00" * 64)
    pytester.makeini("[pytest]\nfilterwarnings = ignore::DeprecationWarning\n")
    pytester.makepyfile(test_compiled=COMPILED_SUITE)

    result, data = _run(pytester, store)

    assert result.ret == 0, result.stdout.str()
    warnings = [line for line in result.outlines if line.startswith("CompileCacheWarning:")]
    assert len(warnings) == 1 and "torch rejected" in warnings[0], warnings
    assert data["totals"]["misses"] >= 1 and data["totals"]["hits"] == 0
