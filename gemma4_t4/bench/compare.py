"""A/B comparison of two results directories: ratios B/A of medians with bootstrap intervals,
matched cell by cell (workload, variant, concurrency, input and output length)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from gemma4_t4.bench.answers import AnswerComparison, compare_answers
from gemma4_t4.bench.metrics import ratio_ci, request_metrics
from gemma4_t4.bench.results import BenchRun, load_run

# metric -> (per-request extractor, True when higher is better)
METRICS: dict[str, tuple[str, bool]] = {
    "ttft_ms": ("ttft_ms", False),
    "tpot_ms": ("tpot_ms", False),
    "e2el_ms": ("e2el_ms", False),
    "per_stream_tok_s": ("per_stream_tok_s", True),
}


@dataclass
class Ratio:
    metric: str
    a: float | None
    b: float | None
    ratio: float | None  # b / a
    ci_low: float | None
    ci_high: float | None
    higher_is_better: bool


@dataclass
class CellComparison:
    key: tuple
    cell_a: str
    cell_b: str
    ratios: list[Ratio]


@dataclass
class RunComparison:
    a: str
    b: str
    cells: list[CellComparison]
    unmatched_a: list[str] = field(default_factory=list)
    unmatched_b: list[str] = field(default_factory=list)
    answers: AnswerComparison | None = None

    def text(self) -> str:
        lines = [f"B/A ratios (A = {self.a}, B = {self.b}); [95 % bootstrap interval]"]
        for cell in self.cells:
            lines.append(f"\n{cell.cell_a}" + (f"  vs  {cell.cell_b}" if cell.cell_b != cell.cell_a else ""))
            for r in cell.ratios:
                interval = f"[{r.ci_low:.3f}, {r.ci_high:.3f}]" if r.ci_low is not None else "[no interval]"
                ratio = f"{r.ratio:.3f}x" if r.ratio is not None else "-"
                lines.append(f"  {r.metric:<26} A {_num(r.a):>10}  B {_num(r.b):>10}  B/A {ratio:>8} {interval}"
                             + ("  (higher is better)" if r.higher_is_better else ""))
        if self.unmatched_a or self.unmatched_b:
            lines.append(f"\nunmatched cells: A {self.unmatched_a}  B {self.unmatched_b}")
        if self.answers:
            lines.append("\n" + self.answers.text())
        return "\n".join(lines)


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:,.2f}"


def cell_key(cell: dict[str, Any]) -> tuple:
    return (cell.get("workload"), cell.get("variant"), cell.get("concurrency"),
            (cell.get("open_loop") or {}).get("offered_rate_rps"), cell.get("input_len"), cell.get("output_len"))


def _per_request(run: BenchRun, cell: str, attr: str) -> list[float]:
    out = []
    for record in run.measured(cell):
        value = getattr(request_metrics(record), attr)
        if value is not None:
            out.append(value)
    return out


def compare_runs(a: str | os.PathLike | BenchRun, b: str | os.PathLike | BenchRun) -> RunComparison:
    run_a = a if isinstance(a, BenchRun) else load_run(a)
    run_b = b if isinstance(b, BenchRun) else load_run(b)
    by_b = {cell_key(c): c for c in run_b.cells}
    matched, unmatched_a = [], []
    for ca in run_a.cells:
        cb = by_b.pop(cell_key(ca), None)
        if cb is None:
            unmatched_a.append(ca["cell"])
            continue
        ratios = []
        for name, (attr, higher) in METRICS.items():
            va, vb = _per_request(run_a, ca["cell"], attr), _per_request(run_b, cb["cell"], attr)
            point, low, high = ratio_ci(va, vb)
            ratios.append(Ratio(name, (ca.get(name) or {}).get("median"), (cb.get(name) or {}).get("median"),
                                point, low, high, higher))
        ta, tb = ca.get("output_throughput_tok_s"), cb.get("output_throughput_tok_s")
        ratios.append(Ratio("output_throughput_tok_s", ta, tb, (tb / ta) if ta and tb else None, None, None, True))
        matched.append(CellComparison(cell_key(ca), ca["cell"], cb["cell"], ratios))
    answers = None
    answers_a = [x for c in run_a.cells for x in c.get("answers") or []]
    answers_b = [x for c in run_b.cells for x in c.get("answers") or []]
    if answers_a and answers_b:
        answers = compare_answers(answers_a, answers_b)
    return RunComparison(str(run_a.dir), str(run_b.dir), matched, unmatched_a,
                         [c["cell"] for c in by_b.values()], answers)
