"""vLLM's kernel at the T4-clamped tiles under Triton's CPU interpreter vs a float32 reference.

The check runs in a fresh process (``TRITON_INTERPRET=1`` must be set before Triton is imported):
this file run as a script (``TRITON_INTERPRET=1 python tests/turing/test_turing_numerics.py``)
prints its JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

# (head, q heads, kv heads, query lens, context lens, sliding window): Gemma 4's head-512 global
# and head-256 sliding layers, prefill/mixed batches (2D path) and decode batches (3D path).
INTERPRETER_CASES = (
    ("global prefill+decode", 512, 8, 1, [20, 1], [40, 33], None),
    ("global decode (3D)", 512, 8, 2, [1, 1], [40, 70], None),
    ("sliding prefill, window 16", 256, 8, 2, [24], [40], 16),
    ("sliding decode (3D), window 16", 256, 16, 8, [1, 1], [50, 23], 16),
)
T4_TARGET = {"platform": "cuda", "name": "sm_75 target", "capability": (7, 5), "limit": 65_536,
             "limit_source": "target"}


def interpreter_check() -> dict:
    """Run the kernel under Triton's CPU interpreter at the T4-clamped tiles and at TILE 32: per case,
    the tiles used and the errors against the float32 reference."""
    import torch

    from gemma4_t4.turing import tilecap
    from gemma4_t4.turing.numerics import forced_tile, make_case, reference_attention, run_unified_attention
    from gemma4_t4.turing.offline import load_kernel_module

    kernel = load_kernel_module(interpret=True)
    original = kernel.module._get_tile_size
    outcome = tilecap.install(kernel.module, origin="numerics", device=T4_TARGET,
                              vllm_version=kernel.vllm_version, log=False)
    results = []
    for name, head, nq, nkv, query_lens, context_lens, window in INTERPRETER_CASES:
        case = make_case(head, nq, nkv, query_lens, context_lens, sliding_window=window, seed=len(results))
        reference = reference_attention(case)
        clamped = run_unified_attention(kernel.module, case).float()
        tiles = {"prefill": kernel.module._get_tile_size(head, window or 0, 2, True),
                 "decode": kernel.module._get_tile_size(head, window or 0, 2, False)}
        with forced_tile(kernel.module, 32):
            default = run_unified_attention(kernel.module, case).float()
        results.append({
            "case": name, "head_size": head, "num_q_heads": nq, "num_kv_heads": nkv,
            "query_lens": query_lens, "context_lens": context_lens, "sliding_window": window,
            "clamped_tiles": tiles, "default_tiles": {"prefill": original(head, window or 0, 2, True),
                                                      "decode": original(head, window or 0, 2, False)},
            "max_abs_error": float((clamped - reference).abs().max()),
            "max_abs_error_default_tile": float((default - reference).abs().max()),
            "max_abs_diff_clamped_vs_default": float((clamped - default).abs().max()),
            "reference_max_abs": float(reference.abs().max()),
            "finite": bool(torch.isfinite(clamped).all()),
        })
    return {"vllm_version": kernel.vllm_version, "patch_action": outcome["action"], "cases": results}


def test_clamped_tiles_match_float32_reference_in_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")  # must be set before Triton is imported
    run = subprocess.run([sys.executable, __file__], capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout)
    assert result["patch_action"] == "capped"
    cases = {c["case"]: c for c in result["cases"]}
    assert {c["head_size"] for c in cases.values()} == {256, 512}
    assert cases["global prefill+decode"]["clamped_tiles"]["prefill"] == 16  # the T4 clamp ran
    assert cases["global prefill+decode"]["default_tiles"]["prefill"] == 32
    assert cases["sliding prefill, window 16"]["clamped_tiles"]["prefill"] == 32  # fits: untouched
    for case in cases.values():
        assert case["finite"]
        # fp16 output of values up to ~5: half an fp16 ulp is ~2e-3
        assert case["max_abs_error"] < 4e-3, case
        assert case["max_abs_error"] <= case["max_abs_error_default_tile"] + 1e-3, case
        assert case["max_abs_diff_clamped_vs_default"] <= 4e-3, case  # at most one fp16 ulp apart


def test_interpreter_mode_needs_a_fresh_process(monkeypatch):
    import triton  # noqa: F401 - already imported without the interpreter

    from gemma4_t4.errors import Gemma4T4Error
    from gemma4_t4.turing.offline import load_kernel_module

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(Gemma4T4Error, match="before Triton is imported"):
        load_kernel_module(interpret=True)


if __name__ == "__main__":  # the fresh process of the first test
    print(json.dumps(interpreter_check(), indent=2))
