"""Which tensors a repack quantizes, and the compressed-tensors ``quantization_config`` it writes.

Quantized: the language model's Linear weights whose input dimension divides the group size,
plus (``emb4``) the token and per-layer embedding tables and an untied 4-bit ``lm_head``.
Everything else that vLLM could treat as a quantizable layer goes on the ``ignore`` list by
exact module name (vLLM fails with "no module or parameter named ...weight" otherwise).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Modules that stay in their original dtype: multimodal towers and projectors, MoE routers (some
# exports name the router's linear "gate"), norms.
KEEP_RE = re.compile(
    r"(^|\.)(vision_tower|audio_tower|embed_vision|embed_audio|multi_modal_projector|router)\."
    r"|(^|\.)gate\.weight$|norm\.weight$"
)
EMBED_RE = re.compile(r"(^|\.)embed_tokens\.weight$")
# the tables emb4 packs: token and per-layer embeddings, and an explicit lm_head
TABLE_RE = re.compile(r"(^|\.)(embed_tokens|embed_tokens_per_layer|lm_head)\.weight$")
LM_HEAD = "lm_head"

COMPRESSED_TENSORS_VERSION = "0.17.0"


@dataclass(frozen=True)
class TensorRole:
    module: str
    quantize: bool
    reason: str = ""  # why a tensor is copied as it is
    layer: bool = True  # a Linear or embedding vLLM could quantize: one kept goes on the ignore list


def classify(name: str, shape: tuple[int, ...], dtype: str, group_size: int, emb4: bool) -> TensorRole:
    """Decide what happens to one checkpoint tensor."""
    module = name.removesuffix(".weight")
    if not name.endswith(".weight") or len(shape) != 2 or dtype not in ("BF16", "F16", "F32"):
        return TensorRole(module, False, "not a 2-D float weight", layer=False)
    if KEEP_RE.search(name):
        return TensorRole(module, False, "tower/router/norm kept in original dtype")
    # an explicit lm_head is packed only together with the embeddings (emb4)
    if TABLE_RE.search(name):
        if not emb4:
            return TensorRole(module, False, "embedding kept (use --emb4 to pack it)")
        if shape[1] % group_size:
            return TensorRole(module, False, f"width {shape[1]} not a multiple of {group_size}")
    elif shape[1] % group_size:
        return TensorRole(module, False, f"input dim {shape[1]} not a multiple of {group_size}")
    return TensorRole(module, True)


def quantization_config(group_size: int, ignore: list[str], emb4: bool, symmetric: bool = True,
                        observer: str = "minmax") -> dict:
    """compressed-tensors ``quantization_config`` for a pack-quantized int4 weight-only build."""
    targets = ["Linear"]
    if emb4:
        targets += [r"re:.*embed_tokens$", r"re:.*embed_tokens_per_layer$", r"re:^lm_head$"]
    weights = {
        "num_bits": 4, "type": "int", "symmetric": symmetric, "strategy": "group", "group_size": group_size,
        "dynamic": False, "actorder": None, "observer": observer, "observer_kwargs": {},
        "block_structure": None,
    }
    group = {
        "targets": targets, "weights": weights, "input_activations": None, "output_activations": None,
        "format": "pack-quantized",
    }
    return {
        "quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
        "config_groups": {"group_0": group}, "ignore": sorted(set(ignore)), "kv_cache_scheme": None,
        "sparsity_config": {}, "transform_config": {}, "global_compression_ratio": None,
        "version": COMPRESSED_TENSORS_VERSION,
    }

