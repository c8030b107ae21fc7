"""Run vLLM's unified-attention kernel on paged KV and compare it with a float32 reference.

Used by the CPU test (Triton's interpreter, ``load_kernel_module(interpret=True)``, in
``tests/turing/test_turing_numerics.py``), the GPU benchmark (``scripts/turing_gpu_bench.py``) and the
prefill benchmark: the same inputs, the same reference, the same launcher.
"""

from __future__ import annotations

import itertools
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from gemma4_t4.catalog.models import KV_BLOCK_SIZE
from gemma4_t4.turing.smem import head_size_padded

NUM_SOFTMAX_SEGMENTS = 16  # vLLM's TRITON_ATTN default for the 3D path


@dataclass
class AttentionCase:
    """Inputs in TRITON_ATTN's layout: q [tokens, q_heads, head], KV cache [blocks, block, kv_heads, head]."""

    q: Any
    key_cache: Any
    value_cache: Any
    block_table: Any
    cu_seqlens_q: Any
    seqused_k: Any
    query_lens: list[int]
    context_lens: list[int]
    head_size: int
    num_q_heads: int
    num_kv_heads: int
    sliding_window: int | None  # (softmax scale 1.0: Gemma 4 normalises q and k)


def make_case(
    head_size: int, num_q_heads: int, num_kv_heads: int, query_lens: list[int], context_lens: list[int],
    sliding_window: int | None = None, device: str = "cpu", seed: int = 0,
) -> AttentionCase:
    """Random unit-RMS q/k/v (Gemma 4 normalises q and k, scale 1.0) in a shuffled paged KV cache."""
    import torch

    dtype = torch.float16
    generator = torch.Generator().manual_seed(seed)
    blocks_per_seq = [-(-ctx // KV_BLOCK_SIZE) for ctx in context_lens]
    num_blocks = sum(blocks_per_seq) + 1
    shape = (num_blocks, KV_BLOCK_SIZE, num_kv_heads, head_size)
    key_cache = torch.randn(shape, generator=generator).to(dtype)
    value_cache = torch.randn(shape, generator=generator).to(dtype)
    order = torch.randperm(num_blocks - 1, generator=generator) + 1  # block 0 unused, as in vLLM
    block_table = torch.zeros(len(context_lens), max(blocks_per_seq), dtype=torch.int32)
    for i, blocks in enumerate(order.split(blocks_per_seq)):
        block_table[i, : len(blocks)] = blocks
    q = torch.randn(sum(query_lens), num_q_heads, head_size, generator=generator).to(dtype)
    cu = torch.tensor([0, *itertools.accumulate(query_lens)], dtype=torch.int32)
    return AttentionCase(
        q.to(device), key_cache.to(device), value_cache.to(device), block_table.to(device), cu.to(device),
        torch.tensor(context_lens, dtype=torch.int32, device=device), list(query_lens), list(context_lens),
        head_size, num_q_heads, num_kv_heads, sliding_window,
    )


def reference_attention(case: AttentionCase) -> Any:
    """Causal (optionally sliding-window) GQA attention in float32 over the paged cache."""
    import torch

    outputs = []
    group = case.num_q_heads // case.num_kv_heads
    block_size = case.key_cache.shape[1]
    start = 0
    for i, (q_len, ctx) in enumerate(zip(case.query_lens, case.context_lens, strict=True)):
        blocks = case.block_table[i, : -(-ctx // block_size)].long()
        keys = case.key_cache[blocks].reshape(-1, case.num_kv_heads, case.head_size)[:ctx].float()
        values = case.value_cache[blocks].reshape(-1, case.num_kv_heads, case.head_size)[:ctx].float()
        keys = keys.repeat_interleave(group, dim=1)  # [ctx, q_heads, head]
        values = values.repeat_interleave(group, dim=1)
        q = case.q[start:start + q_len].float()  # [q_len, q_heads, head]
        scores = torch.einsum("qhd,khd->hqk", q, keys)
        query_pos = torch.arange(ctx - q_len, ctx, device=q.device)[:, None]
        key_pos = torch.arange(ctx, device=q.device)[None, :]
        allowed = key_pos <= query_pos
        if case.sliding_window:
            allowed &= (query_pos - key_pos) < case.sliding_window
        scores = scores.masked_fill(~allowed[None], float("-inf"))
        outputs.append(torch.einsum("hqk,khd->qhd", scores.softmax(-1), values))
        start += q_len
    return torch.cat(outputs)


def run_unified_attention(module: Any, case: AttentionCase) -> Any:
    """Call vLLM's launcher (``module.unified_attention``) on ``case``; returns the output tensor. The
    split-KV buffers are passed, as TRITON_ATTN does, so decode batches take the 3D path."""
    import torch

    q = case.q
    out = torch.empty_like(q)
    window = (case.sliding_window - 1, 0) if case.sliding_window else (-1, -1)
    segments = segment_buffers(q.shape[0], case.num_q_heads, case.num_kv_heads, case.head_size, q.device)
    module.unified_attention(
        q=q, k=case.key_cache, v=case.value_cache, out=out, cu_seqlens_q=case.cu_seqlens_q,
        max_seqlen_q=max(case.query_lens), seqused_k=case.seqused_k, max_seqlen_k=max(case.context_lens),
        softmax_scale=1.0, causal=True, window_size=window, block_table=case.block_table,
        softcap=0, q_descale=None, k_descale=None, v_descale=None, **segments,
    )
    return out


def segment_buffers(tokens: int, num_q_heads: int, num_kv_heads: int, head_size: int, device: Any) -> dict:
    """The split-KV (3D path) arguments TRITON_ATTN passes vLLM's launcher: its threshold, segment
    count and float32 scratch buffers."""
    import torch

    dims = (tokens, num_q_heads, NUM_SOFTMAX_SEGMENTS)
    f32 = dict(dtype=torch.float32, device=device)
    return dict(
        seq_threshold_3D=128 // num_kv_heads, num_par_softmax_segments=NUM_SOFTMAX_SEGMENTS,
        softmax_segm_output=torch.empty(*dims, head_size_padded(head_size), **f32),
        softmax_segm_max=torch.empty(*dims, **f32), softmax_segm_expsum=torch.empty(*dims, **f32),
    )


@contextmanager
def forced_tile(module: Any, tile: int):
    """Make vLLM's launcher use ``tile`` for both paths (the benchmark's default-vs-clamped switch)."""
    original = module._get_tile_size
    module._get_tile_size = lambda head_size, sliding_window, element_size, is_prefill: tile
    try:
        yield
    finally:
        module._get_tile_size = original
