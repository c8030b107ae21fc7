"""The assistant's boundary (issue 41): every MCP tool parameter is a declared decision, and the exact inputs the
fourth red team used against the MCP server are refused before anything is created or billed (AWS on moto)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import boto3
import pytest
from fakes.aws_fixtures import local_aws, local_aws_session  # noqa: F401 - fixtures
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

from gemma4_t4.cli import main
from gemma4_t4.foundation.launch_record import assistant_boundary, user_settings
from gemma4_t4.mcp_boundary import offered
from gemma4_t4.mcp_server import build_server
from gemma4_t4.sagemaker.config import ASSISTANT_ENV, PRICED_INSTANCES, DeployConfig
from gemma4_t4.serving.server_config import ServerConfig

pytestmark = pytest.mark.anyio


# Every tool parameter that is not a generated setting, with why an assistant may pass it. A parameter of a tool
# that is in neither this nor a setting's declaration fails here.
TOOL_PARAMETERS = {
    "confirm": "a strict JSON true; without it a billing or destructive tool only describes",
    "region": "an AWS region the package knows (refused otherwise)",
    "regions": "regions to read (quotas, listings): read-only",
    "instance_types": "instance types to read quotas for: read-only",
    "instance_type": "find_vllm_image: which driver the image needs on it: read-only",
    "include_untagged": "lists other owners' endpoints too: read-only",
    "name": "an endpoint name (SageMaker's name rule); delete_endpoint deletes only this project's tagged ones",
    "lines": "how many log lines to read (1..10,000)",
    "tag": "a pinned AWS vLLM tag (the ECR tag rule; latest and paths refused)",
    "latest": "asks the registry for its newest pinned tag: read-only",
    "base_tag": "the DLC tag the fixed image builds on: a pinned AWS vLLM tag",
    "wait": "whether deploy_endpoint waits for InService (a watch rolls back a Failed one either way)",
    "timeout_s": "how long to wait; a deploy's timeout rolls back what it created",
    "budget_usd": "the cap on what one deploy or image build may bill, bounded for an assistant",
    "prompt": "text sent to the model",
    "endpoint_name": "an endpoint to query (SageMaker's name rule)",
    "base_url": "a local server's URL or sagemaker://REGION/ENDPOINT to query or measure",
    "max_tokens": "tokens to generate (1..32,768)",
    "temperature": "sampling temperature (0..2)",
    "probe_shared_memory": "the doctor reads this GPU's shared memory: read-only",
    "functional": "compile vLLM's kernel for arch offline: nothing installed changes",
    "arch": "the arch to compile for (sm_XY)",
    "revert": "undo the file patch (needs confirm)",
    "port": "stop_vllm_server: which server this MCP server started (others are refused)",
    "spec": "a registered workload's typed spec: every field bounded by its class",
    "model": "run_benchmark: the served model's name (a request field, not a launch)",
    "out_dir": "where results go: a new folder (an existing run's is refused)",
    "request_timeout_s": "per-request timeout",
}


def withheld() -> dict[str, str]:
    """Every setting an assistant never sets, with why (what docs/sagemaker.md and docs/serving.md list)."""
    found = {}
    for venue, model in (("deploy", DeployConfig), ("serve", ServerConfig)):
        for name, field in user_settings(model).items():
            rule = assistant_boundary(field) or {"sets": True}
            if not rule["sets"] or venue == "serve" and "sagemaker_only" in rule:
                found[f"{venue} {name}"] = rule.get("sagemaker_only", rule["why"])
    return found


REPO = Path(__file__).resolve().parents[2]
# the tools whose settings are generated from a declaration, and which
GENERATED = {"get_deployment_config": lambda: offered(DeployConfig, sagemaker=True),
             "deploy_endpoint": lambda: offered(DeployConfig, sagemaker=True),
             "start_vllm_server": lambda: offered(ServerConfig, sagemaker=False)}


@pytest.fixture
def anyio_backend():
    return "asyncio"


def _endpoints() -> list[str]:
    return [e["EndpointName"] for e in boto3.client("sagemaker", region_name="us-east-2").list_endpoints()["Endpoints"]]


def _in_schema(schema: dict, key: str) -> list:
    """Every value of ``key`` in a parameter's schema (its anyOf branches too)."""
    text = json.dumps(schema)
    return [json.loads(v) for v in re.findall(rf'"{key}": (\[[^\]]*\]|[-0-9.e]+)', text)]


async def test_every_tool_parameter_is_a_declared_boundary_decision():
    """A parameter of any tool is either a setting an assistant may set (with the declared bounds in its schema)
    or one of TOOL_PARAMETERS; a setting without a decision, or one withheld but offered, fails here."""
    async with Client(build_server()) as client:
        tools = {t.name: t.input_schema for t in (await client.list_tools()).tools}
    for name, schema in tools.items():
        settings = {o.parameter: o for o in GENERATED[name]()} if name in GENERATED else {}
        for parameter, declared in schema["properties"].items():
            if parameter in settings:
                rule = settings[parameter].rule
                assert rule["sets"], (name, parameter)
                for key, schema_key in (("ge", "minimum"), ("gt", "exclusiveMinimum"), ("le", "maximum")):
                    if key in rule:
                        assert rule[key] in _in_schema(declared, schema_key), (name, parameter, key)
                if "choices" in rule:
                    assert rule["choices"] in _in_schema(declared, "enum"), (name, parameter)
                if "keys" in rule:
                    assert rule["keys"] in _in_schema(declared, "enum"), (name, parameter)
            else:
                assert parameter in TOOL_PARAMETERS, f"{name}.{parameter} has no boundary decision"
    for model, tool in ((DeployConfig, "deploy_endpoint"), (ServerConfig, "start_vllm_server")):
        for field_name, field in user_settings(model).items():  # setting() takes the decision as an argument
            rule = assistant_boundary(field)
            assert rule is not None and (rule["sets"] or rule["why"]), f"{model.__name__}.{field_name}"
            # a setting declared for SageMaker only is withheld from a local server's start tool, with why
            offered_here = rule["sets"] and (model is DeployConfig or "sagemaker_only" not in rule)
            assert (field_name in tools[tool]["properties"]) is offered_here, field_name
    never = withheld()
    assert {"deploy extra_args", "deploy role_arn", "deploy allow_unfixed_image", "serve host", "serve api_key",
            "serve extra_args", "serve extra_env", "serve python", "serve work_dir"} <= set(never)
    assert not {"deploy instance_type", "serve model", "serve port"} & set(never)
    assert all(isinstance(why, str) and why for why in never.values())  # each says why
    assert "127.0.0.1" in never["serve host"]


async def test_the_deploy_schema_offers_priced_types_and_allow_listed_variables_only():
    async with Client(build_server()) as client:
        tools = {t.name: t.input_schema for t in (await client.list_tools()).tools}
    properties = tools["deploy_endpoint"]["properties"]
    assert _in_schema(properties["instance_type"], "enum") == [PRICED_INSTANCES]
    assert _in_schema(properties["extra_env"], "enum") == [list(ASSISTANT_ENV)]
    assert "extra_args" not in properties and "role_arn" not in properties
    assert _in_schema(properties["budget_usd"], "maximum") == [100.0]


@pytest.mark.parametrize("extra_env", [{"LD_PRELOAD": "/tmp/x.so"}, {"PYTHONPATH": "/tmp"},
                                       {"HF_ENDPOINT": "http://evil.example"}, {"SM_VLLM_SEED": "7"},
                                       {"SM_VLLM_ENFORCE_EAGER": "true --trust-remote-code"}])
async def test_an_assistant_sets_no_container_variable_beyond_the_allow_list(local_aws, extra_env):  # noqa: F811
    async with Client(build_server()) as client:
        answer = await client.call_tool("deploy_endpoint", {"name": "g4-env", "extra_env": extra_env,
                                                            "confirm": True})
    assert answer.is_error and "extra_env" in answer.content[0].text
    assert _endpoints() == []


@pytest.mark.parametrize("image", ["123456789012.dkr.ecr.us-east-2.amazonaws.com/mine:1",
                                   "763104351884.dkr.ecr.us-east-2.amazonaws.com/vllm:latest"])
async def test_an_assistant_deploys_no_image_but_the_dlc_at_a_pinned_tag(local_aws, image):  # noqa: F811
    async with Client(build_server()) as client:
        answer = await client.call_tool("deploy_endpoint", {"name": "g4-img", "instance_type": "ml.g6.xlarge",
                                                            "image_uri": image, "confirm": True})
    text = answer.content[0].text
    assert answer.is_error and ("no other image" in text or "not a pinned" in text), text
    assert _endpoints() == []


async def test_an_assistant_passes_no_raw_vllm_argument(local_aws):  # noqa: F811
    async with Client(build_server()) as client:
        answer = await client.call_tool("deploy_endpoint", {"name": "g4-args", "confirm": True,
                                                            "extra_vllm_args": ["--trust-remote-code"]})
    assert answer.is_error and "'extra_vllm_args'" in answer.content[0].text
    assert _endpoints() == []


async def test_twenty_unpriced_instances_for_a_week_are_refused(local_aws):  # noqa: F811
    """The red team's input: 20x ml.g4dn.12xlarge for 168 h deployed 20 instances with no price and no bound."""
    async with Client(build_server()) as client:
        answer = await client.call_tool("deploy_endpoint", {"instance_type": "ml.g4dn.12xlarge", "min_instances": 20,
                                                            "max_instances": 20, "ttl_hours": 168, "confirm": True})
    assert answer.is_error and "instance_type" in answer.content[0].text
    assert _endpoints() == []
    sm = boto3.client("sagemaker", region_name="us-east-2")
    assert sm.list_endpoint_configs()["EndpointConfigs"] == [] and sm.list_models()["Models"] == []


async def test_every_deploy_is_bounded_by_a_budget_the_preview_shows_and_the_deploy_enforces(local_aws):  # noqa: F811
    over = {"name": "g4-budget", "min_instances": 1, "max_instances": 3, "ttl_hours": 24}  # 3 x 24 h x $0.736
    async with Client(build_server()) as client:
        preview = await client.call_tool("get_deployment_config", over)
        refused = await client.call_tool("deploy_endpoint", over | {"confirm": True})
        within = await client.call_tool("deploy_endpoint", over | {"budget_usd": 60})
        cap = await client.call_tool("deploy_endpoint", over | {"budget_usd": 1e6, "confirm": True})
    assert preview.structured_content["valid"] is False and "over the budget of $10.00" in (
        preview.structured_content["problem"])
    assert refused.is_error and "$52.99" in refused.content[0].text and "budget_usd" in refused.content[0].text
    plan = within.structured_content
    assert plan["refused"] is True and "at most 3x ml.g4dn.xlarge x 24 h x $0.736/h = $52.99" in plan["cost"]
    assert cap.is_error and "budget_usd" in cap.content[0].text
    assert _endpoints() == []


@pytest.mark.parametrize("tool, arguments", [
    ("find_vllm_image", {"tag": "latest"}), ("find_vllm_image", {"tag": "../../x"}),
    ("get_endpoint_logs", {"name": "../../x"}), ("get_endpoint_status", {"name": "../x"}),
])
async def test_names_and_tags_follow_the_sagemaker_and_ecr_rules(local_aws, tool, arguments):  # noqa: F811
    async with Client(build_server()) as client:
        answer = await client.call_tool(tool, arguments)
    assert answer.is_error, answer.structured_content
    assert "is not a pinned vLLM SageMaker tag" in answer.content[0].text or "invalid endpoint name" in (
        answer.content[0].text)


async def test_stop_vllm_server_stops_only_what_this_mcp_server_started(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMA4_T4_WORK_DIR", str(tmp_path))
    async with Client(build_server()) as client:
        answer = await client.call_tool("stop_vllm_server", {"port": 8123, "confirm": True})
    assert answer.is_error and "not started by this MCP server" in answer.content[0].text
    assert "gemma4-t4 serve stop" in answer.content[0].text


def test_a_matrix_budget_is_bounded(capsys):
    code = main(["sagemaker", "matrix", "--models", "google/gemma-4-E2B-it", "--budget-usd", "1e308", "--dry-run"])
    out = capsys.readouterr()
    assert code == 2 and "at most 100,000" in out.err + out.out
    assert "0" * 30 not in out.err + out.out


async def test_a_null_workload_field_means_its_default(tmp_path):
    """Issue 44: {"kind": "decode", "input_len": null} ran with input_len None and crashed."""
    from fakes.fake_openai_server import FakeServer

    from gemma4_t4.serving.server_state import free_port

    spec = {"kind": "decode", "input_len": None, "concurrency": [1], "num_prompts": 1, "output_len": 2, "warmup": 0}
    with FakeServer(free_port(), model="fake-model") as fake:
        async with Client(build_server()) as client:
            answer = await client.call_tool("run_benchmark", {"base_url": fake.base_url, "spec": spec,
                                                              "out_dir": str(tmp_path / "run")})
    assert not answer.is_error, answer.content[0].text
    assert [c["input_len"] for c in answer.structured_content["cells"]] == [512]


SERVER = """
import os, sys
from gemma4_t4 import mcp_server
print(f"mcp server pid {os.getpid()}", file=sys.stderr, flush=True)
mcp_server.main()
"""


async def test_sigterm_cancels_a_running_benchmark_instead_of_waiting_for_it(tmp_path):
    """Medium 7: a SIGTERM while run_benchmark waited on a hung server was held for the 600 s grace."""
    import anyio
    import psutil
    from fakes.fake_openai_server import FakeScript, FakeServer, FakeServerState

    from gemma4_t4.serving.server_state import free_port

    env = {**os.environ, "GEMMA4_T4_WORK_DIR": str(tmp_path), "PYTHONPATH": str(REPO)}
    params = StdioServerParameters(command=sys.executable, args=["-c", SERVER], env=env, cwd=str(REPO))
    errlog_path = tmp_path / "stderr.log"
    hung = FakeServerState(default=FakeScript(hang_s=300))
    spec = {"kind": "decode", "concurrency": [1], "num_prompts": 1, "output_len": 2, "warmup": 0}
    exited_after = None

    async def benchmark(client: Client) -> None:
        with contextlib.suppress(Exception):  # the server goes away mid-call: the connection closes
            await client.call_tool("run_benchmark", {"base_url": fake.base_url, "model": "fake-model", "spec": spec})

    with FakeServer(free_port(), state=hung) as fake, open(errlog_path, "w") as errlog, contextlib.suppress(
            Exception):
        async with Client(stdio_client(params, errlog=errlog)) as client, anyio.create_task_group() as group:
            group.start_soon(benchmark, client)
            for _ in range(100):  # the benchmark's request is in flight
                await anyio.sleep(0.1)
                if hung.requests:
                    break
            assert hung.requests
            pid = int(re.search(r"mcp server pid (\d+)", errlog_path.read_text()).group(1))
            start = time.monotonic()
            os.kill(pid, signal.SIGTERM)
            while psutil.pid_exists(pid) and time.monotonic() - start < 30:
                await anyio.sleep(0.1)
            exited_after = time.monotonic() - start
            group.cancel_scope.cancel()
    assert exited_after is not None and exited_after < 30, "the MCP server waited for the benchmark"
