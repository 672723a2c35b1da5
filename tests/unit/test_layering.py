"""The documented shape of the package, checked from its source (ARCHITECTURE.md, "Rules the shape enforces").

Imports flow one way, down the layers below; no module imports a name from the package root (it only
re-exports); only ``plugin`` imports pytest, only ``probe`` torch, only ``stores.s3`` boto3, only ``remote``
and ``probe`` (which guards torch's Redis backend) redis. Imports under ``if TYPE_CHECKING:`` run never and
may point anywhere. A new module must be given its layer here, so the layering cannot drift unnoticed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "pytest_compilecache"

# Top to bottom; a module imports only from layers strictly below its own (a package's submodules share
# its layer and may import each other).
LAYERS: list[set[str]] = [
    {"__main__"},
    {"plugin", "cli", "action_api"},
    {"session"},
    {"save_phase"},
    {"restore_phase"},
    {"payload", "recorder"},
    {"sync"},
    {"bundle"},
    {"container", "install", "stores", "fingerprint"},
    {"cachedir"},
    {"report", "problems"},
    {"stats", "settings", "probe", "miss_report"},
    {"explain", "remote", "headers", "dynamo_costs"},
    {"manifest"},
    {"ghrunner", "_fs", "_env"},
    {"_version", "errors", "options", "record_fields"},
]
ONLY = {
    "pytest": {"plugin"},
    "_pytest": {"plugin"},
    "torch": {"probe"},
    "boto3": {"stores"},
    "redis": {"remote", "probe"},
}


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts) or "__init__"
        found[name] = path
    return found


def _runtime_imports(path: Path, name: str) -> list[tuple[int, str, str]]:
    """``(line, kind, target)``: kind ``ours`` (a module of the package, dotted from its root), ``root`` (a
    name taken from the package root) or ``other`` (a top-level package name). TYPE_CHECKING blocks skipped."""
    tree = ast.parse(path.read_text())
    is_package = path.name == "__init__.py"
    package = name.split(".") if is_package else name.split(".")[:-1]
    if name == "__init__":
        package = []
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(child) for stmt in node.body for child in ast.walk(stmt))
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "pytest_compilecache" or alias.name.startswith("pytest_compilecache."):
                    target = alias.name.partition(".")[2]
                    found.append((node.lineno, "ours" if target else "root", target or alias.name))
                else:
                    found.append((node.lineno, "other", alias.name.split(".")[0]))
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                module = node.module or ""
                if module == "pytest_compilecache":
                    found += [(node.lineno, "root", alias.name) for alias in node.names]
                elif module.startswith("pytest_compilecache."):
                    found.append((node.lineno, "ours", module.partition(".")[2]))
                else:
                    found.append((node.lineno, "other", module.split(".")[0]))
                continue
            base = package[: len(package) - node.level + 1]
            target = ".".join([*base, node.module] if node.module else base)
            if target:
                found.append((node.lineno, "ours", target))
            else:  # from . import x: a submodule, or a name of the root
                modules = _modules()
                for alias in node.names:
                    kind = "ours" if alias.name in modules else "root"
                    found.append((node.lineno, kind, alias.name))
    return found


def _layer(module: str) -> int:
    top = module.split(".")[0]
    for index, layer in enumerate(LAYERS):
        if top in layer:
            return index
    raise AssertionError(f"pytest_compilecache.{module} has no layer: add it to LAYERS in {__file__}")


MODULES = sorted(name for name in _modules() if name != "__init__")


@pytest.mark.parametrize("name", MODULES)
def test_imports_flow_down_the_layers(name: str) -> None:
    own = _layer(name)
    path = _modules()[name]
    wrong = []
    for line, kind, target in _runtime_imports(path, name):
        where = f"{path.relative_to(PACKAGE.parent)}:{line}"
        if kind == "root":
            wrong.append(f"{where} imports {target!r} from the package root (import it from its module)")
        elif kind == "ours":
            if target.split(".")[0] == name.split(".")[0]:
                continue  # within one package (stores, cachedir)
            if _layer(target) <= own:
                wrong.append(f"{where} imports {target} (layer {_layer(target)}) from layer {own}: upward or sideways")
        elif target in ONLY and name.split(".")[0] not in ONLY[target]:
            wrong.append(f"{where} imports {target}: only {sorted(ONLY[target])} may")
    assert not wrong, "\n".join(wrong)


def test_every_module_has_a_layer() -> None:
    for name in MODULES:
        _layer(name)


def test_the_checker_sees_a_violation(tmp_path: Path) -> None:
    """The rules can fail: an upward import, a root import and a torch import outside probe are all seen."""
    bad = tmp_path / "x.py"
    bad.write_text("from . import ConfigError\nfrom .session import Setup\nimport torch\n")
    imports = _runtime_imports(bad, "report")
    assert ("root", "ConfigError") in [(kind, target) for _, kind, target in imports]
    assert ("ours", "session") in [(kind, target) for _, kind, target in imports]
    assert ("other", "torch") in [(kind, target) for _, kind, target in imports]
    assert _layer("session") < _layer("report")


def test_no_module_of_ours_is_rewritten_by_pytest() -> None:
    """pytest rewrites the asserts of every module in a plugin's package on import unless its docstring says
    ``PYTEST_DONT_REWRITE``: parsing and recompiling each module, every session where bytecode cannot be
    cached (``PYTHONDONTWRITEBYTECODE``, common in CI images). We use no assert the rewrite would improve."""
    missing = [name for name, path in _modules().items() if "PYTEST_DONT_REWRITE" not in path.read_text()]
    assert not missing, f"add PYTEST_DONT_REWRITE to the docstrings of {missing}"
