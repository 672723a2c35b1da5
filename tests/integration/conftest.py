"""Fixtures for integration tests against real server processes (moto's S3 over HTTP, redis-server).

Servers are session-scoped (each costs a process start); anything a test mutates is per test: a fresh
bucket, a fresh AWS environment. A missing server skips locally and fails under ``CI=true``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.servers import MotoServer
from tests.servers import RedisServer
from tests.servers import start_moto_server
from tests.servers import start_redis_server

# Dummy credentials moto accepts while its auth is off (the default, INITIAL_NO_AUTH_ACTION_COUNT=inf).
TEST_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
TEST_REGION = "us-east-1"


@dataclass(frozen=True)
class S3Bucket:
    """A fresh, empty bucket on a moto server, and a plain boto3 client to inspect it behind the store's back."""

    name: str
    endpoint_url: str
    client: Any  # botocore's S3 client; untyped without boto3-stubs


@pytest.fixture(scope="session")
def moto_server() -> Iterator[MotoServer]:
    """One moto server process for the session (auth off: any credentials are accepted)."""
    with start_moto_server() as server:
        yield server


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One redis-server process for the session, no persistence; tests should use their own key space."""
    with start_redis_server() as server:
        yield server


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Dummy credentials and region in the environment, isolated from the developer's own AWS setup.

    Clears every variable that could redirect boto3 (profile, endpoint, session token, web identity) and
    points the shared config/credentials files at empty files, so a test never reaches a real account.
    """
    for name in (
        "AWS_PROFILE",
        "AWS_DEFAULT_PROFILE",
        "AWS_SESSION_TOKEN",
        "AWS_SECURITY_TOKEN",
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_S3",
        "AWS_ROLE_ARN",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "AWS_REGION",
        "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS",
    ):
        monkeypatch.delenv(name, raising=False)
    # Not in tmp_path: tests own that directory and check what is in it.
    empty = tmp_path_factory.mktemp("aws") / "empty-config"
    empty.write_text("")
    values = {
        **TEST_CREDENTIALS,
        "AWS_DEFAULT_REGION": TEST_REGION,
        "AWS_CONFIG_FILE": str(empty),
        "AWS_SHARED_CREDENTIALS_FILE": str(empty),
        # Never fall through to the EC2 metadata endpoint (a 1 s timeout x 2 attempts off EC2).
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    return values


@pytest.fixture
def s3_bucket(moto_server: MotoServer, aws_env: dict[str, str]) -> S3Bucket:
    """A new bucket with a unique name on the session's moto server."""
    import boto3

    client = boto3.session.Session().client("s3", endpoint_url=moto_server.endpoint_url, region_name=TEST_REGION)
    name = f"cc-{uuid.uuid4().hex[:16]}"
    client.create_bucket(Bucket=name)
    return S3Bucket(name=name, endpoint_url=moto_server.endpoint_url, client=client)
