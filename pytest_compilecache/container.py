"""The bundle container: header, signature, zstd compression and a strict streaming tar, in bounded memory.

Container format (version 2; integers are unsigned 32-bit big-endian)::

    offset      size  content
    0           8     MAGIC  b"PTCCBNDL"
    8           4     format version (2)
    12          4     M = manifest length (1 .. 64 MiB)
    16          M     manifest: canonical JSON, ASCII (Manifest.to_json_bytes)
    16+M        32    SHA-256 of the manifest bytes (integrity when no signing key is configured)
    48+M        4     S = signature length (0: unsigned, or 64)
    52+M        S     ASCII hex HMAC-SHA256(signing key, manifest bytes)
    52+M+S      rest  payload: one zstd frame of an uncompressed POSIX (pax) tar

The header can be read and authenticated without touching the payload (:func:`read_header`,
:func:`check_signature`). The payload is read once, as a stream: :class:`PayloadReader` hashes the compressed
bytes as zstd pulls them, :func:`iter_tar` parses the tar with its own strict reader (regular files, pax
``path``/``size`` records of bounded size, nothing else) and hands out each member's bytes in chunks. No step
holds more than :data:`CHUNK` bytes of content or :data:`MAX_PAX` bytes of header in memory, whatever sizes the
bundle declares; decompression stops at a caller-given limit (a zip bomb is an error, not an allocation).
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import hashlib
import hmac
import io
import re
import struct
import tarfile
from dataclasses import dataclass
from typing import IO
from typing import BinaryIO
from typing import Iterator
from typing import cast

import zstandard

from ._env import SIGNING_KEY_ENV
from .errors import BundleError
from .errors import ConfigError
from .manifest import FORMAT_VERSION

__all__ = [
    "CHUNK",
    "HEAD_PROBE",
    "MAGIC",
    "SIGNING_KEY_ENV",
    "Header",
    "PayloadReader",
    "TarEntry",
    "check_signature",
    "check_signing_key",
    "compressor",
    "header_bytes",
    "header_size",
    "iter_tar",
    "read_header",
    "sign",
    "tar_limit",
]

MAGIC = b"PTCCBNDL"
CHUNK = 1024 * 1024
MAX_MANIFEST = 16 * 1024 * 1024  # a member entry is ~200 bytes, 'graphs' at most 4 MiB: 16 MiB is ample
# What a reader that wants only the header fetches first: most headers fit (then one request is all), a bigger
# one says its size in its first 16 bytes (then one more, of header_size() bytes).
HEAD_PROBE = 64 * 1024
_PAX_SIZE = re.compile(r"[0-9]{1,19}")
MAX_PAX = 64 * 1024  # one pax extended header: a path (<= 4000 bytes) and a few numbers fit many times
ZSTD_LEVEL = 10
# A frame may ask the decoder for a window of up to 2 GiB; we write 8 MiB windows and accept at most 16 MiB.
ZSTD_WINDOW_LOG = 23
MAX_WINDOW = 1 << 24

_U32 = struct.Struct(">I")
_SHA256_LEN = 32
_SIGNATURE_LEN = 64  # hex of a 32-byte HMAC-SHA256
_BLOCK = 512
_ZERO_BLOCK = bytes(_BLOCK)


@dataclass(frozen=True)
class Header:
    """Everything before the payload: the manifest bytes (checksum verified), the signature, the payload offset."""

    manifest_bytes: bytes
    signature: bytes
    payload_offset: int


# --- header and signature ---------------------------------------------------------------------------------


def sign(manifest_bytes: bytes, signing_key: bytes) -> str:
    """Hex HMAC-SHA256 of the manifest bytes."""
    return hmac.new(signing_key, manifest_bytes, hashlib.sha256).hexdigest()


def check_signing_key(signing_key: bytes | None) -> None:
    """An empty HMAC key authenticates nothing: a configuration mistake (ConfigError), not "no key"."""
    if signing_key is not None and not signing_key:
        raise ConfigError(f"{SIGNING_KEY_ENV}: the signing key must not be empty")


def header_bytes(manifest_bytes: bytes, signature: str) -> bytes:
    """The container header for ``manifest_bytes`` and a hex ``signature`` ("" for unsigned)."""
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


def _read_exact(fh: BinaryIO, size: int) -> bytes:
    data = fh.read(size)
    if len(data) != size:
        raise BundleError("bundle is truncated")
    return data


def header_size(start: bytes) -> int:
    """How many leading bytes of a bundle hold its whole header at most (the signature at its longest), from
    its first 16 bytes or more: what a reader that fetches only the header (:func:`read_header` then needs
    nothing else) asks a store for. BundleError as :func:`read_header` for a bad magic, format or manifest
    length, or fewer than 16 bytes."""
    manifest_len = _read_prefix(io.BytesIO(start[:16]))
    return 16 + manifest_len + _SHA256_LEN + _U32.size + _SIGNATURE_LEN


def read_header(fh: BinaryIO) -> Header:
    """Read up to the payload and check the manifest checksum; BundleError on anything else.

    OSError from ``fh`` propagates (the caller names the file).
    """
    manifest_len = _read_prefix(fh)
    manifest_bytes = _read_exact(fh, manifest_len)
    if not hmac.compare_digest(_read_exact(fh, _SHA256_LEN), hashlib.sha256(manifest_bytes).digest()):
        raise BundleError("bundle manifest checksum mismatch")
    (signature_len,) = _U32.unpack(_read_exact(fh, _U32.size))
    if signature_len not in (0, _SIGNATURE_LEN):
        raise BundleError(f"bundle signature length {signature_len} is invalid")
    signature = _read_exact(fh, signature_len)
    return Header(manifest_bytes, signature, 16 + manifest_len + _SHA256_LEN + _U32.size + signature_len)


def _read_prefix(fh: BinaryIO) -> int:
    """Magic, format and manifest length (the first 16 bytes); return the length."""
    magic = fh.read(len(MAGIC))
    if magic != MAGIC:
        if MAGIC.startswith(magic):
            raise BundleError("bundle is truncated")
        raise BundleError("not a pytest-compilecache bundle (bad magic)")
    (version,) = _U32.unpack(_read_exact(fh, _U32.size))
    if version != FORMAT_VERSION:
        raise BundleError(
            f"bundle format {version} is not supported (expected {FORMAT_VERSION}; older bundles mean a cold compile)"
        )
    (manifest_len,) = _U32.unpack(_read_exact(fh, _U32.size))
    if not 0 < manifest_len <= MAX_MANIFEST:
        raise BundleError(f"bundle manifest length {manifest_len} is out of range")
    return int(manifest_len)


def check_signature(header: Header, signing_key: bytes | None) -> None:
    """With a key: the signature must be present and match (constant time). Without: nothing is checked."""
    if signing_key is None:
        return  # No key configured: a signature, if any, is not checked (the checksums still are).
    if not header.signature:
        raise BundleError(f"bundle signature missing ({SIGNING_KEY_ENV} is set)")
    if not hmac.compare_digest(header.signature, sign(header.manifest_bytes, signing_key).encode("ascii")):
        raise BundleError(f"bundle signature mismatch (wrong {SIGNING_KEY_ENV} or tampered manifest)")


# --- payload ------------------------------------------------------------------------------------------------


class PayloadReader:
    """Reads exactly ``size`` payload bytes from ``fh``, hashing them; zstd pulls from it with ``read``."""

    def __init__(self, fh: BinaryIO, size: int, sha256: str) -> None:
        self._fh = fh
        self._left = size
        self._sha256 = sha256
        self._digest = hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        if self._left <= 0:
            return b""
        want = self._left if size < 0 else min(size, self._left)
        data = self._fh.read(min(want, CHUNK))
        self._left -= len(data)
        self._digest.update(data)
        if not data:
            self._left = -1  # truncated: remembered for finish()
        return data

    def readable(self) -> bool:
        return True

    def finish(self) -> None:
        """Read whatever zstd left, then check length, trailing data and checksum (BundleError)."""
        while self.read(CHUNK):
            pass
        if self._left < 0:
            raise BundleError("bundle is truncated")
        if self._fh.read(1):
            raise BundleError("bundle has trailing data after its payload")
        if self._digest.hexdigest() != self._sha256:
            raise BundleError("bundle payload checksum mismatch")


class _Inflater:
    """zstd output with a hard limit on the total; every read is at most :data:`CHUNK` bytes."""

    def __init__(self, source: PayloadReader, limit: int) -> None:
        decompressor = zstandard.ZstdDecompressor(max_window_size=MAX_WINDOW)
        # PayloadReader has the one method zstd calls on a source: read().
        self._reader = decompressor.stream_reader(cast(IO[bytes], source), read_size=CHUNK, read_across_frames=True)
        self._limit = limit
        self.total = 0

    def read(self, size: int) -> bytes:
        try:
            data = self._reader.read(min(size, CHUNK))
        except zstandard.ZstdError as exc:
            raise BundleError(f"bundle payload is not valid zstd: {str(exc)[:200]}") from None
        self.total += len(data)
        if self.total > self._limit:
            raise BundleError("bundle payload is larger than its manifest declares")
        return data

    def read_exact(self, size: int) -> bytes:
        parts: list[bytes] = []
        while size > 0:
            data = self.read(size)
            if not data:
                raise BundleError("bundle payload is not a valid tar archive (unexpected end of data)")
            parts.append(data)
            size -= len(data)
        return b"".join(parts)


def tar_limit(sizes: list[tuple[str, int]]) -> int:
    """Most tar bytes members of these (path, size) can take: content, pax and ustar headers, end records."""
    overhead = sum(3 * _BLOCK + _BLOCK + 2 * len(path.encode("utf-8", "replace")) for path, _ in sizes)
    return sum(size for _, size in sizes) + overhead + 2 * tarfile.RECORDSIZE


def compressor() -> zstandard.ZstdCompressor:
    """The one zstd setting bundles are written with: single-threaded (deterministic, does not compete with
    the test session) and an 8 MiB window (what readers accept, see :data:`MAX_WINDOW`)."""
    params = zstandard.ZstdCompressionParameters.from_level(ZSTD_LEVEL, window_log=ZSTD_WINDOW_LOG, threads=0)
    return zstandard.ZstdCompressor(compression_params=params)


# --- tar ------------------------------------------------------------------------------------------------------


_KINDS = {
    b"2": "symlink",
    b"1": "hardlink",
    b"5": "directory",
    b"3": "device",
    b"4": "device",
    b"6": "fifo",
}


@dataclass
class TarEntry:
    """One tar member as it streams by. Read its content with :meth:`chunks` (once) before the next entry."""

    name: str
    size: int
    kind: str  # "file", "symlink", "hardlink", "directory", "device", "fifo" or "type 'X'"
    _inflater: _Inflater
    _left: int = 0

    def chunks(self) -> Iterator[bytes]:
        while self._left > 0:
            data = self._inflater.read(min(self._left, CHUNK))
            if not data:
                raise BundleError("bundle payload is not a valid tar archive (unexpected end of data)")
            self._left -= len(data)
            yield data

    def _skip(self) -> None:
        for _ in self.chunks():
            pass
        padding = -self.size % _BLOCK
        if padding:
            self._inflater.read_exact(padding)


def _invalid(why: str) -> BundleError:
    return BundleError(f"bundle payload is not a valid tar archive ({why})")


def _number(field: bytes) -> int:
    if field[:1] and field[0] & 0x80:  # GNU base-256
        value = int.from_bytes(field[1:], "big")
        if field[0] & 0x40:
            raise _invalid("negative number")
        return value
    text = field.rstrip(b"\x00 ").lstrip(b" ")
    if not text:
        return 0
    if not all(48 <= c <= 55 for c in text):
        raise _invalid("bad number field")
    return int(text, 8)


def _text(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BundleError(f"bundle has a member {what} that is not valid UTF-8") from None


def _pax_records(data: bytes) -> dict[str, str]:
    records: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        space = data.find(b" ", pos, pos + 21)
        if space < 0 or not data[pos:space].isdigit():
            raise _invalid("bad pax record")
        length = int(data[pos:space])
        end = pos + length
        if length <= space - pos + 1 or end > len(data) or data[end - 1 : end] != b"\n":
            raise _invalid("bad pax record")
        key, equals, value = data[space + 1 : end - 1].partition(b"=")
        if not equals:
            raise _invalid("bad pax record")
        records[_text(key, "pax key")] = _text(value, "pax value")
        pos = end
    return records


def iter_tar(payload: PayloadReader, limit: int) -> Iterator[TarEntry]:
    """Stream the tar inside the zstd payload, one entry at a time; BundleError on anything unexpected.

    Accepted: ustar headers with valid checksums, pax ``x`` headers (at most :data:`MAX_PAX` bytes; ``path``
    and ``size`` are applied, GNU sparse records and ``hdrcharset`` refused, other records ignored), then the
    end-of-archive: zero bytes up to the end of the stream. Everything else (global headers, GNU long names,
    sparse files) is refused. Entries that are not regular files are yielded with their ``kind`` so the caller
    can name them. After the last entry the whole zstd stream has been consumed (at most ``limit`` bytes).
    """
    inflater = _Inflater(payload, limit)
    pax: dict[str, str] = {}
    while True:
        block = inflater.read_exact(_BLOCK)
        if block == _ZERO_BLOCK:
            break
        stored = _number(block[148:156])
        computed = sum(block[:148]) + 8 * 32 + sum(block[156:])
        if stored != computed:
            raise _invalid("bad header checksum")
        typeflag = block[156:157]
        size = _number(block[124:136])
        if typeflag == b"x":
            if pax:
                raise _invalid("two pax headers in a row")
            if size > MAX_PAX:
                raise _invalid(f"pax header of {size} bytes")
            data = inflater.read_exact(size)
            inflater.read_exact(-size % _BLOCK)
            pax = _pax_records(data)
            if any(k.startswith("GNU.sparse") for k in pax) or "hdrcharset" in pax:
                raise _invalid("sparse or non-UTF-8 pax records")
            if not pax:
                raise _invalid("empty pax header")
            continue
        if typeflag not in (b"0", b"\x00", *_KINDS):
            raise _invalid(f"unsupported member type {typeflag.decode('latin-1')!r}")
        name = block[0:100].split(b"\x00", 1)[0]
        if block[257:263] == b"ustar\x00":
            prefix = block[345:500].split(b"\x00", 1)[0]
            if prefix:
                name = prefix + b"/" + name
        text = _text(name, "name")
        if "path" in pax:
            text = pax["path"]
        if "size" in pax:
            if not _PAX_SIZE.fullmatch(pax["size"]):  # ASCII digits only: str.isdigit() takes "²" (int() does not)
                raise _invalid("bad pax size")
            size = int(pax["size"])
        pax = {}
        kind = "file" if typeflag in (b"0", b"\x00") else _KINDS[typeflag]
        if kind == "directory":
            text = text.rstrip("/")  # tar writes dir names with a trailing slash
        if kind != "file":
            size = 0  # the caller refuses it before reading: links, dirs and devices carry no content for us
        entry = TarEntry(text, size, kind, inflater, size)
        yield entry
        entry._skip()
    if pax:
        raise _invalid("pax header without a member")
    # End of archive: the rest (a second zero block and record padding) must be zeros.
    while data := inflater.read(CHUNK):
        if data.count(0) != len(data):
            raise BundleError("bundle payload has data after the end of its tar archive")
