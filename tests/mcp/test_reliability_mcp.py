"""The MCP server's one error boundary, through a real MCP client: a package error answers its
message and fix, any other exception its type, message and fix (never a bare "Error executing
tool"), and a server's HTTP 400 keeps its reason with the fix that matches it."""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from mcp import Client

from gemma4_t4 import mcp_answers, mcp_server
from gemma4_t4.mcp_answers import http_error, server_reason
from gemma4_t4.mcp_server import REGISTRY, build_server, tool, tool_error_text

pytestmark = pytest.mark.anyio
SECRET = "TopSecretKey-9f8e7d6c5b4a"

# vLLM's ErrorResponse for an over-long request, in the shape vLLM 0.32 returns it
# (vllm/entrypoints/serve/engine/protocol.py: {"error": {"message", "type", "param", "code"}}).
VLLM_400 = {
    "error": {
        "message": "This model's maximum context length is 2048 tokens. However, you requested "
        "5000 output tokens and your prompt contains 9 input tokens, for a total of "
        "5009 tokens. Please reduce the length of the input prompt or the number of "
        "requested output tokens.",
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    }
}


@pytest.fixture
def anyio_backend():
    return "asyncio"


async def _call(name: str, args: dict):
    async with Client(build_server()) as client:
        return await client.call_tool(name, args)


def _answer(result, name: str) -> str:
    """What the tool said: the SDK prefixes every tool error with "Error executing tool NAME: "; a
    bare "Error executing tool NAME" (what an uncaught exception gives) has nothing after it."""
    assert result.is_error
    text = result.content[0].text
    prefix = f"Error executing tool {name}: "
    assert text.startswith(prefix) and len(text) > len(prefix) + 10, text
    return text[len(prefix) :]


async def test_an_unexpected_exception_answers_type_message_and_fix(monkeypatch):
    def exploding_doctor(**kwargs):  # a fault injected into the real tool
        raise PermissionError(13, "Permission denied", "/proc/driver/nvidia")

    monkeypatch.setattr(mcp_server.env, "doctor", exploding_doctor)
    text = _answer(await _call("check_environment", {}), "check_environment")
    assert text.startswith("PermissionError: [Errno 13] Permission denied")
    assert "fix: check the owner and permissions (/proc/driver/nvidia)" in text


async def test_a_real_bad_url_answers_a_clear_error():
    # http.client raises InvalidURL (a ValueError) for a space in the host: no package code catches it
    text = _answer(
        await _call("query_model", {"prompt": "hi", "base_url": "http://local host:8000"}), "query_model"
    )
    assert "\n  fix: " in text
    assert text.split(":")[0] in ("InvalidURL", "Gemma4T4Error", "ValueError")


async def test_package_errors_keep_message_and_fix():
    result = await _call("query_model", {"prompt": "hi"})  # neither endpoint_name nor base_url
    assert _answer(result, "query_model") == (
        "Gemma4T4Error: say where to send the request\n"
        "  fix: pass endpoint_name (SageMaker) or base_url (local vLLM), not both"
    )


async def test_errors_are_scrubbed_of_secrets(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)

    def leaky_doctor(**kwargs):
        raise RuntimeError(f"signing failed with {SECRET}")

    monkeypatch.setattr(mcp_server.env, "doctor", leaky_doctor)
    result = await _call("check_environment", {})
    assert result.is_error and SECRET not in result.content[0].text and "***" in result.content[0].text


async def test_debug_logs_the_traceback_to_the_server_log(monkeypatch, caplog):
    def broken(**kwargs):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(mcp_server.env, "doctor", broken)
    monkeypatch.setenv("GEMMA4_T4_DEBUG", "1")
    with caplog.at_level(logging.ERROR, logger="gemma4_t4.mcp"):
        result = await _call("check_environment", {})
    assert _answer(result, "check_environment").startswith("ZeroDivisionError: division by zero\n  fix: ")
    record = next(r for r in caplog.records if r.name == "gemma4_t4.mcp")
    assert record.exc_info and record.exc_info[0] is ZeroDivisionError


class _Vllm400Handler(BaseHTTPRequestHandler):
    """A stand-in for a vLLM server that rejects every chat request with its 400 body (the real
    server's answer is checked in test_query_model_keeps_vllms_400_reason_on_the_real_server)."""

    def do_GET(self):  # /v1/models
        body = json.dumps({"data": [{"id": "tiny-gemma4", "max_model_len": 2048}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = json.dumps(VLLM_400).encode()
        self.send_response(400)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


async def test_query_model_keeps_the_400_reason_and_suggests_the_right_fix():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Vllm400Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        base_url = f"http://127.0.0.1:{httpd.server_address[1]}"
        result = await _call("query_model", {"prompt": "hi", "base_url": base_url, "max_tokens": 5000})
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)
    text = _answer(result, "query_model")
    assert text.startswith(
        f"Gemma4T4Error: {base_url} answered HTTP 400: This model's maximum context length is 2048"
    )
    assert "fix: shorten the prompt or lower max_tokens" in text
    assert "start_vllm_server" not in text  # the old, wrong advice


def test_http_error_reads_both_vllm_error_shapes_and_picks_the_fix():
    assert server_reason(json.dumps(VLLM_400).encode()).startswith("This model's maximum context length")
    old_shape = {
        "object": "error",
        "message": "temperature must be non-negative",
        "type": "BadRequestError",
        "code": 400,
    }
    assert server_reason(json.dumps(old_shape).encode()) == "temperature must be non-negative"
    assert server_reason(b"<html>Bad Gateway</html>") == "<html>Bad Gateway</html>"
    assert "as the server's reason says" in http_error("u", 400, json.dumps(old_shape).encode()).fix
    assert "server_status" in http_error("u", 500, b'{"error": {"message": "EngineDeadError"}}').fix
    assert "model" in http_error("u", 404, b"{}").fix


def test_tool_error_text_for_a_package_error_and_an_unexpected_one():
    from gemma4_t4.errors import Gemma4T4Error

    assert tool_error_text(Gemma4T4Error("m", "f")) == "Gemma4T4Error: m\n  fix: f"
    text = tool_error_text(KeyError("gpus"))
    assert text.startswith("KeyError: 'gpus'\n  fix: rerun with --debug (or GEMMA4_T4_DEBUG=1)")


async def test_the_registry_is_the_one_source_of_annotations_and_confirm():
    # what a client sees over the protocol is exactly the registry: every tool, its hints, and a
    # confirm parameter on each tool the registry says needs one
    async with Client(build_server()) as client:
        listed = {t.name: t for t in (await client.list_tools()).tools}
    assert set(listed) == set(REGISTRY) and len(REGISTRY) >= 10
    for name, spec in REGISTRY.items():
        seen = listed[name].annotations
        assert (seen.read_only_hint, seen.destructive_hint) == (
            spec.annotations.read_only_hint,
            spec.annotations.destructive_hint,
        ), name
        assert ("confirm" in listed[name].input_schema["properties"]) == spec.confirm, name
        if spec.confirm:
            assert spec.annotations.destructive_hint or not spec.annotations.read_only_hint
    assert {name for name, spec in mcp_server.REGISTRY.items() if spec.confirm} == {
        "deploy_endpoint",
        "delete_endpoint",
        "apply_turing_patch",
        "stop_vllm_server",
        "build_t4_image",
    }
    with pytest.raises(TypeError, match="confirm"):

        @tool(mcp_server.DESTRUCTIVE, confirm=True)
        def wipe_everything() -> None:  # a destructive tool without confirm is refused at import
            pass

    assert "wipe_everything" not in REGISTRY


async def test_local_tools_return_typed_structured_output():
    async with Client(build_server()) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        env_schema = tools["check_environment"].output_schema
        assert {"facts", "pair", "problems", "ok"} <= set(env_schema["properties"])
        assert "gpus" in json.dumps(tools["verify_gpu_arch"].output_schema)
        report = (await client.call_tool("check_environment", {})).structured_content
        image = (await client.call_tool("find_vllm_image", {"region": "us-west-2"})).structured_content
    assert "us-west-2" in image["image_uri"] and image["instance_type"] == "ml.g4dn.xlarge"
    assert image["source"] == "default" and image["inference_ami_version"]
    assert set(tools["find_vllm_image"].output_schema["properties"]) >= {"image_uri", "inference_ami_version"}
    assert set(tools["get_endpoint_logs"].output_schema["properties"]) >= {"found", "lines", "milestones"}
    from gemma4_t4.host.env import doctor

    expected = doctor()
    assert report["ok"] is expected.ok
    assert [p["code"] for p in report["problems"]] == [p.code for p in expected.problems]
    assert report["facts"]["python"] == expected.facts.python


@pytest.mark.vllm
async def test_query_model_keeps_vllms_400_reason_on_the_real_server(vllm_server):
    result = await _call(
        "query_model", {"prompt": "hello", "base_url": vllm_server.base_url, "max_tokens": 5000}
    )
    text = _answer(result, "query_model")
    # vLLM 0.32's own reason, kept word for word
    assert (
        f"{vllm_server.base_url} answered HTTP 400: max_tokens=5000 cannot be greater than max_model_len=2048"
        in text
    )
    assert "fix: shorten the prompt or lower max_tokens" in text


def test_a_sagemaker_url_without_a_model_names_the_missing_model_not_an_unreachable_server():
    from gemma4_t4.errors import Gemma4T4Error

    with pytest.raises(Gemma4T4Error, match="SageMaker endpoint") as info:
        mcp_answers.served_model("sagemaker://us-east-2/ep")
    assert "model=" in info.value.fix


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        ({"kind": "decode", "input_len": "long"}, "DecodeSpec.input_len"),  # a wrong type
        ({"kind": "sweep", "sweep": 3, "rates": [1.0]}, "SweepSpec has no field 'rates'"),  # not this kind's
        # a rule of the run itself (BenchArgs), checked when the spec is made
        ({"kind": "prefix", "groups": 40, "num_prompts": 4}, "4 prompts cannot make 40 groups"),
        ({"kind": "burst"}, "'burst'"),  # no such kind
    ],
)
async def test_a_refused_benchmark_spec_names_what_is_wrong_and_runs_nothing(tmp_path, spec, named):
    # nothing listens on port 9: a spec that got past validation would fail on the server instead
    args = {"base_url": "http://127.0.0.1:9", "model": "m", "out_dir": str(tmp_path / "out"), "spec": spec}
    text = _answer(await _call("run_benchmark", args), "run_benchmark")
    assert named in text and "127.0.0.1:9" not in text
    assert not (tmp_path / "out").exists()
