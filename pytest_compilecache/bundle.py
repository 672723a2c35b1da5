"""Pack, verify and unpack a bundle: one file holding a session's torch compile cache.

A bundle holds the torch mega-cache blobs of a session (one per process: ``controller``, ``gw0``...), the
files copied from the TorchInductor cache dir (compiled ``.so`` kernels...) and a manifest describing both.
Bundles contain pickles that torch will load, so they are treated as code: :func:`verify` checks every byte
and :func:`unpack` writes nothing until the whole bundle has been verified.

Container format (version 1; integers are unsigned 32-bit big-endian)::

    offset      size  content
    0           8     MAGIC  b"PTCCBNDL"
    8           4     format version (1)
    12          4     M = manifest length (1 .. 64 MiB)
    16          M     manifest: canonical JSON, UTF-8 (Manifest.to_json_bytes)
    16+M        32    SHA-256 of the manifest bytes (integrity when no signing key is configured)
    48+M        4     S = signature length (0: unsigned, or 64)
    52+M        S     ASCII hex HMAC-SHA256(signing key, manifest bytes)
    52+M+S      rest  payload: one zstd frame of an uncompressed POSIX (pax) tar

The payload is exactly ``manifest.payload_size`` bytes with SHA-256 ``manifest.payload_sha256``, so the
manifest (and the signature over it) pins every byte of the file. Tar members are regular files only:
``blobs/<name>.bin`` for each mega-cache blob and ``files/<relative path>`` for each cache-dir file, each
listed in the manifest with its size and SHA-256.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import io
import json
import os
import re
import stat
import struct
import tarfile
from dataclasses import dataclass
from datetime import datetime
from datetime import timezone
from pathlib import Path
from pathlib import PureWindowsPath
from typing import Any
from typing import BinaryIO
from typing import Iterable
from typing import Iterator
from typing import Mapping

import zstandard

from . import BundleError
from . import ConfigError
from . import __version__
from ._fs import atomic_file

__all__ = [
    "FORMAT_VERSION",
    "MAGIC",
    "Manifest",
    "Member",
    "Unpacked",
    "is_signed",
    "member_sha256",
    "pack",
    "read_manifest",
    "sign",
    "unpack",
    "verify",
]

FORMAT_VERSION = 1
MAGIC = b"PTCCBNDL"
SIGNING_KEY_ENV = "PYTEST_COMPILECACHE_SIGNING_KEY"

BLOBS_DIR = "blobs/"
FILES_DIR = "files/"

_U32 = struct.Struct(">I")
_SHA256_LEN = 32
_SIGNATURE_LEN = 64  # hex of a 32-byte HMAC-SHA256
_MAX_MANIFEST = 64 * 1024 * 1024
_CHUNK = 1024 * 1024
_ZSTD_LEVEL = 10
_BLOB_NAME = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_MANIFEST_KEYS = frozenset(
    {
        "format",
        "key",
        "fingerprint",
        "digest",
        "plugin_version",
        "torch_version",
        "created",
        "members",
        "stats",
        "payload_size",
        "payload_sha256",
    }
)
_MEMBER_KEYS = frozenset({"path", "size", "sha256"})


@dataclass(frozen=True)
class Member:
    """One tar member: ``path`` is POSIX and relative (``blobs/gw0.bin``, ``files/ab/cabc.main.so``)."""

    path: str
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    """What a bundle holds and where it comes from. Constructing one validates nothing; parsing does."""

    format: int
    key: str
    fingerprint: dict[str, str]
    digest: str
    plugin_version: str
    torch_version: str
    created: str
    members: tuple[Member, ...]
    stats: dict[str, Any]
    payload_size: int
    payload_sha256: str

    def to_json_bytes(self) -> bytes:
        """Canonical JSON (sorted keys, no whitespace): the exact bytes that are hashed and signed."""
        document = {
            "format": self.format,
            "key": self.key,
            "fingerprint": dict(self.fingerprint),
            "digest": self.digest,
            "plugin_version": self.plugin_version,
            "torch_version": self.torch_version,
            "created": self.created,
            "members": [{"path": m.path, "size": m.size, "sha256": m.sha256} for m in self.members],
            "stats": self.stats,
            "payload_size": self.payload_size,
            "payload_sha256": self.payload_sha256,
        }
        return _canonical_json(document)

    @classmethod
    def from_json_bytes(cls, data: bytes) -> Manifest:
        """Parse and validate a manifest; raise :class:`BundleError` on anything malformed.

        Validates types, the format version, hex digests and that every member path is safe and unique.
        """
        try:
            document = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise BundleError(f"bundle manifest is not valid JSON: {exc}") from None
        if not isinstance(document, dict):
            raise BundleError("bundle manifest is not a JSON object")
        _check_keys(document, _MANIFEST_KEYS, "bundle manifest")
        if _int(document["format"], "format") != FORMAT_VERSION:
            raise BundleError(f"bundle manifest format {document['format']} is not supported")
        fingerprint = document["fingerprint"]
        if not isinstance(fingerprint, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in fingerprint.items()
        ):
            raise BundleError("bundle manifest field 'fingerprint' must map strings to strings")
        if not isinstance(document["stats"], dict):
            raise BundleError("bundle manifest field 'stats' must be an object")
        created = _str(document["created"], "created")
        try:
            datetime.fromisoformat(created)
        except ValueError:
            raise BundleError(f"bundle manifest field 'created' is not ISO-8601: {created!r}") from None
        return cls(
            format=FORMAT_VERSION,
            key=_str(document["key"], "key"),
            fingerprint=dict(fingerprint),
            digest=_str(document["digest"], "digest", allow_empty=True),
            plugin_version=_str(document["plugin_version"], "plugin_version"),
            torch_version=_str(document["torch_version"], "torch_version", allow_empty=True),
            created=created,
            members=_parse_members(document["members"]),
            stats=document["stats"],
            payload_size=_int(document["payload_size"], "payload_size"),
            payload_sha256=_sha(document["payload_sha256"], "payload_sha256"),
        )

    @property
    def total_size(self) -> int:
        """Uncompressed size of all members, in bytes."""
        return sum(m.size for m in self.members)

    @property
    def blob_names(self) -> tuple[str, ...]:
        """Names of the mega-cache blobs (``controller``, ``gw0``...), sorted."""
        names = (m.path[len(BLOBS_DIR) : -len(".bin")] for m in self.members if m.path.startswith(BLOBS_DIR))
        return tuple(sorted(names))

    @property
    def file_paths(self) -> tuple[str, ...]:
        """Cache-dir files, relative to the cache dir, sorted."""
        return tuple(sorted(m.path[len(FILES_DIR) :] for m in self.members if m.path.startswith(FILES_DIR)))


@dataclass(frozen=True)
class Unpacked:
    """Result of :func:`unpack`: blobs in memory, and the cache-dir files written or found identical."""

    manifest: Manifest
    blobs: dict[str, bytes]
    files: tuple[str, ...]
    unchanged: tuple[str, ...] = ()


# --- public functions -------------------------------------------------------------------------------------


def member_sha256(path: Path) -> str:
    """Hex SHA-256 of a file's content, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def sign(manifest_bytes: bytes, signing_key: bytes) -> str:
    """Hex HMAC-SHA256 of the manifest bytes."""
    return hmac.new(signing_key, manifest_bytes, hashlib.sha256).hexdigest()


def pack(
    dest: Path,
    *,
    key: str,
    fingerprint: Mapping[str, str],
    digest: str,
    torch_version: str,
    blobs: Mapping[str, bytes],
    cache_dir: Path,
    files: Iterable[str],
    stats: Mapping[str, Any],
    signing_key: bytes | None = None,
) -> Manifest:
    """Write a bundle to ``dest`` atomically and return its manifest.

    ``files`` are POSIX paths relative to ``cache_dir``; each must be a regular file inside it. A file that
    vanished meanwhile is skipped (torch may delete cache entries while we read). A path that escapes
    ``cache_dir`` or names a non-regular file raises :class:`BundleError`, as does any I/O failure. ``dest``
    is written through a temp sibling and ``os.replace``: on failure no partial file or temp file remains.
    """
    _check_signing_key(signing_key)
    contents: dict[str, bytes] = {}
    for name, data in blobs.items():
        if not isinstance(name, str) or not _BLOB_NAME.fullmatch(name):
            raise BundleError(f"invalid blob name {name!r} (use [A-Za-z0-9._-], not starting with '.')")
        contents[f"{BLOBS_DIR}{name}.bin"] = bytes(data)
    contents.update(_read_cache_files(Path(cache_dir), files))
    members = tuple(
        Member(path=p, size=len(contents[p]), sha256=hashlib.sha256(contents[p]).hexdigest())
        for p in sorted(contents)
    )
    payload = _compress(_build_tar(contents, members))
    manifest = Manifest(
        format=FORMAT_VERSION,
        key=key,
        fingerprint={str(k): str(v) for k, v in fingerprint.items()},
        digest=digest,
        plugin_version=__version__,
        torch_version=torch_version,
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        members=members,
        stats=_json_roundtrip(stats),
        payload_size=len(payload),
        payload_sha256=hashlib.sha256(payload).hexdigest(),
    )
    manifest_bytes = manifest.to_json_bytes()
    # Never write a bundle that its own reader would refuse (an empty key, odd fingerprint values...).
    Manifest.from_json_bytes(manifest_bytes)
    signature = sign(manifest_bytes, signing_key) if signing_key is not None else ""
    _write_bundle_file(Path(dest), manifest_bytes, signature, payload)
    return manifest


def read_manifest(path: Path) -> Manifest:
    """Read the header and manifest only (cheap, for ``inspect``); the payload is NOT verified."""
    with _open_bundle(path) as fh:
        manifest_bytes, _ = _read_header(fh)
    return Manifest.from_json_bytes(manifest_bytes)


def is_signed(path: Path) -> bool:
    """Whether the bundle carries a signature (not whether it is valid)."""
    with _open_bundle(path) as fh:
        _, signature = _read_header(fh)
    return bool(signature)


def verify(
    path: Path,
    *,
    signing_key: bytes | None = None,
    fingerprint: Mapping[str, str] | None = None,
) -> Manifest:
    """Verify the whole bundle and return its manifest; raise :class:`BundleError` on any problem.

    Checks the magic and format, the manifest checksum and schema, the signature when ``signing_key`` is
    given (unsigned or wrongly signed is an error; without a key a signature is not checked), equality of
    ``fingerprint`` with the manifest's, the payload size and checksum, and that the archive holds exactly
    the manifest's members, each a regular file at a safe path with the listed size and checksum.
    """
    manifest, _ = _verified_contents(Path(path), signing_key, fingerprint)
    return manifest


def unpack(
    path: Path,
    cache_dir: Path,
    *,
    signing_key: bytes | None = None,
    fingerprint: Mapping[str, str] | None = None,
) -> Unpacked:
    """Verify the bundle, then write its files into ``cache_dir`` and return its blobs in memory.

    Nothing is written before the whole bundle is verified; the files written are the verified bytes held
    in memory, never re-read from the bundle. Each file is written atomically (temp sibling + ``os.replace``)
    and never outside ``cache_dir``: a symlink already in ``cache_dir`` that leads out of it is refused, a
    symlink in place of a file is replaced, not followed. Identical existing files are left alone. Any
    failure, verification or I/O, raises :class:`BundleError`.
    """
    manifest, contents = _verified_contents(Path(path), signing_key, fingerprint)
    cache_dir = Path(cache_dir)
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        root = cache_dir.resolve()
    except OSError as exc:
        raise BundleError(f"cannot create cache dir {cache_dir}: {exc}") from exc
    written: list[str] = []
    unchanged: list[str] = []
    for rel in manifest.file_paths:
        if _install_file(root, rel, contents[FILES_DIR + rel]):
            written.append(rel)
        else:
            unchanged.append(rel)
    blobs = {name: contents[f"{BLOBS_DIR}{name}.bin"] for name in manifest.blob_names}
    return Unpacked(manifest=manifest, blobs=blobs, files=tuple(written), unchanged=tuple(unchanged))


# --- manifest helpers -------------------------------------------------------------------------------------


def _canonical_json(document: Any) -> bytes:
    return json.dumps(
        document, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    ).encode("ascii")


def _json_roundtrip(stats: Mapping[str, Any]) -> dict[str, Any]:
    # Normalise (tuples -> lists...) so the manifest pack() returns equals the one read back later.
    try:
        result = json.loads(_canonical_json(dict(stats)))
    except (TypeError, ValueError) as exc:
        raise BundleError(f"bundle stats are not JSON-serialisable: {exc}") from None
    return result  # type: ignore[no-any-return]


def _check_keys(document: dict[str, Any], expected: frozenset[str], what: str) -> None:
    missing = sorted(expected - document.keys())
    unknown = sorted(document.keys() - expected)
    if missing:
        raise BundleError(f"{what} lacks field(s) {', '.join(missing)}")
    if unknown:
        raise BundleError(f"{what} has unknown field(s) {', '.join(unknown)}")


def _str(value: Any, field: str, *, allow_empty: bool = False) -> str:
    if not isinstance(value, str) or (not value and not allow_empty):
        raise BundleError(f"bundle manifest field {field!r} must be a non-empty string")
    return value


def _int(value: Any, field: str) -> int:
    # bool is an int subclass: refuse it explicitly.
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise BundleError(f"bundle manifest field {field!r} must be a non-negative integer")
    return value


def _sha(value: Any, field: str) -> str:
    if not isinstance(value, str) or not _HEX64.fullmatch(value):
        raise BundleError(f"bundle manifest field {field!r} must be a lowercase hex SHA-256")
    return value


def _parse_members(raw: Any) -> tuple[Member, ...]:
    if not isinstance(raw, list):
        raise BundleError("bundle manifest field 'members' must be a list")
    members: list[Member] = []
    seen: set[str] = set()
    for item in raw:
        if not isinstance(item, dict):
            raise BundleError("bundle manifest member is not an object")
        _check_keys(item, _MEMBER_KEYS, "bundle manifest member")
        path = _check_member_path(_str(item["path"], "members.path"))
        if path in seen:
            raise BundleError(f"bundle manifest lists {path} twice")
        seen.add(path)
        size = _int(item["size"], "members.size")
        members.append(Member(path=path, size=size, sha256=_sha(item["sha256"], "members.sha256")))
    return tuple(members)


def _unsafe_reason(rel: str) -> str | None:
    """Why a relative POSIX path could land outside its base directory, or None when it is safe."""
    if not rel:
        return "empty path"
    if "\\" in rel:
        return "backslash"
    if any(ord(c) < 32 or c == "\x7f" for c in rel):
        return "control character"
    if rel.startswith("/"):
        return "absolute path"
    if PureWindowsPath(rel).drive:
        return "drive or UNC prefix"
    if any(part in ("", ".", "..") for part in rel.split("/")):
        return "'..', '.' or empty component"
    return None


def _check_member_path(path: str) -> str:
    reason = _unsafe_reason(path)
    if reason is None:
        if path.startswith(FILES_DIR) and len(path) > len(FILES_DIR):
            return path
        name = path[len(BLOBS_DIR) : -len(".bin")]
        if path.startswith(BLOBS_DIR) and path.endswith(".bin") and _BLOB_NAME.fullmatch(name):
            return path
        reason = "not under blobs/ or files/"
    raise BundleError(f"bundle has unsafe member path {path!r} ({reason})")


def _fingerprint_differences(bundle: Mapping[str, str], current: Mapping[str, str]) -> list[str]:
    return [
        f"{name}: {bundle.get(name, '<absent>')} != {current.get(name, '<absent>')}"
        for name in sorted(set(bundle) | set(current))
        if bundle.get(name) != current.get(name)
    ]


def _check_signing_key(signing_key: bytes | None) -> None:
    # An empty HMAC key authenticates nothing; treat it as a configuration mistake, not "no key".
    if signing_key is not None and not signing_key:
        raise ConfigError(f"{SIGNING_KEY_ENV}: the signing key must not be empty")


# --- container I/O ----------------------------------------------------------------------------------------


@contextlib.contextmanager
def _open_bundle(path: Path) -> Iterator[BinaryIO]:
    """Open a bundle for reading; any OSError, opening or reading, becomes a :class:`BundleError`."""
    try:
        with open(path, "rb") as fh:
            yield fh
    except OSError as exc:
        raise BundleError(f"cannot read bundle {path}: {exc.strerror or exc}") from exc


def _read_exact(fh: BinaryIO, size: int) -> bytes:
    data = fh.read(size)
    if len(data) != size:
        raise BundleError("bundle is truncated")
    return data


def _read_header(fh: BinaryIO) -> tuple[bytes, bytes]:
    """Read up to the payload; return (manifest bytes, signature bytes). The manifest checksum is checked."""
    magic = fh.read(len(MAGIC))
    if magic != MAGIC:
        if MAGIC.startswith(magic):
            raise BundleError("bundle is truncated")
        raise BundleError("not a pytest-compilecache bundle (bad magic)")
    (version,) = _U32.unpack(_read_exact(fh, _U32.size))
    if version != FORMAT_VERSION:
        raise BundleError(f"bundle format {version} is not supported (expected {FORMAT_VERSION})")
    (manifest_len,) = _U32.unpack(_read_exact(fh, _U32.size))
    if not 0 < manifest_len <= _MAX_MANIFEST:
        raise BundleError(f"bundle manifest length {manifest_len} is out of range")
    manifest_bytes = _read_exact(fh, manifest_len)
    if not hmac.compare_digest(_read_exact(fh, _SHA256_LEN), hashlib.sha256(manifest_bytes).digest()):
        raise BundleError("bundle manifest checksum mismatch")
    (signature_len,) = _U32.unpack(_read_exact(fh, _U32.size))
    if signature_len not in (0, _SIGNATURE_LEN):
        raise BundleError(f"bundle signature length {signature_len} is invalid")
    return manifest_bytes, _read_exact(fh, signature_len)


def _check_signature(manifest_bytes: bytes, signature: bytes, signing_key: bytes | None) -> None:
    if signing_key is None:
        return  # No key configured: a signature, if any, is not checked (the checksums still are).
    if not signature:
        raise BundleError(f"bundle signature missing ({SIGNING_KEY_ENV} is set)")
    if not hmac.compare_digest(signature, sign(manifest_bytes, signing_key).encode("ascii")):
        raise BundleError(f"bundle signature mismatch (wrong {SIGNING_KEY_ENV} or tampered manifest)")


def _read_payload(fh: BinaryIO, manifest: Manifest) -> bytes:
    payload = bytearray()
    digest = hashlib.sha256()
    while chunk := fh.read(_CHUNK):
        payload += chunk
        digest.update(chunk)
        if len(payload) > manifest.payload_size:
            raise BundleError("bundle has trailing data after its payload")
    if len(payload) < manifest.payload_size:
        raise BundleError("bundle is truncated")
    if digest.hexdigest() != manifest.payload_sha256:
        raise BundleError("bundle payload checksum mismatch")
    return bytes(payload)


def _verified_contents(
    path: Path, signing_key: bytes | None, fingerprint: Mapping[str, str] | None
) -> tuple[Manifest, dict[str, bytes]]:
    """Verify everything; return the manifest and every member's bytes, keyed by member path."""
    _check_signing_key(signing_key)
    with _open_bundle(path) as fh:
        manifest_bytes, signature = _read_header(fh)
        # Authenticate before interpreting anything the manifest says.
        _check_signature(manifest_bytes, signature, signing_key)
        manifest = Manifest.from_json_bytes(manifest_bytes)
        if fingerprint is not None:
            differences = _fingerprint_differences(manifest.fingerprint, fingerprint)
            if differences:
                raise BundleError(f"bundle fingerprint differs (bundle != current): {'; '.join(differences)}")
        payload = _read_payload(fh, manifest)
    return manifest, _read_members(_decompress(payload, manifest), manifest)


def _tar_limit(manifest: Manifest) -> int:
    # Bound decompression (a zip bomb must not exhaust memory): content plus generous per-member tar/pax
    # header space plus the end-of-archive record.
    overhead = sum(3 * 512 + 512 + 2 * len(m.path.encode("utf-8")) for m in manifest.members)
    return manifest.total_size + overhead + 2 * tarfile.RECORDSIZE


def _decompress(payload: bytes, manifest: Manifest) -> bytes:
    limit = _tar_limit(manifest)
    out = bytearray()
    try:
        reader = zstandard.ZstdDecompressor().stream_reader(payload)
        while chunk := reader.read(_CHUNK):
            out += chunk
            if len(out) > limit:
                raise BundleError("bundle payload is larger than its manifest declares")
    except zstandard.ZstdError as exc:
        raise BundleError(f"bundle payload is not valid zstd: {exc}") from None
    return bytes(out)


def _member_kind(info: tarfile.TarInfo) -> str:
    if info.issym():
        return "symlink"
    if info.islnk():
        return "hardlink"
    if info.isdir():
        return "directory"
    if info.isdev():
        return "device"
    return f"type {info.type!r}"


def _read_members(tar_bytes: bytes, manifest: Manifest) -> dict[str, bytes]:
    expected = {m.path: m for m in manifest.members}
    contents: dict[str, bytes] = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(tar_bytes), mode="r:") as archive:
            for info in archive:
                name = _check_member_path(info.name)
                # Only plain files: links and devices are how archives escape their base directory.
                if info.type not in (tarfile.REGTYPE, tarfile.AREGTYPE):
                    raise BundleError(f"bundle member {name!r} is not a regular file ({_member_kind(info)})")
                member = expected.get(name)
                if member is None:
                    raise BundleError(f"bundle member {name!r} is not in the manifest")
                if name in contents:
                    raise BundleError(f"bundle member {name!r} appears twice")
                extracted = archive.extractfile(info)
                data = extracted.read() if extracted is not None else b""
                if len(data) != member.size:
                    raise BundleError(
                        f"bundle size mismatch for {name} (manifest {member.size}, archive {len(data)})"
                    )
                if hashlib.sha256(data).hexdigest() != member.sha256:
                    raise BundleError(f"bundle checksum mismatch for {name}")
                contents[name] = data
    except tarfile.TarError as exc:
        raise BundleError(f"bundle payload is not a valid tar archive: {exc}") from None
    missing = sorted(expected.keys() - contents.keys())
    if missing:
        raise BundleError(f"bundle is missing member {missing[0]}")
    return contents


def _build_tar(contents: Mapping[str, bytes], members: Iterable[Member]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:", format=tarfile.PAX_FORMAT) as archive:
        for member in members:
            info = tarfile.TarInfo(member.path)
            # Fixed metadata: the bundle's content depends only on the members, not on who packed it.
            info.size, info.mode, info.mtime = member.size, 0o644, 0
            archive.addfile(info, io.BytesIO(contents[member.path]))
    return buffer.getvalue()


def _compress(data: bytes) -> bytes:
    # threads=0: single-threaded, so packing stays deterministic and does not compete with the test session.
    return zstandard.ZstdCompressor(level=_ZSTD_LEVEL, threads=0).compress(data)


def _write_all(fh: BinaryIO, data: bytes) -> None:
    """Write ``data`` in chunks. A module-level seam so tests can inject a failing writer."""
    view = memoryview(data)
    fh.writelines(view[start : start + _CHUNK] for start in range(0, len(view), _CHUNK))


def _container_header(manifest_bytes: bytes, signature: str) -> bytes:
    signature_bytes = signature.encode("ascii")
    return b"".join(
        (
            MAGIC,
            _U32.pack(FORMAT_VERSION),
            _U32.pack(len(manifest_bytes)),
            manifest_bytes,
            hashlib.sha256(manifest_bytes).digest(),
            _U32.pack(len(signature_bytes)),
            signature_bytes,
        )
    )


def _write_bundle_file(dest: Path, manifest_bytes: bytes, signature: str, payload: bytes) -> None:
    """Write a container to ``dest`` atomically: temp sibling, fsync, ``os.replace``; no leftovers on error."""
    header = _container_header(manifest_bytes, signature)
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(dest) as fh:
            _write_all(fh, header)
            _write_all(fh, payload)
    except OSError as exc:
        raise BundleError(f"cannot write bundle {dest}: {exc.strerror or exc}") from exc


# --- cache-dir side ---------------------------------------------------------------------------------------


def _read_cache_files(cache_dir: Path, files: Iterable[str]) -> dict[str, bytes]:
    """Read the listed cache-dir files, keyed by member path; vanished files are skipped."""
    try:
        root = cache_dir.resolve(strict=True)
    except OSError as exc:
        raise BundleError(f"cannot read cache dir {cache_dir}: {exc.strerror or exc}") from exc
    contents: dict[str, bytes] = {}
    for rel in files:
        reason = _unsafe_reason(rel) if isinstance(rel, str) else "not a string"
        if reason is not None:
            raise BundleError(f"cache file path {rel!r} escapes the cache dir ({reason})")
        data = _read_cache_file(root, rel)
        if data is not None:
            contents[FILES_DIR + rel] = data
    return contents


def _read_cache_file(root: Path, rel: str) -> bytes | None:
    path = root / rel
    # A symlinked directory inside the cache dir could still lead out of it.
    if not path.parent.resolve().is_relative_to(root):
        raise BundleError(f"cache file path {rel!r} escapes the cache dir (through a symlink)")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0))
    except FileNotFoundError:
        return None  # torch deleted it meanwhile: not an error.
    except OSError as exc:
        if path.is_symlink():
            raise BundleError(f"cache file {rel!r} is not a regular file (symlink)") from None
        raise BundleError(f"cannot read cache file {rel!r}: {exc.strerror or exc}") from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode) or path.is_symlink():
            raise BundleError(f"cache file {rel!r} is not a regular file")
        with os.fdopen(os.dup(fd), "rb") as fh:
            return fh.read()
    except OSError as exc:
        raise BundleError(f"cannot read cache file {rel!r}: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)


def _safe_parent(root: Path, rel: str) -> Path:
    """Create and return the resolved parent dir of ``root/rel``, refusing any way out of ``root``."""
    current = root
    for part in rel.split("/")[:-1]:
        current = current / part
        try:
            info = os.lstat(current)
        except FileNotFoundError:
            current.mkdir(exist_ok=True)
            info = os.lstat(current)
        if stat.S_ISLNK(info.st_mode):
            if not current.resolve().is_relative_to(root):
                raise BundleError(f"refusing to unpack {rel}: {current} is a symlink out of the cache dir")
        elif not stat.S_ISDIR(info.st_mode):
            raise BundleError(f"cannot unpack {rel}: {current} is not a directory")
    parent = current.resolve()
    if not parent.is_relative_to(root):  # re-check: the tree may have changed under us.
        raise BundleError(f"refusing to unpack {rel}: it would land outside the cache dir")
    if not parent.is_dir():
        raise BundleError(f"cannot unpack {rel}: {parent} is not a directory")
    return parent


def _is_identical(target: Path, data: bytes) -> bool:
    try:
        info = os.lstat(target)
    except FileNotFoundError:
        return False
    if stat.S_ISDIR(info.st_mode):
        raise BundleError(f"cannot unpack {target.name}: a directory is in the way")
    # A symlink in place of the file is never "identical": it gets replaced, not followed.
    if not stat.S_ISREG(info.st_mode) or info.st_size != len(data):
        return False
    return member_sha256(target) == hashlib.sha256(data).hexdigest()


def _install_file(root: Path, rel: str, data: bytes) -> bool:
    """Write one verified file under ``root`` atomically; False when an identical file was already there."""
    try:
        parent = _safe_parent(root, rel)
        target = parent / rel.rsplit("/", 1)[-1]
        if _is_identical(target, data):
            return False
        with atomic_file(target, fsync=False) as fh:  # a lost cache entry only costs a compile
            _write_all(fh, data)
    except OSError as exc:
        raise BundleError(f"cannot unpack {rel} into {root}: {exc.strerror or exc}") from exc
    return True
