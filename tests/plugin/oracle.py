"""torch's own logs and counters as the oracle for the plugin's per-test Dynamo costs and cache counts.

Two halves, one concept:

* **The tap**: this module is also a pytest plugin. Loaded into the session the plugin measures
  (``-p tests.plugin.oracle``, the repository root importable; ``TORCH_LOGS=recompiles,graph_breaks``; the
  folder in ``$COMPILECACHE_ORACLE_DIR``), it writes one JSON line per record torch logs under
  ``torch._dynamo`` (where Dynamo's loggers end: torch propagates no further), tagged with the test running in
  that process, and one line per test with what torch's cache counters moved by during it
  (``counters["inductor"]["fxgraph_cache_*"]``, ``counters["aot_autograd"]["autograd_cache_*"]``). Its window is
  the plugin's: ``pytest_runtest_logstart`` to ``pytest_runtest_logfinish``. One file per process,
  ``oracle-<xdist worker or main>.jsonl``. It never imports torch (the plugin must set the cache dir before
  anything does); torch keeps a handler it did not create (``torch._logging._internal._clear_handlers``).
* **The reading**: :func:`oracle` reads those files back (recompiles as function and first guard failure, graph
  breaks as torch's logged reasons, frames that hit the recompile limit, the counters), :func:`plugin` reads the
  same facts from the plugin's JSON report, :func:`mismatches` says where they differ.

Used by tests/plugin/test_dynamo_costs.py on a small suite and by bench/dynamo_oracle.py on outside suites.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

DIR_ENV = "COMPILECACHE_ORACLE_DIR"
TORCH_LOGS = "recompiles,graph_breaks"
NO_TEST = "(no test)"
FILES = "oracle-*.jsonl"

# torch's counters (torch/_inductor/codecache.py, torch/_functorch/_aot_autograd/autograd_cache.py, 2.6-2.15):
# report layer -> (counter group, key prefix, fields). The fields are the JSON report's.
COUNTERS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "fxgraph": ("inductor", "fxgraph_cache_", ("hit", "miss", "bypass")),
    "aotautograd": ("aot_autograd", "autograd_cache_", ("hit", "miss", "bypass", "guard_miss")),
}

_RECOMPILING = r"Recompiling function (\S+) in .*?\n.*?triggered by the following guard failure\(s\):\n\s*- (.*)"
# Every graph break torch logs (symbolic_convert's log_graph_break), in full or, when one of the same kind at the
# same place was logged before in this process, as "(user stack suppressed due to duplicate graph break)". A
# duplicate is a break of its own: a recompiled frame, another frame through the same code, a frame traced again
# after ``torch._dynamo.reset()`` (whose duplicate checker it does not reset) or under ``torch._dynamo.explain``
# (which logs every break that way). The plugin counts every break torch logs; torch's own counter
# ``counters["graph_break"]`` misses some of them (tests/plugin/test_oracle.py shows each).
_GRAPH_BREAK = r"\AGraph break (?:\(user stack suppressed due to duplicate graph break\) )?in user code at"
# What torch did about a break, before the break it met: it cannot resume from it, or it gives up on the frame
# ("graph break in loop" and other breaks it fails to handle: the whole frame then runs eagerly).
_WHAT_TORCH_DID = ("Encountered graph break that we cannot resume from", "Failed to handle graph break gracefully")
_PREFIXED = ("Encountered ", "Failed to handle ")  # "<what torch was doing>:\n\n<the exception's message>"
_LIMIT = r"torch._dynamo hit config\.\w+ \(\d+\)\n\s*function: '([^']+)'"


# --------------------------------------------------------------------------- the tap (a pytest plugin)


class _Tap:
    """The test running in this process, the counters at its start, and where this process writes."""

    def __init__(self, folder: str) -> None:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        self.path = os.path.join(folder, f"oracle-{worker}.jsonl")
        self.running = NO_TEST
        self.start: dict[str, dict[str, int]] = {}

    def write(self, entry: dict[str, Any]) -> None:
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(entry) + "\n")


class _Tagged(logging.Handler):
    def __init__(self, tap: _Tap) -> None:
        super().__init__(logging.DEBUG)
        self.tap = tap

    def emit(self, record: logging.LogRecord) -> None:
        self.tap.write({"test": self.tap.running, "logger": record.name, "message": record.getMessage()})


_tap: _Tap | None = None


def counts() -> dict[str, dict[str, int]]:
    """torch's cache counters now, by report layer; zeros before Dynamo is imported (they start there)."""
    utils = sys.modules.get("torch._dynamo.utils")
    counters: Any = getattr(utils, "counters", None) or {}
    found: dict[str, dict[str, int]] = {}
    for layer, (group, prefix, fields) in COUNTERS.items():
        values = counters.get(group) or {}
        found[layer] = {field: int(values.get(prefix + field, 0)) for field in fields}
    return found


def pytest_configure(config: Any) -> None:
    global _tap
    folder = os.environ.get(DIR_ENV)
    if folder and _tap is None:
        _tap = _Tap(folder)
        logging.getLogger("torch._dynamo").addHandler(_Tagged(_tap))


def pytest_runtest_logstart(nodeid: str) -> None:
    if _tap is not None:
        _tap.running = nodeid
        _tap.start = counts()


def pytest_runtest_logfinish(nodeid: str) -> None:
    if _tap is not None and _tap.running == nodeid:
        now = counts()
        moved = {
            layer: {field: value - _tap.start.get(layer, {}).get(field, 0) for field, value in fields.items()}
            for layer, fields in now.items()
        }
        if any(value for fields in moved.values() for value in fields.values()):
            _tap.write({"test": nodeid, "counters": moved})
        _tap.running = NO_TEST


# --------------------------------------------------------------------------- the reading


def empty_oracle() -> dict[str, Any]:
    return {"recompiles": [], "breaks": [], "limits": [], **{layer: {} for layer in COUNTERS}}


def empty_plugin() -> dict[str, Any]:
    return {"recompiles": [], "breaks": [], "break_count": 0, "limits": [], **{layer: {} for layer in COUNTERS}}


def break_reason(message: str) -> str:
    """A logged graph break's reason as the plugin words one (``<what failed>: <torch's explanation>``, from the
    exception's first line and its ``Explanation:``), after what torch did about it when it did more than split
    the graph ("Failed to handle graph break gracefully: ...")."""
    reason = message.split("Graph Break Reason: ", 1)[1].split("User code traceback:", 1)[0]
    kind = next((kind for kind in _WHAT_TORCH_DID if reason.startswith(kind)), None)
    if reason.startswith(_PREFIXED) and ":\n\n" in reason:
        reason = reason.split(":\n\n", 1)[1]
    lines = [line.strip() for line in reason.splitlines() if line.strip()] or [""]
    explained = next((line[len("Explanation:") :].strip() for line in lines if line.startswith("Explanation:")), "")
    text = f"{lines[0]}: {explained}" if explained else lines[0]
    if kind and not text.startswith(kind):
        text = f"{kind}: {text}"
    return " ".join(text.split())


def oracle(root: Path) -> dict[str, dict[str, Any]]:
    """Per test, what torch logged: recompiles as (function, first guard failure), graph breaks as their
    reasons, and the functions that hit the recompile limit; and what its cache counters moved by (only the
    fields that moved). Records logged outside any test are under :data:`NO_TEST`."""
    found: dict[str, dict[str, Any]] = {}
    for path in sorted(root.glob(FILES)):
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            facts = found.setdefault(entry["test"], empty_oracle())
            if "counters" in entry:
                for layer, fields in entry["counters"].items():
                    facts[layer] = {field: value for field, value in fields.items() if value}
                continue
            message = entry["message"]
            recompile = re.search(_RECOMPILING, message)
            if recompile:
                reason = re.sub(r"\A\d+/\d+: ", "", recompile.group(2).strip())
                facts["recompiles"].append((recompile.group(1), " ".join(reason.split())))
            elif re.search(_GRAPH_BREAK, message):
                facts["breaks"].append(break_reason(message))
            limit = re.search(_LIMIT, message)
            if limit:
                facts["limits"].append(limit.group(1))
    return found


def plugin(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per test, the same facts as the plugin's JSON report says them."""
    found = {}
    for test in report["tests"]:
        recompiles = [
            (entry["function"].split(" (")[0], entry["reason"])
            for entry in test["recompiled"]
            for _ in range(entry["count"])
        ]
        found[test["nodeid"]] = {
            "recompiles": recompiles,
            "breaks": test["graph_break_reasons"],
            "break_count": test["graph_breaks"],
            "limits": [hit["function"].split(" (")[0] for hit in test["limit_hit"]],
            **{layer: {field: value for field, value in test[layer].items() if value} for layer in COUNTERS},
        }
    return found


def mismatches(told: dict[str, Any], said: dict[str, Any]) -> list[str]:
    """Where the plugin's facts for one test (``said``, from :func:`plugin`) differ from torch's (``told``, from
    :func:`oracle`): one line each, empty when they agree."""
    from pytest_compilecache.record_fields import TEXT_CHARS  # here: the tap imports nothing but the stdlib

    found: list[str] = []
    # The plugin keeps a reason's first TEXT_CHARS characters (a kornia guard failure: 330); so does the oracle.
    told = {**told, "recompiles": [(function, reason[:TEXT_CHARS]) for function, reason in told["recompiles"]]}
    if Counter(said["recompiles"]) != Counter(told["recompiles"]):
        found.append(f"recompiles: plugin {sorted(said['recompiles'])}, torch {sorted(told['recompiles'])}")
    if said["break_count"] != len(told["breaks"]):
        found.append(f"graph breaks: plugin {said['break_count']}, torch logged {len(told['breaks'])}")
    if len(said["breaks"]) != len(set(told["breaks"])):
        found.append(f"distinct break reasons: plugin {len(said['breaks'])}, torch {len(set(told['breaks']))}")
    for ours in said["breaks"]:  # "<what failed>: <torch's explanation>", both in torch's logged reason
        if not any(all(part in theirs for part in ours.split(": ", 1)) for theirs in told["breaks"]):
            found.append(f"break reason not in torch's log: {ours}")
    if said["limits"] != told["limits"]:
        found.append(f"recompile limit hits: plugin {said['limits']}, torch {told['limits']}")
    for layer in COUNTERS:
        if said[layer] != told[layer]:
            found.append(f"{layer}: plugin {said[layer]}, torch's counters {told[layer]}")
    return found
