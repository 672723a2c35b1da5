"""The post step's Python (``store: github``, saving runs): what to upload, and how the uploads went.

action/js runs ``save`` (:func:`plan_uploads`: the plugin's new bundle in the staging dir, and the precompiled
header :func:`action.transfer.carry_header` staged because its own entry missed), uploads each with
``@actions/cache``, then runs ``saved`` with the client's results (:func:`read_results`). The real result goes
to the log and the job summary: saved (key, size), not needed (why) or failed (the service's own reason, one
warning for the step, the job's outcome unchanged). The post step runs when the job succeeded, or failed
with input save-on-failure (action.yml's ``post-if``, :func:`action.inputs.post_env`).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from typing import Mapping

from action.inputs import HEADER_PATH
from action.inputs import SAVE_PATH
from action.inputs import STAGING
from action.inputs import Plan

# What a failed CreateCacheEntry says when the entry exists already (twirp's already_exists, HTTP 409). For a
# header entry: another job of the lineage saved it first; nothing is lost, not a failure. For a bundle, whose
# key holds the run id and attempt: another job of this run has this job's lineage (COLLISION).
_EXISTS = ("(409)", "already_exists", "already exists")
COLLISION = (
    "an entry of this key exists already: another job of this run has the same job id and matrix leg (a reusable "
    "workflow called twice, or from a matrix, sees its own job id and no matrix); give each such job its own "
    "input matrix-leg (e.g. ${{ toJSON(inputs) }}) or key-prefix"
)


@dataclass(frozen=True)
class Upload:
    """One entry to upload: ``what`` (``bundle`` or ``header``), its ``key``, the literal ``path`` pattern the
    client archives and hashes into the entry version, and the ``bytes`` of the files it matches."""

    what: str
    key: str
    path: str
    bytes: int


@dataclass(frozen=True)
class Saved:
    """How one entry went: ``outcome`` ``saved``, ``not needed`` or ``failed``, and ``why`` in words."""

    what: str
    key: str
    outcome: str
    why: str = ""
    bytes: int = 0
    seconds: float = 0.0


def _files(directory: str) -> list[Path]:
    try:
        return sorted(path for path in Path(directory).glob("*.bundle") if path.is_file())
    except OSError:
        return []


def plan_uploads(plan: Plan) -> tuple[list[Upload], list[Saved]]:
    """What to upload, and the entries that need none (``not needed``, with why). Touches nothing."""
    uploads: list[Upload] = []
    skipped: list[Saved] = []
    bundles = _files(plan.staging)
    if bundles:
        uploads.append(Upload("bundle", plan.key, SAVE_PATH, sum(path.stat().st_size for path in bundles)))
    else:
        skipped.append(_no_bundle(plan))
    # carry_header stages at most one object: the header whose entry missed, named <its key>.bundle
    for path in _files(plan.header_staging)[:1]:
        key = path.name[: -len(".bundle")]
        if bundles and not _names_header(bundles, plan.prefix, key):
            why = "this run's bundle no longer names it (no compile looked it up in the last saves)"
            skipped.append(Saved("header", key, "not needed", why))
            continue
        uploads.append(Upload("header", key, HEADER_PATH, path.stat().st_size))
    return uploads, skipped


def _names_header(staged: list[Path], prefix: str, key: str) -> bool:
    """Whether a bundle this run's plugin wrote names the header stored under ``key``; True when no staged file
    reads as a bundle (the upload then goes ahead, as before the plugin could drop a header)."""
    from pytest_compilecache.action_api import header_object_key
    from pytest_compilecache.action_api import read_manifest

    read = False
    for path in staged:
        try:
            artifacts = read_manifest(path).artifacts
        except Exception:
            continue  # another header's object, riding in the bundle entry beside the bundle
        read = True
        if any(header_object_key(prefix, artifact.sha256) == key for artifact in artifacts):
            return True
    return not read


def _no_bundle(plan: Plan) -> Saved:
    """The bundle entry when the plugin wrote no bundle: why, from the plugin's JSON report."""
    try:
        save = json.loads(Path(plan.json).read_text(encoding="utf-8")).get("save") or {}
    except (OSError, ValueError, AttributeError):
        save = None
    if save is None:
        why = "no bundle written: no pytest session with the plugin reported after this Action's step"
        return Saved("bundle", plan.key, "not needed", why)
    outcome, message = str(save.get("outcome") or ""), str(save.get("message") or "")
    if outcome in ("saved", "staged"):  # the plugin wrote one, and it is gone: that is a failure
        return Saved("bundle", plan.key, "failed", f"the plugin wrote {plan.key}, but {STAGING} holds no bundle")
    if outcome == "error":
        return Saved("bundle", plan.key, "not needed", f"the plugin's save failed ({message or 'see its warning'})")
    return Saved("bundle", plan.key, "not needed", message or "the plugin wrote no bundle")


def save_reply(plan: Plan | None) -> dict[str, Any]:
    """The ``save`` command's reply to action/js: ``report`` (false: nothing to do or say, a read-only run or
    another store), ``uploads`` and ``skipped`` (passed back to ``saved`` unchanged)."""
    if plan is None or plan.transfer != "github" or not plan.save:
        return {"report": False}
    uploads, skipped = plan_uploads(plan)
    return {"report": True, "uploads": [asdict(item) for item in uploads], "skipped": [asdict(s) for s in skipped]}


def outcome(upload: Mapping[str, Any]) -> Saved:
    """One upload's result from what action/js passed: the entry id ``@actions/cache`` returned (-1: nothing
    saved) and the client's lines that say why (its warnings, the service's answer to a refused reservation)."""
    what, key = str(upload.get("what", "")), str(upload.get("key", ""))
    size, seconds = int(upload.get("bytes") or 0), float(upload.get("seconds") or 0.0)
    entry = upload.get("id")
    if isinstance(entry, int) and entry != -1:
        return Saved(what, key, "saved", bytes=size, seconds=seconds)
    problems = [str(line) for line in upload.get("problems") or []]
    if any(mark in line for line in problems for mark in _EXISTS):
        if what != "header":
            return Saved(what, key, "failed", COLLISION, bytes=size, seconds=seconds)
        return Saved(what, key, "not needed", "the entry exists already (another job of this lineage saved it)")
    # The service's own answer first (a refused reservation), then the client's summary of it.
    problems.sort(key=lambda line: not line.startswith("Failed to reserve cache:"))
    why = "; ".join(problems) or "the cache client saved nothing and logged no reason (see its debug log)"
    return Saved(what, key, "failed", why, bytes=size, seconds=seconds)


def read_results(environ: Mapping[str, str]) -> list[Saved]:
    """The ``saved`` command's input (``COMPILECACHE_SAVES``: the ``save`` reply, each upload with the client's
    result): every entry, uploaded or skipped, in order."""
    try:
        data = json.loads(environ.get("COMPILECACHE_SAVES") or "{}")
        uploads, skipped = list(data.get("uploads") or []), list(data.get("skipped") or [])
    except (ValueError, AttributeError, TypeError):
        return [Saved("bundle", "", "failed", "the Action's JavaScript passed no readable result")]
    return [*(Saved(**item) for item in skipped), *(outcome(item) for item in uploads)]


def describe(saved: Saved) -> str:
    """One entry's result as one plain line (the log's words; the summary escapes them)."""
    from pytest_compilecache.action_api import human_size

    entry = f"{saved.what} entry {saved.key}"
    if saved.outcome == "saved":
        return f"{entry}: saved ({human_size(saved.bytes)} in {saved.seconds:.1f} s)"
    return f"{entry}: {saved.outcome}: {saved.why}"


def warning(results: list[Saved]) -> str | None:
    """The step's one warning: every failed upload, or None."""
    failed = [describe(saved) for saved in results if saved.outcome == "failed"]
    if not failed:
        return None
    return "save " + "; ".join(failed) + "; the job's outcome is unchanged, the next run restores an older entry"


def markdown(results: list[Saved]) -> str:
    """The job summary's save section (every value escaped)."""
    from pytest_compilecache.action_api import ghrunner
    from pytest_compilecache.action_api import human_size

    rows = []
    for saved in results:
        if saved.outcome == "saved":
            result = f"saved: {ghrunner.md_code(saved.key)}, {human_size(saved.bytes)} in {saved.seconds:.1f} s"
        else:
            result = f"{saved.outcome}: {ghrunner.md_text(saved.why)} ({ghrunner.md_code(saved.key)})"
        rows.append(f"| {saved.what} entry | {result} |")
    return "\n".join(["### torch.compile cache: save", "", "| | |", "|---|---|", *rows, ""]) + "\n"
