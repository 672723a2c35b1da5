"""The internal API of the GitHub Action (``action/`` in this repository): everything it uses of this package.

Not public: the Action ships with the package (one checkout, one version), so these names change with it,
and nothing else should import this module. Keeping them in one place means the Action depends on this
list, not on the package's module layout: a module that moves changes this file, not the Action.

Importing it loads no torch (:func:`point_cache_dir` must run before anything does) and no boto3.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

from . import ghrunner
from ._env import SIGNING_KEY_ENV
from .bundle import read_manifest
from .cachedir import refuse_foreign
from .errors import ConfigError
from .errors import HeaderError
from .explain import install_restored as keep_graph_record
from .fingerprint import Fingerprint
from .fingerprint import collect as collect_fingerprint
from .fingerprint import handover as handover_fingerprint
from .fingerprint import make_key
from .fingerprint import restore_prefix
from .manifest import Artifact
from .pch import KIND as HEADER_KIND
from .pch import HeaderTransfer
from .pch import header_artifact
from .pch import header_dir
from .pch import install_header
from .pch import object_key as header_object_key
from .pch import packed_bound as header_packed_bound
from .pch import restore_headers
from .pch import sweep_leftovers as sweep_header_leftovers
from .pch import verify_header_copy
from .probe import point_cache_dir
from .report import human_size
from .settings import DEFAULT_PREFIX
from .settings import OPTIONS
from .settings import STORE_OPTIONS
from .settings import from_environment
from .settings import read_signing_key
from .stores import backend_keywords
from .stores import open_store
from .stores import refuse_cache_dir
from .stores.timed import TimedStore
from .sync import HANDOFF_ENV
from .sync import HeaderReport
from .sync import RestoreResult
from .sync import SavePolicy
from .sync import read_handoff
from .sync import read_save_policy
from .sync import restore
from .sync import restore_outputs
from .sync import write_handoff

__all__ = [
    "DEFAULT_PREFIX",
    "HANDOFF_ENV",
    "SIGNING_KEY_ENV",
    "SavePolicy",
    "read_handoff",
    "read_manifest",
    "refuse_foreign",
    "read_save_policy",
    "read_signing_key",
    "write_handoff",
    "HEADER_KIND",
    "OPTIONS",
    "STORE_OPTIONS",
    "ConfigError",
    "Fingerprint",
    "Artifact",
    "HeaderError",
    "HeaderReport",
    "HeaderTransfer",
    "RestoreResult",
    "TimedStore",
    "collect_fingerprint",
    "from_environment",
    "ghrunner",
    "handover_fingerprint",
    "header_artifact",
    "header_dir",
    "header_object_key",
    "header_packed_bound",
    "human_size",
    "install_header",
    "keep_graph_record",
    "make_key",
    "backend_keywords",
    "open_store",
    "refuse_cache_dir",
    "point_cache_dir",
    "restore",
    "restore_headers",
    "restore_outputs",
    "restore_prefix",
    "sweep_header_leftovers",
    "verify_header_copy",
]
