"""The bundle manifest: its schema, canonical bytes, and a parser that validates everything.

The manifest is the part of a bundle that is hashed and signed: it names the lineage the bundle was made for,
every member with its size and SHA-256, and the payload's size and SHA-256, so a verified manifest pins every
byte of the bundle. :meth:`Manifest.from_json_bytes` is the only way in from bytes and raises nothing but
:class:`~pytest_compilecache.BundleError`, whatever the input (deep nesting, lone surrogates, huge numbers).

Member paths are checked to be *installable* here, before any payload byte is read: safe relative POSIX
paths, UTF-8, no component longer than :data:`NAME_MAX` bytes, and no member that is both a file and the
parent dir of another (``files/a`` and ``files/a/b``).
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import json
import re
import unicodedata
from dataclasses import dataclass
from dataclasses import field
from datetime import datetime
from pathlib import PureWindowsPath
from typing import Any
from typing import Iterable
from typing import Mapping

from .errors import BundleError

__all__ = [
    "BLOBS_DIR",
    "FILES_DIR",
    "FORMAT_VERSION",
    "Artifact",
    "Manifest",
    "Member",
    "canonical_json",
    "fingerprint_differences",
    "printable",
    "unsafe_member_reason",
]

FORMAT_VERSION = 3  # 3: an artifact's ``idle`` (saves in a row that did not use it)
BLOBS_DIR = "blobs/"
FILES_DIR = "files/"
NAME_MAX = 255  # bytes per path component on every file system we install into (ext4, xfs, tmpfs, APFS)
PATH_MAX = 4000  # bytes per relative path: below Linux's 4096 with room for the cache dir
MAX_COMPONENTS = 64  # torch's cache trees are a few levels deep; thousands would only cost fds and time
MAX_GRAPHS_BYTES = 4 * 1024 * 1024  # the opaque 'graphs' object, canonical JSON
MAX_DEPTH = 32  # nesting of 'stats' and 'graphs': deeper is hostile (RecursionError elsewhere)
ARTIFACT_KINDS = frozenset({"precompiled_header"})

BLOB_NAME = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_ARTIFACT_NAME = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}$")
_MANIFEST_KEYS = frozenset(
    {
        "format",
        "key",
        "lineage",
        "fingerprint",
        "digest",
        "plugin_version",
        "torch_version",
        "created",
        "members",
        "artifacts",
        "graphs",
        "stats",
        "payload_size",
        "payload_sha256",
    }
)
_MEMBER_KEYS = frozenset({"path", "size", "sha256"})
_ARTIFACT_KEYS = frozenset({"kind", "name", "sha256", "size"})
_ARTIFACT_OPTIONAL = frozenset({"idle"})
MAX_IDLE = 1000  # an artifact's ``idle`` count: a save drops it long before (:data:`.pch.IDLE_SAVES`)


@dataclass(frozen=True)
class Member:
    """One tar member: ``path`` is POSIX and relative (``blobs/gw0.bin``, ``files/ab/cabc.main.so``)."""

    path: str
    size: int
    sha256: str


@dataclass(frozen=True)
class Artifact:
    """A content-addressed file stored once per store, outside the bundle (e.g. torch's precompiled header).

    Written by saves that carry torch's precompiled headers (:mod:`.pch`), signed with the manifest.
    """

    kind: str
    name: str
    sha256: str
    size: int
    idle: int = 0  # saves in a row of this lineage in which no process used it (0: the saving session did)

    def to_json(self) -> dict[str, Any]:
        """Its entry in the manifest's ``artifacts``: ``{kind, name, sha256, size}``, and ``idle`` when not 0.
        Read back (validated) only with the whole manifest (:meth:`Manifest.from_json_bytes`); a kind's own
        shape is its module's to check (:func:`.pch.header_artifact`)."""
        entry: dict[str, Any] = {"kind": self.kind, "name": self.name, "sha256": self.sha256, "size": self.size}
        if self.idle:
            entry["idle"] = self.idle
        return entry


@dataclass(frozen=True)
class Manifest:
    """What a bundle holds, where it comes from and which restore lineage it belongs to.

    ``lineage`` is the restore prefix (``<key prefix>-<fingerprint digest>-``) the bundle was saved for and
    ``key`` the exact store key; both are signed, so a bundle copied under another key or lineage is refused.
    Constructing one validates nothing; :meth:`from_json_bytes` does.
    """

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
    lineage: str = ""
    artifacts: tuple[Artifact, ...] = ()
    graphs: dict[str, Any] = field(default_factory=dict)

    def to_json_bytes(self) -> bytes:
        """Canonical JSON (sorted keys, ASCII, no whitespace): the exact bytes that are hashed and signed."""
        document = {
            "format": self.format,
            "key": self.key,
            "lineage": self.lineage,
            "fingerprint": dict(self.fingerprint),
            "digest": self.digest,
            "plugin_version": self.plugin_version,
            "torch_version": self.torch_version,
            "created": self.created,
            "members": [{"path": m.path, "size": m.size, "sha256": m.sha256} for m in self.members],
            "artifacts": [artifact.to_json() for artifact in self.artifacts],
            "graphs": self.graphs,
            "stats": self.stats,
            "payload_size": self.payload_size,
            "payload_sha256": self.payload_sha256,
        }
        return canonical_json(document)

    @classmethod
    def from_json_bytes(cls, data: bytes) -> Manifest:
        """Parse and validate a manifest; raise :class:`BundleError` (and nothing else) on anything malformed."""
        try:
            # NaN, Infinity and 1e999 parse as floats that no canonical JSON can write back: refused here.
            document = json.loads(data.decode("utf-8"), parse_constant=_no_constant, parse_float=_finite_float)
            # Lone surrogates ("\\ud800") parse but cannot be encoded, printed or used as file names.
            json.dumps(document, ensure_ascii=False).encode("utf-8")
        except RecursionError:
            raise BundleError("bundle manifest is nested too deeply") from None
        except UnicodeError:
            raise BundleError("bundle manifest is not valid UTF-8 (or holds a lone surrogate)") from None
        except ValueError as exc:
            raise BundleError(f"bundle manifest is not valid JSON: {_short(exc)}") from None
        if not isinstance(document, dict):
            raise BundleError("bundle manifest is not a JSON object")
        _check_keys(document, _MANIFEST_KEYS, "bundle manifest")
        if _int(document["format"], "format") != FORMAT_VERSION:
            raise BundleError(f"bundle manifest format {document['format']} is not supported")
        fingerprint = document["fingerprint"]
        if not isinstance(fingerprint, dict) or not all(isinstance(v, str) for v in fingerprint.values()):
            raise BundleError("bundle manifest field 'fingerprint' must map strings to strings")
        stats = _object(document["stats"], "stats")
        graphs = _object(document["graphs"], "graphs")
        if len(canonical_json(graphs)) > MAX_GRAPHS_BYTES:
            raise BundleError(f"bundle manifest field 'graphs' is larger than {MAX_GRAPHS_BYTES} bytes")
        created = _str(document["created"], "created")
        try:
            datetime.fromisoformat(created)
        except ValueError:
            raise BundleError(f"bundle manifest field 'created' is not ISO-8601: {created[:40]!r}") from None
        key = _str(document["key"], "key")
        lineage = _str(document["lineage"], "lineage")
        if not key.startswith(lineage):
            raise BundleError("bundle manifest field 'key' does not start with its 'lineage'")
        return cls(
            format=FORMAT_VERSION,
            key=key,
            lineage=lineage,
            fingerprint=dict(fingerprint),
            digest=_str(document["digest"], "digest", allow_empty=True),
            plugin_version=_str(document["plugin_version"], "plugin_version"),
            torch_version=_str(document["torch_version"], "torch_version", allow_empty=True),
            created=created,
            members=_parse_members(document["members"]),
            artifacts=_parse_artifacts(document["artifacts"]),
            graphs=graphs,
            stats=stats,
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


def canonical_json(document: Any) -> bytes:
    """Sorted keys, no whitespace, ASCII only; raises ValueError/TypeError on what JSON cannot hold."""
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode(
        "ascii"
    )


def json_object(value: Mapping[str, Any], what: str) -> dict[str, Any]:
    """Normalise a mapping through canonical JSON (tuples -> lists...) so a packed manifest equals its reread.

    Raises :class:`BundleError` when it is not JSON-serialisable or nested deeper than :data:`MAX_DEPTH`.
    """
    try:
        result = json.loads(canonical_json(dict(value)))
    except (TypeError, ValueError, RecursionError) as exc:
        raise BundleError(f"bundle {what} are not JSON-serialisable: {_short(exc)}") from None
    _check_depth(result, what)
    return result  # type: ignore[no-any-return]


def unsafe_member_reason(rel: str) -> str | None:
    """Why a relative POSIX path could not be installed inside its base directory, or None when it can."""
    if not rel:
        return "empty path"
    try:
        encoded = rel.encode("utf-8")
    except UnicodeEncodeError:
        return "not valid UTF-8"
    if "\\" in rel:
        return "backslash"
    if any(ord(c) < 32 or c == "\x7f" for c in rel):
        return "control character"
    if rel.startswith("/"):
        return "absolute path"
    if PureWindowsPath(rel).drive:
        return "drive or UNC prefix"
    parts = rel.split("/")
    if any(part in ("", ".", "..") for part in parts):
        return "'..', '.' or empty component"
    if len(encoded) > PATH_MAX or any(len(part.encode("utf-8")) > NAME_MAX for part in parts):
        return "name too long"
    if len(parts) > MAX_COMPONENTS:
        return "too many components"
    return None


def check_member_path(path: str) -> str:
    """Return ``path`` if it is a safe ``blobs/<name>.bin`` or ``files/<rel>`` member; else BundleError."""
    reason = unsafe_member_reason(path)
    if reason is None:
        if path.startswith(FILES_DIR) and len(path) > len(FILES_DIR):
            return path
        name = path[len(BLOBS_DIR) : -len(".bin")]
        if path.startswith(BLOBS_DIR) and path.endswith(".bin") and BLOB_NAME.fullmatch(name):
            return path
        reason = "not under blobs/ or files/"
    raise BundleError(f"bundle has unsafe member path {path[:200]!r} ({reason})")


def printable(text: str, limit: int = 200) -> str:
    """``text`` cut at ``limit`` characters, control characters escaped: bundle text never breaks a line."""
    text = text[:limit]
    return text if text.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def fingerprint_differences(bundle: Mapping[str, str], current: Mapping[str, str]) -> list[str]:
    """``name: bundle value != current value`` for every fact that differs, sorted by name, one line each."""
    return [
        f"{printable(name)}: {printable(bundle.get(name, '<absent>'))} != {printable(current.get(name, '<absent>'))}"
        for name in sorted(set(bundle) | set(current))
        if bundle.get(name) != current.get(name)
    ]


def _short(exc: BaseException) -> str:
    return str(exc)[:200]


def _check_keys(
    document: dict[str, Any], expected: frozenset[str], what: str, optional: frozenset[str] = frozenset()
) -> None:
    missing = sorted(expected - document.keys())
    unknown = sorted(document.keys() - expected - optional)
    if missing:
        raise BundleError(f"{what} lacks field(s) {', '.join(missing)}")
    if unknown:
        raise BundleError(f"{what} has unknown field(s) {', '.join(k[:40] for k in unknown[:5])}")


def _str(value: Any, field: str, *, allow_empty: bool = False) -> str:
    if not isinstance(value, str) or (not value and not allow_empty):
        raise BundleError(f"bundle manifest field {field!r} must be a non-empty string")
    return value


def _int(value: Any, field: str) -> int:
    # bool is an int subclass: refuse it explicitly. 2**63 bounds what any file system or tar could hold.
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**63:
        raise BundleError(f"bundle manifest field {field!r} must be a non-negative integer")
    return value


def _sha(value: Any, field: str) -> str:
    if not isinstance(value, str) or not _HEX64.fullmatch(value):
        raise BundleError(f"bundle manifest field {field!r} must be a lowercase hex SHA-256")
    return value


def _object(value: Any, field: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BundleError(f"bundle manifest field {field!r} must be an object")
    _check_depth(value, f"manifest field {field!r}")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"number out of range: {text[:40]}")
    return value


def _check_depth(value: Any, what: str) -> None:
    # Iterative: a recursive walk is exactly what a deep document would crash. Only containers are pushed, so
    # a long flat list costs one pass over it, not a stack entry per element.
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise BundleError(f"bundle {what} is nested deeper than {MAX_DEPTH} levels")
        if not isinstance(item, (dict, list)):
            continue
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))


def _parse_members(raw: Any) -> tuple[Member, ...]:
    if not isinstance(raw, list):
        raise BundleError("bundle manifest field 'members' must be a list")
    members: list[Member] = []
    seen: dict[str, str] = {}
    for item in raw:
        if not isinstance(item, dict):
            raise BundleError("bundle manifest member is not an object")
        _check_keys(item, _MEMBER_KEYS, "bundle manifest member")
        path = check_member_path(_str(item["path"], "members.path"))
        folded = fold_path(path)
        if folded in seen:
            if seen[folded] == path:
                raise BundleError(f"bundle manifest lists {printable(path)} twice")
            raise BundleError(
                f"bundle members {printable(seen[folded])} and {printable(path)} name one file where names ignore "
                "case or Unicode normalisation (macOS, Windows)"
            )
        seen[folded] = path
        size = _int(item["size"], "members.size")
        members.append(Member(path=path, size=size, sha256=_sha(item["sha256"], "members.sha256")))
    _check_no_file_is_a_parent(m.path for m in members)
    return tuple(members)


def fold_path(path: str) -> str:
    """``path`` as a file system that ignores case and Unicode normalisation (macOS, Windows) compares it:
    two member paths with one folded form would install as one file, the second over the first."""
    return unicodedata.normalize("NFC", unicodedata.normalize("NFD", path).casefold())


def _check_no_file_is_a_parent(paths: Iterable[str]) -> None:
    """Refuse ``files/a`` next to ``files/a/b`` (or ``files/A/b``): they cannot both be installed (found
    before any write)."""
    folded = {fold_path(path): path for path in paths}
    for key, path in folded.items():
        parts = key.split("/")
        for end in range(1, len(parts)):
            parent = "/".join(parts[:end])
            if parent in folded:
                raise BundleError(
                    f"bundle members {printable(folded[parent])} and {printable(path)} cannot both be installed "
                    "(file and dir)"
                )


def _parse_artifacts(raw: Any) -> tuple[Artifact, ...]:
    if not isinstance(raw, list):
        raise BundleError("bundle manifest field 'artifacts' must be a list")
    artifacts: list[Artifact] = []
    seen: set[tuple[str, str]] = set()
    for item in raw:
        if not isinstance(item, dict):
            raise BundleError("bundle manifest artifact is not an object")
        _check_keys(item, _ARTIFACT_KEYS, "bundle manifest artifact", optional=_ARTIFACT_OPTIONAL)
        kind = _str(item["kind"], "artifacts.kind")
        if kind not in ARTIFACT_KINDS:
            raise BundleError(f"bundle manifest artifact kind {kind[:40]!r} is not supported")
        name = _str(item["name"], "artifacts.name")
        if not _ARTIFACT_NAME.fullmatch(name):
            raise BundleError(f"bundle manifest artifact name {name[:40]!r} is invalid")
        if (kind, name) in seen:
            raise BundleError(f"bundle manifest lists artifact {kind}/{name} twice")
        seen.add((kind, name))
        artifacts.append(
            Artifact(
                kind=kind,
                name=name,
                sha256=_sha(item["sha256"], "artifacts.sha256"),
                size=_int(item["size"], "artifacts.size"),
                idle=_idle(item.get("idle", 0)),
            )
        )
    return tuple(artifacts)


def _idle(value: Any) -> int:
    count = _int(value, "artifacts.idle")
    if count > MAX_IDLE:
        raise BundleError(f"bundle manifest field 'artifacts.idle' is more than {MAX_IDLE}")
    return count
