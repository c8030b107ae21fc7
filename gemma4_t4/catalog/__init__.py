"""Gemma 4 and the GPUs as data: the model family, the GPU and price table, the tiny checkpoint."""
