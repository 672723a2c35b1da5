"""pytest hooks: options, early environment set-up, the marker, per-test capture. Thin by design.

The first hook that runs (``pytest_load_initial_conftests``, before any conftest can import torch)
makes the :class:`~pytest_compilecache.session.Setup`; ``pytest_configure`` then chooses the process's
role once - a :class:`~pytest_compilecache.session.Controller` (a plain session or the xdist controller)
or a :class:`~pytest_compilecache.session.Worker` - and every later hook only delegates to it. Printing
happens here and nowhere else. Nothing here imports torch: a session that never imports torch pays for
option parsing and a few dict operations per test.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any
from typing import Generator

import pytest

from . import ConfigError
from . import cachedir
from . import probe
from .cachedir import SESSION_ENV
from .cachedir import SessionDir
from .ghrunner import in_github_actions
from .ghrunner import resume_lines
from .ghrunner import stop_tokens
from .ghrunner import write_command
from .problems import Problems
from .problems import filter_classifier
from .session import Controller
from .session import Recorder
from .session import Setup
from .session import Worker
from .settings import OPTIONS
from .settings import Settings
from .settings import resolve

if TYPE_CHECKING:
    from .session import Start
    from .stats import CompileCacheStats

_SETUP = pytest.StashKey["Setup"]()
# The role chosen in pytest_configure: exactly one of these two is set in a process.
_CONTROLLER = pytest.StashKey["Controller"]()
_WORKER = pytest.StashKey["Worker"]()
_TESTS = pytest.StashKey["_Tests"]()
_RUNNER_OUTPUT = pytest.StashKey["_RunnerOutput"]()

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


def _setup(config: pytest.Config) -> Setup:
    """Decide the cache dir and export it, once per process, before anything imports torch."""
    if _SETUP in config.stash:
        return config.stash[_SETUP]

    settings = _settings(config)
    problems = Problems(strict=settings.strict, classify=filter_classifier(*_warning_filters(config)))
    try:
        setup = Setup.start(settings, _default_shared(config), inherited=_inherited(), problems=problems)
    except ConfigError as exc:
        raise pytest.UsageError(str(exc)) from None
    config.stash[_SETUP] = setup
    return setup


def _warning_filters(config: pytest.Config) -> tuple[list[str], list[str]]:
    """pytest's ``filterwarnings`` (ini) and ``-W`` values, which our CompileCacheWarning obeys."""
    try:
        ini = [str(line) for line in config.getini("filterwarnings")]
    except ValueError:
        ini = []
    namespace = getattr(config, "known_args_namespace", config.option)
    return ini, list(getattr(namespace, "pythonwarnings", None) or [])


def _inherited() -> str | None:
    """The controller's cache-dir decision, when this process is one of its xdist workers (a direct child).

    Needed in the first hook, before xdist sets ``config.workerinput`` (which decides the *role* later).
    A pytest started by a test inside a worker also sees PYTEST_XDIST_WORKER, but is not a child of the
    controller: it makes its own decision.
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


def _keep_a_shared_dir_in_use(config: pytest.Config, setup: Setup) -> None:
    """``--cache-clear`` removes pytest's cache dir, and the default shared dir inside it. While another
    session uses that dir, keep it: clear the rest of pytest's cache here (its ``v/`` and ``d/`` entries,
    what ``Cache.clear_cache`` removes), tell pytest not to, and say so. Runs before pytest's cache
    provider reads the option (both hooks are ``tryfirst``; plugins registered later run first)."""
    path = setup.dir.path
    if setup.dir.mode != "shared" or not path or Path(path) != _default_shared(config):
        return
    own = setup.registration.marker if setup.registration is not None else None
    others = len(cachedir.live_sessions(path, excluding=own))
    if not others:
        return
    from ._fs import rmtree_at

    base = Path(path).parent.parent  # <cache_dir>/d/compilecache
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    for prefix in ("v", "d"):  # what pytest's Cache.clear_cache removes; a link is left alone, as pytest does
        try:
            fd = os.open(base / prefix, flags)
        except OSError:
            continue
        try:
            for name in os.listdir(fd):
                if prefix == "d" and name == Path(path).name:
                    continue
                try:  # best effort, as pytest's own clearing: another process may be clearing too
                    if stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                        rmtree_at(fd, name)
                    else:
                        os.unlink(name, dir_fd=fd)
                except OSError:
                    pass
        finally:
            os.close(fd)
    config.option.cacheclear = False
    who = "session is" if others == 1 else "sessions are"
    setup.problems.warn(
        f"--cache-clear kept the compile cache {path}: {others} other pytest {who} using it "
        "(the rest of pytest's cache was cleared)"
    )


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    setup = _setup(early_config)
    # pytest_unconfigure never runs when pytest stops before configure (an unknown option, a broken
    # conftest, -VV); its cleanup stack always does: the environment and the registration go back then too.
    early_config.add_cleanup(setup.close)


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
    setup = _setup(config)
    if not _is_worker(config) and getattr(config.option, "cacheclear", False):
        _keep_a_shared_dir_in_use(config, setup)
    explain = setup.settings.explain  # a worker resolves the same options: its controller's argv and environment
    if explain:
        probe.watch_graph_lookups()  # every process: the FX-graph lookups that explain a miss (never imports torch)
    probe.watch_precompiled_headers()  # every process: check each header torch looks up, remember it (issue 24)
    if setup.redis_on:
        probe.guard_remote_cache()  # every process: a Redis error is a warning, not a failed compile
    if _is_worker(config):
        recorder = Recorder(os.environ.get("PYTEST_XDIST_WORKER", "worker"), explain)
        config.stash[_WORKER] = Worker(setup, recorder)
    else:
        recorder = Recorder("controller", explain)
        config.stash[_CONTROLLER] = Controller(setup, recorder)
        if in_github_actions():
            watcher = config.stash[_RUNNER_OUTPUT] = _RunnerOutput()
            config.pluginmanager.register(watcher, "compilecache-runner-output")
    tests = config.stash[_TESTS] = _Tests(recorder)
    config.pluginmanager.register(tests, "compilecache-tests")


def pytest_unconfigure(config: pytest.Config) -> None:
    setup = config.stash.get(_SETUP, None)
    if setup is not None:
        setup.close()


def pytest_report_header(config: pytest.Config) -> str | None:
    setup = config.stash.get(_SETUP, None)
    return setup.header() if setup is not None else None


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """Restore a bundle before the first compile and before xdist starts its workers."""
    _role(session.config).session_start()


def _role(config: pytest.Config) -> Controller | Worker:
    controller = config.stash.get(_CONTROLLER, None)
    return controller if controller is not None else config.stash[_WORKER]


# ---- per-test capture
# One wrapper around the whole protocol (setup, call, teardown), on a small object registered per process
# so that the path every test takes reads attributes, not stashes. While torch is not imported that path
# is a few attribute reads and one counter (Recorder.start / finish_cold); records travel to the
# controller at session end.


class _Tests:
    """This process's per-test hook: the recorder, the marked tests and the running test's start."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self.marked: dict[str, str] = {}  # node id -> "isolated" / "disabled" (pytest_collection_modifyitems)
        self.current: Start | None = None  # the running test's start, for the compile_cache_stats fixture

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, Any, Any]:
        recorder = self.recorder
        mode = self.marked.get(item.nodeid) if self.marked else None
        isolation = probe.isolated_compile(disable=mode == "disabled") if mode else None
        start = self.current = recorder.start()
        try:
            if isolation is not None:
                isolation.__enter__()
            return (yield)
        finally:
            if isolation is not None:
                isolation.__exit__(None, None, None)
            if mode is not None or not recorder.finish_cold(start):
                recorder.finish(item.nodeid, start, intended=mode is not None)


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
    config.stash[_TESTS].marked = marked


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
def compile_cache_stats(request: pytest.FixtureRequest) -> CompileCacheStats:
    """The current test's compile record, live: ``compile_cache_stats.fxgraph["miss"] == 0``.

    ``.graphs`` lists its FX-graph lookups and ``.why`` why each miss so far missed (against the restored
    bundle's or the previous session's record): ``assert compile_cache_stats.misses == 0, compile_cache_stats.why``.
    """
    item, tests = request.node, request.config.stash[_TESTS]
    return tests.recorder.live(item.nodeid, tests.current, item.nodeid in tests.marked)


# ---- xdist (optional)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    output = getattr(node, "workeroutput", {}) or {}
    worker = output.get("workerid") or getattr(getattr(node, "gateway", None), "id", "?")
    node.config.stash[_CONTROLLER].add_worker(worker, output.get("compilecache"))


# ---- session end


def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    worker = config.stash.get(_WORKER, None)
    if worker is not None:
        config.workeroutput["compilecache"] = worker.output()  # type: ignore[attr-defined]
        return
    if config.stash[_CONTROLLER].finish() and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    controller = config.stash.get(_CONTROLLER, None)
    if controller is None:
        return
    lines = controller.terminal_lines(verbose=config.option.verbose > 0)
    if lines:
        terminalreporter.write_sep("-", "compile cache")
        for line, markup in lines:
            terminalreporter.write_line(line, **markup)
    _github_commands(controller, config.stash.get(_RUNNER_OUTPUT, None))


class _RunnerOutput:
    """Inside a GitHub Actions job (controller only): the ``stop-commands`` tokens in what pytest prints
    before the plugins' summaries (each test's captured output and failure text, collection errors,
    warnings; under xdist the workers' reports and warnings arrive here too). A failing test that printed
    ``::stop-commands::T`` would otherwise turn every annotation after it into plain text. Output written
    live (``-s``, live logs) is not seen."""

    def __init__(self) -> None:
        self.tokens: list[str] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self._scan(report)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        self._scan(report)

    def pytest_warning_recorded(self, warning_message: Any) -> None:
        self._add(str(warning_message.message))  # the warnings summary comes before ours too

    def _scan(self, report: pytest.TestReport | pytest.CollectReport) -> None:
        for _, content in report.sections:
            self._add(content)
        if report.longrepr is not None:
            self._add(report.longreprtext)

    def _add(self, text: str) -> None:
        self.tokens += [token for token in stop_tokens(text) if token not in self.tokens]


def _github_commands(role: Controller, output: _RunnerOutput | None = None) -> None:
    """Inside a GitHub Actions job, each warning and error also becomes an annotation (escaped), after a
    line that resumes the runner's command processing if a test's output stopped it (``ghrunner.stop_tokens``)."""
    if not in_github_actions() or not (role.problems.warnings or role.problems.errors):
        return
    if output is not None and output.tokens:
        sys.stdout.write("".join(line + "\n" for line in resume_lines(output.tokens)))
    for message in role.problems.warnings:
        if message in role.problems.errors:
            continue  # one annotation per problem: the error below
        write_command(sys.stdout, "warning", message, title="compile cache")
    for message in role.problems.errors:
        write_command(sys.stdout, "error", message, title="compile cache")
