"""Exact values of the benchmark's statistics at their edges: boundaries of the flush rule, empty
and zero-length cells, requests that failed, the seeded bootstrap intervals, the open-loop and
series-decode summaries. Every expected figure is worked out by hand or with numpy, so a changed
constant, comparison or default in gemma4_t4/bench/metrics.py changes a result here."""

import math
import random

import numpy as np
import pytest

from gemma4_t4.bench import metrics
from gemma4_t4.bench.schemas import BufferedDelivery, LatencyStats, RequestRecord, Window


def rec(
    send,
    *,
    first=None,
    first_chunk=None,
    last=None,
    chunks=(),
    n=None,
    prompt=None,
    cached=None,
    error=None,
    detail=None,
    end=None,
    scheduled=None,
    source=None,
    streamed=None,
):
    return RequestRecord(
        request_id=f"r{send}",
        send_s=send,
        first_chunk_s=first_chunk if first_chunk is not None else first,
        first_content_s=first,
        last_choice_s=last,
        end_s=end,
        chunk_times_s=list(chunks),
        completion_tokens=n,
        prompt_tokens=prompt,
        cached_tokens=cached,
        error=error,
        error_detail=detail,
        scheduled_s=scheduled,
        token_source=source,
        streamed=streamed,
    )


def reference_bootstrap(values, statistic, resamples, seed):
    """The documented procedure, written out: ``resamples`` draws with ``random.Random(seed)``,
    then numpy's linear percentiles of the sorted estimates."""
    rng = random.Random(seed)
    n = len(values)
    estimates = [statistic([values[rng.randrange(n)] for _ in range(n)]) for _ in range(resamples)]
    return tuple(float(np.percentile(estimates, t)) for t in (2.5, 97.5))


DATA = [float(x) for x in np.random.default_rng(7).exponential(10, 25)]


# --- percentile / median -------------------------------------------------------------------------


def test_percentile_of_nothing_names_the_problem_exactly():
    with pytest.raises(ValueError) as raised:
        metrics.percentile([], 50)
    assert str(raised.value) == "percentile of an empty sequence"


@pytest.mark.parametrize("q", [0, 100])
def test_percentile_ends_are_the_extremes(q):
    data = [5.0, 1.0, 3.0]
    assert metrics.percentile(data, q) == (1.0 if q == 0 else 5.0)
    assert metrics.percentile([4.0], q) == 4.0


# --- the median's bootstrap interval (summarize's ci_low, ci_high) --------------------------------


def interval(values):
    stats = metrics.summarize(values)
    return (stats.ci_low, stats.ci_high)


def test_bootstrap_is_1000_resamples_of_the_median_seed_0_and_the_central_95_percent():
    expected = reference_bootstrap(DATA, metrics.median, 1000, 0)
    assert interval(DATA) == pytest.approx(expected, rel=1e-12)
    # the same call twice gives the same interval (seeded, not drawn from the clock)
    assert interval(DATA) == interval(DATA)


def test_bootstrap_needs_two_values_and_two_are_enough():
    assert interval([]) == (None, None)
    assert interval([3.0]) == (None, None)
    low, high = interval([1.0, 3.0])
    # resamples of two values have medians 1, 2 or 3: the 95 % interval spans them
    assert (low, high) == pytest.approx(reference_bootstrap([1.0, 3.0], metrics.median, 1000, 0), rel=1e-12)
    assert low == 1.0 and high == 3.0


# --- summarize ------------------------------------------------------------------------------------


def test_summarize_drops_missing_and_non_finite_values():
    stats = metrics.summarize([1.0, None, math.nan, math.inf, -math.inf, 3.0], ci=False)
    assert stats.n == 2
    assert stats.mean == 2.0


def test_summarize_gives_every_figure_exactly():
    data = [8.0, 1.0, 4.0, 2.0]
    stats = metrics.summarize(data, ci=False)
    assert stats.n == 4
    assert stats.mean == 3.75
    assert stats.median == 3.0
    assert stats.p90 == pytest.approx(6.8)  # rank 2.7: 4 + 0.7 * 4
    assert stats.p99 == pytest.approx(7.88)  # rank 2.97: 4 + 0.97 * 4
    assert stats.std == pytest.approx(float(np.std(data, ddof=1)))
    assert stats.min == 1.0
    assert stats.max == 8.0
    assert stats.ci_low is None and stats.ci_high is None


def test_summarize_std_of_two_values_and_of_one():
    assert metrics.summarize([1.0, 3.0], ci=False).std == pytest.approx(math.sqrt(2.0))
    one = metrics.summarize([5.0])
    assert one.std == 0.0
    assert (one.ci_low, one.ci_high) == (None, None)


def test_summarize_interval_is_the_median_bootstrap_with_defaults():
    stats = metrics.summarize(DATA)
    assert (stats.ci_low, stats.ci_high) == pytest.approx(reference_bootstrap(DATA, metrics.median, 1000, 0))


def test_summarize_of_nothing_is_empty():
    assert metrics.summarize([None, math.nan]) == LatencyStats()


# --- the flush rule -------------------------------------------------------------------------------


def test_flush_rule_boundaries_on_the_token_count():
    one_chunk = [10.0]
    assert metrics.delivered_in_one_flush(rec(9.0, n=2, chunks=one_chunk)) is True  # two tokens, one chunk
    assert metrics.delivered_in_one_flush(rec(9.0, n=1, chunks=one_chunk)) is False  # one token: nothing to time
    assert metrics.delivered_in_one_flush(rec(9.0, n=None, chunks=one_chunk)) is False
    assert metrics.delivered_in_one_flush(rec(9.0, n=5, chunks=[])) is False  # no chunk times
    assert metrics.delivered_in_one_flush(rec(9.0, n=5, chunks=one_chunk, error="http_500")) is False
    assert metrics.delivered_in_one_flush(rec(9.0, n=5, chunks=one_chunk, streamed=False)) is False


def test_flush_rule_boundaries_on_the_span():
    # 11 tokens: the floor is 0.1 ms x 10 gaps = 1.0 ms; a span under it is a flush, at it is not
    assert metrics.delivered_in_one_flush(rec(0.0, n=11, chunks=[0.0, 0.001])) is False  # exactly 1.0 ms
    assert metrics.delivered_in_one_flush(rec(0.0, n=11, chunks=[0.0, 0.0009995])) is True  # 0.9995 ms
    assert metrics.delivered_in_one_flush(rec(0.0, n=11, chunks=[0.0, 0.00095])) is True  # 0.95 ms
    assert metrics.delivered_in_one_flush(rec(0.0, n=11, chunks=[0.0, 0.00105])) is False


# --- request_metrics ------------------------------------------------------------------------------


def test_request_metrics_with_a_non_zero_send_time():
    r = rec(5.0, first_chunk=5.05, first=5.1, last=5.16, chunks=[5.1, 5.13, 5.16], n=9, prompt=100, cached=40, end=5.17)
    m = metrics.request_metrics(r)
    assert m.ok is True
    assert m.ttft_ms == pytest.approx(100.0)
    assert m.ttft_first_chunk_ms == pytest.approx(50.0)
    assert m.e2el_ms == pytest.approx(160.0)
    assert m.tpot_ms == pytest.approx(7.5)  # (160 - 100) / 8
    assert m.per_stream_tok_s == pytest.approx(1000.0 / 7.5)
    assert m.itl_ms == pytest.approx([30.0, 30.0])
    assert metrics.delivered_in_one_flush(r) is False


def test_request_metrics_two_tokens_have_a_tpot_and_sub_millisecond_tpot_a_speed():
    two = metrics.request_metrics(rec(1.0, first=1.1, last=1.13, chunks=[1.1, 1.13], n=2))
    assert two.tpot_ms == pytest.approx(30.0)
    # 0.5 ms a token (streamed: the 10 gaps span 5 ms, above the flush floor) is 2,000 tok/s
    streamed = rec(1.0, first=1.1, last=1.105, chunks=[1.1, 1.105], n=11)
    fast = metrics.request_metrics(streamed)
    assert metrics.delivered_in_one_flush(streamed) is False
    assert fast.tpot_ms == pytest.approx(0.5)
    assert fast.per_stream_tok_s == pytest.approx(2000.0)


def test_request_metrics_without_a_last_choice_or_chunks():
    m = metrics.request_metrics(rec(2.0, first=2.1, last=None, chunks=[], n=4))
    assert m.e2el_ms is None
    assert m.tpot_ms is None
    assert m.itl_ms == []


def test_a_failed_request_has_no_latencies_even_with_times_recorded():
    r = rec(3.0, first_chunk=3.05, first=3.1, last=3.2, chunks=[3.1, 3.15, 3.2], n=3, error="http_500", end=3.3)
    m = metrics.request_metrics(r)
    assert m.ok is False
    assert (m.ttft_ms, m.ttft_first_chunk_ms, m.e2el_ms, m.tpot_ms, m.per_stream_tok_s) == (None,) * 5
    assert m.itl_ms == []


def test_a_flushed_request_has_no_itl_and_no_tpot():
    r = rec(4.0, first=4.1, last=4.10005, chunks=[4.1, 4.10005], n=11)
    m = metrics.request_metrics(r)
    assert metrics.delivered_in_one_flush(r) is True
    assert m.itl_ms == []
    assert m.tpot_ms is None and m.per_stream_tok_s is None
    assert metrics.buffered_delivery([r]).span_ms == pytest.approx(0.05)
    assert m.ttft_ms == pytest.approx(100.0)


# --- buffered_delivery ----------------------------------------------------------------------------


def test_buffered_delivery_reports_the_largest_flush_and_span():
    streamed = rec(0.0, first=0.1, last=0.2, chunks=[0.1, 0.15, 0.2], n=3)
    wide = rec(1.0, first=1.1, last=1.10005, chunks=[1.1, 1.10005], n=11)
    big = rec(2.0, first=2.1, last=2.1, chunks=[2.1], n=32)
    failed = rec(3.0, chunks=[3.1], n=32, error="timeout")
    got = metrics.buffered_delivery([streamed, wide, big, failed])
    assert got.requests == 2
    assert got.completed == 3
    assert got.tokens == 32
    assert got.span_ms == pytest.approx(0.05)
    assert metrics.buffered_delivery([streamed]) is None


def test_buffered_delivery_of_single_chunk_flushes_spans_zero():
    got = metrics.buffered_delivery([rec(0.0, first=0.1, last=0.1, chunks=[0.1], n=8)])
    assert got == BufferedDelivery(requests=1, completed=1, tokens=8, span_ms=0.0)


# --- aggregate ------------------------------------------------------------------------------------


def _cell():
    return [
        rec(10.0, first_chunk=10.05, first=10.1, last=10.16, chunks=[10.1, 10.13, 10.16], n=9, prompt=100,
            cached=40, end=10.17, source="usage"),
        rec(10.2, first_chunk=10.27, first=10.32, last=10.34, chunks=[10.3, 10.34], n=None, prompt=None,
            end=10.35, source="chunks"),
        rec(10.4, error="http_500", end=10.6),
        rec(10.45, error="http_500", detail="boom", end=10.5),
        rec(10.5, error="timeout", detail="read timed out", end=None),
    ]


def test_aggregate_gives_every_figure_of_a_cell_exactly():
    s = metrics.aggregate(_cell())
    assert s.completed == 2 and s.failed == 3
    assert s.errors == {"http_500": 2, "timeout": 1}
    # the first example of an error is kept, an empty detail included
    assert s.error_examples == {"http_500": "", "timeout": "read timed out"}
    assert s.window.start_s == 10.0 and s.window.end_s == 10.6
    assert s.window.duration_s == pytest.approx(0.6)
    assert s.ttft_ms.n == 2 and s.ttft_ms.min == pytest.approx(100.0) and s.ttft_ms.max == pytest.approx(120.0)
    assert s.ttft_first_chunk_ms.n == 2
    assert (s.ttft_first_chunk_ms.min, s.ttft_first_chunk_ms.max) == pytest.approx((50.0, 70.0))
    assert s.tpot_ms.n == 1 and s.tpot_ms.mean == pytest.approx(7.5)
    assert s.itl_ms.n == 3 and s.itl_ms.mean == pytest.approx(100.0 / 3)
    assert s.itl_ms.ci_low is None and s.itl_ms.ci_high is None  # gaps are not bootstrapped
    assert (s.e2el_ms.min, s.e2el_ms.max) == pytest.approx((140.0, 160.0))
    assert s.per_stream_tok_s.n == 1 and s.per_stream_tok_s.mean == pytest.approx(1000.0 / 7.5)
    assert s.buffered is None
    # a request without usage counts no tokens (not one)
    assert s.total_output_tokens == 9
    assert s.total_input_tokens == 100
    assert s.output_throughput_tok_s == pytest.approx(9 / 0.6)
    assert s.input_throughput_tok_s == pytest.approx(100 / 0.6)
    assert s.request_throughput_req_s == pytest.approx(2 / 0.6)
    assert s.content_chunks == 5
    assert s.tokens_per_chunk == pytest.approx(9 / 5)
    assert s.token_source == ["chunks", "usage"]
    assert s.cached_prompt_tokens == 40


def test_aggregate_of_no_requests():
    s = metrics.aggregate([])
    assert s.completed == 0 and s.failed == 0
    assert s.window is None
    assert s.output_throughput_tok_s is None
    assert s.input_throughput_tok_s is None
    assert s.request_throughput_req_s is None
    assert s.cached_prompt_tokens is None
    assert s.tokens_per_chunk is None
    assert s.error_examples is None


def test_aggregate_of_a_zero_length_window_has_no_rates():
    s = metrics.aggregate([rec(7.0, first=7.1, last=7.2, chunks=[7.1, 7.2], n=2, prompt=10)])
    assert s.window == Window(start_s=7.0, end_s=7.0, duration_s=0.0)  # no end: the window ends at the send
    assert s.output_throughput_tok_s is None
    assert s.input_throughput_tok_s is None
    assert s.request_throughput_req_s is None
    assert s.cached_prompt_tokens is None  # no request reported cached tokens
    assert s.total_output_tokens == 2 and s.total_input_tokens == 10


def test_one_flushed_request_unmeasures_the_whole_cells_decode():
    streamed = rec(20.0, first=20.1, last=20.16, chunks=[20.1, 20.13, 20.16], n=9, end=20.2)
    flushed = rec(20.0, first=20.1, last=20.10005, chunks=[20.1, 20.10005], n=11, end=20.2)
    s = metrics.aggregate([streamed, flushed])
    assert s.tpot_ms.n == 0 and s.itl_ms.n == 0 and s.per_stream_tok_s.n == 0
    assert (s.buffered.requests, s.buffered.completed, s.buffered.tokens) == (1, 2, 11)
    assert s.buffered.span_ms == pytest.approx(0.05)
    assert s.e2el_ms.n == 2
    assert s.output_throughput_tok_s == pytest.approx(20 / 0.2)


# --- peak_in_flight / open_loop_stats -------------------------------------------------------------


def test_peak_in_flight_counts_overlaps_and_a_handover_is_not_one():
    assert metrics.peak_in_flight([]) == 0
    back_to_back = [rec(0.0, end=1.0), rec(1.0, end=2.0), rec(2.0, end=3.0)]
    assert metrics.peak_in_flight(back_to_back) == 1
    overlapping = [rec(0.0, end=5.0), rec(1.0, end=3.0), rec(2.0, end=4.0), rec(3.5, end=6.0)]
    assert metrics.peak_in_flight(overlapping) == 3
    # a request without an end is open for no time
    assert metrics.peak_in_flight([rec(0.0, end=None), rec(0.0, end=None)]) == 0
    assert metrics.peak_in_flight([rec(0.0, end=2.0), rec(1.0, end=None)]) == 1


def test_open_loop_stats_exactly():
    recs = [
        rec(12.0, scheduled=11.9, end=12.5),
        rec(10.0, scheduled=10.0, end=11.5),
        rec(11.0, scheduled=10.5, end=12.2),
        rec(10.5, end=10.9),
    ]
    info = metrics.open_loop_stats(recs, rate=2.0, arrival="poisson", max_in_flight=3)
    assert info.offered_rate_rps == 2.0
    assert info.arrival == "poisson"
    assert info.achieved_send_rate_rps == pytest.approx(3 / 2.0)  # 4 sends over 10.0 .. 12.0
    assert info.send_lag_ms.n == 3
    assert info.send_lag_ms.mean == pytest.approx((100.0 + 0.0 + 500.0) / 3)
    assert info.send_lag_ms.max == pytest.approx(500.0) and info.send_lag_ms.min == pytest.approx(0.0)
    assert info.send_lag_ms.ci_low is None
    assert info.max_in_flight == 3
    assert info.peak_in_flight == 2  # 10.0-11.5 with 10.5-10.9, then with 11.0-12.2; 12.0 starts after 11.5
    assert info.cap_reached is False
    at_cap = metrics.open_loop_stats(recs, rate=2.0, arrival=None, max_in_flight=2)
    assert at_cap.cap_reached is True and at_cap.arrival is None
    assert metrics.open_loop_stats(recs, rate=2.0, arrival=None, max_in_flight=1).cap_reached is True


def test_open_loop_stats_of_one_send_has_no_rate():
    info = metrics.open_loop_stats([rec(1.0, end=2.0)], rate=0.5, arrival="constant", max_in_flight=4)
    assert info.achieved_send_rate_rps is None
    assert info.send_lag_ms == LatencyStats()
    assert info.peak_in_flight == 1 and info.cap_reached is False
    same_time = metrics.open_loop_stats([rec(1.0, end=2.0), rec(1.0, end=2.0)], rate=1.0, arrival=None, max_in_flight=4)
    assert same_time.achieved_send_rate_rps is None


# --- series_decode --------------------------------------------------------------------------------


def _walls(walls_ms, send=100.0):
    return [rec(send, first=send + 0.01, last=send + w / 1000.0, chunks=[send + 0.01], n=1) for w in walls_ms]


def test_series_decode_exactly():
    short = _walls([100.0, 120.0, 110.0])
    long = _walls([1100.0, 1300.0, 1200.0, 1250.0])
    out = metrics.series_decode(short, long, short_tokens=32, long_tokens=256)
    assert out.short_tokens == 32 and out.long_tokens == 256
    assert out.wall_short_ms == pytest.approx(110.0)
    assert out.wall_long_ms == pytest.approx(1225.0)
    assert out.decode_tok_s == pytest.approx(224 / 1.115)
    # i-th short with i-th long; the fourth long has no partner
    assert out.samples == pytest.approx([224 / 1.0, 224 / 1.18, 224 / 1.09])
    ws, wl = [100.0, 120.0, 110.0], [1100.0, 1300.0, 1200.0, 1250.0]
    rng = random.Random(0)
    estimates = []
    for _ in range(1000):
        a = [ws[rng.randrange(3)] for _ in ws]
        b = [wl[rng.randrange(4)] for _ in wl]
        estimates.append(224 / ((float(np.median(b)) - float(np.median(a))) / 1000.0))
    assert (out.ci_low, out.ci_high) == pytest.approx(tuple(np.percentile(estimates, [2.5, 97.5])), rel=1e-9)


def test_series_decode_has_no_sample_from_a_pair_whose_long_request_came_out_faster():
    short, long = _walls([100.0, 500.0, 110.0]), _walls([1100.0, 400.0, 1200.0])
    out = metrics.series_decode(short, long, short_tokens=32, long_tokens=256)
    assert out.samples == pytest.approx([224 / 1.0, 224 / 1.09])  # the second pair has no speed


def test_series_decode_is_seeded():
    short, long = _walls([100.0, 130.0, 90.0]), _walls([900.0, 1000.0, 1400.0])
    first = metrics.series_decode(short, long, 16, 128)
    assert first.ci_low is not None
    assert metrics.series_decode(short, long, 16, 128) == first  # seeded: the same twice


def test_series_decode_skips_failed_and_unfinished_requests():
    short = [*_walls([100.0]), rec(100.0, first=100.01, last=100.5, chunks=[100.01], n=1, error="timeout"),
             rec(100.0, first=100.01, last=None, n=1)]
    long = _walls([600.0])
    out = metrics.series_decode(short, long, 10, 60)
    assert out.wall_short_ms == pytest.approx(100.0)
    assert out.decode_tok_s == pytest.approx(50 / 0.5)
    assert out.samples == pytest.approx([100.0])
    # one request a side: no interval
    assert out.ci_low is None and out.ci_high is None


def test_series_decode_without_a_side_or_without_a_gap():
    empty = metrics.series_decode([], _walls([600.0]), 10, 60)
    assert (empty.wall_short_ms, empty.wall_long_ms, empty.decode_tok_s, empty.samples) == (None, None, None, [])
    assert metrics.series_decode(_walls([600.0]), [], 10, 60).wall_short_ms is None
    # the long requests were no slower: no decode speed, no sample, no interval (never a division by 0)
    flat = metrics.series_decode(_walls([500.0, 500.0]), _walls([500.0, 500.0]), 10, 60)
    assert flat.wall_short_ms == pytest.approx(500.0) and flat.decode_tok_s is None
    assert flat.samples == [] and flat.ci_low is None and flat.ci_high is None
    faster = metrics.series_decode(_walls([600.0, 700.0]), _walls([500.0, 400.0]), 10, 60)
    assert faster.decode_tok_s is None and faster.samples == [] and faster.ci_low is None


# --- ratio_ci -------------------------------------------------------------------------------------


def reference_ratio(a, b, statistic, resamples, seed):
    rng = random.Random(seed)
    estimates = []
    for _ in range(resamples):
        sa = statistic([a[rng.randrange(len(a))] for _ in a])
        sb = statistic([b[rng.randrange(len(b))] for _ in b])
        if sa:
            estimates.append(sb / sa)
    return tuple(float(x) for x in np.percentile(estimates, [2.5, 97.5]))


def test_ratio_ci_defaults_and_tails_exactly():
    a, b = DATA[:12], [2.0 * v + 1.0 for v in DATA[12:]]
    point, low, high = metrics.ratio_ci(a, b)
    assert point == pytest.approx(metrics.median(b) / metrics.median(a))
    assert (low, high) == pytest.approx(reference_ratio(a, b, metrics.median, 1000, 0), rel=1e-12)
    assert metrics.ratio_ci(a, b) == (point, low, high)  # seeded: the same twice


def test_ratio_ci_edges():
    assert metrics.ratio_ci([], [1.0, 2.0]) == (None, None, None)
    assert metrics.ratio_ci([1.0, 2.0], [None]) == (None, None, None)
    assert metrics.ratio_ci([0.0], [1.0]) == (None, None, None)  # a zero base has no ratio
    assert metrics.ratio_ci([2.0], [1.0, 3.0, 5.0]) == (1.5, None, None)  # one side of one: no interval
    assert metrics.ratio_ci([2.0, 4.0, 6.0], [8.0]) == (2.0, None, None)
    point, low, high = metrics.ratio_ci([1.0, 3.0], [2.0, 6.0])  # two a side are enough
    assert point == 2.0
    assert (low, high) == pytest.approx(reference_ratio([1.0, 3.0], [2.0, 6.0], metrics.median, 1000, 0))
    assert low is not None and low < 2.0 < high


def test_peak_in_flight_lets_an_ended_request_go_before_a_later_overlap():
    # one request ends, then two overlap: the peak is 2 (an end counts -1, not more)
    recs = [rec(0.0, end=1.0), rec(2.0, end=5.0), rec(3.0, end=6.0)]
    assert metrics.peak_in_flight(recs) == 2


def test_open_loop_stats_of_no_requests_and_of_a_sub_second_span():
    empty = metrics.open_loop_stats([], rate=1.0, arrival=None, max_in_flight=2)
    assert empty.achieved_send_rate_rps is None and empty.peak_in_flight == 0 and empty.cap_reached is False
    two = metrics.open_loop_stats([rec(4.0, end=4.1), rec(4.5, end=4.6)], rate=2.0, arrival=None, max_in_flight=2)
    assert two.achieved_send_rate_rps == pytest.approx(2.0)  # one interval of 0.5 s


SPREAD_SHORT = [100.0, 131.0, 92.0, 118.0, 104.0, 125.0, 97.0, 111.0]
SPREAD_LONG = [903.0, 1012.0, 1388.0, 955.0, 1190.0, 1077.0, 1240.0, 998.0, 1125.0]


def test_series_decode_defaults_and_tails_on_a_spread_of_walls():
    short, long = _walls(SPREAD_SHORT), _walls(SPREAD_LONG)
    out = metrics.series_decode(short, long, 16, 128)
    rng = random.Random(0)
    estimates = []
    for _ in range(1000):
        a = [SPREAD_SHORT[rng.randrange(len(SPREAD_SHORT))] for _ in SPREAD_SHORT]
        b = [SPREAD_LONG[rng.randrange(len(SPREAD_LONG))] for _ in SPREAD_LONG]
        gap = float(np.median(b)) - float(np.median(a))
        if gap > 0:
            estimates.append(112 / (gap / 1000.0))
    assert (out.ci_low, out.ci_high) == pytest.approx(tuple(np.percentile(estimates, [2.5, 97.5])), rel=1e-9)


def test_series_decode_needs_two_walls_a_side_for_an_interval():
    one, two = _walls([100.0]), _walls([100.0, 140.0])
    long_one, long_two = _walls([1100.0]), _walls([1100.0, 1300.0])
    assert metrics.series_decode(one, long_two, 10, 60).ci_low is None
    assert metrics.series_decode(two, long_one, 10, 60).ci_low is None
    both = metrics.series_decode(two, long_two, 10, 60)
    assert both.ci_low is not None and both.ci_high is not None and both.ci_low <= both.decode_tok_s <= both.ci_high


def test_series_decode_a_sub_millisecond_gap_is_a_speed_and_unfinished_long_requests_are_skipped():
    short = _walls([100.0])
    long = [*_walls([100.5]), rec(100.0, first=100.01, last=None, n=1)]
    out = metrics.series_decode(short, long, 10, 11)
    assert out.wall_long_ms == pytest.approx(100.5)
    assert out.decode_tok_s == pytest.approx(1 / 0.0005, rel=1e-6)  # one token in 0.5 ms


def test_a_ratio_over_an_all_zero_baseline_has_no_point_and_no_interval():
    """No resample of an all-zero A has a median to divide by: nothing to report, and no crash."""
    assert metrics.ratio_ci([0.0, 0.0, 0.0], [1.0, 2.0, 3.0]) == (None, None, None)
    point, low, high = metrics.ratio_ci([0.0, 0.0, 1.0], [2.0, 2.0, 2.0])
    assert point is None and low is not None and low <= high  # resamples with a non-zero median still count
