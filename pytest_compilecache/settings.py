"""One frozen :class:`Settings`, built from the command line, then the ini file, then the environment.

Every option exists in three spellings: ``--compile-cache-store`` (CLI), ``compile_cache_store`` (ini) and
``PYTEST_COMPILECACHE_STORE`` (environment). Validation errors raise :class:`ConfigError` whose message names
the option as the user wrote it, so pytest can report it at start-up.
Loads lazily (inside the functions that need them, so a session pays only for what it uses): ``urllib.parse``,
``importlib.util``, ``.remote``.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import os
import re
from typing import Any
from typing import Callable
from typing import Mapping
from typing import NamedTuple

from ._env import SIGNING_KEY_ENV
from .errors import ConfigError
from .options import TABLE
from .options import env_name
from .options import ini_name
from .options import scheme_of

MODES = ("shared", "isolated", "disabled")
REPORTS = ("short", "full", "none")
SUMMARY = ("auto", "off")
RESTORE = ("auto", "skip")
SWITCH = ("on", "off")
DEFAULT_PREFIX = "compilecache-v1"


def _choice(choices: tuple[str, ...]) -> Callable[[str, str], str]:
    def parse(option: str, value: str) -> str:
        value = value.strip().lower()
        if value not in choices:
            raise ConfigError(f"{option}: invalid value {value!r} (choose from {', '.join(choices)})")
        return value

    return parse


def _switch(option: str, value: str) -> bool:
    """``on`` / ``off`` only: a switch whose default is on reads better spelled out than as a flag."""
    return _choice(SWITCH)(option, value) == "on"


def _text(option: str, value: str) -> str:
    return value.strip()


def _nonblank(option: str, value: str) -> str:
    """A path or URL: surrounding spaces are dropped; a value of only spaces is a mistake, not "unset"."""
    if not value.strip():
        raise ConfigError(f"{option}: empty value {value!r} (leave the option out to not use it)")
    return value.strip()


def _flag(option: str, value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(f"{option}: expected a boolean (1/0, true/false), got {value!r}")


def _rate(option: str, value: str) -> float:
    try:
        rate = float(value)
    except ValueError:
        raise ConfigError(f"{option}: expected a number between 0 and 1, got {value!r}") from None
    if not 0.0 <= rate <= 1.0:
        raise ConfigError(f"{option}: must be between 0 and 1, got {value!r}")
    return rate


DEFAULT_STORE_TIMEOUT = 300.0
MAX_SECONDS = 86400.0  # a day: longer is a typo, not a budget


def parse_seconds(option: str, value: str) -> float:
    """A positive number of seconds (fractions allowed), at most a day."""
    try:
        seconds = float(value)
    except ValueError:
        raise ConfigError(f"{option}: expected a number of seconds, got {value!r}") from None
    if not 0.0 < seconds <= MAX_SECONDS:  # also refuses nan and inf
        raise ConfigError(f"{option}: must be more than 0 and at most {MAX_SECONDS:g} seconds, got {value!r}")
    return seconds


def _count(option: str, value: str) -> int:
    try:
        count = int(value)
    except ValueError:
        raise ConfigError(f"{option}: expected a whole number, got {value!r}") from None
    if count < 1:
        raise ConfigError(f"{option}: must be at least 1, got {value!r}")
    return count


# Patterns are strings: ``re`` compiles each on first use (compiled at import, every session would pay).
_SIZE = r"^\s*(\d+(?:\.\d+)?)\s*(?:([kmgt])i?)?b?\s*$"


MAX_SIZE = 1024**5  # 1 PiB: larger is a typo, not a cache


def parse_size(option: str, value: str) -> int:
    """Parse ``500M``, ``2G``, ``1.5GiB`` or a plain byte count."""
    match = re.match(_SIZE, value, re.IGNORECASE)
    if not match:
        raise ConfigError(f"{option}: expected a size like 500M or 2G, got {value!r}")
    number, unit = match.groups()
    scaled = float(number) * 1024 ** "_kmgt".index((unit or "_").lower())
    if not 1 <= scaled <= MAX_SIZE:  # float() of 400 digits is inf: int(inf) would raise OverflowError
        raise ConfigError(f"{option}: must be positive and at most 1024T, got {value[:40]!r}")
    return int(scaled)


_KEY_PART = r"^[A-Za-z0-9._-]{1,200}$"


def _key_part(option: str, value: str) -> str:
    value = value.strip()
    if not re.match(_KEY_PART, value):
        raise ConfigError(f"{option}: use 1-200 characters from A-Z a-z 0-9 . _ -, got {value!r}")
    return value


def _key_prefix(option: str, value: str) -> str:
    """A key part that starts the key: like the store's keys (stores.base.validate_key), not with a dot."""
    value = _key_part(option, value)
    if value.startswith("."):
        raise ConfigError(f"{option}: must not start with '.' (keys name files and objects), got {value!r}")
    return value


def http_url(option: str, value: str) -> str:
    """``value`` if it is an ``http(s)://host[:port]`` URL, else ConfigError naming ``option``. Credentials in
    it (``user:secret@``) are refused without repeating the value: they belong in the backend's variables, and
    a store's warnings name its endpoint."""
    from urllib.parse import urlsplit

    value = value.strip()
    if "@" in value.split("://", 1)[-1].split("/", 1)[0]:
        raise ConfigError(f"{option}: credentials in the URL are not accepted (give them in the environment)")
    try:
        parts = urlsplit(value)
        port = parts.port  # ValueError for a port out of range or not a number
    except ValueError as exc:
        raise ConfigError(f"{option}: expected an http(s):// URL, got {value[:200]!r} ({exc})") from None
    if (
        parts.scheme not in ("http", "https")
        or not parts.hostname
        or any(c.isspace() for c in value)
        or (port is not None and port == 0)
    ):
        raise ConfigError(f"{option}: expected an http(s)://host[:port] URL, got {value[:200]!r}")
    return value


def require_package(option: str, module: str, extra: str) -> None:
    """The one rule for an option that needs an optional package (a store backend's SDK, redis for
    ``--compile-cache-redis``): missing, it is a ConfigError naming ``option`` at start-up, not a warning later.
    Looks the package up without importing it."""
    import importlib.util

    try:
        found = importlib.util.find_spec(module)  # a dotted name imports its parents: "google", "google.cloud"
    except (ImportError, ValueError):  # a parent package missing, or one set to None in sys.modules
        found = None
    if found is None:
        raise ConfigError(f"{option}: needs the {module!r} package (pip install 'pytest-compilecache[{extra}]')")


def _redis_url(option: str, value: str) -> str:
    """``redis://[user:password@]host[:port][/db][?option=value&...]`` (``rediss://`` for TLS); IPv6 hosts in
    brackets; the query's options are redis-py's (``socket_timeout``, ``ssl_ca_certs``...), checked by building
    a client (no connection). The ``redis`` package must be installed (:func:`require_package`)."""
    from urllib.parse import urlsplit

    from .remote import redacted

    value = value.strip()
    try:
        parts = urlsplit(value)
        valid = (
            parts.scheme in ("redis", "rediss")
            and bool(parts.hostname)
            and (parts.port is None or 0 < parts.port < 65536)
            and (parts.path.strip("/") == "" or parts.path.strip("/").isdigit())
            and not parts.fragment
        )
    except ValueError:  # a port that is not a number, or out of range
        valid = False
    if not valid:
        raise ConfigError(
            f"{option}: expected redis://host:port/db (with / # ? @ in a password percent-encoded), got "
            f"{redacted(value)!r}"
        )
    require_package(option, "redis", "redis")
    if parts.query:
        from .remote import url_options_problem

        problem = url_options_problem(value)
        if problem:
            raise ConfigError(f"{option}: {problem} in {redacted(value)!r}")
    return value


class Option(NamedTuple):
    """One option in its three spellings (from :data:`options.TABLE`), its parser and its default."""

    name: str  # the attribute on Settings
    cli: str
    parse: Callable[[str, str], Any]
    default: Any
    help: str
    flag: bool = False  # a CLI switch without a value

    @property
    def ini(self) -> str:
        return ini_name(self.cli)

    @property
    def env(self) -> str:
        return env_name(self.name)


# name -> (parser, default); the spellings and help are in options.TABLE, in the order pytest lists them.
_PARSING: dict[str, tuple[Callable[[str, str], Any], Any]] = {
    "mode": (_choice(MODES), None),
    "dir": (_nonblank, None),
    "keep": (_flag, False),
    "report": (_choice(REPORTS), "short"),
    "json": (_nonblank, None),
    "summary": (_choice(SUMMARY), "auto"),
    "explain": (_switch, True),
    "pgo": (_switch, False),
    "min_hit_rate": (_rate, None),
    "store": (_nonblank, None),
    "readonly": (_flag, False),
    "fail_on_eager_fallback": (_flag, False),
    "restore": (_choice(RESTORE), "auto"),
    "key_prefix": (_key_prefix, DEFAULT_PREFIX),
    "key_salt": (_text, ""),
    "run_suffix": (_key_part, None),
    "strict": (_flag, False),
    "keep_bundles": (_count, 3),
    "max_size": (parse_size, None),
    "max_bundle_size": (parse_size, 2 * 1024**3),
    "redis": (_redis_url, None),
    "s3_endpoint": (http_url, None),  # a store backend's option: see STORE_OPTIONS
    "store_timeout": (parse_seconds, DEFAULT_STORE_TIMEOUT),
}

# Options that a store backend reads rather than the plugin: kept together in Settings.store_options (name,
# value), which stores.table hands to the backend whose row names them, so Settings has no field per backend.
# A new backend reads its options from its URL or its own variables instead of adding one here.
STORE_OPTIONS = ("s3_endpoint",)
# Options whose value is a path (the store's only where it names a directory, not a URL): see resolve().
PATH_OPTIONS = ("dir", "json", "store")

OPTIONS: tuple[Option, ...] = tuple(Option(name, cli, *_PARSING[name], help, flag) for name, cli, flag, help in TABLE)


class Settings(NamedTuple):
    """The plugin's whole configuration. ``mode=None`` means: only record statistics."""

    mode: str | None = None
    dir: str | None = None
    keep: bool = False
    report: str = "short"
    json: str | None = None
    summary: str = "auto"
    explain: bool = True
    pgo: bool = False
    min_hit_rate: float | None = None
    store: str | None = None
    readonly: bool = False
    fail_on_eager_fallback: bool = False
    restore: str = "auto"
    key_prefix: str = DEFAULT_PREFIX
    key_salt: str = ""
    run_suffix: str | None = None
    strict: bool = False
    keep_bundles: int = 3
    max_size: int | None = None
    max_bundle_size: int = 2 * 1024**3
    redis: str | None = None
    # (name, value) of each store backend option given (STORE_OPTIONS), for stores.open_store
    store_options: tuple[tuple[str, str], ...] = ()
    store_timeout: float = DEFAULT_STORE_TIMEOUT
    signing_key: bytes | None = None
    # (name, spelling) of each option given in the ini file or the environment rather than on the command line
    spelled: tuple[tuple[str, str], ...] = ()

    def spelling(self, name: str) -> str:
        """Option ``name`` as the user gave it (``--compile-cache-dir``, ``compile_cache_dir`` or
        ``PYTEST_COMPILECACHE_DIR``): the command-line flag unless the ini file or the environment set it."""
        return dict(self.spelled).get(name) or option(name).cli

    def respell(self, exc: ConfigError, name: str) -> ConfigError:
        """``exc`` (from code that names option ``name`` by its flag, e.g. cachedir, stores) naming it as the
        user gave it instead."""
        return exc.respelled(option(name).cli, self.spelling(name))

    @property
    def quiet(self) -> bool:
        """Nothing to do before the tests: no cache dir, store, Redis, JSON report or Action restore to take
        over. Then the plugin only records statistics, and loads the rest only if a test compiles."""
        return (
            self.mode is None
            and self.dir is None
            and self.store is None
            and self.redis is None
            and self.json is None
            and self.restore == "auto"
            and not self.pgo
        )

    @property
    def effective_mode(self) -> str | None:
        """A store or a dir needs a cache dir the plugin owns: with no mode given, they imply ``shared``."""
        if self.mode is None and (self.store or self.dir):
            return "shared"
        return self.mode


def resolve(
    cli: Mapping[str, Any],
    ini: Callable[[str], Any],
    environ: Mapping[str, str] = os.environ,
    ini_base: str | None = None,
) -> Settings:
    """Build :class:`Settings`; CLI beats ini beats environment. Raises :class:`ConfigError`.

    ``cli`` maps option names to parsed argparse values (None when not given); ``ini`` returns the raw
    ini value for a key, or None/"" when unset. ``ini_base``: the dir a relative path the ini file gives
    (:data:`PATH_OPTIONS`) is relative to, pytest's rootdir (as its own ``cache_dir``); one given on the
    command line or in the environment is relative to the current dir. ``~`` is expanded in each.
    """
    values: dict[str, Any] = {}
    spellings: dict[str, str] = {}
    for option in OPTIONS:
        values[option.name], spellings[option.name] = _pick(
            option, cli.get(option.name), ini(option.ini), environ.get(option.env)
        )
    for name in PATH_OPTIONS:
        value = values[name]
        if isinstance(value, str) and not (name == "store" and scheme_of(value)):  # a URL (gs:bucket too) is no path
            path = os.path.expanduser(value)
            from_ini = spellings[name].startswith("compile_cache_")  # the ini key (a flag: --, a variable: upper)
            values[name] = os.path.join(ini_base, path) if from_ini and ini_base else path
    values["store_options"] = tuple((name, value) for name in STORE_OPTIONS if (value := values.pop(name)) is not None)
    values["signing_key"] = read_signing_key(environ)
    values["spelled"] = tuple((name, spelled) for name, spelled in spellings.items() if not spelled.startswith("--"))
    settings = Settings(**values)
    if settings.mode == "disabled" and settings.store:
        raise ConfigError(f"{spellings['store']}: cannot be used with {spellings['mode']}=disabled")
    if settings.store and scheme_of(settings.store) in (None, "file") and not settings.readonly:
        _fit_file_names(settings, spellings)
    if settings.max_size is not None and settings.effective_mode != "shared":
        # Only a shared dir is trimmed (an isolated one is removed at the end): a cap elsewhere caps nothing.
        given = f"not to {spellings['mode']}={settings.mode}" if settings.mode else "no mode is set (statistics only)"
        raise ConfigError(f"{spellings['max_size']}: applies only to shared mode; {given}")
    return settings


# The options only a store reads: given without one, they change nothing (:func:`unused_options`).
_STORE_ONLY = ("readonly", "run_suffix", "keep_bundles", "max_bundle_size", "store_timeout")


def unused_options(settings: Settings) -> list[str]:
    """A note for the options given on the command line or in the ini file that change nothing as configured: a
    store's options without a store, ``keep`` without an isolated dir. Notes, not errors: an ini file may set
    them for CI, where the store comes from the environment. Variables are left out: the Action sets some for
    every job (a pull request's ``READONLY`` guards a store an ini file may name)."""
    notes = []
    by_hand = {name for name in (*_STORE_ONLY, "keep", *STORE_OPTIONS) if not settings.spelling(name).isupper()}
    if settings.keep and settings.effective_mode != "isolated" and "keep" in by_hand:
        notes.append(f"{settings.spelling('keep')}: not used, only an isolated session's dir is removed at its end")
    given = [name for name in _STORE_ONLY if getattr(settings, name) != option(name).default and name in by_hand]
    given += [name for name, _ in settings.store_options if name in by_hand]
    if given and not settings.store:
        shown = ", ".join(settings.spelling(name) for name in given)
        notes.append(f"{shown}: not used without a store ({settings.spelling('store')})")
    return notes


# A directory store keeps each key as a file ``<key>.bundle``, at most 255 bytes on every common file system: a
# bundle's key is ``<prefix>-<digest, 16>-<suffix>`` (``fingerprint.make_key``; the default suffix, time and
# process, takes up to 23). A precompiled header's object (``<prefix>-artifact-<sha256>``) is longer, but only
# a header fails with it: one warning, and torch builds it.
_NAME_MAX, _DEFAULT_SUFFIX_MAX = 255, 23


def _fit_file_names(settings: Settings, spellings: Mapping[str, str]) -> None:
    """ConfigError at start-up where a directory store could not name a bundle's file (every save would fail)."""
    suffix = len(settings.run_suffix) if settings.run_suffix else _DEFAULT_SUFFIX_MAX
    longest = len(settings.key_prefix) + 1 + 16 + 1 + suffix + len(".bundle")
    if longest > _NAME_MAX:
        given = spellings["key_prefix"] + (f" and {spellings['run_suffix']}" if settings.run_suffix else "")
        raise ConfigError(
            f"{given}: too long for a directory store, whose file names take at most {_NAME_MAX} characters "
            f"(a bundle's would take {longest}); shorten the key prefix"
        )


def read_signing_key(environ: Mapping[str, str] = os.environ) -> bytes | None:
    """The bundle signing key from :data:`SIGNING_KEY_ENV` (None when unset or empty): the one place it is
    read, for the plugin, the CLI and the Action alike. A value that is not UTF-8 is a ConfigError naming it."""
    value = environ.get(SIGNING_KEY_ENV, "")
    try:
        return value.encode() if value else None
    except UnicodeEncodeError:  # bytes that are not UTF-8, as Python keeps them in os.environ
        raise ConfigError(f"{SIGNING_KEY_ENV}: not valid UTF-8") from None


def option(name: str) -> Option:
    """The option behind ``Settings.<name>``."""
    return next(candidate for candidate in OPTIONS if candidate.name == name)


def from_environment(name: str, value: str | None, flag: str, environ: Mapping[str, str] = os.environ) -> Any:
    """Option ``name`` for a tool without an ini file (the CLI, the Action): ``value`` given as ``flag``,
    else the plugin's variable, else the default; parsed, a bad value a ConfigError naming where it came from."""
    spec = option(name)
    if value is not None:
        return spec.parse(flag, value)
    from_env = environ.get(spec.env, "")
    return spec.parse(spec.env, from_env) if from_env else spec.default  # as the plugin: only empty is unset


def _pick(option: Option, cli: Any, ini: Any, env: str | None) -> tuple[Any, str]:
    """The first value given, parsed, and the spelling it was given in (for error messages).

    An empty value on the command line (``--compile-cache-store=``) unsets the option: the ini file and
    the environment are not consulted (an empty ini value or variable is the same as none).
    """
    if cli == "":
        return option.default, option.cli
    for value, spelling in ((cli, option.cli), (ini, option.ini), (env, option.env)):
        if value is None or value == "" or (value is False and spelling == option.cli):  # an absent CLI switch
            continue
        if isinstance(value, bool):  # a switch on the command line, a TOML boolean in pytest 9's [tool.pytest]
            value = ("true" if value else "false") if option.flag else ("on" if value else "off")
        return option.parse(spelling, str(value)), spelling
    return option.default, option.cli
