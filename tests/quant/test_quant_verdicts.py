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
from gemma4_t4.quant import (
    NonFiniteError,
    awq_requantize,
    grid_check,
    grid_compare,
    lattice,
    open_checkpoint,
    repack,
)

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


# the count is the message: numpy's own "invalid value encountered" warning must not print beside it
@pytest.mark.filterwarnings("error::RuntimeWarning")
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
    assert code == 0 and "(0 %) moved off their 4-bit level" in out and "lossless conversion" in out
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
        code == 1 and "sits on a 4-bit lattice, so no level could move" in out and "not compared e: zero-size" in out
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
    bits = np.array([0x3F80, 0x7F80, 0xFFC1, 0x7F7F], np.uint16)
    assert lattice.count_non_finite(bits, "BF16") == 2
    assert lattice.count_non_finite(bits, "U16") == 0  # the same bits as integers are just numbers
    assert lattice.count_non_finite(np.array([1, 2**31 - 1], np.int32), "I32") == 0
    assert lattice.count_non_finite(np.array([0x7F, 0xFF, 0x7E, 0x00], np.uint8), "F8_E4M3") == 2
    assert lattice.count_non_finite(np.array([0x7C, 0xFE, 0x7B, 0x3C], np.uint8), "F8_E5M2") == 2
    assert lattice.count_non_finite(np.array([np.nan, 1.0], np.float64), "F64") == 1


def test_grid_compare_counts_levels_only_in_groups_on_refs_lattice(tmp_path):
    """REF with on-lattice and off-lattice groups: a repack that keeps every on-lattice level and
    rounds the off-lattice groups (--allow-requant) changes no level of REF's lattice. Counting the
    off-lattice groups too (against a lattice REF does not have) would call it ~50 % changed."""
    w = _on_grid(16, 128, seed=3)
    noise = np.random.default_rng(4).normal(0.0, 0.02, (16, 128)).astype(np.float32)
    off = np.zeros((16, 4), bool)
    off[::2, 1] = off[1::2, 3] = True  # 16 of 64 groups off the lattice, in every row
    mask = np.repeat(off, 32, axis=1)
    w[mask] = noise[mask]
    src = _checkpoint(tmp_path / "src", {"a.weight": w})
    assert grid_check(str(src)).groups_off_grid == 16
    rounded = repack(src, tmp_path / "rounded", allow_requant=True)
    assert rounded.groups_requantized == 16
    r = grid_compare(str(src), str(tmp_path / "rounded"))
    assert r.weights_with_ref_lattice == 48 * 32 and r.weights_total == 64 * 32
    assert r.level_changed == 0 and r.within_tolerance, r.level_changed
    assert r.bit_identical_pct < 100.0  # the off-lattice groups did move
    # one on-lattice weight one level up, and every off-lattice weight moved far: exactly 1 counted
    other = w.copy()
    other[0, 5] += S
    other[mask] += 50 * S
    r = grid_compare(str(src), str(_checkpoint(tmp_path / "moved", {"a.weight": other})))
    assert r.level_changed == 1 and r.tensors[0].level_changed == 1
    assert r.level_changed_pct == round(100.0 / (48 * 32), 4) and not r.within_tolerance
    assert r.tensors[0].level_changed_pct == r.level_changed_pct  # of the lattice's weights, not all


def test_grid_compare_step_of_a_one_sided_ambiguous_group_is_refs_scale(tmp_path):
    """A group whose levels are {-8, 0} (only negative ones) sits on lattices of step s, 2s ... 8s;
    the finest is s (8 levels fit below zero, none above is needed). A weight moved by a bit more
    than half of s has left its level: with a step of 8s/7 (7 levels, the positive side's count)
    the move would be missed."""
    w = _on_grid(4, 64)
    w[0, :32] = 0.0
    w[0, 0] = -8 * S  # {-8s, 0}: one-sided
    other = w.copy()
    other[0, 9] = np.float32(0.55) * S  # 0.55 s after bf16 rounding: 0.5 s < move < 0.57 s
    ref = _checkpoint(tmp_path / "ref", {"a.weight": w})
    moved = _checkpoint(tmp_path / "moved", {"a.weight": other})
    assert grid_compare(str(ref), str(moved)).level_changed == 1
    repack(ref, tmp_path / "packed")  # packed REF: the same group stored as {-1, 0} at 8s
    assert grid_compare(str(tmp_path / "packed"), str(moved)).level_changed == 1
    other[0, 9] = np.float32(0.45) * S  # less than half a level: still on level 0
    still = _checkpoint(tmp_path / "still", {"a.weight": other})
    assert grid_compare(str(ref), str(still)).level_changed == 0


def test_a_module_without_a_lattice_reports_no_level_count(tmp_path):
    noise = np.random.default_rng(1).normal(size=(8, 64)).astype(np.float32)
    a = _checkpoint(tmp_path / "a", {"n.weight": noise, "g.weight": _on_grid()})
    b = _checkpoint(tmp_path / "b", {"n.weight": noise, "g.weight": _on_grid()})
    by_module = {t.module: t for t in grid_compare(str(a), str(b)).tensors}
    assert by_module["n"].level_changed is None and by_module["n"].level_changed_pct is None
    assert by_module["n"].weights_on_ref_lattice == 0
    assert by_module["g"].level_changed == 0 and by_module["g"].level_changed_pct == 0.0


def test_grid_check_histogram_and_worst_deviation_of_damaged_groups(tmp_path):
    """Off-grid groups have no peak level: the histogram counts only on-grid groups. A NaN group's
    deviation is infinite, and so is the tensor's worst deviation (never a finite number that
    would read as "slightly off")."""
    w = _on_grid(4, 128)
    w[1, 32:64] = np.linspace(0.001, 0.05, 32, dtype=np.float32)  # off the lattice
    w[2, 70] = np.nan
    report = grid_check(str(_checkpoint(tmp_path / "src", {"a.weight": w})))
    t = report.tensors[0]
    assert (t.groups, t.groups_off_grid, t.non_finite) == (16, 2, 1)
    assert -1 not in t.peak_histogram and sum(t.peak_histogram.values()) == 14
    assert t.max_deviation_levels == float("inf") and not t.on_grid
    finite = _on_grid(4, 128)
    finite[1, 32:64] = np.linspace(0.001, 0.05, 32, dtype=np.float32)
    t = grid_check(str(_checkpoint(tmp_path / "finite", {"a.weight": finite}))).tensors[0]
    assert 0.05 < t.max_deviation_levels < 0.5 and t.peak_histogram == {8: 15}


def test_grid_check_bit_identical_counts_match_a_real_repack(tiny_qat_model_dir, tmp_path):
    """grid-check predicts, per scale dtype, how many values and whole groups a repack keeps
    bit-identical; grid-compare measures it on the written build by another code path. A group
    counts only when all of its values are identical."""
    check = grid_check(str(tiny_qat_model_dir))
    for dtype in ("fp16", "bf16"):
        repack(tiny_qat_model_dir, tmp_path / dtype, scale_dtype=dtype, emb4=True)  # every 2-D weight packed
        measured = grid_compare(str(tiny_qat_model_dir), str(tmp_path / dtype))
        assert check.values_bit_identical_pct[dtype] == measured.bit_identical_pct, dtype
        assert check.groups_bit_identical_pct[dtype] == measured.groups_bit_identical_pct, dtype
        assert 0 < measured.groups_bit_identical_pct < 100  # both kinds of group are present
        # the values are compared as a bf16 model holds them, whichever build is REF
        reverse = grid_compare(str(tmp_path / dtype), str(tiny_qat_model_dir))
        assert (reverse.bit_identical_pct, reverse.groups_bit_identical_pct) == (
            measured.bit_identical_pct, measured.groups_bit_identical_pct)


def test_an_asymmetric_packed_ref_has_no_lattice_to_count_levels_on(tmp_path):
    """An AWQ-style REF (zero points) is not a symmetric lattice: its levels are not counted as if
    they were (that would report level changes against a grid the build does not have)."""
    w = _on_grid(8, 128)
    src = _checkpoint(tmp_path / "src", {"a.weight": w})
    awq_requantize(src, tmp_path / "awq")
    r = grid_compare(str(tmp_path / "awq"), str(src))
    assert r.tensors[0].ref_format.startswith("int4 g128 asym")
    assert r.tensors[0].level_changed is None and r.weights_with_ref_lattice == 0
    assert not r.within_tolerance
    code, out, _ = _cli("grid-compare", tmp_path / "awq", src)
    assert code == 1 and "sits on a 4-bit lattice, so no level could move" in out


def test_a_packed_ref_stored_on_a_non_coarsest_lattice_counts_on_its_finest(tmp_path):
    """Another tool may store a group as levels {-6, 3, 0} at scale s (common factor 3) where our
    repack stores {-2, 1, 0} at 3s; both sit on the finer lattice of step 3s/4 ({-8, 4, 0}). A
    move of 0.45 s leaves a level of that lattice and is counted whichever way REF stores it."""
    from gemma4_t4.quant import pack

    levels = np.random.default_rng(5).integers(-8, 8, (4, 64)).astype(np.int8)
    levels[:, ::32] = -8
    levels[0, :32] = 0
    levels[0, 0], levels[0, 1] = -6, 3
    scale = np.full((4, 2), S, np.float16)
    ref = tmp_path / "ref"
    ref.mkdir()
    save_file({"a.weight_packed": pack.pack_int4(levels), "a.weight_scale": scale,
               "a.weight_shape": np.array([4, 64], np.int64)}, str(ref / "model.safetensors"))
    dense = (levels.astype(np.float32) * S).astype(np.float32)
    other = dense.copy()
    other[0, 9] = np.float32(0.45) * S
    assert grid_compare(str(ref), str(_checkpoint(tmp_path / "same", {"a.weight": dense}))).level_changed == 0
    r = grid_compare(str(ref), str(_checkpoint(tmp_path / "moved", {"a.weight": other})))
    assert r.level_changed == 1 and r.tensors[0].ref_format == "int4 g32 sym f16 scales"


def test_grid_compare_per_module_figures_and_a_packed_ref_of_another_group_size(tmp_path):
    w = _on_grid(8, 128)
    src = _checkpoint(tmp_path / "src", {"a.weight": w, "b.weight": _on_grid(8, 64, seed=2)})
    repack(src, tmp_path / "g64", group_size=64)  # REF's group size comes from REF, not --group-size
    other = w.copy()
    other[3, 7] += 3 * S
    moved = _checkpoint(tmp_path / "moved", {"a.weight": other, "b.weight": _on_grid(8, 64, seed=2)})
    r = grid_compare(str(tmp_path / "g64"), str(moved), group_size=32)
    a = {t.module: t for t in r.tensors}["a"]
    assert (a.level_changed, a.weights_on_ref_lattice, a.groups) == (1, 8 * 128, 8 * 128 // 64)
    assert a.level_changed_pct == round(100.0 / (8 * 128), 4)
    assert a.max_abs_diff == pytest.approx(3 * S) and a.mean_abs_diff == pytest.approx(3 * S / (8 * 128))


def test_off_grid_examples_name_absolute_rows_across_blocks(tmp_path):
    from gemma4_t4.quant.grid import check_tensor

    w = _on_grid(64, 64)
    w[41, 33:40] = np.float32(0.0123)  # group 1 of row 41 off the lattice
    src = _checkpoint(tmp_path / "src", {"a.weight": w})
    with open_checkpoint(src) as reader:
        t = check_tensor(reader, "a.weight", block_bytes=16 * 64 * 4)  # 16 rows a block: row 41 is in the 3rd
    assert t.off_grid_examples == [[41, 1]] and t.groups_off_grid == 1


def test_a_tensor_or_module_named_with_or_without_weight_is_found(tmp_path):
    src = _checkpoint(tmp_path / "src", {"a.weight": _on_grid(), "b.weight": _on_grid(seed=1)})
    for name in ("a", "a.weight"):
        assert [t.name for t in grid_check(str(src), tensors=[name]).tensors] == ["a.weight"], name
        assert [t.module for t in grid_compare(str(src), str(src), modules=[name]).tensors] == ["a"], name
