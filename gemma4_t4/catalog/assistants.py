"""Google's MTP drafters ("assistants") for speculative decoding: one checkpoint per Gemma 4 size and
target build, with its size, draft length and whether vLLM is known to serve it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from gemma4_t4.catalog.family import VARIANTS, Gemma4Variant, get_variant

AssistantBuild = Literal["base", "qat"]
MB = 10**6


@dataclass(frozen=True)
class Assistant:
    """Google's MTP drafter checkpoint for one size and target build.

    vLLM serves the ``gemma4_assistant`` model type as ``gemma4_mtp`` through ``--speculative-config``
    in every stable release since 0.21.0 (PR #41745; hosts_as_they_are.md, "Added 2026-12-01"), so on
    every vLLM this package installs (0.29-0.34, the CUDA-12 route's 0.31.0+cu129 included). Its
    decoder layers are Q-only and read the target's KV cache, so it adds weights but no KV cache.
    ``vllm_gap`` says why one is not known to be served (the 12B's ``gemma4_unified_assistant``).
    """

    variant: str  # VARIANTS key
    build: AssistantBuild  # "qat": trained for Google's QAT (q4_0) targets
    hub_id: str
    weights_bytes: int  # bf16 checkpoint size (served as fp16 on a T4: the same bytes)
    weights_source: str  # where weights_bytes comes from; "[inferred]" marks an estimate
    evidence: str  # where the id is recorded (checked 2026-12-01)
    # draft tokens per step until `gemma4-t4 tune` has measured this GPU (the tune profile's N wins)
    num_draft_tokens: int
    num_draft_tokens_source: str
    # empty: vLLM is known to serve it; else why not (``--draft auto`` then stays off and says so)
    vllm_gap: str = ""


_ID_EVIDENCE = (
    "Google's assistant list, google/gemma-4-{E2B,E4B,12B,26B-A4B,31B}-it-assistant each with a "
    "-it-qat-q4_0-unquantized-assistant companion: reference note hosts_as_they_are.md, 'Added 2026-12-01' "
    "(a note citing the Hugging Face API listing of 2026-09-28) [reported]"
)
_QAT_SAME_SIZE = "; the QAT companion has the base assistant's architecture and bf16 weights: the same size [inferred]"
# Sizes (bf16 bytes), each from the most direct public figure found on 2026-12-01:
_ASSISTANT_BYTES = {
    # "78M params" for the E2B drafter (Google's release as summarised by community notes, 2026-05-06);
    # an MLX bf16 copy lists 151 MB. 78M x 2 B, rounded up to E4B's figure.
    "e2b": (156 * MB, "78M parameters reported for the E2B drafter [reported], so ~156 MB bf16 [inferred]; an "
                      "MLX bf16 copy lists 151 MB [reported]"),
    "e4b": (156 * MB, "156 MB, hub discussion google/gemma-4-E4B-it-assistant #3; 78.8M parameters per a GGUF "
                      "conversion's card [reported]"),
    # 423M parameters on the Hub listing (captured by onlylabs.fyi); its BF16 GGUF conversion
    # (sjakek/gemma4-12b-mtp-assistant) is 861,520,128 B: hidden 1024, 4 blocks, FFN 8192
    "12b": (862 * MB, "423M parameters on its Hub listing; the BF16 GGUF conversion is 861,520,128 B [reported]"),
    # A deployment of the 26B-A4B assistant saw ~0.42 B parameters and its weights grow by 0.78 GiB
    # (0.84 GB); the earlier 0.27 GB / ~200 MB / 0.30 GiB notes undercounted it
    "26b-a4b": (840 * MB, "~0.42 B parameters x 2 B = ~840 MB bf16; a deployment saw the weights grow by "
                          "0.78 GiB (a third-party deployment README; reference notes hosts_as_they_are.md, "
                          "2026-12-05) [reported]"),
    "31b": (940 * MB, "0.94 GB bf16, 4 layers, per its MLX conversion NeoRoth/gemma-4-31b-it-assistant-mlx "
                      "(another note: ~930 MB) [reported]"),
}
# Untuned N (num_speculative_tokens) per size; `gemma4-t4 tune` measures N = 1..6 on the user's GPU.
_ASSISTANT_N = {
    "e2b": (2, "vLLM's Gemma 4 recipe: N=2 for E2B [reported]; on a GCE T4 N=2/3/4 gave 126/135/137 vs 100.5 "
               "tok/s (t4_speed_anchors.md)"),
    "e4b": (4, "vLLM's Gemma 4 recipe: N=4 for E4B [reported]"),
    "12b": (4, "no published N for 12B: E4B's recipe value, since a larger target makes each accepted draft "
               "worth more [inferred]"),
    "26b-a4b": (2, "N=2 beat N=4 for 26B-A4B on a DGX Spark (t4_speed_anchors.md) [reported]: a MoE target "
                   "reads more experts per verified token"),
    "31b": (4, "no vLLM recipe value for 31B: third-party vLLM launch scripts for the 31B assistant use N=4 "
               "[reported]; a dense target, like E4B"),
}


# The 12B assistant's model type is gemma4_unified_assistant. vLLM's config code renames it to gemma4_mtp
# (config/speculative.py of 0.31.0 and 0.34.0), but no run of vLLM serving it was found, so it is not
# picked for the user: an explicit --draft id still tries it.
_VLLM_GAPS = {
    "12b": "its model type gemma4_unified_assistant has no known vLLM run: vLLM's config maps it to gemma4_mtp "
           "(config/speculative.py, 0.31.0 and 0.34.0), but no served run of it was found (reference notes "
           "hosts_as_they_are.md, 2026-12-05)",
}


def _assistant(key: str, build: AssistantBuild) -> Assistant:
    size = VARIANTS[key].size
    suffix = "-it-qat-q4_0-unquantized-assistant" if build == "qat" else "-it-assistant"
    weights, weights_source = _ASSISTANT_BYTES[key]
    num, num_source = _ASSISTANT_N[key]
    return Assistant(key, build, f"google/gemma-4-{size}{suffix}", weights,
                     weights_source + (_QAT_SAME_SIZE if build == "qat" else ""), _ID_EVIDENCE, num, num_source,
                     _VLLM_GAPS.get(key, ""))


ASSISTANTS: dict[tuple[str, AssistantBuild], Assistant] = {
    (key, build): _assistant(key, build) for key in VARIANTS for build in get_args(AssistantBuild)
}


def assistant_for(variant: str | Gemma4Variant, build: AssistantBuild) -> tuple[Assistant | None, str]:
    """Google's assistant for a target of ``variant`` and ``build`` (a QAT target gets the QAT
    companion), or None, with the reason."""
    v = get_variant(variant)
    found = ASSISTANTS.get((v.key, build))
    if found:
        return found, f"Google's assistant for {v.size} ({build}): {found.hub_id}"
    return None, f"no Google assistant (drafter) checkpoint is recorded for {v.size} ({build})"


def assistant_by_id(hub_id: str) -> Assistant | None:
    """The catalogued assistant with this hub id (case-insensitive), or None."""
    return next((a for a in ASSISTANTS.values() if a.hub_id.lower() == str(hub_id).strip().lower()), None)
