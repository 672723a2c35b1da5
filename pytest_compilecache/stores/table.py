"""The store table: each URL scheme, the backend that serves it, the extra it needs and the options it reads.

A plain table, cheap to import (no backend module is loaded): :func:`~pytest_compilecache.stores.open_store`
builds a store from it, the Action's install step asks :func:`extra_for` which extra a store needs, and
the error for an unknown scheme lists :func:`expected`. Adding a backend is one module in this package
(a class with ``from_url(url, **options)`` implementing :class:`~pytest_compilecache.stores.base.Store`),
one row of :data:`BACKENDS` and one subclass of the store contract suite (``tests/contract``).

A backend reads its own options: from its URL's query (``az://container/prefix?account=NAME``) or from its
own environment variables (``AZURE_STORAGE_CONNECTION_STRING``, ``STORAGE_EMULATOR_HOST``), inside its
``from_url``. An option the plugin also offers as one of its own (``--compile-cache-s3-endpoint``, older
than this table) reaches the backend through :attr:`Backend.settings`, so ``Settings`` names no backend.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field
from typing import Mapping

from ..options import scheme_of

__all__ = ["BACKENDS", "Backend", "backend_for", "expected", "extra_for", "scheme_of"]


@dataclass(frozen=True)
class Backend:
    """One row: a remote store backend, imported only when a store URL names its scheme."""

    scheme: str
    """The URL scheme, lower case, without ``://``."""
    module: str
    """The module that defines it, imported on first use."""
    factory: str
    """The class in ``module`` whose ``from_url(url, **options)`` builds the store."""
    extra: str
    """The pip extra that installs what it needs: ``pip install 'pytest-compilecache[<extra>]'``."""
    requires: tuple[str, ...]
    """Modules that must be importable (looked up, not imported, at start-up)."""
    example: str
    """The URL's shape, for error messages."""
    variables: tuple[str, ...] = ()
    """The environment variables it reads itself (credentials, endpoints): for the docs and the Action."""
    settings: Mapping[str, str] = field(default_factory=dict)
    """``Settings.store_options`` name -> ``from_url`` keyword: the plugin options it takes."""


BACKENDS: tuple[Backend, ...] = (
    Backend(
        scheme="s3",
        module="pytest_compilecache.stores.s3",
        factory="S3Store",
        extra="s3",
        requires=("boto3",),
        example="s3://bucket/prefix",
        variables=("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_REGION"),
        settings={"s3_endpoint": "endpoint_url"},
    ),
    Backend(
        scheme="gs",
        module="pytest_compilecache.stores.gcs",
        factory="GCSStore",
        extra="gcs",
        requires=("google.cloud.storage",),
        example="gs://bucket/prefix",
        variables=("GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT", "STORAGE_EMULATOR_HOST"),
    ),
    Backend(
        scheme="az",
        module="pytest_compilecache.stores.azure",
        factory="AzureStore",
        extra="azure",
        requires=("azure.storage.blob", "azure.identity"),
        example="az://container/prefix",
        variables=("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT_URL", "AZURE_STORAGE_ACCOUNT_NAME"),
    ),
)


def backend_for(url: str) -> Backend | None:
    """The row for ``url``'s scheme when it is written ``scheme://...``; None for anything else."""
    scheme = scheme_of(url)
    if scheme is None or not url[len(scheme) + 1 :].startswith("//"):
        return None
    return next((backend for backend in BACKENDS if backend.scheme == scheme), None)


def extra_for(url: str) -> str | None:
    """The pip extra a store URL needs (``s3``, ``gcs``, ``azure``), or None (a directory, ``github``).

    Pure: looks at the text only. The Action installs ``pytest-compilecache[<extra>]`` from it.
    """
    backend = backend_for(url.strip())
    return backend.extra if backend else None


def expected() -> str:
    """What ``--compile-cache-store`` accepts, for its error messages."""
    return "expected file:///absolute/path, a directory path, " + ", ".join(b.example for b in BACKENDS)
