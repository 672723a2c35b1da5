"""Compile tiny models twice per scenario (``random``: four times), changing exactly one thing, and print every
FX lookup as JSON.

Run as a script (``python explain_scenarios.py NAME...``) by ``test_explain_real.py``: one torch import
for all scenarios, and the test process stays torch-free. Each scenario gets a fresh cache dir; its
"sessions" are separated by ``torch._dynamo.reset()`` and ``clear_caches()``, so each later one looks
every graph up on disk exactly as a new process would.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import tempfile
import traceback
from typing import Any
from typing import Callable

from pytest_compilecache import probe
from tests import torchenv

torchenv.apply(os.environ)  # the suite's torch settings (tests/torchenv.py)
probe.watch_graph_lookups()  # before torch: the capture must install itself when torch loads its codecache

import torch  # noqa: E402
from torch._inductor.utils import clear_caches  # noqa: E402


# Matmuls wherever the scenario allows: TorchInductor calls extern kernels for them, so no g++ runs (seconds
# per graph on two cores). A constant goes into addmm's ``alpha``, still an extern call.
def _scale(c: float) -> Callable[[torch.Tensor], torch.Tensor]:
    def fn(x: torch.Tensor) -> torch.Tensor:
        gram = x.t() @ x
        return torch.addmm(gram, x.t(), x, alpha=c)

    return fn


def _square(c: float) -> Callable[[torch.Tensor], torch.Tensor]:
    # Another function than _scale's, with a constant too: what a subset run must not compare with _scale's graph.
    def square(x: torch.Tensor) -> torch.Tensor:
        gram = x.t() @ x
        return torch.addmm(gram, gram, gram, alpha=c)

    return square


def _plain(x: torch.Tensor) -> torch.Tensor:
    return x.t() @ x


def _grown(twice: bool) -> Callable[[torch.Tensor], torch.Tensor]:
    # One function, its body edited: _plain's graph, then one more matmul (statements added), extern kernels only.
    # One function on both sides: a graph is only compared with an earlier graph of the same function.
    def grown(x: torch.Tensor) -> torch.Tensor:
        gram = x.t() @ x
        return gram @ gram if twice else gram

    return grown


def _pointwise(x: torch.Tensor) -> torch.Tensor:
    # For the training graph: the backward of a matmul of x with itself adds two gradients, a C++ kernel anyway.
    return (x * 2.0).relu().sum(0)


def _run(fn: Callable[..., Any], *args: Any, options: dict[str, Any] | None = None) -> None:
    with torch.no_grad() if not any(getattr(a, "requires_grad", False) for a in args) else _null():
        torch.compile(fn, options=options)(*args)


def _run_all(*calls: tuple[Callable[..., Any], torch.Tensor]) -> None:
    for fn, arg in calls:
        _run(fn, arg)


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


SCENARIOS: dict[str, tuple[Callable[[], None], ...]] = {
    "same": (lambda: _run(_plain, torch.randn(8, 16)), lambda: _run(_plain, torch.randn(8, 16))),
    "shape": (lambda: _run(_plain, torch.randn(8, 16)), lambda: _run(_plain, torch.randn(8, 32))),
    "dtype": (
        lambda: _run(_plain, torch.randn(8, 16)),
        lambda: _run(_plain, torch.randn(8, 16, dtype=torch.bfloat16)),
    ),
    "requires_grad": (
        lambda: _run(_pointwise, torch.randn(8, 16)),
        lambda: _run(_pointwise, torch.randn(8, 16, requires_grad=True)),
    ),
    "constant": (lambda: _run(_scale(2.0), torch.randn(8, 16)), lambda: _run(_scale(3.0), torch.randn(8, 16))),
    "option": (
        lambda: _run(_plain, torch.randn(8, 16)),
        lambda: _run(_plain, torch.randn(8, 16), options={"epilogue_fusion": False}),
    ),
    "structure": (lambda: _run(_grown(False), torch.randn(8, 16)), lambda: _run(_grown(True), torch.randn(8, 16))),
    # test_c1 compiles fn, test_c2 square (fn already compiled in that process: no lookup); after an edit of the
    # constant, test_c2 alone compiles both (a subset run: -k, --lf, xdist).
    "subset": (
        lambda: _run(_scale(2.0), torch.randn(8, 16)),
        lambda: _run(_square(2.0), torch.randn(8, 16)),
        lambda: _run_all((_scale(3.0), torch.randn(8, 16)), (_square(3.0), torch.randn(8, 16))),
    ),
    # An unseeded random number baked into the graph: what makes a test never hit. Four sessions: flagging
    # needs the same statement changing in three runs in a row (one edit changes it once).
    "random": tuple(lambda: _run(_scale(random.random()), torch.randn(8, 16)) for _ in range(4)),
}


def _session(step: Callable[[], None]) -> list[dict[str, Any]]:
    torch._dynamo.reset()
    clear_caches()
    start = probe.graph_mark()
    step()
    return probe.graph_delta(start)


def main(names: list[str]) -> int:
    out: dict[str, Any] = {}
    for name in names:
        cache = tempfile.mkdtemp(prefix=f"explain-{name}-")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
        try:
            runs = [_session(step) for step in SCENARIOS[name]]
            out[name] = {"a": runs[0], "b": runs[1], "runs": runs}
        except Exception:
            out[name] = {"error": traceback.format_exc()}
        finally:
            shutil.rmtree(cache, ignore_errors=True)
    out["active"] = probe.graph_capture_active()
    out["note"] = probe.graph_capture_installed()
    print("SCENARIOS-JSON " + json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or list(SCENARIOS)))
