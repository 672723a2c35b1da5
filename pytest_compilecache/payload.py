"""The values passed between a session's processes and phases: what each hands on, never a shared object.

* :class:`ProcessOutput`: what one process of a session hands to the controller at its end. An xdist worker
  sends it as JSON through ``workeroutput`` (:meth:`ProcessOutput.to_json`); the controller reads it back
  with :meth:`ProcessOutput.from_json`, which trusts nothing about its shape, and a plain session's
  controller collects its own the same way, so one merge serves both.
* :class:`Gathered`: the controller's fold of every process's output (:meth:`Gathered.fold`), for the save.
* :class:`Restored`: what the session's start found (:meth:`.restore_phase.RestorePhase.finish`), for the
  save and the report.

Loads lazily (inside the functions that need them, so a session pays only for what it uses): ``.stats``, ``.probe``.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field
from typing import TYPE_CHECKING
from typing import Any
from typing import Iterable
from typing import Mapping
from typing import NamedTuple

if TYPE_CHECKING:
    from .context import SessionContext
    from .explain import GraphsRecord
    from .recorder import Recorder
    from .stats import ItemRecord
    from .sync import RestoreResult


class Restored(NamedTuple):
    """What the session's start found. ``result``: the restore's (None: none was attempted, or the Action
    said nothing); ``store_trouble``: the store failed or stalled at the restore (then nothing is saved: one
    warning, not two); ``header_since``: when the session started, for finding the precompiled headers it
    used (None: not saving); ``baseline`` / ``compared_with``: the earlier run's graphs and what they are."""

    result: RestoreResult | None = None
    store_trouble: str | None = None
    header_since: float | None = None
    baseline: GraphsRecord | None = None
    compared_with: str = ""


class Gathered(NamedTuple):
    """Every process's artifacts, folded by the controller (:meth:`fold`): the mega-cache blobs by process
    name, the cache files used, where each process's torch keeps precompiled headers, the headers they
    checked (:class:`.pch.HeaderUse` JSON), the xdist workers that sent nothing (they died), and the node ids
    the processes deselected, the paths their collection ignored and their conftests' rules for that
    (:mod:`.selection`)."""

    blobs: Mapping[str, bytes] = {}
    files: frozenset[str] = frozenset()
    header_dirs: frozenset[str] = frozenset()
    header_uses: tuple[Any, ...] = ()
    silent: tuple[str, ...] = ()
    deselected: frozenset[str] = frozenset()
    ignored: frozenset[str] = frozenset()
    rules: frozenset[str] = frozenset()

    @classmethod
    def fold(cls, outputs: Iterable[tuple[str, ProcessOutput | None]]) -> Gathered:
        """One value from each process's ``(name, output)``; None: a worker that sent nothing."""
        blobs: dict[str, bytes] = {}
        files: set[str] = set()
        header_dirs: set[str] = set()
        uses: list[Any] = []
        silent: list[str] = []
        deselected: set[str] = set()
        ignored: set[str] = set()
        rules: set[str] = set()
        for name, output in outputs:
            if output is None:
                silent.append(name)
                continue
            if output.blob:
                blobs[name] = output.blob
            files.update(output.files)
            if output.header_dir is not None:
                header_dirs.add(output.header_dir)
            uses += output.headers
            deselected.update(output.deselected)
            ignored.update(output.ignored)
            rules.update(output.rules)
        folded = (frozenset(files), frozenset(header_dirs), tuple(uses), tuple(silent), frozenset(deselected))
        return cls(blobs, *folded, frozenset(ignored), frozenset(rules))


@dataclass
class ProcessOutput:
    """One process's tests, compile records, mega-cache blob, cache files used and trouble.

    ``header_dir``: where torch in that process keeps precompiled headers (None: it compiled no C++); the
    controller carries headers only when every process agrees with its own computed dir.
    """

    tests: int = 0
    records: list[ItemRecord] = field(default_factory=list)
    blob: bytes | None = None
    files: list[str] = field(default_factory=list)
    problems: dict[str, list[str]] = field(default_factory=dict)
    remote_errors: list[str] = field(default_factory=list)
    header_dir: str | None = None
    headers: list[Any] = field(default_factory=list)  # the headers torch looked up here, each checked once
    # an xdist worker that restored for its controller: what the ticket holds (RestorePhase.report)
    restore: dict[str, Any] | None = None
    deselected: list[str] = field(default_factory=list)  # an xdist worker's (a plain session's watch is its own)
    ignored: list[str] = field(default_factory=list)  # the paths its collection ignored (absolute), likewise
    rules: list[str] = field(default_factory=list)  # what its conftests told collection to ignore, likewise

    @classmethod
    def collect(cls, context: SessionContext, recorder: Recorder) -> ProcessOutput:
        """This process's output. Call at most once per process: it takes the mega-cache blob (only when
        the session saves), and a second ``save_cache_artifacts`` spoils later loads (torch 2.8+). The Redis
        errors are those ``context`` has taken so far (:meth:`.SessionContext.take_remote_errors`)."""
        from . import probe

        recorder.finish_outside()
        output = cls(
            tests=recorder.stats.tests,
            records=list(recorder.stats.records.values()),
            problems=context.problems.to_json(),
            remote_errors=list(context.remote_errors),
        )
        if probe.dynamo_loaded():
            output.blob = probe.save_artifacts() if context.saving else None
            output.files = probe.used_files(context.dir.path) if context.dir.path else []
        output.header_dir = probe.precompiled_header_dir()
        output.headers = probe.precompiled_headers_used()
        return output

    def to_json(self) -> dict[str, Any]:
        """Plain values for ``workeroutput`` (execnet carries bytes, lists, dicts, str, int, None)."""
        return {
            "tests": self.tests,
            "records": [record.to_json() for record in self.records],
            "blob": self.blob,
            "files": list(self.files),
            "problems": dict(self.problems),
            "remote_errors": list(self.remote_errors),
            "header_dir": self.header_dir,
            "headers": list(self.headers),
            "restore": self.restore,
            "deselected": list(self.deselected),
            "ignored": list(self.ignored),
            "rules": list(self.rules),
        }

    @classmethod
    def from_json(cls, data: Any) -> ProcessOutput | None:
        """Read what a worker sent; None when it sent nothing usable (a crashed worker). Malformed parts
        are dropped one by one, never a crash."""
        if not isinstance(data, dict):
            return None
        tests = data.get("tests")
        blob = data.get("blob")
        problems = data.get("problems")
        header_dir = data.get("header_dir")
        headers = data.get("headers")
        restore = data.get("restore")
        return cls(
            tests=tests if isinstance(tests, int) and not isinstance(tests, bool) and tests >= 0 else 0,
            records=_records(data.get("records")),
            blob=bytes(blob) if isinstance(blob, (bytes, bytearray)) and blob else None,
            files=_strings(data.get("files")),
            problems=problems if isinstance(problems, dict) else {},
            remote_errors=_strings(data.get("remote_errors")),
            header_dir=header_dir if isinstance(header_dir, str) else None,
            headers=list(headers) if isinstance(headers, list) else [],  # each entry read by pch.HeaderUse
            restore=restore if isinstance(restore, dict) else None,  # each field read by RestorePhase
            deselected=_strings(data.get("deselected")),
            ignored=_strings(data.get("ignored")),
            rules=_strings(data.get("rules")),
        )


def _strings(value: Any) -> list[str]:
    """The strings of a list a worker sent (anything else in it dropped); [] for anything but a list."""
    return [item for item in value if isinstance(item, str)] if isinstance(value, list) else []


def _records(data: Any) -> list[ItemRecord]:
    from .stats import ItemRecord

    records = []
    for item in data if isinstance(data, list) else ():
        try:
            records.append(ItemRecord.from_json(item))
        except (KeyError, TypeError, ValueError, AttributeError):  # a record we cannot read: dropped
            continue
    return records
