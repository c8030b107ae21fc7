"""int4 nibble packing, bit-exact with compressed-tensors' ``pack_to_int32`` / ``unpack_from_int32``.

Level q (-8..7) is stored biased as q + 8 (0..15). Element e of a row goes to int32 word
e // 8 at bits 4 * (e % 8): little-endian nibbles. Packing is along the input dimension,
before any transpose; values never pass through float (int32 above 2**24 would round).
Zero points of asymmetric builds are packed the same way along dim 0.
"""

from __future__ import annotations

import numpy as np

from gemma4_t4.quant import lattice

_SHIFTS = np.arange(8, dtype=np.uint32) * 4


def pack_int4(levels: np.ndarray, use_numba: bool | None = None) -> np.ndarray:
    """int8 levels [rows, cols] (cols % 8 == 0) -> int32 [rows, cols // 8]."""
    levels = np.ascontiguousarray(levels, dtype=np.int8)
    rows, cols = levels.shape
    if cols % 8:
        raise ValueError(f"{cols} columns are not a multiple of 8")
    if lattice.numba_enabled(use_numba, levels.size):
        out = np.empty((rows, cols // 8), np.uint32)
        lattice.kernels.pack_kernel(levels, out)
        return out.view(np.int32)
    nibbles = (levels + np.int8(8)).view(np.uint8) & np.uint8(0xF)
    # two nibbles a byte, the even element low; four bytes a word, read little-endian
    return (nibbles[:, 0::2] | nibbles[:, 1::2] << np.uint8(4)).view(np.int32)


def unpack_int4(packed: np.ndarray, cols: int) -> np.ndarray:
    """int32 [rows, cols // 8] -> int8 levels [rows, cols]."""
    words = np.ascontiguousarray(packed).view(np.uint32)
    rows = words.shape[0]
    nibbles = (words[..., None] >> _SHIFTS) & np.uint32(0xF)
    return (nibbles.reshape(rows, -1)[:, :cols].astype(np.int16) - 8).astype(np.int8)


def pack_int4_dim0(values: np.ndarray) -> np.ndarray:
    """Pack along dim 0 (compressed-tensors' layout for zero points): [rows, cols] -> [ceil(rows/8), cols]."""
    values = np.asarray(values, dtype=np.int8)
    rows, cols = values.shape
    pad = -rows % 8
    if pad:
        values = np.concatenate([values, np.full((pad, cols), -8, np.int8)])  # pads as nibble 0
    return pack_int4(np.ascontiguousarray(values.T), use_numba=False).T.copy()


def unpack_int4_dim0(packed: np.ndarray, rows: int) -> np.ndarray:
    return np.ascontiguousarray(unpack_int4(np.ascontiguousarray(packed.T), packed.shape[0] * 8).T[:rows])
