"""grid_check: is every weight of a checkpoint on the symmetric int4 group lattice?
grid_compare: how many levels / values does one build of the same weights change vs another?

Both stream tensor by tensor (and block of rows by block of rows), so memory stays bounded
whatever the checkpoint size; both work on local folders and, for grid_check, over HTTP
range requests.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation.table import Displayable
from gemma4_t4.quant import lattice
from gemma4_t4.quant.builds import FLOAT_DTYPES, ModuleWeight, module_weights
from gemma4_t4.quant.safetensors_io import CheckpointReader, open_checkpoint

BLOCK_BYTES = 32 * 2**20  # source bytes per block: bounds memory, keeps all cores busy
MAX_EXAMPLES = 5
MAX_LISTED = 20
# grid-compare's verdict: the share of REF's lattice weights OTHER may move to another level. A
# lossless repack moves none, and any real conversion (AWQ, GPTQ) moves most, so 0 separates them.
DEFAULT_MAX_CHANGED_PCT = 0.0


@dataclass
class TensorGrid:
    name: str
    shape: list[int]
    dtype: str
    weights: int
    groups: int
    groups_off_grid: int
    on_grid: bool
    max_deviation_levels: float  # worst |w/s - q| over groups (off-grid groups: at their best peak)
    peak_histogram: dict[int, int]  # coarsest peak level -> groups (0: all-zero group)
    values_bit_identical: dict[str, int]  # per scale dtype: values reproduced exactly by a repack
    groups_bit_identical: dict[str, int]
    off_grid_examples: list[list[int]] = field(default_factory=list)  # [row, group]
    non_finite: int = 0  # NaN / Inf values: such a tensor is never on the grid


@dataclass
class GridReport(Displayable):
    source: str
    group_size: int
    tolerance_levels: float
    tensors_checked: int
    tensors_on_grid: int
    tensors_off_grid: list[str]
    tensors_skipped: dict[str, str]  # name -> why it was not checked (unsupported shape or dtype)
    tensors_empty: list[str]  # zero-size float weights: nothing to check, never counted as passing
    tensors_non_finite: dict[str, int]  # name -> NaN/Inf values
    tensors_not_weights: int  # 0-D / 1-D tensors (norms, biases, scalars): not weights of a linear
    groups_total: int
    groups_off_grid: int
    weights_total: int
    values_bit_identical_pct: dict[str, float]
    groups_bit_identical_pct: dict[str, float]
    bytes_read: int
    seconds: float
    mb_per_s: float
    tensors: list[TensorGrid]

    columns = ("name", "shape", "groups", "groups_off_grid", "max_deviation_levels")
    max_rows = 8

    def caption(self) -> str:
        identical = ", ".join(f"{k} {v:.3g} %" for k, v in self.values_bit_identical_pct.items())
        return (f"Grid check of {self.source}: {self.tensors_on_grid}/{self.tensors_checked} tensors on the grid, "
                f"{self.groups_off_grid:,} of {self.groups_total:,} groups off it, {self.weights_total:,} weights; "
                f"values a repack reproduces bit for bit: {identical or '-'}")

    def table_rows(self) -> list[TensorGrid]:
        return sorted(self.tensors, key=lambda t: not t.groups_off_grid)  # off-grid tensors first

    def notes(self) -> list[str]:
        """What the learner's own numbers mean, and every tensor that is damaged or was not checked (shown
        under the table in both displays)."""
        named = [*(f"NON-FINITE {name}: {count:,} NaN/Inf values (never on a grid; the checkpoint is damaged)"
                   for name, count in self.tensors_non_finite.items()),
                 *(f"not checked {name}: {why}" for name, why in self.tensors_skipped.items()),
                 *(f"not checked {name}: zero-size (nothing to check; not counted as on the grid)"
                   for name in self.tensors_empty),
                 f"read {self.bytes_read / 1e6:,.1f} MB in {self.seconds:.1f} s ({self.mb_per_s:,.0f} MB/s)"]
        if self.tensors_checked == 0:
            return [f"NOTHING CHECKED: no 2-D float weight with a multiple of {self.group_size} columns "
                    f"({len(self.tensors_skipped)} not checkable, {len(self.tensors_empty)} zero-size, "
                    f"{self.tensors_not_weights} 0-D/1-D tensors that are not weights), so this says nothing "
                    "about the grid.", *named]
        if self.on_grid:
            reading = (f"Every one of the {self.weights_total:,} weights in {self.tensors_checked} tensors sits "
                       f"exactly on a 4-bit level of its group of {self.group_size} (levels -8..7 times one scale "
                       "per group): a repack to int4 can keep every value.")
        else:
            bad = len(self.tensors_off_grid) + len(self.tensors_non_finite)
            reading = (f"{bad} of {self.tensors_checked} tensors are off the grid ({self.groups_off_grid:,} of "
                       f"{self.groups_total:,} groups): those weights are not 4-bit numbers, so any int4 build "
                       "must move them, and the repack refuses them.")
        if self.weights_total < TINY_WEIGHTS:  # on the CPU default: what the tiny random model shows, and what it cannot
            named.append(f"{self.weights_total:,} weights is the tiny random test model, snapped to the grid the way "
                         "Google's QAT weights are: it shows the check and the repack at work, not that Google's "
                         "checkpoints are on the grid (TARGET='t4' checks the real one).")
        return [reading, *named]

    @property
    def on_grid(self) -> bool:
        """The verdict: something was checked, and every checked tensor is finite and on the grid."""
        return self.tensors_checked > 0 and not self.tensors_off_grid and not self.tensors_non_finite


# Below this a checkpoint is the tiny random test model, not a Gemma 4 (E2B alone has ~5 billion weights).
TINY_WEIGHTS = 100_000_000


def pct(part: float, whole: float) -> float:
    """``part`` as a percentage of ``whole``, to 4 decimals (0 when ``whole`` is 0): every share a report gives."""
    return round(100.0 * part / whole, 4) if whole else 0.0


def throughput_mb_s(nbytes: int, seconds: float) -> float:
    """A report's throughput (0 for no time measured)."""
    return round(nbytes / 1e6 / seconds, 1) if seconds > 0 else 0.0


def check_tensor(reader: CheckpointReader, name: str, group_size: int = lattice.DEFAULT_GROUP,
                 tol: float = lattice.DEFAULT_TOL, scale_dtypes: Sequence[str] = lattice.SCALE_DTYPES,
                 block_bytes: int = BLOCK_BYTES) -> TensorGrid:
    info = reader.info(name)
    rows, cols = info.shape
    hist = np.zeros(10, np.int64)  # index peak + 1: -1 (off grid), 0..8
    off = non_finite = 0
    worst = 0.0
    exact = dict.fromkeys(scale_dtypes, 0)
    gexact = dict.fromkeys(scale_dtypes, 0)
    examples: list[list[int]] = []
    for start, stop in reader.row_blocks(name, block_bytes):
        block = reader.read_rows(name, start, stop)
        non_finite += lattice.count_non_finite(block)
        fit, choices = lattice.analyze(block, group_size, tol, tuple(scale_dtypes))
        hist += np.bincount(fit.peak.reshape(-1).astype(np.int64) + 1, minlength=10)[:10]
        bad = ~fit.on_grid
        if len(examples) < MAX_EXAMPLES:
            examples += (np.argwhere(bad)[:MAX_EXAMPLES] + [start, 0]).tolist()  # [row, group]
        off += int(bad.sum())
        worst = max(worst, float(fit.deviation.max()))  # inf where a group holds NaN/Inf
        for dt, choice in choices.items():
            exact[dt] += int(np.maximum(choice.exact, 0).sum())
            gexact[dt] += int((choice.exact == group_size).sum())
    groups = rows * cols // group_size
    return TensorGrid(
        name=name, shape=[rows, cols], dtype=info.dtype, weights=rows * cols, groups=groups,
        groups_off_grid=off, on_grid=off == 0 and non_finite == 0, max_deviation_levels=round(worst, 6),
        peak_histogram={k - 1: int(v) for k, v in enumerate(hist) if v and k > 0},
        values_bit_identical=exact, groups_bit_identical=gexact, off_grid_examples=examples[:MAX_EXAMPLES],
        non_finite=non_finite,
    )


def grid_check(path: str, tensors: Sequence[str] | None = None, group_size: int = lattice.DEFAULT_GROUP,
               tol: float = lattice.DEFAULT_TOL, progress: bool = False,
               scale_dtypes: Sequence[str] = lattice.SCALE_DTYPES) -> GridReport:
    """Check every 2-D float weight of a checkpoint (or only ``tensors``) against the int4 lattice.

    ``path`` is a local folder / ``.safetensors`` file or an ``http(s)://`` folder URL (then only
    the headers and the named tensors' bytes are downloaded).
    """
    t0 = time.perf_counter()
    group_size = lattice.validate_group_size(group_size)
    tol = lattice.validate_tol(tol)
    with open_checkpoint(path) as reader:
        selection = select_tensors(reader, tensors, group_size)
        rows_out: list[TensorGrid] = []
        bytes_read = sum(reader.tensors[n].nbytes for n in selection.names)
        with progress_bar(bytes_read, progress, "grid-check") as bar:
            for name in selection.names:
                rows_out.append(check_tensor(reader, name, group_size, tol, scale_dtypes))
                bar.update(reader.tensors[name].nbytes)
    seconds = time.perf_counter() - t0
    weights = sum(r.weights for r in rows_out)
    groups = sum(r.groups for r in rows_out)
    return GridReport(
        source=str(path), group_size=group_size, tolerance_levels=tol,
        tensors_checked=len(rows_out), tensors_on_grid=sum(r.on_grid for r in rows_out),
        tensors_off_grid=[r.name for r in rows_out if r.groups_off_grid], tensors_skipped=selection.skipped,
        tensors_empty=selection.empty, tensors_non_finite={r.name: r.non_finite for r in rows_out if r.non_finite},
        tensors_not_weights=selection.not_weights,
        groups_total=groups, groups_off_grid=sum(r.groups_off_grid for r in rows_out), weights_total=weights,
        values_bit_identical_pct={dt: pct(sum(r.values_bit_identical[dt] for r in rows_out), weights)
                                  for dt in scale_dtypes},
        groups_bit_identical_pct={dt: pct(sum(r.groups_bit_identical[dt] for r in rows_out), groups)
                                  for dt in scale_dtypes},
        bytes_read=bytes_read, seconds=round(seconds, 3),
        mb_per_s=throughput_mb_s(bytes_read, seconds), tensors=rows_out,
    )


@dataclass
class Selection:
    """Which tensors grid-check reads, and why each other float weight is not read."""

    names: list[str]
    skipped: dict[str, str]
    empty: list[str]
    not_weights: int


def select_tensors(reader: CheckpointReader, wanted: Sequence[str] | None, group_size: int) -> Selection:
    skipped: dict[str, str] = {}
    empty: list[str] = []
    not_weights = 0
    if wanted:
        names = []
        for name in wanted:
            hit = name if name in reader.tensors else f"{name}.weight"
            if hit not in reader.tensors:
                close = next((n for n in reader.tensors if name in n), None)
                raise Gemma4T4Error(f"{reader.source} has no tensor {name!r}",
                                    fix=f"use a full tensor name{', e.g. ' + close if close else ''}")
            names.append(hit)
    else:
        names = sorted(reader.tensors)
    out = []
    for name in names:
        info = reader.tensors[name]
        shape = list(info.shape)
        if info.dtype not in FLOAT_DTYPES or len(shape) < 2:
            if wanted:
                skipped[name] = f"{info.dtype}{shape} is not a 2-D float weight"
            else:
                not_weights += 1
            continue
        if len(shape) > 2:
            skipped[name] = (f"{len(shape)}-D {info.dtype}{shape}: grid-check reads 2-D weights "
                             "[rows, input columns]; a stacked (e.g. per-expert) tensor is not checked")
            continue
        if info.nbytes == 0:
            empty.append(name)
            continue
        if shape[1] % group_size:
            skipped[name] = (f"{shape[1]} columns are not a multiple of group size {group_size}, "
                             "so its groups cannot be formed")
            continue
        out.append(name)
    return Selection(out, skipped, empty, not_weights)


def progress_bar(total: int, enabled: bool, desc: str, unit: str = "B"):
    """A tqdm bar over ``total`` bytes (or ``unit``s: no k/M scaling); it shows nothing unless ``enabled``."""
    from tqdm.auto import tqdm

    return tqdm(total=total, unit=unit, unit_scale=unit == "B", desc=desc, leave=False, disable=not enabled)


# -- grid_compare ----------------------------------------------------------------------------------


@dataclass
class TensorCompare:
    module: str
    shape: list[int]
    ref_format: str
    other_format: str
    weights: int
    level_changed: int | None  # None where REF is not on a lattice
    level_changed_pct: float | None
    weights_on_ref_lattice: int
    bit_identical: int
    bit_identical_pct: float
    groups: int
    groups_bit_identical: int
    groups_bit_identical_pct: float
    max_abs_diff: float
    mean_abs_diff: float
    ref_non_finite: int = 0  # NaN / Inf values (decompressed, for a packed build)
    other_non_finite: int = 0
    non_finite_scales: int = 0  # NaN / Inf scales of a packed build (REF and OTHER)


@dataclass
class CompareReport(Displayable):
    ref: str
    other: str
    group_size: int
    modules_compared: int
    modules_only_in_ref: list[str]
    modules_only_in_other: list[str]
    weights_total: int
    level_changed: int
    level_changed_pct: float
    weights_with_ref_lattice: int
    bit_identical_pct: float
    groups_bit_identical_pct: float
    max_abs_diff: float
    tensors: list[TensorCompare]
    modules_empty: list[str] = field(default_factory=list)  # zero-size in REF: nothing to compare
    max_changed_pct: float = DEFAULT_MAX_CHANGED_PCT

    def caption(self) -> str:
        return f"{self.other} against {self.ref}: weights moved to another int4 level"

    def table_rows(self) -> list[dict[str, object]]:
        return [{"build": self.other, "levels changed %": self.level_changed_pct,
                 "bit-identical %": self.bit_identical_pct, "weights": self.weights_total,
                 "modules": self.modules_compared}]

    def notes(self) -> list[str]:
        """The learner's reading: how many weights this build moved off the level REF put them on; and every
        module that was not compared."""
        named = [f"groups bit-identical: {self.groups_bit_identical_pct:.2f} %; max |diff| {self.max_abs_diff:.3g}",
                 *(f"not compared {m}: zero-size" for m in self.modules_empty)]
        if self.modules_only_in_ref or self.modules_only_in_other:
            named.append(f"only in {self.ref}: {len(self.modules_only_in_ref)} modules; only in {self.other}: "
                         f"{len(self.modules_only_in_other)}")
        moved = (f"{self.level_changed:,} of {self.weights_with_ref_lattice:,} weights "
                 f"({self.level_changed_pct:.3g} %) moved off their 4-bit level in {self.other}")
        if not self.modules_compared:
            reading = "NOTHING COMPARED: every shared module is zero-size."
        elif not self.weights_with_ref_lattice:
            reading = f"No weight of {self.ref} sits on a 4-bit lattice, so no level could move: nothing compared."
        elif self.level_changed == 0:
            reading = f"{moved}: the same int4 numbers, a lossless conversion."
        else:
            reading = f"{moved}: it re-quantized with its own groups and scales, away from where training put them."
        if self.weights_with_ref_lattice and not self.within_tolerance:
            reading += (f" LEVELS CHANGED beyond tolerance: {self.level_changed_pct:.4g} % > "
                        f"{self.max_changed_pct:g} %.")
        return [reading, *named]

    @property
    def within_tolerance(self) -> bool:
        """The verdict: weights were compared on REF's lattice and few enough changed level."""
        return (self.modules_compared > 0 and self.weights_with_ref_lattice > 0
                and self.level_changed * 100.0 <= self.max_changed_pct * self.weights_with_ref_lattice)


def _describe(w: ModuleWeight) -> str:
    if not w.packed:
        return w.dtype.lower()
    return f"int4 g{w.group_size} {'sym' if w.symmetric else 'asym'} {w.dtype.lower()} scales"


def finest_step(levels: np.ndarray, scale: np.ndarray, group_size: int) -> np.ndarray:
    """Per group, the step of the finest int4 lattice REF's values sit on, float64 [rows, groups].

    A group's lattice is ambiguous when its levels are small: {-8s, 0} is also {-1, 0} at 8s,
    {-2, 0} at 4s ... A weight that moved by s is on another level of the s lattice but within
    half a level of the 8s one, so judging by the coarsest lattice loses it. Any lattice both
    builds share is one of REF's, and the finest of REF's is at least as fine, so it counts
    every weight that left its level on the lattice the builds share (and, when they share
    none, every weight further than half of REF's finest step). An all-zero group gives 0: any
    value other than zero has left level 0.
    """
    rows = levels.shape[0]
    lv = levels.reshape(rows, -1, group_size).astype(np.int16)
    g = np.gcd.reduce(np.abs(lv), axis=-1)  # 0 only for an all-zero group
    unit = np.maximum(g, 1)
    coarse = lv // unit[..., None]
    top, bottom = coarse.max(axis=-1), -coarse.min(axis=-1)
    # the largest d with every level times d still in -8..7
    d = np.minimum(np.where(top > 0, lattice.LEVEL_MAX // np.maximum(top, 1), 8),
                   np.where(bottom > 0, -lattice.LEVEL_MIN // np.maximum(bottom, 1), 8))
    step = np.abs(scale.astype(np.float64)) * unit / np.maximum(d, 1)
    return np.where(g > 0, step, 0.0)


def compare_module(ref_reader: CheckpointReader, other_reader: CheckpointReader, ref: ModuleWeight,
                   other: ModuleWeight, group_size: int) -> TensorCompare:
    rows, cols = ref.shape
    gs = ref.group_size if ref.packed else group_size
    rows_per_block = max(8, BLOCK_BYTES // (cols * 4))
    changed = identical = groups_identical = lattice_weights = 0
    ref_nf = other_nf = scale_nf = 0
    max_diff = sum_diff = 0.0
    for rb, ob in zip(ref.blocks(ref_reader, rows_per_block), other.blocks(other_reader, rows_per_block), strict=True):
        v_ref = rb.values
        ref_nf += lattice.count_non_finite(v_ref)
        other_nf += lattice.count_non_finite(ob.values)
        scale_nf += sum(lattice.count_non_finite(b.scale) for b in (rb, ob) if b.scale is not None)
        if ref.packed and ref.symmetric:
            step, on = finest_step(rb.levels, rb.scale, gs), np.ones(rb.scale.shape, bool)
        elif not ref.packed and cols % gs == 0:
            fit = lattice.fit_lattice(v_ref, gs)
            step, on = finest_step(fit.levels, fit.scale, gs), fit.on_grid
        else:
            step, on = None, None
        # values compared as the bf16 model would load them (the published grid_check's metric)
        v_ref = lattice.round_to_dtype(v_ref, "bf16")
        v_other = lattice.round_to_dtype(ob.values, "bf16")
        diff = np.abs(v_other.astype(np.float64) - v_ref.astype(np.float64))
        same = v_other == v_ref
        identical += int(same.sum())
        max_diff = max(max_diff, float(diff.max()))
        sum_diff += float(diff.sum())
        if cols % gs == 0:
            groups_identical += int(same.reshape(same.shape[0], -1, gs).all(axis=-1).sum())
        if step is not None:
            d = diff.reshape(diff.shape[0], -1, gs)
            off_level = d > 0.5 * step[..., None]
            changed += int((off_level & on[..., None]).sum())
            lattice_weights += int(on.sum()) * gs
    n = rows * cols
    groups = n // gs if cols % gs == 0 else 0
    has_lattice = lattice_weights > 0
    return TensorCompare(
        module=ref.module, shape=[rows, cols], ref_format=_describe(ref), other_format=_describe(other),
        weights=n, level_changed=changed if has_lattice else None,
        level_changed_pct=pct(changed, lattice_weights) if has_lattice else None,
        weights_on_ref_lattice=lattice_weights,
        bit_identical=identical, bit_identical_pct=pct(identical, n),
        groups=groups, groups_bit_identical=groups_identical, groups_bit_identical_pct=pct(groups_identical, groups),
        max_abs_diff=max_diff, mean_abs_diff=sum_diff / n if n else 0.0,
        ref_non_finite=ref_nf, other_non_finite=other_nf, non_finite_scales=scale_nf,
    )


def validate_max_changed_pct(value: object) -> float:
    pct = lattice.as_number(value)
    if not 0.0 <= pct <= 100.0:
        raise Gemma4T4Error(f"levels-changed tolerance {value!r} is not a percentage from 0 to 100",
                            fix="use --max-changed-pct 0 (a lossless repack changes no level)")
    return pct


def _refuse_non_finite(rows: list[TensorCompare], ref: str, other: str) -> None:
    bad = [t for t in rows if t.ref_non_finite or t.other_non_finite or t.non_finite_scales]
    if not bad:
        return
    listed = "; ".join(
        f"{t.module}: {t.ref_non_finite:,} in REF, {t.other_non_finite:,} in OTHER"
        + (f" ({t.non_finite_scales:,} NaN/Inf scales)" if t.non_finite_scales else "") for t in bad[:MAX_LISTED])
    more = f"; and {len(bad) - MAX_LISTED} more modules" if len(bad) > MAX_LISTED else ""
    raise Gemma4T4Error(
        f"NaN/Inf weights: {other} vs {ref} cannot be compared (a non-finite value equals nothing, so "
        f"no level or difference means anything): {listed}{more}",
        fix="rebuild the broken checkpoint from a finite source; `gemma4-t4 grid-check` names a source's "
        "non-finite tensors")


def grid_compare(ref: str, other: str, group_size: int = lattice.DEFAULT_GROUP, modules: Sequence[str] | None = None,
                 progress: bool = False, max_changed_pct: float = DEFAULT_MAX_CHANGED_PCT) -> CompareReport:
    """Compare two builds of the same weights (dense QAT, our repack, a w4a16 build, an AWQ build).

    Levels are counted in REF's lattice (its packed levels, or the lattice recovered from its
    dense values): a weight "changes level" when it moved by more than half a step of the
    finest lattice REF's group sits on (:func:`finest_step`; for groups that peak at 8 or 7
    that is REF's scale, for ambiguous groups such as {-8s, 0} it is s, not 8s).
    Values are bit-identical when the decompressed numbers are exactly equal. NaN/Inf in either
    build (values or scales) raises, naming each module and count. ``max_changed_pct`` is the
    verdict's tolerance (:attr:`CompareReport.within_tolerance`).
    """
    group_size = lattice.validate_group_size(group_size)
    max_changed_pct = validate_max_changed_pct(max_changed_pct)
    with open_checkpoint(ref) as r_reader, open_checkpoint(other) as o_reader:
        r_mods, o_mods = module_weights(r_reader), module_weights(o_reader)
        common = sorted(set(r_mods) & set(o_mods))
        if modules:
            common = [m for m in common if m in modules or f"{m}.weight" in modules]
        if not common:
            raise Gemma4T4Error(f"{ref} and {other} share no 2-D weight modules",
                                fix="compare two builds of the same model (names must match)")
        rows_out = []
        empty = [m for m in common if 0 in r_mods[m].shape]
        with progress_bar(len(common), progress, "grid-compare", unit="module") as bar:
            for m in common:
                if r_mods[m].shape != o_mods[m].shape:
                    raise Gemma4T4Error(f"{m}: shape {r_mods[m].shape} in {ref} but {o_mods[m].shape} in {other}",
                                        fix="compare two builds of the same model")
                if m in empty:
                    continue
                rows_out.append(compare_module(r_reader, o_reader, r_mods[m], o_mods[m], group_size))
                bar.update(1)
    _refuse_non_finite(rows_out, ref, other)
    weights = sum(t.weights for t in rows_out)
    lat_weights = sum(t.weights_on_ref_lattice for t in rows_out)
    changed = sum(t.level_changed or 0 for t in rows_out)
    return CompareReport(
        ref=str(ref), other=str(other), group_size=group_size, modules_compared=len(rows_out),
        modules_only_in_ref=sorted(set(r_mods) - set(o_mods)), modules_only_in_other=sorted(set(o_mods) - set(r_mods)),
        weights_total=weights, level_changed=changed, level_changed_pct=pct(changed, lat_weights),
        weights_with_ref_lattice=lat_weights,
        bit_identical_pct=pct(sum(t.bit_identical for t in rows_out), weights),
        groups_bit_identical_pct=pct(sum(t.groups_bit_identical for t in rows_out), sum(t.groups for t in rows_out)),
        max_abs_diff=max((t.max_abs_diff for t in rows_out), default=0.0), tensors=rows_out,
        modules_empty=empty, max_changed_pct=max_changed_pct,
    )
