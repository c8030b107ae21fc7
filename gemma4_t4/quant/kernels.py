"""numba kernels for lattice.py: one fused pass per block of rows, bit-identical to the numpy
reference there (tests/quant/test_quant_lattice.py checks it).

Why it is fast: every inner loop runs over one group of ``group_size`` values with 32-bit
lanes and no early exit, so LLVM vectorises it. numba widens 32-bit integer arithmetic to
64 bits (halving the SIMD width), so the bit tricks (bf16 widening, |x| as bits, round to
fp16 / bf16) are small LLVM intrinsics that stay 32-bit. Rows are split across all cores.

Inputs are either raw bf16 bit patterns (uint16, read straight from the checkpoint) or
float32 values; levels/scales/peaks/deviations follow :class:`gemma4_t4.quant.lattice.LatticeFit`.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic, overload

FP16, BF16 = 0, 1
FORMAT_CODES = {"fp16": FP16, "bf16": BF16}
_PEAK_TRIALS = (8, 7, 6, 5, 4, 3, 2, 1)  # as lattice._PEAK_TRIALS
_SCALE_STEPS = (0, 1, -1, 2, -2)  # ulps around the rounded least-squares scale, as the reference
_FP16_MIN_NORMAL = 6.103515625e-05
_FP16_MIN_SUB = 5.960464477539063e-08

_I32, _F32 = ir.IntType(32), ir.FloatType()


def _i32(v: int) -> ir.Constant:
    return ir.Constant(_I32, v)


# -- 32-bit bit tricks as LLVM intrinsics ----------------------------------------------------------


def _intrinsic(name: str, signature, emit):
    """A numba-callable LLVM snippet of one or two arguments: ``emit(builder, *args)`` returns its
    value (numba's ``@intrinsic`` takes no ``*args``, so each arity has its typer)."""
    if len(signature.args) == 1:
        def typer(typingctx, x):
            return signature, lambda context, builder, sig, args: emit(builder, *args)
    else:
        def typer(typingctx, x, y):
            return signature, lambda context, builder, sig, args: emit(builder, *args)
    typer.__name__ = typer.__qualname__ = name
    return intrinsic(typer)


u32, i32, f32 = types.uint32, types.int32, types.float32
_f32_bits = _intrinsic("_f32_bits", u32(f32), lambda b, x: b.bitcast(x, _I32))
_bits_f32 = _intrinsic("_bits_f32", f32(u32), lambda b, u: b.bitcast(u, _F32))
# |x| as uint32 bits: ordered like |x| (NaN above inf), so max() needs no float compare
_abs_bits = _intrinsic("_abs_bits", u32(f32), lambda b, x: b.and_(b.bitcast(x, _I32), _i32(0x7FFFFFFF)))
# x's bits as int32: ordered like x over the positive floats
_signed_bits = _intrinsic("_signed_bits", i32(f32), lambda b, x: b.bitcast(x, _I32))
_bf16_to_f32 = _intrinsic("_bf16_to_f32", f32(types.uint16), lambda b, h: b.bitcast(b.shl(b.zext(h, _I32), _i32(16)), _F32))
# a float32 holding a small non-negative integer, as uint32
_small_uint = _intrinsic("_small_uint", u32(f32), lambda b, x: b.fptoui(x, _I32))
_u32_add = _intrinsic("_u32_add", u32(u32, u32), lambda b, x, y: b.add(x, y))
_u32_or = _intrinsic("_u32_or", u32(u32, u32), lambda b, x, y: b.or_(x, y))
# 1 if the float32 values are equal (0.0 == -0.0, as the reference's ==), else 0
_equal = _intrinsic("_equal", u32(f32, f32), lambda b, x, y: b.zext(b.fcmp_ordered("==", x, y), _I32))


def _bf16_ir(builder, u):
    odd = builder.and_(builder.lshr(u, _i32(16)), _i32(1))
    return builder.and_(builder.add(builder.add(u, _i32(0x7FFF)), odd), _i32(0xFFFF0000))


def _fp16_ir(builder, x):
    u = builder.bitcast(x, _I32)
    odd = builder.and_(builder.lshr(u, _i32(13)), _i32(1))
    normal = builder.and_(builder.add(builder.add(u, _i32(0xFFF)), odd), _i32(0xFFFFE000))
    inf = builder.or_(builder.and_(u, _i32(0x80000000)), _i32(0x7F800000))
    overflow = builder.icmp_unsigned(">", builder.and_(normal, _i32(0x7FFFFFFF)), _i32(0x477FE000))  # > 65504
    normal = builder.select(overflow, inf, normal)
    # below 2**-14 fp16 is subnormal: a fixed ulp of 2**-24 (scaling by powers of two is exact)
    rint = builder.module.declare_intrinsic("llvm.rint", [_F32])
    sub = builder.fmul(builder.call(rint, [builder.fmul(x, ir.Constant(_F32, 16777216.0))]),
                       ir.Constant(_F32, _FP16_MIN_SUB))
    tiny = builder.icmp_unsigned("<", builder.and_(u, _i32(0x7FFFFFFF)), _i32(0x38800000))
    return builder.select(tiny, builder.bitcast(sub, _I32), normal)


# round to nearest, ties to even, returned as float32: bf16 (finite or inf input); fp16 with
# subnormals and overflow to inf; fp16 then bf16 (what a bf16 model loads from an fp16-scaled weight)
_round_bf16 = _intrinsic("_round_bf16", f32(f32), lambda b, x: b.bitcast(_bf16_ir(b, b.bitcast(x, _I32)), _F32))
_round_fp16 = _intrinsic("_round_fp16", f32(f32), lambda b, x: b.bitcast(_fp16_ir(b, x), _F32))
_round_fp16_bf16 = _intrinsic("_round_fp16_bf16", f32(f32), lambda b, x: b.bitcast(_bf16_ir(b, _fp16_ir(b, x)), _F32))


def _widen(x):  # pragma: no cover - replaced by the overload inside kernels
    raise NotImplementedError


@overload(_widen, inline="always")
def _widen_impl(x):
    if isinstance(x, types.Integer):  # a bf16 bit pattern
        return lambda x: _bf16_to_f32(x)
    return lambda x: np.float32(x)


# -- per-group helpers -----------------------------------------------------------------------------


# the per-group helpers' compile options: each is compiled into the kernel that calls it (and cached)
_inlined = numba.njit(cache=True, nogil=True, inline="always")
# the row-parallel kernels' options (each row's groups are independent)
_row_parallel = numba.njit(cache=True, nogil=True, parallel=True)


@numba.njit(cache=True, nogil=True)
def step_scale(c, fmt, steps):
    """The positive value representable in ``fmt`` that is ``steps`` ulps from representable c >= 0."""
    y = c
    for _ in range(abs(steps)):
        if fmt == FP16 and (y < _FP16_MIN_NORMAL or (steps < 0 and y == _FP16_MIN_NORMAL)):
            y = np.float32(y + (_FP16_MIN_SUB if steps > 0 else -_FP16_MIN_SUB))
        else:
            u = _f32_bits(y)
            inc = np.uint32(1 << 13) if fmt == FP16 else np.uint32(1 << 16)
            y = _bits_f32(u + inc if steps > 0 else u - inc)
        if y <= 0.0:
            y = np.float32(_FP16_MIN_SUB) if fmt == FP16 else _bits_f32(np.uint32(1 << 16))
    return y


@_inlined
def _count_exact(qf, vals, gs, cand, fmt):
    """How many round_bf16(round_fmt(q * cand)) equal the source values, as a bf16 model loads them
    (q * cand is exact in float32); one loop per format, so each vectorises."""
    n = np.uint32(0)
    if fmt == FP16:
        for j in range(gs):
            n = _u32_add(n, _equal(_round_fp16_bf16(qf[j] * cand), vals[j]))
    else:
        for j in range(gs):
            n = _u32_add(n, _equal(_round_bf16(qf[j] * cand), vals[j]))
    return n


@_inlined
def _choose_group(qf, vals, gs, lsq, fmt):
    """(scale in fmt, values reproduced exactly): the rounded least-squares scale or the best of
    its +-2 ulp neighbours, first one wins ties."""
    c0 = _round_fp16(lsq) if fmt == FP16 else _round_bf16(lsq)
    if c0 <= 0.0:
        c0 = step_scale(np.float32(0.0), fmt, 1)  # underflow: the smallest positive scale
    best = c0
    best_n = np.uint32(0)
    first = True
    for t in _SCALE_STEPS:
        cand = c0 if t == 0 else step_scale(c0, fmt, t)
        n = _count_exact(qf, vals, gs, cand, fmt)
        if first or n > best_n:
            best, best_n, first = cand, n, False
        if best_n == gs:
            break
    return best, best_n


# -- kernels ---------------------------------------------------------------------------------------


@_inlined
def _mark_off_grid(levels, lsq, peak, deviation, scales, exact, r, g, base, gs, nd, dev):
    """A group with no lattice (off grid, or holding inf/nan): zero levels, no scale, ``dev``."""
    for j in range(gs):
        levels[r, base + j] = 0
    lsq[r, g] = 1.0
    peak[r, g] = -1
    deviation[r, g] = dev
    for d in range(nd):
        scales[d, r, g] = 1.0
        exact[d, r, g] = -1


@_inlined
def _find_peak(unit, qf, gs, tol, over8):
    """The first peak level k in _PEAK_TRIALS whose lattice holds every value within ``tol`` (0: none),
    with its worst rounding distance (as bits) and the OR of its levels; the levels land in ``qf``."""
    chosen = 0
    worst = np.uint32(0)
    odd = np.uint32(0)
    for k in _PEAK_TRIALS:
        if k == 8 and over8:
            continue
        kf = np.float32(k)
        # most wrong peaks already fail on the first value: skip their full pass
        r0 = unit[0] * kf
        if abs(r0 - np.rint(r0)) > tol:
            continue
        worst = np.uint32(0)
        odd = np.uint32(0)
        for j in range(gs):  # the levels come out of the same pass (kept if k fits)
            rr = unit[j] * kf
            q = np.rint(rr)
            qf[j] = q
            worst = max(worst, _abs_bits(rr - q))
            odd = _u32_or(odd, _small_uint(abs(q)))
        if _bits_f32(worst) <= tol:
            chosen = k
            break
    return chosen, worst, odd


@_inlined
def _best_deviation(unit, gs, over8):
    """An off-grid group's smallest worst rounding distance (as bits) over the in-range peaks."""
    best = np.uint32(0x7F800000)
    for k in _PEAK_TRIALS:
        if k == 8 and over8:
            continue
        kf = np.float32(k)
        worst = np.uint32(0)
        for j in range(gs):
            rr = unit[j] * kf
            worst = max(worst, _abs_bits(rr - np.rint(rr)))
        best = min(best, worst)
    return best


@_inlined
def _coarsest_divisor(qf, gs, chosen, odd):
    """Coarsest lattice: the levels' gcd, a divisor of the peak ``chosen`` (the peak is a level);
    even divisors are skipped at once when some level is odd."""
    for d in range(chosen, 1, -1):
        if chosen % d == 0 and (d % 2 == 1 or (odd & 1) == 0):
            dv = np.float32(d)
            rest = np.uint32(0)  # division of small integers is exact when d divides
            for j in range(gs):
                x = qf[j] / dv
                rest = _u32_or(rest, _abs_bits(x - np.rint(x)))
            if rest == 0:
                return d
    return 1


@_inlined
def _store_levels_lsq(levels, r, base, qf, vals, gs):
    """Store a group's levels ``qf`` in row ``r`` of ``levels`` and return its least-squares scale
    sum(q*w) / sum(q^2).

    sum(q*w) is exact in float64 whatever the order, so a plain loop gives numpy's pairwise sum bit
    for bit: each product has at most 27 significant bits (a float32 times a level of at most 8), the
    non-zero ones lie within 2**7 of each other (every w with q != 0 is within half a level of q*s,
    the largest is 8*s), and a group has at most 2**15 of them: 27 + 7 + 15 bits fit float64's 53.
    """
    qq = np.uint32(0)  # sum of q^2 in integers: exact, and vectorises (a float sum would not)
    qw = 0.0
    for j in range(gs):
        levels[r, base + j] = np.int8(qf[j])
        qw += np.float64(qf[j]) * np.float64(vals[j])
        qq = _u32_add(qq, _small_uint(qf[j] * qf[j]))
    return np.float32(qw / np.float64(qq))


@_row_parallel
def analyze_kernel(w, gs, tol, fmts, nd, levels, lsq, peak, deviation, scales, exact):
    """Lattice fit of every group plus, for the first ``nd`` scale formats in ``fmts``, the chosen
    scale and its exact-value count. ``tol`` is float32 (the reference compares in float32).
    ``fmts``, ``scales`` and ``exact`` keep at least one entry (zero-length ones crash parfors)."""
    rows, cols = w.shape
    ng = cols // gs
    for r in numba.prange(rows):
        vals = np.empty(gs, np.float32)
        unit = np.empty(gs, np.float32)
        qf = np.empty(gs, np.float32)
        for g in range(ng):
            base = g * gs
            amax_bits = np.uint32(0)
            top_bits = np.int32(0)
            for j in range(gs):
                x = _widen(w[r, base + j])
                vals[j] = x
                amax_bits = max(amax_bits, _abs_bits(x))
                top_bits = max(top_bits, _signed_bits(x))
            if amax_bits >= np.uint32(0x7F800000):  # inf or nan: off grid, nothing to fit
                _mark_off_grid(levels, lsq, peak, deviation, scales, exact, r, g, base, gs, nd, math.inf)
                continue
            if amax_bits == 0:  # all zero: on grid, any scale
                for j in range(gs):
                    levels[r, base + j] = 0
                    qf[j] = 0.0
                s = np.float32(1.0)
                peak[r, g] = 0
                deviation[r, g] = 0.0
            else:
                absmax = _bits_f32(amax_bits)
                for j in range(gs):
                    unit[j] = vals[j] / absmax
                # at k = 8 the positive peak must stay below 7.5 (levels stop at +7)
                over8 = top_bits > 0 and np.rint(np.float32(_bits_f32(np.uint32(top_bits)) / absmax)
                                                 * np.float32(8.0)) > 7.0
                chosen, worst, odd = _find_peak(unit, qf, gs, tol, over8)
                if chosen == 0:  # off grid: report the deviation at the best in-range peak
                    _mark_off_grid(levels, lsq, peak, deviation, scales, exact, r, g, base, gs, nd,
                                   _bits_f32(_best_deviation(unit, gs, over8)))
                    continue
                div = _coarsest_divisor(qf, gs, chosen, odd)
                if div > 1:
                    dv = np.float32(div)
                    for j in range(gs):
                        qf[j] = qf[j] / dv  # exact
                s = _store_levels_lsq(levels, r, base, qf, vals, gs)
                peak[r, g] = chosen // div
                deviation[r, g] = _bits_f32(worst) / np.float32(div)  # in levels of the coarsest lattice
            lsq[r, g] = s
            for d in range(nd):
                c, n = _choose_group(qf, vals, gs, s, fmts[d])
                scales[d, r, g] = c
                exact[d, r, g] = n


@_row_parallel
def pack_kernel(levels, out):
    """int8 levels -> little-endian biased nibbles in uint32 words (see pack.py)."""
    rows, cols = levels.shape
    for r in numba.prange(rows):
        for c in range(cols // 8):
            word = np.uint32(0)
            for i in range(8):
                word |= np.uint32((levels[r, c * 8 + i] + 8) & 0xF) << np.uint32(4 * i)
            out[r, c] = word
