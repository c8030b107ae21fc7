#!/usr/bin/env python3
"""The tensor-core prefill route on a CUDA GPU: numerics and timings against vLLM's Triton kernel.

For Gemma 4 E2B's head-512 global layer (8 q / 1 KV head) and head-256 sliding layer (window 512)
at 512-4096 tokens: one new prompt ("single"), and a mixed step (two new prompts + decode tokens +
a chunk with cached context, shuffled block tables) where the route takes the new prompts and
vLLM's kernel the rest. Each row: max error against a float32 reference, the route's difference
from the Triton path, and the eager time per call (CUDA events). The route is run with the
prompt's K/V in hand and, as in Gemma 4's KV-shared layers, read back from the paged cache.

    python scripts/turing_prefill_gpu.py --vllm-root PATH/TO/vllm --out native.json
    TRITON_OVERRIDE_ARCH=sm75 python scripts/turing_prefill_gpu.py --vllm-root ... --triton-only --out sm75.json
    python scripts/turing_prefill_gpu.py --merge native.json sm75.json --out turing_prefill_h200.json

With TRITON_OVERRIDE_ARCH=sm75 Triton builds the sm_75 code (FMA dot, Turing's shared-memory
layout) on a newer GPU, at the tiles the tile cap picks for a T4: the code a T4 runs today.
Needs only torch, Triton and vLLM's kernel files.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gemma4_t4.turing import prefill_bench as pb  # noqa: E402
from gemma4_t4.turing.verify import AttentionShape  # noqa: E402

E2B_GLOBAL = AttentionShape("E2B", "global", 512, 8, 1, None)
E2B_SLIDING = AttentionShape("E2B", "sliding", 256, 8, 1, 512)
T4 = {"platform": "cuda", "name": "T4", "capability": (7, 5), "limit": 65_536, "limit_source": "target"}
ROUTE = "torch-mem-efficient (tensor-core route)"


def batches(n: int) -> list[tuple[str, list[int], list[int]]]:
    """(name, query lens, context lens): a new prompt alone, and a mixed step around it."""
    half = n // 2 + 37
    return [("single", [n], [n]), ("mixed", [1, n, 1, half, 64, 1], [700, n, n + 300, half, 564, 33])]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-root", help="folder with vLLM's kernel files (vllm/...)")
    parser.add_argument("--lengths", default="512,1024,2048,4096")
    parser.add_argument("--triton-only", action="store_true", help="time only vLLM's kernel (the sm75 run)")
    parser.add_argument("--merge", nargs=2, metavar=("NATIVE", "SM75"))
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.merge:
        return merge(*args.merge, out=args.out)

    import torch
    import triton

    props = torch.cuda.get_device_properties(0)
    capability = (props.major, props.minor)
    override = os.environ.get("TRITON_OVERRIDE_ARCH")
    built_for = capability
    if override:
        digits = override.lower().removeprefix("sm").removeprefix("_")
        built_for = (int(digits[:-1]), int(digits[-1]))
    device = (
        T4
        if built_for == (7, 5)
        else {
            "platform": "cuda",
            "name": props.name,
            "capability": capability,
            "limit": int(props.shared_memory_per_block_optin),
            "limit_source": "target",
        }
    )
    kernel, cap = pb.load_triton_kernel(args.vllm_root, built_for, device)
    triton_path = f"vllm-triton sm_{built_for[0]}{built_for[1]} build" + (
        " (TRITON_OVERRIDE_ARCH)" if override else ""
    )
    tile = kernel.module._get_tile_size(512, 0, 2, True)
    conditions = {
        "device": props.name,
        "not_a_t4": "H200, not a T4" if "H200" in props.name else f"{props.name}, not a T4",
        "capability": f"sm_{capability[0]}{capability[1]}",
        "triton_built_for": f"sm_{built_for[0]}{built_for[1]}",
        "triton_override_arch": override,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "vllm_kernel_version": kernel.vllm_version,
        "kernel_sha256": kernel.sha256,
        "tile_cap": cap["action"],
        "head512_prefill_tile": tile,
        "dtype": "float16",
        "softmax_scale": 1.0,
        "kv_block_size": 16,
        "timing": "median of 5 x 10 eager calls, CUDA events, after 3 warm-up calls",
        "reference": "float32 PyTorch over the paged cache",
    }
    rows = []
    paths = ("triton",) if args.triton_only else ("route", "triton")
    for shape in (E2B_GLOBAL, E2B_SLIDING):
        for n in [int(x) for x in args.lengths.split(",")]:
            for batch, query_lens, context_lens in batches(n):
                for shared in (False,) if args.triton_only else (False, True):
                    step = pb.make_step(
                        shape, query_lens, context_lens, seed=n + len(batch), shared_kv=shared
                    )
                    chosen = ("route",) if shared else paths
                    result = pb.measure(step, kernel.module, paths=chosen)
                    for p in chosen:
                        r = result[p]
                        rows.append(
                            {
                                "seq_len": n,
                                "path": ROUTE if p == "route" else triton_path,
                                "head_size": shape.head_size,
                                "max_abs_err": r["max_abs_err"],
                                "ms": r["ms"],
                                "batch": batch,
                                "query_lens": query_lens,
                                "context_lens": context_lens,
                                "num_q_heads": shape.num_q_heads,
                                "num_kv_heads": shape.num_kv_heads,
                                "window": shape.sliding_window,
                                "finite": r["finite"],
                                **(
                                    {
                                        "kv_source": "paged cache (KV-shared layer)"
                                        if shared
                                        else "forward arguments",
                                        "routed_sequences": r["routed_sequences"],
                                        "fallback_steps": r["fallback_steps"],
                                    }
                                    if p == "route"
                                    else {
                                        "tile": kernel.module._get_tile_size(
                                            shape.head_size, shape.sliding_window or 0, 2, True
                                        )
                                    }
                                ),
                                **(
                                    {"max_abs_diff_vs_triton": r["max_abs_diff_vs_triton"]}
                                    if "max_abs_diff_vs_triton" in r
                                    else {}
                                ),
                                "reference_max_abs": result["reference_max_abs"]["value"],
                            }
                        )
                        print(
                            json.dumps(
                                {
                                    k: rows[-1][k]
                                    for k in ("seq_len", "path", "head_size", "batch", "max_abs_err", "ms")
                                }
                            ),
                            flush=True,
                        )
                    del step
                    torch.cuda.empty_cache()
    Path(args.out).write_text(json.dumps({"conditions": conditions, "rows": rows}, indent=2) + "\n")
    return 0


def _pick(rows, where, prefix, kv=None):
    for r in rows:
        if (
            (r["head_size"], r["seq_len"], r["batch"]) == where
            and r["path"].startswith(prefix)
            and (kv is None or r.get("kv_source") == kv)
        ):
            return r
    return None


def merge(native_path: str, sm75_path: str, out: str) -> int:
    native, sm75 = json.loads(Path(native_path).read_text()), json.loads(Path(sm75_path).read_text())
    rows = native["rows"] + sm75["rows"]
    summary = []
    for head in (512, 256):
        for n in sorted({r["seq_len"] for r in rows}):
            for batch in ("single", "mixed"):
                where = (head, n, batch)
                route = _pick(rows, where, "torch-mem-efficient", "forward arguments")
                sm75_row = _pick(rows, where, "vllm-triton sm_75")
                native_row = _pick(rows, where, "vllm-triton sm_9") or _pick(rows, where, "vllm-triton sm_8")
                if route and sm75_row:
                    summary.append(
                        {
                            "head_size": head,
                            "seq_len": n,
                            "batch": batch,
                            "route_ms": route["ms"],
                            "triton_sm75_build_ms": sm75_row["ms"],
                            "triton_native_ms": native_row and native_row["ms"],
                            "speedup_vs_sm75_build": round(sm75_row["ms"] / route["ms"], 1),
                            "route_err": route["max_abs_err"],
                            "triton_sm75_err": sm75_row["max_abs_err"],
                            "err_ratio": round(route["max_abs_err"] / sm75_row["max_abs_err"], 3),
                        }
                    )
    target = [s for s in summary if s["head_size"] == 512 and s["seq_len"] in (2048, 4096)]
    met = bool(target) and all(s["speedup_vs_sm75_build"] >= 5 and s["err_ratio"] <= 1.5 for s in target)
    result = {
        "conditions": {
            **native["conditions"],
            "sm75_run": sm75["conditions"],
            "note": "measured on an NVIDIA H200, not a T4: the sm_75 Triton build run on the H200 "
            "stands in for what a T4 runs today; the route runs the H200's own (Sm80) "
            "variant of PyTorch's memory-efficient kernel, not the Sm75 one a T4 runs",
        },
        "target": {
            "what": "head-512 routed prefill >= 5x faster than the sm_75 Triton build at 2k-4k tokens, "
            "max error within 1.5x of Triton's",
            "met": met,
        },
        "summary": summary,
        "rows": rows,
    }
    Path(out).write_text(json.dumps(result, indent=2) + "\n")
    for s in summary:
        print(json.dumps(s))
    print("target met:", met)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
