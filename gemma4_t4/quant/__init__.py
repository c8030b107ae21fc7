"""4-bit tools for Gemma 4 QAT checkpoints: grid check, lossless compressed-tensors repack,
build comparison and an AWQ-style baseline. Pure numpy (numba accelerates when installed)."""

from gemma4_t4.quant.awq import awq_requantize
from gemma4_t4.quant.grid import grid_check, grid_compare
from gemma4_t4.quant.repack import NonFiniteError, OffGridError, repack
from gemma4_t4.quant.safetensors_io import open_checkpoint

__all__ = ["NonFiniteError", "OffGridError", "awq_requantize", "grid_check", "grid_compare", "open_checkpoint", "repack"]
