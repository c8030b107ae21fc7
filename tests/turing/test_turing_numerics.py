"""vLLM's kernel at the T4-clamped tiles under Triton's CPU interpreter vs a float32 reference."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")


def test_clamped_tiles_match_float32_reference_in_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")  # must be set before Triton is imported
    run = subprocess.run([sys.executable, "-m", "gemma4_t4.turing.numerics"], capture_output=True, text=True,
                         env=env, timeout=600)
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
