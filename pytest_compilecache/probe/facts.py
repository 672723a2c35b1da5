"""What this torch offers the plugin (capabilities) and what decides reuse (torch and device facts).

PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from typing import NamedTuple

from .hooks import dynamo_loaded


def remote_counts_available() -> bool:
    """AOTAutograd remote hit counts exist in CompilationMetrics from torch 2.11."""
    from torch._dynamo.utils import CompilationMetrics

    return "aotautograd_remote_cache_hit_count" in getattr(CompilationMetrics, "__dataclass_fields__", {})


def capabilities() -> dict[str, bool]:
    """What this torch offers the plugin, probed by attribute (never by version string).

    Keys: ``fx_counters``, ``aot_counters`` (the caches whose counters per-test stats read),
    ``compilation_metrics`` (frames, recompiles, compile seconds), ``metrics_limit`` (more than 64 records
    kept), ``bypass_reasons`` (the codecache log line the bypass tap reads), ``clear_caches`` (isolated
    compiles), ``mega_cache`` (bundles carry torch's artifacts), ``remote_fx_counts``, ``remote_aot_counts``.
    Imports torch's modules: call it only when the session already imported torch.
    """
    import torch
    from torch._dynamo import utils
    from torch._inductor import codecache
    from torch._inductor import utils as inductor_utils

    fields = getattr(utils.CompilationMetrics, "__dataclass_fields__", {})
    aot_cache = False
    with contextlib.suppress(ImportError):
        from torch._functorch._aot_autograd import autograd_cache

        aot_cache = hasattr(autograd_cache, "AOTAutogradCache")
    return {
        "fx_counters": hasattr(codecache, "FxGraphCache"),
        "aot_counters": aot_cache,
        "compilation_metrics": hasattr(utils, "get_compilation_metrics"),
        "metrics_limit": hasattr(utils, "set_compilation_metrics_limit"),
        "bypass_reasons": _logs_bypass_reasons(codecache),
        "clear_caches": hasattr(inductor_utils, "clear_caches") or hasattr(inductor_utils, "clear_inductor_caches"),
        "mega_cache": all(hasattr(torch.compiler, name) for name in ("save_cache_artifacts", "load_cache_artifacts")),
        "remote_fx_counts": "inductor_fx_remote_cache_hit_count" in fields,
        "remote_aot_counts": "aotautograd_remote_cache_hit_count" in fields,
    }


def _logs_bypass_reasons(codecache: Any) -> bool:
    """The tap reads ``log.info("Bypassing FX Graph Cache because '%s'", e)`` on the codecache module's logger."""
    logger = getattr(codecache, "log", None)
    if getattr(logger, "name", None) != "torch._inductor.codecache":
        return False
    try:
        source = Path(codecache.__file__).read_text(encoding="utf-8", errors="replace")
    except (OSError, TypeError):
        return False
    return "Bypassing FX Graph Cache because" in source


# What a missing capability costs the user, in the words of the report.
_MISSING = {
    "fx_counters": "FX graph cache counters not available: per-test FX hits and misses are not measured",
    "aot_counters": "AOTAutograd cache counters not available: per-test AOTAutograd hits and misses are not measured",
    "compilation_metrics": "compilation metrics not available: frames, recompiles and compile seconds are not measured",
    "metrics_limit": "compilation metrics keep only torch's last 64 records: frame counts of long sessions are low",
    "bypass_reasons": "the FX graph cache bypass log line was not found: bypasses are counted without reasons",
    "clear_caches": "no way to clear in-memory kernels: isolated tests may reuse kernels compiled earlier",
    "mega_cache": "no mega-cache API (torch.compiler.save_cache_artifacts): bundles carry no torch artifacts",
}
_MISSING_REMOTE = {
    "remote_fx_counts": "remote FX graph cache counts not available",
    "remote_aot_counts": "AOTAutograd remote cache counts not available (remote FX-graph counts only)",
}


def capability_notes(*, remote: bool = False) -> list[str]:
    """One report note per capability this torch lacks, e.g. "torch 2.7.1: AOTAutograd remote cache counts ...".

    Empty when the session never imported torch (nothing is imported then) or when everything is there.
    ``remote``: a Redis remote cache is on, so missing remote counts matter too. Reads, changes nothing.
    """
    if not dynamo_loaded():
        return []
    import torch

    missing = dict(_MISSING, **_MISSING_REMOTE) if remote else _MISSING
    found = capabilities()
    return [f"torch {torch.__version__}: {text}" for key, text in missing.items() if not found[key]]


# --------------------------------------------------------------------------- fingerprint facts


def torch_facts() -> dict[str, str]:
    """What about this torch install decides whether compiled artifacts can be reused here."""
    import torch

    facts = {
        "torch": torch.__version__,
        "torch_git": str(getattr(torch.version, "git_version", "") or ""),
        # Kernel .so keys embed absolute include paths into torch and Python.
        "torch_path": os.path.dirname(os.path.abspath(torch.__file__)),
        "cpu_capability": _safe(lambda: torch.backends.cpu.get_cpu_capability()),
        # The FX key depends on the thread count (torch 2.13+, the fix of pytorch/pytorch#167463).
        "threads": str(torch.get_num_threads()),
        "cxx": _safe(_compiler_version),
        "torch_tree": _safe(_torch_key),
    }
    return facts


def _safe(fn: Any) -> str:
    try:
        return str(fn())
    except Exception as exc:  # a fact we cannot read is recorded as such, not a crash
        return f"unknown ({type(exc).__name__})"


def _compiler_version() -> str:
    from torch._inductor import cpp_builder

    info = cpp_builder.get_compiler_version_info(cpp_builder.get_cpp_compiler())
    match = re.search(r"(gcc|clang) version [^\s_]+(?: \([^)]*\))?", info)
    return match.group(0) if match else info[-120:]


def _torch_key() -> str:
    from torch._inductor.codecache import torch_key

    return str(torch_key().hex())[:16]


class Devices(NamedTuple):
    """What torch and triton key compiled GPU code on, as read from one process (the seam tests fill in).

    ``properties`` are torch's device-property objects (``torch.cuda.get_device_properties``) of every
    visible GPU, or objects with the same attributes (``name``, ``major``, ``minor``,
    ``multi_processor_count``, ``gcnArchName``; on CUDA builds torch sets ``gcnArchName`` to the name).
    ``triton_key``: a short hash of triton's ``triton_key()`` (its files' content hash, which torch's FX key
    uses), "" when no GPU made it matter.
    """

    cuda: str
    hip: str
    triton: str
    triton_key: str
    properties: list[Any]


def device_facts(devices: Devices | None = None) -> dict[str, Any]:
    """Recorded device facts: ``{"cuda", "hip", "triton", "triton_key", "gpus": [{"name", "capability", "sms"}]}``.

    ``capability`` is what the compiled code was built for: ``major.minor`` on CUDA (triton's kernel key and
    ``-arch=sm_XY``), the ``gcnArchName`` on ROCm (what torch's FX key reads there); ``sms`` the multiprocessor
    count, which generated kernels bake in (MIG slices and cut-down parts share a name). ``devices=None``
    reads this machine through :func:`read_devices` (never initialises CUDA in this process).
    """
    found = read_devices() if devices is None else devices
    return {
        "cuda": found.cuda,
        "hip": found.hip,
        "triton": found.triton,
        "triton_key": found.triton_key,
        "gpus": [_gpu_fact(props, rocm=bool(found.hip)) for props in found.properties],
    }


def _gpu_fact(props: Any, *, rocm: bool) -> dict[str, Any]:
    # On CUDA builds gcnArchName is the device name again (torch/cuda/_utils.py), never the capability.
    arch = str(getattr(props, "gcnArchName", "") or "") if rocm else ""
    return {
        "name": str(props.name),
        "capability": arch or f"{props.major}.{props.minor}",
        "sms": int(props.multi_processor_count),
    }


# Run in a short-lived child: reading device properties initialises CUDA in the process that asks, after
# which CUDA fails in forked children (``pytest --forked``, fork-based multiprocessing) and the process holds
# a GPU context. The child prints the same attributes the property objects have.
_PROPERTY_NAMES = ("name", "major", "minor", "multi_processor_count", "gcnArchName")
_CHILD = """
import json, sys
sys.path.insert(0, sys.argv[1])
from pytest_compilecache import probe
devices = probe.read_devices_here()
print(json.dumps(devices._replace(properties=[probe.property_values(p) for p in devices.properties])._asdict()))
"""
CHILD_TIMEOUT = 120.0


def read_devices() -> Devices:
    """This machine's :class:`Devices`, without initialising CUDA in this process.

    A CPU-only torch build, or NVML (AMD SMI on ROCm) counting no visible GPU: no GPUs, nothing spawned.
    CUDA already initialised here (the tests used the GPU in this process): read here. Otherwise a
    short-lived child process reads them (about one ``import torch``); a child that fails is recorded as an
    unknown GPU, never a crash.
    """
    import torch

    none = _no_devices(torch)
    if not (none.cuda or none.hip) or _visible_gpus(torch, rocm=bool(none.hip)) == 0:
        return none
    if torch.cuda.is_initialized():
        return read_devices_here()
    return _read_devices_in_child(none)


def _visible_gpus(torch: Any, *, rocm: bool) -> int:
    """NVML's (AMD SMI's) count of the GPUs ``CUDA_VISIBLE_DEVICES`` leaves; -1 when it cannot tell.

    torch's own ``device_count`` uses the same private helpers so that it does not initialise CUDA (2.4-2.15),
    which would break forked children (pytorch/pytorch#83973).
    """
    count = getattr(torch.cuda, "_device_count_amdsmi" if rocm else "_device_count_nvml", None)
    if count is None:
        return -1
    try:
        with warnings.catch_warnings():  # "Can't initialize NVML" is a warning torch raises, not our news
            warnings.simplefilter("ignore")
            found = int(count())
    except Exception:
        return -1
    if found < 0 and not rocm and sys.platform == "linux" and not os.path.exists("/proc/driver/nvidia"):
        return 0  # no NVIDIA driver loaded: CUDA would find no device either
    return found


def read_devices_here() -> Devices:
    """Read the visible GPUs in this process. Initialises CUDA here: call it only where CUDA is in use anyway
    (or in the short-lived child)."""
    import torch

    none = _no_devices(torch)
    if not torch.cuda.is_available():
        return none
    properties = [torch.cuda.get_device_properties(index) for index in range(torch.cuda.device_count())]
    return none._replace(triton_key=_safe(_triton_key) if properties else "", properties=properties)


def _no_devices(torch: Any) -> Devices:
    """The versions torch was built with and triton's version; no GPUs yet."""
    triton = ""
    with contextlib.suppress(Exception):
        # Through importlib: triton comes only with CUDA/ROCm builds, so type checks cannot rely on its stubs.
        triton = str(importlib.import_module("triton").__version__)
    return Devices(str(torch.version.cuda or ""), str(getattr(torch.version, "hip", None) or ""), triton, "", [])


def _triton_key() -> str:
    """A short hash of ``triton_key()``: the content hash of triton's sources and ``libtriton``, which torch's FX
    key uses instead of the version (triton is rebuilt without a version change). Found where torch finds it: its
    ``triton_compat`` (2.8-2.15), else triton's own modules (``runtime.cache`` from 3.4, ``compiler.compiler``)."""
    for module in ("torch._inductor.runtime.triton_compat", "triton.runtime.cache", "triton.compiler.compiler"):
        with contextlib.suppress(ImportError):
            key = getattr(importlib.import_module(module), "triton_key", None)
            if callable(key):
                return hashlib.sha256(str(key()).encode()).hexdigest()[:16]
    raise ImportError("no triton_key() in this torch or triton")


def property_values(props: Any) -> dict[str, Any]:
    """The attributes of one device-property object the facts use, as plain JSON values."""
    return {name: getattr(props, name, None) for name in _PROPERTY_NAMES}


def devices_from_json(data: Any) -> Devices:
    """Rebuild :class:`Devices` from what the child printed (properties as attribute objects).

    Raises ValueError when the printed JSON has another shape."""
    if not isinstance(data, dict) or not isinstance(data.get("properties"), list):
        raise ValueError(f"device query printed {str(data)[:100]!r}")
    properties = []
    for values in data["properties"]:
        if not isinstance(values, dict) or not isinstance(values.get("name"), str):
            raise ValueError(f"device query printed a malformed device {str(values)[:100]!r}")
        properties.append(SimpleNamespace(**{name: values.get(name) for name in _PROPERTY_NAMES}))
    text = {name: str(data.get(name) or "") for name in ("cuda", "hip", "triton", "triton_key")}
    return Devices(properties=properties, **text)


def _read_devices_in_child(none: Devices) -> Devices:
    package_parent = str(Path(__file__).resolve().parents[2])
    try:
        done = subprocess.run(
            [sys.executable, "-c", _CHILD, package_parent],
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT,
            check=False,
        )
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"exit status {done.returncode}: {last[:160]}")
        child = devices_from_json(json.loads(done.stdout.strip().splitlines()[-1]))
        return none._replace(triton_key=child.triton_key, properties=child.properties)  # versions: this process's
    except Exception as exc:  # a fact we cannot read is recorded as such, not a crash
        unknown = SimpleNamespace(name=f"unknown ({type(exc).__name__})", major="?", minor="?", multi_processor_count=0)
        return none._replace(triton_key="unknown", properties=[unknown])
