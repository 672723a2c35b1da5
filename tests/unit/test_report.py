"""report.py: exact terminal lines, the table, the JSON report and Markdown that respects its size limit."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from pytest_compilecache import report
from pytest_compilecache.stats import ItemRecord
from pytest_compilecache.stats import SessionStats
from tests.markdown import shown


def _record(
    nodeid: str, *, hit: int = 0, miss: int = 0, bypass: int = 0, seconds: float = 0.0, **extra: Any
) -> ItemRecord:
    record = ItemRecord(nodeid)
    record.add({"fxgraph": {"hit": hit, "miss": miss, "bypass": bypass}, "compile_seconds": seconds, **extra})
    return record


def _stats(*records: ItemRecord, tests: int | None = None) -> SessionStats:
    stats = SessionStats(tests=len(records) if tests is None else tests)
    for record in records:
        stats.add_record(record)
    return stats


# ----------------------------------------------------------------------------------------------- terminal


def test_summary_line_exact() -> None:
    stats = _stats(_record("a", hit=40, miss=1, bypass=1, seconds=10.0), _record("b", hit=2, miss=2, seconds=8.2))
    line = report.summary_line(stats, "shared:/path")
    assert line == "compile cache: 42 hits, 3 misses (93%), 1 bypass, 18.2 s compiling, dir shared:/path"


def test_summary_line_singular_and_plural() -> None:
    stats = _stats(_record("a", hit=1, miss=1, bypass=2, seconds=0.04))
    assert report.summary_line(stats, "isolated:/tmp/x") == (
        "compile cache: 1 hit, 1 miss (50%), 2 bypasses, 0.0 s compiling, dir isolated:/tmp/x"
    )


def test_summary_line_without_lookups_has_no_rate_and_no_bypass_part() -> None:
    assert (
        report.summary_line(_stats(), "disabled")
        == "compile cache: 0 hits, 0 misses (n/a), 0.0 s compiling, dir disabled"
    )


def test_summary_line_mentions_remote_lookups() -> None:
    stats = _stats(_record("a", hit=3, remote={"fx_hit": 2, "fx_miss": 1}))
    assert ", remote 2 hit/1 miss, " in report.summary_line(stats, "shared:/p")


@pytest.mark.parametrize(("rate", "text"), [(None, "n/a"), (0.0, "0%"), (0.934, "93%"), (0.996, "99%"), (1.0, "100%")])
def test_percent(rate: float | None, text: str) -> None:
    assert report.percent(rate) == text


@pytest.mark.parametrize(
    ("size", "text"),
    [
        (None, "-"),
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (4.1 * 1024**2, "4.1 MiB"),
        (3 * 1024**4, "3072.0 GiB"),
    ],
)
def test_human_size(size: float | None, text: str) -> None:
    assert report.human_size(None if size is None else int(size)) == text


def test_transfer_lines() -> None:
    info = {"outcome": "partial", "key": "compilecache-v1-ab12-7", "size": 4 * 1024**2, "seconds": 0.3}
    # Issue 41, finding 4: a report without a description (an older one, the Action's hand-off) still says in
    # words what was restored: "partial" read as an incomplete restore.
    assert report.transfer_line("restore", info) == (
        "restore: restored the newest bundle of this fingerprint: compilecache-v1-ab12-7 (4.0 MiB, 0.30 s)"
    )
    assert report.transfer_line("restore", {"outcome": "miss", "message": "no bundle"}) == "restore: miss - no bundle"
    assert report.transfer_line("save", {}) == "save: ?"


def test_transfer_lines_name_the_precompiled_headers_that_travelled_beside_the_bundle() -> None:
    """Issue 41, finding 4: the save and restore lines left out the 21 MB header object that also went to the store."""
    headers = {"named": 1, "transferred": 1, "size": 21 * 1024**2, "seconds": 0.8, "warnings": []}
    saved = {"outcome": "saved", "key": "k", "size": 4 * 1024**2, "seconds": 0.3, "headers": headers}
    assert report.transfer_line("save", saved) == (
        "save: saved k (4.0 MiB, 0.30 s); precompiled headers: 1 uploaded (21.0 MiB, 0.80 s)"
    )
    restored = {"outcome": "exact", "key": "k", "size": 4 * 1024**2, "seconds": 0.3, "headers": headers}
    assert report.transfer_line("restore", restored).endswith("; precompiled headers: 1 installed (21.0 MiB, 0.80 s)")
    there = {**saved, "headers": {**headers, "transferred": 0, "size": 0}}
    assert report.transfer_line("save", there).endswith("; precompiled headers: 1 named, already in the store")
    assert "precompiled" not in report.transfer_line("save", {**saved, "headers": {"named": 0, "transferred": 0}})


NEWEST = "restored the newest bundle of this fingerprint"


@pytest.mark.parametrize(
    ("outcome", "key", "words"),
    [
        # The Action's key (run id and attempt): the bundle its last run saved, which actions/cache calls partial.
        ("partial", "compilecache-v1-ab12-5001-1", f"{NEWEST} (run 5001, attempt 1)"),
        ("partial", "p-ab12-20261124T223005-4242", f"{NEWEST} (saved 2026-11-24 22:30:05 UTC)"),
        ("partial", "p-ab12-nightly", NEWEST),
        ("exact", "p-ab12-7-2", "restored the bundle of the exact key asked for (run 7, attempt 2)"),
    ],
)
def test_a_restore_says_in_words_what_it_restored(outcome: str, key: str, words: str) -> None:
    """Issue 29: "restore: partial <key>" for the bundle this fingerprint just saved read as an incomplete restore."""
    from pytest_compilecache.sync import RestoreResult

    data = RestoreResult(outcome, key=key, size=4 * 1024**2, seconds=0.3).to_json()  # type: ignore[arg-type]
    assert (data["outcome"], data["description"]) == (outcome, words)  # the JSON: both, outcome unchanged
    line = report.transfer_line("restore", data)
    assert line == f"restore: {words}: {key} (4.0 MiB, 0.30 s)"
    assert "partial" not in line
    text = report.markdown(_stats(_record("t.py::a", hit=1)), where="shared:/c", restore=data)
    assert f"- {line}" in shown(text).splitlines()
    missed = RestoreResult("miss", message="no bundle").to_json()
    assert missed["description"] == "restored nothing: no usable bundle of this fingerprint"
    assert report.transfer_line("restore", missed) == "restore: miss - no bundle"  # a miss says so, with why


def test_the_short_report_names_each_test_that_missed_with_its_reason() -> None:
    """Issue 41, finding 1: the short report named no test ("reasons: shown with -v"), and a rerun with -v hit the
    now-warm cache. It names each test that missed with its one-line reason, a few, then how many more, and
    where this run's full report stays readable."""
    from pytest_compilecache.explain import MissExplanation
    from pytest_compilecache.explain import SessionExplanation

    missed = _stats(*[_record(f"t.py::test_{i}", miss=1 + (i == 2)) for i in range(5)])
    why = SessionExplanation(
        misses={f"t.py::test_{i}": [MissExplanation("k", [f"input 0 shape [8] -> [{i}]"])] for i in range(5)},
        compared_with="bundle",
    )
    assert report.miss_lines(missed, why, None) == [
        "missed: t.py::test_2: input 0 shape [8] -> [2]",  # most misses first
        "missed: t.py::test_0: input 0 shape [8] -> [0]",
        "missed: t.py::test_1: input 0 shape [8] -> [1]",
        "... and 2 more tests missed; full report: python -m pytest_compilecache report "
        "(or -v, --compile-cache-report=full)",
    ]
    assert report.miss_lines(missed, why, "out/r.json")[-1].endswith(', "why" in out/r.json)')
    # Nothing compared (a first run, explaining off): the tests are still named, and why there is no reason.
    first = report.miss_lines(_stats(_record("t.py::a", miss=1)), None, None)
    assert (
        first[0] == "missed: t.py::a: not compared with an earlier run of this cache (a first run, or explaining off)"
    )
    assert report.miss_lines(_stats(_record("t.py::a", hit=3)), why, "r.json") == []  # no misses, no lines
    # A test marked compile_cache("isolated") misses by design: said so, not "not captured"; in the JSON (and
    # so through a worker's output and `report`) and in the step summary's table too.
    marked = _record("t.py::cold", miss=1, by_design=True)
    assert report.miss_lines(_stats(marked), why, None)[0] == f"missed: t.py::cold: {report.BY_DESIGN}"
    assert ItemRecord.from_json(json.loads(json.dumps(marked.to_json()))).by_design
    assert "`t.py::cold` (marked compile_cache: misses by design)" in report.markdown(_stats(marked), where="x")
    outcome = report.SessionOutcome(stats=missed, mode="shared", cache_dir="/c", where="shared:/c", why=why)
    short = [line for line, _ in report.session_lines(outcome, report="short")]
    assert short[1] == "missed: t.py::test_2: input 0 shape [8] -> [2]"  # right under the summary line
    full = [line for line, _ in report.session_lines(outcome, report="full")]
    assert not any(line.startswith("missed:") for line in full)  # the full report has every reason already


def test_identical_reasons_of_one_tests_graphs_are_said_once_with_the_function_and_shapes() -> None:
    """Issue 41, finding 2: the same reason printed twice (once per shape's graph), naming no function or shape."""
    from pytest_compilecache.explain import MissExplanation
    from pytest_compilecache.explain import SessionExplanation

    reason = "graph code changed: a constant in graph statement 6 (1.75 -> 2.0)"
    fn = "gelu (tests/test_ops.py:12)"
    why = SessionExplanation(
        misses={
            "t.py::test_gelu": [
                MissExplanation("k1", [reason], fn, "[4, 8]"),
                MissExplanation("k2", [reason], fn, "[8, 8]"),
                MissExplanation("k3", ["input 0 dtype float32 -> float16"], fn, "[8, 8]"),
            ]
        },
        compared_with="bundle",
    )
    lines = report.why_lines(why)
    assert lines[1:] == [
        f"why t.py::test_gelu: {fn}, 2 graphs (inputs [4, 8]; [8, 8]): {reason}",
        f"why t.py::test_gelu: {fn}, inputs [8, 8]: input 0 dtype float32 -> float16",
    ]
    stats = _stats(_record("t.py::test_gelu", miss=3))
    assert report.miss_lines(stats, why, None)[0] == (
        f"missed: t.py::test_gelu: {fn}, 2 graphs (inputs [4, 8]; [8, 8]): {reason} (and 1 other reason)"
    )
    assert shown(report.why_markdown(why, 10_000)).count(reason) == 1


def test_table_is_slowest_first_with_header_and_recompiles() -> None:
    stats = _stats(
        _record("t.py::fast", hit=1, seconds=0.5),
        _record("t.py::slow", miss=2, bypass=1, seconds=3.25, frames=4, recompiles=2),
        _record("t.py::idle"),
    )
    lines = report.table_lines(stats)
    assert lines[0].split() == ["seconds", "fx", "hit/miss/byp", "aot", "hit/miss", "frames", "test"]
    assert lines[1].split() == ["3.25", "0/2/1", "0/0", "4", "t.py::slow", "(2", "recompiles)"]
    assert lines[2].split() == ["0.50", "1/0/0", "0/0", "0", "t.py::fast"]
    # Issue 41, finding 4: a test that compiled nothing is not dropped without a word.
    assert lines[3] == "(1 other test compiled nothing: not listed)"
    assert len(lines) == 4


def test_table_of_nothing_is_empty() -> None:
    assert report.table_lines(_stats(_record("idle"))) == []


def test_table_truncates_rows_and_long_names() -> None:
    long_id = "tests/" + "deep/" * 40 + "test_x.py::test_tail_is_kept"
    records = [_record(f"t.py::test_{i:02d}", hit=1, seconds=float(i)) for i in range(40)]
    stats = _stats(*records, _record(long_id, hit=1, seconds=100.0, bypass_reasons=["r2", "r1"]))
    lines = report.table_lines(stats, limit=5)
    assert len(lines) == 1 + 5 + 1 + 2
    assert lines[1].endswith("..." + long_id[-77:])
    assert len(lines[1].split()[-1]) == 80
    assert [line.split()[-1] for line in lines[2:6]] == [
        "t.py::test_39",
        "t.py::test_38",
        "t.py::test_37",
        "t.py::test_36",
    ]
    assert lines[6] == "... and 36 more (see --compile-cache-json)"
    assert lines[7:] == ["bypass: r1", "bypass: r2"]
    assert len(report.table_lines(stats, limit=None)) == 1 + 41 + 2
    assert len(report.table_lines(stats)) == 1 + report.TABLE_ROWS + 1 + 2


def test_table_lists_at_most_five_bypass_reasons() -> None:
    stats = _stats(_record("a", bypass=1, bypass_reasons=[f"reason {i}" for i in range(8)]))
    assert [line for line in report.table_lines(stats) if line.startswith("bypass: ")] == [
        f"bypass: reason {i}" for i in range(5)
    ]


# ----------------------------------------------------------------------------------------------------- JSON


def test_json_report() -> None:
    stats = _stats(_record("b", hit=1, seconds=1.0), _record("a", miss=1, seconds=2.0), _record("idle"), tests=5)
    stats.silent_workers.append("gw2")
    restore = {"outcome": "exact", "key": "k", "size": 10, "seconds": 0.1, "message": ""}
    data = report.to_json(stats, mode="shared", cache_dir="/c", restore=restore, notes=["note"])
    assert list(data) == [
        "version",
        "mode",
        "cache_dir",
        "totals",
        "restore",
        "save",
        "silent_workers",
        "notes",
        "tests",
        "why",
        "dynamo",
    ]
    assert data["why"] is None  # nothing compared
    assert data["version"] == report.JSON_VERSION == 1
    assert (data["mode"], data["cache_dir"]) == ("shared", "/c")
    assert data["totals"] == stats.totals_json()
    assert data["totals"]["tests"] == 5
    assert data["restore"] == restore and data["restore"] is not restore
    assert data["save"] is None
    assert data["silent_workers"] == ["gw2"]
    assert data["notes"] == ["note"]
    assert [t["nodeid"] for t in data["tests"]] == ["a", "b"]  # compiled only, by nodeid
    assert json.loads(json.dumps(data)) == data


def test_json_report_of_a_passive_session() -> None:
    data = report.to_json(SessionStats(), mode=None, cache_dir=None)
    assert data["mode"] is None
    assert data["restore"] is None
    assert data["notes"] == []
    assert data["tests"] == []
    assert data["totals"]["hit_rate"] is None


# ------------------------------------------------------------------------------------------------- Markdown


def _details(text: str) -> list[str]:
    return re.findall(r"<details><summary>([^<]*)</summary>", text)


def test_markdown_headline_layers_and_sections() -> None:
    stats = _stats(
        _record("t.py::hit", hit=9, seconds=1.0, aotautograd={"hit": 2, "guard_miss": 1}),
        _record("t.py::miss|pipe", miss=1, bypass=1, seconds=2.0, bypass_reasons=["why `this`"]),
        tests=7,
    )
    save = {"outcome": "saved", "key": "compilecache-v1-x-1", "size": 2048, "seconds": 0.5}
    text = report.markdown(stats, where="shared:/c", save=save)
    lines = text.splitlines()
    assert lines[0] == "### torch.compile cache: 90% hit rate"
    assert "9 FX-graph hits, " in text
    assert "2 of 7 tests compiled, 3.0 s compiling (`shared:/c`)." in text
    assert "| FX graph | 9 | 1 | 1 | - |" in lines
    assert "| AOTAutograd | 2 | 0 | 0 | 1 |" in lines
    assert not any(line.startswith("| remote") for line in lines)
    assert "- save: saved compilecache-v1-x-1 (2.0 KiB, 0.50 s)" in shown(text).splitlines()
    assert _details(text) == ["Slowest compiling tests (2)", "Tests that missed (1)"]
    assert text.count("</details>") == 2
    # table cells are escaped: a pipe would split the cell, a backtick would end the code span
    assert "| 2.00 | 0 | 1 | 0 | `t.py::miss\\|pipe` |" in lines
    assert "| 1 | 0 | `t.py::miss\\|pipe` | why \\`this\\` |" in lines


def test_markdown_remote_rows_and_silent_workers() -> None:
    stats = _stats(_record("a", hit=1, seconds=0.1, remote={"fx_hit": 1, "aot_miss": 2}))
    stats.silent_workers.extend(["gw1", "gw3"])
    lines = report.markdown(stats, where="w").splitlines()
    assert "| remote FX graph | 1 | 0 | - | - |" in lines
    assert "| remote AOTAutograd | 0 | 2 | - | - |" in lines
    assert "- workers that sent no statistics: gw1, gw3" in lines


def test_markdown_of_nothing() -> None:
    text = report.markdown(SessionStats(tests=3), where="shared:/c")
    assert text.startswith("### torch.compile cache: n/a hit rate\n")
    assert "0 of 3 tests compiled" in text
    assert "<details>" not in text


def _many(count: int, *, nodeid_length: int = 300) -> SessionStats:
    stats = SessionStats(tests=count)
    padding = "x" * nodeid_length
    for i in range(count):
        nodeid = f"tests/{padding}/test_{i}.py::test[{i}]"
        fxgraph = {"hit": 1, "miss": i % 3, "bypass": 0}
        stats.records[nodeid] = ItemRecord(nodeid, fxgraph=fxgraph, compile_seconds=i / 1000)
    return stats


@pytest.fixture(scope="module")
def huge() -> SessionStats:
    return _many(100_000)


@pytest.mark.slow  # 100k records: seconds of CPU
def test_markdown_of_100k_long_records_fits_the_default_limit(huge: SessionStats) -> None:
    text = report.markdown(huge, where="shared:/c")
    assert report.MARKDOWN_LIMIT < 1024 * 1024
    assert len(text.encode("utf-8")) <= report.MARKDOWN_LIMIT
    assert text.count("<details>") == text.count("</details>") == 2
    shown = re.findall(r"_(\d+) more rows not shown\._", text)
    assert len(shown) == 2 and all(int(n) > 0 for n in shown)
    # the slowest tests come first and are not the ones cut
    assert "`tests/" + "x" * 300 + "/test_99999.py::test[99999]`" in text


@pytest.mark.slow  # 100k records: seconds of CPU
def test_markdown_of_100k_long_records_respects_a_small_limit(huge: SessionStats) -> None:
    text = report.markdown(huge, where="shared:/c", limit=4_000)
    assert len(text) <= 4_000
    assert text.count("<details>") == text.count("</details>") == 2
    assert "test_99999.py" in text


@pytest.mark.parametrize("limit", [20_000, 4_000, 1_500])
def test_markdown_respects_a_small_limit(limit: int) -> None:
    text = report.markdown(_many(2_000), where="shared:/c", limit=limit)
    assert len(text) <= limit
    assert text.startswith("### torch.compile cache: ")
    assert text.count("<details>") == text.count("</details>") == 2  # cut rows, never the markup
    assert len(re.findall(r"_\d+ more rows not shown\._", text)) == 2


@pytest.mark.parametrize("limit", [200, 1])
def test_markdown_never_exceeds_even_a_tiny_limit(limit: int) -> None:
    text = report.markdown(_many(50), where="shared:/c", limit=limit)
    assert 0 < len(text) <= limit


# ------------------------------------------------------------------------------------- GPU layers (issue 27.5)

TUNED: dict[str, Any] = {"autotune_benchmarks": 3, "triton_compile_seconds": 1.5, "autotune_seconds": 2.25}
BUNDLED: dict[str, Any] = {"triton_bundle_files": 12, "autotune_benchmarks": 3}


def test_all_hits_that_still_autotuned_say_so_plainly() -> None:
    stats = _stats(_record("t.py::test_mm", hit=2, gpu=TUNED), _record("t.py::test_cached", hit=2, gpu=BUNDLED))
    assert report.summary_line(stats, "shared:/p") == (
        "compile cache: 4 hits, 0 misses (100%), 0.0 s compiling, 12 triton files from bundles, "
        "1.5 s triton compiling, 2.2 s autotuning (6 benchmarked), dir shared:/p"
    )
    assert report.gpu_lines(stats) == [
        "gpu: 1 test without an FX-graph miss still autotuned (2.2 s): t.py::test_mm (3.8 s)"
    ]
    table = report.table_lines(stats)
    head = ["triton", "s", "autotune", "s", "bundled", "built", "benchmarks", "test", "(GPU", "layers)"]
    assert table[-3].split() == head
    assert table[-2].split() == ["1.50", "2.25", "0", "0", "3", "t.py::test_mm"]
    assert table[-1].split() == ["0.00", "0.00", "12", "0", "3", "t.py::test_cached"]
    text = report.markdown(stats, where="shared:/p")
    assert "**GPU work despite FX hits**: 1 test without an FX-graph miss still autotuned" in text
    assert "<summary>GPU layers per test (2)</summary>" in text
    assert "| 1.50 | 2.25 | 0 | 0 | 3 | `t.py::test_mm` |" in text
    tests = {t["nodeid"]: t for t in report.to_json(stats, mode="shared", cache_dir="/p")["tests"]}
    assert tests["t.py::test_mm"]["gpu"]["autotune_seconds"] == 2.25


def test_the_json_report_of_a_cpu_session_carries_no_all_zero_gpu_block() -> None:
    """Issue 41, finding 4: CPU runs carried ``"gpu": {...all zeros...}`` per test and in the totals."""
    cpu = _record("t.py::cpu", miss=1, gpu={"triton_compile_seconds": 0.0003})  # torch's C++ wait, not GPU work
    data = report.to_json(_stats(cpu), mode="shared", cache_dir="/c")
    assert "gpu" not in data["totals"] and "gpu" not in data["tests"][0]
    gpu = _record("t.py::gpu", hit=1, gpu={"autotune_seconds": 0.5})
    data = report.to_json(_stats(cpu, gpu), mode="shared", cache_dir="/c")
    assert data["totals"]["gpu"]["autotune_seconds"] == 0.5
    assert [("gpu" in test) for test in data["tests"]] == [False, True]
    assert ItemRecord.from_json(data["tests"][0]).gpu["autotune_seconds"] == 0  # a missing block reads as zeros


def test_cpu_sessions_show_no_gpu_lines() -> None:
    stats = _stats(_record("a", hit=40, miss=1, seconds=10.0))
    assert report.gpu_lines(stats) == [] and report.gpu_table_lines(stats) == []
    assert "GPU" not in report.markdown(stats, where="shared:/p")
    assert "triton" not in report.summary_line(stats, "shared:/p")


def test_a_test_whose_only_gpu_work_is_first_call_autotuning_is_listed() -> None:
    first_call = ItemRecord("t.py::test_first_call")
    first_call.add({"gpu": {"autotune_seconds": 0.75}})  # no frame, no lookup in this test: compiled earlier
    stats = _stats(first_call)
    assert [r.nodeid for r in stats.compiled] == ["t.py::test_first_call"]
    assert report.gpu_lines(stats) == [
        "gpu: 1 test without an FX-graph miss still autotuned (0.8 s): t.py::test_first_call (0.8 s)"
    ]


def test_kernels_built_under_fx_hits_are_named_with_their_count() -> None:
    built = _record("t.py::test_user_kernel", hit=1, gpu={"triton_built": 2, "triton_compile_seconds": 0.4})
    stats = _stats(built, _record("t.py::cpu", hit=1, seconds=0.1, gpu={"triton_compile_seconds": 0.0003}))
    assert report.gpu_lines(stats) == [
        "gpu: 1 test without an FX-graph miss still built 2 triton kernels/helpers (0.4 s compiling): "
        "t.py::test_user_kernel (0.4 s)"
    ]
    assert [line.split()[-1] for line in report.gpu_table_lines(stats)[1:]] == ["t.py::test_user_kernel"]


def test_a_sessions_report_read_back_renders_its_full_report() -> None:
    """Issue 41, finding 1: the JSON the plugin keeps (or --compile-cache-json wrote) reads back into the same full
    report the terminal showed, without rerunning the session."""
    from pytest_compilecache.explain import MissExplanation
    from pytest_compilecache.explain import SessionExplanation

    why = SessionExplanation(
        misses={"t.py::a": [MissExplanation("k", ["input 0 shape [8] -> [16]"])]}, compared_with="bundle"
    )
    restore = {
        "outcome": "partial",
        "key": "k1",
        "size": 10,
        "seconds": 0.1,
        "description": "restored the newest bundle",
    }
    stats = _stats(_record("t.py::a", miss=1, seconds=1.5), tests=3)
    outcome = report.SessionOutcome(
        stats=stats, mode="shared", cache_dir="/c", where="shared:/c", why=why, restored=report._Recorded(restore)
    )
    data = json.loads(json.dumps(report.session_json(outcome)))
    full = [text for text, _ in report.session_lines(outcome, report="full")]
    assert report.full_text(data).splitlines() == full
    assert "why t.py::a: input 0 shape [8] -> [16]" in full
    with pytest.raises((KeyError, TypeError, ValueError)):
        report.outcome_from_json({"totals": {"tests": -1}})


def test_a_whole_percent_is_that_percent_and_any_miss_stays_below_100() -> None:
    from pytest_compilecache.stats import hit_rate

    assert report.percent(hit_rate(29, 21)) == "58%"  # 0.58 * 100 is 57.99... in floating point
    assert report.percent(hit_rate(57, 43)) == "57%" and report.percent(hit_rate(2, 1)) == "66%"  # rounded down
    assert report.percent(hit_rate(999, 1)) == "99%" and report.percent(1 - 1e-12) == "99%"
    assert report.percent(1.0) == "100%" and report.percent(0.0) == "0%" and report.percent(None) == "n/a"
    wrong = [(h, t) for t in range(1, 201) for h in range(t + 1) if report.percent(h / t) != f"{h * 100 // t}%"]
    assert wrong == []


def test_the_outside_row_is_not_counted_as_a_test() -> None:
    from pytest_compilecache.record_fields import OUTSIDE

    stats = _stats(_record("t.py::a", miss=1), _record("t.py::b", hit=1), _record(OUTSIDE, miss=1), tests=3)
    assert stats.compiled_tests == 2 == stats.totals_json()["compiled_tests"]
    assert "2 of 3 tests compiled" in report.markdown(stats, where="shared:/c")
    assert "(1 other test compiled nothing: not listed)" in report.table_lines(stats)


def test_and_n_more_says_one_in_the_singular() -> None:
    from pytest_compilecache.miss_report import MISS_ROWS

    missed = _stats(*[_record(f"t.py::test_{i}", miss=1) for i in range(MISS_ROWS + 1)])
    assert report.miss_lines(missed, None, None)[-1].startswith("... and 1 more test missed; ")
