"""scripts/gpu-check.py: on a machine without CUDA it says it skipped, and succeeds (it runs its checks on one)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu-check.py"


@pytest.mark.slow
def test_without_a_cuda_device_the_gpu_check_says_it_skipped(tmp_path: Path) -> None:
    import torch

    # A machine with CUDA would run every check (minutes): there, only that the script starts.
    argv = [sys.executable, str(SCRIPT), *(["--help"] if torch.cuda.is_available() else [])]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    if "--help" in argv:  # pragma: no cover - CI has no GPU
        assert out.returncode == 0 and "usage:" in out.stdout
        return
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("gpu-check: skipped: "), out.stdout
    assert not list(tmp_path.iterdir())  # nothing written where it ran


def _script() -> Any:
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_warm_suites_conftest_notes_triton_entries_and_best_configs(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    (cache / "triton" / "KEYA").mkdir(parents=True)
    (cache / "triton" / "KEYA" / "add_kernel.json").write_text("{}")
    (cache / "triton" / "KEYA" / "add_kernel.cubin").write_bytes(b"\0")
    (cache / "triton" / "KEYA" / "__grp__add_kernel.json").write_text(
        json.dumps({"child_paths": {"add_kernel.json": str(cache / "triton/KEYA/add_kernel.json"), "x": "/gone/x"}})
    )
    (cache / "triton" / "stray-file").write_text("")
    (cache / "33").mkdir()
    (cache / "33" / "abc.best_config").write_text("{}")
    (cache / "33" / "c33.py").write_text("")
    namespace: dict[str, Any] = {}
    exec(_script().SNAPSHOT_CONFTEST, namespace)
    namespace["snapshot"](str(cache), str(tmp_path / "out.json"))
    assert json.loads((tmp_path / "out.json").read_text()) == {
        "triton": {"KEYA": ["__grp__add_kernel.json", "add_kernel.cubin", "add_kernel.json"]},
        "best_config": ["33/abc.best_config"],
        "astray": ["/gone/x"],
    }


def test_the_diagnosis_names_entries_left_out_made_anew_or_under_another_key() -> None:
    kernel = ["__grp__add_kernel.json", "add_kernel.cubin", "add_kernel.json"]
    cold = {"triton": {"A" * 52: kernel, "B" * 52: ["cuda_utils.so"]}, "best_config": ["33/x.best_config"]}
    carried = {"A" * 52: kernel}
    warm = {"triton": {"A" * 52: kernel, "C" * 52: kernel}, "best_config": ["44/y.best_config"], "astray": ["/a/k"]}
    lines = _script().diagnose(cold, carried, warm)
    assert lines == [
        "the cold run ended with 2 triton entries and 1 best configs; the bundle carried 1 triton entries",
        f"not carried: triton entry {'B' * 16} (cuda_utils.so)",
        f"made on the fresh runner: triton entry {'C' * 16} (add_kernel); the bundle carried this kernel under "
        + "A" * 16,
        "the fresh runner's triton group files name 1 files outside their entry or missing (triton then compiles "
        "again): /a/k",
        "best config on the fresh runner, not in the cold run's dir: 44/y.best_config",
        "best config of the cold run, not on the fresh runner: 33/x.best_config",
    ]
    same = {"triton": {"A" * 52: kernel}, "best_config": ["33/x.best_config"]}
    assert _script().diagnose(same, carried, same) == [
        "the cold run ended with 1 triton entries and 1 best configs; the bundle carried 1 triton entries"
    ]
