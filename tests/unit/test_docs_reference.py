"""The docs' reference pages are generated from the code (scripts/docs_reference.py) and committed: they must
match what the code defines today, and document every option and every Action input and output."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from pytest_compilecache._env import SIGNING_KEY_ENV
from pytest_compilecache.settings import OPTIONS

REPO = Path(__file__).resolve().parents[2]


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_reference", REPO / "scripts" / "docs_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("docs_reference", module)
    spec.loader.exec_module(module)
    return module


def test_the_committed_reference_pages_are_what_the_code_generates() -> None:
    pages = generator().pages()
    assert set(pages) == {REPO / "docs" / "reference" / "options.md", REPO / "docs" / "reference" / "action.md"}
    for path, text in pages.items():
        assert path.read_text() == text, f"{path.name} is stale: run python scripts/docs_reference.py"


def test_the_options_page_documents_every_option_in_its_three_spellings() -> None:
    page = generator().render_options()
    rows = [line for line in page.splitlines() if line.startswith("| `--compile-cache")]
    assert len(rows) == len(OPTIONS)
    for option, row in zip(OPTIONS, rows):
        assert row.startswith(f"| `{option.cli}` |") or row.startswith(f"| `{option.cli}=VALUE` |"), row
        assert f"| `{option.ini}` | `{option.env}` |" in row, row
        assert " ".join(option.help.split()) in row.replace("\\|", "|")
    assert f"| `{SIGNING_KEY_ENV}` |" in page


def test_defaults_are_shown_as_users_write_them() -> None:
    page = generator().render_options()
    row = re.compile(r"^\| `(--[a-z-]+)[=A-Z]*` \| [^|]+ \| [^|]+ \| ([^|]+) \|", re.M)
    shown = {match.group(1): match.group(2) for match in row.finditer(page)}
    assert shown["--compile-cache-max-bundle-size"].strip() == "`2G`"
    assert shown["--compile-cache-store-timeout"].strip() == "`300`"
    assert shown["--compile-cache-explain"].strip() == "on"
    assert shown["--compile-cache-keep"].strip() == "off"
    assert shown["--compile-cache-key-salt"].strip() == "empty"
    assert shown["--compile-cache"].strip() == "unset"


def test_the_action_page_documents_every_input_and_output() -> None:
    action = yaml.safe_load((REPO / "action.yml").read_text())
    page = generator().render_action()
    for section in ("inputs", "outputs"):
        for name in action[section]:
            assert f"| `{name}` |" in page, f"the Action reference does not document {section[:-1]} {name}"


def test_check_mode_names_a_stale_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    module = generator()
    stale = tmp_path / "options.md"
    stale.write_text("old text\n")
    monkeypatch.setattr(module, "ROOT", tmp_path)
    monkeypatch.setattr(module, "pages", lambda: {stale: "new text\n", tmp_path / "action.md": "same\n"})
    (tmp_path / "action.md").write_text("same\n")
    assert module.main(["--check"]) == 1
    assert "stale: options.md" in capsys.readouterr().err
    assert stale.read_text() == "old text\n"  # --check never writes
    assert module.main([]) == 0 and stale.read_text() == "new text\n"
