"""A stand-in for the plugin's wiring of issue 12, loaded with ``-p _explain_capture`` by explain_overhead.py.

With ``EXPLAIN_CAPTURE=1`` it does what the integrated plugin will do: watch for torch's codecache at
configure, take every test's lookups, explain them at session end against the previous record and save
the new one. With ``EXPLAIN_CAPTURE=0`` it is loaded but does nothing, so both variants pay the same
plugin-loading cost and differ by the capture alone.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any
from typing import Iterator

import pytest

ON = os.environ.get("EXPLAIN_CAPTURE") == "1"
_graphs: dict[str, list[Any]] = {}


_spent = {"capture": 0.0, "finish": 0.0}


def pytest_configure(config: pytest.Config) -> None:
    if ON:
        from pytest_compilecache import probe

        probe.watch_graph_lookups()
        record = probe._record_lookup

        def timed(key: Any, debug_lines: Any, result: Any) -> None:
            # What the capture adds to each lookup, measured in place (the wrapper calls this).
            start = time.perf_counter()
            try:
                record(key, debug_lines, result)
            finally:
                _spent["capture"] += time.perf_counter() - start

        probe._record_lookup = timed


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    if not ON:
        yield
        return
    from pytest_compilecache import probe

    start = probe.graph_mark()
    yield
    _graphs[item.nodeid] = probe.graph_delta(start)


def pytest_sessionfinish(session: pytest.Session) -> None:
    if not ON:
        return
    from pytest_compilecache import explain

    start = time.perf_counter()
    record_dir = Path(os.environ["EXPLAIN_RECORD_DIR"])
    try:
        previous = explain.load_record(record_dir)
    except (OSError, ValueError):
        previous = None
    current = {k: [explain.GraphLookup.from_json(g) for g in v] for k, v in _graphs.items()}
    result, record = explain.explain_session(current, previous, "previous session")
    explain.save_record(record_dir, explain.carry_forward(record, previous))
    _spent["finish"] = time.perf_counter() - start
    out = os.environ.get("EXPLAIN_RESULT")
    if out:
        lookups = sum(len(v) for v in current.values())
        cpu = time.process_time()
        data = {"lookups": lookups, "spent": _spent, "process_cpu_s": cpu, "explanation": result.to_json()}
        Path(out).write_text(json.dumps(data))
