"""The plugin-level subset that CI also runs on the oldest and newest declared torch (marker ``compat``).

One place names it: the pytester suites that really compile (``tests/plugin``), the fault and remote
(Redis) integration tests through the plugin, the probe's capability tests and the cross-version tests.
Select it with ``-m compat``; ``bash scripts/test.sh --torch 2.15.0 -m compat`` runs it on another torch.
It leaves out the ``-n 2`` twins (marker ``xdist_variant``) of scenarios whose one-process run it keeps: their
workers meet torch through the same calls as that run, and what is xdist's alone (the controller's roles, the
merge of what the workers send) does not depend on torch's version. Scenarios about xdist and torch together
(a restoring controller that never imports torch, a killed worker, the header checks of workers) are not twins:
they stay. It also leaves out tests marked ``torch_independent``: start-up without torch, option errors, a
bundle refused before torch sees it, our S3 store's round trip and outages (the same mega-cache load as the
directory store's round trips, which stay).
"""

from __future__ import annotations

import atexit
import gc
import os
from pathlib import Path
from typing import Any

import pytest

from tests import torchenv

_TESTS = Path(__file__).parent
COMPAT_PATHS = (
    _TESTS / "plugin",
    _TESTS / "integration" / "test_plugin_faults.py",
    _TESTS / "integration" / "test_plugin_remote.py",
    _TESTS / "unit" / "test_probe.py",
)


# Every compile the suite starts, here or in a process it starts, uses the suite's torch settings (one
# compile thread, no ISA dry-compiles: see tests/torchenv.py).
torchenv.apply(os.environ)
# A pytest process started without tests/site on its path (the outer one, started by hand) skips the
# collector's walk at shutdown too (tests/site/sitecustomize.py); registered before pytest's and torch's own
# exit handlers, so it runs after them.
atexit.register(gc.freeze)


def pytest_configure(config: pytest.Config) -> None:
    # xdist's `load` scheduling hands each worker a quarter of the suite at a time by default, so the
    # slow compiled tests bunch up on one worker while the other idles at the end (632 s against 516 s
    # for the full suite with `-n 2` here). One test at a time keeps both workers busy to the end;
    # `--maxschedchunk N` on the command line still wins.
    if hasattr(config.option, "maxschedchunk") and config.option.maxschedchunk is None:
        config.option.maxschedchunk = 1


@pytest.hookimpl(optionalhook=True)  # xdist's hook: without xdist (`-p no:xdist`) it is never called
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's `load` scheduling (`-n N`), except that the tests that import torch in the test process
    (tests/torchenv.py, IN_PROCESS) are one unit of work for one worker: the other workers never pay that import
    (~5 CPU-seconds each). Other `--dist` modes are xdist's own."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

    class TorchInProcessTogether(LoadScopeScheduling):  # type: ignore[misc]
        # LoadScopeScheduling hands out units of work, ordered by size (the group first, then single tests in
        # collection order: `early` ones first) and tops a worker up when it has two tests left or fewer.
        def _split_scope(self, nodeid: str) -> str:
            return "torch in process" if nodeid.startswith(torchenv.IN_PROCESS) else nodeid

    return TorchInProcessTogether(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Tests marked `early` run first (a stable sort: the rest keep their order). Such a test builds something
    # other tests share, under a lock: at the start of the run one worker builds it while the other runs other
    # tests, where later both workers would reach the sharing tests together and one would wait, its core idle.
    items.sort(key=lambda item: item.get_closest_marker("early") is None)
    for item in items:
        # A -n 2 twin starts a controller and two workers (1-5 s each): seconds, so `slow`. The fast subset keeps
        # its one-process run; the full suite runs both.
        if item.get_closest_marker("xdist_variant") and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)
        path = Path(str(item.path))
        twin_or_torchless = any(item.get_closest_marker(name) for name in ("xdist_variant", "torch_independent"))
        if not twin_or_torchless and any(path == base or base in path.parents for base in COMPAT_PATHS):
            item.add_marker(pytest.mark.compat)
