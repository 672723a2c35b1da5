"""selection: which tests of a restored bundle a session left out, and the save that declines to replace it.

A bundle holds what its session used and the next run restores the newest, so a ``-k``/``--lf``/node-id
session that saved would replace the restored coverage with its part of the suite. The real pytest sessions
here use no torch (collection alone decides); tests/plugin/test_workers.py runs one with xdist and a compile.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from pytest_compilecache import bundle
from pytest_compilecache import plugin
from pytest_compilecache import selection as selection_module
from pytest_compilecache import sync
from pytest_compilecache.context import SessionContext
from pytest_compilecache.explain import GraphLookup
from pytest_compilecache.explain import GraphsRecord
from pytest_compilecache.explain import install_restored
from pytest_compilecache.explain import load_record
from pytest_compilecache.explain import save_record
from pytest_compilecache.payload import Gathered
from pytest_compilecache.payload import ProcessOutput
from pytest_compilecache.payload import Restored
from pytest_compilecache.problems import Problems
from pytest_compilecache.recorder import Recorder
from pytest_compilecache.save_phase import SavePhase
from pytest_compilecache.selection import STALE_SECONDS
from pytest_compilecache.selection import ControllerWatch
from pytest_compilecache.selection import Selection
from pytest_compilecache.selection import SelectionWatch
from pytest_compilecache.selection import Where
from pytest_compilecache.selection import covers
from pytest_compilecache.selection import globs_of
from pytest_compilecache.selection import roots_of
from pytest_compilecache.session import Controller
from pytest_compilecache.session import Worker
from pytest_compilecache.settings import Settings
from pytest_compilecache.stats import ItemRecord


@pytest.mark.parametrize(
    ("root", "nodeid", "expected"),
    [
        ("", "tests/a.py::t", True),
        ("tests", "tests/a.py::t", True),
        ("tests", "tests2/a.py::t", False),
        ("tests/a.py", "tests/a.py::C::t[1]", True),
        ("tests/a.py", "tests/ab.py::t", False),
        ("tests/a.py::t", "tests/a.py::t", True),
        ("tests/a.py::t", "tests/a.py::t[1-2]", True),
        ("tests/a.py::t", "tests/a.py::tt", False),
        ("tests/a.py::C", "tests/a.py::C::t", True),
        ("tests/a.py::C", "tests/a.py::t", False),
    ],
)
def test_a_root_covers_the_tests_pytest_would_collect_from_it(root: str, nodeid: str, expected: bool) -> None:
    assert covers(root, nodeid) is expected


def test_arguments_become_rootdir_relative_roots(tmp_path: Path) -> None:
    root, sub = str(tmp_path), str(tmp_path / "tests")
    args = [".", "unit", "a.py::C::t[1]", str(tmp_path / "tests" / "b.py"), "/elsewhere/c.py", "pkg.mod"]
    roots = roots_of(args, sub, root)
    assert roots[:4] == ("tests", "tests/unit", "tests/a.py::C::t[1]", "tests/b.py")
    assert roots_of(["."], root, root) == ("",)
    # Outside the rootdir (or a --pyargs module name that is no path here): covers no node id.
    assert not any(covers(r, "tests/unit/c.py::t") for r in roots[4:5])
    assert roots[5] == "tests/pkg.mod"  # without --pyargs, a path (pytest would say it is not found)


def test_a_pyargs_module_is_its_file_or_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _files(tmp_path, "src/suite/__init__.py", "src/suite/test_m.py")
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    roots = roots_of(["suite", "suite.test_m::test_x", "no_such_module_here"], str(tmp_path), str(tmp_path), True)
    # A module that cannot be found covers everything: only what pytest deselected counts then.
    assert roots == ("src/suite", "src/suite/test_m.py::test_x", "")


def _files(tmp_path: Path, *names: str) -> None:
    for name in names:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")


def test_left_out_counts_what_still_exists_and_was_not_selected(tmp_path: Path) -> None:
    _files(tmp_path, "tests/a.py", "tests/b.py", "tests/gpu/g.py", "tests/x_slow.py")
    selection = Selection(
        rootdir=str(tmp_path),
        roots=("tests",),
        selected=frozenset({"tests/a.py::kept"}),
        deselected=frozenset({"tests/a.py::by_k"}),
        ignored=("tests/gpu",),
        ignored_globs=(str(tmp_path / "tests" / "*_slow.py"),),
    )
    record = [
        "tests/a.py::kept",  # selected
        "tests/a.py::by_k",  # deselected: -k, -m, --lf, a plugin
        "tests/a.py::removed",  # neither, in a collected file: deleted or renamed
        "tests/gone.py::t",  # its file is gone
        "tests/gpu/g.py::t",  # --ignore
        "tests/x_slow.py::t",  # --ignore-glob
        "other/o.py::t",  # outside the arguments, but its file is gone too
    ]
    assert selection.left_out(record) == ["tests/a.py::by_k", "tests/gpu/g.py::t", "tests/x_slow.py::t"]
    _files(tmp_path, "other/o.py")  # outside what the arguments collect, and it exists
    assert "other/o.py::t" in selection.left_out(record)
    whole = Selection(rootdir=str(tmp_path), selected=frozenset({"tests/a.py::kept"}))
    assert whole.left_out(record) == []  # the whole suite ran: the rest was deleted
    # pytest matches an ignore glob against each dir on the way down too
    by_dir = Selection(rootdir=str(tmp_path), ignored_globs=globs_of(["*/gpu/"], str(tmp_path)))
    assert by_dir.left_out(record) == ["tests/gpu/g.py::t"]


def test_a_real_sessions_watch_sees_what_pytest_deselected(pytester: pytest.Pytester) -> None:
    """-k, -m and --deselect all reach pytest_deselected; what the arguments leave uncollected does not."""
    pytester.makeini("[pytest]\nmarkers = gpu\n")
    pytester.makepyfile(
        test_a="import pytest\n\ndef test_one(): pass\n\ndef test_two(): pass\n\n"
        "@pytest.mark.gpu\ndef test_gpu(): pass\n\ndef test_three(): pass\n",
        test_b="def test_b(): pass\n",
    )
    watch = SelectionWatch()
    result = pytester.inline_run(
        "test_a.py", "-k", "not two", "-m", "not gpu", "--deselect", "test_a.py::test_three", plugins=[watch]
    )
    result.assertoutcome(passed=1)
    assert watch.selected == frozenset({"test_a.py::test_one"})
    assert watch.deselected == {"test_a.py::test_two", "test_a.py::test_gpu", "test_a.py::test_three"}
    config = pytester.parseconfigure("test_a.py::test_one", "--ignore=sub")
    where = Where.of(config)
    assert where.args == ("test_a.py::test_one",) and where.ignore == ("sub",)
    selection = where.selection(watch, ["test_b.py::test_other_worker"])
    assert selection is not None
    assert selection.left_out(["test_a.py::test_two", "test_b.py::test_b", "test_b.py::test_other_worker"]) == [
        "test_a.py::test_two",
        "test_b.py::test_b",  # outside test_a.py::test_one
        "test_b.py::test_other_worker",
    ]


def test_last_failed_leaves_whole_files_out_without_saying_so(pytester: pytest.Pytester) -> None:
    """``--lf`` skips the files without failures and drops a failed file's passing functions, and tells
    ``pytest_deselected`` of neither: every test of the record it did not select counts as left out."""
    pytester.makepyfile(test_a="def test_a(): pass\n\ndef test_a2(): pass\n", test_b="def test_b(): assert 0\n")
    pytester.runpytest("-p", "cacheprovider").assert_outcomes(passed=2, failed=1)
    watch = SelectionWatch()
    pytester.inline_run("--lf", plugins=[watch]).assertoutcome(failed=1)
    assert watch.selected == frozenset({"test_b.py::test_b"}) and watch.deselected == set()
    where = Where.of(pytester.parseconfigure("--lf"))
    assert where.last_failed
    selection = where.selection(watch, [])
    assert selection is not None
    assert selection.left_out(["test_a.py::test_a", "test_a.py::test_a2", "test_b.py::test_b"]) == [
        "test_a.py::test_a",
        "test_a.py::test_a2",
    ]
    assert selection.signature == ""  # --lf (and --sw) select anew each run: alike to no bundle's session
    config = pytester.parseconfigure("--sw-skip")
    config.option.stepwise = False  # as this plugin's tryfirst configure sees it, before pytest's turns it on
    assert Where.of(config).stepwise


def test_what_a_conftest_leaves_out_is_left_out_and_another_selection(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A conftest's ``collect_ignore`` by an environment variable (a unit-test job beside an integration-test job,
    one command line) is neither an argument nor a deselection: ``pytest_ignore_collect`` says it. Its tests count
    as left out, and the job that leaves them out selects otherwise than the job that runs them: the signature
    holds the conftests' rules, never the files they match, so files that come and go (a migration a glob
    ignores, a build dir pytest skips by itself) change no job's signature, and a session whose conftests ignore
    nothing signs as before this was read."""
    conftest = "import os\n\ncollect_ignore = [] if os.environ.get('INTEGRATION') else ['integration']\n"
    pytester.makeconftest(conftest)
    pytester.makepyfile(test_unit="def test_u(): pass\n")
    for name in ("integration/test_i.py", "build/test_g.py", "env/lib/test_v.py"):
        (pytester.path / name).parent.mkdir(parents=True, exist_ok=True)
        (pytester.path / name).write_text("def test_x(): pass\n")
    (pytester.path / "env" / "pyvenv.cfg").write_text("home = /usr/bin\n")

    def selected(*args: str) -> Selection:
        watch = SelectionWatch()
        pytester.inline_run(*args, plugins=[watch, plugin._IgnoreWatch(watch.ignored)])
        selection = Where.of(pytester.parseconfigure(*args)).selection(watch, [])
        assert selection is not None
        return selection

    def unsigned(*args: str) -> str:  # the signature without conftest rules
        where = Where.of(pytester.parseconfigure(*args))
        return where.signature(roots_of(where.args, where.invocation_dir, where.rootdir))

    unit = selected()
    monkeypatch.setenv("INTEGRATION", "1")
    both, by_option = selected(), selected("--ignore=integration")
    record = ["test_unit.py::test_u", "integration/test_i.py::test_x"]
    assert unit.left_out(record) == ["integration/test_i.py::test_x"] and both.left_out(record) == []
    assert {"integration", "build", "env"} <= set(unit.skipped)  # what pytest_ignore_collect said
    assert {"build", "env"} <= set(both.skipped) and "integration" not in both.skipped
    assert unit.signature != both.signature
    assert both.signature == unsigned() and by_option.signature == unsigned("--ignore=integration")
    assert by_option.left_out(record) == ["integration/test_i.py::test_x"]
    monkeypatch.delenv("INTEGRATION")
    assert selected().signature == unit.signature  # the same job's next run signs alike
    shutil.rmtree(pytester.path / "build")
    assert selected().signature == unit.signature

    pytester.makeconftest(conftest + "collect_ignore_glob = ['*/migrations/*', 'setup.py']\n")
    (pytester.path / "app" / "migrations").mkdir(parents=True)
    (pytester.path / "setup.py").write_text("")
    first = selected("-m", "not slow")
    (pytester.path / "app" / "migrations" / "0002_add_field.py").write_text("")
    assert selected("-m", "not slow").signature == first.signature != unit.signature
    assert "app/migrations/0002_add_field.py" in selected("-m", "not slow").skipped


def test_conftest_rules_are_read_as_pytest_resolves_them(tmp_path: Path) -> None:
    """From each conftest's dir, rootdir-relative with links resolved, in any order of plugins and values; a value
    outside the rootdir (it would sign where the checkout lies) or one pytest could not read either is left out,
    and no value a conftest holds breaks the session; other plugins' attributes are not conftest rules."""
    import itertools
    import types

    class Fspath:
        def __init__(self, path: str) -> None:
            self.path = path

        def __fspath__(self) -> str:
            if self.path == "raise":
                raise RuntimeError("no path")
            return self.path

        def __str__(self) -> str:
            raise RuntimeError("no str")

    def conftest(where: str, **values: Any) -> types.ModuleType:
        module = types.ModuleType("conftest")
        module.__file__ = str(tmp_path / where / "conftest.py")
        for name, value in values.items():
            setattr(module, name, value)
        return module

    odd = ["gpu", tmp_path / "tests" / "slow.py", Fspath("fs"), Fspath("raise"), b"bytes", None, 3, ["nested"]]
    plugins = [
        conftest("tests", collect_ignore=odd, collect_ignore_glob={"*_x.py"}),
        conftest("", collect_ignore=("docs", "../outside", str(tmp_path.parent / "elsewhere"))),
        conftest("other", collect_ignore="not a list", collect_ignore_glob=itertools.count()),
        conftest("", collect_ignore=["not", "a", "conftest"]),
    ]
    plugins[-1].__file__ = str(tmp_path / "some_plugin.py")  # a plugin module, not a conftest
    rules = selection_module.ignore_rules(plugins, str(tmp_path))
    assert rules == [
        "collect_ignore:docs",
        "collect_ignore:tests/fs",
        "collect_ignore:tests/gpu",
        "collect_ignore:tests/slow.py",
        "collect_ignore_glob:tests/*_x.py",
    ]
    assert selection_module.ignore_rules(list(reversed(plugins)), str(tmp_path)) == rules
    inner = ["collect_ignore:fs", "collect_ignore:gpu", "collect_ignore:slow.py", "collect_ignore_glob:*_x.py"]
    assert selection_module.ignore_rules(plugins, str(tmp_path / "tests")) == inner  # docs lies outside
    (tmp_path / "tests").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "tests")
    assert selection_module.ignore_rules([conftest("link", collect_ignore=["gpu"])], str(tmp_path)) == [
        "collect_ignore:tests/gpu"
    ]
    where = Where(("",), str(tmp_path), str(tmp_path))
    assert where.signature(("",), rules) == where.signature(("",), iter(list(reversed(rules)) + rules[:1]))
    assert where.signature(("",), iter(())) == where.signature(("",))

    class Hostile(types.ModuleType):
        def __getattr__(self, name: str) -> Any:
            raise RuntimeError(name)

    odd_names = conftest("tests", collect_ignore=["a\0b", "\ud800", "gpu"])  # pytest copes with them: signed
    told = selection_module.ignore_rules([Hostile("x"), odd_names], str(tmp_path))
    assert told == ["collect_ignore:tests/a\0b", "collect_ignore:tests/gpu", "collect_ignore:tests/\ud800"]
    assert where.signature(("",), told) != where.signature(("",))
    (tmp_path / "builds" / "1").mkdir(parents=True)
    (tmp_path / "builds" / "2").mkdir()
    (tmp_path / "latest").symlink_to(tmp_path / "builds" / "1")
    latest = [conftest("", collect_ignore=["latest"], collect_ignore_glob=["latest/*"])]
    signed = selection_module.ignore_rules(latest, str(tmp_path))
    (tmp_path / "latest").unlink()
    (tmp_path / "latest").symlink_to(tmp_path / "builds" / "2")  # a link repointed between runs: the same rule
    assert (
        selection_module.ignore_rules(latest, str(tmp_path))
        == signed
        == [
            "collect_ignore:latest",
            "collect_ignore_glob:latest/*",
        ]
    )


def test_a_checkout_elsewhere_signs_alike(tmp_path: Path) -> None:
    """The same job in another checkout dir (a CI runner's numbered workspace): nothing outside the rootdir is
    signed, an ``--ignore-glob`` or ``--ignore`` reaching out of it neither."""

    def signature(where: str) -> str:
        root = str(tmp_path / where / "repo")
        job = Where(("tests",), root, root, ignore=("../x",), ignore_glob=("../vendor/*", "*/gpu/*"))
        return job.signature(roots_of(job.args, root, root))

    assert signature("a") == signature("b")


def test_a_session_that_ignores_nothing_signs_as_the_version_before() -> None:
    """Bundles saved before conftest rules were read keep matching their jobs: with no rule, the signature is
    the one the version before computed (its value, not this code's, pinned here)."""
    where = Where(("tests",), "/r", "/r", keyword="fast", markexpr="not slow", ignore=("tests/gpu",))
    assert where.signature(("tests",)) == where.signature(("tests",), []) == "35136cc3a1ed037f"
    assert where.signature(("tests",), ["collect_ignore:tests/gpu"]) != "35136cc3a1ed037f"


def test_sessions_that_select_alike_sign_alike(tmp_path: Path) -> None:
    """The signature is how a session selects, not what it found: the same job's runs match after tests come
    and go, ``pytest tests`` matches ``pytest`` with testpaths = tests, and -k, -m, paths differ."""
    here = str(tmp_path)

    def signature(*args: str, **options: Any) -> str:
        where = Where(args, here, here, **options)
        return where.signature(roots_of(args, here, here))

    assert signature("tests") == signature(str(tmp_path / "tests")) == signature("./tests/")
    gpu = signature("tests", ignore=("tests/gpu",))
    assert (
        gpu == signature("tests", ignore=("./tests/gpu/",)) == signature("tests", ignore=(str(tmp_path / "tests/gpu"),))
    )
    assert signature("tests", markexpr="not  slow") == signature("tests", markexpr="not slow")
    assert signature("tests", ignore_glob=("*/gpu/",)) == signature("tests", ignore_glob=("./*/gpu",))
    sub = str(tmp_path / "tests")  # cd tests; pytest --ignore=gpu is not pytest tests --ignore=gpu
    assert Where((".",), sub, here, ignore=("gpu",)).signature(roots_of(["."], sub, here)) == gpu
    assert len({signature("tests"), signature("tests", keyword="fast"), signature("tests", markexpr="not gpu"),
                signature("tests/a.py"), signature("tests", deselect=("tests/a.py::t",))}) == 5  # fmt: skip


def test_no_collection_seen_is_no_selection(tmp_path: Path) -> None:
    where = Where(("",), str(tmp_path), str(tmp_path))
    assert where.selection(SelectionWatch(), ["a"]) is None
    assert where.selection(ControllerWatch(), ["a"]) is None
    controller = ControllerWatch()
    controller.pytest_xdist_node_collection_finished(None, ["t.py::a", "t.py::b"])
    selection = where.selection(controller, ["t.py::c"])
    assert selection is not None and selection.selected == {"t.py::a", "t.py::b"}
    assert selection.deselected == {"t.py::c"}
    nothing = ControllerWatch()  # the workers collected, and selected no test (-k nomatch)
    nothing.pytest_xdist_node_collection_finished(None, [])
    empty = where.selection(nothing, ["t.py::a"])
    assert empty is not None and empty.selected == frozenset() and empty.left_out(["t.py::a"]) == ["t.py::a"]


_OPEN: list[SessionContext] = []


@pytest.fixture(autouse=True)
def _close() -> Any:
    yield
    while _OPEN:
        _OPEN.pop().close()


def _controller(tmp_path: Path, xdist: bool = False) -> Controller:
    settings = Settings(mode="shared", dir=str(tmp_path / "cache"), store=str(tmp_path / "store"))
    context = SessionContext.start(settings, tmp_path / "default", inherited=None, problems=Problems())
    _OPEN.append(context)
    return Controller(context, Recorder("controller"), xdist=xdist)


def _lookup(key: str) -> GraphLookup:
    return GraphLookup(key, "miss", {"gm": (key, None)})


def test_a_session_that_left_out_restored_tests_saves_nothing_over_them(tmp_path: Path) -> None:
    """The save declines with the tests it left out named; a session that restored nothing saves what it has,
    and so does one that selected every test the restored record names."""
    _files(tmp_path, "t.py")
    controller = _controller(tmp_path)
    record = ItemRecord(nodeid="t.py::a")
    record.add({"fxgraph": {"miss": 1}, "frames": 1})
    controller.stats.add_record(record)
    phase = SavePhase(controller.context, controller.recorder)
    tests = {"t.py::a": [_lookup("k1")], "t.py::b": [_lookup("k2")], "t.py::c": [_lookup("k3")]}
    baseline = GraphsRecord(tests=tests, created=time.time())  # recent: see the stale test below
    subset = Selection(str(tmp_path), selected=frozenset({"t.py::a"}), deselected=frozenset({"t.py::b", "t.py::c"}))
    blobs = Gathered(blobs={"controller": b"mega-cache"})

    saved = phase.run(Restored(sync.RestoreResult("exact", key="k"), baseline=baseline), blobs, selection=subset)
    assert saved.result is not None and (saved.result.outcome, saved.result.message) == (
        "skipped",
        "the session left out 2 tests that the restored bundle covers (t.py::b and 1 more: deselected, or outside "
        "what its arguments collect), and no session that selects as this one saved that bundle: nothing saved "
        "over it before it is a week old",
    )
    assert not (tmp_path / "store").exists()

    cold = phase.run(Restored(sync.RestoreResult("miss"), baseline=baseline), blobs, selection=subset)
    assert cold.result is not None and cold.result.outcome == "saved", cold.result
    everything = Selection(str(tmp_path), selected=frozenset({"t.py::a", "t.py::b", "t.py::c"}))
    full = phase.run(Restored(sync.RestoreResult("exact", key="k"), baseline=baseline), blobs, selection=everything)
    assert full.result is not None and full.result.outcome == "saved", full.result


def test_a_job_that_always_selects_alike_saves_over_its_own_bundle(tmp_path: Path) -> None:
    """A bundle whose session selected as this one (``-m "not slow"`` every run) is this job's: it saves over it
    even when a test left that part of the suite meanwhile. The dir's record keeps the signature of the session
    that saved the restored bundle when this one does not save, so a later ``-k`` run cannot pass for that job."""
    _files(tmp_path, "t.py")
    controller = _controller(tmp_path)
    record = ItemRecord(nodeid="t.py::a", graphs=[_lookup("k1b")])  # it looked a graph up: a record is kept
    record.add({"fxgraph": {"miss": 1}, "frames": 1})
    controller.stats.add_record(record)
    phase = SavePhase(controller.context, controller.recorder)
    job = Selection(str(tmp_path), selected=frozenset({"t.py::a"}), deselected=frozenset({"t.py::b"}), signature="J")
    other = Selection(str(tmp_path), selected=frozenset({"t.py::a"}), deselected=frozenset({"t.py::b"}), signature="K")
    blobs = Gathered(blobs={"controller": b"mega-cache"})

    def restored(signature: str, age: float = 0.0) -> Restored:
        tests = {"t.py::a": [_lookup("k1")], "t.py::b": [_lookup("k2")]}
        baseline = GraphsRecord(tests=tests, selection=signature, created=time.time() - age)
        return Restored(sync.RestoreResult("exact", key="k"), baseline=baseline)

    declined = phase.run(restored("J"), blobs, selection=other)
    assert declined.result is not None and declined.result.outcome == "skipped", declined.result
    kept = load_record(tmp_path / "cache")
    assert kept is not None and kept.selection == "J"
    saved = phase.run(restored("J"), blobs, selection=job)
    assert saved.result is not None and saved.result.outcome == "saved", saved.result
    store = tmp_path / "store"
    [bundle_file] = store.iterdir()
    assert GraphsRecord.from_json(bundle.read_manifest(bundle_file).graphs).selection == "J"
    unknown = phase.run(restored(""), blobs, selection=job)  # a record from before signatures: not alike
    assert unknown.result is not None and unknown.result.outcome == "skipped", unknown.result


def test_a_bundle_of_another_selection_nothing_replaced_for_a_week_is_replaced(tmp_path: Path) -> None:
    """A job whose command line narrowed, or a bundle from before signatures: nothing keeps that bundle up to
    date, so after STALE_SECONDS any session that saves replaces it (else its misses would never be saved)."""
    _files(tmp_path, "t.py")
    controller = _controller(tmp_path)
    record = ItemRecord(nodeid="t.py::a", graphs=[_lookup("k1b")])
    record.add({"fxgraph": {"miss": 1}, "frames": 1})
    controller.stats.add_record(record)
    phase = SavePhase(controller.context, controller.recorder)
    narrowed = Selection(
        str(tmp_path), selected=frozenset({"t.py::a"}), deselected=frozenset({"t.py::b"}), signature="N"
    )
    blobs = Gathered(blobs={"controller": b"mega-cache"})
    tests = {"t.py::a": [_lookup("k1")], "t.py::b": [_lookup("k2")]}
    now = time.time()
    for age, outcome in ((STALE_SECONDS - 3600, "skipped"), (STALE_SECONDS + 3600, "saved")):
        # From before signatures (its making counts); a full run's, whose record a later session here rewrote
        # (created is recent, selected_at is when the bundle's session made it).
        for selection, created, at in (("", now - age, 0.0), ("F", now, now - age)):
            baseline = GraphsRecord(tests=tests, created=created, selection=selection, selected_at=at)
            saved = phase.run(
                Restored(sync.RestoreResult("exact", key="k"), baseline=baseline), blobs, selection=narrowed
            )
            assert saved.result is not None and saved.result.outcome == outcome, (age, selection, saved.result)
            kept = load_record(tmp_path / "cache")  # a session that does not save does not restart the clock
            assert kept is not None, "no record kept"
            assert kept.selected_at == (at or created), (kept.selected_at, at, created)
    # A time more than a day ahead of this clock is not believed (a hostile or skewed record): replaceable.
    ahead = GraphsRecord(tests=tests, created=now, selection="F", selected_at=now + 3 * 86400)
    saved = phase.run(Restored(sync.RestoreResult("exact", key="k"), baseline=ahead), blobs, selection=narrowed)
    assert saved.result is not None and saved.result.outcome == "saved", saved.result


def test_a_job_whose_every_graph_hit_renews_its_bundle_every_half_week(tmp_path: Path) -> None:
    """A stable suite's job hits everything and would never save: its bundle would look abandoned after a week
    and the first narrowed session with a miss would replace it. Half a week after its bundle's session, such a
    session saves again (one upload every few days)."""
    _files(tmp_path, "t.py")
    controller = _controller(tmp_path)
    record = ItemRecord(nodeid="t.py::a", graphs=[GraphLookup("k1", "hit", {"gm": ("k1", None)})])
    record.add({"fxgraph": {"hit": 1}, "frames": 1})
    controller.stats.add_record(record)
    phase = SavePhase(controller.context, controller.recorder)
    job = Selection(str(tmp_path), selected=frozenset({"t.py::a"}), signature="J")
    blobs = Gathered(blobs={"controller": b"mega-cache"})
    now = time.time()
    for signature, age, outcome in (
        ("J", STALE_SECONDS / 2 - 3600, "skipped"),
        ("J", STALE_SECONDS / 2 + 3600, "saved"),
        ("K", STALE_SECONDS / 2 + 3600, "skipped"),  # another job's bundle: that job renews it
    ):
        baseline = GraphsRecord(tests={"t.py::a": [_lookup("k1")]}, created=now, selection=signature)
        baseline.selected_at = now - age
        saved = phase.run(Restored(sync.RestoreResult("exact", key="k"), baseline=baseline), blobs, selection=job)
        assert saved.result is not None and saved.result.outcome == outcome, (signature, age, saved.result)


def test_a_records_times_survive_the_file_and_hostile_values(tmp_path: Path) -> None:
    """selected_at is kept on disk also without a signature (a bundle from before signatures, or --lf's): the
    xdist controller and the Action's later steps read the file. Odd values read as unknown, never as an error."""
    record = GraphsRecord(tests={"t.py::a": [_lookup("k1")]}, created=200.0, selected_at=100.0)
    save_record(tmp_path, record)
    kept = load_record(tmp_path)
    assert kept is not None and (kept.selection, kept.selected_at, kept.created) == ("", 100.0, 200.0)
    for value in (10**400, float("nan"), "1", None, True, [1]):
        data = {**record.to_json(), "selected_at": value, "created": value}
        read = GraphsRecord.from_json(data)
        assert (read.selected_at, read.created) == (0.0, 0.0), value


def test_the_dir_record_says_how_the_restored_bundles_session_selected(tmp_path: Path) -> None:
    """A dir whose own record is newer than the restored bundle's keeps its graphs, not its signature: a -k
    session here since must not pass for the job that saved the bundle."""
    cache = tmp_path / "cache"
    cache.mkdir()
    save_record(
        cache, GraphsRecord(tests={"t.py::a": [_lookup("k1")]}, created=200.0, selection="K", selected_at=200.0)
    )
    bundle_record = GraphsRecord(tests={"t.py::b": [_lookup("k2")]}, created=100.0, selection="F", selected_at=100.0)
    record = install_restored(cache, bundle_record.to_json())
    assert set(record.tests) == {"t.py::a", "t.py::b"} and (record.selection, record.selected_at) == ("F", 100.0)
    kept = load_record(cache)
    assert kept is not None and kept.selection == "F"


def test_workers_send_what_they_deselected_and_the_controller_folds_it(tmp_path: Path) -> None:
    controller = _controller(tmp_path, xdist=True)
    where = Where((".",), str(tmp_path), str(tmp_path))
    watch = controller.watch_selection(where)
    assert isinstance(watch, ControllerWatch)
    watch.pytest_xdist_node_collection_finished(None, ["t.py::a"])
    worker = Worker(controller.context, Recorder("gw0"))
    seen = worker.watch_selection(where)
    seen.pytest_deselected([type("Item", (), {"nodeid": "t.py::b"})()])
    seen.ignored.update({str(tmp_path / "integration"), str(tmp_path), str(tmp_path.parent / "elsewhere")})
    seen.rules = ["collect_ignore:integration"]  # a conftest's collect_ignore (the plugin's hook wrapper saw it)
    worker.recorder.record("t.py::a", {"fxgraph": {"miss": 1}, "frames": 1})
    sent = json.loads(json.dumps(worker.output()))
    assert sent["deselected"] == ["t.py::b"] and str(tmp_path / "integration") in sent["ignored"]
    assert sent["rules"] == ["collect_ignore:integration"]
    gathered = Gathered.fold([("gw0", ProcessOutput.from_json(sent)), ("gw1", ProcessOutput.from_json({}))])
    assert gathered.rules == {"collect_ignore:integration"}
    hostile = ProcessOutput.from_json({"rules": ["collect_ignore:a", 1, None, ["b"]], "ignored": [2, "/x"]})
    assert hostile is not None and (hostile.rules, hostile.ignored) == (["collect_ignore:a"], ["/x"])
    folded = where.selection(watch, gathered.deselected, gathered.ignored, gathered.rules)
    assert folded is not None and folded.skipped == ("integration",)  # not the rootdir, nothing outside it
    assert folded.signature == where.signature(("",), ["collect_ignore:integration"]) != where.signature(("",))
    other = Worker(controller.context, Recorder("gw1"))  # collected the same: one list is enough
    other_watch = other.watch_selection(where)
    other_watch.pytest_deselected([type("Item", (), {"nodeid": "t.py::b"})()])
    other_watch.ignored.add(str(tmp_path / "integration"))
    other_watch.rules = ["collect_ignore:integration"]
    assert [json.loads(json.dumps(other.output()))[name] for name in ("deselected", "ignored", "rules")] == [[]] * 3
    named = Worker(controller.context, Recorder("fast-1"))  # --tx popen//id=fast-1: no gw0 to count on
    named.watch_selection(where).pytest_deselected([type("Item", (), {"nodeid": "t.py::b"})()])
    assert json.loads(json.dumps(named.output()))["deselected"] == ["t.py::b"]
    controller.add_worker("gw0", {**sent, "blob": b"mega-cache"})  # it compiled: there is something to save
    _files(tmp_path, "t.py", "integration/i.py")
    tests = {"t.py::a": [_lookup("k1")], "t.py::b": [_lookup("k2")], "integration/i.py::t": [_lookup("k3")]}
    baseline = GraphsRecord(tests=tests, created=time.time())
    controller.start.finish = lambda reported=(): Restored(  # type: ignore[method-assign]
        sync.RestoreResult("exact", key="k"), baseline=baseline
    )
    controller.finish()
    saved = controller.outcome().saved
    assert isinstance(saved, sync.SaveResult) and saved.outcome == "skipped", saved
    assert "left out 2 tests that the restored bundle covers (integration/i.py::t and 1 more" in saved.message


def test_a_saving_session_registers_the_watches_that_see_what_collection_ignored(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The plugin registers both watches in a session that saves to a store (no torch here: the fingerprint is
    handed over, as the Action's plan step hands it to the pytest step), and only there."""
    from pytest_compilecache import fingerprint

    here = {**fingerprint.platform_facts(), "torch_path": fingerprint._torch_path(), "torch": "0.0"}
    monkeypatch.setenv(fingerprint.HANDOVER_ENV, json.dumps(here))
    pytester.makeconftest("collect_ignore = ['integration']\n")
    pytester.makepyfile(test_unit="def test_u(): pass\n")
    (pytester.path / "integration").mkdir()
    (pytester.path / "integration" / "test_i.py").write_text("def test_i(): pass\n")
    options = [f"--compile-cache-dir={tmp_path / 'cache'}", "-p", "no:cacheprovider"]

    saving = pytester.inline_run(*options, f"--compile-cache-store={tmp_path / 'store'}")
    saving.assertoutcome(passed=1)
    plugins = saving.getcall("pytest_collection_finish").session.config.pluginmanager
    watch = plugins.get_plugin("compilecache-selection")
    assert isinstance(watch, SelectionWatch) and watch.selected == frozenset({"test_unit.py::test_u"})
    assert str(pytester.path / "integration") in watch.ignored
    assert plugins.get_plugin("compilecache-ignored").ignored is watch.ignored
    local = pytester.inline_run(*options)  # no store: nothing to guard, no watch
    local.assertoutcome(passed=1)
    assert (
        local.getcall("pytest_collection_finish").session.config.pluginmanager.get_plugin("compilecache-ignored")
        is None
    )


def test_the_ignore_watch_only_watches_a_hook_that_raised(pytester: pytest.Pytester) -> None:
    """A conftest's ``pytest_ignore_collect`` that raises is pytest's to report, as without the plugin, not a
    warning about this plugin's hook wrapper (an error with ``filterwarnings = error``)."""
    pytester.makeini("[pytest]\nfilterwarnings = error\n")
    pytester.makeconftest(
        "def pytest_ignore_collect(collection_path):\n"
        "    if collection_path.name == 'broken':\n"
        "        raise ValueError('boom from conftest')\n"
        "    if collection_path.name == 'kept':\n"
        "        return False  # collected, whatever pytest's own rules say\n"
    )
    pytester.makepyfile(test_a="def test_a(): pass\n")
    (pytester.path / "broken").mkdir()
    (pytester.path / "kept").mkdir()
    (pytester.path / "kept" / "test_k.py").write_text("def test_k(): pass\n")
    watch = SelectionWatch()
    result = pytester.inline_run(plugins=[watch, plugin._IgnoreWatch(watch.ignored)])
    (report,) = [r for r in result.getreports("pytest_collectreport") if r.failed]
    assert "ValueError: boom from conftest" in str(report.longrepr)
    assert "Pluggy" not in str(report.longrepr) and str(pytester.path / "broken") not in watch.ignored
    (pytester.path / "broken").rmdir()
    watch = SelectionWatch()
    pytester.inline_run(plugins=[watch, plugin._IgnoreWatch(watch.ignored)]).assertoutcome(passed=2)
    assert str(pytester.path / "kept") not in watch.ignored and "kept/test_k.py::test_k" in (watch.selected or ())
