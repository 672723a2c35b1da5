"""What pytest's entry point loads (``pytest_compilecache._entry:plugin``): the hooks module, loaded plainly.

pytest imports this module (and the package's ``__init__``) through its assertion-rewriting hook, so both
stay a few lines; everything they import after :func:`~pytest_compilecache._loader.load_plainly` loads with
Python's own path finder and the pyc the installer wrote (see :mod:`pytest_compilecache._loader`). The hooks
take the finder out when the session's configuration is cleaned up. PYTEST_DONT_REWRITE
"""

from __future__ import annotations

from ._loader import load_plainly

load_plainly()

from . import plugin  # noqa: E402  (after the finder: loaded plainly)

__all__ = ["plugin"]
