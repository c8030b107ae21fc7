"""Pure statistics over per-request records: no I/O, no clocks.

Definitions (the same as ``vllm bench serve`` unless stated; see docs/benchmarks.md):

* **TTFT** = first chunk with non-empty content − send. On chat the first chunk is usually a
  role-only delta with no content; it is kept separately as ``ttft_first_chunk``.
* **E2EL** = last chunk carrying ``choices`` − send (a trailing usage-only chunk is excluded).
* **TPOT** = (E2EL − TTFT) / (n − 1) per request, n = completion tokens (> 1); the mean TPOT is
  the mean of the per-request values.
* **ITL** = gaps between consecutive content chunks. These are *chunk* gaps: a chunk may carry
  several tokens, so ``tokens_per_chunk`` is reported next to them.
* **per-stream tok/s** = 1000 / TPOT(ms) per request (decode speed one user sees).
* **output throughput** = Σ completion tokens / window, window = first send → last end of the
  cell (stated explicitly in the summary).

**Buffered streams.** A server that generates a whole answer and then sends it (vLLM's CPU build
at times does) delivers its tokens microseconds apart: TPOT then times the client's parsing, and its
inverse reads 100,000+ tok/s. A request whose n > 1 tokens arrived in one chunk, or whose first-to-
last token span is under :data:`FLUSH_FLOOR_MS_PER_TOKEN` per token, was delivered in one flush;
a cell with any such request has no TPOT, ITL or per-stream tok/s (``CellStats.buffered`` says
why). Output tok/s and E2EL, which time the whole generation, are still measured.
"""

from __future__ import annotations

import itertools
import math
import random
import statistics
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from gemma4_t4.bench.schemas import (
    BufferedDelivery,
    CellStats,
    LatencyStats,
    OpenLoopInfo,
    RequestRecord,
    SeriesDecode,
    Window,
)

# 0.1 ms per token = 10,000 tok/s for ONE stream: no LLM decoder streams that fast (the series' T4
# figures are 25-100 tok/s, i.e. 10-40 ms a token), yet it is ~13x the 7.5 us a token the client
# measured parsing vLLM CPU's flushed answers (32 tokens within 0.23-0.27 ms); see docs/benchmarks.md
FLUSH_FLOOR_MS_PER_TOKEN = 0.1


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method), q in [0, 100]."""
    if not values:
        raise ValueError("percentile of an empty sequence")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)  # one value: its own neighbour
    return float(ordered[low] + (ordered[high] - ordered[low]) * (rank - low))


def median(values: Sequence[float]) -> float:
    return percentile(values, 50.0)


# every bootstrap draws this many resamples from random.Random(0): the same data, the same interval
RESAMPLES = 1000


def _bootstrap(
    statistic: Callable[..., float | None], *samples: Sequence[float]
) -> tuple[float | None, float | None]:
    """95 % percentile-bootstrap interval of ``statistic`` over ``samples``, each resampled in turn
    (resamples where it is None are left out; no interval where none is left, or where a sample
    has fewer than two values to resample)."""
    if any(len(data) < 2 for data in samples):
        return (None, None)
    rng = random.Random(0)
    estimates = []
    for _ in range(RESAMPLES):
        value = statistic(*([data[rng.randrange(len(data))] for _ in data] for data in samples))
        if value is not None:
            estimates.append(value)
    if not estimates:
        return (None, None)
    estimates.sort()
    return (percentile(estimates, 2.5), percentile(estimates, 97.5))


def summarize(values: Iterable[float | None], ci: bool = True) -> LatencyStats:
    data = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not data:
        return LatencyStats()
    mean = sum(data) / len(data)
    std = statistics.stdev(data) if len(data) > 1 else 0.0
    low, high = _bootstrap(median, data) if ci else (None, None)
    return LatencyStats(
        n=len(data), mean=mean, median=median(data), p90=percentile(data, 90), p99=percentile(data, 99),
        std=std, min=min(data), max=max(data), ci_low=low, ci_high=high,
    )


@dataclass
class RequestMetrics:
    """Latencies of one request in milliseconds (None where undefined); its counts stay on the record."""

    ok: bool
    ttft_ms: float | None
    ttft_first_chunk_ms: float | None
    e2el_ms: float | None
    tpot_ms: float | None
    per_stream_tok_s: float | None
    itl_ms: list[float]  # none for a flushed request (no TPOT or per-stream speed either) or a damaged one


def out_of_order(r: RequestRecord) -> bool:
    """Chunk times that go backwards: ``perf_counter`` never does, so the record was damaged or edited."""
    times = r.chunk_times_s
    return any(b < a for a, b in zip(times, times[1:], strict=False))


def delivered_in_one_flush(r: RequestRecord) -> bool:
    """True when a completed, streamed request's n > 1 tokens arrived in one chunk or faster than
    :data:`FLUSH_FLOOR_MS_PER_TOKEN` each: the server sent a finished answer, the stream timed
    nothing of its decoding. A non-streamed request (``streamed=False``) has no TPOT anyway."""
    n = r.completion_tokens
    if r.error is not None or r.streamed is False or n is None or n < 2 or not r.chunk_times_s or out_of_order(r):
        return False  # (a negative span is a corrupt record, not a fast flush)
    span_ms = (r.chunk_times_s[-1] - r.chunk_times_s[0]) * 1000.0
    return len(r.chunk_times_s) < 2 or span_ms < FLUSH_FLOOR_MS_PER_TOKEN * (n - 1)


def request_metrics(r: RequestRecord) -> RequestMetrics:
    """Derive one request's metrics from its raw record (see ``schemas.RequestRecord``)."""
    ok = r.error is None
    n = r.completion_tokens

    def since_send(at: float | None) -> float | None:  # ms; a failed request has no latencies
        return (at - r.send_s) * 1000.0 if ok and at is not None else None

    ttft, e2el = since_send(r.first_content_s), since_send(r.last_choice_s)
    flushed = delivered_in_one_flush(r)
    corrupt = ok and out_of_order(r)
    tpot = None
    if not flushed and not corrupt and ttft is not None and e2el is not None and n is not None and n > 1:
        tpot = (e2el - ttft) / (n - 1)
    chunk_times = r.chunk_times_s
    gaps = [(b - a) * 1000.0 for a, b in zip(chunk_times, chunk_times[1:], strict=False)]
    return RequestMetrics(
        ok=ok, ttft_ms=ttft, ttft_first_chunk_ms=since_send(r.first_chunk_s), e2el_ms=e2el, tpot_ms=tpot,
        per_stream_tok_s=(1000.0 / tpot) if tpot and tpot > 0 else None,
        itl_ms=gaps if ok and not (flushed or corrupt) else [],
    )


def buffered_delivery(records: Sequence[RequestRecord]) -> BufferedDelivery | None:
    """Why a cell's decode figures are not measured (its completed requests that came in one
    flush, or whose records are corrupt), or None when every completed request streamed its
    tokens as they were made."""
    done = [r for r in records if r.error is None]
    flushed = [r for r in done if delivered_in_one_flush(r)]
    corrupt = sum(1 for r in done if out_of_order(r))
    if not flushed and not corrupt:
        return None
    # a flushed request has output chunks: its span is first to last of them
    spans = ((r.chunk_times_s[-1] - r.chunk_times_s[0]) * 1000.0 for r in flushed)
    return BufferedDelivery(
        requests=len(flushed), completed=len(done), tokens=max((r.completion_tokens or 0 for r in flushed), default=0),
        span_ms=max(spans, default=0.0), corrupt=corrupt,
    )


def aggregate(records: Sequence[RequestRecord]) -> CellStats:
    """Summary of one measured cell: latency distributions, throughput over an explicit window."""
    ok = [(r, m) for r in records if (m := request_metrics(r)).ok]
    errors = Counter(r.error for r in records if r.error)
    # each error class's first message
    examples = {e: next(r.error_detail or "" for r in records if r.error == e) for e in errors}
    window = None
    if records:
        start = min(r.send_s for r in records)
        end = max((r.end_s or r.send_s) for r in records)
        window = Window(start_s=start, end_s=end, duration_s=end - start)
    out_tokens = sum(r.completion_tokens or 0 for r, _ in ok)
    in_tokens = sum(r.prompt_tokens or 0 for r, _ in ok)
    duration = window.duration_s if window else 0.0
    chunks = sum(len(r.chunk_times_s) for r, _ in ok)
    cached = [r.cached_tokens for r, _ in ok if r.cached_tokens is not None]
    # one flushed request makes the cell's decode figures unmeasured: the rest came in bursts too
    buffered = buffered_delivery(records)
    decoded = [] if buffered else ok
    return CellStats(
        completed=len(ok), failed=len(records) - len(ok), errors=errors, error_examples=examples or None,
        window=window,
        ttft_ms=summarize(m.ttft_ms for _, m in ok),
        ttft_first_chunk_ms=summarize(m.ttft_first_chunk_ms for _, m in ok),
        tpot_ms=summarize(m.tpot_ms for _, m in decoded),
        itl_ms=summarize([g for _, m in decoded for g in m.itl_ms], ci=False),
        e2el_ms=summarize(m.e2el_ms for _, m in ok),
        per_stream_tok_s=summarize(m.per_stream_tok_s for _, m in decoded),
        buffered=buffered,
        output_throughput_tok_s=out_tokens / duration if duration > 0 else None,
        input_throughput_tok_s=in_tokens / duration if duration > 0 else None,
        request_throughput_req_s=len(ok) / duration if duration > 0 else None,
        total_output_tokens=out_tokens, total_input_tokens=in_tokens, content_chunks=chunks,
        tokens_per_chunk=(out_tokens / chunks) if chunks else None,
        token_source=sorted({r.token_source for r, _ in ok if r.token_source}),
        cached_prompt_tokens=sum(cached) if cached else None,
    )


def peak_in_flight(records: Sequence[RequestRecord]) -> int:
    """Most requests open at the same moment (a request is open from send to end of stream)."""
    events = sorted([(r.send_s, 1) for r in records] + [(r.end_s or r.send_s, -1) for r in records])
    # requests open after each event (at equal times an end (-1) sorts before a send (+1)); the last is 0
    return max(itertools.accumulate(step for _, step in events), default=0)


def open_loop_stats(
    records: Sequence[RequestRecord], rate: float, arrival: str | None, max_in_flight: int
) -> OpenLoopInfo:
    """How well an open-loop cell delivered its arrival process, and how much the server piled up.

    ``send_lag_ms``: sent minus scheduled; it grows when the client's in-flight cap is full, and
    then the offered load was not really offered (``cap_reached``).
    """
    sends = sorted(r.send_s for r in records)
    span = sends[-1] - sends[0] if sends else 0.0
    peak = peak_in_flight(records)
    return OpenLoopInfo(
        offered_rate_rps=rate, arrival=arrival,
        achieved_send_rate_rps=(len(sends) - 1) / span if span > 0 else None,
        send_lag_ms=summarize(
            ((r.send_s - r.scheduled_s) * 1000 for r in records if r.scheduled_s is not None), ci=False
        ),
        max_in_flight=max_in_flight, peak_in_flight=peak, cap_reached=peak >= max_in_flight,
    )


def series_decode(
    short: Sequence[RequestRecord], long: Sequence[RequestRecord], short_tokens: int, long_tokens: int
) -> SeriesDecode:
    """The series' decode speed: (long - short) tokens / (wall_long - wall_short), with wall the
    median end-to-end latency; prefill cancels out. The interval resamples both sides."""
    # end-to-end latencies of the requests that completed (a failed one has none)
    ws, wl = (
        [m.e2el_ms for m in map(request_metrics, side) if m.e2el_ms is not None] for side in (short, long)
    )
    out = SeriesDecode(short_tokens=short_tokens, long_tokens=long_tokens)
    if not ws or not wl:
        return out

    def speed(a: Sequence[float], b: Sequence[float]) -> float | None:
        gap = median(b) - median(a)
        return (long_tokens - short_tokens) / (gap / 1000.0) if gap > 0 else None

    out.wall_short_ms, out.wall_long_ms, out.decode_tok_s = median(ws), median(wl), speed(ws, wl)
    out.samples = [s for s in (speed([a], [b]) for a, b in zip(ws, wl, strict=False)) if s is not None]
    out.ci_low, out.ci_high = _bootstrap(speed, ws, wl)
    return out


def ratio_ci(a: Sequence[float], b: Sequence[float]) -> tuple[float | None, float | None, float | None]:
    """median(b) / median(a) with a 95 % bootstrap interval (both sides resampled)."""
    a = [v for v in a if v is not None]
    b = [v for v in b if v is not None]
    if not a or not b:
        return (None, None, None)

    def ratio(sa: Sequence[float], sb: Sequence[float]) -> float | None:
        base = median(sa)
        return median(sb) / base if base else None

    return (ratio(a, b), *_bootstrap(ratio, a, b))
