"""``--compile-cache-pgo=on``: torch's shape profile is kept per key prefix, so one lineage's profile does not
change another's compile counts.

The recipe of a user whose suite counts recompiles: branch A calls a helper with two sizes (its profile marks
the size dynamic); branch B, on the same machine and cache dir, asserts that the same byte-identical helper
compiles once per size and then recompiles once. With one job id for every prefix, B read A's profile and compiled
the helper dynamically from its first call: no recompile, B failed. The control proves B can fail: run under A's
prefix, it reads A's profile.
"""

from __future__ import annotations

import pytest

from tests.plugin.helpers import run_inner

pytestmark = pytest.mark.slow

HELPER = """
def scale(x):
    return x * 2
"""

BRANCH_A = """
import torch

from helper import scale


def test_two_sizes():
    compiled = torch.compile(scale, backend="eager")
    for size in (4, 8):
        assert compiled(torch.ones(size)).sum() == 2 * size
"""

BRANCH_B = """
import torch
from torch._dynamo.testing import CompileCounter

from helper import scale


def test_a_new_size_recompiles_once():
    counter = CompileCounter()
    compiled = torch.compile(scale, backend=counter)
    compiled(torch.ones(4))
    compiled(torch.ones(8))
    assert counter.frame_count == 2  # static for 4, then again with a symbolic size
"""


def test_a_shape_profile_stays_with_its_key_prefix_in_a_shared_dir(inner: pytest.Pytester) -> None:
    inner.makepyfile(helper=HELPER, test_branch_a=BRANCH_A, test_branch_b=BRANCH_B)
    shared = ("--compile-cache=shared", f"--compile-cache-dir={inner.path / 'cache'}", "--compile-cache-pgo=on")

    def branch(test: str, prefix: str) -> pytest.RunResult:
        return run_inner(inner, *shared, f"--compile-cache-key-prefix={prefix}", test).result

    branch("test_branch_a.py", "branch-a").assert_outcomes(passed=1)
    profiles = sorted(path.name for path in (inner.path / "cache").rglob("code_state_*"))
    assert profiles, "torch kept no shape profile: the control below would prove nothing"
    branch("test_branch_b.py", "branch-b").assert_outcomes(passed=1)
    branch("test_branch_b.py", "branch-a").assert_outcomes(failed=1)  # the control: A's profile applies
