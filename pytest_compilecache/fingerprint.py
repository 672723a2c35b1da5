"""What decides whether cached artifacts can be reused here, its digest, and bundle keys.

A :class:`Fingerprint` is a flat, sorted mapping of facts (all strings). Its digest is the second part
of every bundle key: ``<prefix>-<digest>-<run suffix>``. A restore looks for the exact key, then the
newest key under ``<prefix>-<digest>-``; when that misses, :func:`explain` names the facts that differ
from the newest bundle under ``<prefix>-``.

Torch facts come from :mod:`probe` (the one torch-aware module). GPU facts go through one seam:
``collect(device=...)`` takes recorded device facts, so CUDA paths are tested without a GPU.
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
from .errors import ConfigError

DIGEST_LENGTH = 16


@dataclass(frozen=True)
class Fingerprint:
    """Facts about this machine and install; equal fingerprints mean bundles can be reused."""

    facts: Mapping[str, str]

    def digest(self) -> str:
        """Truncated sha256 over the canonical JSON of the facts."""
        canonical = json.dumps(dict(sorted(self.facts.items())), separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:DIGEST_LENGTH]

    def to_json(self) -> dict[str, str]:
        return dict(sorted(self.facts.items()))

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Fingerprint:
        return cls({str(k): str(v) for k, v in data.items()})


def collect(salt: str = "", device: Mapping[str, Any] | None = None) -> Fingerprint:
    """Collect every fact. Imports torch (through :mod:`probe`); ``device`` replaces the real GPU query."""
    facts = platform_facts()
    facts.update(probe.torch_facts())
    facts.update(device_facts(device if device is not None else probe.device_facts()))
    if salt:
        facts["salt"] = salt
    return Fingerprint(facts)


def device_facts(device: Mapping[str, Any]) -> dict[str, str]:
    """Flatten recorded device facts (``{"cuda", "hip", "triton", "gpus": [{"name", "capability"}]}``).

    Raises :class:`ConfigError` when recorded facts have another shape (they come from a user's file).
    """
    gpus = device.get("gpus") if isinstance(device, Mapping) else None
    if (
        not isinstance(device, Mapping)
        or not isinstance(gpus or [], list)
        or not all(
            isinstance(g, Mapping) and isinstance(g.get("name"), str) and isinstance(g.get("capability"), str)
            for g in gpus or []
        )
    ):
        raise ConfigError(
            'device facts: expected {"cuda": str, "hip": str, "triton": str, '
            '"gpus": [{"name": str, "capability": str}, ...]}'
        )
    facts = {
        "cuda": str(device.get("cuda") or "none"),
        "hip": str(device.get("hip") or "none"),
        "triton": str(device.get("triton") or "none"),
    }
    gpus = device.get("gpus") or []
    facts["gpus"] = "; ".join(f"{g['name']} ({g['capability']})" for g in gpus) or "none"
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


def _cpu() -> tuple[str, str]:
    """CPU model name and sorted flags from /proc/cpuinfo (Linux); platform strings elsewhere."""
    model, flags = platform.processor() or platform.machine(), ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                key = key.strip()
                generic = model in ("", platform.machine(), platform.processor())
                if key in ("model name", "Model", "CPU part") and generic:
                    model = value.strip()
                elif key in ("flags", "Features") and not flags:
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
