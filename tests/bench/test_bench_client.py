"""The streaming client against the FAKE timing server: measured metrics vs injected truth,
multi-token chunks, chat's role-only first chunk, usage, and faults (unreachable server,
server dying mid-run, malformed SSE, HTTP errors)."""

import asyncio
import json
import urllib.request
from pathlib import Path

import pytest
from fakes.bench_cli_args import bench_run_argv
from fakes.fake_openai_server import FakeScript, FakeServer, FakeServerState

from gemma4_t4.bench import compare_runs, load_run, plot_compare, plot_run, run_benchmark
from gemma4_t4.bench.client import RequestSpec, closed_loop, make_session, send_request
from gemma4_t4.bench.metrics import aggregate, request_metrics
from gemma4_t4.bench.schemas import RequestRecord
from gemma4_t4.cli import main as cli_main
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.serving.server_state import free_port

# The client's stamps are checked against what the FAKE server did by causality only (nothing can
# arrive before the server wrote it; both use one system-wide perf_counter clock) and by counting
# chunks: upper bounds would time a shared machine's scheduler. How exact the stamps are (< 1 ms)
# and how well the open loop keeps its schedule are measured by scripts/bench_client_overhead.py.


@pytest.fixture(scope="module")
def fake():
    with FakeServer(free_port()) as server:
        yield server


def _run(server, specs, concurrency=1, keep_text=False):
    async def go():
        async with make_session(concurrency) as session:
            async def send(spec):
                return await send_request(session, server.base_url, "fake-model", spec, keep_text=keep_text)

            return await closed_loop(send, specs, concurrency)

    return list(asyncio.run(go()))


def _server_log(server):
    with urllib.request.urlopen(server.base_url + "/fake/log") as response:
        return json.loads(response.read())


def _spec(i, api="completions", max_tokens=20, **fake):
    return RequestSpec(f"r{i}", "x" * 50, max_tokens, api=api, extra_body={"fake": fake, "fake_id": f"r{i}"})


def _not_before_written(r, truth, ttft_s, gap_s, tokens_per_chunk=1):
    """Every chunk's stamp is at or after the moment the fake could first write it (received +
    ttft + k gaps) and after the server actually logged a write before it: causal bounds."""
    for k, at in enumerate(r.chunk_times_s):
        assert at >= truth["received_s"] + ttft_s + k * gap_s, (k, at, truth["received_s"])
    assert r.send_s <= truth["received_s"] and r.first_token_s == r.chunk_times_s[0]
    assert len(truth["writes_s"]) == len(r.chunk_times_s) == -(-truth["tokens"] // tokens_per_chunk)


def test_completions_timings_match_injected_truth(fake):
    specs = [_spec(i, ttft_s=0.08, gap_s=0.02) for i in range(6)]
    records = _run(fake, specs, concurrency=2)
    log = {e["id"]: e for e in _server_log(fake)}
    for r in records:
        m = request_metrics(r)
        truth = log[r.request_id]
        assert r.error is None and r.completion_tokens == 20 and r.token_source == "usage"
        assert r.finish_reason == "length" and len(r.chunk_times_s) == 20
        _not_before_written(r, truth, 0.08, 0.02)
        # the injected 80 ms runs from the server's receipt; the client also sees the upload
        assert m.ttft_ms >= 80.0 and m.e2el_ms >= 80.0 + 19 * 20.0
        assert m.tpot_ms == pytest.approx((m.e2el_ms - m.ttft_ms) / 19) and len(m.itl_ms) == 19
    agg = aggregate(records)
    assert agg.tokens_per_chunk == 1.0 and agg.itl_ms.n == 6 * 19 and agg.tpot_ms.n == 6 and agg.buffered is None


def test_multi_token_chunks_are_visible(fake):
    # 5 chunks 80 ms apart: only a client stalled for the whole 320 ms could see them as one flush
    records = _run(fake, [_spec(i, ttft_s=0.05, gap_s=0.08, tokens_per_chunk=4) for i in range(3)])
    log = {e["id"]: e for e in _server_log(fake)}
    agg = aggregate(records)
    assert agg.content_chunks == 15 and agg.tokens_per_chunk == pytest.approx(4.0)
    # ITL is per chunk (4 gaps a request) while TPOT spreads those gaps over 19 tokens
    assert agg.itl_ms.n == 3 * 4 and agg.tpot_ms.n == 3
    for r in records:
        _not_before_written(r, log[r.request_id], 0.05, 0.08, tokens_per_chunk=4)
        m = request_metrics(r)
        assert m.tpot_ms == pytest.approx(sum(m.itl_ms) / 19)  # 4 chunk gaps spread over 19 tokens


def test_chat_role_only_first_chunk_is_not_the_first_token(fake):
    records = _run(fake, [_spec(i, api="chat", ttft_s=0.12, gap_s=0.01, role_chunk=True) for i in range(3)])
    truth = {e["id"]: e for e in _server_log(fake)}
    for r in records:
        m = request_metrics(r)
        assert r.error is None and len(r.chunk_times_s) == 20  # the role-only delta is no token
        # TTFT runs to the first token (written 120 ms after receipt), not to the role-only delta
        assert r.first_chunk_s <= r.first_token_s and m.ttft_ms >= 120.0
        assert m.ttft_ms == pytest.approx((r.first_content_s - r.send_s) * 1000)
        assert m.ttft_first_chunk_ms == pytest.approx((r.first_chunk_s - r.send_s) * 1000)
        _not_before_written(r, truth[r.request_id], 0.12, 0.01)


def test_missing_usage_falls_back_to_chunk_count_and_says_so(fake):
    r = _run(fake, [_spec(0, ttft_s=0.01, gap_s=0.001, usage=False, tokens_per_chunk=2)])[0]
    assert r.error is None and r.token_source == "chunks" and r.completion_tokens == 10


def test_malformed_sse_and_http_errors_are_counted_not_raised(fake):
    records = _run(
        fake,
        [
            _spec(0, ttft_s=0.01, gap_s=0.001, malformed_after_chunks=3),
            _spec(1, http_status=500),
            _spec(2, ttft_s=0.01, gap_s=0.001),
        ],
    )
    by_id = {r.request_id: r for r in records}
    assert by_id["r0"].error == "malformed_sse"
    assert by_id["r1"].error == "http_500"
    assert by_id["r2"].error is None
    agg = aggregate(records)
    assert agg.failed == 2 and agg.completed == 1


def test_unreachable_server_fails_before_the_run(tmp_path):
    out = tmp_path / "never"
    with pytest.raises(Gemma4T4Error, match="cannot reach") as info:
        run_benchmark(f"http://127.0.0.1:{free_port()}", "m", "decode", out)
    assert info.value.fix and not out.exists()


def test_bad_options_are_refused(fake, tmp_path):
    with pytest.raises(Gemma4T4Error, match="unknown workload"):
        run_benchmark(fake.base_url, "fake-model", "nope", tmp_path / "a")
    with pytest.raises(Gemma4T4Error, match="does not serve"):
        run_benchmark(fake.base_url, "other-model", "decode", tmp_path / "b")
    with pytest.raises(Gemma4T4Error, match="max_model_len"):
        run_benchmark(fake.base_url, "fake-model", "decode", tmp_path / "c", input_len=9000)
    with pytest.raises(Gemma4T4Error, match="unknown option"):
        run_benchmark(fake.base_url, "fake-model", "decode", tmp_path / "d", concurency=[1])


def test_full_workloads_on_the_fake_server_write_results_and_plots(tmp_path):
    state = FakeServerState(default=FakeScript(ttft_s=0.02, gap_s=0.002))
    with FakeServer(free_port(), state) as server:
        a = run_benchmark(
            server.base_url,
            "fake-model",
            "decode",
            tmp_path / "a",
            concurrency=[1, 4],
            input_len=64,
            output_len=8,
            num_prompts=6,
            max_num_seqs=2,
            gpu="t4",
            bytes_per_token=1.862e9,
            progress=False,
        )
        b = run_benchmark(
            server.base_url,
            "fake-model",
            "decode",
            tmp_path / "b",
            concurrency=[1, 4],
            input_len=64,
            output_len=8,
            num_prompts=6,
            progress=False,
        )
        ttft = run_benchmark(
            server.base_url,
            "fake-model",
            "ttft",
            tmp_path / "ttft",
            input_lens=[32, 64, 128, 256, 512],
            output_len=4,
            num_prompts=3,
            progress=False,
        )
        prefix = run_benchmark(
            server.base_url,
            "fake-model",
            "prefix",
            tmp_path / "prefix",
            input_len=300,
            prefix_len=200,
            groups=2,
            num_prompts=4,
            output_len=4,
            progress=False,
        )
    assert a.status == "complete" and [c.queueing for c in a.cells] == [False, True]
    cell = a.cells[0]
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
        stats = getattr(cell, key)
        assert None not in (stats.mean, stats.median, stats.p90, stats.p99)  # measured
    assert cell.input_len_exact and cell.completed == 6 and cell.failed == 0
    assert cell.derived.roofline.ceiling_tok_s == pytest.approx(171.9, abs=0.1)
    assert len(a.measured(cell.cell)) == 6
    warm = [r for r in a.records if r.phase == "warmup"]
    measured_prompts = {r.request_id for r in a.records if r.phase == "measure"}
    assert warm and not measured_prompts & {r.request_id for r in warm}
    assert len(ttft.cells) == 5 and all(c.input_len_exact for c in ttft.cells)
    assert [c.variant for c in prefix.cells] == ["shared_prefix", "unique_prompts"]
    names = {p.name for p in plot_run(a) + plot_run(ttft) + plot_run(prefix)}
    assert names == {
        "throughput_vs_concurrency.png",
        "roofline.png",
        "ttft_vs_input_len.png",
        "prefix_cache.png",
    }
    comparison = compare_runs(a.dir, b.dir)
    assert len(comparison.cells) == 2 and "B/A" in str(comparison)
    assert plot_compare(a, b, tmp_path / "ab.png").stat().st_size > 1000
    assert (tmp_path / "a" / "summary.csv").read_text().count("\n") == 3


def test_server_dying_mid_run_keeps_partial_results_and_exits_nonzero(tmp_path, fake_server_process):
    base_url = fake_server_process("--ttft", "0.01", "--gap", "0.002", "--exit-after-requests", "6")
    out = tmp_path / "partial"
    # 2 warm-ups + 4 measured succeed, then the fake server exits
    code = cli_main(
        [
            *bench_run_argv(base_url, "fake-model", "decode"),
            "--concurrency",
            "1,2",
            "--input-len",
            "32",
            "--output-len",
            "4",
            "--num-prompts",
            "10",
            "--out",
            str(out),
            "--json",
            "--no-plots",
        ]
    )
    assert code == 1
    run = load_run(out)
    first = run.cells[0]
    assert first.completed == 4 and first.failed == 6
    assert set(first.errors) <= {"connect_error", "disconnected", "truncated_stream"}
    assert run.status == "aborted: server unreachable" and len(run.cells) == 1
    assert len([r for r in run.records if r.phase == "measure"]) == 10


def test_cli_run_plot_and_compare(tmp_path, capsys):
    with FakeServer(free_port(), FakeServerState(default=FakeScript(ttft_s=0.01, gap_s=0.001))) as server:
        base = [
            *bench_run_argv(server.base_url, "fake-model", "decode"),
            "--concurrency",
            "1",
            "--input-len",
            "32",
            "--output-len",
            "4",
            "--num-prompts",
            "4",
        ]
        assert cli_main(base + ["--out", str(tmp_path / "a")]) == 0
        assert cli_main(base + ["--out", str(tmp_path / "b"), "--json"]) == 0
        capsys.readouterr()
        assert cli_main(base + ["--out", str(tmp_path / "a")]) == 2  # never overwrites silently
        assert "already holds" in capsys.readouterr().err
        open_loop = [
            *bench_run_argv(server.base_url, "fake-model", "decode"),
            "--rate",
            "5,10",
            "--arrival",
            "constant",
            "--max-in-flight",
            "4",
            "--input-len",
            "32",
            "--output-len",
            "4",
            "--num-prompts",
            "4",
            "--json",
            "--out",
            str(tmp_path / "open"),
        ]
        capsys.readouterr()
        assert cli_main(open_loop) == 0
        cells = json.loads(capsys.readouterr().out)["cells"]
        assert [(c["open_loop"]["offered_rate_rps"], c["open_loop"]["max_in_flight"]) for c in cells] == [
            (5, 4),
            (10, 4),
        ]
        with pytest.raises(SystemExit) as bad:
            cli_main(open_loop[:-2] + ["--out", str(tmp_path / "bad"), "--rate", "1,x"])
        assert bad.value.code == 2 and "comma-separated numbers" in capsys.readouterr().err
        answers = bench_run_argv(server.base_url, "fake-model", "answers")
        assert cli_main(answers + ["--out", str(tmp_path / "ans1"), "--no-plots"]) == 0
        assert cli_main(answers + ["--out", str(tmp_path / "ans2"), "--no-plots"]) == 0
    assert Path(tmp_path / "a" / "throughput_vs_concurrency.png").exists()
    assert cli_main(["bench", "plot", str(tmp_path / "b")]) == 0
    capsys.readouterr()
    assert cli_main(["bench", "compare", str(tmp_path / "a"), str(tmp_path / "b"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["cells"][0]["ratios"][0]["metric"] == "ttft_ms"
    assert cli_main(["bench", "compare", str(tmp_path / "ans1"), str(tmp_path / "ans2")]) == 0
    assert "identical answers: 20/20" in capsys.readouterr().out


def test_arrival_processes():
    from gemma4_t4.bench.client import arrival_offsets

    poisson = arrival_offsets(4000, 5.0, "poisson", seed=1)
    gaps = [b - a for a, b in zip(poisson, poisson[1:], strict=False)]
    assert poisson[0] == 0 and all(g >= 0 for g in gaps)
    assert sum(gaps) / len(gaps) == pytest.approx(0.2, rel=0.05)  # mean gap 1/rate
    cv = (sum((g - 0.2) ** 2 for g in gaps) / len(gaps)) ** 0.5 / 0.2
    assert cv == pytest.approx(1.0, rel=0.1)  # exponential gaps: std = mean
    assert arrival_offsets(50, 5.0, "poisson", seed=1) == poisson[:50]  # seeded
    assert arrival_offsets(4, 2.0, "constant") == [0.0, 0.5, 1.0, 1.5]
    with pytest.raises(ValueError, match="rate"):
        arrival_offsets(3, 0.0)
    with pytest.raises(ValueError, match="arrival"):
        arrival_offsets(3, 1.0, "bursty")


def test_peak_in_flight_counts_overlaps():
    from gemma4_t4.bench.metrics import peak_in_flight

    records = [
        RequestRecord(request_id=f"r{i}", send_s=s, end_s=e)
        for i, (s, e) in enumerate([(0.0, 1.0), (0.5, 2.0), (1.0, 1.5), (1.6, 1.7)])
    ]
    assert peak_in_flight(records) == 2  # the first ends as the third starts


def test_open_loop_keeps_its_schedule_and_shows_pile_up(tmp_path):
    """Offered load is sent on schedule whatever the server does; responses slower than the
    arrival gap pile up (peak in flight), and a full client cap shows as send lag."""
    state = FakeServerState(default=FakeScript(ttft_s=0.15, gap_s=0.02))  # 8 tokens: ~0.3 s per request
    with FakeServer(free_port(), state) as server:
        run = run_benchmark(
            server.base_url,
            "fake-model",
            "decode",
            tmp_path / "open",
            rates=[8.0, 16.0],
            arrival="constant",
            input_len=32,
            output_len=8,
            num_prompts=12,
            progress=False,
        )
        capped = run_benchmark(
            server.base_url,
            "fake-model",
            "decode",
            tmp_path / "capped",
            rates=[16.0],
            arrival="constant",
            max_in_flight=1,
            input_len=32,
            output_len=8,
            num_prompts=6,
            progress=False,
        )
    assert run.status == "complete" and [c.variant for c in run.cells] == ["open_loop", "open_loop"]
    for cell, rate in zip(run.cells, (8.0, 16.0), strict=True):
        ol = cell.open_loop
        assert cell.concurrency is None and cell.completed == 12 and ol.offered_rate_rps == rate
        # the schedule: every request scheduled on the constant grid, none sent before its time
        measured = sorted(run.measured(cell.cell), key=lambda r: r.scheduled_s)
        offsets = [r.scheduled_s - measured[0].scheduled_s for r in measured]
        assert offsets == pytest.approx([i / rate for i in range(12)])
        assert all(r.send_s >= r.scheduled_s for r in measured) and ol.send_lag_ms.min >= 0
        assert ol.achieved_send_rate_rps is not None and not ol.cap_reached and ol.peak_in_flight <= 12
    measured = [r for r in run.records if r.phase == "measure"]
    assert all(r.scheduled_s is not None for r in measured)
    ol = capped.cells[0].open_loop
    assert ol.cap_reached and ol.peak_in_flight == 1
    # one slot: request k waits for k earlier ones, each >= 0.15 + 7 x 0.02 s (the injected delays),
    # yet was scheduled k / 16 s after the first - a lower bound on its lag that no machine can beat
    sends = sorted(capped.measured(capped.cells[0].cell), key=lambda r: r.scheduled_s)
    assert all(b.send_s >= a.end_s for a, b in zip(sends, sends[1:], strict=False))  # never two at once
    assert ol.send_lag_ms.max >= (5 * 0.29 - 5 / 16) * 1000
    assert "in-flight cap reached" in capped.table() and "16.0 req/s" in capped.table()
    assert {p.name for p in plot_run(run)} == {"ttft_vs_offered_rate.png"}
    assert "offered_rate_rps" in (tmp_path / "open" / "summary.csv").read_text().splitlines()[0]


def test_open_loop_options_are_checked(fake, tmp_path):
    with pytest.raises(Gemma4T4Error, match="decode workload") as err:
        run_benchmark(fake.base_url, "fake-model", "ttft", tmp_path / "x", rates=[1.0], progress=False)
    assert "--workload decode" in err.value.fix
    with pytest.raises(Gemma4T4Error, match=r"rates.0 = 0.0 must be at least 0.01"):
        run_benchmark(fake.base_url, "fake-model", "decode", tmp_path / "y", rates=[0.0], progress=False)
    with pytest.raises(Gemma4T4Error, match="arrival"):
        run_benchmark(
            fake.base_url,
            "fake-model",
            "decode",
            tmp_path / "z",
            rates=[1.0],
            arrival="bursty",
            progress=False,
        )


def test_sweep_measures_both_ends_then_rates_in_between(tmp_path):
    """guidellm-style sweep: one at a time, all at once, then open-loop rates between the two.

    The sweep refuses when all-at-once is not faster than one-at-a-time, and both ends are wall-clock
    readings: each request takes ~0.33 s, so one at a time takes ~1.3 s and all four at once ~0.33 s,
    and only a stall of about a second inside the all-at-once cell could reverse them."""
    state = FakeServerState(default=FakeScript(ttft_s=0.3, gap_s=0.01))  # ~0.33 s per 4-token request
    with FakeServer(free_port(), state) as server:
        run = run_benchmark(
            server.base_url,
            "fake-model",
            "decode",
            tmp_path / "sweep",
            sweep=2,
            arrival="constant",
            input_len=32,
            output_len=4,
            num_prompts=4,
            progress=False,
        )
    assert run.status == "complete"
    assert [c.variant for c in run.cells] == [
        "sweep_synchronous",
        "sweep_throughput",
        "sweep_rate",
        "sweep_rate",
    ]
    sync, burst = run.cells[0], run.cells[1]
    assert (sync.concurrency, burst.concurrency) == (1, 4)
    sweep = run.run.sweep
    assert sweep.synchronous_rps == sync.request_throughput_req_s
    assert sweep.synchronous_rps < sweep.rates[0] < sweep.rates[1] < sweep.throughput_rps
    assert [c.open_loop.offered_rate_rps for c in run.cells[2:]] == sweep.rates
    assert sweep.synchronous_rps < 1 / 0.33  # one at a time: never faster than the scripted request
    assert [c.num_prompts for c in run.cells] == [4, 4, 4, 4]


def test_sweep_rates_and_options():
    from gemma4_t4.bench.specs import sweep_rates

    assert sweep_rates(1.0, 4.0, 2) == [2.0, 3.0]
    with pytest.raises(Gemma4T4Error, match="no load range") as err:
        sweep_rates(5.0, 4.9, 3)
    assert "--max-num-seqs" in err.value.fix


def test_sweep_option_conflicts_are_refused(fake, tmp_path):
    with pytest.raises(Gemma4T4Error, match="--sweep"):
        run_benchmark(
            fake.base_url, "fake-model", "decode", tmp_path / "a", sweep=3, rates=[1.0], progress=False
        )
    with pytest.raises(Gemma4T4Error, match="--sweep"):
        run_benchmark(
            fake.base_url, "fake-model", "decode", tmp_path / "b", sweep=3, concurrency=[2], progress=False
        )
    with pytest.raises(Gemma4T4Error, match="at least 1"):
        run_benchmark(fake.base_url, "fake-model", "decode", tmp_path / "c", sweep=0, progress=False)
