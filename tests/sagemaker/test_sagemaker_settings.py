"""The deploy settings are declared once, on DeployConfig (its vLLM settings on the VLLMSettings it extends):
every one is a flag of ``sagemaker deploy`` (and, but for the per-endpoint ones, of ``matrix``) and, where
the assistant's boundary allows it, a parameter of the MCP tools ``get_deployment_config`` and
``deploy_endpoint``, with the same help, default and refusals; the same settings through the CLI and through
MCP give the same config."""

from __future__ import annotations

import argparse
import json
import re

import pytest
from mcp import Client

from gemma4_t4.cli import build_parser, main
from gemma4_t4.foundation.launch_record import (
    assistant_boundary,
    declared,
    help_for,
    offered_default,
    user_settings,
)
from gemma4_t4.mcp_server import build_server
from gemma4_t4.sagemaker.config import DeployConfig, default_region
from gemma4_t4.sagemaker.image import DEFAULT_VLLM_TAG

SETTINGS = user_settings(DeployConfig)
# What a user who passes nothing gets (None: the deploy works it out: the region from $AWS_REGION, the image tag
# from the registry, an empty list, and a vLLM setting SageMaker's default, 8192 tokens, 4 sequences, 0.90).
TODAYS_DEFAULTS = {
    "name": "gemma4-t4", "model_id": "google/gemma-4-E2B-it", "region": None, "instance_type": "ml.g4dn.xlarge",
    "role_arn": None, "image_uri": None, "image_tag": None, "dtype": None, "max_model_len": None,
    "max_num_seqs": None, "tensor_parallel_size": None, "gpu_memory_utilization": None, "extra_args": None,
    "extra_env": None, "fallback_instance_types": None, "inference_ami_version": "auto",
    "startup_timeout_s": 1800, "ttl_hours": 4.0, "allow_unfixed_image": False, "model_data_s3_uri": None,
    "min_instances": None, "max_instances": None, "scaling_target": None, "draft": "off", "num_draft_tokens": None,
    "served_model_name": None,
}  # fmt: skip
# Flags spelt otherwise than their field, kept as users have always typed them.
OLD_SPELLINGS = {"startup_timeout_s": "--startup-timeout", "extra_args": "--vllm-arg", "extra_env": "--env",
                 "model_data_s3_uri": "--model-data"}


def _flag(name: str) -> str:
    return declared(SETTINGS[name]).get("flag", "--" + name.replace("_", "-"))
# The same deployment in both spellings: every conversion the CLI makes (comma lists, KEY=VALUE, "none").
TAG = DEFAULT_VLLM_TAG
AMI = "al2023-ami-sagemaker-inference-gpu-4-1"  # the driver a CUDA 13 image needs
ARGV = ["--name", "g4-same", "--instance-type", "ml.g6.xlarge", "--fallback-instance-types", "ml.g5.xlarge",
        "--image-tag", TAG, "--max-model-len", "4096", "--max-num-seqs", "2", "--gpu-memory-utilization", "0.85",
        "--vllm-arg=--enforce-eager", "--vllm-arg=--seed=7", "--env", "SM_VLLM_SWAP_SPACE=2", "--ttl-hours", "2",
        "--inference-ami-version", AMI, "--startup-timeout", "900", "--min-instances", "1",
        "--max-instances", "3", "--scaling-target", "8", "--model-data", "s3://my-bucket/models/e2b/"]
# The same deployment within the assistant's boundary (priced types, allow-listed variables, no raw vLLM flags).
ASSISTANT_ARGV = ["--name", "g4-same", "--instance-type", "ml.g6.xlarge", "--fallback-instance-types",
                  "ml.g4dn.xlarge", "--dtype", "float16", "--image-tag", TAG, "--max-model-len", "4096", "--max-num-seqs", "2",
                  "--gpu-memory-utilization", "0.85", "--env", "SM_VLLM_SWAP_SPACE=2", "--env",
                  "SM_VLLM_ENFORCE_EAGER=true", "--ttl-hours", "2", "--startup-timeout", "900", "--min-instances", "1",
                  "--max-instances", "3", "--scaling-target", "8", "--model-data", "s3://my-bucket/models/e2b/"]
PARAMETERS = {"name": "g4-same", "instance_type": "ml.g6.xlarge", "fallback_instance_types": ["ml.g4dn.xlarge"],
              "dtype": "float16", "image_tag": TAG, "max_model_len": 4096, "max_num_seqs": 2, "gpu_memory_utilization": 0.85,
              "extra_env": {"SM_VLLM_SWAP_SPACE": "2", "SM_VLLM_ENFORCE_EAGER": "true"},
              "ttl_hours": 2, "startup_timeout_s": 900, "min_instances": 1,
              "max_instances": 3, "scaling_target": 8, "model_data_s3_uri": "s3://my-bucket/models/e2b/"}


@pytest.fixture
def anyio_backend():
    return "asyncio"


def _command(name: str) -> argparse.ArgumentParser:
    parser = build_parser("sagemaker")
    for word in ("sagemaker", name):
        parser = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[word]
    return parser


def _flags(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {option: action for action in parser._actions for option in action.option_strings}


async def _schemas() -> dict[str, dict]:
    async with Client(build_server()) as client:
        tools = (await client.list_tools()).tools
    return {t.name: t.input_schema for t in tools if t.name in ("get_deployment_config", "deploy_endpoint")}


def _cli_dry_run(capsys, *argv: str) -> tuple[int, dict | str]:
    capsys.readouterr()
    code = main(["sagemaker", "deploy", "--dry-run", "--json", *argv])
    out = capsys.readouterr()
    return code, (json.loads(out.out) if code == 0 else out.out + out.err)


def _timeless(plan: list[str]) -> list[str]:
    """The plan without its expiry tag's timestamp (two calls may straddle a second)."""
    return [re.sub(r'expires-at","Value":"[^"]*"', "", line) for line in plan]


def test_the_declaration_keeps_todays_defaults_and_spellings():
    assert {name: offered_default(field) for name, field in SETTINGS.items()} == TODAYS_DEFAULTS
    for name, flag in OLD_SPELLINGS.items():
        assert _flag(name) == flag
    for name, field in SETTINGS.items():
        assert field.description and "\n" not in field.description, name  # one line: --help and the MCP schema
    # a setting left out (None where its default is None) gets DeployConfig's own default
    left_out = {name: None for name, default in TODAYS_DEFAULTS.items() if default is None}
    assert DeployConfig.from_settings(**left_out) == DeployConfig(region=default_region())
    config = DeployConfig()  # complete when built: SageMaker's values of the vLLM settings left None
    assert (config.max_model_len, config.max_num_seqs, config.gpu_memory_utilization) == (8192, 4, 0.90)


def test_every_setting_is_a_flag_of_deploy_with_its_help_and_default():
    deploy, matrix = _flags(_command("deploy")), _flags(_command("matrix"))
    for name in SETTINGS:
        action = deploy[_flag(name)]
        assert action.help.startswith(help_for(DeployConfig, name, action.default)) and action.dest == name, name
        assert action.default == TODAYS_DEFAULTS[name], name
    # matrix names its endpoints and takes its models from --models
    flags = {_flag(name) for name in SETTINGS}
    assert flags - set(matrix) == {"--name", "--model-id", "--model-data"}
    assert flags - {"--name", "--model-id", "--model-data"} <= set(matrix)
    defaults = vars(_command("deploy").parse_args([]))
    assert {name: defaults[name] for name in SETTINGS} == TODAYS_DEFAULTS
    assert "(SageMaker default 8192)" in deploy["--max-model-len"].help


@pytest.mark.anyio
async def test_every_offered_setting_is_a_described_parameter_of_both_mcp_deploy_tools():
    schemas = await _schemas()
    own = {"get_deployment_config": {"budget_usd"}, "deploy_endpoint": {"wait", "timeout_s", "confirm", "budget_usd"}}
    offered = [name for name, field in SETTINGS.items() if assistant_boundary(field)["sets"]]
    for tool, schema in schemas.items():
        properties = schema["properties"]
        assert set(properties) == set(offered) | own[tool], tool
        for name in offered:
            assert properties[name]["description"].startswith(SETTINGS[name].description), (tool, name)
            assert properties[name]["default"] == TODAYS_DEFAULTS[name], (tool, name)
        # the limits the MCP types carry: the SDK refuses a bad value before the tool runs
        assert '"minimum": 256' in json.dumps(properties["max_model_len"])
        assert '"maximum": 1024' in json.dumps(properties["max_num_seqs"])
        assert '"maximum": 16' in json.dumps(properties["num_draft_tokens"])
    assert schemas["deploy_endpoint"]["properties"]["confirm"]["type"] == "boolean"


@pytest.mark.anyio
async def test_the_cli_dry_run_and_the_mcp_config_tool_give_the_same_config(capsys):
    code, cli = _cli_dry_run(capsys, *ASSISTANT_ARGV)
    assert code == 0, cli
    async with Client(build_server()) as client:
        mcp = (await client.call_tool("get_deployment_config", PARAMETERS)).structured_content
    assert mcp["valid"] is True, mcp
    assert mcp["config"] == cli["config"] and mcp["cost"] == cli["cost"]
    assert _timeless(mcp["aws_cli"]) == _timeless(cli["plan"])
    assert mcp["budget"].startswith("at most 3x ml.g6.xlarge x 2 h")  # the worst case the preview shows
    config = cli["config"]
    assert config["instance_types"] == ["ml.g6.xlarge", "ml.g4dn.xlarge"]
    assert config["container_env"]["SM_VLLM_ENFORCE_EAGER"] == "true"
    # the CLI's whole range (raw vLLM flags, any variable, an unpriced fallback, no AMI) stays a person's
    code, cli = _cli_dry_run(capsys, *ARGV)
    assert code == 0, cli
    config = cli["config"]
    assert config["instance_types"] == ["ml.g6.xlarge", "ml.g5.xlarge"] and config["inference_ami_version"] == AMI
    assert config["container_env"]["SM_VLLM_ENFORCE_EAGER"] == "true" and config["container_env"]["SM_VLLM_SEED"] == "7"
    assert config["container_env"]["SM_VLLM_SWAP_SPACE"] == "2" and config["instances"] == "1..3 (autoscaling)"
    assert config["model_data"] == "s3://my-bucket/models/e2b/" and config["ttl_hours"] == 2
    plan = " ".join(cli["plan"])
    assert TAG in config["image"] and '"ContainerStartupHealthCheckTimeoutInSeconds":900' in plan
    assert '"TargetValue":8.0' in plan


@pytest.mark.anyio
@pytest.mark.parametrize(
    "argv, parameters, message",
    [
        (["--scaling-target", "8"], {"scaling_target": 8}, "--scaling-target applies only to an autoscaled endpoint"),
        (["--startup-timeout", "30"], {"startup_timeout_s": 30}, "startup_timeout_s=30 must be in 60..3600"),
        (["--gpu-memory-utilization", "1.5"], {"gpu_memory_utilization": 1.5}, "gpu_memory_utilization=1.5 must be in 0.1..0.99"),
        (["--vllm-arg=enforce-eager"], {"extra_vllm_args": ["enforce-eager"]}, "is not a --long-flag"),
        (["--env", "1BAD=x"], {"extra_env": {"1BAD": "x"}}, "invalid environment variable name '1BAD'"),
        (["--model-data", "s3://b/no-slash"], {"model_data_s3_uri": "s3://b/no-slash"}, "is not an s3://bucket"),
    ],
    ids=["scaling-target-alone", "startup-timeout", "memory-share", "vllm-arg", "env-name", "model-data"],
)
async def test_the_cli_and_the_mcp_tools_refuse_a_setting_alike(capsys, argv, parameters, message):
    code, text = _cli_dry_run(capsys, "--image-tag", TAG, *argv)
    assert code == 2 and message in text, text
    async with Client(build_server()) as client:
        answer = await client.call_tool("get_deployment_config", parameters)
        deploy = await client.call_tool("deploy_endpoint", {"image_tag": TAG, **parameters})
    parameter = next(iter(parameters))
    if answer.is_error:  # outside the assistant's boundary: the SDK refuses it before the tool runs, named
        assert parameter in answer.content[0].text and parameter in deploy.content[0].text
    else:
        config = answer.structured_content
        assert config["valid"] is False and message in config["problem"], config
        assert config["fix"]  # each refusal names its fix
        assert message in deploy.content[0].text
    assert deploy.is_error  # refused before any AWS call


def test_the_cli_alone_refuses_an_env_item_without_a_value(capsys):
    code, text = _cli_dry_run(capsys, "--image-tag", TAG, "--env", "SM_VLLM_SEED")
    assert code == 2 and "--env expects KEY=VALUE, got 'SM_VLLM_SEED'" in text and "--env SM_VLLM_SEED=0" in text


@pytest.mark.anyio
async def test_no_ami_for_a_cuda_13_image_is_refused_before_billing_and_an_mcp_null_means_auto(capsys):
    """`--inference-ami-version none` (CLI) and `inference_ami_version: null` (MCP) deployed a cu130 image on
    g4dn's default driver (470): CannotStartContainerError ~6 billed minutes later. None is refused where the
    image needs a driver; an MCP null leaves the setting out (auto), as the docs say; "none" is not an
    assistant's choice at all."""
    code, text = _cli_dry_run(capsys, "--image-tag", TAG, "--inference-ami-version", "none")
    assert code == 2 and "needs a newer GPU driver" in text and AMI in text
    async with Client(build_server()) as client:
        null = (await client.call_tool("get_deployment_config", {"inference_ami_version": None})).structured_content
        none = await client.call_tool("deploy_endpoint", {"inference_ami_version": "none", "confirm": True})
    assert null["valid"] is True and null["config"]["inference_ami_version"] == AMI
    assert none.is_error and "inference_ami_version" in none.content[0].text
