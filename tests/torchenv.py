"""The torch settings of every process the suite starts, and the environment an inner process starts from.

Every compile the suite starts, in the test process or in an inner session, a subprocess or an act job, uses
these settings; nothing a test checks depends on them, and each saves seconds of CPU on two cores:

* ``TORCHINDUCTOR_COMPILE_THREADS=1``: no pool of compile workers (each would import torch again).
* ``TORCHINDUCTOR_VEC_ISA_OK=1``: torch trusts the CPU's flags for its vector ISAs instead of dry-compiling
  one probe per ISA (about 2 s of g++ each, three here) in every empty cache dir. A compiler that cannot
  build for a flag the CPU reports then fails the kernel build, loudly. The probes are torch's, not ours;
  the test that checks a bundle carries them (tests/plugin/test_headers.py) turns them back on.

The knobs go into inductor's config, so they are part of every FX-graph key: sessions of one test always
share them (the inner environment gets them from here), so hits and misses are what they would be without.

Every process also gets :data:`SITE` first on ``PYTHONPATH``: its ``sitecustomize`` keeps the garbage collector
from walking torch's objects again after each full collection and at shutdown, a quarter of the CPU of a
process that compiled something (tests/site/sitecustomize.py says why no check depends on it).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from collections.abc import MutableMapping
from pathlib import Path

TORCH_SETTINGS: Mapping[str, str] = {
    "TORCHINDUCTOR_COMPILE_THREADS": "1",
    "TORCHINDUCTOR_VEC_ISA_OK": "1",
}

# Variables that would change what a process started by a test does: the outer session's cache settings,
# a CI step summary, an outer xdist worker's identity.
OUTER_PREFIXES = ("PYTEST_COMPILECACHE_", "TORCHINDUCTOR_", "TRITON_", "PYTEST_XDIST_", "GITHUB_")


SITE = str(Path(__file__).with_name("site"))

# The tests that import torch in the test process itself (node-id prefixes: probe, fingerprint.collect, the CLI's
# fingerprint). No test module imports torch while it is collected: every xdist worker collects every module and
# would pay the import (~5 CPU-seconds) before its first test, also where no such test is selected
# (tests/unit/test_torchenv.py checks it). With xdist these tests share one worker (tests/conftest.py's
# scheduler), so only that worker imports torch.
IN_PROCESS = (
    "tests/unit/test_probe.py::",
    "tests/unit/test_fingerprint.py::",
    "tests/unit/test_cli.py::",
    "tests/unit/test_sync_headers.py::test_cli_save_and_restore_carry_headers",
)


def python_path(current: str | None) -> str:
    """``current`` (a ``PYTHONPATH`` value, or None) with :data:`SITE` first, once."""
    rest = [part for part in (current or "").split(os.pathsep) if part and part != SITE]
    return os.pathsep.join([SITE, *rest])


def inner_env(base: Mapping[str, str] | None = None, prefixes: tuple[str, ...] = OUTER_PREFIXES) -> dict[str, str]:
    """``base`` (default: this process's environment) without variables starting with ``prefixes``, plus
    :data:`TORCH_SETTINGS`, with :data:`SITE` on its ``PYTHONPATH``."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if not k.startswith(prefixes)}
    env.update(TORCH_SETTINGS)
    env["PYTHONPATH"] = python_path(env.get("PYTHONPATH"))
    return env


def apply(env: MutableMapping[str, str]) -> None:
    """Set :data:`TORCH_SETTINGS` in ``env`` where it does not set them already, and put :data:`SITE` on its
    ``PYTHONPATH``."""
    for name, value in TORCH_SETTINGS.items():
        env.setdefault(name, value)
    env["PYTHONPATH"] = python_path(env.get("PYTHONPATH"))
