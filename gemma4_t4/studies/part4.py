"""Part 4 of the notebook series (Gemma 4 on a T4): the host steps (doctor, torch, swap, the sm_75
proof), the workloads, and the results that read the learner's own numbers, check them, plot
themselves and write the part's summary. The notebook makes one short call per step."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gemma4_t4.bench.answers import compare_answers
from gemma4_t4.bench.compare import compare_suites
from gemma4_t4.bench.plots import plot_t4_part
from gemma4_t4.bench.pricing import CostTable, measured_price
from gemma4_t4.bench.published import (
    T4_DRAFTER,
    gce_t4,
    headline_rows,
    sagemaker_decode_table,
    t4_beside,
)
from gemma4_t4.bench.results import BenchRun, load_run
from gemma4_t4.bench.specs import AnswersSpec, DecodeSpec, PrefixSpec, TTFTSpec, WorkloadSpec, run
from gemma4_t4.catalog.hardware import PRICES, InstancePrice, price_key
from gemma4_t4.catalog.models import FitResult, FitTable, fit_table, largest_fitting, load_ram
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation.figures import show_image
from gemma4_t4.foundation.table import Displayable, Table, show_table
from gemma4_t4.host import env, swap, torchfix
from gemma4_t4.venues.endpoint import Budget, Endpoint, start_owned_server
from gemma4_t4.venues.parameters import is_real_number
from gemma4_t4.venues.parts import FIX, PartStudy, context_for, refuse_unmeasured, sagemaker_endpoint
from gemma4_t4.venues.runtime import RuntimeInfo

# The series served the QAT build in Part 4, so its TTFT curve is read against the QAT figures
# (316 ms at 512 tokens -> 7,243 ms at 4,096), never the bf16 ones.
PUBLISHED_TTFT_BUILD = "qat"
PUBLISHED_TTFT_LENS = (512, 4096)


def published_ttft() -> dict[int, float]:
    """The series' GCE T4 median TTFT at c=1 for the build Part 4 serves (QAT)."""
    return {n: gce_t4(PUBLISHED_TTFT_BUILD, n).ttft_ms for n in PUBLISHED_TTFT_LENS}


def drafter_line() -> str:
    """The published drafter result with each speed-up named: tok/s over tok/s, and per-token time."""
    pub = T4_DRAFTER
    return (
        f"published: {pub.model} {pub.build} on a GCE T4, {pub.draft_tokens} draft tokens, greedy: "
        f"{pub.tok_s_off} -> {pub.tok_s_on} tok/s ({pub.tok_s_on / pub.tok_s_off:.2f}x the tok/s); per token "
        f"{pub.ms_per_token_off} -> {pub.ms_per_token_on} ms ({pub.ms_per_token_off / pub.ms_per_token_on:.2f}x less time "
        f"per token); {pub.acceptance:.0%} of drafts accepted, {pub.answers_changed} answers changed length"
    )


@dataclass
class Specs:
    """Part 4's four workloads, each checked when built (before anything is served or billed)."""

    decode: DecodeSpec
    ttft: TTFTSpec
    prefix: PrefixSpec
    answers: AnswersSpec

    @property
    def all(self) -> list[Any]:
        return [self.decode, self.ttft, self.prefix, self.answers]

    @property
    def for_l4(self) -> dict[str, Any]:
        return {"decode": self.decode, "ttft": self.ttft, "answers": self.answers}


def specs(
    concurrency: Sequence[int], ttft_lens: Sequence[int], input_len: int, output_len: int, num_prompts: int
) -> Specs:
    return Specs(
        DecodeSpec(
            concurrency=concurrency, input_len=input_len, output_len=output_len, num_prompts=num_prompts
        ),
        TTFTSpec(input_lens=ttft_lens, output_len=4, num_prompts=4),
        PrefixSpec(input_len=512, output_len=4, num_prompts=8, groups=2),
        AnswersSpec(),
    )


@dataclass
class Study(PartStudy):
    """Part 4's run, with what the host steps found."""

    serves_here: bool  # a local GPU this part serves on (a fix is applied only there)
    ram_gib: float | None = None
    report: Any = None
    proof: Any = None

    def doctor(self) -> Table:
        """Every problem on this host with its fix (on a machine without a GPU, seeing them is the point)."""
        self.report = env.doctor()
        pair = f"vLLM + transformers: {self.report.pair.status} - {self.report.pair.detail}"
        return Table(
            self.report.problems,
            title=f"doctor: {len(self.report.problems)} problem(s); {pair}",
            columns=["severity", "message", "fix"],
        )

    def torch_fix(self) -> str:
        """The CUDA torch plan; applied only on a GPU this part serves on, where it is needed."""
        plan = torchfix.plan_torch_fix()
        if self.serves_here and plan.needed:
            return f"{plan.summary()}\n{torchfix.apply_torch_fix(plan).message} - now restart the kernel and run all cells again"
        return plan.summary()

    def swap(self) -> Table:
        """Host RAM to load each build here, and the swap file made (a dry run unless it is needed and allowed)."""
        now = swap.swap_status()
        load = [load_ram(self.model_size, fmt, host_ram_gib=self.ram_gib) for fmt in ("bf16", "qat-w4a16")]
        need = max(item.swap_needed_gib for item in load)
        real = self.serves_here and need > 0 and now.can_create
        made = swap.create_swap(f"{max(16, int(need))}G", dry_run=not real).summary()
        return Table(
            load, title=f"Host RAM to load {self.model_size.upper()} with vLLM here. {now.summary()} {made}"
        )

    def turing_proof(self) -> Any:
        """vLLM's attention kernel compiled for sm_75 for this size's shapes, unpatched and patched."""
        # lazy: Triton's compiler loads for this step only
        from gemma4_t4.turing.verify import gemma4_attention_shapes, verify

        self.proof = verify(
            "sm_75", shapes=[s for s in gemma4_attention_shapes() if s.model.lower() == self.model_size]
        )
        return self.proof

    def answers(self, endpoint: Endpoint, spec: AnswersSpec, runs_dir: Path, reference: str) -> Any:
        """The fixed questions answered here, compared with ``reference`` (another GPU's answers run) or,
        without one, with a second run here (greedy decoding must repeat itself)."""
        mine = run(endpoint, spec, runs_dir / "answers", overwrite=True)
        other = (
            load_run(reference)
            if reference
            else run(endpoint, spec, runs_dir.parent / "answers-repeat", overwrite=True)
        )
        return compare_answers(mine, other)  # "not measured: ..." if a run did not complete

    @staticmethod
    def release_billed(endpoint: Endpoint) -> None:
        """Stop an endpoint that bills and cannot restart (SageMaker: nothing after this step needs it);
        a local server keeps running for Going further."""
        if not endpoint.can_restart:
            endpoint.stop()

    def fits(self) -> FitTable:
        return fit_table(self.gpu, context_len=8192)

    def compare(
        self,
        decode: BenchRun,
        ttft: BenchRun,
        prefix: BenchRun | None,
        answers: Any,
        headline: Any,
        cost: Any,
        endpoint: Endpoint,
        concurrency: Sequence[int],
        ttft_lens: Sequence[int],
    ) -> Results:
        """The main path's results read and checked: refused, naming the figure, where one is missing or impossible."""
        results = Results(self, decode, ttft, prefix, answers, headline, cost, self.fits(), endpoint)
        results.check(concurrency, ttft_lens)
        return results


def study(target: str, model_size: str, runtime: RuntimeInfo, budget_usd: float) -> Study:
    return Study(
        target,
        model_size,
        runtime.roofline_gpu,
        Budget(budget_usd),
        runtime.serves_on_this_gpu,
        runtime.facts.ram_total_gib,
    )


@dataclass(repr=False)  # the text display is the table (Displayable), not the fields
class Results(Displayable):
    """Part 4's measured figures beside the series' published T4 ones, with their reading."""

    study: Study
    decode: BenchRun
    ttft: BenchRun
    prefix: BenchRun | None
    answers: Any
    headline: Any
    cost: Any
    fits: list[FitResult]
    endpoint: Endpoint
    drafter: Any = None

    @property
    def ttft_ms(self) -> dict[int, float | None]:
        return self.ttft.ttft_by_input_len()

    @property
    def ttft_growth(self) -> float:
        ms = self.ttft_ms
        return ms[max(ms)] / ms[min(ms)]  # type: ignore[operator]

    @property
    def prefix_rate(self) -> float | None:
        return self.prefix.prefix_hit_rate() if self.prefix else None

    @property
    def largest(self) -> FitResult | None:
        return largest_fitting(self.fits)

    def table_rows(self) -> list[object]:
        return list(t4_beside(self.decode, self.ttft_ms, self.caption()).table_rows())

    def caption(self) -> str:
        return f"Measured here ({self.study.target}, {self.study.model_size}) beside the series' published T4 figures"

    def notes(self) -> list[str]:
        speed, ms, pub = self.decode.decode_speed(), self.ttft_ms, published_ttft()
        lo, hi = min(ms), max(ms)
        lines = [
            f"TTFT grew {self.ttft_growth:.1f}x from {lo} to {hi} tokens ({hi / lo:.0f}x the tokens); the series "
            f"measured {pub[512]:,.0f} -> {pub[4096]:,.0f} ms for the QAT build on a GCE T4 "
            f"({pub[4096] / pub[512]:.0f}x for 8x the tokens, published): prefill attention grows faster than the prompt."
        ]
        c1 = gce_t4("qat")
        if speed.streamed and speed.per_stream:
            mine = speed.per_stream[min(speed.per_stream)]
            lines.append(
                f"Per stream at c={min(speed.per_stream)} this run decoded {mine:.1f} tok/s; the series measured "
                f"{c1.per_stream_tok_s} on a GCE T4 (E2B QAT, published)."
            )
        else:
            lines.append(f"Per-stream speed is not measured here: {speed.not_measured}.")
        if self.study.target == "cpu":
            lines.append(
                "On the CPU default a tiny random model runs on vLLM's CPU build: the steps, the checks and the "
                "TTFT growth's shape are real; the speeds say nothing about a T4."
            )
        rate = self.prefix_rate
        if rate is not None:
            lines.append(
                f"The prefix cache served {rate:.0%} of prompt tokens from cache: some relief for shared prefixes, "
                "secondary next to prefill's growth (the series' finding)."
            )
        return lines

    def plot(self) -> Any:
        ok = [f for f in self.fits if f.format == "qat-w4a16"]
        return plot_t4_part(
            self.decode.decode_speed(),
            self.ttft_ms,
            published_ttft(),
            ok,
            self.study.gpu,
            self.study.target,
        )

    @property
    def worst_shared_bytes(self) -> tuple[int, int]:
        """The sm_75 proof's largest shared-memory need of any launch: unpatched, patched."""
        launches = self.study.proof.launches
        return max(c.shared_bytes_unpatched for c in launches), max(c.shared_bytes_patched for c in launches)

    def check(self, concurrency: Sequence[int], ttft_lens: Sequence[int]) -> None:
        """Refuse a run that measured nothing, or a figure that cannot be, with one sentence naming it."""
        unpatched, patched = self.worst_shared_bytes
        if not self.study.proof.ok or unpatched != 98_304 or patched > 65_536:
            raise Gemma4T4Error(
                f"the sm_75 proof found {unpatched:,} B unpatched and {patched:,} B patched: the fix "
                "must bring 98,304 B within 65,536 B",
                fix=FIX,
            )
        runs = (self.decode, self.ttft, *([self.prefix] if self.prefix else []))
        ttft = {f"TTFT ms at {n} tokens": v for n, v in self.ttft_ms.items()}
        refuse_unmeasured(runs, {"decode": self.decode.decode_speed()}, concurrency, ttft, self.study.budget)
        bad = next(self._problems(ttft_lens), None)
        if bad:
            raise Gemma4T4Error(f"Part 4's figures are not real: {bad}", fix=FIX)

    def _problems(self, ttft_lens: Sequence[int]) -> Iterator[str]:
        """Each figure that cannot be, in the order they are checked (the first is the one refused)."""
        s = self.study
        if len(self.ttft_ms) != len(ttft_lens):
            yield f"TTFT measured {sorted(self.ttft_ms)} tokens, not {list(ttft_lens)}"
        rate = self.prefix_rate
        if self.endpoint.exposes_metrics and not (rate and rate > 0):
            yield "the prefix cache hit rate is not above 0 on a server that exposes /metrics"
        if not (self.answers.total and self.answers.identical == self.answers.total):
            yield f"answers: {self.answers.text()}"
        if self.largest is None:
            yield "no Gemma 4 size fits one GPU at 8k context"
        measured, price = self.cost.measured, self.cost.price
        if not price.usd_per_hour > 0:
            yield f"the price of {price.instance} is not positive"
        if s.target == "cpu" and measured.usd_per_mtok is not None:
            yield "a tiny model's CPU speed was priced as $ per Mtok"
        if not (is_real_number(measured.usd_per_mtok) or measured.label.startswith("no $/Mtok")):
            yield f"the measured $ per Mtok is {measured.usd_per_mtok!r} without a reason"
        if s.report is not None and any(not p.fix for p in s.report.problems if p.severity == "error"):
            yield "a doctor error came without its fix"

    def add_drafter(self, drafter: Any) -> Any:
        """Going further: the drafter's figures join the summary, checked like the rest; shown as is."""
        if drafter is not None and not (
            drafter.on.not_measured is None
            and drafter.on.acceptance_rate is not None
            and drafter.answers.measured
        ):
            raise Gemma4T4Error("the drafter run measured no acceptance or no answers to compare", fix=FIX)
        self.drafter = drafter
        return drafter

    def summary(self) -> dict[str, Any]:
        """``nb.save_summary``'s keyword arguments: the checked figures apart from the published ones."""
        speed, ms, d, h = self.decode.decode_speed(), self.ttft_ms, self.drafter, self.headline
        cost, pub, largest = self.cost, published_ttft(), self.largest
        unpatched, patched = self.worst_shared_bytes
        results = {
            "target": self.study.target,
            "doctor problems": len(self.study.report.problems) if self.study.report else None,
            "sm_75 shared bytes unpatched (worst)": unpatched,
            "sm_75 shared bytes patched (worst)": patched,
            "per-stream tok/s c=1": speed.per_stream[min(speed.per_stream)]
            if speed.per_stream
            else speed.not_measured,
            "output tok/s c=1": speed.output_tok_s[min(speed.output_tok_s)],
            "E2EL ms c=1": speed.e2el_ms[min(speed.e2el_ms)],
            "best output tok/s": cost.measured.output_tok_s,
            f"TTFT growth {min(ms)}->{max(ms)} tokens (x)": self.ttft_growth,
            "prefix cache hit rate": self.prefix_rate,
            "identical answers": self.answers.line(),
            "drafter on / off, tok/s at 1 stream": d.speedup if d else None,
            "drafter acceptance": d.on.acceptance_rate if d else None,
            "identical answers, drafter on vs off": d.answers.line() if d else "not run here",
            "T4/L4 decode (SageMaker)": (h.decode_ratio or "; ".join(h.decode_not_measured)) if h else None,
            "largest model that fits one T4": f"{largest.model} {largest.format}" if largest else None,
            "$ per Mtok (measured)": cost.measured.summary(),
            "$ per Mtok priced as": f"{cost.price.platform} {cost.price.instance} ({cost.price.gpu}), {cost.price.usd_per_hour} $/h",
        }
        c1, c8 = gce_t4("qat"), gce_t4("qat", concurrency=8)
        published = {
            "TTFT growth 512->4096 on a T4, QAT (x)": round(pub[4096] / pub[512], 1),
            "per-stream tok/s QAT c=1 (GCE T4)": c1.per_stream_tok_s,
            "output tok/s QAT c=8 (GCE T4)": c8.output_throughput_tok_s,
            "drafter tok/s on / off, E2B emb4, 3 draft tokens (GCE T4)": round(
                T4_DRAFTER.tok_s_on / T4_DRAFTER.tok_s_off, 2
            ),
            "drafter per-token time off / on (GCE T4)": round(
                T4_DRAFTER.ms_per_token_off / T4_DRAFTER.ms_per_token_on, 2
            ),
        }
        return {"part": 4, "results": results, "published": published, "tables": [cost, self]}


# ---------------------------------------------------------------- the steps that run on some venues only


def t4_vs_l4(
    served: Endpoint,
    specs: Mapping[str, WorkloadSpec],
    runs_dir: str | Path,
    out_dir: str | Path,
    *,
    model: str | Path,
    budget: Budget | None,
    region: str = "us-east-2",
    poll_s: float = 15.0,
) -> Any:
    """On SageMaker, run ``specs`` on an L4 endpoint and return the headline against the T4 runs in
    ``runs_dir``; elsewhere show the published rows alone and return ``None``."""
    if served.venue != "sagemaker":
        print(
            f"T4 vs L4 is measured on SageMaker (TARGET='sagemaker'); here ({served.venue}) the published "
            "rows stand alone:"
        )
        show_table(sagemaker_decode_table())
        return None
    context = context_for("sagemaker", model, list(specs.values()))
    with sagemaker_endpoint(
        model,
        name=served.served_name,
        part=4,
        region=region,
        budget=budget,
        gpu="l4",
        max_num_seqs=served.max_num_seqs or 8,
        max_model_len=context,
        poll_s=poll_s,
    ) as l4:
        for label, spec in specs.items():
            run(l4, spec, Path(out_dir) / label, overwrite=True)
    (headline,) = compare_suites(runs_dir, out_dir).headlines
    show_table(headline)
    show_table(headline_rows(headline))
    return headline


def price_of(served: Endpoint) -> InstancePrice:
    """The endpoint's hourly price, else a GCE T4's (which :func:`measured_price` then refuses to use)."""
    return served.price or PRICES[price_key("gce", "n1-standard-2+t4")]


def cost_per_mtok(run: Any, served: Endpoint, runtime: RuntimeInfo) -> CostTable:
    """A decode run's $/Mtok beside the published SageMaker rows, at :func:`price_of`'s price."""
    price = price_of(served)
    return CostTable(price, measured_price(run, price), runtime.target)


def drafter_on_off(served: Endpoint, draft: str, out_dir: str | Path) -> Any:
    """Speculative decoding with ``draft`` off, then on, on a local server like ``served``; ``None`` where
    it cannot restart (SageMaker). ``served``, running without a drafter, is the off side; it is
    stopped before the drafter's launch."""
    if not served.can_restart:
        print(
            f"not run on {served.venue}: a drafter comparison restarts the server twice (on SageMaker: "
            "two more billed deploys)"
        )
        return None
    # lazy: the drafter study (two launches and the benchmark) loads only for its step
    from gemma4_t4.studies import drafter_bench

    return drafter_bench.drafter_on_off(
        served.server.config,
        draft,
        out_dir,
        start=start_owned_server,
        tokenizer=served.tokenizer or served.server.config.model,
        running=served,
    )


def ttft_route_on_off(served: Endpoint, runtime: RuntimeInfo, spec: TTFTSpec, out_dir: str | Path) -> Any:
    """The TTFT curve with the prefill route off, then on; ``None`` off a local Turing GPU."""
    if not served.can_restart or not runtime.is_t4:
        print(f"not run on {runtime.target}: the route activates on a local Turing GPU (sm_7x) only")
        return None
    # lazy: the TTFT route curve (servers, the benchmark, plots) loads only for its step
    from gemma4_t4.studies import ttft_route

    report = ttft_route.ttft_route_on_off(served.server.config, spec, out_dir)
    show_image(report.plot)
    return report


def prefill_verdict(runtime: RuntimeInfo, out_dir: str | Path) -> Any:
    """The tensor-core prefill route's verdict (plot shown), or ``None`` off a Turing GPU."""
    if not runtime.is_t4:
        print(f"skipped on {runtime.target}: the route is measured and used on a Turing GPU only")
        return None
    # lazy: the prefill bench loads Triton's interpreter numerics, needed only on a Turing GPU
    from gemma4_t4.turing import prefill_bench

    report = prefill_bench.bench_prefill(out_dir=out_dir)
    show_image(report.plot)
    return report
