"""URL and credential resolution, without network."""

from __future__ import annotations

import pytest

from fastload.errors import ConfigError
from fastload.storage import open_store, resolve_s3, split_url
from fastload.storage.url import join

_VARS = (
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "COS_REGION",
    "COS_SECRET_ID",
    "COS_SECRET_KEY",
    "COS_SESSION_TOKEN",
    "COS_ENDPOINT_URL",
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _VARS:
        monkeypatch.delenv(name, raising=False)


def test_split_url_plain_path_is_file(tmp_path: object) -> None:
    assert split_url("/data/x/") == ("file", "/data/x")
    assert split_url("s3://bucket/a/b/") == ("s3", "bucket/a/b")
    assert split_url("MEMORY://m/x") == ("memory", "m/x")
    assert join("s3://b/p/", "/manifest.json") == "s3://b/p/manifest.json"


def test_s3_options_win_over_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://env-endpoint:9000")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "ENVKEY")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "ENVSECRET")
    s = resolve_s3(
        "s3://bkt/coco/train",
        {"key": "K", "secret": "S", "client_kwargs": {"endpoint_url": "http://opt:1"}},
    )
    assert (s.bucket, s.prefix) == ("bkt", "coco/train")
    assert (s.key, s.secret, s.endpoint_url) == ("K", "S", "http://opt:1")


def test_s3_falls_back_to_aws_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://env-endpoint:9000")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "ENVKEY")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "ENVSECRET")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    s = resolve_s3("s3://bkt")
    assert (s.bucket, s.prefix) == ("bkt", "")
    assert (s.key, s.secret) == ("ENVKEY", "ENVSECRET")
    assert s.endpoint_url == "http://env-endpoint:9000"
    assert s.region == "eu-west-1"
    monkeypatch.setenv("AWS_REGION", "us-west-2")
    assert resolve_s3("s3://bkt").region == "us-west-2"


def test_cos_maps_onto_s3_with_region_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COS_SECRET_ID", "COSID")
    monkeypatch.setenv("COS_SECRET_KEY", "COSKEY")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AWSKEY")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "AWSSECRET")
    s = resolve_s3("cos://bucket-1250000000/coco", {"region": "ap-guangzhou"})
    assert s.protocol == "cos"
    assert s.endpoint_url == "https://cos.ap-guangzhou.myqcloud.com"
    assert s.region == "ap-guangzhou"
    assert (s.key, s.secret) == ("COSID", "COSKEY")
    assert s.virtual_hosted


def test_cos_region_from_environment_and_aws_credentials(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COS_REGION", "ap-shanghai")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AWSKEY")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "AWSSECRET")
    s = resolve_s3("cos://b/p")
    assert s.endpoint_url == "https://cos.ap-shanghai.myqcloud.com"
    assert (s.key, s.secret) == ("AWSKEY", "AWSSECRET")
    s = resolve_s3("cos://b/p", {"key": "OPTKEY", "secret": "OPTSECRET"})
    assert (s.key, s.secret) == ("OPTKEY", "OPTSECRET")


def test_cos_without_region_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"cos://b/p.*region"):
        resolve_s3("cos://b/p")


def test_url_without_bucket_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="no bucket"):
        resolve_s3("s3:///key")


def test_secret_never_in_repr_or_str() -> None:
    secret = "Sup3rS3cretValue-xyz"
    token = "T0kenValue-abc"
    s = resolve_s3("s3://b/p", {"key": "K", "secret": secret, "token": token})
    store = open_store("s3://b/p", {"key": "K", "secret": secret, "token": token})
    for text in (repr(s), str(s), repr(store), str(store)):
        assert secret not in text
        assert token not in text
    assert "s3://b/p" in repr(store)


def test_s3_filesystem_leaves_retries_to_the_policy() -> None:
    from fastload.config import RetryConfig
    from fastload.storage.backends import make_s3_filesystem

    settings = resolve_s3("s3://b/p", {"key": "K", "secret": "S", "endpoint_url": "http://h:1"})
    fs = make_s3_filesystem(settings, RetryConfig(timeout_s=7.5), pool=40)
    assert fs.retries == 1
    assert fs.config_kwargs["retries"] == {"total_max_attempts": 1, "mode": "standard"}
    assert fs.config_kwargs["connect_timeout"] == 7.5
    assert fs.config_kwargs["read_timeout"] == 7.5
    assert fs.config_kwargs["max_pool_connections"] == 40
    assert fs.client_kwargs["endpoint_url"] == "http://h:1"


def test_cos_store_client_points_at_the_cos_endpoint() -> None:
    store = open_store("cos://bkt-125/coco", {"region": "ap-guangzhou", "key": "I", "secret": "S"})
    from fastload.storage.backends import S3Backend

    backend = store._get_backend()  # builds the client; sends nothing
    assert isinstance(backend, S3Backend)
    client = backend._client
    assert client.meta.endpoint_url == "https://cos.ap-guangzhou.myqcloud.com"
    assert client.meta.region_name == "ap-guangzhou"
    assert client.meta.config.s3["addressing_style"] == "virtual"
    assert client.meta.config.retries["total_max_attempts"] == 1
    assert store.url("manifest.json") == "cos://bkt-125/coco/manifest.json"
