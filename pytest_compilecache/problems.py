"""One collector for what a session has to say besides statistics: notes, warnings, errors.

The policy lives here, once: infrastructure trouble is a *warning* (one line, the session goes on and
compiles cold) unless the user asked for it to fail the session, either with ``--compile-cache-strict``
or with a warning filter that names :class:`~pytest_compilecache.CompileCacheWarning` as an error
(``-W error::pytest_compilecache.CompileCacheWarning``). A filter that names the class as ``ignore``
hides the line. A blanket ``filterwarnings = error`` does *not* escalate cache trouble: it is aimed at
the project's own warnings, and a store that is down must not fail a project's CI (say
``error::pytest_compilecache.CompileCacheWarning`` to get that).
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import re
import warnings
from typing import Any
from typing import Callable
from typing import Literal

from .errors import CompileCacheWarning

Action = Literal["show", "ignore", "error"]
Classifier = Callable[[str], Action]


def always_show(message: str) -> Action:
    return "show"


class Problems:
    """Notes (facts worth a line), warnings (infrastructure trouble) and errors (the session fails).

    A plain class, not a dataclass: every session with a cache dir makes one, and making a dataclass costs
    more at import than this whole class does in a session (``bench/overhead.py``).
    """

    def __init__(
        self,
        strict: bool = False,
        classify: Classifier = always_show,
        notes: list[str] | None = None,
        warnings: list[str] | None = None,
        errors: list[str] | None = None,
    ) -> None:
        self.strict = strict
        self.classify = classify
        self.notes: list[str] = notes if notes is not None else []
        self.warnings: list[str] = warnings if warnings is not None else []
        self.errors: list[str] = errors if errors is not None else []

    def __repr__(self) -> str:
        return f"Problems(strict={self.strict}, notes={self.notes}, warnings={self.warnings}, errors={self.errors})"

    def note(self, message: str) -> None:
        if message not in self.notes:
            self.notes.append(message)

    def warn(self, message: str) -> None:
        """Infrastructure trouble: one line; an error too under ``strict`` or an ``error::`` filter."""
        action = self.classify(message)
        if action == "ignore" and not self.strict:
            return
        if message not in self.warnings:
            self.warnings.append(message)
        if self.strict or action == "error":
            self.error(message)

    def error(self, message: str) -> None:
        """The session fails with this message (hit-rate guard, strict trouble)."""
        if message not in self.errors:
            self.errors.append(message)

    def to_json(self) -> dict[str, list[str]]:
        return {"notes": list(self.notes), "warnings": list(self.warnings), "errors": list(self.errors)}

    def merge(self, data: Any) -> None:
        """Add what a worker reported (its :meth:`to_json`); malformed parts are ignored."""
        if not isinstance(data, dict):
            return
        for name, add in (("notes", self.note), ("warnings", self.warnings_append), ("errors", self.error)):
            for message in data.get(name) or ():
                if isinstance(message, str):
                    add(message)

    def warnings_append(self, message: str) -> None:
        # A worker already applied the policy: its warnings and errors arrive as they are.
        if message not in self.warnings:
            self.warnings.append(message)


def filter_classifier(apply_filters: Callable[[], None]) -> Classifier:
    """A classifier that applies warning filters to our warnings: ``apply_filters`` installs them into
    :mod:`warnings` (the plugin passes pytest's own parsing of ini ``filterwarnings`` then ``-W``).

    Only filters whose category is :class:`CompileCacheWarning` (or a subclass) can turn it into an error;
    broader ones (``error``, ``error::UserWarning``) leave it a warning; ``ignore`` filters of any
    breadth hide it.
    """

    def classify(message: str) -> Action:
        try:
            with warnings.catch_warnings():
                apply_filters()
                filters = list(warnings.filters)
        except Exception:  # a filter pytest itself would reject: pytest reports it; we just show the line
            return "show"
        for action, text, category, module, lineno in filters:
            if not issubclass(CompileCacheWarning, category):
                continue
            if text is not None and not _match(text, message):
                continue
            if module is not None and not _match(module, "pytest_compilecache"):
                continue
            if lineno:
                continue
            if action == "ignore":
                return "ignore"
            if action == "error":
                return "error" if issubclass(category, CompileCacheWarning) else "show"
            return "show"
        return "show"

    return classify


def _match(pattern: Any, text: str) -> bool:
    if isinstance(pattern, re.Pattern):
        return pattern.match(text) is not None
    return bool(pattern.match(text)) if hasattr(pattern, "match") else False
