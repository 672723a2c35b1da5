"""torch's precompiled C++ headers: find the ones a session used, carry them, install them on a fresh runner.

Why this exists. On CPU, torch (2.8+, ``torch/_inductor/codecache.py``) compiles every C++ kernel with
``-include <dir>/<hash>.h``, where ``<hash>.h.gch`` is a ~150 MB precompiled header built by
``_precompile_header``. That function runs once per process for every header it is asked for (it is a
``functools.cache``), from ``CppCodeCache.load_async`` for every kernel key not yet in memory, *before* the
kernel binary is looked up on disk: it preprocesses the header (``g++ -E``), hashes the result (``openssl
sha512``), names the file after the hash of the command line, the preprocessed text and the compiler version,
and compiles it unless the file exists. So a fresh CI runner whose cache dir was fully restored still spends
seconds of g++ on a header it needs for no kernel at all. The header's path is part of no kernel or FX key.

Where the headers go (the design decision). torch keeps them in
``_HEADER_DIR = <tempfile.gettempdir()>/torchinductor_<user>/precompiled_headers``, fixed when
``codecache`` is imported and deliberately outside ``TORCHINDUCTOR_CACHE_DIR`` (torch's comment: the headers
"need to be global"). We restore into that same directory rather than pointing torch at a directory inside
the cache dir, because:

* it needs no private torch state: :func:`header_dir` mirrors ``default_cache_dir()`` without importing torch,
  and pointing torch elsewhere would mean rewriting ``codecache._HEADER_DIR`` in every process before its
  first compile, which the plugin cannot do for xdist workers' subprocesses, tests that spawn Python, or
  torch's own compile workers;
* it works the same on every torch that has the feature, and is a no-op on those that do not (2.7: nothing
  ever appears in the directory, so nothing is found, described or installed);
* a header is tied to the compiler, the flags and the torch install, all of which its name already hashes,
  so one directory can hold several without conflict, and a header that does not match is simply never
  looked up;
* the cache dir stays what torch and the bundles expect (no 150 MB file inside every whole-dir archive).

What we never do there: overwrite or delete a file (an existing header was built by torch, or by us earlier;
it is not provably ours), follow a symlink, or write a name that is not torch's (``c`` + 51 base32 chars +
``.h.gch``/``.h.pch``). Only the compiled file travels: torch writes the tiny ``<hash>.h`` itself (its content
is a single ``#include`` line) before it looks for the compiled file.

A carried header that gcc will not use (another compiler build, other flags) costs what it costs today:
gcc ignores an invalid ``.gch`` (it reports it only under ``-Winvalid-pch``) and parses the text header.

This module never imports torch: everything here is files and hashes. Transport is zstd (level 3, ~150 MB to
~21 MB in about a second), streamed in both directions so memory stays bounded.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import contextlib
import getpass
import hashlib
import os
import re
import stat
import tempfile
import time
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any
from typing import BinaryIO
from typing import Iterable
from typing import Mapping

from ._fs import atomic_file
from ._fs import try_flock
from .errors import HeaderError

if TYPE_CHECKING:
    from .stores.base import Store

__all__ = [
    "KIND",
    "HeaderArtifact",
    "HeaderError",
    "HeaderTransfer",
    "compress",
    "describe",
    "find_used",
    "header_dir",
    "install",
    "is_header_name",
    "object_key",
    "restore_headers",
    "save_headers",
    "session_start",
    "verify",
]

KIND = "precompiled_header"
"""The ``kind`` of a precompiled-header artifact in a bundle manifest."""

# torch's code_hash(): "c" + the first 51 characters of the lower-case base32 SHA-256 (2.5-2.15), then
# ".h" and the compiler's extension: ".gch" for gcc, ".pch" for clang (cpp_builder's
# __get_precompiled_header_flags).
_NAME = re.compile(r"c[a-z2-7]{51}\.h\.(?:gch|pch)")
_KEY_CHARS = re.compile(r"[A-Za-z0-9._-]+")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_CHUNK = 1 << 20
ZSTD_LEVEL = 3
MAX_SIZE = 4 << 30
"""The largest header we describe or install (a real one is ~150 MB); larger is refused, not truncated."""


@dataclass(frozen=True)
class HeaderArtifact:
    """One compiled header as a bundle manifest names it: ``{kind, name, sha256, size}`` (of the raw file)."""

    name: str
    sha256: str
    size: int
    kind: str = KIND

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "sha256": self.sha256, "size": self.size}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> HeaderArtifact:
        """Validate a manifest entry; raise HeaderError naming what is wrong (never trust a manifest's shape)."""
        kind, name, digest, size = data.get("kind"), data.get("name"), data.get("sha256"), data.get("size")
        if kind != KIND:
            raise HeaderError(f"not a {KIND} artifact: kind={kind!r}")
        if not isinstance(name, str) or not is_header_name(name):
            raise HeaderError(f"not a precompiled-header name: {name!r}")
        if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
            raise HeaderError(f"bad sha256 for {name}: {digest!r}")
        if not isinstance(size, int) or isinstance(size, bool) or not 0 < size <= MAX_SIZE:
            raise HeaderError(f"bad size for {name}: {size!r}")
        return cls(name=name, sha256=digest, size=size)


def is_header_name(name: str) -> bool:
    """True for the file names torch gives compiled headers (and nothing else: no dirs, no dots, no links)."""
    return bool(_NAME.fullmatch(name))


def header_dir(tmp: str | os.PathLike[str] | None = None) -> Path:
    """torch's precompiled-header dir for this process, computed as torch does, without importing torch.

    ``<tempfile.gettempdir()>/torchinductor_<user>/precompiled_headers`` (``default_cache_dir()`` in
    ``torch/_inductor/runtime/cache_dir_utils.py``, 2.8-2.15). It follows ``TMPDIR``, never
    ``TORCHINDUCTOR_CACHE_DIR``. Call it in the process whose environment the tests run with: xdist workers
    inherit the controller's ``TMPDIR``, so the controller's answer is theirs. ``tmp`` gives the answer for
    a process whose TMPDIR is ``tmp`` instead (a benchmark's simulated fresh runner).
    """
    try:
        user = getpass.getuser()
    except (KeyError, ModuleNotFoundError, OSError):
        getuid = getattr(os, "getuid", None)
        user = f"uid_{getuid()}" if callable(getuid) else "unknown_user"
    user = re.sub(r'[\\/:*?"<>|]', "_", user)
    return Path(tmp if tmp is not None else tempfile.gettempdir()) / f"torchinductor_{user}" / "precompiled_headers"


def find_used(directory: Path, since: float, installed: Iterable[str] = ()) -> list[Path]:
    """The compiled headers in ``directory`` that this session's processes used, sorted by name.

    A header counts when it was built since ``since`` (its mtime: torch compiled it this session), read since
    then (its atime, where the file system records reads: gcc read it for a kernel), or installed by this
    session's restore (``installed``: names; torch found it and skipped its build). Take ``since`` from
    :func:`time.time` before the first test, minus a second for file systems with coarse timestamps.

    Not found: a header that was on this machine before the session and that no kernel build read (a warm
    persistent machine): then this bundle names no header, and a fresh runner restoring it builds the header
    once, as before. Skipped: symlinks, names that are not torch's, empty files, and headers whose build lock
    another process holds right now (gcc writes the file in place, and a truncated PCH is a fatal error for
    every kernel build that includes it, not a fallback). A missing dir is an empty list.
    """
    if os.name == "nt":  # torch precompiles no header on Windows (codecache asserts it)
        return []
    keep = set(installed)
    found: list[Path] = []
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
    except OSError:
        return []
    for entry in entries:
        if not is_header_name(entry.name):
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISREG(info.st_mode) or info.st_size == 0:
            continue
        used = entry.name in keep or info.st_mtime >= since or info.st_atime >= since
        if used and not _being_built(Path(directory), entry.name):
            found.append(Path(entry.path))
    return found


def describe(path: Path) -> HeaderArtifact:
    """Hash one header file (streamed) into its manifest entry; HeaderError when it cannot be read."""
    if not is_header_name(path.name):
        raise HeaderError(f"not a precompiled-header name: {path.name!r}")
    digest = hashlib.sha256()
    size = 0
    try:
        with _open_regular(path) as fh:
            for chunk in iter(lambda: fh.read(_CHUNK), b""):
                digest.update(chunk)
                size += len(chunk)
                if size > MAX_SIZE:
                    raise HeaderError(f"{path.name} is larger than {MAX_SIZE} bytes")
    except OSError as exc:
        raise HeaderError(f"cannot read {path}: {exc.strerror or exc}") from None
    if size == 0:
        raise HeaderError(f"{path.name} is empty")
    return HeaderArtifact(name=path.name, sha256=digest.hexdigest(), size=size)


def packed_bound(size: int) -> int:
    """The most bytes a ``size``-byte header can take as :func:`compress` writes it (zstd's worst case, for
    data that does not compress, is a little over ``size``)."""
    return size + size // 64 + (1 << 16)


def compress(path: Path, dest: BinaryIO, expected: HeaderArtifact | None = None) -> int:
    """Stream ``path`` as one zstd frame (level 3) into ``dest``; return the compressed byte count.

    With ``expected``, the bytes read are hashed on the way and HeaderError is raised when they are not the
    described ones (torch or another session replaced the file between :func:`describe` and now); the
    caller then discards ``dest``.
    """
    import zstandard  # only when a header moves: the plugin imports this module in every saving session

    digest = hashlib.sha256()
    size = 0
    compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
    try:
        with _open_regular(path) as src:
            writer = compressor.stream_writer(dest, closefd=False)
            for chunk in iter(lambda: src.read(_CHUNK), b""):
                digest.update(chunk)
                size += len(chunk)
                writer.write(chunk)
            writer.flush(zstandard.FLUSH_FRAME)
            written = writer.tell()
    except OSError as exc:
        raise HeaderError(f"cannot read {path}: {exc.strerror or exc}") from None
    if expected is not None and (digest.hexdigest(), size) != (expected.sha256, expected.size):
        raise HeaderError(f"{path.name} changed while it was being packed")
    return int(written)


def install(artifact: HeaderArtifact, compressed: BinaryIO, directory: Path) -> bool:
    """Install one verified header from its zstd stream into ``directory``; True when a file was added.

    Returns False, touching nothing, when the file is already there (torch's or ours: never overwritten) or
    when torch holds the header's build lock right now (it is building that very file). Otherwise the stream is
    decompressed into a temp sibling, hashed and size-checked on the way (at most ``artifact.size`` bytes are
    ever written), and published with ``os.replace`` only when both match: a reader sees no file or the whole
    verified file. Raises HeaderError (one line) for a bad name, a symlinked or foreign directory, a stream
    that is not zstd, or content that is not the artifact's; the directory is then unchanged.
    """
    if not is_header_name(artifact.name) or artifact.kind != KIND:
        raise HeaderError(f"not a precompiled-header artifact: {artifact.name!r}")
    if os.name == "nt":
        raise HeaderError("torch precompiles no header on Windows")
    _ensure_dir(directory)
    dest = directory / artifact.name
    if os.path.lexists(dest):
        return False
    with _build_lock(directory, artifact.name) as held:
        if not held or os.path.lexists(dest):
            return False
        try:
            with atomic_file(dest, fsync=False) as out:
                _copy_verified(artifact, compressed, out)
        except OSError as exc:
            raise HeaderError(f"cannot install {artifact.name}: {exc.strerror or exc}") from None
    return True


def verify(artifact: HeaderArtifact, compressed: BinaryIO) -> None:
    """Check that a zstd stream holds exactly ``artifact`` (size and sha256) without writing it anywhere.

    For a header object that is about to be stored again under its content key (the Action's header entry,
    saved by ``actions/cache`` from a file this run did not install from); :func:`install` verifies on its
    own. Raises HeaderError (one line) when the stream is not zstd or its content is not the artifact's.
    """
    with open(os.devnull, "wb") as sink:
        _copy_verified(artifact, compressed, sink)


def object_key(prefix: str, sha256: str) -> str:
    """The store key of an artifact's content: ``<prefix>-artifact-<sha256>``, one object per content.

    Content-addressed, so a save uploads it only when the store lacks the key and every bundle naming the same
    bytes shares it. Raises ValueError for a prefix or digest a store key cannot hold (``[A-Za-z0-9._-]``).
    ``artifact`` is not a hex word, so no such key starts with a bundle's ``<prefix>-<hex digest>`` restore
    prefix; but a listing or prune over the bare ``<prefix>`` sees these objects too: prune bundles by their
    own prefix, and drop an artifact only when no kept bundle's manifest names its sha256.
    """
    if not _SHA256.fullmatch(sha256):
        raise ValueError(f"not a sha256 hex digest: {sha256!r}")
    key = f"{prefix}-artifact-{sha256}"
    if not _KEY_CHARS.fullmatch(key):
        raise ValueError(f"store keys allow only [A-Za-z0-9._-]: {prefix!r}")
    return key


@dataclass
class HeaderTransfer:
    """What :func:`save_headers` or :func:`restore_headers` did, for the report; ``errors`` are warning lines."""

    artifacts: list[HeaderArtifact] = field(default_factory=list)
    transferred: list[str] = field(default_factory=list)  # names uploaded (save) or installed (restore)
    errors: list[str] = field(default_factory=list)


def save_headers(
    store: Store,
    prefix: str,
    since: float,
    installed: Iterable[str],
    scratch: Path,
    directory: Path | None = None,
    carried: Iterable[str] = (),
) -> HeaderTransfer:
    """Controller, at session end: describe the headers the session used and upload those the store lacks.

    ``artifacts`` are what the bundle manifest must name (``[a.to_json() for a in artifacts]``); a header that
    could not be read or uploaded is left out of it with one line in ``errors``, never failing the save.
    Each upload is one zstd object under :func:`object_key`, skipped when the store already has that key
    (content-addressed: once per store) or when the key is in ``carried``: objects that travel outside this
    store (the Action's own ``actions/cache`` entry for the header, keyed by that object key), which the
    manifest still names. ``scratch`` is a private temp dir of the caller's.
    """
    result = HeaderTransfer()
    elsewhere = set(carried)
    for path in find_used(directory or header_dir(), since, installed):
        try:
            artifact = describe(path)
            key = object_key(prefix, artifact.sha256)
            if key not in elsewhere and not any(entry.key == key for entry in store.list(key)):
                packed = scratch / key
                try:
                    with open(packed, "wb") as out:
                        compress(path, out, artifact)
                    store.put(key, packed)
                finally:
                    with contextlib.suppress(OSError):
                        packed.unlink()
                result.transferred.append(artifact.name)
            result.artifacts.append(artifact)
        except Exception as exc:  # a store or file problem costs this header, not the save
            result.errors.append(f"precompiled header {path.name} not saved: {_one_line(exc)}")
    return result


def restore_headers(
    store: Store, prefix: str, entries: Iterable[Mapping[str, Any]], scratch: Path, directory: Path | None = None
) -> HeaderTransfer:
    """Controller, at session start, before any test: install the headers a verified manifest names.

    ``entries`` are the manifest's artifacts (other kinds are ignored); the manifest must already be verified
    (checksums, signature), since its sha256 is what every downloaded byte is checked against. A header
    already present is not downloaded. Every failure (a bad entry, a store miss, content that does not match)
    is one line in ``errors`` and leaves the header dir as it was: torch then builds the header itself.
    ``transferred`` lists the installed names; ``artifacts`` every valid entry, installed or already present:
    pass ``[a.name for a in result.artifacts]`` to :func:`find_used` as ``installed`` at session end, so the
    next bundle names them again even though no kernel build read them.
    """
    result = HeaderTransfer()
    target = directory or header_dir()
    for entry in entries:
        if entry.get("kind") != KIND:
            continue
        try:
            artifact = HeaderArtifact.from_json(entry)
            result.artifacts.append(artifact)
            if os.path.lexists(target / artifact.name):
                continue
            key = object_key(prefix, artifact.sha256)
            packed = scratch / key
            try:
                # Sized before it is fetched: a store object is anyone's who can write the store, and only
                # the manifest's size (verified with the bundle) bounds what a header can take packed.
                listed = [found.size for found in store.list(key) if found.key == key]
                if not listed:
                    raise HeaderError(f"{key} is not in the store")
                if listed[0] > packed_bound(artifact.size):
                    raise HeaderError(f"{key} is {listed[0]} bytes: more than a {artifact.size}-byte header packs to")
                if not store.get(key, packed, limit=packed_bound(artifact.size)):
                    raise HeaderError(f"{key} is not in the store")
                with open(packed, "rb") as fh:
                    if install(artifact, fh, target):
                        result.transferred.append(artifact.name)
            finally:
                with contextlib.suppress(OSError):
                    packed.unlink()
        except Exception as exc:  # infrastructure trouble: torch builds the header as it would without us
            result.errors.append(f"precompiled header {entry.get('name')!r} not restored: {_one_line(exc)}")
    return result


def _one_line(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if not isinstance(exc, HeaderError) else text


# --------------------------------------------------------------------------- internals


def _open_regular(path: Path) -> BinaryIO:
    """Open a regular file for reading without following a symlink at its last component."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise HeaderError(f"{path} is not a regular file")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _ensure_dir(directory: Path) -> None:
    """Create torch's header dir (and its parent) like torch would; refuse symlinks and other users' dirs.

    ``torchinductor_<user>`` sits in a shared TMPDIR: a dir planted there by someone else (or a link to
    elsewhere) must not receive code that gcc will load.
    """
    for path in (directory.parent, directory):
        try:
            os.mkdir(path)
        except FileExistsError:
            pass
        except OSError as exc:
            raise HeaderError(f"cannot create {path}: {exc.strerror or exc}") from None
        info = os.lstat(path)
        if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
            raise HeaderError(f"{path} is not a plain directory; not installing precompiled headers there")
        if hasattr(os, "getuid") and info.st_uid != os.getuid():
            raise HeaderError(f"{path} belongs to another user; not installing precompiled headers there")


@contextlib.contextmanager
def _build_lock(directory: Path, name: str):  # type: ignore[no-untyped-def]
    """torch's own lock for this header (``locks/<hash>.lock``, a ``filelock`` flock), taken without waiting.

    Yields False when torch holds it: torch is building this very header and will publish it itself.
    """
    import fcntl  # POSIX only, like torch's precompiled headers

    locks = directory / "locks"
    try:
        os.makedirs(locks, exist_ok=True)
        fd = os.open(locks / _lock_name(name), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666)
    except OSError as exc:
        raise HeaderError(f"cannot lock {name}: {exc.strerror or exc}") from None
    try:
        try:
            taken = try_flock(fd)
        except OSError as exc:
            raise HeaderError(f"cannot lock {name}: {exc.strerror or exc}") from None
        if not taken:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _being_built(directory: Path, name: str) -> bool:
    """True when torch's build lock for this header exists and another process holds it (never creates it)."""
    try:
        fd = os.open(directory / "locks" / _lock_name(name), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False  # no lock file: torch never started building this header here
    try:
        return not try_flock(fd, shared=True)
    except OSError:
        return True  # a lock we cannot even probe: treat it as held, never install under it
    finally:
        os.close(fd)  # closing drops the probe's own lock, if it got one


def _lock_name(name: str) -> str:
    # torch: os.path.join(_HEADER_LOCK_DIR, f"{header_hash}.lock"); header_hash is the name before ".h".
    return name.split(".", 1)[0] + ".lock"


def _copy_verified(artifact: HeaderArtifact, compressed: BinaryIO, out: BinaryIO) -> None:
    import zstandard

    digest = hashlib.sha256()
    size = 0
    try:
        reader = zstandard.ZstdDecompressor().stream_reader(compressed, closefd=False)
        while True:
            chunk = reader.read(_CHUNK)
            if not chunk:
                break
            size += len(chunk)
            if size > artifact.size:
                raise HeaderError(f"{artifact.name}: more bytes than the manifest's {artifact.size}")
            digest.update(chunk)
            out.write(chunk)
    except zstandard.ZstdError as exc:
        raise HeaderError(f"{artifact.name}: not a zstd stream ({exc})") from None
    if size != artifact.size or digest.hexdigest() != artifact.sha256:
        raise HeaderError(f"{artifact.name}: content does not match the manifest's sha256; not installed")


def session_start() -> float:
    """The ``since`` to pass to :func:`find_used` later: now, less a second for coarse file-system clocks."""
    return time.time() - 1.0
