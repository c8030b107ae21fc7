"""This machine: what it is (the doctor, what its CPU can run) and the changes that fit it to Gemma 4 on vLLM (install, CUDA torch, swap)."""
