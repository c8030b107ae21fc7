"""Read any build of a model's weights back as float values, a block of rows at a time.

A module's weight can be stored dense (``X.weight``: bf16/fp16/fp32) or compressed-tensors
``pack-quantized`` (``X.weight_packed`` int32, ``X.weight_scale``, ``X.weight_shape`` and,
for asymmetric builds, ``X.weight_zero_point`` packed along dim 0). Decompression follows
compressed-tensors exactly: round_scale_dtype((q - z) * s).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.quant import lattice, pack
from gemma4_t4.quant.safetensors_io import CheckpointReader

FLOAT_DTYPES = ("BF16", "F16", "F32")
SCALE_DTYPE_NAMES = {"F16": "fp16", "BF16": "bf16", "F32": "fp32"}  # safetensors dtype -> rounding name


@dataclass
class WeightBlock:
    values: np.ndarray  # float32 [rows, cols]
    levels: np.ndarray | None = None  # int8, packed builds only
    scale: np.ndarray | None = None  # float32 [rows, groups]


@dataclass
class ModuleWeight:
    """One module's weight in one build."""

    module: str
    shape: tuple[int, int]
    packed: bool
    dtype: str  # dense dtype, or the scale dtype of a packed build
    group_size: int | None = None
    symmetric: bool = True

    def blocks(self, reader: CheckpointReader, rows_per_block: int) -> Iterator[WeightBlock]:
        """The weight, decompressed, ``rows_per_block`` rows at a time (a multiple of 8)."""
        rows_per_block = max(8, rows_per_block - rows_per_block % 8)  # zero points pack 8 rows per word
        m = self.module
        for start in range(0, self.shape[0], rows_per_block):
            stop = min(self.shape[0], start + rows_per_block)
            if not self.packed:
                yield WeightBlock(lattice.as_values(reader.read_rows(f"{m}.weight", start, stop)))
                continue
            levels = pack.unpack_int4(reader.read_rows(f"{m}.weight_packed", start, stop), self.shape[1])
            scale = lattice.as_values(reader.read_rows(f"{m}.weight_scale", start, stop))
            zp = None
            if not self.symmetric:
                packed_zp = reader.read_rows(f"{m}.weight_zero_point", start // 8, (stop + 7) // 8)
                zp = pack.unpack_int4_dim0(packed_zp, stop - start)
            values = lattice.dequantize(levels, scale, self.group_size, SCALE_DTYPE_NAMES[self.dtype], zp)
            yield WeightBlock(values, levels, scale)


def module_weights(reader: CheckpointReader) -> dict[str, ModuleWeight]:
    """Every 2-D weight in the checkpoint, dense or packed, keyed by module name."""
    out: dict[str, ModuleWeight] = {}
    for name, info in reader.tensors.items():
        if name.endswith(".weight") and len(info.shape) == 2 and info.dtype in FLOAT_DTYPES:
            module = name.removesuffix(".weight")
            out[module] = ModuleWeight(module, (info.shape[0], info.shape[1]), False, info.dtype)
        elif name.endswith(".weight_packed"):
            module = name.removesuffix(".weight_packed")
            try:
                shape = tuple(int(x) for x in reader.read_rows(f"{module}.weight_shape"))
                scale = reader.info(f"{module}.weight_scale")
            except Gemma4T4Error as exc:
                raise Gemma4T4Error(f"{reader.source}: packed module {module} is incomplete ({exc.message})",
                                    fix="the checkpoint is not a valid pack-quantized build") from exc
            except (ValueError, OverflowError) as exc:
                raise Gemma4T4Error(f"{reader.source}: {module}.weight_shape is not a pair of integers",
                                    fix="the checkpoint is not a valid pack-quantized build") from exc
            if len(shape) != 2 or info.dtype != "I32" or len(info.shape) != 2:
                raise Gemma4T4Error(f"{reader.source}: {module} is packed as {info.dtype}{shape}; only 2-D int32 int4 is read",
                                    fix="compare 2-D int4 pack-quantized builds")
            if shape[1] != info.shape[1] * 8:
                raise Gemma4T4Error(f"{reader.source}: {module}.weight_packed holds {info.shape[1] * 8} columns, "
                                    f"weight_shape says {shape[1]} (not int4?)", fix="only 4-bit packed builds are read")
            groups = scale.shape[1] if len(scale.shape) == 2 else 0
            if shape[0] <= 0 or groups <= 0 or shape[1] % groups or tuple(scale.shape) != (shape[0], groups) \
                    or tuple(info.shape) != (shape[0], shape[1] // 8) or scale.dtype not in FLOAT_DTYPES:
                raise Gemma4T4Error(
                    f"{reader.source}: {module} has inconsistent packed tensors (weight_shape {list(shape)}, "
                    f"weight_packed {list(info.shape)}, weight_scale {scale.dtype}{list(scale.shape)})",
                    fix="the checkpoint is not a valid pack-quantized build; rebuild it")
            out[module] = ModuleWeight(
                module, (shape[0], shape[1]), True, scale.dtype, group_size=shape[1] // groups,
                symmetric=f"{module}.weight_zero_point" not in reader.tensors,
            )
    return out
