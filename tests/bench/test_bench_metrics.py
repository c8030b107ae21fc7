"""Pure parts of the benchmark: statistics, metric definitions, Prometheus parsing, derived
figures, answer comparison, the results format."""

import json

import numpy as np
import pytest

from gemma4_t4.bench import metrics
from gemma4_t4.bench.answers import compare_answers, is_correct
from gemma4_t4.bench.derive import cost, derive_cell, roofline
from gemma4_t4.bench.published import GCE_T4_E2B, gce_t4
from gemma4_t4.bench.results import ResultsWriter, cells_to_csv, load_run, read_records
from gemma4_t4.bench.schemas import Answer, CellStats, CellSummary, RequestRecord, RunInfo
from gemma4_t4.bench.telemetry import cache_config, prefix_cache_delta, snapshot_from_text
from gemma4_t4.errors import Gemma4T4Error


def test_percentiles_match_numpy():
    rng = np.random.default_rng(1)
    data = list(rng.exponential(10, 101))
    for q in (50, 90, 99):
        assert metrics.percentile(data, q) == pytest.approx(np.percentile(data, q))
    stats = metrics.summarize(data)
    assert stats.std == pytest.approx(np.std(data, ddof=1))
    assert stats.ci_low < stats.median < stats.ci_high


@pytest.mark.parametrize("n", [2, 4, 10, 7])
@pytest.mark.parametrize("q", [90, 99, 33.3, 50, 12.5])
def test_percentiles_interpolate_between_ranks_as_numpy_linear(n, q):
    """Few points and q between ranks: a percentile that took the nearest or lower rank instead of
    interpolating linearly would pass the 101-point case above, never these."""
    data = [float(v) for v in np.random.default_rng(n).exponential(10, n)]
    rank = (n - 1) * q / 100
    if n > 1 and q != 50:
        assert rank != int(rank)  # a fractional rank: the case that needs interpolation
    assert metrics.percentile(data, q) == pytest.approx(np.percentile(data, q, method="linear"), rel=1e-12)
    assert metrics.percentile([1.0, 2.0, 4.0, 8.0], 90) == pytest.approx(6.8)  # rank 2.7: 4 + 0.7 * 4


def _record(send, first, chunks, n, error=None, first_chunk=None):
    return RequestRecord(
        request_id=f"r{send}",
        send_s=send,
        first_token_s=first,
        first_chunk_s=first_chunk or first,
        first_content_s=first,
        last_choice_s=chunks[-1],
        end_s=chunks[-1] + 0.001,
        chunk_times_s=chunks,
        completion_tokens=n,
        prompt_tokens=100,
        error=error,
    )


def test_request_metrics_definitions():
    # 9 tokens in 3 chunks of 3: TTFT 100 ms, chunk gaps 30 ms -> TPOT = (160 - 100) / 8
    r = _record(0.0, 0.100, [0.100, 0.130, 0.160], 9, first_chunk=0.010)
    m = metrics.request_metrics(r)
    assert m.ttft_ms == pytest.approx(100.0)
    assert m.ttft_first_chunk_ms == pytest.approx(10.0)
    assert m.e2el_ms == pytest.approx(160.0)
    assert m.tpot_ms == pytest.approx(60.0 / 8)
    assert m.per_stream_tok_s == pytest.approx(1000.0 / 7.5)
    assert m.itl_ms == pytest.approx([30.0, 30.0])
    one = metrics.request_metrics(_record(0.0, 0.1, [0.1], 1))
    assert one.tpot_ms is None  # undefined for a single token


def test_aggregate_window_and_failures():
    records = [
        _record(0.0, 0.1, [0.1, 0.2], 10),
        _record(0.5, 0.6, [0.6, 1.0], 10),
        _record(0.2, None, [0.3], 0, error="disconnected"),
    ]
    agg = metrics.aggregate(records)
    assert agg.completed == 2 and agg.failed == 1 and agg.errors == {"disconnected": 1}
    assert agg.window.duration_s == pytest.approx(1.001)
    assert agg.output_throughput_tok_s == pytest.approx(20 / 1.001)
    assert agg.tokens_per_chunk == pytest.approx(5.0)
    assert agg.ttft_ms.n == 2


def test_ratio_interval_brackets_the_truth():
    rng = np.random.default_rng(0)
    a = list(rng.normal(100, 5, 64))
    b = list(rng.normal(150, 5, 64))
    point, low, high = metrics.ratio_ci(a, b)
    assert low < point < high and low < 1.5 < high


METRICS_TEXT = """# HELP vllm:prefix_cache_queries_total x
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 250.0
vllm:cache_config_info{block_size="32",enable_prefix_caching="True",engine="0"} 1.0
vllm:num_requests_running{engine="0",model_name="m"} 3.0
"""


def test_prometheus_and_prefix_delta():
    before = snapshot_from_text(METRICS_TEXT)
    after = snapshot_from_text(METRICS_TEXT.replace("1000.0", "1512.0").replace("250.0", "506.0"))
    delta = prefix_cache_delta(before, after)
    assert delta.queries == 512 and delta.hits == 256 and delta.hit_rate == pytest.approx(0.5)
    assert cache_config(after) == {"enable_prefix_caching": "True", "block_size": "32"}
    assert prefix_cache_delta(None, after).hit_rate is None


def test_roofline_and_cost_match_the_reference_figures():
    qat = roofline(72.31, 1.862e9, "t4")
    assert qat.ceiling_tok_s == pytest.approx(171.9, abs=0.1)
    assert qat.effective_bandwidth_gb_s == pytest.approx(134.6, abs=0.1)
    assert qat.plausibility == "ok"
    assert roofline(200.0, 1.862e9, "t4").plausibility.startswith("error")
    prices = cost(100.0, ["sagemaker:ml.g4dn.xlarge"])
    assert prices["sagemaker:ml.g4dn.xlarge"] == pytest.approx(0.736 / 0.36)
    cell = CellStats.model_validate({"per_stream_tok_s": {"median": 40.0}, "output_throughput_tok_s": 37.04})
    derived = derive_cell(cell, "t4", 4.597e9)
    assert derived.roofline.ceiling_tok_s == pytest.approx(69.6, abs=0.1)
    assert "ec2:g4dn.xlarge" in derived.usd_per_million_output_tokens
    with pytest.raises(Gemma4T4Error, match="unknown GPU"):
        derive_cell(cell, "k80", 1e9)


def test_published_results_are_labelled():
    # every row says it is published and names where it comes from (the series' repo or write-up)
    assert all(r.published and ("xbill9" in r.source or "the series" in r.source) for r in GCE_T4_E2B)
    assert gce_t4("qat").per_stream_tok_s == 72.31


def test_answers_comparison_finds_first_divergence():
    a = [
        Answer(index=0, question="q0", text="Paris.", correct=True),
        Answer(index=1, question="q1", text="144 is the answer", correct=True),
    ]
    b = [
        Answer(index=0, question="q0", text="Paris.", correct=True),
        Answer(index=1, question="q1", text="144 was the answer", correct=True),
    ]
    result = compare_answers(a, b)
    assert (result.total, result.identical, result.differing) == (2, 1, [1])
    assert result.first_divergence.char == 4
    assert is_correct("Paris.", "Paris") and not is_correct("It is Paris", "Paris")


def test_results_writer_is_incremental_and_loadable(tmp_path):
    writer = ResultsWriter(tmp_path / "run", RunInfo(workload="decode", model="m"))
    writer.add_record("c1", "measure", _record(0.0, 0.1, [0.1, 0.2], 2))
    # before any cell finishes, the record is already on disk
    assert len(read_records(tmp_path / "run" / "records.jsonl")) == 1
    cell = CellSummary(
        cell="c1",
        workload="decode",
        concurrency=1,
        **metrics.aggregate([_record(0.0, 0.1, [0.1, 0.2], 2)]).model_dump(),
    )
    writer.add_cell(cell)
    writer.update_run(status="complete")
    writer.close()
    with open(tmp_path / "run" / "records.jsonl", "a") as handle:
        handle.write('{"torn": ')  # a hard kill mid-line
    run = load_run(tmp_path / "run")
    assert run.status == "complete" and len(run.records) == 1 and run.cells[0].completed == 1
    assert run.table_rows()[0]["ok"] == 1 and run.table() == str(run)
    assert cells_to_csv(run.cells).splitlines()[0].startswith("cell,workload")
    with pytest.raises(Gemma4T4Error, match="already holds"):
        ResultsWriter(tmp_path / "run", RunInfo())
    with pytest.raises(Gemma4T4Error, match="summary.json"):
        load_run(tmp_path / "missing")
    (tmp_path / "run" / "summary.json").write_text(json.dumps({"schema": "other"}))
    with pytest.raises(Gemma4T4Error, match="schema"):
        load_run(tmp_path / "run")


def test_bytes_per_token_come_from_the_model_catalogue():
    from gemma4_t4.bench.derive import lookup_bytes_per_token

    assert lookup_bytes_per_token("gemma-4-E2B", "qat") == pytest.approx(1.862e9, rel=1e-3)
    assert lookup_bytes_per_token("gemma-4-E2B", "bf16") == pytest.approx(4.597e9, rel=1e-3)
    assert lookup_bytes_per_token("not-a-model", "bf16") is None


def test_gpu_sampler_falls_back_to_nvidia_smi_and_reads_throttling():
    """Without pynvml the sampler polls nvidia-smi; a 70 W T4 at its power cap shows up as such."""
    from gemma4_t4.bench import telemetry

    lines = iter(
        [
            "1590, 69.80, 0x0000000000000004, 5120, 98, 71",
            "585, 70.10, 0x0000000000000004, 5200, 99, 74",
            "1590, 41.00, 0x0000000000000000, 5200, [N/A], 70",
        ]
        * 50
    )
    seen: list[list[str]] = []

    def fake_smi(cmd):  # a stand-in for nvidia-smi (no GPU here)
        seen.append(cmd)
        return next(lines) + "\n"

    sampler = telemetry.GPUSampler(interval_s=0.001, smi=fake_smi, use_nvml=False)
    assert sampler.source == "nvidia-smi" and sampler.available
    sampler.start()
    import time

    deadline = time.monotonic() + 5
    while len(sampler.samples) < 6 and time.monotonic() < deadline:
        time.sleep(0.01)
    summary = sampler.stop()
    assert summary.source == "nvidia-smi" and summary.samples >= 6
    assert summary.sm_clock_mhz_min == 585 and summary.memory_used_mib_max == 5200
    assert 0.5 < summary.throttled_fraction["sw_power_cap"] < 1
    assert any("--query-gpu=clocks.sm,power.draw,clocks_throttle_reasons.active" in " ".join(c) for c in seen)
    assert telemetry.parse_smi_sample("garbage") is None
    none = telemetry.GPUSampler(smi=lambda cmd: None, use_nvml=False)
    assert not none.available and none.start().stop() is None


def test_published_lookups_give_the_series_headline_ratios():
    from gemma4_t4.bench.published import SAGEMAKER_DECODE, SAGEMAKER_LOAD, gce_t4

    # the lookups select the row an independent filter of the table finds (and only that row)
    for build, length, c in [("qat", 512, 1), ("bf16", 512, 8), ("emb4", 4096, 1)]:
        (row,) = [r for r in GCE_T4_E2B if (r.build, r.input_len, r.concurrency) == (build, length, c)]
        assert gce_t4(build, length, c) is row
    per_stream = gce_t4("qat").per_stream_tok_s / gce_t4("bf16").per_stream_tok_s
    all_streams_c8 = (
        gce_t4("qat", concurrency=8).output_throughput_tok_s
        / gce_t4("bf16", concurrency=8).output_throughput_tok_s
    )
    ttft_growth = gce_t4("bf16", 4096).ttft_ms / gce_t4("bf16", 512).ttft_ms
    assert round(per_stream, 2) == 1.79 and round(all_streams_c8, 2) == 1.31 and round(ttft_growth) == 24
    load = SAGEMAKER_LOAD[0]  # E2B emb4
    assert load.published and load.t4_tok_s / load.l4_tok_s == pytest.approx(0.625, abs=0.001)
    with pytest.raises(KeyError, match="published"):
        gce_t4("qat", input_len=1000)
    # the series' headline (T4 decodes at 0.77-0.82x of L4) is what its own table says
    ratios = [p.t4_tok_s / p.l4_tok_s for p in SAGEMAKER_DECODE if p.t4_tok_s]
    assert len(ratios) == 3 and all(0.765 <= r <= 0.825 for r in ratios)


def test_published_single_stream_rows_sit_under_our_roofline():
    """Checked against an independent source: the model catalogue's bytes per token and the T4's
    bandwidth. A published c=1 decode speed above the ceiling (or a catalogue gone wrong) fails."""
    from gemma4_t4.bench.derive import lookup_bytes_per_token

    for row in [r for r in GCE_T4_E2B if r.concurrency == 1 and r.input_len == 512]:
        fit = roofline(row.per_stream_tok_s, lookup_bytes_per_token(row.model, row.build), "t4")
        assert fit.plausibility == "ok" and 0.3 < fit.efficiency < 1.0, (row.build, fit)
    # and the order the series reports (emb4 > qat > bf16 per stream) follows from bytes per token
    speeds = {
        b: gce_t4_row.per_stream_tok_s
        for b in ("bf16", "qat", "emb4")
        for gce_t4_row in GCE_T4_E2B
        if (gce_t4_row.build, gce_t4_row.input_len, gce_t4_row.concurrency) == (b, 512, 1)
    }
    sizes = {b: lookup_bytes_per_token("gemma-4-E2B", b) for b in speeds}
    assert sorted(speeds, key=speeds.get) == sorted(sizes, key=sizes.get, reverse=True)
