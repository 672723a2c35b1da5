"""The per-test record's fields, in one place: what :mod:`probe` measures for a test (its delta has exactly this
shape), what :mod:`stats` adds up per test and per session, and what the JSON report carries per test.

A new per-test statistic is one entry here (and, for people to see it, a renderer in :mod:`report`). A leaf:
imports nothing of ours.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

from typing import Any
from typing import Mapping

FX_FIELDS = ("hit", "miss", "bypass")
AOT_FIELDS = ("hit", "miss", "bypass", "guard_miss")
REMOTE_FIELDS = ("fx_hit", "fx_miss", "aot_hit", "aot_miss")
# Groups of lookup counts: ``fxgraph`` and ``aotautograd`` hold torch's cache lookup outcomes; ``remote`` the subset
# of those lookups that went to a remote (Redis) cache, when torch reports it (2.11+).
COUNT_GROUPS: dict[str, tuple[str, ...]] = {"fxgraph": FX_FIELDS, "aotautograd": AOT_FIELDS, "remote": REMOTE_FIELDS}

# The GPU layers below the FX graph: triton kernel files written from FX entries' triton bundles, triton cache
# entries built (kernels compiled, helper libraries built: new to triton's cache), autotuning benchmarks torch
# counted (an FX hit replays its entry's counts), and seconds spent compiling triton kernels and autotuning
# (measured, never replayed).
GPU_COUNTS = ("triton_bundle_files", "triton_built", "autotune_benchmarks")
GPU_SECONDS = ("triton_compile_seconds", "autotune_seconds")
# What shows the GPU layers were in play. Not triton_compile_seconds alone: torch also books its wait for
# parallel C++ compiles there (``async_compile.wait``), so CPU sessions have it too.
GPU_SIGNALS = ("triton_bundle_files", "triton_built", "autotune_benchmarks", "autotune_seconds")

# Whole numbers summed over a test's phases and over a session's tests: frames Dynamo compiled, how many of them
# were recompiles of a frame compiled before, graph breaks torch counted.
COUNTS = ("frames", "recompiles", "graph_breaks")
SECONDS = ("compile_seconds",)
# Distinct texts, in order of first appearance: the FX-graph cache's bypass reasons, torch's graph-break reasons.
TEXTS = ("bypass_reasons", "graph_break_reasons")
# Distinct entries (plain dicts with a ``count``; equal but for their count, they merge): each recompile with
# torch's guard-failure reason (``function``, ``reason``, ``first``: the test that compiled the frame first in that
# process, "" when unknown), and each frame that hit torch's recompile limit and so is compiled no more
# (``function``, ``limit``, ``reason``: the last guard failure).
ENTRIES = ("recompiled", "limit_hit")
MAX_TEXTS = 20  # distinct texts or entries kept per test and field: the rest add no new reason
TEXT_CHARS = 300
# How a frame Dynamo compiled is named when it is torch's own code, not the user's: the wrapper ``torch.compile``
# puts around a module's forward (``inner`` in torch/_dynamo/external_utils.py), the same frame for every compiled
# module. Nothing takes two frames so named for one function: not the miss explanations' earlier graphs of a new
# test, not a recompile's "first compiled by".
TORCH_FRAME = "torch's "


def _zero() -> dict[str, Any]:
    out: dict[str, Any] = {group: dict.fromkeys(fields, 0) for group, fields in COUNT_GROUPS.items()}
    out["gpu"] = {**dict.fromkeys(GPU_COUNTS, 0), **dict.fromkeys(GPU_SECONDS, 0.0)}
    out.update(dict.fromkeys(COUNTS, 0))
    out.update(dict.fromkeys(SECONDS, 0.0))
    return out


_ZERO = _zero()


def empty_delta() -> dict[str, Any]:
    """A delta with every field at zero: the shape :func:`probe.delta` fills in and ``ItemRecord.add`` reads
    (a copy of one made at import: every test's end asks for one)."""
    return {name: dict(value) if type(value) is dict else value for name, value in _ZERO.items()}


def counts(fields: tuple[str, ...], data: Mapping[str, Any] | None = None) -> dict[str, int]:
    """``fields`` read from ``data`` as whole numbers (missing: 0)."""
    data = data if isinstance(data, Mapping) else {}
    return {name: int(data.get(name, 0) or 0) for name in fields}


def gpu(data: Mapping[str, Any] | None = None) -> dict[str, float]:
    """The GPU fields read from ``data`` (missing: 0)."""
    data = data if isinstance(data, Mapping) else {}
    out: dict[str, float] = {name: int(data.get(name, 0) or 0) for name in GPU_COUNTS}
    out.update({name: float(data.get(name, 0.0) or 0.0) for name in GPU_SECONDS})
    return out


def gpu_json(values: Mapping[str, float]) -> dict[str, Any]:
    return {
        **{name: int(values[name]) for name in GPU_COUNTS},
        **{name: round(values[name], 4) for name in GPU_SECONDS},
    }


def merge_texts(into: list[str], new: Any) -> None:
    """Add the distinct strings of ``new`` to ``into`` (bounded: :data:`MAX_TEXTS`, :data:`TEXT_CHARS` each)."""
    for text in new if isinstance(new, (list, tuple)) else ():
        text = str(text)[:TEXT_CHARS]
        if text not in into and len(into) < MAX_TEXTS:
            into.append(text)


def merge_entries(into: list[dict[str, Any]], new: Any) -> None:
    """Add ``new`` entries to ``into``: an entry equal to one there but for its ``count`` adds to that count."""
    for entry in new if isinstance(new, (list, tuple)) else ():
        if not isinstance(entry, Mapping):
            continue  # a malformed entry from a worker is dropped, not fatal
        plain = {str(k): str(v)[:TEXT_CHARS] for k, v in entry.items() if k != "count" and v is not None}
        count = entry.get("count", 1)
        count = count if type(count) is int and count > 0 else 1
        same = next((e for e in into if {k: v for k, v in e.items() if k != "count"} == plain), None)
        if same is not None:
            same["count"] += count
        elif len(into) < MAX_TEXTS:
            into.append({**plain, "count": count})


# The record of what compiled outside every test of a process (merged across xdist workers): a compile at import
# or collection, in a session hook. Counted in the totals, not as a test. (pytest runs a fixture's teardown inside a
# test's: a session fixture's inside the last test's, which counts it.)
OUTSIDE = "(outside tests)"
