"""The package's metadata as PyPI and users read it (issue 30). scripts/check-package.sh builds the sdist and
the wheel and checks them with twine and check-wheel-contents; this checks what those tools do not."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.servers import require_module_or_fail

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def project() -> dict[str, Any]:
    if sys.version_info < (3, 11):
        pytest.skip("tomllib is Python 3.11+")
    import tomllib

    return dict(tomllib.loads((REPO / "pyproject.toml").read_text())["project"])


def test_license_is_an_spdx_expression_with_its_file(project: dict[str, Any]) -> None:
    assert project["license"] == "MIT"
    assert project["license-files"] == ["LICENSE"] and (REPO / "LICENSE").is_file()
    assert "MIT License" in (REPO / "LICENSE").read_text()
    # PEP 639: no license classifier beside an expression (PyPI rejects the pair).
    assert not [c for c in project["classifiers"] if c.startswith("License ::")]


def test_classifiers_exist_and_cover_the_declared_pythons(project: dict[str, Any]) -> None:
    require_module_or_fail("trove_classifiers")
    from trove_classifiers import classifiers as known

    unknown = [c for c in project["classifiers"] if c not in known]
    assert not unknown, f"PyPI refuses unknown classifiers: {unknown}"
    lowest = re.fullmatch(r">=3\.(\d+)", project["requires-python"])
    assert lowest, project["requires-python"]
    declared = {int(m.group(1)) for c in project["classifiers"] if (m := re.fullmatch(r".*:: 3\.(\d+)", c))}
    assert min(declared) == int(lowest.group(1)) and declared == set(range(min(declared), max(declared) + 1))
    assert {"Framework :: Pytest", "Typing :: Typed"} <= set(project["classifiers"])


def test_urls_keywords_and_the_torch_range(project: dict[str, Any]) -> None:
    assert {"Homepage", "Documentation", "Source", "Issues", "Changelog"} <= set(project["urls"])
    assert all(url.startswith("https://") for url in project["urls"].values())
    assert {"pytest", "torch"} <= set(project["keywords"])
    # No trove classifier names torch versions: the supported range is the torch extra (docs/compatibility.md).
    assert project["optional-dependencies"]["torch"] == ["torch>=2.7,<2.16"]


def test_the_package_is_typed() -> None:
    assert (REPO / "pytest_compilecache" / "py.typed").is_file()
    assert 'pytest_compilecache = ["py.typed"]' in (REPO / "pyproject.toml").read_text()


def test_the_code_parses_as_the_lowest_declared_python(project: dict[str, Any]) -> None:
    """``requires-python`` is what the code can run on: every module's syntax is that Python's, and every
    module that annotates defers its annotations (``X | None`` in a signature is 3.10 syntax at run time)."""
    import ast

    lowest = re.fullmatch(r">=3\.(\d+)", project["requires-python"])
    assert lowest, project["requires-python"]
    for path in sorted([*(REPO / "pytest_compilecache").rglob("*.py"), *(REPO / "action").glob("*.py")]):
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source, str(path), feature_version=(3, int(lowest.group(1))))
        annotates = any(
            isinstance(node, ast.AnnAssign) or (isinstance(node, ast.FunctionDef) and node.returns is not None)
            for node in ast.walk(tree)
        )
        assert not annotates or "from __future__ import annotations" in source, path
