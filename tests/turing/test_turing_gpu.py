"""The clamped tile on a real CUDA GPU: numerics at realistic lengths and clamped-vs-default timing.

Skipped without CUDA. Needs vLLM's kernel files: the installed vLLM, or GEMMA4_T4_VLLM_ROOT
pointing at a copy of the ``vllm`` package folder (the GPU machine may have torch but no vLLM).
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

T4 = {"platform": "cuda", "name": "T4", "capability": (7, 5), "limit": 65_536, "limit_source": "target"}


@pytest.fixture(scope="module")
def kernel():
    from gemma4_t4.turing import tilecap
    from gemma4_t4.turing.offline import load_kernel_module

    props = torch.cuda.get_device_properties(0)
    loaded = load_kernel_module(os.environ.get("GEMMA4_T4_VLLM_ROOT"), capability=(props.major, props.minor))
    # Decide tiles as on a T4: the launcher then runs the clamped configuration on this GPU.
    outcome = tilecap.install(loaded.module, origin="test", device=T4, vllm_version=loaded.vllm_version, log=False)
    assert outcome["action"] == "capped"
    return loaded


@pytest.mark.parametrize("length", [512, 2048, 4096])
def test_clamped_tile_matches_float32_reference(kernel, length):
    from gemma4_t4.turing.numerics import forced_tile, make_case, reference_attention, run_unified_attention

    case = make_case(512, 8, 1, [length], [length], device="cuda", seed=length)
    reference = reference_attention(case)
    clamped = run_unified_attention(kernel.module, case).float()
    assert kernel.module._get_tile_size(512, 0, 2, True) == 16  # the T4 decision for head-512 prefill
    with forced_tile(kernel.module, 32):
        default = run_unified_attention(kernel.module, case).float()
    error = (clamped - reference).abs().max().item()
    error_default = (default - reference).abs().max().item()
    assert torch.isfinite(clamped).all()
    assert error < 1e-2 and error <= error_default * 1.5 + 1e-3, (error, error_default)


def test_clamped_and_default_tiles_both_run(kernel):
    from gemma4_t4.turing.numerics import forced_tile, make_case, run_unified_attention

    case = make_case(512, 8, 1, [2048], [2048], device="cuda")
    times = {}
    for tile in (16, 32):
        with forced_tile(kernel.module, tile):
            run_unified_attention(kernel.module, case)
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(10):
                run_unified_attention(kernel.module, case)
            end.record()
            torch.cuda.synchronize()
            times[tile] = start.elapsed_time(end) / 10
    print(f"head 512, 2048 tokens: TILE 16 {times[16]:.3f} ms, TILE 32 {times[32]:.3f} ms")
    # both tiles ran to completion; what the clamp costs is measured by scripts/turing_gpu_bench.py
    # (a speed bound here would time whatever else shares the GPU)
    assert all(t > 0 for t in times.values()), times
