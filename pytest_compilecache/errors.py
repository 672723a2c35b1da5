"""Every exception (and the one warning class) this package raises on purpose, in one leaf module.

Imports nothing of ours, so any module can import it without a cycle; ``pytest_compilecache`` re-exports
the public ones. The rule the hierarchy encodes: :class:`ConfigError` is bad user input (a start-up error
naming the option); everything else here is infrastructure or a refused bundle, which the plugin turns
into one :class:`CompileCacheWarning` line and a cold compile unless the user asked for ``strict``.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

# The variable that holds the key bundles are signed and verified with; read only by settings.resolve and
# the CLI/Action's own option reading (settings.from_environment), never anywhere else.


class CompileCacheWarning(UserWarning):
    """Infrastructure trouble (a store that is down, a corrupt bundle): the session goes on, cold.

    What happens, exactly: the plugin collects these messages during the session and prints each once in
    its terminal section (``CompileCacheWarning: ...``), in the JSON report's ``warnings`` and, inside
    GitHub Actions, as a ``::warning`` annotation. They are not passed through :func:`warnings.warn` (most
    arise after pytest's warning capture has ended), but pytest's filters naming this class are obeyed:
    ``-W error::pytest_compilecache.CompileCacheWarning`` (or the same in ``filterwarnings``) fails the
    session as ``--compile-cache-strict`` does, ``ignore::...`` hides the line. A blanket ``error`` filter
    does not escalate them: a store that is down must not fail a project's CI unless asked.
    """


class CompileCacheError(Exception):
    """Base of every exception this package raises on purpose."""


class ConfigError(CompileCacheError, ValueError):
    """Bad user input. The message names the option (``--compile-cache-store``...)."""

    def respelled(self, flag: str, spelled: str) -> ConfigError:
        """This error naming the option ``spelled`` (as the user gave it: an ini key, a variable, a CLI flag)
        where its message starts with ``flag:``; itself otherwise."""
        text = str(self)
        if spelled == flag or not text.startswith(flag + ":"):
            return self
        return ConfigError(spelled + text[len(flag) :])


class StoreError(CompileCacheError):
    """A store could not be reached or refused an operation. Callers turn it into a warning."""


class ObjectTooLarge(StoreError):
    """:meth:`Store.get` met an object larger than the caller's ``limit``: nothing is left at ``dest``.

    A listing's size bounds nothing by itself: the object may be replaced between the listing and the
    download by anyone who can write the store.
    """


class NoPartialReads(StoreError):
    """:func:`read_head` on a store without the optional ``get_head`` capability: nothing was transferred."""


class TimedOut(StoreError):
    """The budget of a :class:`~pytest_compilecache.stores.timed.TimedStore` was spent before a call returned."""


class BundleError(CompileCacheError):
    """A bundle failed verification (checksum, signature, manifest, fingerprint, unsafe member)."""


class CacheDirError(BundleError):
    """The cache dir itself failed us (cannot be created, disk full, I/O error): infrastructure trouble,
    not a fault of the bundle. A :class:`BundleError`, so a reader still raises nothing else."""


class HeaderError(CompileCacheError):
    """A precompiled header could not be described or installed; the message is one line for a warning."""
