"""action/main.py unit by unit: save decisions, plans, the plugin's environment, staging, restore, commands."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.action.runner import parse_vars

RUN = {"GITHUB_RUN_ID": "1234", "GITHUB_RUN_ATTEMPT": "2"}


@pytest.fixture
def environ(tmp_path: Path) -> dict[str, str]:
    temp = tmp_path / "runner-temp"
    temp.mkdir()
    files = {name: tmp_path / name for name in ("env", "output", "summary")}
    for path in files.values():
        path.write_text("")
    return {
        **RUN,
        "GITHUB_EVENT_NAME": "push",
        "GITHUB_WORKSPACE": str(tmp_path / "work"),
        "RUNNER_TEMP": str(temp),
        "GITHUB_ENV": str(files["env"]),
        "GITHUB_OUTPUT": str(files["output"]),
        "GITHUB_STEP_SUMMARY": str(files["summary"]),
    }


@pytest.fixture(autouse=True)
def _torch_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """restore() points torch at the cache dir through os.environ: put it back after each test."""
    for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        monkeypatch.delenv(name, raising=False)


# ---- save decisions


@pytest.mark.parametrize(
    ("value", "event", "saves"),
    [
        ("auto", "push", True),
        ("auto", "schedule", True),
        ("auto", "workflow_dispatch", True),
        ("auto", "merge_group", True),
        ("auto", "pull_request", False),
        ("auto", "pull_request_review", False),
        ("auto", "release", False),
        ("", "push", True),
        ("true", "pull_request", True),
        ("TRUE", "pull_request", True),
        ("false", "push", False),
        ("auto", "pull_request_target", False),
        ("true", "pull_request_target", False),
    ],
)
def test_decide_save(action: ModuleType, value: str, event: str, saves: bool) -> None:
    decided, why = action.decide_save(value, event)
    assert decided is saves
    assert why


def test_decide_save_explains_pull_request_target(action: ModuleType) -> None:
    assert "never" in action.decide_save("true", "pull_request_target")[1]


def test_decide_save_rejects_other_values(action: ModuleType) -> None:
    with pytest.raises(action.InputError, match="input save"):
        action.decide_save("sometimes", "push")


# ---- plans


def test_plan_for_github_store(action: ModuleType, environ: dict[str, str], fingerprint: Any) -> None:
    plan = action.make_plan(environ, fingerprint)
    temp = Path(environ["RUNNER_TEMP"])
    digest = fingerprint.digest()
    assert plan.transfer == "github" and plan.save
    assert plan.key == f"compilecache-v1-{digest}-1234-2"
    assert plan.restore_prefix == f"compilecache-v1-{digest}-"
    assert plan.staging == str(temp / "compilecache-staging")
    assert plan.cache_dir == str(temp / "compilecache-dir")
    assert plan.fingerprint == fingerprint.to_json()
    assert action.Plan.from_json(json.loads(json.dumps(plan.to_json()))) == plan


def test_plugin_env_for_a_saving_github_run(action: ModuleType, environ: dict[str, str], fingerprint: Any) -> None:
    plan = action.make_plan(environ, fingerprint)
    assert action.plugin_env(plan) == {
        "PYTEST_COMPILECACHE_MODE": "shared",
        "PYTEST_COMPILECACHE_SUMMARY": "auto",
        "PYTEST_COMPILECACHE_JSON": plan.json,
        "PYTEST_COMPILECACHE_DIR": plan.cache_dir,
        "PYTEST_COMPILECACHE_RESTORE": "skip",
        "PYTEST_COMPILECACHE_KEY_PREFIX": "compilecache-v1",
        "PYTEST_COMPILECACHE_RUN_SUFFIX": "1234-2",
        "PYTEST_COMPILECACHE_STORE": plan.staging,
        "PYTEST_COMPILECACHE_KEEP_BUNDLES": "1",
    }


def test_plugin_env_for_a_pull_request(action: ModuleType, environ: dict[str, str], fingerprint: Any) -> None:
    environ.update(GITHUB_EVENT_NAME="pull_request", INPUT_SUMMARY="false", INPUT_MIN_HIT_RATE="0.9")
    env = action.plugin_env(action.make_plan(environ, fingerprint))
    assert "PYTEST_COMPILECACHE_STORE" not in env
    assert env["PYTEST_COMPILECACHE_READONLY"] == "true"
    assert env["PYTEST_COMPILECACHE_SUMMARY"] == "off"
    assert env["PYTEST_COMPILECACHE_MIN_HIT_RATE"] == "0.9"


def test_plugin_env_for_s3(action: ModuleType, environ: dict[str, str], fingerprint: Any) -> None:
    environ.update(INPUT_STORE="s3://bucket/ci/cache", INPUT_KEY_PREFIX="shard-1", INPUT_KEY_SALT="model-v2")
    plan = action.make_plan(environ, fingerprint)
    env = action.plugin_env(plan)
    assert plan.transfer == "direct"
    assert env["PYTEST_COMPILECACHE_STORE"] == "s3://bucket/ci/cache"
    assert env["PYTEST_COMPILECACHE_KEY_PREFIX"] == "shard-1"
    assert env["PYTEST_COMPILECACHE_KEY_SALT"] == "model-v2"
    assert "PYTEST_COMPILECACHE_KEEP_BUNDLES" not in env  # the plugin's own pruning applies


@pytest.mark.parametrize("mode", ["isolated", "disabled"])
def test_other_modes_move_nothing(action: ModuleType, environ: dict[str, str], fingerprint: Any, mode: str) -> None:
    environ["INPUT_MODE"] = mode
    plan = action.make_plan(environ, fingerprint)
    assert (plan.transfer, plan.save) == ("none", False)
    env = action.plugin_env(plan)
    assert env["PYTEST_COMPILECACHE_MODE"] == mode
    assert not {"PYTEST_COMPILECACHE_STORE", "PYTEST_COMPILECACHE_DIR", "PYTEST_COMPILECACHE_RESTORE"} & set(env)


def test_relative_directory_store_is_under_the_workspace(
    action: ModuleType, environ: dict[str, str], fingerprint: Any
) -> None:
    environ["INPUT_STORE"] = "bundles"
    plan = action.make_plan(environ, fingerprint)
    assert plan.store == str(Path(environ["GITHUB_WORKSPACE"]) / "bundles")
    assert action.plugin_env(plan)["PYTEST_COMPILECACHE_STORE"] == plan.store


def test_relative_cache_dir_is_under_the_workspace(
    action: ModuleType, environ: dict[str, str], fingerprint: Any
) -> None:
    environ["INPUT_CACHE_DIR"] = ".cache/inductor"
    plan = action.make_plan(environ, fingerprint)
    assert plan.cache_dir == str(Path(environ["GITHUB_WORKSPACE"]) / ".cache" / "inductor")


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("INPUT_MODE", "warm", "input mode"),
        ("INPUT_KEY_PREFIX", "a/b", "input key-prefix"),
        ("INPUT_MIN_HIT_RATE", "90%", "input min-hit-rate"),
        ("INPUT_STORE", "ftp://host/x", "input store"),
        ("INPUT_STORE", "s3://Bad_Bucket/x", "input store"),
        ("INPUT_SUMMARY", "maybe", "input summary"),
        ("INPUT_SAVE", "always", "input save"),
    ],
)
def test_invalid_inputs_name_the_input(
    action: ModuleType, environ: dict[str, str], fingerprint: Any, name: str, value: str, message: str
) -> None:
    environ[name] = value
    with pytest.raises(action.InputError, match=message):
        action.make_plan(environ, fingerprint)


def test_plan_needs_the_runner(action: ModuleType, environ: dict[str, str], fingerprint: Any) -> None:
    del environ["GITHUB_RUN_ID"]
    with pytest.raises(action.InputError, match="GITHUB_RUN_ID"):
        action.make_plan(environ, fingerprint)


# ---- runner files


def test_write_vars_round_trips_through_the_runner_format(action: ModuleType, tmp_path: Path) -> None:
    target = tmp_path / "env"
    values = {"A": "1", "PATHY": "/x y/z=1", "MULTI": "line one\nline two"}
    action.write_vars(str(target), values)
    action.write_vars(str(target), {"B": "2"})
    assert parse_vars(target.read_text()) == {**values, "B": "2"}


def test_write_vars_without_a_file_does_nothing(action: ModuleType) -> None:
    action.write_vars(None, {"A": "1"})


# ---- staging and restore


def test_stage_bundles_empties_and_removes_the_staging_dir(action: ModuleType, tmp_path: Path) -> None:
    staging, inbox = tmp_path / "staging", tmp_path / "inbox"
    staging.mkdir()
    (staging / "compilecache-v1-abc-1-1.bundle").write_text("b")
    (staging / ".compilecache-v1-abc-2-1.bundle.123.tmp").write_text("partial")
    (staging / "notes.txt").write_text("x")
    assert action.stage_bundles(staging, inbox) == ["compilecache-v1-abc-1-1"]
    assert not staging.exists()
    assert [p.name for p in inbox.iterdir()] == ["compilecache-v1-abc-1-1.bundle"]


def test_stage_bundles_without_a_restore(action: ModuleType, tmp_path: Path) -> None:
    assert action.stage_bundles(tmp_path / "absent", tmp_path / "inbox") == []


def _bundle(fingerprint: Any, store_dir: Path, suffix: str, prefix: str = "compilecache-v1") -> str:
    """A real bundle (files only: no torch needed) in a directory store; returns its key."""
    from pytest_compilecache import sync
    from pytest_compilecache.stores import open_store

    source = store_dir.parent / f"source-{suffix}"
    (source / "fxgraph" / "ab").mkdir(parents=True)
    (source / "fxgraph" / "ab" / "entry").write_bytes(b"graph " + suffix.encode())
    result = sync.save(
        open_store(store_dir), prefix=prefix, fingerprint=fingerprint, suffix=suffix, cache_dir=str(source),
        blobs={}, files=["fxgraph/ab/entry"], stats={},
    )
    assert result.outcome == "saved", result.message
    return str(result.key)


def test_restore_from_staging(action: ModuleType, environ: dict[str, str], fingerprint: Any) -> None:
    plan = action.make_plan(environ, fingerprint)
    key = _bundle(fingerprint, Path(plan.staging), "99-1")
    result = action.restore(plan, environ)
    assert (result["outcome"], result["key"], result["files"]) == ("partial", key, 1)
    assert (Path(plan.cache_dir) / "fxgraph" / "ab" / "entry").read_bytes() == b"graph 99-1"
    assert not Path(plan.staging).exists() and not Path(plan.inbox).exists()
    assert action.restore_outputs(result) == {"restore-outcome": "partial", "cache-hit": "false", "matched-key": key}


def test_restore_exact_key(action: ModuleType, environ: dict[str, str], fingerprint: Any) -> None:
    plan = action.make_plan(environ, fingerprint)
    _bundle(fingerprint, Path(plan.staging), "1234-2")
    result = action.restore(plan, environ)
    assert action.restore_outputs(result)["cache-hit"] == "true"


def test_restore_miss_without_staged_bundle(action: ModuleType, environ: dict[str, str], fingerprint: Any) -> None:
    plan = action.make_plan(environ, fingerprint)
    result = action.restore(plan, environ)
    assert result["outcome"] == "miss" and plan.restore_prefix in result["message"]
    assert action.restore_outputs(result) == {"restore-outcome": "miss", "cache-hit": "false", "matched-key": ""}


def test_restore_explains_a_bundle_of_another_fingerprint(
    action: ModuleType, environ: dict[str, str], fingerprint: Any
) -> None:
    from pytest_compilecache.fingerprint import Fingerprint

    plan = action.make_plan(environ, fingerprint)
    other = Fingerprint({**fingerprint.to_json(), "torch": "2.14.0"})
    _bundle(other, Path(plan.staging), "77-1")
    result = action.restore(plan, environ)
    assert result["outcome"] == "miss"
    assert "torch: 2.14.0 -> 2.13.0" in result["message"]


def test_restore_of_a_corrupt_bundle_is_an_error_not_a_crash(
    action: ModuleType, environ: dict[str, str], fingerprint: Any
) -> None:
    plan = action.make_plan(environ, fingerprint)
    Path(plan.staging).mkdir()
    (Path(plan.staging) / f"{plan.restore_prefix}5-1.bundle").write_bytes(b"not a bundle")
    result = action.restore(plan, environ)
    assert result["outcome"] == "error"
    assert action.restore_outputs(result)["restore-outcome"] == "miss"
    assert not list(Path(plan.cache_dir).glob("**/entry"))


def test_restore_from_a_directory_store(action: ModuleType, environ: dict[str, str], fingerprint: Any,
                                        tmp_path: Path) -> None:
    store = tmp_path / "store"
    environ["INPUT_STORE"] = str(store)
    key = _bundle(fingerprint, store, "5-1")
    plan = action.make_plan(environ, fingerprint)
    assert plan.transfer == "direct"
    assert action.restore(plan, environ)["key"] == key
    assert (store / f"{key}.bundle").exists()  # read only: the store keeps its bundle


def test_restore_markdown(action: ModuleType, environ: dict[str, str], fingerprint: Any) -> None:
    plan = action.make_plan(environ, fingerprint)
    text = action.restore_markdown(plan, {"outcome": "partial", "key": "k-1", "size": 4096, "seconds": 0.25,
                                          "files": 3})
    assert "### torch.compile cache: restore" in text
    assert "partial: `k-1`, 4.0 KiB in 0.2 s, 3 files" in text
    assert f"`{plan.key}`, written by the tests, uploaded by actions/cache" in text
    environ["GITHUB_EVENT_NAME"] = "pull_request"
    text = action.restore_markdown(action.make_plan(environ, fingerprint), {"outcome": "miss", "message": "a|b"})
    assert "| restored | miss: a\\|b |" in text
    assert "nothing: save: auto restores only on pull_request" in text


# ---- commands


def test_install_command(action: ModuleType, environ: dict[str, str]) -> None:
    environ["GITHUB_ACTION_PATH"] = "/actions/pytest-compilecache"
    argv = action.install_command(environ, python="/py")
    assert argv[:4] == ["/py", "-m", "pip", "install"] and argv[-1] == "/actions/pytest-compilecache"
    environ["INPUT_STORE"] = "s3://bucket/x"
    assert action.install_command(environ, python="/py")[-1] == "/actions/pytest-compilecache[s3]"
    environ["INPUT_INSTALL"] = "false"
    assert action.install_command(environ) is None


def test_main_reports_invalid_input_as_an_error_annotation(
    action: ModuleType, environ: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    environ["INPUT_INSTALL"] = "perhaps"
    assert action.main(["install"], environ) == 2
    assert "::error title=pytest-compilecache::input install: expected true or false" in capsys.readouterr().out


def test_main_usage(action: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    assert action.main(["pack"], {}) == 2
    assert "usage" in capsys.readouterr().err


def test_plan_and_restore_commands(
    action: ModuleType, environ: dict[str, str], monkeypatch: pytest.MonkeyPatch, fingerprint: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import pytest_compilecache.fingerprint

    monkeypatch.setattr(pytest_compilecache.fingerprint, "collect", lambda salt="": fingerprint)
    environ["INPUT_SIGNING_KEY"] = "s3cret"
    assert action.main(["plan"], environ) == 0
    out = capsys.readouterr().out
    assert "::add-mask::s3cret" in out
    assert "::group::compile cache fingerprint" in out and f"digest     {fingerprint.digest()}" in out
    env = parse_vars(Path(environ["GITHUB_ENV"]).read_text())
    outputs = parse_vars(Path(environ["GITHUB_OUTPUT"]).read_text())
    assert env["PYTEST_COMPILECACHE_SIGNING_KEY"] == "s3cret"
    assert outputs["transfer"] == "github" and outputs["save"] == "true"
    assert Path(outputs["plan"]).is_file() and Path(outputs["cache-dir"]).is_dir()

    # The same job again: refused (one configuration per job).
    assert action.main(["plan"], environ) == 2
    assert "once per job" in capsys.readouterr().out

    Path(environ["GITHUB_OUTPUT"]).write_text("")
    assert action.main(["restore"], {**environ, "COMPILECACHE_PLAN": outputs["plan"]}) == 0
    assert parse_vars(Path(environ["GITHUB_OUTPUT"]).read_text())["restore-outcome"] == "miss"
    assert "### torch.compile cache: restore" in Path(environ["GITHUB_STEP_SUMMARY"]).read_text()


def test_restore_command_warns_and_succeeds_on_trouble(
    action: ModuleType, environ: dict[str, str], fingerprint: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = action.make_plan(environ, fingerprint)
    Path(plan.staging).mkdir()
    (Path(plan.staging) / f"{plan.restore_prefix}5-1.bundle").write_bytes(b"garbage")
    plan_file = Path(environ["RUNNER_TEMP"]) / "compilecache-plan.json"
    plan_file.write_text(json.dumps(plan.to_json()))
    assert action.main(["restore"], {**environ, "COMPILECACHE_PLAN": str(plan_file)}) == 0
    assert "::warning title=compile cache::restore failed" in capsys.readouterr().out
