"""pytest-compilecache: share, isolate and measure torch.compile caches in pytest sessions.

PYTEST_DONT_REWRITE
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = [
    "BundleError",
    "CompileCacheWarning",
    "ConfigError",
    "StoreError",
    "__version__",
]


class CompileCacheWarning(UserWarning):
    """Infrastructure trouble (a store that is down, a corrupt bundle): the session goes on, cold."""


class ConfigError(ValueError):
    """Bad user input. The message names the option (``--compile-cache-store``...)."""


class StoreError(Exception):
    """A store could not be reached or refused an operation. Callers turn it into a warning."""


class BundleError(Exception):
    """A bundle failed verification (checksum, signature, manifest, fingerprint, unsafe member)."""
