#!/usr/bin/env python3
"""The GPU checks of issue 27, on a machine with CUDA; without one it says it skipped and exits 0.

Usage (from the repository root, with a CUDA build of torch and triton in the interpreter that runs it):

    python scripts/gpu-check.py              # every check below
    python scripts/gpu-check.py --keep DIR   # keep the suites, stores, reports and logs in DIR

What it checks (each prints one ``ok``/``FAILED`` line; exit status 1 if any failed):

1. fingerprint: ``python -m pytest_compilecache fingerprint --json`` gives one digest for every ordering and
   subset of identical visible GPUs (``CUDA_VISIBLE_DEVICES`` unset, ``0``, ``1,0``, ...), its GPU fact names
   the compute capability (``major.minor``) and SM count, and a fingerprint handed over by one step
   (``PYTEST_COMPILECACHE_FINGERPRINT``) is reused under another ``OMP_NUM_THREADS``.
2. fork: a test that forks a child which uses CUDA passes with a store (the controller fingerprints at start)
   and without: the controller never initialised CUDA.
3. warm restore: a suite with a CUDA reduction, a max-autotune matmul and a user ``@triton.jit`` kernel runs
   cold (saving a bundle), then on a fresh runner (an empty cache dir, temp dir and triton home): 100% FX-graph
   hits, zero autotune seconds, triton compile seconds below 0.1 s (torch books loading cached kernels there too)
   and no triton kernel or helper built in the JSON report, and no C compiler build (``cc``/``gcc``/``g++``/
   ``c++`` calls with ``-c`` or ``-o`` are logged through shims on PATH). Serially, then with ``-n 2``
   (pytest-xdist).
4. examples on CUDA: the repository's ``examples/`` suite with torch's default device set to CUDA runs cold
   (saving a bundle), restored on a fresh runner, then warm in that runner's dirs: every run passes, the restored
   and warm runs hit every FX graph, and the line prints the three wall times and restored/warm. Serially, then
   with ``-n 2``.

When a warm check fails, it says why it can: the triton entries (by kernel name) and best configs each run's
cache dir held at its session's end (a conftest in the suite notes them before an isolated dir is removed), which
entries the bundle carried, and which the fresh runner made anew. ``--only warm-kept`` (not in the default set)
runs the warm check serially with ``--compile-cache-keep`` on its sessions, to compare with the default.

It needs pytest-compilecache importable from this checkout and, for ``-n 2``, pytest-xdist. Nothing outside
the work dir is written; the work dir is removed at the end unless ``--keep`` names one.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CHECKS = ("fingerprint", "fork", "warm", "examples")
OPTIONAL = ("warm-kept",)  # run only when named: the warm check with --compile-cache-keep, to compare
COMPILERS = ("cc", "gcc", "g++", "c++", "clang", "clang++")

FORK_SUITE = textwrap.dedent(
    """
    import multiprocessing

    def _use_cuda(queue):
        import torch
        queue.put(float(torch.ones(4, device="cuda").sum().item()))

    def test_a_forked_child_can_use_cuda():
        context = multiprocessing.get_context("fork")
        queue = context.Queue()
        child = context.Process(target=_use_cuda, args=(queue,))
        child.start()
        child.join(120)
        assert child.exitcode == 0, "the forked child could not use CUDA (the parent initialised it)"
        assert queue.get(timeout=5) == 4.0
    """
)

WARM_SUITE = textwrap.dedent(
    """
    import torch
    import triton
    import triton.language as tl


    @triton.jit
    def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        total = tl.load(x_ptr + offsets, mask=mask) + tl.load(y_ptr + offsets, mask=mask)
        tl.store(out_ptr + offsets, total, mask=mask)


    def test_reduction():
        x = torch.arange(4096.0, device="cuda").reshape(64, 64)
        out = torch.compile(lambda t: (t * 2).sum(dim=1))(x)
        torch.testing.assert_close(out, (x * 2).sum(dim=1))


    def test_max_autotune_matmul():
        a = torch.randn(256, 256, device="cuda", dtype=torch.float16)
        b = torch.randn(256, 256, device="cuda", dtype=torch.float16)
        out = torch.compile(lambda p, q: p @ q, mode="max-autotune-no-cudagraphs")(a, b)
        torch.testing.assert_close(out, a @ b, atol=1e-1, rtol=1e-2)


    def test_user_triton_kernel():
        x = torch.arange(1000.0, device="cuda")
        out = torch.empty_like(x)
        add_kernel[(triton.cdiv(1000, 256),)](x, x, out, 1000, BLOCK=256)
        torch.testing.assert_close(out, x + x)
    """
)


# In the warm suite: what the session's cache dir holds at its end, noted before the plugin removes an isolated
# dir (its pytest_sessionfinish runs after this tryfirst one). Each process (xdist workers too) writes its own file.
SNAPSHOT_CONFTEST = textwrap.dedent(
    """
    import json
    import os

    import pytest


    def snapshot(cache, out):
        triton = os.path.join(cache, "triton")
        entries, astray = {}, []
        if os.path.isdir(triton):
            for key in sorted(os.listdir(triton)):
                folder = os.path.join(triton, key)
                if os.path.isdir(folder):
                    entries[key] = sorted(os.listdir(folder))
                    for name in entries[key]:
                        if name.startswith("__grp__"):
                            with open(os.path.join(folder, name)) as fh:
                                children = json.load(fh).get("child_paths", {}).values()
                            astray += [p for p in children if os.path.dirname(p) != folder or not os.path.exists(p)]
        best = sorted(
            os.path.relpath(os.path.join(folder, name), cache)
            for folder, _, names in os.walk(cache)
            for name in names
            if name.endswith(".best_config")
        )
        with open(out, "w") as fh:
            json.dump({"triton": entries, "best_config": best, "astray": astray}, fh)


    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(session):
        cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
        if cache and os.path.isdir(cache):
            snapshot(cache, os.path.join(os.environ["HOME"], f"entries-{os.getpid()}.json"))
    """
)


def cuda_status() -> str | None:
    """None when a CUDA device is usable by torch here; otherwise why not. Asked in a child: this script
    starts pytest sessions that fork, and must not hold a CUDA context itself."""
    code = "import torch; print(torch.cuda.is_available() and torch.cuda.device_count() > 0, torch.version.cuda)"
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"could not ask torch ({exc})"
    if out.returncode != 0:
        return f"torch not importable by {sys.executable}: {(out.stderr.strip().splitlines() or ['?'])[-1]}"
    available, version = out.stdout.split()
    if available == "True":
        return None
    return "a CPU build of torch" if version == "None" else f"no CUDA device (torch built with CUDA {version})"


class Checks:
    def __init__(self, work: Path, keep: bool = False) -> None:
        self.work = work
        self.keep = ["--compile-cache-keep"] if keep else []  # each session's cache dir, to look into after
        self.failed: list[str] = []
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_COMPILECACHE_", "TORCHINDUCTOR_"))}
        self.env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))
        self.env.pop("TRITON_CACHE_DIR", None)

    def check(self, name: str, ok: bool, detail: str = "") -> None:
        print(f"{'ok    ' if ok else 'FAILED'} {name}" + (f": {detail}" if detail else ""), flush=True)
        if not ok:
            self.failed.append(name)

    def run(
        self, argv: list[str], env: dict[str, str] | None = None, **kwargs: Any
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, env=env or self.env, capture_output=True, text=True, check=False, **kwargs)

    # ---- 1

    def fingerprint(self) -> None:
        def digest(extra: dict[str, str]) -> tuple[str, dict[str, str]]:
            out = self.run(
                [sys.executable, "-m", "pytest_compilecache", "fingerprint", "--json"], {**self.env, **extra}
            )
            if out.returncode != 0:
                return f"error: {out.stderr.strip()[-200:]}", {}
            data = json.loads(out.stdout)
            return data["digest"], data["facts"]

        count = int(self.run([sys.executable, "-c", "import torch; print(torch.cuda.device_count())"]).stdout or 0)
        visible = [{}, {"CUDA_VISIBLE_DEVICES": "0"}]
        if count > 1:
            visible += [{"CUDA_VISIBLE_DEVICES": "1,0"}, {"CUDA_VISIBLE_DEVICES": ",".join(map(str, range(count)))}]
        results = [digest(extra) for extra in visible]
        digests = {d for d, _ in results}
        facts = results[0][1]
        self.check(
            f"fingerprint: one digest for {len(visible)} CUDA_VISIBLE_DEVICES settings ({count} GPUs)",
            len(digests) == 1,
            ", ".join(sorted(digests)),
        )
        gpus = facts.get("gpus", "")
        self.check("fingerprint: the GPU fact is capability and SM count", " SMs)" in gpus and "." in gpus, gpus)
        self.check(
            "fingerprint: triton's content hash is a fact", bool(facts.get("triton_key")), facts.get("triton_key", "")
        )
        handed = json.dumps(facts, separators=(",", ":"))
        other, _ = digest({"OMP_NUM_THREADS": "1", "PYTEST_COMPILECACHE_FINGERPRINT": handed})
        self.check(
            "fingerprint: a handed-over fingerprint is reused under another OMP_NUM_THREADS", other == results[0][0]
        )

    # ---- 2

    def fork(self) -> None:
        suite = self.work / "fork"
        suite.mkdir()
        (suite / "test_fork.py").write_text(FORK_SUITE)
        for label, options in (
            ("without a store", []),
            ("with a store", [f"--compile-cache-store={self.work / 'fork-store'}"]),
        ):
            out = self.run(
                [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--compile-cache=isolated", *options],
                cwd=suite,
                timeout=600,
            )
            self.check(f"fork: a forked child uses CUDA, {label}", out.returncode == 0, _tail(out))

    # ---- 3

    def warm(self, workers: list[str], label: str, kept: bool = False) -> None:
        """``kept``: the sessions run with ``--compile-cache-keep`` (the ``warm-kept`` check)."""
        base = self.work / f"warm{label.replace(' ', '')}{'-kept' if kept else ''}"
        suite = base / "suite"
        suite.mkdir(parents=True)
        (suite / "test_gpu.py").write_text(WARM_SUITE)
        (suite / "conftest.py").write_text(SNAPSHOT_CONFTEST)
        store = base / "store"
        shims, log = self._compiler_shims(base)
        extra = [*workers, "--compile-cache-report=full", *(["--compile-cache-keep"] if kept and not self.keep else [])]
        label = f"{label}{', sessions kept' if kept else ''}"
        reports, carried, failed_before = {}, {}, len(self.failed)
        for run in ("cold", "warm"):
            fresh = base / run  # a fresh runner: no cache dir, temp dir or triton home from the cold run
            log.write_text("")
            out, seconds = self.session(
                suite, fresh, store, fresh / "report.json", extra, path=f"{shims}{os.pathsep}{self.env['PATH']}"
            )
            self.check(f"warm {label}: the {run} run passes ({seconds:.1f} s)", out.returncode == 0, _tail(out))
            if out.returncode != 0:
                return
            reports[run] = json.loads((fresh / "report.json").read_text())
            calls = [line for line in log.read_text().splitlines() if line.strip()]
            if run == "cold":
                carried = self._carried_triton_entries(store)
            else:
                self.check(f"warm {label}: no C compiler call on the fresh runner", not calls, "; ".join(calls[:3]))
        totals = reports["warm"]["totals"]
        gpu = totals.get("gpu", {})
        self.all_hits(f"warm {label}: 100% FX-graph hits", totals)
        # torch books loading cached kernels and its wait for parallel compiles as triton_compile_time_us too:
        # "zero" is below a tenth of a second in all, what loading (not compiling) a few kernels takes.
        compiling = float(gpu.get("triton_compile_seconds", 1e9))
        self.check(f"warm {label}: no triton compile seconds (< 0.1 s)", compiling < 0.1, json.dumps(gpu))
        tests = reports["warm"].get("tests", [])
        self.check(
            f"warm {label}: zero autotune seconds",
            gpu.get("autotune_seconds") == 0,
            f"{json.dumps(gpu)}; {_which(tests, 'autotune_seconds')}",
        )
        self.check(
            f"warm {label}: no triton kernel or helper built",
            gpu.get("triton_built") == 0,
            f"{json.dumps(gpu)}; {_which(tests, 'triton_built')}",
        )
        if len(self.failed) > failed_before:
            for line in diagnose(_snapshot(base / "cold"), carried, _snapshot(base / "warm")):
                print(f"       warm {label}: {line}", flush=True)

    def _carried_triton_entries(self, store: Path) -> dict[str, list[str]]:
        """The triton entries (key -> file names) in the one bundle ``store`` holds (``inspect --json``)."""
        bundles = [p for p in store.glob("*.bundle") if "-artifact-" not in p.name]
        if len(bundles) != 1:
            return {}
        out = self.run([sys.executable, "-m", "pytest_compilecache", "inspect", "--json", str(bundles[0])])
        if out.returncode != 0:
            return {}
        entries: dict[str, list[str]] = {}
        for member in json.loads(out.stdout).get("members", []):
            parts = str(member.get("path", "")).split("/")
            if len(parts) == 4 and parts[:2] == ["files", "triton"]:
                entries.setdefault(parts[2], []).append(parts[3])
        return entries

    # ---- 4

    def examples(self, workers: list[str], label: str, device: str = "cuda") -> None:
        base = self.work / f"examples{label.replace(' ', '')}"
        suite = base / "suite"
        shutil.copytree(ROOT / "examples", suite, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
        conftest = suite / "conftest.py"
        conftest.write_text(f'import torch\n\ntorch.set_default_device("{device}")\n' + conftest.read_text())
        store = base / "store"
        seconds: dict[str, float] = {}
        for run, runner in (("cold", "cold"), ("restored", "fresh"), ("warm", "fresh")):
            report = base / runner / f"{run}.json"
            out, seconds[run] = self.session(suite, base / runner, store, report, workers)
            self.check(f"examples on CUDA {label}: the {run} run passes", out.returncode == 0, _tail(out))
            if out.returncode != 0:
                return
            if run != "cold":
                totals = json.loads(report.read_text())["totals"]
                self.all_hits(f"examples on CUDA {label}: the {run} run hits every FX graph", totals)
        print(
            f"       examples on CUDA {label}: cold {seconds['cold']:.1f} s, restored {seconds['restored']:.1f} s, "
            f"warm {seconds['warm']:.1f} s, restored/warm {seconds['restored'] / seconds['warm']:.2f}x",
            flush=True,
        )

    def session(
        self, suite: Path, runner: Path, store: Path, report: Path, args: list[str], path: str | None = None
    ) -> tuple[subprocess.CompletedProcess[str], float]:
        """One isolated-mode session of ``suite`` on the runner whose ``HOME`` is ``runner`` (``runner/tmp`` its
        TMPDIR), with ``store`` and a JSON ``report``; ``path``: another PATH. Returns the result and its seconds."""
        (runner / "tmp").mkdir(parents=True, exist_ok=True)
        env = {**self.env, "TMPDIR": str(runner / "tmp"), "HOME": str(runner), "PATH": path or self.env["PATH"]}
        start = time.monotonic()
        out = self.run(
            [
                sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--compile-cache=isolated",
                f"--compile-cache-store={store}", f"--compile-cache-json={report}", *self.keep, *args,
            ],
            env=env,
            cwd=suite,
            timeout=900,
        )  # fmt: skip
        return out, time.monotonic() - start

    def all_hits(self, name: str, totals: dict[str, Any]) -> None:
        self.check(
            name, totals["misses"] == 0 and totals["hits"] > 0, f"{totals['hits']} hits, {totals['misses']} misses"
        )

    def _compiler_shims(self, base: Path) -> tuple[Path, Path]:
        """A PATH dir whose cc/gcc/g++/... log each call to ``calls.log``, then run the real compiler."""
        shims, log = base / "shims", base / "calls.log"
        shims.mkdir()
        for name in COMPILERS:
            real = shutil.which(name, path=self.env.get("PATH"))
            if real is None:
                continue
            shim = shims / name
            # Builds only: a version query (`g++ --version`, the fingerprint's compiler fact) compiles nothing.
            shim.write_text(
                f'#!/bin/sh\ncase " $* " in *" -o "*|*" -c "*) echo "{name} $*" >> "{log}" ;; esac\n'
                f'exec "{real}" "$@"\n'
            )
            shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
        return shims, log


def _snapshot(runner: Path) -> dict[str, Any]:
    """What the runner's sessions' cache dirs held at their end (``SNAPSHOT_CONFTEST``'s files, merged)."""
    merged: dict[str, Any] = {"triton": {}, "best_config": [], "astray": []}
    for path in sorted(runner.glob("entries-*.json")):
        data = json.loads(path.read_text())
        merged["triton"].update(data.get("triton", {}))
        merged["astray"] += data.get("astray", [])
        merged["best_config"] = sorted({*merged["best_config"], *data.get("best_config", [])})
    return merged


def _kernels(files: list[str]) -> str:
    """A triton entry's kernel or helper names: its metadata files (``<name>.json``), or its libraries."""
    names = sorted({f[: -len(".json")] for f in files if f.endswith(".json") and not f.startswith("__grp__")})
    return ", ".join(names or sorted(f for f in files if f.endswith(".so")) or files[:3]) or "empty"


def diagnose(cold: dict[str, Any], carried: dict[str, list[str]], warm: dict[str, Any]) -> list[str]:
    """Why a fresh runner built or autotuned, from what each run's cache dir held at its end (:func:`_snapshot`)
    and the triton entries the bundle carried: cold entries the bundle left out, and warm entries it did not bring
    (with a carried entry of the same kernel name: triton looked under another key). Best configs travel in the
    mega-cache blob: compared between the runs' dirs by name."""
    lines = [
        f"the cold run ended with {len(cold['triton'])} triton entries and {len(cold['best_config'])} best "
        f"configs; the bundle carried {len(carried)} triton entries"
    ]
    carried_names = {key: _kernels(files) for key, files in carried.items()}
    for key, files in sorted(cold["triton"].items()):
        if key not in carried:
            lines.append(f"not carried: triton entry {key[:16]} ({_kernels(files)})")
    for key, files in sorted(warm["triton"].items()):
        if key in carried:
            continue
        name = _kernels(files)
        same = [k[:16] for k, n in carried_names.items() if n == name]
        lines.append(
            f"made on the fresh runner: triton entry {key[:16]} ({name})"
            + (f"; the bundle carried this kernel under {', '.join(same)}" if same else "")
        )
    for run, snapshot in (("cold run", cold), ("fresh runner", warm)):
        if snapshot.get("astray"):
            lines.append(
                f"the {run}'s triton group files name {len(snapshot['astray'])} files outside their entry or missing "
                f"(triton then compiles again): {snapshot['astray'][0]}"
            )
    for path in warm["best_config"]:
        if path not in cold["best_config"]:
            lines.append(f"best config on the fresh runner, not in the cold run's dir: {path}")
    for path in cold["best_config"]:
        if path not in warm["best_config"]:
            lines.append(f"best config of the cold run, not on the fresh runner: {path}")
    return lines


def _which(tests: list[dict[str, Any]], counter: str) -> str:
    """The report's tests whose GPU ``counter`` is not zero, with their values (what a failed check names)."""
    found = [f"{t.get('nodeid')}: {t.get('gpu', {}).get(counter)}" for t in tests if t.get("gpu", {}).get(counter)]
    return "by " + ", ".join(found) if found else "by no test (outside them: session start or end)"


def _tail(out: subprocess.CompletedProcess[str]) -> str:
    if out.returncode == 0:
        return ""
    return " | ".join((out.stdout + out.stderr).strip().splitlines()[-6:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--keep", type=Path, help="keep everything in this dir (created; must be empty)")
    parser.add_argument(
        "--only",
        action="append",
        choices=CHECKS + OPTIONAL,
        help=f"run only this check (repeatable; default: all but {', '.join(OPTIONAL)})",
    )
    args = parser.parse_args(argv)
    why = cuda_status()
    if why is not None:
        print(f"gpu-check: skipped: {why}")
        return 0
    work = args.keep or Path(tempfile.mkdtemp(prefix="gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    checks = Checks(work, keep=args.keep is not None)
    chosen = set(args.only or CHECKS)
    xdist = subprocess.run([sys.executable, "-c", "import xdist"], capture_output=True, check=False).returncode == 0
    try:
        if "fingerprint" in chosen:
            checks.fingerprint()
        if "fork" in chosen:
            checks.fork()
        for name, method in (("warm", checks.warm), ("examples", checks.examples)):
            if name not in chosen:
                continue
            method([], "serial")
            if xdist:
                method(["-n", "2"], "-n 2")
            else:
                checks.check(f"{name} -n 2: pytest-xdist is installed", False, "pip install pytest-xdist")
        if "warm-kept" in chosen:
            checks.warm([], "serial", kept=True)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    print(f"gpu-check: {'FAILED: ' + ', '.join(checks.failed) if checks.failed else 'all checks passed'}")
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())
