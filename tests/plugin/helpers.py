"""What the plugin tests share: tiny inner suites, one way to run them, the JSON report's schema.

Inner suites are their own projects, run in a subprocess (``runpytest_subprocess``) so torch and the
plugin start fresh, exactly as a user's session does. Compiled functions are tiny and mostly matmuls,
which TorchInductor lowers to extern kernels without a C++ build; only ``TRAINING_SUITE`` pays for real
C++ kernels (the precompiled-header tests need them).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from typing import Mapping

import pytest

# pytest-cov's xdist_params: every scenario runs in one process and with two xdist workers. The -n 2 twin is
# marked xdist_variant: CI's runs on the oldest and newest torch leave it out (tests/conftest.py).
XDIST = pytest.mark.parametrize(
    "dist",
    [pytest.param((), id="nodist"), pytest.param(("-n", "2"), id="xdist", marks=pytest.mark.xdist_variant)],
)

INNER_INI = """
[pytest]
filterwarnings =
    ignore::DeprecationWarning
"""

# Inner conftest: `env_log(label)` snapshots the cache environment of the running test; every test's
# environment right after its teardown (when the plugin has put back whatever a marker changed) is logged
# as `after-<test name>`. Files land in envlog/<label>.json, with the process that wrote them.
ENV_CONFTEST = """
import json
import os
import pathlib

import pytest

KEYS = ("TORCHINDUCTOR_CACHE_DIR", "TORCHINDUCTOR_FORCE_DISABLE_CACHES")


def _write(root, label):
    folder = pathlib.Path(str(root)) / "envlog"
    folder.mkdir(exist_ok=True)
    data = {key: os.environ.get(key) for key in KEYS}
    data["worker"] = os.environ.get("PYTEST_XDIST_WORKER", "controller")
    (folder / f"{label}.json").write_text(json.dumps(data))


@pytest.fixture
def env_log(request):
    return lambda label: _write(request.config.rootpath, label)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    # Outermost around setup, call and teardown (and the plugin's wrappers), in the process running the test.
    result = yield
    _write(item.config.rootpath, "after-" + item.name)
    return result
"""

# A Linear training step, forward and backward through the compiled module; ``{bias}`` is empty or
# ", bias=False" (without a bias every kernel is a matmul: no C++ reduction for the bias's gradient).
_TRAINING_STEP = """

def test_training_step():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2{bias})
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 4), torch.randn(8, 2)
    loss = torch.nn.functional.mse_loss(torch.compile(model)(x), y)
    loss.backward()
    opt.step()
    assert torch.isfinite(loss)
"""

# Two tests with real C++ kernels (a pointwise op; a Linear training step, forward and backward).
TRAINING_SUITE = """
import torch


def activation(x):
    return torch.sin(x) + x


def test_activation():
    x = torch.randn(8)
    torch.testing.assert_close(torch.compile(activation)(x), activation(x))
""" + _TRAINING_STEP.format(bias="")

# TRAINING_SUITE's shape (an inference graph; a training step, forward and backward) in matmuls only: extern
# kernels, no C++ build, for the tests about the cache's flow rather than what g++ produced.
TRAINING_MATMUL_SUITE = """
import torch


def activation(x, w):
    return x @ w


def test_activation():
    x, w = torch.randn(8, 4), torch.randn(4, 2)
    torch.testing.assert_close(torch.compile(activation)(x, w), activation(x, w))
""" + _TRAINING_STEP.format(bias=", bias=False")

# Two tests, two different graphs (so two xdist workers never race on one cache entry): one FX lookup each.
MATMUL_SUITE = """
import torch


def project(x, w):
    return x @ w


def gram(x):
    return x.t() @ x


def test_project(env_log):
    env_log("project")
    x, w = torch.randn(8, 4), torch.randn(4, 2)
    torch.testing.assert_close(torch.compile(project)(x, w), project(x, w))


def test_gram(env_log):
    env_log("gram")
    x = torch.randn(8, 4)
    torch.testing.assert_close(torch.compile(gram)(x), gram(x))
"""


@dataclass
class InnerRun:
    """One finished inner session: pytest's result and the plugin's JSON report (None if none was written)."""

    result: pytest.RunResult
    report: dict[str, Any] | None

    @property
    def ret(self) -> int:
        return int(self.result.ret)

    @property
    def data(self) -> dict[str, Any]:
        """The JSON report, which the session must have written."""
        assert self.report is not None, self.output
        return self.report

    @property
    def totals(self) -> dict[str, Any]:
        totals: dict[str, Any] = self.data["totals"]
        return totals

    @property
    def output(self) -> str:
        return self.result.stdout.str() + "\n" + self.result.stderr.str()

    def record(self, name: str) -> dict[str, Any]:
        """The JSON record of the compiled test whose nodeid ends in ``::name``."""
        found: list[dict[str, Any]] = [t for t in self.data["tests"] if t["nodeid"].endswith("::" + name)]
        assert len(found) == 1, (name, self.data["tests"])
        return found[0]


def run_inner(pytester: pytest.Pytester, *args: str, json_name: str = "report.json") -> InnerRun:
    """Run the inner suite in a subprocess with ``--compile-cache-json``; read the report back."""
    path = pytester.path / json_name
    path.unlink(missing_ok=True)
    result = pytester.runpytest_subprocess(f"--compile-cache-json={path}", *args, timeout=300)
    report = json.loads(path.read_text()) if path.exists() else None
    return InnerRun(result, report)


def read_envlog(root: Path) -> dict[str, dict[str, Any]]:
    """envlog/<label>.json files written by ENV_CONFTEST, by label."""
    return {p.stem: json.loads(p.read_text()) for p in sorted((root / "envlog").glob("*.json"))}


# ---- the JSON report, version 1

_NUMBER = (int, float)
_COUNTS = {
    "fxgraph": ("hit", "miss", "bypass"),
    "aotautograd": ("hit", "miss", "bypass", "guard_miss"),
    "remote": ("fx_hit", "fx_miss", "aot_hit", "aot_miss"),
}
_TOP = {
    "version": int,
    "mode": (str, type(None)),
    "cache_dir": (str, type(None)),
    "totals": dict,
    "restore": (dict, type(None)),
    "save": (dict, type(None)),
    "silent_workers": list,
    "notes": list,
    "warnings": list,
    "errors": list,
    "tests": list,
    "why": (dict, type(None)),
    "dynamo": dict,
}
_TOTALS = {
    "tests": int,
    "compiled_tests": int,
    "fxgraph": dict,
    "aotautograd": dict,
    "remote": dict,
    "frames": int,
    "recompiles": int,
    "graph_breaks": int,
    "hits": int,
    "misses": int,
    "hit_rate": (float, int, type(None)),
    "compile_seconds": _NUMBER,
}
_TEST = {
    "nodeid": str,
    "worker": str,
    "fxgraph": dict,
    "aotautograd": dict,
    "remote": dict,
    "frames": int,
    "recompiles": int,
    "graph_breaks": int,
    "compile_seconds": _NUMBER,
    "bypass_reasons": list,
    "graph_break_reasons": list,
    "recompiled": list,
    "limit_hit": list,
    "graphs": int,
    "why": list,
}


def _typed(data: Mapping[str, Any], schema: Mapping[str, Any], where: str) -> None:
    missing = set(schema) - set(data)
    assert not missing, f"{where}: missing {sorted(missing)}"
    for key, kind in schema.items():
        value = data[key]
        # bool is an int to isinstance; a count or a rate is never a bool.
        assert isinstance(value, kind) and not isinstance(value, bool), f"{where}.{key}: {value!r} is not {kind}"


def _counts(data: Mapping[str, Any], layer: str, where: str) -> None:
    _typed(data[layer], dict.fromkeys(_COUNTS[layer], int), f"{where}.{layer}")
    assert all(v >= 0 for v in data[layer].values()), f"{where}.{layer}: {data[layer]}"


def check_report(data: Mapping[str, Any]) -> None:
    """Assert that ``data`` is a version-1 report: every documented key, the right types, sums that agree."""
    _typed(data, _TOP, "report")
    assert data["version"] == 1
    totals = data["totals"]
    _typed(totals, _TOTALS, "totals")
    for layer in _COUNTS:
        _counts(totals, layer, "totals")
    assert all(isinstance(w, str) for w in data["silent_workers"] + data["notes"] + data["warnings"])
    for index, test in enumerate(data["tests"]):
        _typed(test, _TEST, f"tests[{index}]")
        for layer in _COUNTS:
            _counts(test, layer, f"tests[{index}]")
        assert all(isinstance(reason, str) for reason in test["bypass_reasons"])
    # The totals are the sums of the per-test records; hits and misses are the FX-graph layer's.
    assert totals["compiled_tests"] == len(data["tests"]) <= totals["tests"]
    for layer, fields in _COUNTS.items():
        assert totals[layer] == {f: sum(t[layer][f] for t in data["tests"]) for f in fields}, layer
    assert totals["frames"] == sum(t["frames"] for t in data["tests"])
    assert totals["recompiles"] == sum(t["recompiles"] for t in data["tests"]) == data["dynamo"]["recompiles"]
    assert totals["graph_breaks"] == sum(t["graph_breaks"] for t in data["tests"]) == data["dynamo"]["graph_breaks"]
    assert (totals["hits"], totals["misses"]) == (totals["fxgraph"]["hit"], totals["fxgraph"]["miss"])
    lookups = totals["hits"] + totals["misses"]
    expected_rate = round(totals["hits"] / lookups, 4) if lookups else None
    assert totals["hit_rate"] == expected_rate


def settle_as_relatime_leaves_it(path: Path) -> None:
    """Give ``path`` the times of a file built two hours ago, then read it once: ``relatime`` records that read
    (the atime the utime set is older than the ctime it set too), and from then on no read for a day, like
    ``noatime``. A session that starts after this and carries the file must have found it without access
    times (issue 24)."""
    now = time.time()
    os.utime(path, (now - 3600, now - 7200))
    path.read_bytes()
