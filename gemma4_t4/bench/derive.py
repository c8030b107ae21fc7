"""Derived figures: roofline efficiency, effective bandwidth, $ per million output tokens.

Decode at batch 1 reads every weight once per token, so tok/s ≤ bandwidth / bytes_per_token.
Bytes per token come from ``gemma4_t4.catalog.models`` (or are passed in); bandwidth and prices from
``gemma4_t4.catalog.hardware``.
"""

from __future__ import annotations

from gemma4_t4.bench.schemas import CellStats, Derived, Roofline
from gemma4_t4.catalog import models
from gemma4_t4.catalog.hardware import GPUS, PRICES, get_gpu, usd_per_million_tokens
from gemma4_t4.errors import Gemma4T4Error


def lookup_bytes_per_token(model: str, fmt: str) -> float | None:
    """Bytes read per decoded token for a catalogue model/format (None if the catalogue lacks it)."""
    try:
        return float(models.decode_bytes_per_token(model, fmt).total_bytes)
    except Gemma4T4Error:  # unknown model or format: no roofline, not a failure
        return None


def roofline(per_stream_tok_s: float | None, bytes_per_token: float, gpu_key: str) -> Roofline:
    """Where a measured per-stream decode speed sits against the (spec) bandwidth ceiling."""
    if bytes_per_token <= 0:
        raise Gemma4T4Error("bytes_per_token must be positive", fix="pass the model's bytes read per token")
    gpu = get_gpu(gpu_key)
    bandwidth = gpu.bandwidth_gb_s
    ceiling = bandwidth * 1e9 / bytes_per_token
    out = Roofline(
        gpu=gpu.key,
        bandwidth_gb_s=bandwidth,
        bytes_per_token=bytes_per_token,
        ceiling_tok_s=ceiling,
        per_stream_tok_s=per_stream_tok_s,
    )
    if per_stream_tok_s:
        out.efficiency = per_stream_tok_s / ceiling
        out.effective_bandwidth_gb_s = per_stream_tok_s * bytes_per_token / 1e9
        # above the ceiling is impossible at batch 1 (cache-served or mislabelled); far below is suspect
        if per_stream_tok_s > ceiling * 1.02:
            out.plausibility = "error: above the bandwidth ceiling"
        elif per_stream_tok_s < ceiling * 0.15:
            out.plausibility = "warning: below 15 % of the ceiling"
        else:
            out.plausibility = "ok"
    return out


def cost(
    output_tok_s: float | None, price_keys: list[str] | None = None, gpu_key: str | None = None
) -> dict[str, float]:
    """$ per million output tokens at the measured system throughput, for each priced instance
    (all instances with ``gpu_key`` when no keys are given). Assumes 100 % utilisation."""
    if not output_tok_s or output_tok_s <= 0:
        return {}
    unknown = [k for k in price_keys or [] if k not in PRICES]
    if unknown:
        raise Gemma4T4Error(f"no price for {', '.join(unknown)}", fix=f"use one of: {', '.join(PRICES)}")
    keys = price_keys or [k for k, p in PRICES.items() if p.gpu == gpu_key]
    return {k: usd_per_million_tokens(PRICES[k].usd_per_hour, output_tok_s) for k in keys}


def derive_cell(
    cell: CellStats,
    gpu_key: str | None = None,
    bytes_per_token: float | None = None,
    price_keys: list[str] | None = None,
    open_loop: bool = False,
) -> Derived:
    """The derived block stored in each summary cell (empty where nothing is known)."""
    out = Derived()
    if gpu_key and gpu_key.lower() not in GPUS:
        raise Gemma4T4Error(f"unknown GPU {gpu_key!r}", fix=f"use one of: {', '.join(GPUS)}")
    if gpu_key and bytes_per_token:
        out.roofline = roofline(cell.per_stream_tok_s.median, bytes_per_token, gpu_key)
    prices = cost(cell.output_throughput_tok_s, price_keys, gpu_key)
    if prices:
        out.usd_per_million_output_tokens = prices
        out.cost_assumes = f"100 % utilisation at this cell's {'offered rate' if open_loop else 'concurrency'}"
    return out
