"""Decode, TTFT, prefix-cache and answers workloads against the REAL vLLM CPU server (tiny
Gemma 4, prefix caching on, block size 32). Cells are tiny; timings are not asserted (the CI
machine is shared), structure and cache behaviour are."""

import importlib.metadata

import pytest

from gemma4_t4.bench import compare_runs, plot_run, run_benchmark
from gemma4_t4.bench.vllm_cli import patch_vllm_version

pytestmark = pytest.mark.vllm


def _opts(vllm_server):
    return {"max_num_seqs": vllm_server.config.max_num_seqs, "server_launch": vllm_server.launch_record,
            "progress": False}


def test_decode_sweep(vllm_server, tmp_path):
    run = run_benchmark(vllm_server.base_url, "tiny-gemma4", "decode", tmp_path / "decode", concurrency=[1, 2],
                        input_len=64, output_len=8, num_prompts=4, warmup=1, **_opts(vllm_server))
    assert run.status == "complete"
    for cell in run.cells:
        assert cell["completed"] == 4 and cell["failed"] == 0 and cell["queueing"] is False
        assert cell["input_len_exact"] and cell["token_source"] == ["usage"]
        assert cell["total_output_tokens"] == 4 * 8
        assert cell["tpot_ms"]["median"] > 0 and cell["output_throughput_tok_s"] > 0
        # unique prompts by construction: measured, not assumed
        assert cell["prefix_cache"]["source"] == "/metrics" and cell["prefix_cache"]["hits"] == 0
        assert cell["prefix_cache"]["queries"] >= 4 * 64
    assert run.run["environment"]["server"]["version"] == "0.32.0"
    assert run.run["environment"]["server"]["cache_config"]["block_size"] == "32"
    assert [p.name for p in plot_run(run)] == ["throughput_vs_concurrency.png"]


def test_ttft_sweep_has_no_cache_hits(vllm_server, tmp_path):
    run = run_benchmark(vllm_server.base_url, "tiny-gemma4", "ttft", tmp_path / "ttft",
                        input_lens=[64, 128, 256, 512, 1024], output_len=2, num_prompts=2, warmup=1,
                        **_opts(vllm_server))
    assert [c["input_len"] for c in run.cells] == [64, 128, 256, 512, 1024]
    for cell in run.cells:
        assert cell["completed"] == 2 and cell["input_len_exact"]
        assert cell["prefix_cache"]["hits"] == 0
    assert [p.name for p in plot_run(run)] == ["ttft_vs_input_len.png"]


def test_prefix_cache_hits_are_measured(vllm_server, tmp_path):
    run = run_benchmark(vllm_server.base_url, "tiny-gemma4", "prefix", tmp_path / "prefix", input_len=320,
                        prefix_len=256, groups=2, num_prompts=4, output_len=2, warmup=1, **_opts(vllm_server))
    shared, unique = run.cells
    assert shared["variant"] == "shared_prefix" and unique["variant"] == "unique_prompts"
    assert shared["prefix_cache"]["hits"] > 0 and shared["prefix_cache"]["hit_rate"] > 0
    assert unique["prefix_cache"]["hits"] == 0
    # the server's per-request cached_tokens agree: followers in each group hit, leaders do not
    cached = [r["cached_tokens"] for r in run.measured(shared["cell"])]
    assert cached[0] == 0 and any(c > 0 for c in cached[1:])


def test_answers_are_identical_across_two_greedy_runs(vllm_server, tmp_path):
    a = run_benchmark(vllm_server.base_url, "tiny-gemma4", "answers", tmp_path / "a", output_len=8,
                      progress=False)
    b = run_benchmark(vllm_server.base_url, "tiny-gemma4", "answers", tmp_path / "b", output_len=8,
                      progress=False)
    assert a.cells[0]["completed"] == 20 and a.cells[0]["api"] == "chat"
    comparison = compare_runs(a, b)
    assert comparison.answers.total == 20 and comparison.answers.identical == 20


def test_vllm_cli_wrapper_reports_a_cpu_version():
    original = importlib.metadata.version
    patched = patch_vllm_version()
    try:
        assert importlib.metadata.version("vllm").endswith("+cpu")
        assert patched is None or patched.endswith("+cpu")
        assert importlib.metadata.version("aiohttp") == original("aiohttp")
    finally:
        importlib.metadata.version = original
