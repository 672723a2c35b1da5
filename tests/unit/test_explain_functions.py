"""explain: a missed graph is compared with earlier graphs of its own function, never with another function's.

Which test pays a shared function's lookup depends on the tests selected and on xdist (a function compiled once
per process is looked up by the first test that calls it), so a test's miss may have its earlier graph in another
test; torch's own wrapper frame (every ``torch.compile(module)``) names no one function and is never matched so.
"""

from __future__ import annotations

from pytest_compilecache import explain
from pytest_compilecache.explain import GraphLookup
from pytest_compilecache.explain import GraphsRecord
from pytest_compilecache.explain.lookup import _code_signature

KIND = {"fx_kwargs[is_backward]": ("b0", "False"), "fx_kwargs[is_inference]": ("i1", "True")}
H = "h2 (test_c.py:5)"  # (x + OFFSET).relu()
K = "k2 (test_c.py:9)"  # (x - OFFSET).abs()
WRAPPER = "torch's inner (torch/_dynamo/external_utils.py:67)"  # every compiled module's frame


def _code(op: str, c: float, then: str) -> str:
    return (
        "<lambda>()\n\n\n\ndef forward(self, arg0_1):\n"
        f"    {op} = torch.ops.aten.{op}.Tensor(arg0_1, {c});  arg0_1 = None\n"
        f"    {then} = torch.ops.aten.{then}.default({op});  {op} = None\n"
        f"    return ({then},)\n"
    )


def _graph(
    function: str, c: float, op: str = "add", then: str = "relu", outcome: str = "miss", size: int = 8
) -> GraphLookup:
    code = _code(op, c, then)
    inputs = {"example_inputs[0]": (f"t{size}", f"dtype=float32;shape=[{size}];stride=(1,)")}
    key = f"{function[:2]}-{op}-{then}-{c}-{size}"
    return GraphLookup(key, outcome, {"gm": (key, _code_signature(code)), **inputs, **KIND}, function)


def h(c: float, outcome: str = "miss") -> GraphLookup:
    return _graph(H, c, "add", "relu", outcome)


def k(c: float, outcome: str = "miss") -> GraphLookup:
    return _graph(K, c, "sub", "abs", outcome)


def _constant(before: float, after: float) -> list[str]:
    return [f"graph code changed: a constant in graph statement 1 ({before} -> {after})"]


def _why(now: dict[str, list[GraphLookup]], record: GraphsRecord) -> dict[str, dict[str, list[str]]]:
    """Each test's reasons by function, from the session's report; the ``compile_cache_stats`` fixture's path
    (:func:`explain.earlier_graphs` then :func:`explain.explain_test`) must say the same."""
    why, _ = explain.explain_session(now, record, "previous session")
    for nodeid, lookups in now.items():
        fixture = explain.explain_test(lookups, explain.earlier_graphs(record, nodeid, lookups))
        assert [m.to_json() for m in fixture] == [m.to_json() for m in why.misses.get(nodeid, [])]
    return {nodeid: {m.function: m.reasons for m in misses} for nodeid, misses in why.misses.items()}


def test_a_subset_run_compares_each_graph_with_its_own_functions_earlier_graph() -> None:
    """The reviewer's case: test_c1 compiled h2; test_c2 used h2 already compiled in that process (no lookup) and
    compiled k2. OFFSET 0.5 -> 0.25, then test_c2 alone: both miss for the constant, each against its own function
    (h2's graph is test_c1's), not h2 against k2's graph and k2 as a new graph."""
    record = GraphsRecord(tests={"test_c.py::test_c1": [h(0.5)], "test_c.py::test_c2": [k(0.5)]})
    assert _why({"test_c.py::test_c2": [h(0.25), k(0.25)]}, record) == {
        "test_c.py::test_c2": {H: _constant(0.5, 0.25), K: _constant(0.5, 0.25)}
    }
    # The milder variant: test_b's own earlier graphs lack h (test_a paid its lookup); h is not a new graph.
    record = GraphsRecord(tests={"t.py::test_a": [h(0.5)], "t.py::test_b": [k(0.5, "hit")]})
    assert _why({"t.py::test_b": [h(0.25), k(0.5, "hit")]}, record) == {"t.py::test_b": {H: _constant(0.5, 0.25)}}


def test_the_tests_own_earlier_graph_of_a_function_comes_before_another_tests() -> None:
    record = GraphsRecord(tests={"t.py::test_a": [h(0.5), k(0.5)], "t.py::test_b": [h(0.75)]})
    assert _why({"t.py::test_b": [h(0.25), k(0.25)]}, record) == {
        "t.py::test_b": {H: _constant(0.75, 0.25), K: _constant(0.5, 0.25)}
    }
    assert explain.earlier_graphs(record, "t.py::test_b", [h(0.25), k(0.25)]) == [h(0.75), k(0.5)]
    assert explain.earlier_graphs(record, "t.py::test_new", [_graph("", 1.0)]) is None  # nothing known: new test


def test_a_graph_is_never_compared_with_another_functions_graph() -> None:
    # g's graph is h's but for a constant: the most similar graph there is, and still not g's earlier graph.
    g = _graph("g (t.py:20)", 0.75)
    assert explain.explain_miss(g, [h(0.5)]) == [explain.NEW_GRAPH]
    assert explain.most_similar(g, [h(0.5), _graph(WRAPPER, 0.5)]) is None  # torch's frame is not g either
    record = GraphsRecord(tests={"t.py::test_a": [h(0.5)], "t.py::test_b": [k(0.5)]})
    assert _why({"t.py::test_b": [h(0.5, "hit"), g]}, record) == {"t.py::test_b": {g.function: [explain.NEW_GRAPH]}}
    assert _why({"t.py::test_new": [g]}, record) == {"t.py::test_new": {g.function: [explain.NEW_TEST]}}
    # A record older than the function field names none: its graphs are still compared.
    assert explain.explain_miss(g, [_graph("", 0.5)]) == _constant(0.5, 0.75)


def test_torch_frames_and_unknown_functions_are_compared_within_the_tests_own_graphs() -> None:
    linear, conv = _graph(WRAPPER, 0.5, "add", "relu"), _graph(WRAPPER, 0.5, "sub", "abs", size=4)
    record = GraphsRecord(tests={"t.py::test_a": [h(0.5)], "t.py::test_b": [linear, conv], "t.py::test_c": [conv]})
    # By similarity among the test's own graphs, as before: each module's graph with the earlier one like it.
    now = [_graph(WRAPPER, 0.25, "sub", "abs", size=4), _graph(WRAPPER, 0.25, "add", "relu")]
    assert [m.reasons for m in explain.explain_session({"t.py::test_b": now}, record)[0].misses["t.py::test_b"]] == [
        _constant(0.5, 0.25),
        _constant(0.5, 0.25),
    ]
    # Never with another test's module graph, nor with another test's graph of a function this test borrows.
    borrowing = [_graph(WRAPPER, 0.25, "add", "relu"), h(0.25)]
    assert explain.earlier_graphs(record, "t.py::test_c", borrowing) == [conv, h(0.5)]
    assert _why({"t.py::test_c": borrowing}, record) == {
        "t.py::test_c": {WRAPPER: _structure_changed(conv), H: _constant(0.5, 0.25)}
    }
    assert explain.graphs_by_function(record) == {H: [h(0.5)]}
    # A module's miss does not take the graph of a function the test compiled: that graph is the function's.
    record = GraphsRecord(tests={"t.py::test_d": [h(0.5), _graph(WRAPPER, 0.5, "mul", "neg")]})
    now = [_graph(WRAPPER, 0.75, "add", "relu"), h(0.25)]
    assert _why({"t.py::test_d": now}, record)["t.py::test_d"][H] == _constant(0.5, 0.25)
    unknown = [_graph("", 0.75, "add", "relu"), h(0.25)]  # torch named no function: the same
    assert _why({"t.py::test_d": unknown}, record)["t.py::test_d"][H] == _constant(0.5, 0.25)


def _structure_changed(old: GraphLookup) -> list[str]:
    return explain.diff(old, _graph(WRAPPER, 0.25, "add", "relu"))


def test_a_function_an_edit_moved_is_the_tests_own_but_not_another_tests_at_another_line() -> None:
    moved = "h2 (test_c.py:6)"  # a line added above h2
    record = GraphsRecord(tests={"t.py::test_a": [h(0.5), k(0.5)]})
    assert _why({"t.py::test_a": [k(0.25), _graph(moved, 0.25)]}, record) == {
        "t.py::test_a": {K: _constant(0.5, 0.25), moved: _constant(0.5, 0.25)}
    }
    # Two tests' nested ``fn`` in one file differ by their lines alone: test_a's is no earlier graph of test_b's.
    record = GraphsRecord(tests={"t.py::test_a": [_graph("fn (t.py:12)", 0.5)], "t.py::test_b": [k(0.5)]})
    assert _why({"t.py::test_b": [_graph("fn (t.py:40)", 0.75)]}, record) == {
        "t.py::test_b": {"fn (t.py:40)": [explain.NEW_GRAPH]}
    }
