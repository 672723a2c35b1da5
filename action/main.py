"""The pytest-compilecache Action's Python side: ``python action/main.py install|plan|restore|headers``.

``action.yml`` keeps each ``run:`` to one call of this file; everything those steps decide lives here.
Inputs arrive as ``INPUT_<NAME>`` variables (``key-prefix`` -> ``INPUT_KEY_PREFIX``): a composite action
does not set them itself, so action.yml maps every input a step needs with ``env:``. The runner's own
``GITHUB_*`` and ``RUNNER_*`` variables say where to write and which run this is.

* ``install``: ``pip install`` the plugin from the Action's own checkout (input ``install``), with the
  ``s3`` extra for an S3 store; ``uv pip install --python`` where the interpreter has no pip (uv's venvs).
  With ``install: false``, warn when the installed plugin is not the Action's version. Standard library
  only: the plugin may not be importable yet.
* ``plan``: check the inputs, decide whether this run saves, compute the fingerprint and the keys; write
  the plan file (read by ``restore``), the step outputs (read by the ``actions/cache`` steps) and the
  ``PYTEST_COMPILECACHE_*`` variables that configure the plugin in the job's later steps.
* ``restore``: unpack the bundle that ``actions/cache`` put in the staging dir (``store: github``) or fetch
  it from the store itself (``s3://``, a directory) into the cache dir; leave the staging dir absent, so
  that it holds only the plugin's new bundle when ``actions/cache``'s post step saves it; tell a miss from
  trouble by what the ``actions/cache`` steps reported (:class:`CacheSteps`); outputs, the restore section
  of the step summary, and the outcome for the plugin (``PYTEST_COMPILECACHE_RESTORED``, see
  :func:`restored_env`). It imports no torch: the bundle's mega-cache blobs are installed into the cache
  dir's pending dir, verified with the rest, and the plugin loads them into torch in the pytest process
  (which imports torch anyway), so a job pays for one torch import, not two. With ``store: github``, also
  the key of the header entry (``header-key``, see :func:`header_entry`) for the precompiled header the
  restored bundle names.
* ``headers``: after that entry's ``actions/cache`` step, verify and install the header from it, or from the
  bundle entry's copy, staged then for ``actions/cache`` to save under the exact key (:func:`carry_header`);
  tell the plugin that the header entry carries it (``header_key`` in ``PYTEST_COMPILECACHE_RESTORED``).

Why the bundle cannot be packed here: torch's mega-cache artifacts exist only inside the pytest
processes, so the plugin writes the new bundle at the end of the pytest step; see action/README.md.

Exit codes: 0 done, including a restore that failed (one ``::warning::``, the tests compile cold);
2 an input is invalid (one ``::error::`` naming the input: configuration errors fail fast).

Everything this file writes for the runner (workflow commands, ``GITHUB_OUTPUT``, ``GITHUB_ENV``, the
step summary) goes through :mod:`pytest_compilecache.ghrunner`, escaped, as the plugin's and the CLI's
output does. ``action`` is a typed package: tests import ``action.main`` like any module.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING
from typing import Any
from typing import Callable
from typing import Mapping
from typing import Sequence

if TYPE_CHECKING:
    from pytest_compilecache.headers import HeaderArtifact
    from pytest_compilecache.sync import RestoreResult


def _load_ghrunner() -> ModuleType:
    """The runner I/O module: the installed plugin's, or, for the ``install`` step that runs before the
    plugin is installed, the Action's own copy (``ghrunner.py`` needs only the standard library)."""
    try:
        from pytest_compilecache import ghrunner
    except ImportError:
        import importlib.util

        path = Path(__file__).resolve().parents[1] / "pytest_compilecache" / "ghrunner.py"
        spec = importlib.util.spec_from_file_location("_compilecache_ghrunner", path)
        assert spec is not None and spec.loader is not None
        ghrunner = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(ghrunner)
    return ghrunner


ghrunner = _load_ghrunner()

GITHUB_STORE = "github"
ENV_PREFIX = "PYTEST_COMPILECACHE_"
SIGNING_KEY_ENV = ENV_PREFIX + "SIGNING_KEY"
RESTORED_ENV = ENV_PREFIX + "RESTORED"
# Events whose runs save with ``save: auto``, and then only on the default branch: an entry saved on
# another branch serves only that branch (and its pull requests) and evicts the default branch's
# entries from the repository's quota (setup-gradle's default).
SAVING_EVENTS = ("push", "schedule", "workflow_dispatch")
# Never save, whatever ``save`` says. pull_request_target runs with a write token in the base
# repository's cache scope, often on a fork's code, so a save would let a fork poison the cache every
# later run restores. merge_group runs on a temporary gh-readonly-queue/... branch whose entries no
# later run can read: a save would only use quota and evict the default branch's entries.
NEVER_SAVING_EVENTS = ("pull_request_target", "merge_group")
_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")
# The names under RUNNER_TEMP (the runner empties it for every job).
INBOX, CACHE_DIR, REPORT, PLAN = (
    "compilecache-inbox",
    "compilecache-dir",
    "compilecache-report.json",
    "compilecache-plan.json",
)
# The staging dir actions/cache restores into and saves from, relative to GITHUB_WORKSPACE (where
# actions/cache resolves relative paths). action.yml spells ``<STAGING>/*.bundle`` literally in both
# actions/cache steps: the path string is hashed into the entry version, so it must be the same on
# every runner (an absolute RUNNER_TEMP is not: self-hosted runners differ, act randomises it), and a
# literal survives the post step's re-evaluation of ``with:``, which loses the ``steps`` context when
# this Action is wrapped in another composite action (actions/runner#2009, #2030).
STAGING = ".compilecache-staging"
SAVE_PATH = STAGING + "/*.bundle"
# The header entry (store: github): each precompiled header travels as its own actions/cache entry keyed
# by its content, ``<lineage>-artifact-<sha256>`` (:func:`pytest_compilecache.headers.object_key`), saved
# once, restored by the runs whose bundle names it. Its staging dir is literal for the same reasons as
# STAGING's and holds at most that one object, ``<key>.bundle`` (a directory store's file name, so that the
# header code reads it as a store). HEADER_SPARE (under RUNNER_TEMP) keeps the bundle entry's own copy of the
# object, where an older run or a changed header put one: the fallback when the header entry is missing.
HEADER_STAGING = ".compilecache-headers"
HEADER_PATH = HEADER_STAGING + "/*.bundle"
HEADER_SPARE, HEADER_STATE = "compilecache-header-spare", "compilecache-header.json"


class InputError(ValueError):
    """An input of the Action is invalid; the message names it as the workflow spells it."""


def _input(environ: Mapping[str, str], name: str, default: str = "") -> str:
    value = environ.get("INPUT_" + name.upper().replace("-", "_"))
    return default if value is None else _utf8(f"input {name}", value.strip())


def _utf8(what: str, value: str) -> str:
    """``value``, or InputError when it holds bytes that are not UTF-8 (Python keeps them as lone surrogates:
    they could be neither printed nor written to GITHUB_ENV)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(f"{what}: not valid UTF-8") from None
    return value


def _flag(environ: Mapping[str, str], name: str, default: str) -> bool:
    value = _input(environ, name, default).lower() or default
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
    job's ``matrix`` context (action.yml passes ``toJSON(matrix)`` as ``COMPILECACHE_MATRIX``).
    """
    import hashlib
    import re

    job = re.sub(r"[^A-Za-z0-9._-]", "_", environ.get("GITHUB_JOB", ""))[:60]
    parts = [prefix, job] if job else [prefix]
    matrix = (environ.get("COMPILECACHE_MATRIX") or "").strip()
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

    ``transfer``: ``github`` (``actions/cache`` moves the bundle through ``staging``), ``direct`` (the
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
    event: str = ""
    fingerprint: dict[str, str] = field(default_factory=dict)
    header_staging: str = ""  # the header entry's staging dir (workspace/HEADER_STAGING)
    header_spare: str = ""  # the bundle entry's copy of the header object (RUNNER_TEMP/HEADER_SPARE)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Plan:
        return cls(**data)


def make_plan(environ: Mapping[str, str], fingerprint: Any) -> Plan:
    """Check the inputs and decide everything; pure apart from reading ``environ`` (raises InputError).

    ``fingerprint`` is a :class:`pytest_compilecache.fingerprint.Fingerprint` (``digest()``, ``to_json()``).
    """
    from pytest_compilecache import ConfigError
    from pytest_compilecache.fingerprint import make_key
    from pytest_compilecache.fingerprint import restore_prefix
    from pytest_compilecache.settings import DEFAULT_PREFIX
    from pytest_compilecache.settings import OPTIONS
    from pytest_compilecache.stores import open_store

    parsers = {option.name: option.parse for option in OPTIONS}
    temp = Path(_required(environ, "RUNNER_TEMP"))
    workspace = Path(_required(environ, "GITHUB_WORKSPACE"))
    try:
        store = _input(environ, "store", GITHUB_STORE) or GITHUB_STORE
        if store.lower() == GITHUB_STORE:
            store = GITHUB_STORE
        else:
            if "://" not in store:  # a directory: the same one for this step and the pytest step
                store = os.path.abspath(workspace / store)
            open_store(store)  # checks the URL; touches neither disk nor network
        mode = parsers["mode"]("input mode", _input(environ, "mode", "shared") or "shared")
        prefix = parsers["key_prefix"]("input key-prefix", _input(environ, "key-prefix") or DEFAULT_PREFIX)
        prefix = parsers["key_prefix"]("input key-prefix (with the job id)", lineage(environ, prefix))
        salt = key_salt(environ)
        min_hit_rate = _input(environ, "min-hit-rate")
        if min_hit_rate:
            parsers["min_hit_rate"]("input min-hit-rate", min_hit_rate)
        suffix = parsers["run_suffix"](
            "GITHUB_RUN_ID/GITHUB_RUN_ATTEMPT",
            f"{_required(environ, 'GITHUB_RUN_ID')}-{environ.get('GITHUB_RUN_ATTEMPT') or '1'}",
        )
    except ConfigError as exc:
        raise InputError(str(exc).replace("--compile-cache-store", "input store")) from None
    save, why = decide_save(
        _input(environ, "save", "auto"),
        environ.get("GITHUB_EVENT_NAME", ""),
        environ.get("GITHUB_REF", ""),
        default_branch(environ),
    )
    summary = _flag(environ, "summary", "true")
    cache_dir = _input(environ, "cache-dir")
    cache_dir = str(workspace / cache_dir) if cache_dir else str(temp / CACHE_DIR)
    transfer = "none" if mode != "shared" else ("github" if store == GITHUB_STORE else "direct")
    if transfer == "none":
        save, why = False, f"mode {mode} keeps no cache dir between runs"
    digest = fingerprint.digest()
    return Plan(
        transfer=transfer,
        store=store,
        save=save,
        why=why,
        mode=mode,
        prefix=prefix,
        salt=salt,
        suffix=suffix,
        digest=digest,
        key=make_key(prefix, digest, suffix),
        restore_prefix=restore_prefix(prefix, digest),
        staging=str(workspace / STAGING),
        inbox=str(temp / INBOX),
        cache_dir=os.path.abspath(cache_dir),
        json=str(temp / REPORT),
        summary=summary,
        min_hit_rate=min_hit_rate,
        fingerprint=fingerprint.to_json(),
        event=environ.get("GITHUB_EVENT_NAME", ""),
        header_staging=str(workspace / HEADER_STAGING),
        header_spare=str(temp / HEADER_SPARE),
    )


def key_salt(environ: Mapping[str, str]) -> str:
    """Input ``key-salt``, else the job's ``PYTEST_COMPILECACHE_KEY_SALT``: the plugin must see the same."""
    # Stripped as the plugin's settings strip it: " v2" and "v2" must give one fingerprint, or the Action's keys
    # never meet the bundles the plugin saves.
    salt = _input(environ, "key-salt") or environ.get(ENV_PREFIX + "KEY_SALT", "").strip()
    return _utf8("key-salt (or PYTEST_COMPILECACHE_KEY_SALT)", salt)


def _required(environ: Mapping[str, str], name: str) -> str:
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
    if plan.min_hit_rate:
        env["MIN_HIT_RATE"] = plan.min_hit_rate
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
    return {
        "key": plan.key,
        "restore-prefix": plan.restore_prefix,
        "digest": plan.digest,
        "transfer": plan.transfer,
        "save": str(plan.save).lower(),
        "staging": plan.staging,
        "cache-dir": plan.cache_dir,
        "json": plan.json,
    }


# ---- restore


def stage_bundles(staging: Path, inbox: Path) -> list[str]:
    """Move what ``actions/cache`` restored from ``staging`` into ``inbox``; remove ``staging``.

    At job end ``actions/cache`` saves ``staging/*.bundle``: only the plugin's new bundle may match then,
    or the restored one would be saved again inside the new entry.
    """
    inbox.mkdir(parents=True, exist_ok=True)
    moved = []
    if staging.is_dir():
        for path in sorted(staging.iterdir()):
            if path.is_file() and path.name.endswith(".bundle") and not path.name.startswith("."):
                os.replace(path, inbox / path.name)
                moved.append(path.name[: -len(".bundle")])
    shutil.rmtree(staging, ignore_errors=True)
    return moved


@dataclass(frozen=True)
class CacheSteps:
    """What action.yml's ``actions/cache`` steps reported, passed to ``restore`` as ``COMPILECACHE_*``.

    ``outcome``: the restoring step's outcome (``success``, ``failure``: ``continue-on-error`` keeps the
    job going); ``hit``: its ``cache-hit`` output, which actions/cache leaves unset on a miss and sets to
    ``false`` when the cache service is not available; ``lookup_outcome``/``lookup_key``: the lookup-only
    step before it (``cache-matched-key``: an entry exists). Empty strings: not known.
    """

    outcome: str = ""
    hit: str = ""
    lookup_outcome: str = ""
    lookup_key: str = ""

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> CacheSteps:
        return cls(
            *(
                environ.get("COMPILECACHE_" + name, "").strip()
                for name in ("CACHE_OUTCOME", "CACHE_HIT", "LOOKUP_OUTCOME", "LOOKUP_KEY")
            )
        )

    def trouble(self, staged: bool) -> str | None:
        """Why the restore failed, in words, or None (a restore, or a real miss).

        actions/cache turns its client's errors into log lines, never a failed step: a download that
        fails after the lookup found an entry leaves exactly what a miss leaves. The lookup step tells
        the two apart; a service that fails the lookup too still reads as a miss (its log says why).
        """
        if "failure" in (self.outcome, self.lookup_outcome):
            return "the actions/cache step failed (see its log)"
        if staged:
            return None
        if self.lookup_key:
            return (
                f"actions/cache found {self.lookup_key} but restored nothing (a failed download or "
                "extraction: see its log)"
            )
        if self.hit:
            return f"the cache service is not available (actions/cache: cache-hit={self.hit}, nothing restored)"
        return None


def restore(plan: Plan, environ: Mapping[str, str]) -> RestoreResult:
    """Restore into ``plan.cache_dir``; never raises.

    Outcomes: ``exact``, ``partial``, ``miss`` (no entry) or ``error`` (trouble: the tests compile cold).
    """
    from pytest_compilecache import sync

    if plan.transfer == "none":
        return sync.RestoreResult("miss", message=plan.why)
    try:
        from pytest_compilecache.fingerprint import Fingerprint
        from pytest_compilecache.probe import point_cache_dir
        from pytest_compilecache.stores import open_store

        point_cache_dir(plan.cache_dir)  # before anything imports torch
        if plan.transfer == "github":
            staged = stage_bundles(Path(plan.staging), Path(plan.inbox))
            trouble = CacheSteps.from_env(environ).trouble(bool(staged))
            if trouble:
                return sync.RestoreResult("error", message=trouble)
            if not staged:
                message = f"actions/cache found no entry under {plan.restore_prefix}"
                return sync.RestoreResult("miss", message=message)
            store = open_store(plan.inbox, readonly=True)
        else:
            from pytest_compilecache.settings import from_environment
            from pytest_compilecache.stores.timed import TimedStore

            endpoint = environ.get(ENV_PREFIX + "S3_ENDPOINT")
            options = {"endpoint_url": endpoint} if endpoint and plan.store.startswith("s3://") else {}
            seconds = from_environment("store_timeout", None, "", environ)  # the plugin's budget, as it reads it
            store = TimedStore(
                open_store(plan.store, readonly=True, **options), seconds, option=ENV_PREFIX + "STORE_TIMEOUT"
            )
        signing_key = environ.get(SIGNING_KEY_ENV, "")
        result = sync.restore(
            store,
            prefix=plan.prefix,
            fingerprint=Fingerprint.from_json(plan.fingerprint),
            cache_dir=plan.cache_dir,
            signing_key=signing_key.encode() if signing_key else None,
            exact_key=plan.key,
            # store: github: the header entry brings the chosen header after this step (see header_entry)
            headers=plan.transfer != "github",
            # torch's artifacts wait in the cache dir for the pytest process to load (sync.load_staged):
            # this step imports no torch, the job pays for one torch import instead of two
            stage_blobs=True,
        )
        return split_headers(plan, store, result) if plan.transfer == "github" else result
    except Exception as exc:  # cache trouble never fails the job: anything here becomes one warning
        return sync.RestoreResult("error", message=f"restore failed: {type(exc).__name__}: {exc}")
    finally:
        shutil.rmtree(plan.inbox, ignore_errors=True)


def header_entry(plan: Plan, result: RestoreResult) -> tuple[str, HeaderArtifact] | None:
    """The header that travels as its own ``actions/cache`` entry, and that entry's key; None when none does.

    ``store: github`` only, after a restore: the first (by name, then sha256) of the precompiled headers the
    verified manifest names; a CPU suite names one. Any others ride in the bundle entry, as before issue 10.
    The key is exact and content-addressed (``<lineage>-artifact-<sha256>``): actions/cache saves it once
    and skips the upload when it exists.
    """
    from pytest_compilecache import headers

    if plan.transfer != "github" or result.outcome not in ("exact", "partial"):
        return None
    valid = []
    for artifact in result.named_artifacts:
        if artifact.kind == headers.KIND:
            try:
                valid.append(headers.HeaderArtifact.from_json(_artifact_json(artifact)))
            except headers.HeaderError:
                continue  # restore_headers reports it
    if not valid:
        return None
    chosen = min(valid, key=lambda artifact: (artifact.name, artifact.sha256))
    return headers.object_key(plan.prefix, chosen.sha256), chosen


def _artifact_json(artifact: Any) -> dict[str, Any]:
    return {"kind": artifact.kind, "name": artifact.name, "sha256": artifact.sha256, "size": artifact.size}


def split_headers(plan: Plan, store: Any, result: RestoreResult) -> RestoreResult:
    """``store: github``, after the bundle restored with ``headers=False``: install from the bundle entry
    (``store``, the inbox) every header it names except :func:`header_entry`'s, and keep the bundle entry's
    copy of that one, if it carries one, in ``plan.header_spare`` for ``headers`` (:func:`carry_header`)."""
    import time
    from dataclasses import replace

    from pytest_compilecache import headers
    from pytest_compilecache.sync import HeaderReport

    entry = header_entry(plan, result)
    named = [_artifact_json(artifact) for artifact in result.named_artifacts]
    if not named:
        return result
    started = time.perf_counter()
    scratch = Path(plan.inbox) / ".headers"
    scratch.mkdir(parents=True, exist_ok=True)
    others = [item for item in named if entry is None or item.get("sha256") != entry[1].sha256]
    try:
        transfer = headers.restore_headers(store, plan.prefix, others, scratch)
        if entry is not None:
            spare = Path(plan.header_spare)
            spare.mkdir(parents=True, exist_ok=True)
            # False: this bundle entry carries none. Bounded by what the verified manifest says it packs to.
            store.get(entry[0], spare / f"{entry[0]}.bundle", limit=headers.packed_bound(entry[1].size))
    except Exception as exc:  # the bundle is installed; torch builds what is not carried
        transfer = headers.HeaderTransfer(errors=[f"precompiled headers not restored: {type(exc).__name__}: {exc}"])
    return replace(result, headers=HeaderReport.of(transfer, time.perf_counter() - started))


@dataclass(frozen=True)
class HeaderCarry:
    """What ``headers`` did with the header entry (see :func:`carry_header`).

    ``source``: ``entry`` (the header entry held it), ``bundle`` (the bundle entry's copy, now staged to be
    saved under the key) or ``none`` (neither: torch builds it). ``present``: the header is in torch's dir
    now (installed, or already there); ``carried``: the header entry holds it, or will once actions/cache
    saves it at job end, so the plugin need not write it into its bundle.
    """

    source: str
    present: bool
    carried: bool
    installed: bool = False
    seconds: float = 0.0
    warnings: tuple[str, ...] = ()


def carry_header(
    plan: Plan, key: str, artifact: HeaderArtifact, hit: bool, directory: Path | None = None
) -> HeaderCarry:
    """Verify and install the header the bundle's manifest names, from its own entry or the bundle's copy.

    ``hit``: actions/cache restored the header entry (its exact key) into ``plan.header_staging``. Every
    byte is checked against the verified manifest's sha256 (:func:`pytest_compilecache.headers.install`, or
    :func:`~pytest_compilecache.headers.verify` where the header is already in torch's dir). The entry's copy
    comes first; when it is missing (evicted, never saved) or bad, the bundle entry's copy: on a saving run
    whose header entry missed, that one is moved into the staging dir, so that actions/cache's post step
    saves it under the exact key; otherwise (nothing will save it) the used object is removed. Neither: one
    warning; torch builds the header, and this run's plugin writes it into its bundle (not ``carried``), from
    which the next saving run saves the header entry. Never raises.
    """
    import time

    from pytest_compilecache import headers

    started = time.perf_counter()
    staged = Path(plan.header_staging) / f"{key}.bundle"
    spare = Path(plan.header_spare) / f"{key}.bundle"
    target = directory or headers.header_dir()
    warnings: list[str] = []
    for source, path in (("entry", staged), ("bundle", spare)):
        if not path.is_file():
            continue
        try:
            with open(path, "rb") as fh:
                installed = headers.install(artifact, fh, target)
                if not installed:  # already in torch's dir (or torch is building it): check the bytes anyway
                    fh.seek(0)
                    headers.verify(artifact, fh)
            if plan.save and not hit:  # actions/cache's post step saves the staged object under the exact key
                if source == "bundle":
                    staged.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(spare, staged)
            else:  # nothing will save it: do not leave ~21 MiB in the workspace
                for leftover in (staged, spare):
                    with contextlib.suppress(OSError):
                        leftover.unlink()
        except (OSError, headers.HeaderError) as exc:
            where = f"actions/cache entry {key}" if source == "entry" else "the bundle entry's copy"
            warnings.append(f"precompiled header {artifact.name}: {where} not used: {exc}")
            if source == "entry" and not hit:
                with contextlib.suppress(OSError):
                    staged.unlink()  # never let actions/cache save bytes that are not the key's
            continue
        return HeaderCarry(
            source,
            present=True,
            carried=source == "entry" or (plan.save and not hit),
            installed=installed,
            seconds=time.perf_counter() - started,
            warnings=tuple(warnings),
        )
    if not warnings:
        warnings.append(
            f"precompiled header {artifact.name}: no actions/cache entry {key} (evicted, or never saved) and the "
            "bundle entry does not carry it; torch builds it, and this run's bundle carries it to the next"
        )
    return HeaderCarry(
        "none", present=False, carried=False, seconds=time.perf_counter() - started, warnings=tuple(warnings)
    )


def restore_outputs(result: RestoreResult) -> dict[str, str]:
    """The step outputs, as the CLI's ``restore --github-output`` writes them (one mapping for both)."""
    from pytest_compilecache.sync import restore_outputs as outputs

    return outputs(result)


def restore_markdown(plan: Plan, result: RestoreResult) -> str:
    """The step summary's short restore section; the plugin appends its own report after the tests.

    Every value that did not come from this file (keys, messages, the store URL) is escaped.
    """
    from pytest_compilecache.report import human_size

    md_code, md_text = ghrunner.md_code, ghrunner.md_text
    outcome = result.outcome
    where = {
        "github": "GitHub Actions cache (`actions/cache`)",
        "direct": md_code(plan.store),
        "none": f"none (mode {plan.mode})",
    }[plan.transfer]
    if outcome in ("exact", "partial"):
        restored = (
            f"{outcome}: {md_code(result.key or '')}, {human_size(result.size)} in "
            f"{result.seconds:.1f} s, {result.files} files"
        )
    else:
        restored = f"{outcome}" + (f": {md_text(result.message)}" if result.message else "")
    if result.skipped:
        restored += f"; refused {len(result.skipped)} bad bundle(s): " + md_text(
            "; ".join(f"{key}: {why}" for key, why in result.skipped)
        )
    if plan.save and plan.transfer == "github":
        saving = (
            f"{md_code(plan.key)} if the tests compile something new: "
            "actions/cache uploads it at job end if the job succeeds"
        )
        if plan.why == "save: true" and plan.event not in SAVING_EVENTS:
            # GitHub gives untrusted triggers (pull requests from forks...) a read-only cache token.
            saving += f"; {md_text(plan.event)} runs may get a read-only cache token, and then nothing is saved"
    elif plan.save:
        saving = f"{md_code(plan.key)} if the tests compile something new, written by the tests into the store"
    else:
        saving = f"nothing: {md_text(plan.why)}"
    lines = [
        "### torch.compile cache: restore",
        "",
        "| | |",
        "|---|---|",
        f"| store | {where} |",
        f"| restored | {restored} |",
        f"| saving | {saving} |",
        f"| fingerprint | {md_code(plan.digest)} (restore prefix {md_code(plan.restore_prefix)}) |",
        f"| lineage | {md_code(plan.prefix)} (key prefix, job id, matrix leg) |",
        "",
    ]
    return "\n".join(lines) + "\n"


def restored_env(plan: Plan, result: RestoreResult) -> dict[str, str]:
    """What the restore tells the plugin in the job's later steps (it runs with ``RESTORE=skip``).

    ``PYTEST_COMPILECACHE_RESTORED``: compact JSON ``{"outcome": "exact"|"partial"|"miss"|"error", "key":
    <restored key or null>, "message": <why, or null>, "headers": [<header names>], "staged": [[<blob name>,
    <size>, <sha256>], ...]}``, the plugin's contract for knowing how the Action's restore went (its hit-rate
    guard must not fail a session after a failed restore) and which verified mega-cache blobs wait in the
    cache dir for it to load (``sync.load_staged``). After a
    failed restore the Action also clears ``PYTEST_COMPILECACHE_MIN_HIT_RATE`` (an empty value is unset for
    the plugin), so input ``min-hit-rate`` cannot fail the job whatever the plugin's version.
    """
    if plan.transfer == "none":
        return {}
    outcome = result.outcome
    told: dict[str, Any] = {
        "outcome": outcome,
        "key": result.key,
        "message": result.warning or result.message or None,
        "headers": list(result.headers.named),
    }
    if result.staged:
        told["staged"] = [list(blob) for blob in result.staged]
    env = {RESTORED_ENV: json.dumps(told, separators=(",", ":"))}
    if outcome == "error" and plan.min_hit_rate:
        env[ENV_PREFIX + "MIN_HIT_RATE"] = ""
    return env


# ---- runner files: everything goes through ghrunner (escaped)


def write_vars(path: str | None, values: Mapping[str, str]) -> None:
    """Append to a GITHUB_ENV/GITHUB_OUTPUT file: :func:`pytest_compilecache.ghrunner.append_vars`."""
    ghrunner.append_vars(path, values)


def _command(name: str, message: str, title: str = "compile cache") -> None:
    """A workflow command (``::warning::``...), escaped by ghrunner."""
    ghrunner.write_command(sys.stdout, name, message, title=title)


# ---- commands


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
    """``pip install <action path>[s3]`` (``uv pip install --python`` where the venv has no pip, as uv
    makes them), or None with ``install: false``. Raises InputError when neither can install."""
    if not _flag(environ, "install", "true"):
        return None
    target = _required(environ, "GITHUB_ACTION_PATH")
    if _input(environ, "store").lower().startswith("s3://"):
        target += "[s3]"
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
    """The plugin version this Action ships (its ``pytest_compilecache/__init__.py``), or None."""
    import re

    try:
        text = (Path(action_path) / "pytest_compilecache" / "__init__.py").read_text(encoding="utf-8")
    except OSError:
        return None
    match = re.search(r"^__version__\s*=\s*[\"']([^\"']+)[\"']", text, re.MULTILINE)
    return match.group(1) if match else None


def check_installed(environ: Mapping[str, str]) -> None:
    """``install: false``: the plugin this interpreter imports must be the Action's version (a warning)."""
    try:
        import pytest_compilecache
    except ImportError as exc:
        raise InputError(
            f"input install is false but pytest-compilecache is not importable by {sys.executable} "
            f"({exc}): install it in the step before, or set install: true"
        ) from None
    installed = getattr(pytest_compilecache, "__version__", "?")
    wanted = action_version(environ.get("GITHUB_ACTION_PATH", ""))
    if wanted and installed != wanted:
        _command(
            "warning",
            f"install: false: the installed pytest-compilecache is {installed}, this Action is "
            f"{wanted}; the Action's steps and the plugin may disagree: install {wanted}, or pin the Action "
            f"to the release of {installed}",
        )
    else:
        print(f"install: false: using pytest-compilecache {installed} from {sys.executable}")


def cmd_install(environ: Mapping[str, str]) -> int:
    argv = install_command(environ)
    if argv is None:
        check_installed(environ)
        return 0
    print("+ " + " ".join(argv), flush=True)
    return subprocess.call(argv)


def cmd_plan(environ: Mapping[str, str]) -> int:
    try:
        from pytest_compilecache.fingerprint import collect
    except ImportError as exc:
        raise InputError(
            f"pytest-compilecache is not importable by {sys.executable} ({exc}); keep input "
            "install: true, or install it into the interpreter named by input python"
        ) from None
    temp = Path(_required(environ, "RUNNER_TEMP"))
    if (temp / PLAN).exists():
        raise InputError(
            "the Action already ran in this job: use it once per job (one pytest-compilecache configuration per job)"
        )
    fingerprint = collect(salt=key_salt(environ))
    plan = make_plan(environ, fingerprint)
    ghrunner.write_command(sys.stdout, "group", "compile cache fingerprint (what decides reuse)")
    width = max(len(name) for name in plan.fingerprint)
    for name, value in plan.fingerprint.items():
        # A line starting with "::" would be a command: facts are one escaped line, indented.
        print(f"{ghrunner.one_line(name):<{width}}  {ghrunner.one_line(value)}")
    print(f"{'digest':<{width}}  {plan.digest}")
    ghrunner.write_command(sys.stdout, "endgroup")
    # plan.why quotes GITHUB_REF and the event payload's default branch: one inert line
    why = ghrunner.one_line(plan.why)
    print(f"key {plan.key}; restore prefix {plan.restore_prefix}; saving: {str(plan.save).lower()} ({why})")
    shutil.rmtree(plan.staging, ignore_errors=True)  # only what actions/cache restores may be there
    shutil.rmtree(plan.header_staging, ignore_errors=True)
    if plan.transfer != "none":
        Path(plan.cache_dir).mkdir(parents=True, exist_ok=True)
    (temp / PLAN).write_text(json.dumps(plan.to_json(), indent=2) + "\n")
    signing_key = _input(environ, "signing-key")
    env = plugin_env(plan)
    if signing_key:
        for line in signing_key.splitlines():
            if line.strip():
                ghrunner.write_command(sys.stdout, "add-mask", line)
        env[SIGNING_KEY_ENV] = signing_key
    write_vars(environ.get("GITHUB_ENV"), env)
    write_vars(environ.get("GITHUB_OUTPUT"), {**step_outputs(plan), "plan": str(temp / PLAN)})
    return 0


def cmd_restore(environ: Mapping[str, str]) -> int:
    plan = Plan.from_json(json.loads(Path(_required(environ, "COMPILECACHE_PLAN")).read_text()))
    result = restore(plan, environ)
    outputs = restore_outputs(result)
    for name, value in outputs.items():
        print(f"{name}={ghrunner.one_line(value)}")
    if result.warning:
        _command("warning", f"{result.warning}; the tests compile cold" if not result.ok else result.warning)
    if result.outcome == "miss":
        print(f"miss: {ghrunner.one_line(result.message)}")
    for line in result.headers.warnings:
        _command("warning", line)
    if result.graphs:
        # The bundle's per-graph record (verified with it): the plugin, which runs with RESTORE=skip, reads
        # it from the cache dir to explain each miss against the bundle.
        from pytest_compilecache import explain

        try:
            explain.install_restored(Path(plan.cache_dir), result.graphs)
        except (OSError, ValueError) as exc:
            _command("warning", f"could not keep the bundle's graph record (misses stay unexplained): {exc}")
    env = restored_env(plan, result)
    entry = header_entry(plan, result)
    if entry is not None:
        # For the header entry's actions/cache step and for ``headers``, which completes what the plugin is told.
        state = {"key": entry[0], "artifact": entry[1].to_json(), "restored": env.get(RESTORED_ENV)}
        (Path(_required(environ, "RUNNER_TEMP")) / HEADER_STATE).write_text(json.dumps(state) + "\n")
        print(f"precompiled header {entry[1].name}: actions/cache entry {entry[0]}")
    write_vars(environ.get("GITHUB_OUTPUT"), {**outputs, "header-key": entry[0] if entry else ""})
    write_vars(environ.get("GITHUB_ENV"), env)
    if result.outcome == "error" and plan.min_hit_rate:
        print(f"min-hit-rate {plan.min_hit_rate} is not enforced in this job: the restore failed")
    if plan.summary:
        try:
            ghrunner.append_summary(environ.get("GITHUB_STEP_SUMMARY"), restore_markdown(plan, result))
        except OSError as exc:
            _command("warning", f"could not write the step summary: {exc}")
    return 0


def cmd_headers(environ: Mapping[str, str]) -> int:
    """After the header entry's actions/cache step: install the header (:func:`carry_header`) and tell the
    plugin which header the header entry carries (``header_key`` in ``PYTEST_COMPILECACHE_RESTORED``)."""
    plan = Plan.from_json(json.loads(Path(_required(environ, "COMPILECACHE_PLAN")).read_text()))
    path = Path(_required(environ, "RUNNER_TEMP")) / HEADER_STATE
    if not path.is_file():
        print("no precompiled header to restore")
        return 0
    try:
        _headers(plan, json.loads(path.read_text()), environ)
    except Exception as exc:  # cache trouble never fails the job: torch builds the header
        _command("warning", f"precompiled header not restored: {type(exc).__name__}: {exc}; torch builds it")
    return 0


def _headers(plan: Plan, state: Mapping[str, Any], environ: Mapping[str, str]) -> None:
    from pytest_compilecache.headers import HeaderArtifact
    from pytest_compilecache.report import human_size

    key, artifact = str(state["key"]), HeaderArtifact.from_json(state["artifact"])
    hit = environ.get("COMPILECACHE_HEADER_HIT", "").strip() == "true"
    carry = carry_header(plan, key, artifact, hit)
    for line in carry.warnings:
        _command("warning", line)
    if carry.present:
        how = "installed" if carry.installed else "already in torch's dir, checked"
        where = f"its actions/cache entry {key}" if carry.source == "entry" else "the bundle entry"
        staged = carry.source == "bundle" and carry.carried and plan.save  # the header entry missed
        saving = f"; saved as {key} at job end" if staged else ""
        line = f"precompiled header {artifact.name} ({human_size(artifact.size)}): {how}, from {where}{saving}"
        print(f"{ghrunner.one_line(line)} in {carry.seconds:.1f} s")
        if plan.summary:
            try:
                ghrunner.append_summary(environ.get("GITHUB_STEP_SUMMARY"), ghrunner.md_text(line) + "\n\n")
            except OSError as exc:
                _command("warning", f"could not write the step summary: {exc}")
    # What the restore step told the plugin, completed: the header is in torch's dir (so the plugin's save
    # names it), and the header entry carries it (so the plugin writes no copy into its bundle).
    restored = json.loads(str(state["restored"]))
    if carry.present:
        restored["headers"] = [*restored.get("headers", []), artifact.name]
    if carry.carried:
        restored["header_key"] = key
    write_vars(environ.get("GITHUB_ENV"), {RESTORED_ENV: json.dumps(restored, separators=(",", ":"))})
    write_vars(environ.get("GITHUB_OUTPUT"), {"header-source": carry.source})


COMMANDS: dict[str, Callable[[Mapping[str, str]], int]] = {
    "install": cmd_install,
    "plan": cmd_plan,
    "restore": cmd_restore,
    "headers": cmd_headers,
}


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1 or args[0] not in COMMANDS:
        print(f"usage: {Path(__file__).name} {{{','.join(COMMANDS)}}}", file=sys.stderr)
        return 2
    try:
        return COMMANDS[args[0]](os.environ if environ is None else environ)
    except InputError as exc:
        _command("error", str(exc), title="pytest-compilecache")
        return 2


if __name__ == "__main__":
    sys.exit(main())
