"""torch's precompiled header, end to end with torch and gcc: carried through a store, used when valid,
harmless when not.

One first machine (its own TMPDIR, fixture ``machine_a``, run once for both halves of the test) compiles a small suite
from an empty cache dir, so builds torch's precompiled header, and saves a bundle to a directory store: the
header goes in as its own content-addressed object. Fresh machines (a new TMPDIR each, an empty cache dir):

* restore from that store (``_fresh_runners_restore_it``): the header is in their
  header dir before the first test runs, the JSON report counts it, and gcc never builds it (torch still
  preprocesses it in every process: that is how it looks the file up); one runs plainly in ``shared`` mode,
  one with ``-n 2`` in ``isolated`` mode;
* get the header carried by hand, the way the product carries it (``headers.find_used``, ``describe``,
  ``compress``, ``install``), with no store, so every kernel is a miss that gcc compiles with
  ``-include <header>`` (``_carried_by_hand``): a
  valid header is used (torch builds no header and gcc, asked with ``-Winvalid-pch``, does not reject it);
  a header gcc will not use (garbage, or a real PCH built with other flags) costs a slower compile and
  nothing else: gcc says so under ``-Winvalid-pch``, every test passes, results are checked against eager.

gcc is seen through a ``g++`` shim first on PATH: same name, so torch's command lines, header names and kernel
keys are unchanged. It logs every call and adds ``-Winvalid-pch`` to kernel builds that include a header.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_compilecache import headers
from pytest_compilecache.stores import LocalStore
from pytest_compilecache.stores.base import is_artifact_key
from tests.plugin.conftest import OUTER_ENV_PREFIXES
from tests.plugin.helpers import INNER_INI
from tests.plugin.helpers import TRAINING_SUITE


def torch_builds_precompiled_headers() -> bool:
    """torch 2.8+ builds a precompiled C++ header per TMPDIR; torch 2.7 has none (nothing to carry there:
    the plugin finds no header and carries none, see tests/unit/test_headers.py)."""
    import torch._inductor.codecache as codecache

    return hasattr(codecache, "_precompile_header")


pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not torch_builds_precompiled_headers(), reason="this torch builds no precompiled header"),
]

SHIM = """#!/bin/sh
PATH=$HEADER_TEST_REALPATH
export PATH
case ":$PATH:" in  # the shim must never find itself: that would be a fork bomb
  *":$(dirname "$0"):"*) echo "g++ shim: HEADER_TEST_REALPATH holds the shim's own dir" >&2; exit 99 ;;
esac
case " $* " in
  *" -include "*) extra=-Winvalid-pch ;;
  *) extra= ;;
esac
echo "CALL $*" >> "$HEADER_TEST_LOG"
err=$(mktemp)
g++ $extra "$@" 2> "$err"
status=$?
sed 's/^/STDERR /' "$err" >> "$HEADER_TEST_LOG"
cat "$err" >&2
rm -f "$err"
exit $status
"""


# Runs first without xdist (-p no:randomly, file order): what the header dir holds before any compile.
PROBE = """
import json
import os

from pytest_compilecache import headers


def test_header_dir_before_compiling(request):
    directory = headers.header_dir()
    names = sorted(p.name for p in directory.iterdir() if headers.is_header_name(p.name)) if directory.is_dir() else []
    (request.config.rootpath / ("probe-" + os.environ["PROBE_LABEL"] + ".json")).write_text(json.dumps(names))
"""


def _shims(root: Path) -> Path:
    shims = root / "shims"
    shims.mkdir(parents=True)
    (shims / "g++").write_text(SHIM)
    (shims / "g++").chmod(0o755)
    return shims


# The test process's PATH, before any machine put the shim first (the shim runs the g++ it finds there).
REAL_PATH = os.environ["PATH"]


def _machine_env(root: Path, shims: Path, label: str) -> dict[str, str]:
    """A machine's variables: its own TMPDIR, the g++ shim first on PATH and its log, the probe's label."""
    (root / "tmp").mkdir(parents=True)
    real_path = REAL_PATH
    return {
        "TMPDIR": str(root / "tmp"),
        "PATH": f"{shims}:{real_path}",
        "HEADER_TEST_REALPATH": real_path,
        "HEADER_TEST_LOG": str(root / "g++.log"),
        "PROBE_LABEL": label,
    }


@dataclass
class FirstMachine:
    """Machine ``a`` after its session: its dir (``tmp/`` its TMPDIR), the store it saved to, when its session
    began (for ``headers.find_used``), its g++ log, its JSON report, the header names before its first test."""

    root: Path
    store: Path
    since: float
    log: str
    report: dict[str, Any]
    before: list[str]


@pytest.fixture
def machine_a(tmp_path_factory: pytest.TempPathFactory) -> FirstMachine:
    """The first machine (its cold compile and header build are the costly part; both halves of the test only
    read what it left): the probe and the training suite, ``shared`` mode, a directory store."""
    base = tmp_path_factory.mktemp("first-machine")
    project = base / "project"
    project.mkdir()
    (project / "pytest.ini").write_text(INNER_INI)
    (project / "test_0_probe.py").write_text(PROBE)
    (project / "test_training.py").write_text(TRAINING_SUITE)
    root, store = base / "a", base / "store"
    env = {k: v for k, v in os.environ.items() if not k.startswith(OUTER_ENV_PREFIXES)}
    env["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
    env.update(_machine_env(root, _shims(base), "a"))
    since = headers.session_start()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:randomly", "-p", "no:cacheprovider", "--compile-cache=shared",
         f"--compile-cache-dir={root / 'cache'}", f"--compile-cache-store={store}",
         f"--compile-cache-json={root / 'report.json'}"],
        cwd=project, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0 and " 3 passed" in done.stdout, done.stdout + done.stderr
    log = root / "g++.log"
    return FirstMachine(
        root=root,
        store=store,
        since=since,
        log=log.read_text() if log.exists() else "",
        report=json.loads((root / "report.json").read_text()),
        before=json.loads((project / "probe-a.json").read_text()),
    )


@pytest.fixture
def machine(inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):  # type: ignore[no-untyped-def]
    """Run the inner suite as one machine: its own TMPDIR, an empty cache dir, the g++ shim; return its log."""
    shims = _shims(tmp_path)
    inner.makepyfile(test_0_probe=PROBE, test_training=TRAINING_SUITE)

    def run(name: str, before: object = None) -> tuple[pytest.RunResult, str]:
        tmp = tmp_path / name
        env = _machine_env(tmp, shims, name)
        if callable(before):
            before(tmp / "tmp")
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        log = tmp / "g++.log"
        result = inner.runpytest_subprocess(
            "-p", "no:randomly", "--compile-cache=shared", f"--compile-cache-dir={tmp / 'cache'}"
        )
        return result, log.read_text() if log.exists() else ""

    return run


def header_builds(log: str) -> list[str]:
    return [line for line in log.splitlines() if line.startswith("CALL ") and "-x c++-header" in line]


def kernel_builds_with_header(log: str) -> list[str]:
    return [line for line in log.splitlines() if line.startswith("CALL ") and " -include " in line]


def pch_warnings(log: str) -> list[str]:
    return [line for line in log.splitlines() if line.startswith("STDERR ") and "Winvalid-pch" in line]


def carried_headers(first: FirstMachine) -> list[tuple[headers.HeaderArtifact, bytes]]:
    """Machine ``a``'s headers, described and packed (what a save uploads)."""
    assert header_builds(first.log), first.log
    source = headers.header_dir(first.root / "tmp")
    used = headers.find_used(source, first.since)
    assert used, sorted(p.name for p in source.iterdir())
    artifacts = []
    for path in used:
        artifact = headers.describe(path)
        packed = io.BytesIO()
        headers.compress(path, packed, artifact)
        artifacts.append((artifact, packed.getvalue()))
    return artifacts


def damaged(artifact: headers.HeaderArtifact, how: str, work: Path) -> tuple[headers.HeaderArtifact, io.BytesIO]:
    """A header under the carried one's name that gcc will not use, described as a manifest would name it."""
    bad = work / artifact.name
    if how == "garbage":
        bad.write_bytes(os.urandom(64 << 10))
    else:  # a real PCH, built with a macro the kernel builds do not define
        text = work / artifact.name[: -len(".gch")]
        text.write_text("#include <vector>\n")
        gxx = shutil.which("g++", path=REAL_PATH)  # the real one: this build is not the machine's, not logged
        assert gxx is not None
        subprocess.run([gxx, "-x", "c++-header", str(text), "-o", str(bad), "-DCOMPILECACHE_OTHER_FLAGS=1"], check=True)
    described = headers.describe(bad)  # verification passes: only gcc can tell it will not use the file
    packed = io.BytesIO()
    headers.compress(bad, packed, described)
    packed.seek(0)
    return described, packed


def _carried_by_hand(machine, machine_a: FirstMachine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A valid header is used; a header gcc will not use costs only a slower compile."""
    # One first machine for every fresh one: each run compiles for real, and CI has two cores.
    carried = carried_headers(machine_a)

    def carry(tmp: Path) -> None:
        for artifact, packed in carried:
            assert headers.install(artifact, io.BytesIO(packed), headers.header_dir(tmp))

    result, log = machine("fresh", before=carry)
    result.assert_outcomes(passed=3)
    assert kernel_builds_with_header(log), "the empty cache dir must make gcc compile kernels: " + log
    assert header_builds(log) == [], "torch rebuilt a carried header"
    assert pch_warnings(log) == [], "gcc rejected the carried header"

    # gcc names the first mismatch it meets: for a PCH built with other flags that may be the debug level or
    # the macro, so only the file it rejected is checked there.
    name = carried[0][0].name
    for how, reason in [("garbage", "not a PCH file"), ("other-flags", name)]:
        work = tmp_path / f"work-{how}"
        work.mkdir()

        def carry_damaged(tmp: Path, how: str = how, work: Path = work) -> None:
            for artifact, _ in carried:
                bad, packed = damaged(artifact, how, work)
                assert headers.install(bad, packed, headers.header_dir(tmp))

        result, log = machine("fresh-" + how, before=carry_damaged)
        result.assert_outcomes(passed=3)  # TRAINING_SUITE checks its results against eager
        assert kernel_builds_with_header(log), log
        warnings = pch_warnings(log)
        assert warnings, f"gcc was expected to reject the {how} header under -Winvalid-pch: " + log
        assert all(name in line and reason in line for line in warnings), warnings
        assert header_builds(log) == [], "torch never rebuilds a header whose file exists: gcc falls back alone"


def _fresh_runners_restore_it(
    inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, machine_a: FirstMachine
) -> None:
    """Fresh machines restore the header from the store before their first test and never build it."""
    shims = _shims(tmp_path / "restoring")
    store = machine_a.store

    def machine(name: str, *args: str) -> tuple[dict[str, Any], str, list[str]]:
        root = tmp_path / name
        for key, value in _machine_env(root, shims, name).items():
            monkeypatch.setenv(key, value)
        log, report = root / "g++.log", root / "report.json"
        result = inner.runpytest_subprocess(
            "-p", "no:randomly", f"--compile-cache-dir={root / 'cache'}", f"--compile-cache-store={store}",
            f"--compile-cache-json={report}", *args, timeout=600,
        )  # fmt: skip
        result.assert_outcomes(passed=3)
        probe = inner.path / f"probe-{name}.json"
        before = json.loads(probe.read_text()) if probe.exists() else []
        return json.loads(report.read_text()), log.read_text() if log.exists() else "", before

    assert machine_a.before == []
    assert header_builds(machine_a.log), "machine a must build the header for this test to mean anything"
    saved = machine_a.report["save"]
    assert saved["outcome"] == "saved", saved
    assert saved["headers"]["named"] >= 1 and saved["headers"]["transferred"] == saved["headers"]["named"]
    built = sorted(
        p.name for p in headers.header_dir(machine_a.root / "tmp").iterdir() if headers.is_header_name(p.name)
    )
    artifacts = [e.key for e in LocalStore(store).list() if is_artifact_key(e.key)]
    assert len(artifacts) == saved["headers"]["named"]

    report, log, before = machine("b", "--compile-cache=shared")
    restored = report["restore"]
    assert restored["outcome"] in ("exact", "partial"), restored
    assert restored["headers"]["transferred"] == saved["headers"]["named"], restored
    assert restored["headers"]["warnings"] == [] and report["warnings"] == []
    assert before and set(before) <= set(built), (before, built)  # installed before the first test ran
    assert header_builds(log) == [], "torch rebuilt a header the restore installed: " + log
    assert " -E " in log, "torch looked the header up (it preprocesses it first) and found it"

    report, log, _ = machine("c", "--compile-cache=isolated", "-n", "2")
    restored = report["restore"]
    assert restored["outcome"] in ("exact", "partial"), restored
    assert restored["headers"]["transferred"] == saved["headers"]["named"], restored
    assert header_builds(log) == [], "an xdist worker rebuilt a header the controller installed: " + log
    installed = headers.header_dir(tmp_path / "c" / "tmp")
    assert {p.name for p in installed.iterdir() if headers.is_header_name(p.name)} == set(before)


def test_a_header_travels_and_a_bad_one_costs_only_a_slower_compile(  # type: ignore[no-untyped-def]
    machine, machine_a: FirstMachine, inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
    subtests: pytest.Subtests,
) -> None:  # fmt: skip
    # One test, so that one process runs the first machine (a cold compile and a header build) for both.
    with subtests.test("fresh runners restore it from the store"):
        _fresh_runners_restore_it(inner, monkeypatch, tmp_path, machine_a)
    with subtests.test("carried by hand: used when valid, a slower compile when not"):
        _carried_by_hand(machine, machine_a, tmp_path)
