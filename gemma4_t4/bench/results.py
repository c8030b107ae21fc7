"""The one results format, written incrementally so an interrupted run keeps what it measured.

A run directory holds:

* ``run.json``      — configuration, environment, prompt seed/nonce, status (rewritten atomically);
* ``records.jsonl`` — one raw request record per line (appended and flushed as requests finish),
  so every aggregate can be recomputed;
* ``summary.json``  — one entry per measured cell (rewritten atomically after every cell);
* ``summary.csv``   — the same cells, flattened, for spreadsheets;
* ``*.png``         — plots (``gemma4-t4 bench plot DIR``).
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from gemma4_t4.bench.schemas import (
    SCHEMA,
    Answer,
    CellSummary,
    RequestRecord,
    RunInfo,
    RunReport,
    StoredRecord,
    SummaryFile,
    parse_file,
)
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation import safepaths
from gemma4_t4.foundation.atomic import atomic_write_json, atomic_write_text
from gemma4_t4.foundation.table import Displayable

RUN_FILE, RECORDS_FILE, SUMMARY_FILE, CSV_FILE = "run.json", "records.jsonl", "summary.json", "summary.csv"
# the plots `bench plot` writes next to the results (plots.plot_run): --overwrite replaces these too
PLOT_FILES = (
    "throughput_vs_concurrency.png", "ttft_vs_offered_rate.png", "ttft_vs_input_len.png", "prefix_cache.png",
    "roofline.png",
)
BENCH_FILES = (RUN_FILE, RECORDS_FILE, SUMMARY_FILE, CSV_FILE, *PLOT_FILES, safepaths.MARKER_NAME)


def check_out_dir(out_dir: str | os.PathLike, overwrite: bool) -> Path:
    """Refuse an ``--out`` that would mix a run with other files, before anything is measured: a
    non-empty folder needs ``--overwrite`` and must be one the bench wrote (its marker, or older
    results files); only :data:`BENCH_FILES` are replaced there."""
    path = Path(out_dir)
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        raise Gemma4T4Error(
            f"--out {path} is {'a symbolic link' if path.is_symlink() else 'a file, not a directory'}",
            fix="choose a directory path for --out (it is created if missing)",
        )
    if not path.exists() or safepaths.holds_nothing(path):  # or only an empty marker a full disk left
        return path
    holds_results = safepaths.is_owned(path, (SUMMARY_FILE, RECORDS_FILE, RUN_FILE))
    if not overwrite:
        what = "already holds benchmark results" if holds_results else "is not empty"
        raise Gemma4T4Error(
            f"--out {path} {what}", fix="choose a new --out directory (or pass --overwrite to replace a bench run)"
        )
    if not holds_results:
        raise Gemma4T4Error(
            f"--out {path} holds files the bench did not write ({safepaths.not_owned_reason(path)}; no results), "
            "so --overwrite will not write into it",
            fix="choose a new --out directory",
        )
    return path


LATENCY_KEYS = ("ttft_ms", "ttft_first_chunk_ms", "tpot_ms", "itl_ms", "e2el_ms", "per_stream_tok_s")
CSV_STATS = ("mean", "median", "p90", "p99", "ci_low", "ci_high")
CSV_SCALARS = (
    "cell", "workload", "variant", "concurrency", "offered_rate_rps", "input_len", "output_len",
    "num_prompts", "completed", "failed", "queueing", "output_throughput_tok_s", "request_throughput_req_s",
    "tokens_per_chunk", "prefix_cache_hit_rate", "partial",
)


def cells_to_csv(cells: Sequence[CellSummary]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(list(CSV_SCALARS) + [f"{k}_{s}" for k in LATENCY_KEYS for s in CSV_STATS])
    for cell in cells:
        values = cell.model_dump() | {
            "prefix_cache_hit_rate": cell.prefix_cache.hit_rate,
            "offered_rate_rps": cell.open_loop.offered_rate_rps if cell.open_loop else None,
        }
        row = [values[k] for k in CSV_SCALARS] + [values[key][s] for key in LATENCY_KEYS for s in CSV_STATS]
        writer.writerow(["" if v is None else v for v in row])
    return buffer.getvalue()


class ResultsWriter:
    """Owns one run directory while a run is in progress: records are appended as requests finish,
    summary and run info rewritten atomically, so an interrupted run keeps what it measured."""

    def __init__(self, out_dir: str | os.PathLike, run_info: RunInfo, overwrite: bool = False):
        self.dir = check_out_dir(out_dir, overwrite)
        try:  # made first: under a file there is no folder, and nothing to replace
            self.dir.mkdir(parents=True, exist_ok=True)
            for name in BENCH_FILES:  # only what a bench run writes; other files are never touched
                (self.dir / name).unlink(missing_ok=True)
            safepaths.write_marker(self.dir, "bench run")
        except OSError as exc:
            raise Gemma4T4Error(
                f"cannot create {self.dir}: {exc.strerror or exc}", fix="choose a writable --out directory"
            ) from None
        self.run_info = run_info.model_copy(update={"schema_id": SCHEMA, "status": "running"})
        self.cells: list[CellSummary] = []
        atomic_write_json(self.dir / RUN_FILE, self.run_info.to_json())
        self._records = open(self.dir / RECORDS_FILE, "a", buffering=1)  # noqa: SIM115 - closed in close()

    def add_record(self, cell: str, phase: str, record: RequestRecord) -> None:
        line = {"cell": cell, "phase": phase} | record.model_dump(mode="json")
        self._records.write(json.dumps(line) + "\n")

    def add_cell(self, summary: CellSummary) -> None:
        self.cells = [c for c in self.cells if c.cell != summary.cell] + [summary]
        write_summary(self.dir, self.run_info, self.cells)

    def update_run(self, **fields: Any) -> None:
        self.run_info = self.run_info.model_copy(update=fields)
        atomic_write_json(self.dir / RUN_FILE, self.run_info.to_json())
        write_summary(self.dir, self.run_info, self.cells)

    def close(self) -> None:
        self._records.close()  # a file closes once; closing it again does nothing

    def result(self) -> BenchRun:
        """The run as written, in memory (nothing re-read from disk)."""
        return BenchRun(dir=self.dir, run=self.run_info, cells=list(self.cells))


def write_summary(path: Path, run: RunInfo, cells: list[CellSummary]) -> None:
    atomic_write_json(path / SUMMARY_FILE, SummaryFile(run=run.digest(), cells=cells).to_json())
    atomic_write_text(path / CSV_FILE, cells_to_csv(cells))


@dataclass
class DecodeSpeed:
    """What a decode run measured, per concurrency; no ``per_stream`` (``not_measured`` says why)
    where the server delivered each answer in one flush (vLLM's CPU build)."""

    per_stream: dict[int, float | None] | None  # median per-stream decode tok/s
    output_tok_s: dict[int, float | None]  # all streams, over the cell's window
    e2el_ms: dict[int, float | None]  # median end-to-end latency
    not_measured: str | None  # why there is no per-stream speed

    @property
    def streamed(self) -> bool:
        return self.not_measured is None


class BenchRun(Displayable, BaseModel):
    """A results directory: the run info and its measured cells, with the accessors notebooks use.
    ``run_benchmark`` returns it in memory; :meth:`load` reads (and validates) one from disk."""

    dir: Path = Field(description="the results directory")
    run: RunInfo = Field(description="run.json")
    cells: list[CellSummary] = Field(default_factory=list, description="summary.json's cells, in run order")

    @classmethod
    def load(cls, out_dir: str | os.PathLike) -> BenchRun:
        path = Path(out_dir)
        summary_path, run_path = path / SUMMARY_FILE, path / RUN_FILE
        if not summary_path.is_file():
            raise Gemma4T4Error(
                f"{path} holds no {SUMMARY_FILE}", fix="pass a directory written by gemma4-t4 bench run"
            )
        summary = parse_file(SummaryFile, summary_path)
        run = (parse_file(RunInfo, run_path) if run_path.is_file()
               else RunInfo.model_validate(summary.run))  # older results: the digest summary.json holds
        return cls(dir=path, run=run, cells=summary.cells)

    @cached_property
    def records(self) -> list[StoredRecord]:
        return read_records(self.dir / RECORDS_FILE)

    def measured(self, cell: str) -> list[StoredRecord]:
        return [r for r in self.records if r.cell == cell and r.phase == "measure"]

    @property
    def failed(self) -> int:
        return sum(c.failed for c in self.cells)

    @property
    def status(self) -> str:
        return self.run.status

    @property
    def ok(self) -> bool:
        return self.run.status == "complete"

    @property
    def not_measured(self) -> str | None:
        """``None`` when the run completed; else why its figures are not a result (a run that
        stopped early or lost requests keeps what it got, but that is not a measurement)."""
        if self.ok:
            return None
        status = self.run.status or "unknown status"
        if status == "complete with failures":
            status += f", {self.failed} request(s) failed"
        detail = f": {self.run.error}" if self.run.error and self.run.error not in status else ""
        return f"run {self.dir} is {status}{detail}"

    def require_complete(self, what: str = "a result") -> BenchRun:
        """This run, or an error naming why it is not ``what`` (for headlines built from runs)."""
        if self.not_measured:
            raise Gemma4T4Error(
                f"not measured: {self.not_measured}, so it gives no {what}",
                fix="read the run's error (run.json), fix the server or endpoint, and run the benchmark again",
            )
        return self

    def cell(
        self,
        name: str | None = None,
        *,
        workload: str | None = None,
        variant: str | None = None,
        concurrency: int | None = None,
        input_len: int | None = None,
    ) -> CellSummary:
        """The one cell matching a name or the given facts (an error naming the cells if none/several)."""
        facts = {"cell": name, "workload": workload, "variant": variant, "concurrency": concurrency,
                 "input_len": input_len}
        found = [c for c in self.cells if all(v is None or getattr(c, k) == v for k, v in facts.items())]
        if len(found) != 1:
            raise Gemma4T4Error(
                f"{len(found)} cells of {self.dir} match; cells: {[c.cell for c in self.cells]}",
                fix="name the cell, or give workload/variant/concurrency/input_len",
            )
        return found[0]

    @property
    def decode_not_measured(self) -> str | None:
        """``None`` when every measured cell streamed its tokens; else why TPOT, ITL and per-stream
        tok/s are not measured (the first cell whose answers came in one flush, named)."""
        buffered = next((c for c in self.cells if c.buffered), None)
        return f"{buffered.buffered.reason} in cell {buffered.cell}" if buffered else None

    def require_streamed(self, what: str = "a per-stream decode speed") -> BenchRun:
        """This run, or an error naming the flush that leaves it without ``what``."""
        if self.decode_not_measured:
            raise Gemma4T4Error(
                f"{self.dir} gives no {what}: {self.decode_not_measured}",
                fix="read its output tok/s and E2EL instead (they time the whole generation), "
                "or measure on a server that streams tokens as it makes them (vLLM on a GPU)",
            )
        return self

    def decode_speed(self) -> DecodeSpeed:
        """The decode figures of a complete run (refused, naming why, for one that did not
        complete), per-stream only where tokens were streamed."""
        why = self.require_complete("decode speed").decode_not_measured
        return DecodeSpeed(
            per_stream=None if why else self.per_stream_by_concurrency(),
            output_tok_s=self.throughput_by_concurrency(),
            e2el_ms=self._decode_medians("e2el_ms"),
            not_measured=why,
        )

    def _decode_medians(self, key: str) -> dict[int, float | None]:
        return {c.concurrency: getattr(c, key).median
                for c in self.cells if c.workload == "decode" and c.concurrency is not None}

    def per_stream_by_concurrency(self) -> dict[int, float | None]:
        """Median per-stream decode tok/s per concurrency (None: answers came in one flush)."""
        return self._decode_medians("per_stream_tok_s")

    def throughput_by_concurrency(self) -> dict[int, float | None]:
        """Aggregate output tok/s (all streams) for each concurrency."""
        return {
            c.concurrency: c.output_throughput_tok_s
            for c in self.cells
            if c.workload in ("decode", "load") and c.concurrency is not None
        }

    def ttft_by_input_len(self) -> dict[int, float | None]:
        """Median TTFT (ms) for each input length of a ttft run."""
        return {c.input_len: c.ttft_ms.median for c in self.cells if c.workload == "ttft" and c.input_len}

    def prefix_hit_rate(self) -> float | None:
        """The shared-prefix cell's measured hit rate (None if the server exposes no counters)."""
        return next((c.prefix_cache.hit_rate for c in self.cells if c.variant == "shared_prefix"), None)

    def answers(self) -> list[Answer]:
        """Every answer of an answers run (first cell with answers)."""
        return next((c.answers for c in self.cells if c.answers), [])

    def caption(self) -> str | None:
        """What the run is and where it ran; a run that did not complete says its figures are no result."""
        what = self.run.label or self.run.workload or "run"
        where = f" on {self.run.base_url}" if self.run.base_url else ""
        return f"{what}{where}: not measured: {self.not_measured}" if self.not_measured else f"{what}{where}"

    def table_rows(self) -> list[dict[str, object]]:
        """One display row per measured cell (what notebooks show): concurrency is the streams of a
        closed loop, "R req/s" of an open one; a decode figure of a flushed cell is why it has none."""
        return [
            {"workload": c.workload, "variant": c.variant,
             "concurrency": c.concurrency if c.concurrency is not None
             else f"{c.open_loop.offered_rate_rps if c.open_loop else None} req/s",
             "input tokens": c.input_len, "output tokens": c.output_len, "ok": c.completed, "failed": c.failed,
             "TTFT ms (median)": c.ttft_ms.median, "TPOT ms (median)": c.decode_median(c.tpot_ms),
             "per-stream tok/s (median)": c.decode_median(c.per_stream_tok_s), "E2EL ms (median)": c.e2el_ms.median,
             "output tok/s (all streams)": c.output_throughput_tok_s,
             "prefix cache hit rate": c.prefix_cache.hit_rate}
            for c in self.cells
        ]

    def notes(self) -> list[str]:
        """What a cell's row does not show: it queued, stopped early, reached the in-flight cap, or drafted."""
        out = []
        for c in self.cells:
            flags = [name for name, on in (("queueing", c.queueing), ("partial", c.partial),
                                           ("in-flight cap reached", c.open_loop and c.open_loop.cap_reached)) if on]
            spec = c.spec_decode
            if spec and spec.acceptance_rate is not None and spec.mean_accepted_length is not None:
                flags.append(f"drafts accepted {spec.acceptance_rate:.0%}, "
                             f"mean accepted length {spec.mean_accepted_length:.2f}")
            if flags:
                out.append(f"{c.cell}: {'; '.join(flags)}")
        return out

    def table(self) -> str:
        """The run as text (the CLI's and the MCP report's): its display; an incomplete run's caption
        says its cells are no result."""
        return str(self)

    def report(self) -> RunReport:
        return RunReport(
            status=self.status, out_dir=str(self.dir), failed=self.failed, table=self.table(),
            cells=self.cells, run=self.run,
        )


def read_records(path: Path) -> list[StoredRecord]:
    """Records, skipping a torn last line left by a hard kill."""
    out: list[StoredRecord] = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            out.append(StoredRecord.model_validate_json(line))
        except ValueError:  # a torn or blank line (pydantic's ValidationError is a ValueError)
            continue
    return out


def load_run(out_dir: str | os.PathLike | BenchRun) -> BenchRun:
    """The run in ``out_dir`` (a run already loaded is itself)."""
    return out_dir if isinstance(out_dir, BenchRun) else BenchRun.load(out_dir)
