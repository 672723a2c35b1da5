"""Pack, verify and install a bundle: one file holding a session's torch compile cache.

A bundle holds the torch mega-cache blobs of a session (one per process: ``controller``, ``gw0``...), the
files copied from the TorchInductor cache dir (compiled ``.so`` kernels...) and a manifest describing both.
Bundles contain pickles that torch will load, so they are treated as code.

This module is the façade over three layers: :mod:`.manifest` (schema and validation), :mod:`.container`
(header, signature, zstd, tar streaming) and :mod:`.install` (containment: dir-fd I/O in the cache dir).

- :func:`read_manifest` reads the header only (no payload byte), checking the manifest checksum and, given a
  key, the signature: the one way to use bundle text (e.g. to explain a miss) without verifying the payload.
- :func:`verify` reads the whole bundle once, as a stream (read, decompress, hash once; memory bounded by a
  few MiB whatever the bundle declares, size capped by ``max_bytes``). Given a ``cache_dir`` it stages the
  members inside it as they verify and returns a :class:`Verified` holding them; :func:`install` then moves
  them into place, all or nothing. Any failure leaves the cache dir exactly as it was.
- :func:`pack` streams cache files (opened through dir fds, no link followed) into a new bundle and never
  writes one its own reader would refuse.

Every error from reading a bundle is a :class:`~pytest_compilecache.BundleError` (an empty signing key is a
:class:`~pytest_compilecache.ConfigError`).
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import stat
import tarfile
from dataclasses import dataclass
from dataclasses import field
from datetime import datetime
from datetime import timezone
from pathlib import Path
from typing import Any
from typing import BinaryIO
from typing import Callable
from typing import Iterable
from typing import Iterator
from typing import Mapping
from typing import cast

from ._fs import atomic_file
from ._fs import temp_name
from ._version import __version__
from .cachedir import OUR_NAMES
from .cachedir import PENDING_DIR
from .container import CHUNK
from .container import MAGIC
from .container import SIGNING_KEY_ENV
from .container import Header
from .container import PayloadReader
from .container import check_signature
from .container import check_signing_key
from .container import compressor
from .container import header_bytes
from .container import iter_tar
from .container import read_header
from .container import sign
from .container import tar_limit
from .errors import BundleError
from .install import CacheDirError
from .install import Installed
from .install import Staging
from .install import cache_root
from .install import open_cache_file
from .manifest import BLOB_NAME
from .manifest import BLOBS_DIR
from .manifest import FILES_DIR
from .manifest import FORMAT_VERSION
from .manifest import Artifact
from .manifest import Manifest
from .manifest import Member
from .manifest import check_member_path
from .manifest import fingerprint_differences
from .manifest import fold_path
from .manifest import json_object
from .manifest import printable
from .manifest import unsafe_member_reason

__all__ = [
    "DEFAULT_MAX_BYTES",
    "FORMAT_VERSION",
    "MAGIC",
    "SIGNING_KEY_ENV",
    "Artifact",
    "CacheDirError",
    "Installed",
    "Manifest",
    "Member",
    "Verified",
    "install",
    "is_signed",
    "pack",
    "pending_path",
    "read_manifest",
    "sign",
    "verify",
]

DEFAULT_MAX_BYTES = 2 * 1024**3
"""Default cap on a bundle's file size and on its unpacked size (``--compile-cache-max-bundle-size``)."""

# Names a cache dir may legitimately hold but no bundle can carry: skipped on pack with a note.
_UNPACKABLE = ("not valid UTF-8", "control character", "name too long", "too many components")

SkipNote = Callable[[str, str], None]


@dataclass
class Verified:
    """A bundle whose every byte has been verified; with a staging dir, its members wait there to be installed.

    Use as a context manager (or call :meth:`close`): closing removes the staging dir, so a verified bundle
    that is never installed leaves nothing behind. Blobs are read back one at a time with :meth:`blob`,
    valid until close (after :func:`install` too).
    """

    manifest: Manifest
    staging: Staging | None = None
    slots: dict[str, str] = field(default_factory=dict)

    def __enter__(self) -> Verified:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def blob(self, name: str) -> bytes:
        """The verified bytes of mega-cache blob ``name`` (one of ``manifest.blob_names``)."""
        if self.staging is None:
            raise ValueError("this bundle was verified without a cache dir: its blobs were not kept")
        try:
            return self.staging.read(self.slots[f"{BLOBS_DIR}{name}.bin"])
        except OSError as exc:
            raise BundleError(f"cannot read staged blob {name}: {exc.strerror or exc}") from exc

    def close(self) -> None:
        if self.staging is not None:
            self.staging.close()


# --- reading ---------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _open_bundle(path: Path) -> Iterator[BinaryIO]:
    """Open a bundle for reading; any OSError, opening or reading, becomes a :class:`BundleError`."""
    try:
        with open(path, "rb") as fh:
            yield fh
    except OSError as exc:
        raise BundleError(f"cannot read bundle {path}: {exc.strerror or exc}") from exc


def _checked_manifest(
    header: Header,
    signing_key: bytes | None,
    *,
    key: str | None,
    lineage: str | None,
    fingerprint: Mapping[str, str] | None,
) -> Manifest:
    # Authenticate before interpreting anything the manifest says.
    check_signature(header, signing_key)
    manifest = Manifest.from_json_bytes(header.manifest_bytes)
    if key is not None and manifest.key != key:
        raise BundleError(f"bundle was saved as {manifest.key!r}, not as {key!r} (copied under another key?)")
    if lineage is not None and manifest.lineage != lineage:
        raise BundleError(f"bundle belongs to lineage {manifest.lineage!r}, not {lineage!r}")
    if fingerprint is not None:
        differences = fingerprint_differences(manifest.fingerprint, fingerprint)
        if differences:
            raise BundleError(f"bundle fingerprint differs (bundle != current): {'; '.join(differences)}")
    return manifest


def read_manifest(
    path: Path, *, signing_key: bytes | None = None, key: str | None = None, lineage: str | None = None
) -> Manifest:
    """Read the header only (no payload byte is read): magic, format, manifest checksum and schema.

    With ``signing_key`` the signature is checked too, and with ``key`` / ``lineage`` the bundle must have
    been saved under that key / lineage: only then is its text fit to show (e.g. in a miss explanation).
    Without a key (``inspect``) the manifest is checksummed but unauthenticated. BundleError on failure.
    """
    check_signing_key(signing_key)
    with _open_bundle(Path(path)) as fh:
        header = read_header(fh)
    return _checked_manifest(header, signing_key, key=key, lineage=lineage, fingerprint=None)


def is_signed(path: Path) -> bool:
    """Whether the bundle carries a signature (not whether it is valid)."""
    with _open_bundle(Path(path)) as fh:
        return bool(read_header(fh).signature)


def verify(
    path: Path,
    *,
    signing_key: bytes | None = None,
    fingerprint: Mapping[str, str] | None = None,
    key: str | None = None,
    lineage: str | None = None,
    cache_dir: Path | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> Verified:
    """Verify the whole bundle in one streaming pass; return a :class:`Verified` (close it) or raise BundleError.

    Checks, in order: magic and format, manifest checksum, the signature when ``signing_key`` is given
    (unsigned or wrongly signed is an error; without a key a signature is not checked), manifest schema and
    installability of its paths, ``key`` / ``lineage`` / ``fingerprint`` equality when given, the file and
    unpacked sizes against ``max_bytes``, then the payload: its size and checksum, and that the archive holds
    exactly the manifest's members, each a regular file at a safe path with the listed size and checksum.

    With ``cache_dir`` the members are staged in ``<cache_dir>/.compilecache-staging-...`` as they verify
    (the cache dir is created if missing, and removed again on failure); nothing else in it is touched. Without
    it the bytes are only hashed (``verify`` command).
    """
    check_signing_key(signing_key)
    if max_bytes <= 0:
        raise ValueError("max_bytes must be positive")
    path = Path(path)
    with _open_bundle(path) as fh:
        header = read_header(fh)
        manifest = _checked_manifest(header, signing_key, key=key, lineage=lineage, fingerprint=fingerprint)
        _check_sizes(fh, header, manifest, max_bytes)
        staging = Staging.create(Path(cache_dir)) if cache_dir is not None else None
        verified = Verified(manifest, staging)
        try:
            if staging is not None:
                staging.check_installable(manifest.file_paths)
            reader = PayloadReader(fh, manifest.payload_size, manifest.payload_sha256)
            try:
                _stream_members(reader, manifest, verified)
            except BundleError:
                reader.finish()  # a damaged payload says so, rather than whichever symptom came first
                raise
            reader.finish()
        except BaseException:
            verified.close()
            raise
    return verified


def _check_sizes(fh: BinaryIO, header: Header, manifest: Manifest, max_bytes: int) -> None:
    limit = f"the limit of {max_bytes} bytes (--compile-cache-max-bundle-size)"
    with contextlib.suppress(OSError, ValueError, io.UnsupportedOperation):
        info = os.fstat(fh.fileno())
        if stat.S_ISREG(info.st_mode):
            if info.st_size > max_bytes:
                raise BundleError(f"bundle is {info.st_size} bytes, more than {limit}")
            expected = header.payload_offset + manifest.payload_size
            if info.st_size < expected:
                raise BundleError("bundle is truncated")
            if info.st_size > expected:
                raise BundleError("bundle has trailing data after its payload")
    if manifest.payload_size > max_bytes or manifest.total_size > max_bytes:
        raise BundleError(f"bundle declares {max(manifest.total_size, manifest.payload_size)} bytes, more than {limit}")


def _stream_members(reader: PayloadReader, manifest: Manifest, verified: Verified) -> None:
    expected = {m.path: m for m in manifest.members}
    limit = tar_limit([(m.path, m.size) for m in manifest.members])
    staging = verified.staging
    for entry in iter_tar(reader, limit):
        name = check_member_path(entry.name)
        # Only plain files: links and devices are how archives escape their base directory.
        if entry.kind != "file":
            raise BundleError(f"bundle member {name!r} is not a regular file ({entry.kind})")
        member = expected.get(name)
        if member is None:
            raise BundleError(f"bundle member {name!r} is not in the manifest")
        if name in verified.slots:
            raise BundleError(f"bundle member {name!r} appears twice")
        if entry.size != member.size:
            raise BundleError(f"bundle size mismatch for {name} (manifest {member.size}, archive {entry.size})")
        slot = f"m{len(verified.slots):06d}"
        verified.slots[name] = slot
        digest = hashlib.sha256()
        writer = staging.writer(slot) if staging is not None else None
        try:
            for chunk in entry.chunks():
                digest.update(chunk)
                if writer is not None:
                    writer.write(chunk)
        except OSError as exc:
            raise CacheDirError(f"cannot stage {name}: {exc.strerror or exc}") from exc
        finally:
            if writer is not None:
                writer.close()
        if digest.hexdigest() != member.sha256:
            raise BundleError(f"bundle checksum mismatch for {name}")
    missing = sorted(expected.keys() - verified.slots.keys())
    if missing:
        raise BundleError(f"bundle is missing member {missing[0]}")


def install(verified: Verified, *, stage_blobs: bool = False) -> Installed:
    """Move a verified bundle's files from its staging dir into the cache dir, all or nothing (BundleError).

    Identical existing files are left alone; a replaced file or symlink is swapped by a rename, never
    written through. The blobs stay readable through :meth:`Verified.blob` until the bundle is closed;
    with ``stage_blobs`` they are installed too, as ``<PENDING_DIR>/<sha256>.bin`` (:func:`pending_path`:
    named by content, so two restores into one dir never take each other's), for a later process to load
    (``sync.load_staged``), and :meth:`Verified.blob` no longer reads them.
    A bundle file among the plugin's own names (``CACHEDIR.TAG``, the lock, the registrations, the graph
    record, the pending dir: :data:`.cachedir.OUR_NAMES`) is refused, in any case (``cachedir.tag`` is the
    tag on a file system that ignores case): no save ever packs one.
    """
    staging = verified.staging
    if staging is None:
        raise ValueError("install() needs a bundle verified with a cache_dir")
    manifest = verified.manifest
    ours = {fold_path(name) for name in OUR_NAMES}  # as a file system that ignores case sees them
    for rel in manifest.file_paths:
        if fold_path(rel.split("/", 1)[0]) in ours:
            raise BundleError(f"refusing to unpack {printable(rel)}: the plugin's own name, not a cache file")
    by_path = {m.path: m for m in manifest.members}
    files = [
        (rel, verified.slots[FILES_DIR + rel], by_path[FILES_DIR + rel].size, by_path[FILES_DIR + rel].sha256)
        for rel in manifest.file_paths
    ]
    if stage_blobs:
        for name in manifest.blob_names:
            member = by_path[f"{BLOBS_DIR}{name}.bin"]
            files.append((pending_path(member.sha256), verified.slots[member.path], member.size, member.sha256))
    staging.check_installable(rel for rel, _, _, _ in files)
    return staging.install(_relocate_triton_groups(staging, files))


# triton's group file (``triton/<key>/__grp__<name>.json``) names its entry's files by absolute path, and takes
# the entry only where those files exist (``FileCacheManager.get_group``): a bundle holds the saving runner's
# paths, so on any other path (an isolated dir, another checkout) triton compiled the kernel again, or read the
# saving runner's files where that dir was still there. Installed with this cache dir's paths instead.
_GROUP = r"triton/([^/]+)/__grp__[^/]+\.json"
_GROUP_MAX = 1 << 20  # triton's are a few hundred bytes


def relocated_group(data: bytes, entry_dir: str) -> bytes | None:
    """Group file ``data`` with each child at its place in ``entry_dir`` (triton names a child by its file name;
    one that is no plain file name is dropped, so no path leaves the entry); None where ``data`` is no group
    file triton writes (then installed as it is: triton takes no entry from it)."""
    if len(data) > _GROUP_MAX:
        return None
    try:
        group = json.loads(data)
    except (ValueError, RecursionError):  # not JSON, or nested deeper than the parser goes
        return None
    children = group.get("child_paths") if isinstance(group, dict) else None
    if not isinstance(children, dict):
        return None
    plain = [name for name in children if name not in ("", ".", "..") and not set("/\\\0") & set(name)]
    return json.dumps({**group, "child_paths": {name: os.path.join(entry_dir, name) for name in plain}}).encode()


def _relocate_triton_groups(
    staging: Staging, files: list[tuple[str, str, int, str]]
) -> list[tuple[str, str, int, str]]:
    """``files`` (rel, slot, size, sha256) with each triton group file staged again, relocated."""
    out = []
    for number, (rel, slot, size, sha256) in enumerate(files):
        match = re.fullmatch(_GROUP, rel)
        try:
            data = None
            if match and size <= _GROUP_MAX:
                entry_dir = os.path.join(os.path.abspath(staging.cache_dir), "triton", match.group(1))
                data = relocated_group(staging.read(slot), entry_dir)
            if data is not None:
                slot = f"g{number:06d}"
                with staging.writer(slot) as fh:
                    fh.write(data)
                size, sha256 = len(data), hashlib.sha256(data).hexdigest()
        except OSError as exc:
            raise CacheDirError(f"cannot stage {rel}: {exc.strerror or exc}") from exc
        out.append((rel, slot, size, sha256))
    return out


def uninstall(verified: Verified) -> None:
    """Take back what :func:`install` put into the cache dir (best effort: its new files and dirs out, the
    files it replaced back), before the bundle is closed: a bundle whose blobs torch rejects leaves nothing."""
    if verified.staging is not None:
        verified.staging.undo()


def pending_path(sha256: str) -> str:
    """Where :func:`install` with ``stage_blobs`` puts the mega-cache blob of that SHA-256 (relative)."""
    return f"{PENDING_DIR}/{sha256}.bin"


# --- packing -----------------------------------------------------------------------------------------------


class _HashingReader:
    """Reads from ``fh`` and hashes what passed; tarfile copies exactly ``size`` bytes through it."""

    def __init__(self, fh: BinaryIO) -> None:
        self._fh = fh
        self.digest = hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self._fh.read(size)
        self.digest.update(data)
        return data


class _HashingWriter:
    def __init__(self, fh: BinaryIO) -> None:
        self._fh = fh
        self.digest = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        self._fh.write(data)
        self.digest.update(data)
        self.size += len(data)
        return len(data)

    def flush(self) -> None:
        self._fh.flush()


def _cache_file_names(files: Iterable[str], on_skip: SkipNote | None) -> list[str]:
    names: list[str] = []
    for rel in files:
        reason = unsafe_member_reason(rel) if isinstance(rel, str) else "not a string"
        if reason in _UNPACKABLE:
            # A legal file name no bundle can carry: skipping it costs one compile; a bundle every restore
            # refuses would cost them all.
            if on_skip is not None:
                on_skip(rel.encode("utf-8", "backslashreplace").decode("ascii", "backslashreplace"), reason or "")
            continue
        if reason is not None:
            raise BundleError(f"cache file path {rel!r} escapes the cache dir ({reason})")
        names.append(rel)
    return sorted(set(names))


def _tar_info(path: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(path)
    # Fixed metadata: the bundle's content depends only on the members, not on who packed it.
    info.size, info.mode, info.mtime = size, 0o644, 0
    return info


def _write_payload(
    out: BinaryIO, blobs: Mapping[str, bytes], cache_dir: Path, files: list[str]
) -> tuple[list[Member], int, str]:
    """Stream the tar of blobs and cache files through zstd into ``out``; return members, size, sha256."""
    members: list[Member] = []
    hashing = _HashingWriter(out)
    with cache_root(cache_dir) as root_fd:
        entries = sorted([(f"{BLOBS_DIR}{n}.bin", n) for n in blobs] + [(f"{FILES_DIR}{r}", r) for r in files])
        with (
            compressor().stream_writer(cast(BinaryIO, hashing), closefd=False) as zwriter,
            tarfile.open(fileobj=zwriter, mode="w|", format=tarfile.PAX_FORMAT) as archive,
        ):
            for path, name in entries:
                if path.startswith(BLOBS_DIR):
                    data = bytes(blobs[name])
                    archive.addfile(_tar_info(path, len(data)), io.BytesIO(data))
                    members.append(Member(path, len(data), hashlib.sha256(data).hexdigest()))
                    continue
                fd = open_cache_file(root_fd, name)
                if fd is None:
                    continue
                with os.fdopen(fd, "rb") as fh:
                    size = os.fstat(fh.fileno()).st_size
                    reader = _HashingReader(fh)
                    try:
                        archive.addfile(_tar_info(path, size), reader)
                    except OSError as exc:
                        raise BundleError(f"cannot read cache file {name!r}: {exc.strerror or exc}") from exc
                members.append(Member(path, size, reader.digest.hexdigest()))
    return members, hashing.size, hashing.digest.hexdigest()


def _write_all(fh: BinaryIO, data: bytes) -> None:
    """Write ``data`` in chunks. A module-level seam so tests can inject a failing writer."""
    view = memoryview(data)
    fh.writelines(view[start : start + CHUNK] for start in range(0, len(view), CHUNK))


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
    lineage: str = "",
    artifacts: Iterable[Artifact] = (),
    graphs: Mapping[str, Any] | None = None,
    on_skip: SkipNote | None = None,
) -> Manifest:
    """Write a bundle to ``dest`` atomically and return its manifest.

    ``lineage`` is the restore prefix the bundle is saved for (``<key prefix>-<digest>-``); ``key`` must start
    with it. ``files`` are POSIX paths relative to ``cache_dir``, read through dir fds (no link followed). A
    file that vanished meanwhile is skipped (torch may delete cache entries while we read); a name no bundle
    can carry (not UTF-8, control characters) is skipped and reported to ``on_skip(name, reason)``. A path
    that escapes ``cache_dir`` or names a link or a non-regular file raises :class:`BundleError`, as does any
    I/O failure. The payload is streamed (memory does not grow with the bundle) through a temp sibling of
    ``dest``; on failure no partial file or temp file remains.
    """
    check_signing_key(signing_key)
    for name in blobs:
        if not isinstance(name, str) or not BLOB_NAME.fullmatch(name):
            raise BundleError(f"invalid blob name {name!r} (use [A-Za-z0-9._-], not starting with '.')")
    names = _cache_file_names(files, on_skip)
    normalised_stats = json_object(stats, "stats")
    normalised_graphs = json_object(graphs or {}, "graphs")
    dest = Path(dest)
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BundleError(f"cannot write bundle {dest}: {exc.strerror or exc}") from exc
    payload_path = dest.parent / temp_name("tmp", lead=f".{dest.name[:120]}.payload.")
    try:
        try:
            with open(payload_path, "xb") as out:
                members, payload_size, payload_sha256 = _write_payload(out, blobs, Path(cache_dir), names)
        except OSError as exc:
            raise BundleError(f"cannot write bundle {dest}: {exc.strerror or exc}") from exc
        manifest = Manifest(
            format=FORMAT_VERSION,
            key=key,
            lineage=lineage,
            fingerprint={str(k): str(v) for k, v in fingerprint.items()},
            digest=digest,
            plugin_version=__version__,
            torch_version=torch_version,
            created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            members=tuple(members),
            artifacts=tuple(artifacts),
            graphs=normalised_graphs,
            stats=normalised_stats,
            payload_size=payload_size,
            payload_sha256=payload_sha256,
        )
        try:
            manifest_bytes = manifest.to_json_bytes()
        except (TypeError, ValueError) as exc:
            raise BundleError(f"bundle manifest cannot be written: {exc}") from None
        # Never write a bundle that its own reader would refuse (an empty key, a key outside its lineage...).
        Manifest.from_json_bytes(manifest_bytes)
        signature = sign(manifest_bytes, signing_key) if signing_key is not None else ""
        try:
            with atomic_file(dest) as fh, open(payload_path, "rb") as payload:
                _write_all(fh, header_bytes(manifest_bytes, signature))
                while chunk := payload.read(CHUNK):
                    _write_all(fh, chunk)
        except OSError as exc:
            raise BundleError(f"cannot write bundle {dest}: {exc.strerror or exc}") from exc
    finally:
        with contextlib.suppress(OSError):
            os.unlink(payload_path)
    return manifest
