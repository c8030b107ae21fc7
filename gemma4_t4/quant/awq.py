"""An AWQ/GPTQ-style baseline re-quantizer: asymmetric int4 with a zero point, group 128,
scales from each group's min/max (round-to-nearest, no calibration data).

It exists to show, on the same QAT weights, what a classic conversion does: min/max scales
ignore the lattice the weights already sit on, so a large share of weights moves to another
level, while the lattice repack (repack.py) moves none.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from gemma4_t4.quant import lattice
from gemma4_t4.quant.repack import BlockResult, RepackReport, build_quantized

AWQ_GROUP = 128


def awq_levels(w: np.ndarray, group_size: int, scale_dtype: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Asymmetric min/max RTN: returns levels (int8, -8..7), scales (in ``scale_dtype``, as float32)
    and zero points (int8, -8..7) in compressed-tensors' signed convention:
    value = (q - z) * s."""
    rows, cols = w.shape
    g = w.reshape(rows, cols // group_size, group_size)  # float32, as lattice.as_values gives it
    wmax = np.maximum(g.max(axis=-1), 0.0)
    wmin = np.minimum(g.min(axis=-1), 0.0)
    scale = np.maximum((wmax - wmin) / 15.0, 1e-5)
    scale = lattice.round_to_dtype(scale, scale_dtype)
    zero = np.clip(-np.rint(wmin / scale), 0, 15)  # unsigned zero point, as AutoAWQ stores it
    q = np.clip(np.rint(g / scale[..., None]) + zero[..., None], 0, 15)
    levels = (q - 8).astype(np.int8).reshape(rows, cols)
    return levels, scale.astype(np.float32), (zero - 8).astype(np.int8)


def awq_requantize(src: str | Path, dst: str | Path, group_size: int = AWQ_GROUP, scale_dtype: str = "fp16",
                   overwrite: bool = False, progress: bool | Callable[[str], None] = False) -> RepackReport:
    """Write the AWQ-style (asymmetric, zero point, ``group_size``) pack-quantized build of SRC's linears."""

    def quantize(block: np.ndarray) -> BlockResult:
        w = lattice.as_values(block)
        levels, scale, zero = awq_levels(w, group_size, scale_dtype)
        deq = lattice.round_to_dtype(lattice.dequantize(levels, scale, group_size, scale_dtype, zero), "bf16")
        exact = int((deq == w).sum())
        return BlockResult(levels, scale, zero, exact={scale_dtype: exact})

    return build_quantized(src, dst, quantize, method="awq-rtn",
                           group_size=group_size, scale_dtype=scale_dtype, symmetric=False,
                           overwrite=overwrite, progress=progress)
