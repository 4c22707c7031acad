"""The obstore client of the incremental output's segments (files.backends) is set up
as the boto3 client of everything else: the same region, endpoint and addressing
style, whatever the environment says. No request is made."""

from __future__ import annotations

import pytest

from files import backends


@pytest.fixture
def aws(monkeypatch):
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    backends.clear_clients()
    yield monkeypatch
    backends.clear_clients()


def config(bucket: str, style: str) -> dict[str, str]:
    store = backends._object_store(bucket, style)
    return {key: store.config[key] for key in ("endpoint", "region",
                                               "virtual_hosted_style_request")}


@pytest.mark.parametrize(("style", "endpoint", "virtual"), [
    ("path", "http://store.internal:9000", "false"),
    ("virtual", "http://my-bucket.store.internal:9000", "true"),
])
def test_a_custom_endpoint_is_addressed_as_boto3_addresses_it(aws, style, endpoint, virtual):
    aws.setenv("AWS_ENDPOINT_URL", "http://store.internal:9000")
    aws.setenv("AWS_REGION", "eu-west-3")

    assert config("my-bucket", style) == {
        "endpoint": endpoint, "region": "eu-west-3", "virtual_hosted_style_request": virtual}
    assert backends._object_store("my-bucket", style).client_options["allow_http"] == "true"


def test_on_aws_the_regions_endpoint_and_virtual_hosts_as_boto3(aws):
    aws.setenv("AWS_REGION", "eu-west-3")

    assert config("my-bucket", "auto") == {
        "endpoint": "https://my-bucket.s3.eu-west-3.amazonaws.com", "region": "eu-west-3",
        "virtual_hosted_style_request": "true"}
    assert backends._client("auto").meta.region_name == "eu-west-3"


def test_aws_region_comes_before_botocores_default_region(aws):
    aws.setenv("AWS_DEFAULT_REGION", "us-west-2")
    assert config("b", "auto")["region"] == "us-west-2"

    aws.setenv("AWS_REGION", "ap-south-1")
    backends.clear_clients()
    assert config("b", "auto")["region"] == "ap-south-1"
    assert backends._client("auto").meta.region_name == "ap-south-1"
