"""Shared memory needed by vLLM's unified-attention kernel, and the tile that fits a limit: the one
model, used by the tile cap (plugin and file patch) and checked against real compiles by ``gemma4-t4
turing verify``. Standard library only: the file patch embeds this text into vLLM's kernel module."""

# Largest shared memory a block may opt in to, by compute capability (CUDA programming guide,
# "Technical Specifications"). Used only to predict the limit without creating a CUDA context;
# the tile cap itself reads the device's real ``shared_memory_per_block_optin``.
OPTIN_SMEM_BY_CAPABILITY = {
    (7, 0): 98_304, (7, 2): 98_304, (7, 5): 65_536,  # sm_75: T4, RTX 20xx, Quadro RTX
    (8, 0): 166_912, (8, 6): 101_376, (8, 7): 166_912, (8, 9): 101_376,  # sm_89: L4, RTX 40xx
    (9, 0): 232_448, (10, 0): 232_448, (12, 0): 101_376,
}

MIN_TILE = 16  # tl.dot needs K >= 16: TILE 8 does not compile
DEFAULT_TILE = 32  # the largest tile vLLM's _get_tile_size picks for fp16 outside sm_100
GEMMA4_MAX_HEAD = 512  # Gemma 4 global-attention layers
GEMMA4_BLOCK_M = 16  # every Gemma 4 size has <= 16 query heads per KV head
AMPERE_ESTIMATE_MARGIN = 1.02  # sm_80/86/89 compiles need up to 1.6% more than the plain count


def next_power_of_2(n):
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def head_size_padded(head_size):
    """HEAD_SIZE_PADDED as vLLM's launcher computes it."""
    return next_power_of_2(head_size)


def launcher_block_m(num_queries_per_kv):
    """BLOCK_M as vLLM's launcher computes it (inline, outside sm_100's tuned branch)."""
    return 16 if num_queries_per_kv <= 16 else next_power_of_2(num_queries_per_kv)


def attention_smem_bytes(tile, block_m, head_size, element_size=2, capability=(7, 5)):
    """Bytes of shared memory one kernel_unified_attention program needs.

    Below sm_80 Triton lowers ``tl.dot`` to FP32 FMAs and stages the Q block and K/V tile as fp32:
    (TILE + BLOCK_M) * HEAD_SIZE_PADDED * 4 bytes whatever the input type, num_warps or num_stages.
    From sm_80 tensor-core layouts and pipelining make it an estimate, (BLOCK_M + 2*TILE) * HSP *
    element bytes + 2%: it bounds the head-512 compiles (49,792 / 83,200 B at TILE 16 / 32) but
    undercounts head 256 (58,624 B at TILE 32 on sm_80); those GPUs allow >= 99 KiB, which every
    Gemma 4 launch fits (``gemma4-t4 turing verify --arch sm_80`` shows the compiled bytes).
    """
    hsp = head_size_padded(head_size)
    if tuple(capability) < (8, 0):
        return 4 * (tile + block_m) * hsp
    return int((block_m + 2 * tile) * hsp * element_size * AMPERE_ESTIMATE_MARGIN + 0.999)


def fitting_tile(tile, block_m, head_size, element_size, limit, capability):
    """The largest power-of-two tile <= ``tile`` whose launch fits ``limit`` (MIN_TILE when nothing
    fits: the launch fails whatever the tile, and the caller reports that)."""
    chosen = tile
    while chosen > MIN_TILE and attention_smem_bytes(chosen, block_m, head_size, element_size, capability) > limit:
        chosen //= 2
    return max(chosen, min(tile, MIN_TILE))


def needs_fix(
    smem_limit, capability=(7, 5), head_size=GEMMA4_MAX_HEAD, element_size=2, block_m=GEMMA4_BLOCK_M,
    tile=DEFAULT_TILE,
):
    """True when vLLM's default tile for this head size overflows ``smem_limit`` (with the defaults:
    a Gemma 4 head-512 fp16 launch at TILE 32, which needs 98,304 B; a T4 allows 65,536 B)."""

    return attention_smem_bytes(tile, block_m, head_size, element_size, capability) > smem_limit
