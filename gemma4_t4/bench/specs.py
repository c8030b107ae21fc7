"""What to measure: one class per workload, registered with :func:`workload`, and :func:`run`.

A workload class holds all of its workload: its fields (shared ones declared once, in
:mod:`gemma4_t4.bench.registry`), ``defaults`` and per-venue values (``venues``: what the notebooks'
parameters and ``params/*.yaml`` read), its rules (validators) and how it builds its cells (``cells``;
``follow``/``finish`` where it adds cells or figures as it runs). The CLI's ``bench run`` flags and the
MCP tool's schema are generated from the registry, so a new workload is one decorated class.

A spec says *what*; a :class:`Served` (an endpoint) says *where*. A spec is refused when it is made,
so a notebook or a SageMaker experiment checks every spec before it serves or bills::

    decode = DecodeSpec(concurrency=[1, 8], input_len=512, output_len=128)   # refused here if wrong
    with nb.endpoint(TARGET, model, work_dir) as endpoint:
        result = run(endpoint, decode, "results/decode")
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, ClassVar, Protocol

from pydantic import Field, field_validator, model_validator

from gemma4_t4.bench.args import CliFlag
from gemma4_t4.bench.cells import Cell, RunOptions, request_specs, warm_count
from gemma4_t4.bench.client import RequestSpec
from gemma4_t4.bench.metrics import series_decode
from gemma4_t4.bench.registry import (
    MAX_PROMPTS,
    MAX_RATES,
    MAX_TOKENS,
    Arrivals,
    PromptLen,
    SpecRefused,
    Streams,
    Values,
    WorkloadSpec,
    workload,
)
from gemma4_t4.bench.schemas import BenchModel, CellSummary, RequestRecord, SweepInfo
from gemma4_t4.errors import Gemma4T4Error

if TYPE_CHECKING:
    from gemma4_t4.bench.prompts import PromptFactory
    from gemma4_t4.bench.results import BenchRun


class Served(Protocol):
    """What a spec runs on: an OpenAI-compatible server (``http://``) or a SageMaker endpoint
    (``sagemaker://REGION/NAME``), the model name it serves, and what the results should record."""

    url: str
    served_name: str
    tokenizer: str | None  # a local tokenizer (an endpoint has no /tokenize)
    gpu: str | None  # the hardware key for roofline and cost (t4, l4), if known
    api_key: str | None
    max_num_seqs: int | None


# ---------------------------------------------------------------- the workloads

MIN_RATE, MAX_RATE = 0.01, 10_000.0  # requests/s: one every 100 s .. far beyond any server
MAX_RUN_S = 24 * 3600  # an open loop's arrivals alone longer than this are refused

_DECODE_T4: Values = {"concurrency": [1, 8], "input_len": 512, "output_len": 128, "num_prompts": 8}
_TTFT_T4: Values = {"input_lens": [512, 1024, 2048, 4096]}


@workload("decode")
class DecodeSpec(Streams, PromptLen, WorkloadSpec):
    """Closed-loop decode: ``concurrency`` streams at once, unique prompts of ``input_len`` tokens."""

    defaults: ClassVar[Values] = {"concurrency": [1, 2, 4, 8, 16], "input_len": 512, "output_len": 128}
    # the series' T4 conditions (a SageMaker endpoint is a T4 too); on cpu the method on the tiny model
    venues: ClassVar[dict[str, Values]] = {
        "t4": _DECODE_T4,
        "sagemaker": _DECODE_T4,
        "cpu": {"concurrency": [1, 8], "input_len": 128, "output_len": 32, "num_prompts": 8},
    }
    params: ClassVar[dict[str, str]] = {  # the notebooks' parameters
        "CONCURRENCY": "concurrency", "INPUT_LEN": "input_len", "OUTPUT_LEN": "output_len", "NUM_PROMPTS": "num_prompts"
    }

    def cells(self, run: RunOptions, factory: PromptFactory | None) -> list[Cell]:
        name = f"decode-c{{}}-in{self.input_len}-out{self.output_len}"
        n = self.num_prompts
        return [self.unique_cell(run, factory, name.format(c), "decode", c, n or max(32, 4 * c)) for c in self.concurrency]


@workload("open_loop")
class OpenLoopSpec(Arrivals, PromptLen, WorkloadSpec):
    """Decode at offered request ``rates`` (requests/s), Poisson or constant arrivals."""

    workload: ClassVar[str] = "decode"
    defaults: ClassVar[Values] = {"input_len": 512, "output_len": 128}
    rates: list[Annotated[float, Field(ge=MIN_RATE, le=MAX_RATE, allow_inf_nan=False)]] = Field(
        min_length=1, max_length=MAX_RATES,
        description=f"decode: open-loop cells at these offered requests/s instead, e.g. 0.5,1,2 "
        f"({MIN_RATE:g} to {MAX_RATE:g})",
        json_schema_extra=CliFlag(flag="--rate", metavar="REQ_PER_S"),
    )

    def pace(self) -> list[tuple[int, float]]:
        return [(self.prompts_at(rate), rate) for rate in self.rates]

    def expected_s(self) -> float:
        return sum(n / rate for n, rate in self.pace())

    @model_validator(mode="after")
    def _ends_within_a_day(self) -> OpenLoopSpec:
        if self.expected_s() > MAX_RUN_S:
            raise SpecRefused(
                f"{self.kind} at {', '.join(f'{r:g}' for r in self.rates)} req/s would send its requests over "
                f"{self.expected_s() / 3600:,.0f} hours (prompts / rate)",
                fix="raise --rate or lower --num-prompts: one run sends its requests within 24 hours",
            )
        return self

    def cells(self, run: RunOptions, factory: PromptFactory | None) -> list[Cell]:
        return rate_cells(self, run, factory, self.rates)


def rate_cells(
    spec: Arrivals, run: RunOptions, factory: PromptFactory | None, rates: list[float], variant: str = "open_loop"
) -> list[Cell]:
    """Open-loop decode cells, one per offered request rate, each warmed up with ``warmup`` prompts."""
    return [
        spec.unique_cell(
            run, factory, f"decode-r{rate:g}-{spec.arrival}-in{spec.input_len}-out{spec.output_len}", variant,
            spec.max_in_flight, spec.prompts_at(rate), warm=spec.warmup, rate=rate, arrival=spec.arrival,
        )
        for rate in rates
    ]


def sweep_rates(synchronous_rps: float, throughput_rps: float, count: int) -> list[float]:
    """``count`` request rates evenly spaced strictly between the synchronous and the saturated rate."""
    if not (synchronous_rps > 0 and throughput_rps > synchronous_rps):
        raise Gemma4T4Error(
            f"the server did not get faster with more concurrent requests ({synchronous_rps:.3g} req/s one at a "
            f"time, {throughput_rps:.3g} req/s all at once): there is no load range to sweep",
            fix="check the server's --max-num-seqs, or choose rates with --rate",
        )
    step = (throughput_rps - synchronous_rps) / (count + 1)
    return [synchronous_rps + step * (i + 1) for i in range(count)]


@workload("sweep")
class SweepSpec(Arrivals, PromptLen, WorkloadSpec):
    """One-at-a-time, all-at-once, then ``sweep`` rates in between (guidellm's sweep)."""

    workload: ClassVar[str] = "decode"
    defaults: ClassVar[Values] = {"input_len": 512, "output_len": 128}
    sweep: int = Field(
        ge=1,
        le=MAX_RATES,
        description="decode: measure one-at-a-time and all-at-once, then N open-loop rates in between",
        json_schema_extra=CliFlag(metavar="N"),
    )

    def cells(self, run: RunOptions, factory: PromptFactory | None) -> list[Cell]:
        n = self.num_prompts or 32
        ends = (("synchronous", 1), ("throughput", min(n, self.max_in_flight)))
        name = f"decode-{{}}-in{self.input_len}-out{self.output_len}"
        return [self.unique_cell(run, factory, name.format(end), f"sweep_{end}", c, n) for end, c in ends]

    def follow(
        self, run: RunOptions, factory: PromptFactory | None, done: list[CellSummary]
    ) -> tuple[list[Cell], dict[str, BenchModel]]:
        """Once both ends are measured, the rates in between come from their measured request rates."""
        if not done or done[-1].variant != "sweep_throughput":
            return [], {}
        ends = {c.variant: c.request_throughput_req_s or 0.0 for c in done}
        sync, through = ends["sweep_synchronous"], ends["sweep_throughput"]
        rates = sweep_rates(sync, through, self.sweep)
        info = SweepInfo(synchronous_rps=sync, throughput_rps=through, rates=rates)
        return rate_cells(self, run, factory, rates, variant="sweep_rate"), {"sweep": info}


@workload("series_decode")
class SeriesDecodeSpec(PromptLen, WorkloadSpec):
    """The series' decode figure: (L - S) / (wall_L - wall_S) from a short and a long output."""

    workload: ClassVar[str] = "decode"
    defaults: ClassVar[Values] = {"input_len": 512, "output_len": 16, "num_prompts": 8, "series_lens": [16, 512]}
    series_lens: list[Annotated[int, Field(ge=1, le=MAX_TOKENS)]] | None = Field(
        None,
        description="series decode: the short and long output tokens (default 16,512)",
        json_schema_extra=CliFlag(metavar="SHORT,LONG"),
    )

    @field_validator("series_lens")
    @classmethod
    def _short_then_long(cls, value: list[int]) -> list[int]:
        if len(value) != 2 or not 0 < value[0] < value[1]:
            raise SpecRefused(
                f"--series-lens {value} must be SHORT,LONG with SHORT < LONG", fix="use e.g. --series-lens 16,512"
            )
        return value

    def longest_output(self) -> int:
        return max(self.series_lens)

    def cells(self, run: RunOptions, factory: PromptFactory | None) -> list[Cell]:
        """The same prompts at c=1 with a short and a long output."""
        short, long = self.series_lens
        return [
            self.unique_cell(
                run, factory, f"decode-series-in{self.input_len}-out{out}", f"series_{kind}", 1, self.num_prompts, output_len=out
            )
            for kind, out in (("short", short), ("long", long))
        ]

    def finish(self, cells: list[Cell], measured: dict[str, list[RequestRecord]]) -> dict[str, BenchModel]:
        by_variant = {c.variant: measured.get(c.cell, []) for c in cells}
        short, long = by_variant.get("series_short", []), by_variant.get("series_long", [])
        return {"series_decode": series_decode(short, long, *self.series_lens)}


@workload("ttft")
class TTFTSpec(WorkloadSpec):
    """Time to first token as the prompt grows (one stream)."""

    defaults: ClassVar[Values] = {"input_lens": [256, 512, 1024, 2048, 4096], "output_len": 16, "num_prompts": 16}
    venues: ClassVar[dict[str, Values]] = {
        "t4": _TTFT_T4,
        "sagemaker": _TTFT_T4,
        "cpu": {"input_lens": [64, 128, 256, 512, 1024]},
    }
    params: ClassVar[dict[str, str]] = {"TTFT_INPUT_LENS": "input_lens"}
    input_lens: list[Annotated[int, Field(ge=1, le=MAX_TOKENS)]] | None = Field(
        None, min_length=1, description="ttft: prompt lengths (default 256,...,4096)"
    )

    def prompt_lens(self) -> list[int]:
        return list(self.input_lens)

    def cells(self, run: RunOptions, factory: PromptFactory | None) -> list[Cell]:
        return [
            self.unique_cell(run, factory, f"ttft-c1-in{n}-out{self.output_len}", "ttft", 1, self.num_prompts, length=n)
            for n in self.input_lens
        ]


@workload("prefix")
class PrefixSpec(PromptLen, WorkloadSpec):
    """Prompts sharing ``groups`` prefixes of ``prefix_len`` tokens vs unique prompts; the prefix
    cache's hit rate where the server exposes /metrics."""

    defaults: ClassVar[Values] = {"input_len": 1024, "output_len": 32, "num_prompts": 32, "groups": 4}
    prefix_len: int | None = Field(
        None, ge=1, le=MAX_TOKENS, description="prefix workload: shared tokens (default 3/4 of input)"
    )
    groups: int | None = Field(
        None, ge=1, le=MAX_PROMPTS // 2, description="prefix workload: number of prefixes"
    )

    @classmethod
    def derived(cls, data: Values) -> Values:
        if data.get("prefix_len") is None and isinstance(data.get("input_len"), int):
            data["prefix_len"] = data["input_len"] * 3 // 4
        return data

    @model_validator(mode="after")
    def _groups_of_two(self) -> PrefixSpec:
        if self.num_prompts < 2 * self.groups:
            raise SpecRefused(
                f"{self.num_prompts} prompts cannot make {self.groups} groups of at least 2",
                fix="raise --num-prompts or lower --groups",
            )
        return self

    def cells(self, run: RunOptions, factory: PromptFactory | None) -> list[Cell]:
        """One stream: the shared-prefix cell, then as many unique prompts (the control)."""
        per_group = self.num_prompts // self.groups
        out, length = self.output_len, self.input_len
        base = f"prefix-c1-in{length}-p{self.prefix_len}-out{out}"
        groups = factory.shared_prefix(f"{base}-shared", self.groups, per_group, self.prefix_len, length)
        shared = [p for group in groups for p in group]  # group-major: the first of each group fills
        meta: dict[str, int | bool | str] = {"prefix_len": self.prefix_len, "groups": self.groups, "per_group": per_group}
        warm_prompts = factory.unique(f"w-{base}", warm_count(self.warmup, 1), length)
        warm = request_specs(warm_prompts, f"w-{base}", run.api, out)
        shared_specs = request_specs(shared, f"{base}-shared", run.api, out)
        control_meta = meta | {"control": True}  # the same count of unique prompts, not warmed again
        return [
            Cell(f"{base}-shared", "prefix", "shared_prefix", 1, length, out, shared_specs, warm, meta),
            self.unique_cell(run, factory, f"{base}-unique", "unique_prompts", 1, len(shared), warm=0, meta=control_meta),
        ]


@workload("answers")
class AnswersSpec(Streams, WorkloadSpec):
    """Fixed questions, greedy: what two servers' answers are compared on."""

    api: ClassVar[str] = "chat"
    prompts: ClassVar[bool] = False
    defaults: ClassVar[Values] = {"concurrency": [1], "output_len": 32}

    def cells(self, run: RunOptions, factory: PromptFactory | None) -> list[Cell]:
        # the questions' module reads results: loaded when a run starts
        from gemma4_t4.bench.answers import QUESTIONS

        specs = [
            RequestSpec(f"answers-{i}", q, self.output_len, api=run.api, ignore_eos=False)
            for i, (q, _) in enumerate(QUESTIONS)
        ]
        warm = [
            RequestSpec(f"w-answers-{i}", f"Say the word number {i}.", 8, api=run.api, ignore_eos=False)
            for i in range(warm_count(self.warmup, min(max(self.concurrency), len(specs))))
        ]
        return [Cell(f"answers-c{c}", "answers", "answers", c, None, self.output_len, specs, warm) for c in self.concurrency]


@workload("load")
class LoadSpec(Streams, PromptLen, WorkloadSpec):
    """The series' load test: ``c`` concurrent requests of one shared prompt (as published: the
    prompt is the same for all, so prefix caching serves its prefill), c = 1..16."""

    defaults: ClassVar[Values] = {"concurrency": [1, 2, 4, 8, 16], "input_len": 512, "output_len": 256}

    def cells(self, run: RunOptions, factory: PromptFactory | None) -> list[Cell]:
        prompt = factory.unique("load-shared", 1, self.input_len)
        cells = []
        for c in self.concurrency:
            name = f"load-c{c}-in{self.input_len}-out{self.output_len}"
            specs = request_specs(prompt * (self.num_prompts or c), name, run.api, self.output_len)
            warm = request_specs(prompt * warm_count(self.warmup, 1), f"w-{name}", run.api, self.output_len)
            shared = {"shared_prompt": True}
            cells.append(Cell(name, "load", "load_shared_prompt", c, self.input_len, self.output_len, specs, warm, shared))
        return cells


# ---------------------------------------------------------------- running a spec


@dataclass(frozen=True)
class ServedAt:
    """The plainest :class:`Served`: a server or endpoint known by its URL and served model name
    (what the MCP tool ``run_benchmark`` is given)."""

    url: str
    served_name: str
    tokenizer: str | None = None
    gpu: str | None = None
    api_key: str | None = None
    max_num_seqs: int | None = None


def run(
    served: Served,
    spec: WorkloadSpec,
    out_dir: str | Path,
    *,
    label: str | None = None,
    model_format: str | None = None,
    overwrite: bool = False,
    progress: bool = True,
    request_timeout_s: float | None = 600.0,
) -> BenchRun:
    """Run ``spec`` on ``served``; write a results directory under ``out_dir`` and return the
    :class:`~gemma4_t4.bench.results.BenchRun` (its ``.table()``, ``per_stream_by_concurrency()``,
    ``ttft_by_input_len()``, ``prefix_hit_rate()``, ...)."""
    if not isinstance(spec, WorkloadSpec):
        raise Gemma4T4Error(
            f"run() takes a workload spec, got {type(spec).__name__}",
            fix="pass e.g. DecodeSpec(concurrency=[1, 8]) from gemma4_t4.bench.specs",
        )
    from gemma4_t4.bench.workloads import BenchArgs, run_benchmark  # the client: only when a run starts

    args = BenchArgs(
        base_url=served.url,
        model=served.served_name,
        spec=spec,
        out_dir=str(out_dir),
        tokenizer=served.tokenizer,
        gpu=served.gpu,
        api_key=served.api_key,
        max_num_seqs=served.max_num_seqs,
        label=label,
        model_format=model_format,
        overwrite=overwrite,
        progress=progress,
        request_timeout_s=request_timeout_s,
    )
    return run_benchmark(args)
