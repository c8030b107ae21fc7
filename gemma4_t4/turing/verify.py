"""Offline proof that the tile cap makes every Gemma 4 attention launch fit a GPU's shared memory.

For every attention shape of Gemma 4 and its assistants (drafters: Q-only layers over the target's
KV cache) and every case (prefill, 3D decode, 2D batch decode, speculative verification of N+1
tokens), :func:`verify` calls vLLM's real ``unified_attention`` launcher on CPU tensors, records
the launch, compiles it ahead of time for the target (``GPUTarget("cuda", 75, 32)`` for a T4) and
reads the kernel's shared-memory bytes, the number the GPU compares with its per-block limit: once
with vLLM's own tiles, once with the tile cap. No GPU is needed.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import time
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

from gemma4_t4.catalog.assistants import ASSISTANTS
from gemma4_t4.catalog.family import VARIANTS
from gemma4_t4.catalog.models import KV_BLOCK_SIZE
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation import signals
from gemma4_t4.foundation.table import Displayable
from gemma4_t4.turing import smem, tilecap
from gemma4_t4.turing.numerics import AttentionCase, run_unified_attention
from gemma4_t4.turing.offline import (
    TRITON_FIX,
    KernelModule,
    RecordedLaunch,
    load_kernel_module,
    recording_launches,
    require_triton,
)
from gemma4_t4.turing.tilecap import arch_name

# Draft lengths whose verification step is compiled: 1..6 covers the useful range (the launch's default
# is 3) and 16 is num_draft_tokens' limit (le=16 in launch_record), the largest a launch accepts (not imported: the
# speculative module reaches the start gate, which imports this package). A step runs N+1 query tokens
# per sequence, so vLLM takes the 2D path with TILE_SIZE_PREFILL and BLOCK_M from the query heads per KV head.
VERIFY_DRAFT_TOKENS = (1, 2, 3, 4, 5, 6, 16)
DEFAULT_DRAFT_TOKENS = 3  # speculative.DEFAULT_NUM_DRAFT_TOKENS: the verification batch's draft length
# Cached tokens per sequence before the step. 256 makes the block table's row stride 16 blocks, which
# Triton specializes as divisible by 16 as in a served model (max_model_len a multiple of 256): a
# compile of its own, next to the prefill case's stride of 4.
VERIFY_CONTEXT = 256


@dataclass(frozen=True)
class AttentionShape:
    model: str
    layer: str  # "sliding" or "global"
    head_size: int
    num_q_heads: int
    num_kv_heads: int
    sliding_window: int | None
    role: str = "target"  # "target", or "drafter": an assistant's Q-only layer over the target's KV cache


@dataclass
class LaunchCheck:
    model: str
    layer: str
    case: str  # prefill | decode | decode-batch | verify-N (N drafts: N+1 query tokens per sequence) | verify-batch
    head_size: int
    num_q_heads: int
    num_kv_heads: int
    path: str  # "2d" or "3d"
    block_m: int
    block_q: int  # query tokens per program: BLOCK_M // (query heads per KV head)
    tile_size: int  # with the tile cap
    tile_size_unpatched: int
    shared_bytes_unpatched: int
    shared_bytes_patched: int
    model_bytes: int  # smem.attention_smem_bytes for the patched launch
    limit_bytes: int
    ok: bool  # patched launch fits the limit
    role: str = "target"  # "drafter": the assistant's layer of this size and type
    query_len: int = 1  # query tokens per sequence in the recorded launch


class VerifyReport(Displayable, BaseModel):
    """The proof's verdict: the kernel and Triton it ran on, what the tile cap decided, and every
    launch checked (the MCP ``verify_turing_patch`` tool returns it with the failing launches only)."""

    ok: bool
    arch: str
    capability: tuple[int, int]
    limit_bytes: int
    vllm_version: str
    kernel_file: str
    kernel_sha256: str
    triton_version: str
    patch_action: str  # what the tile cap decided for this target: capped / no-change / refused
    patch_reason: str
    model_exact: bool | None  # smem model == every compile (checked below sm_80; None above: an estimate)
    changed_launches: int
    compiles: int
    seconds: float
    launches: list[LaunchCheck] = Field(default_factory=list)

    def caption(self) -> str:
        return (f"vLLM {self.vllm_version} attention on {self.arch}: limit {self.limit_bytes:,} B, "
                f"{self.compiles} compiles, all fit: {self.ok}")

    def table_rows(self) -> list[dict[str, object]]:
        return [{"model": c.model, "layer": c.layer, "case": c.case, "head": c.head_size,
                 "q/kv": f"{c.num_q_heads}/{c.num_kv_heads}", "path": c.path, "BLOCK_M": c.block_m,
                 "tile unpatched": c.tile_size_unpatched, "bytes unpatched": c.shared_bytes_unpatched,
                 "tile patched": c.tile_size, "bytes patched": c.shared_bytes_patched, "fits": c.ok}
                for c in self.launches]

    def failures(self) -> list[LaunchCheck]:
        return [launch for launch in self.launches if not launch.ok]


def gemma4_attention_shapes(drafters: bool = True) -> list[AttentionShape]:
    """Every distinct attention layer shape of the Gemma 4 family, and of its assistants (drafters).

    An assistant's Q-only layers (vLLM's ``gemma4_mtp``) take the target's head size and KV heads per
    layer type. Their query-head count is in no local file, so the target's is assumed; shared memory
    does not depend on it up to 16 query heads per KV head (BLOCK_M 16; above, no tile fits head 512
    on a T4 and the launch is reported as not fitting).
    """
    with_assistant = {variant for variant, _build in ASSISTANTS}
    shapes = []
    for variant in VARIANTS.values():
        roles = ["target", "drafter"] if drafters and variant.key in with_assistant else ["target"]
        for role in roles:
            shapes.append(AttentionShape(variant.size, "sliding", variant.head_dim, variant.num_q_heads,
                                         variant.num_kv_heads_sliding, variant.sliding_window, role))
            shapes.append(AttentionShape(variant.size, "global", variant.global_head_dim, variant.num_q_heads,
                                         variant.num_kv_heads_global, None, role))
    return shapes


def parse_arch(arch: str) -> tuple[int, int]:
    """'sm_75', 'sm75', '75' or '7.5' -> (7, 5)."""
    text = str(arch).strip().lower()
    match = re.fullmatch(r"(?:sm_?)?(\d)\.?(\d)", text) or re.fullmatch(r"(?:sm_?)?(\d\d)(\d)", text)
    if not match:
        raise Gemma4T4Error(f"unknown architecture {arch!r}", fix="use sm_75 (T4), sm_80, sm_86 or sm_89")
    return int(match.group(1)), int(match.group(2))


def _launch_cases(shape: AttentionShape) -> dict[str, dict[str, int]]:
    threshold_3d = 128 // shape.num_kv_heads  # TRITON_ATTN's seq_threshold_3D
    return {
        "prefill": {"seqs": 2, "q_len": 64, "ctx": 64},  # 2D: query length > 1
        "decode": {"seqs": min(4, threshold_3d), "q_len": 1, "ctx": 256},  # 3D split-KV
        "decode-batch": {"seqs": threshold_3d + 1, "q_len": 1, "ctx": 32},  # 2D: above the threshold
        # Speculative decoding: the target verifies N drafts (N+1 query tokens per sequence) over cached
        # context, and an assistant's first pass runs over the same N+1 positions. vLLM 0.29-0.32 take the
        # 2D path (TILE_SIZE_PREFILL) for any query longer than 1; 0.33 takes the 3D path (TILE_SIZE_DECODE)
        # up to MAX_3D_QUERY_LEN (8) tokens while num_seqs * ceil((N+1) / BLOCK_Q) <= seq_threshold_3D.
        **{f"verify-{n}": {"seqs": 4, "q_len": n + 1, "ctx": VERIFY_CONTEXT} for n in VERIFY_DRAFT_TOKENS},
        # a verification batch above that threshold: 2D in every version
        "verify-batch": {"seqs": threshold_3d + 1, "q_len": DEFAULT_DRAFT_TOKENS + 1, "ctx": VERIFY_CONTEXT},
    }


def call_launcher(kernel: KernelModule, shape: AttentionShape, seqs: int, q_len: int, ctx: int) -> None:
    """Call vLLM's ``unified_attention`` with CPU fp16 tensors in TRITON_ATTN's layout."""
    import torch

    blocks_per_seq = -(-ctx // KV_BLOCK_SIZE)
    # one paged cache viewed as K and V, as TRITON_ATTN holds it (the strides are part of the compile)
    kv_cache = torch.zeros(seqs * blocks_per_seq + 1, 2, KV_BLOCK_SIZE, shape.num_kv_heads, shape.head_size,
                           dtype=torch.float16)
    key_cache, value_cache = kv_cache.unbind(1)
    run_unified_attention(kernel.module, AttentionCase(
        q=torch.zeros(seqs * q_len, shape.num_q_heads, shape.head_size, dtype=torch.float16),
        key_cache=key_cache, value_cache=value_cache,
        block_table=torch.arange(seqs * blocks_per_seq, dtype=torch.int32).reshape(seqs, blocks_per_seq),
        cu_seqlens_q=torch.arange(0, seqs + 1, dtype=torch.int32) * q_len,
        seqused_k=torch.full((seqs,), ctx, dtype=torch.int32), query_lens=[q_len] * seqs,
        context_lens=[ctx] * seqs, head_size=shape.head_size, num_q_heads=shape.num_q_heads,
        num_kv_heads=shape.num_kv_heads, sliding_window=shape.sliding_window,
    ))


class AttentionLaunch(RecordedLaunch):
    """A recorded attention launch and the shape and case it was recorded for."""

    shape: AttentionShape
    case: str
    query_len: int


def capture_attention_launches(kernel: KernelModule, shapes: list[AttentionShape]) -> list[AttentionLaunch]:
    """One recorded ``kernel_unified_attention`` launch per (shape, case)."""
    launches: list[AttentionLaunch] = []
    for shape in shapes:
        for case, sizes in _launch_cases(shape).items():
            with recording_launches(kernel) as recorded:
                call_launcher(kernel, shape, **sizes)
            attention = [r for r in recorded if r["kernel"] == "kernel_unified_attention"]
            if len(attention) != 1:
                raise Gemma4T4Error(f"expected one attention launch for {shape} {case}, saw {len(attention)}")
            launches.append(AttentionLaunch(shape=shape, case=case, query_len=sizes["q_len"], **attention[0]))
    return launches


class SharedMemoryCompiler:
    """Compiles recorded launches of one kernel (``jit``) for one GPU target and returns
    ``metadata.shared``, once per Triton specialization (Triton's on-disk cache makes a second run fast)."""

    def __init__(self, capability: tuple[int, int], jit: Any):
        triton = require_triton()
        from triton.backends.compiler import GPUTarget
        from triton.compiler import make_backend
        from triton.runtime.jit import create_function_from_signature

        if not hasattr(jit, "_pack_args"):
            raise Gemma4T4Error(
                f"Triton {triton.__version__} lacks the JIT internals the offline compile uses",
                fix=f"install the tested Triton: {TRITON_FIX}",
            )
        self.triton, self.jit = triton, jit
        self.target = GPUTarget("cuda", capability[0] * 10 + capability[1], 32)
        self.backend = make_backend(self.target)
        self.binder = create_function_from_signature(jit.signature, jit.params, self.backend)
        self.cache: dict[tuple, int] = {}
        self.compiles = 0

    def _bind(self, launch: RecordedLaunch) -> tuple[tuple, tuple]:
        """(the launch's specialization: the cache key, the bound arguments a compile takes)."""
        kwargs = dict(launch["kwargs"])
        bound, specialization, options = self.binder(**kwargs)
        return (repr(specialization), repr(options)), (kwargs, bound, specialization, options)

    def _compile(self, bound: tuple) -> int:
        from triton.compiler import ASTSource

        packed_options, signature, constexprs, attrs = self.jit._pack_args(self.backend, *bound)
        source = ASTSource(self.jit, signature, constexprs, attrs)
        compiled = self.triton.compile(source, target=self.target, options=packed_options.__dict__)
        return int(compiled.metadata.shared)

    def shared_bytes(self, launch: RecordedLaunch) -> int:
        key, bound = self._bind(launch)
        if key not in self.cache:
            self.cache[key] = self._compile(bound)
            self.compiles += 1
        return self.cache[key]

    def precompile(self, launches: list[RecordedLaunch], jobs: int) -> None:
        """Compile the distinct launches in ``jobs`` forked processes (each compile is CPU-bound)."""
        pending: dict[tuple, tuple] = {}
        for launch in launches:
            key, bound = self._bind(launch)
            if key not in self.cache:
                pending.setdefault(key, bound)
        if jobs <= 1 or len(pending) <= 1 or "fork" not in multiprocessing.get_all_start_methods():
            return
        global _FORKED_WORK
        _FORKED_WORK = (self, list(pending.values()))
        try:
            context = multiprocessing.get_context("fork")
            # the workers take the default signal actions: the pool's terminate() (SIGTERM) must end
            # them quietly, not through the parent's orderly-stop handler (a traceback per worker)
            with context.Pool(min(jobs, len(pending)), initializer=signals.default_in_child) as pool:
                results = pool.map(_compile_forked, range(len(pending)), chunksize=1)
        except Exception:  # a pool that cannot start: shared_bytes() compiles in this process
            return
        finally:
            _FORKED_WORK = None
        for key, shared in zip(pending, results, strict=True):
            self.cache[key] = shared
        self.compiles += len(pending)


_FORKED_WORK: tuple[SharedMemoryCompiler, list[tuple]] | None = None


def _compile_forked(index: int) -> int:
    compiler, pending = _FORKED_WORK
    return compiler._compile(pending[index])


def verify(
    arch: str = "sm_75", limit_bytes: int | None = None, vllm_root: str | None = None,
    shapes: list[AttentionShape] | None = None, jobs: int | None = None,
) -> VerifyReport:
    """Compile every Gemma 4 attention launch for ``arch``, unpatched and with the tile cap, in ``jobs``
    processes (default: one per CPU). ``ok`` is False if the tile cap refuses this vLLM or a patched
    launch needs more than ``limit_bytes`` (default: the architecture's opt-in maximum)."""

    started = time.monotonic()
    triton = require_triton()
    capability = parse_arch(arch)
    limit = limit_bytes or smem.OPTIN_SMEM_BY_CAPABILITY.get(capability)
    if limit is None:
        raise Gemma4T4Error(f"no known shared-memory limit for {arch_name(capability)}",
                            fix="pass limit_bytes (CLI: --limit-bytes)")
    shapes = shapes or gemma4_attention_shapes()
    kernel = load_kernel_module(vllm_root, capability=capability)
    unpatched = capture_attention_launches(kernel, shapes)
    target = {"platform": "cuda", "name": f"{arch_name(capability)} target", "capability": capability,
              "limit": limit, "limit_source": "target"}
    outcome = tilecap.install(kernel.module, origin="verify", device=target,
                              vllm_version=kernel.vllm_version, log=False)
    patched = capture_attention_launches(kernel, shapes) if outcome["action"] != "refused" else unpatched
    compiler = SharedMemoryCompiler(capability, kernel.module.kernel_unified_attention)
    compiler.precompile([*unpatched, *patched], jobs or os.cpu_count() or 1)
    checks = []
    for before, after in zip(unpatched, patched, strict=True):
        shape: AttentionShape = before["shape"]
        kw_before, kw_after = before["kwargs"], after["kwargs"]
        bytes_after = compiler.shared_bytes(after)
        checks.append(LaunchCheck(
            model=shape.model, layer=shape.layer, case=before["case"], head_size=shape.head_size,
            num_q_heads=shape.num_q_heads, num_kv_heads=shape.num_kv_heads,
            path="3d" if kw_after["IS_3D"] else "2d", block_m=kw_after["BLOCK_M"], block_q=kw_after["BLOCK_Q"],
            tile_size=kw_after["TILE_SIZE"], tile_size_unpatched=kw_before["TILE_SIZE"],
            shared_bytes_unpatched=compiler.shared_bytes(before), shared_bytes_patched=bytes_after,
            model_bytes=smem.attention_smem_bytes(kw_after["TILE_SIZE"], kw_after["BLOCK_M"], shape.head_size, 2,
                                                  capability),
            limit_bytes=limit, ok=bytes_after <= limit, role=shape.role, query_len=before["query_len"],
        ))
    # the model is exact below sm_80 and only estimated above
    model_exact = all(c.model_bytes == c.shared_bytes_patched for c in checks) if capability < (8, 0) else None
    return VerifyReport(
        ok=outcome["action"] != "refused" and all(c.ok for c in checks), arch=arch_name(capability), capability=capability,
        limit_bytes=limit, vllm_version=kernel.vllm_version, kernel_file=str(kernel.kernel_file),
        kernel_sha256=kernel.sha256, triton_version=triton.__version__, patch_action=outcome["action"],
        patch_reason=outcome["reason"], model_exact=model_exact,
        changed_launches=sum(c.tile_size != c.tile_size_unpatched for c in checks),
        compiles=compiler.compiles, seconds=round(time.monotonic() - started, 1), launches=checks,
    )
