"""The tensor-core prefill route's function in plain float32 PyTorch: the oracle the route's CPU tests
and the GPU numerics compare against."""

from __future__ import annotations

from typing import Any


def reference_attention(
    q: Any, k: Any, v: Any, cu_seqlens: Any, max_len: int, scale: float, window: int | None
) -> Any:
    """Packed varlen causal attention, one sequence at a time: [T, H, D] -> [T, H, D]. ``window``: keys a
    query may see, itself included (as :func:`gemma4_t4.turing.prefill.efficient_attention` takes it)."""
    import torch

    out = torch.empty_like(q)
    bounds = cu_seqlens.tolist()
    for start, end in zip(bounds[:-1], bounds[1:], strict=True):
        qs, ks, vs = (t[start:end].float().transpose(0, 1) for t in (q, k, v))  # [H, L, D]
        pos = torch.arange(end - start, device=q.device)
        allowed = pos[None, :] <= pos[:, None]
        if window:
            allowed &= (pos[:, None] - pos[None, :]) < window
        scores = (qs @ ks.transpose(1, 2)) * scale
        probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
        out[start:end] = (probs @ vs).transpose(0, 1).to(q.dtype)
    return out
