"""Workloads and the run loop: decode sweep, TTFT vs input length, prefix cache, answers.

Every cell: warm-up with its own prompts (never the measured ones) → ``/metrics`` scrape →
measured closed-loop run (records streamed to disk) → scrape → summary with the prefix-cache
hit rate measured from the scrape delta. Cells above the server's ``max_num_seqs`` are
labelled as queueing.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from gemma4_t4.bench import telemetry
from gemma4_t4.bench.answers import QUESTIONS, is_correct
from gemma4_t4.bench.client import (
    ARRIVALS,
    Api,
    RequestRecord,
    RequestSpec,
    arrival_offsets,
    make_session,
    run_closed_loop,
    run_open_loop,
)
from gemma4_t4.bench.derive import derive_cell, lookup_bytes_per_token
from gemma4_t4.bench.metrics import aggregate, open_loop_stats
from gemma4_t4.bench.prompts import HFTokenizer, PromptFactory, ServerTokenizer
from gemma4_t4.bench.results import BenchRun, ResultsWriter, load_run
from gemma4_t4.errors import Gemma4T4Error

Workload = Literal["decode", "ttft", "prefix", "answers"]
WORKLOADS: tuple[str, ...] = ("decode", "ttft", "prefix", "answers")

DEFAULTS: dict[str, dict[str, Any]] = {
    "decode": {"concurrency": [1, 2, 4, 8, 16], "input_len": 512, "output_len": 128, "num_prompts": None},
    "ttft": {"concurrency": [1], "input_lens": [256, 512, 1024, 2048, 4096], "output_len": 16,
             "num_prompts": 16},
    "prefix": {"concurrency": [1], "input_len": 1024, "output_len": 32, "num_prompts": 32, "groups": 4},
    "answers": {"concurrency": [1], "output_len": 32},
}


@dataclass
class BenchConfig:
    base_url: str
    model: str
    workload: str
    out_dir: str
    api: Api = "completions"  # answers default to chat
    concurrency: list[int] | None = None
    rates: list[float] | None = None  # decode: open-loop cells at these offered request rates (req/s)
    arrival: str = "poisson"  # open loop: "poisson" or "constant" gaps
    max_in_flight: int = 256  # open loop: requests the client keeps in flight at most
    sweep: int | None = None  # decode: measure c=1 and all-at-once, then this many rates in between
    input_len: int | None = None
    input_lens: list[int] | None = None  # ttft
    output_len: int | None = None
    num_prompts: int | None = None  # per cell; decode default max(32, 4 x concurrency)
    warmup: int = 2  # warm-up requests per cell (at least the concurrency), disjoint from the measured ones
    seed: int = 0
    nonce: str | None = None  # default: fresh per run (recorded) so re-runs never hit old cache
    prefix_len: int | None = None  # prefix workload; default 3/4 of input_len
    groups: int | None = None
    max_num_seqs: int | None = None  # default: from server_launch if given
    api_key: str | None = None
    tokenizer: str | None = None  # local tokenizer path; default the server's /tokenize
    label: str | None = None
    gpu: str | None = None  # hardware key for roofline and cost ("t4", "l4")
    bytes_per_token: float | None = None
    model_format: str | None = None  # for the gemma4_t4.models lookup ("bf16", "qat", "emb4")
    price_keys: list[str] | None = None
    server_launch: dict[str, Any] | None = None
    request_timeout_s: float = 600.0
    sample_metrics: bool = True
    progress: bool = True
    overwrite: bool = False
    stop_on_unreachable: bool = True

    def resolved(self) -> BenchConfig:
        if self.workload not in WORKLOADS:
            raise Gemma4T4Error(f"unknown workload {self.workload!r}", fix=f"use one of: {', '.join(WORKLOADS)}")
        d = DEFAULTS[self.workload]
        c = BenchConfig(**asdict(self))
        c.concurrency = list(self.concurrency or d["concurrency"])
        c.output_len = self.output_len or d["output_len"]
        if self.workload == "ttft":
            c.input_lens = list(self.input_lens or ([self.input_len] if self.input_len else d["input_lens"]))
        else:
            c.input_len = self.input_len or d.get("input_len")
        c.num_prompts = self.num_prompts or d.get("num_prompts")
        if self.workload == "prefix":
            c.groups = self.groups or d["groups"]
            c.prefix_len = self.prefix_len or (c.input_len * 3 // 4)
        if self.workload == "answers" and self.api == "completions" and "api" not in self._explicit:
            c.api = "chat"
        if c.max_num_seqs is None and self.server_launch:
            c.max_num_seqs = (self.server_launch.get("config") or {}).get("max_num_seqs")
        if c.sweep is not None:
            if c.workload != "decode" or c.rates is not None or self.concurrency is not None:
                raise Gemma4T4Error("--sweep is for the decode workload and chooses its own rates",
                                    fix="use --workload decode and drop --rate/--concurrency")
            if c.sweep < 1:
                raise Gemma4T4Error(f"--sweep {c.sweep} must be at least 1", fix="use e.g. --sweep 5")
        if c.rates is not None:
            if c.workload != "decode":
                raise Gemma4T4Error(f"--rate is for the decode workload, not {c.workload}",
                                    fix="drop --rate, or use --workload decode")
            if not c.rates or any(not r > 0 for r in c.rates):
                raise Gemma4T4Error(f"rates must be > 0 requests/s, got {c.rates}", fix="use e.g. --rate 0.5,1,2")
            if c.arrival not in ARRIVALS:
                raise Gemma4T4Error(f"unknown arrival {c.arrival!r}", fix=f"use one of: {', '.join(ARRIVALS)}")
            if c.max_in_flight < 1:
                raise Gemma4T4Error("max_in_flight must be at least 1", fix="use e.g. --max-in-flight 64")
        for value in c.concurrency:
            if value < 1:
                raise Gemma4T4Error(f"concurrency {value} must be at least 1", fix="use e.g. --concurrency 1,8")
        if c.output_len is not None and c.output_len < 1:
            raise Gemma4T4Error("output length must be at least 1", fix="use --output-len 1 or more")
        if c.num_prompts is not None and c.num_prompts < 1:
            raise Gemma4T4Error("num_prompts must be at least 1", fix="use --num-prompts 1 or more")
        if c.workload == "prefix" and c.num_prompts < 2 * c.groups:
            raise Gemma4T4Error(f"{c.num_prompts} prompts cannot make {c.groups} groups of at least 2",
                                fix="raise --num-prompts or lower --groups")
        if self.bytes_per_token is None and self.model_format:
            c.bytes_per_token = lookup_bytes_per_token(self.model, self.model_format)
        return c

    _explicit: frozenset[str] = field(default=frozenset(), repr=False)


def _run_async(factory: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    """asyncio.run, also from inside Jupyter (whose loop is already running): use a thread then."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(factory())
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: asyncio.run(factory())).result()


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
    meta: dict[str, Any] = field(default_factory=dict)
    rate: float | None = None  # open loop: offered requests/s (concurrency is then the in-flight cap)
    arrival: str | None = None


def _specs(prompts: list[Any], cell: str, cfg: BenchConfig, ignore_eos: bool = True,
           temperature: float = 0.0) -> list[RequestSpec]:
    return [RequestSpec(f"{cell}-{i}", p.text, cfg.output_len, api=cfg.api, ignore_eos=ignore_eos,
                        temperature=temperature, input_len=p.tokens) for i, p in enumerate(prompts)]


def _warm_count(cfg: BenchConfig, concurrency: int) -> int:
    # a full batch of warm-up requests: the first batch of a new size can stall on some backends
    return max(cfg.warmup, concurrency) if cfg.warmup > 0 else 0


def build_cells(cfg: BenchConfig, factory: PromptFactory | None) -> list[Cell]:
    """All cells of a workload, prompts included (built before anything is measured)."""
    cells: list[Cell] = []
    w = cfg.workload
    if w == "decode" and cfg.sweep:
        n = cfg.num_prompts or 32
        for variant, c in (("sweep_synchronous", 1), ("sweep_throughput", min(n, cfg.max_in_flight))):
            name = f"decode-{variant.removeprefix('sweep_')}-in{cfg.input_len}-out{cfg.output_len}"
            cells.append(Cell(name, w, variant, c, cfg.input_len, cfg.output_len,
                              _specs(factory.unique(name, n, cfg.input_len), name, cfg),
                              _specs(factory.unique(f"w-{name}", _warm_count(cfg, c), cfg.input_len),
                                     f"w-{name}", cfg)))
    elif w == "decode" and cfg.rates:
        cells += rate_cells(cfg, factory, cfg.rates)
    elif w == "decode":
        for c in cfg.concurrency:
            name = f"decode-c{c}-in{cfg.input_len}-out{cfg.output_len}"
            n = cfg.num_prompts or max(32, 4 * c)
            cells.append(Cell(name, w, "decode", c, cfg.input_len, cfg.output_len,
                              _specs(factory.unique(name, n, cfg.input_len), name, cfg),
                              _specs(factory.unique(f"w-{name}", _warm_count(cfg, c), cfg.input_len), f"w-{name}", cfg)))
    elif w == "ttft":
        for c in cfg.concurrency:
            for length in cfg.input_lens:
                name = f"ttft-c{c}-in{length}-out{cfg.output_len}"
                cells.append(Cell(name, w, "ttft", c, length, cfg.output_len,
                                  _specs(factory.unique(name, cfg.num_prompts, length), name, cfg),
                                  _specs(factory.unique(f"w-{name}", _warm_count(cfg, c), length), f"w-{name}", cfg)))
    elif w == "prefix":
        per_group = cfg.num_prompts // cfg.groups
        for c in cfg.concurrency:
            base = f"prefix-c{c}-in{cfg.input_len}-p{cfg.prefix_len}-out{cfg.output_len}"
            groups = factory.shared_prefix(f"{base}-shared", cfg.groups, per_group, cfg.prefix_len, cfg.input_len)
            shared = [p for group in groups for p in group]  # group-major: the first of each group fills
            meta = {"prefix_len": cfg.prefix_len, "groups": cfg.groups, "per_group": per_group}
            warm = _specs(factory.unique(f"w-{base}", _warm_count(cfg, c), cfg.input_len), f"w-{base}", cfg)
            cells.append(Cell(f"{base}-shared", w, "shared_prefix", c, cfg.input_len, cfg.output_len,
                              _specs(shared, f"{base}-shared", cfg), warm, meta))
            control = factory.unique(f"{base}-unique", len(shared), cfg.input_len)
            cells.append(Cell(f"{base}-unique", w, "unique_prompts", c, cfg.input_len, cfg.output_len,
                              _specs(control, f"{base}-unique", cfg), [], meta | {"control": True}))
    elif w == "answers":
        specs = [RequestSpec(f"answers-{i}", q, cfg.output_len, api=cfg.api, ignore_eos=False, temperature=0.0)
                 for i, (q, _) in enumerate(QUESTIONS)]
        warm = [RequestSpec(f"w-answers-{i}", f"Say the word number {i}.", 8, api=cfg.api, ignore_eos=False)
                for i in range(_warm_count(cfg, max(cfg.concurrency)))]
        for c in cfg.concurrency:
            cells.append(Cell(f"answers-c{c}", w, "answers", c, None, cfg.output_len, specs, warm))
    return cells


def rate_cells(cfg: BenchConfig, factory: PromptFactory, rates: list[float], variant: str = "open_loop") -> list[Cell]:
    """Open-loop decode cells, one per offered request rate."""
    cells = []
    for rate in rates:
        name = f"decode-r{rate:g}-{cfg.arrival}-in{cfg.input_len}-out{cfg.output_len}"
        n = cfg.num_prompts or max(16, min(256, round(30 * rate)))  # about 30 s of arrivals
        cells.append(Cell(name, "decode", variant, cfg.max_in_flight, cfg.input_len, cfg.output_len,
                          _specs(factory.unique(name, n, cfg.input_len), name, cfg),
                          _specs(factory.unique(f"w-{name}", cfg.warmup, cfg.input_len), f"w-{name}", cfg),
                          rate=rate, arrival=cfg.arrival))
    return cells


def sweep_rates(synchronous_rps: float, throughput_rps: float, count: int) -> list[float]:
    """``count`` request rates evenly spaced strictly between the synchronous and the saturated rate."""
    if not (synchronous_rps > 0 and throughput_rps > synchronous_rps):
        raise Gemma4T4Error(
            f"the server did not get faster with more concurrent requests ({synchronous_rps:.3g} req/s one at a "
            f"time, {throughput_rps:.3g} req/s all at once): there is no load range to sweep",
            fix="check the server's --max-num-seqs, or choose rates with --rate")
    step = (throughput_rps - synchronous_rps) / (count + 1)
    return [synchronous_rps + step * (i + 1) for i in range(count)]


def _check_lengths(cfg: BenchConfig, max_model_len: int | None) -> None:
    if not max_model_len:
        return
    lengths = cfg.input_lens if cfg.workload == "ttft" else [cfg.input_len] if cfg.input_len else []
    too_long = [n for n in lengths if n + cfg.output_len > max_model_len]
    if too_long:
        raise Gemma4T4Error(
            f"input {too_long[0]} + output {cfg.output_len} tokens exceed the server's max_model_len "
            f"{max_model_len}",
            fix="lower --input-len/--input-lens or restart the server with a larger --max-model-len",
        )


def run_benchmark(base_url: str, model: str, workload: str, out_dir: str | Path, **opts: Any) -> BenchRun:
    """Run one workload against a live server and write a results directory.

    ``opts`` are :class:`BenchConfig` fields (concurrency, input_len, output_len, num_prompts, ...).
    Raises :class:`Gemma4T4Error` before measuring anything if the server is unreachable.
    """
    unknown = set(opts) - set(BenchConfig.__dataclass_fields__)
    if unknown:
        raise Gemma4T4Error(f"unknown option(s): {', '.join(sorted(unknown))}",
                            fix="see gemma4_t4.bench.workloads.BenchConfig for the options")
    raw = BenchConfig(base_url=base_url, model=model, workload=workload, out_dir=str(out_dir), **opts)
    raw._explicit = frozenset(opts)
    cfg = raw.resolved()
    server = telemetry.check_reachable(cfg.base_url, cfg.model, cfg.api_key)
    _check_lengths(cfg, server.get("max_model_len"))
    environment = telemetry.capture_environment(cfg.base_url, cfg.model, cfg.api_key, cfg.server_launch)
    factory = None
    tokenizer_source = None
    if cfg.workload != "answers":
        tok = HFTokenizer(cfg.tokenizer) if cfg.tokenizer else ServerTokenizer(cfg.base_url, cfg.model, cfg.api_key)
        tokenizer_source = tok.source
        factory = PromptFactory(tok, seed=cfg.seed, nonce=cfg.nonce, chat=cfg.api == "chat")
    cells = build_cells(cfg, factory)
    config_record = {k: v for k, v in asdict(cfg).items() if k not in ("api_key", "_explicit")}
    writer = ResultsWriter(cfg.out_dir, {
        "run_id": uuid.uuid4().hex[:12],
        "workload": cfg.workload,
        "model": cfg.model,
        "base_url": cfg.base_url,
        "label": cfg.label,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "config": config_record,
        "prompts": {"seed": cfg.seed, "nonce": factory.nonce if factory else None, "tokenizer": tokenizer_source},
        "server": server,
        "environment": environment,
        "definitions": "docs/benchmarks.md#metric-definitions",
    }, overwrite=cfg.overwrite)
    status = "complete"
    try:
        pending = list(cells)
        while pending:
            cell = pending.pop(0)
            summary = _run_cell(cfg, cell, writer)
            if summary["failed"] and cfg.stop_on_unreachable:
                try:
                    telemetry.check_reachable(cfg.base_url, None, cfg.api_key)
                except Gemma4T4Error:
                    status = "aborted: server unreachable"
                    break
            if cell.variant == "sweep_throughput":  # both ends measured: now the rates in between
                ends = {c["variant"]: c.get("request_throughput_req_s") or 0.0 for c in writer.cells}
                try:
                    rates = sweep_rates(ends["sweep_synchronous"], ends["sweep_throughput"], cfg.sweep)
                except Gemma4T4Error:
                    status = "aborted: no load range to sweep"
                    raise
                writer.update_run(sweep={"synchronous_rps": ends["sweep_synchronous"],
                                         "throughput_rps": ends["sweep_throughput"], "rates": rates})
                pending += rate_cells(cfg, factory, rates, variant="sweep_rate")
        if status == "complete" and any(c.get("failed") for c in writer.cells):
            status = "complete with failures"
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    finally:
        writer.update_run(status=status, finished_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        writer.close()
    return load_run(cfg.out_dir)


def _queueing(concurrency: int, max_num_seqs: int | None) -> bool | None:
    return None if max_num_seqs is None else concurrency > max_num_seqs


def _run_cell(cfg: BenchConfig, cell: Cell, writer: ResultsWriter) -> dict[str, Any]:
    measured: list[dict[str, Any]] = []
    started = time.time()
    before = after = None
    load: dict[str, Any] = {}
    gpu: dict[str, Any] | None = None
    interrupted = False
    try:
        if cell.warmup_specs:
            _run_async(lambda: _measure(cfg, cell.warmup_specs, min(cell.concurrency, len(cell.warmup_specs)),
                                        lambda r: writer.add_record(cell.cell, "warmup", r.to_dict()),
                                        None))
        before = telemetry.scrape(cfg.base_url, cfg.api_key)
        sampler = telemetry.MetricsSampler(cfg.base_url, cfg.api_key).start() if cfg.sample_metrics else None
        gpu_sampler = telemetry.GPUSampler().start()

        def keep(record: RequestRecord) -> None:
            data = record.to_dict()
            measured.append(data)
            writer.add_record(cell.cell, "measure", data)

        try:
            _run_async(lambda: _measure(cfg, cell.specs, cell.concurrency, keep, cell.cell, cell))
        finally:
            load = sampler.stop() if sampler else {}
            gpu = gpu_sampler.stop()
            after = telemetry.scrape(cfg.base_url, cfg.api_key)
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        summary = _summarize_cell(cfg, cell, measured, before, after, load, gpu, started,
                                  partial=interrupted or len(measured) < len(cell.specs))
        writer.add_cell(summary)
    return summary


def _summarize_cell(cfg: BenchConfig, cell: Cell, measured: list[dict[str, Any]], before: Any, after: Any,
                    load: dict[str, Any], gpu: dict[str, Any] | None, started: float,
                    partial: bool) -> dict[str, Any]:
    agg = aggregate(measured)
    summary: dict[str, Any] = {
        "cell": cell.cell,
        "workload": cell.workload,
        "variant": cell.variant,
        "api": cfg.api,
        "concurrency": None if cell.rate else cell.concurrency,
        "input_len": cell.input_len,
        "output_len": cell.output_len,
        "num_prompts": len(cell.specs),
        "warmup_requests": len(cell.warmup_specs),
        "max_num_seqs": cfg.max_num_seqs,
        "queueing": None if cell.rate else _queueing(cell.concurrency, cfg.max_num_seqs),
        "partial": partial,
        "started_at": started,
    } | agg
    if cell.rate:
        summary["open_loop"] = open_loop_stats(measured, cell.rate, cell.arrival, cell.concurrency)
    summary["prefix_cache"] = telemetry.prefix_cache_delta(before, after)
    summary["prefix_cache"]["prefix_caching_enabled"] = telemetry.cache_config(after).get("enable_prefix_caching")
    summary["server_load"] = load
    if load.get("max_waiting"):
        summary["queueing_observed"] = True
    if gpu:
        summary["gpu_telemetry"] = gpu
    summary["meta"] = cell.meta
    input_lens = [r.get("prompt_tokens") for r in measured if r.get("prompt_tokens") is not None]
    if input_lens and cell.input_len is not None:
        summary["input_len_exact"] = all(n == cell.input_len for n in input_lens)
    if cell.workload == "answers":
        summary["answers"] = _answers(measured)
        summary["correct"] = sum(1 for a in summary["answers"] if a["correct"])
    summary["derived"] = derive_cell(summary, cfg.gpu, cfg.bytes_per_token, cfg.price_keys)
    return summary


def _answers(measured: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for record in measured:
        index = int(record["request_id"].rsplit("-", 1)[1])
        question, expected = QUESTIONS[index]
        text = record.get("text") or ""
        out.append({"index": index, "question": question, "expected": expected, "text": text,
                    "correct": record.get("error") is None and is_correct(text, expected),
                    "error": record.get("error")})
    return sorted(out, key=lambda a: a["index"])


async def _measure(cfg: BenchConfig, specs: list[RequestSpec], concurrency: int,
                   on_record: Callable[[RequestRecord], None], progress_desc: str | None,
                   cell: Cell | None = None) -> None:
    from tqdm.auto import tqdm

    bar = tqdm(total=len(specs), desc=progress_desc, unit="req", leave=True,
               disable=not (cfg.progress and progress_desc))
    failed = 0

    def record(r: RequestRecord) -> None:
        nonlocal failed
        on_record(r)
        if r.error:
            failed += 1
            bar.set_postfix(failed=failed)
        bar.update(1)

    try:
        async with make_session(concurrency, cfg.request_timeout_s) as session:
            if cell is not None and cell.rate:
                offsets = arrival_offsets(len(specs), cell.rate, cell.arrival or "poisson", seed=cfg.seed)
                await run_open_loop(session, cfg.base_url, cfg.model, specs, offsets, concurrency, record,
                                    api_key=cfg.api_key)
            else:
                await run_closed_loop(session, cfg.base_url, cfg.model, specs, concurrency, record,
                                      api_key=cfg.api_key, keep_text=cfg.workload == "answers")
    finally:
        bar.close()
