"""How this package's modules load inside pytest: as any library's do, not through pytest's rewriting hook.

pytest hands every module of a plugin's distribution to its assertion-rewriting import hook. Ours opt out
of rewriting (each docstring says ``PYTEST_DONT_REWRITE``), yet the hook still loads each one through its own
cache: on the first session after an install (the pyc pip wrote is not the one the hook reads) and in every
session where ``PYTHONDONTWRITEBYTECODE`` is set, as in many CI images, it parses and compiles the module
from source; otherwise it reads and hashes the source and unmarshals its own pyc, about 2M instructions per
module. :class:`OwnModules`, ahead of that hook in ``sys.meta_path``, gives our submodules Python's own path
finder instead; :func:`when_imported` runs code just before a module (torch) is first imported. A leaf:
imports nothing of ours. PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import sys
from typing import Any
from typing import Callable

PREFIX = __name__.rpartition(".")[0] + "."


class OwnModules:
    """A ``sys.meta_path`` finder for this package's submodules: Python's path finder, with the usual pyc."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if path is None or not name.startswith(PREFIX):
            return None
        from importlib.machinery import PathFinder  # loaded by importlib itself: costs a dict lookup

        return PathFinder.find_spec(name, path)


def load_plainly() -> Callable[[], None]:
    """Put one :class:`OwnModules` first in ``sys.meta_path`` (once) and return the function that takes it
    out again. It must come out when the session ends: a finder left there keeps its module (and through it
    every module) alive into the interpreter's shutdown, whose garbage collections then cost more than the
    finder saved."""
    found = [finder for finder in sys.meta_path if isinstance(finder, OwnModules)]
    finder = found[0] if found else OwnModules()
    if not found:
        sys.meta_path.insert(0, finder)

    def forget() -> None:
        if finder in sys.meta_path:
            sys.meta_path.remove(finder)

    return forget


class _OnImport:
    """A ``sys.meta_path`` entry that calls ``then()`` when ``module`` is first imported, before it loads (one
    string comparison per import until then; it removes itself once used and finds nothing itself)."""

    def __init__(self, module: str, then: Callable[[], None]) -> None:
        self.module, self.then = module, then

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == self.module:
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            self.then()


def when_imported(module: str, then: Callable[[], None], add_cleanup: Callable[[Callable[[], None]], None]) -> None:
    """Call ``then()`` now if ``module`` is imported, else just before it is (e.g. to load ``probe`` and
    install its hooks only in a session that imports torch). The import hook goes through ``add_cleanup``
    (the session's): a later session in the same process (pytester, an IDE) must not call this one's
    ``then``, and a hook left in ``sys.meta_path`` would keep the whole session alive until the interpreter
    exits."""
    if module in sys.modules:
        then()
        return
    hook = _OnImport(module, then)
    sys.meta_path.insert(0, hook)

    def forget() -> None:
        if hook in sys.meta_path:
            sys.meta_path.remove(hook)

    add_cleanup(forget)
