"""action/main.py unit by unit: save decisions, plans, the plugin's environment, staging, restore, commands."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any
from typing import Mapping

import pytest

from action import inputs
from action import transfer
from pytest_compilecache.sync import RestoreResult
from tests.action.conftest import parse_vars
from tests.markdown import shown

RUN = {"GITHUB_RUN_ID": "1234", "GITHUB_RUN_ATTEMPT": "2"}


@pytest.fixture
def environ(tmp_path: Path) -> dict[str, str]:
    temp = tmp_path / "runner-temp"
    temp.mkdir()
    (tmp_path / "work").mkdir()
    files = {name: tmp_path / name for name in ("env", "output", "summary")}
    for path in files.values():
        path.write_text("")
    event = tmp_path / "event.json"
    event.write_text(json.dumps({"ref": "refs/heads/main", "repository": {"default_branch": "main"}}))
    return {
        **RUN,
        "GITHUB_EVENT_NAME": "push",
        "GITHUB_EVENT_PATH": str(event),
        "GITHUB_REF": "refs/heads/main",
        "GITHUB_JOB": "test",
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
        ("auto", "merge_group", False),
        ("true", "merge_group", False),
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
    decided, why = inputs.decide_save(value, event, "refs/heads/main", "main")
    assert decided is saves
    assert why


@pytest.mark.parametrize("event", ["push", "schedule", "workflow_dispatch"])
def test_save_auto_saves_on_the_default_branch_only(action: ModuleType, event: str) -> None:
    """Fix 4: an entry saved on another branch serves only that branch and evicts the default branch's."""
    assert inputs.decide_save("auto", event, "refs/heads/main", "main")[0] is True
    saves, why = inputs.decide_save("auto", event, "refs/heads/feature", "main")
    assert saves is False and "default branch (main) only" in why
    assert inputs.decide_save("auto", event, "refs/heads/main", "")[0] is False  # unknown: do not guess
    assert inputs.decide_save("true", event, "refs/heads/feature", "main")[0] is True


def test_merge_group_never_saves(action: ModuleType) -> None:
    """Fix 3: a merge queue branch's entries are never read by any later run."""
    saves, why = inputs.decide_save("true", "merge_group", "refs/heads/gh-readonly-queue/main/pr-1-abc", "main")
    assert saves is False and "merge queue" in why


def test_default_branch_from_the_event(action: ModuleType, environ: dict[str, str], tmp_path: Path) -> None:
    assert inputs.default_branch(environ) == "main"
    assert inputs.default_branch({**environ, "GITHUB_EVENT_PATH": str(tmp_path / "absent.json")}) == ""
    (tmp_path / "bare.json").write_text("{}")
    assert inputs.default_branch({**environ, "GITHUB_EVENT_PATH": str(tmp_path / "bare.json")}) == ""


def test_lineage_carries_the_job_and_the_matrix_leg(action: ModuleType) -> None:
    """Fix 5: two jobs or two matrix legs with one fingerprint get different keys and restore their own."""
    assert inputs.lineage({"GITHUB_JOB": "test"}, "compilecache-v1") == "compilecache-v1-test"
    assert inputs.lineage({"GITHUB_JOB": "test", "INPUT_MATRIX_LEG": "null"}, "p") == "p-test"
    assert inputs.lineage({"GITHUB_JOB": "test", "INPUT_MATRIX_LEG": "{}"}, "p") == "p-test"
    leg_a = inputs.lineage({"GITHUB_JOB": "test", "INPUT_MATRIX_LEG": '{"py": "3.11", "os": "linux"}'}, "p")
    leg_a_reordered = inputs.lineage({"GITHUB_JOB": "test", "INPUT_MATRIX_LEG": '{"os":"linux","py":"3.11"}'}, "p")
    leg_b = inputs.lineage({"GITHUB_JOB": "test", "INPUT_MATRIX_LEG": '{"py": "3.12", "os": "linux"}'}, "p")
    assert leg_a == leg_a_reordered and leg_a != leg_b
    assert leg_a.startswith("p-test-") and len(leg_a) == len("p-test-") + 8
    assert inputs.lineage({"GITHUB_JOB": "odd job/name"}, "p") == "p-odd_job_name"
    assert inputs.lineage({}, "p") == "p"
    # Ids alike in their first 60 characters stay apart; one of 60 or fewer is kept whole.
    long_a, long_b = (inputs.lineage({"GITHUB_JOB": "x" * 60 + end}, "p") for end in ("-slow", "-fast"))
    assert long_a != long_b and len(long_a) == len(long_b) == len("p-") + 60
    assert inputs.lineage({"GITHUB_JOB": "x" * 60}, "p") == "p-" + "x" * 60


def test_plan_keys_carry_the_job(action: ModuleType, environ: dict[str, str], fingerprint: Any) -> None:
    other = inputs.make_plan({**environ, "GITHUB_JOB": "lint"}, fingerprint)
    plan = inputs.make_plan(environ, fingerprint)
    assert plan.key != other.key and not other.key.startswith(plan.restore_prefix)
    assert inputs.plugin_env(other)["PYTEST_COMPILECACHE_KEY_PREFIX"] == "compilecache-v1-lint"


def test_decide_save_explains_pull_request_target(action: ModuleType) -> None:
    assert "never" in inputs.decide_save("true", "pull_request_target")[1]


def test_decide_save_rejects_other_values(action: ModuleType) -> None:
    with pytest.raises(inputs.InputError, match="input save"):
        inputs.decide_save("sometimes", "push")


# ---- plans


def test_plan_for_github_store(action: ModuleType, environ: dict[str, str], fingerprint: Any) -> None:
    plan = inputs.make_plan(environ, fingerprint)
    temp = Path(environ["RUNNER_TEMP"])
    digest = fingerprint.digest()
    assert plan.transfer == "github" and plan.save
    assert plan.key == f"compilecache-v1-test-{digest}-1234-2"
    assert plan.restore_prefix == f"compilecache-v1-test-{digest}-"
    assert plan.staging == str(Path(environ["GITHUB_WORKSPACE"]) / ".compilecache-staging")
    assert plan.cache_dir == str(temp / "compilecache-dir")
    assert plan.fingerprint == fingerprint.to_json()
    assert inputs.Plan.from_json(json.loads(json.dumps(plan.to_json()))) == plan


def test_plugin_env_for_a_saving_github_run(action: ModuleType, environ: dict[str, str], fingerprint: Any) -> None:
    plan = inputs.make_plan(environ, fingerprint)
    assert inputs.plugin_env(plan) == {
        "PYTEST_COMPILECACHE_MODE": "shared",
        "PYTEST_COMPILECACHE_SUMMARY": "auto",
        "PYTEST_COMPILECACHE_JSON": plan.json,
        "PYTEST_COMPILECACHE_DIR": plan.cache_dir,
        "PYTEST_COMPILECACHE_RESTORE": "skip",
        "PYTEST_COMPILECACHE_KEY_PREFIX": "compilecache-v1-test",
        "PYTEST_COMPILECACHE_RUN_SUFFIX": "1234-2",
        "PYTEST_COMPILECACHE_STORE": plan.staging,
        "PYTEST_COMPILECACHE_KEEP_BUNDLES": "1",
    }


def test_plugin_env_for_a_pull_request(action: ModuleType, environ: dict[str, str], fingerprint: Any) -> None:
    environ.update(GITHUB_EVENT_NAME="pull_request", INPUT_SUMMARY="false", INPUT_MIN_HIT_RATE="0.9")
    env = inputs.plugin_env(inputs.make_plan(environ, fingerprint))
    assert "PYTEST_COMPILECACHE_STORE" not in env
    assert env["PYTEST_COMPILECACHE_READONLY"] == "true"
    assert env["PYTEST_COMPILECACHE_SUMMARY"] == "off"
    assert env["PYTEST_COMPILECACHE_MIN_HIT_RATE"] == "0.9"


def test_plugin_env_for_s3(action: ModuleType, environ: dict[str, str], fingerprint: Any) -> None:
    environ.update(INPUT_STORE="s3://bucket/ci/cache", INPUT_KEY_PREFIX="shard-1", INPUT_KEY_SALT="model-v2")
    plan = inputs.make_plan(environ, fingerprint)
    env = inputs.plugin_env(plan)
    assert plan.transfer == "direct"
    assert env["PYTEST_COMPILECACHE_STORE"] == "s3://bucket/ci/cache"
    assert env["PYTEST_COMPILECACHE_KEY_PREFIX"] == "shard-1-test"
    assert env["PYTEST_COMPILECACHE_KEY_SALT"] == "model-v2"
    assert "PYTEST_COMPILECACHE_KEEP_BUNDLES" not in env  # the plugin's own pruning applies


def test_input_pgo_switches_the_plugins_option_on_and_false_leaves_it_to_the_job(
    action: ModuleType, environ: dict[str, str], fingerprint: Any
) -> None:
    from pytest_compilecache.settings import resolve

    def plugin_settings(env: dict[str, str]) -> Any:  # what the pytest step's plugin makes of the variables
        return resolve({}, lambda name: None, env)

    environ["INPUT_PGO"] = "true"
    plan = inputs.make_plan(environ, fingerprint)
    assert inputs.Plan.from_json(json.loads(json.dumps(plan.to_json()))) == plan
    env = inputs.plugin_env(plan)
    assert env["PYTEST_COMPILECACHE_PGO"] == "on"
    assert plugin_settings(env).pgo is True
    environ["INPUT_PGO"] = "false"  # exports nothing: the job's own PYTEST_COMPILECACHE_PGO still decides
    env = inputs.plugin_env(inputs.make_plan(environ, fingerprint))
    assert "PYTEST_COMPILECACHE_PGO" not in env
    assert plugin_settings(env).pgo is False
    assert plugin_settings({**env, "PYTEST_COMPILECACHE_PGO": "on"}).pgo is True


@pytest.mark.parametrize("mode", ["isolated", "disabled"])
def test_other_modes_move_nothing(action: ModuleType, environ: dict[str, str], fingerprint: Any, mode: str) -> None:
    environ["INPUT_MODE"] = mode
    plan = inputs.make_plan(environ, fingerprint)
    assert (plan.transfer, plan.save) == ("none", False)
    env = inputs.plugin_env(plan)
    assert env["PYTEST_COMPILECACHE_MODE"] == mode
    assert not {"PYTEST_COMPILECACHE_STORE", "PYTEST_COMPILECACHE_DIR", "PYTEST_COMPILECACHE_RESTORE"} & set(env)


def test_relative_directory_store_is_under_the_workspace(
    action: ModuleType, environ: dict[str, str], fingerprint: Any
) -> None:
    environ["INPUT_STORE"] = "bundles"
    plan = inputs.make_plan(environ, fingerprint)
    assert plan.store == str(Path(environ["GITHUB_WORKSPACE"]) / "bundles")
    assert inputs.plugin_env(plan)["PYTEST_COMPILECACHE_STORE"] == plan.store
    environ["INPUT_STORE"] = "~/compile-store"  # as actions/cache's path: the home dir (it was a dir named ~)
    assert inputs.make_plan(environ, fingerprint).store == str(Path.home() / "compile-store")


def test_relative_cache_dir_is_under_the_workspace(
    action: ModuleType, environ: dict[str, str], fingerprint: Any
) -> None:
    environ["INPUT_CACHE_DIR"] = ".cache/inductor"
    plan = inputs.make_plan(environ, fingerprint)
    assert plan.cache_dir == str(Path(environ["GITHUB_WORKSPACE"]) / ".cache" / "inductor")


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("INPUT_MODE", "warm", "input mode"),
        ("INPUT_KEY_PREFIX", "a/b", "input key-prefix"),
        ("INPUT_MIN_HIT_RATE", "90%", "input min-hit-rate"),
        ("INPUT_STORE", "ftp://host/x", "input store"),
        ("INPUT_STORE", "s3://Bad_Bucket/x", "input store"),
        ("INPUT_STORE", "s3:/bucket/x", "input store: unsupported store"),  # one slash: no directory
        ("INPUT_STORE", "  ", "input store: only spaces"),
        ("INPUT_MODE", " ", "input mode: only spaces"),
        ("INPUT_SAVE_ON_FAILURE", "\t", "input save-on-failure: only spaces"),
        ("INPUT_SUMMARY", "maybe", "input summary"),
        ("INPUT_PGO", "sometimes", "input pgo"),
        ("INPUT_SAVE", "always", "input save"),
        ("INPUT_STORE", ".cache/inductor/bundles", "input store: .* lies in the cache dir"),  # cache-dir below
        ("INPUT_STORE", ".compilecache-staging", "input store: .* is the Action's staging dir"),  # the plan empties it
        # the job's plugin variables that the Action's own steps read: refused here, not a restore "failure"
        ("PYTEST_COMPILECACHE_STORE_TIMEOUT", "abc", "PYTEST_COMPILECACHE_STORE_TIMEOUT: expected a number"),
        ("PYTEST_COMPILECACHE_MAX_BUNDLE_SIZE", "junk", "PYTEST_COMPILECACHE_MAX_BUNDLE_SIZE"),
        ("PYTEST_COMPILECACHE_S3_ENDPOINT", "not a url", "PYTEST_COMPILECACHE_S3_ENDPOINT"),
    ],
)
def test_invalid_inputs_name_the_input(
    action: ModuleType, environ: dict[str, str], fingerprint: Any, name: str, value: str, message: str
) -> None:
    environ[name] = value
    environ["INPUT_CACHE_DIR"] = ".cache/inductor"
    with pytest.raises(inputs.InputError, match=message):
        inputs.make_plan(environ, fingerprint)


def test_plan_needs_the_runner(action: ModuleType, environ: dict[str, str], fingerprint: Any) -> None:
    del environ["GITHUB_RUN_ID"]
    with pytest.raises(inputs.InputError, match="GITHUB_RUN_ID"):
        inputs.make_plan(environ, fingerprint)


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
    assert transfer.stage_bundles(staging, inbox) == ["compilecache-v1-abc-1-1"]
    assert not staging.exists()
    assert [p.name for p in inbox.iterdir()] == ["compilecache-v1-abc-1-1.bundle"]


def test_stage_bundles_without_a_restore(action: ModuleType, tmp_path: Path) -> None:
    assert transfer.stage_bundles(tmp_path / "absent", tmp_path / "inbox") == []


def _bundle(
    fingerprint: Any,
    store_dir: Path,
    suffix: str,
    prefix: str = "compilecache-v1-test",
    signing_key: bytes | None = None,
) -> str:
    """A real bundle (files only: no torch needed) in a directory store; returns its key."""
    from pytest_compilecache import sync
    from pytest_compilecache.stores import open_store

    source = store_dir.parent / f"source-{suffix}"
    (source / "fxgraph" / "ab").mkdir(parents=True)
    (source / "fxgraph" / "ab" / "entry").write_bytes(b"graph " + suffix.encode())
    result = sync.save(
        open_store(store_dir),
        prefix=prefix,
        fingerprint=fingerprint,
        suffix=suffix,
        cache_dir=str(source),
        blobs={},
        files=["fxgraph/ab/entry"],
        stats={},
        signing_key=signing_key,
    )
    assert result.outcome == "saved", result.message
    return str(result.key)


def test_restore_from_staging(action: ModuleType, environ: dict[str, str], fingerprint: Any) -> None:
    plan = inputs.make_plan(environ, fingerprint)
    key = _bundle(fingerprint, Path(plan.staging), "99-1")
    result = transfer.restore(plan, environ)
    assert (result.outcome, result.key, result.files) == ("partial", key, 1)
    assert (Path(plan.cache_dir) / "fxgraph" / "ab" / "entry").read_bytes() == b"graph 99-1"
    assert not Path(plan.staging).exists() and not Path(plan.inbox).exists()
    assert transfer.restore_outputs(result) == {"restore-outcome": "partial", "cache-hit": "false", "matched-key": key}


def test_restore_exact_key(action: ModuleType, environ: dict[str, str], fingerprint: Any) -> None:
    plan = inputs.make_plan(environ, fingerprint)
    _bundle(fingerprint, Path(plan.staging), "1234-2")
    result = transfer.restore(plan, environ)
    assert transfer.restore_outputs(result)["cache-hit"] == "true"


def test_restore_miss_without_staged_bundle(action: ModuleType, environ: dict[str, str], fingerprint: Any) -> None:
    plan = inputs.make_plan(environ, fingerprint)
    result = transfer.restore(plan, environ)
    assert result.outcome == "miss" and plan.restore_prefix in result.message
    assert transfer.restore_outputs(result) == {"restore-outcome": "miss", "cache-hit": "false", "matched-key": ""}


def test_restore_explains_a_bundle_of_another_fingerprint(
    action: ModuleType, environ: dict[str, str], fingerprint: Any
) -> None:
    from pytest_compilecache.fingerprint import Fingerprint

    plan = inputs.make_plan(environ, fingerprint)
    other = Fingerprint({**fingerprint.to_json(), "torch": "2.14.0"})
    _bundle(other, Path(plan.staging), "77-1")
    result = transfer.restore(plan, environ)
    assert result.outcome == "miss"
    assert "torch: 2.14.0 -> 2.13.0" in result.message


def test_restore_of_a_corrupt_bundle_is_a_refused_miss_not_a_crash(
    action: ModuleType, environ: dict[str, str], fingerprint: Any
) -> None:
    plan = inputs.make_plan(environ, fingerprint)
    Path(plan.staging).mkdir(parents=True)
    (Path(plan.staging) / f"{plan.restore_prefix}5-1.bundle").write_bytes(b"not a bundle")
    result = transfer.restore(plan, environ)
    # A bad bundle is the store's content, not trouble reaching it: refused, named, a cold compile.
    assert result.outcome == "miss" and [key for key, _ in result.skipped] == [f"{plan.restore_prefix}5-1"]
    assert result.warning is not None and "bad magic" in result.warning
    assert transfer.restore_outputs(result)["restore-outcome"] == "miss"
    assert not list(Path(plan.cache_dir).glob("**/entry"))


def test_restore_from_a_directory_store(
    action: ModuleType, environ: dict[str, str], fingerprint: Any, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    environ["INPUT_STORE"] = str(store)
    key = _bundle(fingerprint, store, "5-1")
    plan = inputs.make_plan(environ, fingerprint)
    assert plan.transfer == "direct"
    assert transfer.restore(plan, environ).key == key
    assert (store / f"{key}.bundle").exists()  # read only: the store keeps its bundle


@pytest.mark.parametrize("store", ["github", "directory"])
def test_the_restore_keeps_the_jobs_bundle_size_cap(
    action: ModuleType, environ: dict[str, str], fingerprint: Any, tmp_path: Path, store: str
) -> None:
    """PYTEST_COMPILECACHE_MAX_BUNDLE_SIZE caps what is unpacked (docs/security.md): the Action's restore, which
    the plugin leaves to it (RESTORE=skip), read only the built-in 2 GiB."""
    if store == "directory":
        environ["INPUT_STORE"] = str(tmp_path / "store")
    environ["PYTEST_COMPILECACHE_MAX_BUNDLE_SIZE"] = "100"
    plan = inputs.make_plan(environ, fingerprint)
    key = _bundle(fingerprint, Path(plan.staging if store == "github" else plan.store), "5-1")
    result = transfer.restore(plan, environ)
    assert result.outcome == "miss" and [skipped for skipped, _ in result.skipped] == [key]
    assert result.warning is not None and "limit of 100 bytes" in result.warning
    assert not list(Path(plan.cache_dir).glob("**/entry"))


def test_restore_markdown(action: ModuleType, environ: dict[str, str], fingerprint: Any) -> None:
    plan = inputs.make_plan(environ, fingerprint)
    text = transfer.restore_markdown(plan, RestoreResult("partial", key="k-1", size=4096, seconds=0.25, files=3))
    assert "### torch.compile cache: restore" in text
    assert "partial: `k-1`, 4.0 KiB in 0.2 s, 3 files" in text
    # Issue 42: the Action's post step uploads it; its own section of the summary says how that went.
    saving = f"`{plan.key}` if the tests compile something new, uploaded at job end by this Action when the job"
    assert saving + " succeeds (input save-on-failure)" in text
    environ["INPUT_SAVE_ON_FAILURE"] = "true"
    text = transfer.restore_markdown(inputs.make_plan(environ, fingerprint), RestoreResult("partial", key="k-1"))
    assert "by this Action, also when the job fails (input save-on-failure)" in text
    assert "| lineage | `compilecache-v1-test` |" not in text and "| lineage | `compilecache-v1-test` (" in text
    environ["GITHUB_EVENT_NAME"] = "pull_request"
    text = transfer.restore_markdown(inputs.make_plan(environ, fingerprint), RestoreResult("miss", message="a|b"))
    assert "| restored | miss: a\\|b |" in text
    assert "nothing: save: auto restores only on pull_request" in shown(text)
    environ.update(GITHUB_EVENT_NAME="x</details><img src=x>", INPUT_SAVE="true")  # runner text, still escaped
    text = transfer.restore_markdown(inputs.make_plan(environ, fingerprint), RestoreResult("miss"))
    assert "x\\</details\\>\\<img src=x\\> runs may get a read-only cache token" in text  # inert: no tag


def test_salt_is_stripped_and_must_be_utf8(action: ModuleType, environ: dict[str, str]) -> None:
    # The plugin strips the salt it reads: the Action must too, or its keys never meet the plugin's bundles.
    environ["PYTEST_COMPILECACHE_KEY_SALT"] = " model-v2 "
    assert inputs.key_salt(environ) == "model-v2"
    environ["INPUT_KEY_SALT"] = "v2\udcff"  # a byte that is not UTF-8, as Python keeps it in os.environ
    with pytest.raises(inputs.InputError, match="^input key-salt: not valid UTF-8"):
        inputs.key_salt(environ)


# ---- commands


def test_install_command(action: ModuleType, environ: dict[str, str]) -> None:
    environ["GITHUB_ACTION_PATH"] = "/actions/pytest-compilecache"
    argv = inputs.install_command(environ, python="/py", has_pip=lambda python: True)
    assert argv is not None
    assert argv[:4] == ["/py", "-m", "pip", "install"] and argv[-1] == "/actions/pytest-compilecache"
    for store, extra in [
        ("s3://bucket/x", "[s3]"),
        ("gs://bucket/x", "[gcs]"),
        ("az://box/x", "[azure]"),
        ("github", ""),
    ]:
        environ["INPUT_STORE"] = store
        assert (inputs.install_command(environ, python="/py", has_pip=lambda python: True) or [""])[-1] == (
            "/actions/pytest-compilecache" + extra
        )
    environ["INPUT_INSTALL"] = "false"
    assert inputs.install_command(environ) is None


def test_install_into_a_venv_without_pip_uses_uv(action: ModuleType, environ: dict[str, str]) -> None:
    """Fix 8: uv makes venvs without pip; ``python -m pip`` fails there with no word of why."""
    environ["GITHUB_ACTION_PATH"] = "/actions/pytest-compilecache"
    argv = inputs.install_command(
        environ,
        python="/venv/bin/python",
        has_pip=lambda python: False,
        which=lambda name: "/usr/bin/uv" if name == "uv" else None,
    )
    assert argv == ["/usr/bin/uv", "pip", "install", "--python", "/venv/bin/python", "/actions/pytest-compilecache"]
    with pytest.raises(inputs.InputError, match="input install: /venv/bin/python has no pip .* uv is not on PATH"):
        inputs.install_command(
            environ, python="/venv/bin/python", has_pip=lambda python: False, which=lambda name: None
        )


def test_has_pip_asks_the_interpreter(action: ModuleType, tmp_path: Path) -> None:
    import sys
    import venv

    assert inputs._has_pip(sys.executable) is True
    venv.create(tmp_path / "bare", with_pip=False)  # what `uv venv` makes: no pip inside
    assert inputs._has_pip(str(tmp_path / "bare" / "bin" / "python")) is False


def test_install_false_checks_the_installed_version(
    action: ModuleType, environ: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Fix 8: with install: false, a plugin of another version than the Action's is named, not ignored."""
    import pytest_compilecache

    # The Action's own checkout: the version read there is the package's.
    assert inputs.action_version(str(Path(__file__).resolve().parents[2])) == pytest_compilecache.__version__
    shipped = tmp_path / "action" / "pytest_compilecache"
    shipped.mkdir(parents=True)
    environ.update(INPUT_INSTALL="false", GITHUB_ACTION_PATH=str(tmp_path / "action"))
    (shipped / "_version.py").write_text(f'__version__ = "{pytest_compilecache.__version__}"\n')
    assert action.main(["install"], environ) == 0
    assert "::warning" not in capsys.readouterr().out
    (shipped / "_version.py").write_text('"""doc"""\n\n__version__ = "9.9.9"\n')
    assert action.main(["install"], environ) == 0
    out = capsys.readouterr().out
    assert (
        f"::warning title=compile cache::install: false: the installed pytest-compilecache is "
        f"{pytest_compilecache.__version__}, this Action is 9.9.9" in out
    )


def test_main_reports_invalid_input_as_an_error_annotation(
    action: ModuleType, environ: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    environ["INPUT_INSTALL"] = "perhaps"
    assert action.main(["install"], environ) == 2
    assert "::error title=pytest-compilecache::input install: expected true or false" in capsys.readouterr().out


def test_a_cache_dir_that_cannot_be_made_is_an_error_naming_the_input(
    action: ModuleType,
    environ: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    fingerprint: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import pytest_compilecache.action_api

    monkeypatch.setattr(pytest_compilecache.action_api, "collect_fingerprint", lambda salt="": fingerprint)
    (Path(environ["GITHUB_WORKSPACE"]) / "notes.txt").write_text("a file of the user's")
    environ["INPUT_CACHE_DIR"] = "notes.txt"
    assert action.main(["plan"], environ) == 2
    out = capsys.readouterr().out
    assert "::error title=pytest-compilecache::input cache-dir: cannot make " in out and "Traceback" not in out
    assert (Path(environ["GITHUB_WORKSPACE"]) / "notes.txt").read_text() == "a file of the user's"


def test_main_usage(action: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    assert action.main(["pack"], {}) == 2
    assert "usage" in capsys.readouterr().err


def test_plan_and_restore_commands(
    action: ModuleType,
    environ: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    fingerprint: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import pytest_compilecache.action_api

    monkeypatch.setattr(pytest_compilecache.action_api, "collect_fingerprint", lambda salt="": fingerprint)
    environ["INPUT_SIGNING_KEY"] = "s3cret"
    reply = Path(environ["RUNNER_TEMP"]) / "reply.json"
    environ["COMPILECACHE_REPLY"] = str(reply)
    assert action.main(["plan"], environ) == 0
    out = capsys.readouterr().out
    assert "::add-mask::s3cret" in out
    assert "::group::compile cache fingerprint" in out and f"digest     {fingerprint.digest()}" in out
    env = parse_vars(Path(environ["GITHUB_ENV"]).read_text())
    outputs = parse_vars(Path(environ["GITHUB_OUTPUT"]).read_text())
    assert env["PYTEST_COMPILECACHE_SIGNING_KEY"] == "s3cret"
    # Issue 27.4: the plan's fingerprint is handed to pytest, which saves under the key the plan computed.
    assert json.loads(env["PYTEST_COMPILECACHE_FINGERPRINT"]) == fingerprint.to_json()
    assert set(outputs) == {"key", "cache-dir", "report"} and Path(outputs["cache-dir"]).is_dir()
    # What action/js needs to restore the bundle entry (the literal path: the client hashes it into the version).
    told = json.loads(reply.read_text())
    assert told == {
        "transfer": "github",
        "key": outputs["key"],
        "restore_prefix": told["restore_prefix"],
        "path": ".compilecache-staging/*.bundle",
    }
    assert outputs["key"].startswith(told["restore_prefix"]) and "COMPILECACHE_SAVE_ON_FAILURE" not in env

    # The same job again: refused (one configuration per job).
    assert action.main(["plan"], environ) == 2
    assert "once per job" in capsys.readouterr().out

    Path(environ["GITHUB_OUTPUT"]).write_text("")
    reply.unlink()
    assert action.main(["restore"], {**environ, "COMPILECACHE_FOUND": '{"matched": null, "problem": null}'}) == 0
    assert parse_vars(Path(environ["GITHUB_OUTPUT"]).read_text())["restore-outcome"] == "miss"
    assert "### torch.compile cache: restore" in Path(environ["GITHUB_STEP_SUMMARY"]).read_text()
    assert not reply.exists()  # no header entry to restore: nothing to tell action/js


def test_plan_refuses_a_cache_dir_that_holds_someones_files(
    action: ModuleType,
    environ: dict[str, str],
    fingerprint: Any,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 29.1: input cache-dir follows the rule of pytest's --compile-cache-dir and the CLI's --cache-dir."""
    import pytest_compilecache.action_api

    monkeypatch.setattr(pytest_compilecache.action_api, "collect_fingerprint", lambda salt="": fingerprint)
    project = Path(environ["GITHUB_WORKSPACE"]) / "src"
    project.mkdir(parents=True)
    (project / "models.py").write_text("# the user's\n")
    environ["INPUT_CACHE_DIR"] = "src"
    assert action.main(["plan"], environ) == 2
    out = capsys.readouterr().out
    assert "::error" in out and "input cache-dir:" in out and "is not a compile cache" in out
    assert sorted(p.name for p in project.iterdir()) == ["models.py"]


@pytest.mark.parametrize(
    "given", [".compilecache-staging", ".compilecache-headers/x", ".", "ci-cache/../.compilecache-staging"]
)
def test_plan_refuses_a_cache_dir_that_is_holds_or_lies_in_a_staging_dir(
    action: ModuleType, environ: dict[str, str], fingerprint: Any, given: str
) -> None:
    """The plan empties the staging dirs; with ``store: github`` a cache dir there was also the plugin's store
    dir, refused only in the pytest step: the input is refused at the start, naming it, on every store."""
    for store in ("github", "s3://bucket/p"):
        with pytest.raises(inputs.InputError, match=r"input cache-dir: .* the Action's staging dir"):
            inputs.make_plan({**environ, "INPUT_CACHE_DIR": given, "INPUT_STORE": store}, fingerprint)


def test_restore_command_warns_and_succeeds_on_trouble(
    action: ModuleType, environ: dict[str, str], fingerprint: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = inputs.make_plan(environ, fingerprint)
    Path(plan.staging).mkdir(parents=True)
    (Path(plan.staging) / f"{plan.restore_prefix}5-1.bundle").write_bytes(b"garbage")
    plan_file = Path(environ["RUNNER_TEMP"]) / "compilecache-plan.json"
    plan_file.write_text(json.dumps(plan.to_json()))
    assert action.main(["restore"], environ) == 0
    assert "::warning title=compile cache::restore skipped 1 bundle(s)" in capsys.readouterr().out


# ---- what the cache client found (issue 42: its own words) and what the plugin is told (fix 9)


@pytest.mark.parametrize(
    ("found", "staged", "trouble"),
    [
        (transfer.Found(), False, None),  # the service answered: no entry (a miss)
        (transfer.Found("k-1"), True, None),  # restored
        (transfer.Found(problem="Failed to restore: (403) Forbidden"), False, "restored nothing: Failed to restore"),
        (transfer.Found("k-1"), False, "reported k-1 restored but left no bundle in .compilecache-staging"),
        (transfer.Found("k-1", "a warning the client logged"), True, None),  # restored all the same
    ],
)
def test_what_the_client_found_tells_trouble_from_a_miss(
    found: transfer.Found, staged: bool, trouble: str | None
) -> None:
    said = found.trouble(staged)
    assert (said is None) if trouble is None else (trouble in (said or ""))


def test_what_the_client_found_is_read_from_the_javascript() -> None:
    assert transfer.Found.read({}) == transfer.Found()
    told = {"COMPILECACHE_FOUND": '{"matched": "k-1", "problem": null}'}
    assert transfer.Found.read(told) == transfer.Found("k-1")
    told = {"COMPILECACHE_FOUND": '{"matched": null, "problem": "Failed to restore: ECONNREFUSED"}'}
    assert transfer.Found.read(told) == transfer.Found(problem="Failed to restore: ECONNREFUSED")
    for bad in ("not json", "[1]"):
        assert "no readable result" in str(transfer.Found.read({"COMPILECACHE_FOUND": bad}).problem)


def test_a_failed_download_is_an_error_not_a_miss(
    action: ModuleType, environ: dict[str, str], fingerprint: Any
) -> None:
    """Fix 7: the lookup found an entry, the client restored nothing: that is trouble, not "no entry"."""
    plan = inputs.make_plan(environ, fingerprint)
    problem = "Failed to restore: Cache service responded with 403"
    environ["COMPILECACHE_FOUND"] = json.dumps({"matched": None, "problem": problem})
    result = transfer.restore(plan, environ)
    assert result.outcome == "error" and result.message == f"the cache client restored nothing: {problem}"
    assert transfer.restore_outputs(result) == {"restore-outcome": "error", "cache-hit": "false", "matched-key": ""}
    assert "| restored | error: the cache client restored nothing" in transfer.restore_markdown(plan, result)


def test_restore_tells_the_plugin_and_lifts_min_hit_rate_after_trouble(
    action: ModuleType, environ: dict[str, str], fingerprint: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fix 9: the plugin runs with RESTORE=skip; the Action passes its outcome, and a failed restore never
    leaves min-hit-rate to fail the job (an empty variable is unset for the plugin's settings)."""
    import pytest_compilecache.action_api
    from pytest_compilecache.settings import resolve

    monkeypatch.setattr(pytest_compilecache.action_api, "collect_fingerprint", lambda salt="": fingerprint)
    environ["INPUT_MIN_HIT_RATE"] = "0.9"
    assert action.main(["plan"], environ) == 0
    environ["COMPILECACHE_FOUND"] = json.dumps({"matched": None, "problem": "Failed to restore: (503)"})
    assert action.main(["restore"], environ) == 0
    env = parse_vars(Path(environ["GITHUB_ENV"]).read_text())
    told = json.loads(env["PYTEST_COMPILECACHE_RESTORED"])  # RestoreResult.encode() and the save policy
    assert {name: told[name] for name in ("outcome", "key", "message", "save_when", "save_staged")} == {
        "outcome": "error",
        "key": None,
        "message": "the cache client restored nothing: Failed to restore: (503)",
        "save_when": "passed",  # issue 26: the save policy, and that the plugin's save is only staged
        "save_staged": True,
    }
    assert told["headers"]["named"] == []
    assert env["PYTEST_COMPILECACHE_MIN_HIT_RATE"] == ""  # the later line wins in GITHUB_ENV
    assert resolve({}, lambda name: None, env).min_hit_rate is None


def test_a_strict_job_keeps_min_hit_rate_after_restore_trouble(
    action: ModuleType, environ: dict[str, str], fingerprint: Any
) -> None:
    """PYTEST_COMPILECACHE_STRICT: infrastructure trouble may fail the job, as for the plugin; a miss still may not."""
    environ.update(INPUT_MIN_HIT_RATE="0.9", PYTEST_COMPILECACHE_STRICT="true")
    plan = inputs.make_plan(environ, fingerprint)
    assert plan.strict
    error = RestoreResult("error", message="the cache client restored nothing")
    refused = RestoreResult("miss", skipped=((f"{plan.restore_prefix}1-1", "bad magic"),))
    for troubled in (error, refused):
        assert "PYTEST_COMPILECACHE_MIN_HIT_RATE" not in transfer.restored_env(plan, troubled)
        assert "min-hit-rate" not in transfer.restore_markdown(plan, troubled)
    assert transfer.restored_env(plan, RestoreResult("miss"))["PYTEST_COMPILECACHE_MIN_HIT_RATE"] == ""
    environ["PYTEST_COMPILECACHE_STRICT"] = "maybe"
    with pytest.raises(inputs.InputError, match="PYTEST_COMPILECACHE_STRICT"):
        inputs.make_plan(environ, fingerprint)


def test_restore_command_stages_torchs_artifacts_and_imports_no_torch(
    action: ModuleType, environ: dict[str, str], fingerprint: Any, tmp_path: Path
) -> None:
    """The restore step installs the bundle and leaves its mega-cache blobs for the pytest process, which
    imports torch anyway (sync.load_staged): the step itself, a process of its own, never imports torch."""
    from pytest_compilecache import bundle
    from pytest_compilecache import sync
    from pytest_compilecache.stores import open_store
    from tests.fakes import FakeLoader

    plan = inputs.make_plan(environ, fingerprint)
    source = tmp_path / "source"
    (source / "fxgraph" / "ab").mkdir(parents=True)
    (source / "fxgraph" / "ab" / "entry").write_bytes(b"graph")
    blobs = {"controller": b"controller artifacts", "gw0": b"gw0 artifacts"}
    saved = sync.save(
        open_store(Path(plan.staging)), prefix=plan.prefix, fingerprint=fingerprint, suffix="99-1",
        cache_dir=str(source), blobs=blobs, files=["fxgraph/ab/entry"], stats={},
    )  # fmt: skip
    assert saved.outcome == "saved", saved.message
    (Path(environ["RUNNER_TEMP"]) / "compilecache-plan.json").write_text(json.dumps(plan.to_json()))
    script = Path(str(action.__file__))
    code = (
        "import runpy, sys\n"
        f"sys.argv = [{str(script)!r}, 'restore']\n"
        "try:\n"
        f"    runpy.run_path({str(script)!r}, run_name='__main__')\n"
        "except SystemExit as exc:\n"
        "    assert not exc.code, exc.code\n"
        "print('torch imported:', 'torch' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, **environ},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "torch imported: False" in done.stdout, done.stdout
    outputs = parse_vars(Path(environ["GITHUB_OUTPUT"]).read_text())
    assert (outputs["restore-outcome"], outputs["matched-key"]) == ("partial", saved.key)
    told = json.loads(parse_vars(Path(environ["GITHUB_ENV"]).read_text())["PYTEST_COMPILECACHE_RESTORED"])
    digests = {name: hashlib.sha256(data).hexdigest() for name, data in blobs.items()}
    assert told["staged"] == [[name, len(blobs[name]), digests[name]] for name in sorted(blobs)]
    for name in blobs:
        assert (Path(plan.cache_dir) / bundle.pending_path(digests[name])).read_bytes() == blobs[name]

    # What the plugin does with it in the pytest step (tests/unit/test_session.py drives the session).
    from pytest_compilecache.sync import read_handoff as action_restore_result

    result = action_restore_result(json.dumps(told))
    assert result is not None
    loader = FakeLoader()
    loaded = sync.load_staged(result, plan.cache_dir, load=loader)
    assert loader.blobs == [blobs["controller"], blobs["gw0"]] and loaded.artifacts == {"fx_graph": 4, "triton": 2}


def test_min_hit_rate_applies_only_after_a_restore(
    action: ModuleType, environ: dict[str, str], fingerprint: Any
) -> None:
    """Issue 26: a miss (the first run after a torch upgrade) compiles every graph cold, as an error does: the
    gate is lifted and the summary says why; after a restore (exact or partial) it holds."""
    environ["INPUT_MIN_HIT_RATE"] = "0.9"
    plan = inputs.make_plan(environ, fingerprint)
    miss = RestoreResult("miss", message="no entry")
    env = transfer.restored_env(plan, miss)
    assert json.loads(env["PYTEST_COMPILECACHE_RESTORED"])["outcome"] == "miss"
    assert env["PYTEST_COMPILECACHE_MIN_HIT_RATE"] == ""
    assert "| min-hit-rate | min-hit-rate 0.9 not applied: nothing to restore (a miss)" in shown(
        transfer.restore_markdown(plan, miss)
    )
    partial = RestoreResult("partial", key=f"{plan.restore_prefix}1-1")
    assert "PYTEST_COMPILECACHE_MIN_HIT_RATE" not in transfer.restored_env(plan, partial)
    assert "min-hit-rate" not in transfer.restore_markdown(plan, partial)
    # isolated and disabled restore nothing: the gate is never exported, and the summary says why.
    for mode in ("isolated", "disabled"):
        environ["INPUT_MODE"] = mode
        plan = inputs.make_plan(environ, fingerprint)
        assert "PYTEST_COMPILECACHE_MIN_HIT_RATE" not in inputs.plugin_env(plan)
        assert transfer.restored_env(plan, RestoreResult("miss")) == {}
        assert f"min-hit-rate 0.9 not applied: mode {mode} restores nothing" in shown(
            transfer.restore_markdown(plan, transfer.restore(plan, environ))
        )


# ---- the signing key (fix 10) and what the summary promises (fix 12)


def test_a_signing_key_from_the_step_env_stays_out_of_github_env(
    action: ModuleType, environ: dict[str, str], fingerprint: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fix 10: the scoped way (action/README.md): the key as ``env:`` of the Action's and the pytest step."""
    import pytest_compilecache.action_api

    monkeypatch.setattr(pytest_compilecache.action_api, "collect_fingerprint", lambda salt="": fingerprint)
    environ["PYTEST_COMPILECACHE_SIGNING_KEY"] = "scoped-secret"
    assert action.main(["plan"], environ) == 0
    assert "scoped-secret" not in Path(environ["GITHUB_ENV"]).read_text()


def test_the_restore_verifies_with_the_signing_key_input(
    action: ModuleType, environ: dict[str, str], fingerprint: Any
) -> None:
    """The input reaches later steps through GITHUB_ENV, which the runner applies only after this step: the
    restore, in this step, verifies with the input itself. An unsigned bundle is refused, a signed one restores."""
    environ["INPUT_SIGNING_KEY"] = "input-secret"
    plan = inputs.make_plan(environ, fingerprint)
    unsigned = _bundle(fingerprint, Path(plan.staging), "5-1")
    refused = transfer.restore(plan, environ)
    assert refused.outcome == "miss" and [key for key, _ in refused.skipped] == [unsigned], refused
    assert not list(Path(plan.cache_dir).glob("**/entry"))

    signed = _bundle(fingerprint, Path(plan.staging), "6-1", signing_key=b"input-secret")
    restored = transfer.restore(plan, environ)
    assert (restored.outcome, restored.key) == ("partial", signed), restored
    # The input wins over the step's own variable, as the plan exports it to the later steps.
    environ["PYTEST_COMPILECACHE_SIGNING_KEY"] = "another-key"
    assert inputs.with_signing_key(environ)["PYTEST_COMPILECACHE_SIGNING_KEY"] == "input-secret"


def test_the_summary_does_not_promise_a_save_a_read_only_token_cannot_make(
    action: ModuleType, environ: dict[str, str], fingerprint: Any
) -> None:
    environ.update(GITHUB_EVENT_NAME="pull_request", INPUT_SAVE="true")
    text = transfer.restore_markdown(inputs.make_plan(environ, fingerprint), RestoreResult("miss"))
    assert "pull_request runs may get a read-only cache token, and then nothing is saved" in shown(text)


# ---- action.yml (fixes 1, 2, 6, 7)


def test_action_yml_is_a_node_action_whose_post_step_runs_after_a_red_job_only_when_told(action: ModuleType) -> None:
    """Issue 42: a node24 action (the runner gives the cache service's URL and token to node actions only) whose
    committed bundle action/js/dist runs main and post; post-if lets a failed job save only with save-on-failure,
    which the plan exports for saving store: github runs (inputs.post_env)."""
    import yaml

    from tests.action.conftest import REPO

    runs = yaml.safe_load((REPO / "action.yml").read_text())["runs"]
    assert runs["using"] == "node24"
    assert (runs["main"], runs["post"]) == ("action/js/dist/main.js", "action/js/dist/post.js")
    for step in ("main", "post"):
        assert (REPO / runs[step]).is_file()
    assert runs["post-if"] == f"success() || failure() && env.{inputs.SAVE_ON_FAILURE_ENV} == 'true'"
    from pytest_compilecache._env import POST_STEP_ENV  # the plugin's spelling: it sets it after its own failure

    assert inputs.SAVE_ON_FAILURE_ENV == POST_STEP_ENV
    # Literal and relative to the workspace: the client hashes the path string into the entry version.
    assert (
        inputs.SAVE_PATH == ".compilecache-staging/*.bundle" and inputs.HEADER_PATH == ".compilecache-headers/*.bundle"
    )


def test_the_post_step_runs_after_a_red_job_only_for_saving_github_runs_with_save_on_failure(
    environ: dict[str, str], fingerprint: Any
) -> None:
    environ["INPUT_SAVE_ON_FAILURE"] = "true"
    assert inputs.post_env(inputs.make_plan(environ, fingerprint)) == {"COMPILECACHE_SAVE_ON_FAILURE": "true"}
    for other in ({"INPUT_SAVE": "false"}, {"INPUT_STORE": "s3://bucket/p"}, {"INPUT_MODE": "isolated"}):
        assert inputs.post_env(inputs.make_plan({**environ, **other}, fingerprint)) == {}
    environ["INPUT_SAVE_ON_FAILURE"] = "false"
    assert inputs.post_env(inputs.make_plan(environ, fingerprint)) == {}


# ---- the header entry (issue 10): store: github carries each precompiled header as its own entry

HEADER = "c" + "a2b3c4d5e6f7" * 4 + "abc" + ".h.gch"  # torch's name shape: c + 51 base32 chars
SECOND = "c" + "z" * 51 + ".h.gch"


@pytest.fixture
def runner_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's TMPDIR, so that torch's header dir (headers.header_dir()) is private to it."""
    import tempfile

    path = tmp_path / "runner-tmp"
    path.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(path))
    return path


def _planned(action: ModuleType, environ: dict[str, str]) -> tuple[str, Any]:
    """Run the Action's ``plan`` command; return the plan file it wrote (RUNNER_TEMP) and the Plan."""
    assert action.main(["plan"], environ) == 0
    plan_file = str(Path(environ["RUNNER_TEMP"]) / inputs.PLAN)
    return plan_file, inputs.Plan.from_json(json.loads(Path(plan_file).read_text()))


def _header_bytes(name: str) -> bytes:
    """What :func:`_header_bundle` writes for the header ``name``: it starts like a gcc PCH."""
    return b"gpch" + name.encode() * 4000


def _handed_off(environ: Mapping[str, str]) -> Any:
    """The RestoreResult the Action's steps last handed the plugin through GITHUB_ENV (or None)."""
    from pytest_compilecache.sync import read_handoff

    return read_handoff(parse_vars(Path(environ["GITHUB_ENV"]).read_text())["PYTEST_COMPILECACHE_RESTORED"])


def _header_bundle(
    fingerprint: Any,
    plan: Any,
    machine: Path,
    suffix: str,
    carried: tuple[str, ...] = (),
    names: tuple[str, ...] = (),
    idle: int = 0,
) -> tuple[str, dict[str, Any]]:
    """What the plugin of an earlier run wrote into the staging dir: a bundle naming the headers in ``machine``
    (one, or ``names``), with their objects beside it unless ``carried``. Returns the key and headers' sha256.
    ``idle``: the headers were restored, and ``idle`` saves in a row looked none of them up."""
    from pytest_compilecache import pch as headers
    from pytest_compilecache import sync
    from pytest_compilecache.stores import open_store

    machine.mkdir(parents=True, exist_ok=True)
    for name in names or (HEADER,):
        (machine / name).write_bytes(_header_bytes(name))
    source = Path(plan.staging).parent / f"source-{suffix}"
    (source / "fxgraph" / "ab").mkdir(parents=True)
    (source / "fxgraph" / "ab" / "entry").write_bytes(b"graph")
    result = sync.save(
        open_store(plan.staging),
        prefix=plan.prefix,
        fingerprint=fingerprint,
        suffix=suffix,
        cache_dir=str(source),
        blobs={},
        files=["fxgraph/ab/entry"],
        stats={},
        header_since=time.time() + 3600 if idle else 0.0,  # idle: none built this session
        header_dir=machine,
        header_carried=carried,
        header_installed=names or (HEADER,) if idle else (),
        header_idle={name: idle - 1 for name in names or (HEADER,)} if idle > 1 else {},
    )
    assert result.outcome == "saved", result.message
    shas = {name: headers.describe(machine / name) for name in names or (HEADER,)}
    return str(result.key), shas


def _object_key(plan: Any, artifact: Any) -> str:
    from pytest_compilecache import pch as headers

    return headers.object_key(plan.prefix, artifact.sha256)


def _staged_objects(directory: str) -> list[str]:
    return sorted(path.name for path in Path(directory).glob("*.bundle")) if Path(directory).is_dir() else []


def test_restore_names_the_header_entry_and_keeps_the_bundle_entrys_copy(
    action: ModuleType, environ: dict[str, str], fingerprint: Any, tmp_path: Path, runner_tmp: Path
) -> None:
    from pytest_compilecache import pch as headers

    plan = inputs.make_plan(environ, fingerprint)
    _, shas = _header_bundle(fingerprint, plan, tmp_path / "machine", "10-1")  # an entry saved before issue 10
    result = transfer.restore(plan, environ)
    assert result.outcome == "partial"
    key = _object_key(plan, shas[HEADER])
    assert transfer.header_entry(plan, result) == (key, shas[HEADER])
    assert not (headers.header_dir() / HEADER).exists()  # the header step installs it, after its entry's step
    assert _staged_objects(plan.header_spare) == [f"{key}.bundle"]  # the bundle entry's copy, kept for it
    assert result.headers.named == () and result.headers.warnings == ()


def test_several_headers_one_entry_the_others_ride_in_the_bundle_entry(
    action: ModuleType, environ: dict[str, str], fingerprint: Any, tmp_path: Path, runner_tmp: Path
) -> None:
    from pytest_compilecache import pch as headers

    plan = inputs.make_plan(environ, fingerprint)
    _, shas = _header_bundle(fingerprint, plan, tmp_path / "machine", "10-1", names=(SECOND, HEADER))
    result = transfer.restore(plan, environ)
    entry = transfer.header_entry(plan, result)
    assert entry == (_object_key(plan, shas[HEADER]), shas[HEADER])  # the first by name, whatever the order
    assert (headers.header_dir() / SECOND).read_bytes() == _header_bytes(SECOND)  # from the bundle entry
    assert not (headers.header_dir() / HEADER).exists()
    assert result.headers.named == (SECOND,) and result.headers.transferred == (SECOND,)


def test_no_header_entry_for_other_stores_or_without_a_restored_header(
    action: ModuleType, environ: dict[str, str], fingerprint: Any, tmp_path: Path, runner_tmp: Path
) -> None:
    plan = inputs.make_plan(environ, fingerprint)
    assert transfer.header_entry(plan, transfer.restore(plan, environ)) is None  # a miss
    _bundle(fingerprint, Path(plan.staging), "3-1")  # a bundle that names no header (a GPU suite)
    assert transfer.header_entry(plan, transfer.restore(plan, environ)) is None
    environ["INPUT_STORE"] = str(tmp_path / "store")
    direct = inputs.make_plan(environ, fingerprint)
    _header_bundle(fingerprint, direct, tmp_path / "machine", "4-1")
    assert transfer.header_entry(direct, RestoreResult("partial", key="k")) is None


def _stage(plan: Any, directory: str, key: str, path: Path, content: bytes | None = None) -> Path:
    """A header object as the cache client (or the bundle entry) leaves it: ``<dir>/<key>.bundle``, zstd."""
    import zstandard

    Path(directory).mkdir(parents=True, exist_ok=True)
    target = Path(directory) / f"{key}.bundle"
    target.write_bytes(zstandard.ZstdCompressor().compress(path.read_bytes() if content is None else content))
    return target


@pytest.fixture
def header_case(action: ModuleType, environ: dict[str, str], fingerprint: Any, tmp_path: Path, runner_tmp: Path) -> Any:
    """A plan, the header torch built on an earlier machine, its manifest entry and entry key."""
    from pytest_compilecache import pch as headers

    plan = inputs.make_plan(environ, fingerprint)
    machine = tmp_path / "machine"
    machine.mkdir()
    (machine / HEADER).write_bytes(b"gpch" * 5000)
    artifact = headers.describe(machine / HEADER)
    return plan, machine / HEADER, artifact, _object_key(plan, artifact)


def test_header_entry_hit_installs_and_is_carried(action: ModuleType, header_case: Any) -> None:
    from pytest_compilecache import pch as headers

    plan, source, artifact, key = header_case
    _stage(plan, plan.header_staging, key, source)
    carry = transfer.carry_header(plan, key, artifact, hit=True)
    assert (carry.source, carry.present, carry.carried, carry.installed, carry.warnings) == (
        "entry",
        True,
        True,
        True,
        (),
    )
    assert (headers.header_dir() / HEADER).read_bytes() == source.read_bytes()
    assert _staged_objects(plan.header_staging) == []  # a hit is never saved again: no 21 MiB left behind


def test_a_read_only_run_installs_the_bundle_entrys_copy_and_keeps_nothing(
    action: ModuleType, environ: dict[str, str], header_case: Any
) -> None:
    from dataclasses import replace

    from pytest_compilecache import pch as headers

    plan, source, artifact, key = header_case
    plan = replace(plan, save=False)
    _stage(plan, plan.header_spare, key, source)
    carry = transfer.carry_header(plan, key, artifact, hit=False)
    assert (carry.source, carry.present, carry.carried, carry.warnings) == ("bundle", True, False, ())
    assert (headers.header_dir() / HEADER).read_bytes() == source.read_bytes()
    assert _staged_objects(plan.header_staging) == [] and _staged_objects(plan.header_spare) == []


def test_header_entry_miss_installs_the_bundle_entrys_copy_and_stages_it_for_saving(
    action: ModuleType, header_case: Any
) -> None:
    from pytest_compilecache import pch as headers

    plan, source, artifact, key = header_case
    _stage(plan, plan.header_spare, key, source)
    carry = transfer.carry_header(plan, key, artifact, hit=False)
    assert (carry.source, carry.present, carry.carried, carry.warnings) == ("bundle", True, True, ())
    assert (headers.header_dir() / HEADER).read_bytes() == source.read_bytes()
    # The post step saves exactly this object under its exact key; the spare is gone.
    assert _staged_objects(plan.header_staging) == [f"{key}.bundle"] and _staged_objects(plan.header_spare) == []


def test_a_bad_header_entry_falls_back_to_the_bundle_entrys_copy(action: ModuleType, header_case: Any) -> None:
    from pytest_compilecache import pch as headers

    plan, source, artifact, key = header_case
    _stage(plan, plan.header_staging, key, source, content=b"not the header")
    _stage(plan, plan.header_spare, key, source)
    carry = transfer.carry_header(plan, key, artifact, hit=True)
    assert (carry.source, carry.present) == ("bundle", True)
    # The exact key exists (with bad bytes) and is never saved again: the plugin keeps carrying the header.
    assert carry.carried is False
    assert len(carry.warnings) == 1 and f"cache entry {key} not used" in carry.warnings[0]
    assert "does not match" in carry.warnings[0]
    assert (headers.header_dir() / HEADER).read_bytes() == source.read_bytes()


def test_an_evicted_header_entry_is_one_warning_and_torch_builds_it(action: ModuleType, header_case: Any) -> None:
    from pytest_compilecache import pch as headers

    plan, _, artifact, key = header_case
    carry = transfer.carry_header(plan, key, artifact, hit=False)
    assert (carry.source, carry.present, carry.carried) == ("none", False, False)
    assert len(carry.warnings) == 1 and key in carry.warnings[0] and "torch builds it" in carry.warnings[0]
    assert not (headers.header_dir() / HEADER).exists() and _staged_objects(plan.header_staging) == []


def test_a_bad_bundle_entry_copy_is_never_staged_for_saving(action: ModuleType, header_case: Any) -> None:
    from pytest_compilecache import pch as headers

    plan, source, artifact, key = header_case
    _stage(plan, plan.header_spare, key, source, content=b"pch" * 4999 + b"pcX")
    carry = transfer.carry_header(plan, key, artifact, hit=False)
    assert (carry.source, carry.present, carry.carried) == ("none", False, False)
    assert len(carry.warnings) == 1 and "does not match" in carry.warnings[0]
    assert _staged_objects(plan.header_staging) == [] and not (headers.header_dir() / HEADER).exists()


def test_a_header_already_in_torchs_dir_is_still_checked_before_it_is_saved(
    action: ModuleType, header_case: Any
) -> None:
    from pytest_compilecache import pch as headers

    plan, source, artifact, key = header_case
    headers.header_dir().mkdir(parents=True)
    (headers.header_dir() / HEADER).write_bytes(b"gpch torch's own")  # a PCH: never overwritten
    _stage(plan, plan.header_spare, key, source, content=b"forged")
    carry = transfer.carry_header(plan, key, artifact, hit=False)
    assert (carry.source, carry.carried) == ("none", False) and _staged_objects(plan.header_staging) == []
    _stage(plan, plan.header_spare, key, source)
    carry = transfer.carry_header(plan, key, artifact, hit=False)
    assert (carry.source, carry.present, carry.installed, carry.carried) == ("bundle", True, False, True)
    assert (headers.header_dir() / HEADER).read_bytes() == b"gpch torch's own"


def test_a_header_another_process_is_putting_in_place_is_not_called_already_there(
    action: ModuleType,
    environ: dict[str, str],
    fingerprint: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Another process on the runner holds torch's build lock for the header (torch building it, another job's
    install): the verified copy is not installed here, the plugin is still told the header is named (it will be
    in torch's dir: jobs sharing a runner restore one header), and the log says who puts it there."""
    import fcntl

    from pytest_compilecache import pch as headers

    plan = _saving_plan(action, environ, monkeypatch, fingerprint)
    _header_bundle(fingerprint, plan, tmp_path / "machine", "1-1", names=(SECOND, HEADER), idle=2)
    assert action.main(["restore"], environ) == 0
    locks = headers.header_dir() / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    with open(locks / (HEADER.split(".", 1)[0] + ".lock"), "w") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)  # what torch's FileLock does while it builds the header
        assert action.main(["headers"], environ) == 0
    assert not (headers.header_dir() / HEADER).exists()
    result = _handed_off(environ)
    assert result is not None and result.headers.named == (SECOND, HEADER)
    out = capsys.readouterr().out
    assert "being put in torch's dir by another process (it holds torch's build lock), checked" in out
    assert "already in torch's dir" not in out


def test_restore_and_headers_commands_tell_the_plugin_which_header_the_entry_carries(
    action: ModuleType,
    environ: dict[str, str],
    fingerprint: Any,
    tmp_path: Path,
    runner_tmp: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Two runs, as action.yml runs them: the first restores an entry that still carries the header object
    (and saves it as the header entry); the plugin's next bundle names it without carrying it; the second run
    gets it from the header entry."""
    import pytest_compilecache.action_api
    from pytest_compilecache import pch as headers
    from pytest_compilecache.sync import read_handoff as action_restore_result

    monkeypatch.setattr(pytest_compilecache.action_api, "collect_fingerprint", lambda salt="": fingerprint)
    _, plan = _planned(action, environ)
    _, shas = _header_bundle(fingerprint, plan, tmp_path / "machine", "1-1")
    key = _object_key(plan, shas[HEADER])
    reply = Path(environ["RUNNER_TEMP"]) / "reply.json"
    assert action.main(["restore"], {**environ, "COMPILECACHE_REPLY": str(reply)}) == 0
    assert json.loads(reply.read_text()) == {"header": {"key": key, "path": ".compilecache-headers/*.bundle"}}
    restored = json.loads(parse_vars(Path(environ["GITHUB_ENV"]).read_text())["PYTEST_COMPILECACHE_RESTORED"])
    assert restored["headers"]["named"] == [] and restored["headers"]["carried"] == []

    # The header entry missed (the client matched nothing): the bundle entry's copy is used.
    assert action.main(["headers"], environ) == 0
    out = capsys.readouterr().out
    assert "::warning" not in out and f"from the bundle entry; saved as {key} at job end" in out
    assert (headers.header_dir() / HEADER).exists()
    assert _staged_objects(plan.header_staging) == [f"{key}.bundle"]
    env = parse_vars(Path(environ["GITHUB_ENV"]).read_text())  # the later line wins
    result = action_restore_result(env["PYTEST_COMPILECACHE_RESTORED"])
    assert result is not None and result.outcome == "partial"
    assert (result.headers.named, result.headers.carried) == ((HEADER,), (key,))

    # The plugin's save in the pytest step: names the header, writes only the bundle into the staging dir.
    new_key, _ = _header_bundle(fingerprint, plan, tmp_path / "machine", "2-1", carried=result.headers.carried)
    assert _staged_objects(plan.staging) == [f"{new_key}.bundle"]

    # The next run, on a fresh runner: the header entry (saved at job end) hits.
    saved_entry = (Path(plan.header_staging) / f"{key}.bundle").read_bytes()
    for path in (Path(environ["RUNNER_TEMP"]), Path(plan.header_staging), runner_tmp):
        shutil.rmtree(path)
        path.mkdir()
    for name in ("GITHUB_ENV", "GITHUB_OUTPUT"):
        Path(environ[name]).write_text("")
    staged_bundle = (Path(plan.staging) / f"{new_key}.bundle").read_bytes()
    assert action.main(["plan"], environ) == 0
    (Path(plan.staging)).mkdir(parents=True)
    (Path(plan.staging) / f"{new_key}.bundle").write_bytes(staged_bundle)  # the cache client restored it
    assert action.main(["restore"], {**environ, "COMPILECACHE_REPLY": str(reply)}) == 0
    assert json.loads(reply.read_text())["header"]["key"] == key
    assert _staged_objects(plan.header_spare) == []  # the new bundle entry carries no copy
    assert not Path(plan.header_staging).exists()  # plan leaves only what the cache client restores there
    Path(plan.header_staging).mkdir()
    (Path(plan.header_staging) / f"{key}.bundle").write_bytes(saved_entry)  # the cache client restored it
    found = json.dumps({"matched": key, "problem": None})
    assert action.main(["headers"], {**environ, "COMPILECACHE_FOUND": found}) == 0
    assert f"installed, from its cache entry {key}" in capsys.readouterr().out
    assert (headers.header_dir() / HEADER).read_bytes() == _header_bytes(HEADER)
    result = _handed_off(environ)
    assert result is not None and result.headers.carried == (key,)


def test_the_headers_command_hands_the_plugin_the_header_entrys_idle_count(
    action: ModuleType,
    environ: dict[str, str],
    fingerprint: Any,
    tmp_path: Path,
    runner_tmp: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The header the header entry carries goes to the plugin with the count the verified manifest gives it, so
    the plugin's save counts on from there (pch.IDLE_SAVES)."""
    from pytest_compilecache import pch as headers

    plan = _saving_plan(action, environ, monkeypatch, fingerprint)
    _header_bundle(fingerprint, plan, tmp_path / "machine", "1-1", names=(SECOND, HEADER), idle=2)
    assert action.main(["restore"], environ) == 0
    restored = _handed_off(environ)
    assert restored is not None and restored.headers.idle == {SECOND: 2}  # rode in the bundle entry
    assert action.main(["headers"], environ) == 0  # the header entry missed: the bundle entry's copy
    assert (headers.header_dir() / HEADER).exists()
    result = _handed_off(environ)
    assert result is not None and result.headers.named == (SECOND, HEADER)
    assert result.headers.idle == {SECOND: 2, HEADER: 2}


def test_headers_command_without_a_header_does_nothing(
    action: ModuleType, environ: dict[str, str], fingerprint: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pytest_compilecache.action_api

    monkeypatch.setattr(pytest_compilecache.action_api, "collect_fingerprint", lambda salt="": fingerprint)
    _planned(action, environ)
    Path(environ["GITHUB_ENV"]).write_text("")
    assert action.main(["headers"], environ) == 0
    assert Path(environ["GITHUB_ENV"]).read_text() == ""


def test_an_evicted_header_entry_makes_the_headers_command_warn_not_fail(
    action: ModuleType,
    environ: dict[str, str],
    fingerprint: Any,
    tmp_path: Path,
    runner_tmp: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import pytest_compilecache.action_api

    monkeypatch.setattr(pytest_compilecache.action_api, "collect_fingerprint", lambda salt="": fingerprint)
    _, plan = _planned(action, environ)
    _header_bundle(fingerprint, plan, tmp_path / "machine", "1-1", carried=("x",))
    (Path(plan.staging) / "x").write_text("")  # not a bundle name: ignored
    for path in Path(plan.staging).glob("*-artifact-*.bundle"):
        path.unlink()  # a bundle entry saved after issue 10: no copy of the header
    assert action.main(["restore"], environ) == 0
    capsys.readouterr()
    assert action.main(["headers"], environ) == 0
    out = capsys.readouterr().out
    assert out.count("::warning") == 1 and "torch builds it" in out
    result = _handed_off(environ)
    assert result is not None and (result.headers.named, result.headers.carried) == ((), ())


def test_headers_command_trouble_is_a_warning_not_a_failed_job(
    action: ModuleType,
    environ: dict[str, str],
    fingerprint: Any,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import pytest_compilecache.action_api

    monkeypatch.setattr(pytest_compilecache.action_api, "collect_fingerprint", lambda salt="": fingerprint)
    _planned(action, environ)
    (Path(environ["RUNNER_TEMP"]) / inputs.HEADER_STATE).write_text('{"key": "k", "artifact": {"kind": "x"}}')
    capsys.readouterr()
    assert action.main(["headers"], environ) == 0
    out = capsys.readouterr().out
    assert out.startswith("::warning") and "precompiled header not restored: HeaderError" in out


def test_the_install_step_runs_before_the_plugin_is_installed(tmp_path: Path) -> None:
    """``python action/main.py install`` on an interpreter without the plugin (``-S``: no site-packages): the
    Action's checkout supplies ``ghrunner`` (imported as a module), and ``install: false`` says the plugin is
    not installed rather than using the checkout's copy."""
    from tests.action.conftest import REPO

    def install(**inputs: str) -> subprocess.CompletedProcess[str]:
        env = {"PATH": os.environ.get("PATH", ""), "GITHUB_ACTION_PATH": str(REPO), **RUN, **inputs}
        return subprocess.run(
            [sys.executable, "-S", str(REPO / "action" / "main.py"), "install"],
            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    bad = install(INPUT_INSTALL="perhaps\n::warning::injected")
    assert bad.returncode == 2, bad.stderr
    assert bad.stdout.startswith("::error title=pytest-compilecache::input install: expected true or false")
    assert "\n::warning::injected" not in bad.stdout  # escaped by ghrunner
    missing = install(INPUT_INSTALL="false")
    assert missing.returncode == 2, missing.stderr
    assert "input install is false but pytest-compilecache is not importable" in missing.stdout


def test_the_install_step_imports_the_actions_package_not_an_older_install(tmp_path: Path) -> None:
    """A project that pinned an older release (0.2.0 has no store table, 0.1.0 no ``_version.py``) and runs this
    Action with ``install: true``: the install step reads the store table and the options from the Action's
    checkout (it crashed with ModuleNotFoundError), installs the Action's version with the store's extra, and
    checks the other inputs before pip runs; with ``install: false`` it names the installed version."""
    import venv

    from tests.action.conftest import REPO

    venv.create(tmp_path / "venv", with_pip=False)  # no pip: the step's command goes to uv (a recorder here)
    old = tmp_path / "site" / "pytest_compilecache"
    old.mkdir(parents=True)
    (old / "__init__.py").write_text('__version__ = "0.1.0"\n')  # as 0.1.0 wrote it; no stores, no settings
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "uv").write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {tmp_path / "uv-args"}\n')
    (tools / "uv").chmod(0o755)

    def install(**inputs: str) -> subprocess.CompletedProcess[str]:
        env = {
            "PATH": f"{tools}{os.pathsep}{os.environ.get('PATH', '')}",
            "PYTHONPATH": str(old.parent),
            "GITHUB_ACTION_PATH": str(REPO),
            **RUN,
            **inputs,
        }
        return subprocess.run(
            [str(tmp_path / "venv" / "bin" / "python"), str(REPO / "action" / "main.py"), "install"],
            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    done = install(INPUT_STORE="gs://bucket/ci")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "uv-args").read_text().split("\n")[-2] == f"{REPO}[gcs]"
    (tmp_path / "uv-args").unlink()
    bad = install(INPUT_STORE="gs://bucket/ci", INPUT_MIN_HIT_RATE="90%")
    assert bad.returncode == 2, bad.stderr
    assert bad.stdout.startswith("::error title=pytest-compilecache::input min-hit-rate:")
    assert not (tmp_path / "uv-args").exists()  # nothing installed for a run that cannot plan
    kept = install(INPUT_INSTALL="false")
    assert kept.returncode == 0, kept.stderr
    assert "the installed pytest-compilecache is 0.1.0, this Action is" in kept.stdout


# ---- the save policy the Action hands the plugin (issue 26)


def test_action_save_policy_reads_the_hand_off() -> None:
    from pytest_compilecache.sync import SavePolicy as ActionSave
    from pytest_compilecache.sync import read_save_policy as action_save_policy
    from pytest_compilecache.sync import write_handoff

    done = write_handoff(RestoreResult("miss"), ActionSave(True, True))
    assert action_save_policy(done) == ActionSave(only_when_passed=True, staged=True)  # one writer, one reader

    assert action_save_policy(None) == action_save_policy("not json") == action_save_policy("[1]") == ActionSave()
    assert action_save_policy('{"outcome":"miss"}') == ActionSave(only_when_passed=False, staged=False)
    told = '{"outcome":"miss","save_when":"passed","save_staged":true}'
    assert action_save_policy(told) == ActionSave(only_when_passed=True, staged=True)
    assert action_save_policy('{"save_when":"always","save_staged":"yes"}') == ActionSave()


@pytest.mark.parametrize("store", ["github", "s3://bucket/ci/cache", "gs://bucket/ci", "file:///srv/cache"])
@pytest.mark.parametrize("on_failure", ["false", "true"])
def test_one_save_policy_for_every_store(
    environ: dict[str, str], fingerprint: Any, store: str, on_failure: str
) -> None:
    """Issue 26: what the restore hands the plugin about a red run's save is input save-on-failure's, whatever
    the store; only store github's save is staged (the post step uploads it). The plugin's side, in a real
    session: test_the_plugin_saves_nothing_after_failed_tests_when_told; the whole flow under act:
    tests/action/test_act.py (a red job on store github)."""
    from pytest_compilecache.sync import read_save_policy

    environ.update(INPUT_STORE=store, INPUT_SAVE_ON_FAILURE=on_failure)
    plan = inputs.make_plan(environ, fingerprint)
    told = transfer.restored_env(plan, RestoreResult("miss"))["PYTEST_COMPILECACHE_RESTORED"]
    policy = read_save_policy(told)
    assert policy.only_when_passed is (on_failure == "false")
    assert policy.staged is (store == "github")


@pytest.mark.slow  # two pytest sessions that fingerprint torch
@pytest.mark.parametrize(("save_when", "outcome"), [("passed", "skipped"), ("always", None)])
def test_the_plugin_saves_nothing_after_failed_tests_when_told(
    tmp_path: Path, save_when: str, outcome: str | None
) -> None:
    """What the Action tells the plugin decides a red session's save, on every store (here a directory)."""
    (tmp_path / "test_red.py").write_text("def test_red():\n    assert False\n")
    report = tmp_path / "report.json"
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PYTEST_COMPILECACHE_", "GITHUB_", "RUNNER_"))
    }
    env.update(
        PYTEST_COMPILECACHE_MODE="shared",
        PYTEST_COMPILECACHE_DIR=str(tmp_path / "dir"),
        PYTEST_COMPILECACHE_STORE=str(tmp_path / "store"),
        PYTEST_COMPILECACHE_RESTORE="skip",
        PYTEST_COMPILECACHE_JSON=str(report),
        PYTEST_COMPILECACHE_RESTORED=json.dumps({"outcome": "miss", "save_when": save_when}),
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_red.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    save = json.loads(report.read_text())["save"]
    if outcome is None:  # the save went ahead, and found nothing compiled to save
        assert (save["outcome"], save["message"]) == ("skipped", "nothing was compiled")
    else:
        why = "the tests failed: nothing saved (input save-on-failure)"
        assert (save["outcome"], save["message"]) == (outcome, why)


def test_the_restore_names_the_run_whose_upload_it_found(environ: dict[str, str], fingerprint: Any) -> None:
    """The next restore says whose entry it found (the newest of the lineage: the last upload that worked)."""
    plan = inputs.make_plan(environ, fingerprint)
    key = f"{plan.restore_prefix}987-2"
    assert transfer.saved_by(plan, key) == "987 attempt 2"
    assert transfer.saved_by(plan, "another-lineage-987-2") is None
    text = transfer.restore_markdown(plan, RestoreResult("partial", key=key, size=10, seconds=0.1, files=1))
    assert "(the newest saved: run 987 attempt 2)" in text


# ---- the post step (issue 42): what it uploads, and the real result


def _saving_plan(action: ModuleType, environ: dict[str, str], monkeypatch: pytest.MonkeyPatch, fingerprint: Any) -> Any:
    import pytest_compilecache.action_api

    monkeypatch.setattr(pytest_compilecache.action_api, "collect_fingerprint", lambda salt="": fingerprint)
    return _planned(action, environ)[1]


def test_save_names_the_plugins_bundle_and_a_staged_header(
    action: ModuleType, environ: dict[str, str], fingerprint: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from action import upload

    plan = _saving_plan(action, environ, monkeypatch, fingerprint)
    Path(plan.staging).mkdir(parents=True)
    (Path(plan.staging) / f"{plan.key}.bundle").write_bytes(b"b" * 300)
    Path(plan.header_staging).mkdir(parents=True)
    (Path(plan.header_staging) / "lineage-artifact-abc.bundle").write_bytes(b"h" * 20)
    reply = Path(environ["RUNNER_TEMP"]) / "reply.json"
    assert action.main(["save"], {**environ, "COMPILECACHE_REPLY": str(reply)}) == 0
    assert json.loads(reply.read_text()) == {
        "report": True,
        "uploads": [
            {"what": "bundle", "key": plan.key, "path": ".compilecache-staging/*.bundle", "bytes": 300},
            {"what": "header", "key": "lineage-artifact-abc", "path": ".compilecache-headers/*.bundle", "bytes": 20},
        ],
        "skipped": [],
    }
    # Read-only runs and other stores: nothing to upload, nothing to say.
    assert upload.save_reply(inputs.make_plan({**environ, "INPUT_SAVE": "false"}, fingerprint)) == {"report": False}
    assert upload.save_reply(inputs.make_plan({**environ, "INPUT_STORE": "store"}, fingerprint)) == {"report": False}
    assert upload.save_reply(None) == {"report": False}


def test_save_leaves_out_a_staged_header_the_plugins_new_bundle_no_longer_names(
    action: ModuleType,
    environ: dict[str, str],
    fingerprint: Any,
    tmp_path: Path,
    runner_tmp: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The header entry missed, so the restore staged the bundle entry's copy for the post step; if the plugin's
    save then dropped that header (pch.IDLE_SAVES), uploading it would make an entry no bundle names."""
    from action import upload
    from pytest_compilecache import pch as headers

    plan = _saving_plan(action, environ, monkeypatch, fingerprint)
    named = headers.object_key(plan.prefix, hashlib.sha256(_header_bytes(HEADER)).hexdigest())
    # names HEADER and SECOND; SECOND's object rides in the bundle entry, beside the bundle
    _header_bundle(fingerprint, plan, tmp_path / "machine", "1-1", carried=(named,), names=(HEADER, SECOND))
    assert len(list(Path(plan.staging).glob("*-artifact-*.bundle"))) == 1
    Path(plan.header_staging).mkdir(parents=True)
    staged = Path(plan.header_staging) / f"{named}.bundle"
    staged.write_bytes(b"h" * 20)
    uploads, skipped = upload.plan_uploads(plan)
    assert [(item.what, item.key) for item in uploads] == [("bundle", plan.key), ("header", named)] and not skipped
    dropped = headers.object_key(plan.prefix, "0" * 64)
    staged.rename(Path(plan.header_staging) / f"{dropped}.bundle")
    uploads, skipped = upload.plan_uploads(plan)
    assert [(item.what, item.key) for item in uploads] == [("bundle", plan.key)]
    assert [(item.what, item.key, item.outcome) for item in skipped] == [("header", dropped, "not needed")]
    assert "no longer names it" in skipped[0].why


def test_save_after_a_main_step_that_stopped_before_its_plan_says_nothing(
    action: ModuleType, environ: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    reply = Path(environ["RUNNER_TEMP"]) / "reply.json"
    assert action.main(["save"], {**environ, "COMPILECACHE_REPLY": str(reply)}) == 0
    assert json.loads(reply.read_text()) == {"report": False} and capsys.readouterr().out == ""


@pytest.mark.parametrize(
    ("report", "why"),
    [
        ({"save": {"outcome": "skipped", "message": "nothing new was compiled"}}, "nothing new was compiled"),
        (None, "no pytest session with the plugin reported"),
        ({"save": {"outcome": "error", "message": "disk full"}}, "the plugin's save failed (disk full)"),
    ],
)
def test_no_bundle_is_not_needed_and_says_why(
    action: ModuleType,
    environ: dict[str, str],
    fingerprint: Any,
    monkeypatch: pytest.MonkeyPatch,
    report: Any,
    why: str,
) -> None:
    from action import upload

    plan = _saving_plan(action, environ, monkeypatch, fingerprint)
    if report is not None:
        Path(plan.json).write_text(json.dumps(report))
    uploads, (skipped,) = upload.plan_uploads(plan)
    assert uploads == [] and (skipped.what, skipped.key, skipped.outcome) == ("bundle", plan.key, "not needed")
    assert why in skipped.why


def test_a_staged_bundle_that_vanished_is_a_failure(
    action: ModuleType, environ: dict[str, str], fingerprint: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from action import upload

    plan = _saving_plan(action, environ, monkeypatch, fingerprint)
    Path(plan.json).write_text(json.dumps({"save": {"outcome": "staged", "message": "staged"}}))
    (skipped,) = upload.plan_uploads(plan)[1]
    assert skipped.outcome == "failed" and ".compilecache-staging holds no bundle" in skipped.why


RESERVE_429 = (
    "Failed to reserve cache: Error: Failed to CreateCacheEntry: Received non-retryable error: Failed request: "
    "(429) Too Many Requests: too many cache entries created"
)


@pytest.mark.parametrize(
    ("result", "outcome", "why"),
    [
        ({"id": 17, "problems": []}, "saved", ""),
        (
            {"id": -1, "problems": ["Failed to save: Unable to reserve cache with key k", RESERVE_429]},
            "failed",
            RESERVE_429 + "; Failed to save: Unable to reserve cache with key k",  # the service's answer first
        ),
        ({"id": -1, "problems": ["Failed to reserve cache: Error: (409) Conflict: exists"]}, "failed", "same job id"),
        ({"id": -1, "problems": []}, "failed", "logged no reason"),
        ({"problems": ["Failed to save: (500) boom"]}, "failed", "Failed to save: (500) boom"),
    ],
)
def test_the_clients_result_is_saved_not_needed_or_failed(result: dict[str, Any], outcome: str, why: str) -> None:
    """A bundle's key holds the run id and attempt: an entry of that key already there is another job of this
    run with this job's lineage (a reusable workflow called twice sees one job id), a failed save to name."""
    from action import upload

    saved = upload.outcome({"what": "bundle", "key": "k", "path": "p", "bytes": 3, "seconds": 0.5, **result})
    assert saved.outcome == outcome and why in saved.why


def test_a_header_entry_another_job_saved_first_was_not_needed() -> None:
    """A header entry is keyed by its content per lineage: one saved first by another job is nothing lost."""
    from action import upload

    exists = {"id": -1, "problems": ["Failed to reserve cache: Error: (409) Conflict: exists"]}
    saved = upload.outcome({"what": "header", "key": "k", "path": "p", "bytes": 3, **exists})
    assert saved.outcome == "not needed"
    assert saved.why == "the entry exists already (another job of this lineage saved it)"
    assert upload.warning([saved]) is None


def test_saved_reports_the_real_result_with_one_warning_for_failures(
    action: ModuleType,
    environ: dict[str, str],
    fingerprint: Any,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    plan = _saving_plan(action, environ, monkeypatch, fingerprint)
    capsys.readouterr()
    summary = Path(environ["GITHUB_STEP_SUMMARY"])
    summary.write_text("")
    bundle = {"what": "bundle", "key": plan.key, "path": "p", "bytes": 2 << 20, "seconds": 1.25}
    told = {"report": True, "uploads": [{**bundle, "id": 3, "problems": []}], "skipped": []}
    assert action.main(["saved"], {**environ, "COMPILECACHE_SAVES": json.dumps(told)}) == 0
    out = capsys.readouterr().out
    assert "::" not in out and f"save: bundle entry {plan.key}: saved (2.0 MiB in 1.2 s)" in out
    assert f"| bundle entry | saved: `{plan.key}`, 2.0 MiB in 1.2 s |" in summary.read_text()

    summary.write_text("")
    header = {"what": "header", "key": "h-artifact-1", "path": "q", "bytes": 5}
    refused = ["::warning::<b>|x", RESERVE_429]  # the client's words, untrusted: escaped everywhere
    told = {
        "report": True,
        "uploads": [{**bundle, "id": -1, "problems": refused}, {**header, "id": -1, "problems": refused}],
        "skipped": [],
    }
    assert action.main(["saved"], {**environ, "COMPILECACHE_SAVES": json.dumps(told)}) == 0
    out = capsys.readouterr().out
    warnings = [line for line in out.splitlines() if line.startswith("::")]
    assert len(warnings) == 1 and warnings[0].startswith("::warning title=compile cache::save bundle entry")
    assert "header entry h-artifact-1: failed" in warnings[0] and "the job's outcome is unchanged" in warnings[0]
    text = summary.read_text()
    assert "| bundle entry | failed: " in text and "\\<b\\>\\|x" in text and "(429) Too Many Requests" in text

    summary.write_text("")
    why = "nothing new was compiled"
    told = {
        "report": True,
        "uploads": [],
        "skipped": [{"what": "bundle", "key": plan.key, "outcome": "not needed", "why": why}],
    }
    assert action.main(["saved"], {**environ, "COMPILECACHE_SAVES": json.dumps(told)}) == 0
    assert "::" not in capsys.readouterr().out
    assert f"| bundle entry | not needed: {why} (`{plan.key}`) |" in summary.read_text()
