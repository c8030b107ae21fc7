"""Lattice recovery, float rounding and int4 packing on synthetic tensors."""

from __future__ import annotations

import numpy as np
import pytest

from gemma4_t4.quant import lattice, pack


def _qat_matrix(rows=256, cols=512, seed=0, scale_dtype="fp32"):
    """Values bf16(q * s) with peaks on random levels 1..8 and scales spread over 3 decades."""
    rng = np.random.default_rng(seed)
    groups = cols // 32
    peak = rng.integers(1, 9, size=(rows, groups))
    scale = (10 ** rng.uniform(-4, -1, size=(rows, groups))).astype(np.float32)
    scale = lattice.round_to_dtype(scale, scale_dtype) if scale_dtype != "fp32" else scale
    q = rng.integers(-8, 8, size=(rows, groups, 32))
    q = np.clip(q, -peak[..., None], np.minimum(peak[..., None], 7))
    q[..., 0] = np.where(peak == 8, -8, peak)  # make each group's peak actually present
    w = lattice.round_to_dtype(q * scale[..., None].astype(np.float64), "bf16").reshape(rows, cols)
    return w, q.reshape(rows, cols).astype(np.int8), scale, peak


@pytest.mark.parametrize("use_numba", [False, True])
def test_recovers_levels_and_peaks_without_assuming_eight(use_numba):
    w, q, _scale, peak = _qat_matrix()
    fit = lattice.fit_lattice(w, use_numba=use_numba)
    assert fit.on_grid.all()
    # the coarsest lattice: levels equal to the generator's up to a common factor per group
    deq = lattice.dequantize(fit.levels, fit.scale, 32, "fp32")
    assert np.all(np.abs(deq - w) <= lattice.DEFAULT_TOL * np.repeat(fit.scale, 32, axis=1))
    assert set(np.unique(fit.peak)) >= {1, 2, 3, 5, 6, 7, 8}
    assert np.all(fit.peak <= peak)
    # absmax / 8 (the classic assumption) would move most groups with a peak below 8
    naive = np.abs(w).reshape(256, -1, 32).max(-1) / 8
    moved = np.rint(w.reshape(256, -1, 32) / naive[..., None]) * naive[..., None] != w.reshape(256, -1, 32)
    assert moved.any(axis=-1)[peak < 8].mean() > 0.5


def test_numba_and_numpy_agree_bit_for_bit():
    if lattice.numba is None:
        pytest.skip("numba is not installed (the numpy path is then the only one)")
    w, *_ = _qat_matrix(seed=3)
    w[5, 40] += 0.37 * abs(w[5, 40]) + 1e-3  # one off-grid group
    w[7, :32] = 0.0  # an all-zero group
    a = lattice.fit_lattice(w, use_numba=False)
    b = lattice.fit_lattice(w, use_numba=True)
    for field in ("levels", "scale", "peak"):
        assert np.array_equal(getattr(a, field), getattr(b, field)), field
    assert np.allclose(a.deviation, b.deviation, equal_nan=True)
    for dt in lattice.SCALE_DTYPES:
        ca = lattice.analyze(w, scale_dtypes=(dt,), use_numba=False)[1][dt]
        cb = lattice.analyze(w, scale_dtypes=(dt,), use_numba=True)[1][dt]
        assert np.array_equal(ca.scale, cb.scale) and np.array_equal(ca.exact, cb.exact)
    assert not a.on_grid[5, 1] and a.peak[7, 0] == 0 and a.on_grid.sum() == a.on_grid.size - 1


def _adversarial_matrix(group_size: int, seed: int = 7) -> np.ndarray:
    """On-grid rows with every corner the kernels special-case, plus off-grid and non-finite groups."""
    w, *_ = _qat_matrix(rows=64, cols=8 * group_size, seed=seed)
    rng = np.random.default_rng(seed)
    gs = group_size

    def group(r, g, levels, scale):
        lv = np.resize(np.asarray(levels, np.float64), gs)
        w[r, g * gs:(g + 1) * gs] = lattice.round_to_dtype(lv * scale, "bf16")

    group(0, 0, [7, -7, 0, 7], 0.013)  # odd common factor 7: coarsest lattice is +-1
    group(0, 1, [6, -3, 0, 3], 0.021)  # factor 3 with odd levels
    group(0, 2, [8, -4, 2, 0, -6], 0.002)  # even levels, peak 8: factor 2
    group(0, 3, [7, -3, 1, 0], 0.05)  # positive peak at +7: k = 8 would put it on +8 (out of range)
    group(1, 0, [-8, 7, 1, -1], 3e-7)  # fp16-subnormal scales
    group(1, 1, [-8, 7, 3, 2], 1e-9)  # below fp16's smallest subnormal: scale underflows to 0
    group(1, 2, [-8, 7, 5], 9000.0)  # q * s beyond fp16's max: no fp16 scale reproduces it
    group(1, 3, [0], 1.0)
    w[1, 3 * gs + 1] = -0.0  # negative zero in an all-zero group
    w[2, 0] = np.nan
    w[2, gs + 3] = np.inf
    w[3, :gs] = lattice.round_to_dtype(rng.normal(0, 0.02, gs), "bf16")  # off grid
    w[4, gs + 5] *= 1.19  # one value nudged off its level
    return lattice.round_to_dtype(w, "bf16")  # a bf16 checkpoint's values


@pytest.mark.parametrize("group_size", [32, 64, 128, 256])
def test_kernels_match_the_numpy_reference_bit_for_bit(group_size):
    """The numba kernels (fed float32 or raw bf16 bits) equal the numpy reference on every field."""
    if lattice.numba is None:
        pytest.skip("numba is not installed (the numpy path is then the only one)")
    w = _adversarial_matrix(group_size)
    bits = lattice.f32_to_bf16_bits(w)
    ref_fit, ref = lattice.analyze(w, group_size, scale_dtypes=lattice.SCALE_DTYPES, use_numba=False)
    assert {1, -1, 0} <= set(np.unique(ref_fit.peak))  # the corners are really there
    assert ref_fit.peak[0, 0] == 1 and ref_fit.peak[0, 1] == 2 and ref_fit.peak[0, 2] == 4 and ref_fit.peak[0, 3] == 7
    for block in (w, bits):
        fit, got = lattice.analyze(block, group_size, scale_dtypes=lattice.SCALE_DTYPES, use_numba=True)
        for field in ("levels", "scale", "peak", "deviation"):
            assert np.array_equal(getattr(fit, field), getattr(ref_fit, field)), field
        for dt in lattice.SCALE_DTYPES:
            assert np.array_equal(got[dt].scale, ref[dt].scale), dt
            assert np.array_equal(got[dt].exact, ref[dt].exact), dt
            # the separate entry point gives the same choice
            alone = lattice.choose_scale(block, fit, dt)
            assert np.array_equal(alone.scale, ref[dt].scale) and np.array_equal(alone.exact, ref[dt].exact)
    assert np.isinf(ref["fp16"].scale[1, 2]) or ref["fp16"].exact[1, 2] < group_size


@pytest.mark.parametrize("use_numba", [False, True])
def test_requantizing_chooses_anew_only_the_off_grid_groups_and_equals_a_full_choice(use_numba):
    w = _adversarial_matrix(64)
    w[~np.isfinite(w)] = 0.0  # a repack refuses NaN/Inf before it requantizes
    fit, choices = lattice.analyze(w, 64, scale_dtypes=lattice.SCALE_DTYPES, use_numba=use_numba)
    assert lattice.requantize_off_grid(w, fit, choices) > 0 and fit.on_grid.all()
    for dt in lattice.SCALE_DTYPES:
        full = lattice.choose_scale(w, fit, dt)
        assert np.array_equal(choices[dt].scale, full.scale) and np.array_equal(choices[dt].exact, full.exact)


@pytest.mark.parametrize("group_size", [32, 4096])
def test_kernel_least_squares_scale_is_numpys_for_float32_values_half_a_level_off(group_size):
    """The kernel sums q*w in order, numpy pairwise: equal because the float64 sum is exact, even for
    float32 values (24-bit mantissas) up to ~half a level off their lattice and very long groups."""
    if lattice.numba is None:
        pytest.skip("numba is not installed")
    rng = np.random.default_rng(0)
    rows, groups = 16, 4
    scale = 10 ** rng.uniform(-30, 3, size=(rows, groups, 1))
    q = rng.integers(-8, 8, size=(rows, groups, group_size)).astype(np.float64)
    q[..., 0] = -8
    noise = rng.uniform(-0.45, 0.45, size=q.shape) * (q != -8)
    w = ((q + noise) * scale).astype(np.float32).reshape(rows, -1)
    ref = lattice.fit_lattice(w, group_size, tol=0.49, use_numba=False)
    got = lattice.fit_lattice(w, group_size, tol=0.49, use_numba=True)
    assert ref.on_grid.all()
    assert np.array_equal(got.scale, ref.scale) and np.array_equal(got.levels, ref.levels)


def test_the_kernels_are_the_default_only_for_tensors_big_enough_to_repay_their_compile():
    if lattice.numba is None:
        assert not lattice.numba_enabled(True, 8) and not lattice.numba_enabled(None, 1 << 30)
        return
    big = lattice.NUMBA_MIN_VALUES
    assert lattice.numba_enabled(None, big) and lattice.numba_enabled(None, 4 * big)
    assert not lattice.numba_enabled(None, big - 1) and not lattice.numba_enabled(None, 65_536)  # a tiny model's
    assert lattice.numba_enabled(True, 8) and not lattice.numba_enabled(False, 4 * big)  # a flag wins
    assert 65_536 < big <= 2048 * 2048  # a tiny model's largest tensor stays on numpy; a real layer's does not


def test_tolerance_matters_for_bf16_rounding():
    w, *_ = _qat_matrix(seed=1)
    assert lattice.fit_lattice(w, tol=0.05).on_grid.all()
    assert lattice.fit_lattice(w, tol=1e-4).on_grid.mean() < 0.9


def test_off_grid_groups_are_reported_with_their_deviation():
    rng = np.random.default_rng(2)
    w = lattice.round_to_dtype(rng.normal(0, 0.05, size=(64, 256)), "bf16")
    fit = lattice.fit_lattice(w)
    assert fit.on_grid.mean() < 0.05
    assert np.all(fit.deviation[~fit.on_grid] > 0.05)
    w[0, 0] = np.nan
    assert lattice.fit_lattice(w).peak[0, 0] == -1


def test_bf16_scale_source_is_reproduced_exactly_and_fp16_scales_keep_more_values():
    w, *_ = _qat_matrix(seed=4, scale_dtype="bf16")
    fit = lattice.fit_lattice(w)
    assert (lattice.choose_scale(w, fit, "bf16").exact == 32).all()
    w2, *_ = _qat_matrix(seed=5)  # full-precision scales, like real QAT exports
    fit2 = lattice.fit_lattice(w2)
    fp16 = lattice.choose_scale(w2, fit2, "fp16").exact.sum()
    bf16 = lattice.choose_scale(w2, fit2, "bf16").exact.sum()
    assert fp16 > bf16 and fp16 > 0.97 * w2.size


def test_rounding_helpers_match_torch():
    import torch

    x = np.concatenate([np.random.default_rng(0).normal(0, 1, 10000), [1 + 2**-8, 1 + 3 * 2**-8, 2**-20, 70000.0]])
    x32 = x.astype(np.float32)
    assert np.array_equal(lattice.round_to_dtype(x32, "bf16"), torch.from_numpy(x32).bfloat16().float().numpy())
    assert np.array_equal(lattice.round_to_dtype(x32, "fp16"), torch.from_numpy(x32).half().float().numpy())


def test_packing_is_bit_exact_with_compressed_tensors():
    import torch
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32, unpack_from_int32

    levels = np.random.default_rng(0).integers(-8, 8, size=(33, 256)).astype(np.int8)
    ref = pack_to_int32(torch.from_numpy(levels), 4).numpy()
    for use_numba in (False, True):
        assert np.array_equal(pack.pack_int4(levels, use_numba=use_numba), ref)
    assert np.array_equal(pack.unpack_int4(ref, 256), levels)
    assert np.array_equal(unpack_from_int32(torch.from_numpy(ref), 4, torch.Size([33, 256])).numpy(), levels)
    zp = levels[:, :5]
    assert np.array_equal(pack.pack_int4_dim0(zp), pack_to_int32(torch.from_numpy(zp.copy()), 4, packed_dim=0).numpy())
    assert np.array_equal(pack.unpack_int4_dim0(pack.pack_int4_dim0(zp), 33), zp)


@pytest.mark.parametrize("use_numba", [False, True])
def test_a_scale_dtype_outside_fp16_and_bf16_is_refused_by_name_on_either_path(use_numba):
    """Before, the numba path failed with a bare KeyError and the numpy one computed scales in a dtype
    no checkpoint stores."""
    block = np.zeros((2, 64), dtype=np.float32)
    with pytest.raises(ValueError, match=r"scale dtype must be one of \('fp16', 'bf16'\), got 'fp32'"):
        lattice.analyze(block, 32, lattice.DEFAULT_TOL, ("fp32",), use_numba=use_numba)
