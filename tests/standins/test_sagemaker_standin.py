"""The SageMaker-runtime STAND-IN: AWS event-stream framing that botocore itself decodes, the
runtime's errors as botocore raises them, and real replies from the tiny Gemma 4 on the real
vLLM CPU server through a real boto3 client (moto keeps the control plane)."""

from __future__ import annotations

import json
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import boto3
import pytest
from botocore.eventstream import EventStreamBuffer
from botocore.exceptions import ClientError
from fakes.aws_fixtures import local_aws, local_aws_session  # noqa: F401 - fixtures

from gemma4_t4.sagemaker import DeployConfig, deploy, invoke, invoke_stream
from gemma4_t4.standins.runtime_standin import (
    RuntimeStandIn,
    event_message,
    model_stream_error,
    payload_part,
)

REGION = "us-east-2"


def _runtime(url: str):
    return boto3.client(
        "sagemaker-runtime",
        region_name=REGION,
        endpoint_url=url,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def test_event_stream_frames_decode_with_botocore():
    buffer = EventStreamBuffer()
    data = payload_part(b'data: {"x": 1}\n\n') + payload_part(b"") + model_stream_error("boom")
    for i in range(0, len(data), 7):  # arbitrary splits, as a socket delivers them
        buffer.add_data(data[i : i + 7])
    messages = list(buffer)
    assert [
        m.headers[":event-type" if ":event-type" in m.headers else ":exception-type"] for m in messages
    ] == ["PayloadPart", "PayloadPart", "ModelStreamError"]
    assert messages[0].payload == b'data: {"x": 1}\n\n'
    assert json.loads(messages[2].payload)["Message"] == "boom"
    corrupt = bytearray(event_message({":event-type": "PayloadPart"}, b"abc"))
    corrupt[-6] ^= 0xFF  # one flipped payload byte: the message CRC must catch it
    bad = EventStreamBuffer()
    bad.add_data(bytes(corrupt))
    with pytest.raises(Exception, match="(?i)crc|checksum"):
        list(bad)


class _Backend(BaseHTTPRequestHandler):
    """A stand-in model container that answers 400, as vLLM does for a bad request."""

    def log_message(self, *args):
        pass

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers["Content-Length"]))
        body = b'{"error": {"message": "max_tokens must be at least 1"}}'
        self.send_response(400)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_runtime_errors_reach_boto3_as_aws_sends_them(local_aws):  # noqa: F811
    backend = ThreadingHTTPServer(("127.0.0.1", 0), _Backend)
    threading.Thread(target=backend.serve_forever, daemon=True).start()
    try:
        with RuntimeStandIn(
            f"http://127.0.0.1:{backend.server_address[1]}", control_plane_url=local_aws.endpoint_url
        ) as standin:
            runtime = _runtime(standin.url)
            with pytest.raises(ClientError) as missing:
                runtime.invoke_endpoint(EndpointName="nope", Body=b"{}", ContentType="application/json")
            assert missing.value.response["Error"]["Code"] == "ValidationError"
            assert "nope" in missing.value.response["Error"]["Message"]
            deploy(DeployConfig(name="g4-err"), progress=False, poll_s=0)
            with pytest.raises(ClientError) as model_error:
                runtime.invoke_endpoint(EndpointName="g4-err", Body=b"{}", ContentType="application/json")
            assert model_error.value.response["Error"]["Code"] == "ModelError"
            assert model_error.value.response["OriginalStatusCode"] == 400
            assert "max_tokens must be at least 1" in model_error.value.response["Error"]["Message"]
            with pytest.raises(ClientError) as stream_error:
                runtime.invoke_endpoint_with_response_stream(
                    EndpointName="g4-err", Body=b"{}", ContentType="application/json"
                )
            assert stream_error.value.response["Error"]["Code"] == "ModelError"
            assert stream_error.value.response["OriginalStatusCode"] == 400
            assert "max_tokens must be at least 1" in stream_error.value.response["Error"]["Message"]
    finally:
        backend.shutdown()
        backend.server_close()
    with pytest.raises(Exception, match="http://"):
        RuntimeStandIn("file:///etc/passwd")


@pytest.mark.vllm
def test_real_replies_from_the_tiny_model_through_boto3(local_aws, vllm_server, monkeypatch):  # noqa: F811
    deploy(DeployConfig(name="g4-tiny"), progress=False, poll_s=0)  # moto: the control plane
    with RuntimeStandIn(vllm_server.base_url, control_plane_url=local_aws.endpoint_url) as standin:
        monkeypatch.setenv("AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME", standin.url)  # how boto3 is pointed at it
        prompt = "Count from one to ten in English words, please."
        opts = {"max_tokens": 12, "ignore_eos": True}
        reply = invoke("g4-tiny", REGION, prompt, **opts)
        assert reply.usage["completion_tokens"] == 12 and reply.text.strip()

        streamed = invoke_stream("g4-tiny", REGION, prompt, **opts)
        assert streamed.text == reply.text  # greedy decoding: the same tokens both ways
        assert streamed.usage["completion_tokens"] == 12 and streamed.ttft_s < streamed.total_s
        assert standin.parts_sent >= 1

        # the same request straight to the server over HTTP gives the same tokens
        payload = {
            "model": "tiny-gemma4",
            "messages": [{"role": "user", "content": prompt}],
            "temperature": 0.0,
            **opts,
        }
        request = urllib.request.Request(
            vllm_server.base_url + "/v1/chat/completions",
            data=json.dumps(payload).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            direct = json.loads(response.read())
        assert direct["choices"][0]["message"]["content"] == reply.text

        # and a real boto3 stream reads the tiny model's tokens as PayloadParts
        raw = boto3.client("sagemaker-runtime", region_name=REGION).invoke_endpoint_with_response_stream(
            EndpointName="g4-tiny",
            ContentType="application/json",
            Body=json.dumps({**payload, "stream": True}),
        )
        chunks = b"".join(e["PayloadPart"]["Bytes"] for e in raw["Body"] if "PayloadPart" in e)
        assert b"data:" in chunks and b"[DONE]" in chunks

        runtime = boto3.client("sagemaker-runtime", region_name=REGION)
        with pytest.raises(ClientError, match="ValidationError"):  # an endpoint moto never created
            runtime.invoke_endpoint(EndpointName="g4-never", Body=b"{}", ContentType="application/json")


@pytest.mark.vllm
@pytest.mark.slow
def test_matrix_measures_through_the_benchmark_adapter(
    local_aws,  # noqa: F811
    vllm_server,
    tiny_model_dir,
    monkeypatch,
    tmp_path,
):
    """The matrix run end to end offline: moto deploys, the benchmark measures sagemaker://REGION/ENDPOINT
    through the stand-in (real tokens from the tiny model), and the endpoint is deleted."""
    from gemma4_t4.bench.specs import DecodeSpec
    from gemma4_t4.studies.matrix import EndpointHandling, matrix_configs, run_configs

    with RuntimeStandIn(vllm_server.base_url, control_plane_url=local_aws.endpoint_url) as standin:
        monkeypatch.setenv("AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME", standin.url)
        monkeypatch.setenv("GEMMA4_T4_CACHE_DIR", str(tmp_path / "cache"))  # ownership records
        result = run_configs(
            matrix_configs(["tiny-gemma4"], DeployConfig()),
            {"decode": DecodeSpec(concurrency=[1], input_len=32, output_len=8, num_prompts=2, warmup=1)},
            budget=1.0,
            out_dir=tmp_path,
            tokenizer=str(tiny_model_dir),
            how=EndpointHandling(poll_s=0, progress=False),
        )
    [entry] = result.entries
    assert entry.status == "measured", entry.error
    assert entry.runs["decode"].cells[0].total_output_tokens == 2 * 8
    assert (tmp_path / entry.endpoint / "decode" / "summary.json").exists()
    summary = json.loads((tmp_path / entry.endpoint / "decode" / "summary.json").read_text())
    assert "sagemaker://us-east-2/" + entry.endpoint in json.dumps(summary)
    assert standin.parts_sent > 0  # the requests really went through the runtime API
    assert boto3.client("sagemaker", region_name=REGION).list_endpoints()["Endpoints"] == []
