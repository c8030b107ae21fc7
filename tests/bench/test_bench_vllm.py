"""Decode, TTFT, prefix-cache and answers workloads against the REAL vLLM CPU server (tiny
Gemma 4, prefix caching on, block size 32). Cells are tiny; timings are not asserted (the CI
machine is shared), structure and cache behaviour are."""

import importlib.metadata

import pytest

from gemma4_t4.bench import compare_runs, plot_run, run_benchmark
from gemma4_t4.bench.vllm_cli import patch_vllm_version

pytestmark = pytest.mark.vllm


def _opts(vllm_server):
    return {
        "max_num_seqs": vllm_server.config.max_num_seqs,
        "server_launch": vllm_server.launch_record,
        "progress": False,
    }


def test_decode_sweep(vllm_server, tmp_path):
    run = run_benchmark(
        vllm_server.base_url,
        "tiny-gemma4",
        "decode",
        tmp_path / "decode",
        concurrency=[1, 2],
        input_len=64,
        output_len=8,
        num_prompts=4,
        warmup=1,
        **_opts(vllm_server),
    )
    assert run.status == "complete"
    for cell in run.cells:
        assert cell.completed == 4 and cell.failed == 0 and cell.queueing is False
        assert cell.input_len_exact and cell.token_source == ["usage"]
        assert cell.total_output_tokens == 4 * 8
        assert cell.output_throughput_tok_s > 0 and cell.e2el_ms.median > 0
        # vLLM's CPU build at times sends each answer in one flush: then TPOT is named not measured, never ~0
        # (a request whose text stayed empty, which a random tiny model can produce, has no TTFT/TPOT)
        assert (cell.buffered is None) == (cell.tpot_ms.n > 0), (cell.buffered, cell.tpot_ms)
        assert cell.buffered is None or cell.per_stream_tok_s.median is None
        # unique prompts by construction: measured, not assumed
        assert cell.prefix_cache.source == "/metrics" and cell.prefix_cache.hits == 0
        assert cell.prefix_cache.queries >= 4 * 64
    assert run.run.environment["server"]["version"] == "0.32.0"
    assert run.run.environment["server"]["cache_config"]["block_size"] == "32"
    assert [p.name for p in plot_run(run)] == ["throughput_vs_concurrency.png"]


def test_ttft_sweep_has_no_cache_hits(vllm_server, tmp_path):
    run = run_benchmark(
        vllm_server.base_url,
        "tiny-gemma4",
        "ttft",
        tmp_path / "ttft",
        input_lens=[64, 128, 256, 512, 1024],
        output_len=2,
        num_prompts=2,
        warmup=1,
        **_opts(vllm_server),
    )
    assert [c.input_len for c in run.cells] == [64, 128, 256, 512, 1024]
    for cell in run.cells:
        assert cell.completed == 2 and cell.input_len_exact
        assert cell.prefix_cache.hits == 0
    assert [p.name for p in plot_run(run)] == ["ttft_vs_input_len.png"]


def test_prefix_cache_hits_are_measured(vllm_server, tmp_path):
    run = run_benchmark(
        vllm_server.base_url,
        "tiny-gemma4",
        "prefix",
        tmp_path / "prefix",
        input_len=320,
        prefix_len=256,
        groups=2,
        num_prompts=4,
        output_len=2,
        warmup=1,
        **_opts(vllm_server),
    )
    shared, unique = run.cells
    assert shared.variant == "shared_prefix" and unique.variant == "unique_prompts"
    assert shared.prefix_cache.hits > 0 and shared.prefix_cache.hit_rate > 0
    assert unique.prefix_cache.hits == 0
    # the server's per-request cached_tokens agree: followers in each group hit, leaders do not
    cached = [r.cached_tokens for r in run.measured(shared.cell)]
    assert cached[0] == 0 and any(c > 0 for c in cached[1:])


def test_answers_are_identical_across_two_greedy_runs(vllm_server, tmp_path):
    a = run_benchmark(
        vllm_server.base_url, "tiny-gemma4", "answers", tmp_path / "a", output_len=8, progress=False
    )
    b = run_benchmark(
        vllm_server.base_url, "tiny-gemma4", "answers", tmp_path / "b", output_len=8, progress=False
    )
    assert a.cells[0].completed == 20 and a.cells[0].api == "chat"
    comparison = compare_runs(a, b)
    assert comparison.answers.total == 20 and comparison.answers.identical == 20


def test_vllm_cli_wrapper_reports_a_cpu_version():
    original = importlib.metadata.version
    patched = patch_vllm_version()
    try:
        assert importlib.metadata.version("vllm").endswith("+cpu")
        assert patched is None or patched.endswith("+cpu")
        assert importlib.metadata.version("aiohttp") == original("aiohttp")
    finally:
        importlib.metadata.version = original


def test_decode_and_answers_through_the_typed_spine(vllm_server, tmp_path):
    """The in-memory run is the run on disk: typed cells, accessors, and a validated reload."""
    from gemma4_t4.bench import BenchArgs, DecodeSpec, load_run
    from gemma4_t4.bench.schemas import CellSummary

    args = BenchArgs(
        base_url=vllm_server.base_url,
        model="tiny-gemma4",
        out_dir=str(tmp_path / "typed"),
        # 24 tokens: enough gaps for a per-stream rate even when vLLM's CPU build streams a few
        # tokens per chunk (a 6-token reply could arrive in one chunk: no rate, honestly None)
        spec=DecodeSpec(concurrency=[1, 2], input_len=64, output_len=24, num_prompts=3, warmup=1),
        **_opts(vllm_server),
    )
    run = run_benchmark(args)
    assert all(isinstance(c, CellSummary) for c in run.cells)
    c2 = run.cell(workload="decode", concurrency=2)
    assert c2.completed == 3 and c2.total_output_tokens == 72 and c2.prefix_cache.hits == 0
    # vLLM's CPU build streams most answers but may flush one whole: such a cell has no per-stream
    # rate and says why; every other cell has a positive one
    per_stream = run.per_stream_by_concurrency()
    assert set(per_stream) == {1, 2}
    for c in (1, 2):
        flushed = run.cell(workload="decode", concurrency=c).buffered
        assert (per_stream[c] is None) if flushed else (per_stream[c] or 0) > 0, (c, per_stream, flushed)
    assert [r["ok"] for r in run.table_rows()] == [3, 3]
    assert load_run(run.dir).cells == run.cells and load_run(run.dir).run == run.run
    answers = run_benchmark(
        vllm_server.base_url, "tiny-gemma4", "answers", tmp_path / "ans", output_len=6, progress=False
    )
    assert len(answers.answers()) == 20 and all(a.error is None for a in answers.answers())
    assert answers.cells[0].correct == sum(a.correct for a in answers.answers())


def test_series_decode_method_on_the_real_server(vllm_server, tmp_path):
    run = run_benchmark(
        vllm_server.base_url,
        "tiny-gemma4",
        "decode",
        tmp_path / "series",
        method="series",
        series_lens=[4, 24],
        input_len=64,
        num_prompts=3,
        warmup=1,
        **_opts(vllm_server),
    )
    short, long = run.cells
    assert (short.variant, long.variant) == ("series_short", "series_long")
    assert short.total_output_tokens == 3 * 4 and long.total_output_tokens == 3 * 24
    sd = run.run.series_decode
    assert sd.short_tokens == 4 and sd.long_tokens == 24 and sd.wall_short_ms > 0 and sd.wall_long_ms > 0
    # the method's arithmetic; whether the long median came out longer times this (shared) machine
    if sd.wall_long_ms > sd.wall_short_ms:
        assert sd.decode_tok_s == pytest.approx(20 / ((sd.wall_long_ms - sd.wall_short_ms) / 1000))
    else:
        assert sd.decode_tok_s is None  # no figure from a long request that came out faster
    # one sample per short/long pair, none from a pair whose long request came out faster (machine timing)
    assert len(sd.samples) <= 3 and all(s > 0 for s in sd.samples)


def test_two_local_endpoints_match_http_on_the_same_server(vllm_server, tiny_model_dir, tmp_path, capsys):
    """decode, answers and compare over sagemaker:// against two local endpoints (moto's control
    plane + the package's runtime stand-in -> vLLM's own /invocations) match the same workloads
    over HTTP against the same server: the same token counts, identical answers n/n."""
    from gemma4_t4.bench import load_run
    from gemma4_t4.bench.compare import compare_suites
    from gemma4_t4.cli import main as cli_main
    from gemma4_t4.sagemaker import DeployConfig, delete_endpoint, deploy
    from gemma4_t4.standins.local import LocalAWS

    decode = {
        "input_len": 64,
        "output_len": 6,
        "num_prompts": 3,
        "warmup": 1,
        "concurrency": [1, 2],
        "tokenizer": str(tiny_model_dir),
        "progress": False,
    }
    answers = {"output_len": 6, "progress": False}
    bases = {"http": vllm_server.base_url}
    with LocalAWS(runtime_backend=vllm_server.base_url) as aws:
        for name in ("tiny-a", "tiny-b"):
            deploy(DeployConfig(name=name, served_model_name="tiny-gemma4"), progress=False, poll_s=0)
            bases[name] = f"sagemaker://us-east-2/{name}"
        runs = {
            side: {
                "decode": run_benchmark(base, "tiny-gemma4", "decode", tmp_path / side / "decode", **decode),
                "answers": run_benchmark(
                    base, "tiny-gemma4", "answers", tmp_path / side / "answers", **answers
                ),
            }
            for side, base in bases.items()
        }
        assert aws.runtime.parts_sent > 0  # the sagemaker:// runs streamed through the runtime API
        capsys.readouterr()
        assert cli_main(["bench", "compare", str(tmp_path / "tiny-a"), str(tmp_path / "tiny-b")]) == 0
        printed = capsys.readouterr().out
        for name in ("tiny-a", "tiny-b"):
            delete_endpoint(name, "us-east-2")
    http = runs["http"]
    with_text = 0
    for side in ("tiny-a", "tiny-b"):
        d, a = runs[side]["decode"], runs[side]["answers"]
        assert d.status == "complete" and d.run.server.backend == "sagemaker"
        assert (
            d.run.base_url == bases[side] and load_run(tmp_path / side / "decode").run.base_url == bases[side]
        )
        assert [c.total_output_tokens for c in d.cells] == [
            c.total_output_tokens for c in http["decode"].cells
        ]
        assert [c.total_output_tokens for c in d.cells] == [18, 18]
        assert all(c.input_len_exact and c.failed == 0 and c.completed == 3 for c in d.cells)
        # a TTFT for every request whose stream carried text (a random tiny model can emit tokens
        # that detokenize to nothing yet, e.g. half a UTF-8 character; each run's prompts differ by
        # their nonce, and once all three of a cell's 6-token answers were empty)
        for c in d.cells:
            streamed_text = [r for r in d.measured(c.cell) if r.streamed and r.output_chars]
            assert c.ttft_ms.n == len(streamed_text), c.cell
            with_text += len(streamed_text)
        assert [x.text for x in a.answers()] == [x.text for x in http["answers"].answers()]
        assert compare_runs(http["answers"], a).answers.identical == 20
        headline = compare_suites(tmp_path / side, tmp_path / "http").headlines[0]
        assert headline.answers.identical == headline.answers.total == 20
        # a per-stream ratio where the server streamed its tokens; else named not measured (one flush, or
        # a random tiny model's three c=1 answers with no two timed tokens)
        assert (headline.decode_ratio is not None) != bool(headline.decode_not_measured), str(headline)
    assert with_text > 0  # some of the 12 sagemaker:// decode requests carried text, each with its TTFT
    (headline,) = compare_suites(tmp_path / "tiny-a", tmp_path / "tiny-b").headlines
    assert headline.answers.identical == headline.answers.total == 20
    assert "identical answers: 20/20" in printed
    if headline.decode_not_measured:
        assert headline.decode_ratio is None and all(why in printed for why in headline.decode_not_measured)
    else:
        assert headline.decode_ratio > 0 and "decode tok/s (per-stream c=1)" in printed
