"""The plugin against real servers: S3 bundles (moto server) and torch's Redis remote cache (redis-server).

Each session runs in a subprocess through pytester, compiling a tiny function (a matmul) for real on the CPU.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.servers import SilentServer
from tests.servers import free_port

pytestmark = [pytest.mark.slow, pytest.mark.integration]

# A matmul: TorchInductor calls an extern kernel, so the FX graph is cached (locally and in Redis) without a
# C++ build; the remote and store paths are what these tests are about.
SUITE = """
import torch

def test_compiled():
    fn = torch.compile(lambda x, w: x @ w)
    x, w = torch.randn(8, 4), torch.randn(4, 2)
    torch.testing.assert_close(fn(x, w), x @ w)
"""


def _session(pytester: pytest.Pytester, name: str, *args: str) -> tuple[Any, dict[str, Any]]:
    report = pytester.path / f"{name}.json"
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--compile-cache=isolated", f"--compile-cache-json={report}", *args
    )
    return result, json.loads(report.read_text())


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeini("[pytest]\nfilterwarnings = ignore::DeprecationWarning\n")
    pytester.makepyfile(test_suite=SUITE)
    return pytester


@pytest.mark.torch_independent  # our store; torch loads the bundle as from a directory store
def test_s3_bundle_round_trip(suite: pytest.Pytester, s3_bucket: Any, aws_env: dict[str, str]) -> None:
    url = f"s3://{s3_bucket.name}/ci/cache"
    endpoint = f"--compile-cache-s3-endpoint={s3_bucket.endpoint_url}"
    cold, first = _session(suite, "cold", f"--compile-cache-store={url}", endpoint)
    assert cold.ret == 0
    assert first["totals"]["misses"] >= 1 and first["save"]["outcome"] == "saved"
    keys = [o["Key"] for o in s3_bucket.client.list_objects_v2(Bucket=s3_bucket.name).get("Contents", [])]
    assert keys == [f"ci/cache/{first['save']['key']}.bundle"]

    warm, second = _session(suite, "warm", f"--compile-cache-store={url}", endpoint, "--compile-cache-readonly")
    assert warm.ret == 0
    assert second["restore"]["outcome"] == "partial"
    assert second["restore"]["key"] == first["save"]["key"]
    assert second["totals"]["misses"] == 0 and second["totals"]["hits"] >= 1
    assert second["save"] is None  # read-only: nothing new in the bucket
    assert len(s3_bucket.client.list_objects_v2(Bucket=s3_bucket.name)["Contents"]) == 1


@pytest.mark.torch_independent  # our store's outage: torch compiles cold
def test_s3_down_is_one_warning_and_a_cold_compile(suite: pytest.Pytester, aws_env: dict[str, str]) -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"
    store = "--compile-cache-store=s3://bucket/x"
    # A cold run caused by the store being down does not trip the hit-rate guard either.
    result, data = _session(
        suite, "down", store, f"--compile-cache-s3-endpoint={endpoint}", "--compile-cache-min-hit-rate=0.9"
    )
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*passed*"])
    warnings = [line for line in result.outlines if line.startswith("CompileCacheWarning:")]
    assert len(warnings) == 1, warnings  # the restore's; the save is skipped rather than failing again
    assert data["restore"]["outcome"] == "error" and data["totals"]["misses"] >= 1
    skipped = "the store failed at the restore; nothing saved"
    assert (data["save"]["outcome"], data["save"]["message"]) == ("skipped", skipped)

    # A store that accepts and never answers: S3's timeouts alone would wait 2 x 10 s per request; the
    # store budget gives up after 1 s, with one warning, and the session goes on cold.
    with SilentServer() as silent:
        slow, data = _session(
            suite,
            "slow",
            store,
            f"--compile-cache-s3-endpoint={silent.endpoint_url}",
            "--compile-cache-store-timeout=1",
        )
    assert slow.ret == 0
    warnings = [line for line in slow.outlines if line.startswith("CompileCacheWarning:")]
    assert len(warnings) == 1 and "did not finish within 1 s (list)" in warnings[0], warnings
    assert (data["restore"]["outcome"], data["save"]["outcome"]) == ("error", "skipped")
    # That an "error" restore fails a --compile-cache-strict session, through the whole plugin:
    # tests/integration/test_plugin_faults.py (a broken store); at unit level, tests/unit/test_session.py.


def test_redis_shares_graphs_between_sessions(suite: pytest.Pytester, redis_server: Any) -> None:
    import redis

    redis.Redis.from_url(redis_server.url).flushdb()
    url = f"--compile-cache-redis={redis_server.url}"
    first, cold = _session(suite, "first", url)
    assert first.ret == 0
    assert cold["totals"]["remote"]["fx_miss"] >= 1 and cold["totals"]["remote"]["fx_hit"] == 0
    # A second session with another empty local dir: every FX graph comes from Redis.
    second, warm = _session(suite, "second", url)
    assert second.ret == 0
    assert warm["cache_dir"] != cold["cache_dir"]
    assert warm["totals"]["misses"] == 0
    assert warm["totals"]["remote"]["fx_hit"] == warm["totals"]["hits"] >= 1
    second.stdout.fnmatch_lines(["compile cache: * remote * hit/0 miss*"])
    assert any(key.startswith(b"pt2:fx-graph") for key in redis.Redis.from_url(redis_server.url).scan_iter("pt2:*"))


def test_a_redis_that_answers_with_an_error_is_refused_not_unreachable(redis_server: Any) -> None:
    from pytest_compilecache import remote

    assert remote.check_redis(redis_server.url) is None
    no_such_db = redis_server.url.rsplit("/", 1)[0] + "/99999"
    reason = remote.check_redis(no_such_db)
    assert reason is not None and reason.startswith("refused: ResponseError: "), reason
    # The URL's own options reach the client: an option redis-py does not take is bad input, caught at start-up.
    assert remote.url_options_problem(redis_server.url + "?socket_timeout=1") is None
    assert remote.check_redis(redis_server.url + "?socket_timeout=1") is None


def test_redis_down_is_one_warning(suite: pytest.Pytester) -> None:
    result, data = _session(suite, "down", f"--compile-cache-redis=redis://:hunter2@127.0.0.1:{free_port()}/0")
    assert result.ret == 0
    warnings = [line for line in result.outlines if line.startswith("CompileCacheWarning:")]
    assert len(warnings) == 1 and "unreachable" in warnings[0]
    result.stdout.fnmatch_lines(["compile cache: isolated:*, redis redis://:***@127.0.0.1:*/0 (ping failed, off)"])
    assert "hunter2" not in result.stdout.str() + result.stderr.str()
    assert data["totals"]["misses"] >= 1 and data["totals"]["remote"]["fx_hit"] == 0


def test_a_redis_failing_mid_session_is_one_warning_not_a_failed_test(
    suite: pytest.Pytester, redis_server: Any
) -> None:
    """Redis answers the start-up PING, then refuses every write (full, no eviction; a paused primary, a
    read-only replica or a timeout do the same to torch's put). torch's Redis backend catches only
    ConnectionError, so without the plugin's guard the compile raised and the test failed."""
    import redis

    client = redis.Redis.from_url(redis_server.url)
    client.flushdb()
    before = client.config_get("maxmemory*")
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", 1)
    try:
        result, data = _session(suite, "full", f"--compile-cache-redis={redis_server.url}")
    finally:
        client.config_set("maxmemory", str(before["maxmemory"]))
        client.config_set("maxmemory-policy", str(before["maxmemory-policy"]))
    assert result.ret == 0, result.stdout.str()[-4000:]
    result.assert_outcomes(passed=1)
    warnings = [line for line in result.outlines if line.startswith("CompileCacheWarning:")]
    assert len(warnings) == 1, warnings
    assert "redis remote cache failed mid-session (put: OutOfMemoryError" in warnings[0], warnings
    # The first error switches the process's remote caches off: the later puts (torch makes a backend per
    # cache and per compile) are skipped, not each refused again after a round trip.
    assert "errors in all" not in warnings[0], warnings
    assert data["warnings"] == [warnings[0].removeprefix("CompileCacheWarning: ")]
    assert data["totals"]["misses"] >= 1  # compiled with the local cache dir


@pytest.mark.torch_independent  # option errors, before torch
def test_bad_urls_fail_at_start(suite: pytest.Pytester) -> None:
    for option, needle in (
        ("--compile-cache-redis=http://nope", "--compile-cache-redis"),
        ("--compile-cache-store=ftp://x/y", "--compile-cache-store"),
        ("--compile-cache-store=s3://", "--compile-cache-store"),
        ("--compile-cache-s3-endpoint=localhost:9000", "--compile-cache-s3-endpoint"),
    ):
        result = suite.runpytest_subprocess("-p", "no:cacheprovider", option)
        assert result.ret == pytest.ExitCode.USAGE_ERROR, option
        assert needle in result.stderr.str(), (option, result.stderr.str())
        assert not list(Path(suite.path).glob("*.json"))
