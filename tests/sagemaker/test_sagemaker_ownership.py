"""What `sagemaker delete` removes and what build-image --force writes, against moto: a config or
model another endpoint still uses is kept (and named with why), the dry run lists exactly what
the real run then deletes, and a forced rebuild never targets a tag the immutable repository has."""

from __future__ import annotations

import json

import boto3
import pytest
from botocore.exceptions import ClientError
from fakes.aws_fixtures import local_aws, local_aws_session  # noqa: F401 - fixtures

from gemma4_t4.cli import main
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.sagemaker.ops import delete_plan, plan_delete
from gemma4_t4.standins.local import FAKE_ROLE_ARN

REGION = "us-east-2"


OURS = [{"Key": "project", "Value": "gemma4-t4"}]


def _chain(sm, endpoint: str, config: str, model: str, create_model: bool = True, ours: bool = True) -> None:
    tags = OURS if ours else [{"Key": "team", "Value": "prod"}]
    if create_model:
        sm.create_model(ModelName=model, ExecutionRoleArn=FAKE_ROLE_ARN, PrimaryContainer={"Image": "x/y:1"},
                        Tags=tags)
    sm.create_endpoint_config(
        Tags=tags,
        EndpointConfigName=config,
        ProductionVariants=[
            {
                "VariantName": "AllTraffic",
                "ModelName": model,
                "InitialInstanceCount": 1,
                "InstanceType": "ml.g4dn.xlarge",
            }
        ],
    )
    sm.create_endpoint(EndpointName=endpoint, EndpointConfigName=config, Tags=tags)


def _run(capsys, *argv: str) -> tuple[int, dict]:
    capsys.readouterr()
    code = main(["sagemaker", *argv, "--region", REGION, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_delete_keeps_a_model_another_endpoint_uses_and_the_dry_run_matches(local_aws, capsys):  # noqa: F811
    sm = boto3.client("sagemaker", region_name=REGION)
    _chain(sm, "prod-b", "cfg-b", "shared")
    _chain(
        sm, "prod-a", "cfg-a", "shared", create_model=False, ours=False
    )  # not a package endpoint, shares prod-b's model
    # not created here: refused, in the dry run and for real, unless --not-ours says so
    assert _run(capsys, "delete", "prod-a", "--yes")[0] == 2
    assert sm.describe_endpoint(EndpointName="prod-a")["EndpointStatus"] == "InService"
    code, planned = _run(capsys, "delete", "prod-a", "--dry-run", "--not-ours")
    assert code == 0
    assert planned["kept"] == ["model:shared (still used by endpoint prod-b)"]
    assert not any("shared" in step for step in planned["plan"])
    code, done = _run(capsys, "delete", "prod-a", "--yes", "--not-ours")
    assert code == 0
    assert done["deleted"] == ["endpoint:prod-a", "endpoint-config:cfg-a"]
    assert done["plan"] == planned["plan"]  # the dry run listed exactly what was then deleted
    assert done["kept"] == planned["kept"]
    assert [m["ModelName"] for m in sm.list_models()["Models"]] == ["shared"]
    assert sm.describe_endpoint(EndpointName="prod-b")["EndpointStatus"] == "InService"
    # the last user goes: now nothing else references the model, so it is deleted with it
    code, last = _run(capsys, "delete", "prod-b", "--yes")
    assert (
        last["deleted"] == ["endpoint:prod-b", "endpoint-config:cfg-b", "model:shared"] and last["kept"] == []
    )
    assert sm.list_models()["Models"] == []


def test_delete_of_a_name_without_an_endpoint_touches_only_this_projects_leftovers(local_aws, capsys):  # noqa: F811
    sm = boto3.client("sagemaker", region_name=REGION)
    sm.create_model(ModelName="batch-job", ExecutionRoleArn=FAKE_ROLE_ARN, PrimaryContainer={"Image": "x/y:1"})
    code, done = _run(capsys, "delete", "batch-job", "--yes")  # an unrelated, untagged model of that name
    assert code == 0 and done["deleted"] == [] and "endpoint:batch-job" in done["already_absent"]
    assert done["kept"] == ["model:batch-job (not created by gemma4-t4: no project tag)"]
    assert [m["ModelName"] for m in sm.list_models()["Models"]] == ["batch-job"]
    sm.create_model(ModelName="left-over", ExecutionRoleArn=FAKE_ROLE_ARN, PrimaryContainer={"Image": "x/y:1"},
                    Tags=OURS)  # what a killed deploy of ours left behind
    code, done = _run(capsys, "delete", "left-over", "--yes")
    assert code == 0 and done["deleted"] == ["model:left-over"]


def test_forced_rebuild_of_an_existing_tag_pushes_a_new_tag_never_the_immutable_one(local_aws):  # noqa: F811
    from gemma4_t4.sagemaker.build import build_t4_image
    from gemma4_t4.sagemaker.image import find_fixed_image, fixed_image_tag

    existing = fixed_image_tag()  # seeded: what an earlier build-image pushed
    ecr = boto3.client("ecr", region_name=REGION)
    before = ecr.describe_images(repositoryName="gemma4-t4-vllm")["imageDetails"]
    first = build_t4_image(
        REGION, force=True, poll_s=0, progress=False, on_build_succeeded=local_aws.seed_fixed_image
    )
    assert first.status == "SUCCEEDED" and first.build_id
    assert first.tag == f"{existing}-r2" and first.image_uri.endswith(f":{existing}-r2")
    second = build_t4_image(
        REGION, force=True, poll_s=0, progress=False, on_build_succeeded=local_aws.seed_fixed_image
    )
    assert second.tag == f"{existing}-r3"
    tags = {
        t
        for i in ecr.describe_images(repositoryName="gemma4-t4-vllm")["imageDetails"]
        for t in i["imageTags"]
    }
    assert tags == {existing, f"{existing}-r2", f"{existing}-r3"}
    assert {t for i in before for t in i["imageTags"]} == {existing}
    assert find_fixed_image(REGION).tag == f"{existing}-r3"  # a deploy takes the newest rebuild
    reused = build_t4_image(REGION, progress=False)  # without --force the existing tag is reused
    assert reused.status == "REUSED" and reused.tag == existing


def test_delete_keeps_an_endpoint_config_another_live_endpoint_uses(local_aws, capsys):  # noqa: F811
    """Two endpoints on one endpoint config (config and model named apart, so a check that read the
    model map for the config would delete the config under the live endpoint)."""
    sm = boto3.client("sagemaker", region_name=REGION)
    _chain(sm, "prod-a", "cfg-shared", "model-m")
    sm.create_endpoint(EndpointName="prod-b", EndpointConfigName="cfg-shared", Tags=OURS)
    code, planned = _run(capsys, "delete", "prod-a", "--dry-run")
    assert code == 0 and planned["kept"] == [
        "endpoint-config:cfg-shared (still used by endpoint prod-b)",
        "model:model-m (still used by endpoint prod-b)",
    ]
    code, done = _run(capsys, "delete", "prod-a", "--yes")
    assert code == 0 and done["deleted"] == ["endpoint:prod-a"] and done["kept"] == planned["kept"]
    assert done["plan"] == planned["plan"]
    assert sm.describe_endpoint_config(EndpointConfigName="cfg-shared")["ProductionVariants"]
    assert [m["ModelName"] for m in sm.list_models()["Models"]] == ["model-m"]
    assert sm.describe_endpoint(EndpointName="prod-b")["EndpointStatus"] == "InService"
    code, last = _run(capsys, "delete", "prod-b", "--yes")  # the last user: its whole chain goes
    assert last["deleted"] == ["endpoint:prod-b", "endpoint-config:cfg-shared", "model:model-m"]
    assert last["kept"] == [] and sm.list_endpoint_configs()["EndpointConfigs"] == []


def test_delete_keeps_a_model_another_of_our_endpoints_serves_through_its_own_config(local_aws, capsys):  # noqa: F811
    sm = boto3.client("sagemaker", region_name=REGION)
    _chain(sm, "prod-a", "cfg-a", "shared-m")
    _chain(sm, "prod-b", "cfg-b", "shared-m", create_model=False)
    code, done = _run(capsys, "delete", "prod-a", "--yes")
    assert code == 0 and done["deleted"] == ["endpoint:prod-a", "endpoint-config:cfg-a"]
    assert done["kept"] == ["model:shared-m (still used by endpoint prod-b)"]
    assert [c["EndpointConfigName"] for c in sm.list_endpoint_configs()["EndpointConfigs"]] == ["cfg-b"]
    assert [m["ModelName"] for m in sm.list_models()["Models"]] == ["shared-m"]


def test_delete_of_an_untagged_config_is_kept_and_our_model_under_it_goes(local_aws, capsys):  # noqa: F811
    """Each resource's own tag decides, not its neighbour's: our model under a config someone else
    made is deleted, their config is kept and named."""
    sm = boto3.client("sagemaker", region_name=REGION)
    sm.create_model(ModelName="our-m", ExecutionRoleArn=FAKE_ROLE_ARN, PrimaryContainer={"Image": "x/y:1"},
                    Tags=OURS)
    _chain(sm, "prod-c", "their-cfg", "our-m", create_model=False, ours=False)
    sm.add_tags(ResourceArn=sm.describe_endpoint(EndpointName="prod-c")["EndpointArn"], Tags=OURS)
    code, done = _run(capsys, "delete", "prod-c", "--yes")
    assert code == 0 and done["deleted"] == ["endpoint:prod-c", "model:our-m"]
    assert done["kept"] == ["endpoint-config:their-cfg (not created by gemma4-t4: no project tag)"]


def test_delete_sees_every_variant_of_a_config(local_aws, capsys):  # noqa: F811
    """A config with two variants: deleting its endpoint deletes both models; and a model another
    endpoint serves in its second variant is kept."""
    sm = boto3.client("sagemaker", region_name=REGION)
    for model in ("m-one", "m-two", "m-three"):
        sm.create_model(ModelName=model, ExecutionRoleArn=FAKE_ROLE_ARN, PrimaryContainer={"Image": "x/y:1"},
                        Tags=OURS)

    def two_variants(endpoint: str, config: str, first: str, second: str) -> None:
        variants = [
            {"VariantName": f"v{i}", "ModelName": m, "InitialInstanceCount": 1, "InstanceType": "ml.g4dn.xlarge"}
            for i, m in enumerate((first, second))
        ]
        sm.create_endpoint_config(EndpointConfigName=config, ProductionVariants=variants, Tags=OURS)
        sm.create_endpoint(EndpointName=endpoint, EndpointConfigName=config, Tags=OURS)

    two_variants("prod-a", "cfg-a", "m-one", "m-two")
    two_variants("prod-b", "cfg-b", "m-three", "m-two")  # shares prod-a's second variant's model
    code, done = _run(capsys, "delete", "prod-a", "--yes")
    assert code == 0 and done["deleted"] == ["endpoint:prod-a", "endpoint-config:cfg-a", "model:m-one"]
    assert done["kept"] == ["model:m-two (still used by endpoint prod-b)"]
    code, done = _run(capsys, "delete", "prod-b", "--yes")
    assert done["deleted"] == ["endpoint:prod-b", "endpoint-config:cfg-b", "model:m-three", "model:m-two"]


class _DenyingSageMakerStandIn:
    """A stand-in SageMaker client: moto's client, except that ``operation`` fails with ``code``
    (for every call, or only for the resource named ``only``)."""

    def __init__(self, sm, operation: str, code: str, message: str, only: str | None = None):
        self._sm, self._operation, self._code, self._message, self._only = sm, operation, code, message, only

    def __getattr__(self, name):
        call = getattr(self._sm, name)
        if name != self._operation:
            return call

        def failing(**params):
            if self._only is None or self._only in params.values():
                raise ClientError({"Error": {"Code": self._code, "Message": self._message}}, name)
            return call(**params)

        return failing


def test_an_aws_failure_while_planning_a_delete_names_the_call_and_resource(local_aws):  # noqa: F811
    sm = boto3.client("sagemaker", region_name=REGION)
    _chain(sm, "prod-a", "cfg-a", "model-a")
    _chain(sm, "prod-b", "cfg-b", "model-b")
    denied = _DenyingSageMakerStandIn(sm, "describe_endpoint_config", "AccessDeniedException", "no")
    with pytest.raises(Gemma4T4Error) as config_error:
        plan_delete(denied, "prod-a")
    assert str(config_error.value).startswith("DescribeEndpointConfig cfg-a failed: AccessDeniedException: no")
    denied = _DenyingSageMakerStandIn(sm, "describe_endpoint", "AccessDeniedException", "no", only="prod-b")
    with pytest.raises(Gemma4T4Error) as other_error:  # another endpoint's config cannot be read
        plan_delete(denied, "prod-a")
    assert str(other_error.value).startswith("DescribeEndpoint prod-b failed: AccessDeniedException: no")


def test_an_endpoint_gone_while_the_plan_lists_the_others_is_skipped(local_aws):  # noqa: F811
    sm = boto3.client("sagemaker", region_name=REGION)
    _chain(sm, "prod-a", "cfg-a", "model-a")
    _chain(sm, "prod-b", "cfg-b", "model-a", create_model=False)
    gone = _DenyingSageMakerStandIn(
        sm, "describe_endpoint", "ValidationException", "Could not find endpoint prod-b", only="prod-b"
    )
    plan = plan_delete(gone, "prod-a")  # prod-b no longer uses model-a: nothing is kept for it
    assert plan.resources == [("endpoint", "prod-a"), ("endpoint-config", "cfg-a"), ("model", "model-a")]
    assert plan.kept == []


def test_a_refused_delete_says_how_to_delete_anyway(local_aws):  # noqa: F811
    sm = boto3.client("sagemaker", region_name=REGION)
    _chain(sm, "theirs", "their-cfg", "their-m", ours=False)
    with pytest.raises(Gemma4T4Error) as refused:
        plan_delete(sm, "theirs")
    assert refused.value.fix == (
        "delete it with the AWS console or CLI, or with `gemma4-t4 sagemaker delete theirs --not-ours --yes` "
        "(the CLI only: the MCP delete_endpoint never deletes an endpoint this project did not create)"
    )
    plan = plan_delete(sm, "theirs", not_ours=True)  # the whole untagged chain goes
    assert plan.resources == [("endpoint", "theirs"), ("endpoint-config", "their-cfg"), ("model", "their-m")]
    assert plan.kept == []


def test_a_model_several_endpoints_use_is_kept_naming_them_all(local_aws):  # noqa: F811
    sm = boto3.client("sagemaker", region_name=REGION)
    _chain(sm, "prod-a", "cfg-a", "shared-m")
    _chain(sm, "prod-c", "cfg-c", "shared-m", create_model=False)
    _chain(sm, "prod-b", "cfg-b", "shared-m", create_model=False)
    plan = plan_delete(sm, "prod-a")
    assert plan.kept == ["model:shared-m (still used by endpoint prod-b, prod-c)"]


def test_the_delete_plan_of_a_chain_and_scaling_goes_through_its_own_service():
    chain = [("endpoint", "ep"), ("endpoint-config", "ep"), ("model", "ep")]
    assert [(c.service, c.operation, c.params, c.region) for c in delete_plan(chain, REGION)] == [
        ("sagemaker", "delete_endpoint", {"EndpointName": "ep"}, REGION),
        ("sagemaker", "delete_endpoint_config", {"EndpointConfigName": "ep"}, REGION),
        ("sagemaker", "delete_model", {"ModelName": "ep"}, REGION),
    ]
    [call] = delete_plan([("autoscaling", "endpoint/ep/variant/AllTraffic")], REGION)
    assert (call.service, call.operation) == ("application-autoscaling", "deregister_scalable_target")
    assert call.params["ResourceId"] == "endpoint/ep/variant/AllTraffic"
    assert call.cli().startswith("# also removes the target-tracking policy\naws application-autoscaling ")
