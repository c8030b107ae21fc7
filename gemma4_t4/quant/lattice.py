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

Two implementations with identical results: plain numpy here (the readable reference) and
fused numba kernels in kernels.py (used when numba is importable, for tensors of at least
NUMBA_MIN_VALUES values: one vectorised pass per block, all cores). Inputs are [rows, cols]
float arrays or, straight from a checkpoint, bf16 bit patterns (uint16), which the kernels
widen on the fly.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np

from gemma4_t4.errors import Gemma4T4Error

DEFAULT_GROUP = 32
DEFAULT_TOL = 0.05  # in levels; bf16 storage rounds by up to ~0.03 level, 1e-3 rejects most groups
LEVEL_MIN, LEVEL_MAX = -8, 7
SCALE_DTYPES = ("fp16", "bf16")
# Peak levels tried first; every peak 1..8 divides one of them (see the module docstring).
_PEAK_TRIALS = (8, 7, 6, 5, 4, 3, 2, 1)
ZERO_GROUP_SCALE = 1.0  # any scale reproduces an all-zero group; 1.0 keeps scales finite and tidy
MAX_GROUP = 32767  # per-group exact-value counts are int16
MAX_TOL = 0.5  # half a level: beyond it every value is "on" some level and the check means nothing

try:  # optional accelerator
    if os.environ.get("GEMMA4_T4_NO_NUMBA"):
        raise ImportError("disabled by GEMMA4_T4_NO_NUMBA")
    import numba

    from gemma4_t4.quant import kernels
except ImportError:  # pragma: no cover - exercised when numba is absent
    numba = kernels = None


def validate_group_size(group_size: object, multiple_of: int = 1) -> int:
    """A group size the tools can use: a positive integer (a multiple of ``multiple_of``)."""
    if isinstance(group_size, bool) or not isinstance(group_size, (int, np.integer)) \
            or not 0 < group_size <= MAX_GROUP or group_size % multiple_of:
        need = f"a positive multiple of {multiple_of}" if multiple_of > 1 else "a positive integer"
        raise Gemma4T4Error(f"group size {group_size!r} is not usable: it must be {need} up to {MAX_GROUP}",
                            fix="use --group-size 32 (Gemma 4 QAT) or 128 (AWQ-style builds)")
    return int(group_size)


def as_number(value: object) -> float:
    """``value`` as a float; NaN when it is none, which every range check then refuses."""
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.nan


def validate_tol(tol: object) -> float:
    """A lattice tolerance in levels: 0 <= tol < 0.5."""
    value = as_number(tol)
    if not 0 <= value < MAX_TOL:
        raise Gemma4T4Error(f"tolerance {tol!r} is not usable: it must be a number from 0 to below {MAX_TOL} level",
                            fix=f"use --tol {DEFAULT_TOL} (bf16 storage rounds by up to ~0.03 level)")
    return value


# -- float formats ---------------------------------------------------------------------------------


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    """uint16 bf16 bit patterns -> float32 (exact)."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bit patterns, round to nearest even (as torch does)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    out = rounded.astype(np.uint16)
    out[np.isnan(x)] = 0x7FC0
    return out


def count_non_finite(block: np.ndarray, dtype: str | None = None) -> int:
    """NaN and Inf values in a block as read for safetensors ``dtype`` (0 for integer dtypes). Where
    no dtype is given, uint16 is bf16 bit patterns and anything else floats: the safetensors dtype
    decides where one is known (BF16 and U16 are both read as uint16).

    bf16 and fp8 bits are tested in place (exponent all ones), so the check costs no float copy.
    """
    dtype = dtype or ("BF16" if block.dtype == np.uint16 else "F32")
    if dtype in ("F16", "F32", "F64"):
        return int(block.size - np.count_nonzero(np.isfinite(block)))
    # F8_E4M3 is the fn variant: no Inf, NaN is S.1111.111; F8_E5M2 is IEEE-like
    mask = {"BF16": 0x7F80, "F8_E4M3": 0x7F, "F8_E5M2": 0x7C}.get(dtype)
    return 0 if mask is None else int(np.count_nonzero((block & mask) == mask))


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


# -- results ---------------------------------------------------------------------------------------


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


# -- numpy reference -------------------------------------------------------------------------------


def _groups(w: np.ndarray, group_size: int) -> np.ndarray:
    """[rows, cols] -> [rows, groups, group_size], refusing any other shape."""
    if w.ndim != 2 or w.shape[1] % group_size:
        raise ValueError(f"expected [rows, a multiple of {group_size} columns], got shape {w.shape}")
    return w.reshape(w.shape[0], w.shape[1] // group_size, group_size)


def fit_lattice_numpy(w: np.ndarray, group_size: int, tol: float) -> LatticeFit:
    g = _groups(w, group_size)  # float32, as analyze gives it
    rows, ngroups, _ = g.shape
    finite = np.isfinite(g).all(axis=-1)
    absmax = np.where(finite, np.abs(g).max(axis=-1), 0).astype(np.float32)
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
        fits = (dev <= tol) & in_range  # the groups still to do hold 0 in chosen and chosen_dev
        chosen[todo] = np.where(fits, k, 0)
        chosen_dev[todo] = np.where(fits, dev, 0)
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


def choose_scale(w: np.ndarray, fit: LatticeFit, dtype: str = "fp16") -> ScaleChoice:
    """Pick per-group scales in ``dtype`` that reproduce the most values bit-exactly (the numpy
    reference of the kernels' choice; ``w`` as floats or bf16 bits).

    A value is reproduced when the decompressed weight, round_dtype(q * s), rounds back to the
    stored source value in bf16 (Gemma's checkpoint dtype), i.e. the
    model loads the same bits.
    """
    g = _groups(as_values(np.asarray(w)), fit.group_size)
    rows, ngroups, gs = g.shape
    q = fit.levels.reshape(rows, ngroups, gs).astype(np.float64)
    base = round_to_dtype(fit.scale, dtype)
    base = np.where(base > 0, base, _neighbour_scales(np.zeros_like(base), dtype, 1))  # underflow -> min subnormal
    best, best_exact = base, np.full((rows, ngroups), -1, np.int16)
    for steps in (0, 1, -1, 2, -2):
        cand = base if steps == 0 else _neighbour_scales(base, dtype, steps)
        deq = round_to_dtype(round_to_dtype(q * cand[..., None].astype(np.float64), dtype), "bf16")
        exact = (deq == g).sum(axis=-1).astype(np.int16)
        better = exact > best_exact
        best = np.where(better, cand, best)
        best_exact = np.where(better, exact, best_exact)
    off = ~fit.on_grid
    best = np.where(off, base, best).astype(np.float32)
    best_exact = np.where(off, -1, best_exact).astype(np.int16)
    return ScaleChoice(best, best_exact)


# The kernels compile on their first call in a fresh install (30-56 s for all of them on a 2-core
# machine, then cached beside kernels.py): paid back by a real checkpoint's tensors (millions of values
# each), never by a tiny model's (at most ~65k), where numpy gives the same bits in milliseconds.
NUMBA_MIN_VALUES = 1 << 20


def numba_enabled(flag: bool | None, values: int) -> bool:
    """Whether to use the kernels: ``flag`` where given (and numba is importable), else for a tensor of
    at least :data:`NUMBA_MIN_VALUES` ``values``."""
    if numba is None:
        return False
    return flag if flag is not None else values >= NUMBA_MIN_VALUES


def as_values(block: np.ndarray) -> np.ndarray:
    """A block as read from a checkpoint (uint16 = bf16 bit patterns, or floats) -> float32."""
    if block.dtype == np.uint16:
        return bf16_bits_to_f32(block)
    return np.ascontiguousarray(block, dtype=np.float32)


def analyze(block: np.ndarray, group_size: int = DEFAULT_GROUP, tol: float = DEFAULT_TOL,
            scale_dtypes: tuple[str, ...] | list[str] = ("fp16",),
            use_numba: bool | None = None) -> tuple[LatticeFit, dict[str, ScaleChoice]]:
    """Lattice fit plus the scale choice for each of ``scale_dtypes``, in one pass.

    ``block`` is [rows, cols] as read from a checkpoint: uint16 bf16 bit patterns or floats.
    Same results as :func:`fit_lattice` followed by :func:`choose_scale` per dtype.
    """
    for dt in scale_dtypes:
        if dt not in SCALE_DTYPES:
            raise ValueError(f"scale dtype must be one of {SCALE_DTYPES}, got {dt!r}")
    _groups(block, group_size)  # refuses a shape the groups do not tile
    if not numba_enabled(use_numba, block.size):
        w = as_values(block)
        with np.errstate(invalid="ignore"):  # a non-finite group is marked off the grid, as the kernels do
            fit = fit_lattice_numpy(w, group_size, tol)
            return fit, {dt: choose_scale(w, fit, dt) for dt in scale_dtypes}
    rows, cols = block.shape
    ng = cols // group_size
    nd = len(scale_dtypes)
    levels = np.empty((rows, cols), np.int8)
    lsq = np.empty((rows, ng), np.float32)
    peak = np.empty((rows, ng), np.int8)
    deviation = np.empty((rows, ng), np.float32)
    scales = np.empty((max(nd, 1), rows, ng), np.float32)
    exact = np.empty((max(nd, 1), rows, ng), np.int16)
    fmts = np.array([kernels.FORMAT_CODES[dt] for dt in scale_dtypes] or [0], np.int64)
    # the kernels read bf16 bits directly (no float32 copy) and widen anything else once
    w = np.ascontiguousarray(block, dtype=np.uint16 if block.dtype == np.uint16 else np.float32)
    kernels.analyze_kernel(w, group_size, np.float32(tol), fmts, nd, levels, lsq, peak, deviation,
                           scales, exact)
    fit = LatticeFit(levels, lsq, peak, deviation, group_size)
    return fit, {dt: ScaleChoice(scales[i], exact[i]) for i, dt in enumerate(scale_dtypes)}


def fit_lattice(w: np.ndarray, group_size: int = DEFAULT_GROUP, tol: float = DEFAULT_TOL,
                use_numba: bool | None = None) -> LatticeFit:
    """Recover levels and least-squares scales of a [rows, cols] tensor (floats or bf16 bits)."""
    return analyze(np.asarray(w), group_size, tol, (), use_numba=use_numba)[0]


def requantize_off_grid(w: np.ndarray, fit: LatticeFit, choices: dict[str, ScaleChoice]) -> int:
    """Give off-grid groups a plain symmetric round-to-nearest lattice and choose their scales anew
    in ``choices`` (all in place). Returns how many.

    The scale uses the full asymmetric range of int4 (+7 / -8) without clipping. Those
    groups' values change; the caller reports them. Only they are chosen again: every other
    group keeps its levels and least-squares scale, so its choice stands.
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
    # the requantized groups as a [groups, group_size] tensor of one group per row
    alone = LatticeFit(q, s[:, None], fit.peak[off][:, None], fit.deviation[off][:, None], fit.group_size)
    for dtype, choice in choices.items():
        chosen = choose_scale(sel, alone, dtype)
        choice.scale[off], choice.exact[off] = chosen.scale[:, 0], chosen.exact[:, 0]
    return count
