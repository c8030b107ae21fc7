"""The Gemma 4 family as data: its sizes (shapes from transformers' Gemma 4 configs and modelling
code, checkpoint names and parameter counts as published), its formats, and the one lookup by a
flexible name (``e2b``, ``gemma-4-e2b``, a hub id). :mod:`gemma4_t4.catalog.models` derives what follows
from it on a GPU.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gemma4_t4.errors import Gemma4T4Error

GiB = 2**30
GB = 10**9

FORMATS: tuple[str, ...] = ("bf16", "qat-w4a16", "emb4")


_FORMAT_ALIASES = {"bf16": "bf16", "fp16": "bf16", "float16": "bf16", "bfloat16": "bf16", "base": "bf16",
                   "q4-0-unquantized": "bf16", "qat-q4-0-unquantized": "bf16",
                   "qat-w4a16": "qat-w4a16", "qat": "qat-w4a16", "w4a16": "qat-w4a16", "ct": "qat-w4a16",
                   "qat-w4a16-ct": "qat-w4a16", "int4": "qat-w4a16",
                   "emb4": "emb4", "text-emb4": "emb4", "w4a16-emb4": "emb4"}


def normalize_format(name: str) -> str:
    """``'QAT'`` -> ``'qat-w4a16'``; raise a :class:`Gemma4T4Error` listing the formats."""
    key = str(name).strip().lower().replace("_", "-") if name is not None else ""  # q4_0 -> q4-0 too
    if key in _FORMAT_ALIASES:
        return _FORMAT_ALIASES[key]
    raise Gemma4T4Error(
        f"unknown format {name!r}", fix=f"use one of: {', '.join(FORMATS)} (aliases: qat, w4a16, fp16)",
    )



@dataclass(frozen=True)
class MoE:
    num_experts: int
    top_k: int
    expert_intermediate_size: int


@dataclass(frozen=True)
class PublishedParams:
    """Parameter counts in billions, as published (counted on the ``meta`` device)."""

    total: float
    body: float | None = None
    embed: float | None = None
    ple: float | None = None
    vision: float | None = None
    audio: float | None = None
    active: float | None = None


@dataclass(frozen=True)
class HubIds:
    bf16: str
    qat_w4a16_ct: str | None
    qat_q4_0_unquantized: str
    qat_q4_0_gguf: str
    qat_mobile_ct: str | None = None
    community_emb4: str | None = None


@dataclass(frozen=True)
class Gemma4Variant:
    """One Gemma 4 size. Shapes are those of the text decoder."""

    key: str  # e2b, e4b, 12b, 26b-a4b, 31b
    size: str  # as in the hub ids: E2B, E4B, 12B, 26B-A4B, 31B
    model_type: str
    hidden_size: int
    num_layers: int
    full_attention_every: int  # every Nth layer is global (full) attention
    num_q_heads: int
    num_kv_heads_sliding: int
    num_kv_heads_global: int
    sliding_window: int
    intermediate_size: int
    max_position_embeddings: int
    published: PublishedParams
    towers: str
    head_dim: int = 256
    global_head_dim: int = 512
    num_kv_shared_layers: int = 0  # the last N layers reuse an earlier layer's KV cache
    double_wide_mlp_in_kv_shared: bool = False
    ple_dim_per_layer: int = 0  # per-layer embedding width (0: no PLE)
    attention_k_eq_v: bool = False  # global layers: V reuses K's projection
    moe: MoE | None = None
    vocab_size: int = 262_144
    tie_word_embeddings: bool = True
    ct_duplicate_lm_head: bool = False  # the ct file ships an extra bf16 lm_head
    notes: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return f"gemma-4-{self.size}"

    @property
    def hub(self) -> HubIds:
        base = f"google/gemma-4-{self.size}-it"
        return HubIds(
            bf16=base, qat_w4a16_ct=None if self.moe else f"{base}-qat-w4a16-ct",
            qat_q4_0_unquantized=f"{base}-qat-q4_0-unquantized", qat_q4_0_gguf=f"{base}-qat-q4_0-gguf",
            qat_mobile_ct=f"{base}-qat-mobile-ct" if self.ple_dim_per_layer else None,
            community_emb4=f"xbill9/gemma-4-{self.size}-it-qat-q4_0-w4a16-ct-text-emb4",
        )

    def layer_types(self) -> list[str]:
        return ["full_attention" if (i + 1) % self.full_attention_every == 0 else "sliding_attention"
                for i in range(self.num_layers)]

    def is_kv_shared(self, layer: int) -> bool:
        """Whether ``layer`` is one of the last ``num_kv_shared_layers``."""
        return layer >= self.num_layers - self.num_kv_shared_layers

    @property
    def num_full_layers(self) -> int:
        return self.layer_types().count("full_attention")


# The released checkpoints set tie_word_embeddings; sizes from transformers' conversion table.
VARIANTS: dict[str, Gemma4Variant] = {
    v.key: v
    for v in [
        Gemma4Variant(key="e2b", size="E2B", model_type="gemma4", hidden_size=1536, num_layers=35,
                      full_attention_every=5, num_q_heads=8, num_kv_heads_sliding=1, num_kv_heads_global=1,
                      sliding_window=512, intermediate_size=6144, max_position_embeddings=131_072,
                      num_kv_shared_layers=20, double_wide_mlp_in_kv_shared=True, ple_dim_per_layer=256,
                      ct_duplicate_lm_head=True, towers="vision 16 layers + audio 12 layers",
                      published=PublishedParams(total=5.10, body=1.877, embed=0.403, ple=2.349, vision=0.169,
                                                audio=0.307),
                      notes=("dense with per-layer embeddings (PLE), not MoE",)),
        Gemma4Variant(
            key="e4b", size="E4B", model_type="gemma4", hidden_size=2560, num_layers=42,
            full_attention_every=6, num_q_heads=8, num_kv_heads_sliding=2, num_kv_heads_global=2,
            sliding_window=512, intermediate_size=10240, max_position_embeddings=131_072,
            num_kv_shared_layers=18, ple_dim_per_layer=256, ct_duplicate_lm_head=True,
            towers="vision 16 layers + audio 12 layers",
            # The towers are E2B's (7.94 - 3.973 - 0.671 - 2.819 = 0.477 = 0.169 + 0.307).
            published=PublishedParams(total=7.94, body=3.973, embed=0.671, ple=2.819, vision=0.169,
                                      audio=0.307),
            notes=("dense with per-layer embeddings (PLE), not MoE",),
        ),
        Gemma4Variant(key="12b", size="12B", model_type="gemma4_unified", hidden_size=3840, num_layers=48,
                      full_attention_every=6, num_q_heads=16, num_kv_heads_sliding=8, num_kv_heads_global=1,
                      sliding_window=1024, intermediate_size=15360, max_position_embeddings=131_072,
                      attention_k_eq_v=True, towers="no vision tower (patch projection) + audio projector",
                      published=PublishedParams(total=11.96),
                      notes=("launched 2026-06-03", "the largest size that fits one T4 (4-bit builds)")),
        Gemma4Variant(key="26b-a4b", size="26B-A4B", model_type="gemma4", hidden_size=2816, num_layers=30,
                      full_attention_every=6, num_q_heads=16, num_kv_heads_sliding=8, num_kv_heads_global=2,
                      sliding_window=1024, intermediate_size=2112, max_position_embeddings=262_144,
                      attention_k_eq_v=True, moe=MoE(num_experts=128, top_k=8, expert_intermediate_size=704),
                      towers="vision 27 layers", published=PublishedParams(total=25.81, active=3.8),
                      notes=("MoE: a dense MLP plus 128 experts (top-8) per layer",
                             "Google publishes no -qat-w4a16-ct build for this size")),
        Gemma4Variant(
            key="31b", size="31B", model_type="gemma4", hidden_size=5376, num_layers=60,
            full_attention_every=6, num_q_heads=32, num_kv_heads_sliding=16, num_kv_heads_global=4,
            sliding_window=1024, intermediate_size=21504, max_position_embeddings=262_144,
            attention_k_eq_v=True, towers="vision 27 layers", published=PublishedParams(total=31.27),
        ),
    ]
}




_NAME_ALIASES = {"26b": "26b-a4b", "26ba4b": "26b-a4b", "a4b": "26b-a4b", "moe": "26b-a4b"}


def get_variant(name: str | Gemma4Variant) -> Gemma4Variant:
    """Look a size up by a flexible name: ``e2b``, ``E2B``, ``gemma-4-e2b``, a hub id..."""
    if isinstance(name, Gemma4Variant):
        return name
    key = re.sub(r"^(google|xbill9)/", "", str(name or "").strip().lower())
    key = re.sub(r"^gemma[-_ ]?4[-_ ]?", "", key)
    # Drop a hub suffix such as "-it", "-it-qat-w4a16-ct".
    key = re.sub(r"[-_](it|pt)([-_].*)?$", "", key).replace("_", "-").replace(" ", "-")
    key = _NAME_ALIASES.get(key, key)
    if key in VARIANTS:
        return VARIANTS[key]
    raise Gemma4T4Error(
        f"unknown Gemma 4 model {name!r}",
        fix=f"use one of: {', '.join(VARIANTS)} (also accepted: E2B, gemma-4-e2b, google/gemma-4-E2B-it)",
    )
