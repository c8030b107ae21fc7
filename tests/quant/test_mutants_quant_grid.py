"""Behaviour of the grid check and the grid comparison (quant/grid.py) that the mutation run
(``make mutation``, docs/testing.md) showed no other fast test pinned down: figures summed over a
tensor read in several row blocks, exact counts and types in the report, and the arguments each
call passes on. CPU only, small synthetic checkpoints."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest

from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.quant import open_checkpoint
from gemma4_t4.quant.grid import check_tensor
from tests.quant.test_quant_verdicts import S, _checkpoint, _on_grid  # S = 2^-7: exact in fp16 and bf16

ROWS, COLS = 48, 64  # 96 groups of 32
ROW_BYTES = COLS * 4


def _damaged() -> np.ndarray:
    """On the int4 grid (every group peaks at -8) except: two off-grid groups in different row
    blocks, an all-zero group and one NaN, so each figure has something to sum across blocks."""
    w = _on_grid(ROWS, COLS, seed=7)
    w[5, 3] += S / 3  # group (5, 0): one value a third of a level off
    w[30, 40] += S / 7  # group (30, 1)
    w[40, :32] = 0.0  # group (40, 0): all zero (peak level 0)
    w[6, 10] = np.nan  # group (6, 0): non-finite, in the first block
    w[45, 50] = np.nan  # group (45, 1): non-finite, in the last block
    return w


def test_a_tensor_read_in_many_row_blocks_reports_what_one_block_reports(tmp_path):
    """Every figure is summed over the blocks (counts, histogram, examples, bit-identical values),
    never taken from the last block alone."""
    src = _checkpoint(tmp_path / "src", {"a.weight": _damaged()})
    with open_checkpoint(src) as reader:
        whole = check_tensor(reader, "a.weight", block_bytes=ROWS * ROW_BYTES)
        blocks = check_tensor(reader, "a.weight", block_bytes=8 * ROW_BYTES)  # 6 blocks of 8 rows
    assert asdict(blocks) == asdict(whole)
    assert whole.shape == [ROWS, COLS] and whole.weights == ROWS * COLS
    assert whole.groups == 96 and type(whole.groups) is int
    assert (whole.groups_off_grid, whole.non_finite, whole.on_grid) == (4, 2, False)
    assert whole.off_grid_examples == [[5, 0], [6, 0], [30, 1], [45, 1]]
    # 91 groups peak at -8 (coarsest level 8), the all-zero group at 0; off-grid groups have no peak
    assert whole.peak_histogram == {0: 1, 8: 91}
    # every value of an on-grid group is reproduced exactly; an off-grid group counts none
    assert whole.values_bit_identical == dict.fromkeys(whole.values_bit_identical, 92 * 32)
    assert whole.groups_bit_identical == dict.fromkeys(whole.groups_bit_identical, 92)
    assert whole.max_deviation_levels == float("inf")  # the NaN groups


def test_blocks_whose_groups_all_peak_low_add_up(tmp_path):
    """A block without any group peaking at 7 or 8 still adds to the ten-bucket histogram."""
    w = (np.random.default_rng(3).integers(-1, 2, (ROWS, COLS)) * S).astype(np.float32)  # levels -1..1
    w[:, 0] = S  # no all-zero group
    src = _checkpoint(tmp_path / "src", {"a.weight": w})
    with open_checkpoint(src) as reader:
        whole = check_tensor(reader, "a.weight", block_bytes=ROWS * ROW_BYTES)
        blocks = check_tensor(reader, "a.weight", block_bytes=8 * ROW_BYTES)
    assert asdict(blocks) == asdict(whole) and whole.on_grid
    assert max(whole.peak_histogram) < 7 and sum(whole.peak_histogram.values()) == 96


def test_the_worst_deviation_is_rounded_to_six_decimals(tmp_path):
    w = _damaged()
    w[6, 10] = w[45, 50] = -8 * S  # no NaN: a finite worst deviation
    src = _checkpoint(tmp_path / "src", {"a.weight": w})
    with open_checkpoint(src) as reader:
        t = check_tensor(reader, "a.weight", block_bytes=8 * ROW_BYTES)
    assert t.max_deviation_levels == 0.333333  # a third of a level, at six decimals


# -- grid_check: the report's own figures ------------------------------------------------------------
class _Clock:
    """perf_counter for grid_check: start, then ``elapsed`` seconds later."""

    def __init__(self, elapsed: float):
        self.readings = [100.0, 100.0 + elapsed]

    def perf_counter(self) -> float:
        return self.readings.pop(0)


def test_the_report_sums_every_tensor_and_times_the_read(tmp_path, monkeypatch, capsys):
    from gemma4_t4.quant import grid

    src = _checkpoint(tmp_path / "src", {"a.weight": _on_grid(16, 64), "b.weight": _on_grid(8, 128, seed=1)})
    monkeypatch.setattr(grid, "time", _Clock(0.25037))
    report = grid.grid_check(str(src), tol=0.02, scale_dtypes=("fp16",))
    assert capsys.readouterr().err == ""  # no progress bar unless asked for
    assert (report.source, report.group_size, report.tolerance_levels) == (str(src), 32, 0.02)
    assert report.bytes_read == (16 * 64 + 8 * 128) * 4 and report.tensors_checked == 2
    assert report.seconds == 0.25  # rounded to the millisecond
    assert report.mb_per_s == round(report.bytes_read / 1e6 / 0.25037, 1) == 0.0  # 8 kB in a quarter second
    assert [sorted(t.values_bit_identical) for t in report.tensors] == [["fp16"], ["fp16"]]
    assert report.values_bit_identical_pct == {"fp16": 100.0}


def test_the_read_rate_is_megabytes_per_second_and_zero_for_no_elapsed_time(tmp_path, monkeypatch):
    from gemma4_t4.quant import grid

    src = _checkpoint(tmp_path / "src", {"a.weight": _on_grid(1024, 256)})  # 1,048,576 bytes
    monkeypatch.setattr(grid, "time", _Clock(0.4))
    assert grid.grid_check(str(src)).mb_per_s == 2.6  # 1.048576 MB / 0.4 s = 2.62 MB/s, to 0.1
    monkeypatch.setattr(grid, "time", _Clock(0.0))
    report = grid.grid_check(str(src))
    assert (report.seconds, report.mb_per_s) == (0.0, 0.0)


def test_the_progress_bar_shows_the_bytes_to_read(tmp_path, capsys):
    from gemma4_t4.quant import grid

    src = _checkpoint(tmp_path / "src", {"a.weight": _on_grid(16, 64)})
    grid.grid_check(str(src), progress=True)
    err = capsys.readouterr().err
    assert "grid-check:" in err and "0%|" in err and "/4.10k" in err  # 4,096 bytes, unit-scaled


# -- select_tensors: what is not read, and why -------------------------------------------------------
def test_an_unknown_tensor_name_suggests_the_first_that_contains_it(tmp_path):
    from gemma4_t4.quant import grid

    src = _checkpoint(tmp_path / "src", {"x.q_proj.weight": _on_grid(8, 64), "y.q_proj.weight": _on_grid(8, 64)})
    with pytest.raises(Gemma4T4Error) as refused:
        grid.grid_check(str(src), tensors=["q_proj"])
    assert str(refused.value).startswith(f"{src} has no tensor 'q_proj'")
    assert refused.value.fix == "use a full tensor name, e.g. x.q_proj.weight"
    with pytest.raises(Gemma4T4Error) as refused:
        grid.grid_check(str(src), tensors=["k_proj"])
    assert refused.value.fix == "use a full tensor name"


def test_each_tensor_not_read_is_counted_or_named_with_why(tmp_path):
    from gemma4_t4.quant import grid

    tensors = {
        "a.weight": _on_grid(8, 48),  # sorted first: 48 columns, not a multiple of 32
        "b.weight": _on_grid(8, 64),  # read
        "c.experts": np.zeros((2, 8, 64), np.float32),  # stacked
        "n1.weight": np.ones(64, np.float32),  # 1-D: a norm
        "n2.bias": np.ones(8, np.float32),
    }
    src = _checkpoint(tmp_path / "src", tensors)
    report = grid.grid_check(str(src))
    assert [t.name for t in report.tensors] == ["b.weight"] and report.tensors_not_weights == 2
    assert report.tensors_skipped == {
        "a.weight": "48 columns are not a multiple of group size 32, so its groups cannot be formed",
        "c.experts": "3-D F32[2, 8, 64]: grid-check reads 2-D weights [rows, input columns]; a stacked "
                     "(e.g. per-expert) tensor is not checked",
    }
    named = grid.grid_check(str(src), tensors=["n1", "b"])
    assert named.tensors_skipped == {"n1.weight": "F32[64] is not a 2-D float weight"}
    assert named.tensors_not_weights == 0 and [t.name for t in named.tensors] == ["b.weight"]


# -- finest_step: the lattice a REF group sits on ----------------------------------------------------
def _group(*levels: int) -> list[int]:
    """A group of 32 levels: the given ones, then zeros."""
    return [*levels, *[0] * (32 - len(levels))]


def test_the_finest_step_of_each_kind_of_group():
    from gemma4_t4.quant.grid import finest_step

    levels = np.array([
        _group(-8),  # {-8, 0}: also {-1, 0} at 8 s ... and every lattice between: finest s
        _group(7),  # {0, 7}: gcd 7, {0, 1} cannot be scaled past 7: s
        _group(2, 4, -2),  # gcd 2: {1, 2, -1} fits 3x at most (2 * 3 <= 7): 2 s / 3
        _group(1, -3),  # -3 fits 2x at most (-6 >= -8): s / 2
        _group(),  # all zero: any other value has left level 0
        _group(7, -1),  # the top bound alone: s
        _group(5, -5),  # gcd 5: {1, -1} fits 7x: 5 s / 7
    ], np.int8).reshape(1, -1)
    scale = np.array([[1.0, 1.0, 1.0, 1.0, 1.0, 1.0, -2.0]], np.float32)  # a negative scale's step is positive
    step = finest_step(levels, scale, 32)
    assert step.dtype == np.float64 and step.shape == (1, 7)
    np.testing.assert_allclose(step[0], [1.0, 1.0, 2 / 3, 0.5, 0.0, 1.0, 2 * 5 / 7], rtol=0, atol=1e-12)


# -- compare_module / grid_compare -------------------------------------------------------------------
def _modules(folder: Path):
    from gemma4_t4.quant.builds import module_weights

    reader = open_checkpoint(folder)
    return reader, module_weights(reader)["a"]


def test_a_module_compared_in_many_row_blocks_reports_what_one_block_reports(tmp_path, monkeypatch):
    from gemma4_t4.quant import grid

    ref = _on_grid(48, 64)
    other = ref.copy()
    other[3, :5] += S  # block 0: five weights one level up
    other[20, 40] += S / 4  # block 2: a quarter level (bit-different, same level)
    other[44, 10] -= 2 * S  # block 5
    ref_dir = _checkpoint(tmp_path / "ref", {"a.weight": ref})
    other_dir = _checkpoint(tmp_path / "other", {"a.weight": other})
    (r_reader, r_mod), (o_reader, o_mod) = _modules(ref_dir), _modules(other_dir)
    with r_reader, o_reader:
        whole = grid.compare_module(r_reader, o_reader, r_mod, o_mod, 32)
        monkeypatch.setattr(grid, "BLOCK_BYTES", 1)  # 8 rows a block: 6 blocks
        blocks = grid.compare_module(r_reader, o_reader, r_mod, o_mod, 32)
    assert asdict(blocks) == asdict(whole)
    assert (whole.ref_format, whole.other_format) == ("f32", "f32")
    assert (whole.level_changed, whole.bit_identical, whole.groups_bit_identical) == (6, 48 * 64 - 7, 96 - 3)
    assert whole.max_abs_diff == pytest.approx(2 * S) and whole.mean_abs_diff == pytest.approx(
        (5 * S + S / 4 + 2 * S) / (48 * 64))


def test_non_finite_values_are_counted_in_every_block(tmp_path, monkeypatch):
    from gemma4_t4.quant import grid

    ref, other = _on_grid(48, 64), _on_grid(48, 64)
    ref[2, 0] = np.nan
    ref[40, 1] = np.inf
    other[17, 3] = np.nan
    other[33, 3] = -np.inf
    other[47, 63] = np.nan
    (r_reader, r_mod) = _modules(_checkpoint(tmp_path / "ref", {"a.weight": ref}))
    (o_reader, o_mod) = _modules(_checkpoint(tmp_path / "other", {"a.weight": other}))
    monkeypatch.setattr(grid, "BLOCK_BYTES", 1)
    with r_reader, o_reader:
        t = grid.compare_module(r_reader, o_reader, r_mod, o_mod, 32)
    assert (t.ref_non_finite, t.other_non_finite, t.non_finite_scales) == (2, 3, 0)


def test_the_default_lattice_tolerance_reaches_the_fit(tmp_path):
    from gemma4_t4.quant import grid

    ref = _on_grid(8, 64)
    ref[0, 1] += S * 0.02  # 0.02 of a level off: on the lattice at the default 0.05
    (r_reader, r_mod) = _modules(_checkpoint(tmp_path / "ref", {"a.weight": ref}))
    (o_reader, o_mod) = _modules(_checkpoint(tmp_path / "other", {"a.weight": ref}))
    with r_reader, o_reader:
        loose = grid.compare_module(r_reader, o_reader, r_mod, o_mod, 32)
    assert loose.weights_on_ref_lattice == 8 * 64


def test_reports_caption_and_table_rows(tmp_path):
    from gemma4_t4.quant import grid

    ref = _on_grid(8, 64)
    other = ref.copy()
    other[0, 0] += S
    ref_dir = _checkpoint(tmp_path / "ref", {"a.weight": ref})
    other_dir = _checkpoint(tmp_path / "other", {"a.weight": other})
    report = grid.grid_compare(str(ref_dir), str(other_dir))
    assert report.caption() == f"{other_dir} against {ref_dir}: weights moved to another int4 level"
    assert report.table_rows() == [{"build": str(other_dir), "levels changed %": 0.1953,
                                    "bit-identical %": 99.8047, "weights": 512, "modules": 1}]
    assert grid.grid_check(str(ref_dir), scale_dtypes=()).caption().endswith("reproduces bit for bit: -")
    checked = grid.grid_check(str(ref_dir))
    assert checked.caption() == (
        f"Grid check of {ref_dir}: 1/1 tensors on the grid, 0 of 16 groups off it, 512 weights; "
        "values a repack reproduces bit for bit: fp16 100 %, bf16 100 %")


def _row(module: str, ref_nf: int = 0, other_nf: int = 0, scales: int = 0):
    from gemma4_t4.quant.grid import TensorCompare

    return TensorCompare(module=module, shape=[8, 64], ref_format="bf16", other_format="bf16", weights=512,
                         level_changed=0, level_changed_pct=0.0, weights_on_ref_lattice=512, bit_identical=512,
                         bit_identical_pct=100.0, groups=16, groups_bit_identical=16, groups_bit_identical_pct=100.0,
                         max_abs_diff=0.0, mean_abs_diff=0.0, ref_non_finite=ref_nf, other_non_finite=other_nf,
                         non_finite_scales=scales)


def test_non_finite_modules_are_listed_with_their_counts_and_how_many_more():
    from gemma4_t4.quant.grid import MAX_LISTED, _refuse_non_finite

    _refuse_non_finite([_row("fine")], "REF", "OTHER")  # nothing non-finite: no error
    with pytest.raises(Gemma4T4Error) as refused:
        _refuse_non_finite([_row("fine"), _row("a", 1_234, 0), _row("b", 0, 2, scales=3)], "REF", "OTHER")
    assert str(refused.value).startswith(
        "NaN/Inf weights: OTHER vs REF cannot be compared (a non-finite value equals nothing, so no level or "
        "difference means anything): a: 1,234 in REF, 0 in OTHER; b: 0 in REF, 2 in OTHER (3 NaN/Inf scales)")
    assert refused.value.fix == ("rebuild the broken checkpoint from a finite source; `gemma4-t4 grid-check` names "
                                 "a source's non-finite tensors")
    with pytest.raises(Gemma4T4Error) as exactly:
        _refuse_non_finite([_row(f"m{i:02d}", 1) for i in range(MAX_LISTED)], "REF", "OTHER")
    assert "more modules" not in str(exactly.value) and str(exactly.value).count(" in REF") == MAX_LISTED
    with pytest.raises(Gemma4T4Error) as more:
        _refuse_non_finite([_row(f"m{i:02d}", 1) for i in range(MAX_LISTED + 2)], "REF", "OTHER")
    assert "m19: 1 in REF, 0 in OTHER; and 2 more modules" in str(more.value)


@pytest.mark.parametrize("value", ["abc", None, "nan", "inf", -0.1, 100.5, 150])
def test_a_levels_changed_tolerance_outside_0_to_100_is_refused(value):
    from gemma4_t4.quant.grid import validate_max_changed_pct

    with pytest.raises(Gemma4T4Error) as refused:
        validate_max_changed_pct(value)
    assert str(refused.value).startswith(f"levels-changed tolerance {value!r} is not a percentage from 0 to 100")
    assert refused.value.fix == "use --max-changed-pct 0 (a lossless repack changes no level)"
    assert (validate_max_changed_pct("0"), validate_max_changed_pct(100)) == (0.0, 100.0)


def test_grid_compare_names_both_builds_and_the_modules_only_one_has(tmp_path, capsys):
    from gemma4_t4.quant import grid

    w = _on_grid(8, 64)
    ref = _checkpoint(tmp_path / "ref", {"a.weight": np.zeros((0, 64), np.float32), "b.weight": w,
                                         "r.weight": w})
    other = _checkpoint(tmp_path / "other", {"a.weight": np.zeros((0, 64), np.float32), "b.weight": w,
                                             "o.weight": w})
    report = grid.grid_compare(str(ref), str(other), group_size=32)
    assert capsys.readouterr().err == ""  # no progress bar unless asked for
    assert (report.ref, report.other, report.group_size) == (str(ref), str(other), 32)
    assert (report.modules_only_in_ref, report.modules_only_in_other) == (["r"], ["o"])
    assert report.modules_empty == ["a"] and [t.module for t in report.tensors] == ["b"]  # "a" sorts first
    grid.grid_compare(str(ref), str(other), progress=True)
    err = capsys.readouterr().err
    assert "grid-compare:" in err and "0/2 [00:00<?, ?module/s]" in err  # a and b in common, counted by module


def test_grid_compare_of_only_empty_modules_has_no_difference_and_no_verdict(tmp_path):
    from gemma4_t4.quant import grid

    empty = {"a.weight": np.zeros((0, 64), np.float32)}
    report = grid.grid_compare(str(_checkpoint(tmp_path / "r", empty)), str(_checkpoint(tmp_path / "o", empty)))
    assert (report.modules_compared, report.max_abs_diff, report.within_tolerance) == (0, 0.0, False)


def test_grid_compare_refuses_builds_with_nothing_in_common_or_another_shape(tmp_path):
    from gemma4_t4.quant import grid

    ref = _checkpoint(tmp_path / "ref", {"a.weight": _on_grid(8, 64)})
    other = _checkpoint(tmp_path / "other", {"b.weight": _on_grid(8, 64)})
    with pytest.raises(Gemma4T4Error) as refused:
        grid.grid_compare(str(ref), str(other))
    assert str(refused.value).startswith(f"{ref} and {other} share no 2-D weight modules")
    assert refused.value.fix == "compare two builds of the same model (names must match)"
    wide = _checkpoint(tmp_path / "wide", {"a.weight": _on_grid(8, 128)})
    with pytest.raises(Gemma4T4Error) as shape:
        grid.grid_compare(str(ref), str(wide))
    assert str(shape.value).startswith(f"a: shape (8, 64) in {ref} but (8, 128) in {wide}")
    assert shape.value.fix == "compare two builds of the same model"
    nan = _on_grid(8, 64)
    nan[0, 0] = np.nan
    broken = _checkpoint(tmp_path / "broken", {"a.weight": nan})
    with pytest.raises(Gemma4T4Error, match=f"NaN/Inf weights: {broken} vs {ref} cannot be compared"):
        grid.grid_compare(str(ref), str(broken))
