"""A carried precompiled header, end to end with torch and gcc: used when valid, harmless when not.

One machine (TMPDIR ``a``) compiles a small suite from an empty cache dir and so builds torch's precompiled
header. Its header is carried the way the product carries it (``headers.find_used``, ``describe``,
``compress``, ``install``) into the header dir of a fresh machine (a new TMPDIR) whose cache dir is empty as
well, so every kernel is a miss that gcc compiles with ``-include <header>``:

* a valid header is used: torch builds no header there and gcc, asked with ``-Winvalid-pch``, does not reject it;
* a header gcc will not use (garbage, or a real PCH built with other flags) costs a slower compile and
  nothing else: gcc says so under ``-Winvalid-pch``, every test passes, results are checked against eager.

gcc is seen through a ``g++`` shim first on PATH: same name, so torch's command lines, header names and kernel
keys are unchanged. It logs every call and adds ``-Winvalid-pch`` to kernel builds that include a header.
"""

from __future__ import annotations

import io
import os
import subprocess
from pathlib import Path

import pytest

from pytest_compilecache import headers
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


@pytest.fixture
def machine(inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):  # type: ignore[no-untyped-def]
    """Run the inner suite as one machine: its own TMPDIR, an empty cache dir, the g++ shim; return its log."""
    shims = tmp_path / "shims"
    shims.mkdir()
    (shims / "g++").write_text(SHIM)
    (shims / "g++").chmod(0o755)
    inner.makepyfile(test_training=TRAINING_SUITE)
    real_path = os.environ["PATH"]

    def run(name: str, before: object = None) -> tuple[pytest.RunResult, str]:
        tmp = tmp_path / name
        (tmp / "tmp").mkdir(parents=True)
        if callable(before):
            before(tmp / "tmp")
        log = tmp / "g++.log"
        monkeypatch.setenv("TMPDIR", str(tmp / "tmp"))
        monkeypatch.setenv("PATH", f"{shims}:{real_path}")
        monkeypatch.setenv("HEADER_TEST_REALPATH", real_path)
        monkeypatch.setenv("HEADER_TEST_LOG", str(log))
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


def first_machine(machine, tmp_path: Path) -> list[tuple[headers.HeaderArtifact, bytes]]:  # type: ignore[no-untyped-def]
    """Run the suite on machine ``a``; return its headers described and packed (what a save uploads)."""
    since = headers.session_start()
    result, log = machine("a")
    result.assert_outcomes(passed=2)
    assert header_builds(log), log
    source = headers.header_dir(tmp_path / "a" / "tmp")
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
        subprocess.run(
            ["g++", "-x", "c++-header", str(text), "-o", str(bad), "-DCOMPILECACHE_OTHER_FLAGS=1"], check=True
        )
    described = headers.describe(bad)  # verification passes: only gcc can tell it will not use the file
    packed = io.BytesIO()
    headers.compress(bad, packed, described)
    packed.seek(0)
    return described, packed


def test_a_carried_header_is_used_and_a_bad_one_costs_only_a_slower_compile(machine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # One first machine for three fresh ones: each run compiles for real, and CI has two cores.
    carried = first_machine(machine, tmp_path)

    def carry(tmp: Path) -> None:
        for artifact, packed in carried:
            assert headers.install(artifact, io.BytesIO(packed), headers.header_dir(tmp))

    result, log = machine("fresh", before=carry)
    result.assert_outcomes(passed=2)
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
        result.assert_outcomes(passed=2)  # TRAINING_SUITE checks its results against eager
        assert kernel_builds_with_header(log), log
        warnings = pch_warnings(log)
        assert warnings, f"gcc was expected to reject the {how} header under -Winvalid-pch: " + log
        assert all(name in line and reason in line for line in warnings), warnings
        assert header_builds(log) == [], "torch never rebuilds a header whose file exists: gcc falls back alone"
