"""The shared-memory model and the tile choice (pure arithmetic; the compiles are in test_turing_verify)."""

import pytest

from gemma4_t4.turing.smem import (
    MIN_TILE,
    OPTIN_SMEM_BY_CAPABILITY,
    attention_smem_bytes,
    fitting_tile,
    launcher_block_m,
    needs_fix,
)

T4_LIMIT = 65_536


@pytest.mark.parametrize(("tile", "block_m", "head", "expected"), [
    (32, 16, 512, 98_304),  # the T4 failure: "Required: 98304, Hardware limit: 65536"
    (16, 16, 512, 65_536),  # the fix: exactly the limit (the load check is "need > limit")
    (32, 16, 256, 49_152),
    (16, 16, 256, 32_768),
    (32, 32, 512, 131_072),
    (64, 16, 512, 163_840),
    (16, 16, 400, 65_536),  # padded to 512
])
def test_sm75_model_matches_measured_compiles(tile, block_m, head, expected):
    assert attention_smem_bytes(tile, block_m, head, 2, (7, 5)) == expected


def test_sm75_need_does_not_depend_on_element_size():
    # fp32 compiles need the same bytes as fp16 on sm_75 (the FMA dot stages operands as fp32)
    assert attention_smem_bytes(32, 16, 512, 4, (7, 5)) == attention_smem_bytes(32, 16, 512, 2, (7, 5))


def test_ampere_estimate_bounds_measured_compiles():
    assert 49_792 <= attention_smem_bytes(16, 16, 512, 2, (8, 0)) < 52_000
    assert 83_200 <= attention_smem_bytes(32, 16, 512, 2, (8, 6)) < 86_000


def test_fitting_tile():
    assert fitting_tile(32, 16, 512, 2, T4_LIMIT, (7, 5)) == 16
    assert fitting_tile(32, 16, 256, 2, T4_LIMIT, (7, 5)) == 32  # fits: unchanged
    assert fitting_tile(16, 16, 512, 2, T4_LIMIT, (7, 5)) == 16
    assert fitting_tile(64, 16, 512, 2, T4_LIMIT, (7, 5)) == 16
    assert fitting_tile(32, 16, 512, 2, 232_448, (9, 0)) == 32
    # more than 16 query heads per KV head at head 512: nothing fits on a T4; the minimum is returned
    assert fitting_tile(32, 32, 512, 2, T4_LIMIT, (7, 5)) == MIN_TILE
    assert attention_smem_bytes(MIN_TILE, 32, 512, 2, (7, 5)) > T4_LIMIT


def test_needs_fix_follows_the_limit_not_the_gpu_name():
    assert needs_fix(OPTIN_SMEM_BY_CAPABILITY[(7, 5)], (7, 5))
    assert not needs_fix(OPTIN_SMEM_BY_CAPABILITY[(8, 9)], (8, 9))  # L4
    assert not needs_fix(OPTIN_SMEM_BY_CAPABILITY[(8, 0)], (8, 0))
    assert not needs_fix(OPTIN_SMEM_BY_CAPABILITY[(9, 0)], (9, 0))
    assert not needs_fix(OPTIN_SMEM_BY_CAPABILITY[(7, 0)], (7, 0))  # V100: 96 KiB holds 98,304 B exactly
    assert needs_fix(48 * 1024, (6, 1))
    assert not needs_fix(T4_LIMIT, (7, 5), head_size=256)


def test_launcher_block_m():
    assert [launcher_block_m(n) for n in (1, 2, 8, 16, 17, 32, 33)] == [16, 16, 16, 16, 32, 32, 64]


# Query heads per KV head of every Gemma 4 layer (models.VARIANTS): E2B 8/1, E4B 8/2, 12B 16/8 and 16/1,
# 26B-A4B 16/8 and 16/2, 31B 32/16 and 32/4. An assistant's Q-only layers read the target's KV heads.
GEMMA4_QUERIES_PER_KV = (8, 4, 2, 16, 1)


@pytest.mark.parametrize("queries_per_kv", GEMMA4_QUERIES_PER_KV)
def test_verification_step_needs_what_prefill_needs(queries_per_kv):
    # N+1 query tokens per sequence take vLLM's 2D path: BLOCK_M from the query heads per KV head (not
    # from N), BLOCK_Q = BLOCK_M // queries_per_kv query tokens per program, TILE_SIZE_PREFILL (32)
    block_m = launcher_block_m(queries_per_kv)
    assert block_m == 16 and block_m // queries_per_kv == 16 // queries_per_kv
    assert attention_smem_bytes(32, block_m, 512, 2, (7, 5)) == 98_304  # unpatched: over the T4's limit
    assert fitting_tile(32, block_m, 512, 2, T4_LIMIT, (7, 5)) == 16
    assert attention_smem_bytes(16, block_m, 512, 2, (7, 5)) == T4_LIMIT  # capped: fits exactly
    assert fitting_tile(32, block_m, 256, 2, T4_LIMIT, (7, 5)) == 32  # head 256: 49,152 B, unchanged


def test_an_assistant_over_16_queries_per_kv_head_cannot_fit_a_t4_at_head_512():
    # 16 query heads per KV head is the last count with BLOCK_M 16; one more doubles BLOCK_M
    assert launcher_block_m(16) == 16 and launcher_block_m(17) == 32
    assert fitting_tile(32, launcher_block_m(17), 512, 2, T4_LIMIT, (7, 5)) == MIN_TILE
    assert attention_smem_bytes(MIN_TILE, launcher_block_m(17), 512, 2, (7, 5)) == 98_304
