"""The tensor-core prefill route on a real CUDA GPU: PyTorch's memory-efficient kernel against a
float32 reference and against vLLM's Triton kernel, for new prompts alone and in mixed steps.

Skipped without CUDA. Needs vLLM's kernel files: the installed vLLM, or GEMMA4_T4_VLLM_ROOT
pointing at a copy of the ``vllm`` package folder (the GPU machine may have torch but no vLLM).
"""

from __future__ import annotations

import json
import os

import pytest

torch = pytest.importorskip("torch")

from fakes.packed_attention import reference_attention as packed_reference  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.fixture(scope="module")
def kernel():
    from gemma4_t4.turing.prefill_bench import load_triton_kernel

    props = torch.cuda.get_device_properties(0)
    device = {
        "platform": "cuda",
        "name": props.name,
        "capability": (props.major, props.minor),
        "limit": int(props.shared_memory_per_block_optin),
        "limit_source": "target",
    }
    loaded, _ = load_triton_kernel(os.environ.get("GEMMA4_T4_VLLM_ROOT"), (props.major, props.minor), device)
    return loaded


@pytest.mark.parametrize("head,window", [(512, None), (256, 512)])
@pytest.mark.parametrize("length", [512, 2048])
@pytest.mark.parametrize("shared_kv", [False, True])
def test_route_matches_float32_and_triton(kernel, head, window, length, shared_kv):
    from gemma4_t4.turing import prefill_bench as pb
    from gemma4_t4.turing.verify import AttentionShape

    shape = AttentionShape("E2B", "global" if window is None else "sliding", head, 8, 1, window)
    for query_lens, context_lens in (
        ([length], [length]),
        ([1, length, 1, 300, 64], [700, length, length + 9, 300, 564]),
    ):
        step = pb.make_step(shape, query_lens, context_lens, seed=length + head, shared_kv=shared_kv)
        result = pb.measure(step, kernel.module, timing=False)
        route, triton = result["route"], result["triton"]
        assert route["finite"] and route["fallback_steps"] == 0
        assert route["routed_sequences"] == (1 if len(query_lens) == 1 else 2)
        assert route["max_abs_err"] <= 1.5 * triton["max_abs_err"] + 1e-4, (route, triton)
        assert route["max_abs_diff_vs_triton"] < 8e-3  # a few fp16 ulps at outputs near 4


def test_efficient_kernel_window_matches_gemma_sliding_semantics():
    from gemma4_t4.turing import prefill

    q, k, v = (torch.randn(1000, 8, 256, device="cuda", dtype=torch.float16) for _ in range(3))
    cu = torch.tensor([0, 600, 1000], dtype=torch.int32, device="cuda")
    fast = prefill.efficient_attention(q, k, v, cu, 600, 1.0, 512).float()
    exact = packed_reference(q, k, v, cu, 600, 1.0, 512).float()
    wider = packed_reference(q, k, v, cu, 600, 1.0, 513).float()
    assert (fast - exact).abs().max() < 4e-3
    assert (fast - wider).abs().max() > 1e-2  # the window is off by nothing, not by one


def test_bench_prefill_writes_json_plot_and_verdict(tmp_path, monkeypatch, kernel):
    from gemma4_t4.foundation.cache import CACHE_ENV
    from gemma4_t4.turing import prefill
    from gemma4_t4.turing.prefill_bench import bench_prefill

    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    report = bench_prefill((512, 1024), ("e2b",), os.environ.get("GEMMA4_T4_VLLM_ROOT"), tmp_path / "out")
    data = json.loads((tmp_path / "out" / "bench_prefill.json").read_text())
    assert (tmp_path / "out" / "bench_prefill.png").stat().st_size > 1000
    assert {r["head_size"] for r in data["rows"]} == {256, 512} and len(data["rows"]) == 4
    assert set(report.heads) == {"256", "512"}
    verdict = prefill.load_verdict(prefill.device_key(data["key"]["vllm"]))
    assert verdict is not None and verdict["heads"] == report.heads
    print(json.dumps(report.heads))
