"""The Action <-> plugin protocol: how the Action's restore step tells the pytest session what it restored, and
how it wants the session's save done.

The Action restores before pytest runs (``--compile-cache-restore=skip``) and puts, in :data:`HANDOFF_ENV`, the
restore's result in its one codec (:meth:`.results.RestoreResult.encode`) and its save policy
(:class:`SavePolicy`), so that a failed restore never fails the session through the hit-rate guard, the headers
it installed are named again by the save, and the blobs it staged are loaded by the session. Written by
:func:`write_handoff`, read by :func:`read_handoff` and :func:`read_save_policy`, nowhere else.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import json
from typing import Any
from typing import NamedTuple

from .results import RESTORE_OUTCOMES
from .results import RestoreResult

HANDOFF_ENV = "PYTEST_COMPILECACHE_RESTORED"


class SavePolicy(NamedTuple):
    """How the Action wants the session's save: ``only_when_passed`` (no save after failed tests: input
    ``save-on-failure`` false, actions/cache's convention) and ``staged`` (the store is the Action's staging
    dir, which actions/cache uploads at job end: the save is then reported as ``staged``, never ``saved``)."""

    only_when_passed: bool = False
    staged: bool = False


# Nothing in the job learns how the upload went: actions/cache's post step runs after every step (the runner
# queues post steps once the main steps are done), so the next run's restore is where it shows.
STAGED_MESSAGE = (
    "staged for upload at job end (actions/cache uploads it after the last step if the job succeeds; "
    "the next run's restore reports the result)"
)


def write_handoff(result: RestoreResult, policy: SavePolicy | None = None) -> str:
    """The value of :data:`HANDOFF_ENV` for ``result`` (compact JSON), read back by :func:`read_handoff` and
    :func:`read_save_policy`: :meth:`RestoreResult.encode` (the outcome and why, the bad bundles skipped, the
    precompiled headers the restore installed or found, so the save names them again where the file system
    records no reads, the object key of a header carried by the Action's own cache entry in
    ``headers.carried``, the mega-cache blobs left for pytest to load) plus, for a saving run,
    ``"save_when": "passed"|"always"`` and ``"save_staged": true``.
    """
    told: dict[str, Any] = result.encode()
    if policy is not None:
        told["save_when"] = "passed" if policy.only_when_passed else "always"
        if policy.staged:
            told["save_staged"] = True
    return json.dumps(told, separators=(",", ":"))


def read_save_policy(value: str | None) -> SavePolicy:
    """The save policy :func:`write_handoff` wrote; the defaults (save whatever the tests did, for real)
    when absent or malformed."""
    try:
        data = json.loads(value or "")
    except (ValueError, RecursionError):
        return SavePolicy()
    if not isinstance(data, dict):
        return SavePolicy()
    return SavePolicy(only_when_passed=data.get("save_when") == "passed", staged=data.get("save_staged") is True)


def read_handoff(value: str | None) -> RestoreResult | None:
    """What :func:`write_handoff` wrote (anyone's text: never a crash); None when unknown or malformed.

    :meth:`RestoreResult.decode` checks every field. Older Actions' shapes are read too: a bare outcome
    (``partial``), and ``"headers"`` as a list of names with the carried header's key in ``"header_key"``.
    """
    if not value:
        return None
    try:
        data = json.loads(value)
    except (ValueError, RecursionError):
        data = {"outcome": value.strip()}
    if isinstance(data, str):
        data = {"outcome": data}
    if not isinstance(data, dict) or data.get("outcome") not in RESTORE_OUTCOMES:
        return None
    carried = data.get("header_key")
    if isinstance(carried, str) and carried and isinstance(data.get("headers"), list):
        data = {**data, "headers": {"named": data["headers"], "carried": [carried]}}
    return RestoreResult.decode(data)
