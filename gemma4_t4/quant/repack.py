"""Repack a QAT checkpoint (bf16 values on the int4 grid) into compressed-tensors
``pack-quantized`` int4, keeping every level: levels and scales are recovered from the
values (lattice.py), not re-derived from absmax.

The build streams block by block into a temporary sibling of DST and is renamed into place
only when complete: an interruption or an off-grid refusal leaves no DST behind, and the
source is only ever read.
"""

from __future__ import annotations

import json
import shutil
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation import safepaths
from gemma4_t4.foundation.jsonable import to_jsonable
from gemma4_t4.foundation.table import Displayable
from gemma4_t4.quant import config as qconfig
from gemma4_t4.quant import lattice, pack
from gemma4_t4.quant.grid import BLOCK_BYTES, MAX_LISTED, pct, progress_bar, throughput_mb_s
from gemma4_t4.quant.safetensors_io import (
    INDEX_NAME,
    PICKLE_SUFFIXES,
    LocalCheckpoint,
    PlannedTensor,
    ShardedWriter,
    TensorInfo,
)

SHARD_BYTES = 4 * 10**9
REPORT_NAME = "gemma4_t4_repack.json"


@dataclass
class TensorRepack:
    name: str
    shape: list[int]
    action: str  # "int4" | "copy"
    reason: str
    groups: int = 0
    groups_off_grid: int = 0
    groups_requantized: int = 0
    levels_changed: int = 0  # weights of requantized groups that moved to another level
    values_bit_identical: Counter[str] = field(default_factory=Counter)  # per scale dtype
    off_grid_examples: list[list[int]] = field(default_factory=list)  # [row, group], at most 3
    non_finite: int = 0  # NaN / Inf source values: the build is refused


@dataclass
class RepackReport(Displayable):
    src: str
    dst: str
    method: str  # "lattice" (this repack) or "awq-rtn"
    emb4: bool
    scale_dtype: str
    group_size: int
    symmetric: bool
    files: list[str]
    tensors_quantized: int
    tensors_copied: int
    weights_quantized: int
    groups_total: int
    groups_off_grid: int
    groups_requantized: int
    levels_changed: int | None  # weights moved to another level; 0 for a lattice repack of on-grid groups
    values_bit_identical: dict[str, int]  # per scale dtype (the written one and the alternative)
    values_bit_identical_pct: dict[str, float]
    ignore: list[str]
    bytes_read: int
    bytes_written: int
    seconds: float
    mb_per_s: float
    tensors: list[TensorRepack]
    cleanup: list[str] = field(default_factory=list)  # stale partial output this run removed or restored

    def caption(self) -> str:
        return f"{self.src} -> {self.dst} ({self.scale_dtype} scales, g{self.group_size})"

    def table_rows(self) -> list[dict[str, object]]:
        return [{"build": self.method + (" + emb4" if self.emb4 else ""), "tensors int4": self.tensors_quantized,
                 "levels changed": self.levels_changed,
                 "values bit-identical %": self.values_bit_identical_pct.get(self.scale_dtype),
                 "MB written": self.bytes_written / 1e6, "MB read": self.bytes_read / 1e6}]

    def notes(self) -> list[str]:
        """The learner's reading: was the conversion lossless, and how much smaller is it."""
        share = f"{self.bytes_written / self.bytes_read:.0%} of the {self.bytes_read / 1e6:,.1f} MB read" \
            if self.bytes_read else "nothing read"
        if self.levels_changed == 0:
            kept = "no weight moved to another level: lossless"
        elif self.levels_changed is None:
            kept = "levels moved: not counted"
        else:
            kept = f"{self.levels_changed:,} weights moved to another level: not lossless"
        identical = ", ".join(f"{k} scales {v:.2f} %" for k, v in self.values_bit_identical_pct.items())
        return [f"{self.tensors_quantized} tensors packed to int4, {kept}; {self.bytes_written / 1e6:,.1f} MB "
                f"written, {share}.",
                f"{'symmetric' if self.symmetric else 'asymmetric'}: {self.weights_quantized:,} weights packed, "
                f"{self.tensors_copied} tensors copied, {len(self.ignore)} modules on the ignore list; groups off "
                f"grid {self.groups_off_grid:,}, requantized {self.groups_requantized:,}; values bit-identical: "
                f"{identical}; {self.seconds:.1f} s ({self.mb_per_s:,.0f} MB/s)", *self.cleanup]


class TensorsRefused(Gemma4T4Error):
    """A repack refused because of some tensors (named with a count each); nothing was written."""

    json_key = "tensors"

    def __init__(self, message: str, fix: str, tensors: dict[str, int]):
        super().__init__(message, fix=fix)
        self.tensors = tensors

    def to_dict(self) -> dict:
        return {**super().to_dict(), self.json_key: self.tensors}


class OffGridError(TensorsRefused):
    """Some groups are not on the int4 lattice; nothing was written."""

    json_key = "off_grid_tensors"


class NonFiniteError(TensorsRefused):
    """Some weights to quantize are NaN or Inf; nothing was written (with or without requantizing)."""

    json_key = "non_finite_tensors"


# A quantizer turns one block as read (uint16 bf16 bits or floats; lattice.as_values widens it)
# into (levels int8, scale float32 in scale dtype, zero point int8 or None) and per-block stats.
@dataclass
class BlockResult:
    levels: np.ndarray
    scale: np.ndarray
    zero_point: np.ndarray | None
    off_grid: int = 0
    requantized: int = 0
    off_grid_examples: list[list[int]] = field(default_factory=list)  # [row, group]
    exact: dict[str, int] = field(default_factory=dict)
    levels_changed: int = 0


Quantizer = Callable[[np.ndarray], BlockResult]


def _side_items(src: Path) -> list[Path]:
    """The source's files and folders a build carries over as they are (tokenizer, configs, ...)."""
    # pickle weights are never carried over (and would duplicate the model)
    return [item for item in sorted(src.iterdir())
            if not (item.name.endswith(".safetensors") or item.name in (INDEX_NAME, REPORT_NAME)
                    or item.name.startswith(".") or item.name.lower().endswith(PICKLE_SUFFIXES))]


def _build_config(source_text: str | None, where: str, qcfg: dict, untie: bool) -> dict:
    """The source's config.json (none: an empty one) with the build's ``quantization_config``."""
    try:
        config = json.loads(source_text) if source_text else {}
    except (ValueError, RecursionError) as exc:
        raise Gemma4T4Error(f"{where}/config.json is not valid JSON ({str(exc)[:120]})",
                            fix="restore the checkpoint's config.json (re-download it)") from exc
    if not isinstance(config, dict):
        raise Gemma4T4Error(f"{where}/config.json is not a JSON object",
                            fix="restore the checkpoint's config.json (re-download it)")
    config["quantization_config"] = qcfg
    text = config.get("text_config")
    if isinstance(text, dict):  # a QAT source's partial quantization_config there confuses detectors
        text = config["text_config"] = {k: v for k, v in text.items() if k != "quantization_config"}
    if untie:
        config["tie_word_embeddings"] = False
        if isinstance(text, dict):
            text["tie_word_embeddings"] = False
    return config


def _side_bytes(src: Path) -> int:
    total = 0
    for item in _side_items(src):
        try:
            total += sum(f.stat().st_size for f in item.rglob("*") if f.is_file()) if item.is_dir() \
                else item.stat().st_size
        except OSError:
            pass
    return total


def build_quantized(
    src: str | Path, dst: str | Path, quantizer: Quantizer, *, method: str, group_size: int, scale_dtype: str,
    symmetric: bool, emb4: bool = False, overwrite: bool = False, shard_bytes: int = SHARD_BYTES,
    progress: bool | Callable[[str], None] = False,
) -> RepackReport:
    """Shared writer for the lattice repack and the AWQ-style baseline."""
    t0 = time.perf_counter()
    src_path, dst_path = Path(src), Path(dst)
    if str(src).startswith(("http://", "https://")):
        raise Gemma4T4Error("repack reads local checkpoints only", fix="download the checkpoint first")
    group_size = lattice.validate_group_size(group_size, multiple_of=8)  # int4 packs 8 per int32 word
    if scale_dtype not in lattice.SCALE_DTYPES:
        raise Gemma4T4Error(f"unknown scale dtype {scale_dtype!r}", fix="use fp16 (T4 default) or bf16")
    with LocalCheckpoint(src_path) as reader:
        # the source folder and, for symlinked shards (the Hugging Face cache), the folders they live in
        sources = [reader.root, *{(reader.root / s).resolve().parent for s in reader.shards}]
        safepaths.refuse_overlap(dst_path, sources)
        cleanup = safepaths.clean_stale(dst_path, legacy_names=(REPORT_NAME,))
        safepaths.check_target(dst_path, overwrite=overwrite, sources=sources, legacy_names=(REPORT_NAME,))
        roles, plan, qcfg, embed_name, untie = _plan_build(reader, src, method, group_size, scale_dtype, symmetric,
                                                           emb4)
        config = _build_config(reader.read_text("config.json"), str(reader.root), qcfg, untie)
        # headers are at most a few MB; side files (tokenizer ...) are copied as they are
        need = sum(t.nbytes for t in plan) + 512 * len(plan) + _side_bytes(reader.root)
        command = "repack" if method == "lattice" else "requant-awq"
        with safepaths.partial_build(dst_path, overwrite, need, f"the build {dst_path}", command,
                                     source=str(reader.root)) as tmp:
            writer = ShardedWriter(tmp, plan, max_shard_bytes=shard_bytes)  # sized up front: a full disk fails here
            try:
                rows = _scan(reader, writer, roles, quantizer, group_size, embed_name if untie else None, progress,
                             method)
                _refuse_damaged(rows)
                files = writer.finish()
            except BaseException:
                writer.abort()
                raise
            return _write_build(tmp, files, reader.root, config, rows, t0, reader.nbytes, src=str(src),
                                dst=str(dst_path), method=method, emb4=emb4, scale_dtype=scale_dtype,
                                group_size=group_size, symmetric=symmetric, ignore=qcfg["ignore"],
                                cleanup=cleanup)


def _scan(reader: LocalCheckpoint, writer: ShardedWriter, roles: dict[str, qconfig.TensorRole], quantizer: Quantizer,
          group_size: int, lm_head_source: str | None, progress: bool | Callable[[str], None],
          method: str) -> list[TensorRepack]:
    """Copy or quantize every tensor, block by block, into ``writer`` (``lm_head_source``: the embedding
    also written as the untied lm_head): a row per tensor. Once a tensor refuses the build nothing more
    is written; the scan reads on to name every one."""
    rows: list[TensorRepack] = []
    refusing = False
    with progress_bar(reader.nbytes, progress is True, method) as bar:
        for name in sorted(reader.tensors):
            info, role = reader.tensors[name], roles[name]
            if not role.quantize:
                bad = _copy_tensor(reader, writer, name, write=not refusing)
                row = TensorRepack(name, list(info.shape), "copy", role.reason, non_finite=bad)
            else:
                row = _quantize_tensor(reader, writer, info, role.module, quantizer, group_size,
                                       write=not refusing, lm_head=name == lm_head_source)
            rows.append(row)
            refusing = refusing or bool(row.non_finite or _off_grid(row))
            bar.update(info.nbytes)
            if callable(progress):
                progress(name)
    return rows


def _off_grid(row: TensorRepack) -> int:
    """The tensor's groups off the grid that were not requantized: they refuse the build."""
    return 0 if row.groups_requantized else row.groups_off_grid


def _plan_build(reader: LocalCheckpoint, src: str | Path, method: str, group_size: int, scale_dtype: str,
                symmetric: bool, emb4: bool
                ) -> tuple[dict[str, qconfig.TensorRole], list[PlannedTensor], dict, str | None, bool]:
    """Each source tensor's role, the planned tensors in source order (quantized weights replaced by
    their packed tensors), the quantization config, and the embedding untied into an int4 lm_head."""
    roles = {n: qconfig.classify(n, i.shape, i.dtype, group_size, emb4) for n, i in reader.tensors.items()}
    quant = [n for n, r in roles.items() if r.quantize]
    if not quant:
        raise Gemma4T4Error(f"{src} has no 2-D weights to quantize", fix="point at a Gemma 4 checkpoint folder")
    embed_name = next((n for n in quant if qconfig.EMBED_RE.search(n)), None)
    untie = emb4 and embed_name is not None and "lm_head.weight" not in reader.tensors
    scale_st = "F16" if scale_dtype == "fp16" else "BF16"
    plan: list[PlannedTensor] = []
    for name in sorted(reader.tensors):
        info = reader.tensors[name]
        if roles[name].quantize:
            plan += _packed_plan(roles[name].module, info, group_size, scale_st, symmetric)
        else:
            plan.append(PlannedTensor(name, info.dtype, info.shape))
    if untie:
        plan += _packed_plan(qconfig.LM_HEAD, reader.tensors[embed_name], group_size, scale_st, symmetric)

    ignore = [r.module for r in roles.values() if r.layer and not r.quantize]  # the config sorts it
    if not (untie or ("lm_head.weight" in roles and roles["lm_head.weight"].quantize)):
        ignore.append(qconfig.LM_HEAD)
    qcfg = qconfig.quantization_config(group_size, ignore, emb4, symmetric=symmetric,
                                       observer="lattice" if method == "lattice" else "minmax")

    return roles, plan, qcfg, embed_name, untie


def _copy_tensor(reader: LocalCheckpoint, writer: ShardedWriter, name: str, write: bool) -> int:
    """Copy one tensor block by block; returns its NaN/Inf count (a NaN in a norm would reach every
    logit), writing nothing once one is found but reading on so the error names every damaged tensor."""

    bad = 0
    for start, stop in reader.row_blocks(name, BLOCK_BYTES):
        rows = reader.read_rows(name, start, stop)
        bad += lattice.count_non_finite(rows, reader.tensors[name].dtype)
        if write and not bad:
            writer.write_rows(name, start, rows)
    return bad


def _listed(entries: list[str]) -> str:
    """The first MAX_LISTED entries, and how many more."""
    more = f" and {len(entries) - MAX_LISTED} more" if len(entries) > MAX_LISTED else ""
    return ", ".join(entries[:MAX_LISTED]) + more


def _refuse_damaged(rows: list[TensorRepack]) -> None:
    """Refuse a build with NaN/Inf values or (without --allow-requant) groups off the int4 grid,
    naming the tensors."""
    non_finite = {r.name: r.non_finite for r in rows if r.non_finite}
    off_rows = [(r, count) for r in rows if (count := _off_grid(r))]
    off_grid = {r.name: count for r, count in off_rows}
    if non_finite:
        copied = sum(1 for r in rows if r.non_finite and r.action == "copy")
        kinds = ", ".join(part for part in (
            f"{len(non_finite) - copied} to quantize" if len(non_finite) > copied else "",
            f"{copied} copied as they are" if copied else "") if part)
        raise NonFiniteError(
            f"{sum(non_finite.values()):,} NaN/Inf values in {len(non_finite)} tensor(s) ({kinds}); "
            f"no int4 level can represent them and a copy would pass the damage on to every output, "
            f"so nothing was written: {_listed([f'{n} ({c:,} values)' for n, c in non_finite.items()])}",
            fix="the source checkpoint is damaged: re-download it (or restore the named tensors); "
            "--allow-requant does not apply, a NaN has no nearest level",
            tensors=non_finite,
        )
    if off_grid:
        listed = _listed([f"{r.name} ({c} groups, e.g. row/group {r.off_grid_examples[:1]})" for r, c in off_rows])
        raise OffGridError(
            f"{sum(off_grid.values())} groups in {len(off_grid)} tensor(s) are not on the int4 grid, "
            f"so a lossless repack is impossible; nothing was written: {listed}",
            fix="check the source is a QAT (-qat-q4_0-unquantized) checkpoint with `gemma4-t4 grid-check`; "
            "pass --allow-requant to round those groups (their values change)",
            tensors=off_grid,
        )


def _write_build(tmp: Path, files: list[str], src_root: Path, config: dict, rows: list[TensorRepack], t0: float,
                 bytes_read: int, **fields: object) -> RepackReport:
    """Finish the partial build ``tmp``: side files, the build's config and the report of the scan's ``rows``."""
    side = _side_items(src_root)
    for item in side:
        if item.is_dir():
            shutil.copytree(item, tmp / item.name)
        else:
            shutil.copy2(item, tmp / item.name)
    (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    packed = [r for r in rows if r.action == "int4"]
    weights = sum(r.shape[0] * r.shape[1] for r in packed)
    exact: Counter[str] = Counter()
    for r in packed:
        exact.update(r.values_bit_identical)
    seconds = time.perf_counter() - t0
    report = RepackReport(
        **fields, files=sorted({*files, *(item.name for item in side), "config.json"}), tensors_quantized=len(packed),
        tensors_copied=len(rows) - len(packed), weights_quantized=weights, groups_total=sum(r.groups for r in packed),
        groups_off_grid=sum(r.groups_off_grid for r in packed),
        groups_requantized=sum(r.groups_requantized for r in packed),
        levels_changed=sum(r.levels_changed for r in packed) if fields["method"] == "lattice" else None,
        values_bit_identical=dict(exact), values_bit_identical_pct={k: pct(v, weights) for k, v in exact.items()},
        bytes_read=bytes_read, bytes_written=sum((tmp / f).stat().st_size for f in files),
        seconds=round(seconds, 3), mb_per_s=throughput_mb_s(bytes_read, seconds), tensors=rows,
    )
    (tmp / REPORT_NAME).write_text(json.dumps(to_jsonable(report), indent=1) + "\n")
    return report


def _packed_plan(module: str, info: TensorInfo, group_size: int, scale_st: str, symmetric: bool) -> list[PlannedTensor]:
    rows, cols = info.shape
    plan = [
        PlannedTensor(f"{module}.weight_packed", "I32", (rows, cols // 8)),
        PlannedTensor(f"{module}.weight_scale", scale_st, (rows, cols // group_size)),
        PlannedTensor(f"{module}.weight_shape", "I64", (2,)),
    ]
    if not symmetric:
        plan.append(PlannedTensor(f"{module}.weight_zero_point", "I32", ((rows + 7) // 8, cols // group_size)))
    return plan


def _quantize_tensor(reader: LocalCheckpoint, writer: ShardedWriter, info: TensorInfo, module: str,
                     quantizer: Quantizer, group_size: int, write: bool, lm_head: bool) -> TensorRepack:
    rows, cols = info.shape
    targets = [module] + ([qconfig.LM_HEAD] if lm_head else [])
    row = TensorRepack(info.name, [rows, cols], "int4", "4-bit embedding (emb4), also written as an untied lm_head"
                       if lm_head else ("int4 embedding" if "embed" in module else "int4 linear"),
                       groups=rows * cols // group_size)
    if write:
        for t in targets:
            writer.write_rows(f"{t}.weight_shape", 0, np.array([rows, cols], np.int64))
    # zero points pack 8 rows per int32 word: keep blocks a multiple of 8 rows
    for start, stop in reader.row_blocks(info.name, BLOCK_BYTES, multiple=8):
        block = reader.read_rows(info.name, start, stop)
        bad = lattice.count_non_finite(block)
        if bad:  # refused whatever the quantizer would do (RTN would silently turn NaN into level 0)
            row.non_finite += bad
            write = False
            continue
        res = quantizer(block)
        row.groups_off_grid += res.off_grid
        row.groups_requantized += res.requantized
        row.levels_changed += res.levels_changed
        room = 3 - len(row.off_grid_examples)
        row.off_grid_examples += [[r + start, g] for r, g in res.off_grid_examples[:room]]
        row.values_bit_identical.update(res.exact)
        if res.off_grid and not res.requantized:
            write = False  # refusing anyway: keep scanning to name every off-grid tensor
        if write:
            packed = pack.pack_int4(res.levels)
            scale = res.scale.astype(np.float16) if writer.tensors[f"{module}.weight_scale"].dtype == "F16" \
                else lattice.f32_to_bf16_bits(res.scale)  # the stored scale dtype
            for t in targets:
                writer.write_rows(f"{t}.weight_packed", start, packed)
                writer.write_rows(f"{t}.weight_scale", start, scale)
                if res.zero_point is not None:
                    writer.write_rows(f"{t}.weight_zero_point", start // 8, pack.pack_int4_dim0(res.zero_point))
    return row


def repack(
    src: str | Path,
    dst: str | Path,
    emb4: bool = False,
    scale_dtype: str = "fp16",
    group_size: int = lattice.DEFAULT_GROUP,
    allow_requant: bool = False,
    overwrite: bool = False,
    shard_bytes: int = SHARD_BYTES,
    progress: bool | Callable[[str], None] = False,
    compare_scale_dtypes: bool = False,
) -> RepackReport:
    """Repack a QAT checkpoint into compressed-tensors int4 (symmetric, ``group_size``), losslessly
    on the grid. ``emb4`` also packs ``embed_tokens`` / ``embed_tokens_per_layer`` and writes an
    untied 4-bit ``lm_head``. fp16 scales are the T4 default (Turing has no bf16).
    Off-grid groups raise :class:`OffGridError` (nothing written) unless ``allow_requant``.
    The report counts the values kept bit-identical with ``scale_dtype``; ``compare_scale_dtypes``
    also counts them for the other scale dtype (about 40 % more compute; ``grid_check`` always
    reports both).
    """
    report_dtypes = lattice.SCALE_DTYPES if compare_scale_dtypes else (scale_dtype,)
    dtypes = tuple(dict.fromkeys((scale_dtype, *report_dtypes)))  # the written one first

    def quantize(block: np.ndarray) -> BlockResult:
        fit, choices = lattice.analyze(block, group_size, lattice.DEFAULT_TOL, dtypes)
        off_mask = ~fit.on_grid
        off = int(off_mask.sum())
        examples = np.argwhere(off_mask)[:3].tolist()  # [row, group]
        requant = changed = 0
        if off and allow_requant:  # rare: fit the off-grid groups with plain RTN and choose their scales
            w = lattice.as_values(block)
            requant = lattice.requantize_off_grid(w, fit, choices)
            deq = lattice.dequantize(fit.levels, fit.scale, group_size, "fp32")
            changed = int((np.abs(deq - w) > 0.5 * np.repeat(fit.scale, group_size, axis=1)).sum())
        exact = {dt: int(np.maximum(choices[dt].exact, 0).sum()) for dt in report_dtypes}
        chosen = choices[scale_dtype]
        if not np.all(np.isfinite(chosen.scale)):
            raise Gemma4T4Error(f"a scale overflows {scale_dtype}", fix="use --scale-dtype bf16")
        return BlockResult(fit.levels, chosen.scale, None, off, requant, examples, exact, changed)

    return build_quantized(src, dst, quantize, method="lattice", group_size=group_size, scale_dtype=scale_dtype,
                           symmetric=True, emb4=emb4, overwrite=overwrite, shard_bytes=shard_bytes,
                           progress=progress)
