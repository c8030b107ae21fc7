"""What follows from the Gemma 4 family (:mod:`gemma4_t4.catalog.family`, the data) on a GPU.

Loaded sizes and KV-token figures were published by the series (labelled ``published``); the rest is
derived by pure functions (no I/O): bytes per decoded token, the bandwidth roofline, the memory fit
(tensor parallelism, drafters included) and host RAM while loading. Google's MTP drafters are
catalogued in :mod:`gemma4_t4.catalog.assistants`.

Formats (bytes per weight):

* ``bf16`` - the plain checkpoint, served as fp16 on a T4 (2 bytes). Google's
  ``-qat-q4_0-unquantized`` build is the same size: bf16 values that lie on a 4-bit grid.
* ``qat-w4a16`` - Google's ``-it-qat-w4a16-ct`` compressed-tensors build: decoder linears
  int4 with one bf16 scale per 32 weights (0.5 + 2/32 = 0.5625 bytes); embeddings, PLE,
  towers and lm_head stay bf16. The E2B/E4B files also carry a duplicate bf16 lm_head.
* ``emb4`` - the series' text-only repack: linears, ``embed_tokens``, the per-layer
  embedding table and an untied lm_head all int4 group-32 (fp16 scales: 0.5625 bytes).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from gemma4_t4.catalog.family import (
    FORMATS,
    GB,
    VARIANTS,
    Gemma4Variant,
    GiB,
    HubIds,
    PublishedParams,
    get_variant,
    normalize_format,
)
from gemma4_t4.catalog.hardware import get_gpu
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation.table import Displayable

# Bytes per weight. int4 with one 16-bit scale per group of 32: 4/8 + 16/(8*32) = 0.5625.
INT4_G32_BYTES = 0.5 + 2 / 32
FP16_BYTES = 2
KV_DTYPE_BYTES = FP16_BYTES  # the KV cache is fp16 (a T4 has no fp8)
# Per format: bytes per weight of the decoder linears, and of the embedding tables (the token
# embedding, the output layer and the PLE table); norms and MoE routers stay 16-bit in every format.
FORMAT_BYTES = {"bf16": (FP16_BYTES, FP16_BYTES), "qat-w4a16": (INT4_G32_BYTES, FP16_BYTES),
                "emb4": (INT4_G32_BYTES, INT4_G32_BYTES)}


# ---------------------------------------------------------------------------------------
# Parameter counts derived from the architecture
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LinearCounts:
    """Decoder linear weights (parameters), split the way decode reads them.

    ``kv_shared_projections``: the k/v projections that the original checkpoints still ship
    for KV-shared layers; transformers >= 5 and vLLM drop them at load, Google's ct files lack
    them. ``k_eq_v_duplicate``: vLLM loads K's weights into V's slot on k_eq_v global layers,
    so it holds (and reads) them twice.
    """

    attention: int
    mlp_dense: int
    experts_total: int
    experts_active: int  # top-k of them, read per decoded token at batch 1
    router: int
    ple: int  # per-layer input gate/projection + the model-level PLE projection
    kv_shared_projections: int
    k_eq_v_duplicate: int

    @property
    def resident(self) -> int:
        """What transformers holds (no KV-shared k/v, experts all resident)."""
        return self.attention + self.mlp_dense + self.experts_total + self.router + self.ple

    @property
    def read_per_token(self) -> int:
        return self.attention + self.mlp_dense + self.experts_active + self.router + self.ple


def linear_counts(variant: str | Gemma4Variant) -> LinearCounts:
    """Count every decoder linear from the shapes in transformers' ``modeling_gemma4``."""
    v = get_variant(variant)
    h = v.hidden_size
    attention = mlp = experts = experts_active = router = ple = shared_kv = dup = 0
    for i, layer_type in enumerate(v.layer_types()):
        is_global = layer_type == "full_attention"
        hd = v.global_head_dim if is_global else v.head_dim
        kv = v.num_kv_heads_global if is_global else v.num_kv_heads_sliding
        attention += 2 * h * v.num_q_heads * hd  # q_proj, o_proj
        kv_proj = h * kv * hd
        k_eq_v = v.attention_k_eq_v and is_global
        kv_weights = kv_proj * (1 if k_eq_v else 2)
        if v.is_kv_shared(i):
            shared_kv += kv_weights
        else:
            attention += kv_weights
            if k_eq_v:
                dup += kv_proj
        wide = 2 if (v.double_wide_mlp_in_kv_shared and v.is_kv_shared(i)) else 1
        mlp += 3 * h * v.intermediate_size * wide  # gate, up, down
        if v.moe:
            per_expert = 3 * h * v.moe.expert_intermediate_size
            experts += v.moe.num_experts * per_expert
            experts_active += v.moe.top_k * per_expert
            router += h * v.moe.num_experts
        ple += 2 * h * v.ple_dim_per_layer  # per_layer_input_gate, per_layer_projection (0 without PLE)
    ple += h * v.num_layers * v.ple_dim_per_layer  # per_layer_model_projection
    return LinearCounts(attention, mlp, experts, experts_active, router, ple, shared_kv, dup)


def norm_params(variant: str | Gemma4Variant) -> int:
    """RMSNorm scales and small vectors (read every token, always 16-bit)."""
    v = get_variant(variant)
    h = v.hidden_size
    total = h  # final norm
    for i, layer_type in enumerate(v.layer_types()):
        hd = v.global_head_dim if layer_type == "full_attention" else v.head_dim
        total += 4 * h + hd  # 4 block norms, q_norm
        if not v.is_kv_shared(i):
            total += hd  # k_norm
        if v.ple_dim_per_layer:
            total += h  # post_per_layer_input_norm
        if v.moe:
            total += 3 * h + h + v.moe.num_experts  # extra norms, router scale, per-expert scale
    return total + v.ple_dim_per_layer  # the PLE projection norm (0 without PLE)


@dataclass(frozen=True)
class ParamBreakdown:
    """Parameter counts (not billions: exact integers where derived)."""

    body: int  # decoder linears + norms (transformers layout)
    embed: int  # the tied token embedding / output layer
    ple: int  # the per-layer embedding table
    towers: int  # vision/audio/projectors: published total minus the derived text model
    total: int
    active_per_token: int  # body as read per token (MoE: top-k experts) + embed
    published: PublishedParams


def param_breakdown(variant: str | Gemma4Variant) -> ParamBreakdown:
    v = get_variant(variant)
    lin = linear_counts(v)
    norms = norm_params(v)
    body = lin.resident + norms
    embed = v.vocab_size * v.hidden_size
    ple = v.vocab_size * v.num_layers * v.ple_dim_per_layer
    text = body + embed + ple
    if v.published.vision is not None or v.published.audio is not None:
        towers = round(((v.published.vision or 0) + (v.published.audio or 0)) * 1e9)
    else:
        towers = max(0, round(v.published.total * 1e9) - text)
    return ParamBreakdown(body=body, embed=embed, ple=ple, towers=towers, total=text + towers,
                          active_per_token=lin.read_per_token + norms + embed, published=v.published)


# ---------------------------------------------------------------------------------------
# Decode: bytes read per token and the bandwidth roofline
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DecodeBytes:
    """Bytes one decoded token reads from GPU memory at batch 1 (GB = 1e9 B).

    ``weights_bytes`` follows the published convention: N_lin x b_lin + N_emb x b_emb, where
    N_lin counts the decoder linears as each checkpoint ships them and N_emb is the tied
    output layer (the embedding lookup itself reads one row).
    """

    model: str
    format: str
    linear_params: int
    linear_bytes: int
    embed_params: int  # the output layer
    weights_bytes: int  # the linears, the output layer, and norms + one embedding row + one PLE row
    kv_bytes: int  # KV cache read at the context length (0 when it is 0)

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes

    @property
    def weights_gb(self) -> float:
        return self.weights_bytes / GB


def kv_read_bytes_per_token(variant: str | Gemma4Variant, context_len: int) -> int:
    """KV cache bytes one decode step reads for one sequence at ``context_len``.

    Every layer attends, KV-shared ones included (they read their source layer's cache);
    sliding layers read at most the window. E2B fp16 gives ~24 MB at 640 tokens, ~75 MB at
    4.2k and ~250 MB at 16k, the series' published estimates.
    """
    v = get_variant(variant)
    if context_len < 0:
        raise Gemma4T4Error("context length must be >= 0", fix="pass a token count such as 4096")
    full = v.num_full_layers
    return 2 * KV_DTYPE_BYTES * (full * v.num_kv_heads_global * v.global_head_dim * context_len  # K and V
                                 + (v.num_layers - full) * v.num_kv_heads_sliding * v.head_dim
                                 * min(context_len, v.sliding_window))


def decode_bytes_per_token(
    variant: str | Gemma4Variant, fmt: str = "bf16", context_len: int = 0,
) -> DecodeBytes:
    """Bytes per decoded token for a format; E2B: bf16 4.597 GB, qat-w4a16 1.862 GB, emb4 1.29 GB.

    Derivation for E2B (the published figures): N_emb = 262,144 x 1,536 = 402.7 M;
    N_lin = 1,895.7 M counts q/o, k/v, the MLPs (double width in the 20 KV-shared layers), the
    PLE gate/projection per layer and the model-level PLE projection, including the 18.9 M k/v
    weights the bf16 checkpoint ships for KV-shared layers. Google's ct file lacks those, so
    its N_lin is 1,876.8 M: 1,876.8 M x 0.5625 + 402.7 M x 2 = 1.861 GB, plus 0.6 MB of norms.
    """
    v = get_variant(variant)
    fmt = normalize_format(fmt)
    lin = linear_counts(v)
    b_lin, b_emb = FORMAT_BYTES[fmt]
    # Google's bf16 / q4_0-unquantized checkpoints keep the KV-shared layers' k/v (the published
    # N_lin = 1,895.7 M for E2B counts them); the emb4 repack starts from q4_0-unquantized and
    # keeps them; Google's ct file lacks them (its int4 body is 1.056 GB = 1,876.8 M x 0.5625).
    linear_params = lin.read_per_token + (lin.kv_shared_projections if fmt != "qat-w4a16" else 0)
    embed_params = v.vocab_size * v.hidden_size
    linear_bytes = round(linear_params * b_lin)
    small = FP16_BYTES * (norm_params(v) + v.hidden_size + v.num_layers * v.ple_dim_per_layer)
    return DecodeBytes(
        model=v.key, format=fmt, linear_params=linear_params, linear_bytes=linear_bytes, embed_params=embed_params,
        weights_bytes=linear_bytes + round(embed_params * b_emb) + small,
        kv_bytes=kv_read_bytes_per_token(v, context_len) if context_len else 0,
    )


@dataclass(frozen=True)
class Roofline(Displayable):
    """Upper bound on per-stream decode speed: bandwidth / bytes per token."""

    model: str
    format: str
    gpu: str
    bytes_per_token: int
    spec_bandwidth_gb_s: float
    tok_s_spec: float
    measured_bandwidth_gb_s: float | None
    tok_s_measured: float | None
    context_len: int

    def table_rows(self) -> list[dict[str, object]]:
        return [{"GPU": self.gpu, "format": self.format, "GB per token": self.bytes_per_token / 1e9,
                 "roofline tok/s (spec bandwidth)": self.tok_s_spec,
                 "roofline tok/s (measured bandwidth)": self.tok_s_measured}]


def decode_roofline(variant: str | Gemma4Variant, fmt: str = "bf16", gpu: str = "t4", context_len: int = 0) -> Roofline:
    """Per-stream decode ceiling on ``gpu`` (T4: bf16 69.6, qat-w4a16 171.9 tok/s at 320 GB/s).

    Ignores fixed per-step cost, so real runs land well below it (the series measured 40 and
    72 tok/s on a T4); a result above it is a measurement error.
    """
    g = get_gpu(gpu)
    b = decode_bytes_per_token(variant, fmt, context_len)
    measured = g.measured_bandwidth_gb_s
    return Roofline(
        model=b.model, format=b.format, gpu=g.key, bytes_per_token=b.total_bytes, spec_bandwidth_gb_s=g.bandwidth_gb_s,
        tok_s_spec=g.bandwidth_gb_s * GB / b.total_bytes, measured_bandwidth_gb_s=measured,
        tok_s_measured=measured * GB / b.total_bytes if measured else None, context_len=context_len,
    )


# ---------------------------------------------------------------------------------------
# Memory fit
# ---------------------------------------------------------------------------------------

# Loaded sizes vLLM reports exceed the checkpoint arithmetic by 0.2-0.3 GiB (E2B bf16 9.8,
# ct 8.01, emb4 2.86 GiB published vs 9.50 / 7.74 / 2.64 computed): RoPE caches and buffers.
RUNTIME_BUFFERS_GIB = 0.25
# CUDA context, activation peak of the profile run, sampler and CUDA graphs, per GPU. With it fit()
# comes this close to the published figures (E2B on a GCE T4, 16k context, 8 seqs, util 0.9, vLLM's
# default 2,048 batched tokens): KV capacity 285,320 / 519,671 / 1,198,973 tokens for bf16 / qat-w4a16 /
# emb4 against 315,974 / 519,568 / 1,099,362 published (-10 %, 0 %, +9 %); loaded weights 9.76 / 8.00 /
# 2.89 GiB against 9.8 / 8.02 / 2.86. For the 12B, weights come out 7.94 (qat-w4a16) / 7.03 GiB (emb4)
# against 8.28 / 7.36 (-4 %). The SageMaker KV figures (12B emb4 on a T4: 20,354 tokens at 8k) ran
# under container defaults that were not published; with vLLM's defaults we estimate ~1.8x as many,
# so treat KV capacity as +-10 % when the server flags are known and as an upper bound otherwise.
DEFAULT_OVERHEAD_GIB = 1.2
# vLLM's `serve` default below 70 GiB of GPU memory; sliding layers hold window + this.
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048
KV_BLOCK_SIZE = 16  # vLLM's CUDA default KV block size (tokens)


@dataclass(frozen=True)
class WeightsEstimate:
    model: str
    format: str
    text_only: bool
    total_bytes: int  # all ranks together, without runtime buffers
    checkpoint_bytes: int  # size on disk of that build (for download/RAM advice)


def weights_estimate(variant: str | Gemma4Variant, fmt: str = "bf16", text_only: bool = False) -> WeightsEstimate:
    """GPU-resident weight bytes of a build as vLLM loads it (fp16 on pre-Ampere GPUs).

    emb4 builds are text-only by construction. ``text_only`` models ``--language-model-only``.
    """
    v = get_variant(variant)
    fmt = normalize_format(fmt)
    p = param_breakdown(v)
    lin = linear_counts(v)
    b_lin, b_emb = FORMAT_BYTES[fmt]
    towers_b = 0 if (text_only or fmt == "emb4") else p.towers * FP16_BYTES
    quant_lin = lin.resident - lin.router + lin.k_eq_v_duplicate  # vLLM holds k_eq_v's K twice
    total = (round(quant_lin * b_lin) + lin.router * FP16_BYTES + round(p.embed * b_emb) + round(p.ple * b_emb)
             + norm_params(v) * FP16_BYTES + towers_b)
    if fmt == "emb4":  # int4 embed, int4 untied lm_head, int4 PLE, no towers
        total += round(p.embed * b_emb)
    elif fmt == "qat-w4a16" and v.ct_duplicate_lm_head:
        total += p.embed * FP16_BYTES
    # The checkpoint always carries the towers (except emb4) and what vLLM drops/duplicates: the
    # KV-shared layers' k/v; Google's ct file lacks those and stores k_eq_v's K once.
    if fmt == "qat-w4a16":
        ckpt_extra = -round(lin.k_eq_v_duplicate * b_lin)
    else:
        ckpt_extra = round((lin.kv_shared_projections - lin.k_eq_v_duplicate) * b_lin)
    ckpt_towers = 0 if fmt == "emb4" else p.towers * FP16_BYTES
    checkpoint = total - towers_b + ckpt_towers + ckpt_extra
    return WeightsEstimate(v.key, fmt, text_only or fmt == "emb4", total, checkpoint)


def kv_cache_bytes_per_sequence(
    variant: str | Gemma4Variant, context_len: int, tensor_parallel: int = 1,
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
) -> int:
    """KV cache one sequence of ``context_len`` occupies on one GPU, the way vLLM sizes it.

    Only layers with their own cache count (KV-shared layers add none). Full layers hold the
    whole context; sliding layers hold ``window - 1 + max_num_batched_tokens`` tokens (vLLM
    frees out-of-window blocks only after each step) plus one block. k_eq_v layers still
    store K and V. KV heads split across tensor-parallel ranks and are replicated when there
    are fewer heads than ranks.
    """
    v = get_variant(variant)
    total = 0
    for i, layer_type in enumerate(v.layer_types()):
        if v.is_kv_shared(i):
            continue
        if layer_type == "full_attention":
            heads, hd = v.num_kv_heads_global, v.global_head_dim
            tokens = math.ceil(context_len / KV_BLOCK_SIZE) * KV_BLOCK_SIZE
        else:
            heads, hd = v.num_kv_heads_sliding, v.head_dim
            held = min(v.sliding_window - 1 + max_num_batched_tokens, context_len)
            tokens = (math.ceil(held / KV_BLOCK_SIZE) + 1) * KV_BLOCK_SIZE
        heads_per_rank = max(1, math.ceil(heads / tensor_parallel))
        total += 2 * heads_per_rank * hd * KV_DTYPE_BYTES * tokens
    return total


@dataclass(frozen=True)
class FitResult:
    """Whether a build fits a GPU (per GPU figures; GiB = 2^30 B)."""

    model: str
    format: str
    gpu: str
    num_gpus: int
    context_len: int
    gpu_memory_utilization: float
    max_num_seqs: int
    max_num_batched_tokens: int
    text_only: bool
    usable_gib: float  # what torch reports per GPU
    budget_gib: float  # usable x gpu_memory_utilization
    weights_gib: float  # per GPU, with runtime buffers
    overhead_gib: float
    kv_budget_gib: float
    kv_gib_per_sequence: float  # at context_len, per GPU
    kv_token_capacity: int  # what vLLM logs as "KV cache size: N tokens" at context_len
    max_concurrency: float  # sequences of context_len that fit at once
    concurrent_sequences: int  # min(max_num_seqs, floor(max_concurrency))
    max_context_fits: int  # longest context one sequence can have (0: weights don't fit)
    weights_fit: bool
    fits: bool
    google_build: bool  # a Google checkpoint exists in this format
    verdict: str
    notes: list[str] = field(default_factory=list)


def fit(variant: str | Gemma4Variant, fmt: str = "qat-w4a16", gpu: str = "t4", context_len: int = 8192,
        num_gpus: int = 1, gpu_memory_utilization: float = 0.9, max_num_seqs: int = 8,
        max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS, text_only: bool = False,
        overhead_gib: float = DEFAULT_OVERHEAD_GIB, draft_weights_bytes: int = 0,
        draft_own_kv: bool = False) -> FitResult:
    """Weights + KV cache + overhead against one GPU (or ``num_gpus`` with tensor parallelism).

    With tensor parallelism the weights split evenly over the GPUs (vLLM shards linears and
    vocab-parallel embeddings; norms are negligible), KV heads split or replicate, and every
    GPU pays its own runtime buffers and ``overhead_gib``.

    Accuracy against the published figures: see :data:`DEFAULT_OVERHEAD_GIB`.

    A drafter adds ``draft_weights_bytes`` (split over the GPUs like the target's). An MTP
    assistant reads the target's KV cache (Q-only layers); a whole-model drafter (vLLM
    ``draft_model``, e.g. the target as its own drafter) keeps its own KV cache of the same
    shape: ``draft_own_kv=True`` doubles the KV bytes per sequence.
    """
    v = get_variant(variant)
    fmt = normalize_format(fmt)
    g = get_gpu(gpu)
    _check_fit_args(v, num_gpus, gpu_memory_utilization, context_len, max_num_seqs, max_num_batched_tokens,
                    overhead_gib, draft_weights_bytes)
    w = weights_estimate(v, fmt, text_only)
    usable = g.usable_memory_gib
    budget = usable * gpu_memory_utilization
    weights_gib = (w.total_bytes + draft_weights_bytes) / GiB / num_gpus + RUNTIME_BUFFERS_GIB
    kv_budget = budget - weights_gib - overhead_gib
    weights_fit = kv_budget > 0
    seq_bytes, concurrency, max_ctx = _kv_fit(v, context_len, num_gpus, max_num_batched_tokens,
                                              2 if draft_own_kv else 1, kv_budget)
    fits = weights_fit and concurrency >= 1.0 and context_len <= v.max_position_embeddings
    kv_tokens, sequences = int(concurrency * context_len), min(max_num_seqs, int(concurrency))
    google_build = not (fmt == "qat-w4a16" and v.hub.qat_w4a16_ct is None) and fmt != "emb4"
    where = f"{num_gpus}x {g.key.upper()}" if num_gpus > 1 else g.key.upper()
    if not weights_fit:
        verdict = (f"does not fit: weights {weights_gib:.2f} GiB + overhead {overhead_gib:.1f} GiB exceed "
                   f"{budget:.2f} GiB ({gpu_memory_utilization:g} x {usable:.2f} GiB) on {where}")
    elif context_len > v.max_position_embeddings:
        verdict = f"context {context_len} exceeds the model's {v.max_position_embeddings} positions"
    elif not fits:
        verdict = (f"weights fit, but one {context_len}-token sequence needs {seq_bytes / GiB:.2f} GiB of KV "
                   f"cache and {max(0.0, kv_budget):.2f} GiB is left; max context {max_ctx}")
    else:
        verdict = f"fits on {where}: {kv_tokens:,} KV tokens, {sequences} x {context_len}-token sequences at once"
    return FitResult(
        model=v.key, format=fmt, gpu=g.key, num_gpus=num_gpus, context_len=context_len,
        gpu_memory_utilization=gpu_memory_utilization, max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens, text_only=w.text_only,
        usable_gib=round(usable, 3), budget_gib=round(budget, 3), weights_gib=round(weights_gib, 3),
        overhead_gib=overhead_gib, kv_budget_gib=round(kv_budget, 3),
        kv_gib_per_sequence=round(seq_bytes / GiB, 4),
        kv_token_capacity=kv_tokens if weights_fit else 0,
        max_concurrency=round(concurrency, 3), concurrent_sequences=sequences,
        max_context_fits=max_ctx, weights_fit=weights_fit, fits=fits, google_build=google_build,
        verdict=verdict, notes=_fit_notes(v, fmt, g.key, fits, concurrency, context_len, max_num_seqs,
                                          draft_weights_bytes, draft_own_kv),
    )


def _check_fit_args(v: Gemma4Variant, num_gpus: int, gpu_memory_utilization: float, context_len: int,
                    max_num_seqs: int, max_num_batched_tokens: int, overhead_gib: float,
                    draft_weights_bytes: int) -> None:
    """Refuse arguments that would give a silently wrong verdict (NaN compares False everywhere)."""
    if num_gpus < 1 or v.num_q_heads % num_gpus:
        raise Gemma4T4Error(f"{v.name} cannot be split over {num_gpus} GPUs: {v.num_q_heads} query heads",
                            fix="use a tensor-parallel size that divides the head count (1, 2, 4 or 8)")
    if not 0.1 <= gpu_memory_utilization <= 1.0:
        raise Gemma4T4Error("gpu_memory_utilization must be in [0.1, 1.0]", fix="typical: 0.85-0.92")
    if context_len < 1 or max_num_seqs < 1:
        raise Gemma4T4Error("context length and max_num_seqs must be positive", fix="e.g. --context 8192")
    if max_num_batched_tokens < 1:
        raise Gemma4T4Error("max_num_batched_tokens must be positive",
                            fix=f"vLLM's default is {DEFAULT_MAX_NUM_BATCHED_TOKENS}")
    if not 0.0 <= overhead_gib < 1e6:  # also refuses NaN and infinity
        raise Gemma4T4Error(f"overhead_gib must be a non-negative number of GiB, not {overhead_gib}",
                            fix=f"the default is {DEFAULT_OVERHEAD_GIB} GiB per GPU")
    if draft_weights_bytes < 0:
        raise Gemma4T4Error(f"draft_weights_bytes must not be negative, not {draft_weights_bytes}",
                            fix="pass 0 without a drafter")


def _fit_notes(v: Gemma4Variant, fmt: str, gpu: str, fits: bool, concurrency: float, context_len: int,
               max_num_seqs: int, draft_weights_bytes: int, draft_own_kv: bool) -> list[str]:
    notes = []
    if fmt == "qat-w4a16" and v.hub.qat_w4a16_ct is None:
        notes.append("no Google -qat-w4a16-ct build for this size: repack -qat-q4_0-unquantized "
                     "or use a community w4a16 build")
    if fmt == "emb4":
        notes.append(f"community text-only build, e.g. {v.hub.community_emb4}; needs vLLM >= 0.29")
    if fits and concurrency < max_num_seqs:
        notes.append(f"only {int(concurrency)} sequences of {context_len} tokens fit at once, "
                     f"below max_num_seqs={max_num_seqs}")
    if gpu == "t4" and fmt == "bf16":
        notes.append("a T4 has no bf16: vLLM serves the weights as fp16 (--dtype float16)")
    if draft_weights_bytes or draft_own_kv:
        notes.append(f"drafter counted: {draft_weights_bytes / GiB:.2f} GiB of weights"
                     + (", its own KV cache (the same size as the target's)" if draft_own_kv else
                        "; it reads the target's KV cache"))
    return notes


def _kv_fit(v: Gemma4Variant, context_len: int, num_gpus: int, max_num_batched_tokens: int,
            kv_copies: int, kv_budget_gib: float) -> tuple[int, float, int]:
    """(KV bytes of one ``context_len`` sequence, sequences that fit at once, longest context that fits:
    a multiple of the block size, 0 when nothing fits)."""

    def per_seq(n: int) -> int:
        return kv_copies * kv_cache_bytes_per_sequence(v, n, num_gpus, max_num_batched_tokens)

    seq_bytes = per_seq(context_len)
    kv_budget_bytes = max(0.0, kv_budget_gib) * GiB
    lo, hi = 0, v.max_position_embeddings  # per_seq is non-decreasing in the context, and positive
    if per_seq(hi) <= kv_budget_bytes:
        return seq_bytes, kv_budget_bytes / seq_bytes, hi
    while hi - lo > KV_BLOCK_SIZE:  # no budget: lo stays 0
        mid = (lo + hi) // 2
        if per_seq(mid) <= kv_budget_bytes:
            lo = mid
        else:
            hi = mid
    return seq_bytes, kv_budget_bytes / seq_bytes, lo - lo % KV_BLOCK_SIZE


def fit_table(gpu: str = "t4", context_len: int = 8192, num_gpus: int = 1, **kwargs) -> FitTable:
    """:func:`fit` for every model x format (largest first within each model)."""
    return FitTable(fit(m, f, gpu, context_len, num_gpus, **kwargs) for m in VARIANTS for f in FORMATS)


class FitTable(Displayable, list[FitResult]):
    """:func:`fit_table`'s results: a list of :class:`FitResult` that shows itself as a table."""

    columns = ("model", "format", "weights_gib", "kv_token_capacity", "fits", "verdict")

    def table_rows(self) -> list[FitResult]:
        return list(self)

    def caption(self) -> str:
        first = self[0]  # never empty: every caller asks for known models and formats
        return f"{first.num_gpus} x {first.gpu}, {first.context_len:,} context: what fits"


def largest_fitting(results: Iterable[FitResult]) -> FitResult | None:
    """The biggest model (by published parameter count) with a format that fits."""
    return max((r for r in results if r.fits), key=lambda r: (VARIANTS[r.model].published.total, r.kv_token_capacity),
               default=None)


# ---------------------------------------------------------------------------------------
# Host RAM while loading
# ---------------------------------------------------------------------------------------

# Python + torch + CUDA libraries + vLLM's API server and engine processes while loading.
# With the checkpoint size this reproduces the series' peaks on a 7.8 GB n1-standard-2 (RAM +
# swap: E2B bf16 ~13.6 GiB, ct ~11.9 GiB; without swap it was OOM-killed).
LOAD_PROCESS_RAM_GIB = 4.0


@dataclass(frozen=True)
class LoadRam:
    model: str
    format: str
    checkpoint_gib: float
    peak_ram_gib: float  # RAM + swap the load needs at its peak
    host_ram_gib: float | None
    swap_needed_gib: float  # swap to add on that host (0 if RAM suffices)
    advice: str


def load_ram(variant: str | Gemma4Variant, fmt: str = "bf16", host_ram_gib: float | None = None) -> LoadRam:
    """Host memory needed to load a build with vLLM, and the swap to add on a small host."""
    w = weights_estimate(variant, fmt)
    ckpt = w.checkpoint_bytes / GiB
    peak = ckpt + LOAD_PROCESS_RAM_GIB
    swap = 0.0
    if host_ram_gib is None:
        advice = f"loading needs about {peak:.1f} GiB of RAM + swap at its peak"
    elif host_ram_gib >= peak:
        advice = f"{host_ram_gib:.1f} GiB of RAM covers the ~{peak:.1f} GiB load peak; no swap needed"
    else:
        swap = float(math.ceil(peak - host_ram_gib + 1.0))
        advice = (f"{host_ram_gib:.1f} GiB of RAM is below the ~{peak:.1f} GiB load peak: add at least "
                  f"{swap:.0f} GiB of swap (the series used 16 GiB) or the loader is OOM-killed")
    return LoadRam(w.model, w.format, round(ckpt, 2), round(peak, 2), host_ram_gib, swap, advice)


# ---------------------------------------------------------------------------------------
# Catalog view
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelInfo:
    """Everything ``gemma4-t4 models`` prints for one size."""

    key: str
    name: str
    model_type: str
    layers: int
    full_attention_layers: int
    layer_pattern: str
    hidden_size: int
    q_heads: int
    kv_heads_sliding: int
    kv_heads_global: int
    head_dim: int
    global_head_dim: int
    sliding_window: int
    mlp: str
    kv_shared_layers: int
    ple: str
    vocab_size: int
    tie_word_embeddings: bool
    attention_k_eq_v: bool
    max_position_embeddings: int
    towers: str
    params: ParamBreakdown
    hub: HubIds
    decode_bytes_gb: dict[str, float]
    t4_roofline_tok_s: dict[str, float]
    notes: tuple[str, ...]


def model_info(variant: str | Gemma4Variant) -> ModelInfo:
    v = get_variant(variant)
    if v.moe:
        mlp = (f"{v.intermediate_size} + {v.moe.num_experts} experts x {v.moe.expert_intermediate_size}, "
               f"top-{v.moe.top_k}")
    elif v.double_wide_mlp_in_kv_shared:
        mlp = f"{v.intermediate_size} ({2 * v.intermediate_size} in KV-shared layers)"
    else:
        mlp = str(v.intermediate_size)
    ple = (f"{v.vocab_size} x {v.num_layers * v.ple_dim_per_layer} ({v.ple_dim_per_layer}/layer)"
           if v.ple_dim_per_layer else "none")
    return ModelInfo(
        key=v.key, name=v.name, model_type=v.model_type, layers=v.num_layers,
        full_attention_layers=v.num_full_layers, layer_pattern=f"{v.full_attention_every - 1} sliding : 1 full",
        hidden_size=v.hidden_size, q_heads=v.num_q_heads, kv_heads_sliding=v.num_kv_heads_sliding,
        kv_heads_global=v.num_kv_heads_global, head_dim=v.head_dim, global_head_dim=v.global_head_dim,
        sliding_window=v.sliding_window, mlp=mlp, kv_shared_layers=v.num_kv_shared_layers, ple=ple,
        vocab_size=v.vocab_size, tie_word_embeddings=v.tie_word_embeddings,
        attention_k_eq_v=v.attention_k_eq_v, max_position_embeddings=v.max_position_embeddings,
        towers=v.towers, params=param_breakdown(v), hub=v.hub,
        decode_bytes_gb={f: round(decode_bytes_per_token(v, f).weights_gb, 3) for f in FORMATS},
        t4_roofline_tok_s={f: round(decode_roofline(v, f).tok_s_spec, 1) for f in FORMATS},
        notes=v.notes,
    )
