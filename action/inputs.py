"""The Action's inputs: read, checked, and turned into one :class:`Plan` (the ``plan`` step), and the
``install`` step's command.

Inputs arrive as ``INPUT_<NAME>`` variables (``key-prefix`` -> ``INPUT_KEY_PREFIX``): the runner gives the node
action ``INPUT_KEY-PREFIX``, and action/js passes it to Python with ``_`` for ``-``. The runner's own
``GITHUB_*`` and ``RUNNER_*`` variables say where to write and which run this is. A bad input is an
:class:`InputError` naming it as the workflow spells it (configuration errors fail fast).

Standard library only at import: the ``install`` step runs before the plugin is installed; what the plan
needs of the plugin is imported from :mod:`pytest_compilecache.action_api` inside :func:`make_plan`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any
from typing import Callable
from typing import Mapping

GITHUB_STORE = "github"
ENV_PREFIX = "PYTEST_COMPILECACHE_"
# The same name as pytest_compilecache._env.SIGNING_KEY_ENV (a test checks): spelled here because the install
# step runs before the package is importable.
SIGNING_KEY_ENV = ENV_PREFIX + "SIGNING_KEY"
RESTORED_ENV = ENV_PREFIX + "RESTORED"
# Read by action.yml's post-if (``success() || failure() && env.<this> == 'true'``); see post_env. The plugin
# sets it too (pytest_compilecache._env.POST_STEP_ENV, the same name: a test checks).
SAVE_ON_FAILURE_ENV = "COMPILECACHE_SAVE_ON_FAILURE"
# Events whose runs save with ``save: auto``, and then only on the default branch: an entry saved on
# another branch serves only that branch (and its pull requests) and evicts the default branch's
# entries from the repository's quota (setup-gradle's default).
SAVING_EVENTS = ("push", "schedule", "workflow_dispatch")
# Never save, whatever ``save`` says. pull_request_target runs with a write token in the base
# repository's cache scope, often on a fork's code, so a save would let a fork poison the cache every
# later run restores. merge_group runs on a temporary gh-readonly-queue/... branch whose entries no
# later run can read: a save would only use quota and evict the default branch's entries.
NEVER_SAVING_EVENTS = ("pull_request_target", "merge_group")
# The plugin's options the Action's own steps read from the job's environment, as the pytest step will: the
# restore's size cap and store timeout, and the store options its backend takes (settings.STORE_OPTIONS).
JOB_OPTIONS = ("max_bundle_size", "store_timeout", "s3_endpoint")
_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")
# The names under RUNNER_TEMP (the runner empties it for every job).
INBOX, CACHE_DIR, REPORT, PLAN = (
    "compilecache-inbox",
    "compilecache-dir",
    "compilecache-report.json",
    "compilecache-plan.json",
)
# The staging dir the cache client restores into and saves from, relative to GITHUB_WORKSPACE (where
# @actions/cache resolves relative paths, and the node action's working dir). The client hashes the path
# string, ``<STAGING>/*.bundle``, into the entry version, so it must be the same on every runner (an absolute
# RUNNER_TEMP is not: self-hosted runners differ, act randomises it). action/js gets it from the plan's reply.
STAGING = ".compilecache-staging"
SAVE_PATH = STAGING + "/*.bundle"
# The header entry (store: github): each precompiled header travels as its own cache entry keyed
# by its content, ``<lineage>-artifact-<sha256>`` (:func:`pytest_compilecache.headers.object_key`), saved
# once, restored by the runs whose bundle names it. Its staging dir is literal for the same reasons as
# STAGING's and holds at most that one object, ``<key>.bundle`` (a directory store's file name, so that the
# header code reads it as a store). HEADER_SPARE (under RUNNER_TEMP) keeps the bundle entry's own copy of the
# object, where an older run or a changed header put one: the fallback when the header entry is missing.
HEADER_STAGING = ".compilecache-headers"
HEADER_PATH = HEADER_STAGING + "/*.bundle"
HEADER_SPARE, HEADER_STATE = "compilecache-header-spare", "compilecache-header.json"


class InputError(ValueError):  # here, not in errors.py: the install step runs before the package imports
    """An input of the Action is invalid; the message names it as the workflow spells it."""


def read(environ: Mapping[str, str], name: str, default: str = "") -> str:
    """Input ``name`` without the spaces around it; ``default`` when the runner gave none. Empty is the
    input's default wherever it is read (an unset ``${{ vars.X }}``); only spaces is an InputError, as the
    plugin's options refuse it: a mistake, not "unset"."""
    value = environ.get("INPUT_" + name.upper().replace("-", "_"))
    if value is None:
        return default
    if value and not value.strip():
        raise InputError(f"input {name}: only spaces; leave it empty (or out) for its default")
    return _utf8(f"input {name}", value.strip())


def with_signing_key(environ: Mapping[str, str]) -> Mapping[str, str]:
    """``environ`` as the plugin would see it in this job's later steps: with input ``signing-key`` (when given)
    as :data:`SIGNING_KEY_ENV`, which the plan step exports. The restore, in the plan's own step, verifies with
    it: the runner applies ``GITHUB_ENV`` only to later steps. Without the input, the step's own variable."""
    key = read(environ, "signing-key")
    return {**environ, SIGNING_KEY_ENV: key} if key else environ


def _utf8(what: str, value: str) -> str:
    """``value``, or InputError when it holds bytes that are not UTF-8 (Python keeps them as lone surrogates:
    they could be neither printed nor written to GITHUB_ENV)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(f"{what}: not valid UTF-8") from None
    return value


def _flag(environ: Mapping[str, str], name: str, default: str) -> bool:
    value = read(environ, name, default).lower() or default
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise InputError(f"input {name}: expected true or false, got {value!r}")


def decide_save(value: str, event: str, ref: str = "", default_branch: str = "") -> tuple[bool, str]:
    """Whether this run saves a bundle (input ``save``: auto, true or false), and why, in words.

    ``ref`` is ``GITHUB_REF``; ``default_branch`` the repository's (from the event payload, see
    :func:`default_branch`; empty when unknown, and then ``save: auto`` does not save).
    """
    value = (value or "auto").strip().lower()
    if value not in ("auto", *_TRUE, *_FALSE):
        raise InputError(f"input save: expected auto, true or false, got {value!r}")
    if event == "pull_request_target":
        return False, f"{event} runs never save (a fork could poison the cache)"
    if event == "merge_group":
        return False, f"{event} runs never save (no later run can read a merge queue branch's entries)"
    if value in _TRUE:
        return True, "save: true"
    if value in _FALSE:
        return False, "save: false"
    if event not in SAVING_EVENTS:
        return False, (
            f"save: auto restores only on {event or 'this event'} (it saves on "
            f"{', '.join(SAVING_EVENTS)} to the default branch)"
        )
    if not default_branch:
        return False, "save: auto could not tell the default branch (no repository.default_branch in the event)"
    if ref != f"refs/heads/{default_branch}":
        return False, f"save: auto saves on the default branch ({default_branch}) only, not on {ref or 'this ref'}"
    return True, f"save: auto saves on {event} to {default_branch}"


def default_branch(environ: Mapping[str, str]) -> str:
    """The repository's default branch, from the event payload (``GITHUB_EVENT_PATH``); empty if unknown."""
    try:
        event = json.loads(Path(environ.get("GITHUB_EVENT_PATH") or "").read_text(encoding="utf-8"))
        return str(event["repository"]["default_branch"] or "")
    except (OSError, ValueError, KeyError, TypeError):
        return ""


def lineage(environ: Mapping[str, str], prefix: str) -> str:
    """``<key-prefix>-<job id>[-<matrix leg>]``: what every key of this job starts with.

    Two jobs, or two legs of a matrix, with one fingerprint would otherwise race for one key (the
    loser's save is refused) and restore each other's bundles. The matrix leg is a short hash of the
    job's ``matrix`` context (input ``matrix-leg``, whose default in action.yml is ``toJSON(matrix)``).
    """
    import hashlib
    import re

    job = re.sub(r"[^A-Za-z0-9._-]", "_", environ.get("GITHUB_JOB", ""))
    if len(job) > 60:  # cut, but two ids alike in their first 60 characters stay apart
        job = f"{job[:51]}-{hashlib.sha256(job.encode()).hexdigest()[:8]}"
    parts = [prefix, job] if job else [prefix]
    matrix = read(environ, "matrix-leg")
    if matrix and matrix not in ("null", "{}", '""'):
        try:
            canonical = json.dumps(json.loads(matrix), sort_keys=True, separators=(",", ":"))
        except ValueError:
            canonical = matrix
        parts.append(hashlib.sha256(canonical.encode()).hexdigest()[:8])
    return "-".join(parts)


@dataclass
class Plan:
    """What ``plan`` decided; written to ``RUNNER_TEMP/compilecache-plan.json`` for ``restore``.

    ``transfer``: ``github`` (``@actions/cache`` moves the bundle through ``staging``), ``direct`` (the
    plugin's own store: S3 or a directory) or ``none`` (mode isolated or disabled: nothing to move).
    """

    transfer: str
    store: str
    save: bool
    why: str
    mode: str
    prefix: str  # the lineage: input key-prefix, the job id and the matrix leg (see lineage())
    salt: str
    suffix: str
    digest: str
    key: str
    restore_prefix: str
    staging: str
    inbox: str
    cache_dir: str
    json: str
    summary: bool
    min_hit_rate: str
    save_on_failure: bool = False  # input save-on-failure: save after failed tests too (see transfer.restored_env)
    pgo: bool = False  # input pgo: the plugin's --compile-cache-pgo=on for the job's later steps
    event: str = ""
    strict: bool = False  # the job's PYTEST_COMPILECACHE_STRICT: restore trouble keeps min-hit-rate (gate_lifted)
    fingerprint: dict[str, str] = field(default_factory=dict)
    header_staging: str = ""  # the header entry's staging dir (workspace/HEADER_STAGING)
    header_spare: str = ""  # the bundle entry's copy of the header object (RUNNER_TEMP/HEADER_SPARE)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Plan:
        return cls(**data)


@dataclass(frozen=True)
class Inputs:
    """The inputs checked by :func:`check`: everything the plan decides that needs nothing installed."""

    store: str  # as given; ``github`` in any case is the GitHub cache
    mode: str
    prefix: str  # the lineage: input key-prefix, the job id and the matrix leg (see lineage())
    salt: str
    min_hit_rate: str
    strict: bool
    suffix: str
    save: bool
    why: str
    summary: bool
    save_on_failure: bool
    pgo: bool


def check(environ: Mapping[str, str]) -> Inputs:
    """Check every input that needs nothing installed (raises InputError naming the first bad one).

    The ``install`` step calls it before pip runs, so a mistyped input fails in seconds, not after an install;
    :func:`make_plan` calls it again and adds what needs the installed plugin (the store's backend). Uses only
    the standard library and the package's option table (:mod:`pytest_compilecache.settings`, standard library
    only too), so the Action's checkout of the package serves before the plugin is installed.
    """
    from pytest_compilecache.errors import ConfigError
    from pytest_compilecache.settings import DEFAULT_PREFIX
    from pytest_compilecache.settings import OPTIONS
    from pytest_compilecache.settings import from_environment
    from pytest_compilecache.settings import read_signing_key

    parsers = {option.name: option.parse for option in OPTIONS}
    try:
        store = read(environ, "store", GITHUB_STORE) or GITHUB_STORE
        mode = parsers["mode"]("input mode", read(environ, "mode", "shared") or "shared")
        prefix = parsers["key_prefix"]("input key-prefix", read(environ, "key-prefix") or DEFAULT_PREFIX)
        prefix = parsers["key_prefix"]("input key-prefix (with the job id)", lineage(environ, prefix))
        salt = key_salt(environ)
        min_hit_rate = read(environ, "min-hit-rate")
        if min_hit_rate:
            parsers["min_hit_rate"]("input min-hit-rate", min_hit_rate)
        strict = bool(from_environment("strict", None, "", environ))  # the job's, as its pytest step reads it
        for name in JOB_OPTIONS:  # the job's, which the Action's own steps read too: a bad one fails here
            from_environment(name, None, "", environ)
        read_signing_key(with_signing_key(environ))
        suffix = parsers["run_suffix"](
            "GITHUB_RUN_ID/GITHUB_RUN_ATTEMPT",
            f"{required(environ, 'GITHUB_RUN_ID')}-{environ.get('GITHUB_RUN_ATTEMPT') or '1'}",
        )
    except ConfigError as exc:
        raise InputError(str(exc)) from None
    save, why = decide_save(
        read(environ, "save", "auto"),
        environ.get("GITHUB_EVENT_NAME", ""),
        environ.get("GITHUB_REF", ""),
        default_branch(environ),
    )
    read(environ, "cache-dir")
    return Inputs(
        store=GITHUB_STORE if store.lower() == GITHUB_STORE else store,
        mode=mode,
        prefix=prefix,
        salt=salt,
        min_hit_rate=min_hit_rate,
        strict=strict,
        suffix=suffix,
        save=save,
        why=why,
        summary=_flag(environ, "summary", "true"),
        save_on_failure=_flag(environ, "save-on-failure", "false"),
        pgo=_flag(environ, "pgo", "false"),
    )


def _refuse_staging(cache_dir: str, workspace: Path) -> None:
    """Refuse a cache dir that is one of the Action's staging dirs, lies in one or holds one: the plan empties
    them, and the plugin would refuse a store dir that is its cache dir only in the pytest step."""
    cache = os.path.realpath(cache_dir)
    for staging in (STAGING, HEADER_STAGING):
        own = os.path.realpath(workspace / staging)
        if cache == own or cache.startswith(own + os.sep) or own.startswith(cache + os.sep):
            where = "is" if cache == own else ("lies in" if len(cache) > len(own) else "holds")
            raise InputError(
                f"input cache-dir: {cache_dir} {where} the Action's staging dir {own}: give the cache dir a "
                "directory of its own"
            )


def make_plan(environ: Mapping[str, str], fingerprint: Any) -> Plan:
    """Check the inputs (:func:`check`, then the store as the plugin opens it) and decide everything; pure apart
    from reading ``environ`` (raises InputError).

    ``fingerprint`` is a :class:`pytest_compilecache.fingerprint.Fingerprint` (``digest()``, ``to_json()``).
    """
    from pytest_compilecache.action_api import ConfigError
    from pytest_compilecache.action_api import make_key
    from pytest_compilecache.action_api import open_store
    from pytest_compilecache.action_api import refuse_cache_dir
    from pytest_compilecache.action_api import restore_prefix

    temp = Path(required(environ, "RUNNER_TEMP"))
    workspace = Path(required(environ, "GITHUB_WORKSPACE"))
    given = check(environ)
    store = given.store
    if store != GITHUB_STORE:
        try:
            open_store(store)  # checks it as the plugin would (s3:/b is no directory); touches neither disk nor network
        except ConfigError as exc:
            raise InputError(str(exc).replace("--compile-cache-store", "input store")) from None
        if "://" not in store:  # a directory: the same one for this step and the pytest step (~: the home dir)
            store = os.path.abspath(workspace / os.path.expanduser(store))
    save, why = given.save, given.why
    cache_dir = read(environ, "cache-dir")
    cache_dir = str(workspace / cache_dir) if cache_dir else str(temp / CACHE_DIR)
    _refuse_staging(cache_dir, workspace)
    transfer = "none" if given.mode != "shared" else ("github" if store == GITHUB_STORE else "direct")
    if store != GITHUB_STORE:
        try:
            if transfer == "direct":
                refuse_cache_dir(store, cache_dir)
            for staging in (STAGING, HEADER_STAGING):  # emptied by the plan: never a store's dir
                refuse_cache_dir(store, workspace / staging, "the Action's staging dir")
        except ConfigError as exc:
            raise InputError(str(exc).replace("--compile-cache-store", "input store")) from None
    if transfer == "none":
        save, why = False, f"mode {given.mode} keeps no cache dir between runs"
    digest = fingerprint.digest()
    return Plan(
        transfer=transfer,
        store=store,
        save=save,
        why=why,
        mode=given.mode,
        prefix=given.prefix,
        salt=given.salt,
        suffix=given.suffix,
        digest=digest,
        key=make_key(given.prefix, digest, given.suffix),
        restore_prefix=restore_prefix(given.prefix, digest),
        staging=str(workspace / STAGING),
        inbox=str(temp / INBOX),
        cache_dir=os.path.abspath(cache_dir),
        json=str(temp / REPORT),
        summary=given.summary,
        save_on_failure=given.save_on_failure,
        pgo=given.pgo,
        min_hit_rate=given.min_hit_rate,
        strict=given.strict,
        fingerprint=fingerprint.to_json(),
        event=environ.get("GITHUB_EVENT_NAME", ""),
        header_staging=str(workspace / HEADER_STAGING),
        header_spare=str(temp / HEADER_SPARE),
    )


def key_salt(environ: Mapping[str, str]) -> str:
    """Input ``key-salt``, else the job's ``PYTEST_COMPILECACHE_KEY_SALT``: the plugin must see the same."""
    # Stripped as the plugin's settings strip it: " v2" and "v2" must give one fingerprint, or the Action's keys
    # never meet the bundles the plugin saves.
    salt = read(environ, "key-salt") or environ.get(ENV_PREFIX + "KEY_SALT", "").strip()
    return _utf8("key-salt (or PYTEST_COMPILECACHE_KEY_SALT)", salt)


def required(environ: Mapping[str, str], name: str) -> str:
    value = environ.get(name, "")
    if not value:
        raise InputError(f"{name} is not set: run this file from the Action on a GitHub Actions runner")
    return value


def plugin_env(plan: Plan) -> dict[str, str]:
    """The ``PYTEST_COMPILECACHE_*`` variables that configure the plugin in the job's later steps.

    ini and command-line options still win over these (CLI > ini > environment): a project that also
    sets ``compile_cache_store`` in its ini keeps its own store.
    """
    env = {
        "MODE": plan.mode,
        "SUMMARY": "auto" if plan.summary else "off",
        "JSON": plan.json,
    }
    if plan.min_hit_rate and plan.transfer != "none":  # isolated and disabled restore nothing: never gated
        env["MIN_HIT_RATE"] = plan.min_hit_rate
    if plan.pgo:  # false exports nothing: a job's own PYTEST_COMPILECACHE_PGO (or the ini) still decides
        env["PGO"] = "on"
    if plan.transfer != "none":
        env.update(DIR=plan.cache_dir, RESTORE="skip", KEY_PREFIX=plan.prefix, RUN_SUFFIX=plan.suffix)
        if plan.salt:
            env["KEY_SALT"] = plan.salt
    if plan.save and plan.transfer == "github":
        # The plugin writes its one new bundle where actions/cache's post step will find it.
        env.update(STORE=plan.staging, KEEP_BUNDLES="1")
    elif plan.save and plan.transfer == "direct":
        env["STORE"] = plan.store
    elif plan.transfer != "none":
        env["READONLY"] = "true"
    return {ENV_PREFIX + name: value for name, value in env.items()}


def step_outputs(plan: Plan) -> dict[str, str]:
    """The plan's outputs of the Action (action.yml's ``outputs``; the restore adds its own)."""
    return {"key": plan.key, "cache-dir": plan.cache_dir, "report": plan.json}


def post_env(plan: Plan) -> dict[str, str]:
    """What action.yml's ``post-if`` reads: :data:`SAVE_ON_FAILURE_ENV` is ``true`` when the post step must run
    after a failed job too (a saving ``store: github`` run with input save-on-failure); else nothing."""
    return {SAVE_ON_FAILURE_ENV: "true"} if plan.save and plan.save_on_failure and plan.transfer == "github" else {}


def js_plan(plan: Plan) -> dict[str, str]:
    """What action/js needs of the plan to restore the bundle entry (the ``plan`` command's reply)."""
    return {"transfer": plan.transfer, "key": plan.key, "restore_prefix": plan.restore_prefix, "path": SAVE_PATH}


def _has_pip(python: str) -> bool:
    return (
        subprocess.call([python, "-m", "pip", "--version"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) == 0
    )


def install_command(
    environ: Mapping[str, str],
    python: str = sys.executable,
    *,
    has_pip: Callable[[str], bool] = _has_pip,
    which: Callable[[str], str | None] = shutil.which,
) -> list[str] | None:
    """``pip install <action path>[<extra>]``, the extra the store's backend needs (``s3``, ``gcs``, ``azure``;
    ``uv pip install --python`` where the venv has no pip, as uv makes them), or None with ``install: false``.
    Raises InputError when neither can install."""
    if not _flag(environ, "install", "true"):
        return None
    target = required(environ, "GITHUB_ACTION_PATH")
    # The checkout's own store table (stdlib only): which extra the store's backend needs, if any.
    from pytest_compilecache.stores.table import extra_for

    extra = extra_for(read(environ, "store"))
    if extra:
        target += f"[{extra}]"
    if has_pip(python):
        return [python, "-m", "pip", "install", "--disable-pip-version-check", "--progress-bar", "off", target]
    uv = which("uv")
    if uv:
        return [uv, "pip", "install", "--python", python, target]
    raise InputError(
        f"input install: {python} has no pip (a venv made by uv?) and uv is not on PATH: add pip "
        "or uv, or install pytest-compilecache yourself and set install: false"
    )


def action_version(action_path: str) -> str | None:
    """The plugin version this Action ships (its ``pytest_compilecache/_version.py``, the one place the
    version is written), or None."""
    return package_version(Path(action_path) / "pytest_compilecache")


def package_version(package: Path) -> str | None:
    """The version of the pytest_compilecache package in the dir ``package``, read from its files without
    importing it (``_version.py``; ``__init__.py`` in 0.1.0), or None."""
    import re

    for name in ("_version.py", "__init__.py"):
        try:
            text = (package / name).read_text(encoding="utf-8")
        except OSError:
            continue
        match = re.search(r"^__version__\s*=\s*[\"']([^\"']+)[\"']", text, re.MULTILINE)
        if match:
            return match.group(1)
    return None
