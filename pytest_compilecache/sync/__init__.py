"""restore / save: the one orchestration of store + bundle + torch that the plugin, CLI and Action share.

Neither raises for infrastructure trouble: each returns a typed result (:class:`RestoreResult`,
:class:`SaveResult`) whose ``message`` is the one line to warn with. Callers decide whether that fails
anything (``--compile-cache-strict``). One module per concept:

- :mod:`.results`: the typed results and their one codec (the xdist ticket, the Action's hand-off);
- :mod:`.handoff`: the Action <-> plugin protocol and the save policy;
- :mod:`.restoring` (:class:`RestoreRequest`, :func:`restore_bundle`) and :mod:`.saving` (:class:`SaveRequest`,
  :func:`save_bundle`); :func:`restore` and :func:`save` take the requests' fields as keywords;
- :mod:`.staged`: blobs restored in one process and loaded in another;
- :mod:`.precompiled`: the precompiled headers' part of both, and their background install.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

from .handoff import HANDOFF_ENV
from .handoff import STAGED_MESSAGE
from .handoff import SavePolicy
from .handoff import read_handoff
from .handoff import read_save_policy
from .handoff import write_handoff
from .precompiled import HeaderInstall
from .restoring import MAX_CANDIDATES
from .restoring import MAX_HEADERS
from .restoring import RestoreRequest
from .restoring import restore
from .restoring import restore_bundle
from .results import HeaderReport
from .results import RestoreResult
from .results import SaveResult
from .results import StagedBlob
from .results import restore_outputs
from .saving import SaveRequest
from .saving import save
from .saving import save_bundle
from .staged import STAGED_MAX_AGE
from .staged import load_staged

__all__ = [
    "HANDOFF_ENV", "MAX_CANDIDATES", "MAX_HEADERS", "STAGED_MAX_AGE", "STAGED_MESSAGE", "HeaderInstall",
    "HeaderReport", "RestoreRequest", "RestoreResult", "SavePolicy", "SaveRequest", "SaveResult", "StagedBlob",
    "load_staged", "read_handoff", "read_save_policy", "restore", "restore_bundle", "restore_outputs", "save",
    "save_bundle", "write_handoff",
]  # fmt: skip
