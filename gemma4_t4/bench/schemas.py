"""The benchmark's results as typed models: one request, its latency statistics, one measured
cell, the run's information, and the files they are stored in.

Every model is what ``summary.json`` / ``run.json`` / ``records.jsonl`` hold, field for field
(the on-disk names are the model's field names), so results written before these models still
load. Code reads them as models (``cell.ttft_ms.median``); fields a newer writer added are kept
in ``model_extra``. ``to_json()`` is what goes to disk.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation.jsonable import JSONObject

SCHEMA_FAMILY = "gemma4_t4.bench/"
SCHEMA_VERSION = 1
SCHEMA = f"{SCHEMA_FAMILY}{SCHEMA_VERSION}"

# JSON whose shape belongs to someone else (a server's reply, a launch record, host facts):
# stored as received, never interpreted field by field (the bench's name for a JSON object)
RawJSON = JSONObject


class BenchModel(BaseModel):
    """Base of every results model: unknown fields are kept in ``model_extra`` (a newer writer's
    extras survive a load/save round trip)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    def to_json(self) -> dict:
        return self.model_dump(mode="json", by_alias=True)


# ---------------------------------------------------------------- one request


class RequestRecord(BenchModel):
    """Raw measurements of one request. Times are seconds on the client's ``perf_counter`` clock."""

    request_id: str = Field(description="unique within the run; '<cell>-<index>'")
    api: str = Field("completions", description="completions | chat")
    input_len_target: int | None = Field(None, description="intended prompt length in tokens")
    max_tokens: int = Field(0, description="max_tokens sent")
    send_s: float = Field(description="request sent")
    first_byte_s: float | None = Field(None, description="first response byte")
    first_chunk_s: float | None = Field(None, description="first chunk carrying choices (may be role-only)")
    first_token_s: float | None = Field(None, description="first chunk carrying an output token")
    first_content_s: float | None = Field(None, description="first chunk with non-empty text (TTFT)")
    last_choice_s: float | None = Field(None, description="last chunk carrying choices (E2EL)")
    end_s: float | None = Field(None, description="end of the stream or of the failed request")
    chunk_times_s: list[float] = Field(default_factory=list, description="arrival of every output chunk")
    prompt_tokens: int | None = Field(None, description="server usage.prompt_tokens")
    completion_tokens: int | None = Field(
        None, description="server usage.completion_tokens (else chunk count)"
    )
    cached_tokens: int | None = Field(None, description="usage.prompt_tokens_details.cached_tokens")
    token_source: str | None = Field(None, description="usage | chunks: where completion_tokens came from")
    finish_reason: str | None = None
    http_status: int | None = Field(None, description="HTTP status (SageMaker: the runtime's status)")
    error: str | None = Field(None, description="error class; None for a successful request")
    error_detail: str | None = Field(None, description="the server's or network's message, shortened")
    output_chars: int = 0
    text: str | None = Field(None, description="generated text (answers workload only)")
    scheduled_s: float | None = Field(None, description="open loop: when the arrival process wanted it sent")
    streamed: bool | None = Field(None, description="False when the backend could not stream (no TTFT/TPOT)")
    attempts: int | None = Field(None, description="SageMaker: invocations made (throttling is retried)")


class StoredRecord(RequestRecord):
    """One line of ``records.jsonl``: a request record and where it belongs."""

    cell: str = Field(description="cell name")
    phase: Literal["warmup", "measure"] = Field(description="warm-up requests are never measured")


# ---------------------------------------------------------------- statistics


class LatencyStats(BenchModel):
    """A distribution. ``ci_low``/``ci_high`` bound the median (95 % percentile bootstrap)."""

    n: int = Field(0, description="values summarised")
    mean: float | None = None
    median: float | None = None
    p90: float | None = None
    p99: float | None = None
    std: float | None = Field(None, description="sample standard deviation (ddof 1)")
    min: float | None = None
    max: float | None = None
    ci_low: float | None = Field(None, description="median's 95 % bootstrap interval, low end")
    ci_high: float | None = Field(None, description="median's 95 % bootstrap interval, high end")


class Window(BaseModel):
    start_s: float = Field(description="first send of the cell")
    end_s: float = Field(description="last end of the cell")
    duration_s: float = Field(description="the window throughput is computed over")


class PrefixCache(BenchModel):
    """Prefix-cache hit rate measured between two ``/metrics`` scrapes (prompt tokens)."""

    queries: float | None = Field(None, description="delta of vllm:prefix_cache_queries_total")
    hits: float | None = Field(None, description="delta of vllm:prefix_cache_hits_total")
    hit_rate: float | None = Field(None, description="hits / queries")
    source: str = Field("unavailable", description="/metrics | not exposed | unavailable")
    prefix_caching_enabled: str | None = Field(None, description="from vllm:cache_config_info")


class SpecDecode(BenchModel):
    """Speculative decoding measured between two ``/metrics`` scrapes (vLLM's spec-decode counters).

    acceptance_rate = accepted / draft tokens; mean_accepted_length = 1 + accepted / drafts (the
    tokens one verification step yields, the bonus token included), as vLLM's own log computes them.
    """

    drafts: float | None = Field(None, description="delta of vllm:spec_decode_num_drafts_total")
    draft_tokens: float | None = Field(None, description="delta of vllm:spec_decode_num_draft_tokens_total")
    accepted_tokens: float | None = Field(None, description="delta of vllm:spec_decode_num_accepted_tokens_total")
    acceptance_rate: float | None = Field(None, description="accepted_tokens / draft_tokens")
    mean_accepted_length: float | None = Field(None, description="1 + accepted_tokens / drafts")
    per_position_acceptance: list[float] = Field(
        default_factory=list,
        description="accepted at draft position i / drafts (vllm:spec_decode_num_accepted_tokens_per_pos_total)",
    )
    source: str = Field("unavailable", description="/metrics | unavailable")


class OpenLoopInfo(BenchModel):
    """How well an open-loop cell delivered its arrival process."""

    offered_rate_rps: float = Field(description="requests per second offered")
    arrival: str | None = Field(None, description="poisson | constant")
    achieved_send_rate_rps: float | None = Field(None, description="(sends - 1) / send span")
    send_lag_ms: LatencyStats = Field(default_factory=LatencyStats, description="sent minus scheduled")
    max_in_flight: int = Field(description="the client's cap")
    peak_in_flight: int = Field(0, description="most requests open at once")
    cap_reached: bool = Field(False, description="the cap was full: the offered load was not really offered")


class Roofline(BenchModel):
    """Where a per-stream decode speed sits against the memory-bandwidth ceiling."""

    gpu: str
    bandwidth_gb_s: float
    bytes_per_token: float = Field(description="bytes read per decoded token")
    ceiling_tok_s: float = Field(description="bandwidth / bytes_per_token")
    per_stream_tok_s: float | None = None
    efficiency: float | None = Field(None, description="per_stream_tok_s / ceiling_tok_s")
    effective_bandwidth_gb_s: float | None = None
    plausibility: str = Field("unknown", description="ok | warning: ... | error: ... | unknown")


class Derived(BenchModel):
    """Figures derived from a cell: roofline and $ per million output tokens."""

    roofline: Roofline | None = None
    usd_per_million_output_tokens: dict[str, float] | None = Field(
        None, description="price key -> $ per million output tokens at this cell's throughput"
    )
    cost_assumes: str | None = None


class Answer(BenchModel):
    index: int = Field(description="question index in gemma4_t4.bench.answers.QUESTIONS")
    question: str = ""
    expected: str | None = None
    text: str = ""
    correct: bool = False
    error: str | None = None


class ServerLoad(BenchModel):
    """What the /metrics sampler saw during a cell."""

    samples: int = 0
    max_running: float | None = None
    max_waiting: float | None = Field(None, description="> 0 means the server queued requests")
    max_kv_cache_usage: float | None = None


class GPUTelemetry(BenchModel):
    """NVML / nvidia-smi samples during a cell, summarised."""

    samples: int = 0
    source: str | None = Field(None, description="nvml | nvidia-smi")
    sm_clock_mhz_median: float | None = None
    sm_clock_mhz_min: float | None = None
    power_w_mean: float | None = None
    power_w_max: float | None = None
    memory_used_mib_max: float | None = None
    throttled_fraction: dict[str, float] = Field(
        default_factory=dict, description="reason -> share of samples"
    )


class BufferedDelivery(BenchModel):
    """A cell whose server generated each answer and then sent it in one burst (vLLM's CPU build
    does): its tokens arrived faster than any decoder makes them, so the gaps between them time the
    client's parsing, not generation. TPOT, ITL and per-stream tok/s are then not measured (see
    metrics.delivered_in_one_flush and docs/benchmarks.md); output tok/s and E2EL still are."""

    requests: int = Field(description="completed requests delivered in one flush")
    completed: int = Field(description="completed requests of the cell")
    tokens: int = Field(description="most tokens one flush delivered")
    span_ms: float = Field(description="longest first-to-last token span among the flushed requests")
    corrupt: int = Field(0, description="completed records whose chunk times go backwards (damaged or edited)")

    @property
    def reason(self) -> str:
        """What a TPOT / ITL / per-stream figure reads instead of a number."""
        if self.corrupt:  # the client's clock never goes back: such a record was damaged or edited
            return (
                f"not measured: {self.corrupt} of {self.completed} records are corrupt (their chunk times go "
                "backwards, which the client's clock cannot do): records.jsonl was damaged or edited"
            )
        return (
            f"not measured: the server delivered {self.tokens} tokens in one flush "
            f"({self.requests} of {self.completed} requests: every token within {self.span_ms:.2f} ms of the first)"
        )


class CellStats(BenchModel):
    """What the metrics compute from one cell's measured records (pure; see metrics.aggregate)."""

    completed: int = 0
    failed: int = 0
    errors: dict[str, int] = Field(default_factory=dict, description="error class -> count")
    error_examples: dict[str, str] | None = Field(None, description="error class -> first message seen")
    window: Window | None = None
    ttft_ms: LatencyStats = Field(default_factory=LatencyStats, description="first non-empty content - send")
    ttft_first_chunk_ms: LatencyStats = Field(default_factory=LatencyStats, description="first chunk - send")
    tpot_ms: LatencyStats = Field(default_factory=LatencyStats, description="(E2EL - TTFT) / (n - 1)")
    itl_ms: LatencyStats = Field(default_factory=LatencyStats, description="gaps between content chunks")
    e2el_ms: LatencyStats = Field(default_factory=LatencyStats, description="last chunk with choices - send")
    per_stream_tok_s: LatencyStats = Field(
        default_factory=LatencyStats, description="1000 / TPOT per request"
    )
    buffered: BufferedDelivery | None = Field(
        None, description="set when answers came in one flush: TPOT, ITL and per-stream tok/s are then empty"
    )
    output_throughput_tok_s: float | None = Field(None, description="completion tokens / window")
    input_throughput_tok_s: float | None = None
    request_throughput_req_s: float | None = Field(None, description="completed requests / window")
    total_output_tokens: int = 0
    total_input_tokens: int = 0
    content_chunks: int = 0
    tokens_per_chunk: float | None = None
    token_source: list[str] = Field(default_factory=list)
    cached_prompt_tokens: int | None = None

    def decode_median(self, stats: LatencyStats) -> float | str | None:
        """The median of a decode figure (TPOT, per-stream tok/s) of this cell, or, where the answers came
        in one flush, the reason it is not measured (what every table shows instead of a number)."""
        return self.buffered.reason if self.buffered else stats.median


class CellSummary(CellStats):
    """One measured cell of ``summary.json``."""

    cell: str = Field(description="unique cell name")
    workload: str
    variant: str | None = None
    api: str | None = None
    concurrency: int | None = Field(None, description="closed loop; None for an open-loop cell")
    input_len: int | None = None
    output_len: int | None = None
    num_prompts: int | None = None
    warmup_requests: int | None = None
    max_num_seqs: int | None = None
    queueing: bool | None = Field(None, description="concurrency > the server's max_num_seqs")
    partial: bool = Field(False, description="interrupted before every request finished")
    started_at: float | None = None
    open_loop: OpenLoopInfo | None = None
    prefix_cache: PrefixCache = Field(default_factory=PrefixCache)
    spec_decode: SpecDecode | None = Field(None, description="None: the server drafts nothing (no counters)")
    server_load: ServerLoad = Field(default_factory=ServerLoad, description="/metrics sampler summary")
    queueing_observed: bool | None = None
    gpu_telemetry: GPUTelemetry | None = Field(None, description="NVML / nvidia-smi summary")
    meta: dict[str, int | bool | str] = Field(
        default_factory=dict, description="workload-specific cell facts"
    )
    input_len_exact: bool | None = None
    answers: list[Answer] | None = None
    correct: int | None = None
    derived: Derived = Field(default_factory=Derived)


class SweepInfo(BenchModel):
    synchronous_rps: float = Field(description="measured one request at a time")
    throughput_rps: float = Field(description="measured all at once")
    rates: list[float] = Field(description="the open-loop rates measured in between")


class SeriesDecode(BenchModel):
    """The series' decode method: (long - short) output tokens over the wall-time difference."""

    short_tokens: int
    long_tokens: int
    wall_short_ms: float | None = Field(None, description="median E2EL of the short requests")
    wall_long_ms: float | None = Field(None, description="median E2EL of the long requests")
    decode_tok_s: float | None = Field(None, description="(long - short) / (wall_long - wall_short)")
    ci_low: float | None = Field(None, description="95 % bootstrap interval, low end")
    ci_high: float | None = None
    samples: list[float] = Field(
        default_factory=list, description="per-pair estimates (i-th short, i-th long)"
    )


class PromptInfo(BenchModel):
    seed: int = 0
    nonce: str | None = Field(None, description="reproduces the exact prompts with --nonce")
    tokenizer: str | None = None


class ServerInfo(BenchModel):
    models: list[str | None] = Field(default_factory=list)
    max_model_len: int | None = None
    root: str | None = None
    backend: str | None = Field(None, description="openai-http | sagemaker")


class RunInfo(BenchModel):
    """``run.json``: configuration, environment, prompts, status."""

    schema_id: str = Field(SCHEMA, alias="schema", description="results format version")
    status: str = Field(
        "running", description="running | complete | complete with failures | interrupted | aborted: ..."
    )
    run_id: str | None = None
    workload: str | None = None
    model: str | None = None
    base_url: str | None = None
    label: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    config: RawJSON = Field(default_factory=dict, description="the BenchArgs of the run, secrets removed")
    prompts: PromptInfo = Field(default_factory=PromptInfo)
    server: ServerInfo = Field(default_factory=ServerInfo)
    environment: RawJSON = Field(default_factory=dict, description="captured host/server facts (free-form)")
    definitions: str | None = None
    sweep: SweepInfo | None = None
    series_decode: SeriesDecode | None = None
    error: str | None = Field(None, description="why the run stopped early")

    def digest(self) -> dict[str, str | None]:
        """What summary.json repeats of run.json: what the run was and how it ended."""
        facts = {"run_id", "workload", "model", "base_url", "status", "started_at", "finished_at", "label"}
        return self.model_dump(mode="json", include=facts, exclude_none=True)


class SummaryFile(BenchModel):
    """``summary.json``: the run digest and every measured cell."""

    schema_id: str = Field(SCHEMA, alias="schema")
    run: dict[str, str | None] = Field(default_factory=dict, description="a digest of run.json")
    cells: list[CellSummary] = Field(default_factory=list)


def parse_file(model: type[BenchModel], where: Path) -> Any:
    """Parse and validate one results file, with a one-line error naming the file; a file of another
    results format, or of an older/newer version of this one, is refused."""
    text = where.read_text()
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise Gemma4T4Error(f"{where} is not valid JSON: {exc}", fix="re-run the benchmark") from None
    if not isinstance(data, dict):
        raise Gemma4T4Error(f"{where} is not a JSON object", fix="re-run the benchmark")
    found = data.get("schema")
    if isinstance(found, str) and found.startswith(SCHEMA_FAMILY) and found != SCHEMA:
        version = found.removeprefix(SCHEMA_FAMILY)
        newer = version.isdigit() and int(version) > SCHEMA_VERSION
        raise Gemma4T4Error(
            f"{where} is results format version {version}; this gemma4-t4 reads version {SCHEMA_VERSION}",
            fix="upgrade gemma4-t4 to read it"
            if newer
            else "re-run the benchmark with this version of gemma4-t4",
        )
    if found != SCHEMA:
        raise Gemma4T4Error(
            f"{where} has schema {found!r}, expected {SCHEMA!r}",
            fix="pass a directory written by gemma4-t4 bench run (or re-run the benchmark)",
        )
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        at = ".".join(str(p) for p in first["loc"])
        raise Gemma4T4Error(
            f"{where} does not hold valid benchmark results ({at}: {first['msg']})",
            fix="re-run the benchmark; the file was edited or written by another tool",
        ) from None


class RunReport(BenchModel):
    """What a finished run reports to a caller (the MCP tool's structured output)."""

    status: str = Field(description="complete | complete with failures | interrupted | aborted: ...")
    out_dir: str = Field(description="the results directory")
    failed: int = Field(description="failed requests over all cells")
    table: str = Field(description="the plain-text table of medians")
    cells: list[CellSummary] = Field(default_factory=list)
    run: RunInfo = Field(default_factory=RunInfo)
