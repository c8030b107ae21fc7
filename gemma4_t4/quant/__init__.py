"""4-bit tools for Gemma 4 QAT checkpoints: grid check, lossless compressed-tensors repack,
build comparison and an AWQ-style baseline. Pure numpy (numba accelerates when installed)."""

from gemma4_t4.quant.awq import awq_requantize
from gemma4_t4.quant.grid import CompareReport, GridReport, grid_check, grid_compare
from gemma4_t4.quant.lattice import LatticeFit, choose_scale, dequantize, fit_lattice
from gemma4_t4.quant.pack import pack_int4, unpack_int4
from gemma4_t4.quant.repack import NonFiniteError, OffGridError, RepackReport, repack
from gemma4_t4.quant.safetensors_io import open_checkpoint

__all__ = [
    "CompareReport", "GridReport", "LatticeFit", "NonFiniteError", "OffGridError", "RepackReport",
    "awq_requantize", "choose_scale", "dequantize", "fit_lattice", "grid_check", "grid_compare",
    "open_checkpoint", "pack_int4", "repack", "unpack_int4",
]

