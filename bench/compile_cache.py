"""Benchmark: what a bundle buys on a suite of compiled CPU tests, measured in one run.

Scenarios, each a fresh pytest process. "Same machine" runs share one TMPDIR with the cold run (torch
keeps its precompiled C++ header there, outside the cache dir); "fresh machine" runs get a new TMPDIR,
as a new CI runner does, and so rebuild that header (seconds of g++, whatever the cache holds):

* eager     - TORCH_COMPILE_DISABLE=1: the floor, no compile at all
* cold      - an empty cache dir (saves a bundle to a local store at the end)
* warm      - the same cache dir again, same machine: the best a cache can do
* restored  - an empty isolated dir restored from the cold run's bundle, same machine
* restored-fresh - the same on a fresh machine (the CI case)
* megacache - fresh machine, an empty dir into which only torch's mega-cache blobs are loaded (no kernels)
* wholedir  - fresh machine, the cold run's whole cache dir archived (tar + zstd) and unpacked

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
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import zstandard

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


def run_pytest(suite: Path, tmp: Path, *args: str, env: dict[str, str] | None = None,
               machine: Path | None = None) -> tuple[float, dict]:
    """Run the suite once; return wall seconds and the plugin's JSON report (empty for eager).

    ``machine`` is the TMPDIR to use (same machine); None gives a fresh one (a fresh machine).
    """
    report = tmp / f"report-{time.monotonic_ns()}.json"
    scratch = machine or Path(tempfile.mkdtemp(prefix="tmpdir-", dir=tmp))
    full_env = {**os.environ, "TMPDIR": str(scratch), **(env or {})}
    full_env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    cmd = [PY, "-m", "pytest", str(suite), "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
           f"--compile-cache-json={report}", *args]
    started = time.perf_counter()
    proc = subprocess.run(cmd, env=full_env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        raise SystemExit(f"pytest failed in scenario {args}")
    data = json.loads(report.read_text()) if report.exists() else {}
    return seconds, data


def load_blobs_only(bundle_path: Path, cache_dir: Path) -> None:
    """Load only the mega-cache blobs of a bundle into cache_dir (what torch alone would restore)."""
    code = (
        "import sys, os, tempfile; from pathlib import Path\n"
        "os.environ['TORCHINDUCTOR_CACHE_DIR'] = sys.argv[2]\n"
        "from pytest_compilecache import bundle, probe\n"
        "unpacked = bundle.unpack(Path(sys.argv[1]), Path(tempfile.mkdtemp()))\n"
        "[probe.load_artifacts(b) for b in unpacked.blobs.values()]\n"
    )
    subprocess.run([PY, "-c", code, str(bundle_path), str(cache_dir)], check=True, capture_output=True)


def archive(directory: Path, dest: Path) -> int:
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


def misses(data: dict) -> str:
    totals = data.get("totals", {})
    return f"{totals.get('hits', '-')}/{totals.get('misses', '-')}"


def scenarios(suite: Path, tmp: Path) -> dict:
    store, cold_dir = tmp / "store", tmp / "cold-dir"
    machine = tmp / "machine-a"
    machine.mkdir()
    out: dict = {}
    out["eager"] = run_pytest(suite, tmp, env={"TORCH_COMPILE_DISABLE": "1"})
    out["cold"] = run_pytest(suite, tmp, "--compile-cache=shared", f"--compile-cache-dir={cold_dir}",
                             f"--compile-cache-store={store}", machine=machine)
    bundle_path = newest_bundle(store)
    whole = tmp / "whole.tar.zst"
    out["_sizes"] = {"bundle": bundle_path.stat().st_size, "wholedir": archive(cold_dir, whole)}
    out["warm"] = run_pytest(suite, tmp, "--compile-cache=shared", f"--compile-cache-dir={cold_dir}",
                             machine=machine)
    restore_args = ("--compile-cache=isolated", f"--compile-cache-store={store}", "--compile-cache-readonly")
    out["restored"] = run_pytest(suite, tmp, *restore_args, machine=machine)
    out["restored-fresh"] = run_pytest(suite, tmp, *restore_args)
    mega_dir = tmp / "mega-dir"
    load_blobs_only(bundle_path, mega_dir)
    out["megacache"] = run_pytest(suite, tmp, "--compile-cache=shared", f"--compile-cache-dir={mega_dir}")
    whole_dir = tmp / "whole-dir"
    unarchive(whole, whole_dir)
    out["wholedir"] = run_pytest(suite, tmp, "--compile-cache=shared", f"--compile-cache-dir={whole_dir}")
    return out


def variant(suite: Path, dest: Path, index: int) -> Path:
    """A copy of the suite whose compiled code differs: every float literal 4.0 / 2 scaled by index."""
    shutil.copytree(suite, dest, dirs_exist_ok=True)
    for path in dest.glob("test_*.py"):
        text = path.read_text().replace("/ 4.0", f"/ {4.0 + index}").replace("lr=0.1", f"lr={0.1 * (index + 1):.2f}")
        text = text.replace("torch.sin(x) * torch.sigmoid(x)", f"torch.sin(x) * torch.sigmoid(x) * {index + 1}")
        path.write_text(text)
    return dest


def growth(suite: Path, tmp: Path, runs: int = 5) -> list[dict]:
    store, shared = tmp / "growth-store", tmp / "growth-dir"
    rows = []
    for index in range(runs):
        copy = variant(suite, tmp / f"variant-{index}", index)
        seconds, data = run_pytest(copy, tmp, "--compile-cache=shared", f"--compile-cache-dir={shared}",
                                   f"--compile-cache-store={store}", "--compile-cache-keep-bundles=1")
        bundle_size = newest_bundle(store).stat().st_size
        rows.append({"run": index + 1, "seconds": round(seconds, 2), "misses": data["totals"]["misses"],
                     "bundle": bundle_size, "wholedir": archive(shared, tmp / f"growth-{index}.tar.zst")})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--suite", default=str(ROOT / "examples"))
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--no-growth", action="store_true", help="skip the five-run growth series")
    args = parser.parse_args()
    suite = Path(args.suite).resolve()
    with tempfile.TemporaryDirectory(prefix="compilecache-bench-") as tmp_name:
        tmp = Path(tmp_name)
        results = scenarios(suite, tmp)
        rows = [] if args.no_growth else growth(suite, tmp)
    sizes = results.pop("_sizes")
    warm = results["warm"][0]
    print(f"suite: {suite}  (python {sys.version.split()[0]}, {os.cpu_count()} cpus)")
    print(f"{'scenario':<15} {'wall s':>7} {'x warm':>7}  hits/misses")
    for name, (seconds, data) in results.items():
        print(f"{name:<15} {seconds:7.2f} {seconds / warm:7.2f}  {misses(data)}")
    restore = results["restored-fresh"][1].get("restore") or {}
    save = results["cold"][1].get("save") or {}
    print(f"bundle {sizes['bundle'] / 1024:.0f} KiB vs whole-dir archive {sizes['wholedir'] / 1024:.0f} KiB; "
          f"save {save.get('seconds', 0):.2f} s, restore {restore.get('seconds', 0):.2f} s")
    if rows:
        print("growth: run  misses  bundle KiB  whole-dir KiB")
        for row in rows:
            bundle_kib, whole_kib = row["bundle"] / 1024, row["wholedir"] / 1024
            print(f"        {row['run']:>3}  {row['misses']:>6}  {bundle_kib:>10.0f}  {whole_kib:>13.0f}")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "scenarios": {k: {"seconds": round(v[0], 3), "ratio_to_warm": round(v[0] / warm, 3),
                              "totals": v[1].get("totals")} for k, v in results.items()},
            "sizes": sizes, "save_seconds": save.get("seconds"), "restore_seconds": restore.get("seconds"),
            "growth": rows,
        }, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
