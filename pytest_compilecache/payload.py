"""What one process of a session hands to the controller at its end: :class:`ProcessOutput`.

An xdist worker sends it as JSON through ``workeroutput`` (:meth:`ProcessOutput.to_json`); the controller
reads it back with :meth:`ProcessOutput.from_json`, which trusts nothing about its shape, and a plain
session's controller collects its own the same way, so one merge serves both.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field
from typing import TYPE_CHECKING
from typing import Any

from . import probe
from .stats import ItemRecord

if TYPE_CHECKING:
    from .recorder import Recorder
    from .session import Setup


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

    @classmethod
    def collect(cls, setup: Setup, recorder: Recorder) -> ProcessOutput:
        """This process's output. Call at most once per process: it takes the mega-cache blob (only when
        the session saves), and a second ``save_cache_artifacts`` spoils later loads (torch 2.8+). The Redis
        errors are those ``setup`` has taken so far (:meth:`Setup.take_remote_errors`)."""
        output = cls(
            tests=recorder.stats.tests,
            records=list(recorder.stats.records.values()),
            problems=setup.problems.to_json(),
            remote_errors=list(setup.remote_errors),
        )
        if probe.dynamo_loaded():
            output.blob = probe.save_artifacts() if setup.saving else None
            output.files = probe.used_files(setup.dir.path) if setup.dir.path else []
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
        }

    @classmethod
    def from_json(cls, data: Any) -> ProcessOutput | None:
        """Read what a worker sent; None when it sent nothing usable (a crashed worker). Malformed parts
        are dropped one by one, never a crash."""
        if not isinstance(data, dict):
            return None
        tests = data.get("tests")
        blob = data.get("blob")
        files = data.get("files")
        problems = data.get("problems")
        errors = data.get("remote_errors")
        header_dir = data.get("header_dir")
        headers = data.get("headers")
        return cls(
            tests=tests if isinstance(tests, int) and not isinstance(tests, bool) and tests >= 0 else 0,
            records=_records(data.get("records")),
            blob=bytes(blob) if isinstance(blob, (bytes, bytearray)) and blob else None,
            files=[f for f in files if isinstance(f, str)] if isinstance(files, list) else [],
            problems=problems if isinstance(problems, dict) else {},
            remote_errors=[e for e in errors if isinstance(e, str)] if isinstance(errors, list) else [],
            header_dir=header_dir if isinstance(header_dir, str) else None,
            headers=list(headers) if isinstance(headers, list) else [],  # each entry read by headers.HeaderUse
        )


def _records(data: Any) -> list[ItemRecord]:
    records = []
    for item in data if isinstance(data, list) else ():
        try:
            records.append(ItemRecord.from_json(item))
        except (KeyError, TypeError, ValueError, AttributeError):  # a record we cannot read: dropped
            continue
    return records
