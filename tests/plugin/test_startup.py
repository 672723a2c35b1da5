"""Start-up behaviour that needs no torch: configuration errors, precedence, the default dir, passivity.

No session here imports torch (``torch_independent``: the compat subset leaves them out, tests/conftest.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.plugin.helpers import INNER_INI
from tests.plugin.helpers import XDIST
from tests.plugin.helpers import check_report
from tests.plugin.helpers import run_inner
from tests.servers import free_port

pytestmark = pytest.mark.torch_independent

# Every scenario runs in one process and with two xdist workers (XDIST), but the bad configurations: those fail
# in pytest_load_initial_conftests, before xdist starts a worker, in the same code with or without -n (two of
# them also run with -n 2 to show it).
XDIST_TOO = ("mode", "env")


# A suite that leaves a trace when it runs, so a test can tell that nothing ran.
TRIVIAL_SUITE = """
import pathlib


def test_runs():
    pathlib.Path(__file__).with_name("ran").write_text("yes")
"""


BAD_CONFIGURATIONS = [
    pytest.param(
        ["--compile-cache=bogus"],
        "",
        {},
        "--compile-cache: invalid value 'bogus' (choose from shared, isolated, disabled)",
        id="mode",
    ),
    pytest.param(
        ["--compile-cache-min-hit-rate=1.5"],
        "",
        {},
        "--compile-cache-min-hit-rate: must be between 0 and 1, got '1.5'",
        id="min-hit-rate",
    ),
    pytest.param(
        ["--compile-cache=shared", "--compile-cache-dir={file}/sub"],
        "",
        {},
        "--compile-cache-dir: */a-file/sub is not a writable directory*",
        id="shared-dir-under-a-file",
    ),
    pytest.param(
        ["--compile-cache=isolated", "--compile-cache-dir={file}/sub"],
        "",
        {},
        "--compile-cache-dir: cannot create an isolated dir in */a-file/sub*",
        id="isolated-dir-under-a-file",
    ),
    pytest.param(
        ["--compile-cache-max-size=lots"],
        "",
        {},
        "--compile-cache-max-size: expected a size like 500M or 2G, got 'lots'",
        id="max-size",
    ),
    pytest.param(
        ["--compile-cache=disabled", "--compile-cache-store={file}"],
        "",
        {},
        "--compile-cache-store: cannot be used with --compile-cache=disabled",
        id="store-when-disabled",
    ),
    pytest.param(
        ["--compile-cache-json={file}/report.json"],
        "",
        {},
        "--compile-cache-json: cannot create the directory of */a-file/report.json*",
        id="json-under-a-file",
    ),
    # Tried, not asked: os.access says yes to root (CI containers run as root), /sys refuses anyone.
    pytest.param(
        ["--compile-cache-json=/sys/r.json"],
        "",
        {},
        "--compile-cache-json: /sys/r.json is not writable (Permission denied)",
        id="json-unwritable-even-for-root",
    ),
    pytest.param(
        ["--compile-cache-store={file}"],
        "",
        {},
        "--compile-cache-store: '*/a-file' is a file, not a directory",
        id="store-is-a-file",
    ),
    pytest.param(
        [],
        "compile_cache_store = file://{file}/bundles",
        {},
        "compile_cache_store: 'file://*/a-file/bundles' lies under the file */a-file, not a directory",
        id="store-under-a-file",
    ),
    pytest.param(
        ["--compile-cache=isolated", "--compile-cache-max-size=1K"],
        "",
        {},
        "--compile-cache-max-size: applies only to shared mode; not to --compile-cache=isolated",
        id="max-size-when-isolated",
    ),
    pytest.param(
        ["-p", "hide_redis", "--compile-cache-redis=redis://127.0.0.1:1/0"],
        "",
        {},
        "--compile-cache-redis: needs the 'redis' package (pip install 'pytest-compilecache[redis]')",
        id="redis-package-missing",
    ),
    pytest.param(
        [],
        "",
        {"PYTEST_COMPILECACHE_DIR": "{file}/sub", "PYTEST_COMPILECACHE_MODE": "shared"},
        "PYTEST_COMPILECACHE_DIR: */a-file/sub is not a writable directory*",
        id="dir-from-env",
    ),
    pytest.param(
        [],
        "compile_cache_store = ftp://x/y",
        {},
        "compile_cache_store: unsupported store: 'ftp://x/y'*",
        id="store-from-ini",
    ),
    pytest.param(
        ["--compile-cache-redis=redis://u:pw@[zz]/0"],
        "",
        {},
        "--compile-cache-redis: expected redis://host:port/db (with / # ? @ in a password percent-encoded), got 'redis://*'",
        id="redis-unparsable",
    ),
    pytest.param(  # the report's dir is not made for a start refused for the cache dir
        ["--compile-cache-json={file}.out/sub/r.json", "--compile-cache=shared", "--compile-cache-dir={file}/sub"],
        "",
        {},
        "--compile-cache-dir: */a-file/sub is not a writable directory*",
        id="json-dir-then-a-bad-dir",
    ),
    pytest.param(
        ["--compile-cache-dir={file}.d", "--compile-cache-store={file}.d/bundles"],
        "",
        {},
        "--compile-cache-store: '*/a-file.d/bundles' lies in the cache dir */a-file.d: give the store a directory*",
        id="store-in-the-cache-dir",
    ),
    pytest.param(
        ["--compile-cache=isolated", "--compile-cache-dir={file}.d", "--compile-cache-store={file}.d"],
        "",
        {},
        "--compile-cache-store: '*/a-file.d' holds the cache dir */a-file.d/<a fresh dir>: give the store a dir*",
        id="store-holds-the-isolated-dir",
    ),
    pytest.param([], "compile_cache = bogus", {}, "compile_cache: invalid value 'bogus'*", id="ini"),
    pytest.param(
        [],
        "",
        {"PYTEST_COMPILECACHE_MODE": "bogus"},
        "PYTEST_COMPILECACHE_MODE: invalid value 'bogus'*",
        id="env",
    ),
]


@pytest.mark.parametrize(
    ("args", "ini", "env", "message", "dist"),
    [
        *(pytest.param(*bad.values, (), id=f"{bad.id}-nodist") for bad in BAD_CONFIGURATIONS),
        *(
            pytest.param(*bad.values, ("-n", "2"), id=f"{bad.id}-xdist", marks=pytest.mark.xdist_variant)
            for bad in BAD_CONFIGURATIONS
            if bad.id in XDIST_TOO
        ),
    ],
)
def test_bad_configuration_fails_at_start_naming_the_option(
    inner: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    dist: tuple[str, ...],
    args: list[str],
    ini: str,
    env: dict[str, str],
    message: str,
) -> None:
    inner.makepyfile(test_suite=TRIVIAL_SUITE)
    # -p hide_redis: an environment without the redis package (imported before the plugin reads its options).
    inner.makepyfile(hide_redis="import sys\n\nsys.modules['redis'] = None\n")
    inner.makeini(INNER_INI + ini.format(file=inner.path / "a-file"))
    a_file = inner.path / "a-file"
    a_file.write_text("a regular file, not a directory\n")
    for name, value in env.items():
        monkeypatch.setenv(name, value.format(file=a_file))
    before = set(inner.path.rglob("*"))

    result = inner.runpytest_subprocess(*(a.format(file=a_file) for a in args), *dist, timeout=120)

    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {message}"])
    assert not (inner.path / "ran").exists()
    # A refused start makes nothing: no cache dir, no isolated dir, no report dir, no tag.
    made = {p.relative_to(inner.path) for p in set(inner.path.rglob("*")) - before}
    pytesters = {"stdout", "stderr", "__pycache__"}  # pytester's own output and bytecode are no start's doing
    left = {p for p in made if not pytesters & set(p.parts) and not p.parts[0].startswith("runpytest-")}
    assert not left, sorted(map(str, left))


@XDIST
def test_cli_beats_ini_beats_env(
    inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, dist: tuple[str, ...]
) -> None:
    inner.makepyfile(test_suite=TRIVIAL_SUITE)
    inner.makeini(INNER_INI + "compile_cache = isolated\n")
    monkeypatch.setenv("PYTEST_COMPILECACHE_MODE", "disabled")

    from_cli = run_inner(inner, "--compile-cache=shared", f"--compile-cache-dir={inner.path / 'cache'}", *dist)
    from_ini = run_inner(inner, *dist)
    inner.makeini(INNER_INI)
    from_env = run_inner(inner, *dist)

    for run in (from_cli, from_ini, from_env):
        assert run.ret == 0, run.output
        check_report(run.data)
    assert [r.data["mode"] for r in (from_cli, from_ini, from_env)] == ["shared", "isolated", "disabled"]
    assert from_cli.data["cache_dir"] == str(inner.path / "cache")


@pytest.mark.skipif(pytest.version_tuple < (9, 2), reason="a union ini type (TOML values) needs pytest 9.2")
def test_native_toml_takes_booleans_and_numbers(inner: pytest.Pytester) -> None:
    """pytest 9's ``[tool.pytest]`` table types its values: a switch is ``true``, a rate ``0.5``, a count ``2``,
    an on/off option ``false``, as a user writes TOML; our parsers still check each (naming the key)."""
    inner.makepyfile(test_suite=TRIVIAL_SUITE)
    (inner.path / "tox.ini").unlink()

    def toml(extra: str) -> None:
        inner.makefile(
            ".toml",
            pyproject='[tool.pytest]\nfilterwarnings = ["ignore::DeprecationWarning"]\ncompile_cache = "isolated"\n'
            'compile_cache_dir = "parent"\ncompile_cache_keep = true\ncompile_cache_explain = false\n'
            "compile_cache_keep_bundles = 2\n" + extra,
        )

    toml("compile_cache_min_hit_rate = 0.5\n")
    taken = run_inner(inner)
    assert taken.ret == 0, taken.output
    kept = Path(taken.data["cache_dir"])
    assert taken.data["mode"] == "isolated" and kept.parent == inner.path / "parent" and kept.is_dir()  # `true`
    toml("compile_cache_min_hit_rate = 1.5\n")
    refused = inner.runpytest_subprocess(timeout=120)
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    refused.stderr.fnmatch_lines(["ERROR: compile_cache_min_hit_rate: must be between 0 and 1, got '1.5'"])


@XDIST
def test_default_shared_dir_is_in_pytest_cache(inner: pytest.Pytester, dist: tuple[str, ...]) -> None:
    inner.makepyfile(test_suite=TRIVIAL_SUITE)
    expected = inner.path / ".pytest_cache" / "d" / "compilecache"

    run = run_inner(inner, "--compile-cache=shared", *dist)

    assert run.ret == 0, run.output
    check_report(run.data)
    assert Path(run.data["cache_dir"]).resolve() == expected.resolve()
    assert (expected / "CACHEDIR.TAG").read_text().startswith("Signature: 8a477f597d28d172789f06886806bc55\n")


@XDIST
def test_default_shared_dir_survives_cache_clear(
    inner: pytest.Pytester, dist: tuple[str, ...], request: pytest.FixtureRequest
) -> None:
    inner.makepyfile(test_suite=TRIVIAL_SUITE)
    expected = inner.path / ".pytest_cache" / "d" / "compilecache"
    run_inner(inner, "--compile-cache=shared")

    # --cache-clear empties .pytest_cache/d after the plugin made its dir there: it must be made again.
    run = run_inner(inner, "--compile-cache=shared", "--cache-clear", *dist)

    assert run.ret == 0, run.output
    assert Path(run.data["cache_dir"]).resolve() == expected.resolve()
    assert (expected / "CACHEDIR.TAG").is_file()


# A test that only looks torch up (``find_spec``), beside one that never thinks of it.
LOOKS_TORCH_UP = """
import importlib.util


def test_looks_torch_up():
    assert importlib.util.find_spec("torch") is not None
"""

# Each process (the controller and every xdist worker) records, after every other unconfigure hook (the
# plugin's included), whether torch was imported and how each of our modules was loaded; and at its exit,
# after every cleanup, whether torch was imported and which of our finders are still in ``sys.meta_path``.
PROCESS_RECORD = """
import atexit
import os
import sys
from pathlib import Path

import pytest

here = Path(__file__).parent
process = os.environ.get("PYTEST_XDIST_WORKER", "controller")


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    (here / f"torch-imported-{process}.txt").write_text(str("torch" in sys.modules))
    loaders = sorted(
        f"{name}={type(module.__loader__).__name__}"
        for name, module in list(sys.modules.items())
        if name.startswith("pytest_compilecache")
    )
    (here / f"loaders-{process}.txt").write_text(" ".join(loaders))


def record():
    finders = [f"{type(f).__module__}.{type(f).__name__}" for f in sys.meta_path]
    ours = [name for name in finders if name.startswith("pytest_compilecache")]
    (here / f"finders-{process}.txt").write_text(f"{'torch' in sys.modules} {ours}")


atexit.register(record)
"""


@XDIST
def test_a_session_without_torch_imports_none_loads_ours_plainly_and_leaves_no_finder(
    inner: pytest.Pytester, dist: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One session with a cache dir, whose tests never import torch (one looks it up), checked in each process:

    * torch is never imported, not by the plugin either (its watches wake on the lookup, then wait);
    * issue 23: pytest hands every module of a plugin's distribution to its assertion-rewriting hook, which
      costs each of ours (all PYTEST_DONT_REWRITE) about 2M instructions, and with PYTHONDONTWRITEBYTECODE a
      parse and a compile in every session. The modules the session loads after the plugin come from Python's
      own loader (those pytest imported to find the plugin necessarily went through the hook);
    * when the session ends, none of the plugin's finders stays in ``sys.meta_path`` (checked at exit)."""
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    # What pytest does for a plugin installed from a wheel (an editable install, as here, lists no files, and
    # pytest then hands over only the entry point's module), done by a plugin loaded before ours.
    inner.makepyfile(
        test_suite=TRIVIAL_SUITE,
        test_lookup=LOOKS_TORCH_UP,
        mark_ours='import pytest\n\npytest.register_assert_rewrite("pytest_compilecache")\n',
    )
    inner.makeconftest(PROCESS_RECORD)

    run = run_inner(inner, "-p", "mark_ours", "-p", "no:cacheprovider", "--compile-cache=shared",
                    f"--compile-cache-dir={inner.path / 'cache'}", *dist)  # fmt: skip

    assert run.ret == 0, run.output
    check_report(run.data)
    assert (run.totals["tests"], run.totals["compiled_tests"], run.totals["hit_rate"]) == (2, 0, None)
    processes = ["controller", "gw0", "gw1"] if dist else ["controller"]
    seen = {p.name: p.read_text() for p in inner.path.glob("torch-imported-*.txt")}
    assert seen == {f"torch-imported-{p}.txt": "False" for p in processes}
    seen = {p.name: p.read_text() for p in inner.path.glob("finders-*.txt")}
    assert seen == {f"finders-{p}.txt": "False []" for p in processes}
    # What pytest imports to find the plugin: the package, the entry point's module and the finder it puts
    # ahead of the hook. The hooks module and the option table already load plainly.
    before_finder = {
        "pytest_compilecache",
        "pytest_compilecache._version",
        "pytest_compilecache._entry",
        "pytest_compilecache._loader",
    }
    for process in processes:
        loaders = dict(pair.split("=") for pair in (inner.path / f"loaders-{process}.txt").read_text().split())
        assert {"pytest_compilecache.session", "pytest_compilecache.settings"} <= set(loaders), loaders
        assert {"pytest_compilecache.plugin", "pytest_compilecache.options"} <= set(loaders), loaders
        by_hook = {name for name, loader in loaders.items() if loader == "AssertionRewritingHook"}
        assert by_hook <= before_finder, (process, by_hook)
        assert "pytest_compilecache.plugin" not in by_hook, (process, by_hook)
        assert {loaders[name] for name in set(loaders) - by_hook} == {"SourceFileLoader"}, loaders


@XDIST
def test_a_session_with_no_option_loads_only_the_option_table(inner: pytest.Pytester, dist: tuple[str, ...]) -> None:
    """Issue 23: no option, no torch: of the plugin, each process loads only what pytest needs to list the
    options (the controller and every xdist worker)."""
    inner.makepyfile(test_suite=TRIVIAL_SUITE)
    inner.makeconftest(
        """
        import os
        import sys

        import pytest


        @pytest.hookimpl(trylast=True)
        def pytest_unconfigure(config):
            process = os.environ.get("PYTEST_XDIST_WORKER", "controller")
            ours = sorted(name for name in sys.modules if name.startswith("pytest_compilecache"))
            (config.rootpath / f"ours-{process}.txt").write_text(" ".join(ours))
        """
    )

    result = inner.runpytest_subprocess("-p", "no:cacheprovider", *dist, timeout=300)

    assert result.ret == 0, result.stdout.str()
    seen = {p.name: p.read_text().split() for p in inner.path.glob("ours-*.txt")}
    expected = [
        "pytest_compilecache",
        "pytest_compilecache._entry",
        "pytest_compilecache._env",
        "pytest_compilecache._loader",
        "pytest_compilecache._version",
        "pytest_compilecache.options",
        "pytest_compilecache.plugin",
    ]
    processes = ["controller", "gw0", "gw1"] if dist else ["controller"]
    assert seen == {f"ours-{p}.txt": expected for p in processes}


@XDIST
def test_invalid_marker_mode_is_an_error(inner: pytest.Pytester, dist: tuple[str, ...]) -> None:
    inner.makepyfile(
        test_suite="""
        import pathlib

        import pytest


        @pytest.mark.compile_cache("bogus")
        def test_marked():
            pathlib.Path(__file__).with_name("ran").write_text("yes")
        """
    )

    result = inner.runpytest_subprocess(
        "--compile-cache=shared", f"--compile-cache-dir={inner.path / 'cache'}", *dist, timeout=120
    )

    # A test error or a usage error, both name the marker; never a crash, and the test body never runs.
    output = result.stdout.str() + result.stderr.str()
    assert "INTERNALERROR" not in output
    assert result.ret in (pytest.ExitCode.TESTS_FAILED, pytest.ExitCode.USAGE_ERROR)
    assert "@pytest.mark.compile_cache: mode must be 'isolated' or 'disabled', got 'bogus'" in output
    assert not (inner.path / "ran").exists()


@XDIST
@pytest.mark.parametrize("stop", ["--help", "--no-such-option", "broken-conftest"])
def test_isolated_dir_is_not_left_behind_when_the_session_stops_early(
    inner: pytest.Pytester, dist: tuple[str, ...], stop: str
) -> None:
    inner.makepyfile(test_suite=TRIVIAL_SUITE)
    if stop == "broken-conftest":
        inner.makeconftest("import a_module_that_does_not_exist")
    parent = inner.path / "isolated"

    result = inner.runpytest_subprocess(
        "--compile-cache=isolated",
        f"--compile-cache-dir={parent}",
        *dist,
        *([stop] if stop.startswith("--") else []),
        timeout=120,
    )

    assert result.ret == (pytest.ExitCode.OK if stop == "--help" else pytest.ExitCode.USAGE_ERROR)
    assert not (inner.path / "ran").exists()
    assert sorted(p.name for p in parent.glob("*")) == []


def test_help_is_shown_despite_a_bad_value_and_makes_no_dir(
    inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--help`` lists the options' right values: a bad one must not hide it, and asking for it makes no dir."""
    inner.makepyfile(test_suite=TRIVIAL_SUITE)
    monkeypatch.setenv("PYTEST_COMPILECACHE_MODE", "bogus")
    shown = inner.runpytest_subprocess("--help", timeout=120)
    assert shown.ret == pytest.ExitCode.OK and "--compile-cache=" in shown.stdout.str()
    monkeypatch.delenv("PYTEST_COMPILECACHE_MODE")
    shown = inner.runpytest_subprocess("--help", "--compile-cache=shared", f"--compile-cache-dir={inner.path / 'cc'}")
    assert shown.ret == pytest.ExitCode.OK and not (inner.path / "cc").exists()


def test_a_variable_a_conftest_sets_reaches_no_xdist_worker(inner: pytest.Pytester) -> None:
    """The plugin reads its variables before any conftest, which the controller's session ignores; xdist
    workers, started later, would read what a conftest set, at its import or in its pytest_configure (each its
    own isolated dir, a signing key the controller's save does not use, or a bad value failing every worker
    with a traceback). They are put back before the workers start, with one warning naming them. A plugin that
    sets them first thing (pytest-env's tryfirst hook) is read, and warned of by nobody."""
    inner.makepyfile(test_suite=TRIVIAL_SUITE)
    inner.makeconftest(
        "import os\n\nos.environ['PYTEST_COMPILECACHE_MODE'] = 'bogus'\n\n\ndef pytest_configure(config):\n"
        "    os.environ['PYTEST_COMPILECACHE_SIGNING_KEY'] = 'from the conftest'\n"
    )
    inner.makepyfile(
        envplugin="import os\n\nimport pytest\n\n\n@pytest.hookimpl(tryfirst=True)\n"
        "def pytest_load_initial_conftests(early_config):\n    os.environ['PYTEST_COMPILECACHE_REPORT'] = 'full'\n"
    )

    result = inner.runpytest_subprocess("-p", "envplugin", "--compile-cache-summary=off", "-n", "2", timeout=120)

    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    result.stdout.fnmatch_lines(
        ["*PYTEST_COMPILECACHE_MODE, PYTEST_COMPILECACHE_SIGNING_KEY: changed after pytest-compilecache read it*"]
    )
    assert "PYTEST_COMPILECACHE_REPORT" not in result.stdout.str()  # read, not put back
    assert "Traceback" not in result.stdout.str() + result.stderr.str()

    # Where warnings are errors, the session stops with pytest's usage error, not an internal one.
    strict = inner.runpytest_subprocess("-W", "error", "--compile-cache-summary=off", "-n", "2", timeout=120)
    assert strict.ret == pytest.ExitCode.USAGE_ERROR, strict.stdout.str() + strict.stderr.str()
    strict.stderr.fnmatch_lines(["ERROR: PYTEST_COMPILECACHE_MODE, *: changed after pytest-compilecache read it*"])
    assert "INTERNALERROR" not in strict.stdout.str() + strict.stderr.str()

    # A session that asked the plugin for nothing uses no signing key: a CI secret a conftest exports is its own.
    inner.makeconftest("import os\n\nos.environ['PYTEST_COMPILECACHE_SIGNING_KEY'] = 'from the conftest'\n")
    quiet = inner.runpytest_subprocess("-n", "2", timeout=120)
    assert quiet.ret == pytest.ExitCode.OK and "changed after" not in quiet.stdout.str(), quiet.stdout.str()


# A test that starts a pytest session of its own (as pytester does), with its own --compile-cache.
NESTED_SUITE = """
import json
import pathlib
import subprocess
import sys


def test_starts_its_own_pytest(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\\n")
    (tmp_path / "test_nested.py").write_text("def test_ok():\\n    pass\\n")
    report = tmp_path / "nested.json"
    subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--compile-cache=isolated",
         f"--compile-cache-json={report}"],
        cwd=tmp_path, check=True,
    )
    pathlib.Path(__file__).with_name("nested-mode.txt").write_text(json.loads(report.read_text())["mode"])
"""


@XDIST
def test_nested_session_follows_its_own_options(
    inner: pytest.Pytester, dist: tuple[str, ...], request: pytest.FixtureRequest
) -> None:
    inner.makepyfile(test_suite=NESTED_SUITE)

    run = run_inner(inner, "--compile-cache=shared", f"--compile-cache-dir={inner.path / 'cache'}", *dist)

    assert run.ret == 0, run.output
    assert (inner.path / "nested-mode.txt").read_text() == "isolated"


@XDIST
def test_annotations_resume_after_a_test_stopped_the_runners_commands(
    inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, dist: tuple[str, ...]
) -> None:
    """A failing test whose output holds ``::stop-commands::TOKEN`` (pytest prints it before our summary)
    would turn the plugin's annotations into plain text on a GitHub runner: a ``::TOKEN::`` line comes first."""
    inner.makepyfile(
        test_suite="""
        def test_prints_untrusted_text():
            print("::stop-commands::resume-me")
            assert False

        def test_ok():
            pass

        def test_warns():
            import warnings

            warnings.warn("disk nearly full\\n::stop-commands::warntok")  # the warnings summary shows it
        """
    )
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    # Redis that is down: one warning at start-up, without importing torch.
    run = run_inner(inner, "--compile-cache=shared", f"--compile-cache-redis=redis://127.0.0.1:{free_port()}/0", *dist)

    assert run.ret == 1, run.output  # the failing test
    lines = [line.strip() for line in run.result.outlines]
    warning = next(i for i, line in enumerate(lines) if line.startswith("::warning title=compile cache::"))
    for token in ("resume-me", "warntok"):
        stop = lines.index(f"::stop-commands::{token}")
        resume = lines.index(f"::{token}::")
        assert stop < resume < warning, run.output
        assert lines.count(f"::{token}::") == 1
