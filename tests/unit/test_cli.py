"""``python -m pytest_compilecache``: each command, its output and its documented exit code."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_compilecache import bundle
from pytest_compilecache import cli
from pytest_compilecache.fingerprint import collect
from pytest_compilecache.stores.local import LocalStore

H100 = {"cuda": "12.8", "hip": "", "triton": "3.4.0", "gpus": [{"name": "NVIDIA H100 80GB HBM3", "capability": "9.0"}]}


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # restore points torch at the cache dir through the environment; keep that inside the test.
    for name in (
        "TORCHINDUCTOR_CACHE_DIR",
        "TRITON_CACHE_DIR",
        "GITHUB_OUTPUT",
        "GITHUB_STEP_SUMMARY",
        "PYTEST_COMPILECACHE_SIGNING_KEY",
        "GITHUB_ACTIONS",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "unused"))


@pytest.fixture
def device_file(tmp_path: Path) -> Path:
    path = tmp_path / "device.json"
    path.write_text(json.dumps(H100))
    return path


KERNEL = "cab" + "x" * 49  # torch's shape: a 52-character key in the dir of its 2nd and 3rd characters
FX_KEY = "fxy" + "a" * 49  # an FX-graph key, in fxgraph/<its 2nd and 3rd characters>/
AUTOTUNE = "f2b4c1d0" * 8  # torch's local autotuning results: cache/<system hash>


def _cache_dir(tmp_path: Path) -> Path:
    cache = tmp_path / "cache"
    (cache / "ab").mkdir(parents=True)
    (cache / "ab" / f"{KERNEL}.main.so").write_bytes(b"kernel")
    (cache / "fxgraph" / "xy" / FX_KEY).mkdir(parents=True)
    (cache / "fxgraph" / "xy" / FX_KEY / "entry").write_bytes(b"graph")
    (cache / "ab" / f"{KERNEL}.cpp").write_text("// regenerated, not bundled")
    return cache


def test_fingerprint_json_uses_recorded_device_facts(capsys: pytest.CaptureFixture[str], device_file: Path) -> None:
    assert cli.main(["fingerprint", "--json", "--device-facts", str(device_file)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["facts"]["gpus"] == "NVIDIA H100 80GB HBM3 (9.0)"
    assert data["facts"]["cuda"] == "12.8" and data["facts"]["torch"].startswith("2.")
    assert len(data["digest"]) == 16


def test_fingerprint_prints_hostile_facts_on_one_inert_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GPU names from a recorded facts file and the salt are anyone's text: never a runner command.
    device = tmp_path / "device.json"
    device.write_text(json.dumps({**H100, "gpus": [{"name": "H100\n::error::from device facts", "capability": "9.0"}]}))
    monkeypatch.setenv("PYTEST_COMPILECACHE_KEY_SALT", " v2\n::add-mask::e ")
    assert cli.main(["fingerprint", "--device-facts", str(device)]) == 0
    out = capsys.readouterr().out
    assert not any(line.lstrip().startswith("::") for line in out.splitlines()), out
    assert "H100\\n::error::from device facts (9.0)" in out


def test_salt_is_stripped_as_the_plugin_strips_it(capsys: pytest.CaptureFixture[str], device_file: Path) -> None:
    digests = []
    for salt in ("model-v2", " model-v2 "):
        assert cli.main(["fingerprint", "--json", "--salt", salt, "--device-facts", str(device_file)]) == 0
        digests.append(json.loads(capsys.readouterr().out)["digest"])
    assert digests[0] == digests[1]


def test_key_writes_github_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, device_file: Path) -> None:
    out = tmp_path / "github_output"
    monkeypatch.setenv("GITHUB_OUTPUT", str(out))
    assert (
        cli.main(["key", "--prefix", "p1", "--suffix", "42-1", "--github-output", "--device-facts", str(device_file)])
        == 0
    )
    values = dict(line.split("=", 1) for line in out.read_text().splitlines())
    assert values["key"] == f"p1-{values['digest']}-42-1"
    assert values["restore-prefix"] == f"p1-{values['digest']}-"


def test_save_restore_inspect_verify_prune(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, cache = tmp_path / "store", _cache_dir(tmp_path)
    for suffix in ("1", "2", "3"):
        assert (
            cli.main(["save", "--store", str(store), "--cache-dir", str(cache), "--suffix", suffix, "--keep", "5"]) == 0
        )
    keys = [e.key for e in LocalStore(store).list()]
    assert len(keys) == 3

    target = tmp_path / "restored"
    out = tmp_path / "github_output"
    monkeypatch.setenv("GITHUB_OUTPUT", str(out))
    assert (
        cli.main(
            [
                "restore",
                "--store",
                str(store),
                "--cache-dir",
                str(target),
                "--github-output",
                "--json",
                str(tmp_path / "r.json"),
            ]
        )
        == 0
    )
    values = dict(line.split("=", 1) for line in out.read_text().splitlines())
    assert values["restore-outcome"] == "partial" and values["cache-hit"] == "false"
    assert values["matched-key"] == keys[0]  # newest first
    assert (target / "ab" / f"{KERNEL}.main.so").read_bytes() == b"kernel"
    assert (target / "fxgraph" / "xy" / FX_KEY / "entry").read_bytes() == b"graph"
    assert not (target / "ab" / f"{KERNEL}.cpp").exists()

    assert cli.main(["restore", "--store", str(store), "--cache-dir", str(target), "--key", keys[1]]) == 0
    assert "restore-outcome=exact" in capsys.readouterr().out

    bundle_path = store / f"{keys[0]}.bundle"
    assert cli.main(["inspect", str(bundle_path), "--json"]) == 0
    manifest = json.loads(capsys.readouterr().out)
    assert {m["path"] for m in manifest["members"]} == {
        f"files/ab/{KERNEL}.main.so",
        f"files/fxgraph/xy/{FX_KEY}/entry",
    }
    assert manifest["signed"] is False

    assert cli.main(["verify", str(bundle_path), "--fingerprint"]) == 0
    data = bytearray(bundle_path.read_bytes())
    data[-5] ^= 0xFF
    bundle_path.write_bytes(bytes(data))
    assert cli.main(["verify", str(bundle_path)]) == cli.EXIT_FAILED
    assert "invalid:" in capsys.readouterr().out

    prefix = keys[0].rsplit("-", 1)[0] + "-"
    assert cli.main(["prune", "--store", str(store), "--prefix", prefix, "--keep", "1"]) == 0
    assert [e.key for e in LocalStore(store).list()] == [keys[0]]


def test_signed_bundles_need_the_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store, cache = tmp_path / "store", _cache_dir(tmp_path)
    monkeypatch.setenv("PYTEST_COMPILECACHE_SIGNING_KEY", "k1")
    assert cli.main(["save", "--store", str(store), "--cache-dir", str(cache), "--suffix", "1"]) == 0
    (path,) = store.glob("*.bundle")
    assert cli.main(["verify", str(path)]) == 0
    monkeypatch.setenv("PYTEST_COMPILECACHE_SIGNING_KEY", "k2")
    assert cli.main(["verify", str(path)]) == cli.EXIT_FAILED
    # A restore with the wrong key warns and restores nothing (exit 0), or exits 1 when strict.
    target = tmp_path / "restored"
    assert cli.main(["restore", "--store", str(store), "--cache-dir", str(target)]) == 0
    assert not (target / "ab").exists()
    assert cli.main(["restore", "--store", str(store), "--cache-dir", str(target), "--strict"]) == cli.EXIT_FAILED


def test_miss_and_usage_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty-store"
    assert cli.main(["restore", "--store", str(empty), "--cache-dir", str(tmp_path / "c")]) == 0
    assert "no bundle under" in capsys.readouterr().err
    assert (
        cli.main(["restore", "--store", str(empty), "--cache-dir", str(tmp_path / "c"), "--fail-on-miss"])
        == cli.EXIT_MISS
    )
    capsys.readouterr()
    for command in (["restore", "--cache-dir", str(tmp_path / "c")], ["prune", "--prefix", "p"]):
        assert cli.main([*command, "--store", "ftp://nowhere"]) == cli.EXIT_USAGE
        err = capsys.readouterr().err  # the flag the user typed, not the plugin's option
        assert err.startswith("error: --store: unsupported store: 'ftp://nowhere'"), err
        assert "--compile-cache-store" not in err, err


def test_report_renders_markdown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    report = tmp_path / "r.json"
    report.write_text(
        json.dumps(
            {
                "version": 1,
                "mode": "shared",
                "cache_dir": "/c",
                "totals": {"tests": 2},
                "tests": [
                    {
                        "nodeid": "t.py::a",
                        "fxgraph": {"hit": 3, "miss": 1, "bypass": 0},
                        "frames": 2,
                        "compile_seconds": 1.5,
                    }
                ],
            }
        )
    )
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    assert cli.main(["report", str(report), "--summary"]) == 0
    text = summary.read_text()
    assert "75% hit rate" in text and "`t.py::a`" in text


def test_report_renders_why_these_tests_missed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The JSON report's top-level ``why`` comes out as the step summary's section, through report.py."""
    from pytest_compilecache import report as report_mod
    from pytest_compilecache.explain import MissExplanation
    from pytest_compilecache.explain import SessionExplanation

    why = SessionExplanation(
        misses={"t.py::a": [MissExplanation("k2", ["input 0 shape [8, 16] -> [8, 32]"])]},
        never_hit={"t.py::r": ("a constant in graph statement 3", 2)},
        compared_with="bundle",
    )
    record = {"nodeid": "t.py::a", "fxgraph": {"hit": 0, "miss": 1, "bypass": 0}, "frames": 1}
    data = {"version": 1, "mode": "shared", "cache_dir": "/c", "totals": {"tests": 2}, "tests": [record]}
    path = tmp_path / "r.json"
    path.write_text(json.dumps({**data, "why": report_mod.why_json(why)}))
    assert cli.main(["report", str(path)]) == 0
    out = capsys.readouterr().out
    assert "Why these tests missed (compared with the bundle) (2)" in out
    assert "| `t.py::a` | input 0 shape \\[8, 16\\] -\\> \\[8, 32\\] |" in out  # escaped Markdown
    assert "| `t.py::r` | **never hits**: only a constant in graph statement 3 changed" in out
    assert out.strip().endswith(report_mod.why_markdown(why, report_mod.WHY_MARKDOWN_BYTES).strip())

    path.write_text(json.dumps({**data, "why": None}))  # a first run: nothing compared
    assert cli.main(["report", str(path)]) == 0
    assert "Why these tests missed" not in capsys.readouterr().out

    path.write_text(json.dumps({**data, "why": {"misses": {"t.py::a": [{"reasons": []}]}}}))
    assert cli.main(["report", str(path)]) == cli.EXIT_USAGE
    assert "is not a --compile-cache-json report" in capsys.readouterr().err


def test_module_entry_point_runs() -> None:
    proc = subprocess.run([sys.executable, "-m", "pytest_compilecache", "--version"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip()


def test_inspect_text_shows_the_header_artifact(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 29: only --json showed the precompiled header a bundle names."""
    from pytest_compilecache import bundle

    NAME = "c" + "a" * 51 + ".h.gch"  # torch's name for a compiled header (gcc)

    cache = _cache_dir(tmp_path)
    header = bundle.Artifact(kind="precompiled_header", name=NAME, sha256="ab" * 32, size=2100)
    idle = bundle.Artifact(kind="precompiled_header", name=NAME.replace("a", "b"), sha256="cd" * 32, size=99, idle=2)
    path = tmp_path / "b.bundle"
    bundle.pack(
        path, key="p-abc-1-1", lineage="p-abc-", fingerprint={"torch": "2.13.0"}, digest="abc", torch_version="2.13.0",
        blobs={}, cache_dir=cache, files=["ab/cabc.main.so"], stats={}, artifacts=[header, idle],
    )  # fmt: skip
    assert cli.main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-3:] == [
        "artifacts    2 (stored beside the bundle, by sha256)",
        f"        2100  precompiled_header  {NAME}  sha256 {'ab' * 32}",
        f"          99  precompiled_header  {idle.name}  sha256 {'cd' * 32}  unused in the last 2 saves",
    ]


def test_bad_keep_and_store_trouble_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["save", "--store", str(tmp_path / "s"), "--cache-dir", str(tmp_path), "--keep", "0"])
    assert exit_info.value.code == cli.EXIT_USAGE
    assert not (tmp_path / "s").exists()  # refused before anything was saved
    assert "--keep: must be at least 1" in capsys.readouterr().err
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    # A store that is a file: refused before any work since issue 29 (it was store trouble at the first call).
    assert cli.main(["prune", "--store", str(not_a_dir), "--prefix", "p-"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err


def _usage_cases(tmp_path: Path) -> list[tuple[list[str], int]]:
    store = str(tmp_path / "store")
    cache = str(tmp_path / "cache")
    wrong_shape = tmp_path / "wrong.json"
    wrong_shape.write_text(json.dumps({"totals": [], "tests": "x"}))
    not_json = tmp_path / "not.json"
    not_json.write_text("{")
    bad_device = tmp_path / "device-bad.json"
    bad_device.write_text(json.dumps({"gpus": [{}]}))
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    garbage = tmp_path / "garbage.bundle"
    garbage.write_bytes(b"not a bundle")
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    return [
        (["report", str(wrong_shape)], cli.EXIT_USAGE),
        (["report", str(not_json)], cli.EXIT_USAGE),
        (["report", str(tmp_path / "missing.json")], cli.EXIT_USAGE),
        (["report", "/dev/zero"], cli.EXIT_USAGE),  # endless: refused unread, no MemoryError
        (["report", str(fifo)], cli.EXIT_USAGE),  # no writer: refused without waiting for one
        (
            ["restore", "--store", store, "--cache-dir", str(tmp_path / "my cache")],
            cli.EXIT_USAGE,
        ),  # torch can't build there
        (["fingerprint", "--device-facts", str(bad_device)], cli.EXIT_USAGE),
        (["fingerprint", "--device-facts", str(tmp_path / "missing.json")], cli.EXIT_USAGE),
        (["restore", "--store", store, "--cache-dir", cache, "--key", "../evil"], cli.EXIT_USAGE),
        (["restore", "--store", store, "--cache-dir", cache, "--device-facts", str(bad_device)], cli.EXIT_USAGE),
        (["restore", "--store", store, "--cache-dir", cache, "--prefix", "bad/prefix"], cli.EXIT_USAGE),
        (["restore", "--store", store, "--cache-dir", cache, "--json", str(a_file / "x.json")], cli.EXIT_USAGE),
        (["restore", "--store", store, "--cache-dir", cache, "--json", "/sys/r.json"], cli.EXIT_USAGE),  # root too
        (["restore", "--store", str(a_file), "--cache-dir", cache], cli.EXIT_USAGE),
        (["save", "--store", str(a_file / "sub"), "--cache-dir", cache], cli.EXIT_USAGE),
        (["restore", "--store", "   ", "--cache-dir", cache], cli.EXIT_USAGE),
        (["save", "--store", store, "--cache-dir", cache, "--suffix", "bad/suffix"], cli.EXIT_USAGE),
        (["key", "--prefix", "p\ncache-hit=true", "--github-output"], cli.EXIT_USAGE),
        (["prune", "--store", store, "--prefix", "../x"], cli.EXIT_USAGE),
        (["restore", "--store", store, "--cache-dir", str(a_file)], cli.EXIT_USAGE),  # a file: no cache dir
        (["restore", "--store", store, "--cache-dir", str(a_file / "sub")], cli.EXIT_USAGE),
        (["restore", "--store", store, "--cache-dir", store], cli.EXIT_USAGE),  # the store's own dir
        (["save", "--store", str(tmp_path / "c" / "store"), "--cache-dir", str(tmp_path / "c")], cli.EXIT_USAGE),
        (["verify", str(tmp_path / "missing.bundle")], cli.EXIT_FAILED),
        (["inspect", str(garbage)], cli.EXIT_FAILED),
    ]


def test_documented_exit_codes_and_one_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    output = tmp_path / "github_output"
    monkeypatch.setenv("GITHUB_OUTPUT", str(output))
    for argv, code in _usage_cases(tmp_path):
        assert cli.main(argv) == code, argv
        out, err = capsys.readouterr()
        if argv[0] == "verify":  # its verdict on stdout: "invalid: <why>"
            out, err = "", out.replace("invalid: ", "error: ", 1)
        assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err + out, (argv, err)
    assert not output.exists()  # no usage error wrote an output
    assert not (tmp_path / "store").exists() and not (tmp_path / "cache").exists()  # nothing was done


def test_restore_json_dir_is_made(tmp_path: Path) -> None:
    target = tmp_path / "new" / "dir" / "restore.json"
    assert (
        cli.main(["restore", "--store", str(tmp_path / "s"), "--cache-dir", str(tmp_path / "c"), "--json", str(target)])
        == 0
    )
    assert json.loads(target.read_text())["outcome"] == "miss"


def test_bad_plugin_variables_are_usage_errors_naming_the_variable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The CLI's --max-bundle-size and --s3-endpoint default to the plugin's variables: a bad one was a
    # traceback while the parser was built (even for --help), or a warning at the first S3 call.
    restore = ["restore", "--store", str(tmp_path / "store"), "--cache-dir", str(tmp_path / "c")]
    monkeypatch.setenv("PYTEST_COMPILECACHE_MAX_BUNDLE_SIZE", "abc")
    assert cli.main(restore) == cli.EXIT_USAGE
    assert capsys.readouterr().err == (
        "error: PYTEST_COMPILECACHE_MAX_BUNDLE_SIZE: expected a size like 500M or 2G, got 'abc'\n"
    )
    assert cli.main([*restore, "--max-bundle-size", "1G"]) == 0  # the flag wins; the variable is not read
    monkeypatch.delenv("PYTEST_COMPILECACHE_MAX_BUNDLE_SIZE")
    monkeypatch.setenv("PYTEST_COMPILECACHE_S3_ENDPOINT", "ftp://bad")
    assert cli.main(["prune", "--store", "s3://bucket/x", "--prefix", "p", "--keep", "2"]) == cli.EXIT_USAGE
    assert "error: PYTEST_COMPILECACHE_S3_ENDPOINT: expected an http(s)://host[:port] URL" in capsys.readouterr().err
    assert cli.main([*restore, "--s3-endpoint", "ftp://bad"]) == cli.EXIT_USAGE
    assert "error: --s3-endpoint: expected an http(s)://host[:port] URL" in capsys.readouterr().err
    monkeypatch.delenv("PYTEST_COMPILECACHE_S3_ENDPOINT")
    monkeypatch.setenv("PYTEST_COMPILECACHE_STORE_TIMEOUT", "0")
    assert cli.main(["prune", "--store", str(tmp_path / "store"), "--prefix", "p", "--keep", "2"]) == cli.EXIT_USAGE
    assert "error: PYTEST_COMPILECACHE_STORE_TIMEOUT: must be more than 0" in capsys.readouterr().err
    # Whitespace is a value, as in the plugin (only an empty variable is unset there and here).
    monkeypatch.setenv("PYTEST_COMPILECACHE_STORE_TIMEOUT", " ")
    assert cli.main(["prune", "--store", str(tmp_path / "store"), "--prefix", "p", "--keep", "2"]) == cli.EXIT_USAGE
    assert "error: PYTEST_COMPILECACHE_STORE_TIMEOUT: expected a number of seconds" in capsys.readouterr().err


# ---- issue 28.7: no CLI output is ever a runner command ---------------------------------------------------

# Hostile text in every form the runner acts on: "##[" anywhere in a line (its older command form), "::" at a
# line's start after whitespace, and the line breaks that would put it there (LF, CR, CRLF).
HOSTILE = "x ##[error]owned\n::error::lf\r  ::add-mask::cr\r\n\t::warning::crlf ##[add-mask]tail"


def _runner_commands(text: str) -> list[str]:
    """The lines of ``text`` the runner would try as workflow commands (actions/runner ActionCommand.cs):
    TryParseV2 takes a line that starts with ``::`` after TrimStart, TryParse one holding ``##[`` anywhere.
    Lines end at LF, CR or CRLF (its StreamReader). Python's whitespace is a superset of .NET's, and the
    command name is not checked: this oracle flags more than the runner acts on, never less."""
    return [line for line in re.split(r"\r\n|\r|\n", text) if line.lstrip().startswith("::") or "##[" in line]


def _hostile_bundle(tmp_path: Path) -> Path:
    """An unsigned bundle whose every free-text field is hostile: its facts, stats, graphs and member path."""
    cache = tmp_path / "hostile-cache"
    (cache / "ab").mkdir(parents=True)
    (cache / "ab" / "k##[error]x.so").write_bytes(b"kernel")
    facts = {**collect(device=H100).to_json(), "gpus": HOSTILE, "salt": HOSTILE}
    digest = collect(device=H100).digest()
    key = f"compilecache-v1-{digest}-run1"
    path = tmp_path / "store" / f"{key}.bundle"
    path.parent.mkdir(parents=True, exist_ok=True)
    bundle.pack(
        path, key=key, lineage=f"compilecache-v1-{digest}-", fingerprint=facts, digest=digest,
        torch_version=HOSTILE, blobs={"controller": b"blob"}, cache_dir=cache, files=["ab/k##[error]x.so"],
        stats={"note": HOSTILE}, graphs={"format": 1, "note": HOSTILE},
    )  # fmt: skip
    return path


def _hostile_report(tmp_path: Path) -> Path:
    record = {"nodeid": f"t.py::test[{HOSTILE}]", "fxgraph": {"hit": 1, "miss": 2, "bypass": 0}, "frames": 1}
    why = {"compared_with": HOSTILE, "misses": {record["nodeid"]: [{"key": HOSTILE, "reasons": [HOSTILE]}]}}
    data = {
        "version": 1, "mode": HOSTILE, "cache_dir": HOSTILE, "totals": {"tests": 1}, "tests": [record],
        "silent_workers": [HOSTILE], "restore": {"outcome": "miss", "message": HOSTILE, "key": HOSTILE},
        "save": {"outcome": "error", "message": HOSTILE}, "why": why,
    }  # fmt: skip
    path = tmp_path / "report.json"
    path.write_text(json.dumps(data))
    return path


def test_no_command_prints_a_line_the_runner_would_act_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    hostile_bundle = _hostile_bundle(tmp_path)
    store = hostile_bundle.parent
    device = tmp_path / "device.json"
    device.write_text(json.dumps({**H100, "gpus": [{"name": HOSTILE, "capability": "9.0"}]}))
    odd = tmp_path / "dir ##[error]x"  # paths are anyone's text too
    odd.mkdir()
    garbage = odd / "##[error]garbage.bundle"
    garbage.write_bytes(b"not a bundle ##[error]")
    report = _hostile_report(tmp_path)
    fp = ["--device-facts", str(device), "--salt", "s ##[error]x"]
    runs = [
        ["fingerprint", *fp],
        ["fingerprint", "--json", *fp],
        ["key", *fp],
        ["restore", "--store", str(store), "--cache-dir", str(odd / "c"), "--device-facts", str(_h100(tmp_path))],
        ["restore", "--store", str(odd / "s"), "--cache-dir", str(odd / "c"), *fp],
        ["save", "--store", str(odd / "s"), "--cache-dir", str(_cache_dir(odd)), *fp],
        ["save", "--store", str(odd / "s"), "--cache-dir", str(odd / "missing"), "--strict", *fp],
        ["inspect", str(hostile_bundle)],
        ["inspect", "--json", str(hostile_bundle)],
        ["inspect", str(garbage)],
        ["verify", str(hostile_bundle)],
        ["verify", str(garbage)],
        ["verify", "--fingerprint", *fp, str(hostile_bundle)],
        ["prune", "--store", str(odd / "s"), "--prefix", "compilecache-v1-", "--keep", "1"],
        ["prune", "--store", str(garbage), "--prefix", "p"],
        ["report", str(report)],
        ["report", str(odd / "missing.json")],
        ["report", str(garbage)],
        ["save", "--store", str(store), "--cache-dir", str(odd), "--keep", HOSTILE],  # argparse's own error
        [HOSTILE],
    ]
    for argv in runs:
        try:
            cli.main(argv)
        except SystemExit:
            pass  # argparse: usage errors exit 2 after printing
        out, err = capsys.readouterr()
        assert out + err, argv
        assert _runner_commands(out) == [] and _runner_commands(err) == [], (argv, out, err)
    cli.main(["inspect", "--json", str(hostile_bundle)])
    shown = json.loads(capsys.readouterr().out)  # still valid JSON, with the text unchanged
    assert shown["fingerprint"]["gpus"] == HOSTILE and shown["stats"]["note"] == HOSTILE


def _h100(tmp_path: Path) -> Path:
    path = tmp_path / "device-h100.json"
    path.write_text(json.dumps(H100))
    return path


# ---- issue 28.10: any malformed report is exit 2 and one line ------------------------------------------------


def _report_data() -> dict[str, Any]:
    record = {"nodeid": "t.py::a", "fxgraph": {"hit": 3, "miss": 1, "bypass": 0}, "frames": 2, "compile_seconds": 1.5}
    why = {"compared_with": "bundle", "misses": {"t.py::a": [{"key": "k2", "reasons": ["input 0 shape"]}]}}
    return {
        "version": 1, "mode": "shared", "cache_dir": "/c", "totals": {"tests": 2}, "tests": [record],
        "silent_workers": ["gw1"], "restore": {"outcome": "partial", "message": "", "key": "k", "size": 10},
        "save": {"outcome": "saved", "message": "", "key": "k2", "size": 12, "seconds": 0.5}, "why": why,
    }  # fmt: skip


def _report_exit(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(["report", str(path)])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    "text",
    [
        '{"totals": {"tests": 1e999}}',  # inf: int() raised OverflowError, exit 1
        '{"totals": {"tests": -1e999}}',
        '{"totals": {"tests": NaN}}',
        '{"totals": {"tests": 1.5}}',
        '{"totals": {"tests": true}}',
        '{"totals": {"tests": -3}}',
        '{"totals": {"tests": "2"}}',
        "[" * 100_000 + "]" * 100_000,  # deeper than the parser goes: RecursionError
        '{"totals": {"tests": 1}, "tests": [{"nodeid": "a", "frames": 1e999}]}',
    ],
)
def test_a_malformed_report_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str) -> None:
    path = tmp_path / "r.json"
    path.write_text(text)
    code, out, err = _report_exit(path, capsys)
    assert code == cli.EXIT_USAGE, (code, err)
    assert out == "" and err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err


def test_report_input_fuzz(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Seeded mutations of a valid report: each renders (exit 0) or is refused in one line (exit 2), never
    another exit code, a traceback, or a line the runner would act on."""
    rng = random.Random(2811)
    values: list[Any] = [
        float("inf"), float("-inf"), float("nan"), 10**400, -(10**400), -1, 0, 1.5, True, None, "", "x" * 5000,
        "##[error]x\n::error::y", [], {}, [[[]]], {"a": {"b": {}}}, [None], {"nodeid": None}, "\x00\ud800",
    ]  # fmt: skip

    def mutate(node: Any, depth: int = 0) -> Any:
        if rng.random() < 0.25 or not isinstance(node, (dict, list)) or not node:
            return rng.choice(values)
        if isinstance(node, dict):
            key = rng.choice(list(node))
            if rng.random() < 0.1:
                return {k: v for k, v in node.items() if k != key}  # a field left out
            return {**node, key: mutate(node[key], depth + 1)}
        index = rng.randrange(len(node))
        return [*node[:index], mutate(node[index], depth + 1), *node[index + 1 :]]

    path = tmp_path / "r.json"
    codes = {0: 0, 2: 0}
    for _ in range(400):
        data = _report_data()
        for _ in range(rng.randint(1, 3)):
            data = mutate(data)
        path.write_text(json.dumps(data))
        code, out, err = _report_exit(path, capsys)
        assert code in codes, (code, data, err)
        codes[code] += 1
        if code:
            assert out == "" and err.startswith("error: ") and err.count("\n") == 1, (data, err)
        assert "Traceback" not in out + err and _runner_commands(out + err) == [], (data, out, err)
    assert codes[0] > 20 and codes[2] > 20, codes  # the fuzz reaches both outcomes


def test_restore_refuses_a_project_folder_as_pytest_does(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Issue 29.1: the rule of `pytest --compile-cache-dir=.`: torch's dirs are never sprayed among a user's files.
    store, cache = tmp_path / "store", tmp_path / "cache"
    key = "c3g2mqobe6g24e353lemr6cpzfcmocdsk5rbq3mousrlfxbh7zgy"  # a real torch 2.13 kernel key
    (cache / key[1:3]).mkdir(parents=True)
    (cache / key[1:3] / f"{key}.main.so").write_bytes(b"kernel")
    assert cli.main(["save", "--store", str(store), "--cache-dir", str(cache)]) == 0
    project = tmp_path / "project"
    project.mkdir()
    (project / "models.py").write_text("# the user's\n")
    (project / "test_user.py").write_text("def test_x():\n    pass\n")
    capsys.readouterr()
    assert cli.main(["restore", "--store", str(store), "--cache-dir", str(project)]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert f"--cache-dir: {project} is not a compile cache" in err and "models.py" in err
    assert sorted(p.name for p in project.iterdir()) == ["models.py", "test_user.py"]
    # A new dir, and one holding a restore's leftovers, are fine.
    assert cli.main(["restore", "--store", str(store), "--cache-dir", str(tmp_path / "new")]) == 0
    assert cli.main(["restore", "--store", str(store), "--cache-dir", str(tmp_path / "new")]) == 0


def test_restore_sweeps_what_a_killed_restore_left(tmp_path: Path) -> None:
    # Issue 28.5: a restore SIGKILLed into a new dir leaves only its staging dir; the next restore takes it away.
    from pytest_compilecache import _fs

    store, cache = tmp_path / "store", _cache_dir(tmp_path)
    assert cli.main(["save", "--store", str(store), "--cache-dir", str(cache)]) == 0
    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True).stdout)
    target = tmp_path / "restored"
    staging = target / f".compilecache-staging-{_fs.host_tag()}-{dead}-1700000000-abcd1234"
    (staging / "files").mkdir(parents=True)
    (staging / "files" / "half").write_bytes(b"partial")
    assert cli.main(["restore", "--store", str(store), "--cache-dir", str(target)]) == 0
    assert not staging.exists()
    assert (target / "ab" / f"{KERNEL}.main.so").read_bytes() == b"kernel"


def test_save_carries_what_a_fresh_gpu_runner_would_rebuild(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """issue 27.6: triton's cache entries (kernels, cuda_utils.so) and torch's local autotune results."""
    store, cache = tmp_path / "store", _cache_dir(tmp_path)
    entry = cache / "triton" / "VKVKVKVKVKVKVKVKVKVKVKVKVKVKVKVKVKVKVKVKVKVKVKVKVKVA"
    entry.mkdir(parents=True)
    (entry / "cuda_utils.cpython-311-x86_64-linux-gnu.so").write_bytes(b"\x7fELF helper")
    (entry / "__grp__k.json").write_text("{}")
    (entry / "lock").write_text("")
    (entry / "tmp.pid_7_0").write_text("half")
    (cache / "cache").mkdir()
    (cache / "cache" / AUTOTUNE).write_text('{"mm": {}}')
    assert cli.main(["save", "--store", str(store), "--cache-dir", str(cache), "--suffix", "1"]) == 0
    capsys.readouterr()
    (bundle_path,) = store.glob("*.bundle")
    assert cli.main(["inspect", str(bundle_path), "--json"]) == 0
    members = {m["path"] for m in json.loads(capsys.readouterr().out)["members"]}
    assert members == {
        f"files/ab/{KERNEL}.main.so",
        f"files/fxgraph/xy/{FX_KEY}/entry",
        f"files/triton/{entry.name}/cuda_utils.cpython-311-x86_64-linux-gnu.so",
        f"files/triton/{entry.name}/__grp__k.json",
        f"files/cache/{AUTOTUNE}",
    }
    target = tmp_path / "fresh-runner"
    assert cli.main(["restore", "--store", str(store), "--cache-dir", str(target)]) == 0
    helper = target / "triton" / entry.name / "cuda_utils.cpython-311-x86_64-linux-gnu.so"
    assert helper.read_bytes() == b"\x7fELF helper"
    assert (target / "cache" / AUTOTUNE).read_text() == '{"mm": {}}'


def test_save_carries_only_torchs_and_tritons_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A user's files, torch's locks and temp files and the plugin's own names stay out of a bundle (a restore
    would refuse ours); torch's own triton layout (``triton/<device>/<key>/``) is carried; a dir with none of
    torch's files saves nothing (an empty bundle would be restored as one, and its save prune the useful ones)."""
    store, cache = tmp_path / "store", _cache_dir(tmp_path)
    others = {
        "cache/my_data.bin": b"user", "db/libfoo.so": b"user", ".compilecache-pending/blob.so": b"ours",
        f"fxgraph/xy/{FX_KEY}/.1234.5678.tmp": b"half", f"fxgraph/xy/{FX_KEY}/foo.lock": b"", "ab/notes.so": b"user",
    }  # fmt: skip
    device_layout = f"triton/0/{'Q' * 52}/k.cubin"
    for rel, data in {**others, device_layout: b"cubin"}.items():
        (cache / rel).parent.mkdir(parents=True, exist_ok=True)
        (cache / rel).write_bytes(data)
    assert cli.main(["save", "--store", str(store), "--cache-dir", str(cache), "--suffix", "1"]) == 0
    capsys.readouterr()
    (bundle_path,) = store.glob("*.bundle")
    assert cli.main(["inspect", str(bundle_path), "--json"]) == 0
    members = {m["path"] for m in json.loads(capsys.readouterr().out)["members"]}
    assert members == {f"files/ab/{KERNEL}.main.so", f"files/fxgraph/xy/{FX_KEY}/entry", f"files/{device_layout}"}

    foreign = tmp_path / "project"
    for rel, data in others.items():
        (foreign / rel).parent.mkdir(parents=True, exist_ok=True)
        (foreign / rel).write_bytes(data)
    assert cli.main(["save", "--store", str(tmp_path / "other"), "--cache-dir", str(foreign), "--suffix", "1"]) == 0
    assert "save: skipped:" in capsys.readouterr().out and not (tmp_path / "other").exists()


def test_prune_takes_only_whole_key_parts_and_only_bundles(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``prune`` deletes only what it can prove is ours: bundles (by their first bytes) made with the key prefix
    it is given (not a longer one's, as ``proj-gpu`` is to ``proj``), or under the lineage it is given; never
    every project's at once, never a link."""
    store = tmp_path / "store"
    store.mkdir()
    a, b = "a" * 16, "b" * 16
    names = [f"projA-{a}-1", f"projA-{a}-2", f"projA-{a}-3", f"projAB-{b}-1", f"projA-gpu-{a}-1", f"projA-gpu-{b}-2"]
    for age, name in enumerate(reversed(names)):  # the last the newest
        (store / f"{name}.bundle").write_bytes(bundle.MAGIC + b" the rest of a bundle")
        os.utime(store / f"{name}.bundle", (1_700_000_000 - age, 1_700_000_000 - age))
    (store / f"projA-{a}-0.bundle").write_bytes(b"# v2 git bundle\n")  # oldest, named like one, not ours
    os.utime(store / f"projA-{a}-0.bundle", (1_600_000_000, 1_600_000_000))
    elsewhere = tmp_path / "elsewhere.bundle"
    elsewhere.write_bytes(bundle.MAGIC + b" not in the store")
    (store / f"projA-{a}-9.bundle").symlink_to(elsewhere)  # its target the newest: it must take no keep slot
    (store / f"projA-{a}-8.bundle").write_bytes(b"junk")  # the newest object: not a bundle, so it takes no keep slot

    assert cli.main(["prune", "--store", str(store), "--prefix", "", "--keep", "1"]) == cli.EXIT_USAGE
    assert "error: prune: the prefix must not be empty" in capsys.readouterr().err

    assert cli.main(["prune", "--store", str(store), "--prefix", "projA", "--keep", "1"]) == 0
    left = sorted(p.name.removesuffix(".bundle") for p in store.iterdir())
    kept = [f"projA-gpu-{a}-1", f"projA-gpu-{b}-2", f"projA-{a}-0", f"projA-{a}-3", f"projA-{a}-8", f"projA-{a}-9"]
    kept.append(f"projAB-{b}-1")
    assert left == sorted(kept)
    assert "deleted 2" in capsys.readouterr().out
    assert elsewhere.exists()

    assert cli.main(["prune", "--store", str(store), "--prefix", "projA-gpu", "--keep", "1"]) == 0  # its own, two
    assert not (store / f"projA-gpu-{a}-1.bundle").exists() and (store / f"projA-gpu-{b}-2.bundle").exists()


def test_save_leaves_out_a_linked_dir_and_saves_the_rest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A link to a dir elsewhere (a user's library dir) is not the cache's: what it leads to is never listed,
    and it does not make the whole save fail."""
    store, cache = tmp_path / "store", _cache_dir(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "libsecret.so").write_bytes(b"not ours")
    (cache / "zz").symlink_to(outside)
    assert cli.main(["save", "--store", str(store), "--cache-dir", str(cache), "--suffix", "1"]) == 0
    (path,) = store.glob("*.bundle")
    capsys.readouterr()
    assert cli.main(["inspect", str(path), "--json"]) == 0
    members = {m["path"] for m in json.loads(capsys.readouterr().out)["members"]}
    assert members == {f"files/ab/{KERNEL}.main.so", f"files/fxgraph/xy/{FX_KEY}/entry"}


def test_the_key_prefix_is_the_plugins_own(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, device_file: Path
) -> None:
    # key, restore and save read PYTEST_COMPILECACHE_KEY_PREFIX as the plugin does (settings.OPTIONS): an empty
    # variable is unset, spaces are trimmed, 1-200 characters; else the keys a CLI step saves under were never
    # the keys the plugin's sessions look up.
    key = ["key", "--suffix", "s", "--device-facts", str(device_file)]
    for value, prefix in (("", "compilecache-v1-"), (" proj ", "proj-")):
        monkeypatch.setenv("PYTEST_COMPILECACHE_KEY_PREFIX", value)
        assert cli.main(key) == 0
        assert f"key={prefix}" in capsys.readouterr().out, value
    monkeypatch.setenv("PYTEST_COMPILECACHE_KEY_PREFIX", "a" * 201)
    assert cli.main(key) == cli.EXIT_USAGE
    assert capsys.readouterr().err.startswith("error: PYTEST_COMPILECACHE_KEY_PREFIX: use 1-200 characters")
    assert cli.main([*key, "--prefix", ""]) == cli.EXIT_USAGE  # the flag wins, and an empty one is no prefix
    assert capsys.readouterr().err.startswith("error: --prefix: use 1-200 characters")


def test_verify_takes_the_size_limit_save_and_restore_take(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, cache = tmp_path / "store", _cache_dir(tmp_path)
    assert cli.main(["save", "--store", str(store), "--cache-dir", str(cache), "--suffix", "1"]) == 0
    (path,) = store.glob("*.bundle")
    assert cli.main(["verify", str(path)]) == 0
    assert cli.main(["verify", str(path), "--max-bundle-size", "10"]) == cli.EXIT_FAILED
    assert "more than the limit of 10 bytes" in capsys.readouterr().out
    monkeypatch.setenv("PYTEST_COMPILECACHE_MAX_BUNDLE_SIZE", "10")
    assert cli.main(["verify", str(path)]) == cli.EXIT_FAILED
    assert cli.main(["verify", str(path), "--max-bundle-size", "1M"]) == 0  # the flag wins


def test_save_says_when_its_cache_dir_is_not_there(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = tmp_path / "store"
    assert cli.main(["save", "--store", str(store), "--cache-dir", str(tmp_path / "typo"), "--strict"]) == 0
    assert f"save: skipped: --cache-dir {tmp_path / 'typo'} is not a directory" in capsys.readouterr().out
    assert not store.exists() or not any(store.iterdir())


def test_device_facts_nested_past_the_parser_are_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000)
    assert cli.main(["fingerprint", "--device-facts", str(deep)]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("error: --device-facts: cannot read ") and err.count("\n") == 1, err


def test_report_as_text_into_the_step_summary_is_inert(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # --text is the terminal's report, made of test ids and warnings: in the summary it is one fenced block
    # that none of it can close, so no HTML, link, image or heading of theirs is rendered.
    hostile = "<img src=https://e.example/x.png> [a](https://e.example) ## h\n```` `` ~~~"
    record = {"nodeid": f"t.py::test[{hostile}]", "fxgraph": {"hit": 0, "miss": 1, "bypass": 0}, "frames": 1}
    data = {"version": 1, "mode": "shared", "cache_dir": hostile, "totals": {"tests": 1}, "tests": [record]}
    path = tmp_path / "report.json"
    path.write_text(json.dumps(data))
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    assert cli.main(["report", str(path), "--text", "--summary"]) == 0
    lines = summary.read_text().splitlines()
    fence = lines[0].removesuffix("text")
    assert set(fence) == {"`"} and len(fence) == 5 and lines[-1] == fence  # longer than the text's ```` run
    inside = lines[1:-1]
    assert not any(line.lstrip().startswith("`" * 5) for line in inside)
    assert any("<img src=" in line for line in inside)  # shown as written, inside the block


def test_usage_errors_name_the_flag_as_typed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each message names what the user typed: the CLI's flag, not the plugin's, nor an internal name."""
    store, cache = str(tmp_path / "store"), str(tmp_path / "cache")
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    for argv, words in [
        (["restore", "--store", store, "--cache-dir", cache, "--key", "bad key"], "--key: invalid cache key"),
        (["key", "--suffix", "a b"], "--suffix: invalid cache key"),
        (["prune", "--store", store, "--prefix", "  "], "--prefix: invalid cache key prefix"),
        (["restore", "--store", store, "--cache-dir", str(a_file)], f"--cache-dir: {a_file} is not a writable"),
        (["restore", "--store", store, "--cache-dir", store], f"--store: '{store}' is the cache dir {store}"),
        (["save", "--store", f"{cache}/s", "--cache-dir", cache], f"--store: '{cache}/s' lies in the cache dir"),
        (["restore", "--store", cache, "--cache-dir", f"{cache}/c"], f"--store: '{cache}' holds the cache dir"),
    ]:
        assert cli.main(argv) == cli.EXIT_USAGE, argv
        assert capsys.readouterr().err.startswith(f"error: {words}"), argv
    assert not (tmp_path / "store").exists() and not (tmp_path / "cache").exists()  # nothing was done
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["save", "--store", store, "--cache-dir", cache, "--keep", "abc"])
    assert exit_info.value.code == cli.EXIT_USAGE
    assert "argument --keep: not a whole number: 'abc'" in capsys.readouterr().err
    monkeypatch.setenv("PYTEST_COMPILECACHE_SIGNING_KEY", "key\udcff")  # a byte that is not UTF-8
    assert cli.main(["verify", str(a_file)]) == cli.EXIT_USAGE
    assert capsys.readouterr().err == "error: PYTEST_COMPILECACHE_SIGNING_KEY: not valid UTF-8\n"


def test_the_size_limit_is_named_as_the_cli_takes_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store, cache = tmp_path / "store", _cache_dir(tmp_path)
    assert cli.main(["save", "--store", str(store), "--cache-dir", str(cache), "--suffix", "1"]) == 0
    (path,) = store.glob("*.bundle")
    capsys.readouterr()
    assert cli.main(["verify", str(path), "--max-bundle-size", "10"]) == cli.EXIT_FAILED
    assert capsys.readouterr().out.endswith("more than the limit of 10 bytes (--max-bundle-size)\n")
    target = tmp_path / "restored"
    assert cli.main(["restore", "--store", str(store), "--cache-dir", str(target), "--max-bundle-size", "10"]) == 0
    err = capsys.readouterr().err
    assert "more than the limit of 10 bytes" in err and "--compile-cache-" not in err


def test_runner_files_are_checked_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--github-output without GITHUB_OUTPUT wrote nothing and said nothing; one that cannot be written failed after
    the restore had filled the cache dir (exit 1). Both are usage errors now, before any work."""
    store, cache = tmp_path / "store", _cache_dir(tmp_path)
    assert cli.main(["save", "--store", str(store), "--cache-dir", str(cache), "--suffix", "1"]) == 0
    target = tmp_path / "restored"
    restore = ["restore", "--store", str(store), "--cache-dir", str(target), "--github-output"]
    monkeypatch.delenv("GITHUB_OUTPUT", raising=False)
    capsys.readouterr()
    assert cli.main(restore) == cli.EXIT_USAGE
    assert capsys.readouterr().err.startswith("error: --github-output: GITHUB_OUTPUT is not set")
    monkeypatch.setenv("GITHUB_OUTPUT", str(tmp_path / "a-dir-that-is-not-there" / "out"))
    assert cli.main(restore) == cli.EXIT_USAGE
    assert "error: --github-output: cannot append to GITHUB_OUTPUT" in capsys.readouterr().err
    assert not target.exists()  # nothing restored
    monkeypatch.setenv("GITHUB_OUTPUT", str(tmp_path / "out"))
    assert cli.main(restore) == 0 and (tmp_path / "out").read_text().startswith("restore-outcome=partial")
    report_file = tmp_path / "report.json"
    report_file.write_text(json.dumps({"version": 1, "totals": {}, "tests": []}))
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path / "no-dir" / "summary"))
    assert cli.main(["report", str(report_file), "--summary"]) == cli.EXIT_USAGE
    assert "error: --summary: cannot append to GITHUB_STEP_SUMMARY" in capsys.readouterr().err
