"""Test doubles other tests share. Each passes the same contract as the real thing (tests/unit/test_fakes.py).

* :class:`MemoryStore` - a :class:`~pytest_compilecache.stores.Store` in memory, with failure injection.
* :class:`FakeLoader` - torch's mega-cache loader (``probe.load_artifacts``): records what it was given.
* :class:`FakeProbe` - the torch-facing probe functions the session roles call (no torch, no compile).
"""

from __future__ import annotations

import builtins
import os
import threading
from pathlib import Path
from typing import Any
from typing import Mapping

from pytest_compilecache import StoreError
from pytest_compilecache._env import CACHE_ENV
from pytest_compilecache.stores import ObjectTooLarge
from pytest_compilecache.stores import StoreEntry
from pytest_compilecache.stores import newest_first
from pytest_compilecache.stores import validate_key
from pytest_compilecache.stores import validate_prefix


class MemoryBackend:
    """The objects several :class:`MemoryStore` views share (as several S3 clients share one bucket)."""

    def __init__(self) -> None:
        self.objects: dict[str, tuple[bytes, float]] = {}
        self.clock = 1_700_000_000.0  # logical time: each put is strictly newer than the previous one
        self.lock = threading.Lock()


class MemoryStore:
    """A hand-written in-memory Store. ``fail`` names operations (get, get_head, put, list, delete) that
    raise StoreError."""

    def __init__(self, *, fail: tuple[str, ...] = (), backend: MemoryBackend | None = None) -> None:
        self.location = "memory://test"
        self.backend = backend or MemoryBackend()
        self.fail = set(fail)
        self.calls: list[str] = []

    @property
    def objects(self) -> dict[str, tuple[bytes, float]]:
        return self.backend.objects

    def _maybe_fail(self, operation: str) -> None:
        self.calls.append(operation)
        if operation in self.fail:
            raise StoreError(f"cannot {operation} at {self.location}: connection reset")

    def get(self, key: str, dest: Path, *, limit: int | None = None) -> bool:
        validate_key(key)
        self._maybe_fail("get")
        with self.backend.lock:
            found = self.objects.get(key)
        if found is None:
            return False
        if limit is not None and len(found[0]) > limit:
            raise ObjectTooLarge(f"{key} in {self.location} is {len(found[0])} bytes, more than {limit}")
        dest = Path(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.tmp")
        tmp.write_bytes(found[0])
        tmp.replace(dest)
        return True

    def get_head(self, key: str, limit: int) -> bytes | None:
        validate_key(key)
        self._maybe_fail("get_head")
        with self.backend.lock:
            found = self.objects.get(key)
        return None if found is None else found[0][:limit]

    def put(self, key: str, src: Path) -> None:
        validate_key(key)
        self._maybe_fail("put")
        data = Path(src).read_bytes()
        with self.backend.lock:
            self.backend.clock += 1
            self.objects[key] = (data, self.backend.clock)

    def list(self, prefix: str = "") -> builtins.list[StoreEntry]:
        validate_prefix(prefix)
        self._maybe_fail("list")
        with self.backend.lock:
            items = builtins.list(self.objects.items())
        return newest_first([StoreEntry(k, len(data), when) for k, (data, when) in items if k.startswith(prefix)])

    def delete(self, key: str) -> None:
        validate_key(key)
        self._maybe_fail("delete")
        with self.backend.lock:
            self.objects.pop(key, None)

    def set_modified(self, key: str, when: float) -> None:
        with self.backend.lock:
            data, _ = self.objects[key]
            self.objects[key] = (data, when)


class FakeLoader:
    """Stands in for torch's mega-cache loader: records what it got and where the cache dir pointed."""

    def __init__(self, error: Exception | None = None, rejects: bytes | None = None) -> None:
        self.error = error  # raised for every blob, or (with ``rejects``) for that blob only
        self.rejects = rejects
        self.blobs: list[bytes] = []
        self.cache_dirs: list[str | None] = []

    def __call__(self, blob: bytes) -> Mapping[str, int]:
        self.blobs.append(blob)
        self.cache_dirs.append(os.environ.get(CACHE_ENV))
        if self.error is not None and self.rejects in (None, blob):
            raise self.error
        return {"fx_graph": 2, "triton": 1}


class FakeProbe:
    """Stands in for :mod:`pytest_compilecache.probe` (torch) in the session's unit tests.

    Installed with ``monkeypatch`` over the functions the roles call. By default this process has not loaded
    Dynamo and has compiled nothing; ``run`` plays one test whose FX-graph lookups (``GraphLookup.to_json()``
    dicts) appear in ``graph_delta`` and are counted in ``delta`` as torch's counters would.
    ``header_dir`` is what ``precompiled_header_dir`` answers, ``header_uses`` what ``precompiled_headers_used``
    does. Each replaced function keeps the real one's
    signature (tests/unit/test_fakes.py checks), so a change in probe's API shows up here first.
    """

    REPLACES = (
        "torch_loaded",
        "dynamo_loaded",
        "mark",
        "moved",
        "delta",
        "graph_mark",
        "graph_delta",
        "precompiled_header_dir",
        "precompiled_headers_used",
    )

    def __init__(self, monkeypatch: Any) -> None:
        self.loaded = False
        self.lookups: list[dict[str, Any]] = []
        self.header_dir: str | None = None
        self.header_uses: list[dict[str, Any]] = []
        for name in self.REPLACES:
            monkeypatch.setattr(f"pytest_compilecache.probe.{name}", getattr(self, name))
        # the recorder asks sys.modules itself (it must not load probe before torch): the same answer
        monkeypatch.setattr("pytest_compilecache.recorder.torch_loaded", self.torch_loaded)

    def torch_loaded(self) -> bool:
        return True  # the roles take the measured path (the cold path has its own tests in test_session.py)

    def dynamo_loaded(self) -> bool:
        return self.loaded

    def mark(self) -> Any:
        return len(self.lookups)

    def moved(self, start: Any, now: Any) -> bool:
        return bool(now != (start or 0))

    def delta(self, start: Any) -> dict[str, Any]:
        new = self.lookups[start if isinstance(start, int) else 0 :]  # probe.ZERO: since torch's import
        if not new:
            return {}
        misses = sum(1 for g in new if g["o"] != "hit")
        return {"fxgraph": {"hit": len(new) - misses, "miss": misses}, "frames": 1}

    def graph_mark(self) -> int:
        return len(self.lookups)

    def graph_delta(self, start: int) -> list[dict[str, Any]]:
        return list(self.lookups[start:])

    def precompiled_header_dir(self) -> str | None:
        return self.header_dir

    def precompiled_headers_used(self) -> list[dict[str, Any]]:
        return list(self.header_uses)

    def run(self, recorder: Any, nodeid: str, *graphs: Any, intended: bool = False) -> None:
        """One test through ``recorder`` (a ``session.Recorder``) that looked up ``graphs``."""
        start = recorder.start()
        self.lookups += [g.to_json() for g in graphs]
        recorder.finish(nodeid, start, intended=intended)
