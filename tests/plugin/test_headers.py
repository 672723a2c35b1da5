"""torch's precompiled header, end to end with torch and gcc: carried through a store, used when valid,
harmless when not.

One first machine (its own TMPDIR, run once for both halves of the test) compiles a small suite from an
empty cache dir, so builds torch's precompiled header, and saves a bundle to a directory store: the header
goes in as its own content-addressed object. Fresh machines (a new TMPDIR each, an empty cache dir):

* restore from that store (``_fresh_runners_restore_it``): the header is in their
  header dir before the first test runs, the JSON report counts it, and gcc never builds it (torch still
  preprocesses it in every process: that is how it looks the file up), nor torch's vector-ISA probes (the
  bundle carries them; these machines dry-compile them as a user's would, see tests/torchenv.py); one runs
  plainly in ``shared`` mode with one new kernel beside the restored ones, which gcc compiles with
  ``-include <header>``: the restored header is used (torch builds no header and gcc, asked with
  ``-Winvalid-pch``, does not reject it); one runs with ``-n 2`` in ``isolated`` mode;
* get a header gcc will not use (garbage, or a real PCH built with other flags) under the carried one's
  name, installed the way the product installs it (``headers.describe``, ``compress``, ``install``), with
  no store, so every kernel is a miss that gcc compiles with ``-include <header>`` (``_bad_headers``): it
  costs a slower compile and nothing else: gcc says so under ``-Winvalid-pch``, every test passes, results
  are checked against eager.

gcc is seen through a ``g++`` shim first on PATH: same name, so torch's command lines, header names and kernel
keys are unchanged. It logs every call and adds ``-Winvalid-pch`` to kernel builds that include a header.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from typing import Callable

import pytest

from pytest_compilecache import headers
from pytest_compilecache.stores import LocalStore
from pytest_compilecache.stores.base import is_artifact_key
from tests import torchenv
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
class Machine:
    """One machine's session: its dir (``tmp/`` is its TMPDIR), its g++ log, its JSON report, and the header
    names its header dir held before the first test (the probe's)."""

    root: Path
    log: str
    report: dict[str, Any]
    before: list[str]


# One more C++ kernel, for a machine that restores the others: gcc compiles it with the restored header.
NEW_KERNEL = """
import torch


def ramp(x):
    return torch.cos(x) * 3


def test_new_kernel():
    x = torch.randn(8)
    torch.testing.assert_close(torch.compile(ramp)(x), ramp(x))
"""


@pytest.fixture
def machine(inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):  # type: ignore[no-untyped-def]
    """``machine(name, *args, before=None, kernels="all", isa_probes=True)``: run the probe and the training
    suite as machine ``name`` (its own TMPDIR, an empty cache dir, the g++ shim) with ``args``;
    ``before(tmpdir)`` runs first; every test passes. ``kernels="one"`` runs only ``test_activation`` (one
    C++ kernel), for the machines that only need gcc to meet a header once; ``kernels="new"`` adds
    ``NEW_KERNEL``'s test for this machine alone; ``isa_probes=False`` keeps the suite's setting that skips
    torch's ISA dry-compiles (tests/torchenv.py), for the machines of ``kernels="one"``."""
    shims = _shims(tmp_path)
    inner.makepyfile(test_0_probe=PROBE, test_training=TRAINING_SUITE)

    def run(
        name: str,
        *args: str,
        before: Callable[[Path], None] | None = None,
        kernels: str = "all",
        isa_probes: bool = True,
    ) -> Machine:
        root = tmp_path / name
        env = _machine_env(root, shims, name)
        if before is not None:
            before(root / "tmp")
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        if isa_probes:  # as on a user's machine: torch dry-compiles a probe per vector ISA in an empty cache dir
            monkeypatch.delenv("TORCHINDUCTOR_VEC_ISA_OK", raising=False)
        else:
            monkeypatch.setenv("TORCHINDUCTOR_VEC_ISA_OK", torchenv.TORCH_SETTINGS["TORCHINDUCTOR_VEC_ISA_OK"])
        report = root / "report.json"
        select = ("-k", "probe or activation") if kernels == "one" else ()
        new = inner.makepyfile(test_new=NEW_KERNEL) if kernels == "new" else None
        try:
            result = inner.runpytest_subprocess(
                "-p", "no:randomly", f"--compile-cache-dir={root / 'cache'}", f"--compile-cache-json={report}",
                *args, *select, timeout=600,
            )  # fmt: skip
        finally:
            if new is not None:
                new.unlink()
        # TRAINING_SUITE and NEW_KERNEL check their results against eager.
        passed = {"all": 3, "new": 4, "one": 2}[kernels]
        result.assert_outcomes(passed=passed, deselected=1 if kernels == "one" else 0)
        log, probe = root / "g++.log", inner.path / f"probe-{name}.json"
        return Machine(
            root=root,
            log=log.read_text() if log.exists() else "",
            report=json.loads(report.read_text()),
            before=json.loads(probe.read_text()) if probe.exists() else [],
        )

    return run


def header_builds(log: str) -> list[str]:
    return [line for line in log.splitlines() if line.startswith("CALL ") and "-x c++-header" in line]


def kernel_builds_with_header(log: str) -> list[str]:
    return [line for line in log.splitlines() if line.startswith("CALL ") and " -include " in line]


def isa_probe_builds(log: str) -> list[str]:
    """torch's dry-compiles of its vector-ISA probes (a source defining ``__avx_chk_kernel``)."""
    found = []
    for line in log.splitlines():
        sources = [Path(arg) for arg in line.split() if arg.endswith(".cpp")] if line.startswith("CALL ") else []
        if any(source.is_file() and b"_chk_kernel" in source.read_bytes() for source in sources):
            found.append(line)
    return found


def pch_warnings(log: str) -> list[str]:
    return [line for line in log.splitlines() if line.startswith("STDERR ") and "Winvalid-pch" in line]


def carried_headers(first: Machine, since: float) -> list[tuple[headers.HeaderArtifact, bytes]]:
    """The headers machine ``first`` used since ``since``, described and packed (what a save uploads)."""
    source = headers.header_dir(first.root / "tmp")
    used = headers.find_used(source, since)
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


def _bad_headers(machine, first: Machine, since: float, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A header gcc will not use costs only a slower compile."""
    carried = carried_headers(first, since)

    # One kernel is enough to see gcc refuse the header: each machine below compiles one. gcc names the first
    # mismatch it meets: for a PCH built with other flags that may be the debug level or the macro, so only
    # the file it rejected is checked there.
    name = carried[0][0].name
    for how, reason in [("garbage", "not a PCH file"), ("other-flags", name)]:
        work = tmp_path / f"work-{how}"
        work.mkdir()

        def carry_damaged(tmp: Path, how: str = how, work: Path = work) -> None:
            for artifact, _ in carried:
                bad, packed = damaged(artifact, how, work)
                assert headers.install(bad, packed, headers.header_dir(tmp))

        log = machine(
            "fresh-" + how, "--compile-cache=shared", before=carry_damaged, kernels="one", isa_probes=False
        ).log
        assert kernel_builds_with_header(log), log
        warnings = pch_warnings(log)
        assert warnings, f"gcc was expected to reject the {how} header under -Winvalid-pch: " + log
        assert all(name in line and reason in line for line in warnings), warnings
        assert header_builds(log) == [], "torch never rebuilds a header whose file exists: gcc falls back alone"


def _fresh_runners_restore_it(machine, first: Machine, store: Path) -> None:  # type: ignore[no-untyped-def]
    """Fresh machines restore the header from the store before their first test and never build it."""
    saved = first.report["save"]
    assert saved["outcome"] == "saved", saved
    assert saved["headers"]["named"] >= 1 and saved["headers"]["transferred"] == saved["headers"]["named"]
    built = sorted(p.name for p in headers.header_dir(first.root / "tmp").iterdir() if headers.is_header_name(p.name))
    artifacts = [e.key for e in LocalStore(store).list() if is_artifact_key(e.key)]
    assert len(artifacts) == saved["headers"]["named"]

    b = machine("b", "--compile-cache=shared", f"--compile-cache-store={store}", kernels="new")
    report, log, before = b.report, b.log, b.before
    restored = report["restore"]
    assert restored["outcome"] in ("exact", "partial"), restored
    assert restored["headers"]["transferred"] == saved["headers"]["named"], restored
    assert restored["headers"]["warnings"] == [] and report["warnings"] == []
    assert before and set(before) <= set(built), (before, built)  # installed before the first test ran
    assert header_builds(log) == [], "torch rebuilt a header the restore installed: " + log
    assert " -E " in log, "torch looked the header up (it preprocesses it first) and found it"
    # The new kernel is a miss: gcc compiles it with the restored header and does not reject it.
    assert report["totals"]["misses"] >= 1 and report["totals"]["hits"] >= 1, report["totals"]
    assert kernel_builds_with_header(log), "the new kernel must make gcc compile with the header: " + log
    assert pch_warnings(log) == [], "gcc rejected the restored header: " + log
    # torch's ISA probe libraries came with the bundle (probe.used_files): no dry-compile on this machine.
    assert isa_probe_builds(log) == [], "the bundle did not carry torch's ISA probes: " + log
    # b compiled something new, so it saved a bundle of its own: it names the header, which the store
    # already holds (headers go in once per store, by content), and does not upload it again.
    assert b.report["save"]["outcome"] == "saved", b.report["save"]
    assert b.report["save"]["headers"]["named"] == saved["headers"]["named"], b.report["save"]
    assert b.report["save"]["headers"]["transferred"] == 0, b.report["save"]

    # c restores b's bundle (the newest): the header comes from the store's one copy, which a's save put there.
    c = machine("c", "--compile-cache=isolated", f"--compile-cache-store={store}", "-n", "2")
    report, log = c.report, c.log
    restored = report["restore"]
    assert restored["outcome"] in ("exact", "partial"), restored
    assert restored["key"] == b.report["save"]["key"], (restored, b.report["save"])
    assert restored["headers"]["transferred"] == saved["headers"]["named"], restored
    assert header_builds(log) == [], "an xdist worker rebuilt a header the controller installed: " + log
    assert isa_probe_builds(log) == [], log
    installed = headers.header_dir(c.root / "tmp")
    assert {p.name for p in installed.iterdir() if headers.is_header_name(p.name)} == set(before)


def test_a_header_travels_and_a_bad_one_costs_only_a_slower_compile(  # type: ignore[no-untyped-def]
    machine, tmp_path: Path, subtests: pytest.Subtests
) -> None:
    # One test, so that one process runs the first machine (a cold compile and a header build) for both halves.
    store = tmp_path / "store"
    since = headers.session_start()
    first = machine("a", "--compile-cache=shared", f"--compile-cache-store={store}")
    assert first.before == []
    assert header_builds(first.log), "machine a must build the header for this test to mean anything: " + first.log
    assert isa_probe_builds(first.log), "machine a must dry-compile torch's ISA probes: " + first.log
    with subtests.test("fresh runners restore it from the store"):
        _fresh_runners_restore_it(machine, first, store)
    with subtests.test("a header gcc will not use: a slower compile"):
        _bad_headers(machine, first, since, tmp_path)
