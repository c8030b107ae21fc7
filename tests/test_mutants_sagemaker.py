"""What a SageMaker user sees from the deployment config and the deploy itself, pinned where the other
SageMaker tests leave it loose: each refusal's boundary and words, the exact CreateModel /
CreateEndpointConfig / CreateEndpoint parameters, the dry run's plan, the rollback's order and the
failover's choices. Everything runs in process against small fake AWS clients (no moto, no network)."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.sagemaker.config import (
    DeployConfig,
    auto_tensor_parallel,
    check_assistant_env,
    create_bucket_params,
    default_region,
    deploy_settings,
    extra_args_to_env,
    redact_env,
    validate_name,
)
from gemma4_t4.sagemaker.image import DEFAULT_VLLM_TAG, fixed_image_tag

ROLE = "arn:aws:iam::123456789012:role/sm-exec"
ROLE_ENV = "GEMMA4_T4_SAGEMAKER_ROLE_ARN"
FIXED = f"123456789012.dkr.ecr.us-east-2.amazonaws.com/gemma4-t4-vllm:{fixed_image_tag()}"
STOCK = f"763104351884.dkr.ecr.us-east-2.amazonaws.com/vllm:{DEFAULT_VLLM_TAG}"
NOW = dt.datetime(2026, 11, 1, 12, 0, tzinfo=dt.UTC)


def refusal(config: DeployConfig, require_role: bool = False) -> Gemma4T4Error:
    """The error a config's validation raises (the test fails where it raises none)."""
    with pytest.raises(Gemma4T4Error) as info:
        config.validate(require_role=require_role)
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
    shown = redact_env({"HF_TOKEN": "hf_abcdef123456", "SM_VLLM_MAX_NUM_BATCHED_TOKENS": "2048", "A": "b"})
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
    with pytest.raises(Gemma4T4Error) as info:
        extra_args_to_env(args)
    assert info.value.message == f"extra vLLM argument {bad!r} is not a --long-flag"
    assert info.value.fix == "pass flags like ['--enforce-eager', '--max-num-batched-tokens', '1024']"


# -- what an assistant may set ------------------------------------------------------------------------


def test_an_assistant_sets_the_allow_listed_vllm_switches_with_their_values():
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


@pytest.mark.parametrize("key", ["LD_PRELOAD", "HF_ENDPOINT", "SM_VLLM_TRUST_REMOTE_CODE"])
def test_an_assistant_may_not_set_another_variable(key):
    with pytest.raises(Gemma4T4Error) as info:
        check_assistant_env({"SM_VLLM_ENFORCE_EAGER": "true", key: "1"})
    assert info.value.message == f"extra_env {key} is not a container variable an assistant sets"
    assert info.value.fix.startswith("use one of SM_VLLM_ENFORCE_EAGER, SM_VLLM_ENABLE_PREFIX_CACHING, ")
    assert "gemma4-t4 sagemaker deploy --env" in info.value.fix


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
    first, second = DeployConfig(), DeployConfig()
    first.extra_args.append("--enforce-eager")
    first.extra_env["X"] = "1"
    first.fallback_instance_types.append("ml.g6.xlarge")
    assert second.extra_args == [] and second.extra_env == {} and second.fallback_instance_types == []


def test_the_settings_name_their_flags_parameters_and_left_out_defaults():
    settings = {s.name: s for s in deploy_settings()}
    assert (
        settings["extra_args"].flag == "--vllm-arg" and settings["extra_args"].parameter == "extra_vllm_args"
    )
    assert (
        settings["max_model_len"].flag == "--max-model-len"
        and settings["max_model_len"].parameter == "max_model_len"
    )
    assert settings["max_model_len"].default == 8192 and settings["max_model_len"].type is int
    assert settings["region"].default is None and settings["extra_env"].default is None
    assert settings["region"].type == str | None
    assert "served_model_name" not in settings and "instance_count" not in settings  # not a user's setting


def test_settings_left_out_keep_their_defaults_and_the_region_follows_the_environment(monkeypatch):
    """An MCP client that sends null for a setting gets its default, never None."""
    monkeypatch.setenv("AWS_REGION", "us-west-2")
    config = DeployConfig.from_settings(
        name="g4-x", max_model_len=None, extra_vllm_args=["--enforce-eager"], region=None, draft=None
    )
    assert config.region == "us-west-2" and config.max_model_len == 8192 and config.draft == "off"
    assert config.extra_args == ["--enforce-eager"] and config.name == "g4-x"
    assert DeployConfig.from_settings(region="eu-west-1").region == "eu-west-1"


def test_inference_ami_none_means_no_ami_and_auto_stays_auto():
    assert DeployConfig.from_settings(inference_ami_version="none").inference_ami_version is None
    assert DeployConfig.from_settings(inference_ami_version=None).inference_ami_version == "auto"


def test_a_scaling_target_alone_is_refused_and_with_instances_taken():
    with pytest.raises(Gemma4T4Error) as info:
        DeployConfig.from_settings(scaling_target=8)
    assert (
        info.value.message
        == "--scaling-target applies only to an autoscaled endpoint; alone it would be ignored"
    )
    assert "--min-instances" in info.value.fix
    assert DeployConfig.from_settings(scaling_target=8, max_instances=3).scaling_target == 8
    assert DeployConfig.from_settings(scaling_target=8, min_instances=2).scaling_target == 8
    assert DeployConfig.from_settings(scaling_target=None).scaling_target == 4.0


def test_a_setting_no_deploy_has_is_refused():
    with pytest.raises(TypeError, match="no_such_setting"):
        DeployConfig.from_settings(no_such_setting=1)


def test_an_image_given_is_labelled_given_and_a_tag_given_is_pinned():
    config = DeployConfig(image_uri=FIXED)
    assert config.pin_image_tag(None) == f"{FIXED} (given)"
    other = DeployConfig()
    other.pin_image_tag("0.29.0-gpu-py312-cu130-ubuntu24.04-sagemaker-v1.3")
    assert other.image_tag == "0.29.0-gpu-py312-cu130-ubuntu24.04-sagemaker-v1.3"


# -- derived values -----------------------------------------------------------------------------------


def test_the_dtype_is_float16_on_a_t4_and_bfloat16_elsewhere_unless_given():
    assert DeployConfig().resolved_dtype() == "float16"
    assert DeployConfig(instance_type="ml.g6.xlarge").resolved_dtype() == "bfloat16"
    assert DeployConfig(instance_type="ml.g5.xlarge", dtype="float32").resolved_dtype() == "float32"


def test_the_role_is_the_given_one_else_the_environments(monkeypatch):
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
    mixed = DeployConfig(
        instance_type="ml.g6.xlarge", fallback_instance_types=["ml.g4dn.2xlarge", "ml.g5.xlarge"]
    )
    assert mixed.turing_instance_types == ["ml.g4dn.2xlarge"] and mixed.needs_fixed_image
    assert not DeployConfig(instance_type="ml.g6.xlarge").needs_fixed_image
    assert not DeployConfig(allow_unfixed_image=True).needs_fixed_image


def test_the_image_is_the_given_one_else_the_planned_fixed_one_on_t4_else_the_stock_dlc():
    assert DeployConfig(image_uri=STOCK, allow_unfixed_image=True).resolved_image() == STOCK
    planned = DeployConfig(region="us-west-2").resolved_image()
    assert planned == f"<ACCOUNT>.dkr.ecr.us-west-2.amazonaws.com/gemma4-t4-vllm:{fixed_image_tag()}"
    assert DeployConfig(instance_type="ml.g6.xlarge", region="us-west-2").resolved_image() == (
        f"763104351884.dkr.ecr.us-west-2.amazonaws.com/vllm:{DEFAULT_VLLM_TAG}"
    )


def test_instances_autoscaling_and_the_worst_case_count():
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
    given = DeployConfig(inference_ami_version="al2-ami-sagemaker-inference-gpu-2")
    assert given.resolved_ami_version() == "al2-ami-sagemaker-inference-gpu-2"
    mixed = DeployConfig(
        instance_type="ml.g6.xlarge",
        fallback_instance_types=["ml.g4dn.xlarge"],
        image_uri=STOCK.replace(DEFAULT_VLLM_TAG, "0.30.0-gpu-py312-cu129-ubuntu24.04-sagemaker-v1.1"),
        allow_unfixed_image=True,
    )
    assert mixed.resolved_ami_version() == "al2-ami-sagemaker-inference-gpu-3-1"


def test_the_container_gets_the_model_its_short_name_and_the_launch_limits():
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
    env = DeployConfig(
        extra_args=["--max-num-seqs", "8", "--dtype=half"], extra_env={"SM_VLLM_MAX_NUM_SEQS": "6"}
    ).container_env()
    assert env["SM_VLLM_MAX_NUM_SEQS"] == "6" and env["SM_VLLM_DTYPE"] == "half"


def test_a_draft_sends_its_speculative_config_and_a_local_folder_is_refused(tmp_path):
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
    container = DeployConfig(image_uri=FIXED, model_data_s3_uri="s3://my-bucket/e2b/").primary_container()
    assert container["Image"] == FIXED
    assert container["ModelDataSource"] == {
        "S3DataSource": {"S3Uri": "s3://my-bucket/e2b/", "S3DataType": "S3Prefix", "CompressionType": "None"}
    }
    assert "ModelDataSource" not in DeployConfig().primary_container()


def test_every_resource_is_tagged_with_its_owner_lifetime_and_expiry():
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
    long_id = "org/" + "m" * 400
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


def test_a_long_context_and_many_sequences_need_more_gpus():
    assert auto_tensor_parallel("google/gemma-4-31B-it-qat-w4a16", "ml.g4dn.12xlarge", 131072, 64) == 4


@pytest.mark.parametrize("suffix", ["-qat-w4a16", "-QAT", "-w4a16", "-int4", "-emb4"])
def test_a_quantized_build_named_in_the_model_id_fits_on_fewer_gpus(suffix):
    """The build is read from the id, in any case: a 4-bit 31B fits on two T4s where the bf16 one needs four."""
    assert auto_tensor_parallel("google/gemma-4-31B-it" + suffix, "ml.g4dn.12xlarge") == 2


# -- validation: each refusal at its boundary ---------------------------------------------------------


def test_a_default_t4_config_with_a_role_is_valid(monkeypatch):
    monkeypatch.delenv(ROLE_ENV, raising=False)
    DeployConfig(role_arn=ROLE).validate()
    DeployConfig().validate(require_role=False)


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
        {"scaling_target": -1},  # not autoscaled: the target is never sent
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
    DeployConfig(**change).validate(require_role=False)


@pytest.mark.parametrize(
    "change, message, fix",
    [
        (
            {"max_model_len": 255},
            "max_model_len must be >= 256 and max_num_seqs >= 1",
            "T4 defaults: max_model_len=8192, max_num_seqs=4",
        ),
        (
            {"max_num_seqs": 0},
            "max_model_len must be >= 256 and max_num_seqs >= 1",
            "T4 defaults: max_model_len=8192, max_num_seqs=4",
        ),
        ({"gpu_memory_utilization": 0.09}, "gpu_memory_utilization=0.09 is outside 0.1..0.99", "use 0.90"),
        ({"gpu_memory_utilization": 0.995}, "gpu_memory_utilization=0.995 is outside 0.1..0.99", "use 0.90"),
        (
            {"startup_timeout_s": 59},
            "startup/download timeouts must be 60..3600 s (SageMaker's limits)",
            "use 1800 for a first start that downloads weights",
        ),
        (
            {"startup_timeout_s": 3601},
            "startup/download timeouts must be 60..3600 s (SageMaker's limits)",
            None,
        ),
        (
            {"download_timeout_s": 59},
            "startup/download timeouts must be 60..3600 s (SageMaker's limits)",
            None,
        ),
        (
            {"download_timeout_s": 3601},
            "startup/download timeouts must be 60..3600 s (SageMaker's limits)",
            None,
        ),
        (
            {"ttl_hours": 0},
            "ttl_hours=0 must be in (0, 168]",
            "choose a lifetime such as 4 hours; `reap` deletes endpoints past it",
        ),
        ({"ttl_hours": 168.5}, "ttl_hours=168.5 must be in (0, 168]", None),
        (
            {"tensor_parallel_size": -1},
            "tensor_parallel_size must be >= 0 (0: auto) and instance_count >= 1",
            None,
        ),
        ({"instance_count": 0}, "tensor_parallel_size must be >= 0 (0: auto) and instance_count >= 1", None),
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
        ({"model_id": "a" * 1025}, "model_id is empty", None),
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
    error = refusal(DeployConfig(**change))
    assert message in error.message
    if fix is not None:
        assert error.fix == fix


def test_the_bf16_refusal_names_an_override_only_when_there_is_one():
    assert "(set through" not in refusal(DeployConfig(dtype="bfloat16")).message
    overridden = refusal(DeployConfig(dtype="float16", extra_args=["--dtype", "bfloat16"])).message
    assert overridden.endswith(" (set through --env SM_VLLM_DTYPE or --vllm-arg)")


@pytest.mark.parametrize(
    "change, message",
    [
        ({"min_instances": 0}, "min_instances=0, max_instances=0: need 1 <= min <= max <= 20"),
        ({"min_instances": 21}, "min_instances=21, max_instances=21: need 1 <= min <= max <= 20"),
        ({"max_instances": 21}, "min_instances=1, max_instances=21: need 1 <= min <= max <= 20"),
        (
            {"min_instances": 3, "max_instances": 2},
            "min_instances=3, max_instances=2: need 1 <= min <= max <= 20",
        ),
        ({"max_instances": 0}, "min_instances=1, max_instances=0: need 1 <= min <= max <= 20"),
    ],
)
def test_autoscaling_bounds_are_refused_with_the_counts_read(change, message):
    error = refusal(DeployConfig(**change))
    assert error.message == message and error.fix == "e.g. --min-instances 1 --max-instances 3"


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
    error = refusal(DeployConfig(min_instances=1, max_instances=2, **change))
    assert error.message == "scaling target must be > 0 and cooldowns 0..3600 s"
    assert error.fix == "defaults: 4 invocations/instance/minute, 600 s in, 300 s out"


def test_a_role_is_needed_for_a_real_deploy_and_must_be_an_iam_role_arn(monkeypatch):
    monkeypatch.delenv(ROLE_ENV, raising=False)
    error = refusal(DeployConfig(), require_role=True)
    assert error.message == "no SageMaker execution role"
    assert error.fix.startswith(f"pass role_arn=... (CLI: --role-arn) or set {ROLE_ENV}")
    for bad in (
        "arn:aws:iam::12345678901:role/r",
        "arn:aws:iam::123456789012:user/r",
        "x" + ROLE,
        ROLE + " x",
    ):
        error = refusal(DeployConfig(role_arn=bad), require_role=True)
        assert error.message == f"{bad!r} is not an IAM role ARN"
        assert error.fix == "use arn:aws:iam::<12-digit account>:role/<name>"
    monkeypatch.setenv(ROLE_ENV, "arn:aws-us-gov:iam::123456789012:role/path/sm-exec")
    DeployConfig().validate(require_role=True)
    DeployConfig(role_arn="not-checked").validate(require_role=False)


def test_an_image_from_another_regions_ecr_is_refused():
    error = refusal(DeployConfig(region="us-west-2", image_uri=FIXED))
    assert error.message == f"image {FIXED} is in us-east-2 but the endpoint is in us-west-2"
    assert error.fix.startswith("SageMaker pulls from ECR in the endpoint's region")
    DeployConfig(region="us-east-2", image_uri=FIXED).validate(require_role=False)


def test_an_unpinned_tag_is_refused_only_where_no_image_is_given():
    error = refusal(DeployConfig(image_tag="latest"))
    assert error.message == "image tag 'latest' is not a pinned vLLM SageMaker tag"
    assert error.fix == f"use a tag like {DEFAULT_VLLM_TAG} (floating, -soci and omni tags are refused)"
    DeployConfig(image_tag="latest", image_uri=FIXED).validate(require_role=False)


def test_a_given_ami_must_run_the_image_and_none_is_judged_too():
    """inference_ami_version 'none' leaves g4dn on driver 470, which a CUDA 13 image cannot use."""
    assert (
        "needs a newer GPU driver than ml.g4dn.xlarge's default"
        in refusal(DeployConfig(inference_ami_version=None)).message
    )
    assert (
        "cannot run image"
        in refusal(DeployConfig(inference_ami_version="al2-ami-sagemaker-inference-gpu-2")).message
    )
    DeployConfig(inference_ami_version="al2023-ami-sagemaker-inference-gpu-4-1").validate(require_role=False)


def test_a_t4_with_the_stock_image_is_refused_naming_the_fix():
    error = refusal(DeployConfig(image_uri=STOCK, fallback_instance_types=["ml.g4dn.2xlarge"]))
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
        in refusal(DeployConfig(image_uri=other)).message
    )
    DeployConfig(image_uri=STOCK, allow_unfixed_image=True).validate(require_role=False)
    DeployConfig(image_uri=STOCK, instance_type="ml.g6.xlarge").validate(require_role=False)
    DeployConfig(image_uri=FIXED).validate(require_role=False)
