"""The transfer of bundles and headers: what the ``restore`` and ``headers`` steps do, and what they report.

``store: github``: the Action's JavaScript (action/js) restored the bundle entry into the staging dir with
``@actions/cache``; :func:`restore` unpacks it (telling a miss from trouble by what the client said,
:class:`Found`), and the header entry travels as an entry of its own (:func:`header_entry`,
:func:`carry_header`); the post step uploads what the plugin and :func:`carry_header` staged
(:mod:`action.upload`). Other stores:
:func:`restore` fetches from the store itself. Everything of the plugin comes from
:mod:`pytest_compilecache.action_api` (the Action's one internal API); nothing here imports torch.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any
from typing import Mapping

from action.inputs import ENV_PREFIX
from action.inputs import RESTORED_ENV
from action.inputs import SAVING_EVENTS
from action.inputs import STAGING
from action.inputs import Plan
from action.inputs import with_signing_key

if TYPE_CHECKING:
    from pytest_compilecache.action_api import Artifact
    from pytest_compilecache.action_api import RestoreResult


def stage_bundles(staging: Path, inbox: Path) -> list[str]:
    """Move what the cache client restored from ``staging`` into ``inbox``; remove ``staging``.

    At job end the post step saves ``staging/*.bundle``: only the plugin's new bundle may match then,
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
class Found:
    """What the Action's JavaScript got from ``@actions/cache`` for one entry (``COMPILECACHE_FOUND``, JSON).

    ``matched``: the key the client restored, or None; ``problem``: why it restored nothing, in the client's own
    words (the warning it logged: a refused or failed lookup, an unreachable service, a failed download), or
    None when the service answered that there is no entry (a miss). The client never raises for these: it logs
    them and returns as for a miss, so action/js reads its log (``captureClientLog``) and passes them here.
    """

    matched: str | None = None
    problem: str | None = None

    @classmethod
    def read(cls, environ: Mapping[str, str]) -> Found:
        """From ``COMPILECACHE_FOUND``; absent: nothing restored, no problem (a miss)."""
        import json

        text = environ.get("COMPILECACHE_FOUND", "").strip()
        if not text:
            return cls()
        try:
            data = json.loads(text)
            matched, problem = data.get("matched"), data.get("problem")
        except (ValueError, AttributeError):
            return cls(problem=f"the Action's JavaScript passed no readable result: {text[:200]!r}")
        return cls(str(matched) if matched else None, str(problem) if problem else None)

    def trouble(self, staged: bool) -> str | None:
        """Why the restore failed, in words, or None (a restore, or a real miss: the service answered)."""
        if self.problem and not staged:
            return f"the cache client restored nothing: {self.problem}"
        if self.matched and not staged:
            return f"the cache client reported {self.matched} restored but left no bundle in {STAGING}"
        return None


def restore(plan: Plan, environ: Mapping[str, str]) -> RestoreResult:
    """Restore into ``plan.cache_dir``; never raises.

    Outcomes: ``exact``, ``partial``, ``miss`` (no entry) or ``error`` (trouble: the tests compile cold).
    """
    from pytest_compilecache import action_api as api

    if plan.transfer == "none":
        return api.RestoreResult("miss", message=plan.why)
    try:
        api.point_cache_dir(plan.cache_dir)  # before anything imports torch
        if plan.transfer == "github":
            staged = stage_bundles(Path(plan.staging), Path(plan.inbox))
            trouble = Found.read(environ).trouble(bool(staged))
            if trouble:
                return api.RestoreResult("error", message=trouble)
            if not staged:
                message = f"no entry under {plan.restore_prefix}"
                return api.RestoreResult("miss", message=message)
            store = api.open_store(plan.inbox, readonly=True)
        else:
            # The job's options, read as its pytest step reads them (the plan checked them): the store's budget and
            # the options its backend takes.
            given = {name: api.from_environment(name, None, "", environ) for name in api.STORE_OPTIONS}
            seconds = api.from_environment("store_timeout", None, "", environ)
            store = api.TimedStore(
                api.open_store(plan.store, readonly=True, **api.backend_keywords(plan.store, given)),
                seconds,
                option=ENV_PREFIX + "STORE_TIMEOUT",
            )
        result = api.restore(
            store,
            prefix=plan.prefix,
            fingerprint=api.Fingerprint.from_json(plan.fingerprint),
            cache_dir=plan.cache_dir,
            signing_key=api.read_signing_key(with_signing_key(environ)),
            exact_key=plan.key,
            max_bytes=api.from_environment("max_bundle_size", None, "", environ),  # the job's cap, as the plugin's
            # store: github: the header entry brings the chosen header after this step (see header_entry)
            headers=plan.transfer != "github",
            # torch's artifacts wait in the cache dir for the pytest process to load (sync.load_staged):
            # this step imports no torch, the job pays for one torch import instead of two
            stage_blobs=True,
        )
        return split_headers(plan, store, result) if plan.transfer == "github" else result
    except Exception as exc:  # cache trouble never fails the job: anything here becomes one warning
        return api.RestoreResult("error", message=f"restore failed: {type(exc).__name__}: {exc}")
    finally:
        shutil.rmtree(plan.inbox, ignore_errors=True)


def header_entry(plan: Plan, result: RestoreResult) -> tuple[str, Artifact] | None:
    """The header that travels as its own cache entry, and that entry's key; None when none does.

    ``store: github`` only, after a restore: the first (by name, then sha256) of the precompiled headers the
    verified manifest names; a CPU suite names one. Any others ride in the bundle entry.
    The key is exact and content-addressed (``<lineage>-artifact-<sha256>``): the post step saves it once
    and skips the upload when it exists.
    """
    from pytest_compilecache import action_api as api

    if plan.transfer != "github" or result.outcome not in ("exact", "partial"):
        return None
    valid = []
    for artifact in result.named_artifacts:
        if artifact.kind == api.HEADER_KIND:
            try:
                valid.append(api.header_artifact(artifact))
            except api.HeaderError:
                continue  # restore_headers reports it
    if not valid:
        return None
    chosen = min(valid, key=lambda artifact: (artifact.name, artifact.sha256))
    return api.header_object_key(plan.prefix, chosen.sha256), chosen


def split_headers(plan: Plan, store: Any, result: RestoreResult) -> RestoreResult:
    """``store: github``, after the bundle restored with ``headers=False``: install from the bundle entry
    (``store``, the inbox) every header it names except :func:`header_entry`'s, and keep the bundle entry's
    copy of that one, if it carries one, in ``plan.header_spare`` for ``headers`` (:func:`carry_header`)."""
    import time
    from dataclasses import replace

    from pytest_compilecache import action_api as api

    entry = header_entry(plan, result)
    named = list(result.named_artifacts)
    if not named:
        return result
    started = time.perf_counter()
    scratch = Path(plan.inbox) / ".headers"
    scratch.mkdir(parents=True, exist_ok=True)
    others = [item for item in named if entry is None or item.sha256 != entry[1].sha256]
    try:
        transfer = api.restore_headers(store, plan.prefix, others, scratch)
        if entry is not None:
            spare = Path(plan.header_spare)
            spare.mkdir(parents=True, exist_ok=True)
            # False: this bundle entry carries none. Bounded by what the verified manifest says it packs to.
            store.get(entry[0], spare / f"{entry[0]}.bundle", limit=api.header_packed_bound(entry[1].size))
    except Exception as exc:  # the bundle is installed; torch builds what is not carried
        transfer = api.HeaderTransfer(errors=[f"precompiled headers not restored: {type(exc).__name__}: {exc}"])
    return replace(result, headers=api.HeaderReport.of(transfer, time.perf_counter() - started))


@dataclass(frozen=True)
class HeaderCarry:
    """What ``headers`` did with the header entry (see :func:`carry_header`).

    ``source``: ``entry`` (the header entry held it), ``bundle`` (the bundle entry's copy, now staged to be
    saved under the key) or ``none`` (neither: torch builds it). ``present``: the header is in torch's dir
    now (installed, already there, or being put there by another process on the runner that holds torch's build
    lock for it: torch building it, another job's install; then ``elsewhere``); ``carried``: the header entry
    holds it, or will once the post step saves it at job end, so the plugin need not write it into its bundle.
    """

    source: str
    present: bool
    carried: bool
    installed: bool = False
    seconds: float = 0.0
    warnings: tuple[str, ...] = ()
    elsewhere: bool = False


def carry_header(plan: Plan, key: str, artifact: Artifact, hit: bool, directory: Path | None = None) -> HeaderCarry:
    """Verify and install the header the bundle's manifest names, from its own entry or the bundle's copy.

    ``hit``: the cache client restored the header entry (its exact key) into ``plan.header_staging``. Every
    byte is checked against the verified manifest's sha256 (:func:`pytest_compilecache.headers.install_header`,
    or :func:`~pytest_compilecache.headers.verify_header_copy` where the header is already in torch's dir).
    The entry's copy comes first; when it is missing (evicted, never saved) or bad, the bundle entry's copy:
    on a saving run whose header entry missed, that one is moved into the staging dir, so that the Action's
    post step saves it under the exact key; otherwise (nothing will save it) the used object is removed.
    Neither: one warning; torch builds the header, and this run's plugin writes it into its bundle (not
    ``carried``), from which the next saving run saves the header entry. Never raises.
    """
    import time

    from pytest_compilecache import action_api as api

    started = time.perf_counter()
    staged = Path(plan.header_staging) / f"{key}.bundle"
    spare = Path(plan.header_spare) / f"{key}.bundle"
    target = directory or api.header_dir()
    warnings: list[str] = []
    for source, path in (("entry", staged), ("bundle", spare)):
        if not path.is_file():
            continue
        try:
            with open(path, "rb") as fh:
                installed = api.install_header(artifact, fh, target)
                if not installed:  # already in torch's dir (or torch is building it): check the bytes anyway
                    fh.seek(0)
                    api.verify_header_copy(artifact, fh)
            if plan.save and not hit:  # the post step saves the staged object under the exact key
                if source == "bundle":
                    staged.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(spare, staged)
            else:  # nothing will save it: do not leave ~21 MiB in the workspace
                for leftover in (staged, spare):
                    with contextlib.suppress(OSError):
                        leftover.unlink()
        except (OSError, api.HeaderError) as exc:
            where = f"cache entry {key}" if source == "entry" else "the bundle entry's copy"
            warnings.append(f"precompiled header {artifact.name}: {where} not used: {exc}")
            if source == "entry" and not hit:
                with contextlib.suppress(OSError):
                    staged.unlink()  # never let the post step save bytes that are not the key's
            continue
        return HeaderCarry(
            source,
            present=True,
            carried=source == "entry" or (plan.save and not hit),
            installed=installed,
            seconds=time.perf_counter() - started,
            warnings=tuple(warnings),
            elsewhere=not installed and not os.path.lexists(target / artifact.name),
        )
    if not warnings:
        warnings.append(
            f"precompiled header {artifact.name}: no cache entry {key} (evicted, or never saved) and the "
            "bundle entry does not carry it; torch builds it, and this run's bundle carries it to the next"
        )
    return HeaderCarry(
        "none", present=False, carried=False, seconds=time.perf_counter() - started, warnings=tuple(warnings)
    )


def restore_outputs(result: RestoreResult) -> dict[str, str]:
    """The step outputs, as the CLI's ``restore --github-output`` writes them (one mapping for both)."""
    from pytest_compilecache.action_api import restore_outputs as outputs

    return outputs(result)


def restore_markdown(plan: Plan, result: RestoreResult) -> str:
    """The step summary's short restore section; the plugin appends its own report after the tests.

    Every value that did not come from this file (keys, messages, the store URL) is escaped.
    """
    from pytest_compilecache.action_api import ghrunner
    from pytest_compilecache.action_api import human_size

    md_code, md_text = ghrunner.md_code, ghrunner.md_text
    outcome = result.outcome
    where = {
        "github": "GitHub Actions cache",
        "direct": md_code(plan.store),
        "none": f"none (mode {plan.mode})",
    }[plan.transfer]
    if outcome in ("exact", "partial"):
        restored = (
            f"{outcome}: {md_code(result.key or '')}, {human_size(result.size)} in "
            f"{result.seconds:.1f} s, {result.files} files"
        )
        run = saved_by(plan, result.key or "")
        if run:
            # What the Action can learn of an earlier upload: the newest entry of the lineage is that run's.
            restored += f" (the newest saved: run {md_text(run)})"
    else:
        restored = f"{outcome}" + (f": {md_text(result.message)}" if result.message else "")
    if result.skipped:
        restored += f"; refused {len(result.skipped)} bad bundle(s): " + md_text(
            "; ".join(f"{key}: {why}" for key, why in result.skipped)
        )
    if plan.save and plan.transfer == "github":
        saving = f"{md_code(plan.key)} if the tests compile something new, uploaded at job end by this Action"
        saving += (
            ", also when the job fails (input save-on-failure)"
            if plan.save_on_failure
            else " when the job succeeds (input save-on-failure)"
        )
        if plan.why == "save: true" and plan.event not in SAVING_EVENTS:
            # GitHub gives untrusted triggers (pull requests from forks...) a read-only cache token.
            saving += f"; {md_text(plan.event)} runs may get a read-only cache token, and then nothing is saved"
    elif plan.save:
        saving = f"{md_code(plan.key)} if the tests compile something new, written by the tests into the store"
        if not plan.save_on_failure:
            saving += " if they pass (input save-on-failure)"
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
        *([f"| min-hit-rate | {md_text(lifted)} |"] if (lifted := gate_lifted(plan, result)) else []),
        "",
    ]
    return "\n".join(lines) + "\n"


def saved_by(plan: Plan, key: str) -> str | None:
    """``<run id> attempt <n>`` of the run that saved ``key`` (a key of this lineage and fingerprint), else None.

    The entry a restore finds is the newest one of the lineage: the run that saved it is the last whose upload
    worked (its post step's summary said so; a later run's that failed did too)."""
    suffix = key[len(plan.restore_prefix) :] if key.startswith(plan.restore_prefix) else ""
    run, _, attempt = suffix.rpartition("-")
    return f"{run} attempt {attempt}" if run.isdigit() and attempt.isdigit() else None


def restored_env(plan: Plan, result: RestoreResult) -> dict[str, str]:
    """What the restore tells the plugin in the job's later steps (it runs with ``RESTORE=skip``).

    ``PYTEST_COMPILECACHE_RESTORED`` as ``sync.write_handoff`` writes it (the plugin reads it with
    ``sync.read_handoff`` and ``sync.read_save_policy``; on saving runs it carries the save policy), the
    plugin's contract for knowing how the Action's restore went (its hit-rate
    guard must not fail a session after a failed restore) and which verified mega-cache blobs wait in the
    cache dir for it to load (``sync.load_staged``). When nothing was
    restored (a miss or an error, :func:`gate_lifted`) the Action also clears ``PYTEST_COMPILECACHE_MIN_HIT_RATE``
    (an empty value is unset for the plugin), so input ``min-hit-rate`` cannot fail the job whatever the
    plugin's version.
    """
    if plan.transfer == "none":
        return {}
    from pytest_compilecache import action_api as api

    # One policy for every store (actions/cache's): no save after failed tests unless save-on-failure; with
    # store: github the plugin only stages, and the Action's post step uploads at job end (action.upload).
    policy = (
        api.SavePolicy(only_when_passed=not plan.save_on_failure, staged=plan.transfer == "github")
        if plan.save
        else None
    )
    env = {RESTORED_ENV: api.write_handoff(result, policy)}
    if gate_lifted(plan, result):
        env[ENV_PREFIX + "MIN_HIT_RATE"] = ""
    return env


def gate_lifted(plan: Plan, result: RestoreResult) -> str | None:
    """Why input ``min-hit-rate`` is not applied in this job, or None (it is, or it is not set).

    The hit rate measures the restored bundle: with none (the first run of a fingerprint, a torch upgrade, an
    evicted lineage, or a restore that failed) every graph compiles cold, and a gate would fail the job for
    what the cache could not have served. Unless the job is strict (``PYTEST_COMPILECACHE_STRICT``): then
    infrastructure trouble (a failed restore, a refused bundle) keeps the gate, as it does for the plugin.
    """
    if not plan.min_hit_rate or result.outcome in ("exact", "partial"):
        return None
    if plan.strict and plan.transfer != "none" and (result.outcome == "error" or result.skipped):
        return None  # strict, as the plugin's guard: a failed restore or a refused bundle trips the gate
    if plan.transfer == "none":
        restores = f"mode {plan.mode} restores nothing"
        return f"min-hit-rate {plan.min_hit_rate} not applied: {restores}, every graph compiles cold"
    if result.outcome == "error":
        return f"min-hit-rate {plan.min_hit_rate} not applied: the restore failed, every graph compiles cold"
    return f"min-hit-rate {plan.min_hit_rate} not applied: nothing to restore (a miss), every graph compiles cold"
