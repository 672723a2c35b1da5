"""settings.py: CLI > ini > environment, every parser, and errors that name the option as the user wrote it."""

from __future__ import annotations

from typing import Any
from typing import Mapping

import pytest

from pytest_compilecache import ConfigError
from pytest_compilecache._env import SIGNING_KEY_ENV
from pytest_compilecache.settings import DEFAULT_PREFIX
from pytest_compilecache.settings import OPTIONS
from pytest_compilecache.settings import STORE_OPTIONS
from pytest_compilecache.settings import Settings
from pytest_compilecache.settings import parse_size
from pytest_compilecache.settings import resolve

BY_NAME = {option.name: option for option in OPTIONS}


def _resolve(
    cli: Mapping[str, Any] | None = None,
    ini: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
) -> Settings:
    """``resolve`` with plain dicts; ini and env are keyed by the option's attribute name for brevity."""
    ini_values = {BY_NAME[name].ini: value for name, value in (ini or {}).items()}
    environ = {BY_NAME[name].env if name in BY_NAME else name: value for name, value in (env or {}).items()}
    return resolve(dict(cli or {}), ini_values.get, environ)


def _error(**where: Mapping[str, Any]) -> str:
    with pytest.raises(ConfigError) as info:
        _resolve(**where)
    return str(info.value)


def test_defaults_with_nothing_configured() -> None:
    settings = _resolve()
    assert settings == Settings()
    assert settings.mode is None
    assert settings.report == "short"
    assert settings.key_prefix == DEFAULT_PREFIX
    assert settings.keep_bundles == 3
    assert settings.signing_key is None
    assert settings.effective_mode is None


def test_every_option_has_three_distinct_spellings() -> None:
    for option in OPTIONS:
        assert option.cli.startswith("--compile-cache")
        assert option.ini == option.cli[2:].replace("-", "_")
        assert option.env == "PYTEST_COMPILECACHE_" + option.name.upper()
        # A store backend's option has no field of its own: unset, it is not among Settings.store_options.
        if option.name in STORE_OPTIONS:
            assert option.default is None and option.name not in dict(Settings().store_options)
        else:
            assert option.default == getattr(Settings(), option.name), option.name
    assert (
        len({o.cli for o in OPTIONS}) == len({o.ini for o in OPTIONS}) == len({o.env for o in OPTIONS}) == len(OPTIONS)
    )


@pytest.mark.parametrize(
    ("cli", "ini", "env", "expected"),
    [
        ("isolated", "disabled", "shared", "isolated"),
        (None, "disabled", "shared", "disabled"),
        (None, None, "shared", "shared"),
        (None, "", "isolated", "isolated"),  # an empty ini value counts as unset
        ("", None, "isolated", None),  # an empty command-line value unsets it: ini and env are not read
    ],
)
def test_cli_beats_ini_beats_env(cli: str | None, ini: str | None, env: str, expected: str | None) -> None:
    settings = _resolve(cli={"mode": cli}, ini={"mode": ini}, env={"mode": env})
    assert settings.mode == expected


def test_precedence_is_per_option() -> None:
    settings = _resolve(
        cli={"report": "full"},
        ini={"keep_bundles": "5", "report": "none"},
        env={"keep_bundles": "9", "key_salt": "from-env", "report": "none"},
    )
    assert (settings.report, settings.keep_bundles, settings.key_salt) == ("full", 5, "from-env")


def test_an_unset_cli_switch_does_not_hide_the_environment() -> None:
    # argparse's store_true cannot say "false": an absent switch (None or False) falls through to ini/env.
    assert _resolve(cli={"keep": None}, env={"keep": "1"}).keep is True
    assert _resolve(cli={"readonly": False}, ini={"readonly": "true"}).readonly is True
    assert _resolve(cli={"strict": True}, env={"strict": "0"}).strict is True


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("1", True), ("true", True), ("YES", True), (" on ", True), ("0", False), ("false", False), ("off", False)],
)
def test_flags_from_the_environment(raw: str, expected: bool) -> None:
    assert _resolve(env={"readonly": raw}).readonly is expected


def test_choices_are_normalised() -> None:
    assert _resolve(env={"mode": " Shared "}).mode == "shared"
    assert _resolve(ini={"report": "FULL"}).report == "full"


@pytest.mark.parametrize(
    ("where", "spelling"),
    [("cli", "--compile-cache"), ("ini", "compile_cache"), ("env", "PYTEST_COMPILECACHE_MODE")],
)
def test_errors_name_the_option_as_the_user_spelled_it(where: str, spelling: str) -> None:
    message = _error(**{where: {"mode": "sometimes"}})
    assert message.startswith(f"{spelling}: ")
    assert "'sometimes'" in message
    assert "shared, isolated, disabled" in message


def test_a_bad_lower_priority_value_is_not_validated_when_overridden() -> None:
    assert _resolve(cli={"mode": "shared"}, env={"mode": "bogus"}).mode == "shared"


@pytest.mark.parametrize(
    ("name", "raw", "needle"),
    [
        ("keep", "maybe", "expected a boolean"),
        ("min_hit_rate", "most", "expected a number between 0 and 1"),
        ("min_hit_rate", "1.5", "must be between 0 and 1"),
        ("min_hit_rate", "-0.1", "must be between 0 and 1"),
        ("keep_bundles", "three", "expected a whole number"),
        ("keep_bundles", "0", "must be at least 1"),
        ("max_size", "lots", "expected a size like 500M or 2G"),
        ("max_size", "0", "must be positive"),
        ("key_prefix", "has/slash", "use 1-200 characters"),
        ("key_prefix", "x" * 201, "use 1-200 characters"),
        ("key_prefix", ".hidden", "must not start with '.'"),
        ("store_timeout", "0", "must be more than 0 and at most 86400 seconds"),
        ("store_timeout", "nan", "must be more than 0"),
        ("store_timeout", "soon", "expected a number of seconds"),
        ("run_suffix", "a b", "use 1-200 characters"),
        ("redis", "http://localhost:6379", "expected redis://host:port/db"),
        ("redis", "redis://", "expected redis://host:port/db"),
        ("redis", "redis://[::1", "expected redis://host:port/db"),  # urlsplit raises on these
        ("redis", "redis://u:pw@[zz]/0", "expected redis://host:port/db"),
        ("report", "verbose", "choose from short, full, none"),
        ("summary", "on", "choose from auto, off"),
        ("restore", "never", "choose from auto, skip"),
        ("explain", "yes", "choose from on, off"),
        ("explain", "1", "choose from on, off"),
        ("pgo", "yes", "choose from on, off"),
    ],
)
def test_validation_errors(name: str, raw: str, needle: str) -> None:
    message = _error(env={name: raw})
    assert message.startswith(BY_NAME[name].env + ": ")
    assert needle in message
    cli_message = _error(cli={name: raw})
    assert cli_message.startswith(BY_NAME[name].cli + ": ")


def test_pgo_is_off_unless_switched_on_and_then_the_session_is_not_quiet() -> None:
    assert _resolve().pgo is False and _resolve().quiet
    assert _resolve(env={"pgo": "on"}).pgo is True and not _resolve(env={"pgo": "on"}).quiet
    assert _resolve(cli={"pgo": "off"}, env={"pgo": "on"}).pgo is False


def test_explain_is_on_unless_switched_off_cli_over_ini_over_env() -> None:
    assert _resolve().explain is True
    assert _resolve(env={"explain": "off"}).explain is False
    assert _resolve(ini={"explain": "on"}, env={"explain": "off"}).explain is True
    assert _resolve(cli={"explain": " OFF "}, ini={"explain": "on"}).explain is False
    assert _resolve(cli={"explain": "on"}, env={"explain": "off"}).explain is True


def test_typed_ini_values_from_native_toml() -> None:
    """pytest 9's ``[tool.pytest]`` hands TOML values over typed: each means what its string would, and a
    TOML ``false`` is a value given (it hides a lower-priority ``true``), not an unset option."""
    typed = _resolve(ini={"keep": True, "explain": False, "pgo": True, "min_hit_rate": 0.5, "keep_bundles": 2})
    assert (typed.keep, typed.explain, typed.pgo, typed.min_hit_rate, typed.keep_bundles) == (True, False, True, 0.5, 2)
    assert _resolve(ini={"keep": False}, env={"keep": "1"}).keep is False
    assert _resolve(ini={"max_size": 1024}, cli={"mode": "shared"}).max_size == 1024
    assert "compile_cache_keep_bundles: must be at least 1" in _error(ini={"keep_bundles": 0})


def test_the_ini_options_are_strings_where_pytest_takes_no_union(monkeypatch: pytest.MonkeyPatch) -> None:
    """pytest before 9.2 takes no union type in ``addini`` (it asserts, and under ``python -O`` registers what
    its ``getini`` then refuses): every option is registered as a string there."""
    from pytest_compilecache import plugin

    monkeypatch.setattr(pytest, "version_tuple", (9, 1, 0))

    class OldParser:
        def __init__(self) -> None:
            self.inis: dict[str, Any] = {}

        def getgroup(self, *args: Any) -> Any:
            return self

        def addoption(self, *args: Any, **kwargs: Any) -> None:
            pass

        def addini(self, name: str, help: str, type: Any = None, default: Any = None) -> None:
            assert type is None, "type must be one of string, paths, pathlist, args, linelist, bool"
            self.inis[name] = type

    parser = OldParser()
    plugin.pytest_addoption(parser)  # type: ignore[arg-type]
    assert set(parser.inis) == {option.ini for option in OPTIONS} and set(parser.inis.values()) == {None}


def test_options_that_change_nothing_as_configured_are_named() -> None:
    from pytest_compilecache.settings import unused_options

    assert unused_options(_resolve(cli={"mode": "isolated", "keep": True, "store": "/s", "readonly": True})) == []
    assert unused_options(_resolve(ini={"mode": "shared", "keep_bundles": "3", "store_timeout": "300"})) == []
    idle = _resolve(
        cli={"mode": "shared", "keep": True, "readonly": True},
        ini={"keep_bundles": "2", "s3_endpoint": "http://127.0.0.1:9000"},
        env={"run_suffix": "run-1"},
    )
    assert unused_options(idle) == [
        "--compile-cache-keep: not used, only an isolated session's dir is removed at its end",
        "--compile-cache-readonly, compile_cache_keep_bundles, compile_cache_s3_endpoint: not used without a store "
        "(--compile-cache-store)",
    ]
    # The Action exports READONLY and RUN_SUFFIX for every pull request, where an ini file may name the store.
    assert unused_options(_resolve(cli={"mode": "shared"}, env={"readonly": "true", "keep": "1"})) == []


def test_key_parts_too_long_for_a_directory_stores_file_names_fail_at_start() -> None:
    """Every save would fail on "File name too long": said at start-up, naming the option; a bucket takes them."""
    assert "compile_cache_key_prefix and compile_cache_run_suffix: too long for a directory store" in _error(
        cli={"store": "/tmp/s"}, ini={"key_prefix": "p" * 200, "run_suffix": "r" * 31}
    )
    assert "--compile-cache-key-prefix and --compile-cache-run-suffix: too long" in _error(
        cli={"store": "file:///tmp/s", "key_prefix": "p" * 100, "run_suffix": "r" * 131}
    )
    assert _resolve(cli={"store": "/tmp/s", "key_prefix": "p" * 200, "run_suffix": "12345678901-1"}).key_prefix
    assert _resolve(cli={"store": "/tmp/s", "key_prefix": "p" * 200, "run_suffix": "r" * 60, "readonly": True})
    assert _resolve(cli={"store": "s3://bucket/p", "key_prefix": "p" * 200, "run_suffix": "r" * 200}).store


def test_valid_values_are_parsed() -> None:
    settings = _resolve(
        cli={
            "mode": "shared",
            "min_hit_rate": "0.9",
            "keep_bundles": "7",
            "max_size": "500M",
            "key_prefix": "proj.v2_x-1",
        },
        env={"redis": "rediss://cache.internal:6380/2", "run_suffix": "123-1", "dir": "  /tmp/x  "},
    )
    assert settings.min_hit_rate == 0.9
    assert settings.keep_bundles == 7
    assert settings.max_size == 500 * 1024**2
    assert settings.key_prefix == "proj.v2_x-1"
    assert settings.redis == "rediss://cache.internal:6380/2"
    assert settings.run_suffix == "123-1"
    assert settings.dir == "/tmp/x"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("1024", 1024),
        ("1k", 1024),
        ("500M", 500 * 1024**2),
        ("500 mb", 500 * 1024**2),
        ("2G", 2 * 1024**3),
        ("2GiB", 2 * 1024**3),
        ("1.5GiB", 3 * 1024**3 // 2),
        ("1T", 1024**4),
    ],
)
def test_parse_size(raw: str, expected: int) -> None:
    assert parse_size("--compile-cache-max-size", raw) == expected


@pytest.mark.parametrize("raw", ["", "M", "-1", "1e3", "2 gigs", "5X", "0.0001K", "9" * 400, "2000T"])
def test_parse_size_rejects(raw: str) -> None:
    with pytest.raises(ConfigError, match=r"^compile_cache_max_size: "):
        parse_size("compile_cache_max_size", raw)


@pytest.mark.parametrize("url", ["http://127.0.0.1:9000", "https://s3.example.com", "http://[::1]:9000/"])
def test_s3_endpoints_accepted(url: str) -> None:
    assert _resolve(cli={"s3_endpoint": url}).store_options == (("s3_endpoint", url),)


@pytest.mark.parametrize(
    "url", ["http://[::1", "http://a b:9000", "http://:80", "https://x:abc", "http://h:99999", "ftp://h", "h:9000"]
)
def test_bad_s3_endpoints_fail_naming_the_option(url: str) -> None:
    # Each would otherwise be a traceback at start-up, or a warning in every session that never restores.
    with pytest.raises(ConfigError, match=r"^--compile-cache-s3-endpoint: expected an http\(s\)://"):
        _resolve(cli={"s3_endpoint": url})


@pytest.mark.parametrize("url", ["http://AKIAX:hunter2@127.0.0.1:9000", "https://:hunter2@s3.example.com"])
def test_credentials_in_an_s3_endpoint_are_refused_unrepeated(url: str) -> None:
    # A store's warnings name its endpoint: a secret in it would reach every log.
    with pytest.raises(ConfigError, match=r"^--compile-cache-s3-endpoint: credentials in the URL") as info:
        _resolve(cli={"s3_endpoint": url})
    assert "hunter2" not in str(info.value)


@pytest.mark.parametrize(
    "url", ["redis://localhost", "redis://127.0.0.1:6379", "redis://cache:6379/0", "rediss://h/3/"]
)
def test_redis_urls_accepted(url: str) -> None:
    assert _resolve(cli={"redis": url}).redis == url


def test_a_redis_url_may_carry_redis_pys_own_options() -> None:
    pytest.importorskip("redis")
    url = "rediss://cache:6380/0?socket_timeout=30&ssl_ca_certs=/etc/ca.pem"
    assert _resolve(cli={"redis": url}).redis == url
    for query, needle in (("socket_timeout=soon", "socket_timeout"), ("sockettimeout=3", "sockettimeout")):
        message = _error(cli={"redis": f"redis://:s3cret@cache:6379/0?{query}"})
        assert message.startswith("--compile-cache-redis: an option redis-py does not take"), message
        assert needle in message and "s3cret" not in message


def test_store_implies_shared_mode() -> None:
    assert _resolve(env={"store": "/srv/cache"}).effective_mode == "shared"
    assert _resolve(env={"store": "/srv/cache", "mode": "isolated"}).effective_mode == "isolated"


def test_store_with_disabled_mode_is_an_error() -> None:
    message = _error(cli={"mode": "disabled", "store": "/srv/cache"})
    assert "--compile-cache-store" in message
    assert "disabled" in message


def test_a_size_cap_outside_shared_mode_is_an_error() -> None:
    # Only a shared dir is trimmed: an isolated dir is removed at the end, a disabled or unmanaged one is not ours.
    assert _error(cli={"mode": "isolated", "max_size": "1K"}) == (
        "--compile-cache-max-size: applies only to shared mode; not to --compile-cache=isolated"
    )
    assert _error(ini={"max_size": "1K"}, env={"mode": "disabled"}) == (
        "compile_cache_max_size: applies only to shared mode; not to PYTEST_COMPILECACHE_MODE=disabled"
    )
    assert "no mode is set (statistics only)" in _error(cli={"max_size": "1K"})
    assert _resolve(cli={"max_size": "1K"}, env={"store": "/srv/store"}).max_size == 1024  # a store implies shared
    assert _resolve(cli={"max_size": "1K", "dir": "/srv/cache"}).max_size == 1024


def test_redis_without_the_redis_package_is_an_error_like_s3_without_boto3(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from pytest_compilecache.stores import open_store

    monkeypatch.setitem(sys.modules, "redis", None)  # what find_spec and import see when it is not installed
    monkeypatch.setitem(sys.modules, "boto3", None)
    assert _error(env={"redis": "redis://u:secret@host:6379/0"}) == (
        "PYTEST_COMPILECACHE_REDIS: needs the 'redis' package (pip install 'pytest-compilecache[redis]')"
    )
    with pytest.raises(ConfigError) as info:
        open_store("s3://bucket/prefix")
    # The URL had the expected form: no "(expected ...)" after it, only what is missing.
    assert str(info.value) == "--compile-cache-store: needs the 'boto3' package (pip install 'pytest-compilecache[s3]')"


def test_signing_key_from_the_environment_only() -> None:
    assert _resolve(env={SIGNING_KEY_ENV: "s3cret"}).signing_key == b"s3cret"
    assert _resolve(env={SIGNING_KEY_ENV: ""}).signing_key is None
    assert "signing_key" not in BY_NAME  # never on the command line or in a committed ini file


def test_settings_are_frozen() -> None:
    settings = _resolve()
    with pytest.raises(AttributeError):
        settings.mode = "shared"  # type: ignore[misc]


def test_an_empty_command_line_value_unsets_the_option() -> None:
    # --compile-cache-store= overrides a store the environment or the ini file sets (it used to fall through).
    settings = _resolve(cli={"store": "", "json": ""}, ini={"json": "from-ini.json"}, env={"store": "/srv/store"})
    assert (settings.store, settings.json) == (None, None)
    assert _resolve(cli={"mode": ""}, env={"mode": "shared"}).mode is None


def test_errors_raised_elsewhere_are_respelled_as_the_user_gave_the_option() -> None:
    # cachedir and stores name an option by its flag; the plugin names it as the user wrote it.
    settings = _resolve(ini={"store": "/srv/store"}, env={"dir": "/srv/cache"}, cli={"json": "r.json"})
    assert [settings.spelling(name) for name in ("store", "dir", "json", "mode")] == [
        "compile_cache_store",
        "PYTEST_COMPILECACHE_DIR",
        "--compile-cache-json",
        "--compile-cache",
    ]
    respelled = settings.respell(ConfigError("--compile-cache-dir: /srv/cache is not a directory"), "dir")
    assert str(respelled) == "PYTEST_COMPILECACHE_DIR: /srv/cache is not a directory"
    untouched = ConfigError("--compile-cache-json: r.json is a directory")
    assert settings.respell(untouched, "json") is untouched
    other = ConfigError("something else: --compile-cache-dir")
    assert settings.respell(other, "dir") is other


def test_a_relative_path_from_the_ini_file_is_relative_to_the_rootdir_and_tilde_is_expanded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As pytest's own ``cache_dir``: the same ini file gives the same dirs wherever pytest starts. A path
    given on the command line or in the environment stays relative to the current dir; a URL is no path."""
    monkeypatch.setenv("HOME", "/home/u")

    def resolved(**given: Mapping[str, Any]) -> Settings:
        ini = {BY_NAME[name].ini: value for name, value in given.get("ini", {}).items()}
        env = {BY_NAME[name].env: value for name, value in given.get("env", {}).items()}
        return resolve(dict(given.get("cli", {})), ini.get, env, ini_base="/project")

    from_ini = resolved(ini={"dir": ".cc", "json": "out/r.json", "store": "bundles"})
    assert (from_ini.dir, from_ini.json, from_ini.store) == ("/project/.cc", "/project/out/r.json", "/project/bundles")
    absolute = resolved(ini={"store": "s3://b/p", "dir": "/abs"})
    assert (absolute.dir, absolute.store) == ("/abs", "s3://b/p")
    for url in ("file:relative", "gs:bucket/prefix", "s3:/bucket"):  # a URL, mistyped or not, is opened as given
        assert resolved(ini={"store": url}).store == url
    assert resolved(ini={"json": "~/r.json"}).json == "/home/u/r.json"
    for given in ({"cli": {"dir": ".cc", "json": "r.json"}}, {"env": {"dir": ".cc", "json": "r.json"}}):
        settings = resolved(**given)
        assert (settings.dir, settings.json) == (".cc", "r.json")
    assert resolved(cli={"json": "~/r.json"}).json == "/home/u/r.json"
