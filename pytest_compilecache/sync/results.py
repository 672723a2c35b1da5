"""The typed results of a restore and a save, and their one codec.

:class:`RestoreResult` and :class:`SaveResult` (with :class:`HeaderReport` and :class:`StagedBlob`) are what
:mod:`.restore`, :mod:`.save` and :mod:`.staged` return. A result crosses a process boundary in one shape only,
:meth:`RestoreResult.encode` / :meth:`RestoreResult.decode` (plain JSON; every field but the in-process ones,
``graphs`` and ``named_artifacts``): the xdist restore ticket carries it from the restoring worker to the
controller, and the Action's hand-off (:mod:`.handoff`) from its restore step to the plugin. The decoder
trusts nothing (anyone may set an environment variable): strings become one line, header names must be
torch's, staged entries must have their exact shape; what is not a result is None. The report's view
(:meth:`RestoreResult.to_json`, the ``restore`` and ``save`` objects of the JSON report's format 1) is a
projection of the same fields.
Loads lazily (inside the functions that need them, so a session pays only for what it uses): ``..pch``.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field
from typing import TYPE_CHECKING
from typing import Any
from typing import Generic
from typing import Literal
from typing import Mapping
from typing import NamedTuple
from typing import TypeVar

from ..fingerprint import key_origin
from ..ghrunner import one_line
from ..manifest import BLOB_NAME
from ..manifest import MAX_IDLE

if TYPE_CHECKING:
    from ..manifest import Artifact
    from ..pch import HeaderTransfer

RestoreOutcome = Literal["exact", "partial", "miss", "error"]
SaveOutcome = Literal["saved", "staged", "skipped", "error"]
Outcome = TypeVar("Outcome", RestoreOutcome, SaveOutcome)
RESTORE_OUTCOMES: tuple[RestoreOutcome, ...] = ("exact", "partial", "miss", "error")


class StagedBlob(NamedTuple):
    """A mega-cache blob a restore installed for a later process to load (``restore(stage_blobs=True)``):
    its name (``controller``, ``gw0``...), size and SHA-256, from the verified manifest."""

    name: str
    size: int
    sha256: str


@dataclass(frozen=True)
class HeaderReport:
    """The precompiled headers a restore or save carried (see :mod:`..pch`).

    ``named``: the headers the bundle's manifest names (restore: every valid entry, installed or already
    present; pass them to the save as ``installed``); ``transferred``: those installed (restore) or uploaded
    (save, only those the store lacked); ``size``: raw bytes of ``transferred``; ``warnings``: one line per
    header that could not be carried; ``carried``: object keys (``<prefix>-artifact-<sha256>``) that travel
    outside the bundle's store (the Action's own ``actions/cache`` entry per header): a save names those
    headers in its manifest but does not upload them (restore, from the Action's report only).
    """

    named: tuple[str, ...] = ()
    transferred: tuple[str, ...] = ()
    size: int = 0
    seconds: float = 0.0
    warnings: tuple[str, ...] = ()
    carried: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()  # restore: a damaged local header replaced; save: an idle header dropped
    idle: Mapping[str, int] = field(default_factory=dict)  # named headers' idle counts (0s left out)

    @classmethod
    def of(cls, transfer: HeaderTransfer, seconds: float) -> HeaderReport:
        sizes = {artifact.name: artifact.size for artifact in transfer.artifacts}
        return cls(
            idle={artifact.name: artifact.idle for artifact in transfer.artifacts if artifact.idle},
            named=tuple(artifact.name for artifact in transfer.artifacts),
            transferred=tuple(transfer.transferred),
            size=sum(sizes.get(name, 0) for name in transfer.transferred),
            seconds=seconds,
            warnings=tuple(one_line(line) for line in transfer.errors),
            notes=tuple(one_line(line) for line in transfer.notes),
        )

    def encode(self) -> dict[str, Any]:
        """Every field, as plain JSON (:meth:`decode` reads it back)."""
        return {
            "named": list(self.named),
            "transferred": list(self.transferred),
            "size": self.size,
            "seconds": self.seconds,
            "warnings": list(self.warnings),
            "carried": list(self.carried),
            "notes": list(self.notes),
            "idle": dict(self.idle),
        }

    @classmethod
    def decode(cls, data: object) -> HeaderReport:
        """What :meth:`encode` wrote, each field checked (a field that is not its shape is left empty); also
        the hand-off's older shape, a list of the header names alone."""
        from ..pch import is_header_name

        if isinstance(data, list):
            data = {"named": data}
        if not isinstance(data, dict):
            return cls()

        def lines(name: str) -> tuple[str, ...]:
            value = data.get(name)
            if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
                return ()
            return tuple(one_line(item) for item in value)

        def names(name: str) -> tuple[str, ...]:
            return tuple(item for item in lines(name) if is_header_name(item))

        def counts(name: str) -> dict[str, int]:
            value = data.get(name)
            if not isinstance(value, dict):
                return {}
            return {
                key: count
                for key, count in value.items()
                if isinstance(key, str) and is_header_name(key) and _count(count) == count and 0 < count <= MAX_IDLE
            }

        return cls(
            named=names("named"),
            transferred=names("transferred"),
            size=_count(data.get("size")),
            seconds=_seconds(data.get("seconds")),
            warnings=lines("warnings"),
            carried=lines("carried"),
            notes=lines("notes"),
            idle=counts("idle"),
        )

    def to_json(self) -> dict[str, Any]:
        """The report's view: counts of the headers named and transferred, their bytes, seconds, warnings."""
        return {
            "named": len(self.named),
            "transferred": len(self.transferred),
            "size": self.size,
            "seconds": round(self.seconds, 3),
            "warnings": list(self.warnings),
        }


@dataclass(frozen=True)
class _Transfer(Generic[Outcome]):
    """What a restore and a save report alike. ``skipped``: ``(key, reason)`` pairs (restore: bundles that
    failed verification; save: cache files left out of the bundle, names no bundle can carry)."""

    outcome: Outcome
    key: str | None = None
    size: int | None = None
    seconds: float = 0.0
    message: str = ""
    files: int = 0
    artifacts: Mapping[str, int] = field(default_factory=dict)
    skipped: tuple[tuple[str, str], ...] = ()
    headers: HeaderReport = field(default_factory=HeaderReport)

    @property
    def ok(self) -> bool:
        return self.outcome != "error"

    def to_json(self) -> dict[str, Any]:
        """The report's ``restore`` or ``save`` object: the fields of format 1 plus ``skipped`` (a list of
        {key, reason}) and ``headers`` (:meth:`HeaderReport.to_json`: named, installed or uploaded, their
        bytes, seconds, warnings)."""
        return {
            "outcome": self.outcome,
            "key": self.key,
            "size": self.size,
            "seconds": round(self.seconds, 3),
            "message": self.message,
            "files": self.files,
            "artifacts": dict(self.artifacts),
            "skipped": [{"key": key, "reason": reason} for key, reason in self.skipped],
            "headers": self.headers.to_json(),
        }


@dataclass(frozen=True)
class RestoreResult(_Transfer[RestoreOutcome]):
    """What a restore did (see the module docstring for the outcomes). ``skipped``: bundles that failed
    verification or could not be read, as ``(key, reason)``."""

    # The restored bundle's ``graphs`` record, read from its manifest after verification:
    # untrusted JSON to parse with ``explain.GraphsRecord.from_json``; None when the bundle has none.
    graphs: Mapping[str, Any] | None = field(default=None, repr=False)
    # The verified manifest's artifact entries (precompiled headers), for a caller that restored with
    # ``headers=False`` to fetch them by other means (the Action's header entry, see action/main.py).
    named_artifacts: tuple[Artifact, ...] = field(default=(), repr=False)
    # The mega-cache blobs installed for a later process to load (``stage_blobs``): see :func:`load_staged`.
    staged: tuple[StagedBlob, ...] = ()

    @property
    def description(self) -> str:
        """What happened, in plain words for people (``outcome`` stays for programs): ``partial`` is the
        newest bundle of this fingerprint, often the very one its last run saved, not an incomplete restore
        (actions/cache's word for a key matched by prefix), e.g. "restored the newest bundle of this
        fingerprint (run 5001, attempt 1)"."""
        origin = key_origin(self.key) if self.key else None
        which = f" ({origin})" if origin else ""
        if self.outcome == "exact":
            return f"restored the bundle of the exact key asked for{which}"
        if self.outcome == "partial":
            return f"restored the newest bundle of this fingerprint{which}"
        if self.outcome == "miss":
            return "restored nothing: no usable bundle of this fingerprint"
        return "restored nothing: the restore failed"

    def to_json(self) -> dict[str, Any]:
        """:meth:`_Transfer.to_json` plus ``description`` (:attr:`description`)."""
        return {**super().to_json(), "description": self.description}

    def encode(self) -> dict[str, Any]:
        """The one codec of a restore's result between processes (the xdist ticket, the Action's hand-off):
        every field but ``graphs`` (the restoring process installs the record in the cache dir) and
        ``named_artifacts`` (the verified manifest's entries, used in that process only). :meth:`decode`
        reads it back."""
        return {
            "outcome": self.outcome,
            "key": self.key,
            "size": self.size,
            "seconds": self.seconds,
            "message": self.message,
            "files": self.files,
            "artifacts": dict(self.artifacts),
            "skipped": [list(pair) for pair in self.skipped],
            "staged": [list(blob) for blob in self.staged],
            "headers": self.headers.encode(),
        }

    @classmethod
    def decode(cls, data: object) -> RestoreResult | None:
        """What :meth:`encode` wrote, from anyone (never a crash): None when it is not a result's shape (no
        known outcome); any other field that is not its shape is left at its default. Staged blobs only for a
        restore that restored something."""
        if not isinstance(data, dict) or data.get("outcome") not in RESTORE_OUTCOMES:
            return None
        outcome: RestoreOutcome = data["outcome"]
        key = data.get("key")
        artifacts = data.get("artifacts")
        skipped = data.get("skipped")
        staged = data.get("staged") if outcome in ("exact", "partial") else None
        size = data.get("size")
        return cls(
            outcome,
            key=one_line(key, 300) if isinstance(key, str) else None,
            size=size if isinstance(size, int) and not isinstance(size, bool) and size >= 0 else None,
            seconds=_seconds(data.get("seconds")),
            message=one_line(str(data.get("message") or "")),
            files=_count(data.get("files")),
            artifacts={
                one_line(kind): count
                for kind, count in (artifacts.items() if isinstance(artifacts, dict) else ())
                if isinstance(count, int) and not isinstance(count, bool)
            },
            skipped=tuple(
                (one_line(pair[0], 300), one_line(pair[1], 500))
                for pair in (skipped if isinstance(skipped, list) else ())
                if isinstance(pair, list) and len(pair) == 2 and all(isinstance(item, str) for item in pair)
            ),
            staged=tuple(
                StagedBlob(*entry) for entry in (staged if isinstance(staged, list) else ()) if _staged(entry)
            ),
            headers=HeaderReport.decode(data.get("headers")),
        )

    @property
    def warning(self) -> str | None:
        """The one line to warn with, or None: the error, or the bad bundles skipped (whatever the outcome).

        Headers that could not be restored are not in it: each is its own line in ``headers.warnings``.
        """
        if self.outcome == "error":
            return self.message
        if self.skipped:
            reasons = "; ".join(f"{key}: {reason}" for key, reason in self.skipped)
            why = "failed verification, could not be read or torch could not load"
            return one_line(f"restore skipped {len(self.skipped)} bundle(s) that {why}: {reasons}")
        return None


@dataclass(frozen=True)
class SaveResult(_Transfer[SaveOutcome]):
    """What a save did: ``saved``, ``skipped`` (nothing to save) or ``error``. ``skipped``: cache files left
    out of the bundle as ``(name, reason)`` (names no bundle can carry)."""

    @property
    def warning(self) -> str | None:
        """The one line to warn with (an error), or None; files left out are a note, in ``message``; headers
        that could not be saved are each a line in ``headers.warnings``."""
        return self.message if self.outcome == "error" else None


def restore_outputs(result: RestoreResult) -> dict[str, str]:
    """What a restore reports to a CI job's later steps (the CLI's ``--github-output`` and the Action):
    ``restore-outcome`` (exact, partial, miss or error), ``cache-hit`` (``true`` only for the exact key) and
    ``matched-key`` (the restored key; empty unless something was restored)."""
    restored = result.outcome in ("exact", "partial")
    return {
        "restore-outcome": result.outcome,
        "cache-hit": str(result.outcome == "exact").lower(),
        "matched-key": (result.key or "") if restored else "",
    }


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _seconds(value: object) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < float("inf")
    return float(value) if ok else 0.0  # type: ignore[arg-type]


def _staged(entry: object) -> bool:
    """``[name, size, sha256]`` with a blob name a bundle may carry, a size and a hex SHA-256."""
    if not (isinstance(entry, list) and len(entry) == 3):
        return False
    name, size, sha256 = entry
    return (
        isinstance(name, str)
        and BLOB_NAME.fullmatch(name) is not None
        and isinstance(size, int)
        and not isinstance(size, bool)
        and size >= 0
        and isinstance(sha256, str)
        and len(sha256) == 64
        and all(c in "0123456789abcdef" for c in sha256)
    )
