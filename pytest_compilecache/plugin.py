"""pytest hooks: options, early environment set-up, per-test capture, reports. Thin by design.

The work lives in :mod:`session` (what one pytest process does) and below. Nothing here imports torch:
a session that never imports torch pays only for option parsing and a few dict operations per test.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from typing import Generator

import pytest

from . import ConfigError
from . import probe
from .cachedir import SESSION_ENV
from .cachedir import SessionDir
from .settings import OPTIONS
from .settings import Settings
from .settings import resolve

_SESSION = pytest.StashKey["Any"]()
_MARK = pytest.StashKey["Any"]()

MARKER = "compile_cache"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("compilecache", "torch.compile caches (pytest-compilecache)")
    for option in OPTIONS:
        dest = "compile_cache_" + option.name
        text = f"{option.help} [ini: {option.ini}, env: {option.env}]"
        if option.flag:
            group.addoption(option.cli, action="store_true", default=None, dest=dest, help=text)
        else:
            group.addoption(option.cli, default=None, dest=dest, metavar="VALUE", help=text)
        parser.addini(option.ini, help=option.help, default=None)


def _settings(config: pytest.Config) -> Settings:
    namespace = getattr(config, "known_args_namespace", config.option)

    def cli(name: str) -> Any:
        return getattr(namespace, "compile_cache_" + name, None)

    def ini(key: str) -> Any:
        try:
            return config.getini(key)
        except ValueError:
            return None

    try:
        return resolve({o.name: cli(o.name) for o in OPTIONS}, ini)
    except ConfigError as exc:
        raise pytest.UsageError(str(exc)) from None


def _start(config: pytest.Config) -> Any:
    """Decide the cache dir and export it, once per process, before anything imports torch."""
    if _SESSION in config.stash:
        return config.stash[_SESSION]
    from .session import CompileCacheSession

    settings = _settings(config)
    inherited = _inherited()
    try:
        session = CompileCacheSession.start(settings, _default_shared(config), inherited=inherited)
    except ConfigError as exc:
        raise pytest.UsageError(str(exc)) from None
    config.stash[_SESSION] = session
    return session


def _inherited() -> str | None:
    """The controller's decision, when this process is one of its xdist workers (a direct child).

    A pytest started by a test inside a worker also sees PYTEST_XDIST_WORKER, but is not a child of
    the controller: it makes its own decision.
    """
    value = os.environ.get(SESSION_ENV)
    if not value or not os.environ.get("PYTEST_XDIST_WORKER"):
        return None
    return value if SessionDir.parent_pid(value) == os.getppid() else None


def _default_shared(config: pytest.Config) -> Path:
    """Inside pytest's own cache dir, so --cache-clear and its .gitignore apply."""
    try:
        cache_dir = config.getini("cache_dir") or ".pytest_cache"
    except ValueError:
        cache_dir = ".pytest_cache"
    base = Path(os.path.expandvars(os.path.expanduser(str(cache_dir))))  # as pytest's resolve_from_str
    if not base.is_absolute():
        base = config.rootpath / base
    return base / "d" / "compilecache"


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    _start(early_config)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    if _inherited() is not None:
        # The controller already honoured --cache-clear; a worker clearing .pytest_cache/d again would
        # delete the restored shared dir, possibly while another worker compiles into it.
        config.option.cacheclear = False
    config.addinivalue_line(
        "markers",
        f"{MARKER}(mode): 'isolated' compiles this test cold in its own fresh cache dir; 'disabled' turns "
        "torch's compile caches off for it. Everything is put back afterwards.",
    )
    session = _start(config)
    session.is_worker = hasattr(config, "workerinput")


def pytest_unconfigure(config: pytest.Config) -> None:
    session = config.stash.get(_SESSION, None)
    if session is not None:
        session.close()


def pytest_report_header(config: pytest.Config) -> str | None:
    session = config.stash.get(_SESSION, None)
    return session.header() if session is not None else None


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """Restore a bundle before the first compile and before xdist starts its workers."""
    state = session.config.stash[_SESSION]
    # --cache-clear (pytest's cacheprovider, in pytest_configure) may have removed a shared dir under
    # .pytest_cache since load_initial_conftests: make it again. Racing workers are fine (atomic).
    state.ensure_dir()
    if not state.is_worker:
        state.restore()


# ---- per-test capture
# One wrapper around the whole protocol (setup, call, teardown) keeps the per-test cost to a few
# microseconds while torch is not loaded; records travel to the controller at session end.


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, Any, Any]:
    state = item.config.stash[_SESSION]
    mode = state.marked.get(item.nodeid) if state.marked else None
    isolation = probe.isolated_compile(disable=mode == "disabled") if mode else None
    start = item.stash[_MARK] = probe.mark()
    try:
        if isolation is not None:
            isolation.__enter__()
        return (yield)
    finally:
        if isolation is not None:
            isolation.__exit__(None, None, None)
        state.record(item.nodeid, probe.delta(start))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Find marked tests once, so that the per-test path is a dict lookup.

    A marker with a bad mode becomes that test's setup error (through a fixture), not a crash: under
    xdist a collection-time exception in a worker would be an INTERNALERROR.
    """
    memo: dict[int, Any] = {}
    marked = {}
    for item in items:
        mark = _closest_marker(item, memo)
        if mark is None:
            continue
        mode = mark.args[0] if mark.args else mark.kwargs.get("mode", "isolated")
        if mode in ("isolated", "disabled"):
            marked[item.nodeid] = mode
        elif _BAD_MARKER not in getattr(item, "fixturenames", [_BAD_MARKER]):
            item.fixturenames.insert(0, _BAD_MARKER)  # type: ignore[attr-defined]
    config.stash[_SESSION].marked = marked


_BAD_MARKER = "_compile_cache_bad_marker"


@pytest.fixture(name=_BAD_MARKER)
def _bad_marker(request: pytest.FixtureRequest) -> None:
    mark = request.node.get_closest_marker(MARKER)
    mode = (mark.args[0] if mark.args else mark.kwargs.get("mode")) if mark else None
    raise ValueError(f"@pytest.mark.{MARKER}: mode must be 'isolated' or 'disabled', got {mode!r}")


def _closest_marker(node: Any, memo: dict[int, Any]) -> Any:
    """``node.get_closest_marker(MARKER)``, memoised per parent: a few times cheaper over a big suite."""
    for mark in node.own_markers:
        if mark.name == MARKER:
            return mark
    parent = node.parent
    if parent is None:
        return None
    key = id(parent)
    if key not in memo:
        memo[key] = _closest_marker(parent, memo)
    return memo[key]


@pytest.fixture
def compile_cache_stats(request: pytest.FixtureRequest) -> Any:
    """The current test's compile record, live: ``compile_cache_stats.fxgraph["miss"] == 0``."""
    from .session import LiveRecord

    item = request.node
    return LiveRecord(item.nodeid, item.stash.get(_MARK, None))


# ---- xdist (optional)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    output = getattr(node, "workeroutput", {}) or {}
    worker = output.get("workerid") or getattr(getattr(node, "gateway", None), "id", "?")
    node.config.stash[_SESSION].add_worker_output(worker, output.get("compilecache"))


# ---- session end


def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    state = config.stash[_SESSION]
    if hasattr(config, "workerinput"):
        config.workeroutput["compilecache"] = state.worker_output()  # type: ignore[attr-defined]
        return
    failed = state.finish(verbose=config.option.verbose > 0)
    if failed and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    state = config.stash.get(_SESSION, None)
    if state is None or hasattr(config, "workerinput"):
        return
    lines = state.terminal_lines(verbose=config.option.verbose > 0)
    if not lines:
        return
    terminalreporter.write_sep("-", "compile cache")
    for line, markup in lines:
        terminalreporter.write_line(line, **markup)
