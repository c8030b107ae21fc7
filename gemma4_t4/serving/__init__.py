"""Serving Gemma 4: the start gate and its sm_75 proof, the local vLLM server and its supervisor, launch profiles, and drafters."""
