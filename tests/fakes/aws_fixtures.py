"""Offline AWS for the SageMaker and MCP tests: one moto server plus the FAKE Service Quotas
server per session (gemma4_t4.standins.local.LocalAWS), reset before every test.

Test modules import these fixtures by name, and pytest keeps a separate cache for a fixture in every
module that defines it: ``local_aws_session`` here is only a per-module handle on the server that
tests/conftest.py starts once per session (``local_aws_server``)."""

from __future__ import annotations

import pytest

from gemma4_t4.standins.local import DEFAULT_QUOTAS, LocalAWS


@pytest.fixture(scope="session")
def local_aws_session(local_aws_server: LocalAWS) -> LocalAWS:
    return local_aws_server


@pytest.fixture
def local_aws(local_aws_session: LocalAWS) -> LocalAWS:
    """moto + fake quotas with empty state and the default quota table."""
    local_aws_session.reset()
    assert local_aws_session.quota_fake is not None
    local_aws_session.quota_fake.quotas.clear()
    local_aws_session.quota_fake.quotas.update({r: dict(v) for r, v in DEFAULT_QUOTAS.items()})
    local_aws_session.quota_fake.requests.clear()
    return local_aws_session
