"""Timing fidelity of the offline SageMaker path, as tested properties that hold on any machine:
the runtime STAND-IN forwards every chunk the server writes as its own event, at once (proved in
lock step: the bench's FAKE server writes the next token only after the test has received the
previous one), and the same workload through ``sagemaker://`` and plain HTTP records the same
tokens, chunks and causal lower bounds. How close the two paths' TTFT and TPOT readings are is a
measurement, not a test: ``scripts/bench_standin_fidelity.py`` prints both (docs/sagemaker.md
cites its output)."""

from __future__ import annotations

import http.client
import threading

from fakes.fake_openai_server import FakeScript, FakeServer, FakeServerState
from fakes.sagemaker_fault_standin import aws_env

from gemma4_t4.bench import run_benchmark
from gemma4_t4.serving.server_state import free_port
from gemma4_t4.standins.runtime_standin import RuntimeStandIn

TTFT_S, GAP_S = 0.040, 0.015  # injected: 40 ms to the first token, 15 ms between tokens
TOKEN = b'"text": "ab"'  # one fake token as the server writes it (inside the stand-in's event)


def _same_workload(base_url: str, model: str, out, **opts):
    return run_benchmark(
        base_url, model, "decode", out, concurrency=[1], warmup=1, progress=False, overwrite=True, **opts
    )


def test_the_standin_forwards_each_chunk_before_the_next_exists():
    """HTTP/1.1 chunked, one event per chunk, as the real runtime: in lock step, the server writes
    token k+1 only once the test holds token k, so a stand-in that held anything back would stall
    the stream (the read times out) instead of passing."""
    state = FakeServerState(default=FakeScript(ttft_s=0.0, gap_s=0.0, role_chunk=False))
    state.lockstep = threading.Semaphore(0)
    with FakeServer(free_port(), state) as fake, RuntimeStandIn(fake.base_url) as standin:
        port = int(standin.url.rsplit(":", 1)[1])
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)  # < the fake's 30 s wait
        conn.request(
            "POST",
            "/endpoints/ep/invocations-response-stream",
            body=b'{"prompt": "hi", "max_tokens": 4, "stream": true}',
            headers={"Content-Type": "application/json"},
        )
        response = conn.getresponse()
        assert response.version == 11 and response.getheader("Transfer-Encoding") == "chunked"
        received = b""
        for k in range(1, 4):
            while received.count(TOKEN) < k:
                more = response.read1(65536)
                assert more, f"the stream ended after {received.count(TOKEN)} of 4 tokens"
                received += more
            # token k is here while the server still waits to write token k+1: nothing was held back
            assert received.count(TOKEN) == k and b"[DONE]" not in received
            state.lockstep.release()
        received += response.read()
        conn.close()
    assert received.count(TOKEN) == 4 and b"[DONE]" in received
    assert received.count(b"PayloadPart") >= 4  # each token its own event


def test_sagemaker_path_records_what_http_records_on_the_fake_server(tiny_model_dir, tmp_path, monkeypatch):
    """The same decode workload over HTTP and through the stand-in: the same tokens, one chunk per
    token on both paths, every token write forwarded as an event, and TTFT / E2EL no shorter than
    the injected delays (a causal bound: nothing can arrive before the server wrote it)."""
    state = FakeServerState(default=FakeScript(ttft_s=TTFT_S, gap_s=GAP_S))
    with FakeServer(free_port(), state) as fake, RuntimeStandIn(fake.base_url) as standin:
        aws_env(monkeypatch, standin.url)
        opts = {"input_len": 16, "output_len": 12, "num_prompts": 6, "tokenizer": str(tiny_model_dir)}
        http_run = _same_workload(fake.base_url, "fake-model", tmp_path / "http", **opts)
        written_before = sum(len(entry["writes_s"]) for entry in state.log)
        sm_run = _same_workload("sagemaker://us-east-2/fake-ep", "fake-model", tmp_path / "sm", **opts)
        token_writes = sum(len(entry["writes_s"]) for entry in state.log) - written_before
        forwarded = len(standin.part_times)
    assert token_writes >= 7 * 12  # warm-up + measured (and the check's probe), one write per token
    assert forwarded >= token_writes  # every token write left the stand-in as its own event
    cells = {}
    for name, run in (("http", http_run), ("sm", sm_run)):
        (cell,) = run.cells
        assert run.status == "complete" and cell.failed == 0, (name, run.status, run.run.error)
        assert (cell.completed, cell.total_output_tokens, cell.content_chunks) == (6, 72, 72), name
        assert cell.ttft_ms.min >= TTFT_S * 1000, (name, cell.ttft_ms)
        assert cell.e2el_ms.min >= (TTFT_S + 11 * GAP_S) * 1000, (name, cell.e2el_ms)
        cells[name] = cell
    assert sm_run.run.server.backend == "sagemaker" and http_run.run.server.backend == "openai-http"
    assert cells["sm"].token_source == cells["http"].token_source == ["usage"]
