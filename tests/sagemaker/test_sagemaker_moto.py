"""The deploy -> status -> invoke -> logs -> delete lifecycle, the reaper and the CLI against a
local moto server (SageMaker) and the fake Service Quotas server, reached through
AWS_ENDPOINT_URL / AWS_ENDPOINT_URL_SERVICE_QUOTAS exactly as boto3 reaches real AWS."""

from __future__ import annotations

import datetime as dt
import json

import boto3
import pytest
from fakes.aws_fixtures import local_aws, local_aws_session, put_endpoint_logs  # noqa: F401 - fixtures

from gemma4_t4.cli import main
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.sagemaker import (
    DeployConfig,
    check_health,
    check_quotas,
    delete_endpoint,
    deploy,
    endpoint_logs,
    endpoint_status,
    invoke,
    list_endpoints,
    pick_region,
    reap,
)
from gemma4_t4.sagemaker.deploy import deploy_in_background
from gemma4_t4.sagemaker.image import fixed_image_tag

REGION = "us-east-2"


def _names(region: str = REGION) -> dict[str, list[str]]:
    sm = boto3.client("sagemaker", region_name=region)
    return {
        "endpoints": [e["EndpointName"] for e in sm.list_endpoints()["Endpoints"]],
        "configs": [c["EndpointConfigName"] for c in sm.list_endpoint_configs()["EndpointConfigs"]],
        "models": [m["ModelName"] for m in sm.list_models()["Models"]],
    }


def test_lifecycle_deploy_status_invoke_logs_delete(local_aws):  # noqa: F811
    result = deploy(DeployConfig(name="g4-life", max_model_len=4096), poll_s=0.05, progress=False)
    assert result.success and result.status == "InService"
    assert result.created == ["model:g4-life", "endpoint-config:g4-life", "endpoint:g4-life"]
    assert result.usd_per_hour == pytest.approx(0.736)

    sm = boto3.client("sagemaker", region_name=REGION)
    model = sm.describe_model(ModelName="g4-life")
    assert model["PrimaryContainer"]["Environment"]["SM_VLLM_MAX_MODEL_LEN"] == "4096"
    # A T4 never gets the stock DLC: the newest fixed image in the region's ECR (seeded by LocalAWS)
    assert model["PrimaryContainer"]["Image"] == (
        "123456789012.dkr.ecr.us-east-2.amazonaws.com/gemma4-t4-vllm:" + fixed_image_tag()
    )
    variant = sm.describe_endpoint_config(EndpointConfigName="g4-life")["ProductionVariants"][0]
    assert variant["InferenceAmiVersion"] == "al2023-ami-sagemaker-inference-gpu-4-1"
    tags = {t["Key"]: t["Value"] for t in sm.list_tags(ResourceArn=model["ModelArn"])["Tags"]}
    assert tags["project"] == "gemma4-t4" and tags["created-by"] and "gemma4-t4:expires-at" in tags

    status = endpoint_status("g4-life", REGION)
    assert status.status == "InService" and status.instance_types == ["ml.g4dn.xlarge"]
    assert status.usd_per_hour == pytest.approx(0.736) and status.expires_at == tags["gemma4-t4:expires-at"]

    local_aws.queue_chat_replies(["4", "42", "Paris"])
    reply = invoke("g4-life", REGION, "What is 2 + 2?")
    assert reply.text == "4" and reply.usage["completion_tokens"] >= 1
    health = check_health(lambda p: invoke("g4-life", REGION, p, max_tokens=32).text)
    assert health.healthy, health.summary

    missing = endpoint_logs("g4-life", REGION)
    assert not missing.found and "container never started" in missing.explanation
    put_endpoint_logs(
        "g4-life",
        ["INFO starting", "INFO Model loading took 9.8 GiB and 41 s", "INFO Application startup complete."],
    )
    logs = endpoint_logs("g4-life", REGION, lines=2)
    assert logs.found and len(logs.lines) == 2 and logs.lines[-1].endswith("startup complete.")
    assert any("Model loading took" in m for m in logs.milestones)

    deleted = delete_endpoint("g4-life", REGION)
    assert deleted.deleted == ["endpoint:g4-life", "endpoint-config:g4-life", "model:g4-life"]
    assert _names() == {"endpoints": [], "configs": [], "models": []}
    again = delete_endpoint("g4-life", REGION)  # idempotent
    assert again.deleted == [] and len(again.already_absent) == 3
    assert not endpoint_status("g4-life", REGION).exists


def test_degenerate_endpoint_fails_health(local_aws):  # noqa: F811
    deploy(DeployConfig(name="g4-broken"), poll_s=0.05, progress=False)
    local_aws.queue_chat_replies([": ok: ok: ok: ok: ok: ok", ": ok: ok: ok: ok: ok: ok"])
    report = check_health(lambda p: invoke("g4-broken", REGION, p).text)
    assert not report.healthy
    assert all("repeats" in " ".join(p.reasons) for p in report.probes)


def test_deploy_never_overwrites_and_rolls_back_partial_state(local_aws):  # noqa: F811
    deploy(DeployConfig(name="g4-dup"), poll_s=0.05, progress=False)
    with pytest.raises(Gemma4T4Error, match="already exists"):
        deploy(DeployConfig(name="g4-dup"), progress=False)
    assert _names()["endpoints"] == ["g4-dup"]


def test_background_watch_reports_in_service(local_aws):  # noqa: F811
    watcher = deploy_in_background(DeployConfig(name="g4-bg"), poll_s=0.05)
    result = watcher.wait(timeout=30)
    assert watcher.done.is_set() and result.success and result.rolled_back == []


def test_quota_fake_end_to_end(local_aws, monkeypatch):  # noqa: F811
    asked, quota_list = [], local_aws.quota_fake.quota_list
    monkeypatch.setattr(local_aws.quota_fake, "quota_list", lambda region: asked.append(region) or quota_list(region))
    report = check_quotas(["ml.g4dn.xlarge", "ml.g6.xlarge"])
    assert asked == [
        "us-east-1",
        "us-east-2",
        "us-west-2",
        "us-west-1",
    ]  # sequential, in order
    assert pick_region(report, "ml.g4dn.xlarge") == "us-east-2"
    assert pick_region(report, "ml.g4dn.xlarge", preferred=["us-west-2"]) == "us-west-2"
    local_aws.quota_fake.quotas["us-east-2"]["ml.g6.xlarge"] = 0
    with pytest.raises(Gemma4T4Error, match="no quota"):
        pick_region(check_quotas(["ml.g6.xlarge"]), "ml.g6.xlarge")


def test_reap_deletes_only_expired_project_endpoints(local_aws):  # noqa: F811
    now = dt.datetime.now(dt.UTC)
    deploy(DeployConfig(name="g4-old", ttl_hours=1), poll_s=0.05, progress=False)
    deploy(DeployConfig(name="g4-new", ttl_hours=48), poll_s=0.05, progress=False)
    sm = boto3.client("sagemaker", region_name=REGION)  # someone else's endpoint, untagged
    sm.create_model(
        ModelName="other",
        ExecutionRoleArn="arn:aws:iam::123456789012:role/x",
        PrimaryContainer={"Image": "123456789012.dkr.ecr.us-east-2.amazonaws.com/other:1"},
    )
    sm.create_endpoint_config(
        EndpointConfigName="other",
        ProductionVariants=[
            {
                "VariantName": "v",
                "ModelName": "other",
                "InitialInstanceCount": 1,
                "InstanceType": "ml.g4dn.xlarge",
            }
        ],
    )
    sm.create_endpoint(EndpointName="other", EndpointConfigName="other")
    later = now + dt.timedelta(hours=2)
    preview = reap([REGION], dry_run=True, now=later)
    assert preview.expired == ["g4-old"] and preview.deleted == []
    assert sorted(_names()["endpoints"]) == ["g4-new", "g4-old", "other"]
    result = reap([REGION], now=later)
    assert result.deleted == ["g4-old"]
    assert sorted(_names()["endpoints"]) == ["g4-new", "other"]
    assert "g4-old" not in _names()["models"]
    assert [e.name for e in list_endpoints([REGION], project_only=True)] == ["g4-new"]


def _cli(capsys, *argv: str) -> tuple[int, dict | str]:
    code = main(list(argv))
    out = capsys.readouterr().out
    try:
        return code, json.loads(out)
    except ValueError:
        return code, out


def test_cli_lifecycle_and_confirmation(local_aws, capsys):  # noqa: F811
    code, plan = _cli(capsys, "sagemaker", "deploy", "--name", "g4-cli", "--dry-run", "--json")
    assert code == 0 and plan["dry_run"] and "aws sagemaker create-model" in plan["plan"][0]
    assert _names()["models"] == []  # a dry run calls nothing

    code, deployed = _cli(
        capsys,
        "sagemaker",
        "deploy",
        "--name",
        "g4-cli",
        "--vllm-arg=--enforce-eager",
        "--timeout",
        "60",
        "--json",
    )
    assert code == 0 and deployed["status"] == "InService"
    code, status = _cli(capsys, "sagemaker", "status", "g4-cli", "--json")
    assert code == 0 and status["status"] == "InService"
    local_aws.queue_chat_replies(["Paris"])
    code, text = _cli(capsys, "sagemaker", "invoke", "g4-cli", "--prompt", "Capital of France?")
    assert code == 0 and text.strip() == "Paris"
    code, listed = _cli(capsys, "sagemaker", "list", "--regions", REGION, "--json")
    assert [e["name"] for e in listed] == ["g4-cli"]

    code, refusal = _cli(capsys, "sagemaker", "delete", "g4-cli", "--json")
    assert code == 2 and "without --yes" in refusal["message"]
    assert _names()["endpoints"] == ["g4-cli"]  # nothing deleted
    code, deleted = _cli(capsys, "sagemaker", "delete", "g4-cli", "--yes", "--json")
    assert code == 0 and len(deleted["deleted"]) == 3

    code, quotas = _cli(capsys, "sagemaker", "quotas", "--json")
    assert code == 0 and quotas["picked"] == {"ml.g4dn.xlarge": "us-east-2"}
    code, bad = _cli(capsys, "sagemaker", "deploy", "--region", "eu-mars-1", "--json")
    assert code == 2 and "unknown or unsupported AWS region" in bad["message"]


def test_reap_deletes_the_endpoint_it_listed_never_a_later_one_of_the_same_name(local_aws):  # noqa: F811
    """Between the reaper's listing and its delete the owner deleted the expired endpoint and deployed a new
    one of the same name: the reaper checks the listed CreationTime and leaves the new one alone."""
    import time

    deploy(DeployConfig(name="g4-old", ttl_hours=1), poll_s=0.05, progress=False)
    real = boto3.client("sagemaker", region_name=REGION)

    class ReCreatedMeanwhile:
        """moto's client; the first DescribeEndpoint (the delete's) finds the name re-created."""

        done = False

        def __getattr__(self, name):
            return getattr(real, name)

        def describe_endpoint(self, **kwargs):
            if not ReCreatedMeanwhile.done:
                ReCreatedMeanwhile.done = True
                real.delete_endpoint(EndpointName="g4-old")
                time.sleep(1.5)  # a later CreationTime
                real.create_endpoint(EndpointName="g4-old", EndpointConfigName="g4-old")
            return real.describe_endpoint(**kwargs)

    def clients(service, region):
        return ReCreatedMeanwhile() if service == "sagemaker" else boto3.client(service, region_name=region)

    result = reap([REGION], now=dt.datetime.now(dt.UTC) + dt.timedelta(hours=2), clients=clients)
    assert result.deleted == [] and result.decisions[0].action == "failed"
    assert "not the one recorded" in result.decisions[0].reason
    assert _names()["endpoints"] == ["g4-old"]
