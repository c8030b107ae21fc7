"""Recover the symmetric int4 lattice of QAT weights: per group of input columns one scale s
and integer levels q in -8..7 with w == round_bf16(q * s).

The recipe (see docs/quantization.md):

1. split each row into groups of ``group_size`` consecutive input columns;
2. find which level the group's largest magnitude sits on: try s0 = absmax / k and accept
   when every w / s0 is within ``tol`` of an integer in -8..7. The peak is *not* assumed to
   be 8 (many QAT groups peak at 7, 6, ...; absmax/8 would move them off the grid). Testing
   k = 8, 7, 6, 5, 4 reaches every peak 1..8 through a multiple; the levels' gcd then gives
   the coarsest lattice (the smallest k);
3. refine s by least squares (sum q*w / sum q^2);
4. choose the scale representable in the target dtype (fp16 or bf16) that reproduces the
   most values exactly, as the consumer computes them: round_dtype(q * s).

Two implementations with identical results: plain numpy (the readable reference) and a
fused numba kernel (used when numba is importable; one pass over memory, all cores).
Inputs are float32 arrays of shape [rows, cols]; BF16 checkpoints are widened with
:func:`bf16_bits_to_f32` (exact).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np

DEFAULT_GROUP = 32
DEFAULT_TOL = 0.05  # in levels; bf16 storage rounds by up to ~0.03 level, 1e-3 rejects most groups
LEVEL_MIN, LEVEL_MAX = -8, 7
SCALE_DTYPES = ("fp16", "bf16")
# Peak levels tried first; every peak 1..8 divides one of them (see the module docstring).
_PEAK_TRIALS = (8, 7, 6, 5, 4, 3, 2, 1)
ZERO_GROUP_SCALE = 1.0  # any scale reproduces an all-zero group; 1.0 keeps scales finite and tidy

try:  # optional accelerator
    if os.environ.get("GEMMA4_T4_NO_NUMBA"):
        raise ImportError("disabled by GEMMA4_T4_NO_NUMBA")
    import numba
except ImportError:  # pragma: no cover - exercised when numba is absent
    numba = None


# ------------------------------------------------------------------------------------------
# float formats


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    """uint16 bf16 bit patterns -> float32 (exact)."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bit patterns, round to nearest even (as torch does)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    nan = np.isnan(x)
    out = rounded.astype(np.uint16)
    if nan.any():
        out[nan] = 0x7FC0
    return out


def round_to_dtype(x: np.ndarray, dtype: str) -> np.ndarray:
    """Round float32/float64 values to fp16 or bf16 (RNE) and return them as float32."""
    x = np.asarray(x, dtype=np.float32)
    if dtype == "fp16":
        with np.errstate(over="ignore"):
            return x.astype(np.float16).astype(np.float32)
    if dtype == "bf16":
        return bf16_bits_to_f32(f32_to_bf16_bits(x))
    if dtype == "fp32":
        return x
    raise ValueError(f"unknown dtype {dtype!r}")


def scale_to_bits(scale_f32: np.ndarray, dtype: str) -> np.ndarray:
    """Scales (already representable in ``dtype``) as the stored array: float16 or bf16 bits."""
    if dtype == "fp16":
        return scale_f32.astype(np.float16)
    return f32_to_bf16_bits(scale_f32)


# ------------------------------------------------------------------------------------------
# results


@dataclass
class LatticeFit:
    """Per-group lattice of one [rows, cols] tensor."""

    levels: np.ndarray  # int8 [rows, cols], the recovered q (0 where the group is off grid)
    scale: np.ndarray  # float32 [rows, groups], least-squares scale (full precision)
    peak: np.ndarray  # int8 [rows, groups], coarsest peak level k (0 = all-zero group, -1 = off grid)
    deviation: np.ndarray  # float32 [rows, groups], worst distance to an integer level (best k if off grid)
    group_size: int

    @property
    def on_grid(self) -> np.ndarray:
        return self.peak >= 0


@dataclass
class ScaleChoice:
    scale: np.ndarray  # float32 [rows, groups], values representable in the target dtype
    exact: np.ndarray  # int16 [rows, groups], values per group reproduced bit-exactly
    dtype: str


# ------------------------------------------------------------------------------------------
# numpy reference


def _groups(w: np.ndarray, group_size: int) -> np.ndarray:
    rows, cols = w.shape
    if cols % group_size:
        raise ValueError(f"{cols} columns are not a multiple of group size {group_size}")
    return w.reshape(rows, cols // group_size, group_size)


def fit_lattice_numpy(w: np.ndarray, group_size: int = DEFAULT_GROUP, tol: float = DEFAULT_TOL) -> LatticeFit:
    g = _groups(np.asarray(w, dtype=np.float32), group_size)
    rows, ngroups, _ = g.shape
    finite = np.isfinite(g).all(axis=-1)
    absmax = np.where(finite, np.abs(np.where(np.isfinite(g), g, 0)).max(axis=-1), 0).astype(np.float32)
    safe = np.where(absmax > 0, absmax, 1.0).astype(np.float32)
    unit = g / safe[..., None]
    chosen = np.zeros((rows, ngroups), np.int16)
    chosen_dev = np.zeros((rows, ngroups), np.float32)
    best_dev = np.full((rows, ngroups), np.inf, np.float32)
    for k in _PEAK_TRIALS:
        todo = (chosen == 0) & finite & (absmax > 0)
        if not todo.any():
            break
        r = unit[todo] * np.float32(k)
        q = np.rint(r)
        dev = np.abs(r - q).max(axis=-1)
        in_range = (q.min(axis=-1) >= LEVEL_MIN) & (q.max(axis=-1) <= LEVEL_MAX)
        fits = (dev <= tol) & in_range
        idx = np.nonzero(todo)
        chosen[idx[0][fits], idx[1][fits]] = k
        chosen_dev[idx[0][fits], idx[1][fits]] = dev[fits]
        keep = best_dev[todo]
        best_dev[todo] = np.where(in_range, np.minimum(keep, dev), keep)
    on = chosen > 0
    levels = np.rint(unit * chosen[..., None].astype(np.float32)).astype(np.int8)
    levels[~on] = 0
    # coarsest lattice: divide by the levels' gcd (the peak level is in the group, so gcd | k)
    div = np.gcd.reduce(np.abs(levels).astype(np.int16), axis=-1)
    div = np.where(on & (div > 0), div, 1).astype(np.int8)
    levels = (levels // div[..., None]).astype(np.int8)
    peak = np.where(on, chosen // div, np.where(finite & (absmax == 0), 0, -1)).astype(np.int8)
    qf = levels.astype(np.float64)
    qq = (qf * qf).sum(axis=-1)
    qw = (qf * g.astype(np.float64)).sum(axis=-1)
    scale = np.where(qq > 0, qw / np.where(qq > 0, qq, 1), ZERO_GROUP_SCALE).astype(np.float32)
    dev_on = chosen_dev / div.astype(np.float32)  # in levels of the coarsest lattice
    deviation = np.where(on, dev_on, np.where(peak == 0, 0.0, best_dev)).astype(np.float32)
    return LatticeFit(levels.reshape(rows, -1), scale, peak, deviation, group_size)


def dequantize(levels: np.ndarray, scale: np.ndarray, group_size: int, dtype: str,
               zero_point: np.ndarray | None = None) -> np.ndarray:
    """round_dtype((q - z) * s) as float32, the way compressed-tensors decompresses."""
    rows, cols = levels.shape
    q = levels.reshape(rows, cols // group_size, group_size).astype(np.float32)
    if zero_point is not None:
        q = q - zero_point[..., None].astype(np.float32)
    prod = q.astype(np.float64) * scale[..., None].astype(np.float64)
    return round_to_dtype(prod, dtype).reshape(rows, cols)


def _neighbour_scales(c0: np.ndarray, dtype: str, steps: int) -> np.ndarray:
    """The representable value ``steps`` ulps above (steps>0) or below c0 (c0 > 0)."""
    if dtype == "fp16":
        bits = c0.astype(np.float16).view(np.uint16).astype(np.int32) + steps
        return np.clip(bits, 1, 0x7BFF).astype(np.uint16).view(np.float16).astype(np.float32)
    bits = f32_to_bf16_bits(c0).astype(np.int32) + steps
    return bf16_bits_to_f32(np.clip(bits, 1, 0x7F7F).astype(np.uint16))


def choose_scale_numpy(w: np.ndarray, fit: LatticeFit, dtype: str, value_dtype: str = "bf16") -> ScaleChoice:
    g = _groups(np.asarray(w, dtype=np.float32), fit.group_size)
    rows, ngroups, gs = g.shape
    q = fit.levels.reshape(rows, ngroups, gs).astype(np.float64)
    base = round_to_dtype(fit.scale, dtype)
    base = np.where(base > 0, base, _neighbour_scales(np.zeros_like(base), dtype, 1))  # underflow -> min subnormal
    best, best_exact = base, np.full((rows, ngroups), -1, np.int16)
    for steps in (0, 1, -1, 2, -2):
        cand = base if steps == 0 else _neighbour_scales(base, dtype, steps)
        deq = round_to_dtype(round_to_dtype(q * cand[..., None].astype(np.float64), dtype), value_dtype)
        exact = (deq == g).sum(axis=-1).astype(np.int16)
        better = exact > best_exact
        best = np.where(better, cand, best)
        best_exact = np.where(better, exact, best_exact)
    off = ~fit.on_grid
    best = np.where(off, base, best).astype(np.float32)
    best_exact = np.where(off, -1, best_exact).astype(np.int16)
    return ScaleChoice(best, best_exact, dtype)


# ------------------------------------------------------------------------------------------
# numba fused kernels (same results as the numpy reference)

if numba is not None:
    _FP16, _BF16, _FP32 = 0, 1, 2

    @numba.njit(cache=True, nogil=True, inline="always")
    def _bits(buf_f, buf_u, x):
        buf_f[0] = x
        return buf_u[0]

    @numba.njit(cache=True, nogil=True, inline="always")
    def _value(buf_f, buf_u, u):
        buf_u[0] = u
        return buf_f[0]

    @numba.njit(cache=True, nogil=True)
    def _round_bits(buf_f, buf_u, x, fmt):
        """Round float32 ``x`` to fp16 / bf16 / fp32 (RNE); returns the float32 bit pattern."""
        u = _bits(buf_f, buf_u, x)
        if fmt == _FP32:
            return u
        if (u & np.uint32(0x7F800000)) == np.uint32(0x7F800000):
            return u  # inf / nan
        if fmt == _BF16:
            return (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
        a = abs(x)
        if a < 6.103515625e-05:  # fp16 subnormal range: fixed ulp 2**-24
            return _bits(buf_f, buf_u, np.float32(np.rint(np.float64(x) * 16777216.0) / 16777216.0))
        r = (u + np.uint32(0xFFF) + ((u >> np.uint32(13)) & np.uint32(1))) & np.uint32(0xFFFFE000)
        if abs(_value(buf_f, buf_u, r)) > 65504.0:
            return (u & np.uint32(0x80000000)) | np.uint32(0x7F800000)
        return r

    @numba.njit(cache=True, nogil=True)
    def _step_bits(buf_f, buf_u, c, fmt, steps):
        """The positive representable value ``steps`` away from representable ``c`` > 0 (as float32)."""
        y = c
        for _ in range(abs(steps)):
            if fmt == _FP16 and (y < 6.103515625e-05 or (steps < 0 and y == 6.103515625e-05)):
                y = np.float32(y + (5.960464477539063e-08 if steps > 0 else -5.960464477539063e-08))
            else:
                inc = np.uint32(1 << 13) if fmt == _FP16 else np.uint32(1 << 16)
                u = _bits(buf_f, buf_u, y)
                y = _value(buf_f, buf_u, u + inc if steps > 0 else u - inc)
            if y <= 0.0:
                y = np.float32(5.960464477539063e-08) if fmt == _FP16 else _value(buf_f, buf_u, np.uint32(1 << 16))
        return y

    @numba.njit(cache=True, nogil=True, parallel=True)
    def _fit_kernel(w, gs, tol, levels, scale, peak, deviation):
        rows, cols = w.shape
        ng = cols // gs
        trials = np.array([8, 7, 6, 5, 4, 3, 2, 1], dtype=np.int64)
        for r in numba.prange(rows):
            qbuf = np.empty(gs, dtype=np.int64)
            unit = np.empty(gs, dtype=np.float32)
            for g in range(ng):
                base = g * gs
                absmax = np.float32(0.0)
                finite = True
                for j in range(gs):
                    x = w[r, base + j]
                    if not math.isfinite(x):
                        finite = False
                    elif abs(x) > absmax:
                        absmax = abs(x)
                if not finite or absmax == 0.0:
                    for j in range(gs):
                        levels[r, base + j] = 0
                    scale[r, g] = 1.0
                    peak[r, g] = 0 if finite else -1
                    deviation[r, g] = 0.0 if finite else math.inf
                    continue
                for j in range(gs):
                    unit[j] = w[r, base + j] / absmax  # float32, as the numpy reference
                chosen = 0
                chosen_dev = np.float32(0.0)
                for t in range(trials.shape[0]):
                    k = np.float32(trials[t])
                    fits = True
                    worst32 = np.float32(0.0)
                    for j in range(gs):
                        rr = unit[j] * k
                        q = np.rint(rr)
                        d32 = abs(np.float32(rr - q))
                        if q < -8 or q > 7 or d32 > tol:
                            fits = False
                            break
                        if d32 > worst32:
                            worst32 = d32
                        qbuf[j] = np.int64(q)
                    if fits:
                        chosen = trials[t]
                        chosen_dev = worst32
                        break
                if chosen == 0:
                    best_dev = math.inf  # off grid: report the deviation at the best in-range peak
                    for t in range(trials.shape[0]):
                        k = np.float32(trials[t])
                        worst = 0.0
                        in_range = True
                        for j in range(gs):
                            rr = unit[j] * k
                            q = np.rint(rr)
                            if q < -8 or q > 7:
                                in_range = False
                            d = abs(np.float32(rr - q))
                            if d > worst:
                                worst = d
                        if in_range and worst < best_dev:
                            best_dev = worst
                    for j in range(gs):
                        levels[r, base + j] = 0
                    scale[r, g] = 1.0
                    peak[r, g] = -1
                    deviation[r, g] = best_dev
                    continue
                # gcd of the levels (usually 1 after the first odd level; the peak k is a level)
                div = chosen
                for j in range(gs):
                    if div == 1:
                        break
                    a = abs(qbuf[j])
                    if a % div:
                        b = div
                        while a:
                            b, a = a, b % a
                        div = b
                qq = 0.0
                qw = 0.0
                for j in range(gs):
                    q = qbuf[j] // div
                    qbuf[j] = q
                    levels[r, base + j] = q
                    qq += q * q
                    qw += q * np.float64(w[r, base + j])
                scale[r, g] = np.float32(qw / qq)
                peak[r, g] = chosen // div
                deviation[r, g] = chosen_dev / np.float32(div)  # in levels of the coarsest lattice

    @numba.njit(cache=True, nogil=True, parallel=True)
    def _choose_kernel(w, levels, lsq, peak, gs, fmt, vfmt, out_scale, out_exact):
        rows, cols = w.shape
        ng = cols // gs
        steps_list = np.array([0, 1, -1, 2, -2], dtype=np.int64)
        for r in numba.prange(rows):
            buf_f = np.empty(1, dtype=np.float32)
            buf_u = buf_f.view(np.uint32)
            for g in range(ng):
                base = g * gs
                c0 = _value(buf_f, buf_u, _round_bits(buf_f, buf_u, lsq[r, g], fmt))
                if c0 <= 0.0:
                    c0 = _step_bits(buf_f, buf_u, np.float32(0.0), fmt, 1)
                if peak[r, g] < 0:
                    out_scale[r, g] = c0
                    out_exact[r, g] = -1
                    continue
                best = c0
                best_exact = -1
                for t in range(steps_list.shape[0]):
                    cand = c0 if steps_list[t] == 0 else _step_bits(buf_f, buf_u, c0, fmt, steps_list[t])
                    exact = 0
                    for j in range(gs):
                        prod = np.float32(np.float64(levels[r, base + j]) * np.float64(cand))  # exact
                        v = _value(buf_f, buf_u, _round_bits(buf_f, buf_u, prod, fmt))
                        v = _value(buf_f, buf_u, _round_bits(buf_f, buf_u, v, vfmt))
                        if v == w[r, base + j]:
                            exact += 1
                    if exact > best_exact:
                        best_exact = exact
                        best = cand
                    if best_exact == gs:
                        break
                out_scale[r, g] = best
                out_exact[r, g] = best_exact

    @numba.njit(cache=True, nogil=True, parallel=True)
    def _pack_kernel(levels, out):
        rows, cols = levels.shape
        for r in numba.prange(rows):
            for c in range(cols // 8):
                word = np.uint32(0)
                for i in range(8):
                    word |= np.uint32((levels[r, c * 8 + i] + 8) & 0xF) << np.uint32(4 * i)
                out[r, c] = word

_FORMAT_CODES = {"fp16": 0, "bf16": 1, "fp32": 2}


def _use_numba(flag: bool | None) -> bool:
    return numba is not None if flag is None else (flag and numba is not None)


def fit_lattice(w: np.ndarray, group_size: int = DEFAULT_GROUP, tol: float = DEFAULT_TOL,
                use_numba: bool | None = None) -> LatticeFit:
    """Recover levels and least-squares scales of a [rows, cols] float32 tensor."""
    w = np.ascontiguousarray(w, dtype=np.float32)
    if w.ndim != 2:
        raise ValueError(f"expected a 2-D tensor, got shape {w.shape}")
    if not _use_numba(use_numba):
        return fit_lattice_numpy(w, group_size, tol)
    rows, cols = w.shape
    if cols % group_size:
        raise ValueError(f"{cols} columns are not a multiple of group size {group_size}")
    ng = cols // group_size
    levels = np.empty((rows, cols), np.int8)
    scale = np.empty((rows, ng), np.float32)
    peak = np.empty((rows, ng), np.int8)
    deviation = np.empty((rows, ng), np.float32)
    _fit_kernel(w, group_size, float(tol), levels, scale, peak, deviation)
    return LatticeFit(levels, scale, peak, deviation, group_size)


def choose_scale(w: np.ndarray, fit: LatticeFit, dtype: str = "fp16", value_dtype: str = "bf16",
                 use_numba: bool | None = None) -> ScaleChoice:
    """Pick per-group scales in ``dtype`` that reproduce the most values bit-exactly.

    A value is reproduced when the decompressed weight, round_dtype(q * s), rounds back to the
    stored source value in ``value_dtype`` (the checkpoint's dtype, bf16 for Gemma), i.e. the
    model loads the same bits.
    """
    if dtype not in SCALE_DTYPES:
        raise ValueError(f"scale dtype must be one of {SCALE_DTYPES}, got {dtype!r}")
    w = np.ascontiguousarray(w, dtype=np.float32)
    if not _use_numba(use_numba):
        return choose_scale_numpy(w, fit, dtype, value_dtype)
    out_scale = np.empty(fit.scale.shape, np.float32)
    out_exact = np.empty(fit.scale.shape, np.int16)
    _choose_kernel(w, fit.levels, fit.scale, fit.peak, fit.group_size, _FORMAT_CODES[dtype],
                   _FORMAT_CODES[value_dtype], out_scale, out_exact)
    return ScaleChoice(out_scale, out_exact, dtype)


def requantize_off_grid(w: np.ndarray, fit: LatticeFit) -> int:
    """Give off-grid groups a plain symmetric round-to-nearest lattice (in place). Returns how many.

    The scale uses the full asymmetric range of int4 (+7 / -8) without clipping. Those
    groups' values change; the caller reports them.
    """
    off = ~fit.on_grid
    count = int(off.sum())
    if not count:
        return 0
    g = _groups(np.asarray(w, dtype=np.float32), fit.group_size)
    sel = np.where(np.isfinite(g[off]), g[off], 0.0)
    pos = np.maximum(sel.max(axis=-1), 0) / 7.0
    neg = np.maximum(-sel.min(axis=-1), 0) / 8.0
    s = np.maximum(pos, neg)
    s = np.where(s > 0, s, ZERO_GROUP_SCALE).astype(np.float32)
    q = np.clip(np.rint(sel / s[:, None]), LEVEL_MIN, LEVEL_MAX).astype(np.int8)
    lv = fit.levels.reshape(g.shape)
    lv[off] = q
    fit.scale[off] = s
    fit.peak[off] = np.abs(q).max(axis=-1)
    return count
