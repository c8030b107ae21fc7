"""Behaviour of the shared-memory model (turing/smem.py) and the tile cap (turing/tilecap.py) that the
mutation run (``make mutation``, docs/testing.md) showed no other fast test pinned down: exact
boundaries, rounding, defaults and the arguments each call passes on. Pure Python, no GPU."""

import math

import pytest

from gemma4_t4.turing.smem import (
    AMPERE_ESTIMATE_MARGIN,
    MIN_TILE,
    attention_smem_bytes,
    fitting_tile,
    head_size_padded,
    launcher_block_m,
    needs_fix,
    next_power_of_2,
)

T4_LIMIT = 65_536
# between the sm_80 estimate (83,559 B) and the sm_75 count (98,304 B) of a head-512 TILE-32 launch:
# only the capability's own model decides whether that launch fits
BETWEEN_MODELS = 90_000


# -- smem.py ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("n", "expected"), [
    (0, 1), (1, 1), (2, 2), (3, 4), (4, 4), (5, 8), (16, 16), (17, 32), (256, 256), (400, 512), (512, 512),
])
def test_next_power_of_2_is_the_smallest_power_of_two_not_below_n(n, expected):
    assert next_power_of_2(n) == expected


def test_small_head_sizes_pad_to_their_own_power_of_two():
    assert [head_size_padded(h) for h in (1, 2, 3, 64, 80)] == [1, 2, 4, 64, 128]


def test_launcher_block_m_is_16_up_to_16_queries_then_the_next_power_of_two():
    assert [launcher_block_m(q) for q in (1, 8, 16, 17, 24, 32, 33)] == [16, 16, 16, 32, 32, 32, 64]


def test_ampere_estimate_rounds_up_to_whole_bytes():
    # (16 + 2*32) * 512 * 2 B = 81,920 B, plus the 2% margin = 83,558.4 B: the estimate never undercounts
    plain = (16 + 2 * 32) * 512 * 2
    assert attention_smem_bytes(32, 16, 512, 2, (8, 0)) == math.ceil(plain * AMPERE_ESTIMATE_MARGIN) == 83_559
    assert attention_smem_bytes(16, 16, 256, 2, (8, 9)) == math.ceil((16 + 32) * 256 * 2 * AMPERE_ESTIMATE_MARGIN)


def test_default_element_size_is_fp16():
    # sm_75 ignores the element size, so the default shows only from sm_80 on
    assert attention_smem_bytes(32, 16, 512, capability=(8, 0)) == attention_smem_bytes(32, 16, 512, 2, (8, 0))
    assert attention_smem_bytes(32, 16, 512, capability=(8, 0)) < attention_smem_bytes(32, 16, 512, 4, (8, 0))


def test_default_capability_is_the_t4():
    assert attention_smem_bytes(32, 16, 512) == attention_smem_bytes(32, 16, 512, 2, (7, 5)) == 98_304


def test_fitting_tile_uses_the_capability_and_element_size_it_is_given():
    assert fitting_tile(32, 16, 512, 2, BETWEEN_MODELS, (8, 0)) == 32  # sm_80 estimate: 83,559 B fits
    assert fitting_tile(32, 16, 512, 2, BETWEEN_MODELS, (7, 5)) == 16  # sm_75 count: 98,304 B does not
    assert fitting_tile(32, 16, 512, 4, BETWEEN_MODELS, (8, 0)) == 16  # fp32 on sm_80: 167,117 B does not


def test_a_launch_needing_exactly_the_limit_keeps_its_tile():
    # the driver refuses only need > limit: head 256 at TILE 32 needs exactly 49,152 B on sm_75
    assert attention_smem_bytes(32, 16, 256, 2, (7, 5)) == 49_152
    assert fitting_tile(32, 16, 256, 2, 49_152, (7, 5)) == 32
    assert fitting_tile(32, 16, 256, 2, 49_151, (7, 5)) == 16


def test_fitting_tile_halves_to_the_largest_power_of_two_that_fits():
    # head 256 on a T4: TILE 64 needs 81,920 B (over), TILE 32 needs 49,152 B (fits)
    chosen = fitting_tile(64, 16, 256, 2, T4_LIMIT, (7, 5))
    assert chosen == 32
    assert isinstance(chosen, int)  # the tile is a Triton constexpr: an int, never 32.0
    assert fitting_tile(128, 16, 128, 2, 40_000, (7, 5)) == 32  # 147,456 -> 79,872 -> 45,056 -> 24,576 B
    assert isinstance(fitting_tile(128, 16, 128, 2, 40_000, (7, 5)), int)


def test_a_tile_already_below_the_minimum_is_kept():
    assert fitting_tile(8, 16, 64, 2, T4_LIMIT, (7, 5)) == 8
    assert fitting_tile(MIN_TILE, 16, 512, 2, 1_000, (7, 5)) == MIN_TILE  # nothing fits: the minimum


def test_needs_fix_uses_the_capability_and_element_size_it_is_given():
    assert not needs_fix(BETWEEN_MODELS, (8, 0))  # sm_80 estimate 83,559 B fits
    assert needs_fix(BETWEEN_MODELS, (7, 5))  # sm_75 count 98,304 B does not
    assert needs_fix(BETWEEN_MODELS, (8, 0), element_size=4)
    assert not needs_fix(98_304, (7, 5))  # exactly the need: fits
    assert needs_fix(98_303, (7, 5))
