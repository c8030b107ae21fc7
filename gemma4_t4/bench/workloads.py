"""The benchmark: its arguments (:class:`BenchArgs`), the workloads (a small registry, each
producing its cells) and the run loop.

Every cell: warm-up with its own prompts (never the measured ones) → ``/metrics`` scrape →
measured run (records streamed to disk) → scrape → summary with the prefix-cache hit rate
measured from the scrape delta. Cells above the server's ``max_num_seqs`` are labelled as
queueing. A workload may add cells after one is measured (the sweep's rates come from the
measured ends, as guidellm's sweep profile does).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError, field_validator, model_validator

from gemma4_t4 import secrets, signals
from gemma4_t4.bench.answers import QUESTIONS, is_correct
from gemma4_t4.bench.args import METHODS, WORKLOAD_CHOICES, BenchOptions
from gemma4_t4.bench.backends import Backend, backend_for, parse_base_url
from gemma4_t4.bench.client import ARRIVALS, RequestSpec, arrival_offsets, closed_loop, open_loop
from gemma4_t4.bench.derive import derive_cell, lookup_bytes_per_token
from gemma4_t4.bench.metrics import aggregate, open_loop_stats, series_decode
from gemma4_t4.bench.prompts import PromptFactory
from gemma4_t4.bench.results import BenchRun, ResultsWriter, check_out_dir
from gemma4_t4.bench.schemas import (
    Answer,
    BenchModel,
    CellSummary,
    GPUTelemetry,
    PromptInfo,
    RequestRecord,
    RunInfo,
    ServerInfo,
    ServerLoad,
    SweepInfo,
)
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.jsonable import JSONValue

# ---------------------------------------------------------------- arguments


class BenchArgs(BenchOptions):
    """Everything one benchmark run needs: the options declared once in :class:`BenchOptions`
    (the CLI's flags and the workload specs are generated from them), with their rules. Defaults
    that depend on the workload are filled in by the validator."""

    @field_validator("workload")
    @classmethod
    def _known_workload(cls, value: str) -> str:
        if value not in WORKLOAD_CHOICES:
            raise Gemma4T4Error(
                f"unknown workload {value!r}", fix=f"use one of: {', '.join(WORKLOAD_CHOICES)}"
            )
        return value

    @field_validator("base_url")
    @classmethod
    def _url(cls, value: str) -> str:
        parse_base_url(value)
        return value.rstrip("/")

    @field_validator("concurrency", "input_lens")
    @classmethod
    def _positive_ints(cls, value: list[int] | None, info: Any) -> list[int] | None:
        if value is not None:
            if not value:
                raise Gemma4T4Error(f"{info.field_name} is empty", fix="give at least one value, e.g. 1")
            for v in value:
                if v < 1:
                    what = "concurrency" if info.field_name == "concurrency" else "input length"
                    raise Gemma4T4Error(f"{what} {v} must be at least 1", fix="use e.g. --concurrency 1,8")
        return value

    @field_validator("request_timeout_s")
    @classmethod
    def _timeout(cls, value: float | None) -> float | None:
        if value is not None and not value > 0:
            raise Gemma4T4Error(
                f"--request-timeout {value} must be > 0 seconds", fix="use e.g. --request-timeout 120"
            )
        return value

    @model_validator(mode="after")
    def _resolve(self) -> BenchArgs:
        entry = WORKLOADS[self.mode]
        d = entry.defaults
        self.api = self.api or ("chat" if self.workload == "answers" else "completions")
        if self.sweep is not None:
            if self.workload != "decode" or self.rates is not None or self.concurrency is not None:
                raise Gemma4T4Error(
                    "--sweep is for the decode workload and chooses its own rates",
                    fix="use --workload decode and drop --rate/--concurrency",
                )
            if self.sweep < 1:
                raise Gemma4T4Error(f"--sweep {self.sweep} must be at least 1", fix="use e.g. --sweep 5")
        elif self.rates is None:
            self.concurrency = list(self.concurrency or d.concurrency)
        self.output_len = self.output_len or d.output_len
        if self.workload == "ttft":
            self.input_lens = list(self.input_lens or ([self.input_len] if self.input_len else d.input_lens))
        else:
            self.input_len = self.input_len or d.input_len
        self.num_prompts = self.num_prompts or d.num_prompts
        if self.workload == "prefix":
            self.groups = self.groups or d.groups
            self.prefix_len = self.prefix_len or (self.input_len * 3 // 4)
        if self.max_num_seqs is None and self.server_launch:
            self.max_num_seqs = (self.server_launch.get("config") or {}).get("max_num_seqs")
        if self.rates is not None:
            if self.workload != "decode":
                raise Gemma4T4Error(
                    f"--rate is for the decode workload, not {self.workload}",
                    fix="drop --rate, or use --workload decode",
                )
            if not self.rates or any(not r > 0 for r in self.rates):
                raise Gemma4T4Error(
                    f"rates must be > 0 requests/s, got {self.rates}", fix="use e.g. --rate 0.5,1,2"
                )
        if self.arrival is None:
            self.arrival = "poisson"
        if self.max_in_flight < 1:
            raise Gemma4T4Error("max_in_flight must be at least 1", fix="use e.g. --max-in-flight 64")
        if self.method == "series":
            if self.workload != "decode" or self.rates is not None or self.sweep is not None:
                raise Gemma4T4Error(
                    "--method series is a decode method (8 prompts at c=1)",
                    fix="use --workload decode without --rate/--sweep",
                )
            self.series_lens = list(self.series_lens or [16, 512])
            if len(self.series_lens) != 2 or not 0 < self.series_lens[0] < self.series_lens[1]:
                raise Gemma4T4Error(
                    f"--series-lens {self.series_lens} must be SHORT,LONG with SHORT < LONG",
                    fix="use e.g. --series-lens 16,512",
                )
        if self.output_len is not None and self.output_len < 1:
            raise Gemma4T4Error("output length must be at least 1", fix="use --output-len 1 or more")
        if self.num_prompts is not None and self.num_prompts < 1:
            raise Gemma4T4Error("num_prompts must be at least 1", fix="use --num-prompts 1 or more")
        if self.warmup < 0:
            raise Gemma4T4Error("warm-up requests cannot be negative", fix="use --warmup 0 or more")
        if self.workload == "prefix" and self.num_prompts < 2 * self.groups:
            raise Gemma4T4Error(
                f"{self.num_prompts} prompts cannot make {self.groups} groups of at least 2",
                fix="raise --num-prompts or lower --groups",
            )
        if self.bytes_per_token is None and self.model_format:
            self.bytes_per_token = lookup_bytes_per_token(self.model, self.model_format)
        return self

    @property
    def mode(self) -> str:
        """The registry entry this run uses (decode runs closed loop, open loop, sweep or series)."""
        if self.workload == "decode":
            if self.sweep is not None:
                return "sweep"
            if self.rates is not None:
                return "open_loop"
            if self.method == "series":
                return "series_decode"
        return self.workload

    def key(self) -> str | None:
        return self.api_key.get_secret_value() if self.api_key else None

    def record(self) -> dict[str, JSONValue]:
        """What run.json stores: every argument (as JSON), the API key and other secrets never."""
        data = self.model_dump(mode="json", exclude={"api_key"})
        data["api_key_used"] = self.api_key is not None
        return secrets.mask(data)


def build_args(base_url: str, model: str, workload: str, out_dir: str | Path, **opts: Any) -> BenchArgs:
    """:class:`BenchArgs` from keyword options, with one-line errors for unknown or invalid ones."""
    try:
        return BenchArgs(base_url=base_url, model=model, workload=workload, out_dir=str(out_dir), **opts)
    except ValidationError as exc:
        unknown = [str(e["loc"][0]) for e in exc.errors() if e["type"] == "extra_forbidden"]
        if unknown:
            raise Gemma4T4Error(
                f"unknown option(s): {', '.join(sorted(unknown))}",
                fix="see gemma4_t4.bench.BenchArgs for the options",
            ) from None
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "arguments"
        raise Gemma4T4Error(
            f"invalid benchmark option {where}: {first['msg']}",
            fix="see gemma4_t4.bench.BenchArgs (or gemma4-t4 bench run --help)",
        ) from None


# ---------------------------------------------------------------- cells and the workload registry


@dataclass
class Cell:
    cell: str
    workload: str
    variant: str
    concurrency: int
    input_len: int | None
    output_len: int
    specs: list[RequestSpec]
    warmup_specs: list[RequestSpec]
    meta: dict[str, int | bool | str] = field(default_factory=dict)
    rate: float | None = None  # open loop: offered requests/s (concurrency is then the in-flight cap)
    arrival: str | None = None


@dataclass(frozen=True)
class Defaults:
    concurrency: tuple[int, ...] = (1,)
    input_len: int | None = None
    input_lens: tuple[int, ...] = ()
    output_len: int = 128
    num_prompts: int | None = None
    groups: int | None = None


Build = Callable[[BenchArgs, PromptFactory | None], list[Cell]]
# after a cell is measured: more cells, and fields for run.json
Follow = Callable[
    [BenchArgs, PromptFactory | None, list[CellSummary]], tuple[list[Cell], dict[str, BenchModel]]
]


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    defaults: Defaults
    build: Build
    follow: Follow | None = None
    prompts: bool = True  # needs exact-length prompts (a tokenizer)


def _specs(
    prompts: list[Any], cell: str, args: BenchArgs, output_len: int | None = None
) -> list[RequestSpec]:
    return [
        RequestSpec(
            f"{cell}-{i}",
            p.text,
            output_len or args.output_len,
            api=args.api,
            ignore_eos=True,
            temperature=0.0,
            input_len=p.tokens,
        )
        for i, p in enumerate(prompts)
    ]


def _warm_count(args: BenchArgs, concurrency: int) -> int:
    # a full batch of warm-up requests: the first batch of a new size can stall on some backends
    return max(args.warmup, concurrency) if args.warmup > 0 else 0


def _unique_cell(
    args: BenchArgs,
    factory: PromptFactory,
    name: str,
    workload: str,
    variant: str,
    c: int,
    n: int,
    length: int,
    output_len: int | None = None,
    **extra: Any,
) -> Cell:
    out = output_len or args.output_len
    return Cell(
        name,
        workload,
        variant,
        c,
        length,
        out,
        _specs(factory.unique(name, n, length), name, args, out),
        _specs(factory.unique(f"w-{name}", _warm_count(args, c), length), f"w-{name}", args, out),
        **extra,
    )


def decode_cells(args: BenchArgs, factory: PromptFactory | None) -> list[Cell]:
    return [
        _unique_cell(
            args,
            factory,
            f"decode-c{c}-in{args.input_len}-out{args.output_len}",
            "decode",
            "decode",
            c,
            args.num_prompts or max(32, 4 * c),
            args.input_len,
        )
        for c in args.concurrency
    ]


def ttft_cells(args: BenchArgs, factory: PromptFactory | None) -> list[Cell]:
    return [
        _unique_cell(
            args, factory, f"ttft-c{c}-in{n}-out{args.output_len}", "ttft", "ttft", c, args.num_prompts, n
        )
        for c in args.concurrency
        for n in args.input_lens
    ]


def prefix_cells(args: BenchArgs, factory: PromptFactory | None) -> list[Cell]:
    cells = []
    per_group = args.num_prompts // args.groups
    for c in args.concurrency:
        base = f"prefix-c{c}-in{args.input_len}-p{args.prefix_len}-out{args.output_len}"
        groups = factory.shared_prefix(
            f"{base}-shared", args.groups, per_group, args.prefix_len, args.input_len
        )
        shared = [p for group in groups for p in group]  # group-major: the first of each group fills
        meta = {"prefix_len": args.prefix_len, "groups": args.groups, "per_group": per_group}
        warm = _specs(factory.unique(f"w-{base}", _warm_count(args, c), args.input_len), f"w-{base}", args)
        cells.append(
            Cell(
                f"{base}-shared",
                "prefix",
                "shared_prefix",
                c,
                args.input_len,
                args.output_len,
                _specs(shared, f"{base}-shared", args),
                warm,
                meta,
            )
        )
        control = factory.unique(f"{base}-unique", len(shared), args.input_len)
        cells.append(
            Cell(
                f"{base}-unique",
                "prefix",
                "unique_prompts",
                c,
                args.input_len,
                args.output_len,
                _specs(control, f"{base}-unique", args),
                [],
                meta | {"control": True},
            )
        )
    return cells


def answers_cells(args: BenchArgs, factory: PromptFactory | None) -> list[Cell]:
    specs = [
        RequestSpec(f"answers-{i}", q, args.output_len, api=args.api, ignore_eos=False, temperature=0.0)
        for i, (q, _) in enumerate(QUESTIONS)
    ]
    warm = [
        RequestSpec(f"w-answers-{i}", f"Say the word number {i}.", 8, api=args.api, ignore_eos=False)
        for i in range(_warm_count(args, max(args.concurrency)))
    ]
    return [
        Cell(f"answers-c{c}", "answers", "answers", c, None, args.output_len, specs, warm)
        for c in args.concurrency
    ]


def rate_cells(
    args: BenchArgs,
    factory: PromptFactory | None,
    rates: list[float] | None = None,
    variant: str = "open_loop",
) -> list[Cell]:
    """Open-loop decode cells, one per offered request rate."""
    cells = []
    for rate in rates if rates is not None else args.rates:
        name = f"decode-r{rate:g}-{args.arrival}-in{args.input_len}-out{args.output_len}"
        n = args.num_prompts or max(16, min(256, round(30 * rate)))  # about 30 s of arrivals
        cells.append(
            Cell(
                name,
                "decode",
                variant,
                args.max_in_flight,
                args.input_len,
                args.output_len,
                _specs(factory.unique(name, n, args.input_len), name, args),
                _specs(factory.unique(f"w-{name}", args.warmup, args.input_len), f"w-{name}", args),
                rate=rate,
                arrival=args.arrival,
            )
        )
    return cells


def sweep_cells(args: BenchArgs, factory: PromptFactory | None) -> list[Cell]:
    n = args.num_prompts or 32
    return [
        _unique_cell(
            args,
            factory,
            f"decode-{variant.removeprefix('sweep_')}-in{args.input_len}-out{args.output_len}",
            "decode",
            variant,
            c,
            n,
            args.input_len,
        )
        for variant, c in (("sweep_synchronous", 1), ("sweep_throughput", min(n, args.max_in_flight)))
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


def sweep_follow(
    args: BenchArgs, factory: PromptFactory | None, done: list[CellSummary]
) -> tuple[list[Cell], dict[str, BenchModel]]:
    """Once both ends are measured, the rates in between come from their measured request rates."""
    if not done or done[-1].variant != "sweep_throughput":
        return [], {}
    ends = {c.variant: c.request_throughput_req_s or 0.0 for c in done}
    rates = sweep_rates(ends["sweep_synchronous"], ends["sweep_throughput"], args.sweep)
    info = SweepInfo(
        synchronous_rps=ends["sweep_synchronous"], throughput_rps=ends["sweep_throughput"], rates=rates
    )
    return rate_cells(args, factory, rates, variant="sweep_rate"), {"sweep": info}


def series_cells(args: BenchArgs, factory: PromptFactory | None) -> list[Cell]:
    """The series' decode method: the same 8 prompts at c=1 with a short and a long output."""
    short, long = args.series_lens
    n = args.num_prompts
    return [
        _unique_cell(
            args,
            factory,
            f"decode-series-in{args.input_len}-out{out}",
            "decode",
            f"series_{kind}",
            1,
            n,
            args.input_len,
            output_len=out,
        )
        for kind, out in (("short", short), ("long", long))
    ]


def load_cells(args: BenchArgs, factory: PromptFactory | None) -> list[Cell]:
    """The series' load test: c concurrent requests of one shared prompt (as published: the prompt
    is the same for all, so prefix caching serves its prefill), c = 1..16."""
    prompt = factory.unique("load-shared", 1, args.input_len)
    cells = []
    for c in args.concurrency:
        name = f"load-c{c}-in{args.input_len}-out{args.output_len}"
        n = args.num_prompts or c
        specs = _specs(prompt * n, name, args)
        warm = _specs(prompt * _warm_count(args, 1), f"w-{name}", args)
        cells.append(
            Cell(
                name,
                "load",
                "load_shared_prompt",
                c,
                args.input_len,
                args.output_len,
                specs,
                warm,
                {"shared_prompt": True},
            )
        )
    return cells


def _series_follow(
    args: BenchArgs, factory: PromptFactory | None, done: list[CellSummary]
) -> tuple[list[Cell], dict[str, BenchModel]]:
    return [], {}  # the decode figure needs the records: computed by the run loop at the end


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload(
            "decode",
            "closed loop at each concurrency, unique prompts",
            Defaults((1, 2, 4, 8, 16), 512, (), 128),
            decode_cells,
        ),
        Workload(
            "ttft",
            "TTFT vs input length",
            Defaults((1,), None, (256, 512, 1024, 2048, 4096), 16, 16),
            ttft_cells,
        ),
        Workload(
            "prefix",
            "shared prefixes vs unique prompts, hit rate from /metrics",
            Defaults((1,), 1024, (), 32, 32, 4),
            prefix_cells,
        ),
        Workload(
            "answers",
            "fixed questions, greedy: identical answers across runs",
            Defaults((1,), None, (), 32),
            answers_cells,
            prompts=False,
        ),
        Workload(
            "open_loop",
            "decode at offered request rates (Poisson or constant)",
            Defaults((1,), 512, (), 128),
            rate_cells,
        ),
        Workload(
            "sweep",
            "one at a time, all at once, then rates in between",
            Defaults((1,), 512, (), 128),
            sweep_cells,
            sweep_follow,
        ),
        Workload(
            "series_decode",
            "the series' method: (L-S) / (wall_L - wall_S), 8 prompts at c=1",
            Defaults((1,), 512, (), 16, 8),
            series_cells,
            _series_follow,
        ),
        Workload(
            "load",
            "the series' load test: c = 1..16 requests of one shared prompt",
            Defaults((1, 2, 4, 8, 16), 512, (), 256),
            load_cells,
        ),
    )
}


def build_cells(args: BenchArgs, factory: PromptFactory | None) -> list[Cell]:
    """All cells of a workload known before anything is measured, prompts included."""
    return WORKLOADS[args.mode].build(args, factory)


# ---------------------------------------------------------------- the run loop


def _run_async(factory: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    """asyncio.run, also from inside Jupyter (whose loop is already running): use a thread then."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(factory())
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: asyncio.run(factory())).result()


def _check_lengths(args: BenchArgs, max_model_len: int | None) -> None:
    if not max_model_len:
        return
    lengths = args.input_lens if args.workload == "ttft" else [args.input_len] if args.input_len else []
    longest = max(args.series_lens) if args.series_lens else args.output_len
    too_long = [n for n in lengths if n + longest > max_model_len]
    if too_long:
        raise Gemma4T4Error(
            f"input {too_long[0]} + output {longest} tokens exceed the server's max_model_len {max_model_len}",
            fix="lower --input-len/--input-lens or restart the server with a larger --max-model-len",
        )


def run_benchmark(
    base_url: str | BenchArgs,
    model: str | None = None,
    workload: str | None = None,
    out_dir: str | Path | None = None,
    **opts: Any,
) -> BenchRun:
    """Run one workload against a live server or endpoint; write a results directory and return
    the run (in memory). ``opts`` are :class:`BenchArgs` fields, or pass a ``BenchArgs`` alone.
    Raises :class:`Gemma4T4Error` before measuring anything if the server is unreachable."""
    if isinstance(base_url, BenchArgs):
        args = base_url
    else:
        if model is None or workload is None or out_dir is None:
            raise Gemma4T4Error(
                "run_benchmark needs base_url, model, workload and out_dir",
                fix="call run_benchmark(base_url, model, workload, out_dir, ...) or pass BenchArgs",
            )
        args = build_args(base_url, model, workload, out_dir, **opts)
    # before the server is asked anything: a folder holding other files is refused, not mixed into
    out = check_out_dir(args.out_dir, args.overwrite)
    backend = backend_for(args.base_url, args.key(), args.request_timeout_s)
    server = backend.check(args.model)
    _check_lengths(args, server.max_model_len)
    environment = backend.environment(args.model, args.server_launch)
    entry = WORKLOADS[args.mode]
    factory = None
    tokenizer_source = None
    if entry.prompts:
        tok = backend.tokenizer(args.model, args.tokenizer)
        tokenizer_source = tok.source
        factory = PromptFactory(tok, seed=args.seed, nonce=args.nonce, chat=args.api == "chat")
    cells = entry.build(args, factory)
    writer = ResultsWriter(
        out,
        RunInfo(
            run_id=uuid.uuid4().hex[:12],
            workload=args.workload,
            model=args.model,
            base_url=args.base_url,
            label=args.label,
            started_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            config=args.record(),
            prompts=PromptInfo(
                seed=args.seed, nonce=factory.nonce if factory else None, tokenizer=tokenizer_source
            ),
            server=server,
            environment=secrets.mask(environment),
            definitions="docs/benchmarks.md#metric-definitions",
        ),
        overwrite=args.overwrite,
    )
    status, error = "complete", None
    measured: dict[str, list[RequestRecord]] = {}
    try:
        with signals.orderly_stop(redeliver=False):
            pending = list(cells)
            while pending:
                cell = pending.pop(0)
                summary, records = _run_cell(args, backend, cell, writer)
                measured[cell.cell] = records
                if summary.failed and args.stop_on_unreachable:
                    try:
                        backend.check(None if backend.kind == "openai-http" else args.model)
                    except Gemma4T4Error as exc:
                        status, error = "aborted: server unreachable", exc.message
                        break
                if entry.follow is not None:
                    try:
                        more, fields = entry.follow(args, factory, writer.cells)
                    except Gemma4T4Error as exc:
                        status, error = "aborted: no load range to sweep", exc.message
                        raise
                    if fields:
                        writer.update_run(**{k: v.to_json() for k, v in fields.items()})
                    pending += more
            if args.mode == "series_decode":
                writer.update_run(series_decode=_series_figure(args, cells, measured).to_json())
            if status == "complete" and any(c.failed for c in writer.cells):
                status = "complete with failures"
    except KeyboardInterrupt as exc:
        status = signals.interrupt_label(exc)
        raise
    except Exception as exc:  # whatever stopped the run, run.json must not call it complete
        if status == "complete":
            status, error = f"aborted: {type(exc).__name__}", str(exc)[:300]
        raise
    finally:
        writer.update_run(status=status, error=error, finished_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        writer.close()
    return writer.result()


def _series_figure(args: BenchArgs, cells: list[Cell], measured: dict[str, list[RequestRecord]]) -> Any:
    short, long = args.series_lens
    by_variant = {c.variant: measured.get(c.cell, []) for c in cells}
    return series_decode(by_variant.get("series_short", []), by_variant.get("series_long", []), short, long)


def _queueing(concurrency: int, max_num_seqs: int | None) -> bool | None:
    return None if max_num_seqs is None else concurrency > max_num_seqs


def _run_cell(
    args: BenchArgs, backend: Backend, cell: Cell, writer: ResultsWriter
) -> tuple[CellSummary, list[RequestRecord]]:
    from gemma4_t4.bench import telemetry

    measured: list[RequestRecord] = []
    started = time.time()
    before = after = None
    load = ServerLoad()
    gpu: GPUTelemetry | None = None
    interrupted = False
    try:
        if cell.warmup_specs:
            _run_async(
                lambda: _measure(
                    args,
                    backend,
                    cell.warmup_specs,
                    min(cell.concurrency, len(cell.warmup_specs)),
                    lambda r: writer.add_record(cell.cell, "warmup", r),
                    None,
                )
            )
        before = backend.scrape()
        make_sampler = getattr(backend, "sampler", None)
        sampler = make_sampler() if (args.sample_metrics and make_sampler) else None
        sampler = sampler.start() if sampler else None
        gpu_sampler = telemetry.GPUSampler().start()

        def keep(record: RequestRecord) -> None:
            measured.append(record)
            writer.add_record(cell.cell, "measure", record)

        try:
            _run_async(lambda: _measure(args, backend, cell.specs, cell.concurrency, keep, cell.cell, cell))
        finally:
            load = sampler.stop() if sampler else ServerLoad()
            gpu = gpu_sampler.stop()
            after = backend.scrape()
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        summary = _summarize_cell(
            args,
            cell,
            measured,
            before,
            after,
            load,
            gpu,
            started,
            partial=interrupted or len(measured) < len(cell.specs),
        )
        writer.add_cell(summary)
    return summary, measured


def _summarize_cell(
    args: BenchArgs,
    cell: Cell,
    measured: list[RequestRecord],
    before: Any,
    after: Any,
    load: ServerLoad,
    gpu: GPUTelemetry | None,
    started: float,
    partial: bool,
) -> CellSummary:
    from gemma4_t4.bench import telemetry

    stats = aggregate(measured)
    summary = CellSummary(
        cell=cell.cell,
        workload=cell.workload,
        variant=cell.variant,
        api=args.api,
        concurrency=None if cell.rate else cell.concurrency,
        input_len=cell.input_len,
        output_len=cell.output_len,
        num_prompts=len(cell.specs),
        warmup_requests=len(cell.warmup_specs),
        max_num_seqs=args.max_num_seqs,
        queueing=None if cell.rate else _queueing(cell.concurrency, args.max_num_seqs),
        partial=partial,
        started_at=started,
        **stats.model_dump(),
    )
    if cell.rate:
        summary.open_loop = open_loop_stats(measured, cell.rate, cell.arrival, cell.concurrency)
    summary.prefix_cache = telemetry.prefix_cache_delta(before, after)
    summary.prefix_cache.prefix_caching_enabled = telemetry.cache_config(after).get("enable_prefix_caching")
    summary.spec_decode = telemetry.spec_decode_delta(before, after)
    summary.server_load = load
    if load.max_waiting:
        summary.queueing_observed = True
    summary.gpu_telemetry = gpu or None
    summary.meta = dict(cell.meta)
    input_lens = [r.prompt_tokens for r in measured if r.prompt_tokens is not None]
    if input_lens and cell.input_len is not None:
        summary.input_len_exact = all(n == cell.input_len for n in input_lens)
    if cell.workload == "answers":
        summary.answers = _answers(measured)
        summary.correct = sum(1 for a in summary.answers if a.correct)
    summary.derived = derive_cell(
        summary, args.gpu, args.bytes_per_token, args.price_keys, open_loop=cell.rate is not None
    )
    return summary


def _answers(measured: list[RequestRecord]) -> list[Answer]:
    out = []
    for record in measured:
        index = int(record.request_id.rsplit("-", 1)[1])
        question, expected = QUESTIONS[index]
        text = record.text or ""
        out.append(
            Answer(
                index=index,
                question=question,
                expected=expected,
                text=text,
                correct=record.error is None and is_correct(text, expected),
                error=record.error,
            )
        )
    return sorted(out, key=lambda a: a.index)


async def _measure(
    args: BenchArgs,
    backend: Backend,
    specs: list[RequestSpec],
    concurrency: int,
    on_record: Callable[[RequestRecord], None],
    progress_desc: str | None,
    cell: Cell | None = None,
) -> None:
    from tqdm.auto import tqdm

    bar = tqdm(
        total=len(specs),
        desc=progress_desc,
        unit="req",
        leave=True,
        disable=not (args.progress and progress_desc),
    )
    failed = 0

    def record(r: RequestRecord) -> None:
        nonlocal failed
        on_record(r)
        if r.error:
            failed += 1
            bar.set_postfix(failed=failed)
        bar.update(1)

    try:
        async with backend.sender(args.model, concurrency, keep_text=args.workload == "answers") as send:
            if cell is not None and cell.rate:
                offsets = arrival_offsets(len(specs), cell.rate, cell.arrival or "poisson", seed=args.seed)
                await open_loop(send, specs, offsets, concurrency, record)
            else:
                await closed_loop(send, specs, concurrency, record)
    finally:
        bar.close()


__all__ = [
    "ARRIVALS",
    "METHODS",
    "WORKLOADS",
    "WORKLOAD_CHOICES",
    "BenchArgs",
    "Cell",
    "ServerInfo",
    "Workload",
    "build_args",
    "build_cells",
    "rate_cells",
    "run_benchmark",
    "sweep_rates",
]
