"""Miss explanations on real compiles: exactly one thing changes between two sessions, and we name it.

One subprocess (``explain_scenarios.py``) imports torch once and runs every scenario: a fresh cache dir,
a first session, ``torch._dynamo.reset()`` + ``clear_caches()``, a second session in which one thing
differs. The capture is ``probe``'s wrapper of ``FxGraphCache.load_with_key``; the words are explain.py's.

The checks run as subtests of one test: under xdist one worker runs them all, so the scenarios' compiles run
once (a module fixture shared by separate tests would run once in every worker that gets one of them).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any
from typing import Callable

import pytest

from pytest_compilecache import explain
from pytest_compilecache.explain import GraphLookup
from pytest_compilecache.explain import GraphsRecord
from tests import torchenv

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).with_name("explain_scenarios.py")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def scenarios() -> dict[str, Any]:
    env = torchenv.inner_env(prefixes=("TORCHINDUCTOR_", "TRITON_", "PYTEST_"))
    env["PYTHONPATH"] = torchenv.python_path(str(ROOT))
    proc = subprocess.run(
        [sys.executable, str(SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("SCENARIOS-JSON "))
    data: dict[str, Any] = json.loads(line.split(" ", 1)[1])
    # torch 2.13 has the API; the capture installed itself when the first compile imported the codecache.
    assert data["active"] is True and data["note"] is None
    return data


def _sessions(scenarios: dict[str, Any], name: str) -> tuple[list[GraphLookup], list[GraphLookup]]:
    result = scenarios[name]
    assert "error" not in result, result.get("error")
    first = [GraphLookup.from_json(g) for g in result["a"]]
    second = [GraphLookup.from_json(g) for g in result["b"]]
    assert first and [g.outcome for g in first] == ["miss"] * len(first)  # a fresh cache dir: all cold
    return first, second


def _reasons(scenarios: dict[str, Any], name: str) -> list[list[str]]:
    first, second = _sessions(scenarios, name)
    return [m.reasons for m in explain.explain_test(second, first)]


def _nothing_changed_every_graph_hits_and_nothing_is_explained(scenarios: dict[str, Any], tmp_path: Path) -> None:
    first, second = _sessions(scenarios, "same")
    assert [g.outcome for g in second] == ["hit"] * len(first)
    assert [g.key for g in second] == [g.key for g in first]
    assert explain.explain_test(second, first) == []
    assert explain.never_hits([first, second]) is None


def _an_input_shape_change_is_named(scenarios: dict[str, Any], tmp_path: Path) -> None:
    assert _reasons(scenarios, "shape") == [["input 0 shape [8, 16] -> [8, 32]"]]
    # Which graph (issue 41): the compiled function, as torch's logs name it, and the shapes of its inputs.
    _, second = _sessions(scenarios, "shape")
    [miss] = explain.explain_test(second, _sessions(scenarios, "shape")[0])
    assert miss.function.startswith("_plain (") and "explain_scenarios.py:" in miss.function, miss.function
    assert miss.inputs == "[8, 32]"


def _a_dtype_change_is_named(scenarios: dict[str, Any], tmp_path: Path) -> None:
    assert _reasons(scenarios, "dtype") == [["input 0 dtype float32 -> bfloat16"]]


def _a_requires_grad_change_is_named(scenarios: dict[str, Any], tmp_path: Path) -> None:
    # The forward graph of a training graph takes detached inputs: torch's key says "training", not which input.
    assert _reasons(scenarios, "requires_grad") == [
        ["requires_grad False -> True (an input or parameter now requires grad: a training graph)"]
    ]


def _a_constant_in_the_model_is_a_graph_code_change(scenarios: dict[str, Any], tmp_path: Path) -> None:
    # torch 2.13's inference graph: "<lambda>()", then permute, mm, permute_1, addmm(..., alpha = 2.0), return.
    # The header is not a statement (issue 29.9), and the values are named (issue 29.11).
    first, _ = _sessions(scenarios, "constant")
    statements = (first[0].value("gm") or "").split("\n")[1:]
    assert statements[3] == "\taddmm = aten.addmm.default(mm, permute_1, arg0_1, alpha = 2.0)"
    assert _reasons(scenarios, "constant") == [["graph code changed: a constant in graph statement 4 (2.0 -> 3.0)"]]


def _a_structural_change_says_how_many_statements_and_the_first(scenarios: dict[str, Any], tmp_path: Path) -> None:
    ((reason,),) = _reasons(scenarios, "structure")
    assert reason.startswith("graph code changed: ") and "added" in reason, reason
    assert "; first at statement 3: " in reason and "aten.mm.default(" in reason, reason
    assert len(reason) < 300


def _an_inductor_option_is_named(scenarios: dict[str, Any], tmp_path: Path) -> None:
    assert _reasons(scenarios, "option") == [["inductor config changed: epilogue_fusion"]]


def _a_random_constant_makes_a_test_that_can_never_hit(scenarios: dict[str, Any], tmp_path: Path) -> None:
    runs = [[GraphLookup.from_json(g) for g in run] for run in scenarios["random"]["runs"]]
    assert len(runs) == 4 and all(g.outcome == "miss" for run in runs for g in run)
    assert explain.never_hits(runs) == "a constant in graph statement 4"  # three changes in a row
    assert explain.never_hits(runs[:3]) is None  # two changes: could be two edits (issue 29.10)
    assert explain.never_hits(runs[:2]) is None  # one change: an edit
    assert explain.never_hits(list(_sessions(scenarios, "shape"))) is None  # a real change is not flagged
    # An edit and its revert is not evidence (issue 41): 2.0 -> 3.0 -> 2.0 (the first graph again, missed).
    first, second = _sessions(scenarios, "constant")
    again = [GraphLookup(g.key, "miss", g.components) for g in first]
    assert explain.never_hits([first, second, again]) is None
    # Through the records the session keeps: flagged in the fourth run, not before.
    record: GraphsRecord | None = None
    flagged = []
    for run in runs:
        why, record = explain.explain_session({"t.py::test_random": run}, record, "previous session")
        flagged.append(dict(why.never_hit))
    assert flagged[:3] == [{}, {}, {}]
    assert flagged[3] == {"t.py::test_random": ("a constant in graph statement 4", 4)}


def _a_training_forward_without_backward_is_noted(scenarios: dict[str, Any], tmp_path: Path) -> None:
    inference, training = _sessions(scenarios, "requires_grad")
    assert {g.kind for g in training} == {("False", "False")}  # torch compiled the forward only
    why, _ = explain.explain_session({"t.py::test_fw": training, "t.py::test_inf": inference}, None)
    assert why.forward_only == ["t.py::test_fw"]


def _a_new_test_and_the_record_round_trip(scenarios: dict[str, Any], tmp_path: Path) -> None:
    first, second = _sessions(scenarios, "random")
    _, record = explain.explain_session({"t.py::test_old": first}, None)
    explain.save_record(tmp_path, record)
    previous = explain.load_record(tmp_path)
    assert previous is not None and previous.tests == record.tests
    elsewhere = [replace(lookup, function="elsewhere (t.py:1)") for lookup in second]
    result, _ = explain.explain_session(
        {"t.py::test_old": second, "t.py::test_new": elsewhere, "t.py::test_shares": second},
        previous,
        "previous session",
    )
    assert [m.reasons for m in result.misses["t.py::test_new"]] == [[explain.NEW_TEST]]
    assert result.never_hit == {}  # one change is not yet evidence (issue 29.10)
    [[reason]] = [m.reasons for m in result.misses["t.py::test_old"]]
    assert reason.startswith("graph code changed: a constant in graph statement 4 (0."), reason
    # A test new to the record that compiles a function another test looked up: compared with that graph.
    assert [m.reasons for m in result.misses["t.py::test_shares"]] == [[reason]]
    # Compact: a real lookup costs well under a few KB in the record.
    size = len(json.dumps(GraphsRecord(tests={"t": first}).to_json()))
    assert size < 4000 * len(first)


def _a_subset_run_compares_each_graph_with_its_own_functions(scenarios: dict[str, Any], tmp_path: Path) -> None:
    # test_c1 looked fn up, test_c2 square; test_c2 run alone after the edit looks both up: each miss is compared
    # with its own function's earlier graph (fn's is test_c1's), not fn with square's and square as a new graph.
    assert "error" not in scenarios["subset"], scenarios["subset"].get("error")
    runs = [[GraphLookup.from_json(g) for g in run] for run in scenarios["subset"]["runs"]]
    _, record = explain.explain_session({"t.py::test_c1": runs[0], "t.py::test_c2": runs[1]}, None)
    why, _ = explain.explain_session({"t.py::test_c2": runs[2]}, record, "previous session")
    assert {miss.function.split(" (")[0]: miss.reasons for miss in why.misses["t.py::test_c2"]} == {
        "fn": ["graph code changed: a constant in graph statement 4 (2.0 -> 3.0)"],
        "square": ["graph code changed: a constant in graph statement 3 (2.0 -> 3.0)"],
    }


CHECKS: dict[str, Callable[[dict[str, Any], Path], None]] = {
    "nothing changed": _nothing_changed_every_graph_hits_and_nothing_is_explained,
    "shape": _an_input_shape_change_is_named,
    "dtype": _a_dtype_change_is_named,
    "requires_grad": _a_requires_grad_change_is_named,
    "constant": _a_constant_in_the_model_is_a_graph_code_change,
    "structure": _a_structural_change_says_how_many_statements_and_the_first,
    "option": _an_inductor_option_is_named,
    "never hits": _a_random_constant_makes_a_test_that_can_never_hit,
    "forward only": _a_training_forward_without_backward_is_noted,
    "new test, record round trip": _a_new_test_and_the_record_round_trip,
    "subset run": _a_subset_run_compares_each_graph_with_its_own_functions,
}


def test_each_change_is_named_on_real_compiles(
    scenarios: dict[str, Any], subtests: pytest.Subtests, tmp_path: Path
) -> None:
    for name, check in CHECKS.items():
        with subtests.test(check=name):
            check(scenarios, tmp_path)
