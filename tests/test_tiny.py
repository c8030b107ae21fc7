import json

import pytest

from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.tiny import TinySpec, build_tiny_gemma4, snap_to_int4_grid


def test_tiny_checkpoint_loads_in_transformers(tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert tok.pad_token_id == 0 and tok.eos_token_id == 1 and tok.bos_token_id == 2
    text = "Gemma 4 on the T4"
    assert tok.decode(tok(text).input_ids) == text
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                     add_generation_prompt=True)
    assert prompt.endswith("<|turn>model\n")
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert type(model).__name__ == "Gemma4ForCausalLM"
    ids = tok("The quick brown", return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=5, do_sample=False)
    assert out.shape[1] == ids.shape[1] + 5
    assert model.config.tie_word_embeddings
    assert torch.equal(model.get_input_embeddings().weight, model.get_output_embeddings().weight)


def test_config_keeps_distinct_head_dims_in_portable_keys(tiny_model_dir):
    config = json.loads((tiny_model_dir / "config.json").read_text())
    assert config["head_dim"] != config["global_head_dim"]
    assert "per_layer_config" not in config
    assert {"sliding_attention", "full_attention"} <= set(config["layer_types"])
    assert config["layer_types"][-1] == "full_attention"


def test_build_is_deterministic(tmp_path):
    a = build_tiny_gemma4(tmp_path / "a")
    b = build_tiny_gemma4(tmp_path / "b")
    assert (a.path / "model.safetensors").read_bytes() == (b.path / "model.safetensors").read_bytes()
    c = build_tiny_gemma4(tmp_path / "c", spec=TinySpec(seed=1))
    assert (a.path / "model.safetensors").read_bytes() != (c.path / "model.safetensors").read_bytes()


def test_existing_output_is_refused(tmp_path):
    build_tiny_gemma4(tmp_path / "m")
    with pytest.raises(Gemma4T4Error, match="already exists"):
        build_tiny_gemma4(tmp_path / "m")


def test_qat_variant_sits_on_int4_grid(tiny_qat_model_dir):
    import torch
    from safetensors.torch import load_file

    tensors = load_file(tiny_qat_model_dir / "model.safetensors")
    checked = 0
    for name, t in tensors.items():
        if t.dim() != 2 or t.shape[1] % 32:
            continue
        g = t.float().reshape(t.shape[0], -1, 32)
        absmax = g.abs().amax(-1, keepdim=True)
        # some peak level k in 5..8 reproduces every value as an integer multiple
        ok = torch.zeros(g.shape[:2], dtype=torch.bool)
        for k in range(1, 9):
            q = g / (absmax / k).clamp_min(1e-12)
            ok |= ((q - q.round()).abs() < 0.05).all(-1) & (q.round() >= -8).all(-1) & (q.round() <= 7).all(-1)
        assert ok.all(), name
        checked += 1
    assert checked >= 10


def test_snap_rejects_bad_shape():
    import torch

    with pytest.raises(Gemma4T4Error, match="multiple of 32"):
        snap_to_int4_grid(torch.zeros(4, 40))
