"""What a SageMaker user sees from the deployment config and the deploy itself, pinned where the other
SageMaker tests leave it loose: each refusal's boundary and words, the exact CreateModel /
CreateEndpointConfig / CreateEndpoint parameters, the dry run's plan, the rollback's order and the
failover's choices. Everything runs in process against small fake AWS clients (no moto, no network)."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from botocore.exceptions import ClientError
from pydantic import ValidationError

from gemma4_t4.catalog.hardware import SAGEMAKER_INSTANCES
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation import secrets
from gemma4_t4.foundation.launch_record import assistant_boundary, declared, offered_default, user_settings
from gemma4_t4.sagemaker.config import (
    DeployConfig,
    auto_tensor_parallel,
    check_assistant_env,
    create_bucket_params,
    default_region,
    extra_args_to_env,
    validate_name,
)
from gemma4_t4.sagemaker.deploy import (
    DeployFailed,
    DeploymentWatcher,
    DeployResult,
    TimelineEvent,
    autoscaling_calls,
    check_model_data,
    deploy,
    deploy_cost,
    deploy_in_background,
    deploy_with_failover,
    deployment_calls,
    deployment_plan,
    describe_deleted,
    is_capacity_failure,
    rollback,
    wait_in_service,
    with_fixed_image,
)
from gemma4_t4.sagemaker.deploy import run_deploy as deploy_flow  # run_deploy below is this file's helper
from gemma4_t4.sagemaker.image import DEFAULT_VLLM_TAG, fixed_image_tag

ROLE = "arn:aws:iam::123456789012:role/sm-exec"
ROLE_ENV = "GEMMA4_T4_SAGEMAKER_ROLE_ARN"
FIXED = f"123456789012.dkr.ecr.us-east-2.amazonaws.com/gemma4-t4-vllm:{fixed_image_tag()}"
STOCK = f"763104351884.dkr.ecr.us-east-2.amazonaws.com/vllm:{DEFAULT_VLLM_TAG}"
NOW = dt.datetime(2026, 11, 1, 12, 0, tzinfo=dt.UTC)


def refusal(require_role: bool = False, **change: object) -> Gemma4T4Error:
    """The error building the config raises (or, ``require_role``, checking its role; the test fails where
    neither raises)."""
    with pytest.raises(Gemma4T4Error) as info:
        config = DeployConfig(**change)
        if require_role:
            config.check_role()
    return info.value


# -- the region, names and buckets --------------------------------------------------------------------


def test_the_region_is_the_given_one_then_aws_region_then_aws_default_region_then_us_east_2(monkeypatch):
    """The CLI and the MCP server pick the region as the AWS CLI does: AWS_REGION before
    AWS_DEFAULT_REGION, us-east-2 where neither is set, and an explicit region over both."""
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    assert default_region() == "us-east-2"
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    assert default_region() == "eu-west-1"
    monkeypatch.setenv("AWS_REGION", "us-west-2")
    assert default_region() == "us-west-2"
    assert default_region("ap-south-1") == "ap-south-1"


@pytest.mark.parametrize("name", ["a", "g4-t4", "A" * 63, "a-b--c", "9x"])
def test_sagemaker_names_of_1_to_63_letters_digits_and_inner_hyphens_are_taken(name):
    """SageMaker's own rule: up to 63 characters, hyphens only between letters or digits."""
    validate_name(name)


@pytest.mark.parametrize("name", ["", "A" * 64, "-lead", "trail-", "a_b", "a/b", "a.b"])
def test_other_endpoint_names_are_refused_naming_the_rule(name):
    """A name SageMaker would refuse is refused here first, with the rule to follow."""
    with pytest.raises(Gemma4T4Error) as info:
        validate_name(name)
    assert info.value.message == f"invalid endpoint name {name!r}"
    assert info.value.fix == "use 1-63 letters, digits and hyphens, starting with a letter or digit"


def test_a_bucket_outside_us_east_1_names_its_region_and_one_in_us_east_1_does_not():
    """S3 refuses a LocationConstraint of us-east-1 and needs one everywhere else."""
    assert create_bucket_params("b", "us-east-1") == {"Bucket": "b"}
    assert create_bucket_params("b", "eu-west-1") == {
        "Bucket": "b",
        "CreateBucketConfiguration": {"LocationConstraint": "eu-west-1"},
    }


def test_shown_environments_hide_tokens_but_not_token_counts():
    """A dry run or an MCP answer masks HF_TOKEN and keeps the batched-token limit readable."""
    shown = secrets.mask_env({"HF_TOKEN": "hf_abcdef123456", "SM_VLLM_MAX_NUM_BATCHED_TOKENS": "2048", "A": "b"})
    assert shown["HF_TOKEN"] != "hf_abcdef123456" and "hf_" not in shown["HF_TOKEN"]
    assert shown["SM_VLLM_MAX_NUM_BATCHED_TOKENS"] == "2048" and shown["A"] == "b"


# -- vLLM flags as container variables ----------------------------------------------------------------


def test_vllm_flags_become_the_containers_variables():
    """`--flag value`, `--flag=value` and a bare switch, as the container's launcher reads them back."""
    env = extra_args_to_env(
        ["--enforce-eager", "--swap-space=4", "--seed", "7", "--kv-cache-dtype=fp8=x", "--disable-log-stats"]
    )
    assert env == {
        "SM_VLLM_ENFORCE_EAGER": "true",
        "SM_VLLM_SWAP_SPACE": "4",
        "SM_VLLM_SEED": "7",
        "SM_VLLM_KV_CACHE_DTYPE": "fp8=x",
        "SM_VLLM_DISABLE_LOG_STATS": "true",
    }


def test_a_switch_followed_by_another_flag_stays_a_switch():
    """`--enforce-eager --max-num-seqs 2` is a switch and a flag with its value, not one flag valued '--max-num-seqs'."""
    assert extra_args_to_env(["--enforce-eager", "--max-num-seqs", "2"]) == {
        "SM_VLLM_ENFORCE_EAGER": "true",
        "SM_VLLM_MAX_NUM_SEQS": "2",
    }
    assert extra_args_to_env([]) == {}


@pytest.mark.parametrize(
    "args, bad",
    [
        (["enforce-eager"], "enforce-eager"),
        (["-x"], "-x"),
        (["--Seed=1"], "--Seed=1"),
        (["--seed", "1", "2"], "2"),
        (["--"], "--"),
    ],
)
def test_a_value_that_is_not_a_long_flag_is_refused_by_name(args, bad):
    """A stray value or a short flag is refused, quoting the argument the user typed."""
    with pytest.raises(Gemma4T4Error) as info:
        extra_args_to_env(args)
    assert info.value.message == f"extra vLLM argument {bad!r} is not a --long-flag"
    assert info.value.fix == "pass flags like ['--enforce-eager', '--max-num-batched-tokens', '1024']"


# -- what an assistant may set ------------------------------------------------------------------------


def test_an_assistant_sets_the_allow_listed_vllm_switches_with_their_values():
    """An MCP client may set the five allow-listed vLLM switches, a number given as a number too."""
    check_assistant_env(
        {
            "SM_VLLM_ENFORCE_EAGER": "true",
            "SM_VLLM_ENABLE_PREFIX_CACHING": "false",
            "SM_VLLM_MAX_NUM_BATCHED_TOKENS": 1024,
            "SM_VLLM_BLOCK_SIZE": "128",
            "SM_VLLM_SWAP_SPACE": "0",
        }
    )
    check_assistant_env({})


@pytest.mark.parametrize(
    "key, value",
    [
        ("SM_VLLM_ENFORCE_EAGER", "yes"),
        ("SM_VLLM_ENFORCE_EAGER", "true; rm"),
        ("SM_VLLM_BLOCK_SIZE", "1281"),
        ("SM_VLLM_MAX_NUM_BATCHED_TOKENS", "0"),
        ("SM_VLLM_SWAP_SPACE", "1000"),
    ],
)
def test_an_allow_listed_variable_takes_only_its_whole_values(key, value):
    """The whole value must match: `true; rm` is not `true`."""
    with pytest.raises(Gemma4T4Error) as info:
        check_assistant_env({key: value})
    assert info.value.message == f"extra_env {key}={value!r} is not a value it takes"
    assert info.value.fix.startswith("use ")


# -- settings as the CLI and MCP give them ------------------------------------------------------------


def test_each_config_has_its_own_lists_and_variables():
    """Two configs never share a list: one's extra flags do not leak into the next deploy."""
    first, second = DeployConfig(), DeployConfig()  # frozen, but a list inside could still be changed
    first.extra_args.append("--enforce-eager")
    first.extra_env["X"] = "1"
    first.fallback_instance_types.append("ml.g6.xlarge")
    assert second.extra_args == [] and second.extra_env == {} and second.fallback_instance_types == []


def test_the_settings_name_their_flags_parameters_and_left_out_defaults():
    """The CLI flag and MCP parameter of each setting, and what a user who passes nothing gets."""
    settings = user_settings(DeployConfig)
    assert declared(settings["extra_args"])["flag"] == "--vllm-arg" and "flag" not in declared(settings["max_model_len"])
    assert offered_default(settings["max_model_len"]) is None and settings["max_model_len"].annotation == int | None
    assert offered_default(settings["region"]) is None and offered_default(settings["extra_env"]) is None
    assert "instance_count" not in settings  # not a user's setting
    assert settings["ttl_hours"].description.startswith("lifetime in hours, a cost guard")
    # the MCP boundary travels with each setting: the role is a person's, the context length bounded
    role, context = assistant_boundary(settings["role_arn"]), assistant_boundary(settings["max_model_len"])
    assert role["sets"] is False and ROLE_ENV in role["why"]
    assert context["sets"] is True and (context["ge"], context["le"]) == (256, 1_048_576)


def test_settings_left_out_keep_their_defaults_and_the_region_follows_the_environment(monkeypatch):
    """An MCP client that sends null for a setting gets its default, never None."""
    monkeypatch.setenv("AWS_REGION", "us-west-2")
    config = DeployConfig.from_settings(
        name="g4-x", max_model_len=None, extra_args=["--enforce-eager"], region=None, draft=None
    )
    assert config.region == "us-west-2" and config.max_model_len == 8192 and config.draft == "off"
    assert config.extra_args == ["--enforce-eager"] and config.name == "g4-x"
    assert DeployConfig.from_settings(region="eu-west-1").region == "eu-west-1"


def test_inference_ami_none_means_no_ami_and_auto_stays_auto():
    """`--inference-ami-version none` sends no AMI; leaving it out keeps 'auto'."""
    cu114 = "123456789012.dkr.ecr.us-east-2.amazonaws.com/x:1.0-gpu-cu114"  # needs no newer driver
    assert DeployConfig.from_settings(inference_ami_version="none", instance_type="ml.g6.xlarge", image_uri=cu114,
                                      region="us-east-2").inference_ami_version is None
    assert DeployConfig.from_settings(inference_ami_version=None).inference_ami_version == "auto"


def test_a_scaling_target_alone_is_refused_and_with_instances_taken():
    """A scaling target without min/max instances would be ignored, so it is refused; with either it is kept."""
    with pytest.raises(Gemma4T4Error) as info:
        DeployConfig.from_settings(scaling_target=8)
    assert (
        info.value.message
        == "--scaling-target applies only to an autoscaled endpoint; alone it would be ignored"
    )
    assert "--min-instances" in info.value.fix
    assert DeployConfig.from_settings(scaling_target=8, max_instances=3).scaling_target == 8
    assert DeployConfig.from_settings(scaling_target=8, min_instances=2).scaling_target == 8
    assert DeployConfig.from_settings(scaling_target=None).scaling_target is None  # not autoscaled: none sent
    assert DeployConfig.from_settings(min_instances=2).scaling_target == 4.0


def test_a_setting_no_deploy_has_is_refused():
    """A misspelt setting is an error naming it, not silently dropped."""
    with pytest.raises(TypeError, match="no_such_setting"):
        DeployConfig.from_settings(no_such_setting=1)


def test_an_image_given_is_labelled_given_and_a_tag_given_is_pinned():
    """The dry run says where the image came from: the user's URI or the tag they pinned, resolved when the
    config is built (it is frozen after)."""
    config = DeployConfig.from_settings(look_up_image_tag=True, image_uri=FIXED)
    assert config.image_label == f"{FIXED} (given)"
    tag = "0.29.0-gpu-py312-cu130-ubuntu24.04-sagemaker-v1.3"
    other = DeployConfig.from_settings(look_up_image_tag=True, image_tag=tag)
    assert other.image_label == f"{tag} (given)" and other.image_tag == tag
    with pytest.raises(ValidationError):
        other.image_tag = "0.30.0-gpu-py312-cu130-ubuntu24.04-sagemaker-v1.1"


# -- derived values -----------------------------------------------------------------------------------


def test_the_dtype_is_float16_on_a_t4_and_bfloat16_elsewhere_unless_given():
    """Turing has no bf16: float16 on a T4, bfloat16 on L4/A10G, the user's dtype where given."""
    assert DeployConfig().resolved_dtype() == "float16"
    assert DeployConfig(instance_type="ml.g6.xlarge").resolved_dtype() == "bfloat16"
    assert DeployConfig(instance_type="ml.g5.xlarge", dtype="float32").resolved_dtype() == "float32"


def test_the_role_is_the_given_one_else_the_environments(monkeypatch):
    """The execution role is the one passed, else $GEMMA4_T4_SAGEMAKER_ROLE_ARN; an empty variable is no role."""
    monkeypatch.delenv(ROLE_ENV, raising=False)
    assert DeployConfig().resolved_role() is None
    monkeypatch.setenv(ROLE_ENV, "")
    assert DeployConfig().resolved_role() is None
    monkeypatch.setenv(ROLE_ENV, ROLE)
    assert DeployConfig().resolved_role() == ROLE
    assert (
        DeployConfig(role_arn="arn:aws:iam::111122223333:role/r").resolved_role()
        == "arn:aws:iam::111122223333:role/r"
    )


def test_any_t4_in_the_pool_needs_the_fixed_image_unless_opted_out():
    """A T4 anywhere in the instance pool needs the Turing-fixed image, unless the user opts out."""
    mixed = DeployConfig(
        instance_type="ml.g6.xlarge", fallback_instance_types=["ml.g4dn.2xlarge", "ml.g5.xlarge"], dtype="float16"
    )
    assert mixed.turing_instance_types == ["ml.g4dn.2xlarge"] and mixed.needs_fixed_image
    assert not DeployConfig(instance_type="ml.g6.xlarge").needs_fixed_image
    assert not DeployConfig(allow_unfixed_image=True).needs_fixed_image


def test_the_image_is_the_given_one_else_the_planned_fixed_one_on_t4_else_the_stock_dlc():
    """The image a deploy plans: the user's, the fixed image in their ECR on a T4, else AWS's DLC."""
    assert DeployConfig(image_uri=STOCK, allow_unfixed_image=True).resolved_image() == STOCK
    planned = DeployConfig(region="us-west-2").resolved_image()
    assert planned == f"<ACCOUNT>.dkr.ecr.us-west-2.amazonaws.com/gemma4-t4-vllm:{fixed_image_tag()}"
    assert DeployConfig(instance_type="ml.g6.xlarge", region="us-west-2").resolved_image() == (
        f"763104351884.dkr.ecr.us-west-2.amazonaws.com/vllm:{DEFAULT_VLLM_TAG}"
    )


def test_instances_autoscaling_and_the_worst_case_count():
    """How many instances start, and the most that can be billed, with and without autoscaling."""
    plain = DeployConfig(instance_count=2)
    assert not plain.autoscaling and plain.initial_instances == 2 and plain.billed_instances_at_most == 2
    low_only = DeployConfig(min_instances=3)
    assert low_only.autoscaling and low_only.initial_instances == 3 and low_only.billed_instances_at_most == 3
    high_only = DeployConfig(max_instances=4)
    assert (
        high_only.autoscaling and high_only.initial_instances == 1 and high_only.billed_instances_at_most == 4
    )
    assert DeployConfig(name="g4-a").scaling_resource_id() == "endpoint/g4-a/variant/AllTraffic"


def test_the_ami_is_the_newest_any_pool_member_needs_or_none_or_the_given_one():
    """One AMI per variant: a CUDA 13 image needs the driver-580 AMI on every pool member."""
    assert DeployConfig().resolved_ami_version() == "al2023-ami-sagemaker-inference-gpu-4-1"
    cu124 = STOCK.replace(DEFAULT_VLLM_TAG, "0.8.0-gpu-py312-cu124-ubuntu22.04-sagemaker-v1.0")
    older = DeployConfig(instance_type="ml.g6.xlarge", image_uri=cu124)
    assert older.resolved_ami_version() == "al2-ami-sagemaker-inference-gpu-3-1"
    cu114 = "123456789012.dkr.ecr.us-east-2.amazonaws.com/x:1.0-gpu-cu114"
    assert DeployConfig(instance_type="ml.g6.xlarge", image_uri=cu114).resolved_ami_version() is None
    given = DeployConfig(instance_type="ml.g6.xlarge", image_uri=cu114, inference_ami_version="al2-ami-sagemaker-inference-gpu-2")
    assert given.resolved_ami_version() == "al2-ami-sagemaker-inference-gpu-2"
    mixed = DeployConfig(
        instance_type="ml.g6.xlarge",
        fallback_instance_types=["ml.g4dn.xlarge"],
        image_uri=STOCK.replace(DEFAULT_VLLM_TAG, "0.30.0-gpu-py312-cu129-ubuntu24.04-sagemaker-v1.1"),
        allow_unfixed_image=True,
        dtype="float16",
    )
    assert mixed.resolved_ami_version() == "al2-ami-sagemaker-inference-gpu-3-1"


def test_the_container_gets_the_model_its_short_name_and_the_launch_limits():
    """The container's variables: the model (or the uploaded folder), its served name and the limits."""
    env = DeployConfig(
        model_id="google/gemma-4-E4B-it", max_model_len=4096, max_num_seqs=2, gpu_memory_utilization=0.85
    ).container_env()
    assert env == {
        "SM_VLLM_MODEL": "google/gemma-4-E4B-it",
        "SM_VLLM_SERVED_MODEL_NAME": "gemma-4-E4B-it",
        "SM_VLLM_DTYPE": "float16",
        "SM_VLLM_MAX_MODEL_LEN": "4096",
        "SM_VLLM_MAX_NUM_SEQS": "2",
        "SM_VLLM_GPU_MEMORY_UTILIZATION": "0.85",
    }
    named = DeployConfig(
        model_id="google/gemma-4-E4B-it", served_model_name="g4", model_data_s3_uri="s3://my-bucket/e4b/"
    ).container_env()
    assert named["SM_VLLM_MODEL"] == "/opt/ml/model" and named["SM_VLLM_SERVED_MODEL_NAME"] == "g4"
    assert DeployConfig(model_id="plain").container_env()["SM_VLLM_SERVED_MODEL_NAME"] == "plain"


def test_tensor_parallelism_is_sent_only_above_one_gpu():
    """On ml.g4dn.12xlarge the 31B needs all four T4s; the E2B runs on one and sends nothing."""
    big = DeployConfig(instance_type="ml.g4dn.12xlarge", model_id="google/gemma-4-31B-it")
    assert big.resolved_tensor_parallel_size() == 4
    assert big.container_env()["SM_VLLM_TENSOR_PARALLEL_SIZE"] == "4"
    small = DeployConfig(instance_type="ml.g4dn.12xlarge")
    assert (
        small.resolved_tensor_parallel_size() == 1
        and "SM_VLLM_TENSOR_PARALLEL_SIZE" not in small.container_env()
    )
    assert (
        DeployConfig(instance_type="ml.g4dn.12xlarge", tensor_parallel_size=2).container_env()[
            "SM_VLLM_TENSOR_PARALLEL_SIZE"
        ]
        == "2"
    )


def test_extra_flags_then_extra_variables_win_over_everything_derived():
    """--vllm-arg overrides what the config derives, and --env overrides both."""
    env = DeployConfig(
        extra_args=["--max-num-seqs", "8", "--dtype=half"], extra_env={"SM_VLLM_MAX_NUM_SEQS": "6"}
    ).container_env()
    assert env["SM_VLLM_MAX_NUM_SEQS"] == "6" and env["SM_VLLM_DTYPE"] == "half"


def test_a_draft_sends_its_speculative_config_and_a_local_folder_is_refused(tmp_path):
    """A drafter reaches the container as SM_VLLM_SPECULATIVE_CONFIG; a local folder it cannot read is refused."""
    auto = json.loads(DeployConfig(draft="auto").container_env()["SM_VLLM_SPECULATIVE_CONFIG"])
    assert auto == {"model": "google/gemma-4-E2B-it-assistant", "num_speculative_tokens": 2}
    tuned = json.loads(
        DeployConfig(draft="auto", num_draft_tokens=5).container_env()["SM_VLLM_SPECULATIVE_CONFIG"]
    )
    assert tuned["num_speculative_tokens"] == 5
    assert "SM_VLLM_SPECULATIVE_CONFIG" not in DeployConfig().container_env()
    # --draft self drafts with the container's own copy of the target: its folder where the weights are uploaded
    own = DeployConfig(model_id="some/other-model", draft="self", model_data_s3_uri="s3://my-bucket/m/")
    assert json.loads(own.container_env()["SM_VLLM_SPECULATIVE_CONFIG"])["model"] == "/opt/ml/model"
    hub = DeployConfig(model_id="some/other-model", draft="self")
    assert json.loads(hub.container_env()["SM_VLLM_SPECULATIVE_CONFIG"])["model"] == "some/other-model"
    with pytest.raises(Gemma4T4Error) as info:
        DeployConfig(draft=str(tmp_path)).draft_plan()
    assert (
        info.value.message
        == f"--draft {tmp_path} is a local folder, which the SageMaker container cannot read"
    )


# -- the create calls' parameters ---------------------------------------------------------------------


def test_the_variant_names_the_model_instances_timeouts_and_driver():
    """CreateEndpointConfig's variant carries the model, instance count, both timeouts, type and AMI."""
    variant = DeployConfig(
        name="g4-v",
        instance_count=2,
        startup_timeout_s=900,
        download_timeout_s=600,
        instance_type="ml.g6.xlarge",
    ).production_variant()
    assert variant == {
        "VariantName": "AllTraffic",
        "ModelName": "g4-v",
        "InitialInstanceCount": 2,
        "ContainerStartupHealthCheckTimeoutInSeconds": 900,
        "ModelDataDownloadTimeoutInSeconds": 600,
        "InstanceType": "ml.g6.xlarge",
        "InferenceAmiVersion": "al2023-ami-sagemaker-inference-gpu-4-1",
    }
    assert DeployConfig(min_instances=3, max_instances=5).production_variant()["InitialInstanceCount"] == 3


def test_uploaded_weights_are_mounted_uncompressed_and_hub_weights_are_not():
    """Weights uploaded to S3 are mounted as an uncompressed prefix; Hub weights need no model data."""
    container = DeployConfig(image_uri=FIXED, model_data_s3_uri="s3://my-bucket/e2b/").primary_container()
    assert container["Image"] == FIXED
    assert container["ModelDataSource"] == {
        "S3DataSource": {"S3Uri": "s3://my-bucket/e2b/", "S3DataType": "S3Prefix", "CompressionType": "None"}
    }
    assert "ModelDataSource" not in DeployConfig().primary_container()


def test_every_resource_is_tagged_with_its_owner_lifetime_and_expiry():
    """Every resource carries the tags `reap` reads: owner, lifetime, expiry, model; the user's tags win."""
    tags = DeployConfig(ttl_hours=1.5, created_by="ci", tags={"team": "ml", "project": "mine"}).resource_tags(
        NOW
    )
    assert tags == [
        {"Key": "project", "Value": "mine"},
        {"Key": "created-by", "Value": "ci"},
        {"Key": "gemma4-t4:ttl-hours", "Value": "1.5"},
        {"Key": "gemma4-t4:expires-at", "Value": "2026-11-01T13:30:00Z"},
        {"Key": "model-id", "Value": "google/gemma-4-E2B-it"},
        {"Key": "team", "Value": "ml"},
    ]
    scaled = dict(
        (t["Key"], t["Value"]) for t in DeployConfig(min_instances=1, max_instances=3).resource_tags(NOW)
    )
    assert scaled["gemma4-t4:autoscaling"] == "1..3" and scaled["project"] == "gemma4-t4"
    long_id = "org/" + "/".join(["m" * 200] * 2)
    assert (
        len(
            dict((t["Key"], t["Value"]) for t in DeployConfig(model_id=long_id).resource_tags(NOW))[
                "model-id"
            ]
        )
        == 256
    )
    assert DeployConfig(ttl_hours=2).expires_at(NOW) == NOW + dt.timedelta(hours=2)
    assert abs((DeployConfig(ttl_hours=2).expires_at() - dt.datetime.now(dt.UTC)).total_seconds() - 7200) < 60


def test_the_summary_shows_what_a_deploy_will_be_with_secrets_masked():
    """The dry run's and MCP config tool's summary: every field, HF_TOKEN masked."""
    summary = DeployConfig(
        name="g4-s",
        extra_env={"HF_TOKEN": "hf_secret_value"},
        ttl_hours=2,
        model_data_s3_uri="s3://my-bucket/e2b/",
    ).summary()
    assert summary["name"] == "g4-s" and summary["region"] == "us-east-2"
    assert summary["model_id"] == "google/gemma-4-E2B-it" and summary["instance_types"] == ["ml.g4dn.xlarge"]
    assert summary["image"].startswith("<ACCOUNT>.dkr.ecr.us-east-2.amazonaws.com/gemma4-t4-vllm:")
    assert summary["inference_ami_version"] == "al2023-ami-sagemaker-inference-gpu-4-1"
    assert (
        summary["dtype"] == "float16" and summary["ttl_hours"] == 2 and summary["turing_fix_required"] is True
    )
    assert summary["model_data"] == "s3://my-bucket/e2b/" and summary["instances"] == "1"
    assert "hf_secret_value" not in json.dumps(summary) and "HF_TOKEN" in summary["container_env"]
    assert DeployConfig(min_instances=2, max_instances=4).summary()["instances"] == "2..4 (autoscaling)"
    assert DeployConfig(instance_count=3).summary()["instances"] == "3"


# -- tensor parallelism by the fit calculator ---------------------------------------------------------


def test_the_fit_calculator_picks_the_smallest_tensor_parallel_size_that_fits():
    """ml.g4dn.12xlarge has four T4s: the E2B fits on one, the 31B QAT build on two, the 31B needs four."""
    assert auto_tensor_parallel("google/gemma-4-E2B-it", "ml.g4dn.12xlarge") == 1
    assert auto_tensor_parallel("google/gemma-4-31B-it-qat-w4a16", "ml.g4dn.12xlarge") == 2
    assert auto_tensor_parallel("google/gemma-4-31B-it", "ml.g4dn.12xlarge") == 4
    assert auto_tensor_parallel("google/gemma-4-31B-it", "ml.g4dn.xlarge") == 1  # one GPU: nothing to split
    assert auto_tensor_parallel("google/gemma-4-31B-it", "ml.unknown") == 1
    assert auto_tensor_parallel("my/local-model", "ml.g4dn.12xlarge") == 1  # unknown to the calculator


def test_a_long_context_needs_more_gpus():
    """The 31B QAT build fits two T4s at 16k tokens per sequence and needs four at 32k."""
    assert auto_tensor_parallel("google/gemma-4-31B-it-qat-w4a16", "ml.g4dn.12xlarge", 16384) == 2
    assert auto_tensor_parallel("google/gemma-4-31B-it-qat-w4a16", "ml.g4dn.12xlarge", 32768) == 4
    config = DeployConfig(instance_type="ml.g4dn.12xlarge", model_id="google/gemma-4-31B-it-qat-w4a16")
    assert config.resolved_tensor_parallel_size() == 2
    assert config.replaced(max_model_len=32768).resolved_tensor_parallel_size() == 4


@pytest.mark.parametrize("suffix", ["-qat-w4a16", "-QAT", "-w4a16", "-int4", "-emb4"])
def test_a_quantized_build_named_in_the_model_id_fits_on_fewer_gpus(suffix):
    """The build is read from the id, in any case: a 4-bit 31B fits on two T4s where the bf16 one needs four."""
    assert auto_tensor_parallel("google/gemma-4-31B-it" + suffix, "ml.g4dn.12xlarge") == 2


# -- validation: each refusal at its boundary ---------------------------------------------------------


def test_a_default_t4_config_with_a_role_is_valid(monkeypatch):
    """The defaults deploy on a T4 as they are."""
    monkeypatch.delenv(ROLE_ENV, raising=False)
    DeployConfig(role_arn=ROLE).check_role()
    DeployConfig()


@pytest.mark.parametrize(
    "change",
    [
        {"max_model_len": 256},
        {"max_num_seqs": 1},
        {"gpu_memory_utilization": 0.1},
        {"gpu_memory_utilization": 0.99},
        {"startup_timeout_s": 60},
        {"startup_timeout_s": 3600},
        {"download_timeout_s": 60},
        {"download_timeout_s": 3600},
        {"ttl_hours": 168},
        {"ttl_hours": 0.01},
        {"tensor_parallel_size": 1},
        {"model_id": "/".join(["a" * 200] * 5) + "b" * 20},
        {"min_instances": 1, "max_instances": 20},
        {"min_instances": 20},
        {"max_instances": 20},
        {"min_instances": 1, "scaling_target": 10_000},
        {"min_instances": 1, "scaling_target": 0.5},
        {"min_instances": 1, "scale_in_cooldown_s": 0, "scale_out_cooldown_s": 3600},
        {"min_instances": 1, "scale_in_cooldown_s": 3600, "scale_out_cooldown_s": 0},
        {"extra_env": {"SM_VLLM_DTYPE": "half"}},
        {"extra_env": {"_X9": "1"}},
        {"dtype": "float32"},
        {"instance_type": "ml.g6.xlarge", "dtype": "bfloat16"},
        {"instance_type": "ml.g6.xlarge", "extra_env": {"SM_VLLM_DTYPE": "auto"}},
        {"model_data_s3_uri": "s3://<account>-bucket/models/e2b/"},
        {"model_data_s3_uri": "s3://abc/"},
        {"served_model_name": "g4.e2b_it-1"},
        {"model_id": "/opt/ml/model"},
        {"instance_type": "ml.g4dn.12xlarge", "extra_env": {"SM_VLLM_TENSOR_PARALLEL_SIZE": "4"}},
    ],
)
def test_values_at_the_edge_of_what_sagemaker_and_vllm_accept_are_taken(change):
    """Each limit's own edge is accepted: a user at the boundary is not refused."""
    DeployConfig(**change)


@pytest.mark.parametrize(
    "change, message, fix",
    [
        ({"max_model_len": 255}, "max_model_len=255 must be >= 256", "T4 defaults: max_model_len=8192, max_num_seqs=4"),
        ({"max_num_seqs": 0}, "max_num_seqs=0 must be >= 1", "leave it out for the venue's default, or pass a count such as 4"),
        # the shared floor answers first; its fix names SageMaker's own floor, so following it is not refused again
        ({"max_model_len": 0}, "max_model_len=0 must be >= 1",
         "leave it out for the venue's default, or pass a context such as 4096 (a SageMaker endpoint needs at least 256)"),
        (
            {"gpu_memory_utilization": 0.09},
            "gpu_memory_utilization=0.09 must be in 0.1..0.99",
            "use a value such as 0.90",
        ),
        ({"gpu_memory_utilization": 0.995}, "gpu_memory_utilization=0.995 must be in 0.1..0.99", None),
        (
            {"startup_timeout_s": 59},
            "startup_timeout_s=59 must be in 60..3600",
            "use 1800 for a first start that downloads weights",
        ),
        ({"startup_timeout_s": 3601}, "startup_timeout_s=3601 must be in 60..3600", None),
        ({"download_timeout_s": 59}, "download_timeout_s=59 must be in 60..3600", None),
        ({"download_timeout_s": 3601}, "download_timeout_s=3601 must be in 60..3600", None),
        (
            {"ttl_hours": 0},
            "ttl_hours=0 must be in (0, 168]",
            "choose a lifetime such as 4 hours; `reap` deletes endpoints past it",
        ),
        ({"ttl_hours": 168.5}, "ttl_hours=168.5 must be in (0, 168]", None),
        ({"tensor_parallel_size": -1}, "tensor_parallel_size=-1 must be >= 0", None),
        ({"instance_count": 0}, "instance_count=0 must be >= 1", None),
        ({"scaling_target": 3}, "--scaling-target applies only to an autoscaled endpoint", None),
        (
            {"extra_env": {"9X": "1"}},
            "invalid environment variable name '9X'",
            "use letters, digits and underscores, not starting with a digit",
        ),
        ({"extra_env": {"A-B": "1"}}, "invalid environment variable name 'A-B'", None),
        (
            {"extra_env": {"SM_VLLM_DTYPE": "fp8"}},
            "unknown dtype 'fp8'",
            "use float16 on T4, bfloat16 on L4/A10G",
        ),
        (
            {"dtype": "bfloat16"},
            "dtype bfloat16 on ml.g4dn.xlarge (T4, sm_75): Turing has no bf16 and vLLM refuses it",
            "use dtype='float16' (the T4 default) and drop the bf16 override",
        ),
        (
            {"extra_env": {"SM_VLLM_DTYPE": "auto"}},
            "dtype auto on ml.g4dn.xlarge (T4, sm_75): Turing has no bf16 and "
            "vLLM refuses it (set through --env SM_VLLM_DTYPE or --vllm-arg)",
            None,
        ),
        (
            {
                "instance_type": "ml.g6.xlarge",
                "fallback_instance_types": ["ml.g4dn.2xlarge"],
                "extra_args": ["--dtype=bfloat16"],
            },
            "dtype bfloat16 on ml.g4dn.2xlarge (T4, sm_75): Turing has no bf16 and vLLM refuses it",
            None,
        ),
        (
            {"extra_env": {"SM_VLLM_TENSOR_PARALLEL_SIZE": "0"}},
            "tensor parallel size '0' is not a positive integer",
            "use 1, 2 or 4 (or 0 for the fit calculator's choice)",
        ),
        (
            {"extra_env": {"SM_VLLM_TENSOR_PARALLEL_SIZE": "two"}},
            "tensor parallel size 'two' is not a positive integer",
            None,
        ),
        (
            {"instance_type": "ml.g4dn.12xlarge", "tensor_parallel_size": 8},
            "tensor_parallel_size=8 but ml.g4dn.12xlarge has 4 GPU(s)",
            "lower tensor_parallel_size or pick a multi-GPU instance such as ml.g4dn.12xlarge",
        ),
        (
            {
                "instance_type": "ml.g4dn.12xlarge",
                "fallback_instance_types": ["ml.g6.xlarge"],
                "tensor_parallel_size": 2,
                "image_uri": FIXED,
            },
            "tensor_parallel_size=2 but ml.g6.xlarge has 1 GPU(s)",
            None,
        ),
        (
            {"fallback_instance_types": ["ml.g4dn.xlarge"]},
            "an instance type appears twice in the pool list",
            "list each fallback instance type once",
        ),
        ({"instance_type": "ml.p3.2xlarge"}, "unsupported SageMaker instance type 'ml.p3.2xlarge'", None),
        ({"model_id": ""}, "model_id is empty", "pass a Hugging Face id such as google/gemma-4-E2B-it"),
        ({"model_id": "a" * 1025}, "has a part longer than 255 bytes", None),
        ({"model_id": "org/" * 300}, "model_id is 1,200 characters long: no model id is", None),
        (
            {"model_id": "org/model name"},
            "model_id 'org/model name' has characters a model id never has "
            "(whitespace, quotes or shell syntax)",
            "pass a Hugging Face id such as google/gemma-4-E2B-it (letters, digits, . _ - /)",
        ),
        (
            {"served_model_name": "g4;rm"},
            "served_model_name 'g4;rm' has characters a model id never has",
            None,
        ),
        (
            {"model_data_s3_uri": "s3://my-bucket/e2b"},
            "model data 's3://my-bucket/e2b' is not an s3://bucket/prefix/ folder",
            "upload the folder with `gemma4-t4 sagemaker deploy --model-dir DIR`",
        ),
        ({"model_data_s3_uri": "https://my-bucket/e2b/"}, "is not an s3://bucket/prefix/ folder", None),
        ({"name": "g4_bad"}, "invalid endpoint name 'g4_bad'", None),
        ({"region": "mars-1"}, "unknown or unsupported AWS region 'mars-1'", None),
    ],
)
def test_a_value_sagemaker_or_vllm_would_refuse_is_refused_first_naming_the_fix(change, message, fix):
    """Just past each limit the deploy is refused before any AWS call, with the words and the fix."""
    error = refusal(**change)
    assert message in error.message
    if fix is not None:
        assert error.fix == fix


def test_the_bf16_refusal_names_an_override_only_when_there_is_one():
    """The bf16-on-T4 refusal points at --env/--vllm-arg only when that is where the bf16 came from."""
    assert "(set through" not in refusal(dtype="bfloat16").message
    overridden = refusal(dtype="float16", extra_args=["--dtype", "bfloat16"]).message
    assert overridden.endswith(" (set through --env SM_VLLM_DTYPE or --vllm-arg)")


@pytest.mark.parametrize(
    "change, message",
    [
        ({"min_instances": 0}, "min_instances=0 must be in 1..20"),
        ({"min_instances": 21}, "min_instances=21 must be in 1..20"),
        ({"max_instances": 21}, "max_instances=21 must be in 1..20"),
        ({"min_instances": 3, "max_instances": 2}, "min_instances=3, max_instances=2: need 1 <= min <= max <= 20"),
        ({"max_instances": 0}, "max_instances=0 must be in 1..20"),
    ],
)
def test_autoscaling_bounds_are_refused_with_the_counts_read(change, message):
    """Autoscaling bounds outside 1 <= min <= max <= 20 are refused, showing the counts as read."""
    error = refusal(**change)
    assert error.message == message
    assert error.fix == ("e.g. --min-instances 1 --max-instances 3" if "need" in message
                         else f"pass {next(iter(change))} in 1..20, or leave it out for its default")


@pytest.mark.parametrize(
    "change",
    [
        {"scaling_target": 0},
        {"scaling_target": 10_001},
        {"scale_in_cooldown_s": -1},
        {"scale_in_cooldown_s": 3601},
        {"scale_out_cooldown_s": -1},
        {"scale_out_cooldown_s": 3601},
    ],
)
def test_a_scaling_policy_sagemaker_would_refuse_is_refused(change):
    """A target of 0 or above 10,000, or a cooldown outside 0..3600 s, is refused."""
    error = refusal(min_instances=1, max_instances=2, **change)
    name, value = next(iter(change.items()))
    assert error.message == f"{name}={value} must be " + ("in (0, 10000]" if name == "scaling_target" else "in 0..3600")


def test_a_role_is_needed_for_a_real_deploy_and_must_be_an_iam_role_arn(monkeypatch):
    """A real deploy needs an IAM role ARN (a 12-digit account, a role path); a dry run does not."""
    monkeypatch.delenv(ROLE_ENV, raising=False)
    error = refusal(require_role=True)
    assert error.message == "no SageMaker execution role"
    assert error.fix.startswith(f"pass role_arn=... (CLI: --role-arn) or set {ROLE_ENV}")
    for bad in (
        "arn:aws:iam::12345678901:role/r",
        "arn:aws:iam::123456789012:user/r",
        "x" + ROLE,
        ROLE + " x",
    ):
        error = refusal(role_arn=bad, require_role=True)
        assert error.message == f"{bad!r} is not an IAM role ARN"
        assert error.fix == "use arn:aws:iam::<12-digit account>:role/<name>"
    monkeypatch.setenv(ROLE_ENV, "arn:aws-us-gov:iam::123456789012:role/path/sm-exec")
    DeployConfig().check_role()
    DeployConfig(role_arn="not-checked")


def test_an_image_from_another_regions_ecr_is_refused():
    """SageMaker pulls from the endpoint's own region: an image in another region's ECR is refused."""
    error = refusal(region="us-west-2", image_uri=FIXED)
    assert error.message == f"image {FIXED} is in us-east-2 but the endpoint is in us-west-2"
    assert error.fix.startswith("SageMaker pulls from ECR in the endpoint's region")
    DeployConfig(region="us-east-2", image_uri=FIXED)


def test_an_unpinned_tag_is_refused_only_where_no_image_is_given():
    """A floating DLC tag is refused; with an explicit image the tag is not used and not judged."""
    error = refusal(image_tag="latest")
    assert error.message == "image tag 'latest' is not a pinned vLLM SageMaker tag"
    assert error.fix == f"use a tag like {DEFAULT_VLLM_TAG} (floating, -soci and omni tags are refused)"
    DeployConfig(image_tag="latest", image_uri=FIXED)


def test_a_given_ami_must_run_the_image_and_none_is_judged_too():
    """inference_ami_version 'none' leaves g4dn on driver 470, which a CUDA 13 image cannot use."""
    assert (
        "needs a newer GPU driver than ml.g4dn.xlarge's default"
        in refusal(inference_ami_version=None).message
    )
    assert (
        "cannot run image"
        in refusal(inference_ami_version="al2-ami-sagemaker-inference-gpu-2").message
    )
    DeployConfig(inference_ami_version="al2023-ami-sagemaker-inference-gpu-4-1")


def test_a_t4_with_the_stock_image_is_refused_naming_the_fix():
    """AWS's stock vLLM image crashes a T4 at the first prefill: refused, naming the T4s and build-image."""
    error = refusal(image_uri=STOCK, fallback_instance_types=["ml.g4dn.2xlarge"])
    assert error.message.startswith(
        f"image {STOCK} is AWS's stock vLLM container, which lacks the Turing "
        "attention fix: on a T4 (ml.g4dn.xlarge, ml.g4dn.2xlarge, sm_75, 64 KiB shared"
    )
    assert error.fix.startswith(
        "build the fixed image once (gemma4-t4 sagemaker build-image --region us-east-2)"
    )
    other = "123456789012.dkr.ecr.us-east-2.amazonaws.com/my-vllm:1.0"
    assert (
        f"image {other} is not a gemma4-t4-vllm:<base tag>-g4t4-<version> image, which lacks"
        in refusal(image_uri=other).message
    )
    DeployConfig(image_uri=STOCK, allow_unfixed_image=True)
    DeployConfig(image_uri=STOCK, instance_type="ml.g6.xlarge")
    DeployConfig(image_uri=FIXED)


# -- fake AWS for the deploy ---------------------------------------------------------------------------

CREATED = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
NAME = "g4-test"
KINDS = {"model": "ModelName", "endpoint_config": "EndpointConfigName", "endpoint": "EndpointName"}


def aws_failure(code: str, message: str = "", operation: str = "Op") -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": message}}, operation)


def not_found() -> ClientError:
    return aws_failure("ValidationException", "Could not find resource.")


class FakeSageMaker:
    """SageMaker's models, endpoint configs and endpoints in a dict, each with its CreationTime. The endpoint
    answers ``statuses`` in turn (the last one from then on); the describe right after CreateEndpoint reads
    only its CreationTime and answers ``Creating``. ``fail`` raises an AWS error at an operation, once.
    Only ``name`` is this deploy's: any other name is not found."""

    def __init__(self, statuses=("InService",), fail=None, existing=(), name=NAME):
        self.name = name
        self.statuses = ["Creating", *statuses]
        self.fail = dict(fail or {})
        self.resources = {kind: CREATED for kind in existing}
        self.calls: list[tuple[str, dict]] = []

    def __getattr__(self, operation):
        verb, _, kind = operation.partition("_")
        if kind not in KINDS:
            raise AttributeError(operation)

        def call(**params):
            self.calls.append((operation, params))
            if operation in self.fail:
                raise self.fail.pop(operation)
            exists = kind in self.resources and params.get(KINDS[kind]) == self.name
            if verb == "create":
                assert params[KINDS[kind]] == self.name, params
                self.resources[kind] = CREATED
                return {}
            if not exists:
                raise not_found()
            if verb == "delete":
                del self.resources[kind]
                return {}
            answer = {"CreationTime": self.resources[kind]}
            if kind == "endpoint":
                status = self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]
                if isinstance(status, BaseException):
                    raise status
                status, _, reason = status.partition(":")
                answer["EndpointStatus"] = status
                if reason:
                    answer["FailureReason"] = reason.strip()
            return answer

        return call

    def operations(self) -> list[str]:
        return [operation for operation, _ in self.calls]


class FakeCalls:
    """Any other AWS client: records each call; ``fail`` raises at an operation."""

    def __init__(self, fail=None, pages=None):
        self.fail = dict(fail or {})
        self.pages = pages or {}
        self.calls: list[tuple[str, dict]] = []

    def __getattr__(self, operation):
        def call(**params):
            self.calls.append((operation, params))
            if operation in self.fail:
                raise self.fail[operation]
            return {}

        return call

    def get_paginator(self, operation):
        fake = self

        class Pages:
            def paginate(self, **params):
                fake.calls.append((operation, params))
                if operation in fake.fail:
                    raise fake.fail[operation]
                return fake.pages[operation]

        return Pages()


class FakeClock:
    def __init__(self, now: float = 0.0):
        self.now = now

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


_FAILOVER_CLOCK = FakeClock()
FAKE_TIME = {"sleep": _FAILOVER_CLOCK.sleep, "monotonic": _FAILOVER_CLOCK.monotonic}  # a failover's waits


def t4_config(**change) -> DeployConfig:
    """A T4 deploy with the fixed image given (no ECR lookup) and a role."""
    return DeployConfig(**({"name": NAME, "role_arn": ROLE, "image_uri": FIXED} | change))


def run_deploy(
    config: DeployConfig, sm: FakeSageMaker, clock: FakeClock | None = None, **kwargs
) -> DeployResult:
    clock = clock or FakeClock()
    return deploy(
        config,
        client=sm,
        ecr_client=FakeCalls(),
        progress=False,
        sleep=clock.sleep,
        monotonic=clock.monotonic,
        **kwargs,
    )


def failed_deploy(config: DeployConfig, sm: FakeSageMaker, **kwargs) -> DeployFailed:
    with pytest.raises(DeployFailed) as info:
        run_deploy(config, sm, **kwargs)
    return info.value


# -- the deploy's results as a learner reads them ------------------------------------------------------


def test_a_deploys_caption_and_reading_say_what_happened():
    """The result's caption and the learner's reading, for a quick stand-in, a real start and a failure."""
    ok = DeployResult(
        "g4",
        "us-east-2",
        "InService",
        True,
        elapsed_s=12.34,
        created=["model:g4", "endpoint-config:g4", "endpoint:g4"],
    )
    assert ok.caption() == "g4: InService in 12.3 s"
    assert ok.notes() == [
        "InService after 12 s, 3 resources created (model, endpoint-config, endpoint). A real "
        "endpoint takes 10-15 minutes to come up, so seconds mean a local stand-in answered: the "
        "calls are real, the GPU is not."
    ]
    ok.elapsed_s = 600.0
    assert ok.notes() == [
        "InService after 10.0 min, 3 resources created (model, endpoint-config, endpoint); it "
        "bills from now until deleted."
    ]
    failed = DeployResult(
        "g4",
        "us-east-2",
        "Failed",
        False,
        elapsed_s=5,
        failure_reason="OOM",
        rolled_back=["endpoint:g4", "model:g4"],
    )
    assert failed.caption() == "g4: Failed in 5.0 s: OOM"
    assert failed.notes() == [
        "Failed: nothing is left billing from this deploy (rolled back: endpoint:g4, model:g4)."
    ]
    assert DeployResult("g4", "r", "Error", False).notes() == [
        "Error: nothing is left billing from this deploy (rolled back: nothing)."
    ]
    event = TimelineEvent(1.0, "validated")
    assert DeployResult("g4", "r", "Error", False, timeline=[event]).table_rows() == [event]


def test_a_failed_deploy_names_its_status_reason_and_what_it_rolled_back():
    """The error of a failed deploy says where, how it ended, why, and what was deleted."""
    result = DeployResult("g4", "us-west-2", "Failed", False, failure_reason="OOM", rolled_back=["model:g4"])
    error = DeployFailed(result, fix="read the logs")
    assert error.message == "deploy of g4 in us-west-2 ended Failed: OOM; rolled back: model:g4"
    assert error.fix == "read the logs" and error.result is result
    assert DeployFailed(DeployResult("g4", "r", "Error", False)).message.endswith("rolled back: nothing")
    assert describe_deleted(["endpoint:a", "endpoint-config:a", "model:a:b"]) == (
        "endpoint a, endpoint config a, model a:b"
    )


# -- the create calls and the dry run ------------------------------------------------------------------


def test_the_create_calls_carry_the_models_container_the_variant_and_the_tags(monkeypatch):
    """The three create calls' exact parameters and the notes the printed recipe shows beside them."""
    monkeypatch.delenv(ROLE_ENV, raising=False)
    config = DeployConfig(name=NAME, image_uri=FIXED)
    calls = deployment_calls(config, NOW)
    tags = config.resource_tags(NOW)
    assert [(c.service, c.operation, c.region) for c in calls] == [
        ("sagemaker", "create_model", "us-east-2"),
        ("sagemaker", "create_endpoint_config", "us-east-2"),
        ("sagemaker", "create_endpoint", "us-east-2"),
    ]
    assert calls[0].params == {
        "ModelName": NAME,
        "ExecutionRoleArn": "arn:aws:iam::<ACCOUNT>:role/<SageMakerExecutionRole>",
        "PrimaryContainer": config.primary_container(),
        "Tags": tags,
    }
    assert calls[1].params == {
        "EndpointConfigName": NAME,
        "ProductionVariants": [config.production_variant()],
        "Tags": tags,
    }
    assert calls[2].params == {"EndpointName": NAME, "EndpointConfigName": NAME, "Tags": tags}
    assert calls[0].note == "model google/gemma-4-E2B-it in the vLLM container"
    assert calls[1].note == "instance, driver (InferenceAmiVersion) and startup timeouts"
    assert calls[2].note == deploy_cost(config).line() and "$0.736/hour" in calls[2].note
    uploaded = deployment_calls(t4_config(model_data_s3_uri="s3://my-bucket/e2b/"), NOW)
    assert uploaded[0].note == "model s3://my-bucket/e2b/ in the vLLM container"
    assert uploaded[0].params["ExecutionRoleArn"] == ROLE


def test_an_autoscaled_deploy_registers_its_variant_and_a_target_tracking_policy():
    """Autoscaling registers MIN..MAX and a target-tracking policy with the user's target and cooldowns; the cost is at MAX."""
    config = t4_config(
        min_instances=2, max_instances=5, scaling_target=8.0, scale_in_cooldown_s=120, scale_out_cooldown_s=60
    )
    register, policy = autoscaling_calls(config)
    resource = {
        "ServiceNamespace": "sagemaker",
        "ScalableDimension": "sagemaker:variant:DesiredInstanceCount",
        "ResourceId": f"endpoint/{NAME}/variant/AllTraffic",
    }
    assert (register.service, register.operation, register.region) == (
        "application-autoscaling",
        "register_scalable_target",
        "us-east-2",
    )
    assert register.params == {**resource, "MinCapacity": 2, "MaxCapacity": 5}
    assert register.note == "scale 2..5 instances (after InService)"
    assert (policy.service, policy.operation) == ("application-autoscaling", "put_scaling_policy")
    assert policy.params == {
        "PolicyName": f"{NAME}-invocations",
        **resource,
        "PolicyType": "TargetTrackingScaling",
        "TargetTrackingScalingPolicyConfiguration": {
            "TargetValue": 8.0,
            "PredefinedMetricSpecification": {
                "PredefinedMetricType": "SageMakerVariantInvocationsPerInstance"
            },
            "ScaleInCooldown": 120,
            "ScaleOutCooldown": 60,
        },
    }
    assert policy.note == "target tracking on invocations per instance, with cooldowns"
    assert policy.region == "us-east-2"
    assert autoscaling_calls(t4_config()) == []
    assert deployment_calls(config)[3:] == [register, policy]
    assert deploy_cost(config).usd_per_hour == pytest.approx(5 * 0.736)  # the worst case: all five billed


def test_the_dry_run_plan_looks_up_the_fixed_image_creates_and_waits():
    """The dry run prints the ECR lookup and create-model as one step on a T4, then the other creates and the wait."""
    plan = deployment_plan(DeployConfig(name=NAME, region="us-west-2"))
    assert len(plan) == 4
    lines = plan[0].split("\n")  # one step: find the image, then create the model with it
    assert lines[0] == (
        "# T4: the newest fixed image in your ECR (tag <base DLC tag>-g4t4-<version>) replaces <ACCOUNT>/...; none "
        "there = refused (build it: gemma4-t4 sagemaker build-image)"
    )
    assert lines[1] == (
        "aws ecr describe-images --region us-west-2 --repository-name gemma4-t4-vllm "
        '--filter \'{"tagStatus":"TAGGED"}\''
    )
    assert lines[2] == "# model google/gemma-4-E2B-it in the vLLM container"
    assert lines[3].startswith("aws sagemaker create-model --region us-west-2 --model-name g4-test ")
    assert "\naws sagemaker create-endpoint-config --region us-west-2 " in plan[1]
    assert plan[-1] == (
        "# wait for InService (a T4 start takes ~13 min)\naws sagemaker wait endpoint-in-service "
        f"--region us-west-2 --endpoint-name {NAME}"
    )
    for given in (
        DeployConfig(name=NAME, image_uri=FIXED),
        DeployConfig(name=NAME, instance_type="ml.g6.xlarge"),
    ):
        first = deployment_plan(given)[0]
        assert "describe-images" not in first and "create-model" in first
    with pytest.raises(Gemma4T4Error, match="invalid endpoint name"):
        deployment_plan(DeployConfig(name="bad name"))


# -- deploy -------------------------------------------------------------------------------------------


def test_a_dry_run_calls_nothing_needs_no_role_and_returns_the_plan(monkeypatch):
    """A dry run touches no AWS client and needs no role; a real run does need one."""
    monkeypatch.delenv(ROLE_ENV, raising=False)

    class Exploding:
        def __getattr__(self, name):
            raise AssertionError(f"AWS was called ({name})")

    config = DeployConfig(name=NAME)
    run = deploy_flow(config, act=False, client=Exploding(), ecr_client=Exploding(), progress=False)
    assert (run.result, run.plan) == (None, deployment_plan(config))
    assert "$0.736/hour" in run.cost
    with pytest.raises(Gemma4T4Error, match="no SageMaker execution role"):
        deploy(config, client=Exploding(), ecr_client=Exploding(), progress=False)


def test_a_deploy_creates_model_config_and_endpoint_waits_and_records_each_identity():
    """A deploy checks the name is free, creates the three resources, records each CreationTime and waits."""
    sm, clock = FakeSageMaker(statuses=("Creating", "InService")), FakeClock()
    result = run_deploy(t4_config(), sm, clock, poll_s=30)
    assert (result.status, result.success, result.failure_reason) == ("InService", True, None)
    assert result.created == [f"model:{NAME}", f"endpoint-config:{NAME}", f"endpoint:{NAME}"]
    assert result.created_at == {
        f"{k}:{NAME}": CREATED.timestamp() for k in ("model", "endpoint-config", "endpoint")
    }
    assert sm.operations() == [
        "describe_endpoint",
        "describe_endpoint_config",
        "describe_model",
        "create_model",
        "describe_model",
        "create_endpoint_config",
        "describe_endpoint_config",
        "create_endpoint",
        "describe_endpoint",
        "describe_endpoint",
        "describe_endpoint",
    ]
    assert sm.calls[3][1] == deployment_calls(t4_config())[0].params | {"Tags": sm.calls[3][1]["Tags"]}
    stages = [(e.stage, e.detail) for e in result.timeline]
    assert stages[0][0] == "validated" and stages[0][1] == f"{deploy_cost(t4_config()).line()}; image {FIXED}"
    assert stages[1:4] == [
        ("create_model", NAME),
        ("create_endpoint_config", NAME),
        ("create_endpoint", NAME),
    ]
    assert stages[4:] == [("status Creating", ""), ("status InService", ""), ("InService", "after 30 s")]
    assert [e.t_s for e in result.timeline][-1] == 30.0 and result.elapsed_s == 30.0
    assert [line.split("\n")[-1].split(" --region")[0] for line in result.plan] == [
        "aws sagemaker create-model",
        "aws sagemaker create-endpoint-config",
        "aws sagemaker create-endpoint",
    ]
    assert result.usd_per_hour == pytest.approx(0.736)


def test_a_deploy_without_waiting_returns_at_creating():
    """wait=False returns as soon as the endpoint is Creating (an MCP tool's background deploy)."""
    sm = FakeSageMaker(statuses=("Failed:never read",))
    result = run_deploy(t4_config(), sm, wait=False)
    assert (result.status, result.success) == ("Creating", True)
    assert sm.operations()[-1] == "describe_endpoint" and len(result.created) == 3  # its CreationTime only


def test_the_wait_defaults_to_the_startup_timeout_plus_15_minutes():
    """The wait gives up at the container startup timeout plus 15 minutes of placement, then deletes all."""
    sm = FakeSageMaker(statuses=("Creating",))
    error = failed_deploy(t4_config(startup_timeout_s=60), sm, poll_s=100)
    assert error.result.status == "TimedOut" and error.result.failure_reason == "still Creating after 960 s"
    assert (
        error.fix == "raise the timeout or read the logs (gemma4-t4 sagemaker logs); the endpoint was deleted"
    )
    assert error.result.rolled_back == [f"endpoint:{NAME}", f"endpoint-config:{NAME}", f"model:{NAME}"]
    assert sm.resources == {}
    given = failed_deploy(t4_config(), FakeSageMaker(statuses=("Creating",)), poll_s=100, timeout_s=250)
    assert given.result.failure_reason == "still Creating after 250 s"


@pytest.mark.parametrize(
    "reason, fix",
    [
        (
            "CannotStartContainerError",
            "the container never started: check inference_ami_version matches the image's CUDA",
        ),
        (
            "Insufficient CAPACITY in us-east-2",
            "try another region (deploy --failover) or another instance type",
        ),
        ("ResourceLimitExceeded", "try another region (deploy --failover) or another instance type"),
        ("out of memory", "read the logs (gemma4-t4 sagemaker logs NAME) before retrying"),
    ],
)
def test_a_failed_endpoint_is_rolled_back_and_the_fix_follows_the_reason(reason, fix):
    """A Failed endpoint is deleted with its config and model, and the fix fits the failure reason."""
    sm = FakeSageMaker(statuses=(f"Failed:{reason}",))
    error = failed_deploy(t4_config(), sm)
    assert error.result.status == "Failed" and error.result.failure_reason == reason and error.fix == fix
    assert error.message == (
        f"deploy of {NAME} in us-east-2 ended Failed: {reason}; rolled back: endpoint:{NAME}, "
        f"endpoint-config:{NAME}, model:{NAME}"
    )
    assert error.result.timeline[-1].stage == "rolled back" and sm.resources == {}


def test_a_refused_create_rolls_back_what_was_made_and_names_the_quota_fix():
    """A quota refusal at CreateEndpoint deletes the model and config already made, and names the quota fix."""
    sm = FakeSageMaker(fail={"create_endpoint": aws_failure("ResourceLimitExceeded", "0 Instances")})
    error = failed_deploy(t4_config(), sm)
    assert error.result.failure_reason == "ResourceLimitExceeded: 0 Instances"
    assert ("error", "create_endpoint: ResourceLimitExceeded: 0 Instances") in [
        (e.stage, e.detail) for e in error.result.timeline
    ]
    assert error.fix.startswith("request a quota increase")
    assert error.result.created == [f"model:{NAME}", f"endpoint-config:{NAME}"]
    assert error.result.rolled_back == [f"endpoint-config:{NAME}", f"model:{NAME}"]
    assert error.result.status == "Error" and sm.resources == {}


def test_an_unreadable_creation_time_still_records_the_resource():
    """The model was made but its CreationTime could not be read: the rollback still knows it by name."""
    answers = iter(
        [not_found(), aws_failure("AccessDeniedException", "no")]
    )  # preflight, then after the create

    class Denied(FakeSageMaker):
        def describe_model(self, **params):
            self.calls.append(("describe_model", params))
            raise next(answers)

    result = run_deploy(t4_config(), Denied())
    assert result.success and f"model:{NAME}" in result.created and f"model:{NAME}" not in result.created_at
    assert f"endpoint:{NAME}" in result.created_at


def test_an_error_while_waiting_is_named_and_rolled_back():
    """An unexpected error mid-wait is named on the result and everything is deleted."""

    def broken(_seconds):
        raise RuntimeError("network went away")

    sm = FakeSageMaker(statuses=("Creating",))
    with pytest.raises(DeployFailed) as info:
        deploy(t4_config(), client=sm, ecr_client=FakeCalls(), progress=False, sleep=broken)
    result = info.value.result
    assert (result.status, result.failure_reason) == ("Error", "RuntimeError: network went away")
    assert info.value.fix == "read the logs (gemma4-t4 sagemaker logs NAME) before retrying"
    assert len(result.rolled_back) == 3 and sm.resources == {}


def test_an_interrupted_deploy_deletes_what_it_made_and_says_so_on_the_interrupt():
    """Ctrl-C mid-wait deletes the three resources and the interrupt says so."""

    def interrupt(_seconds):
        raise KeyboardInterrupt

    sm = FakeSageMaker(statuses=("Creating",))
    with pytest.raises(KeyboardInterrupt) as info:
        deploy(t4_config(), client=sm, ecr_client=FakeCalls(), progress=False, sleep=interrupt)
    assert info.value.__notes__ == [
        f"gemma4-t4 undid: deleted endpoint {NAME}, endpoint config {NAME}, model {NAME} in us-east-2"
    ]
    assert sm.resources == {}


def test_a_wait_that_ends_in_an_aws_error_is_rolled_back_with_that_error():
    """DescribeEndpoint refused mid-wait: the deploy ends Error with AWS's reason and rolls back."""
    sm = FakeSageMaker(statuses=(aws_failure("AccessDeniedException", "denied"), "Failed"))
    error = failed_deploy(t4_config(), sm)
    assert (error.result.status, error.result.failure_reason) == ("Error", "AccessDeniedException: denied")
    assert sm.resources == {}


@pytest.mark.parametrize(
    "kind, label", [("endpoint", "endpoint"), ("endpoint_config", "endpoint-config"), ("model", "model")]
)
def test_a_name_already_taken_is_never_overwritten(kind, label):
    """An endpoint, config or model of the same name is someone's: refused, nothing created or deleted."""
    sm = FakeSageMaker(existing=(kind,))
    with pytest.raises(Gemma4T4Error) as info:
        run_deploy(t4_config(region="us-west-2", image_uri=FIXED.replace("us-east-2", "us-west-2")), sm)
    assert not isinstance(info.value, DeployFailed)
    assert info.value.message == f"{label} {NAME!r} already exists in us-west-2; deploy never overwrites"
    assert info.value.fix == (
        f"delete it first (gemma4-t4 sagemaker delete {NAME} --region us-west-2 --yes) or "
        "choose another --name"
    )
    assert not any(op.startswith(("create", "delete")) for op in sm.operations())


def test_a_preflight_read_that_fails_otherwise_is_not_taken_for_absent():
    """A denied read of an existing name is an error, not a free name."""
    sm = FakeSageMaker(fail={"describe_endpoint_config": aws_failure("AccessDeniedException", "denied")})
    with pytest.raises(Gemma4T4Error) as info:
        run_deploy(t4_config(), sm)
    assert info.value.message == f"DescribeEndpointConfig {NAME} failed: AccessDeniedException: denied"
    assert not any(op.startswith("create") for op in sm.operations())


def test_an_autoscaled_deploy_registers_after_in_service():
    """Autoscaling is registered only once the endpoint is InService, and recorded first for the rollback."""
    sm, aas = FakeSageMaker(), FakeCalls()
    result = run_deploy(t4_config(min_instances=1, max_instances=3), sm, autoscaling_client=aas)
    assert result.success and [op for op, _ in aas.calls] == [
        "register_scalable_target",
        "put_scaling_policy",
    ]
    assert result.created[0] == f"autoscaling:endpoint/{NAME}/variant/AllTraffic"
    stages = [(e.stage, e.detail) for e in result.timeline]
    assert stages[-2:] == [
        ("register_scalable_target", "scale 1..3 instances (after InService)"),
        ("put_scaling_policy", "target tracking on invocations per instance, with cooldowns"),
    ]
    assert stages[-3][0] == "InService"


def test_a_refused_autoscaling_registration_rolls_the_endpoint_back():
    """A refused scalable-target registration fails the deploy and deletes the endpoint."""
    sm = FakeSageMaker()
    aas = FakeCalls(fail={"register_scalable_target": aws_failure("ValidationException", "bad capacity")})
    error = failed_deploy(t4_config(min_instances=1, max_instances=3), sm, autoscaling_client=aas)
    assert error.result.failure_reason == "register_scalable_target: ValidationException: bad capacity"
    assert error.result.status == "Error" and sm.resources == {} and len(error.result.rolled_back) == 3


def test_uploaded_weights_are_checked_before_anything_is_created():
    """--model-data is checked for config.json before any create; missing, nothing is created."""
    s3 = FakeCalls()
    run_deploy(t4_config(model_data_s3_uri="s3://my-bucket/models/e2b/"), FakeSageMaker(), s3_client=s3)
    assert s3.calls == [("head_object", {"Bucket": "my-bucket", "Key": "models/e2b/config.json"})]
    sm = FakeSageMaker()
    missing = FakeCalls(fail={"head_object": aws_failure("404", "Not Found")})
    with pytest.raises(Gemma4T4Error, match="does not exist; nothing was created"):
        run_deploy(t4_config(model_data_s3_uri="s3://my-bucket/e2b/"), sm, s3_client=missing)
    assert sm.calls == []


@pytest.mark.parametrize("code", ["404", "NoSuchKey", "NotFound", "NoSuchBucket"])
def test_model_data_without_config_json_or_bucket_is_refused_saying_which(code):
    """Missing model data says whether the bucket or only config.json is missing."""
    s3 = FakeCalls(fail={"head_object": aws_failure(code, "gone")})
    with pytest.raises(Gemma4T4Error) as info:
        check_model_data(s3, "s3://my-bucket/e2b/")
    assert info.value.message == (
        "model data s3://my-bucket/e2b/: s3://my-bucket/e2b/config.json does not exist; nothing was created"
    )
    assert (
        info.value.fix == "upload the model folder first (deploy --model-dir DIR does it) or fix --model-data"
    )
    assert s3.calls[-1] == ("head_bucket", {"Bucket": "my-bucket"})
    s3.fail["head_bucket"] = aws_failure("404", "gone")
    with pytest.raises(Gemma4T4Error) as info:
        check_model_data(s3, "s3://my-bucket/e2b/")
    assert info.value.message == (
        "model data s3://my-bucket/e2b/: bucket 'my-bucket' does not exist (or is not "
        "yours); nothing was created"
    )


def test_model_data_that_cannot_be_read_says_why():
    """Model data that cannot be read (403) is an error with AWS's code, not 'missing'."""
    s3 = FakeCalls(fail={"head_object": aws_failure("403", "Forbidden")})
    with pytest.raises(Gemma4T4Error) as info:
        check_model_data(s3, "s3://my-bucket/e2b/")
    assert info.value.message == "HeadObject s3://my-bucket/e2b/config.json failed: 403: Forbidden"
    assert [op for op, _ in s3.calls] == ["head_object"]


def ecr_with_fixed_image(tag: str) -> FakeCalls:
    """An ECR whose repository holds one fixed image tagged ``tag``."""
    image = {"imageTags": [tag], "imageDigest": "sha256:" + "a" * 64, "registryId": "123456789012"}
    return FakeCalls(pages={"describe_images": [{"imageDetails": [image]}]})


def test_a_t4_without_an_image_gets_the_newest_fixed_one_in_its_regions_ecr():
    """A T4 deploy without --image-uri uses the newest fixed image in its region's ECR."""
    tag = fixed_image_tag()
    ecr = ecr_with_fixed_image(tag)
    config = DeployConfig(name=NAME, region="us-west-2")
    found = with_fixed_image(config, ecr)
    assert found.image_uri.endswith(f".dkr.ecr.us-west-2.amazonaws.com/gemma4-t4-vllm:{tag}")
    assert found.image_uri.startswith("123456789012.") and config.image_uri is None
    assert ecr.calls == [
        ("describe_images", {"repositoryName": "gemma4-t4-vllm", "filter": {"tagStatus": "TAGGED"}})
    ]
    for kept in (DeployConfig(image_uri=FIXED), DeployConfig(instance_type="ml.g6.xlarge")):
        assert with_fixed_image(kept, FakeCalls()) is kept


# -- the rollback ---------------------------------------------------------------------------------------


def test_a_rollback_deletes_endpoint_then_config_then_model():
    """A rollback deletes in reverse order of creation: endpoint, config, model."""
    sm = FakeSageMaker(existing=("model", "endpoint_config", "endpoint"))
    gone = rollback(sm, [f"model:{NAME}", f"endpoint-config:{NAME}", f"endpoint:{NAME}"])
    assert gone == [f"endpoint:{NAME}", f"endpoint-config:{NAME}", f"model:{NAME}"]
    assert [op for op in sm.operations()] == ["delete_endpoint", "delete_endpoint_config", "delete_model"]
    assert rollback(FakeSageMaker(), []) == []


def test_a_rollback_counts_an_already_gone_resource_and_keeps_going_past_a_failed_delete():
    """An already-gone resource counts as rolled back; a failed delete is not claimed and the rest still go."""
    sm = FakeSageMaker(
        existing=("model", "endpoint"),
        fail={"delete_endpoint": aws_failure("AccessDeniedException", "denied")},
    )
    recorded = {f"model:{NAME}": CREATED.timestamp(), f"endpoint-config:{NAME}": CREATED.timestamp()}
    gone = rollback(sm, [f"model:{NAME}", f"endpoint-config:{NAME}", f"endpoint:{NAME}"], recorded)
    assert gone == [
        f"model:{NAME}",
        f"endpoint-config:{NAME}",
    ]  # the config was already gone; the endpoint stays
    assert "delete_endpoint_config" not in sm.operations() and sm.resources == {"endpoint": CREATED}


def test_a_rollback_leaves_alone_a_name_someone_re_created():
    """A resource re-created under the name since the deploy is someone else's: left alone and said so."""
    sm = FakeSageMaker(existing=("model", "endpoint"))
    sm.resources["endpoint"] = CREATED + dt.timedelta(minutes=3)
    recorded = {f"model:{NAME}": CREATED.timestamp(), f"endpoint:{NAME}": CREATED.timestamp()}
    gone = rollback(sm, [f"model:{NAME}", f"endpoint:{NAME}"], recorded)
    assert gone == [
        f"model:{NAME}",
        f"left alone: endpoint:{NAME} (re-created by another owner since this deploy)",
    ]
    assert "endpoint" in sm.resources


# -- waiting for InService -----------------------------------------------------------------------------


def test_the_wait_polls_until_the_timeout_and_counts_every_second(capsys):
    """The wait polls every poll_s until the timeout and its bar counts the seconds waited."""
    sm, clock, events = FakeSageMaker(statuses=("Creating",)), FakeClock(), []
    sm.resources["endpoint"] = CREATED
    sm.statuses = ["Creating"]
    final = wait_in_service(
        sm,
        NAME,
        100,
        poll_s=30,
        progress=True,
        event=lambda s, d: events.append((s, d)),
        sleep=clock.sleep,
        monotonic=clock.monotonic,
    )
    assert final == {"status": "TimedOut", "reason": "still Creating after 100 s"}
    assert clock.now == 100 and sm.operations().count("describe_endpoint") == 5  # t = 0, 30, 60, 90, 100
    assert events == [("status Creating", "")]  # once per change, not per poll
    assert "100/100 s of the timeout" in capsys.readouterr().err


@pytest.mark.parametrize("status", ["Failed", "OutOfService", "Deleting", "RollingBack"])
def test_an_endpoint_that_can_no_longer_come_up_ends_the_wait(status):
    """Failed, OutOfService, Deleting or RollingBack end the wait at once as Failed."""
    sm = FakeSageMaker()
    sm.resources["endpoint"] = CREATED
    sm.statuses = [status]
    clock = FakeClock()
    assert wait_in_service(sm, NAME, 100, progress=False, sleep=clock.sleep, monotonic=clock.monotonic) == {
        "status": "Failed",
        "reason": status,
    }


def test_throttling_keeps_waiting_and_another_error_ends_the_wait():
    """Throttling is waited through (keeping the last status); any other AWS error ends the wait."""
    sm, clock = FakeSageMaker(), FakeClock()
    sm.resources["endpoint"] = CREATED
    sm.statuses = ["Updating", aws_failure("ThrottlingException", "slow down"), "InService"]
    events = []
    final = wait_in_service(
        sm,
        NAME,
        100,
        poll_s=10,
        progress=False,
        event=lambda s, d: events.append(s),
        sleep=clock.sleep,
        monotonic=clock.monotonic,
    )
    assert final == {"status": "InService"} and events == ["status Updating", "status InService"]
    sm.statuses = [aws_failure("AccessDeniedException", "denied")]
    assert wait_in_service(sm, NAME, 100, progress=False, sleep=clock.sleep, monotonic=clock.monotonic) == {
        "status": "Error",
        "reason": "AccessDeniedException: denied",
    }
    first = FakeSageMaker()
    first.resources["endpoint"] = CREATED
    first.statuses = [aws_failure("ThrottlingException", "slow down"), "InService"]
    events.clear()
    wait_in_service(
        first,
        NAME,
        100,
        poll_s=10,
        progress=False,
        event=lambda s, d: events.append(s),
        sleep=clock.sleep,
        monotonic=clock.monotonic,
    )
    assert events == ["status Creating", "status InService"]


def test_a_failure_reason_is_shown_with_its_status():
    """SageMaker's FailureReason is the wait's reason and the timeline's detail."""
    sm, events = FakeSageMaker(), []
    sm.resources["endpoint"] = CREATED
    sm.statuses = ["Failed:the container exited"]
    clock = FakeClock()
    final = wait_in_service(
        sm,
        NAME,
        100,
        progress=False,
        event=lambda s, d: events.append((s, d)),
        sleep=clock.sleep,
        monotonic=clock.monotonic,
    )
    assert final == {"status": "Failed", "reason": "the container exited"}
    assert events == [("status Failed", "the container exited")]


# -- region failover ------------------------------------------------------------------------------------


def quota_pages(value: float) -> dict:
    """Service Quotas' answer: every endpoint instance type at ``value``, and a training quota beside it."""
    quotas = [
        {"QuotaName": f"{t} for endpoint usage", "QuotaCode": f"L-{i}", "Value": value}
        for i, t in enumerate(SAGEMAKER_INSTANCES)
    ]
    return {
        "list_service_quotas": [
            {
                "Quotas": [
                    *quotas,
                    {"QuotaName": "ml.g6.xlarge for training job usage", "QuotaCode": "L-T", "Value": 9.0},
                ]
            }
        ]
    }


class Regions:
    """A client factory: SageMaker and quotas per region, ECR answering nothing; any other client is a
    mistake (a failover asks for each region's own clients)."""

    def __init__(self, sagemaker: dict[str, FakeSageMaker], quotas: dict[str, float | None] | None = None):
        self.sagemaker = sagemaker
        self.quotas = quotas or {}
        self.asked: list[tuple[str, str]] = []

    def __call__(self, service: str, region: str):
        self.asked.append((service, region))
        assert region in ("us-east-1", "us-east-2", "us-west-2", "eu-west-1"), region
        assert service in ("sagemaker", "service-quotas", "ecr"), service
        if service == "sagemaker":
            return self.sagemaker[region]
        if service == "service-quotas":
            quota = self.quotas.get(region, 0.0)
            if quota is None:  # the quota could not be read in this region
                return FakeCalls(fail={"list_service_quotas": aws_failure("AccessDeniedException", "denied")})
            return FakeCalls(pages=quota_pages(quota))
        return FakeCalls()


def test_failover_moves_on_after_no_quota_or_no_capacity_and_stops_at_in_service():
    """Failover skips a region without quota, moves on after a capacity failure and stops at InService."""
    clients = Regions(
        {
            "us-west-2": FakeSageMaker(statuses=("Failed:InsufficientInstanceCapacity",)),
            "us-east-2": FakeSageMaker(),
        },
        quotas={"us-west-2": 1.0, "us-east-2": 2.0},
    )
    config = DeployConfig(name=NAME, role_arn=ROLE, allow_unfixed_image=True)
    outcome = deploy_with_failover(
        config, ["us-east-1", "us-west-2", "us-east-2"], clients=clients, progress=False, **FAKE_TIME
    )
    assert outcome.success and outcome.region == "us-east-2" and outcome.deployment.region == "us-east-2"
    attempts = [(a.region, a.outcome, a.reason) for a in outcome.attempts]
    assert attempts == [
        ("us-east-1", "skipped: no quota", "ml.g4dn.xlarge=0.0"),
        ("us-west-2", "capacity", "InsufficientInstanceCapacity"),
        ("us-east-2", "InService", None),
    ]
    assert outcome.attempts[1].rolled_back == [f"endpoint:{NAME}", f"endpoint-config:{NAME}", f"model:{NAME}"]
    assert outcome.attempts[2].timeline == outcome.deployment.timeline
    assert ("sagemaker", "us-east-1") not in clients.asked
    assert outcome.attempts[0].elapsed_s == 0.0
    for attempt in outcome.attempts:  # when each began (UTC) and how long it took, in seconds to 1/100
        assert dt.datetime.fromisoformat(attempt.started_at).tzinfo == dt.UTC
        assert isinstance(attempt.elapsed_s, float) and 0 <= attempt.elapsed_s < 1.5
        assert attempt.elapsed_s == round(attempt.elapsed_s, 2)
    assert [e.stage for e in outcome.attempts[1].timeline][-1] == "rolled back"


def test_failover_stops_at_a_failure_another_region_would_repeat():
    """A failure that is not about capacity would repeat anywhere: failover stops there."""
    clients = Regions(
        {
            "us-west-2": FakeSageMaker(statuses=("Failed:CannotStartContainerError",)),
            "us-east-2": FakeSageMaker(),
        }
    )
    config = DeployConfig(name=NAME, role_arn=ROLE, allow_unfixed_image=True)
    outcome = deploy_with_failover(
        config, ["us-west-2", "us-east-2"], clients=clients, check_quota=False, progress=False, **FAKE_TIME
    )
    assert outcome.success is False and outcome.region is None and outcome.deployment is None
    assert [(a.region, a.outcome) for a in outcome.attempts] == [("us-west-2", "failed")]
    assert ("service-quotas", "us-west-2") not in clients.asked and (
        "sagemaker",
        "us-east-2",
    ) not in clients.asked


def test_failover_that_runs_out_of_capacity_everywhere_reports_each_region():
    """No capacity anywhere: every region's attempt is reported, nothing raised."""
    clients = Regions(
        {r: FakeSageMaker(statuses=("Failed:quota exceeded",)) for r in ("us-west-2", "us-east-2")}
    )
    config = DeployConfig(name=NAME, role_arn=ROLE, allow_unfixed_image=True)
    outcome = deploy_with_failover(
        config, ["us-west-2", "us-east-2"], clients=clients, check_quota=False, progress=False, **FAKE_TIME
    )
    assert not outcome.success and [a.outcome for a in outcome.attempts] == ["capacity", "capacity"]


def test_failover_without_quota_anywhere_is_refused_naming_the_regions():
    """No quota in any region: refused, naming the quota and the regions, nothing created."""
    clients = Regions({}, quotas={"us-east-1": 0.0, "us-west-2": 0.5})
    with pytest.raises(Gemma4T4Error) as info:
        deploy_with_failover(
            DeployConfig(name=NAME, role_arn=ROLE), ["us-east-1", "us-west-2"], clients=clients
        )
    assert info.value.message == (
        "no quota for 'ml.g4dn.xlarge for endpoint usage' in any region tried "
        "(us-east-1, us-west-2); nothing was created"
    )
    assert info.value.fix == (
        "request a quota increase in Service Quotas (new accounts often have 0), or add --fallback-instance-types"
    )


def test_failover_validates_every_regions_config_before_any_call():
    """A bad region later in the list is refused before the first region is touched."""
    clients = Regions({})
    with pytest.raises(Gemma4T4Error, match="unknown or unsupported AWS region 'mars-1'"):
        deploy_with_failover(DeployConfig(name=NAME, role_arn=ROLE), ["us-east-2", "mars-1"], clients=clients)
    assert clients.asked == []


@pytest.mark.parametrize(
    "reason, capacity",
    [
        (None, False),
        ("", False),
        ("OOM at load", False),
        ("InsufficientInstanceCapacity", True),
        ("Quota reached", True),
        ("resourcelimitexceeded", True),
    ],
)
def test_capacity_failures_are_the_ones_worth_another_region(reason, capacity):
    """Capacity and quota failures, in any case, are the ones another region may not have."""
    assert is_capacity_failure(reason) is capacity


# -- the background watch -------------------------------------------------------------------------------


def test_a_watch_of_an_autoscaled_endpoint_built_without_a_client_makes_its_own(monkeypatch):
    """Its scaling after InService, and a rollback's deregistration, need the autoscaling client: a watcher
    built without one makes it at once (none for an endpoint that does not scale). Making a client calls no AWS."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    result = DeployResult(NAME, "us-east-2", "Creating", True)
    scaled = DeploymentWatcher(FakeSageMaker(), result, 100, config=t4_config(min_instances=1, max_instances=2))
    assert scaled.autoscaling_client.meta.service_model.service_name == "application-autoscaling"
    assert scaled.autoscaling_client.meta.region_name == "us-east-2"
    assert DeploymentWatcher(FakeSageMaker(), result, 100, config=t4_config()).autoscaling_client is None


def test_a_background_watch_reports_in_service_and_registers_autoscaling(capsys):
    """The watch polls quietly (no bar from a background thread) until InService, then registers autoscaling."""
    sm, aas = FakeSageMaker(), FakeCalls()
    sm.resources["endpoint"] = CREATED
    sm.statuses = ["Creating", "Creating", "Creating", "InService"]  # three polls 0.01 s apart, then up
    config = t4_config(min_instances=1, max_instances=2)
    result = DeployResult(NAME, "us-east-2", "Creating", True, created=[f"endpoint:{NAME}"])
    watcher = DeploymentWatcher(sm, result, 100, poll_s=0.01, config=config, autoscaling_client=aas).start()
    assert watcher.wait(5) is result and watcher.done.is_set()
    assert result.success and result.status == "InService" and result.rolled_back == []
    assert [op for op, _ in aas.calls] == ["register_scalable_target", "put_scaling_policy"]
    assert [(e.stage, e.detail) for e in result.timeline] == [
        ("status Creating", ""),
        ("status InService", ""),
        ("InService", "after 0 s"),  # the blocking deploy's timeline: one wait-and-scale for both
        ("register_scalable_target", "scale 1..2 instances (after InService)"),
        ("put_scaling_policy", "target tracking on invocations per instance, with cooldowns"),
    ]
    for event in result.timeline:  # seconds since the watch began, to 1/100
        assert isinstance(event.t_s, float) and 0 <= event.t_s < 10 and event.t_s == round(event.t_s, 2)
    assert capsys.readouterr().err == ""
    assert isinstance(result.elapsed_s, float) and 0 < result.elapsed_s < 1.5
    assert result.elapsed_s == round(result.elapsed_s, 2)


def test_a_background_watch_runs_in_a_named_daemon_thread_that_never_holds_up_an_exit():
    """A notebook or MCP server that exits while an endpoint is still Creating is not kept waiting."""
    import threading

    release = threading.Event()

    class Slow(FakeSageMaker):
        def describe_endpoint(self, **params):
            release.wait(5)
            return {"EndpointStatus": "InService", "CreationTime": CREATED}

    result = DeployResult(NAME, "us-east-2", "Creating", True, created=[f"endpoint:{NAME}"])
    watcher = DeploymentWatcher(Slow(), result, 100)
    assert watcher.poll_s == 15.0  # one DescribeEndpoint every 15 s
    watcher.start()
    try:
        thread = next(t for t in threading.enumerate() if t.name == f"watch-{NAME}")
        assert thread.daemon
    finally:
        release.set()
    assert watcher.wait(5).status == "InService"


@pytest.mark.parametrize(
    "answer, status, reason",
    [
        ("Failed:CannotStartContainerError", "Failed", "CannotStartContainerError"),
        (RuntimeError("boom"), "Error", "RuntimeError: boom"),
    ],
)
def test_a_background_watch_rolls_back_an_endpoint_that_did_not_come_up(answer, status, reason):
    """A watched endpoint that fails, or a watch that errors, is rolled back and says why."""
    sm = FakeSageMaker(existing=("endpoint", "model"))
    sm.statuses = [answer]
    result = DeployResult(NAME, "us-east-2", "Creating", True, created=[f"model:{NAME}", f"endpoint:{NAME}"])
    DeploymentWatcher(sm, result, 100, poll_s=0.01).start().wait(5)
    assert (result.success, result.status, result.failure_reason) == (False, status, reason)
    assert result.rolled_back == [f"endpoint:{NAME}", f"model:{NAME}"] and sm.resources == {}
    assert result.timeline[-1].stage == "rolled back"


def test_a_background_watch_whose_autoscaling_is_refused_rolls_back():
    """A refused autoscaling registration after InService rolls the watched endpoint back."""
    sm = FakeSageMaker(existing=("endpoint",))
    sm.statuses = ["InService"]
    aas = FakeCalls(fail={"register_scalable_target": aws_failure("ValidationException", "no")})
    result = DeployResult(NAME, "us-east-2", "Creating", True, created=[f"endpoint:{NAME}"])
    DeploymentWatcher(
        sm, result, 100, poll_s=0.01, config=t4_config(max_instances=2), autoscaling_client=aas
    ).start().wait(5)
    assert (result.success, result.status) == (False, "Error")
    assert result.failure_reason == "register_scalable_target: ValidationException: no"
    assert result.rolled_back == [f"endpoint:{NAME}"]


def test_a_background_deploy_creates_now_and_watches_with_the_default_timeout():
    """deploy_in_background creates at once and watches for the startup timeout plus 15 minutes."""

    class Session:
        def __init__(self, sm):
            self.sm = sm

        def get_credentials(self):
            return object()

        def client(self, service, region_name, config):
            assert region_name == "us-east-2"
            return self.sm if service == "sagemaker" else FakeCalls()

    sm = FakeSageMaker(statuses=("InService",))
    config = t4_config(startup_timeout_s=600)
    watcher = deploy_in_background(config, session=Session(sm))
    assert (
        watcher.timeout_s == 1500 and watcher.poll_s == 15.0 and watcher.sm is sm and watcher.config is config
    )
    result = watcher.wait(5)
    assert result.success and result.status == "InService" and len(result.created) == 3
    assert [e.stage for e in result.timeline].count(
        "status InService"
    ) == 1  # the create returned at Creating: only the watch waited
    assert 0 <= result.elapsed_s < 10
    given = deploy_in_background(
        t4_config(name="g4-two"),
        client=FakeSageMaker(name="g4-two"),
        session=Session(None),
        timeout_s=30,
        poll_s=0.01,
    )
    assert given.timeout_s == 30 and given.poll_s == 0.01 and given.wait(5).status == "InService"


def test_a_background_deploy_scales_and_rolls_back_through_its_own_session(no_aws_credentials):
    """A background deploy with autoscaling, made through a session (a profile), registers its scalable
    target through that session's client and, when the scaling policy is refused, deregisters it through
    the same client: nothing is asked of the process's default credentials (here there are none)."""
    sm = FakeSageMaker(statuses=("InService",))
    aas = FakeCalls(fail={"put_scaling_policy": aws_failure("ValidationException", "bad policy")})
    asked = []

    class Session:
        def get_credentials(self):
            return object()

        def client(self, service, region_name, config):
            asked.append((service, region_name))
            return {"sagemaker": sm, "application-autoscaling": aas}.get(service) or FakeCalls()

    config = t4_config(min_instances=1, max_instances=3)
    result = deploy_in_background(config, session=Session(), timeout_s=30, poll_s=0.01).wait(5)
    assert (result.success, result.failure_reason) == (False, "put_scaling_policy: ValidationException: bad policy")
    assert [op for op, _ in aas.calls] == ["register_scalable_target", "put_scaling_policy",
                                           "deregister_scalable_target"]
    assert result.rolled_back[0] == f"autoscaling:endpoint/{NAME}/variant/AllTraffic"
    assert ("application-autoscaling", config.region) in asked and sm.resources == {}


def test_an_automatic_drafter_is_dropped_where_it_would_not_fit_beside_the_target_on_a_t4():
    """draft=auto sends Google's assistant only where the fit calculator says target and drafter fit the T4s
    at the endpoint's memory share and tensor parallelism; off a T4 it is not judged."""

    def drafts(**change) -> bool:
        return "SM_VLLM_SPECULATIVE_CONFIG" in DeployConfig(draft="auto", **change).container_env()

    assert drafts(gpu_memory_utilization=0.8) and not drafts(gpu_memory_utilization=0.7)
    e4b = "google/gemma-4-E4B-it"
    assert not drafts(model_id=e4b)  # one T4
    assert drafts(model_id=e4b, instance_type="ml.g4dn.12xlarge")  # split over two of the four T4s
    assert not drafts(model_id=e4b, instance_type="ml.g4dn.12xlarge", tensor_parallel_size=1)
    assert drafts(model_id=e4b, instance_type="ml.g6.xlarge")


def test_failover_reports_an_unreadable_quota_and_refuses_when_no_region_had_one():
    """An unreadable quota is a skipped region with AWS's reason; with no region left it is refused."""
    clients = Regions({}, quotas={"us-east-1": None, "us-west-2": 0.0})
    with pytest.raises(Gemma4T4Error, match="in any region tried"):
        deploy_with_failover(
            DeployConfig(name=NAME, role_arn=ROLE), ["us-east-1", "us-west-2"], clients=clients
        )
    clients = Regions(
        {"us-west-2": FakeSageMaker(statuses=("Failed:capacity",))},
        quotas={"us-east-1": None, "us-west-2": 1.0},
    )
    config = DeployConfig(name=NAME, role_arn=ROLE, allow_unfixed_image=True)
    outcome = deploy_with_failover(
        config, ["us-east-1", "us-west-2"], clients=clients, progress=False, **FAKE_TIME
    )
    assert not outcome.success  # one region skipped, one out of capacity: reported, not refused
    skipped = outcome.attempts[0]
    assert (skipped.outcome, skipped.reason) == (
        "skipped: no quota",
        "ml.g4dn.xlarge=ListServiceQuotas failed: AccessDeniedException: denied",
    )
    assert outcome.attempts[1].outcome == "capacity"


def test_failover_over_no_regions_tries_nothing():
    """An empty region list tries nothing and refuses nothing."""
    outcome = deploy_with_failover(DeployConfig(name=NAME, role_arn=ROLE), [], clients=Regions({}))
    assert not outcome.success and outcome.attempts == []


def test_an_interrupt_before_anything_was_created_deletes_nothing_and_says_nothing():
    """Ctrl-C before the first create deletes nothing and claims nothing."""

    class Interrupted(FakeSageMaker):
        def create_model(self, **params):
            raise KeyboardInterrupt

    sm = Interrupted()
    with pytest.raises(KeyboardInterrupt) as info:
        run_deploy(t4_config(), sm)
    assert getattr(info.value, "__notes__", []) == []
    assert not any(op.startswith("delete") for op in sm.operations())


def test_failover_deploys_in_the_region_it_tries_with_that_regions_clients():
    """A config made for us-east-2 that fails over to us-west-2 is created there, named there."""
    clients = Regions({"us-west-2": FakeSageMaker()}, quotas={"us-west-2": 1.0, "eu-west-1": 1.0})
    config = DeployConfig(
        name=NAME,
        role_arn=ROLE,
        region="us-east-2",
        instance_type="ml.g6.xlarge",
        fallback_instance_types=["ml.g5.xlarge"],
    )
    outcome = deploy_with_failover(config, ["us-west-2"], clients=clients, progress=False, wait=False)
    assert outcome.success is True and outcome.region == "us-west-2"
    assert outcome.attempts[0].outcome == "Creating"  # the deploy's own arguments reach it
    assert outcome.deployment.region == "us-west-2" and outcome.deployment.name == NAME
    create = next(params for op, params in clients.sagemaker["us-west-2"].calls if op == "create_model")
    assert ".dkr.ecr.us-west-2." in create["PrimaryContainer"]["Image"]
    assert config.region == "us-east-2"  # the caller's config is left as it was
    nothing = Regions({}, quotas={"us-west-2": 0.0})
    with pytest.raises(Gemma4T4Error) as info:
        deploy_with_failover(config, ["us-west-2"], clients=nothing)
    assert info.value.message.startswith("no quota for 'ml.g6.xlarge for endpoint usage'")
    skipped = Regions(
        {"us-west-2": FakeSageMaker(statuses=("Failed:capacity",))},
        quotas={"us-east-1": 0.0, "us-west-2": 1.0},
    )
    outcome = deploy_with_failover(
        config, ["us-east-1", "us-west-2"], clients=skipped, progress=False, **FAKE_TIME
    )
    assert outcome.attempts[0].reason == "ml.g6.xlarge=0.0; ml.g5.xlarge=0.0"


def test_the_timeline_ends_naming_what_was_rolled_back_or_that_nothing_was_created():
    """The timeline's last line names what the rollback deleted, or that nothing was created."""
    error = failed_deploy(t4_config(), FakeSageMaker(statuses=("Failed:OOM",)))
    assert (error.result.timeline[-1].stage, error.result.timeline[-1].detail) == (
        "rolled back",
        f"endpoint:{NAME}, endpoint-config:{NAME}, model:{NAME}",
    )
    assert getattr(error.__cause__, "__notes__", None) is None  # only an interrupt says what it undid
    nothing = failed_deploy(
        t4_config(), FakeSageMaker(fail={"create_model": aws_failure("ValidationException", "bad image")})
    )
    assert (nothing.result.timeline[-1].stage, nothing.result.timeline[-1].detail) == (
        "rolled back",
        "nothing created",
    )
    assert nothing.result.created == [] and nothing.result.rolled_back == []
    assert nothing.message.endswith("rolled back: nothing")


def test_a_failed_deploy_leaves_alone_an_endpoint_someone_re_created_under_its_name():
    """Between the failure and the rollback the name was deleted and re-created by another owner: the rollback
    compares the CreationTime recorded at create and deletes only what this deploy made."""

    class Recreated(FakeSageMaker):
        def describe_endpoint(self, **params):
            answer = self.__getattr__("describe_endpoint")(**params)
            if answer["EndpointStatus"] == "Failed":
                self.resources["endpoint"] = CREATED + dt.timedelta(minutes=3)
            return answer

    sm = Recreated(statuses=("Failed:OOM",))
    error = failed_deploy(t4_config(), sm)
    assert error.result.rolled_back == [
        f"endpoint-config:{NAME}",
        f"model:{NAME}",
        f"left alone: endpoint:{NAME} (re-created by another owner since this deploy)",
    ]
    assert "delete_endpoint" not in sm.operations() and "endpoint" in sm.resources


@pytest.fixture
def no_aws_credentials(monkeypatch):
    """No AWS credentials anywhere boto3 looks: a client made without one handed in fails at once."""
    for variable in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def test_a_refused_scaling_policy_rolls_back_the_registered_target_first(no_aws_credentials):
    """The scalable target was registered before the policy was refused: it is the first thing this deploy
    made that the rollback undoes, checked as its endpoint's, and deregistered through the same client that
    registered it (here the process has no AWS credentials of its own: a rollback that asked the default
    client left the target registered and did not say so)."""
    sm = FakeSageMaker()
    aas = FakeCalls(fail={"put_scaling_policy": aws_failure("ValidationException", "bad policy")})
    error = failed_deploy(t4_config(min_instances=1, max_instances=3), sm, autoscaling_client=aas)
    assert error.result.failure_reason == "put_scaling_policy: ValidationException: bad policy"
    target = f"endpoint/{NAME}/variant/AllTraffic"
    assert error.result.created[0] == f"autoscaling:{target}"
    assert error.result.rolled_back == [f"autoscaling:{target}", f"endpoint:{NAME}", f"endpoint-config:{NAME}",
                                        f"model:{NAME}"]
    assert [op for op, _ in aas.calls] == ["register_scalable_target", "put_scaling_policy",
                                           "deregister_scalable_target"]
    assert aas.calls[-1][1]["ResourceId"] == target
    assert sm.resources == {}
    # after the create: its CreationTime read and the InService poll, then the rollback
    rollback_calls = sm.operations()[sm.operations().index("create_endpoint") + 3 :]
    assert rollback_calls == [
        "describe_endpoint",  # the scalable target's endpoint: still this deploy's
        "describe_endpoint",
        "delete_endpoint",
        "describe_endpoint_config",
        "delete_endpoint_config",
        "describe_model",
        "delete_model",
    ]


def test_a_deploy_through_a_session_rolls_its_scalable_target_back_through_that_session(no_aws_credentials):
    """A deploy made with a session (a profile) whose scaling policy is refused deregisters the scalable
    target through that session's own client, not through the process's default credentials."""
    sm = FakeSageMaker()
    aas = FakeCalls(fail={"put_scaling_policy": aws_failure("ValidationException", "bad policy")})
    made = {"sagemaker": sm, "application-autoscaling": aas, "ecr": FakeCalls(), "s3": FakeCalls()}

    class Session:
        def get_credentials(self):
            return object()

        def client(self, service, region_name, config):
            return made[service]

    config = t4_config(min_instances=1, max_instances=3)
    with pytest.raises(Gemma4T4Error) as caught:
        deploy(config, session=Session(), progress=False, sleep=lambda s: None)
    assert caught.value.result.rolled_back[0] == f"autoscaling:endpoint/{NAME}/variant/AllTraffic"
    assert [op for op, _ in aas.calls][-1] == "deregister_scalable_target"


def test_a_scalable_target_whose_endpoint_is_already_gone_is_still_deregistered(no_aws_credentials):
    """Someone deleted the endpoint before the rollback: the endpoint counts as gone, but its scalable
    target is not assumed gone with it: it is deregistered, through the deploy's own client."""
    sm = FakeSageMaker()

    class PolicyRefused(FakeCalls):
        def put_scaling_policy(self, **params):
            del sm.resources["endpoint"]
            raise aws_failure("ValidationException", "bad policy")

    aas = PolicyRefused()
    error = failed_deploy(t4_config(min_instances=1, max_instances=3), sm, autoscaling_client=aas)
    assert error.result.rolled_back == [f"autoscaling:endpoint/{NAME}/variant/AllTraffic",
                                        f"endpoint-config:{NAME}", f"model:{NAME}", f"endpoint:{NAME}"]
    assert [op for op, _ in aas.calls][-1] == "deregister_scalable_target"


def test_a_deploy_through_a_session_asks_its_own_regions_clients_and_shows_a_bar(capsys):
    """Without clients handed in, a deploy makes each one from the session in the endpoint's region, looks
    up the fixed image there, checks the uploaded weights there, and draws the wait's bar by default."""
    tag = fixed_image_tag()
    sm, s3 = FakeSageMaker(statuses=("Creating", "InService")), FakeCalls()
    ecr = ecr_with_fixed_image(tag)
    aas = FakeCalls()
    made = {"sagemaker": sm, "ecr": ecr, "s3": s3, "application-autoscaling": aas}

    class Session:
        def get_credentials(self):
            return object()

        def client(self, service, region_name, config):
            assert region_name == "us-west-2"
            return made[service]

    clock = FakeClock(1000.0)
    config = DeployConfig(
        name=NAME, role_arn=ROLE, region="us-west-2", model_data_s3_uri="s3://my-bucket/e2b/", max_instances=2
    )
    result = deploy(config, session=Session(), sleep=clock.sleep, monotonic=clock.monotonic)
    assert result.success and ecr.calls and s3.calls
    assert [op for op, _ in aas.calls] == ["register_scalable_target", "put_scaling_policy"]
    create = next(params for op, params in sm.calls if op == "create_model")
    assert (
        create["PrimaryContainer"]["Image"]
        == f"123456789012.dkr.ecr.us-west-2.amazonaws.com/gemma4-t4-vllm:{tag}"
    )
    assert result.timeline[-3].detail == "after 15 s"  # one poll, 15 s apart by default
    assert "InService | 15/2700 s of the timeout" in capsys.readouterr().err


def test_a_deploys_times_are_seconds_to_one_hundredth_since_it_began():
    """Timeline times and the elapsed time are seconds since the deploy began, to 1/100 s."""
    clock = FakeClock(1000.0)
    result = run_deploy(
        t4_config(), FakeSageMaker(statuses=("Creating", "InService")), clock, poll_s=0.123456
    )
    assert result.elapsed_s == 0.12 and result.timeline[-1].detail == "after 0 s"
    assert [e.t_s for e in result.timeline][:2] == [0.0, 0.0] and result.timeline[-1].t_s == 0.12


def test_waiting_polls_every_15_s_and_leaves_its_bar_by_default(capsys):
    """The bar names the endpoint, shows its status and the seconds of the timeout, and stays on screen."""
    sm, clock = FakeSageMaker(), FakeClock(1000.0)
    sm.resources["endpoint"] = CREATED
    sm.statuses = ["Creating", "InService"]
    assert wait_in_service(sm, NAME, 60, sleep=clock.sleep, monotonic=clock.monotonic) == {
        "status": "InService"
    }
    assert clock.now == 1015.0
    err = capsys.readouterr().err
    assert f"\r{NAME}: " in err and err.endswith("InService | 15/60 s of the timeout\n")
    sm.statuses = ["InService"]
    wait_in_service(sm, NAME, 60, progress=False, sleep=clock.sleep, monotonic=clock.monotonic)
    assert capsys.readouterr().err == ""


def test_an_endpoint_without_a_status_is_shown_as_unknown_until_the_timeout():
    """A DescribeEndpoint answer without a status shows as '?' and is waited on until the timeout."""

    class NoStatus:
        def describe_endpoint(self, **params):
            return {"EndpointName": params["EndpointName"]}

    clock, events = FakeClock(), []
    final = wait_in_service(
        NoStatus(),
        NAME,
        10,
        poll_s=10,
        progress=False,
        event=lambda s, d: events.append(s),
        sleep=clock.sleep,
        monotonic=clock.monotonic,
    )
    assert final == {"status": "TimedOut", "reason": "still ? after 10 s"} and events == ["status ?"]


def test_a_background_watch_names_what_it_rolled_back_and_leaves_a_re_created_endpoint_alone():
    """The watch's rollback checks CreationTimes too and ends its timeline naming what went."""
    sm = FakeSageMaker(existing=("endpoint", "model"))
    sm.resources["endpoint"] = CREATED + dt.timedelta(minutes=3)  # deleted and re-created by another owner
    sm.statuses = ["Failed:OOM"]
    result = DeployResult(
        NAME,
        "us-east-2",
        "Creating",
        True,
        created=[f"model:{NAME}", f"endpoint:{NAME}"],
        created_at={f"model:{NAME}": CREATED.timestamp(), f"endpoint:{NAME}": CREATED.timestamp()},
    )
    DeploymentWatcher(sm, result, 100, poll_s=0.01).start().wait(5)
    left = f"left alone: endpoint:{NAME} (re-created by another owner since this deploy)"
    assert result.rolled_back == [f"model:{NAME}", left] and "endpoint" in sm.resources
    assert (result.timeline[-1].stage, result.timeline[-1].detail) == ("rolled back", f"model:{NAME}, {left}")
    empty = DeployResult(NAME, "us-east-2", "Creating", True)
    DeploymentWatcher(
        FakeSageMaker(statuses=("Failed:OOM",), existing=("endpoint",)), empty, 100, poll_s=0.01
    ).start().wait(5)
    assert (empty.timeline[-1].stage, empty.timeline[-1].detail) == ("rolled back", "nothing created")


def test_the_last_poll_comes_exactly_at_the_timeout_not_after_it():
    """With 0.4 s of the timeout left the wait sleeps 0.4 s, not a whole second or a whole poll."""
    sm, clock = FakeSageMaker(), FakeClock()
    sm.resources["endpoint"] = CREATED
    sm.statuses = ["Creating"]
    final = wait_in_service(
        sm, NAME, 100.4, poll_s=50, progress=False, sleep=clock.sleep, monotonic=clock.monotonic
    )
    assert clock.now == pytest.approx(100.4) and final == {
        "status": "TimedOut",
        "reason": "still Creating after 100 s",
    }


def test_a_drafter_named_by_hub_id_is_sent_with_its_own_size_recipe():
    """An assistant's hub id is not a local folder: it is sent as named, with that assistant's untuned N
    (4 for the 31B's), and --draft self sends the whole target with the whole-model default."""
    named = DeployConfig(model_id="some/other-model", draft="google/gemma-4-31B-it-assistant").container_env()
    assert json.loads(named["SM_VLLM_SPECULATIVE_CONFIG"]) == {
        "model": "google/gemma-4-31B-it-assistant",
        "num_speculative_tokens": 4,
    }
    own = DeployConfig(model_id="some/other-model", draft="self").container_env()
    assert json.loads(own["SM_VLLM_SPECULATIVE_CONFIG"]) == {
        "model": "some/other-model",
        "num_speculative_tokens": 3,
        "method": "draft_model",
    }


def test_refusals_word_for_word_where_the_words_carry_the_fix(tmp_path, monkeypatch):
    """The messages a user acts on, whole: limits, role, unfixed image, a local drafter, a lone scaling target."""
    assert refusal(max_num_seqs=0).message == "max_num_seqs=0 must be >= 1"
    assert refusal(max_model_len=255).message == "max_model_len=255 must be >= 256"
    assert refusal(startup_timeout_s=1).message == "startup_timeout_s=1 must be in 60..3600"
    monkeypatch.delenv(ROLE_ENV, raising=False)
    assert refusal(require_role=True).fix == (
        f"pass role_arn=... (CLI: --role-arn) or set {ROLE_ENV}; docs/sagemaker.md lists the minimal policy"
    )
    stock = refusal(image_uri=STOCK)
    assert stock.message.endswith(
        "vLLM's attention kernel asks for 96 KiB at Gemma 4's first prefill and the endpoint crashes"
    )
    assert stock.fix == (
        "build the fixed image once (gemma4-t4 sagemaker build-image --region us-east-2), then "
        "deploy without --image-uri (the newest fixed image in ECR is used) or with --image-uri of "
        "that image; --allow-unfixed-image only for an image whose vLLM is fixed upstream"
    )
    with pytest.raises(Gemma4T4Error) as info:
        DeployConfig(draft=str(tmp_path)).draft_plan()
    assert (
        info.value.fix == "pass an assistant hub id (e.g. google/gemma-4-E2B-it-assistant), auto, self or off"
    )
    with pytest.raises(Gemma4T4Error) as info:
        DeployConfig.from_settings(scaling_target=8)
    assert info.value.fix == "add --min-instances N and/or --max-instances M, or drop --scaling-target"


def test_the_image_follows_the_pinned_tag_and_a_model_path_serves_under_its_last_part():
    """--image-tag picks the fixed image built on that tag on a T4 and that DLC elsewhere; a model given as a
    path is served under its folder's name."""
    tag = "0.29.0-gpu-py312-cu130-ubuntu24.04-sagemaker-v1.3"
    assert DeployConfig(image_tag=tag).resolved_image().endswith(f"/gemma4-t4-vllm:{fixed_image_tag(tag)}")
    assert DeployConfig(image_tag=tag, instance_type="ml.g6.xlarge").resolved_image().endswith(f"/vllm:{tag}")
    env = DeployConfig(model_id="/models/gemma/gemma-4-E2B-it").container_env()
    assert env["SM_VLLM_SERVED_MODEL_NAME"] == "gemma-4-E2B-it"


def test_the_fit_is_judged_on_the_hosts_own_gpu():
    """The E4B needs two 16 GB T4s on ml.g4dn.12xlarge but fits one 24 GB L4 on ml.g6.12xlarge."""
    assert auto_tensor_parallel("google/gemma-4-E4B-it", "ml.g4dn.12xlarge") == 2
    assert auto_tensor_parallel("google/gemma-4-E4B-it", "ml.g6.12xlarge") == 1


def test_more_refusals_word_for_word_and_the_edges_they_leave_open():
    """Lower-case variable names are variable names; a bucket of 63 characters with the dry run's account
    placeholder is still a bucket; each refusal below says exactly what is wrong."""
    DeployConfig(extra_env={"my_var": "1"}, model_data_s3_uri="s3://<account>-" + "b" * 50 + "/m/")
    assert refusal(dtype="bfloat16").message == (
        "dtype bfloat16 on ml.g4dn.xlarge (T4, sm_75): Turing has no bf16 and vLLM refuses it"
    )
    assert refusal(instance_count=0).message == "instance_count=0 must be >= 1"
    assert refusal(fallback_instance_types=["ml.g4dn.xlarge"]).message == (
        "an instance type appears twice in the pool list"
    )
    assert refusal(model_id="").message == "model_id is empty"
    assert (
        "use one of: ml.g4dn.xlarge, ml.g4dn.2xlarge, "
        in refusal(instance_type="ml.p3.2xlarge").fix
    )
