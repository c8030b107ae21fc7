"""The benchmark: its arguments (:class:`BenchArgs`: run options and a workload spec) and the run loop.

Every cell: warm-up with its own prompts (never the measured ones) → ``/metrics`` scrape → measured
run (records streamed to disk) → scrape → summary, the prefix-cache hit rate from the scrape delta.
Cells above the server's ``max_num_seqs`` are labelled queueing. A workload may add cells after one
is measured (the sweep's rates come from its measured ends, as guidellm's sweep does).
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from pydantic import Field, SerializeAsAny, ValidationError, field_validator, model_validator

from gemma4_t4.bench import telemetry
from gemma4_t4.bench.answers import QUESTIONS, is_correct
from gemma4_t4.bench.args import BenchOptions
from gemma4_t4.bench.backends import Backend, backend_for, parse_base_url
from gemma4_t4.bench.cells import Cell
from gemma4_t4.bench.client import RequestSpec, arrival_offsets, closed_loop, open_loop
from gemma4_t4.bench.derive import derive_cell, lookup_bytes_per_token
from gemma4_t4.bench.metrics import aggregate, open_loop_stats
from gemma4_t4.bench.prompts import PromptFactory
from gemma4_t4.bench.registry import REGISTRY, WorkloadSpec, spec_for, spec_from_options
from gemma4_t4.bench.results import BenchRun, ResultsWriter, check_out_dir
from gemma4_t4.bench.schemas import (
    Answer,
    CellSummary,
    GPUTelemetry,
    PromptInfo,
    RequestRecord,
    RunInfo,
    ServerLoad,
)
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation import secrets, signals
from gemma4_t4.foundation.jsonable import JSONValue

# ---------------------------------------------------------------- arguments


class BenchArgs(BenchOptions):
    """One benchmark run: the run-level options (:class:`BenchOptions`) and the workload spec it measures."""

    spec: SerializeAsAny[WorkloadSpec] = Field(description="what to measure: a registered workload")

    @field_validator("spec", mode="before")
    @classmethod
    def _registered(cls, value: object) -> object:
        if isinstance(value, dict):  # a dumped run (run.json's config): its kind names the class
            fields = dict(value)
            return spec_for(str(fields.pop("kind", "")), **fields)
        return value

    @field_validator("base_url")
    @classmethod
    def _url(cls, value: str) -> str:
        parse_base_url(value)
        return value.rstrip("/")

    @field_validator("request_timeout_s")
    @classmethod
    def _timeout(cls, value: float | None) -> float | None:
        if value is not None and not value > 0:
            message = f"--request-timeout {value} must be > 0 seconds"
            raise Gemma4T4Error(message, fix="use e.g. --request-timeout 120")
        return value

    @model_validator(mode="after")
    def _resolve(self) -> BenchArgs:
        self.api = self.api or self.spec.api
        if self.max_num_seqs is None and self.server_launch:
            self.max_num_seqs = (self.server_launch.get("config") or {}).get("max_num_seqs")
        if self.bytes_per_token is None and self.model_format:
            self.bytes_per_token = lookup_bytes_per_token(self.model, self.model_format)
        return self

    @property
    def workload(self) -> str:
        """What the results call the workload (open loop, sweep and series decode are decode)."""
        return self.spec.workload

    def key(self) -> str | None:
        return self.api_key.get_secret_value() if self.api_key else None

    def secret_values(self) -> list[str]:
        """What no result may hold: the API key and every secret the environment holds (a server
        may echo the Authorization header, or a proxy's token, in an error body)."""
        return secrets.known_values([self.key()])

    def record(self) -> dict[str, JSONValue]:
        """What run.json stores: every argument (as JSON), the API key and other secrets never."""
        data = self.model_dump(mode="json", exclude={"api_key"})
        data["api_key_used"] = self.api_key is not None
        return secrets.mask(data, self.secret_values())  # a label may hold the key too


def build_args(base_url: str, model: str, workload: str, out_dir: str | Path, **opts: Any) -> BenchArgs:
    """:class:`BenchArgs` from keyword options (run options and the workload's fields, as the CLI's
    flags give them), with one-line errors for unknown or invalid ones."""
    run_level = {k: v for k, v in opts.items() if k in BenchOptions.model_fields}
    fields = {k: v for k, v in opts.items() if k not in run_level}
    known = {name for spec in REGISTRY.values() for name in spec.model_fields} | {"method"}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise Gemma4T4Error(
            f"unknown option(s): {', '.join(unknown)}", fix="see gemma4-t4 bench run --help for the options"
        )
    spec = spec_from_options(workload, **fields)
    try:
        return BenchArgs(base_url=base_url, model=model, out_dir=str(out_dir), spec=spec, **run_level)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "arguments"
        raise Gemma4T4Error(
            f"invalid benchmark option {where}: {first['msg']}",
            fix="see gemma4_t4.bench.BenchArgs (or gemma4-t4 bench run --help)",
        ) from None


# ---------------------------------------------------------------- the run loop


def _check_lengths(args: BenchArgs, max_model_len: int | None) -> None:
    if not max_model_len:
        return
    longest = args.spec.longest_output()
    too_long = [n for n in args.spec.prompt_lens() if n + longest > max_model_len]
    if too_long:
        raise Gemma4T4Error(
            f"input {too_long[0]} + output {longest} tokens exceed the server's max_model_len {max_model_len}",
            fix="lower --input-len/--input-lens or restart the server with a larger --max-model-len",
        )


def run_benchmark(
    base_url: str | BenchArgs, model: str | None = None, workload: str | None = None,
    out_dir: str | Path | None = None, **opts: Any,
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
    try:
        return _run(args)
    except Gemma4T4Error as exc:  # a server's message may hold the key it was sent: never shown
        values = args.secret_values()
        exc.message = secrets.mask_text(exc.message, values)
        exc.fix = exc.fix and secrets.mask_text(exc.fix, values)
        exc.args = (exc.message,)
        raise


# "a few minutes": a run expected to take longer says so before it starts, and shows its progress
LONG_RUN_S = 180.0


def _announce(args: BenchArgs, what: str, pace: list[tuple[int, float]], say: Callable[[str], None]) -> BenchArgs:
    """The run, with its progress shown where its open-loop cells (``pace``: requests and the rate they
    are sent at) take long: said before they start."""
    expected = sum(n / rate for n, rate in pace)
    if expected <= LONG_RUN_S:
        return args
    hours, minutes = divmod(round(expected / 60), 60)
    took = f"{hours} h {minutes} min" if hours else f"{minutes} min"
    rates = ", ".join(f"{n} requests at {rate:.3g} req/s" for n, rate in pace)
    say(f"note: {what} takes at least {took}: its requests are sent at the offered rate ({rates}); "
        "progress is shown per request")
    return args.model_copy(update={"progress": True})


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)  # stderr: --json's stdout and an MCP stdio stream stay clean


def _run(args: BenchArgs, say: Callable[[str], None] = _say) -> BenchRun:
    args = _announce(args, f"this {args.spec.kind} run", args.spec.pace(), say)
    # before the server is asked anything: a folder holding other files is refused, not mixed into
    out = check_out_dir(args.out_dir, args.overwrite)
    backend = backend_for(args.base_url, args.key(), args.request_timeout_s)
    server = backend.check(args.model)
    _check_lengths(args, server.max_model_len)
    environment = backend.environment(args.model, args.server_launch)
    spec, factory = args.spec, None
    if spec.prompts:
        tok = backend.tokenizer(args.model, args.tokenizer)
        factory = PromptFactory(tok, seed=spec.seed, nonce=spec.nonce, chat=args.api == "chat")
    cells = spec.cells(args, factory)
    # the results folder, with run.json saying what is measured, where, and with which prompts
    nonce, tokenizer = (factory.nonce, factory.tokenizer.source) if factory else (None, None)
    hidden = args.secret_values()
    info = RunInfo(
        run_id=uuid.uuid4().hex[:12], workload=args.workload, model=args.model, base_url=args.base_url,
        label=secrets.mask(args.label, hidden), started_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        config=args.record(), prompts=PromptInfo(seed=spec.seed, nonce=nonce, tokenizer=tokenizer),
        server=server, environment=secrets.mask(environment, hidden), definitions="docs/benchmarks.md#metric-definitions",
    )
    writer = ResultsWriter(out, info, overwrite=args.overwrite)
    outcome = _Outcome()
    try:
        with signals.orderly_stop(redeliver=False):
            _run_cells(args, backend, cells, factory, writer, outcome, say)
    except KeyboardInterrupt as exc:
        outcome.status = signals.interrupt_label(exc)
        raise
    except Exception as exc:  # whatever stopped the run, run.json must not call it complete
        if outcome.status == "complete":
            outcome.status, outcome.error = f"aborted: {type(exc).__name__}", secrets.mask_text(str(exc), hidden)[:300]
        raise
    finally:
        writer.update_run(status=outcome.status, error=outcome.error,
                          finished_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        writer.close()
    return writer.result()


@dataclass
class _Outcome:
    """How a run ended, as run.json records it (set as the cells run, read when the run closes)."""

    status: str = "complete"
    error: str | None = None


def _run_cells(
    args: BenchArgs, backend: Backend, cells: list[Cell], factory: PromptFactory | None,
    writer: ResultsWriter, outcome: _Outcome, say: Callable[[str], None],
) -> None:
    """Run the cells in order (a sweep adds more as it learns the load range, saying so where they take
    long), stopping early where the server became unreachable; ``outcome`` says how it ended."""
    spec = args.spec
    measured: dict[str, list[RequestRecord]] = {}
    pending = list(cells)
    while pending:
        cell = pending.pop(0)
        summary, records = _run_cell(args, backend, cell, writer)
        measured[cell.cell] = records
        if summary.failed and args.stop_on_unreachable:
            try:
                backend.check(None if backend.kind == "openai-http" else args.model)
            except Gemma4T4Error as exc:
                outcome.status, outcome.error = "aborted: server unreachable", exc.message
                break
        try:
            more, fields = spec.follow(args, factory, writer.cells)
        except Gemma4T4Error as exc:
            outcome.status, outcome.error = "aborted: no load range to sweep", exc.message
            raise
        if fields:
            writer.update_run(**fields)
        pace = [(len(c.specs), c.rate) for c in more if c.rate]
        args = _announce(args, f"the rest of this {spec.kind} run", pace, say)  # rates known only now
        pending += more
    figures = spec.finish(cells, measured)
    if figures:
        writer.update_run(**figures)
    if outcome.status == "complete" and any(c.failed for c in writer.cells):
        outcome.status = "complete with failures"


def _run_cell(
    args: BenchArgs, backend: Backend, cell: Cell, writer: ResultsWriter
) -> tuple[CellSummary, list[RequestRecord]]:
    measured: list[RequestRecord] = []
    started = time.time()
    before = after = None
    load = ServerLoad()
    gpu: GPUTelemetry | None = None
    interrupted = False
    try:
        if cell.warmup_specs:
            keep_warm = partial(writer.add_record, cell.cell, "warmup")
            streams = min(cell.concurrency, len(cell.warmup_specs))
            signals.run_to_completion(lambda: _measure(args, backend, cell.warmup_specs, streams, keep_warm))
        before = backend.scrape()
        sampler = backend.sampler() if args.sample_metrics else None
        sampler = sampler.start() if sampler else None
        gpu_sampler = telemetry.GPUSampler().start()

        def keep(record: RequestRecord) -> None:
            measured.append(record)
            writer.add_record(cell.cell, "measure", record)

        try:
            signals.run_to_completion(lambda: _measure(args, backend, cell.specs, cell.concurrency, keep, cell))
        finally:
            load = sampler.stop() if sampler else ServerLoad()
            gpu = gpu_sampler.stop()
            after = backend.scrape()
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        cut_short = interrupted or len(measured) < len(cell.specs)
        summary = _summarize_cell(args, cell, measured, before, after, load, gpu, started, partial=cut_short)
        writer.add_cell(summary)
    return summary, measured


def _summarize_cell(
    args: BenchArgs, cell: Cell, measured: list[RequestRecord], before: Any, after: Any, load: ServerLoad,
    gpu: GPUTelemetry | None, started: float, partial: bool,
) -> CellSummary:
    prefix_cache = telemetry.prefix_cache_delta(before, after)
    prefix_cache.prefix_caching_enabled = telemetry.cache_config(after).get("enable_prefix_caching")
    input_lens = [r.prompt_tokens for r in measured if r.prompt_tokens is not None]
    answers = _answers(measured) if cell.workload == "answers" else None
    summary = CellSummary(
        cell=cell.cell, workload=cell.workload, variant=cell.variant, api=args.api,
        concurrency=None if cell.rate else cell.concurrency, input_len=cell.input_len,
        output_len=cell.output_len, num_prompts=len(cell.specs), warmup_requests=len(cell.warmup_specs),
        max_num_seqs=args.max_num_seqs,
        # a closed-loop cell queues above the server's max_num_seqs (an open loop's concurrency is its cap)
        queueing=None if cell.rate or args.max_num_seqs is None else cell.concurrency > args.max_num_seqs,
        partial=partial,
        started_at=started, **aggregate(measured).model_dump(),
        open_loop=open_loop_stats(measured, cell.rate, cell.arrival, cell.concurrency) if cell.rate else None,
        prefix_cache=prefix_cache, spec_decode=telemetry.spec_decode_delta(before, after), server_load=load,
        queueing_observed=True if load.max_waiting else None, gpu_telemetry=gpu or None, meta=dict(cell.meta),
        input_len_exact=all(n == cell.input_len for n in input_lens) if input_lens and cell.input_len else None,
        answers=answers, correct=None if answers is None else sum(a.correct for a in answers),
    )
    summary.derived = derive_cell(summary, args.gpu, args.bytes_per_token, args.price_keys, cell.rate is not None)
    return summary


def _answers(measured: list[RequestRecord]) -> list[Answer]:
    out = []
    for record in measured:
        index = int(record.request_id.rsplit("-", 1)[1])
        question, expected = QUESTIONS[index]
        text = record.text or ""
        correct = record.error is None and is_correct(text, expected)
        out.append(Answer(index=index, question=question, expected=expected, text=text, correct=correct,
                          error=record.error))
    return sorted(out, key=lambda a: a.index)


async def _measure(
    args: BenchArgs, backend: Backend, specs: list[RequestSpec], concurrency: int,
    on_record: Callable[[RequestRecord], None], cell: Cell | None = None,
) -> None:
    """Send ``specs`` to the backend: a measured ``cell`` (its progress shown), or its warm-up (None)."""
    from tqdm.auto import tqdm

    desc = cell.cell if cell else None
    bar = tqdm(total=len(specs), desc=desc, unit="req", leave=True, disable=not (args.progress and desc))
    failed = 0
    values = args.secret_values()

    def record(r: RequestRecord) -> None:
        nonlocal failed
        for name in ("error_detail", "text"):  # what a server sent back, masked before it is stored or returned
            if getattr(r, name):
                setattr(r, name, secrets.mask_text(getattr(r, name), values))
        on_record(r)
        if r.error:
            failed += 1
            bar.set_postfix(failed=failed)
        bar.update(1)

    try:
        async with backend.sender(args.model, concurrency, keep_text=args.workload == "answers") as send:
            if cell is not None and cell.rate:
                offsets = arrival_offsets(len(specs), cell.rate, cell.arrival or "poisson", seed=args.spec.seed)
                await open_loop(send, specs, offsets, concurrency, record)
            else:
                await closed_loop(send, specs, concurrency, record)
    finally:
        bar.close()

