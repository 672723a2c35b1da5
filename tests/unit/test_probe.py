"""probe's capability guards, on whichever torch this venv has (CI runs them on 2.7.1, 2.13.0 and 2.15.0).

A missing private API must become a note, never a crash or a silent zero: each test removes one API from
the real torch (monkeypatch) and checks both the guard and the note.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING
from typing import Any

import pytest

if TYPE_CHECKING:
    import torch
    import torch._dynamo.utils
    import torch._inductor.utils

from pytest_compilecache import probe
from pytest_compilecache._env import CACHE_ENV
from pytest_compilecache.probe import config as probe_config
from pytest_compilecache.probe import facts as probe_facts
from tests import torchenv


@pytest.fixture(autouse=True)
def _torch_imported() -> None:
    """Every test here runs torch in this process: torch is imported when the first of them runs, not while the
    file is collected, and with xdist they share one worker (tests/torchenv.py, IN_PROCESS)."""
    global torch
    import torch
    import torch._dynamo.utils
    import torch._inductor.utils


@dataclasses.dataclass
class _CacheInfo27:
    """torch 2.7's CacheInfo: one list per artifact type."""

    inductor_artifacts: list[str] = dataclasses.field(default_factory=list)
    autotune_artifacts: list[str] = dataclasses.field(default_factory=list)
    aot_autograd_artifacts: list[str] = dataclasses.field(default_factory=list)
    pgo_artifacts: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class _CacheInfo28:
    """torch 2.8+'s CacheInfo: a dict by type name."""

    artifacts: dict[str, list[str]] = dataclasses.field(default_factory=dict)


def test_artifact_counts_reads_both_cacheinfo_shapes() -> None:
    old = _CacheInfo27(inductor_artifacts=["a", "b"], aot_autograd_artifacts=["c"])
    new = _CacheInfo28(artifacts={"inductor": ["a", "b"], "aot_autograd": ["c"]})
    assert probe.artifact_counts(old) == {"inductor": 2, "aot_autograd": 1}
    assert probe.artifact_counts(new) == probe.artifact_counts(old)
    assert probe.artifact_counts(_CacheInfo27()) == {}


def test_every_capability_has_a_note() -> None:
    found = probe.capabilities()
    assert set(found) == set(probe_facts._MISSING) | set(probe_facts._MISSING_REMOTE)
    assert all(isinstance(value, bool) for value in found.values())


def test_notes_name_exactly_what_is_missing_here() -> None:
    found = probe.capabilities()
    notes = probe.capability_notes(remote=True)
    missing = [key for key, ok in found.items() if not ok]
    assert len(notes) == len(missing)
    assert all(note.startswith(f"torch {torch.__version__}: ") for note in notes)
    # The one capability known to differ inside the declared range agrees with the older check.
    assert found["remote_aot_counts"] == probe.remote_counts_available()
    local = probe.capability_notes(remote=False)
    assert set(local) <= set(notes)
    assert not [note for note in local for text in probe_facts._MISSING_REMOTE.values() if text in note]


def test_missing_mega_cache_is_a_note_and_no_blob(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(torch.compiler, "save_cache_artifacts")
    assert probe.capabilities()["mega_cache"] is False
    assert any("no mega-cache API" in note for note in probe.capability_notes())
    assert probe.save_artifacts() is None


def test_missing_clear_caches_is_a_note_not_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("clear_caches", "clear_inductor_caches"):
        monkeypatch.delattr(torch._inductor.utils, name, raising=False)
    assert probe.capabilities()["clear_caches"] is False
    assert any("clear in-memory kernels" in note for note in probe.capability_notes())
    with probe.isolated_compile() as tmp:
        assert os.environ[CACHE_ENV] == tmp


def test_clear_caches_uses_whichever_name_this_torch_has(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    # torch 2.7 has only clear_inductor_caches; 2.8+ has clear_caches (and the old name as an alias).
    monkeypatch.delattr(torch._inductor.utils, "clear_caches", raising=False)
    monkeypatch.setattr(torch._inductor.utils, "clear_inductor_caches", lambda: calls.append("old"), raising=False)
    assert probe_config._clear_inductor_caches() is True
    assert calls == ["old"]


def test_missing_compilation_metrics_counts_no_frames_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(torch._dynamo.utils, "get_compilation_metrics")
    start = probe.mark()
    out = probe.delta(start)
    assert out["frames"] == 0 and out["compile_seconds"] == 0.0
    assert any("compilation metrics not available" in note for note in probe.capability_notes())


def test_missing_bypass_log_line_is_a_note(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch._inductor.codecache as codecache

    monkeypatch.setattr(codecache, "log", __import__("logging").getLogger("elsewhere"))
    assert probe.capabilities()["bypass_reasons"] is False
    assert any("bypasses are counted without reasons" in note for note in probe.capability_notes())


def test_the_log_taps_read_torchs_lines_and_leave_what_the_user_sees_as_it_was() -> None:
    """The bypass tap reads an INFO line of torch._inductor.codecache where its level is WARNING. An earlier
    tap lowered that logger's level to INFO: its output_code child then passed "Output code written to" (INFO,
    every compile) to a handler, and a level the user set later could not go below INFO."""
    import logging

    import torch._inductor.codecache as codecache

    probe.mark()  # the taps are in place from here on
    parent, child = codecache.log, codecache.output_code_log
    assert parent.level == logging.NOTSET and parent.getEffectiveLevel() == logging.WARNING  # torch's default
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    for logger in (parent, child):
        logger.addHandler(handler)
    try:
        before = probe.mark()
        parent.info("Bypassing FX Graph Cache because '%s'", "a reason")
        assert probe.delta(before)["bypass_reasons"] == ["a reason"]
        child.info("Output code written to: %s", "/tmp/x.py")
        parent.warning("a warning still shows")
        parent.setLevel(logging.DEBUG)  # what torch._logging.set_logs(...) or the user may do later
        parent.debug("debug shows once asked for")
    finally:
        parent.setLevel(logging.NOTSET)
        for logger in (parent, child):
            logger.removeHandler(handler)
    assert seen == ["a warning still shows", "debug shows once asked for"]


def test_a_recompile_limit_hit_is_read_also_where_dynamos_warnings_are_silenced() -> None:
    """``TORCH_LOGS="-dynamo"`` sets Dynamo's level to ERROR: torch's limit warning was never made, and the frame
    that then ran uncompiled was in no report."""
    import logging

    probe.mark()
    dynamo_log = logging.getLogger("torch._dynamo")
    before_level = dynamo_log.level
    dynamo_log.setLevel(logging.ERROR)

    def scaled_eager(x: torch.Tensor, k: int) -> torch.Tensor:
        return x * k

    scaled = torch.compile(scaled_eager, backend="eager", dynamic=False)

    try:
        with torch._dynamo.config.patch(recompile_limit=1):
            start = probe.mark()
            for k in (2, 3, 4):  # an int argument is a constant under dynamic=False: one frame per value
                scaled(torch.ones(2), k)
            out = probe.delta(start)
    finally:
        dynamo_log.setLevel(before_level)
    assert [hit["function"].split(" (")[0] for hit in out.get("limit_hit", [])] == ["scaled_eager"]


def test_no_notes_and_no_torch_import_in_a_session_without_torch(tmp_path: Path) -> None:
    code = "import sys; from pytest_compilecache import probe; "
    code += "print(probe.capability_notes(remote=True), 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path)
    assert out.stdout.split() == ["[]", "False"]


MEGA_CACHE_ROUND_TRIP = textwrap.dedent(
    """
    import json, os, sys
    import torch
    from pytest_compilecache import probe

    os.environ["TORCHINDUCTOR_CACHE_DIR"] = sys.argv[1]
    torch.compile(lambda x: x @ x.t())(torch.randn(4, 4))  # a matmul: an FX entry, no C++ build
    blob = probe.save_artifacts()
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = sys.argv[2]
    print(json.dumps({"blob": blob is not None, "counts": probe.load_artifacts(blob) if blob else {}}))
    """
)


@pytest.mark.slow
def test_mega_cache_round_trip_counts_artifacts_on_this_torch(tmp_path: Path) -> None:
    """The real save/load API of this torch, in a fresh process (save is once per process)."""
    env = torchenv.inner_env(prefixes=("TORCHINDUCTOR_", "TRITON_", "PYTEST_"))
    out = subprocess.run(
        [sys.executable, "-c", MEGA_CACHE_ROUND_TRIP, str(tmp_path / "a"), str(tmp_path / "b")],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["blob"] is True
    assert result["counts"].get("inductor", 0) >= 1, result


# Saved with a job id (--compile-cache-pgo), the blob holds torch's shape profile even where local profiles are
# off (TORCH_DYNAMO_AUTOMATIC_DYNAMIC_LOCAL_PGO=0, read at import and beyond config.patch's reach): torch alone
# then raises on it while loading and writes nothing after it. argv: the blob's file, the cache dir to load
# into, and "save" to compile and save the blob first.
MEGA_CACHE_WITH_A_PROFILE = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    os.environ["TORCH_COMPILE_JOB_ID"] = "round-trip"  # read at import
    import torch
    from pytest_compilecache import probe

    blob_file, cache_dir = Path(sys.argv[1]), sys.argv[2]
    if sys.argv[3:] == ["save"]:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(blob_file.parent / "saved")
        torch.compile(lambda x: x @ x.t())(torch.randn(4, 4))
        blob_file.write_bytes(probe.save_artifacts())
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
    counts = probe.load_artifacts(blob_file.read_bytes())
    written = {name: sorted(os.listdir(os.path.join(cache_dir, name))) for name in os.listdir(cache_dir)}
    print(json.dumps({"counts": counts, "written": written}))
    """
)


@pytest.mark.slow
def test_a_blob_with_a_shape_profile_loads_where_local_profiles_are_off(tmp_path: Path) -> None:
    env = torchenv.inner_env(prefixes=("TORCHINDUCTOR_", "TRITON_", "PYTEST_", "TORCH_COMPILE_", "TORCH_DYNAMO_"))
    blob = tmp_path / "blob"

    def load(cache_dir: str, *save: str, **extra: str) -> dict[str, Any]:
        argv = [sys.executable, "-c", MEGA_CACHE_WITH_A_PROFILE, str(blob), str(tmp_path / cache_dir), *save]
        out = subprocess.run(argv, capture_output=True, text=True, env={**env, **extra}, timeout=900)
        assert out.returncode == 0, out.stderr
        return dict(json.loads(out.stdout.strip().splitlines()[-1]))

    off = load("off", "save", TORCH_DYNAMO_AUTOMATIC_DYNAMIC_LOCAL_PGO="0")
    assert off["counts"].get("pgo", 0) >= 1 and off["counts"].get("inductor", 0) >= 1, off
    assert sorted(off["written"]) == ["aotautograd", "fxgraph"], off  # all but the profile, which nothing reads here
    on = load("on")  # local profiles on (torch's default): the profile is written as usual
    assert sorted(on["written"]) == ["aotautograd", "dynamo", "fxgraph"], on
    assert [name for name in on["written"]["dynamo"] if name.endswith(".pkl")] == ["code_state_round-trip_None_.pkl"]


class _Client:
    """Stands in for the redis client torch's backend holds: raises ``error`` from get and set."""

    def __init__(self, error: BaseException | None) -> None:
        self.error = error

    def get(self, key: str) -> bytes | None:
        if self.error is not None:
            raise self.error
        return b"value"

    def set(self, key: str, data: bytes) -> None:
        if self.error is not None:
            raise self.error


def test_the_remote_cache_guard_turns_any_redis_error_into_a_recorded_miss() -> None:
    # This torch's real RedisRemoteCacheBackend, its client replaced: torch catches ConnectionError only.
    import redis
    from torch._inductor.remote_cache import RedisRemoteCacheBackend

    def backend(error: BaseException | None) -> Any:
        made: Any = RedisRemoteCacheBackend.__new__(RedisRemoteCacheBackend)
        made._redis = _Client(error)
        return made

    full = backend(redis.exceptions.ResponseError("OOM command not allowed when used memory > 'maxmemory'."))
    with pytest.raises(redis.exceptions.ResponseError):
        full._put("k", b"v")  # what a compile met before the guard
    probe.guard_remote_cache()
    try:
        assert backend(None)._get("k") == b"value"  # no error yet: torch's calls go through
        assert full._put("k", b"v") is None and full._redis is None  # switched off, as torch does on ConnectionError
        assert full._get("k") is None  # later calls: a miss, nothing recorded
        # torch builds a new backend for each compile: the switch is the process's, or each compile would
        # wait out the socket timeout again. A fresh backend's client is never asked (it would raise).
        fresh = backend(redis.exceptions.TimeoutError("Timeout reading from socket"))
        assert fresh._get("k") is None and fresh._put("k", b"v") is None and fresh._redis is not None
        assert backend(None)._get("k") is None
        assert probe.remote_cache_errors() == [
            "put: ResponseError: OOM command not allowed when used memory > 'maxmemory'."
        ]
        assert probe.remote_cache_errors() == []  # taken once
        for error, line in (
            (
                redis.exceptions.TimeoutError("Timeout reading from socket"),
                "get: TimeoutError: Timeout reading from socket",
            ),
            # torch catches this one itself and switches that backend off; the guard notices, and switches the process
            (redis.exceptions.ConnectionError("Connection reset by peer"), "get: the connection was lost"),
        ):
            probe.uninstall_remote_guard()
            probe.guard_remote_cache()
            failing = backend(error)
            assert failing._get("k") is None and failing._redis is None
            assert backend(None)._get("k") is None
            assert probe.remote_cache_errors() == [line]
        assert backend(None)._get("k") is None  # off in this session, since its error
        probe.guard_remote_cache()  # the next session in this process (pytest.main again): not wrapped twice,
        assert backend(None)._get("k") == b"value"  # and it tries Redis again
        assert (
            getattr(RedisRemoteCacheBackend._get, "__wrapped__", None)
            is RedisRemoteCacheBackend.__dict__["_get"].__wrapped__
        )
        assert not hasattr(RedisRemoteCacheBackend._get.__wrapped__, "__wrapped__")
    finally:
        probe.uninstall_remote_guard()
    assert not hasattr(RedisRemoteCacheBackend._get, "__wrapped__")


def test_a_disabled_session_leaves_torch_caching_as_it_found_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # In-process (pytester, an IDE): torch reads TORCHINDUCTOR_FORCE_DISABLE_CACHES once, at import, and
    # keeps it (2.8+: a forced config value no assignment overrides). After a `disabled` session during
    # which torch was imported, later sessions in the process compiled with every cache off.
    from torch._inductor import config

    monkeypatch.delenv(probe.DISABLE_ENV, raising=False)
    monkeypatch.delenv("TORCH_COMPILE_FORCE_DISABLE_CACHES", raising=False)
    compiler_config = sys.modules.get("torch.compiler.config")
    entry = getattr(compiler_config, "_config", {}).get("force_disable_caches")
    if entry is not None and hasattr(entry, "env_value_force"):  # torch 2.8+
        monkeypatch.setattr(entry, "env_value_force", True)  # as torch read it at import, variable set
    else:  # torch 2.7: the module attribute it computed at import. Patched on torch's entry: pytest's undo of a
        # module attribute it did not find in the module's __dict__ deletes it, which hides it from torch for
        # the rest of the process (every later compile then fails in torch's config copy).
        monkeypatch.setattr(config._config["force_disable_caches"], "user_override", True)
    assert config.force_disable_caches is True
    monkeypatch.setitem(probe_config._config_before, probe_config._READ_AT_IMPORT, True)  # what point_cache_dir records
    probe.put_back_config()  # after the lease removed the variable
    assert config.force_disable_caches is False
    assert probe_config._config_before == {}

    # Torch imported before the session: point_cache_dir assigned the value; it is assigned back.
    note = probe.point_cache_dir(None, disable=True)
    assert note is not None and config.force_disable_caches is True
    os.environ.pop(probe.DISABLE_ENV)  # what the lease does first
    probe.put_back_config()
    assert config.force_disable_caches is False


# --------------------------------------------------------------------------- GPU facts (issue 27): recorded devices


class _CudaInitialised(AssertionError):
    pass


def _looks_like_a_cuda_build_with_one_gpu(monkeypatch: pytest.MonkeyPatch, *, nvml: int = 1) -> list[str]:
    """This CPU torch made to look like a CUDA build that sees one GPU (NVML's count), where anything that
    initialises CUDA in this process raises; returns the calls that would have."""
    calls: list[str] = []

    def initialises(name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            calls.append(name)
            raise _CudaInitialised(f"{name} initialises CUDA in the pytest controller")

        return call

    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "_device_count_nvml", lambda: nvml, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    for name in ("get_device_properties", "_lazy_init", "init", "current_device"):
        monkeypatch.setattr(torch.cuda, name, initialises(name))
    return calls


@pytest.mark.slow
def test_reading_gpus_never_initialises_cuda_in_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """issue 27.3: the controller asks a short-lived child; CUDA in this process stays untouched, so forked
    children can still use it. (The child runs this machine's real CPU torch: it finds no GPU.)"""
    calls = _looks_like_a_cuda_build_with_one_gpu(monkeypatch)
    facts = probe.device_facts()
    assert calls == []
    assert not torch.cuda.is_initialized()
    assert facts["cuda"] == "12.8" and facts["gpus"] == []  # the child's real answer here: no GPU


def test_no_gpu_by_nvml_spawns_no_child(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _looks_like_a_cuda_build_with_one_gpu(monkeypatch, nvml=0)  # e.g. CUDA_VISIBLE_DEVICES=""
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("spawned a child without a GPU"))
    assert probe.device_facts()["gpus"] == [] and calls == []


def test_a_cpu_build_spawns_no_child(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("spawned a child on a CPU build"))
    facts = probe.device_facts()
    assert (facts["cuda"], facts["triton_key"], facts["gpus"]) == ("", "", [])


def test_a_failing_child_is_an_unknown_gpu_not_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    _looks_like_a_cuda_build_with_one_gpu(monkeypatch)
    monkeypatch.setattr(probe_facts, "_CHILD", "import sys; sys.exit('cuInit failed: 999')")
    facts = probe.device_facts()
    assert facts["gpus"] == [{"name": "unknown (RuntimeError)", "capability": "?.?", "sms": 0}]
    assert facts["triton_key"] == "unknown"


def test_with_cuda_already_initialised_the_gpus_are_read_here(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests import devices

    _looks_like_a_cuda_build_with_one_gpu(monkeypatch)
    visible = [devices.H100_SXM, devices.H100_SXM]
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(visible))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: visible[index])
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("spawned a child with CUDA in use here"))
    facts = probe.device_facts()
    assert facts["gpus"] == [{"name": "NVIDIA H100 80GB HBM3", "capability": "9.0", "sms": 132}] * 2


def test_what_the_child_prints_reads_back_as_the_same_facts() -> None:
    from tests import devices

    machine = devices.cuda_machine(devices.H100_SXM, devices.A100)
    printed = json.loads(
        json.dumps(machine._replace(properties=[probe.property_values(p) for p in machine.properties])._asdict())
    )
    assert probe.device_facts(probe.devices_from_json(printed)) == probe.device_facts(machine)
    rocm = devices.rocm_machine(devices.MI300X)
    printed = {**rocm._asdict(), "properties": [probe.property_values(devices.MI300X)]}
    assert probe.device_facts(probe.devices_from_json(printed))["gpus"][0]["capability"] == "gfx942:sramecc+:xnack-"
    bad: Any
    for bad in ({"properties": "x"}, {"properties": [{"major": 9}]}, []):
        with pytest.raises(ValueError):
            probe.devices_from_json(bad)


# --------------------------------------------------------------------------- GPU layers per test (issue 27.5)


def test_the_gpu_counters_and_metrics_are_the_ones_this_torch_writes() -> None:
    """The names probe reads, checked against this torch's own source and CompilationMetrics (CI: 2.7.1-2.15)."""
    import torch._inductor as inductor

    source = "".join(path.read_text(errors="replace") for path in Path(inductor.__file__).parent.rglob("*.py"))
    # 2.7.1 counts max-autotune only; pad_mm_bench, coordesc_tuning_bench and combo_autotune_bench come later.
    counted = {name for name in probe.AUTOTUNE_COUNTERS if f'counters["inductor"]["{name}"]' in source}
    assert "select_algorithm_autotune" in counted
    assert 'counters["inductor"]["triton_bundler_read_and_emit_kernel"]' in source
    assert 'counters["inductor"] += graph.counter_deltas' in source  # why counts alone prove nothing on a hit
    fields = set(getattr(torch._dynamo.utils.CompilationMetrics, "__dataclass_fields__", {}))
    assert set(probe.TRITON_COMPILE_METRICS + probe.AUTOTUNE_METRICS) <= fields


def test_a_test_that_clears_torchs_counters_still_counts_what_it_compiled() -> None:
    """torch's own ``TestCase`` clears ``counters`` in its ``setUp`` and again in its ``tearDown``, as "fresh Dynamo"
    fixtures do: what a test counted before, between and after such clears all counts (the reviewer's suite
    reported 0 hits, 0 misses for every such test); an attempt that failed (a frame Dynamo skipped) is no
    compiled frame."""
    import collections

    from torch._dynamo.utils import CompilationMetrics

    records: collections.deque[Any] = collections.deque()
    fresh: collections.defaultdict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    with pytest.MonkeyPatch.context() as patch:  # this session's own plugin measures the real ones
        patch.setattr(torch._dynamo.utils, "_compilation_metrics", records)
        patch.setattr(torch._dynamo.utils, "counters", fresh)
        fresh["inductor"]["fxgraph_cache_miss"] += 5  # earlier tests
        start = probe.mark()
        fresh["inductor"]["fxgraph_cache_miss"] += 1
        fresh.clear()  # the test's set-up, as torch's TestCase does
        fresh["inductor"]["fxgraph_cache_miss"] += 1
        fresh["aot_autograd"]["autograd_cache_miss"] += 1
        fresh["inductor"]["fxgraph_cache_hit"] += 1
        fresh.clear()  # its tear-down: the counts of the test body are gone from torch's counters
        records.append(CompilationMetrics(compile_id="0/0", fail_type="Unsupported", entire_frame_compile_time_s=0.25))
        out = probe.delta(start)
        start = probe.mark()
        fresh["inductor"].clear()  # in place: a clear takes nothing off what was counted
        fresh["inductor"]["fxgraph_cache_hit"] += 1
        again = probe.delta(start)
        start = probe.mark()
        fresh["inductor"] = fresh["inductor"].copy()  # torch's pattern matcher puts a copy back: no clear
        fresh["inductor"]["fxgraph_cache_miss"] += 1
        fresh["inductor"] += collections.Counter(fxgraph_cache_hit=2)  # a hit adds its entry's counts so
        copied = probe.delta(start)
        start = probe.mark()
        patch.setattr(torch._dynamo.utils, "counters", collections.defaultdict(collections.Counter))
        torch._dynamo.utils.counters["inductor"]["fxgraph_cache_bypass"] += 1
        replaced = probe.delta(start)  # counters itself replaced since the start: what the new one holds
    assert out["fxgraph"] == {"hit": 1, "miss": 2, "bypass": 0} and out["aotautograd"]["miss"] == 1
    assert (out["frames"], out["compile_seconds"]) == (0, 0.25)
    assert again["fxgraph"]["hit"] == 1 and again["fxgraph"]["miss"] == 0
    assert copied["fxgraph"] == {"hit": 2, "miss": 1, "bypass": 0}
    assert replaced["fxgraph"] == {"hit": 0, "miss": 0, "bypass": 1}


def test_counting_through_clears_leaves_torchs_counters_as_torch_uses_them() -> None:
    """The plugin of this very session counts torch's real counters through clears; each group still reads,
    copies, adds and pickles as the plain ``Counter`` torch made (a pickled group is one: an FX-graph cache entry
    must never name the plugin's class), and counters of other groups are not totalled."""
    import collections
    import pickle

    from pytest_compilecache.probe import counters as counting

    assert counting.count_through_clears(torch._dynamo.utils.counters) is not None  # installed at Dynamo's import
    fresh: collections.defaultdict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    fresh["inductor"]["fxgraph_cache_hit"] += 3  # before: counted as what was there
    fresh["stats"]["calls_captured"] += 7
    totals = counting.count_through_clears(fresh)
    assert totals == {"fxgraph_cache_hit": 3} and counting.count_through_clears(fresh) is totals
    group = fresh["inductor"]
    group["fxgraph_cache_hit"] += 1
    group["unrelated"] = 5  # a counter not read here: set as torch sets ddp_buckets
    assert group == collections.Counter(fxgraph_cache_hit=4, unrelated=5) and group["absent"] == 0
    assert type(pickle.loads(pickle.dumps(group))) is collections.Counter
    assert type(group - collections.Counter(fxgraph_cache_hit=1)) is collections.Counter  # torch's counter_deltas
    fresh.clear()
    fresh["aot_autograd"]["autograd_cache_hit"] += 1
    assert totals == {"fxgraph_cache_hit": 4, "autograd_cache_hit": 1}
    other: collections.defaultdict[str, list[int]] = collections.defaultdict(list)
    assert counting.count_through_clears(other) is None and other.default_factory is list  # not torch's: untouched


def test_delta_measures_triton_bundles_autotuning_and_triton_compiles() -> None:
    """A test whose GPU work is first-call autotuning: torch's runtime record, after the compile's own."""
    import collections

    from torch._dynamo.utils import CompilationMetrics

    records: collections.deque[Any] = collections.deque()
    # Fresh counters and records, put back before the test ends: this session's own plugin measures the real ones.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch._dynamo.utils, "_compilation_metrics", records)
        patch.setattr(torch._dynamo.utils, "counters", collections.defaultdict(collections.Counter))
        start = probe.mark()  # counted through clears from here: the group is made after
        counters = torch._dynamo.utils.counters["inductor"]
        counters["fxgraph_cache_hit"] += 1
        counters["triton_bundler_read_and_emit_kernel"] += 4
        counters["select_algorithm_autotune"] += 2
        compiled = CompilationMetrics(compile_id="0/0", entire_frame_compile_time_s=0.5, triton_compile_time_us=300_000)
        first_call = CompilationMetrics(compile_id="0/0", is_runtime=True, runtime_triton_autotune_time_us=1_250_000)
        records.extend((compiled, first_call))
        out = probe.delta(start)
    assert out["gpu"] == {
        "triton_bundle_files": 4,
        "triton_built": 0,
        "autotune_benchmarks": 2,
        "triton_compile_seconds": 0.3,
        "autotune_seconds": 1.25,
    }
    assert out["frames"] == 1 and out["fxgraph"]["hit"] == 1


# ------------------------------------------------------------------ what a fresh GPU runner rebuilds (issue 27.6)


class _FileCacheManager:
    """triton 3.x's ``triton.runtime.cache.FileCacheManager`` where this torch has no triton (CPU builds): the
    same constructor, the same ``cache_dir`` under ``TRITON_CACHE_DIR``, ``put`` writing one file."""

    def __init__(self, key: str, override: bool = False, dump: bool = False) -> None:
        self.key = key
        self.cache_dir = os.path.join(os.environ["TRITON_CACHE_DIR"], key)
        os.makedirs(self.cache_dir, exist_ok=True)

    def put(self, data: bytes, filename: str, binary: bool = True) -> str:
        path = os.path.join(self.cache_dir, filename)
        Path(path).write_bytes(data)
        return path

    def put_group(self, filename: str, group: dict[str, str]) -> str:
        return self.put(json.dumps({"child_paths": group}).encode(), f"__grp__{filename}", binary=False)


@pytest.fixture
def triton_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    """triton's real cache module where triton is installed (CI's CUDA build of torch 2.15), else the stand-in;
    TRITON_CACHE_DIR under a cache dir, and the watch installed (and removed after)."""
    import importlib
    import types

    try:
        module: Any = importlib.import_module("triton.runtime.cache")
    except ImportError:
        module = types.ModuleType("triton.runtime.cache")
        module.FileCacheManager = _FileCacheManager
        monkeypatch.setitem(sys.modules, "triton.runtime.cache", module)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache" / "triton"))
    probe.watch_triton_cache()
    yield module
    probe.uninstall_triton_watch()


def test_used_files_carry_the_triton_entries_this_process_opened(triton_cache: Any, tmp_path: Path) -> None:
    root = tmp_path / "cache"
    helper = triton_cache.FileCacheManager("a" * 64)  # triton's gcc-built cuda_utils, loaded outside sys.modules
    helper.put(b"\x7fELF helper", "cuda_utils.cpython-311-x86_64-linux-gnu.so", binary=True)
    kernel = triton_cache.FileCacheManager("b" * 64)  # a kernel: what torch's bundle lacks with bundling off
    kernel.put(b"cubin", "triton_poi_fused_0.cubin", binary=True)
    kernel.put(b"{}", "__grp__triton_poi_fused_0.json", binary=False)
    Path(kernel.cache_dir, "tmp.pid_7_123").mkdir()  # triton's temp dir of a put in flight
    Path(kernel.cache_dir, "lock").write_text("")
    other = root / "triton" / ("c" * 64)  # an entry some other session left: not this process's
    other.mkdir(parents=True)
    (other / "x.cubin").write_bytes(b"old")
    (root / "cache").mkdir()
    (root / "cache" / "f2b4c1d0").write_text('{"mm": {}}')  # max-autotune's GEMM timings (CacheBase's local cache)
    rel = {os.path.relpath(d, root) for d in (helper.cache_dir, kernel.cache_dir)}
    carried = probe.used_files(str(root))
    assert set(carried) == {
        *(f"{d}/{name}" for d in rel for name in os.listdir(root / d) if name not in ("lock", "tmp.pid_7_123")),
        "cache/f2b4c1d0",
    }
    assert f"{os.path.relpath(helper.cache_dir, root)}/cuda_utils.cpython-311-x86_64-linux-gnu.so" in carried
    assert not any(name.startswith("triton/" + "c" * 64) for name in carried)


def test_triton_entries_outside_the_cache_dir_are_not_carried(triton_cache: Any, tmp_path: Path) -> None:
    triton_cache.FileCacheManager("d" * 64).put(b"x", "k.cubin", binary=True)
    assert probe.used_files(str(tmp_path / "elsewhere")) == []
    # An entry that is a link to a dir elsewhere: nothing behind it is listed (the bundle reads no links).
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.cubin").write_bytes(b"not ours")
    entry = tmp_path / "cache" / "triton" / ("e" * 52)
    entry.symlink_to(outside, target_is_directory=True)
    triton_cache.FileCacheManager(entry.name)  # triton opens it: the watch records the linked dir
    assert not any("secret" in name for name in probe.used_files(str(tmp_path / "cache")))


def test_the_triton_key_fact_hashes_the_key_torch_uses() -> None:
    """Real triton where installed (CI's CUDA build of torch 2.15): the same triton_key() torch's FX key reads."""
    import hashlib
    import importlib.util

    if importlib.util.find_spec("triton") is None:
        # no triton: recorded as unknown, no crash
        assert probe_facts._safe(probe_facts._triton_key).startswith("unknown (")
        return
    import torch._inductor.codecache as codecache

    if hasattr(codecache, "triton_key"):  # 2.8+: torch's own wrapper
        key = codecache.triton_key()
    else:  # 2.7.1 imports it inside CacheBase.get_system, from triton 3.3's compiler module
        from triton.compiler.compiler import triton_key

        key = triton_key()
    assert probe_facts._triton_key() == hashlib.sha256(str(key).encode()).hexdigest()[:16]


def test_triton_entries_this_process_built_are_counted_per_test(triton_cache: Any) -> None:
    """A kernel compiled (triton writes its group file, on a miss only) and a helper library built count; a
    lookup that found its entry does not."""
    start = probe.mark()
    kernel = triton_cache.FileCacheManager("e" * 64)
    kernel.put(b"cubin", "k.cubin", binary=True)
    kernel.put_group("k.json", {"k.cubin": os.path.join(kernel.cache_dir, "k.cubin")})
    triton_cache.FileCacheManager("f" * 64).put(b"\x7fELF", "cuda_utils.cpython-311-x86_64-linux-gnu.so", binary=True)
    triton_cache.FileCacheManager("e" * 64)  # a later lookup of the same entry: a hit, nothing built
    assert probe.delta(start)["gpu"]["triton_built"] == 2


def test_a_phase_that_compiles_nothing_copies_none_of_torchs_records() -> None:
    """torch's ``get_compilation_metrics()`` copies every record it keeps: a phase that compiled nothing must not
    call it, however many the session holds."""
    import collections

    from torch._dynamo.utils import CompilationMetrics

    records: collections.deque[Any] = collections.deque(CompilationMetrics(compile_id=f"{n}/0") for n in range(9))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch._dynamo.utils, "_compilation_metrics", records)
        patch.setattr(torch._dynamo.utils, "get_compilation_metrics", lambda: pytest.fail("records copied"))
        start = probe.mark()
        assert probe.delta(start)["frames"] == 0
        records.append(CompilationMetrics(compile_id="9/0", co_name="f", entire_frame_compile_time_s=0.5))
        assert probe.delta(start)["frames"] == 1


def test_every_graph_break_torch_logs_is_counted_also_those_its_counter_leaves_out() -> None:
    """A data-dependent branch splits the graph, and torch logs it as a graph break, but its
    ``counters["graph_break"]`` does not count it; a ``print`` it counts. Both are the test's."""

    def branch(x: torch.Tensor) -> torch.Tensor:
        x = x + 1
        if x.sum() > 0:
            return x * 2
        return x - 1

    def noisy(x: torch.Tensor) -> torch.Tensor:
        x = x + 1
        print(end="")
        return x * 2

    start = probe.mark()
    torch.compile(branch, backend="eager")(torch.ones(3))
    torch.compile(noisy, backend="eager")(torch.ones(3))
    out = probe.delta(start)
    assert out["graph_breaks"] == 2, out
    data_dependent, printed = out["graph_break_reasons"]
    assert data_dependent.startswith("Data-dependent branching") and "`print`" in printed


# A first compiling test with more frames than torch keeps records of by default (64), in a fresh process: every
# frame is counted when the records are kept from Dynamo's import on.
FIRST_TEST_OF_70_FRAMES = textwrap.dedent(
    """
    import torch
    from pytest_compilecache import probe

    probe.watch_dynamo()  # what the session does at its start, before torch loads Dynamo
    start = probe.mark()
    for index in range(70):
        torch.compile(eval("lambda x: x + %d" % index), backend="eager")(torch.ones(2))
    print(probe.delta(start)["frames"])
    """
)


@pytest.mark.slow
def test_a_first_test_that_compiles_more_frames_than_torch_keeps_by_default_counts_them_all() -> None:
    env = torchenv.inner_env(prefixes=("TORCHINDUCTOR_", "TRITON_", "PYTEST_"))
    argv = [sys.executable, "-c", FIRST_TEST_OF_70_FRAMES]
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1] == "70"


def test_a_session_with_redis_sets_torchs_switches_in_process_and_puts_them_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch (imported here already) read its remote-cache switches at its import: a session that sets the
    variables only then switches torch's config in-process, says so, and puts every entry back at its end,
    so that a later session in the process (pytester, an IDE) does not keep using that Redis."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    from pytest_compilecache import remote
    from pytest_compilecache.context import SessionContext
    from pytest_compilecache.problems import Problems
    from pytest_compilecache.settings import Settings

    entries: list[tuple[Any, str]] = [
        (inductor_config, "fx_graph_remote_cache"),
        (inductor_config, "autotune_remote_cache"),
    ]
    entries.append((functorch_config, "enable_remote_autograd_cache"))
    for config, name in entries:  # set in code by the user: what close puts back, not what the variables say
        monkeypatch.setattr(config, name, False)
    before = [getattr(config, name) for config, name in entries]
    monkeypatch.setattr(remote, "check_redis", lambda url: None)  # answers
    settings = Settings(mode="isolated", dir=str(tmp_path), redis="redis://127.0.0.1:1/0")
    problems = Problems()
    context = SessionContext.start(settings, tmp_path / "default", inherited=None, problems=problems)
    try:
        assert [getattr(config, name) for config, name in entries] == [True, True, True]
        assert any("switched its remote caches in-process" in note for note in problems.notes)
    finally:
        context.close()
    context.close()  # pytest's cleanup stack closes it again after unconfigure: a no-op
    assert [getattr(config, name) for config, name in entries] == before
    # A Redis that does not answer: the switches are off in-process too, also where torch had them on.
    inductor_config.fx_graph_remote_cache = True
    monkeypatch.setattr(remote, "check_redis", lambda url: "unreachable")
    context = SessionContext.start(settings, tmp_path / "default", inherited=None, problems=Problems())
    try:
        assert inductor_config.fx_graph_remote_cache is False
    finally:
        context.close()
        assert inductor_config.fx_graph_remote_cache is True
        inductor_config.fx_graph_remote_cache = before[0]
    # torch imported during a session that had set them: each entry reads the variables as they are now.
    monkeypatch.delenv("TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE", raising=False)
    inductor_config.fx_graph_remote_cache = True
    probe.put_back_remote_caches()
    assert inductor_config.fx_graph_remote_cache is None
    inductor_config.fx_graph_remote_cache = before[0]


class _AutotuneCache:
    """torch's AutotuneCache as a static autotuner's save hook holds it: ``local_cache = (cache, path)``."""

    def __init__(self, path: str) -> None:
        self.local_cache = (object(), path)

    def save(self, *args: Any) -> None:  # the hook: AutotuneCache.save, bound
        raise AssertionError("not called by a load")


def test_a_static_autotuner_is_moved_into_the_cache_dir_it_is_loaded_in() -> None:
    from pytest_compilecache.probe.triton import relocate_autotuner

    old = "/tmp/compilecache-gone/q3"
    kernel = SimpleNamespace(
        filename=f"{old}/cq3abc.py", save_cache_hook=_AutotuneCache(f"{old}/d4e5.best_config").save
    )
    relocate_autotuner(kernel, "/runner/cache")
    assert kernel.filename == "/runner/cache/q3/cq3abc.py"
    assert kernel.save_cache_hook.__self__.local_cache[1] == "/runner/cache/q3/d4e5.best_config"
    here = SimpleNamespace(filename="/runner/cache/q3/cq3abc.py", save_cache_hook=None)
    relocate_autotuner(here, "/runner/cache/")  # already there; no hook: nothing else to move
    assert here.filename == "/runner/cache/q3/cq3abc.py"
    odd = SimpleNamespace(filename="relative.py", save_cache_hook=print)  # neither is torch's: left alone
    relocate_autotuner(odd, "/runner/cache")
    assert odd.filename == "relative.py"


def test_torch_loads_static_autotuners_moved_into_its_cache_dir(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Through torch's own TritonBundler.load_autotuners (2.8+): what an FX-cache hit hands it, pickled where
    another cache dir compiled it, is pointed at this process's cache dir before torch keeps it."""
    import torch._inductor.triton_bundler as triton_bundler
    from torch._inductor.async_compile import CompiledTritonKernels

    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "here"))
    kernel = SimpleNamespace(
        filename="/elsewhere/cache/ab/cabc.py",
        save_cache_hook=_AutotuneCache("/elsewhere/cache/ab/f00.best_config").save,
        compile_results=[],
    )
    result = SimpleNamespace(kernel=kernel, cache_key="compilecache-test-key", kernel_name="triton_poi_0")
    probe.relocate_static_autotuners()
    if "load_autotuners" not in vars(triton_bundler.TritonBundler):  # torch 2.7: no static autotuners to move
        from pytest_compilecache.probe import triton as probe_triton

        assert str(probe_triton._relocating).startswith("static autotuners are not moved with this torch")
        probe.uninstall_triton_watch()
        return
    try:
        assert triton_bundler.TritonBundler.load_autotuners([result]) == ["triton_poi_0"]
    finally:
        CompiledTritonKernels._cache.pop("compilecache-test-key", None)
        probe.uninstall_triton_watch()
    assert kernel.filename == str(tmp_path / "here" / "ab" / "cabc.py")
    assert kernel.save_cache_hook.__self__.local_cache[1] == str(tmp_path / "here" / "ab" / "f00.best_config")
    assert not hasattr(triton_bundler.TritonBundler.load_autotuners, "__wrapped__")  # put back
