"""The documented shape of the package, checked from its source (ARCHITECTURE.md, "Rules the shape enforces").

Imports flow one way, down the layers below; no module imports a name from the package root (it only
re-exports); only ``plugin`` imports pytest, only ``probe`` torch, only ``stores`` boto3 and the Google and
Azure SDKs (each in its own backend, lazily), only ``remote`` and ``probe`` (which guards torch's Redis
backend) redis. Imports under ``if TYPE_CHECKING:`` are arrows of the graph too (a type named from a layer
above is a dependency on it): they follow the same layers, and only the rules about third-party packages
(which such an import never loads) skip them. A new module must be given its layer here, so the layering
cannot drift unnoticed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "pytest_compilecache"

# Top to bottom; a module imports only from layers strictly below its own (a package's submodules share
# its layer and may import each other).
LAYERS: list[set[str]] = [
    {"__main__", "_entry"},
    {"plugin", "cli", "action_api"},
    {"session"},
    {"save_phase", "restore_phase"},
    {"payload"},
    {"recorder"},
    {"context"},
    {"sync"},
    {"bundle"},
    {"container", "install", "stores", "fingerprint"},
    {"cachedir"},
    {"report", "problems"},
    {"miss_report"},
    {"dynamo_costs"},
    {"stats", "settings", "probe"},
    {"explain", "remote", "pch"},
    {"manifest"},
    {"ghrunner", "_fs"},
    {"_version", "errors", "options", "_loader", "record_fields", "selection"},
    {"_env"},
]
ONLY = {
    "pytest": {"plugin"},
    "_pytest": {"plugin"},
    "torch": {"probe"},
    "boto3": {"stores"},
    "google": {"stores"},  # stores/gcs.py, lazily
    "azure": {"stores"},  # stores/azure.py, lazily
    "redis": {"remote", "probe"},
}


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts) or "__init__"
        found[name] = path
    return found


def _runtime_imports(path: Path, name: str, *, typing_too: bool = False) -> list[tuple[int, str, str]]:
    """``(line, kind, target)``: kind ``ours`` (a module of the package, dotted from its root), ``root`` (a
    name taken from the package root) or ``other`` (a top-level package name). TYPE_CHECKING blocks skipped
    unless ``typing_too``."""
    tree = ast.parse(path.read_text())
    is_package = path.name == "__init__.py"
    package = name.split(".") if is_package else name.split(".")[:-1]
    if name == "__init__":
        package = []
    skipped: set[int] = set()
    for node in ast.walk(tree) if not typing_too else ():
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
    runtime = set(_runtime_imports(path, name))
    for line, kind, target in _runtime_imports(path, name, typing_too=True):
        where = f"{path.relative_to(PACKAGE.parent)}:{line}"
        if kind == "root":
            wrong.append(f"{where} imports {target!r} from the package root (import it from its module)")
        elif kind == "ours":
            if target.split(".")[0] == name.split(".")[0]:
                continue  # within one package (stores, cachedir)
            if _layer(target) <= own:
                wrong.append(f"{where} imports {target} (layer {_layer(target)}) from layer {own}: upward or sideways")
        elif (line, kind, target) in runtime and target in ONLY and name.split(".")[0] not in ONLY[target]:
            wrong.append(f"{where} imports {target}: only {sorted(ONLY[target])} may")
    assert not wrong, "\n".join(wrong)


def test_the_import_graph_has_no_circle() -> None:
    """Module-level, function-local and TYPE_CHECKING imports alike: no module reaches itself again (packages
    as one node, as their layer is one)."""
    graph: dict[str, set[str]] = {}
    for name, path in _modules().items():
        node = name.split(".")[0]
        targets = {t.split(".")[0] for _, kind, t in _runtime_imports(path, name, typing_too=True) if kind == "ours"}
        graph.setdefault(node, set()).update(targets - {node})
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path_now: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path_now.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                cycle = path_now[path_now.index(target) :] + [target]
                raise AssertionError("import circle: " + " -> ".join(cycle))
            if target not in state:
                visit(target)
        path_now.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)


def test_every_module_has_a_layer() -> None:
    for name in MODULES:
        _layer(name)


def test_the_checker_sees_a_violation(tmp_path: Path) -> None:
    """The rules can fail: an upward import, a root import and a torch import outside probe are all seen."""
    bad = tmp_path / "x.py"
    bad.write_text(
        "from typing import TYPE_CHECKING\nfrom . import ConfigError\nfrom .session import Controller\n"
        "import torch\nif TYPE_CHECKING:\n    from .plugin import x\n"
    )
    imports = _runtime_imports(bad, "report")
    assert ("root", "ConfigError") in [(kind, target) for _, kind, target in imports]
    assert ("ours", "session") in [(kind, target) for _, kind, target in imports]
    assert ("other", "torch") in [(kind, target) for _, kind, target in imports]
    assert ("ours", "plugin") not in [(kind, target) for _, kind, target in imports]
    typed = _runtime_imports(bad, "report", typing_too=True)
    assert ("ours", "plugin") in [(kind, target) for _, kind, target in typed]  # a TYPE_CHECKING arrow counts
    assert _layer("session") < _layer("report")


def test_no_module_of_ours_is_rewritten_by_pytest() -> None:
    """pytest rewrites the asserts of every module in a plugin's package on import unless its docstring says
    ``PYTEST_DONT_REWRITE``: parsing and recompiling each module, every session where bytecode cannot be
    cached (``PYTHONDONTWRITEBYTECODE``, common in CI images). We use no assert the rewrite would improve."""
    missing = [name for name, path in _modules().items() if "PYTEST_DONT_REWRITE" not in path.read_text()]
    assert not missing, f"add PYTEST_DONT_REWRITE to the docstrings of {missing}"


MODULE_LINES, CLASS_LINES, FUNCTION_LINES = 600, 250, 80


@pytest.mark.parametrize("name", sorted(_modules()))
def test_modules_and_functions_stay_small(name: str) -> None:
    """A module past 600 lines, a class past 250 or a function past 80 has grown a second job: give it its
    own module or object. The Action's Python (``action/``) is held to the same sizes."""
    path = _modules()[name]
    _check_size(path)


@pytest.mark.parametrize("path", sorted((PACKAGE.parent / "action").glob("*.py")), ids=lambda p: p.name)
def test_the_actions_python_stays_small(path: Path) -> None:
    _check_size(path)


def _check_size(path: Path) -> None:
    source = path.read_text()
    lines = len(source.splitlines())
    assert lines <= MODULE_LINES, f"{path.name}: {lines} lines"
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines, line {node.lineno})"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > (CLASS_LINES if isinstance(node, ast.ClassDef) else FUNCTION_LINES)
    ]
    assert not long, f"{path.name}: {long}"
