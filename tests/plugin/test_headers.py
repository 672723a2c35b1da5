"""torch's precompiled header, end to end with torch and gcc: carried through a store when the session's
processes checked it, never carried or left installed when gcc cannot use it (issue 24).

One first machine (its own TMPDIR, run once per suite run and shared by every test here, across xdist
workers: :func:`first`) compiles a small suite from an empty cache dir, so builds torch's precompiled header,
and saves a bundle to a directory store: the header goes in as its own content-addressed object. Each test
then starts fresh machines (a new TMPDIR each, an empty cache dir) that:

* restore from that store (``test_fresh_runners_restore_it``): the header is in their header dir before any
  compile looks it up (installed in the background under torch's own build lock, which holds such a lookup
  until it is in place), the JSON report counts it, and gcc never builds it (torch still
  preprocesses it in every process: that is how it looks the file up), nor torch's vector-ISA probes (the
  bundle carries them; these machines dry-compile them as a user's would, see tests/torchenv.py); one runs
  plainly in ``shared`` mode with one new kernel beside the restored ones, which gcc compiles with
  ``-include <header>``: the restored header is used (torch builds no header and gcc, asked with
  ``-Winvalid-pch``, does not reject it); one runs with ``-n 2`` in ``isolated`` mode;
* hold the header already, built and read before the session, its times pinned as ``relatime`` leaves them
  (no read is recorded again that day; ``noatime`` records none): the session, with ``-n 2``, still carries
  it, since its processes report the headers torch looked up (``test_found_without_access_times``);
* hold a truncated copy under the header's name, and a killed build's partial file
  (``test_damaged_on_the_saving_machine``): the session's check removes the damaged one, torch builds it again,
  the tests pass, and the store receives only the sound rebuild, which gcc used for the session's kernel (that
  the check rejects every damage, zeroed and junk ones too, is ``tests/unit/test_headers.py::test_check_with_gcc``'s,
  with real gcc: from there on the session's path is the same);
* restore with a damaged copy already in torch's dir (``test_damaged_on_the_restoring_machine``): a zeroed one
  is replaced by the bundle's verified copy, a truncated one is removed by the check and rebuilt.

gcc is seen through a ``g++`` shim first on PATH: same name, so torch's command lines, header names and kernel
keys are unchanged. It logs every call and adds ``-Winvalid-pch`` to kernel builds that include a header.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import io
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from typing import Callable

import pytest

from pytest_compilecache import pch
from pytest_compilecache.stores import LocalStore
from pytest_compilecache.stores.base import is_artifact_key
from tests import torchenv
from tests.plugin.helpers import INNER_INI
from tests.plugin.helpers import TRAINING_SUITE
from tests.plugin.helpers import settle_as_relatime_leaves_it


def torch_builds_precompiled_headers() -> bool:
    """torch 2.8+ builds a precompiled C++ header per TMPDIR; torch 2.7 has none (nothing to carry there:
    the plugin finds no header and carries none, see tests/unit/test_headers.py). Read from torch's version,
    so that the test process need not import torch (tests/torchenv.py, IN_PROCESS)."""
    from importlib.metadata import version

    from packaging.version import Version

    return Version(version("torch")).release[:2] >= (2, 8)


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

from pytest_compilecache import pch


def test_header_dir_before_compiling(request):
    directory = pch.header_dir()
    names = sorted(p.name for p in directory.iterdir() if pch.is_header_name(p.name)) if directory.is_dir() else []
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
    (root / "tmp").mkdir(parents=True, exist_ok=True)  # exists when the machine runs a second session
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

# Another: for machines restoring a store whose bundles already hold NEW_KERNEL's.
OTHER_KERNEL = NEW_KERNEL.replace("torch.cos(x) * 3", "torch.sin(x) * 5 + 1")


class Machines:
    """Starts machine sessions: the probe and the training suite (one project, ``project/``) as machine ``name``
    (``<root>/<name>``: its own TMPDIR and HOME, an empty cache dir, the g++ shim first on PATH), each a fresh
    pytest process with the suite's inner environment (tests/torchenv.py)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.shims = _shims(root)
        self.project = root / "project"
        self.project.mkdir()
        (self.project / "pytest.ini").write_text(INNER_INI)
        (self.project / "test_0_probe.py").write_text(PROBE)
        (self.project / "test_training.py").write_text(TRAINING_SUITE)

    def run(
        self,
        name: str,
        *args: str,
        before: Callable[[Path], None] | None = None,
        kernels: str = "all",
        isa_probes: bool = True,
    ) -> Machine:
        """Run machine ``name`` with ``args``; ``before(tmpdir)`` runs first; every test must pass.

        ``kernels="one"`` runs only ``test_activation`` (one C++ kernel), for the machines that only need gcc
        to meet a header once; ``kernels="new"`` adds ``NEW_KERNEL``'s test for this machine alone
        (``"other"``: ``OTHER_KERNEL``'s); ``isa_probes=False`` keeps the suite's setting that skips torch's
        ISA dry-compiles (tests/torchenv.py), for the machines of ``kernels="one"``."""
        root = self.root / name
        env = {**torchenv.inner_env(), **_machine_env(root, self.shims, name), "HOME": str(root), "PY_COLORS": "0"}
        env.pop("PYTEST_ADDOPTS", None)
        if before is not None:
            before(root / "tmp")
        if isa_probes:  # as on a user's machine: torch dry-compiles a probe per vector ISA in an empty cache dir
            env.pop("TORCHINDUCTOR_VEC_ISA_OK", None)
        report = root / "report.json"
        select = ("-k", "probe or activation") if kernels == "one" else ()
        extra = {"new": NEW_KERNEL, "other": OTHER_KERNEL}.get(kernels)
        new = self.project / "test_new.py"
        if extra is not None:
            new.write_text(extra)
        try:
            done = subprocess.run(
                [sys.executable, "-m", "pytest", f"--basetemp={root / 'basetemp'}", "-p", "no:randomly",
                 "-p", "no:cacheprovider", f"--compile-cache-dir={root / 'cache'}",
                 f"--compile-cache-json={report}", *args, *select],
                cwd=self.project, env=env, capture_output=True, text=True, timeout=600,
            )  # fmt: skip
        finally:
            new.unlink(missing_ok=True)
        result = pytest.RunResult(done.returncode, done.stdout.splitlines(), done.stderr.splitlines(), 0.0)
        # TRAINING_SUITE and NEW_KERNEL check their results against eager.
        passed = {"all": 3, "new": 4, "other": 4, "one": 2}[kernels]
        # xdist's controller does not count what its workers deselected.
        deselected = 1 if kernels == "one" and "-n" not in args else 0
        try:
            result.assert_outcomes(passed=passed, deselected=deselected)
        except AssertionError as failed:
            raise AssertionError(f"machine {name}: {failed}\n{done.stdout[-6000:]}\n{done.stderr[-3000:]}") from None
        log, probe = root / "g++.log", self.project / f"probe-{name}.json"
        return Machine(
            root=root,
            log=log.read_text() if log.exists() else "",
            report=json.loads(report.read_text()),
            before=json.loads(probe.read_text()) if probe.exists() else [],
        )


@pytest.fixture
def machine(tmp_path: Path) -> Callable[..., Machine]:
    """``machine(name, *args, ...)``: :meth:`Machines.run` for machines of this test (under ``tmp_path``)."""
    return Machines(tmp_path).run


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created if absent): one xdist worker at a time."""
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@dataclass
class First:
    """The first machine (it compiled cold, built the header and saved a bundle) and the store it saved to.
    Shared by the tests: read it, never write under it (copy the store to save into it)."""

    machine: Machine
    store: Path

    def store_copy(self, target: Path) -> Path:
        return Path(shutil.copytree(self.store, target))


@pytest.fixture(scope="session")
def first(tmp_path_factory: pytest.TempPathFactory) -> First:
    """Machine ``a``, run once per suite run: the first xdist worker to get here runs it (a cold compile, torch's
    header and ISA-probe builds: the seconds every test here needs) under a lock in the dir that the session's
    workers share; the others wait for it and read what it left (pytest-xdist's recipe for session data)."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if "PYTEST_XDIST_WORKER" in os.environ else base
    root = shared / "headers-first"
    done = root / "machine.json"
    with _locked(shared / "headers-first.lock"):
        if not done.is_file():
            shutil.rmtree(root, ignore_errors=True)  # a worker whose run of it failed left this behind
            root.mkdir()
            store = root / "store"
            a = Machines(root).run("a", "--compile-cache=shared", f"--compile-cache-store={store}")
            done.write_text(json.dumps({**dataclasses.asdict(a), "root": str(a.root)}))
    data = json.loads(done.read_text())
    return First(Machine(**{**data, "root": Path(data["root"])}), root / "store")


def header_builds(log: str) -> list[str]:
    return [line for line in log.splitlines() if line.startswith("CALL ") and "-x c++-header" in line]


CHECK = "compilecache_check"  # the one-line file of the plugin's header check (pch.check)


def header_checks(log: str) -> list[str]:
    return [line for line in log.splitlines() if line.startswith("CALL ") and CHECK in line]


def kernel_builds_with_header(log: str) -> list[str]:
    return [
        line for line in log.splitlines() if line.startswith("CALL ") and " -include " in line and CHECK not in line
    ]


def isa_probe_builds(log: str) -> list[str]:
    """torch's dry-compiles of its vector-ISA probes (a source defining ``__avx_chk_kernel``)."""
    found = []
    for line in log.splitlines():
        sources = [Path(arg) for arg in line.split() if arg.endswith(".cpp")] if line.startswith("CALL ") else []
        if any(source.is_file() and b"_chk_kernel" in source.read_bytes() for source in sources):
            found.append(line)
    return found


def pch_warnings(log: str) -> list[str]:
    """gcc's complaints about a header in torch's own compiles (not in the plugin's check of it)."""
    return [
        line for line in log.splitlines() if line.startswith("STDERR ") and "Winvalid-pch" in line and CHECK not in line
    ]


def _the_header(first: Machine) -> Path:
    (path,) = [p for p in pch.header_dir(first.root / "tmp").iterdir() if pch.is_header_name(p.name)]
    return path


def _place(tmp: Path, name: str, content: bytes) -> Path:
    """Put ``content`` under torch's header name in the header dir of the machine whose TMPDIR is ``tmp``."""
    directory = pch.header_dir(tmp)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_bytes(content)
    return directory / name


def _artifact_bytes(store: Path) -> list[bytes]:
    """The raw headers a store holds (each object is one zstd frame)."""
    import zstandard

    local = LocalStore(store)
    found = []
    for entry in local.list():
        if is_artifact_key(entry.key):
            packed = store / f"{entry.key}.bundle"
            found.append(zstandard.ZstdDecompressor().stream_reader(io.BytesIO(packed.read_bytes())).read())
    return found


def _repaired(report: dict[str, Any], name: str) -> list[str]:
    return [note for note in report["notes"] if name in note and "rejected by the compiler" in note]


def test_found_without_access_times(machine: Callable[..., Machine], first: First, tmp_path: Path) -> None:
    """A header built and read before the session, whose times no read changes (relatime after its first read;
    noatime always), is carried by a session whose xdist workers compiled with it."""
    good = _the_header(first.machine)

    def built_earlier(tmp: Path) -> None:
        settle_as_relatime_leaves_it(_place(tmp, good.name, good.read_bytes()))
        time.sleep(2.5)  # the session's start, less its second of slack, comes after that read

    store = tmp_path / "store-r"
    r = machine("r", "--compile-cache=shared", f"--compile-cache-store={store}", "-n", "2", before=built_earlier,
                kernels="one", isa_probes=False)  # fmt: skip
    saved = r.report["save"]
    assert saved["outcome"] == "saved", saved
    assert (saved["headers"]["named"], saved["headers"]["transferred"]) == (1, 1), saved
    assert header_builds(r.log) == [] and kernel_builds_with_header(r.log), r.log
    assert header_checks(r.log), "the worker that compiled checked the header: " + r.log
    assert _artifact_bytes(store) == [good.read_bytes()]
    assert r.report["warnings"] == [] and _repaired(r.report, good.name) == []

    # The next session on that machine (warm, in one process: the record is read the same way by any process):
    # the header was accepted as this very file, so no process runs the compiler on it again (the header dir's
    # record, pch.VERDICTS), and it still counts as checked.
    again = machine("r", "--compile-cache=shared", kernels="one", isa_probes=False)
    log = again.log[len(r.log) :]
    assert header_checks(log) == [] and header_builds(log) == [], log
    assert again.report["warnings"] == [] and _repaired(again.report, good.name) == [], again.report


def test_damaged_on_the_saving_machine(machine: Callable[..., Machine], first: First, tmp_path: Path) -> None:
    """A truncated header, and a killed build's partial file, never reach a fresh runner. (A zeroed or junk one
    fails the same check, with real gcc: tests/unit/test_headers.py::test_check_with_gcc; the session's path from
    the check's verdict on is this one.)"""
    good = _the_header(first.machine)
    data = good.read_bytes()
    damaged_bytes = data[: len(data) // 2]
    store = tmp_path / "store-truncated"

    def damaged_here(tmp: Path) -> None:
        _place(tmp, good.name, damaged_bytes)
        _place(tmp, good.name + ".gpcWriteK3xQ9a", data[: 1 << 20])  # a killed build's partial file

    s = machine("s-truncated", "--compile-cache=shared", f"--compile-cache-store={store}", before=damaged_here,
                kernels="one", isa_probes=False)  # fmt: skip
    assert len(header_builds(s.log)) == 1, "torch was expected to build the removed header again: " + s.log
    assert pch_warnings(s.log) == [], s.log
    (note,) = _repaired(s.report, good.name)
    assert "removed it and torch built it again" in note, note
    rebuilt = (pch.header_dir(s.root / "tmp") / good.name).read_bytes()
    assert rebuilt != damaged_bytes and rebuilt[:4] == b"gpch"
    assert s.report["save"]["headers"]["transferred"] == 1, s.report["save"]
    # The sound rebuild only, no damaged or partial file: the very bytes gcc just compiled this machine's kernel
    # with, unrejected. (A fresh runner's restore of a stored header is test_fresh_runners_restore_it's.)
    assert kernel_builds_with_header(s.log), s.log
    assert _artifact_bytes(store) == [rebuilt]


@pytest.mark.parametrize("how", ["zeroed", "truncated"])
def test_damaged_on_the_restoring_machine(
    machine: Callable[..., Machine], first: First, tmp_path: Path, how: str
) -> None:
    """A damaged header already in torch's dir: replaced by the verified copy (zeroed) or removed by the check
    and built again (truncated); the tests pass either way."""
    good = _the_header(first.machine)
    data = good.read_bytes()
    damaged_bytes = {"zeroed": b"\0" * len(data), "truncated": data[: len(data) // 3]}[how]
    store = first.store_copy(tmp_path / "store")

    def damaged_here(tmp: Path) -> None:
        _place(tmp, good.name, damaged_bytes)

    # Read-only, so that OTHER_KERNEL is a miss that gcc compiles with the header.
    d = machine("d-" + how, "--compile-cache=shared", f"--compile-cache-store={store}", "--compile-cache-readonly",
                before=damaged_here, kernels="other")  # fmt: skip
    installed = (pch.header_dir(d.root / "tmp") / good.name).read_bytes()
    assert installed != damaged_bytes and installed[:4] == b"gpch"
    assert pch_warnings(d.log) == [] and kernel_builds_with_header(d.log), d.log
    if how == "zeroed":  # no PCH at all: the restore puts the verified copy in its place
        assert installed == data and header_builds(d.log) == [], d.log
        assert any(good.name in note and "replaced" in note for note in d.report["notes"]), d.report["notes"]
    else:  # starts like one: the check of the first process that looks it up finds it cut short
        assert len(header_builds(d.log)) == 1, d.log
        assert _repaired(d.report, good.name), d.report["notes"]


@pytest.mark.early  # builds `first` at the start of the run (tests/conftest.py)
def test_the_first_machine_builds_the_header(first: First) -> None:
    """What every other test here stands on: machine ``a`` started without a header, built it, and ran torch's
    ISA probes (a user's machine with an empty cache dir)."""
    assert first.machine.before == []
    log = first.machine.log
    assert header_builds(log), "machine a must build the header for this test to mean anything: " + log
    assert isa_probe_builds(log), "machine a must dry-compile torch's ISA probes: " + log


def test_fresh_runners_restore_it(machine: Callable[..., Machine], first: First, tmp_path: Path) -> None:
    """Fresh machines restore the header from the store before their first compile and never build it."""
    store = first.store_copy(tmp_path / "store")
    a = first.machine
    saved = a.report["save"]
    assert saved["outcome"] == "saved", saved
    assert saved["headers"]["named"] >= 1 and saved["headers"]["transferred"] == saved["headers"]["named"]
    built = sorted(p.name for p in pch.header_dir(a.root / "tmp").iterdir() if pch.is_header_name(p.name))
    artifacts = [e.key for e in LocalStore(store).list() if is_artifact_key(e.key)]
    assert len(artifacts) == saved["headers"]["named"]

    b = machine("b", "--compile-cache=shared", f"--compile-cache-store={store}", kernels="new")
    report, log, before = b.report, b.log, b.before
    restored = report["restore"]
    assert restored["outcome"] in ("exact", "partial"), restored
    assert restored["headers"]["transferred"] == saved["headers"]["named"], restored
    assert restored["headers"]["warnings"] == [] and report["warnings"] == []
    # Installed in the background, under torch's build lock (issue 25): perhaps not yet when the first test
    # (the probe, which compiles nothing) ran, but before any compile looked it up: torch built no header.
    assert set(before) <= set(built), (before, built)
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
    # Every kernel hit, and the workers still looked the header up (torch does before it loads a kernel from
    # its cache): a saving session of hits keeps the header in the lineage (pch.IDLE_SAVES ages only the rest).
    assert report["totals"]["misses"] == 0 and kernel_builds_with_header(log) == [], (report["totals"], log)
    assert " -E " in log, "no process looked the header up: " + log
    installed = pch.header_dir(c.root / "tmp")
    assert {p.name for p in installed.iterdir() if pch.is_header_name(p.name)} == set(built)
