"""What a user expects of the SageMaker config, the MCP server's errors and the benchmark's specs, each
checked where no other test would notice it going wrong (scripts/planted_bugs.py plants each bug these
catch). Everything runs in-process: no AWS call, no server."""

from __future__ import annotations

import datetime as dt

import anyio
import pytest

from gemma4_t4 import mcp_server
from gemma4_t4.bench.specs import DecodeSpec, TTFTSpec
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.sagemaker.config import DeployConfig, create_bucket_params, validate_name

NOW = dt.datetime(2026, 11, 1, 9, 30, tzinfo=dt.UTC)


def _tags(config: DeployConfig) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in config.resource_tags(NOW)}


# ---------------------------------------------------------------- SageMaker: what a deploy is told


def test_an_endpoints_expiry_tag_is_its_lifetime_in_hours_after_the_deploy():
    """A 4-hour endpoint deployed at 09:30 is tagged to expire at 13:30, the time `reap` deletes it
    after; 90 minutes is 11:00."""
    assert _tags(DeployConfig(ttl_hours=4))["gemma4-t4:expires-at"] == "2026-11-01T13:30:00Z"
    tags = _tags(DeployConfig(ttl_hours=1.5))
    assert tags["gemma4-t4:expires-at"] == "2026-11-01T11:00:00Z" and tags["gemma4-t4:ttl-hours"] == "1.5"


def test_a_bucket_is_created_in_the_deploys_region():
    """S3 creates a bucket outside us-east-1 only when told the region (and refuses being told
    us-east-1), so the model upload's bucket is where the endpoint is."""
    assert create_bucket_params("models", "us-east-2") == {
        "Bucket": "models",
        "CreateBucketConfiguration": {"LocationConstraint": "us-east-2"},
    }
    assert create_bucket_params("models", "us-east-1") == {"Bucket": "models"}


def test_an_endpoint_name_of_64_characters_is_refused_before_aws_sees_it():
    """SageMaker's names hold 63 characters: the 63rd passes, a 64th is refused here with the rule,
    not by AWS halfway through a deploy."""
    validate_name("g" * 63)
    validate_name("g4-" + "t" * 60)
    with pytest.raises(Gemma4T4Error, match="invalid endpoint name") as refused:
        validate_name("g" * 64)
    assert refused.value.fix == "use 1-63 letters, digits and hyphens, starting with a letter or digit"


@pytest.mark.parametrize("hours", [0, -1, 168.5])
def test_a_lifetime_outside_zero_to_a_week_is_refused_naming_the_range(hours):
    """A lifetime of 0 hours would have the reaper delete the endpoint as soon as it is up; more than a
    week is not a cost guard."""
    with pytest.raises(Gemma4T4Error, match=r"must be in \(0, 168\]") as refused:
        DeployConfig(ttl_hours=hours).validate(require_role=False)
    assert f"ttl_hours={hours}" in refused.value.message and "reap" in refused.value.fix
    DeployConfig(ttl_hours=168).validate(require_role=False)  # a week exactly is allowed
    DeployConfig(ttl_hours=0.25).validate(require_role=False)


# ---------------------------------------------------------------- the MCP server's answers


def test_a_secret_in_a_tools_error_is_masked_in_the_mcp_answer(monkeypatch):
    """A tool that fails with the environment's token in its message (a server echoing its
    Authorization header) answers with the token masked, and still names the fix."""
    monkeypatch.setenv("HF_TOKEN", "hf-secret-token-0451")

    def failing() -> mcp_server.QueryResult:
        raise Gemma4T4Error("the server refused token hf-secret-token-0451", fix="check the token's scope")

    with pytest.raises(Exception, match="refused token") as answer:
        anyio.run(mcp_server._adapter(failing))
    text = str(answer.value)
    assert "hf-secret-token-0451" not in text and "the server refused token ***" in text
    assert "fix: check the token's scope" in text


# ---------------------------------------------------------------- the benchmark's specs


@pytest.mark.parametrize(
    ("build", "field"),
    [(lambda: DecodeSpec(concurrency=[]), "concurrency"), (lambda: TTFTSpec(input_lens=[]), "input_lens")],
)
def test_an_empty_concurrency_list_is_refused_with_its_fix(build, field):
    """An empty list (a notebook's `CONCURRENCY = []`) would measure nothing: refused, naming the field."""
    with pytest.raises(Gemma4T4Error, match=f"{field} is empty") as refused:
        build()
    assert refused.value.fix == "give at least one value, e.g. 1"


def test_a_negative_warmup_is_refused_and_zero_is_allowed():
    """No warm-up is a choice (`--warmup 0`); a negative count is a typo."""
    assert DecodeSpec(warmup=0).warmup == 0
    for warmup in (-1, -5):
        with pytest.raises(Gemma4T4Error, match="warm-up requests cannot be negative") as refused:
            DecodeSpec(warmup=warmup)
        assert refused.value.fix == "use --warmup 0 or more"
