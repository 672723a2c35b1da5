"""S3Store against real server processes: moto's S3 over HTTP, a port with nothing listening, a silent server.

Failure tests assert behaviour (a one-line StoreError naming the cause; how many connections a client
made) and keep a generous wall-clock bound only as a hang guard, never as the thing being measured.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
import uuid
from collections.abc import Callable
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_compilecache import ConfigError
from pytest_compilecache import StoreError
from pytest_compilecache.stores import Store
from pytest_compilecache.stores.base import ObjectTooLarge
from pytest_compilecache.stores.s3 import S3Store
from tests.bundles import find_latest
from tests.contract.store_contract import StoreContract
from tests.integration.conftest import TEST_REGION
from tests.integration.conftest import S3Bucket
from tests.servers import MotoServer
from tests.servers import RedisServer
from tests.servers import SilentServer
from tests.servers import free_port
from tests.servers import require_binary_or_fail
from tests.servers import start_moto_server

pytestmark = pytest.mark.integration

MiB = 1024 * 1024
# A hang guard, not a benchmark: every failure below is configured to fail in about a second.
HANG_GUARD_S = 20.0

Operation = Callable[[S3Store, Path], object]
OPERATIONS: dict[str, Operation] = {
    "get": lambda store, tmp: store.get("k1", tmp / "dest.bundle"),
    "put": lambda store, tmp: store.put("k1", _write(tmp / "src.bundle", b"payload")),
    "list": lambda store, tmp: store.list(""),
    "find_latest": lambda store, tmp: find_latest(store, "k"),
    "delete": lambda store, tmp: store.delete("k1"),
}


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _fails_fast(operation: Operation, store: S3Store, tmp_path: Path) -> str:
    """Run ``operation``, which must raise StoreError within the hang guard; return the message."""
    started = time.monotonic()
    with pytest.raises(StoreError) as info:
        operation(store, tmp_path)
    elapsed = time.monotonic() - started
    assert elapsed < HANG_GUARD_S, f"took {elapsed:.1f} s"
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{store.location}: ")
    return message


def _no_leftovers(directory: Path) -> None:
    """A failed get leaves neither ``dest`` nor a temp file behind."""
    assert [p.name for p in directory.iterdir() if "dest" in p.name] == []


# -- configuration: no server needed ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "bucket", "prefix", "location"),
    [
        ("s3://my-bucket", "my-bucket", "", "s3://my-bucket"),
        ("s3://my-bucket/", "my-bucket", "", "s3://my-bucket"),
        ("s3://my.bucket/ci/compile-cache/", "my.bucket", "ci/compile-cache", "s3://my.bucket/ci/compile-cache"),
    ],
)
def test_from_url_parses_bucket_and_prefix(url: str, bucket: str, prefix: str, location: str) -> None:
    store = S3Store.from_url(url)
    assert (store.bucket, store.prefix, store.location) == (bucket, prefix, location)


@pytest.mark.parametrize(
    "url",
    [
        "s3:/bucket",
        "https://bucket/prefix",
        "s3://",
        "s3://Bad_Bucket/x",
        "s3://ab",
        "s3://key:secret@bucket/x",
        "s3://bucket:9000/x",
        "s3://bucket/x?versionId=1",
        "s3://bucket/a//b",
        "s3://bucket/a/../b",
    ],
)
def test_from_url_rejects_malformed_urls_naming_the_option(url: str) -> None:
    with pytest.raises(ConfigError, match="--compile-cache-store"):
        S3Store.from_url(url)


@pytest.mark.parametrize(
    "option", [{"connect_timeout": 0}, {"read_timeout": -1}, {"max_attempts": 0}, {"multipart_threshold": 0}]
)
def test_from_url_rejects_nonsense_options(option: dict[str, float]) -> None:
    with pytest.raises(ConfigError, match="--compile-cache-store"):
        S3Store.from_url("s3://bucket/x", **option)


def test_creating_a_store_does_no_network_io() -> None:
    with SilentServer() as silent:
        S3Store.from_url("s3://bucket/x", endpoint_url=silent.endpoint_url)
        time.sleep(0.2)  # the listener thread polls every 0.1 s
        assert silent.connections == 0


# -- against moto ----------------------------------------------------------------------------------------


def _store(bucket: S3Bucket, prefix: str = "ci/cache", **options: object) -> S3Store:
    return S3Store.from_url(f"s3://{bucket.name}/{prefix}", endpoint_url=bucket.endpoint_url, **options)


class TestS3StoreContract(StoreContract):
    """The shared contract over HTTP against moto. ``set_modified`` is not provided: S3 sets LastModified
    itself (no API can change it), so the four clock-controlled ordering tests are removed from this
    class; the ordering of real server timestamps is covered by test_newer_object_wins_over_greater_key.
    """

    @pytest.fixture
    def make_store(self, s3_bucket: S3Bucket) -> Callable[[], Store]:
        # moto's threaded server answers HTTP 500 now and then under concurrent PUTs of one key (its
        # in-memory backend races; real S3 does not). botocore retries a 500 as it would against AWS; the
        # store's default of 2 attempts (fail fast when S3 is down) is too few for moto's bursts, so the
        # contract runs with botocore's own default budget plus headroom. What the tests prove (no partial
        # object, atomic replace, ordering) does not depend on the number of attempts.
        return lambda: _store(s3_bucket, max_attempts=6)

    # Not applicable here rather than skipped: they need a clock S3 does not let clients set.
    test_list_is_newest_first = None  # type: ignore[assignment]
    test_find_latest_picks_the_newest_under_the_prefix = None  # type: ignore[assignment]
    test_ties_are_broken_by_the_greatest_key = None  # type: ignore[assignment]
    test_prune_keeps_the_newest_n = None  # type: ignore[assignment]


def test_newer_object_wins_over_greater_key(s3_bucket: S3Bucket, tmp_path: Path) -> None:
    store = _store(s3_bucket)
    store.put("p-z", _write(tmp_path / "z", b"older"))
    older = store.list("p-z")[0].modified
    # LastModified has one-second resolution: re-put "p-a" until the server's clock has moved on.
    # Decided by the server's own timestamps, so it cannot flake; the deadline only guards a hang.
    deadline = time.monotonic() + HANG_GUARD_S
    while store.list("p-a")[:1] == [] or store.list("p-a")[0].modified <= older:
        assert time.monotonic() < deadline
        store.put("p-a", _write(tmp_path / "a", b"newer"))
        time.sleep(0.1)
    assert find_latest(store, "p-") == "p-a"
    assert [entry.key for entry in store.list("p-")] == ["p-a", "p-z"]


def test_round_trip_writes_prefix_key_bundle_with_sha256_checksum(s3_bucket: S3Bucket, tmp_path: Path) -> None:
    store = _store(s3_bucket)
    data = os.urandom(4096)
    store.put("linux-abc-1", _write(tmp_path / "src", data))

    name = "ci/cache/linux-abc-1.bundle"
    head = s3_bucket.client.head_object(Bucket=s3_bucket.name, Key=name, ChecksumMode="ENABLED")
    assert head["ContentLength"] == len(data)
    assert head["ChecksumSHA256"] == base64.b64encode(hashlib.sha256(data).digest()).decode()
    assert store.get("linux-abc-1", tmp_path / "dest.bundle") is True
    assert (tmp_path / "dest.bundle").read_bytes() == data
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dest.bundle", "src"]  # no temp file left


def test_multipart_above_threshold_round_trips(s3_bucket: S3Bucket, tmp_path: Path) -> None:
    # moto, like S3, refuses parts under 5 MiB except the last one: 6 MiB = one 5 MiB part + one 1 MiB part.
    store = _store(s3_bucket, multipart_threshold=5 * MiB)
    data = os.urandom(6 * MiB)
    store.put("big", _write(tmp_path / "src", data))

    head = s3_bucket.client.head_object(Bucket=s3_bucket.name, Key="ci/cache/big.bundle", ChecksumMode="ENABLED")
    assert head["ETag"].strip('"').endswith("-2")  # a multipart object's ETag is "<md5 of part md5s>-<parts>"
    assert head["ChecksumSHA256"]  # composite for multipart, so only its presence is checked
    assert store.get("big", tmp_path / "dest.bundle") is True  # > threshold: ranged GETs in parallel
    assert hashlib.sha256((tmp_path / "dest.bundle").read_bytes()).digest() == hashlib.sha256(data).digest()
    # With a limit the ranged parts land in a file that refuses to grow past it: the second part fails it.
    (tmp_path / "dest.bundle").unlink()
    with pytest.raises(ObjectTooLarge):
        store.get("big", tmp_path / "dest.bundle", limit=5 * MiB + 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]  # nothing kept, no temp file
    assert store.get("big", tmp_path / "dest.bundle", limit=6 * MiB) is True
    assert hashlib.sha256((tmp_path / "dest.bundle").read_bytes()).digest() == hashlib.sha256(data).digest()


def test_an_object_replaced_after_it_was_listed_is_bounded_by_the_limit(s3_bucket: S3Bucket, tmp_path: Path) -> None:
    # The listing said 10 bytes; by the time of the download the object is 1 MiB. The caller's limit (what
    # the listing allowed) holds: s3transfer's single GET is not pinned to an ETag, the bounded file is.
    store = _store(s3_bucket)
    store.put("k", _write(tmp_path / "src", b"0123456789"))
    (listed,) = store.list()
    store.put("k", _write(tmp_path / "src", os.urandom(MiB)))
    with pytest.raises(ObjectTooLarge):
        store.get("k", tmp_path / "dest.bundle", limit=listed.size)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_list_ignores_foreign_objects_and_other_prefixes(s3_bucket: S3Bucket, tmp_path: Path) -> None:
    store = _store(s3_bucket)
    store.put("k1", _write(tmp_path / "src", b"x"))
    for foreign in ("ci/cache/notes.txt", "ci/cache/sub/k2.bundle", "ci/cache/.hidden.bundle", "ci/other/k3.bundle"):
        s3_bucket.client.put_object(Bucket=s3_bucket.name, Key=foreign, Body=b"y")
    assert [entry.key for entry in store.list()] == ["k1"]
    assert _store(s3_bucket, "ci").list() == []  # "ci/cache/k1.bundle" is not a key directly under "ci"


@pytest.mark.parametrize("variable", ["AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"])
def test_endpoint_from_environment_is_honoured(
    variable: str, s3_bucket: S3Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(variable, s3_bucket.endpoint_url)
    store = S3Store.from_url(f"s3://{s3_bucket.name}/p")  # no endpoint_url: boto3 resolves it
    store.put("k1", _write(tmp_path / "src", b"via env"))
    assert find_latest(store, "k") == "k1"


@pytest.mark.parametrize("name", sorted(OPERATIONS))
def test_missing_bucket_is_a_store_error_and_is_never_created(name: str, s3_bucket: S3Bucket, tmp_path: Path) -> None:
    missing = f"missing-{uuid.uuid4().hex[:12]}"
    store = S3Store.from_url(f"s3://{missing}/p", endpoint_url=s3_bucket.endpoint_url, max_attempts=1)
    message = _fails_fast(OPERATIONS[name], store, tmp_path)
    assert message.endswith(f"bucket {missing} does not exist")
    _no_leftovers(tmp_path)
    buckets = [b["Name"] for b in s3_bucket.client.list_buckets()["Buckets"]]
    assert missing not in buckets


# -- unreachable and silent endpoints ---------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(OPERATIONS))
def test_endpoint_down_is_a_store_error(name: str, aws_env: dict[str, str], tmp_path: Path) -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"
    store = S3Store.from_url("s3://bucket/p", endpoint_url=endpoint, max_attempts=2)
    message = _fails_fast(OPERATIONS[name], store, tmp_path)
    assert message.endswith(f"endpoint {endpoint} unreachable")
    _no_leftovers(tmp_path)


@pytest.mark.parametrize("name", sorted(OPERATIONS))
def test_silent_endpoint_times_out_after_read_timeout(name: str, aws_env: dict[str, str], tmp_path: Path) -> None:
    with SilentServer() as silent:
        store = S3Store.from_url("s3://bucket/p", endpoint_url=silent.endpoint_url, read_timeout=1, max_attempts=1)
        message = _fails_fast(OPERATIONS[name], store, tmp_path)
        assert message.endswith(f"endpoint {silent.endpoint_url} did not answer within 1 s")
        assert silent.connections == 1  # max_attempts=1: no retry, neither botocore's nor s3transfer's
    _no_leftovers(tmp_path)


@pytest.mark.parametrize("attempts", [2, 3])
def test_retries_on_a_silent_endpoint_are_bounded_by_max_attempts(
    attempts: int, aws_env: dict[str, str], tmp_path: Path
) -> None:
    with SilentServer() as silent:
        store = S3Store.from_url(
            "s3://bucket/p", endpoint_url=silent.endpoint_url, read_timeout=0.5, max_attempts=attempts
        )
        _fails_fast(OPERATIONS["get"], store, tmp_path)
        assert silent.connections == attempts


# -- credentials and permissions (moto with IAM auth enforced) ---------------------------------------------


@dataclass(frozen=True)
class AuthS3:
    """A moto server enforcing IAM auth, a bucket holding one bundle, and a read-only user's keys."""

    endpoint_url: str
    bucket: str
    reader_key: tuple[str, str]


READ_ONLY_POLICY = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Action": ["s3:GetObject", "s3:ListBucket"], "Resource": "*"}],
}


@pytest.fixture(scope="module")
def auth_s3() -> Iterator[AuthS3]:
    """A dedicated moto server (auth enforcement is process-wide), set up before auth is switched on."""
    import boto3

    with start_moto_server() as server:
        session = boto3.session.Session(aws_access_key_id="testing", aws_secret_access_key="testing")
        iam = session.client("iam", endpoint_url=server.endpoint_url, region_name=TEST_REGION)
        s3 = session.client("s3", endpoint_url=server.endpoint_url, region_name=TEST_REGION)
        s3.create_bucket(Bucket="auth-bucket")
        s3.put_object(Bucket="auth-bucket", Key="p/k1.bundle", Body=b"cached")
        iam.create_user(UserName="reader")
        iam.put_user_policy(UserName="reader", PolicyName="read-only", PolicyDocument=json.dumps(READ_ONLY_POLICY))
        key = iam.create_access_key(UserName="reader")["AccessKey"]
        server.enforce_auth()
        yield AuthS3(server.endpoint_url, "auth-bucket", (key["AccessKeyId"], key["SecretAccessKey"]))


def _auth_store(auth_s3: AuthS3, monkeypatch: pytest.MonkeyPatch, key_id: str, secret: str) -> S3Store:
    # Through the environment, i.e. boto3's standard credential chain, as in CI.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    return S3Store.from_url(f"s3://{auth_s3.bucket}/p", endpoint_url=auth_s3.endpoint_url, max_attempts=1)


@pytest.mark.parametrize(
    ("credentials", "expected"),
    [
        (("AKIAUNKNOWNUNKNOWN00", "whatever"), "InvalidAccessKeyId"),
        (("testing", "testing"), "InvalidAccessKeyId"),  # moto's defaults mean nothing once auth is on
        (("reader", "wrong-secret"), "SignatureDoesNotMatch"),
    ],
)
@pytest.mark.parametrize("name", ["list", "put", "get"])
def test_wrong_credentials_are_a_store_error(
    name: str,
    credentials: tuple[str, str],
    expected: str,
    auth_s3: AuthS3,
    aws_env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    key_id = auth_s3.reader_key[0] if credentials[0] == "reader" else credentials[0]
    store = _auth_store(auth_s3, monkeypatch, key_id, credentials[1])
    message = _fails_fast(OPERATIONS[name], store, tmp_path)
    if name == "get":
        # get starts with a HEAD, whose 403 has no body: the error code is not available.
        assert message.endswith("access denied or credentials rejected (HTTP 403)")
    else:
        assert message.endswith(f"credentials rejected ({expected})")
    _no_leftovers(tmp_path)


def test_read_only_credentials_read_but_cannot_write(
    auth_s3: AuthS3, aws_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    store = _auth_store(auth_s3, monkeypatch, *auth_s3.reader_key)
    # The same credentials read fine, so the refusals below are the policy, not bad keys.
    assert find_latest(store, "k") == "k1"
    assert store.get("k1", tmp_path / "got.bundle") is True
    assert store.get("k2", tmp_path / "miss.bundle") is False
    assert _fails_fast(OPERATIONS["put"], store, tmp_path).endswith("put k1: access denied")
    assert _fails_fast(OPERATIONS["delete"], store, tmp_path).endswith("delete k1: access denied")
    assert store.list()[0].key == "k1"  # still there


# -- the redis fixture -------------------------------------------------------------------------------------


def test_redis_server_fixture_answers_ping(redis_server: RedisServer) -> None:
    import redis

    client = redis.Redis.from_url(redis_server.url)
    try:
        assert client.ping() is True
        assert redis_server.url == f"redis://127.0.0.1:{redis_server.port}/0"
    finally:
        client.close()


@pytest.mark.parametrize(("ci", "outcome"), [("true", pytest.fail.Exception), ("", pytest.skip.Exception)])
def test_a_missing_server_binary_fails_in_ci_and_skips_locally(
    ci: str, outcome: type[BaseException], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome, match="no-such-server-binary is not installed"):
        require_binary_or_fail("no-such-server-binary")


def test_moto_server_fixture_is_loopback(moto_server: MotoServer) -> None:
    assert moto_server.endpoint_url == f"http://127.0.0.1:{moto_server.port}"


def test_precompiled_headers_travel_once_per_bucket(s3_bucket: S3Bucket, tmp_path: Path) -> None:
    """Issue 10 on S3: a save puts each header as one object per content hash under the prefix, a second
    save does not upload it again, and a fresh machine's restore installs it verified into torch's dir."""
    import hashlib

    from pytest_compilecache import pch as headers
    from pytest_compilecache import sync
    from pytest_compilecache.fingerprint import Fingerprint
    from tests.fakes import FakeLoader

    name = "c" + "a2b3c4d5e6f7" * 4 + "abc" + ".h.gch"
    content = b"gpch precompiled header " * 4096  # starts like a gcc PCH (a save with no process reports checks that)
    store = _store(s3_bucket)
    fp = Fingerprint({"torch": "2.13.0", "python": "cpython 3.11.7", "arch": "x86_64"})
    source = tmp_path / "cache-a"
    (source / "ab").mkdir(parents=True)
    (source / "ab" / "kernel.so").write_bytes(b"\x7fELF kernel")
    machine_a = tmp_path / "headers-a"
    machine_a.mkdir()

    def save(suffix: str) -> sync.SaveResult:
        since = headers.session_start()
        (machine_a / name).write_bytes(content)  # built (or read) during this session
        return sync.save(
            store, prefix="cc", fingerprint=fp, suffix=suffix, cache_dir=str(source), blobs={"controller": b"blob"},
            files=["ab/kernel.so"], stats={}, header_since=since, header_dir=machine_a,
        )  # fmt: skip

    first, second = save("run-1"), save("run-2")
    assert (first.outcome, second.outcome) == ("saved", "saved"), (first.message, second.message)
    assert (first.headers.transferred, second.headers.transferred) == ((name,), ())
    key = headers.object_key("cc", hashlib.sha256(content).hexdigest())
    listing = s3_bucket.client.list_objects_v2(Bucket=s3_bucket.name, Prefix="ci/cache/")
    objects = sorted(item["Key"] for item in listing["Contents"])
    assert objects.count(f"ci/cache/{key}.bundle") == 1 and len(objects) == 3  # two bundles, one header

    fresh = tmp_path / "headers-fresh"
    restored = sync.restore(
        store, prefix="cc", cache_dir=str(tmp_path / "cache-b"), header_dir=fresh, load=FakeLoader(), fingerprint=fp
    )
    assert restored.outcome == "partial", restored.message
    assert restored.headers.transferred == (name,) and restored.headers.warnings == ()
    assert (fresh / name).read_bytes() == content


def test_an_archived_newest_bundle_is_skipped_and_the_older_one_restored(s3_bucket: S3Bucket, tmp_path: Path) -> None:
    """Issue 28.3 on S3: an archived (GLACIER) object cannot be downloaded (HTTP 403), a per-object error;
    the restore skips that object as it would a bad bundle and restores the one before it."""
    from pytest_compilecache import sync
    from pytest_compilecache.fingerprint import Fingerprint
    from pytest_compilecache.fingerprint import make_key
    from tests.fakes import FakeLoader

    store = _store(s3_bucket)
    fp = Fingerprint({"torch": "2.13.0", "python": "cpython 3.11.7", "arch": "x86_64"})
    source = tmp_path / "cache-a"
    (source / "ab").mkdir(parents=True)
    (source / "ab" / "kernel.so").write_bytes(b"\x7fELF kernel")

    def save(suffix: str) -> str:
        saved = sync.save(
            store, prefix="cc", fingerprint=fp, suffix=suffix, cache_dir=str(source), blobs={"controller": b"blob"},
            files=["ab/kernel.so"], stats={},
        )  # fmt: skip
        assert saved.outcome == "saved", saved.message
        return make_key("cc", fp.digest(), suffix)

    older, newest = save("run-1"), save("run-2")  # same second or not, run-2 lists first
    name = f"ci/cache/{newest}.bundle"
    body = s3_bucket.client.get_object(Bucket=s3_bucket.name, Key=name)["Body"].read()
    s3_bucket.client.put_object(Bucket=s3_bucket.name, Key=name, Body=body, StorageClass="GLACIER")
    restored = sync.restore(
        store, prefix="cc", cache_dir=str(tmp_path / "cache-b"), load=FakeLoader(), fingerprint=fp, headers=False
    )
    assert (restored.outcome, restored.key) == ("partial", older), restored.message
    assert [key for key, _ in restored.skipped] == [newest]
    assert restored.skipped[0][1].startswith(f"cannot be read: {store.location}: get {newest}: ")
