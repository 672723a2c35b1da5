"""Fixtures for integration tests against real server processes (moto's S3 over HTTP, redis-server,
gcp-storage-emulator for GCS, Azurite for Azure Blob).

Servers are session-scoped (each costs a process start); anything a test mutates is per test: a fresh
bucket, a fresh AWS environment. A missing server skips locally and fails under ``CI=true``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.servers import AzuriteServer
from tests.servers import GCSEmulator
from tests.servers import MotoServer
from tests.servers import RedisServer
from tests.servers import start_azurite
from tests.servers import start_gcs_emulator
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


# Every variable that could point the Google or Azure clients elsewhere (a developer's own account).
_CLOUD_ENV = (
    "STORAGE_EMULATOR_HOST",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "GOOGLE_CLOUD_PROJECT",
    "AZURE_STORAGE_CONNECTION_STRING",
    "AZURE_STORAGE_ACCOUNT_URL",
    "AZURE_STORAGE_ACCOUNT_NAME",
    "AZURE_CLIENT_ID",
    "AZURE_TENANT_ID",
    "AZURE_CLIENT_SECRET",
    "AZURE_FEDERATED_TOKEN_FILE",
)


@dataclass(frozen=True)
class CloudBucket:
    """A fresh, empty GCS bucket or Azure container on an emulator, the store URL that names it with a
    prefix, the environment that reaches it (set for the test), and a client to inspect it behind the
    store's back (google.cloud.storage.Bucket or azure.storage.blob.ContainerClient)."""

    cloud: str  # "gcs" or "azure"
    name: str
    url: str
    env: dict[str, str]
    client: Any

    def object_names(self) -> list[str]:
        return sorted(blob.name for blob in self.client.list_blobs())  # the same call in both clients


@pytest.fixture(scope="session")
def gcs_emulator() -> Iterator[GCSEmulator]:
    """One gcp-storage-emulator process for the session (in memory)."""
    with start_gcs_emulator() as server:
        _load_client_modules("gcs", server.endpoint_url)
        yield server


@pytest.fixture(scope="session")
def azurite() -> Iterator[AzuriteServer]:
    """One Azurite (blob service) process for the session (in memory)."""
    with start_azurite() as server:
        _load_client_modules("azure", server.connection_string)
        yield server


def _load_client_modules(cloud: str, where: str) -> None:
    """One request with the cloud's client, so that every module it loads lazily (its HTTP transport, the
    parts of requests it uses) is loaded once for the session, before any test's pytester snapshots
    sys.modules: pytester drops the modules a test loaded, and loading them again makes new classes that the
    objects kept from the first load (requests' cookie jars) are no instances of."""
    if cloud == "gcs":
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        options = {"api_endpoint": where}
        anonymous = AnonymousCredentials()  # type: ignore[no-untyped-call]
        client = storage.Client(project="test", credentials=anonymous, client_options=options)
        list(client.list_buckets())
    else:
        from azure.storage.blob import BlobServiceClient

        list(BlobServiceClient.from_connection_string(where).list_containers())


def _clear_cloud_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _CLOUD_ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def gcs_bucket(gcs_emulator: GCSEmulator, monkeypatch: pytest.MonkeyPatch) -> CloudBucket:
    """A new bucket with a unique name on the session's GCS emulator; STORAGE_EMULATOR_HOST set."""
    from google.cloud import storage

    _clear_cloud_env(monkeypatch)
    env = {"STORAGE_EMULATOR_HOST": gcs_emulator.endpoint_url}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    name = f"cc-{uuid.uuid4().hex[:16]}"
    bucket = storage.Client(project="test").create_bucket(name)
    return CloudBucket("gcs", name, f"gs://{name}/ci/cache", env, bucket)


@pytest.fixture
def azure_container(azurite: AzuriteServer, monkeypatch: pytest.MonkeyPatch) -> CloudBucket:
    """A new container with a unique name on the session's Azurite; AZURE_STORAGE_CONNECTION_STRING set."""
    from azure.storage.blob import ContainerClient

    _clear_cloud_env(monkeypatch)
    env = {"AZURE_STORAGE_CONNECTION_STRING": azurite.connection_string}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    name = f"cc-{uuid.uuid4().hex[:16]}"
    client = ContainerClient.from_connection_string(azurite.connection_string, name)
    client.create_container()
    return CloudBucket("azure", name, f"az://{name}/ci/cache", env, client)


@pytest.fixture(params=["gcs", "azure"])
def cloud_bucket(request: pytest.FixtureRequest) -> CloudBucket:
    """Each cloud's fresh bucket in turn (gcs_bucket, azure_container)."""
    fixture = "gcs_bucket" if request.param == "gcs" else "azure_container"
    bucket: CloudBucket = request.getfixturevalue(fixture)
    return bucket
