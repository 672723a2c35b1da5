"""Fuzzing the miss explanations (issue 28.2): whatever a graph record holds, explaining never raises.

A record comes from a bundle (unsigned stores) or from a shared cache dir anyone can write, and a crash
while explaining would repeat in every run. Seeded and bounded, like ``test_bundle_fuzz.py``: a few thousand
hostile records (edited component names and values, outcomes, signatures, streaks, top-level fields) and
hostile torch debug lines. Reading may refuse a record with ValueError, nothing else; a record that reads is
explained against hostile current lookups, written back, read again and rendered, all without an exception.
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path
from typing import Any

from pytest_compilecache import explain
from pytest_compilecache import report
from pytest_compilecache.explain import GraphLookup
from pytest_compilecache.explain import GraphsRecord
from pytest_compilecache.explain import SessionExplanation
from pytest_compilecache.explain import lookup as explain_lookup

# Override for a longer campaign: COMPILECACHE_FUZZ_SEED=7 COMPILECACHE_FUZZ_CASES=20000 pytest this file.
SEED = int(os.environ.get("COMPILECACHE_FUZZ_SEED", "20261124"))
CASES = int(os.environ.get("COMPILECACHE_FUZZ_CASES", "3000"))

CODE = (
    "<lambda>()\n\n\n\ndef forward(self, arg0_1):\n"
    "    mul = torch.ops.aten.mul.Tensor(arg0_1, {c});  arg0_1 = None\n    return (mul,)\n"
)
NAMES = [
    "gm",
    "example_inputs[0]",
    "example_inputs[1]",
    "example_inputs[²]",
    "example_inputs[" + "9" * 5000 + "]",
    "example_inputs[",
    "example_inputs[]",
    "example_inputs[-1]",
    "example_inputs[0",
    "fx_kwargs[is_backward]",
    "fx_kwargs[is_inference]",
    "inductor_config",
    "inductor_config_comms",
    "inductor_config.",
    "inductor_config.max_autotune",
    "torch_version",
    "system_info",
    "system_info[",
    "[",
    "]",
    "",
    "\x00\n\x1b[31m",
    "é[ü]",
    "##[error]x",
]
TOKENS = ["abcd1234", "abcd5678", "ffff1234", "", "a", "abcd12345678", "\n", "  ", "x" * 300]


def _value(rng: random.Random) -> Any:
    choice = rng.randrange(12)
    if choice == 0:
        return None
    if choice == 1:
        return "".join(rng.choice("=;[], 0123456789.²\n\x00é'\"#") for _ in range(rng.randrange(40)))
    if choice == 2:
        return " ".join(rng.choice(TOKENS) for _ in range(rng.randrange(50)))
    if choice == 3:  # a graph signature with a text section
        sig = " ".join(rng.choice(TOKENS[:4]) for _ in range(rng.randrange(8)))
        lines = [rng.choice(["mul = aten.mul(x, 2.0)", "# File: a.py:3", "", "\x00", "'" * 5, "1" * 400])]
        return sig + "\n" + "\n".join(lines * rng.randrange(5))
    if choice == 4:
        return "x" * rng.choice([0, 1, 160, 161, 5000])
    if choice == 5:
        return rng.choice(["True", "False", "None", "2.13.0", "shape=[8, 16];dtype=float32", "a=b=c;;="])
    if choice == 6:
        return rng.choice([1, 1.5, [], {}, ["a"], ["a", "b", "c"], True])  # not a string: refused
    return f"dtype=float{rng.choice([16, 32])};shape=[{rng.randrange(9)}, 16];requires_grad={rng.random() < 0.5}"


def _component(rng: random.Random) -> Any:
    digest = rng.choice(["h1", "h2", "h3", "", "h1" * 40])
    value = _value(rng)
    if value is None or rng.random() < 0.1:
        return digest if rng.random() < 0.95 else value
    return [digest, value] if rng.random() < 0.95 else [digest, value, "extra"]


def _lookup(rng: random.Random) -> Any:
    comps = {rng.choice(NAMES): _component(rng) for _ in range(rng.randrange(12))}
    if rng.random() < 0.7:
        comps["gm"] = ["g" + str(rng.randrange(3)), explain_lookup._code_signature(CODE.format(c=rng.random())) or ""]
    if rng.random() < 0.7:
        comps["fx_kwargs[is_backward]"] = ["b", rng.choice(["False", "True", "x"])]
        comps["fx_kwargs[is_inference]"] = ["i", rng.choice(["False", "True"])]
    entry: dict[str, Any] = {"k": rng.choice(["k1", "k2", "k3", ""]), "o": rng.choice([*explain.OUTCOMES, "x"])}
    if rng.random() < 0.97:
        entry["c"] = comps
    odd: list[Any] = [[], "k", None, {"k": 1}]
    return entry if rng.random() < 0.98 else rng.choice(odd)


def _record(rng: random.Random) -> Any:
    tests = {
        rng.choice(["t::a", "t::b", "t::c", "", "\n::error::x", "t::" + "é" * 50]): [
            _lookup(rng) for _ in range(rng.randrange(5))
        ]
        for _ in range(rng.randrange(4))
    }
    volatile = {
        nodeid: rng.choice(
            [
                ["a constant in graph statement 1", rng.choice([0, 1, 2, -5, 10**30])],
                ["a constant in graph statement 1", 2, ["abcd", "ffff"]],
                ["x", "2"],
                [1, 1],
                ["x"],
                None,
            ]
        )
        for nodeid in tests
    }
    data: dict[str, Any] = {
        "format": 1 if rng.random() < 0.97 else rng.choice([2, "1", None]),
        "torch": rng.choice(["2.13.0", "", 5, ["x"]]),
        "common": {rng.choice(NAMES): _component(rng) for _ in range(rng.randrange(4))},
        "tests": tests,
        "volatile": volatile,
        "truncated": rng.choice([0, 3, -1, 10**30, "x", None]),
        "created": rng.choice([0, 1.5e9, -1, 1e308, "now", None, float("nan")]),
    }
    for name in rng.sample(sorted(data), rng.randrange(3)):
        data[name] = rng.choice([None, [], {}, "x", 0])
    return json.loads(json.dumps(data))  # what a bundle's manifest or the cache dir's file would give


def _current(rng: random.Random) -> dict[str, list[GraphLookup]]:
    out: dict[str, list[GraphLookup]] = {}
    for nodeid in ("t::a", "t::b", "t::new"):
        lookups = []
        for _ in range(rng.randrange(4)):
            try:
                lookups.append(GraphLookup.from_json(_lookup(rng)))
            except ValueError:
                pass
        out[nodeid] = lookups
    return out


def _explain_everything(rng: random.Random, previous: GraphsRecord) -> None:
    current = _current(rng)
    why, record = explain.explain_session(current, previous, "bundle")
    for nodeid, lookups in current.items():
        explain.explain_test(lookups, previous.tests.get(nodeid))
        explain.never_hits([previous.tests.get(nodeid, []), lookups, lookups])
    kept = explain.carry_forward(record, previous)
    again = GraphsRecord.from_json(json.loads(json.dumps(kept.to_json())))
    assert set(again.tests) <= set(kept.tests)
    data = json.loads(json.dumps(why.to_json()))
    assert SessionExplanation.from_json(data).to_json() == data
    for line in report.why_lines(why):
        assert "\n" not in line and len(line) <= 2000
    assert len(report.why_markdown(why, 8000).encode()) <= 8000


def test_hostile_graph_records_are_refused_or_explained_never_a_crash(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    began, refused = time.monotonic(), 0
    for case in range(CASES):
        data = _record(rng)
        if case % 10 == 0:  # restored from a bundle over the dir's record (itself from an earlier case)
            try:
                explain.install_restored(tmp_path, data)
            except ValueError:
                pass
            assert explain.read_baseline(tmp_path, None)[1] is None
        try:
            previous = GraphsRecord.from_json(data)
        except ValueError:
            refused += 1
            continue
        try:
            _explain_everything(rng, previous)
        except Exception as exc:  # pragma: no cover - the failure message names the case to replay
            raise AssertionError(f"case {case} (seed {SEED}) crashed: {exc!r}\n{json.dumps(data)[:3000]}") from exc
    assert 0 < refused < CASES  # both paths ran
    assert time.monotonic() - began < 60


def test_hostile_torch_debug_lines_never_crash_the_capture() -> None:
    rng = random.Random(SEED + 1)
    parts = ["[", "]", " ", ":", "gm", "example_inputs", "[0]", "[²]", "inductor_config", "\n", "TensorMetadata(", ")"]
    for _ in range(CASES):
        lines = ["".join(rng.choice(parts) for _ in range(rng.randrange(12))) for _ in range(rng.randrange(20))]
        lines.append(f"[abc] gm: {CODE.format(c=rng.random())}" if rng.random() < 0.5 else "[abc] gm: ")
        lookup = explain.lookup_from_torch("k", "miss", lines, defaults={"x": "1"})
        assert GraphLookup.from_json(json.loads(json.dumps(lookup.to_json()))) == lookup
        explain.diff(lookup, explain.lookup_from_torch("k2", "miss", lines[::-1]))
