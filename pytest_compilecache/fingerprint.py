"""What decides whether cached artifacts can be reused here, its digest, and bundle keys.

A :class:`Fingerprint` is a flat, sorted mapping of facts (all strings). Its digest, over the facts and the
bundle format, is the second part of every bundle key: ``<prefix>-<digest>-<run suffix>``. A restore looks
for the exact key, then the newest key under ``<prefix>-<digest>-``; when that misses, :func:`explain` names
the facts that differ from the newest bundle under ``<prefix>-``.

Torch facts come from :mod:`probe` (the one torch-aware module). GPU facts are what torch's and triton's keys
use (compute capability, SM count, the CUDA/HIP version, triton's content hash), read without initialising CUDA
in this process; ``collect(device=...)`` takes recorded device facts instead (``probe.device_facts`` of recorded
device-property objects in tests, a ``--device-facts`` file in the CLI), so CUDA paths are tested without a GPU.
One job computes its fingerprint once: :func:`handover` passes it to the job's later steps.
Loads lazily (inside the functions that need them, so a session pays only for what it uses): ``importlib.util``.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import sys
import time
from dataclasses import dataclass
from typing import Any
from typing import Mapping

from . import probe
from ._env import FINGERPRINT_ENV
from .errors import ConfigError
from .manifest import FORMAT_VERSION

DIGEST_LENGTH = 16
# The bundle format is part of every lineage, so that a format bump starts new lineages quietly: a restore
# lists only bundles it can read, instead of reading and refusing each old one's header (up to 16 per restore)
# until they are pruned. Format 2 was current when this rule came in: its digests stay what they were (the
# facts alone), so the bundles already stored keep being found.
_FORMAT_BEFORE_KEYING = 2


@dataclass(frozen=True)
class Fingerprint:
    """Facts about this machine and install; equal fingerprints mean bundles can be reused."""

    facts: Mapping[str, str]

    def digest(self) -> str:
        """Truncated sha256 over the canonical JSON of the facts and the bundle format version (format 2: the
        facts alone, as before the format was keyed)."""
        canonical = json.dumps(dict(sorted(self.facts.items())), separators=(",", ":"))
        if FORMAT_VERSION != _FORMAT_BEFORE_KEYING:
            canonical = f"bundle format {FORMAT_VERSION}\n{canonical}"
        return hashlib.sha256(canonical.encode()).hexdigest()[:DIGEST_LENGTH]

    def to_json(self) -> dict[str, str]:
        return dict(sorted(self.facts.items()))

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Fingerprint:
        return cls({str(k): str(v) for k, v in data.items()})


HANDOVER_ENV = FINGERPRINT_ENV
# The facts a handed-over fingerprint must share with this process to be this process's: the same machine,
# interpreter, torch install and salt. Facts that legitimately differ between two steps of one job (the
# thread count from OMP_NUM_THREADS, the GPUs CUDA_VISIBLE_DEVICES leaves) are the handed-over ones.
_SAME_INSTALL = ("python", "python_abi", "python_prefix", "os", "arch", "libc", "cpu_model", "cpu_flags", "torch_path")


def collect(
    salt: str = "", device: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None
) -> Fingerprint:
    """Collect every fact; ``device`` (recorded device facts, see :func:`device_facts`) replaces the GPU query.

    Without ``device``, a fingerprint handed over by an earlier step of the same job (:func:`handover`, in
    ``environ``, default ``os.environ``) is reused when it describes this install: then the Action's plan step
    and the pytest process key bundles alike, whatever their ``CUDA_VISIBLE_DEVICES`` or ``OMP_NUM_THREADS``.
    Otherwise imports torch (through :mod:`probe`) and asks the GPUs without initialising CUDA here.
    """
    facts = platform_facts()
    if salt:
        facts["salt"] = salt
    if device is None:
        handed = handed_over(environ if environ is not None else os.environ, {**facts, "torch_path": _torch_path()})
        if handed is not None:
            return handed
    facts.update(probe.torch_facts())
    facts.update(device_facts(device if device is not None else probe.device_facts()))
    return Fingerprint(facts)


def handover(fingerprint: Fingerprint) -> dict[str, str]:
    """The environment variable that hands ``fingerprint`` to the job's later steps (the Action writes it to
    ``GITHUB_ENV`` in its plan step), so that pytest's save uses the key the plan computed."""
    return {HANDOVER_ENV: json.dumps(fingerprint.to_json(), separators=(",", ":"))}


def handed_over(environ: Mapping[str, str], here: Mapping[str, str]) -> Fingerprint | None:
    """The fingerprint in ``environ[HANDOVER_ENV]`` when it describes this install (``here``: this process's
    platform facts, ``torch_path`` and ``salt``), else None (absent, malformed, or another interpreter, torch
    or salt: then this process collects its own)."""
    text = environ.get(HANDOVER_ENV, "").strip()
    if not text:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
        return None
    if any(data.get(name) != here.get(name) for name in (*_SAME_INSTALL, "salt")):
        return None
    return Fingerprint(data)


def _torch_path() -> str:
    """The torch install's dir, as ``probe.torch_facts()["torch_path"]`` says it, without importing torch."""
    import importlib.util

    spec = importlib.util.find_spec("torch")
    origin = getattr(spec, "origin", None)
    return os.path.dirname(os.path.abspath(origin)) if origin else "(not found)"


def device_facts(device: Mapping[str, Any]) -> dict[str, str]:
    """Flatten recorded device facts (``probe.device_facts()``'s shape: ``{"cuda", "hip", "triton", "triton_key",
    "gpus": [{"name", "capability", "sms"}]}``; ``triton_key`` and ``sms`` may be absent).

    Identical GPUs count once and the order does not matter: a 1-GPU and an 8-GPU runner of one model, or
    ``CUDA_VISIBLE_DEVICES=1,0``, share bundles; torch and triton key on the device's name, capability and
    multiprocessor count, never on how many there are. ``triton_key`` is a fact only where it is known (a GPU
    made it matter), so CPU-only fingerprints keep their digest. Raises :class:`ConfigError` when recorded
    facts have another shape (they come from a user's file).
    """
    gpus = device.get("gpus") if isinstance(device, Mapping) else None
    if (
        not isinstance(device, Mapping)
        or not isinstance(gpus or [], list)
        or not all(
            isinstance(g, Mapping)
            and isinstance(g.get("name"), str)
            and isinstance(g.get("capability"), str)
            and isinstance(g.get("sms", 0), int)
            for g in gpus or []
        )
    ):
        raise ConfigError(
            'device facts: expected {"cuda": str, "hip": str, "triton": str, "triton_key": str, '
            '"gpus": [{"name": str, "capability": str, "sms": int}, ...]}'
        )
    facts = {
        "cuda": str(device.get("cuda") or "none"),
        "hip": str(device.get("hip") or "none"),
        "triton": str(device.get("triton") or "none"),
    }
    if device.get("triton_key"):
        facts["triton_key"] = str(device["triton_key"])
    kinds = {
        f"{g['name']} ({g['capability']}, {g['sms']} SMs)" if g.get("sms") else f"{g['name']} ({g['capability']})"
        for g in gpus or []
    }
    facts["gpus"] = "; ".join(sorted(kinds)) or "none"
    return facts


def platform_facts() -> dict[str, str]:
    """Python, OS, architecture, libc and the CPU (model and flags: kernels are built with -march=native)."""
    libc, libc_version = platform.libc_ver()
    model, flags = _cpu()
    return {
        "python": f"{sys.implementation.name} {platform.python_version()}",
        "python_abi": sys.implementation.cache_tag or "",
        "python_prefix": sys.prefix,
        "os": platform.system(),
        "arch": platform.machine(),
        "libc": f"{libc} {libc_version}".strip() or "unknown",
        "cpu_model": model,
        "cpu_flags": hashlib.sha256(flags.encode()).hexdigest()[:12] if flags else "unknown",
    }


# /proc/cpuinfo flags that say nothing about which instructions the CPU runs, and that differ between hosts of
# one CPU model (microcode, kernel version, the hypervisor): speculation controls, virtualisation, timers,
# power and performance monitoring. A denylist, not an allowlist: a flag missing here only separates lineages
# (a miss), while an instruction-set flag left out of the hash could load a kernel built for it (-march=native)
# on a CPU without it. The names are Linux's (arch/x86/include/asm/cpufeatures.h). Kept though they vary with the
# kernel: ``ospke`` and ``user_shstk``, from which gcc's -march=native turns on -mpku and -mshstk.
_NOT_ISA_FLAGS = frozenset(
    {
        # speculation controls and mitigations
        "ibrs", "ibpb", "stibp", "ssbd", "md_clear", "flush_l1d", "arch_capabilities", "ibrs_enhanced", "pti",
        "retpoline", "retpoline_amd", "rsb_ctxsw", "use_ibpb", "use_ibrs_fw", "spec_ctrl", "spec_ctrl_ssbd",
        "intel_stibp", "intel_ppin", "virt_ssbd", "stibp_always_on", "ibrs_fw", "kaiser", "l1tf_pteinv", "psfd",
        "rrsba_ctrl", "bhi_ctrl", "ibpb_brtype", "sbpb", "ibpb_exit_to_user", "srso_no", "split_lock_detect",
        "bus_lock_detect", "invpcid_single", "core_capabilities", "tsx_force_abort",
        # virtualisation
        "hypervisor", "vmx", "svm", "ept", "ept_ad", "vpid", "flexpriority", "tpr_shadow", "vnmi", "vmmcall",
        "npt", "lbrv", "nrip_save", "tsc_scale", "vmcb_clean", "flushbyasid", "decodeassists", "pausefilter",
        "pfthreshold", "avic", "vgif", "vmsave_vmload", "x2avic", "x2apic", "osvw",
        # timers, power and performance monitoring
        "constant_tsc", "nonstop_tsc", "nonstop_tsc_s3", "tsc_known_freq", "tsc_adjust", "tsc_reliable",
        "tsc_deadline_timer", "arat", "aperfmperf", "pln", "pts", "epb", "dtherm", "ida", "cpb", "hw_pstate",
        "proc_feedback", "arch_perfmon", "pebs", "bts", "pdcm", "ds_cpl", "dtes64", "tm", "tm2", "acpi", "est",
        "xtpr", "pbe", "perfctr_core", "perfctr_nb", "perfctr_llc", "perfctr_l2", "cpuid_fault", "rep_good",
        "nopl", "xtopology", "cpuid", "extd_apicid", "amd_dcm", "ht",
    }
)  # fmt: skip
_NOT_ISA_PREFIXES = ("amd_", "hwp", "v_", "ibrs_", "ibpb_", "arch_lbr")


def isa_flags(flags: str) -> str:
    """``flags`` (a /proc/cpuinfo ``flags`` line) sorted, without those that name no instructions
    (:data:`_NOT_ISA_FLAGS`): what a kernel built with ``-march=native`` can depend on, and no more."""
    kept = {flag for flag in flags.split() if flag not in _NOT_ISA_FLAGS and not flag.startswith(_NOT_ISA_PREFIXES)}
    return " ".join(sorted(kept))


def _cpu(cpuinfo: str = "/proc/cpuinfo") -> tuple[str, str]:
    """CPU model name and its sorted instruction-set flags (:func:`isa_flags`) from /proc/cpuinfo (Linux);
    platform strings elsewhere."""
    model, flags = platform.processor() or platform.machine(), ""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                key = key.strip()
                generic = model in ("", platform.machine(), platform.processor())
                if key in ("model name", "Model", "CPU part") and generic:
                    model = value.strip()
                elif key == "flags" and not flags:  # x86
                    flags = isa_flags(value)
                elif key == "Features" and not flags:  # arm: instruction-set features only
                    flags = " ".join(sorted(value.split()))
                if key == "" and flags:
                    break
    except OSError:
        pass
    return model or "unknown", flags


def explain(old: Mapping[str, str], new: Mapping[str, str]) -> list[str]:
    """Human-readable differences, e.g. ``["torch: 2.13.0 -> 2.14.1", "salt: (absent) -> v2"]``."""
    lines = []
    for name in sorted(set(old) | set(new)):
        before, after = old.get(name, "(absent)"), new.get(name, "(absent)")
        if before != after:
            lines.append(f"{name}: {before} -> {after}")
    return lines


def make_key(prefix: str, digest: str, suffix: str) -> str:
    """``<prefix>-<digest>-<suffix>``: the one place keys are built."""
    return f"{prefix}-{digest}-{suffix}"


def restore_prefix(prefix: str, digest: str) -> str:
    return f"{prefix}-{digest}-"


def key_rest(prefix: str) -> str | None:
    """What follows ``prefix`` in the keys :func:`make_key` makes with it, as a regular expression: None for a
    lineage (``<key prefix>-<digest>-``: every key under it is one of its own), else ``<digest>-<suffix>``, so
    that key prefix ``proj`` does not take a longer one's keys (``proj-gpu-<digest>-...``)."""
    digest = rf"[0-9a-f]{{{DIGEST_LENGTH}}}"
    return None if re.search(rf"-{digest}-?$", prefix) else rf"{digest}-.+"


def default_suffix() -> str:
    """Sortable and unique enough per machine: UTC time plus the process id."""
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + f"-{os.getpid()}"


_ACTION_SUFFIX = re.compile(r"-(\d+)-(\d+)$")  # the Action's: <run id>-<attempt>
_DEFAULT_SUFFIX = re.compile(r"-(\d{4})(\d\d)(\d\d)T(\d\d)(\d\d)(\d\d)-\d+$")  # default_suffix()'s


def key_origin(key: str) -> str | None:
    """Which run saved ``key``, read off its suffix, for people: ``run 5001, attempt 1`` (the Action's
    suffix) or ``saved 2026-11-24 22:30:00 UTC`` (:func:`default_suffix`); None for any other suffix."""
    saved = _DEFAULT_SUFFIX.search(key)
    if saved:
        year, month, day, hour, minute, second = saved.groups()
        return f"saved {year}-{month}-{day} {hour}:{minute}:{second} UTC"
    run = _ACTION_SUFFIX.search(key)
    return f"run {run[1]}, attempt {run[2]}" if run else None
