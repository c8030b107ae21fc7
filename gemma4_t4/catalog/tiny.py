"""A tiny random-weight Gemma 4 text model with an offline tokenizer.

What the tests, CI and the CPU notebooks serve, built in seconds with no model hub: a
``Gemma4ForCausalLM`` with sliding and full attention (distinct head dims, like the real 256/512), tied
and per-layer embeddings, and a BPE tokenizer with Gemma's special-token ids and chat template. ``qat``
snaps every Linear and embedding onto the symmetric int4 group-32 grid (stored as bf16), as Google's
``-qat-q4_0-unquantized`` checkpoints are; ``drafter`` is a matching tiny ``gemma4_assistant`` (Google's
MTP layout: same vocabulary, Q-only layers reading the target's KV cache).
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation import safepaths

Variant = Literal["bf16", "qat", "drafter"]
VARIANTS: tuple[str, ...] = get_args(Variant)
INFO_NAME = "tiny_gemma4.json"  # variant + spec; also what marks tiny builds made before the ownership marker
TOKENIZER_BYTES = 2 * 2**20  # tokenizer, chat template and configs of the tiny model, with room to spare
SaveModel = Callable[[Any, Path], None]  # (model, folder): writes the weights and the model's config

# Gemma's special tokens, in Gemma's id order (pad 0, eos 1, bos 2, unk 3), then turn markers.
SPECIAL_TOKENS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
TURN_TOKENS = ["<|turn>", "<turn|>"]

CHAT_TEMPLATE = ("{{ bos_token }}"
                 "{% for message in messages %}"
                 "{{ '<|turn>' + message['role'] + '\n' + message['content'] | trim + '<turn|>\n' }}"
                 "{% endfor %}"
                 "{% if add_generation_prompt %}{{ '<|turn>model\n' }}{% endif %}")

# A small corpus: enough merges for a few hundred tokens, and every ASCII letter/digit.
CORPUS = [
    "Gemma 4 runs on the NVIDIA T4, a Turing GPU with 16 GB of memory and 65536 bytes of shared memory.",
    "The quick brown fox jumps over the lazy dog while the vLLM server streams tokens.",
    "Quantization aware training puts every weight on a four bit grid of sixteen levels.",
    "Decode speed is bound by memory bandwidth: bytes read per token set the roofline.",
    "SageMaker endpoints bill by the hour, so delete them when the benchmark is done.",
    "Prefix caching reuses the key value cache of a shared prompt prefix.",
    "What is the capital of France? Paris. What is two plus two? Four.",
    "0123456789 ABCDEFGHIJKLMNOPQRSTUVWXYZ abcdefghijklmnopqrstuvwxyz .,;:!?'\"()[]{}<>/-_=+*&%$#@",
]


@dataclass(frozen=True)
class TinySpec:
    """Shape of the tiny model. Defaults serve on vLLM's CPU build and suit group-32 quant tests."""

    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 1
    head_dim: int = 32  # vLLM's CPU backend supports 32, 64, ..., 256, 512
    global_head_dim: int = 64  # distinct from head_dim, like Gemma 4's 256 / 512
    hidden_size_per_layer_input: int = 32  # multiple of 32 so group-32 quantization divides it
    sliding_window: int = 64
    full_attention_every: int = 2  # every 2nd layer is global; the last layer must be global
    max_position_embeddings: int = 4096
    vocab_size: int = 512
    seed: int = 0
    # the drafter variant (a gemma4_assistant): its own width, the target's head sizes
    draft_hidden_size: int = 64
    draft_intermediate_size: int = 128
    draft_num_hidden_layers: int = 2  # one sliding, one full: each reads the target's last layer of its type
    draft_num_attention_heads: int = 2

    def layer_types(self) -> list[str]:
        types = ["full_attention" if (i + 1) % self.full_attention_every == 0 else "sliding_attention"
                 for i in range(self.num_hidden_layers)]
        types[-1] = "full_attention"
        return types


@dataclass
class TinyModelInfo:
    """What :func:`build_tiny_gemma4` wrote."""

    path: Path
    variant: str
    spec: dict[str, int]  # the TinySpec (asdict): every field is an int
    vocab_size: int
    num_parameters: int
    files: list[str] = field(default_factory=list)
    served_model_name: str = "tiny-gemma4"
    cleanup: list[str] = field(default_factory=list)  # stale partial builds this run removed or restored


def build_tokenizer(vocab_size: int):
    """Train a byte-fallback BPE tokenizer offline and wrap it as a transformers tokenizer."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    byte_tokens = [f"<0x{i:02X}>" for i in range(256)]
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=False))
    tokenizer.normalizer = normalizers.Replace(" ", "▁")
    tokenizer.pre_tokenizer = pre_tokenizers.Split("▁", behavior="merged_with_next")
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS + byte_tokens + TURN_TOKENS,
        initial_alphabet=list("▁"), show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<bos>", eos_token="<eos>", unk_token="<unk>",
        pad_token="<pad>", mask_token="<mask>", additional_special_tokens=TURN_TOKENS, add_bos_token=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def snap_to_int4_grid(weight, group_size: int = 32, generator=None):
    """Return ``weight`` moved onto a symmetric int4 grid: per group of ``group_size`` input
    columns one scale s, every value s*q with q in -8..7 (stored in the weight's dtype).

    Peaks land on a random level in 5..8 per group (never always 8), as in real QAT weights.
    """
    import torch

    rows, cols = weight.shape
    if cols % group_size:
        raise Gemma4T4Error(f"cannot snap a {tuple(weight.shape)} tensor to group {group_size}",
                            fix=f"use a shape whose last dimension is a multiple of {group_size}")
    w = weight.detach().float().reshape(rows, cols // group_size, group_size)
    absmax = w.abs().amax(dim=-1, keepdim=True).clamp_min(1e-8)
    peak = torch.randint(5, 9, absmax.shape, generator=generator).float()
    scale = absmax / peak
    levels = torch.clamp(torch.round(w / scale), -8, 7)
    snapped = (levels * scale).reshape(rows, cols)
    return snapped.to(weight.dtype)


def _portable_config(config_path: Path, spec: TinySpec) -> None:
    """Rewrite config.json with the pre-5.15 keys (``global_head_dim``,
    ``num_global_key_value_heads``) that every vLLM release reads; transformers >= 5.15
    converts them back into ``per_layer_config`` on load."""
    config = json.loads(config_path.read_text())
    config.pop("per_layer_config", None)
    config["global_head_dim"] = spec.global_head_dim
    config["num_global_key_value_heads"] = spec.num_key_value_heads
    config["architectures"] = ["Gemma4ForCausalLM"]
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def save_model(model, folder: Path) -> None:
    """How a tiny model's weights are written (safetensors); ``build_tiny_gemma4(save=...)`` replaces it."""
    model.save_pretrained(folder, safe_serialization=True)


def build_tiny_gemma4(out_dir: str | os.PathLike, variant: Variant = "bf16", spec: TinySpec = TinySpec(),
                      overwrite: bool = False, save: SaveModel = save_model) -> TinyModelInfo:
    """Build the tiny Gemma 4 checkpoint + tokenizer into ``out_dir``, deterministic per ``spec.seed``;
    written to a partial sibling and renamed, so an interrupted build leaves nothing half-written.
    ``save`` writes the weights (default :func:`save_model`)."""
    import torch
    from transformers import Gemma4ForCausalLM

    if variant not in VARIANTS:
        raise Gemma4T4Error(f"unknown tiny variant {variant!r}", fix=f"use one of: {', '.join(VARIANTS)}")
    out = Path(out_dir)
    # as every output folder: --overwrite replaces only a folder this package wrote (older tiny
    # builds carry tiny_gemma4.json), never a symlink or a user's folder
    cleanup = safepaths.clean_stale(out, legacy_names=(INFO_NAME,))  # first: it may restore OUT
    safepaths.check_target(out, overwrite=overwrite, what="OUT", legacy_names=(INFO_NAME,))

    tokenizer = build_tokenizer(spec.vocab_size)
    vocab = len(tokenizer)
    torch.manual_seed(spec.seed)
    generator = torch.Generator().manual_seed(spec.seed + 1)
    if variant == "drafter":
        model = _tiny_assistant(spec, tokenizer, generator)
    else:
        config = _text_config(
            spec, tokenizer, vocab_size_per_layer_input=vocab, hidden_size=spec.hidden_size,
            intermediate_size=spec.intermediate_size, num_hidden_layers=spec.num_hidden_layers,
            num_attention_heads=spec.num_attention_heads,
            hidden_size_per_layer_input=spec.hidden_size_per_layer_input, layer_types=spec.layer_types(),
        )
        model = _widened(Gemma4ForCausalLM(config), generator)
    with torch.no_grad():
        if variant == "qat":
            for param in model.parameters():
                if param.dim() == 2 and param.shape[-1] % 32 == 0:
                    param.copy_(snap_to_int4_grid(param, 32, generator))
    model.generation_config.do_sample = False
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    # a failure or stop signal removes the partial build; a full disk is a Gemma4T4Error naming it
    with safepaths.partial_build(out, overwrite, weights + TOKENIZER_BYTES, f"the tiny model {out}", "tiny",
                                 variant=variant) as tmp:
        save(model, tmp)
        tokenizer.save_pretrained(tmp)
        if variant != "drafter":  # the target's config.json is rewritten for every vLLM, not the drafter's
            _portable_config(tmp / "config.json", spec)
        (tmp / INFO_NAME).write_text(json.dumps({"variant": variant, "spec": asdict(spec)}, indent=2) + "\n")
    return TinyModelInfo(
        path=out, variant=variant, spec=asdict(spec), vocab_size=vocab,
        num_parameters=sum(p.numel() for p in model.parameters()),
        files=sorted(p.name for p in out.iterdir() if not p.name.startswith(".")), cleanup=cleanup,
    )


def _tiny_assistant(spec: TinySpec, tokenizer, generator):
    """A random ``Gemma4AssistantForCausalLM`` that fits the tiny target built from ``spec``.

    What vLLM's ``gemma4_mtp`` needs of it (vllm/model_executor/models/gemma4_mtp.py): the
    target's vocabulary (the drafter embeds with the target's embed_tokens and scores with its
    own lm_head), ``backbone_hidden_size`` = the target's hidden size (pre/post projections),
    and per layer type the target's head size and KV heads (its Q-only attention reads the
    target's cache). No per-layer embeddings, every layer KV-shared (transformers' own rules).
    """
    from transformers import Gemma4AssistantConfig, Gemma4AssistantForCausalLM

    layers = spec.draft_num_hidden_layers
    text = _text_config(
        spec, tokenizer, vocab_size_per_layer_input=0, hidden_size=spec.draft_hidden_size,
        intermediate_size=spec.draft_intermediate_size, num_hidden_layers=layers,
        num_attention_heads=spec.draft_num_attention_heads, hidden_size_per_layer_input=0,
        layer_types=["sliding_attention"] * (layers - 1) + ["full_attention"], num_kv_shared_layers=layers,
    )
    config = Gemma4AssistantConfig(
        text_config=text, backbone_hidden_size=spec.hidden_size,
        # centroid masking off: vLLM captures CUDA graphs for it, which a CPU cannot
        use_ordered_embeddings=False, tie_word_embeddings=True,
    )
    return _widened(Gemma4AssistantForCausalLM(config), generator)


def _text_config(spec: TinySpec, tokenizer, **shape: Any):
    """A ``Gemma4TextConfig`` with the tiny target's vocabulary, attention heads, window and special
    tokens; ``shape`` gives the rest (the target's or the drafter's)."""
    from transformers import Gemma4TextConfig

    return Gemma4TextConfig(
        vocab_size=len(tokenizer), num_key_value_heads=spec.num_key_value_heads, head_dim=spec.head_dim,
        global_head_dim=spec.global_head_dim, num_global_key_value_heads=spec.num_key_value_heads,
        sliding_window=spec.sliding_window, max_position_embeddings=spec.max_position_embeddings,
        final_logit_softcapping=30.0, tie_word_embeddings=True, pad_token_id=0,
        eos_token_id=[1, tokenizer.convert_tokens_to_ids("<turn|>")], bos_token_id=2, **shape,
    )


def _widened(model, generator):
    """``model`` in bf16 with its matrices drawn at std 0.08: transformers' init (std 0.02) is so
    narrow that greedy outputs would not differ between prompts."""
    import torch

    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 2:
                param.normal_(0.0, 0.08, generator=generator)
    return model.to(torch.bfloat16)


def ensure_tiny_gemma4(out_dir: str | os.PathLike, variant: Variant = "bf16") -> Path:
    """Build the tiny model once and reuse it (tests, notebooks, ``make run``)."""
    out = Path(out_dir)
    marker = out / INFO_NAME
    out.parent.mkdir(parents=True, exist_ok=True)
    # two processes at once (test workers, two notebooks): the second waits for the first's build
    # and reuses it instead of replacing a folder the first may be serving from
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.exists() and json.loads(marker.read_text()).get("variant") == variant:
            return out
        build_tiny_gemma4(out, variant=variant, overwrite=True)
    return out
