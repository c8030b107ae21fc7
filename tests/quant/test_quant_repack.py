"""Repack / grid-check / grid-compare on the tiny QAT Gemma 4, round-tripped through the real
compressed-tensors and transformers libraries."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from gemma4_t4.cli import main as cli_main
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.quant import awq_requantize, grid_check, grid_compare, open_checkpoint, repack
from gemma4_t4.quant.repack import OffGridError


def _source(folder: Path) -> dict[str, np.ndarray]:
    """The checkpoint's tensors as float32, read by the safetensors library (not by the code under test)."""
    from safetensors.torch import load_file

    return {k: v.float().numpy() for k, v in load_file(str(folder / "model.safetensors")).items()}


def _to_bf16(x: np.ndarray) -> np.ndarray:
    """Round to bf16 with torch (round to nearest even), back as float32."""
    import torch

    return torch.from_numpy(np.ascontiguousarray(x, np.float32)).to(torch.bfloat16).float().numpy()


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def builds(tiny_qat_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("quant-builds")
    before = _digest(tiny_qat_model_dir)
    reports = {
        "linear": repack(tiny_qat_model_dir, out / "linear", compare_scale_dtypes=True),
        "linear_bf16": repack(tiny_qat_model_dir, out / "linear_bf16", scale_dtype="bf16"),
        "emb4": repack(tiny_qat_model_dir, out / "emb4", emb4=True),
        "awq": awq_requantize(tiny_qat_model_dir, out / "awq"),
    }
    assert _digest(tiny_qat_model_dir) == before, "the source checkpoint must never change"
    return out, reports


def _ct_decompress(folder: Path, module: str, group_size: int, symmetric: bool = True):
    """Decompress one module of our output with compressed-tensors itself."""
    import torch
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from safetensors.torch import load_file

    tensors = load_file(str(folder / "model.safetensors"))
    state = {k.split(".")[-1]: v for k, v in tensors.items() if k.rsplit(".", 1)[0] == module}
    scheme = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(
        num_bits=4, type="int", symmetric=symmetric, strategy="group", group_size=group_size))
    return PackedQuantizationCompressor.decompress(state, scheme)["weight"].to(torch.float32).numpy()


def test_grid_check_finds_every_tiny_qat_weight_on_grid(tiny_qat_model_dir):
    report = grid_check(str(tiny_qat_model_dir))
    assert report.tensors_checked >= 30 and report.tensors_on_grid == report.tensors_checked
    assert report.groups_off_grid == 0 and not report.tensors_off_grid
    assert report.weights_total == sum(t.weights for t in report.tensors)
    # peaks are spread over 5..8: a max-at-8 assumption would be wrong for most groups
    hist = {}
    for t in report.tensors:
        for k, v in t.peak_histogram.items():
            hist[k] = hist.get(k, 0) + v
    assert sum(v for k, v in hist.items() if k != 8) > 0.5 * report.groups_total
    assert report.values_bit_identical_pct["fp16"] > report.values_bit_identical_pct["bf16"] > 85


def test_grid_check_flags_the_plain_bf16_model_off_grid(tiny_model_dir):
    report = grid_check(str(tiny_model_dir), tensors=["model.layers.0.self_attn.q_proj.weight"])
    assert report.tensors_checked == 1 and report.tensors_off_grid == ["model.layers.0.self_attn.q_proj.weight"]
    assert report.groups_off_grid > 0.9 * report.groups_total
    assert report.tensors[0].off_grid_examples


def test_repack_output_decompresses_with_compressed_tensors_to_the_grid_values(builds, tiny_qat_model_dir):
    out, reports = builds
    rep = reports["linear"]
    assert rep.levels_changed == 0 and rep.groups_off_grid == 0
    assert rep.values_bit_identical["fp16"] > rep.values_bit_identical["bf16"]
    src = _source(tiny_qat_model_dir)
    for module in ("model.layers.0.self_attn.q_proj", "model.layers.1.mlp.down_proj",
                   "model.layers.2.per_layer_projection", "model.per_layer_model_projection"):
        w = src[f"{module}.weight"]
        for folder in ("linear", "linear_bf16"):
            got = _ct_decompress(out / folder, module, 32)
            assert got.shape == w.shape
            # every weight within 1/64 of its own value (bf16 and scale rounding only): a move to the
            # next level is at least 1/14 of a weight at level 7, so no weight changed level
            assert np.all(np.abs(got - w) <= np.abs(w) / 64)
            identical = (_to_bf16(got) == w).mean()
            assert identical > (0.98 if folder == "linear" else 0.94), (folder, identical)
    config = json.loads((out / "linear" / "config.json").read_text())
    qc = config["quantization_config"]
    assert qc["format"] == "pack-quantized" and qc["config_groups"]["group_0"]["weights"]["group_size"] == 32
    assert {"lm_head", "model.embed_tokens", "model.embed_tokens_per_layer"} <= set(qc["ignore"])
    assert config["tie_word_embeddings"] is True
    assert (out / "linear" / "tokenizer.json").read_bytes() == (tiny_qat_model_dir / "tokenizer.json").read_bytes()
    packed = open_checkpoint(out / "linear")
    info = packed.info("model.layers.0.self_attn.q_proj.weight_packed")
    assert info.dtype == "I32" and info.shape == (128, 16)
    assert packed.info("model.layers.0.self_attn.q_proj.weight_scale").dtype == "F16"
    assert list(packed.read_rows("model.layers.0.self_attn.q_proj.weight_shape")) == [128, 128]


def _bf16_scale_qat_copy(src: Path, dst: Path) -> Path:
    """A QAT checkpoint made from scratch: every group's values are bf16(q * s) with s a bf16
    number and a level -8 in every group (so its lattice is unique), so a bf16-scale repack must
    reproduce every value: the strictest end-to-end check, with no use of the code under test."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    tensors = load_file(str(src / "model.safetensors"))
    gen = torch.Generator().manual_seed(0)
    for name, t in tensors.items():
        if t.ndim == 2 and t.shape[1] % 32 == 0 and "embed" not in name:
            rows, cols = t.shape
            absmax = t.float().abs().reshape(rows, -1, 32).amax(-1, keepdim=True)
            s = torch.clamp(absmax / 8, min=2**-12).to(torch.bfloat16).float()
            q = torch.randint(-8, 8, (rows, cols // 32, 32), generator=gen).float()
            q[..., 0] = -8
            tensors[name] = (q * s).reshape(rows, cols).to(torch.bfloat16)
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def test_linear_repack_loads_in_transformers_with_identical_logits(tiny_qat_model_dir, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    src = _bf16_scale_qat_copy(tiny_qat_model_dir, tmp_path / "qat-bf16-scales")
    report = repack(src, tmp_path / "repacked", scale_dtype="bf16")
    assert report.values_bit_identical_pct["bf16"] == 100.0 and report.levels_changed == 0
    ids = torch.tensor([[2, 40, 41, 42, 43, 44, 45, 46]])
    ref = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "repacked", dtype=torch.bfloat16)
    assert model.config.quantization_config is not None
    with torch.no_grad():
        assert torch.equal(model(ids).logits, ref(ids).logits)


def test_fp16_scale_repack_loads_in_transformers_as_the_values_we_report(builds, tiny_qat_model_dir):
    """Loaded as float16 (as on a T4), transformers sees exactly fp16(q * s) for every packed weight.
    (Loaded as bfloat16 it first casts the fp16 scales to bf16, which moves some values by one
    bf16 ulp; docs/quantization.md notes this.)"""
    import torch
    from transformers import AutoModelForCausalLM, CompressedTensorsConfig

    from gemma4_t4.quant.builds import module_weights

    out, reports = builds
    model = AutoModelForCausalLM.from_pretrained(
        out / "linear", dtype=torch.float16, quantization_config=CompressedTensorsConfig(dequantize=True))
    state = model.state_dict()
    reader = open_checkpoint(out / "linear")
    src = _source(tiny_qat_model_dir)
    identical = total = 0
    for module, mw in module_weights(reader).items():
        if not mw.packed:
            continue
        # fp16(q * s), as compressed-tensors computes it
        ours = np.concatenate([b.values for b in mw.blocks(reader, mw.shape[0])])
        loaded = state[f"{module}.weight"].float().numpy()
        assert np.array_equal(loaded, ours), module
        identical += int((_to_bf16(loaded) == src[f"{module}.weight"]).sum())  # torch's rounding, not ours
        total += loaded.size
    assert total == reports["linear"].weights_quantized
    assert identical == reports["linear"].values_bit_identical["fp16"]


def test_emb4_packs_embeddings_and_writes_an_untied_lm_head(builds, tiny_qat_model_dir):
    out, reports = builds
    rep = reports["emb4"]
    assert rep.levels_changed == 0 and rep.ignore == []
    config = json.loads((out / "emb4" / "config.json").read_text())
    assert config["tie_word_embeddings"] is False
    targets = config["quantization_config"]["config_groups"]["group_0"]["targets"]
    assert "re:.*embed_tokens$" in targets and "re:^lm_head$" in targets
    src = _source(tiny_qat_model_dir)
    emb = src["model.embed_tokens.weight"]
    for module in ("model.embed_tokens", "lm_head"):
        got = _ct_decompress(out / "emb4", module, 32)
        assert got.shape == emb.shape
        assert np.all(np.abs(got - emb) <= np.abs(emb) / 64)  # on its level (see the linear test)
    ple = _ct_decompress(out / "emb4", "model.embed_tokens_per_layer", 32)
    source_ple = src["model.embed_tokens_per_layer.weight"]
    assert ple.shape == source_ple.shape and np.all(np.abs(ple - source_ple) <= np.abs(source_ple) / 64)


def test_grid_compare_repack_changes_no_level_and_awq_does(builds, tiny_qat_model_dir):
    out, reports = builds
    ours = grid_compare(str(tiny_qat_model_dir), str(out / "linear"))
    assert ours.level_changed == 0 and ours.bit_identical_pct > 95
    assert ours.weights_with_ref_lattice == ours.weights_total
    awq = grid_compare(str(tiny_qat_model_dir), str(out / "awq"))
    assert awq.level_changed > 0 and awq.bit_identical_pct < 60
    assert reports["awq"].symmetric is False
    # the AWQ build also round-trips through compressed-tensors (asymmetric, zero points)
    got = _ct_decompress(out / "awq", "model.layers.0.mlp.up_proj", 128, symmetric=False)
    from gemma4_t4.quant.builds import module_weights

    reader = open_checkpoint(out / "awq")
    up_proj = module_weights(reader)["model.layers.0.mlp.up_proj"]
    ours_awq = np.concatenate([b.values for b in up_proj.blocks(reader, 256)])
    assert np.array_equal(got, ours_awq)


def test_off_grid_source_is_refused_and_nothing_is_written(tiny_model_dir, tmp_path):
    dst = tmp_path / "out"
    with pytest.raises(OffGridError) as err:
        repack(tiny_model_dir, dst)
    assert "model.layers.0.self_attn.q_proj.weight" in err.value.tensors
    assert "--allow-requant" in (err.value.fix or "")
    assert not dst.exists() and list(tmp_path.iterdir()) == []
    rep = repack(tiny_model_dir, dst, allow_requant=True)
    assert rep.groups_requantized == rep.groups_off_grid > 0 and rep.levels_changed is not None
    assert (dst / "model.safetensors").exists()


def test_interrupted_repack_leaves_no_partial_checkpoint(tiny_qat_model_dir, tmp_path):
    before = _digest(tiny_qat_model_dir)
    seen = []

    def boom(name: str) -> None:
        seen.append(name)
        if len(seen) == 20:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        repack(tiny_qat_model_dir, tmp_path / "dst", progress=boom)
    assert list(tmp_path.iterdir()) == []
    assert _digest(tiny_qat_model_dir) == before


def test_sharded_output_has_a_consistent_index(tiny_qat_model_dir, tmp_path):
    rep = repack(tiny_qat_model_dir, tmp_path / "sharded", shard_bytes=200_000)
    files = set(rep.files)
    assert "model.safetensors.index.json" in files and sum(f.endswith(".safetensors") for f in files) > 2
    reader = open_checkpoint(tmp_path / "sharded")  # validates index against shards
    assert "model.layers.3.mlp.down_proj.weight_packed" in reader.tensors
    assert grid_compare(str(tiny_qat_model_dir), str(tmp_path / "sharded")).level_changed == 0


def test_existing_destination_is_not_overwritten_by_default(tiny_qat_model_dir, tmp_path):
    (tmp_path / "dst").mkdir()
    with pytest.raises(Gemma4T4Error, match="already exists"):
        repack(tiny_qat_model_dir, tmp_path / "dst")
    with pytest.raises(Gemma4T4Error, match="is the source .*could destroy the source"):
        repack(tiny_qat_model_dir, tiny_qat_model_dir, overwrite=True)


def test_cli_grid_check_repack_and_compare_json(tiny_qat_model_dir, tiny_model_dir, tmp_path, capsys):
    assert cli_main(["grid-check", str(tiny_qat_model_dir), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    for key in ("tensors_checked", "tensors_on_grid", "tensors_off_grid", "groups_total", "groups_off_grid",
                "weights_total", "tensors"):
        assert key in data
    assert cli_main(["grid-check", str(tiny_model_dir), "--json", "--tensor",
                     "model.layers.0.mlp.up_proj.weight"]) == 1
    assert json.loads(capsys.readouterr().out)["tensors_off_grid"] == ["model.layers.0.mlp.up_proj.weight"]
    assert cli_main(["repack", str(tiny_qat_model_dir), str(tmp_path / "r"), "--emb4", "--json",
                     "--compare-scale-dtypes"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["levels_changed"] == 0 and set(data["values_bit_identical_pct"]) == {"fp16", "bf16"}
    assert cli_main(["grid-compare", str(tiny_qat_model_dir), str(tmp_path / "r"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["level_changed"] == 0 and "level_changed_pct" in data and "groups_bit_identical_pct" in data
    assert cli_main(["repack", str(tiny_model_dir), str(tmp_path / "bad"), "--json"]) == 2
    err = json.loads(capsys.readouterr().out)
    assert "not on the int4 grid" in err["message"] and err["fix"]
    assert not (tmp_path / "bad").exists()
