"""Offline AWS for the SageMaker and MCP tests: one moto server plus the FAKE Service Quotas
server per session (gemma4_t4.standins.local.LocalAWS), reset before every test.

Test modules import these fixtures by name, and pytest keeps a separate cache for a fixture in every
module that defines it: ``local_aws_session`` here is only a per-module handle on the server that
tests/conftest.py starts once per session (``local_aws_server``)."""

from __future__ import annotations

import time
import urllib.request

import boto3
import pytest

from gemma4_t4.standins.local import DEFAULT_QUOTAS, LocalAWS


@pytest.fixture(scope="session")
def local_aws_session(local_aws_server: LocalAWS) -> LocalAWS:
    return local_aws_server


@pytest.fixture
def local_aws(local_aws_session: LocalAWS) -> LocalAWS:
    """moto + fake quotas with empty state and the default quota table."""
    reset(local_aws_session)
    assert local_aws_session.quota_fake is not None
    local_aws_session.quota_fake.quotas.clear()
    local_aws_session.quota_fake.quotas.update({r: dict(v) for r, v in DEFAULT_QUOTAS.items()})
    return local_aws_session


def reset(aws: LocalAWS) -> None:
    """Forget every moto resource (between tests); the fixed image is seeded again."""
    request = urllib.request.Request(aws.endpoint_url + "/moto-api/reset", data=b"{}", method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        response.read()
    if aws.seed_image:
        aws.seed_fixed_image()


def put_endpoint_logs(endpoint: str, lines: list[str], region: str = LocalAWS.region) -> None:
    """Write container log lines where SageMaker would (/aws/sagemaker/Endpoints/NAME), in moto's logs."""
    logs = boto3.client("logs", region_name=region)
    group = f"/aws/sagemaker/Endpoints/{endpoint}"
    try:
        logs.create_log_group(logGroupName=group)
    except logs.exceptions.ResourceAlreadyExistsException:
        pass
    stream = "AllTraffic/i-0fake0000000000000"
    try:
        logs.create_log_stream(logGroupName=group, logStreamName=stream)
    except logs.exceptions.ResourceAlreadyExistsException:
        pass
    now = int(time.time() * 1000)
    events = [{"timestamp": now + i, "message": line} for i, line in enumerate(lines)]
    logs.put_log_events(logGroupName=group, logStreamName=stream, logEvents=events)
