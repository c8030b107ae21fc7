"""The deploy settings are declared once, beside DeployConfig: every one is a flag of ``sagemaker
deploy`` (and, but for the per-endpoint ones, of ``matrix``) and a parameter of the MCP tools
``get_deployment_config`` and ``deploy_endpoint``, with the same help, default and refusals; the same
settings through the CLI and through MCP give the same config."""

from __future__ import annotations

import argparse
import json
import re

import pytest
from mcp import Client

from gemma4_t4.cli import build_parser, main
from gemma4_t4.mcp_server import build_server
from gemma4_t4.sagemaker.config import DeployConfig, default_region, deploy_settings
from gemma4_t4.sagemaker.image import DEFAULT_VLLM_TAG

SETTINGS = {s.name: s for s in deploy_settings()}
# What a user who passes nothing gets, as the CLI's flags and the MCP tools have always said (None: the
# deploy works it out: the region from $AWS_REGION, the image tag from the registry, an empty list).
TODAYS_DEFAULTS = {
    "name": "gemma4-t4", "model_id": "google/gemma-4-E2B-it", "region": None, "instance_type": "ml.g4dn.xlarge",
    "role_arn": None, "image_uri": None, "image_tag": None, "dtype": None, "max_model_len": 8192,
    "max_num_seqs": 4, "tensor_parallel_size": 0, "gpu_memory_utilization": 0.90, "extra_args": None,
    "extra_env": None, "fallback_instance_types": None, "inference_ami_version": "auto",
    "startup_timeout_s": 1800, "ttl_hours": 4.0, "allow_unfixed_image": False, "model_data_s3_uri": None,
    "min_instances": None, "max_instances": None, "scaling_target": None, "draft": "off", "num_draft_tokens": None,
}  # fmt: skip
# Flags and MCP parameters spelt otherwise than their field, kept as users have always typed them.
OLD_SPELLINGS = {"startup_timeout_s": ("--startup-timeout", "startup_timeout_s"),
                 "extra_args": ("--vllm-arg", "extra_vllm_args"), "extra_env": ("--env", "extra_env"),
                 "model_data_s3_uri": ("--model-data", "model_data_s3_uri")}
# The same deployment in both spellings: every conversion the CLI makes (comma lists, KEY=VALUE, "none").
TAG = DEFAULT_VLLM_TAG
ARGV = ["--name", "g4-same", "--instance-type", "ml.g6.xlarge", "--fallback-instance-types", "ml.g5.xlarge",
        "--image-tag", TAG, "--max-model-len", "4096", "--max-num-seqs", "2", "--gpu-memory-utilization", "0.85",
        "--vllm-arg=--enforce-eager", "--vllm-arg=--seed=7", "--env", "SM_VLLM_SWAP_SPACE=2", "--ttl-hours", "2",
        "--inference-ami-version", "none", "--startup-timeout", "900", "--min-instances", "1",
        "--max-instances", "3", "--scaling-target", "8", "--model-data", "s3://my-bucket/models/e2b/"]
PARAMETERS = {"name": "g4-same", "instance_type": "ml.g6.xlarge", "fallback_instance_types": ["ml.g5.xlarge"],
              "image_tag": TAG, "max_model_len": 4096, "max_num_seqs": 2, "gpu_memory_utilization": 0.85,
              "extra_vllm_args": ["--enforce-eager", "--seed=7"], "extra_env": {"SM_VLLM_SWAP_SPACE": "2"},
              "ttl_hours": 2, "inference_ami_version": "none", "startup_timeout_s": 900, "min_instances": 1,
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
    assert {name: s.default for name, s in SETTINGS.items()} == TODAYS_DEFAULTS
    for name, (flag, parameter) in OLD_SPELLINGS.items():
        assert (SETTINGS[name].flag, SETTINGS[name].parameter) == (flag, parameter)
    for s in SETTINGS.values():
        assert s.help and "\n" not in s.help, s.name  # one line each, for --help and the MCP schema
    # a setting left out (None where its default is None) gets DeployConfig's own default
    left_out = {s.parameter: None for s in SETTINGS.values() if s.default is None}
    assert DeployConfig.from_settings(**left_out) == DeployConfig(region=default_region())


def test_every_setting_is_a_flag_of_deploy_with_its_help_and_default():
    deploy, matrix = _flags(_command("deploy")), _flags(_command("matrix"))
    for s in SETTINGS.values():
        action = deploy[s.flag]
        assert (action.help, action.dest) == (s.help, s.parameter), s.name
        assert action.default == s.default, s.name
    # matrix names its endpoints and takes its models from --models
    assert {s.flag for s in SETTINGS.values()} - set(matrix) == {"--name", "--model-id", "--model-data"}
    assert {s.flag for s in SETTINGS.values()} - {"--name", "--model-id", "--model-data"} <= set(matrix)
    defaults = vars(_command("deploy").parse_args([]))
    assert {s.name: defaults[s.parameter] for s in SETTINGS.values()} == TODAYS_DEFAULTS


@pytest.mark.anyio
async def test_every_setting_is_a_described_parameter_of_both_mcp_deploy_tools():
    schemas = await _schemas()
    own = {"get_deployment_config": set(), "deploy_endpoint": {"wait", "timeout_s", "confirm"}}
    for tool, schema in schemas.items():
        properties = schema["properties"]
        assert set(properties) == {s.parameter for s in SETTINGS.values()} | own[tool], tool
        for s in SETTINGS.values():
            assert properties[s.parameter]["description"] == s.help, (tool, s.name)
            assert properties[s.parameter]["default"] == s.default, (tool, s.name)
        # the limits the MCP types carry: the SDK refuses a bad value before the tool runs
        assert properties["max_model_len"]["exclusiveMinimum"] == 0 and properties["max_num_seqs"]["maximum"] == 1024
        assert '"maximum": 16' in json.dumps(properties["num_draft_tokens"])
    assert schemas["deploy_endpoint"]["properties"]["confirm"]["type"] == "boolean"


@pytest.mark.anyio
async def test_the_cli_dry_run_and_the_mcp_config_tool_give_the_same_config(capsys):
    code, cli = _cli_dry_run(capsys, *ARGV)
    assert code == 0, cli
    async with Client(build_server()) as client:
        mcp = (await client.call_tool("get_deployment_config", PARAMETERS)).structured_content
    assert mcp["valid"] is True, mcp
    assert mcp["config"] == cli["config"] and mcp["cost"] == cli["cost"]
    assert _timeless(mcp["aws_cli"]) == _timeless(cli["plan"])
    config = cli["config"]
    assert config["instance_types"] == ["ml.g6.xlarge", "ml.g5.xlarge"] and config["inference_ami_version"] is None
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
        (["--startup-timeout", "30"], {"startup_timeout_s": 30}, "startup/download timeouts must be 60..3600"),
        (["--gpu-memory-utilization", "1.5"], {"gpu_memory_utilization": 1.5}, "outside 0.1..0.99"),
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
        config = (await client.call_tool("get_deployment_config", parameters)).structured_content
        deploy = await client.call_tool("deploy_endpoint", {"image_tag": TAG, **parameters})
    assert config["valid"] is False and message in config["problem"], config
    assert config["fix"]  # each refusal names its fix
    assert deploy.is_error and message in deploy.content[0].text  # refused before any AWS call


def test_the_cli_alone_refuses_an_env_item_without_a_value(capsys):
    code, text = _cli_dry_run(capsys, "--image-tag", TAG, "--env", "SM_VLLM_SEED")
    assert code == 2 and "--env 'SM_VLLM_SEED' is not KEY=VALUE" in text and "--env SM_VLLM_SEED=0" in text
