"""pytest hooks: options, early environment set-up, the marker, per-test capture. Thin by design.

The first hook that runs (``pytest_load_initial_conftests``, before any conftest can import torch)
resolves the settings and, when they ask for anything before the tests (a cache dir, a store, Redis, a
JSON report), makes the :class:`~pytest_compilecache.context.SessionContext`; ``pytest_configure`` then chooses the
process's role once - a :class:`~pytest_compilecache.session.Controller` (a plain session or the xdist
controller) or a :class:`~pytest_compilecache.session.Worker` - and every later hook only delegates to it.

What a session pays before torch appears is kept to a minimum, because most test suites that have the
plugin installed never import torch in most of their sessions:

* With no option given anywhere (command line, ini file, environment), this module loads only the option
  table (:mod:`options`): no settings, no recorder, no role, no directory touched.
* Until torch is imported (or a test is marked), each test costs one hook that adds one to a counter
  (:class:`_Counter`). When torch appears - an import hook sees it coming (:func:`when_imported`) - the
  counter hands over to the per-test capture (:class:`_Tests`), and in a session with no option the role is
  made at the end only if a test compiled.

Printing happens here and nowhere else. Nothing here imports torch. Loads lazily (inside the functions that
need them, so a session pays only for what it uses): ``.errors``, ``.settings``, ``.context``, ``.problems``,
``_pytest.config``, ``.cachedir``, ``.probe``, ``.ghrunner``, ``.recorder``, ``.session``, ``.report``.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any
from typing import Sequence

import pytest

from ._env import SIGNING_KEY_ENV
from ._env import put_back
from ._loader import load_plainly
from ._loader import when_imported
from .options import SESSION_ENV
from .options import TABLE
from .options import env_name
from .options import ini_name
from .options import ini_type

if TYPE_CHECKING:
    from .context import SessionContext
    from .ghrunner import StopTokenWatch
    from .problems import Classifier
    from .recorder import PerTestHooks
    from .recorder import Recorder
    from .session import Controller
    from .session import Worker
    from .settings import Settings
    from .stats import CompileCacheStats

_MODULES = sys.modules
# Stash keys (annotated, not subscripted: a subscripted generic costs at import in every session).
_SETTINGS: pytest.StashKey[Settings | None] = pytest.StashKey()
_SETUP: pytest.StashKey[SessionContext] = pytest.StashKey()
# The role chosen in pytest_configure (a quiet session's at the end, if a test compiled): one of these two.
_CONTROLLER: pytest.StashKey[Controller] = pytest.StashKey()
_WORKER: pytest.StashKey[Worker] = pytest.StashKey()
_RECORDER: pytest.StashKey[Recorder] = pytest.StashKey()
_COUNTER: pytest.StashKey[_Counter] = pytest.StashKey()
_TESTS: pytest.StashKey[PerTestHooks] = pytest.StashKey()
_RUNNER_OUTPUT: pytest.StashKey[StopTokenWatch] = pytest.StashKey()
_KEPT: pytest.StashKey[str] = pytest.StashKey()  # what --cache-clear kept in a session that asked for nothing
_PLAIN: pytest.StashKey[bool] = pytest.StashKey()
_DOWN: pytest.StashKey[set[int]] = pytest.StashKey()  # the xdist workers already merged (by id of their node)
_TORCH_BEFORE: pytest.StashKey[bool] = pytest.StashKey()  # torch was imported before this session's conftests
_ENV_READ: pytest.StashKey[dict[str, str | None]] = pytest.StashKey()  # our variables when _settings read them

MARKER = "compile_cache"


def _load_own_modules_plainly(config: pytest.Config) -> None:
    """Until ``config`` is cleaned up, this package's modules load as any library's do
    (:mod:`~pytest_compilecache._loader`). The entry point put the finder in place already; this takes it out
    at the session's cleanup, and puts it back for a later session in the same process."""
    if config.stash.get(_PLAIN, False):
        return
    config.stash[_PLAIN] = True
    config.add_cleanup(load_plainly())


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("compilecache", "torch.compile caches (pytest-compilecache)")
    for name, flag, switch, text in TABLE:
        described = f"{text} [ini: {ini_name(flag)}, env: {env_name(name)}]"
        kind: dict[str, Any] = {"action": "store_true"} if switch else {"metavar": "VALUE"}
        group.addoption(flag, default=None, dest="compile_cache_" + name, help=described, **kind)
        typed = ini_type(name, switch) if pytest.version_tuple >= (9, 2) else None  # a union: TOML's `true`, `0.9`
        parser.addini(ini_name(flag), help=text, type=typed, default=None)


def _settings(config: pytest.Config) -> Settings | None:
    """The options, resolved once per process (a bad value is a usage error naming it).

    None when no option is given anywhere (command line, ini file, environment): every default, and
    :mod:`settings` is not even loaded (:func:`_resolved` makes the default settings when they are needed).
    """
    if _SETTINGS in config.stash:
        return config.stash[_SETTINGS]
    namespace = getattr(config, "known_args_namespace", config.option)
    cli = {name: getattr(namespace, "compile_cache_" + name, None) for name, _, _, _ in TABLE}
    ini = {key: _ini(config, key) for key in (ini_name(flag) for _, flag, _, _ in TABLE)}
    read = config.stash[_ENV_READ] = {env_name(name): os.environ.get(env_name(name)) for name, _, _, _ in TABLE}
    asked = getattr(namespace, "help", False) or getattr(namespace, "version", False)  # a bad value hides no help
    if asked or (all(v is None for v in [*cli.values(), *ini.values()] if v != "") and not any(read.values())):
        config.stash[_SETTINGS] = None
        return None
    read[SIGNING_KEY_ENV] = os.environ.get(SIGNING_KEY_ENV)  # a session that may use it: its workers too
    _load_own_modules_plainly(config)
    from .errors import ConfigError
    from .settings import resolve

    try:
        settings = config.stash[_SETTINGS] = resolve(cli, ini.get, ini_base=str(config.rootpath))
    except ConfigError as exc:
        raise pytest.UsageError(str(exc)) from None
    return settings


def _ini(config: pytest.Config, key: str) -> Any:
    try:
        return config.getini(key)
    except ValueError:
        return None


def _resolved(config: pytest.Config) -> Settings:
    """The settings, the defaults made now if no option was given (:func:`_settings` returned None)."""
    settings = _settings(config)
    if settings is None:
        from .settings import resolve

        settings = config.stash[_SETTINGS] = resolve({}, lambda key: None, environ={})
    return settings


def _quiet(config: pytest.Config) -> bool:
    """No option asks for anything before the tests (:attr:`Settings.quiet`)."""
    settings = _settings(config)
    return settings is None or settings.quiet


def _setup(config: pytest.Config) -> SessionContext:
    """Decide the cache dir and export it, once per process, before anything imports torch."""
    if _SETUP in config.stash:
        return config.stash[_SETUP]
    from .context import SessionContext
    from .problems import Problems

    settings = _resolved(config)
    problems = Problems(strict=settings.strict, classify=warning_classifier(*_warning_filters(config)))
    from .errors import ConfigError

    try:
        setup = SessionContext.start(settings, _default_shared(config), inherited=_inherited(), problems=problems)
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


def warning_classifier(config_filters: Sequence[str], cmdline_filters: Sequence[str]) -> Classifier:
    """How pytest's warning filters (ini ``filterwarnings`` then ``-W``) treat a CompileCacheWarning."""
    from .problems import filter_classifier

    def apply() -> None:
        # pytest's own parsing (``module.Class`` categories as pytest resolves them); private, so guarded
        from _pytest.config import apply_warning_filters

        apply_warning_filters(list(config_filters), list(cmdline_filters))

    return filter_classifier(apply)


def _inherited() -> str | None:
    """The controller's cache-dir decision, when this process is one of its xdist workers (a direct child: a
    pytest a test in a worker starts sees PYTEST_XDIST_WORKER too). Read before xdist sets ``workerinput``."""
    value = os.environ.get(SESSION_ENV)
    if not value or not os.environ.get("PYTEST_XDIST_WORKER"):
        return None
    from .cachedir import SessionDir

    return value if SessionDir.parent_pid(value) == os.getppid() else None


def _default_shared(config: pytest.Config) -> Path:
    """Inside pytest's own cache dir (``cachedir.default_shared_dir``), so --cache-clear and its .gitignore apply."""
    from . import cachedir  # no cost: the session's start and --cache-clear's keeping, its callers, load it anyway

    try:
        cache_dir = config.getini("cache_dir")
    except ValueError:
        cache_dir = None
    return cachedir.default_shared_for(str(cache_dir or ".pytest_cache"), config.rootpath)


def _keep_a_shared_dir_in_use(config: pytest.Config, setup: SessionContext | None) -> None:
    """``--cache-clear`` removes pytest's cache dir and the default shared dir in it: while another session uses
    it, keep it (``cachedir.clear_pytest_cache_keeping``), tell pytest not to clear, say so (``setup`` None: a
    quiet session). Before pytest's cache provider reads the option (both tryfirst: the later-registered first)."""
    from . import cachedir

    own = setup.registration.marker if setup is not None and setup.registration is not None else None
    if (message := cachedir.clear_pytest_cache_keeping(str(_default_shared(config)), excluding=own)) is None:
        return
    config.option.cacheclear = False
    if setup is not None:
        setup.problems.warn(message)
    else:  # no role will report it: pytest_terminal_summary does
        config.stash[_KEPT] = message


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


@pytest.hookimpl  # after tryfirst ones (pytest-env's variables), before pytest's own (trylast) loads a conftest
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    early_config.stash[_TORCH_BEFORE] = "torch" in _MODULES  # if not, a compile in a conftest is this session's
    when_imported("torch", lambda: _watch(early_config), early_config.add_cleanup)  # its graphs, breaks, limits
    if _quiet(early_config):
        return
    setup = _setup(early_config)
    # pytest_unconfigure never runs when pytest stops before configure (an unknown option, a broken
    # conftest, -VV); its cleanup stack always does: the environment and the registration go back then too.
    early_config.add_cleanup(setup.close)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    _load_own_modules_plainly(config)  # the entry point's finder leaves with the session
    if _is_worker(config) or _inherited() is not None:
        # The controller honoured --cache-clear (xdist gives workers its arguments): a worker clearing again would
        # delete a dir the controller kept for another session, or the restored one while workers compile into it.
        config.option.cacheclear = False
    config.addinivalue_line(
        "markers",
        f"{MARKER}(mode): 'isolated' compiles this test cold in its own fresh cache dir; 'disabled' turns "
        "torch's compile caches off for it. Everything is put back afterwards.",
    )
    quiet = _quiet(config)
    settings = _settings(config)  # None: no option given (settings not even loaded)
    if settings is not None and settings.fail_on_eager_fallback:
        from . import probe

        config.add_cleanup(probe.fail_on_recompile_limit())  # set once torch's Dynamo config is imported
    if not _is_worker(config) and getattr(config.option, "cacheclear", False):
        _keep_a_shared_dir_in_use(config, None if quiet else _setup(config))
    if not quiet:
        setup = _setup(config)
        if setup.redis_on:
            from . import probe

            probe.guard_remote_cache()  # every process: a Redis error is a warning, not a failed compile
    if not _is_xdist_controller(config):  # an xdist controller runs no test itself
        counter = config.stash[_COUNTER] = _Counter()
        config.pluginmanager.register(counter, "compilecache-counter")
    if not quiet:
        _make_role(config, _recorder(config))
    if not _is_worker(config) and os.environ.get("GITHUB_ACTIONS") == "true":  # ghrunner.in_github_actions
        from .ghrunner import StopTokenWatch

        watcher = config.stash[_RUNNER_OUTPUT] = StopTokenWatch()
        config.pluginmanager.register(watcher, "compilecache-runner-output")
    # Every process, from when torch (or triton, whose hook waits for torch) is imported: the per-test capture and
    # the watches (_watch: explained lookups, triton entries, the header check; already there after a conftest's).
    when_imported("torch", lambda: _torch_appears(config), config.add_cleanup)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_setupnodes(config: pytest.Config) -> None:
    """Before xdist starts workers: a variable of ours changed since we read it (a conftest) is put back, warned."""
    if changed := put_back(config.stash.get(_ENV_READ, {})):  # nothing read: the plugin was asked for nothing
        warning = f"{', '.join(changed)}: changed after pytest-compilecache read it (by a conftest?), so put back"
        try:  # -W error makes it an error: said as pytest says one, not as an internal error's traceback
            config.issue_config_time_warning(pytest.PytestConfigWarning(f"{warning}; set it before pytest starts"), 2)
        except pytest.PytestConfigWarning as exc:
            raise pytest.UsageError(str(exc)) from None


def _torch_appears(config: pytest.Config) -> None:
    """torch is about to be imported (nothing of it has run yet): from now on a test may compile."""
    _load_own_modules_plainly(config)
    _watch(config)
    _start_tests(config)
    when_imported("triton", lambda: _watch(config), config.add_cleanup)


def _watch(config: pytest.Config) -> None:
    """Install probe's watches (each once per process; none imports torch or triton itself). A watch still
    waiting for its module when the session ends leaves with it: torch may only have been looked up
    (``importlib.util.find_spec``), and a later ``torch.compile`` in the same process (a notebook, a second
    ``pytest.main``) must not be checked and captured outside any session."""
    from . import probe

    before = set(map(id, sys.meta_path))
    if _resolved(config).explain:  # a worker resolves the same options: its controller's argv and environment
        probe.watch_graph_lookups()
    if not _quiet(config):  # a cache dir the session chose: what torch restores into it is moved into it
        probe.watch_precompiled_headers()
        probe.relocate_static_autotuners()
    probe.watch_triton_cache()
    probe.watch_dynamo()
    added = [finder for finder in sys.meta_path if id(finder) not in before]

    def forget() -> None:
        sys.meta_path[:] = [finder for finder in sys.meta_path if finder not in added]

    if added:
        config.add_cleanup(forget)


def _is_xdist_controller(config: pytest.Config) -> bool:
    """xdist will run the tests in workers (``-n N`` with N > 0, ``--dist``...)."""
    dist = not _is_worker(config) and config.getoption("dist", "no") not in ("no", None)
    return dist and bool(config.getoption("tx", None))


def pytest_unconfigure(config: pytest.Config) -> None:
    if (setup := config.stash.get(_SETUP, None)) is not None:
        setup.close()


def _make_role(config: pytest.Config, recorder: Recorder) -> None:
    """This process's role, made once (a quiet session's at the end, when a test compiled)."""
    role = (_worker if _is_worker(config) else _controller)(config, recorder)
    if role.context.saving:  # what the session selects: a save never replaces a restored bundle with a part
        from .selection import SelectionWatch
        from .selection import Where

        watch = role.watch_selection(Where.of(config))
        config.pluginmanager.register(watch, "compilecache-selection")
        if isinstance(watch, SelectionWatch):  # a process that collects (not an xdist controller)
            config.pluginmanager.register(_IgnoreWatch(watch.ignored), "compilecache-ignored")


class _IgnoreWatch:
    """Adds to ``ignored`` each path pytest's ``pytest_ignore_collect`` ignored (``collect_ignore``, a plugin)."""

    def __init__(self, ignored: set[str]) -> None:
        self.ignored = ignored

    @pytest.hookimpl(hookwrapper=True)
    def pytest_ignore_collect(self, collection_path: Path) -> Any:
        outcome = yield  # a hook that raised: pytest reports its error, not this wrapper's
        if outcome.excinfo is None and outcome.get_result():
            self.ignored.add(str(collection_path))


def _recorder(config: pytest.Config) -> Recorder:
    """This process's recorder (made on first use), holding every test the counter has counted so far."""
    recorder = config.stash.get(_RECORDER, None)
    if recorder is None:
        from .recorder import Recorder

        worker = os.environ.get("PYTEST_XDIST_WORKER", "worker") if _is_worker(config) else "controller"
        since_import = not config.stash.get(_TORCH_BEFORE, True)
        recorder = config.stash[_RECORDER] = Recorder(worker, _resolved(config).explain, since_import)
    counter = config.stash.get(_COUNTER, None)
    if counter is not None and counter.tests:
        recorder.cold_tests += counter.tests  # moved, never copied: the counter restarts from zero
        counter.tests = 0
    return recorder


def _worker(config: pytest.Config, recorder: Recorder | None = None) -> Worker:
    worker = config.stash.get(_WORKER, None)
    if worker is None:
        from .session import Worker

        worker = config.stash[_WORKER] = Worker(_setup(config), recorder or _recorder(config))
    return worker


def _controller(config: pytest.Config, recorder: Recorder | None = None) -> Controller:
    controller = config.stash.get(_CONTROLLER, None)
    if controller is None:
        from .session import Controller

        controller = config.stash[_CONTROLLER] = Controller(
            _setup(config), recorder or _recorder(config), xdist=_is_xdist_controller(config)
        )
    return controller


def pytest_report_header(config: pytest.Config) -> str | None:
    setup = config.stash.get(_SETUP, None)
    return setup.header() if setup is not None else None


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """Restore a bundle before the first compile and before xdist starts its workers (not quiet)."""
    config = session.config
    role = config.stash.get(_CONTROLLER, None) or config.stash.get(_WORKER, None)
    if role is not None:
        role.session_start()


def pytest_collection_finish(session: pytest.Session) -> None:
    """An xdist worker waits here, before its first test, for the worker that restores the bundle."""
    worker = session.config.stash.get(_WORKER, None)
    if worker is not None:
        worker.before_tests()


# ---- per-test capture
# Until torch is imported (or a test is marked), a test can compile nothing: one hook counts it (_Counter).
# From then on two plain hooks surround the whole protocol (pytest_runtest_logstart before setup,
# logfinish after teardown) on a small object (_Tests), so that the path every test takes reads attributes,
# not stashes. Records travel to the controller at session end. Both live only in processes that run tests.


class _Counter:
    """Counts the tests that finish while torch is not imported: the only per-test work until then."""

    def __init__(self) -> None:
        self.tests = 0

    def pytest_runtest_logfinish(self) -> None:
        self.tests += 1


def _start_tests(config: pytest.Config) -> PerTestHooks | None:
    """Hand the counting over to the per-test capture (once; None in an xdist controller, which runs no test).

    Called when torch is about to be imported - maybe in the middle of a test, which then started before
    torch was and is recorded from zero - when a test is marked, or when a test asks for its statistics.
    """
    tests = config.stash.get(_TESTS, None)
    if tests is not None or _is_xdist_controller(config):
        return tests
    counter = config.stash.get(_COUNTER, None)
    if counter is not None:
        config.pluginmanager.unregister(counter)
    from .recorder import PerTestHooks

    tests = config.stash[_TESTS] = PerTestHooks(_recorder(config))  # _recorder takes the counter's tests over
    tests.current = tests.cold  # the running test, if any: it began before torch could compile anything
    config.pluginmanager.register(tests, "compilecache-tests")
    return tests


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Find marked tests once, so that the per-test path is a dict lookup.

    A marker with a bad mode becomes that test's setup error (through a fixture), not a crash: under
    xdist a collection-time exception in a worker would be an INTERNALERROR.
    """
    memo: dict[int, Any] = {}
    marked = {}
    for item in items:
        # _closest_marker, its first step inlined: a call per test is most of this loop's cost
        for mark in item.own_markers:
            if mark.name == MARKER:
                break
        else:
            parent = item.parent
            if parent is None:
                continue
            key = id(parent)
            mark = memo[key] if key in memo else memo.setdefault(key, _closest_marker(parent, memo))
        if mark is None:
            continue
        mode = mark.args[0] if mark.args else mark.kwargs.get("mode", "isolated")
        if mode in ("isolated", "disabled"):
            marked[item.nodeid] = mode
        elif _BAD_MARKER not in getattr(item, "fixturenames", [_BAD_MARKER]):
            item.fixturenames.insert(0, _BAD_MARKER)  # type: ignore[attr-defined]
    tests = _start_tests(config) if marked else config.stash.get(_TESTS, None)
    if tests is not None:
        tests.marked = marked


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
    item, tests = request.node, _start_tests(request.config)
    assert tests is not None  # a fixture runs in a process that runs tests
    return tests.recorder.live(item.nodeid, tests.current, item.nodeid in tests.marked)


# ---- xdist (optional)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    output = getattr(node, "workeroutput", {}) or {}
    worker = output.get("workerid") or getattr(getattr(node, "gateway", None), "id", "?")
    sent, config = output.get("compilecache"), node.config
    if id(node) in config.stash.setdefault(_DOWN, set()):
        return  # xdist reports a worker that exited with status 2 (KeyboardInterrupt, pytest.exit) twice
    config.stash[_DOWN].add(id(node))
    if _CONTROLLER not in config.stash and isinstance(sent, dict) and set(sent) == {"tests"}:
        # A quiet worker whose tests never imported torch: only a count, kept without loading the roles (in a
        # counter that is not registered: the controller runs no test; _recorder takes it over if needed).
        counter = config.stash.setdefault(_COUNTER, _Counter())
        counter.tests += int(sent["tests"])
        return
    _controller(config).add_worker(str(worker), sent)


# ---- session end


def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    if _RECORDER in config.stash:
        _recorder(config)  # the tests the counter counted join the recorder's
    quiet = _quiet(config) and "torch" not in sys.modules  # nothing compiled in this process
    if _is_worker(config):
        if _WORKER not in config.stash and quiet:  # cold tests only (the counter's joined the recorder above)
            recorder, counter = config.stash.get(_RECORDER, None), config.stash.get(_COUNTER, None)
            sent: dict[str, Any] = {"tests": recorder.cold_tests if recorder else counter.tests if counter else 0}
        else:
            sent = _worker(config).output()
        config.workeroutput["compilecache"] = sent  # type: ignore[attr-defined]
        return
    if _CONTROLLER not in config.stash and quiet:
        return  # no option, no compile, no worker that compiled: nothing to report
    failed = session.exitstatus not in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED)
    stopped = session.shouldstop or session.shouldfail or session.exitstatus == pytest.ExitCode.INTERRUPTED
    try:
        must_fail = _controller(config).finish(failed=failed, stopped=bool(stopped))
    except KeyboardInterrupt:  # Ctrl-C during the save: pytest's Interrupted, not a traceback
        pytest.exit(
            "KeyboardInterrupt: the compile cache stopped its save; nothing was saved",
            returncode=pytest.ExitCode.INTERRUPTED,
        )
    if must_fail and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    _controller(config).keep_report(getattr(config, "cache", None))


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    controller = config.stash.get(_CONTROLLER, None)
    lines = controller.terminal_lines(verbose=config.option.verbose > 0) if controller is not None else []
    kept = config.stash.get(_KEPT, None)  # a session that asked for nothing kept another's dir
    if kept is not None:
        lines = [(f"CompileCacheWarning: {kept}", {"yellow": True}), *lines]
    if lines:
        terminalreporter.write_sep("-", "compile cache")
        for line, markup in lines:
            terminalreporter.write_line(line, **markup)
    if controller is not None:
        _github_commands(controller, config.stash.get(_RUNNER_OUTPUT, None))


def _github_commands(role: Controller, output: StopTokenWatch | None = None) -> None:
    """Inside a GitHub Actions job, each warning and error also becomes an annotation (``ghrunner.annotate``)."""
    if not (role.problems.warnings or role.problems.errors) or os.environ.get("GITHUB_ACTIONS") != "true":
        return  # the same test as ghrunner.in_github_actions, without loading ghrunner
    from .ghrunner import annotate

    annotate(sys.stdout, role.problems.warnings, role.problems.errors, output.tokens if output else [])
