"""A/B comparison of two results directories: ratios B/A of medians with bootstrap intervals,
matched cell by cell (workload, variant, concurrency, input and output length)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from gemma4_t4.bench.answers import AnswerComparison, compare_answers
from gemma4_t4.bench.derive import cost
from gemma4_t4.bench.metrics import aggregate, buffered_delivery, median, ratio_ci, request_metrics
from gemma4_t4.bench.published import Kind, PublishedSageMaker, measured_kind, published_decode
from gemma4_t4.bench.results import RECORDS_FILE, SUMMARY_FILE, BenchRun, load_run
from gemma4_t4.bench.schemas import CellStats, CellSummary, SpecDecode
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation.table import Displayable

# metric (a per-request figure and a cell statistic) -> True when higher is better
METRICS = {"ttft_ms": False, "tpot_ms": False, "e2el_ms": False, "per_stream_tok_s": True}


@dataclass
class Ratio:
    metric: str
    higher_is_better: bool
    a: float | None = None
    b: float | None = None
    ratio: float | None = None  # b / a
    ci_low: float | None = None
    ci_high: float | None = None
    not_measured: str | None = None  # why there is no figure (answers that came in one flush)


@dataclass
class CellComparison:
    key: tuple
    cell_a: str
    cell_b: str
    ratios: list[Ratio]
    spec_a: SpecDecode | None = None  # drafter on vs off: acceptance of each side (None: no drafter)
    spec_b: SpecDecode | None = None


@dataclass
class RunComparison(Displayable):
    a: str
    b: str
    cells: list[CellComparison]
    unmatched_a: list[str] = field(default_factory=list)
    unmatched_b: list[str] = field(default_factory=list)
    answers: AnswerComparison | None = None
    not_measured: list[str] = field(default_factory=list)  # runs that did not complete: no ratios

    @property
    def problems(self) -> list[str]:
        """Why this is not (wholly) a comparison; empty when it is one."""
        out = [f"not measured: {why}" for why in self.not_measured]
        if not self.not_measured and not self.cells and not self.answers:
            out.append(
                "nothing compared: no cell of A matches one of B (same workload, variant, "
                f"concurrency, rate, input and output length); A has {self.unmatched_a}, B has {self.unmatched_b}"
            )
        if self.answers and not self.answers.measured and not self.not_measured:
            out.append(f"answers {self.answers.line()}")
        return out

    def caption(self) -> str:
        return "; ".join([f"B/A ratios (A = {self.a}, B = {self.b})", *self.problems])

    columns = ("cell", "metric", "higher is better", "A", "B", "B/A [95 % interval]")

    def table_rows(self) -> list[dict[str, object]]:
        """One row per compared figure of each matched cell, and one for its drafter's acceptance."""
        rows: list[dict[str, object]] = []
        for cell in self.cells:
            name = cell.cell_a if cell.cell_b == cell.cell_a else f"{cell.cell_a} vs {cell.cell_b}"
            rows += [{"cell": name, "metric": r.metric, "higher is better": r.higher_is_better, "A": r.a,
                      "B": r.b, "B/A [95 % interval]": r.not_measured or _ratio(r.ratio, r.ci_low, r.ci_high)}
                     for r in cell.ratios]
            if cell.spec_a or cell.spec_b:
                rows.append({"cell": name, "metric": "drafter", "A": _drafter(cell.spec_a),
                             "B": _drafter(cell.spec_b)})
        return rows

    def notes(self) -> list[str]:
        unmatched = self.unmatched_a or self.unmatched_b
        return ([f"unmatched cells: A {self.unmatched_a}  B {self.unmatched_b}"] if unmatched else []) + (
            [self.answers.text()] if self.answers else [])


def _drafter(spec: SpecDecode | None) -> str:
    if spec is None:
        return "off"
    if spec.acceptance_rate is None or spec.mean_accepted_length is None:
        return f"on ({spec.source})"
    return f"accepted {spec.acceptance_rate:.1%}, mean accepted length {spec.mean_accepted_length:.2f}"


def _ratio(ratio: float | None, low: float | None = None, high: float | None = None) -> str | None:
    """A measured ratio, 3 decimals, with its 95 % bootstrap interval or a word that it has none."""
    if ratio is None:
        return None
    interval = f"[{low:.3f}, {high:.3f}]" if low is not None and high is not None else "[no interval]"
    return f"{ratio:.3f} {interval}"


def cell_key(cell: CellSummary) -> tuple:
    rate = cell.open_loop.offered_rate_rps if cell.open_loop else None
    return (cell.workload, cell.variant, cell.concurrency, rate, cell.input_len, cell.output_len)


DECODE_METRICS = ("tpot_ms", "per_stream_tok_s")


def _recomputed(run: BenchRun, cell: CellSummary, side: str) -> CellStats | str:
    """The cell's statistics from its measured records, or why they cannot be (no records)."""
    records = run.measured(cell.cell)
    if not records:
        return (
            f"{side}: {run.dir / RECORDS_FILE} holds no measured records of cell {cell.cell}, so its "
            "figures cannot be checked (summary.json alone can be edited); compare runs with their records.jsonl"
        )
    return aggregate(records)


def _per_request(run: BenchRun, cell: str, attr: str) -> list[float]:
    values = (getattr(request_metrics(record), attr) for record in run.measured(cell))
    return [v for v in values if v is not None]


def compare_runs(a: str | os.PathLike | BenchRun, b: str | os.PathLike | BenchRun) -> RunComparison:
    run_a, run_b = load_run(a), load_run(b)
    incomplete = [
        f"{side}: {run.not_measured}" for side, run in (("A", run_a), ("B", run_b)) if run.not_measured
    ]
    if incomplete:  # what a stopped run got is no result: no ratios from it
        return RunComparison(str(run_a.dir), str(run_b.dir), [], not_measured=incomplete)
    by_b = {cell_key(c): c for c in run_b.cells}
    matched, unmatched_a, missing = [], [], []  # missing: cells whose records are gone, nothing to compute from
    for ca in run_a.cells:
        cb = by_b.pop(cell_key(ca), None)
        if cb is None:
            unmatched_a.append(ca.cell)
            continue
        # every figure printed comes from the records (summary.json is a cache that can be edited)
        sa, sb = _recomputed(run_a, ca, "A"), _recomputed(run_b, cb, "B")
        if isinstance(sa, str) or isinstance(sb, str):
            why = " / ".join(x for x in (sa, sb) if isinstance(x, str))
            if ca.workload != "answers":  # an answers run's result is its answers, compared below
                missing.append(why)
            ratios = [Ratio(n, h, not_measured=why) for n, h in METRICS.items()]
        else:
            flush = " / ".join(
                f"{side}: {s.buffered.reason}" for side, s in (("A", sa), ("B", sb)) if s.buffered
            )
            ratios = [
                # a flushed stream times no decoding: no figure, no ratio
                Ratio(name, higher, not_measured=flush) if flush and name in DECODE_METRICS
                else Ratio(name, higher, getattr(sa, name).median, getattr(sb, name).median,
                           *ratio_ci(_per_request(run_a, ca.cell, name), _per_request(run_b, cb.cell, name)))
                for name, higher in METRICS.items()
            ]
            ta, tb = sa.output_throughput_tok_s, sb.output_throughput_tok_s
            ratios.append(Ratio("output_throughput_tok_s", True, ta, tb, (tb / ta) if ta and tb else None))
        matched.append(CellComparison(cell_key(ca), ca.cell, cb.cell, ratios, ca.spec_decode, cb.spec_decode))
    answers = compare_answers(run_a, run_b) if run_a.answers() or run_b.answers() else None
    unmatched_b = [c.cell for c in by_b.values()]
    return RunComparison(str(run_a.dir), str(run_b.dir), matched, unmatched_a, unmatched_b, answers, missing)


# ---------------------------------------------------------------- T4 vs L4: one headline per model


def is_suite(path: str | os.PathLike) -> bool:
    """A folder of results directories (not itself one)."""
    p = Path(path)
    holds_runs = p.is_dir() and any((d / SUMMARY_FILE).is_file() for d in p.iterdir())
    return holds_runs and not (p / SUMMARY_FILE).exists()


def load_suite(path: str | os.PathLike) -> list[BenchRun]:
    p = Path(path)
    if (p / SUMMARY_FILE).exists():
        return [load_run(p)]
    runs = [load_run(d) for d in sorted(p.iterdir()) if (d / SUMMARY_FILE).is_file()] if p.is_dir() else []
    if not runs:
        raise Gemma4T4Error(
            f"{p} holds no benchmark results", fix="pass a results directory or a folder of them"
        )
    return runs


@dataclass
class Headline(Displayable):
    """One model measured on A and on B (e.g. T4 and L4). Ratios are A/B (T4/L4, as published)."""

    model: str
    decode_method: str | None  # "series" | "per-stream c=1"
    decode_a: float | None
    decode_b: float | None
    decode_ratio: float | None
    decode_ci_low: float | None
    decode_ci_high: float | None
    ttft_a_ms: float | None
    ttft_b_ms: float | None
    ttft_ratio: float | None
    answers: AnswerComparison | None
    usd_per_mtok_a: dict[str, float]
    usd_per_mtok_b: dict[str, float]
    published: PublishedSageMaker | None
    not_measured: list[str] = field(default_factory=list)  # this model's runs that did not complete
    kind_a: Kind | None = None  # what A and B measured on, from what their runs recorded
    kind_b: Kind | None = None
    decode_not_measured: list[str] = field(default_factory=list)  # e.g. answers that came in one flush
    unpriced_a: str | None = None  # why A shows no $/Mtok (a tiny model, a CPU, ...)
    unpriced_b: str | None = None

    def caption(self) -> str:
        return "; ".join([f"{self.model}: A/B, measured", *(f"not measured: {w}" for w in self.not_measured)])

    def table_rows(self) -> list[dict[str, object]]:
        """Decode, TTFT and $/Mtok, A beside B, then the published row (T4 as A, L4 as B)."""
        ratio = "A/B [95 % interval]"
        rows = [
            {"figure": f"decode tok/s ({self.decode_method or '-'})", "A": self.decode_a, "B": self.decode_b,
             ratio: _ratio(self.decode_ratio, self.decode_ci_low, self.decode_ci_high)
             or "; ".join(self.decode_not_measured) or "not measured on both sides"},
            {"figure": "TTFT ms (median)", "A": self.ttft_a_ms, "B": self.ttft_b_ms,
             ratio: _ratio(self.ttft_ratio)},
            {"figure": "$/Mtok (at the best output tok/s)", "A": _usd(self.usd_per_mtok_a, self.unpriced_a),
             "B": _usd(self.usd_per_mtok_b, self.unpriced_b)},
        ]
        p = self.published
        if p is not None:
            rows.append({"figure": f"{_published(p)}: decode tok/s T4 | L4",
                         "A": p.t4_tok_s, "B": p.l4_tok_s,
                         ratio: f"{p.t4_tok_s / p.l4_tok_s:.3f}" if p.t4_tok_s else None})
        return rows

    def notes(self) -> list[str]:
        """The answers compared, and the published row's answers and source."""
        out = [self.answers.text()] if self.answers else []
        p = self.published
        if p is not None:
            out.append(f"{_published(p)}: identical answers {p.identical_answers or '-'}  [{p.source}]")
        return out


def _published(p: PublishedSageMaker) -> str:
    return f"published ({p.model} {p.build}, not our measurement)"


def _usd(prices: dict[str, float], unpriced: str | None) -> str | None:
    """$/Mtok of each instance a side was priced as, or why it shows none."""
    return ", ".join(f"{k} ${v:.2f}" for k, v in prices.items()) or unpriced


@dataclass
class SuiteComparison(Displayable):
    a: str
    b: str
    headlines: list[Headline]
    unmatched_models: list[str] = field(default_factory=list)

    @property
    def problems(self) -> list[str]:
        """Why this is not (wholly) a comparison; empty when it is one."""
        out = [f"{h.model}: not measured: {why}" for h in self.headlines for why in h.not_measured]
        out += [
            f"{h.model}: answers {h.answers.line()}"
            for h in self.headlines
            if h.answers and not h.answers.measured and not h.not_measured
        ]
        if not self.headlines:
            out.append(
                f"nothing compared: no model was run on both sides (one side only: {self.unmatched_models})"
            )
        return out

    def caption(self) -> str:
        return "; ".join([f"A = {self.a}, B = {self.b}", *self.problems])

    def table_rows(self) -> list[dict[str, object]]:
        """Each model's headline rows, the model named in each."""
        return [{"model": h.model, **row} for h in self.headlines for row in h.table_rows()]

    def notes(self) -> list[str]:
        out = [f"{h.model}: {note}" for h in self.headlines for note in h.notes()]
        return out + ([f"models on one side only: {self.unmatched_models}"] if self.unmatched_models else [])


def _decode_samples(runs: list[BenchRun]) -> tuple[str | None, list[float], str | None]:
    """(method, per-request decode tok/s, why there are none). The series' method times whole
    requests, so it holds for a server that flushes its answers; per-stream speed does not."""
    for run in runs:
        sd = run.run.series_decode
        if sd and sd.samples:
            return "series", sd.samples, None
    for run in runs:
        for c in run.cells:
            if c.workload == "decode" and c.concurrency == 1 and c.completed:
                flushed = buffered_delivery(run.measured(c.cell))
                if flushed:
                    return "per-stream c=1", [], f"{flushed.reason} ({run.dir}, cell {c.cell})"
                samples = _per_request(run, c.cell, "per_stream_tok_s")
                # no sample (no request streamed two timed tokens): named, as a flush is, not shown as a blank
                why = None if samples else f"not measured: no request streamed tokens to time ({run.dir}, cell {c.cell})"
                return "per-stream c=1", samples, why
    return None, [], None


def _ttft_samples(runs: list[BenchRun]) -> list[float]:
    for run in runs:
        for c in run.cells:
            if c.workload in ("decode", "ttft") and c.concurrency == 1 and c.completed:
                return _per_request(run, c.cell, "ttft_ms")
    return []


def _prices(runs: list[BenchRun]) -> tuple[dict[str, float], str | None]:
    """$/Mtok at the best measured output tok/s (from the records), or why none is shown: only
    a real Gemma 4 size on the GPU it was priced as gets a price."""
    if not runs:
        return {}, None
    kind = measured_kind(runs[0])  # the GPU the headline names is the one priced, or none is
    unpriced = kind.unpriced(next(filter(None, (r.run.config.get("gpu") for r in runs)), None))
    if unpriced:
        return {}, unpriced
    measured = [(aggregate(run.measured(c.cell)).output_throughput_tok_s or 0.0, c)
                for run in runs for c in run.cells if c.workload in ("decode", "load")]
    tok_s, best = max(measured, key=lambda m: m[0], default=(0.0, None))
    if not tok_s:
        return {}, None
    # the instances the run was priced as (none recorded: every instance of its GPU)
    return cost(tok_s, list(best.derived.usd_per_million_output_tokens or {}), kind.gpu), None


def _median(values: list[float]) -> float | None:
    return median(values) if values else None


def compare_suites(a: str | os.PathLike, b: str | os.PathLike) -> SuiteComparison:
    """Per model: decode A/B with an interval, TTFT A/B, identical answers, $/Mtok, published row."""
    runs_a, runs_b = load_suite(a), load_suite(b)
    models_a, models_b = ({r.run.model or "?" for r in runs} for runs in (runs_a, runs_b))
    headlines = []
    for model in sorted(models_a & models_b):
        every_a, every_b = ([r for r in runs if (r.run.model or "?") == model] for runs in (runs_a, runs_b))
        incomplete = [
            f"{side}: {r.not_measured}" for side, runs in (("A", every_a), ("B", every_b)) for r in runs if r.not_measured
        ]
        # figures come from complete runs only; a stopped run is named, never averaged in
        ra, rb = ([r for r in runs if r.ok] for runs in (every_a, every_b))
        method_a, da, unmeasured_a = _decode_samples(ra)
        method_b, db, unmeasured_b = _decode_samples(rb)
        unmeasured = [f"{side}: {why}" for side, why in (("A", unmeasured_a), ("B", unmeasured_b)) if why]
        method = method_a if method_a == method_b and not unmeasured else None
        point, low, high = ratio_ci(db, da) if method else (None, None, None)  # A/B
        answers_a, answers_b = (
            next((r for r in runs if r.answers() or r.run.workload == "answers"), None) for runs in (every_a, every_b)
        )
        build = next(filter(None, (r.run.config.get("model_format") for r in ra + rb)), None)
        ma, mb = _median(_ttft_samples(ra)), _median(_ttft_samples(rb))
        (prices_a, unpriced_a), (prices_b, unpriced_b) = _prices(ra), _prices(rb)
        headlines.append(
            Headline(
                model=model, decode_method=method, decode_a=_median(da) if method else None,
                decode_b=_median(db) if method else None, decode_ratio=point, decode_ci_low=low,
                decode_ci_high=high, ttft_a_ms=ma, ttft_b_ms=mb, ttft_ratio=(ma / mb) if ma and mb else None,
                answers=compare_answers(answers_a, answers_b) if answers_a and answers_b else None,
                usd_per_mtok_a=prices_a, usd_per_mtok_b=prices_b, unpriced_a=unpriced_a,
                unpriced_b=unpriced_b, decode_not_measured=unmeasured, published=published_decode(model, build),
                not_measured=incomplete, kind_a=measured_kind(ra[0]) if ra else None,
                kind_b=measured_kind(rb[0]) if rb else None,
            )
        )
    return SuiteComparison(str(a), str(b), headlines, sorted(models_a ^ models_b))
