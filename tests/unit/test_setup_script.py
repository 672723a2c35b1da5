"""scripts/setup.sh: torch's CPU build from PyTorch's CPU index by default, a bounded fallback to pip's configured
index where that index does not answer, and a line saying which build it installed.

The venv is real (``python -m venv --without-pip``); its ``pip`` is a small fake module that records every
call and, for ``torch==V``, writes the dist-info a real install would: ``V+cpu`` from an ``--index-url`` (the
CPU index), else PyPI's default build (``V`` and an ``nvidia-*`` package). The index is a local HTTP server, or
a socket that accepts and never answers (a blackholed index).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from http.server import HTTPServer
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

FAKE_PIP = """\
import json, os, pathlib, sys, sysconfig
args = sys.argv[1:]
with open(os.environ["FAKE_PIP_LOG"], "a") as log:
    log.write(json.dumps(args) + "\\n")
site = pathlib.Path(sysconfig.get_paths()["purelib"])
def dist(name, version):
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\\nName: {name}\\nVersion: {version}\\n")
for arg in args:
    if arg.startswith("torch=="):
        version = arg.split("==", 1)[1]
        if "--index-url" in args:
            dist("torch", version + "+cpu")
        else:
            dist("torch", version)
            dist("nvidia-cublas-cu12", "12.6.4.1")
"""


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    venv = tmp_path_factory.mktemp("template") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = next((venv / "lib").glob("python*/site-packages"))
    (site / "pip").mkdir()
    (site / "pip" / "__init__.py").write_text("")
    (site / "pip" / "__main__.py").write_text(FAKE_PIP)
    return venv


@pytest.fixture
def venv(template: Path, tmp_path: Path) -> Path:
    import shutil

    target = tmp_path / "venv"
    shutil.copytree(template, target, symlinks=True)
    return target


def setup_sh(venv: Path, tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], list[list[str]], float]:
    log = tmp_path / "pip.jsonl"
    environ = {k: v for k, v in os.environ.items() if k not in ("TORCH", "TORCH_INDEX", "VENV", "PYTHONPATH")}
    environ.update(VENV=str(venv), FAKE_PIP_LOG=str(log), **env)
    started = time.monotonic()
    result = subprocess.run(
        ["bash", str(REPO / "scripts" / "setup.sh"), "--no-project"],
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return result, calls, time.monotonic() - started


class _Index(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.send_response(200 if self.path == "/whl/cpu/torch/" else 404)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def index() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), _Index)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/whl/cpu"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def blackhole() -> Iterator[str]:
    """An index that accepts connections and never answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/whl/cpu"


def torch_install(calls: list[list[str]]) -> list[str]:
    (call,) = [call for call in calls if any(arg.startswith("torch==") for arg in call)]
    return call


def test_the_default_is_the_cpu_index(venv: Path, tmp_path: Path, index: str) -> None:
    result, calls, _ = setup_sh(venv, tmp_path, TORCH_INDEX=index)
    assert result.returncode == 0, result.stderr
    install = torch_install(calls)
    assert install[install.index("--index-url") + 1] == index and "torch==2.13.0" in install
    assert f"setup.sh: torch 2.13.0+cpu (CPU build) from {index}" in result.stdout
    script = (REPO / "scripts" / "setup.sh").read_text()
    assert "CPU_INDEX=https://download.pytorch.org/whl/cpu" in script
    assert "TORCH_INDEX=${TORCH_INDEX:-$CPU_INDEX}" in script


def test_an_index_that_does_not_answer_falls_back_quickly_and_says_so(
    venv: Path, tmp_path: Path, blackhole: str
) -> None:
    result, calls, seconds = setup_sh(venv, tmp_path, TORCH_INDEX=blackhole, PROBE_SECONDS="1")
    assert result.returncode == 0, result.stderr
    assert seconds < 10, seconds  # the probe gives up after PROBE_SECONDS (+1 s hard limit), not pip's minutes
    assert f"{blackhole} did not answer within 1 s: torch comes from pip's configured index" in result.stderr
    assert "--index-url" not in torch_install(calls)
    assert "setup.sh: torch 2.13.0 (CUDA build) from pip's configured index" in result.stdout


def test_pypi_skips_the_probe_and_another_version_is_pinned(venv: Path, tmp_path: Path) -> None:
    result, calls, _ = setup_sh(venv, tmp_path, TORCH_INDEX="pypi", TORCH="2.15.0")
    assert result.returncode == 0, result.stderr
    assert "did not answer" not in result.stderr
    assert "torch==2.15.0" in torch_install(calls) and "--index-url" not in torch_install(calls)
    assert "setup.sh: torch 2.15.0 (CUDA build) from pip's configured index" in result.stdout
    # The stamp: a second run with the same settings does nothing.
    again, calls_again, _ = setup_sh(venv, tmp_path, TORCH_INDEX="pypi", TORCH="2.15.0")
    assert again.returncode == 0 and len(calls_again) == len(calls)


def test_a_bad_index_is_refused_at_once(venv: Path, tmp_path: Path) -> None:
    result, calls, _ = setup_sh(venv, tmp_path, TORCH_INDEX="download.pytorch.org/whl/cpu")
    assert result.returncode == 2 and calls == []
    assert "TORCH_INDEX must be 'pypi' or an index URL" in result.stderr


def test_no_extras_accept_a_venv_set_up_with_extras(venv: Path, tmp_path: Path) -> None:
    """scripts/demo.sh (no extras) after scripts/test.sh (test,docs) reinstalls nothing; other changes do."""
    pyproject = (REPO / "pyproject.toml").read_text()
    cksum = subprocess.run(["cksum"], input=pyproject, capture_output=True, text=True, check=True).stdout.strip()
    stamp = venv / ".compilecache-setup"
    for extras, reinstalls in (("test,docs", False), ("--no-project", True)):
        stamp.write_text(f"torch=2.13.0 index=pypi extras={extras} pyproject={cksum}\n")
        environ = {k: v for k, v in os.environ.items() if k not in ("TORCH", "VENV", "PYTHONPATH")}
        log = tmp_path / f"pip-{extras}.jsonl"
        environ.update(VENV=str(venv), TORCH_INDEX="pypi", FAKE_PIP_LOG=str(log))
        result = subprocess.run(
            ["bash", str(REPO / "scripts" / "setup.sh")], env=environ, capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 0, result.stderr
        assert log.exists() is reinstalls, extras
