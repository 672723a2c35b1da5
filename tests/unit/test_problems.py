"""problems: the one policy for notes, warnings and errors (strict, and pytest's warning filters)."""

from __future__ import annotations

import pytest

from pytest_compilecache.plugin import warning_classifier as filter_classifier
from pytest_compilecache.problems import Problems


def test_warnings_are_lines_unless_strict() -> None:
    problems = Problems()
    problems.warn("store down")
    problems.warn("store down")  # the same trouble twice is one line
    problems.note("fyi")
    assert problems.to_json() == {"notes": ["fyi"], "warnings": ["store down"], "errors": []}
    strict = Problems(strict=True)
    strict.warn("store down")
    assert strict.warnings == ["store down"] and strict.errors == ["store down"]


@pytest.mark.parametrize(
    ("ini", "cmdline", "expected"),
    [
        ([], [], "show"),
        (["error"], [], "show"),  # a blanket error filter is aimed at the project's own warnings
        (["error::UserWarning"], [], "show"),
        (["error::pytest_compilecache.CompileCacheWarning"], [], "error"),
        ([], ["error::pytest_compilecache.CompileCacheWarning"], "error"),
        (
            ["error::pytest_compilecache.CompileCacheWarning"],
            ["ignore::pytest_compilecache.CompileCacheWarning"],
            "ignore",
        ),  # -W comes after the ini file, as in pytest
        (["ignore::UserWarning"], [], "ignore"),
        (["error::pytest_compilecache.CompileCacheWarning:.*other.*"], [], "show"),  # message does not match
        (["error:store down:pytest_compilecache.CompileCacheWarning"], [], "error"),
    ],
)
def test_filters_decide(ini: list[str], cmdline: list[str], expected: str) -> None:
    assert filter_classifier(ini, cmdline)("store down") == expected


def test_filter_policy_applies_to_warn() -> None:
    escalate = Problems(classify=filter_classifier(["error::pytest_compilecache.CompileCacheWarning"], []))
    escalate.warn("bundle corrupt")
    assert escalate.errors == ["bundle corrupt"]
    hide = Problems(classify=filter_classifier(["ignore::pytest_compilecache.CompileCacheWarning"], []))
    hide.warn("bundle corrupt")
    assert hide.warnings == [] and hide.errors == []
    hide_but_strict = Problems(strict=True, classify=hide.classify)
    hide_but_strict.warn("bundle corrupt")
    assert hide_but_strict.errors == ["bundle corrupt"]


def test_a_broken_filter_shows_the_line() -> None:
    assert filter_classifier(["error::no.such.Module"], [])("x") == "show"


def test_merge_takes_a_workers_report_as_is() -> None:
    controller = Problems()
    controller.merge({"notes": ["n"], "warnings": ["w"], "errors": ["e"], "junk": [1]})
    controller.merge(None)
    controller.merge({"warnings": [3, "w"]})
    assert controller.to_json() == {"notes": ["n"], "warnings": ["w"], "errors": ["e"]}
