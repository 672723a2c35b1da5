"""Carrying headers: packed as zstd, one store object per content (:func:`save_headers`), installed from a
verified manifest into torch's header dir (:func:`restore_headers`, :func:`install_header`), every byte checked
against the manifest's sha256 on the way.
Loads lazily (inside the functions that need them, so a session pays only for what it uses): ``zstandard``,
``.._fs``, ``.verdicts``.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from dataclasses import dataclass
from dataclasses import field
from dataclasses import replace
from pathlib import Path
from typing import BinaryIO
from typing import Iterable
from typing import Mapping
from typing import Protocol
from typing import Sequence

from .._fs import atomic_file
from ..errors import HeaderError
from ..errors import ObjectTooLarge
from ..errors import StoreError
from ..manifest import Artifact
from .check import find_built
from .check import find_used
from .locks import Reservation
from .locks import build_lock
from .locks import ensure_dir
from .names import CHUNK
from .names import KIND
from .names import describe
from .names import header_artifact
from .names import header_dir
from .names import is_damaged_copy
from .names import is_header_name
from .names import looks_complete
from .names import object_key
from .names import open_regular
from .names import owned_dir
from .names import packed_bound


class _Listed(Protocol):
    @property
    def key(self) -> str: ...
    @property
    def size(self) -> int: ...


class Store(Protocol):
    """What carrying headers needs of a store (:class:`.stores.base.Store` is one): named here, so that the
    headers, which the probe uses, depend on no store module."""

    def get(self, key: str, dest: Path, *, limit: int | None = None) -> bool: ...
    def put(self, key: str, src: Path) -> None: ...
    def list(self, prefix: str = "") -> Sequence[_Listed]: ...


ZSTD_LEVEL = 3


def compress(path: Path, dest: BinaryIO, expected: Artifact | None = None) -> int:
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
        with open_regular(path) as src:
            writer = compressor.stream_writer(dest, closefd=False)
            for chunk in iter(lambda: src.read(CHUNK), b""):
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


def install_header(artifact: Artifact, compressed: BinaryIO, directory: Path) -> bool:
    """Install one verified header from its zstd stream into ``directory``; True when a file was added.

    Returns False, touching nothing, when a file that may be sound is already there (torch's or ours: never
    overwritten) or when torch holds the header's build lock right now (it is building that very file). A
    regular file of that name that is no PCH at all (:func:`is_damaged_copy`: zeroed, junk) is replaced. The
    stream is decompressed into a temp sibling, hashed and size-checked on the way (at most ``artifact.size``
    bytes are ever written), and published with ``os.replace`` only when both match: a reader sees the old
    file, or the whole verified file. Raises HeaderError (one line) for a bad name, a symlinked or foreign
    directory, a stream that is not zstd, or content that is not the artifact's; the directory is then
    unchanged.
    """
    if not is_header_name(artifact.name) or artifact.kind != KIND:
        raise HeaderError(f"not a precompiled-header artifact: {artifact.name!r}")
    if os.name == "nt":
        raise HeaderError("torch precompiles no header on Windows")
    ensure_dir(directory)
    dest = directory / artifact.name
    if os.path.lexists(dest) and not is_damaged_copy(dest):
        return False
    with build_lock(directory, artifact.name) as held:
        return held and install_locked(artifact, compressed, dest)


def install_locked(artifact: Artifact, compressed: BinaryIO, dest: Path) -> bool:
    """:func:`install_header`'s work, under torch's build lock for the header (held by the caller)."""
    if os.path.lexists(dest) and not is_damaged_copy(dest):
        return False
    try:
        with atomic_file(dest, fsync=False) as out:
            _copy_verified(artifact, compressed, out)
    except OSError as exc:
        raise HeaderError(f"cannot install {artifact.name}: {exc.strerror or exc}") from None
    return True


def verify_header_copy(artifact: Artifact, compressed: BinaryIO) -> None:
    """Check that a zstd stream holds exactly ``artifact`` (size and sha256) without writing it anywhere.

    For a header object that is about to be stored again under its content key (the Action's header entry,
    saved by ``actions/cache`` from a file this run did not install from); :func:`install_header` verifies on its
    own. Raises HeaderError (one line) when the stream is not zstd or its content is not the artifact's.
    """
    with open(os.devnull, "wb") as sink:
        _copy_verified(artifact, compressed, sink)


def _copy_verified(artifact: Artifact, compressed: BinaryIO, out: BinaryIO) -> None:
    import zstandard

    digest = hashlib.sha256()
    size = 0
    try:
        reader = zstandard.ZstdDecompressor().stream_reader(compressed, closefd=False)
        while True:
            chunk = reader.read(CHUNK)
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


@dataclass
class HeaderTransfer:
    """What :func:`save_headers` or :func:`restore_headers` did, for the report; ``errors`` are warning lines."""

    artifacts: list[Artifact] = field(default_factory=list)
    transferred: list[str] = field(default_factory=list)  # names uploaded (save) or installed (restore)
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # restore: damaged copies replaced; save: idle headers dropped


IDLE_SAVES = 3
"""A header that the restore installed and no process looked up is named again by the save, with its ``idle``
count one higher; at ``IDLE_SAVES`` saves in a row it is dropped instead, so a header no compile needs any more
(torch's flags or config changed: a new name) stops being downloaded by every restore of the lineage. torch
looks a header up for every C++ kernel a process loads, from its cache too (``CppCodeCache.load_async`` calls
``_precompile_header`` before it looks for the kernel's ``.so``; tests/plugin/test_headers.py pins it), so a
saving session that runs the suite's CPU kernels, hits or misses, keeps it; one whose processes load none (GPU
or extern kernels only, another shard's tests) ages it. If a compile needs it after all, torch builds it again
and the next save carries it."""


def save_headers(
    store: Store,
    prefix: str,
    since: float,
    installed: Iterable[str],
    scratch: Path,
    directory: Path | None = None,
    carried: Iterable[str] = (),
    uses: Iterable[object] | None = None,
    idle: Mapping[str, int] | None = None,
) -> HeaderTransfer:
    """Controller, at session end: describe the headers the session used and upload those the store lacks.

    ``uses``: every process's :class:`HeaderUse` reports: the headers uploaded are those a compiler check
    accepted (:func:`find_used`); a header only ``installed`` (restored, named again though no process
    looked it up) is named only when its exact content is already stored or ``carried``, never uploaded
    unchecked. Without ``uses`` (the CLI: no process to ask), headers written since ``since``
    (:func:`find_built`) and ``installed`` ones are carried when they start like a PCH, all it can check.
    ``idle``: the restored manifest's count for each installed header (absent: 0); a header no process looked
    up (the CLI: none written since ``since``) gets its count plus one, and is left out with a line in
    ``notes`` when that reaches :data:`IDLE_SAVES`; one looked up gets 0.

    ``artifacts`` are what the bundle manifest must name (``[a.to_json() for a in artifacts]``); a header that
    could not be read or uploaded is left out of it with one line in ``errors``, never failing the save.
    Each upload is one zstd object under :func:`object_key`, skipped when the store already has that key
    (content-addressed: once per store) or when the key is in ``carried``: objects that travel outside this
    store (the Action's own ``actions/cache`` entry for the header, keyed by that object key), which the
    manifest still names. ``scratch`` is a private temp dir of the caller's.
    """
    result = HeaderTransfer()
    elsewhere = set(carried)
    target = directory or header_dir()
    ages = idle or {}
    if uses is None:
        restored = find_used(target, (), installed)
        looked_up = {path.name for path in find_built(target, since) if looks_complete(path)}
        checked = looked_up | {path.name for path in restored if looks_complete(path)}
        candidates = sorted({*(target / name for name in checked), *restored})
    else:
        reports = list(uses)
        checked = looked_up = {path.name for path in find_used(target, reports)}
        candidates = find_used(target, reports, installed)
    if candidates and not owned_dir(target):  # another user could have put or swapped a header there
        result.errors.append(
            f"precompiled headers not saved: {target} (or its parent) is not this user's alone: other users may "
            "write to it"
        )
        return result
    for path in candidates:
        count = 0 if path.name in looked_up else ages.get(path.name, 0) + 1
        if count >= IDLE_SAVES:  # decided before describe() reads ~150 MB
            result.notes.append(
                f"precompiled header {path.name} no longer carried: no compile looked it up in {count} saves in a "
                "row (torch builds it again if one does)"
            )
            continue
        try:
            artifact = replace(describe(path), idle=count)
            key = object_key(prefix, artifact.sha256)
            stored = key in elsewhere or any(entry.key == key for entry in store.list(key))
            if not stored and path.name not in checked:
                raise HeaderError("changed since the restore installed it, and no process checked it")
            if not stored:
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
    store: Store,
    prefix: str,
    entries: Iterable[Artifact],
    scratch: Path,
    directory: Path | None = None,
    reservation: Reservation | None = None,
) -> HeaderTransfer:
    """Controller, at session start, before any test: install the headers a verified manifest names.

    ``entries`` are the manifest's artifacts (other kinds are ignored; each header's entry is checked with
    :func:`header_artifact`); the manifest must already be verified
    (checksums, signature), since its sha256 is what every downloaded byte is checked against. A header
    already present is not downloaded. Every failure (a bad entry, a store miss, content that does not match)
    is one line in ``errors`` and leaves the header dir as it was: torch then builds the header itself.
    ``transferred`` lists the installed names; ``artifacts`` every valid entry, installed or already present:
    pass ``[a.name for a in result.artifacts]`` to :func:`find_used` as ``installed`` at session end, so the
    next bundle names them again even though no kernel build read them.

    ``reservation`` (:func:`reserve_headers`, same ``directory``): the headers whose build lock it holds are
    installed under it, and each lock is let go once its header is in place or failed; all are let go on
    return, whatever happens.
    """
    try:
        return _restore_headers(store, prefix, entries, scratch, directory or header_dir(), reservation)
    finally:
        if reservation is not None:
            reservation.release()


def _restore_headers(
    store: Store, prefix: str, entries: Iterable[Artifact], scratch: Path, target: Path, reservation: Reservation | None
) -> HeaderTransfer:
    result = HeaderTransfer()
    down: int | None = None  # the line of the store's failure: the headers after it are not tried
    untried = 0
    for entry in entries:
        if entry.kind != KIND:
            continue
        try:
            artifact = header_artifact(entry)
            result.artifacts.append(artifact)
            damaged = is_damaged_copy(target / artifact.name)
            if os.path.lexists(target / artifact.name) and not damaged:
                continue  # torch's or an earlier restore's: the processes that look it up check it
            if down is not None:
                untried += 1  # one wait and one line for a store that failed, not one per header
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
                guard = reservation.guard if reservation is not None else contextlib.nullcontext()
                with open(packed, "rb") as fh, guard:
                    # Still reserved, or let go meanwhile (the install gave up waiting for the download, and
                    # torch may be building the header itself): then as any install, under torch's lock.
                    reserved = reservation is not None and artifact.name in reservation.held
                    if (
                        install_locked(artifact, fh, target / artifact.name)
                        if reserved
                        else install_header(artifact, fh, target)
                    ):
                        result.transferred.append(artifact.name)
                        if damaged:
                            result.notes.append(
                                f"precompiled header {artifact.name} was damaged (not a PCH); replaced with the "
                                "bundle's verified copy"
                            )
            finally:
                with contextlib.suppress(OSError):
                    packed.unlink()
        except Exception as exc:  # infrastructure trouble: torch builds the header as it would without us
            if isinstance(exc, StoreError) and not isinstance(exc, ObjectTooLarge) and down is None:
                down = len(result.errors)  # the store itself, not this object: the rest would wait for it too
            result.errors.append(f"precompiled header {entry.name!r} not restored: {_one_line(exc)}")
        finally:
            if reservation is not None:
                reservation.release(entry.name)  # in place, or failed: torch may look it up (or build it)
    if down is not None and untried:
        result.errors[down] += f"; {untried} more not tried (torch builds them)"
    return result


def _one_line(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if not isinstance(exc, HeaderError) else text


def sweep_leftovers(directory: Path | None = None) -> list[str]:
    """Remove what killed installs left in torch's header dir (``directory``, default torch's): partial headers
    and records under our temp names whose writer is provably gone (:func:`.._fs.sweep_our_temps`); only in a
    dir whose ownership is proved (this user's, no one else may write to it). The names removed."""
    from .._fs import sweep_our_temps

    target = directory or header_dir()
    if not owned_dir(target):
        return []
    return sweep_our_temps(target)
