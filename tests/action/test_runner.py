"""The runner stand-in itself: expressions, runner files and actions/cache semantics it must get right."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.action.runner import ExpressionError
from tests.action.runner import FakeActionsCache
from tests.action.runner import Job
from tests.action.runner import evaluate
from tests.action.runner import parse_vars
from tests.action.runner import render

REPO = Path(__file__).resolve().parents[2]


def _context(**extra: Any) -> dict[str, Any]:
    return {
        "inputs": {"install": "true", "store": "github", "key-prefix": "cc"},
        "steps": {"plan": {"outputs": {"transfer": "github", "save": "true"}, "outcome": "success"}},
        "github": {"event_name": "push", "action_path": "/a"},
        "runner": {"temp": "/t"},
        "env": {"HOME": "/root"},
        "__status__": lambda function: {"success": True, "always": True, "failure": False}[function],
        **extra,
    }


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("inputs.install == 'true'", True),
        ("${{ inputs.install == 'TRUE' }}", True),  # strings compare case-insensitively
        ("steps.plan.outputs.transfer == 'github' && steps.plan.outputs.save == 'true'", True),
        ("steps.plan.outputs.transfer == 'github' && steps.plan.outputs.save != 'true'", False),
        ("steps.plan.outputs.missing == ''", True),
        ("!(inputs.store == 'github') || false", False),
        ("success()", True),
        ("failure() || always()", True),
        ("env.NOT_SET", None),
        ("'it''s'", "it's"),
        ("inputs.key-prefix", "cc"),
    ],
)
def test_evaluate(expression: str, value: Any) -> None:
    assert evaluate(expression, _context()) == value


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("cancelled()", "function cancelled"),
        ("contains(inputs.store, 's3')", "unsupported syntax"),
        ("matrix.python", "context 'matrix'"),
        ("inputs.nope", "inputs.nope is not defined"),
        ("steps.nope.outputs.x", "steps.nope is not defined"),
        ("inputs.store > 'a'", "unsupported syntax"),
        ("inputs.store ==", "unexpected end"),
        ("inputs.install == true", "mixed types"),
        ("(inputs.store", "unexpected end"),
        ("(inputs.store inputs.key-prefix)", "missing"),
    ],
)
def test_evaluate_fails_loudly_outside_the_subset(expression: str, message: str) -> None:
    with pytest.raises(ExpressionError, match=message):
        evaluate(expression, _context())


def test_render() -> None:
    assert render("${{ runner.temp }}/x-${{ inputs.key-prefix }}", _context()) == "/t/x-cc"
    assert render(True, {}) == "true" and render(3, {}) == "3"
    with pytest.raises(ExpressionError):
        render("${{ secrets.TOKEN }}", _context())


def test_every_expression_in_action_yml_is_in_the_subset() -> None:
    """Walk action.yml: each ``${{ }}`` and ``if:`` parses (evaluation is the end-to-end tests' job)."""
    metadata = yaml.safe_load((REPO / "action.yml").read_text())
    steps = {step["id"]: {"outputs": {}, "outcome": "success"} for step in metadata["runs"]["steps"] if "id" in step}
    context = _context(inputs={k: "" for k in metadata["inputs"]}, steps=steps)
    seen = 0

    def walk(node: Any, key: str = "") -> None:
        nonlocal seen
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, k)
        elif isinstance(node, list):
            for item in node:
                walk(item)
        elif isinstance(node, str):
            if key == "if":
                evaluate(node, context)
                seen += 1
            elif "${{" in node:
                render(node, context)
                seen += 1

    walk(metadata)
    assert seen > 20


def test_parse_vars() -> None:
    text = "A=1\nB=x=y\nC<<EOF\nline 1\nline 2\nEOF\n\nD=\n"
    assert parse_vars(text) == {"A": "1", "B": "x=y", "C": "line 1\nline 2", "D": ""}
    with pytest.raises(ValueError, match="malformed"):
        parse_vars("garbage\n")
    with pytest.raises(ValueError, match="no closing"):
        parse_vars("C<<EOF\nline\n")


# ---- actions/cache


@pytest.fixture
def cache(tmp_path: Path) -> FakeActionsCache:
    return FakeActionsCache(tmp_path / "cache")


def _dir(path: Path, name: str, text: str) -> str:
    path.mkdir(parents=True, exist_ok=True)
    (path / name).write_text(text)
    return str(path)


def test_cache_exact_key_then_newest_by_prefix(cache: FakeActionsCache, tmp_path: Path) -> None:
    src = tmp_path / "src"
    for key in ("p-a-1", "p-a-2", "p-b-3"):
        shutil_rm(src)
        _dir(src, "f", key)
        assert cache.save([str(src)], key, "refs/heads/main") == f"Cache saved with key: {key}"
    dest = tmp_path / "dest"
    assert cache.restore([str(dest)], "p-a-1", ["p-a-"], "refs/heads/main") is None  # other path: other version
    shutil_rm(src)
    assert cache.restore([str(src)], "p-a-1", ["p-a-"], "refs/heads/main") == "p-a-1"
    assert cache.restore([str(src)], "p-a-9", ["p-a-"], "refs/heads/main") == "p-a-2"
    assert (src / "f").read_text() == "p-a-2"
    assert cache.restore([str(src)], "p-c-9", ["p-c-", "p-"], "refs/heads/main") == "p-b-3"
    assert cache.restore([str(src)], "p-c-9", ["q-"], "refs/heads/main") is None


def test_cache_entries_are_immutable(cache: FakeActionsCache, tmp_path: Path) -> None:
    src = _dir(tmp_path / "src", "f", "one")
    cache.save([src], "k", "refs/heads/main")
    _dir(tmp_path / "src", "f", "two")
    assert "Unable to reserve cache with key k" in cache.save([src], "k", "refs/heads/main")
    cache.restore([src], "k", [], "refs/heads/main")
    assert (Path(src) / "f").read_text() == "one"


def test_cache_missing_path_saves_nothing(cache: FakeActionsCache, tmp_path: Path) -> None:
    assert "Path Validation Error" in cache.save([str(tmp_path / "absent")], "k", "refs/heads/main")
    (tmp_path / "empty").mkdir()
    assert "Path Validation Error" in cache.save([str(tmp_path / "empty" / "*.bundle")], "k", "refs/heads/main")
    assert cache.keys() == []


def test_cache_glob_round_trip(cache: FakeActionsCache, tmp_path: Path) -> None:
    staging = tmp_path / "staging"
    _dir(staging, "a.bundle", "new")
    _dir(staging, ".a.bundle.1.tmp", "partial")
    pattern = [str(staging / "*.bundle")]
    cache.save(pattern, "k", "refs/heads/main")
    shutil_rm(staging)
    assert cache.restore(pattern, "k", [], "refs/heads/main") == "k"
    assert [p.name for p in staging.iterdir()] == ["a.bundle"]


def test_cache_scopes(cache: FakeActionsCache, tmp_path: Path) -> None:
    src = _dir(tmp_path / "src", "f", "x")
    cache.save([src], "p-branch", "refs/heads/feature")
    cache.save([src], "p-main", "refs/heads/main")
    assert cache.restore([src], "none", ["p-"], "refs/pull/1/merge") == "p-main"  # not another branch's
    assert cache.restore([src], "none", ["p-"], "refs/heads/feature") == "p-branch"  # own ref first


def test_job_post_step_saves_unless_exact_or_failed(cache: FakeActionsCache, tmp_path: Path) -> None:
    def job(run_id: int) -> Job:
        return Job(root=tmp_path, cache=cache, event="push", run_id=run_id, workspace=tmp_path)

    first = job(1)
    path = str(first.temp / "out")
    first.use("actions/cache@v4", {"path": path, "key": "k-1", "restore-keys": "k-"})
    _dir(Path(path), "f", "1")
    first.finish()
    assert cache.keys() == ["k-1"]

    exact = job(2)
    assert exact.use("actions/cache@v4", {"path": path, "key": "k-1"}).outputs == {"cache-hit": "true"}
    assert "not saving" in exact.finish()[0].stdout

    failing = job(3)
    failing.use("actions/cache@v4", {"path": path, "key": "k-3"})
    assert failing.run("exit 3").outcome == "failure"
    assert failing.finish()[0].outcome == "skipped"
    assert cache.keys() == ["k-1"]

    reader = job(4)
    out = reader.use("actions/cache/restore@v4", {"path": path, "key": "k-4", "restore-keys": "k-"}).outputs
    assert out == {"cache-hit": "false", "cache-primary-key": "k-4", "cache-matched-key": "k-1"}
    assert reader.finish() == []


def test_job_accumulates_env_outputs_and_summary(cache: FakeActionsCache, tmp_path: Path) -> None:
    job = Job(root=tmp_path, cache=cache, event="push", run_id=1, workspace=tmp_path)
    first = job.run('echo "A=1" >> "$GITHUB_ENV"; echo "x=2" >> "$GITHUB_OUTPUT"; echo "# hi" >> "$GITHUB_STEP_SUMMARY"'
                    '; echo "::warning title=t::careful"')
    assert first.outputs == {"x": "2"}
    assert job.run('test "$A" = 1 && test "$RUNNER_TEMP" = "' + str(job.temp) + '"').outcome == "success"
    assert job.summary == "# hi\n"
    assert job.warnings() == ["careful"]


def shutil_rm(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)
