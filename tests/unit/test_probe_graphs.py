"""probe's per-lookup capture against a hand-written fake of torch's codecache (no torch import).

The fake has torch's shape: a class ``FxGraphCache`` whose staticmethod ``load_with_key(key, debug_lines,
...)`` returns ``(graph or None, cache_info)``. The real thing is proven in
``tests/integration/test_explain_real.py``.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any
from typing import Iterator

import pytest

from pytest_compilecache import probe
from pytest_compilecache.probe import graphs
from pytest_compilecache.probe import hooks

LINES = [
    "[aaaa] gm: def forward(self, x):\n    return (x * 2.0,)",
    "[bbbb] fx_kwargs[is_backward]: False",
    "[cccc] torch_version: \ufffd\x01",
]


def _fake_torch(monkeypatch: pytest.MonkeyPatch, load_with_key: Any) -> type:
    torch = types.ModuleType("torch")
    torch.__version__ = "9.9.9"  # type: ignore[attr-defined]
    inductor = types.ModuleType("torch._inductor")
    config = types.ModuleType("torch._inductor.config")
    config._config = {}  # type: ignore[attr-defined]
    codecache = types.ModuleType("torch._inductor.codecache")
    cache = type("FxGraphCache", (), {"load_with_key": load_with_key})
    codecache.FxGraphCache = cache  # type: ignore[attr-defined]
    inductor.config = config  # type: ignore[attr-defined]
    for name, module in (
        ("torch", torch),
        ("torch._inductor", inductor),
        ("torch._inductor.config", config),
        ("torch._inductor.codecache", codecache),
    ):
        monkeypatch.setitem(sys.modules, name, module)
    return cache


@pytest.fixture(autouse=True)
def _fresh_capture() -> Iterator[None]:
    probe.uninstall_graph_capture()
    yield
    probe.uninstall_graph_capture()


def _cache_hit_on(hit_key: str) -> Any:
    @staticmethod  # type: ignore[misc]
    def load_with_key(key: str, debug_lines: list[str], *args: Any, **kwargs: Any) -> Any:
        if key == "boom":
            raise RuntimeError("torch failed")
        state = "hit" if key == hit_key else "miss"
        return (object() if state == "hit" else None), {"cache_state": state, "key": key}

    return load_with_key


def test_the_capture_records_each_lookup_and_returns_torchs_result_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    cache = _fake_torch(monkeypatch, _cache_hit_on("k1"))
    assert probe.graph_capture_installed() is None
    assert probe.graph_capture_active()
    start = probe.graph_mark()
    graph, info = cache.load_with_key("k1", LINES, [], True, None, False, None)  # type: ignore[attr-defined]
    assert graph is not None and info["cache_state"] == "hit"
    cache.load_with_key("k2", LINES, [], True, None, False, None)  # type: ignore[attr-defined]
    with pytest.raises(RuntimeError, match="torch failed"):  # torch's own errors pass through
        cache.load_with_key("boom", LINES)  # type: ignore[attr-defined]
    lookups = probe.graph_delta(start)
    assert [(g["k"], g["o"]) for g in lookups] == [("k1", "hit"), ("k2", "miss")]
    assert lookups[0]["c"]["torch_version"] == ["cccc", "9.9.9"]  # torch's bytes replaced by the version
    assert lookups[0]["c"]["fx_kwargs[is_backward]"] == ["bbbb", "False"]
    assert probe.graph_delta(probe.graph_mark()) == []
    probe.uninstall_graph_capture()
    assert "load_with_key" in cache.__dict__ and not hasattr(cache.__dict__["load_with_key"].__func__, "__wrapped__")


def test_a_torch_without_the_api_gets_a_note_not_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    @staticmethod  # type: ignore[misc]
    def load_with_key(key: str, lines: list[str]) -> Any:  # renamed parameter: not the API we know
        return None, {}

    _fake_torch(monkeypatch, load_with_key)
    note = probe.graph_capture_installed()
    assert note is not None and "no miss explanations" in note
    assert not probe.graph_capture_active()


def test_watch_installs_the_capture_when_the_codecache_is_imported(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    package = tmp_path / "fake_inductor_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "codecache.py").write_text(
        "class FxGraphCache:\n"
        "    @staticmethod\n"
        "    def load_with_key(key, debug_lines, *args):\n"
        "        return None, {'cache_state': 'miss'}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(graphs, "CODECACHE", "fake_inductor_pkg.codecache")
    monkeypatch.setattr(graphs, "graph_capture_installed", lambda: installed.append(True))
    installed: list[bool] = []
    # The plugin running this very session watches for torch's real codecache: leave its finder out.
    monkeypatch.setattr(sys, "meta_path", [f for f in sys.meta_path if not isinstance(f, hooks._InstallOnImport)])
    before = list(sys.meta_path)
    probe.watch_graph_lookups()
    probe.watch_graph_lookups()  # twice: one finder only
    assert len(sys.meta_path) == len(before) + 1
    try:
        import fake_inductor_pkg.codecache  # type: ignore[import-not-found]  # noqa: F401
    finally:
        sys.modules.pop("fake_inductor_pkg.codecache", None)
        sys.modules.pop("fake_inductor_pkg", None)
    assert installed == [True]
    assert sys.meta_path == before  # the finder removed itself
