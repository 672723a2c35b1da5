"""probe.dynamo: torch's recompile, recompile-limit and graph-break facts as plain per-test values, without torch.

The shapes here are torch 2.13's (``CompilationMetrics`` records, ``counters["graph_break"]`` keys, the warning
``convert_frame`` logs at the limit); ``tests/plugin/test_dynamo_costs.py`` checks the same against torch's own
logs on real compiles, on every torch CI runs.
"""

from __future__ import annotations

import logging
import os
import sys
import types
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_compilecache.probe import dynamo

PRINT_BREAK = (
    "Failed to trace builtin operator\n"
    "  Explanation: Dynamo does not know how to trace builtin operator `print` with argument types ['str']\n"
    "  Hint: Avoid calling builtin `print`.\n"
)


def test_function_text_is_relative_to_the_working_directory_when_under_it() -> None:
    inside = os.path.join(os.getcwd(), "tests", "test_ops.py")
    assert dynamo.function_text("gelu", inside, 12) == f"gelu ({os.path.join('tests', 'test_ops.py')}:12)"
    assert dynamo.function_text("f", "/elsewhere/x.py", 3).endswith("x.py:3)")


def test_a_frame_of_torchs_own_files_is_named_as_torchs(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """torch.compile(module) compiles torch's wrapper frame (``inner`` in external_utils.py), the same for every
    module: named as torch's, so that nothing takes two modules for one function."""
    torch_dir = tmp_path / "site-packages" / "torch"
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(__file__=str(torch_dir / "__init__.py")))
    wrapper = torch_dir / "_dynamo" / "external_utils.py"
    expected = f"torch's inner ({os.path.join('torch', '_dynamo', 'external_utils.py')}:67)"
    assert dynamo.function_text("inner", str(wrapper), 67) == expected
    assert dynamo.function_text("f", str(tmp_path / "site-packages" / "torchvision" / "x.py"), 3).startswith("f (")


def test_guard_failure_drops_the_compile_id_and_keeps_one_line() -> None:
    reason = "0/0: tensor 'x' size mismatch at index 0. expected 4, actual 8"
    assert dynamo.guard_failure(reason) == "tensor 'x' size mismatch at index 0. expected 4, actual 8"
    multi = "3/0: n == 0     # return x * n  # t.py:18 in lim\nUser stack trace:\n  File ..."
    assert dynamo.guard_failure(multi) == "n == 0 # return x * n # t.py:18 in lim"
    assert dynamo.guard_failure(None) == ""


PRINT = (
    "Failed to trace builtin operator: Dynamo does not know how to trace builtin operator `print` with argument "
    "types ['str']"
)


def test_a_logged_graph_break_reads_as_its_first_line_and_explanation_after_what_torch_did() -> None:
    assert dynamo.graph_break_reason(PRINT_BREAK) == PRINT
    gave_up = (
        "Failed to handle graph break gracefully. Skipping the function and falling back to eager. Graph break "
        "encountered:\n\n" + PRINT_BREAK
    )
    assert dynamo.graph_break_reason(gave_up) == "Failed to handle graph break gracefully: " + PRINT
    assert dynamo.graph_break_reason("Data-dependent branching\n  Explanation: the branch") == (
        "Data-dependent branching: the branch"
    )
    assert dynamo.graph_break_reason("") == ""


def test_graph_breaks_since_a_mark_count_each_and_name_each_reason_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dynamo, "_breaks", ["old"])
    start = dynamo.breaks_mark()
    dynamo._breaks.extend([PRINT, "a new one: why", PRINT])
    assert dynamo.graph_breaks(start) == (3, [PRINT, "a new one: why"])
    assert dynamo.graph_breaks(dynamo.breaks_mark()) == (0, [])


def test_functions_of_reads_the_newest_records_first() -> None:
    records = [
        SimpleNamespace(compile_id="0/0", co_name="old", co_filename="/x/a.py", co_firstlineno=1),
        SimpleNamespace(compile_id="1/0", co_name="g", co_filename="/x/b.py", co_firstlineno=5),
        SimpleNamespace(compile_id="0/1", co_name=None),  # a failed compile: torch names no function
    ]
    assert dynamo.functions_of({"1/0", "0/1"}, records) == {"1/0": "g (/x/b.py:5)", "0/1": ""}


def test_the_limit_tap_keeps_each_warning_as_an_entry() -> None:
    tap = dynamo._LimitHits()
    record = logging.LogRecord(
        "torch._dynamo.convert_frame",
        logging.WARNING,
        __file__,
        1,
        "torch._dynamo hit config.%s (%s)\n   function: %s\n   last reason: %s\n",
        ("recompile_limit", 8, "'times' (/x/t.py:9)", "0/7: tensor 'x' size mismatch at index 0. expected 8, actual 9"),
        None,
    )
    tap.read(record)
    assert tap.hits == [
        {
            "function": "times (/x/t.py:9)",
            "limit": "recompile_limit = 8",
            "reason": "tensor 'x' size mismatch at index 0. expected 8, actual 9",
        }
    ]
    other = logging.LogRecord("torch._dynamo.convert_frame", logging.WARNING, __file__, 1, "something else", (), None)
    tap.read(other)
    assert len(tap.hits) == 1


def test_fail_on_recompile_limit_sets_torchs_switch_once_its_config_is_imported_and_puts_it_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config: Any = types.ModuleType("torch._dynamo.config")
    config.fail_on_recompile_limit_hit = False
    monkeypatch.setitem(sys.modules, "torch._dynamo.config", config)
    put_back = dynamo.fail_on_recompile_limit()
    assert config.fail_on_recompile_limit_hit is True
    put_back()
    assert config.fail_on_recompile_limit_hit is False


def test_the_recorder_names_the_test_that_compiled_a_recompiled_frame_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """A recompile's usual cause is another test's shapes: the record names the earlier test (same process)."""
    from pytest_compilecache import probe
    from pytest_compilecache.recorder import Recorder
    from pytest_compilecache.recorder import Start

    deltas = iter(
        [
            {"frames": 1, probe.FIRST_COMPILES: ["scale (t.py:4)"]},
            {"frames": 1, "recompiles": 1, "recompiled": [{"function": "scale (t.py:4)", "reason": "size"}]},
        ]
    )
    monkeypatch.setattr("pytest_compilecache.probe.delta", lambda start: next(deltas))
    recorder = Recorder("controller", explain=False)
    recorder.finish("t.py::test_first", Start(None, None))
    recorder.finish("t.py::test_second", Start(None, None))
    [entry] = recorder.stats.records["t.py::test_second"].recompiled
    assert entry == {"function": "scale (t.py:4)", "reason": "size", "first": "t.py::test_first", "count": 1}
    assert probe.FIRST_COMPILES not in recorder.stats.records["t.py::test_first"].to_json()


def test_a_recompile_of_torchs_module_wrapper_names_no_first_compiler(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every compiled module's frame is torch's one wrapper: the test that compiled another module first is not
    the one whose shapes recompiled this module."""
    from pytest_compilecache import probe
    from pytest_compilecache.recorder import Recorder
    from pytest_compilecache.recorder import Start

    wrapper = "torch's inner (torch/_dynamo/external_utils.py:67)"
    deltas = iter(
        [
            {"frames": 1, probe.FIRST_COMPILES: [wrapper]},
            {"frames": 1, "recompiles": 1, "recompiled": [{"function": wrapper, "reason": "size"}]},
        ]
    )
    monkeypatch.setattr("pytest_compilecache.probe.delta", lambda start: next(deltas))
    recorder = Recorder("controller", explain=False)
    recorder.finish("t.py::test_linear", Start(None, None))
    recorder.finish("t.py::test_conv", Start(None, None))
    [entry] = recorder.stats.records["t.py::test_conv"].recompiled
    assert entry["first"] == ""


def test_a_test_marked_compile_cache_is_recorded_as_missing_by_design(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_compilecache.recorder import Recorder
    from pytest_compilecache.recorder import Start

    deltas = iter([{"frames": 1, "fxgraph": {"hit": 0, "miss": 1, "bypass": 0}}, {}, {"frames": 1}])
    monkeypatch.setattr("pytest_compilecache.probe.delta", lambda start: next(deltas))
    recorder = Recorder("controller", explain=False)
    recorder.finish("t.py::test_marked", Start(None, None), intended=True)
    recorder.finish("t.py::test_marked_compiling_nothing", Start(None, None), intended=True)
    recorder.finish("t.py::test_plain", Start(None, None))
    records = recorder.stats.records
    assert records["t.py::test_marked"].by_design and records["t.py::test_marked"].to_json()["by_design"] is True
    assert "t.py::test_marked_compiling_nothing" not in records  # no record for a test that compiled nothing
    assert not records["t.py::test_plain"].by_design and "by_design" not in records["t.py::test_plain"].to_json()
