"""pytest-compilecache: share, isolate and measure torch.compile caches in pytest sessions.

The public surface is :data:`__all__`; everything else (modules and names starting with ``_`` or not
listed here) may change in any release. Importing this package is cheap: the names below that need more
than the standard library (stores, the orchestration, statistics) are loaded on first use.

PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING
from typing import Any

from ._version import __version__

__all__ = [
    "BundleError",
    "CompileCacheError",
    "CompileCacheStats",
    "CompileCacheWarning",
    "ConfigError",
    "Fingerprint",
    "ItemRecord",
    "SessionStats",
    "StoreError",
    "__version__",
    "open_store",
    "restore",
    "save",
]

# name -> module that defines it; loaded on first attribute access (PEP 562), so that `import
# pytest_compilecache` (which pytest does for every session through the plugin entry point) stays cheap.
_LAZY = {
    "BundleError": "errors",
    "CompileCacheError": "errors",
    "CompileCacheWarning": "errors",
    "ConfigError": "errors",
    "StoreError": "errors",
    "CompileCacheStats": "stats",
    "ItemRecord": "stats",
    "SessionStats": "stats",
    "Fingerprint": "fingerprint",
    "open_store": "stores",
    "restore": "sync",
    "save": "sync",
}

if TYPE_CHECKING:
    from .errors import BundleError
    from .errors import CompileCacheError
    from .errors import CompileCacheWarning
    from .errors import ConfigError
    from .errors import StoreError
    from .fingerprint import Fingerprint
    from .stats import CompileCacheStats
    from .stats import ItemRecord
    from .stats import SessionStats
    from .stores import open_store
    from .sync import restore
    from .sync import save


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # Not cached here: the defining module stays the one home of the name (a test harness that unloads and
    # reloads modules, like pytester, must not see a stale class through the package).
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
