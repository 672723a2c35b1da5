"""explain.py: torch's debug lines -> compact lookups, a miss diffed in words, never-hit tests, the bounded record.

The debug lines here follow torch 2.13's ``FxGraphCachePickler.debug_lines`` format (``[<hash>] <attr>[<index>]:
<value>``); ``tests/integration/test_explain_real.py`` proves the same on real compiles.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_compilecache import explain
from pytest_compilecache.explain import GraphLookup
from pytest_compilecache.explain import GraphsRecord
from pytest_compilecache.explain import SessionExplanation
from pytest_compilecache.explain import lookup as explain_lookup

CODE = """GraphModule()



def forward(self, arg0_1):
    mul = torch.ops.aten.mul.Tensor(arg0_1, {c});  arg0_1 = None
    relu = torch.ops.aten.relu.default(mul);  mul = None
    return (relu,)
"""


def _tensor(shape: str, dtype: str = "float32", grad: bool = False, stride: str = "(16, 1)") -> str:
    return (
        f"TensorMetadata(dtype=torch.{dtype}, shape=torch.Size([{shape}]), stride={stride}, "
        f"device=device(type='cpu'), layout=torch.strided, memory_format=torch.contiguous_format, "
        f"storage_offset=0, storage_bytes=None, requires_grad={grad}, is_quantized=False, is_conj=False, "
        f"is_neg=False, is_inference=False, is_sparse=False, is_coalesced=None, dense_dim=None, sparse_dim=None)"
    )


def _h(value: object) -> str:
    """A stand-in for torch's component hash: equal values, equal hashes."""
    return explain_lookup._short(repr(value)) + "abcdefghijklmnopqrstuvwxyz"


def _lines(
    *,
    c: str = "2.0",
    inputs: tuple[str, ...] = ("8, 16",),
    dtype: str = "float32",
    grad: bool = False,
    options: dict[str, str] | None = None,
    torch_key: str = "k1",
    system: str = "s1",
    backward: bool = False,
) -> list[str]:
    code = CODE.format(c=c)
    lines = [f"[{_h(code)}] gm: {code}"]
    for i, shape in enumerate(inputs):
        meta = _tensor(shape, dtype, grad)
        lines.append(f"[{_h(meta)}] example_inputs[{i}]: {meta}")
    lines += [
        f"[{_h(backward)}] fx_kwargs[is_backward]: {backward}",
        f"[{_h(False)}] fx_kwargs[is_inference]: False",
        f"[{_h('fn')}] fx_kwargs[get_decomp_fn]: <function select_decomp_table at 0x7fd218e16ac0>",
        f"[{_h(torch_key)}] torch_version: \ufffd\x01garbage",
        f"[{_h(system)}] system_info[hash]: {system}",
    ]
    config = {"debug": "False", "max_autotune": "False", "epilogue_fusion": "True"} | (options or {})
    lines += [f"[{_h(v)}] inductor_config[{k}]: {v}" for k, v in config.items()]
    return lines


DEFAULTS = {"debug": "False", "max_autotune": "False", "epilogue_fusion": "True"}


def _lookup(outcome: str = "miss", *, torch_version: str = "2.13.0", **kw: Any) -> GraphLookup:
    lines = _lines(**kw)
    key = "f" + explain_lookup._short("\n".join(lines))
    return explain.lookup_from_torch(
        key,
        outcome,
        lines,
        defaults=DEFAULTS,
        values={"torch_version": torch_version},
    )


# --------------------------------------------------------------------------- parsing


def test_lookup_from_torch_keeps_short_readable_values_and_collapses_the_config() -> None:
    lookup = _lookup(options={"max_autotune": "True"})
    assert (
        lookup.value("example_inputs[0]") == "dtype=float32;shape=[8, 16];stride=(16, 1);device=cpu;requires_grad=False"
    )
    assert lookup.value("fx_kwargs[get_decomp_fn]") == "<function select_decomp_table>"  # no address
    assert lookup.value("torch_version") == "2.13.0"
    assert lookup.value("inductor_config.max_autotune") == "True"
    assert "inductor_config.debug" not in lookup.components  # at its default: only in the digest
    assert lookup.components["inductor_config"][1] is None
    assert all(len(digest) == explain.HASH_CHARS for digest, _ in lookup.components.values())
    assert lookup.kind == ("False", "False")


def test_unparsable_lines_are_ignored_and_large_values_keep_only_their_hash() -> None:
    big = "x" * (explain.VALUE_CHARS + 1)
    lookup = explain.lookup_from_torch("k", "hit", ["garbage", f"[abc] custom: {big}", 42])  # type: ignore[list-item]
    assert lookup.components == {"custom": ("abc", None)}


def test_an_index_with_a_colon_parses() -> None:
    lookup = explain.lookup_from_torch("k", "hit", ["[abc] system_info[device:0]: NVIDIA H100", "[d] x[1: 2"])
    assert lookup.components == {"system_info[device:0]": ("abc", "NVIDIA H100")}


def test_the_values_budget_bounds_a_lookup_with_many_inputs() -> None:
    lookup = _lookup(inputs=tuple(f"{i}, 16" for i in range(200)))
    kept = [v for _, v in lookup.components.values() if v]
    assert sum(len(v) for v in kept) <= explain.VALUES_PER_LOOKUP + 200
    assert lookup.components["example_inputs[199]"][1] is None


def test_lookup_json_round_trip_and_hostile_input() -> None:
    lookup = _lookup()
    assert GraphLookup.from_json(json.loads(json.dumps(lookup.to_json()))) == lookup
    bad: object
    for bad in ([], {"k": 1, "o": "miss"}, {"k": "a", "o": "boom"}, {"k": "a", "o": "hit", "c": {"x": [1]}}):
        with pytest.raises(ValueError):
            GraphLookup.from_json(bad)


# --------------------------------------------------------------------------- one miss, in words


@pytest.mark.parametrize(
    ("before", "after", "reasons"),
    [
        ({}, {"inputs": ("8, 32",)}, ["input 0 shape [8, 16] -> [8, 32]"]),
        ({}, {"dtype": "bfloat16"}, ["input 0 dtype float32 -> bfloat16"]),
        ({}, {"grad": True}, ["input 0 requires_grad False -> True"]),
        ({}, {"c": "3.0"}, ["graph code changed: a constant in graph statement 1 (2.0 -> 3.0)"]),
        ({}, {"options": {"max_autotune": "True"}}, ["inductor config changed: max_autotune"]),
        ({}, {"torch_key": "k2"}, ["torch build (same version, other source) changed"]),
        ({}, {"torch_key": "k2", "torch_version": "2.14.0"}, ["torch version 2.13.0 -> 2.14.0"]),
        ({}, {"system": "s2"}, ["system (compiler, devices or drivers) changed"]),
        ({}, {"inputs": ("8, 16", "4")}, ["number of graph inputs 1 -> 2"]),
    ],
)
def test_explain_miss_names_the_one_thing_that_changed(
    before: dict[str, Any], after: dict[str, Any], reasons: list[str]
) -> None:
    assert explain.explain_miss(_lookup(**after), [_lookup("hit", **before)]) == reasons


def test_explain_miss_new_test_new_graph_and_same_key() -> None:
    miss = _lookup()
    assert explain.explain_miss(miss, None) == [explain.NEW_TEST]
    assert explain.explain_miss(miss, []) == [explain.NEW_GRAPH]
    assert explain.explain_miss(miss, [_lookup(backward=True)]) == [explain.NEW_GRAPH]  # only other kinds
    assert explain.explain_miss(miss, [_lookup("hit")]) == [explain.SAME_KEY]
    guarded = _lookup("guard_miss")
    assert explain.explain_miss(guarded, [_lookup("hit")]) == [explain.GUARD_MISS]
    assert explain.explain_test([guarded], [_lookup("hit")])[0].reasons == [explain.GUARD_MISS]


def test_a_miss_of_an_earlier_graphs_very_key_is_that_graph_beside_the_tests_other_earlier_graphs() -> None:
    """The test compiled two graphs last run and looks up only the first now, whose entry is gone: the same key,
    not a diff against the other earlier graph (what the session said, while compile_cache_stats.why in the
    test said otherwise)."""
    first, other = _lookup("hit"), _lookup("hit", c="9.0")
    assert [m.reasons for m in explain.explain_test([_lookup()], [first, other])] == [[explain.SAME_KEY]]
    assert [m.reasons for m in explain.explain_test([_lookup()], [other, first])] == [[explain.SAME_KEY]]
    guarded = explain.explain_test([_lookup("guard_miss")], [other, first])
    assert [m.reasons for m in guarded] == [[explain.GUARD_MISS]]


def test_a_training_graph_is_compared_with_an_inference_graph_when_nothing_closer_exists() -> None:
    flag = f"[{_h(True)}] fx_kwargs[is_inference]: True"
    lines = [flag if "fx_kwargs[is_inference]" in ln else ln for ln in _lines()]
    inference = explain.lookup_from_torch("f-inference", "hit", lines, defaults=DEFAULTS)
    assert explain.explain_miss(_lookup(c="3.0"), [inference]) == [
        "requires_grad False -> True (an input or parameter now requires grad: a training graph)"
    ]
    assert explain.diff(_lookup(c="3.0"), inference) == [
        "requires_grad True -> False (nothing requires grad now, or no_grad: an inference graph)"
    ]


def test_explain_miss_compares_with_the_most_similar_candidate() -> None:
    far = _lookup("hit", c="5.0", dtype="bfloat16")
    near = _lookup("hit", dtype="bfloat16")
    assert explain.explain_miss(_lookup(), [far, near]) == ["input 0 dtype bfloat16 -> float32"]


def test_a_structural_code_change_is_not_called_a_constant() -> None:
    old = _lookup("hit")
    new = _lookup()
    code = CODE.format(c="2.0").replace("relu", "sigmoid")
    new.components["gm"] = (_h(code)[:12], explain_lookup._code_signature(code))
    new.key = "f-other"
    assert explain.diff(old, new) == [
        "graph code changed: 2 statements differ (2 changed); first at statement 2: sigmoid = aten.sigmoid.default(mul)"
    ]


def test_explain_test_pairs_each_miss_with_an_unmatched_earlier_graph() -> None:
    fw, bw = _lookup("hit"), _lookup("hit", backward=True)
    now = [_lookup("hit"), _lookup(backward=True, c="3.0"), _lookup(inputs=("1, 1",))]
    out = explain.explain_test(now, [fw, bw])
    assert [m.reasons for m in out] == [
        ["graph code changed: a constant in graph statement 1 (2.0 -> 3.0)"],
        [explain.NEW_GRAPH],
    ]
    assert explain.explain_test([_lookup()], None)[0].reasons == [explain.NEW_TEST]
    assert explain.explain_test([_lookup("hit")], [fw]) == []


def test_a_graph_missed_by_every_worker_of_dist_each_is_explained_once() -> None:
    # --dist each: two workers ran the test, each missed the same graph, and both lookups are the test's.
    earlier = [_lookup("hit")]
    now = [_lookup(c="3.0"), _lookup(c="3.0")]
    out = explain.explain_test(now, earlier)
    assert [m.reasons for m in out] == [["graph code changed: a constant in graph statement 1 (2.0 -> 3.0)"]]
    assert [m.reasons for m in explain.explain_test(now, None)] == [[explain.NEW_TEST]]


# --------------------------------------------------------------------------- tests that can never hit


def test_never_hits_flags_a_constant_that_changes_every_run() -> None:
    runs = [[_lookup(c=c)] for c in ("0.84", "0.76", "0.42", "0.17")]
    assert explain.never_hits(runs) == "a constant in graph statement 1"  # three changes in a row
    assert explain.never_hits(runs[:1]) is None


def test_never_hits_needs_evidence_that_one_edit_cannot_give() -> None:
    """Issue 29.10: ``4.0`` -> ``4.25`` once, then hits, is an edit, not a test that never hits."""
    runs = [[_lookup(c=c)] for c in ("0.84", "0.76", "0.42")]
    assert explain.never_hits(runs[:2]) is None  # one change: an edit
    assert explain.never_hits(runs) is None  # two: two edits, perhaps
    edit = [[_lookup(c="4.0")], [_lookup(c="4.25")], [_lookup("hit", c="4.25")], [_lookup("hit", c="4.25")]]
    assert explain.never_hits(edit) is None
    back = [[_lookup(c=c)] for c in ("4.0", "4.25", "4.0")]
    assert explain.never_hits(back) is None  # an edit and its revert (issue 41): not a test that never hits
    back_and_forth = [[_lookup(c=c)] for c in ("4.0", "4.25", "4.0", "4.25", "4.0")]
    assert explain.never_hits(back_and_forth) is None  # values that repeat are edits, not random numbers
    other = [[_lookup(c="1.0")], [_lookup(c="2.0")], [_lookup(c="2.0", inputs=("8, 32",))], [_lookup(c="3.0")]]
    assert explain.never_hits(other) is None  # the streak broke
    # Another statement changing starts a new streak: the evidence is per statement.
    streak = explain.Streak("a constant in graph statement 1", 2, ("a", "b", "c"))
    assert streak.then(("a constant in graph statement 2", "c", "d")) == explain.Streak(
        "a constant in graph statement 2", 1, ("c", "d")
    )


def test_an_edit_and_its_revert_says_what_changed_and_why_it_missed() -> None:
    """Issue 41, finding 3: bundles made with 1.5, 2.0, then 1.5 again. The third run's miss is the revert
    (``2.0 -> 1.5``), its graph absent from the bundle the second run made: said as such, not "can never hit"."""
    _, record = explain.explain_session({"t::a": [_lookup(c="1.5")]}, None)
    _, record = explain.explain_session({"t::a": [_lookup(c="2.0")]}, record, "bundle")
    third, _ = explain.explain_session({"t::a": [_lookup(c="1.5")]}, record, "bundle")
    assert third.never_hit == {}
    [miss] = third.misses["t::a"]
    assert miss.reasons == ["graph code changed: a constant in graph statement 1 (2.0 -> 1.5)", explain.CAME_BACK]


def test_never_hits_ignores_other_changes_and_runs_that_hit() -> None:
    assert explain.never_hits([[_lookup()], [_lookup(inputs=("8, 32",))]]) is None
    assert explain.never_hits([[_lookup(c="1.0")], [_lookup("hit", c="2.0")]]) is None
    assert explain.never_hits([[_lookup(c="1.0")], [_lookup(c="2.0")], [_lookup("hit", c="2.0")]]) is None


def test_explain_session_counts_the_streak_and_explains_against_the_record() -> None:
    first, record1 = explain.explain_session({"t::a": [_lookup(c="0.1")]}, None)
    assert first.misses == {} and first.compared_with == ""
    second, record2 = explain.explain_session(
        {"t::a": [_lookup(c="0.2")], "t::b": [_lookup()]}, record1, "previous session"
    )
    assert second.never_hit == {}  # one change: perhaps an edit
    assert second.misses["t::a"][0].reasons == ["graph code changed: a constant in graph statement 1 (0.1 -> 0.2)"]
    assert second.misses["t::b"][0].reasons == [explain.NEW_TEST]
    assert record2.volatile["t::a"].what == "a constant in graph statement 1"
    assert record2.volatile["t::a"].changes == 1
    third, record3 = explain.explain_session({"t::a": [_lookup(c="0.3")]}, record2, "bundle")
    assert record3.volatile["t::a"].changes == 2 and third.never_hit == {}
    assert third.to_json()["compared_with"] == "bundle"
    again = GraphsRecord.from_json(json.loads(json.dumps(record3.to_json())))  # the streak survives the record
    fourth, record4 = explain.explain_session({"t::a": [_lookup(c="0.4")]}, again, "bundle")
    assert fourth.never_hit == {"t::a": ("a constant in graph statement 1", 4)}
    assert record4.volatile["t::a"].changes == 3
    kept = explain.carry_forward(record3, record2)
    assert set(kept.tests) == {"t::a", "t::b"}


# --------------------------------------------------------------------------- the record on disk


def test_record_round_trip_stores_common_components_once(tmp_path: Path) -> None:
    record = GraphsRecord(tests={f"t::{i}": [_lookup(c=f"{i}.0"), _lookup("hit", backward=True)] for i in range(20)})
    data = record.to_json()
    assert "system_info[hash]" in data["common"]
    assert all("system_info[hash]" not in g["c"] for lookups in data["tests"].values() for g in lookups)
    explain.save_record(tmp_path, record)
    again = explain.load_record(tmp_path)
    assert again is not None and again.tests == record.tests
    assert [p.name for p in tmp_path.iterdir()] == [explain.RECORD_NAME]  # no temp file left


def test_record_is_bounded_and_says_how_much_it_dropped() -> None:
    record = GraphsRecord(tests={f"t::{i}": [_lookup(c=f"{i}.0")] * 40 for i in range(50)})
    data = record.to_json(max_bytes=20_000)
    assert len(json.dumps(data)) < 25_000
    assert data["truncated"] == 50 - len(data["tests"]) > 0
    assert all(len(v) == explain.MAX_LOOKUPS_PER_TEST for v in data["tests"].values())


def test_load_record_absent_corrupt_and_hostile(tmp_path: Path) -> None:
    assert explain.load_record(tmp_path) is None
    path = tmp_path / explain.RECORD_NAME
    bad: object
    for bad in ("{", '{"format": 99}', '{"format": 1, "tests": {"t": [{"k": "a", "o": "hit", "c": []}]}}'):
        path.write_text(bad)
        with pytest.raises(ValueError):
            explain.load_record(tmp_path)
    path.unlink()
    target = tmp_path / "elsewhere.json"
    target.write_text(json.dumps(GraphsRecord().to_json()))
    path.symlink_to(target)
    assert explain.load_record(tmp_path) is None  # a link is not ours to follow


def test_a_small_record_cannot_expand_into_a_memory_bomb() -> None:
    """Issue 28.1: every lookup used to get its own copy of the record's ``common`` components."""
    import tracemalloc

    common = {f"c{i}": "h" for i in range(3000)}
    hostile = {"format": 1, "common": common, "tests": {f"t{i}": [{"k": "k", "o": "miss"}] * 32 for i in range(8)}}
    size = len(json.dumps(hostile))
    tracemalloc.start()
    try:
        try:
            GraphsRecord.from_json(hostile)
        except ValueError as exc:
            assert "components" in str(exc)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20 * size  # bounded by the record's size (it was ~1,000 x: 768,000 component copies)


def test_the_component_cap_holds_for_records_we_write(tmp_path: Path) -> None:
    many = tuple(f"{i}, 16" for i in range(300))  # 300 inputs: ~310 components per lookup
    record = GraphsRecord(tests={f"t::{i}": [_lookup(c=f"{i}.0", inputs=many)] * 8 for i in range(100)})
    data = record.to_json(max_bytes=50_000_000)
    assert 0 < len(data["tests"]) < 100 and data["truncated"] == 100 - len(data["tests"])
    again = GraphsRecord.from_json(data)  # what we write, we read back
    assert sum(len(g.components) for lookups in again.tests.values() for g in lookups) <= explain.MAX_COMPONENTS


def test_an_input_index_of_unicode_digits_is_ordered_not_a_crash() -> None:
    """Issue 28.2: ``"²".isdigit()`` is True and ``int("²")`` raises."""
    old, new = _lookup(), _lookup(c="3.0")
    for lookup in (old, new):
        lookup.components["example_inputs[²]"] = ("a", "x")
        lookup.components["example_inputs[" + "9" * 5000 + "]"] = ("a", "x")  # int() refuses > 4300 digits
    new.components["example_inputs[²]"] = ("b", "y")
    assert explain.diff(old, new) == [
        "input ² x -> y",
        "graph code changed: a constant in graph statement 1 (2.0 -> 3.0)",
    ]


# --------------------------------------------------------------------------- graph code: where and what changed


def _code_lookup(code: str) -> GraphLookup:
    return explain.lookup_from_torch(_h(code), "miss", [f"[{_h(code)}] gm: {code}"])


@pytest.mark.parametrize(
    "header",
    ["GraphModule()", "<lambda>()", "GraphModule(\n  (sub): Linear(in_features=4, out_features=2, bias=True)\n)"],
)
def test_statements_are_counted_from_the_graph_body_whatever_the_header(header: str) -> None:
    """Issue 29.9: an inference graph's header is ``<lambda>()`` (torch 2.13), and it was counted as statement 1."""
    old, new = (_code_lookup(CODE.format(c=c).replace("GraphModule()", header, 1)) for c in ("2.0", "3.0"))
    assert explain.diff(old, new) == ["graph code changed: a constant in graph statement 1 (2.0 -> 3.0)"]


def test_a_record_from_before_counts_the_same_statements() -> None:
    old = _code_lookup(CODE.format(c="2.0").replace("GraphModule()", "<lambda>()"))
    new = _code_lookup(CODE.format(c="3.0").replace("GraphModule()", "<lambda>()"))
    sig = (old.value("gm") or "").split("\n")[0]
    old.components["gm"] = (old.components["gm"][0], f"{explain_lookup._LEGACY_HEADER} {sig}")  # what 448f063 wrote
    assert explain.diff(old, new) == ["graph code changed: a constant in graph statement 1"]


def test_a_changed_statement_says_how_many_and_the_first_with_its_source() -> None:
    """Issue 29.11: what changed, not only where; the user's file and line when torch's graph code has them."""
    verbose = CODE.replace(
        "    mul =", "    # File: /home/u/project/model.py:12 in forward, code: return (x * c).relu()\n    mul ="
    )
    old, new = _code_lookup(verbose.format(c="0.89")), _code_lookup(verbose.format(c="0.43"))
    assert explain.diff(old, new) == ["graph code changed: a constant in graph statement 1 (0.89 -> 0.43; model.py:12)"]
    added = verbose.replace("    return (relu,)", "    neg = torch.ops.aten.neg.default(relu)\n    return (neg,)")
    assert explain.diff(old, _code_lookup(added.format(c="0.89"))) == [
        "graph code changed: 2 statements differ (1 added, 1 changed); "
        "first at statement 3: neg = aten.neg.default(relu) (model.py:12)"
    ]
    assert explain.diff(_code_lookup(added.format(c="0.89")), old) == [
        "graph code changed: 2 statements differ (1 removed, 1 changed); first at statement 3: return (relu,)"
    ]
    dropped = verbose.replace("    relu = torch.ops.aten.relu.default(mul);  mul = None\n", "")
    assert explain.diff(old, _code_lookup(dropped.format(c="0.89"))) == [
        "graph code changed: 1 statement differs (1 removed); "
        "first at statement 2 (removed): relu = aten.relu.default(mul) (model.py:12)"
    ]


def test_what_changed_stays_bounded_in_the_record_and_in_words() -> None:
    body = "\n".join(f"    v{i} = torch.ops.aten.add.Tensor(arg0_1, {i}.5 + {'x' * 300!r})" for i in range(300))
    code = f"<lambda>()\n\n\n\ndef forward(self, arg0_1):\n{body}\n    return (v0,)\n"
    old, new = _code_lookup(code), _code_lookup(code.replace("299.5", "299.25").replace("v0 =", "w0 ="))
    assert len(old.value("gm") or "") <= 9 * 301 + explain.CODE_TEXT_CHARS
    [reason] = explain.diff(old, new)
    assert len(reason) < 300
    assert reason.startswith("graph code changed: 2 statements differ (2 changed); first at statement 1: w0 = ")
    [constant] = explain.diff(old, _code_lookup(code.replace("299.5", "299.25")))
    assert constant == "graph code changed: a constant in graph statement 300"  # past the kept text: no values


def test_tests_that_ran_a_training_forward_without_a_backward_are_listed() -> None:
    """Issue 29.12: their AOTAutograd lookups miss in every run; the report says why, once."""
    training, backward, inference = _lookup(), _lookup(backward=True), _lookup()
    inference.components["fx_kwargs[is_inference]"] = ("i", "True")
    current = {"t::fw": [training], "t::both": [training, backward], "t::inf": [inference]}
    why, _ = explain.explain_session(current, None)
    assert why.forward_only == ["t::fw"]
    assert SessionExplanation.from_json(json.loads(json.dumps(why.to_json()))).forward_only == ["t::fw"]
    # Its AOTAutograd lookup hit (another test ran the same graph's backward): nothing to say.
    assert explain.explain_session(current, None, aot_misses={"t::fw": 0})[0].forward_only == []
    assert explain.explain_session(current, None, aot_misses={"t::fw": 1})[0].forward_only == ["t::fw"]


def test_a_miss_with_many_differences_has_a_bounded_number_of_reasons() -> None:
    old = _lookup("hit", inputs=tuple(f"{i}, 16" for i in range(40)))
    new = _lookup(inputs=tuple(f"{i}, 32" for i in range(40)))
    reasons = explain.diff(old, new)
    assert len(reasons) == explain.MAX_REASONS and reasons[-1] == "... and 31 more differences"
    assert reasons[0] == "input 0 shape [0, 16] -> [0, 32]"


# ---- misses that depend on the order tests ran in (issue 25)

# Reasons as diff() gave them for bench/suite's -n 2 runs: a size symbolic in one run, fixed in the other.
ORDER_DEPENDENT = [
    "number of graph inputs 11 -> 14",
    "input 2 dtype=float32;shape=[2, 3, 16, 16];stride=(768, 256, 16, 1);device=cpu;requires_grad=False -> ('s77',)",
    "input 5 shape [8] -> [s77, 3, s53, s0]",
]


@pytest.mark.parametrize(
    ("reason", "one_side"),
    [
        ("input 5 shape [8] -> [s77, 3, s53, s0]", True),
        ("input 5 shape [s77, 3, s53, s0] -> [8]", True),
        ("input 0 ('s88',) -> dtype=float32;shape=[8, 4];stride=(4, 1);device=cpu;requires_grad=False", True),
        ("input 0 shape [8, 16] -> [8, 32]", False),  # another fixed size: the test's inputs changed
        ("input 0 shape [s0, 16] -> [s1, 16]", False),  # symbolic on both sides
        ("input 1 dtype float32 -> float64", False),
        ("graph code changed: a constant in graph statement 4 (s1 -> 0.43; mod.py:12)", False),  # not an input
        ("input 0 shape [8, 16] -> [8, 16s]", False),
    ],
)
def test_a_size_symbolic_on_one_side_only(reason: str, one_side: bool) -> None:
    assert explain.symbolic_one_side(reason) is one_side


def test_a_tensor_that_became_a_symbolic_size_is_named_briefly_when_its_metadata_is_long() -> None:
    tensor = "dtype=float32;shape=[64, 3, 224, 224];stride=(150528, 50176, 224, 1);device=cpu;requires_grad=False"
    tensor += ";storage_offset=0;is_coalesced=None"  # over _change's 120 characters with the other side
    old = GraphLookup("k1", "hit", {"example_inputs[2]": ("h1", tensor), "gm": ("c", None)})
    new = GraphLookup("k2", "miss", {"example_inputs[2]": ("h2", "('s77',)"), "gm": ("c", None)})
    (reason,) = explain.diff(old, new)
    assert reason == "input 2 tensor float32 [64, 3, 224, 224] -> ('s77',)"
    assert explain.symbolic_one_side(reason)


def test_order_dependent_tests_are_those_with_such_a_miss() -> None:
    miss = explain.MissExplanation
    why = SessionExplanation(
        misses={
            "t.py::test_b": [miss("k1", ["input 0 shape [8, 16] -> [8, 32]"]), miss("k2", ORDER_DEPENDENT)],
            "t.py::test_a": [miss("k3", ORDER_DEPENDENT)],
            "t.py::test_new": [miss("k4", [explain.NEW_TEST])],
            "t.py::test_shape": [miss("k5", ["input 0 shape [8, 16] -> [8, 32]"])],
            "t.py::test_flaky": [miss("k6", ORDER_DEPENDENT)],  # flagged as never hitting: its own story
        },
        never_hit={"t.py::test_flaky": ("input 0", 3)},
    )
    assert explain.order_dependent_tests(why) == ["t.py::test_a", "t.py::test_b"]
    assert explain.order_dependent_tests(SessionExplanation()) == []


def test_a_test_whose_shared_function_another_test_compiled_last_run_is_compared_with_that_graph() -> None:
    """Two tests call one compiled function; the first to run pays the lookup (the other uses Dynamo's entry
    in memory). Run alone next time (``-k``, another xdist worker), the second is compared with the graph the
    first looked up, not called a new test."""
    from dataclasses import replace

    shared = "shared (test_f.py:5)"
    _, record = explain.explain_session({"t::a": [replace(_lookup(c="1.5"), function=shared)]}, None)
    second, _ = explain.explain_session({"t::b": [replace(_lookup(c="2.0"), function=shared)]}, record, "run")
    [miss] = second.misses["t::b"]
    assert miss.reasons == ["graph code changed: a constant in graph statement 1 (1.5 -> 2.0)"]
    other, _ = explain.explain_session({"t::c": [replace(_lookup(c="2.0"), function="other (t.py:1)")]}, record)
    assert [m.reasons for m in other.misses["t::c"]] == [[explain.NEW_TEST]]


def test_a_new_test_compiling_a_module_is_new_not_another_modules_changed_inputs() -> None:
    """Every torch.compile(module) compiles torch's one wrapper frame: a new test's module is not compared with
    the graph of another test's module, as if that test's inputs had changed."""
    from dataclasses import replace

    wrapper = "torch's inner (torch/_dynamo/external_utils.py:67)"
    _, record = explain.explain_session({"t::linear": [replace(_lookup(c="1.5"), function=wrapper)]}, None)
    new, _ = explain.explain_session({"t::conv": [replace(_lookup(c="2.0"), function=wrapper)]}, record, "run")
    assert [m.reasons for m in new.misses["t::conv"]] == [[explain.NEW_TEST]]


def test_a_constant_that_came_back_is_said_of_its_own_statement_only() -> None:
    """Graph f's constant in statement 1 goes 1.0 -> 2.0 -> 1.0 (a revert) while graph g's in statement 12 takes a
    new value: only f's miss says it came back; g's new value will not hit next run."""
    from pytest_compilecache.explain.lookup import _code_signature

    kind = {"fx_kwargs[is_backward]": ("b0", "False"), "fx_kwargs[is_inference]": ("i1", "True")}

    def lookup(key: str, code: str, function: str) -> GraphLookup:
        return GraphLookup(key, "miss", {"gm": (key, _code_signature(code)), **kind}, function)

    def f_code(c: float) -> str:
        return f"def forward(self, x):\n    mul = torch.ops.aten.mul.Tensor(x, {c})\n    return (mul,)"

    def g_code(c: int) -> str:
        body = "".join(f"    a{i} = torch.ops.aten.add.Tensor(x, {i})\n" for i in range(11))
        return f"def forward(self, x):\n{body}    b = torch.ops.aten.mul.Tensor(a10, {c})\n    return (b,)"

    previous = None
    for n, (fc, gc) in enumerate([(1.0, 5), (2.0, 5), (1.0, 6)]):
        now = {"t.py::test": [lookup(f"f{fc}", f_code(fc), "f (t.py:1)"), lookup(f"g{gc}", g_code(gc), "g (t.py:9)")]}
        why, previous = explain.explain_session(now, previous, "previous session", now=float(n))
    reasons = {miss.function: miss.reasons for miss in why.misses["t.py::test"]}
    assert reasons["f (t.py:1)"][-1] == explain.CAME_BACK
    assert "statement 12" in reasons["g (t.py:9)"][0] and explain.CAME_BACK not in reasons["g (t.py:9)"]
