"""``gemma4-t4 turing bench-prefill``: time the tensor-core prefill route against vLLM's Triton kernel
on this GPU, check both against float32, and cache the verdict the route follows.

Both paths run the code vLLM runs: :class:`.prefill.PrefillRoute` ``.forward``, and vLLM's own
``unified_attention`` (loaded from its files by :mod:`.offline`, no engine) called as
TritonAttentionImpl.forward calls it, at the tile cap's tiles. Times are medians of eager calls
(CUDA events), as vLLM runs attention outside its CUDA graphs.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from gemma4_t4.catalog.models import KV_BLOCK_SIZE, get_variant
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation.atomic import atomic_write_json
from gemma4_t4.foundation.figures import pyplot, save_figure
from gemma4_t4.foundation.jsonable import TypedDict
from gemma4_t4.foundation.table import Displayable
from gemma4_t4.turing import prefill, tilecap
from gemma4_t4.turing.numerics import make_case, reference_attention, segment_buffers
from gemma4_t4.turing.offline import load_kernel_module
from gemma4_t4.turing.verify import AttentionShape, gemma4_attention_shapes

DEFAULT_LENGTHS = (512, 1024, 2048, 4096)
DEFAULT_MODELS = ("e2b", "e4b", "12b")
ERROR_MARGIN = 1.5  # the route must be within 1.5x of Triton's max error vs float32 (plus one fp16 ulp floor)
ERROR_FLOOR = 2e-3


@dataclass
class FakeImpl:
    """The attributes of vLLM's TritonAttentionImpl that its forward and the route read (fp16 cache)."""

    num_heads: int
    head_size: int
    num_kv_heads: int
    sliding_window: tuple[int, int]
    scale: float = 1.0  # Gemma 4 normalises q and k and uses softmax scale 1.0
    kv_cache_dtype: str = "auto"
    alibi_slopes: Any = None
    logits_soft_cap: float = 0
    sinks: Any = None
    attn_type: str = "decoder"
    chunk_lookback: int = -1
    _is_per_token_head_quant: bool = False


@dataclass
class StepMetadata:
    """Built like vLLM's TritonAttentionMetadata (the fields forward and the route read)."""

    num_actual_tokens: int
    max_query_len: int
    query_start_loc: Any
    max_seq_len: int
    seq_lens: Any
    block_table: Any
    seq_threshold_3D: int
    num_par_softmax_segments: int
    softmax_segm_output: Any
    softmax_segm_max: Any
    softmax_segm_expsum: Any
    causal: Any = True
    mm_prefix_range_tensor: Any = None
    rswa_prefix_lens: Any = None


@dataclass
class Step:
    """One attention call of a step: inputs in vLLM's layout and the float32 reference."""

    impl: FakeImpl
    query: Any
    key: Any  # the new tokens' K ([tokens, kv_heads, head]); None models a KV-shared layer
    value: Any
    kv_cache: Any  # logical [blocks, kv_heads, block_size, 2 * head], as vLLM hands it to forward
    metadata: StepMetadata
    case: Any = field(repr=False, default=None)


def make_step(
    shape: AttentionShape, query_lens: list[int], context_lens: list[int], device: str = "cuda", seed: int = 0,
    shared_kv: bool = False,
) -> Step:
    """A step's attention inputs with a shuffled block table; K/V of the new tokens already cached."""
    import torch

    case = make_case(
        shape.head_size, shape.num_q_heads, shape.num_kv_heads, query_lens, context_lens,
        sliding_window=shape.sliding_window, device=device, seed=seed,
    )
    # vLLM's physical cache is [blocks, block_size, kv_heads, 2*head]; forward sees it transposed.
    physical = torch.cat([case.key_cache, case.value_cache], dim=-1)
    kv_cache = physical.transpose(1, 2)
    key_cache, value_cache = prefill.split_kv_cache(kv_cache, shape.head_size)
    keys, values = [], []
    for i, (q_len, ctx) in enumerate(zip(query_lens, context_lens, strict=True)):
        pos = torch.arange(ctx - q_len, ctx, device=device)
        blocks = case.block_table[i, pos // KV_BLOCK_SIZE].long()
        keys.append(key_cache[blocks, pos % KV_BLOCK_SIZE])
        values.append(value_cache[blocks, pos % KV_BLOCK_SIZE])
    metadata = StepMetadata(
        num_actual_tokens=sum(query_lens), max_query_len=max(query_lens), query_start_loc=case.cu_seqlens_q,
        max_seq_len=max(context_lens), seq_lens=case.seqused_k, block_table=case.block_table,
        **segment_buffers(sum(query_lens), shape.num_q_heads, shape.num_kv_heads, shape.head_size, device),
    )
    window = (shape.sliding_window - 1, 0) if shape.sliding_window else (-1, -1)
    impl = FakeImpl(shape.num_q_heads, shape.head_size, shape.num_kv_heads, window)
    key = None if shared_kv else torch.cat(keys)
    value = None if shared_kv else torch.cat(values)
    return Step(impl, case.q, key, value, kv_cache, metadata, case)


def triton_forward(kernel_module: Any):
    """TritonAttentionImpl.forward's launch (fp16 cache, no quantisation) over vLLM's real launcher, for
    machines without a vLLM engine (the arguments :func:`.prefill.structure_problem` checks)."""

    def forward(
        impl, layer, query, key, value, kv_cache, attn_metadata, output, output_scale=None,
        output_block_scale=None,
    ):
        key_cache, value_cache = prefill.split_kv_cache(kv_cache, impl.head_size)
        n, meta = attn_metadata.num_actual_tokens, attn_metadata
        kernel_module.unified_attention(
            q=query[:n], k=key_cache, v=value_cache, out=output[:n], cu_seqlens_q=meta.query_start_loc,
            max_seqlen_q=meta.max_query_len, seqused_k=meta.seq_lens, max_seqlen_k=meta.max_seq_len,
            softmax_scale=impl.scale, causal=meta.causal, window_size=impl.sliding_window,
            block_table=meta.block_table, softcap=impl.logits_soft_cap, q_descale=None, k_descale=None,
            v_descale=None, seq_threshold_3D=meta.seq_threshold_3D,
            num_par_softmax_segments=meta.num_par_softmax_segments,
            softmax_segm_output=meta.softmax_segm_output, softmax_segm_max=meta.softmax_segm_max,
            softmax_segm_expsum=meta.softmax_segm_expsum, sinks=impl.sinks, output_scale=output_scale,
        )
        return output

    return forward


def run_path(step: Step, forward: Any, route: prefill.PrefillRoute | None) -> Any:
    """One attention call; ``route`` None runs ``forward`` (Triton) alone. Returns a fresh output."""
    import torch

    output = torch.full_like(step.query, float("nan"))  # poison: every row must be written
    args = (step.impl, None, step.query, step.key, step.value, step.kv_cache, step.metadata, output)
    if route is None:
        forward(*args)
    else:
        route.forward(forward, *args)
    return output


def time_ms(fn: Any) -> float:
    """Median milliseconds per eager call: 3 warm-up calls, then CUDA events around each of 5 batches of
    10 back-to-back calls."""
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(10):
            fn()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) / 10)
    return statistics.median(samples)


def require_cuda() -> Any:
    try:
        import torch
    except ImportError as exc:
        raise Gemma4T4Error("bench-prefill needs PyTorch with CUDA", fix="pip install -e '.[gpu]'") from exc
    if not torch.cuda.is_available():
        raise Gemma4T4Error(
            "bench-prefill needs a CUDA GPU; none is visible here",
            fix="run it on the T4 (or other NVIDIA GPU) that will serve the model",
        )
    return torch


class PathMeasure(TypedDict, total=False):
    """One path (route or Triton) on one step; ``reference_max_abs`` carries only ``value``."""

    max_abs_err: float
    finite: bool
    routed_sequences: int
    fallback_steps: int
    ms: float
    max_abs_diff_vs_triton: float
    value: float


class PrefillBenchRow(TypedDict, total=False):
    """One (layer shape, prompt length) of ``bench_prefill.json``: the shape, then each path's
    measures prefixed ``route_`` / ``triton_``."""

    model: str
    layer: str
    head_size: int
    num_q_heads: int
    num_kv_heads: int
    window: int | None
    seq_len: int
    route_max_abs_err: float
    route_finite: bool
    route_routed_sequences: int
    route_fallback_steps: int
    route_ms: float
    route_max_abs_diff_vs_triton: float
    triton_max_abs_err: float
    triton_finite: bool
    triton_ms: float
    speedup: float


class PrefillBenchReport(Displayable, BaseModel):
    """``bench_prefill.json`` (plus where the plot and the cached verdict went); it displays the
    verdict, one row per head size."""

    key: dict[str, str]
    tile_cap: str
    kernel_sha256: str
    heads: dict[str, prefill.HeadVerdict]
    rows: list[PrefillBenchRow]
    plot: str | None = None
    verdict_path: str | None = None

    def caption(self) -> str:
        key = self.key
        return (f"prefill route verdict on {key.get('gpu', '?')} ({key.get('capability', '?')}), "
                f"vLLM {key.get('vllm', '?')}; tile cap: {self.tile_cap}")

    def table_rows(self) -> list[dict[str, object]]:
        return [{"head": head, **verdict} for head, verdict in self.heads.items()]


def load_triton_kernel(vllm_root: str | None, capability: tuple[int, int], device: prefill.DeviceInfo) -> Any:
    """vLLM's kernel module for ``capability`` with the tile cap decided for ``device``."""
    kernel = load_kernel_module(vllm_root, capability=capability)
    return kernel, tilecap.install(
        kernel.module, origin="bench", device=device, vllm_version=kernel.vllm_version, log=False
    )


def measure(
    step: Step, kernel_module: Any, paths: tuple[str, ...] = ("route", "triton"), timing: bool = True
) -> dict[str, PathMeasure]:
    """Max error vs float32 (and route vs Triton) and eager time of each path on one step."""
    import torch

    reference = reference_attention(step.case)
    forward = triton_forward(kernel_module)
    results: dict[str, PathMeasure] = {}
    outputs = {}
    for path in paths:
        route = prefill.PrefillRoute(policy=lambda impl: (True, 0, "benchmark"), log=lambda *a: None) \
            if path == "route" else None
        out = run_path(step, forward, route)
        torch.cuda.synchronize()
        outputs[path] = out.float()
        row: PathMeasure = {
            "max_abs_err": float((outputs[path] - reference).abs().max()),
            "finite": bool(torch.isfinite(outputs[path]).all()),
        }
        if route is not None:
            row["routed_sequences"] = route.counts["routed_sequences"]
            row["fallback_steps"] = route.counts["fallback_steps"]
        if timing:
            row["ms"] = round(time_ms(lambda r=route: run_path(step, forward, r)), 4)
        results[path] = row
    if "route" in outputs and "triton" in outputs:
        results["route"]["max_abs_diff_vs_triton"] = float((outputs["route"] - outputs["triton"]).abs().max())
    results["reference_max_abs"] = {"value": float(reference.abs().max())}
    return results


def decide(rows: list[PrefillBenchRow]) -> dict[str, prefill.HeadVerdict]:
    """Per head size: route where it is faster than Triton and within ERROR_MARGIN of its error, at
    every measured shape from ``min_tokens`` up (lengths below the first measured one follow it)."""
    verdict: dict[str, prefill.HeadVerdict] = {}
    for head in sorted({r["head_size"] for r in rows}):
        mine = [r for r in rows if r["head_size"] == head]
        lengths = sorted({r["seq_len"] for r in mine})
        accurate = all(
            r["route_max_abs_err"] <= ERROR_MARGIN * r["triton_max_abs_err"] + ERROR_FLOOR
            and r["route_finite"]
            for r in mine

        )
        wins = {n: all(r["route_ms"] < r["triton_ms"] for r in mine if r["seq_len"] == n) for n in lengths}
        min_tokens = None
        for n in reversed(lengths):
            if not wins[n]:
                break
            min_tokens = n
        entry: prefill.HeadVerdict
        if not accurate:
            entry = {"use_route": False, "min_tokens": 0, "why": "the route's error exceeds 1.5x Triton's"}
        elif min_tokens is None:
            entry = {"use_route": False, "min_tokens": 0, "why": "Triton was faster at the longest prompts"}
        else:
            floor = 0 if min_tokens == lengths[0] else min_tokens
            speedups = [r["triton_ms"] / r["route_ms"] for r in mine if r["seq_len"] >= min_tokens]
            why = f"{min(speedups):.1f}-{max(speedups):.1f}x faster, error within 1.5x"
            why += f", from {floor} tokens" if floor else ""
            entry = {"use_route": True, "min_tokens": floor, "why": why}
        verdict[str(head)] = entry
    return verdict


def bench_prefill(
    lengths: tuple[int, ...] = DEFAULT_LENGTHS, models: tuple[str, ...] = DEFAULT_MODELS,
    vllm_root: str | None = None, out_dir: str | Path = "bench_prefill", save_verdict: bool = True,
) -> PrefillBenchReport:
    """Run the benchmark on this GPU; write ``bench_prefill.json`` + ``bench_prefill.png``; cache the verdict."""
    torch = require_cuda()

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    capability = (props.major, props.minor)
    # the device's real limit: the tile cap decides as it would in vLLM on this GPU
    device: prefill.DeviceInfo = {
        "platform": "cuda", "name": props.name, "capability": capability,
        "limit": int(props.shared_memory_per_block_optin), "limit_source": "target",
    }
    kernel, cap_outcome = load_triton_kernel(vllm_root, capability, device)
    key = prefill.device_key(kernel.vllm_version)
    rows: list[PrefillBenchRow] = []
    names = {get_variant(name).size for name in models}
    for shape in (s for s in gemma4_attention_shapes(drafters=False) if s.model in names):
        for n in lengths:
            step = make_step(shape, [n], [n], seed=n)
            result = measure(step, kernel.module)
            rows.append({
                "model": shape.model, "layer": shape.layer, "head_size": shape.head_size,
                "num_q_heads": shape.num_q_heads, "num_kv_heads": shape.num_kv_heads,
                "window": shape.sliding_window, "seq_len": n,
                **{f"{p}_{k}": v for p in ("route", "triton") for k, v in result[p].items()},
                "speedup": round(result["triton"]["ms"] / result["route"]["ms"], 2),
            })
            del step
            torch.cuda.empty_cache()
    verdict = decide(rows)
    report = PrefillBenchReport(key=key, tile_cap=cap_outcome["action"], kernel_sha256=kernel.sha256,
                                heads=verdict, rows=rows)
    out = Path(out_dir)
    atomic_write_json(out / "bench_prefill.json", report.model_dump(exclude={"plot", "verdict_path"}))
    report.plot = str(plot(rows, out / "bench_prefill.png", key))
    if save_verdict:
        path = prefill.verdict_path(key)
        atomic_write_json(path, {"key": key, "heads": verdict})
        report.verdict_path = str(path)
    return report


def plot(rows: list[PrefillBenchRow], path: Path, key: dict[str, str]) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for model_layer in sorted({(r["model"], r["layer"]) for r in rows}):
        mine = sorted(
            (r for r in rows if (r["model"], r["layer"]) == model_layer), key=lambda r: r["seq_len"]
        )
        label = f"{model_layer[0]} {model_layer[1]} (head {mine[0]['head_size']})"
        lengths = [r["seq_len"] for r in mine]
        line = ax.plot(lengths, [r["triton_ms"] for r in mine], "--o", label=f"{label} Triton")
        route_label = f"{label} tensor-core route"
        ax.plot(lengths, [r["route_ms"] for r in mine], "-s", color=line[0].get_color(), label=route_label)

    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("prompt tokens (one new sequence)")
    ax.set_ylabel("attention ms per layer call")
    ax.set_title(f"Prefill attention on {key['gpu']} ({key['capability']})")
    ax.legend(fontsize=6)
    return save_figure(fig, path)
