#!/usr/bin/env python3
"""Run vLLM's unified attention on a CUDA GPU at the T4-clamped tile and at vLLM's default tile.

For Gemma 4's head-512 global layer (8 q heads / 1 KV head, as E2B) and head-256 sliding layer
(window 512), at single-sequence prefill lengths 512-4096: the max error of each tile against a
float32 reference, the difference between the two tiles, their times (CUDA-graph replays), and
the shared memory of the compiled kernels. Set TRITON_OVERRIDE_ARCH=sm75 to build the sm_75 code
(FMA dot, Turing's shared-memory layout) on a newer GPU.

Only torch, Triton and vLLM's kernel files are needed (no vLLM install):
    python scripts/turing_gpu_bench.py --vllm-root PATH/TO/vllm --out results.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gemma4_t4.turing import smem, tilecap  # noqa: E402
from gemma4_t4.turing.numerics import forced_tile, make_case, reference_attention, run_unified_attention  # noqa: E402
from gemma4_t4.turing.offline import load_kernel_module  # noqa: E402

LAYERS = (  # name, head, q heads, kv heads, sliding window
    ("global head 512 (E2B 8q/1kv)", 512, 8, 1, None),
    ("sliding head 256, window 512 (E2B 8q/1kv)", 256, 8, 1, 512),
)


def time_graph(fn, reps: int = 20, batches: int = 5) -> float:
    """Median milliseconds per call, replaying a CUDA graph of ``fn`` (no Python launch overhead)."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    samples = []
    for _ in range(batches):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) / reps)
    return statistics.median(samples)


def compiled_shared_bytes(jit) -> list[int]:
    sizes = []
    for cache in jit.device_caches.values():
        for kernel in cache[0].values():
            sizes.append(int(kernel.metadata.shared))
    return sorted(set(sizes))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-root", required=True, help="folder with vLLM's kernel files (vllm/...)")
    parser.add_argument("--lengths", default="512,1024,2048,4096")
    parser.add_argument("--out", default="turing_gpu_bench.json")
    args = parser.parse_args()

    import torch
    import triton

    props = torch.cuda.get_device_properties(0)
    capability = (props.major, props.minor)
    override = os.environ.get("TRITON_OVERRIDE_ARCH")
    code_capability = smem_capability = capability
    if override:
        digits = override.lower().removeprefix("sm").removeprefix("_")
        code_capability = (int(digits[:-1]), int(digits[-1]))
        smem_capability = code_capability
    kernel = load_kernel_module(args.vllm_root, capability=code_capability)
    device = {"platform": "cuda", "name": props.name, "capability": capability,
              "limit": int(props.shared_memory_per_block_optin), "limit_source": "target"}
    on_this_gpu = tilecap.install(kernel.module, origin="bench", device=device, vllm_version=kernel.vllm_version,
                                  log=False)
    t4 = {"platform": "cuda", "name": "T4", "capability": (7, 5), "limit": 65_536, "limit_source": "target"}
    t4_tile = smem.fitting_tile(32, 16, 512, 2, t4["limit"], t4["capability"])
    results = {
        "device": props.name, "capability": f"sm_{capability[0]}{capability[1]}",
        "shared_memory_per_block_optin": int(props.shared_memory_per_block_optin),
        "triton_override_arch": override, "code_built_for": f"sm_{code_capability[0]}{code_capability[1]}",
        "torch": torch.__version__, "triton": triton.__version__, "vllm_kernel_version": kernel.vllm_version,
        "kernel_sha256": kernel.sha256, "tile_cap_on_this_gpu": on_this_gpu["action"],
        "tile_cap_on_this_gpu_reason": on_this_gpu["reason"], "t4_clamped_tile_head512": t4_tile,
        "softmax_scale": 1.0, "kv_block_size": 16, "dtype": "float16", "rows": [],
    }
    lengths = [int(x) for x in args.lengths.split(",")]
    jit = kernel.module.kernel_unified_attention
    for name, head, nq, nkv, window in LAYERS:
        for length in lengths:
            case = make_case(head, nq, nkv, [length], [length], sliding_window=window, device="cuda", seed=length)
            reference = reference_attention(case)
            row = {"layer": name, "head_size": head, "tokens": length}
            outputs = {}
            for tile in (16, 32):
                with forced_tile(kernel.module, tile):
                    before = set(compiled_shared_bytes(jit))
                    outputs[tile] = run_unified_attention(kernel.module, case).float()
                    torch.cuda.synchronize()
                    new = sorted(set(compiled_shared_bytes(jit)) - before) or None
                    try:
                        ms = time_graph(lambda c=case: run_unified_attention(kernel.module, c))
                    except Exception as exc:  # graph capture unsupported: time plain launches
                        print(f"graph capture failed ({exc}); timing eager launches", file=sys.stderr)
                        torch.cuda.synchronize()
                        t0 = time.perf_counter()
                        for _ in range(20):
                            run_unified_attention(kernel.module, case)
                        torch.cuda.synchronize()
                        ms = (time.perf_counter() - t0) / 20 * 1e3
                row[f"tile{tile}_ms"] = round(ms, 4)
                row[f"tile{tile}_max_abs_error"] = float((outputs[tile] - reference).abs().max())
                row[f"tile{tile}_new_kernel_shared_bytes"] = new
                row[f"tile{tile}_model_bytes"] = smem.attention_smem_bytes(tile, 16, head, 2, smem_capability)
            row["max_abs_diff_tile16_vs_tile32"] = float((outputs[16] - outputs[32]).abs().max())
            row["reference_max_abs"] = float(reference.abs().max())
            row["ratio_tile16_over_tile32"] = round(row["tile16_ms"] / row["tile32_ms"], 3)
            row["finite"] = bool(torch.isfinite(outputs[16]).all() and torch.isfinite(outputs[32]).all())
            results["rows"].append(row)
            print(json.dumps(row), flush=True)
            torch.cuda.empty_cache()
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
