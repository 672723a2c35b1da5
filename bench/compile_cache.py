"""Benchmark: what a bundle buys on a suite of compiled CPU tests, measured in one run.

Scenarios, each a fresh pytest process. "Same machine" runs share one TMPDIR with the cold run (torch
keeps its precompiled C++ header there, outside the cache dir); "fresh machine" runs get a new TMPDIR,
as a new CI runner does, where torch finds no header: it builds one (seconds of g++, whatever the cache
holds) unless something put it there first, as the plugin's restore does with the headers a bundle names:

* eager     - TORCH_COMPILE_DISABLE=1: the floor, no compile at all
* cold      - an empty cache dir (saves a bundle to a local store at the end)
* warm      - the same cache dir again, same machine: the best a cache can do
* restored  - an empty isolated dir restored from the cold run's bundle, same machine
* restored-fresh - the same on a fresh machine (the CI case): the plugin restores the bundle and the
  precompiled headers it names (the cold run's save put them in the store)
* megacache - fresh machine, an empty dir into which only torch's mega-cache blobs are loaded (no kernels)
* wholedir  - fresh machine, the cold run's whole cache dir archived (tar + zstd) and unpacked: no header,
  so torch builds it (what a fresh runner paid before headers were carried)
* restored-fresh+headers - restored-fresh, after the precompiled headers the cold run used were carried to
  the fresh machine by hand, step by step (``pytest_compilecache.pch``: find_built, describe, compress to
  a content-addressed object, download, install into torch's header dir under the new TMPDIR): a
  cross-check of the product's path, with the time of each step

``--workers N`` (default 2; 0 turns it off) adds an xdist twin of the cold run and of every timed scenario
(``cold -n2``, ``warm -n2``, ``restored-fresh -n2``...), run in the same rotation and reported against the warm
run of the same parallelism: the README's CI example runs ``pytest -n 2``. The twins form their own lineage, as
that CI does (a push run with ``-n 2`` saves, a pull request run with ``-n 2`` restores): ``cold -n2`` saves the
bundle and fills the dir that ``warm -n2`` and ``restored-fresh -n2`` reuse. Which graphs a worker compiles
depends on the tests before it in that worker (automatic dynamic shapes), so a serial run's bundle restored into
``-n 2`` misses the graphs only a parallel run compiles (the report's ``why`` names each).

``serial-bundle -n2`` is the mismatch itself, for comparison: a fresh machine restores the *serial* lineage's
bundle into ``-n 2``. ``--pgo`` runs every scenario with ``--compile-cache-pgo=on`` (torch keeps its profile of
which sizes vary in the cache dir and the bundles), with which each process compiles the same graphs in any
order: then ``serial-bundle -n2`` misses nothing either.

``--rounds N`` repeats warm, restored, restored-fresh, restored-fresh+headers and wholedir N times in a
rotating order (load drifting on a shared machine then touches all of them alike) and reports the median.
``--trace-compiler`` puts ``g++`` and ``openssl`` shims first on PATH (same names, so torch's command lines and
kernel keys do not change) and reports, per scenario, how many of each kind of compiler call ran and their
seconds: header preprocessing (``g++ -E``), header builds, kernel builds, other builds (ISA probes, links),
compiler version queries, ``openssl sha512`` and the plugin's header checks. That is what a fresh runner still
pays that a warm one does not.

Then a growth series: five runs in which the tested code changes, sharing one cache dir and one store;
the newest bundle's size against the whole dir's archive size after each run.

Usage: ``python bench/compile_cache.py [--suite examples] [--json out.json]``. Results are reported as
ratios to the warm run, because absolute seconds depend on the machine.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import zstandard

from pytest_compilecache import pch as headers
from pytest_compilecache.manifest import Artifact

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
TRACE_DIR: Path | None = None  # the compiler shims' dir when --trace-compiler is on

SHIM = """#!/bin/sh
# A benchmark shim: time one call of the real tool and log it, then exit with its status.
tool=$(basename "$0")
PATH=$COMPILECACHE_BENCH_REALPATH
export PATH
start=$(date +%s.%N)
"$tool" "$@"
status=$?
end=$(date +%s.%N)
printf '%s %s %s %s\\n' "$tool" "$start" "$end" "$*" >> "$COMPILECACHE_BENCH_TRACE"
exit $status
"""


def run_pytest(
    suite: Path, tmp: Path, *args: str, env: dict[str, str] | None = None, machine: Path | None = None
) -> tuple[float, dict[str, Any]]:
    """Run the suite once; return wall seconds and the plugin's JSON report (empty for eager).

    ``machine`` is the TMPDIR to use (same machine); None gives a fresh one (a fresh machine).
    """
    report = tmp / f"report-{time.monotonic_ns()}.json"
    scratch = machine or Path(tempfile.mkdtemp(prefix="tmpdir-", dir=tmp))
    full_env = {**os.environ, "TMPDIR": str(scratch), **(env or {})}
    full_env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    trace = tmp / f"trace-{time.monotonic_ns()}.log"
    if TRACE_DIR is not None:
        full_env.update(
            PATH=f"{TRACE_DIR}:{os.environ['PATH']}",
            COMPILECACHE_BENCH_REALPATH=os.environ["PATH"],
            COMPILECACHE_BENCH_TRACE=str(trace),
        )
    cmd = [
        PY,
        "-m",
        "pytest",
        str(suite),
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:randomly",
        f"--compile-cache-json={report}",
        *args,
    ]
    started = time.perf_counter()
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, env=full_env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        raise SystemExit(f"pytest failed in scenario {args}")
    data = json.loads(report.read_text()) if report.exists() else {}
    # CPU seconds of pytest and everything it waited for (g++ included): far less sensitive than wall time to
    # other load on a shared machine.
    data["_cpu"] = (cpu_after.ru_utime + cpu_after.ru_stime) - (cpu_before.ru_utime + cpu_before.ru_stime)
    if TRACE_DIR is not None:
        data["_trace"] = classify(trace)
    return seconds, data


def classify(trace: Path) -> dict[str, list[float]]:
    """Compiler calls of one run by kind: [count, seconds] each (see the module docstring)."""
    kinds: dict[str, list[float]] = {}
    lines = trace.read_text().splitlines() if trace.exists() else []
    for line in lines:
        tool, start, end, args = (line.split(" ", 3) + [""])[:4]
        if tool == "openssl":
            kind = "openssl sha512"
        elif args.startswith(("-v", "--version")):
            kind = "g++ version"
        elif " -E " in f" {args} ":
            kind = "header preprocess"
        elif "-x c++-header" in args:
            kind = "header build"
        elif "compilecache_check" in args:  # the plugin's check of a header torch looked up (headers.check)
            kind = "header check"
        elif ".main.cpp" in args or ".optimized.cpp" in args or ".main.o" in args:
            kind = "kernel build"
        else:
            kind = "other build"
        entry = kinds.setdefault(kind, [0, 0.0])
        entry[0] += 1
        entry[1] += float(end) - float(start)
    return kinds


def make_shims(tmp: Path) -> Path:
    shims = tmp / "shims"
    shims.mkdir()
    for tool in ("g++", "openssl"):
        (shims / tool).write_text(SHIM)
        (shims / tool).chmod(0o755)
    return shims


def carry_headers(machine: Path, objects: Path, since: float) -> tuple[list[Artifact], dict[str, Any]]:
    """Upload the headers the cold run used on ``machine`` as content-addressed objects (once each)."""
    started = time.perf_counter()
    artifacts = []
    for path in headers.find_built(headers.header_dir(machine), since):
        artifact = headers.describe(path)
        key = objects / headers.object_key("bench", artifact.sha256)
        if not key.exists():  # content-addressed: a store that has it needs no upload
            tmp_key = key.with_suffix(".partial")
            with open(tmp_key, "wb") as out:
                headers.compress(path, out, artifact)
            os.replace(tmp_key, key)
        artifacts.append(artifact)
    info = {
        "count": len(artifacts),
        "raw": sum(a.size for a in artifacts),
        "compressed": sum((objects / headers.object_key("bench", a.sha256)).stat().st_size for a in artifacts),
        "upload_s": time.perf_counter() - started,
    }
    return artifacts, info


def install_headers(artifacts: list[Artifact], objects: Path, fresh: Path) -> dict[str, Any]:
    """Download each object (a local copy stands in for the transfer) and install it under ``fresh``."""
    started = time.perf_counter()
    downloads = fresh / "downloads"
    downloads.mkdir()
    for artifact in artifacts:
        key = headers.object_key("bench", artifact.sha256)
        shutil.copyfile(objects / key, downloads / key)
    downloaded = time.perf_counter()
    for artifact in artifacts:
        with open(downloads / headers.object_key("bench", artifact.sha256), "rb") as fh:
            headers.install_header(artifact, fh, headers.header_dir(fresh))
    shutil.rmtree(downloads)
    return {"download_s": downloaded - started, "install_s": time.perf_counter() - downloaded}


def load_blobs_only(bundle_path: Path, cache_dir: Path) -> None:
    """Load only the mega-cache blobs of a bundle into cache_dir (what torch alone would restore)."""
    code = (
        "import sys, os, tempfile; from pathlib import Path\n"
        "os.environ['TORCHINDUCTOR_CACHE_DIR'] = sys.argv[2]\n"
        "from pytest_compilecache import bundle, probe\n"
        "with bundle.verify(Path(sys.argv[1]), cache_dir=Path(tempfile.mkdtemp())) as verified:\n"
        "    blobs = [verified.blob(name) for name in verified.manifest.blob_names]\n"
        "[probe.load_artifacts(b) for b in blobs]\n"
    )
    subprocess.run([PY, "-c", code, str(bundle_path), str(cache_dir)], check=True, capture_output=True)


def archive(directory: Path, dest: Path) -> int:
    """tar + zstd -10 of a whole dir, as a cache-the-dir workflow would upload it; returns the byte count."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(directory, arcname=".")
    dest.write_bytes(zstandard.ZstdCompressor(level=10).compress(buf.getvalue()))
    return dest.stat().st_size


def unarchive(src: Path, directory: Path) -> None:
    data = zstandard.ZstdDecompressor().decompress(src.read_bytes(), max_output_size=2**34)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(directory, filter="data")


def newest_bundle(store: Path) -> Path:
    return max(store.glob("*.bundle"), key=lambda p: p.stat().st_mtime)


def misses(data: dict[str, Any]) -> str:
    totals = data.get("totals", {})
    return f"{totals.get('hits', '-')}/{totals.get('misses', '-')}"


def lineage(
    suite: Path, tmp: Path, dist: tuple[str, ...], extra: dict[str, Any]
) -> tuple[tuple[float, dict[str, Any]], Path, dict[str, Any]]:
    """One CI lineage run with ``dist`` (``()`` or ``("-n", "2")``): a cold run on its own machine saves a bundle to
    its own store; returns the cold run, its bundle and the timed scenarios that reuse its dir, bundle and
    headers, all with the same ``dist``. ``extra`` receives sizes and transfer times.

    Each parallelism gets its own lineage, as in the README's CI example (a push run with ``-n 2`` saves, a pull
    request run with ``-n 2`` restores): which graphs a worker compiles depends on the tests before it in that
    worker (automatic dynamic shapes), so a serial run's bundle restored into ``-n 2`` misses the graphs that only
    parallel runs compile, which a warm dir used with ``-n 2`` holds.
    """
    label = "-".join(arg.lstrip("-") for arg in dist) or "serial"
    store, cold_dir, objects = tmp / f"store-{label}", tmp / f"cold-dir-{label}", tmp / f"objects-{label}"
    machine = tmp / f"machine-{label}"
    machine.mkdir()
    objects.mkdir()
    since = headers.session_start()
    cold = run_pytest(
        suite,
        tmp,
        "--compile-cache=shared",
        f"--compile-cache-dir={cold_dir}",
        f"--compile-cache-store={store}",
        *dist,
        machine=machine,
    )
    bundle_path = newest_bundle(store)
    whole = tmp / f"whole-{label}.tar.zst"
    started = time.perf_counter()
    whole_size = archive(cold_dir, whole)
    archive_s = time.perf_counter() - started
    artifacts, carried = carry_headers(machine, objects, since)
    extra.update(bundle=bundle_path.stat().st_size, wholedir=whole_size)
    extra.update(wholedir_pack_s=archive_s, headers=carried, wholedir_unpack_s=[])
    extra["headers"]["installs"] = []
    restore_args = ("--compile-cache=isolated", f"--compile-cache-store={store}", "--compile-cache-readonly", *dist)

    def warm() -> tuple[float, dict[str, Any]]:
        shared = ("--compile-cache=shared", f"--compile-cache-dir={cold_dir}")
        return run_pytest(suite, tmp, *shared, *dist, machine=machine)

    def restored() -> tuple[float, dict[str, Any]]:
        return run_pytest(suite, tmp, *restore_args, machine=machine)

    def restored_fresh() -> tuple[float, dict[str, Any]]:
        return run_pytest(suite, tmp, *restore_args)

    def restored_fresh_headers() -> tuple[float, dict[str, Any]]:
        fresh = Path(tempfile.mkdtemp(prefix="tmpdir-", dir=tmp))
        extra["headers"]["installs"].append(install_headers(artifacts, objects, fresh))
        return run_pytest(suite, tmp, *restore_args, machine=fresh)

    def wholedir() -> tuple[float, dict[str, Any]]:
        target = Path(tempfile.mkdtemp(prefix="whole-dir-", dir=tmp))
        started = time.perf_counter()
        unarchive(whole, target)
        extra["wholedir_unpack_s"].append(time.perf_counter() - started)
        return run_pytest(suite, tmp, "--compile-cache=shared", f"--compile-cache-dir={target}", *dist)

    return (
        cold,
        bundle_path,
        {
            "warm": warm,
            "restored": restored,
            "restored-fresh": restored_fresh,
            "restored-fresh+headers": restored_fresh_headers,
            "wholedir": wholedir,
        },
    )


def scenarios(suite: Path, tmp: Path, rounds: int, megacache: bool, workers: int = 0) -> dict[str, Any]:
    out: dict[str, Any] = {"eager": [run_pytest(suite, tmp, env={"TORCH_COMPILE_DISABLE": "1"})]}
    extra: dict[str, Any] = {}
    lineages: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {"": ((), extra)}
    if workers:
        lineages[f" -n{workers}"] = (("-n", str(workers)), {})
        extra["parallel"] = lineages[f" -n{workers}"][1]
    timed: dict[str, Any] = {}
    bundles: dict[str, Path] = {}
    for suffix, (dist, into) in lineages.items():
        cold, bundles[suffix], found = lineage(suite, tmp, dist, into)
        out[f"cold{suffix}"] = [cold]
        timed.update({f"{name}{suffix}": fn for name, fn in found.items()})
    if workers:  # the serial lineage's bundle restored into -n N on a fresh machine: the mismatch, for comparison
        store = bundles[""].parent  # the serial lineage's store
        serial = ("--compile-cache=isolated", f"--compile-cache-store={store}", "--compile-cache-readonly")
        timed[f"serial-bundle -n{workers}"] = lambda: run_pytest(suite, tmp, *serial, "-n", str(workers))
    names = list(timed)
    for index in range(rounds):
        order = names[index % len(names) :] + names[: index % len(names)]
        for name in order:
            out.setdefault(name, []).append(timed[name]())
    if megacache:
        mega_dir = tmp / "mega-dir"
        load_blobs_only(bundles[""], mega_dir)
        out["megacache"] = [run_pytest(suite, tmp, "--compile-cache=shared", f"--compile-cache-dir={mega_dir}")]
    out["_extra"] = extra
    return out


def variant(suite: Path, dest: Path, index: int) -> Path:
    """A copy of the suite whose compiled code differs: every float literal 4.0 / 2 scaled by index."""
    shutil.copytree(suite, dest, dirs_exist_ok=True)
    for path in dest.glob("test_*.py"):
        text = path.read_text().replace("/ 4.0", f"/ {4.0 + index}").replace("lr=0.1", f"lr={0.1 * (index + 1):.2f}")
        text = text.replace("torch.sin(x) * torch.sigmoid(x)", f"torch.sin(x) * torch.sigmoid(x) * {index + 1}")
        path.write_text(text)
    return dest


def growth(suite: Path, tmp: Path, runs: int = 5) -> list[dict[str, Any]]:
    store, shared = tmp / "growth-store", tmp / "growth-dir"
    rows = []
    for index in range(runs):
        copy = variant(suite, tmp / f"variant-{index}", index)
        seconds, data = run_pytest(
            copy,
            tmp,
            "--compile-cache=shared",
            f"--compile-cache-dir={shared}",
            f"--compile-cache-store={store}",
            "--compile-cache-keep-bundles=1",
        )
        bundle_size = newest_bundle(store).stat().st_size
        rows.append(
            {
                "run": index + 1,
                "seconds": round(seconds, 2),
                "misses": data["totals"]["misses"],
                "bundle": bundle_size,
                "wholedir": archive(shared, tmp / f"growth-{index}.tar.zst"),
            }
        )
    return rows


def median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def main() -> int:
    global TRACE_DIR
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--suite", default=str(ROOT / "examples"))
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--rounds", type=int, default=1, help="alternating rounds of the timed scenarios")
    parser.add_argument("--no-growth", action="store_true", help="skip the five-run growth series")
    parser.add_argument("--no-megacache", action="store_true", help="skip the mega-cache-only scenario")
    parser.add_argument("--workers", type=int, default=2, help="xdist twins of the timed scenarios (0: none)")
    parser.add_argument("--trace-compiler", action="store_true", help="count and time g++ and openssl calls")
    parser.add_argument("--pgo", action="store_true", help="run every scenario with --compile-cache-pgo=on")
    args = parser.parse_args()
    if args.pgo:  # every run's environment starts from this one (run_pytest)
        os.environ["PYTEST_COMPILECACHE_PGO"] = "on"
    suite = Path(args.suite).resolve()
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="compilecache-bench-") as tmp_name:
        tmp = Path(tmp_name)
        if args.trace_compiler:
            TRACE_DIR = make_shims(tmp)
        results = scenarios(suite, tmp, max(1, args.rounds), megacache=not args.no_megacache, workers=args.workers)
        rows = [] if args.no_growth else growth(suite, tmp)
    extra = results.pop("_extra")

    def warm_of(name: str, value: Any) -> float:  # the warm run with the same parallelism as ``name``
        suffix = name[name.index(" -n") :] if " -n" in name else ""
        return median([value(run) for run in results["warm" + suffix]])

    def wall(run: Any) -> float:
        return float(run[0])

    def cpu_of(run: Any) -> float:
        return float(run[1]["_cpu"])

    load_after = os.getloadavg()
    pgo = ", --compile-cache-pgo=on" if args.pgo else ""
    print(f"suite: {suite}  (python {sys.version.split()[0]}, {os.cpu_count()} cpus, {args.rounds} rounds{pgo})")
    print(f"load average: {load[0]:.1f} before, {load_after[0]:.1f} after")
    print(
        f"{'scenario':<23} {'median s':>8} {'x warm':>7} {'min s':>7} {'max s':>7} {'cpu s':>7} {'cpu x warm':>10}"
        "  hits/misses (each run)"
    )
    summary = {}
    for name, runs in results.items():
        times = [seconds for seconds, _ in runs]
        mid = median(times)
        cpu = median([data["_cpu"] for _, data in runs])
        warm, warm_cpu = warm_of(name, wall), warm_of(name, cpu_of)
        summary[name] = {
            "seconds": [round(t, 3) for t in times],
            "median": round(mid, 3),
            "ratio_to_warm": round(mid / warm, 3),
            "cpu_seconds": [round(data["_cpu"], 3) for _, data in runs],
            "cpu_ratio_to_warm": round(cpu / warm_cpu, 3),
            "totals": runs[-1][1].get("totals"),
            "misses": [(data.get("totals") or {}).get("misses") for _, data in runs],
            "compiler": runs[-1][1].get("_trace"),
        }
        print(
            f"{name:<23} {mid:8.2f} {mid / warm:7.2f} {min(times):7.2f} {max(times):7.2f} {cpu:7.2f} "
            f"{cpu / warm_cpu:10.2f}  {' '.join(misses(data) for _, data in runs)}"
        )
    restores = [(r[1].get("restore") or {}).get("seconds", 0.0) for r in results["restored-fresh"]]
    save = results["cold"][0][1].get("save") or {}
    hdr = extra["headers"]
    installs = hdr["installs"]
    print(
        f"bundle {extra['bundle'] / 1024:.0f} KiB: save (pack + upload) {save.get('seconds', 0):.2f} s, "
        f"restore (download + verify + unpack) {median(restores):.2f} s"
    )
    print(
        f"headers: {hdr['count']} file(s), {hdr['raw'] / 2**20:.1f} MiB raw, {hdr['compressed'] / 2**20:.1f} MiB "
        f"zstd-3: upload (hash + compress) {hdr['upload_s']:.2f} s, download "
        f"{median([i['download_s'] for i in installs]):.2f} s, install (decompress + verify) "
        f"{median([i['install_s'] for i in installs]):.2f} s"
    )
    print(
        f"whole-dir archive {extra['wholedir'] / 1024:.0f} KiB (zstd-10): pack {extra['wholedir_pack_s']:.2f} s, "
        f"unpack {median(extra['wholedir_unpack_s']):.2f} s"
    )
    if "parallel" in extra:
        parallel = extra["parallel"]
        print(
            f"-n{args.workers} lineage: bundle {parallel['bundle'] / 1024:.0f} KiB, whole-dir archive "
            f"{parallel['wholedir'] / 1024:.0f} KiB"
        )
    if args.trace_compiler:
        print("compiler calls in the last run of each scenario: kind count/seconds")
        for name, info in summary.items():
            calls = info["compiler"] or {}
            text = ", ".join(f"{kind} {int(c)}/{sec:.1f}" for kind, (c, sec) in sorted(calls.items()))
            print(f"  {name:<23} {text or '-'}")
    if rows:
        print("growth: run  misses  bundle KiB  whole-dir KiB")
        for row in rows:
            bundle_kib, whole_kib = row["bundle"] / 1024, row["wholedir"] / 1024
            print(f"        {row['run']:>3}  {row['misses']:>6}  {bundle_kib:>10.0f}  {whole_kib:>13.0f}")
    if args.json:
        payload = {
            "suite": str(suite),
            "rounds": args.rounds,
            "pgo": args.pgo,
            "load": [load[0], load_after[0]],
            "scenarios": summary,
            "sizes_and_transfers": extra,
            "save_seconds": save.get("seconds"),
            "restore_seconds": restores,
            "growth": rows,
        }
        Path(args.json).write_text(json.dumps(payload, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
