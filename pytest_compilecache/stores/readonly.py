"""Read-only mode for any store: reads pass through, writes raise :class:`StoreError`.

``open_store(..., readonly=True)`` wraps the backend in :class:`ReadOnlyStore`; backends know nothing of
the mode (sccache's approach: read-only overrides only the write check). Used off the default branch
(pull requests restore but do not save), as setup-gradle does.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import builtins
from pathlib import Path

from ..errors import StoreError
from .base import Store
from .base import StoreEntry
from .base import read_head
from .base import validate_key

__all__ = ["ReadOnlyStore"]


class ReadOnlyStore:
    """Wraps ``inner``; ``put`` and ``delete`` raise ``StoreError("store is read-only ...")``."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.location = inner.location

    def __repr__(self) -> str:
        return f"ReadOnlyStore({self.inner!r})"

    def get(self, key: str, dest: Path, *, limit: int | None = None) -> bool:
        """Delegate to the wrapped store."""
        return self.inner.get(key, dest, limit=limit)

    def get_head(self, key: str, limit: int) -> bytes | None:
        """Delegate to the wrapped store (:func:`.base.read_head`)."""
        return read_head(self.inner, key, limit)

    def list(self, prefix: str = "") -> builtins.list[StoreEntry]:
        """Delegate to the wrapped store."""
        return self.inner.list(prefix)

    def cancel(self) -> None:
        """Pass :meth:`.timed.TimedStore`'s word on to the wrapped store (S3 stops its transfers), if it takes it."""
        cancel = getattr(self.inner, "cancel", None)
        if callable(cancel):
            cancel()

    def put(self, key: str, src: Path) -> None:
        """Always refuse (after validating the key, so a bad key is still a ConfigError)."""
        validate_key(key)
        raise StoreError(f"store is read-only: cannot put {key} to {self.location}")

    def delete(self, key: str) -> None:
        """Always refuse (after validating the key, so a bad key is still a ConfigError)."""
        validate_key(key)
        raise StoreError(f"store is read-only: cannot delete {key} from {self.location}")
