"""remote.py: the environment that turns torch's Redis caches on, redaction, and a check that fails fast."""

from __future__ import annotations

import socket
import sys
import threading
from typing import Any

import pytest

from pytest_compilecache import remote

SWITCHES = (
    "TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE",
    "TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE",
    "TORCHINDUCTOR_AUTOTUNE_REMOTE_CACHE",
)


def test_redis_env_turns_on_every_remote_cache() -> None:
    env = remote.redis_env("redis://cache.internal:6380/2")
    assert env == {
        **dict.fromkeys(SWITCHES, "1"),
        "TORCHINDUCTOR_REDIS_URL": "redis://cache.internal:6380/2?socket_timeout=5.0&socket_connect_timeout=5.0",
        "TORCHINDUCTOR_REDIS_HOST": "cache.internal",
        "TORCHINDUCTOR_REDIS_PORT": "6380",
    }
    assert all(isinstance(value, str) for value in env.values())


def test_redis_env_defaults_the_port() -> None:
    env = remote.redis_env("rediss://cache.internal")
    assert (env["TORCHINDUCTOR_REDIS_HOST"], env["TORCHINDUCTOR_REDIS_PORT"]) == ("cache.internal", "6379")


def test_redis_env_keeps_the_password_for_torch_only_in_the_url() -> None:
    env = remote.redis_env("redis://user:s3cret@cache:6379/0")
    assert env["TORCHINDUCTOR_REDIS_URL"].startswith("redis://user:s3cret@cache:6379/0?")
    assert env["TORCHINDUCTOR_REDIS_HOST"] == "cache"
    assert not any("s3cret" in value for name, value in env.items() if name != "TORCHINDUCTOR_REDIS_URL")


def test_torch_gets_timeouts_unless_the_url_sets_them() -> None:
    # torch builds its own client from TORCHINDUCTOR_REDIS_URL: without a socket timeout (redis-py before 6)
    # a Redis that stops answering holds a compile forever.
    import redis

    url = remote.redis_env("redis://:pw@cache:6379/2?socket_timeout=1&health_check_interval=3")[
        "TORCHINDUCTOR_REDIS_URL"
    ]
    kwargs = redis.Redis.from_url(url).connection_pool.connection_kwargs
    assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"]) == (1.0, remote.REDIS_OP_TIMEOUT_S)
    assert (kwargs["password"], kwargs["db"], kwargs["health_check_interval"]) == ("pw", 2, 3)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://[::1", "redis://***"),  # urlsplit raises on these: the message about them must not
        ("redis://u:s3cret@[zz]/0", "redis://***"),
        ("redis://u:s3cret@cache:99x/0", "redis://***"),
        ("redis://user:s3cret@cache:6379/0", "redis://user:***@cache:6379/0"),
        ("redis://:s3cret@cache/1", "redis://:***@cache/1"),
        ("rediss://cache:6380/0", "rediss://cache:6380/0"),
        ("redis://user@cache:6379", "redis://user@cache:6379"),
        # redis-py's own query options for secrets
        ("redis://cache:1/0?socket_timeout=3&password=s3cret", "redis://cache:1/0?socket_timeout=3&password=***"),
        ("redis://cache:1/0?password=s3&cr#et&x=1", "redis://cache:1/0?password=***"),  # to the end: & # unescaped
        # an @ after ? or #: in the query, or in a password with an unescaped ? or #: nothing told apart
        ("redis://cache:6379/0?password=abc@defs3cret", "redis://***"),
        ("redis://:pw@cache:6379/0?ssl_password=s3@cret", "redis://***"),
        ("redis://:ab?s3cret@cache:6379/0", "redis://***"),
        # a name redis-py decodes, a ; separator, a fragment, no scheme where the only :// is in the query
        ("redis://cache:1/0?p%61ssword=s3cret", "redis://cache:1/0?p%61ssword=***"),
        ("redis://cache/0?db=0;password=s3cret", "redis://cache/0?db=0;password=***"),
        ("redis://cache/0#password=s3cret", "redis://cache/0#***"),
        ("redis:/u:s3cret@cache/0?ssl_ca_certs=file:///ca", "***"),
        ("rediss://cache/0?ssl_password=s3cret", "rediss://cache/0?ssl_password=***"),
        # a password with an unescaped / # ? (an Azure access key is base64): another URL, or none
        ("redis://:12/s3cret@cache:6379/0", "redis://:***@cache:6379/0"),
        ("redis://:ab#s3cret@cache:6379/0", "redis://***"),
        ("redis://u/x:s3cret@cache/0", "redis://***:***@cache/0"),
    ],
)
def test_redacted(url: str, shown: str) -> None:
    assert remote.redacted(url) == shown
    assert "s3cret" not in remote.redacted(url)


def _closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on: bound (so the kernel picked a free one), then closed."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_check_redis_against_a_closed_port_gives_a_reason() -> None:
    pytest.importorskip("redis")
    url = f"redis://127.0.0.1:{_closed_port()}/0"
    result: list[str | None] = []
    worker = threading.Thread(target=lambda: result.append(remote.check_redis(url)), daemon=True)
    worker.start()
    worker.join(timeout=60)  # hang guard only; the check itself is bounded by REDIS_TIMEOUT_S
    assert not worker.is_alive(), "check_redis hung"
    [reason] = result
    assert reason is not None
    assert reason.startswith("unreachable (ConnectionError: ")
    assert "\n" not in reason
    assert len(reason) <= len("unreachable (ConnectionError: )") + 120


def test_check_redis_bounds_its_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Also where the URL sets torch's timeouts (the docs' example: ``?socket_timeout=30``): redis-py lets the
    URL's options win over keywords, so the check's client is built from the URL without them."""
    redis = pytest.importorskip("redis")
    assert 0 < remote.REDIS_TIMEOUT_S <= 2.0
    made: list[Any] = []
    real = redis.Redis.from_url

    def from_url(url: str, **kwargs: Any) -> Any:
        made.append(real(url, **kwargs))  # the client the check would ping, never asked
        raise redis.exceptions.ConnectionError("not asked")

    monkeypatch.setattr(redis.Redis, "from_url", from_url)
    remote.check_redis("redis://127.0.0.1:1/0?socket_timeout=30&socket_connect_timeout=30&health_check_interval=3")
    kwargs = made[0].connection_pool.connection_kwargs
    assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"]) == (remote.REDIS_TIMEOUT_S,) * 2
    assert kwargs["health_check_interval"] == 3  # the URL's other options are kept


def test_check_redis_without_the_client_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "redis", None)  # makes `import redis` raise ImportError
    reason = remote.check_redis("redis://127.0.0.1:6379/0")
    assert reason is not None
    assert "pip install 'pytest-compilecache[redis]'" in reason
