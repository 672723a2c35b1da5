"""Which tests a session selected, and which tests of a restored bundle it left out.

A bundle holds what its session used, and the next run restores the newest bundle: a session that ran part
of the suite (``-k``, ``-m``, ``--lf``, node ids, a plugin that deselects) and saved would replace the
coverage it restored with its part. :meth:`Selection.left_out` names the tests of the restored bundle's
record that such a save would drop although they still exist, so the save phase can decline.

A test of the record counts as left out when this session did not select it and either deselected it
(pytest's ``pytest_deselected``: it exists), or its file still exists and lies outside what the session's
arguments collect (``pytest tests/a.py``, a node id, ``--ignore``, or what pytest's ``pytest_ignore_collect``
ignored: a conftest's ``collect_ignore``, a plugin). A test that was neither selected nor
deselected inside what the arguments collect was deleted or renamed: dropping it loses nothing. With
``--lf`` (which drops whole files without telling the hook) every test of the record it did not select counts.

The save declines only when the restored bundle's session selected otherwise: :meth:`Where.signature` is how a
session selects (kept in the graph record), so a job that always runs the same part of the suite saves over
its own bundles. A bundle that no session of its own selection saved for :data:`STALE_SECONDS` is abandoned,
and any session replaces it (the save phase's ``_against``).

Nothing here imports pytest: :class:`SelectionWatch` and :class:`ControllerWatch` are registered as plugins
by :mod:`.plugin`, whose hooks pytest finds by name.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass
from typing import Any
from typing import Iterable
from typing import Sequence

# A bundle of another selection that no session has replaced for this long is replaced by any session that
# saves: nothing keeps it up to date (a job whose command line narrowed, a bundle from before signatures).
STALE_SECONDS = 7 * 24 * 3600


@dataclass(frozen=True)
class Selection:
    """What a session selected: ``roots`` (what its arguments collect, as rootdir-relative node-id prefixes;
    ``""`` is the whole rootdir), ``selected`` and ``deselected`` (node ids), ``ignored`` (``--ignore`` paths,
    rootdir-relative, and ``--ignore-glob`` patterns made absolute as pytest does), ``rootdir``, and ``skipped``:
    the rootdir-relative paths collection ignored (``pytest_ignore_collect``: a conftest's ``collect_ignore``,
    a plugin, ``--ignore`` too)."""

    rootdir: str
    roots: tuple[str, ...] = ("",)
    selected: frozenset[str] = frozenset()
    deselected: frozenset[str] = frozenset()
    ignored: tuple[str, ...] = ()
    ignored_globs: tuple[str, ...] = ()
    signature: str = ""
    skipped: tuple[str, ...] = ()

    def left_out(self, tests: Iterable[str]) -> list[str]:
        """The tests of ``tests`` (a restored record's node ids) this session left out though they still
        exist, sorted."""
        out = []
        for nodeid in tests:
            if nodeid in self.selected:
                continue
            if nodeid in self.deselected or (self._exists(nodeid) and not self._collected(nodeid)):
                out.append(nodeid)
        return sorted(out)

    def _exists(self, nodeid: str) -> bool:
        return os.path.exists(os.path.join(self.rootdir, _file(nodeid)))

    def _collected(self, nodeid: str) -> bool:
        """Whether this session's arguments collect ``nodeid``'s test (not: whether it was selected)."""
        path = _file(nodeid)
        if any(_under(path, hole) for hole in (*self.ignored, *self.skipped)):
            return False
        if self.ignored_globs:  # pytest matches each dir on the way down, and the file
            parts = path.split("/")
            for depth in range(1, len(parts) + 1):
                here = os.path.join(self.rootdir, *parts[:depth])
                if any(fnmatch.fnmatch(here, glob) for glob in self.ignored_globs):
                    return False
        return any(covers(root, nodeid) for root in self.roots)


def covers(root: str, nodeid: str) -> bool:
    """Whether collecting ``root`` (a rootdir-relative path or node id, ``""`` for the rootdir) collects
    ``nodeid``: ``tests`` covers ``tests/a.py::t``; ``tests/a.py::t`` covers ``tests/a.py::t[1]``, not
    ``tests/a.py::u``."""
    if root == "":
        return True
    if "::" in root:
        return nodeid == root or nodeid.startswith((root + "::", root + "["))
    return _under(_file(nodeid), root)


def roots_of(args: Sequence[str], invocation_dir: str, rootdir: str, pyargs: bool = False) -> tuple[str, ...]:
    """pytest's collection arguments (``config.args``: what the user typed, else ``testpaths``, else the
    invocation dir) as rootdir-relative node-id prefixes. An argument outside the rootdir covers nothing: its
    tests count as left out, which only ever declines a save. With ``--pyargs`` a module name is its file or
    package dir (pytest imported it to collect); one that cannot be found covers everything, so that only
    what pytest deselected counts."""
    roots = []
    for arg in args:
        path, sep, rest = str(arg).partition("::")
        absolute = os.path.normpath(os.path.join(invocation_dir, path))
        if pyargs and not os.path.exists(absolute):
            found = _module_path(path)
            if found is None:
                roots.append("")
                continue
            absolute = found
        relative = os.path.relpath(absolute, rootdir) if _inside(absolute, rootdir) else None
        if relative is None:
            roots.append("\0" + str(arg))  # matches no node id
            continue
        relative = "" if relative == "." else relative.replace(os.sep, "/")
        roots.append(relative + sep + rest if sep else relative)
    return tuple(roots)


def _module_path(name: str) -> str | None:
    """Where module ``name`` lives (a package's dir), as ``--pyargs`` collects it; None when not found."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return os.path.normpath(next(iter(spec.submodule_search_locations)))
    return os.path.normpath(spec.origin) if spec.origin else None


def ignored_of(paths: Sequence[str], invocation_dir: str, rootdir: str) -> tuple[str, ...]:
    """``--ignore`` values as rootdir-relative paths (those outside the rootdir ignore none of its tests)."""
    out = []
    for path in paths:
        absolute = os.path.normpath(os.path.join(invocation_dir, str(path)))
        if _inside(absolute, rootdir):
            out.append(os.path.relpath(absolute, rootdir).replace(os.sep, "/"))
    return tuple(out)


def globs_of(patterns: Sequence[str], invocation_dir: str) -> tuple[str, ...]:
    """``--ignore-glob`` values made absolute, as pytest matches them (``absolutepath``: normalised)."""
    return tuple(os.path.abspath(os.path.join(invocation_dir, str(p))) for p in patterns)


def _file(nodeid: str) -> str:
    return nodeid.partition("::")[0]


def _under(path: str, root: str) -> bool:
    return root in ("", ".") or path == root or path.startswith(root.rstrip("/") + "/")


def _relative(path: str, rootdir: str) -> str:
    return os.path.relpath(os.path.normpath(path), rootdir).replace(os.sep, "/")


def _inside(path: str, directory: str) -> bool:
    try:
        return os.path.commonpath([path, os.path.normpath(directory)]) == os.path.normpath(directory)
    except ValueError:  # another drive (Windows)
        return False


class SelectionWatch:
    """A plugin for a process that collects tests (a plain session, an xdist worker): the node ids pytest
    deselected (every ``-k``/``-m``/``--lf``/``--deselect`` and any plugin that deselects reports them through
    ``pytest_deselected``) and those it selected, the paths collection ignored (:attr:`ignored`) and the
    conftests' rules for that (:attr:`rules`)."""

    def __init__(self) -> None:
        self.selected: frozenset[str] | None = None
        self.deselected: set[str] = set()
        # paths pytest_ignore_collect ignored (filled by the plugin's hook wrapper, which needs pytest's marker)
        self.ignored: set[str] = set()
        self.rules: list[str] = []  # what the conftests tell collection to ignore (ignore_rules)

    def pytest_deselected(self, items: Sequence[Any]) -> None:
        self.deselected.update(item.nodeid for item in items)

    def pytest_collection_finish(self, session: Any) -> None:
        self.selected = frozenset(item.nodeid for item in session.items)
        self.rules = ignore_rules(session.config.pluginmanager.get_plugins(), str(session.config.rootpath))


class ControllerWatch:
    """A plugin for an xdist controller, which collects nothing itself: each worker says what it selected."""

    def __init__(self) -> None:
        self.selected: set[str] = set()
        self.reported = False  # a worker said what it collected (maybe nothing)

    def pytest_xdist_node_collection_finished(self, node: Any, ids: Sequence[str]) -> None:
        self.selected.update(ids)
        self.reported = True


def ignore_rules(plugins: Iterable[Any], rootdir: str) -> list[str]:
    """What the loaded conftests (among ``plugins``: pytest registers each as a plugin) tell collection to ignore,
    their ``collect_ignore`` and ``collect_ignore_glob`` values resolved as pytest resolves them (from the
    conftest's dir), rootdir-relative, sorted: the rules as written, not the files they match nor where a link
    among them points. A value outside the rootdir is left out (it would sign where this checkout lies), and so
    is one pytest could not read either; nothing here raises (it runs in the user's session)."""
    roots = tuple(dict.fromkeys((os.path.realpath(rootdir), os.path.normpath(rootdir))))  # reached through a link too
    rules = set()
    for module in plugins:
        try:
            file = getattr(module, "__file__", None)
            if not isinstance(file, str) or os.path.basename(file) != "conftest.py":
                continue
            here = os.path.dirname(os.path.realpath(file))
            for name in ("collect_ignore", "collect_ignore_glob"):
                for value in _paths(getattr(module, name, None)):
                    path = os.path.normpath(os.path.join(here, value))  # links in the value stay as written
                    inside = [root for root in roots if _inside(path, root)]
                    if inside:
                        rules.add(f"{name}:{_relative(path, inside[0])}")
        except Exception:  # a plugin object or a value we cannot read (a NUL byte...): not a rule we can sign
            continue
    return sorted(rules)


def _paths(values: Any, limit: int = 10_000) -> list[str]:
    """A conftest's list of paths as pytest reads it (any iterable of ``str`` or ``os.PathLike``): each value
    pytest could read, the first ``limit`` of them; one of another type, or whose ``__fspath__`` fails, skipped."""
    if values is None or isinstance(values, (str, bytes)):
        return []
    out: list[str] = []
    try:
        for count, value in enumerate(values):
            if count >= limit:
                break
            try:
                text = os.fspath(value) if isinstance(value, (str, os.PathLike)) else None
            except Exception:  # a user's object: skipped, never the session's failure
                continue
            if isinstance(text, str):
                out.append(text)
    except Exception:  # not iterable, or an iterator that failed: what it gave so far
        pass
    return out


def describe(left: Sequence[str]) -> str:
    """``left`` (node ids, sorted) in a few words: the first, and how many more."""
    more = f" and {len(left) - 1} more" if len(left) > 1 else ""
    return f"{left[0]}{more}"


@dataclass(frozen=True)
class Where:
    """What shapes a session's collection, as plain values from pytest's config: ``args`` (``config.args``),
    ``invocation_dir``, ``rootdir``, and the options that select (``-k``, ``-m``, ``--deselect``, ``--ignore``,
    ``--ignore-glob``, ``--lf``, ``--sw``, ``--pyargs``)."""

    args: tuple[str, ...]
    invocation_dir: str
    rootdir: str
    ignore: tuple[str, ...] = ()
    ignore_glob: tuple[str, ...] = ()
    keyword: str = ""
    markexpr: str = ""
    deselect: tuple[str, ...] = ()
    last_failed: bool = False
    stepwise: bool = False
    pyargs: bool = False

    @classmethod
    def of(cls, config: Any) -> Where:
        """From pytest's ``Config`` (read, never imported here; options of a disabled plugin read as unset)."""
        option = config.option

        def values(name: str) -> tuple[str, ...]:
            return tuple(str(v) for v in getattr(option, name, None) or ())

        return cls(
            tuple(str(arg) for arg in config.args),
            str(config.invocation_params.dir),
            str(config.rootpath),
            values("ignore"),
            values("ignore_glob"),
            str(getattr(option, "keyword", "") or ""),
            str(getattr(option, "markexpr", "") or ""),
            values("deselect"),
            bool(getattr(option, "lf", False)),
            # pytest's own configure turns --sw-skip and --sw-reset into --sw, after this plugin's
            any(getattr(option, name, False) for name in ("stepwise", "stepwise_skip", "stepwise_reset")),
            bool(getattr(option, "pyargs", False)),
        )

    def signature(self, roots: Sequence[str], rules: Iterable[str] = ()) -> str:
        """How this session selects, as a short hash: sessions that select alike (the same job's runs) match,
        whatever tests the suite gains or loses between them, and however their paths are spelt. "" (alike to
        none) for ``--lf`` and ``--sw``, which select anew in every run. ``rules``: what the conftests tell
        collection to ignore (:func:`ignore_rules`), so a job whose conftest leaves a dir out by an environment
        variable is another selection; the rules, never the files they match, which come and go."""
        if self.last_failed or self.stepwise:
            return ""
        import hashlib
        import json

        root = self.rootdir
        absolute = globs_of(self.ignore_glob, self.invocation_dir)
        globs = sorted(os.path.relpath(g, root) for g in absolute if _inside(g, root))  # not where a checkout lies
        shape = [sorted(roots), " ".join(self.keyword.split()), " ".join(self.markexpr.split()),
                 sorted(self.deselect), sorted(ignored_of(self.ignore, self.invocation_dir, root)), globs]  # fmt: skip
        told = sorted(set(rules))
        if told:  # none: the signature of the versions before (a bundle they saved still matches)
            shape.append(told)
        return hashlib.sha256(json.dumps(shape).encode()).hexdigest()[:16]

    def selection(
        self,
        watch: SelectionWatch | ControllerWatch,
        deselected: Iterable[str],
        ignored: Iterable[str] = (),
        rules: Iterable[str] = (),
    ) -> Selection | None:
        """The session's :class:`Selection` from its watch and the workers' deselected node ids, ignored paths
        (absolute, as :attr:`SelectionWatch.ignored`) and conftest rules (:func:`ignore_rules`); None when the
        watch saw no collection (a session that stopped in collection, an xdist controller whose workers never
        said what they collected).

        ``--lf`` leaves whole files out without telling ``pytest_deselected``: with it, every test of the
        record this session did not select counts as left out (its file exists), a deleted one too."""
        if isinstance(watch, ControllerWatch):
            selected: frozenset[str] | None = frozenset(watch.selected) if watch.reported else None
            own: set[str] = set()
            skips: set[str] = set()
            told: list[str] = []
        else:
            selected, own, skips, told = watch.selected, watch.deselected, watch.ignored, watch.rules
        if selected is None:
            return None
        here, root = self.invocation_dir, self.rootdir
        roots = roots_of(self.args, here, root, self.pyargs)
        skipped = tuple(sorted({_relative(path, root) for path in (*skips, *ignored) if _inside(path, root)} - {"."}))
        return Selection(
            rootdir=root,
            roots=() if self.last_failed else roots,
            selected=selected,
            deselected=frozenset(own) | frozenset(deselected),
            ignored=ignored_of(self.ignore, here, root),
            ignored_globs=globs_of(self.ignore_glob, here),
            signature=self.signature(roots, [*told, *rules]),
            skipped=skipped,
        )
