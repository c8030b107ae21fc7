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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gemma4_t4.atomic import atomic_write_json, atomic_write_text
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.jsonable import to_jsonable

SCHEMA = "gemma4_t4.bench/1"
RUN_FILE, RECORDS_FILE, SUMMARY_FILE, CSV_FILE = "run.json", "records.jsonl", "summary.json", "summary.csv"
LATENCY_KEYS = ("ttft_ms", "ttft_first_chunk_ms", "tpot_ms", "itl_ms", "e2el_ms", "per_stream_tok_s")
CSV_STATS = ("mean", "median", "p90", "p99", "ci_low", "ci_high")
CSV_SCALARS = ("cell", "workload", "variant", "concurrency", "offered_rate_rps", "input_len", "output_len", "num_prompts",
               "completed", "failed", "queueing", "output_throughput_tok_s", "request_throughput_req_s",
               "tokens_per_chunk", "prefix_cache_hit_rate", "partial")


def cells_to_csv(cells: list[dict[str, Any]]) -> str:
    header = list(CSV_SCALARS) + [f"{k}_{s}" for k in LATENCY_KEYS for s in CSV_STATS]
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(header)
    for cell in cells:
        nested = {"prefix_cache_hit_rate": (cell.get("prefix_cache") or {}).get("hit_rate"),
                  "offered_rate_rps": (cell.get("open_loop") or {}).get("offered_rate_rps")}
        row = [nested[k] if k in nested else cell.get(k) for k in CSV_SCALARS]
        for key in LATENCY_KEYS:
            stats = cell.get(key) or {}
            row += [stats.get(s) for s in CSV_STATS]
        writer.writerow(["" if v is None else v for v in row])
    return buffer.getvalue()


class ResultsWriter:
    """Owns one run directory while a run is in progress."""

    def __init__(self, out_dir: str | os.PathLike, run_info: dict[str, Any], overwrite: bool = False):
        self.dir = Path(out_dir)
        if (self.dir / SUMMARY_FILE).exists() or (self.dir / RECORDS_FILE).exists():
            if not overwrite:
                raise Gemma4T4Error(f"{self.dir} already holds benchmark results",
                                    fix="choose a new --out directory (or pass --overwrite)")
            for name in (RECORDS_FILE, SUMMARY_FILE, CSV_FILE, RUN_FILE):
                (self.dir / name).unlink(missing_ok=True)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.run_info = {"schema": SCHEMA, "status": "running"} | run_info
        self.cells: list[dict[str, Any]] = []
        atomic_write_json(self.dir / RUN_FILE, self.run_info)
        self._records = open(self.dir / RECORDS_FILE, "a", buffering=1)  # noqa: SIM115 - closed in close()

    def add_record(self, cell: str, phase: str, record: dict[str, Any]) -> None:
        self._records.write(json.dumps({"cell": cell, "phase": phase} | record) + "\n")

    def add_cell(self, summary: dict[str, Any]) -> None:
        self.cells = [c for c in self.cells if c["cell"] != summary["cell"]] + [summary]
        self._write_summary()

    def _write_summary(self) -> None:
        atomic_write_json(self.dir / SUMMARY_FILE, {"schema": SCHEMA, "run": self._run_digest(),
                                                    "cells": self.cells})
        atomic_write_text(self.dir / CSV_FILE, cells_to_csv(to_jsonable(self.cells)))

    def _run_digest(self) -> dict[str, Any]:
        keep = ("run_id", "workload", "model", "base_url", "status", "started_at", "finished_at", "label")
        return {k: self.run_info.get(k) for k in keep if k in self.run_info}

    def update_run(self, **fields: Any) -> None:
        self.run_info.update(fields)
        atomic_write_json(self.dir / RUN_FILE, self.run_info)
        self._write_summary()

    def close(self) -> None:
        if not self._records.closed:
            self._records.close()


@dataclass
class BenchRun:
    """A results directory loaded back (or just written)."""

    dir: Path
    run: dict[str, Any]
    cells: list[dict[str, Any]]
    _records: list[dict[str, Any]] | None = field(default=None, repr=False)

    @property
    def records(self) -> list[dict[str, Any]]:
        if self._records is None:
            self._records = read_records(self.dir / RECORDS_FILE)
        return self._records

    def measured(self, cell: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r.get("cell") == cell and r.get("phase") == "measure"]

    @property
    def failed(self) -> int:
        return sum(int(c.get("failed") or 0) for c in self.cells)

    @property
    def status(self) -> str:
        return str(self.run.get("status"))

    def table(self) -> str:
        return format_cells(self.cells)


def read_records(path: Path) -> list[dict[str, Any]]:
    """Records, skipping a torn last line left by a hard kill."""
    out = []
    if not path.exists():
        return out
    with open(path) as handle:
        for line in handle:
            line = line.strip()
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def load_run(out_dir: str | os.PathLike) -> BenchRun:
    path = Path(out_dir)
    summary_path = path / SUMMARY_FILE
    if not summary_path.exists():
        raise Gemma4T4Error(f"{path} holds no {SUMMARY_FILE}",
                            fix="pass a directory written by gemma4-t4 bench run")
    try:
        summary = json.loads(summary_path.read_text())
        run = json.loads((path / RUN_FILE).read_text()) if (path / RUN_FILE).exists() else summary.get("run", {})
    except ValueError as exc:
        raise Gemma4T4Error(f"{summary_path} is not valid JSON: {exc}", fix="re-run the benchmark") from None
    if summary.get("schema") != SCHEMA:
        raise Gemma4T4Error(f"{summary_path} has schema {summary.get('schema')!r}, expected {SCHEMA!r}",
                            fix="re-run the benchmark with this version of gemma4-t4")
    return BenchRun(path, run, summary.get("cells", []))


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def format_cells(cells: list[dict[str, Any]]) -> str:
    """A plain-text table of medians (p90 where it matters), one line per cell."""
    header = (f"{'cell':<44} {'c':>3} {'in':>5} {'out':>4} {'ok/fail':>8} {'TTFT p50':>9} {'TTFT p90':>9} "
              f"{'TPOT p50':>9} {'ITL p99':>8} {'stream t/s':>10} {'out tok/s':>9} {'hit %':>6}")
    lines = [header, "-" * len(header)]
    for c in cells:
        hit = (c.get("prefix_cache") or {}).get("hit_rate")
        flags = (" [queueing]" if c.get("queueing") else "") + (" [partial]" if c.get("partial") else "")
        open_loop = c.get("open_loop") or {}
        if open_loop.get("cap_reached"):
            flags += " [in-flight cap reached]"
        load = c.get("concurrency") if c.get("concurrency") is not None else f"{open_loop.get('offered_rate_rps'):g}/s"
        lines.append(
            f"{c['cell'][:44]:<44} {load:>3} {_fmt(c.get('input_len')):>5} "
            f"{_fmt(c.get('output_len')):>4} {str(c.get('completed')) + '/' + str(c.get('failed')):>8} "
            f"{_fmt((c.get('ttft_ms') or {}).get('median')):>9} {_fmt((c.get('ttft_ms') or {}).get('p90')):>9} "
            f"{_fmt((c.get('tpot_ms') or {}).get('median'), 2):>9} {_fmt((c.get('itl_ms') or {}).get('p99')):>8} "
            f"{_fmt((c.get('per_stream_tok_s') or {}).get('median')):>10} "
            f"{_fmt(c.get('output_throughput_tok_s')):>9} {_fmt(hit * 100 if hit is not None else None):>6}{flags}"
        )
    return "\n".join(lines)
