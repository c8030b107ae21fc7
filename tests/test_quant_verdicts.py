"""The quant commands' verdicts never pass vacuously or on NaN: non-finite weights and scales are
refused and named; unsupported shapes are named with why; zero-size tensors are counted apart;
grid-check / grid-compare exit non-zero when nothing was compared or a tolerance is exceeded."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from gemma4_t4.cli import main
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.quant import NonFiniteError, awq_requantize, grid_check, grid_compare, lattice, repack

S = np.float32(2.0**-7)


def _cli(*args) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in args])
    return code, out.getvalue(), err.getvalue()


def _on_grid(rows: int = 8, cols: int = 64, seed: int = 0) -> np.ndarray:
    w = (np.random.default_rng(seed).integers(-8, 8, (rows, cols)) * S).astype(np.float32)
    w[:, ::32] = -8 * S  # every group peaks at -8: one unambiguous lattice
    return w


def _checkpoint(folder: Path, tensors: dict[str, np.ndarray]) -> Path:
    folder.mkdir(parents=True)
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text('{"model_type": "gemma4_text"}')
    return folder


def test_bf16_and_float_non_finite_values_are_counted():
    bits = np.array(
        [0x3F80, 0x7F7F, 0x7F80, 0xFF80, 0x7FC0, 0xFFC1, 0x0001], np.uint16
    )  # 1, max, +-Inf, NaNs
    assert lattice.count_non_finite(bits) == 4
    assert lattice.count_non_finite(np.array([1.0, np.inf, np.nan, -np.inf, 65504.0], np.float16)) == 3
    assert lattice.count_non_finite(np.zeros((4, 4), np.float32)) == 0


def test_all_nan_weights_are_refused_by_every_command(tmp_path):
    good = _on_grid()
    nan = np.full_like(good, np.nan)
    src = _checkpoint(tmp_path / "nan", {"a.weight": nan, "b.weight": good})
    code, out, _ = _cli("grid-check", src, "--quiet")
    assert code == 1 and f"NON-FINITE a.weight: {nan.size:,} NaN/Inf values" in out
    assert grid_check(str(src)).tensors_non_finite == {"a.weight": nan.size}
    for extra in ([], ["--allow-requant"]):
        code, _, err = _cli("repack", src, tmp_path / "out", *extra)
        assert code == 2 and f"a.weight ({nan.size:,} values)" in err and "NaN/Inf" in err, err
        assert "fix:" in err and not (tmp_path / "out").exists()
    with pytest.raises(NonFiniteError) as info:
        awq_requantize(src, tmp_path / "awq", group_size=32)
    assert info.value.tensors == {"a.weight": nan.size} and not (tmp_path / "awq").exists()
    finite = _checkpoint(tmp_path / "finite", {"a.weight": good, "b.weight": good})
    repack(finite, tmp_path / "packed")
    for ref, other in ((src, tmp_path / "packed"), (tmp_path / "packed", src)):
        code, out, err = _cli("grid-compare", ref, other)
        assert code == 2 and "a: " in err and f"{nan.size:,} in" in err and "b: " not in err, err


def test_inf_in_a_few_weights_is_named_with_its_count(tmp_path):
    w = _on_grid()
    w[0, 3], w[5, 40] = np.inf, -np.inf
    src = _checkpoint(tmp_path / "inf", {"a.weight": w})
    report = grid_check(str(src))
    assert not report.on_grid and report.tensors_non_finite == {"a.weight": 2}
    with pytest.raises(NonFiniteError, match=r"a\.weight \(2 values\)"):
        repack(src, tmp_path / "out", allow_requant=True)


def test_a_nan_scale_in_a_packed_build_is_refused(tmp_path):
    src = _checkpoint(tmp_path / "src", {"a.weight": _on_grid()})
    repack(src, tmp_path / "packed")
    shard = tmp_path / "packed" / "model.safetensors"
    tensors = load_file(str(shard))
    tensors["a.weight_scale"] = tensors["a.weight_scale"].copy()
    tensors["a.weight_scale"][2, 1] = np.nan
    save_file(tensors, str(shard))
    with pytest.raises(Gemma4T4Error, match=r"a: 0 in REF, 32 in OTHER \(1 NaN/Inf scales\)"):
        grid_compare(str(src), str(tmp_path / "packed"))


def test_grid_check_names_what_it_cannot_check_and_fails_when_nothing_was_checked(tmp_path):
    src = _checkpoint(
        tmp_path / "odd",
        {
            "experts.weight": np.zeros((2, 8, 64), np.float32),  # 3-D (stacked experts)
            "odd.weight": np.zeros((8, 48), np.float32),  # 48 columns: not a multiple of 32
            "empty.weight": np.zeros((0, 64), np.float32),
            "norm.weight": np.ones(64, np.float32),
        },
    )
    code, out, _ = _cli("grid-check", src, "--quiet")
    assert code == 1 and "0/0 tensors" in out
    assert "not checked experts.weight: 3-D F32[2, 8, 64]" in out and "stacked" in out
    assert "not checked odd.weight: 48 columns are not a multiple of group size 32" in out
    assert "not checked empty.weight: zero-size" in out
    assert "NOTHING CHECKED" in out and "1 0-D/1-D tensors" in out
    code, out, _ = _cli("grid-check", src, "--json", "--quiet")
    data = json.loads(out)
    assert code == 1 and data["tensors_empty"] == ["empty.weight"] and len(data["tensors_skipped"]) == 2
    # beside a real weight, the empty one is still not counted as on the grid
    ok = _checkpoint(tmp_path / "ok", {"a.weight": _on_grid(), "empty.weight": np.zeros((0, 32), np.float32)})
    report = grid_check(str(ok))
    assert report.on_grid and (report.tensors_checked, report.tensors_on_grid) == (1, 1)
    assert report.tensors_empty == ["empty.weight"]


def test_grid_compare_exit_code_follows_the_levels_changed_tolerance(tmp_path):
    w = _on_grid(32, 128)
    w *= np.repeat([1, 2, 4, 8], 32).astype(
        np.float32
    )  # a scale per group of 32: AWQ's g128 cannot keep them
    src = _checkpoint(tmp_path / "src", {"a.weight": w})
    repack(src, tmp_path / "lossless")
    awq_requantize(src, tmp_path / "awq")
    code, out, _ = _cli("grid-compare", src, tmp_path / "lossless")
    assert code == 0 and "level changed (REF grid): 0 " in out
    code, out, _ = _cli("grid-compare", src, tmp_path / "awq")
    pct = grid_compare(str(src), str(tmp_path / "awq")).level_changed_pct
    assert pct > 10 and code == 1 and f"{pct:.4g} % > 0 %" in out
    assert _cli("grid-compare", src, tmp_path / "awq", "--max-changed-pct", "100")[0] == 0
    assert _cli("grid-compare", src, tmp_path / "awq", "--max-changed-pct", f"{pct / 2}")[0] == 1
    code, _, err = _cli("grid-compare", src, tmp_path / "awq", "--max-changed-pct", "nan")
    assert code == 2 and "not a percentage" in err


def test_grid_compare_fails_when_nothing_is_on_a_lattice_or_everything_is_empty(tmp_path):
    noise = np.random.default_rng(1).normal(size=(8, 64)).astype(np.float32)
    a = _checkpoint(tmp_path / "a", {"a.weight": noise, "e.weight": np.zeros((0, 64), np.float32)})
    b = _checkpoint(tmp_path / "b", {"a.weight": noise, "e.weight": np.zeros((0, 64), np.float32)})
    code, out, _ = _cli("grid-compare", a, b)
    assert (
        code == 1 and "no weight of REF sits on an int4 lattice" in out and "not compared e: zero-size" in out
    )
    code, out, _ = _cli("grid-compare", a, b, "--tensor", "e")
    assert code == 1 and "NOTHING COMPARED: every shared module is zero-size" in out


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".partial-" in p.name or ".old-" in p.name)


def test_non_finite_values_in_copied_tensors_are_refused_and_named(tmp_path):
    """Tensors a build copies unchanged (an embedding without --emb4, a norm, a linear whose width
    the group size does not divide) are checked like the quantized ones: refused, each named."""
    emb = _on_grid(16, 64)
    emb[3, 5], emb[0, 0] = np.nan, np.inf
    norm = np.ones(64, np.float32)
    norm[7] = -np.inf
    q_proj = _on_grid(8, 64)
    src = _checkpoint(tmp_path / "src", {
        "model.embed_tokens.weight": emb, "model.norm.weight": norm,
        "model.layers.0.self_attn.q_proj.weight": q_proj,
    })
    code, out, err = _cli("repack", src, tmp_path / "out")
    assert code == 2 and out == "", (code, out, err)
    assert "model.embed_tokens.weight (2 values)" in err and "model.norm.weight (1 values)" in err, err
    assert "2 copied as they are" in err and "NaN/Inf" in err and "\n  fix: " in err, err
    assert not (tmp_path / "out").exists() and _leftovers(tmp_path) == []
    with pytest.raises(NonFiniteError) as info:
        repack(src, tmp_path / "out")
    assert info.value.tensors == {"model.embed_tokens.weight": 2, "model.norm.weight": 1}
    # --emb4 packs the embedding instead: the same damage, now as a tensor to quantize
    with pytest.raises(NonFiniteError, match="1 to quantize, 1 copied as they are"):
        repack(src, tmp_path / "out", emb4=True)

    # requant-awq (group 128) copies a 64-column q_proj unchanged: a NaN there is refused too
    q_proj[2, 9] = np.nan
    awq_src = _checkpoint(tmp_path / "awq-src", {
        "model.layers.0.self_attn.q_proj.weight": q_proj,
        "model.layers.0.mlp.down_proj.weight": _on_grid(8, 128),
    })
    code, _, err = _cli("requant-awq", awq_src, tmp_path / "awq")
    assert code == 2 and "model.layers.0.self_attn.q_proj.weight (1 values)" in err, err
    assert "1 copied as they are" in err and "fix:" in err
    assert not (tmp_path / "awq").exists() and _leftovers(tmp_path) == []
    # the finite build still succeeds and copies the tensor bit for bit
    q_proj[2, 9] = 0.0
    fine = _checkpoint(tmp_path / "fine", {
        "model.layers.0.self_attn.q_proj.weight": q_proj,
        "model.layers.0.mlp.down_proj.weight": _on_grid(8, 128),
    })
    report = awq_requantize(fine, tmp_path / "awq-ok")
    assert report.tensors_copied == 1
    copied = load_file(str(tmp_path / "awq-ok" / "model.safetensors"))["model.layers.0.self_attn.q_proj.weight"]
    assert np.array_equal(copied, q_proj)


def test_non_finite_check_follows_the_safetensors_dtype():
    from gemma4_t4.quant.repack import non_finite_values

    bits = np.array([0x3F80, 0x7F80, 0xFFC1, 0x7F7F], np.uint16)
    assert non_finite_values(bits, "BF16") == 2
    assert non_finite_values(bits, "U16") == 0  # the same bits as integers are just numbers
    assert non_finite_values(np.array([1, 2**31 - 1], np.int32), "I32") == 0
    assert non_finite_values(np.array([0x7F, 0xFF, 0x7E, 0x00], np.uint8), "F8_E4M3") == 2
    assert non_finite_values(np.array([0x7C, 0xFE, 0x7B, 0x3C], np.uint8), "F8_E5M2") == 2
    assert non_finite_values(np.array([np.nan, 1.0], np.float64), "F64") == 1
