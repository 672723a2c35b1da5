"""The plugin's options as pytest lists them: each one's name, command-line flag and help, nothing else.

A plain table, cheap to import: the plugin's hooks read it in every session, also in those that give no
option (and then load nothing more). Each option has three spellings: the flag (``--compile-cache-store``),
the ini key (``compile_cache_store``, :func:`ini_name`) and the environment variable
(``PYTEST_COMPILECACHE_STORE``, :func:`env_name`). How each value is parsed and its default live in
:mod:`settings` (``settings.OPTIONS``, built from this table).
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import re
from typing import Any
from typing import Union

from ._env import ENV_PREFIX
from ._env import SESSION_ENV

__all__ = ["ENV_PREFIX", "INI_TYPES", "SESSION_ENV", "TABLE", "env_name", "ini_name", "ini_type", "scheme_of"]

# (name, flag, is a switch without a value, help); ``name`` is the attribute on settings.Settings.
TABLE: tuple[tuple[str, str, bool, str], ...] = (
    (
        "mode",
        "--compile-cache",
        False,
        "TorchInductor cache dir for this session: shared (persistent, reused), isolated (fresh, "
        "removed at the end) or disabled (no caching). Unset: leave torch's configuration alone.",
    ),
    (
        "dir",
        "--compile-cache-dir",
        False,
        "shared: the cache dir (default: inside pytest's cache dir). isolated: where the fresh dir is made.",
    ),
    ("keep", "--compile-cache-keep", True, "isolated: keep the session cache dir."),
    (
        "report",
        "--compile-cache-report",
        False,
        "terminal report: short (one line), full (a table of compiled tests; also with -v), none.",
    ),
    ("json", "--compile-cache-json", False, "write the statistics as JSON to this path."),
    (
        "summary",
        "--compile-cache-summary",
        False,
        "auto: append Markdown to $GITHUB_STEP_SUMMARY when it is set; off: never.",
    ),
    (
        "explain",
        "--compile-cache-explain",
        False,
        "on: record each FX-graph lookup's key components and say why each miss missed; off: capture nothing.",
    ),
    (
        "pgo",
        "--compile-cache-pgo",
        False,
        "on: keep torch's profile of which input sizes vary (automatic dynamic shapes) in the cache dir and its "
        "bundles, so that every process compiles the same graphs whatever the test order (xdist); off: torch "
        "decides in each process (the default). The profile is kept per --compile-cache-key-prefix and travels "
        "with its bundles: a test that counts recompiles sees the sizes the run that saved them saw (give such "
        "suites their own key prefix, or leave this off).",
    ),
    (
        "min_hit_rate",
        "--compile-cache-min-hit-rate",
        False,
        "fail the session when the FX-graph hit rate is lower (0..1); tests marked compile_cache are left out.",
    ),
    (
        "store",
        "--compile-cache-store",
        False,
        "restore a bundle from and save one to this store: a directory, file:///path, s3://bucket/prefix, "
        "gs://bucket/prefix or az://container/prefix.",
    ),
    ("readonly", "--compile-cache-readonly", True, "restore but never save."),
    (
        "fail_on_eager_fallback",
        "--compile-cache-fail-on-eager-fallback",
        True,
        "fail a test whose compiled function hits torch's recompile limit (torch would compile it no more, run "
        "the inputs its compiled code does not accept uncompiled, and the test pass without testing compiled code): "
        "torch's fail_on_recompile_limit_hit.",
    ),
    (
        "restore",
        "--compile-cache-restore",
        False,
        "auto: restore from the store at start; skip: the cache dir was already restored (the Action).",
    ),
    (
        "key_prefix",
        "--compile-cache-key-prefix",
        False,
        "first part of every bundle key; change it to start afresh.",
    ),
    (
        "key_salt",
        "--compile-cache-key-salt",
        False,
        "extra text mixed into the fingerprint (e.g. a model revision).",
    ),
    (
        "run_suffix",
        "--compile-cache-run-suffix",
        False,
        "last part of the saved key (default: time and process; the Action passes run id and attempt).",
    ),
    (
        "strict",
        "--compile-cache-strict",
        True,
        "make store and bundle trouble fail the session instead of warning.",
    ),
    (
        "keep_bundles",
        "--compile-cache-keep-bundles",
        False,
        "keep this many newest bundles per fingerprint in the store after a save.",
    ),
    (
        "max_size",
        "--compile-cache-max-size",
        False,
        "shared: cap the cache dir (e.g. 2G), evicting least recently used entries at the end.",
    ),
    (
        "max_bundle_size",
        "--compile-cache-max-bundle-size",
        False,
        "refuse to download, unpack or write a bundle larger than this (e.g. 4G); default 2G.",
    ),
    (
        "redis",
        "--compile-cache-redis",
        False,
        "turn on torch's Redis remote caches (FX graph, AOTAutograd, autotune) at this URL.",
    ),
    (
        "s3_endpoint",
        "--compile-cache-s3-endpoint",
        False,
        "S3-compatible endpoint URL (default: AWS_ENDPOINT_URL or AWS).",
    ),
    (
        "store_timeout",
        "--compile-cache-store-timeout",
        False,
        "seconds a restore, and a save, may wait for the store in all; then one warning (default 300).",
    ),
)


# The ini options whose value may also be a TOML number or boolean (pytest 9's native ``[tool.pytest]`` table
# types its values), beside the switches (a TOML boolean); every other one is a string. Any of them may be a string.
INI_TYPES: dict[str, type] = {
    "explain": bool,
    "pgo": bool,
    "min_hit_rate": float,
    "keep_bundles": int,
    "max_size": int,
    "max_bundle_size": int,
    "store_timeout": float,
}


def ini_type(name: str, switch: bool) -> Any:
    """The type option ``name`` is registered with for pytest 9.2+: ``str | bool`` for a switch or an on/off
    option, ``str | int`` or ``str | float`` for a number, so that pytest 9's native TOML takes ``true`` or
    ``0.9`` (an ini file's strings stay strings: the first member); None (a string) for the rest. ``settings``
    parses either."""
    other = bool if switch else INI_TYPES.get(name)
    return None if other is None else Union[str, other]


def ini_name(flag: str) -> str:
    """``--compile-cache-store`` -> ``compile_cache_store``."""
    return flag.lstrip("-").replace("-", "_")


def env_name(name: str) -> str:
    """``store`` -> ``PYTEST_COMPILECACHE_STORE``."""
    return ENV_PREFIX + name.upper()


# A URL's scheme: two or more characters before ":" so that a Windows drive ("C:\\cache") stays a plain path.
_SCHEME = r"^([A-Za-z][A-Za-z0-9+.-]+):"


def scheme_of(url: str) -> str | None:
    """The lower-case scheme of ``url`` (``s3`` for ``S3://b``), or None for a plain path: what tells a store URL
    from a directory (``stores.table``, the ini's relative paths in ``settings``) and a Redis URL's scheme."""
    match = re.match(_SCHEME, url)
    return match.group(1).lower() if match else None
