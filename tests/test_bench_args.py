"""One BenchArgs for the CLI, the MCP tool and notebooks; the workload registry; the series'
decode method and load test; the T4-vs-L4 headline. Against the bench FAKE server."""

import inspect
import json
from typing import get_args

import pytest

from gemma4_t4.bench import BenchArgs, run_benchmark
from gemma4_t4.bench.args import METHODS, BenchOptions, flag_name, is_user_option
from gemma4_t4.bench.compare import compare_suites, published_decode
from gemma4_t4.bench.fake_server import FakeScript, FakeServer, FakeServerState
from gemma4_t4.bench.metrics import series_decode
from gemma4_t4.bench.schemas import RequestRecord
from gemma4_t4.bench.specs import SPECS
from gemma4_t4.bench.workloads import WORKLOAD_CHOICES, WORKLOADS, build_args
from gemma4_t4.cli import build_parser
from gemma4_t4.cli import main as cli_main
from gemma4_t4.cli.bench import bench_args
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.server_state import free_port


@pytest.fixture(scope="module")
def fake():
    with FakeServer(free_port(), FakeServerState(default=FakeScript(ttft_s=0.02, gap_s=0.004))) as server:
        yield server


def _parse(*argv):
    return build_parser().parse_args(["bench", "run", *argv])


def test_cli_flags_become_benchargs_fields_by_the_same_names(tmp_path):
    ns = _parse(
        "--base-url",
        "http://127.0.0.1:8000",
        "--model",
        "m",
        "--workload",
        "decode",
        "--out",
        str(tmp_path),
        "--rate",
        "1,2",
        "--price",
        "ec2:g4dn.xlarge",
        "--request-timeout",
        "30",
        "--concurrency",
        "1",
    )
    fields = bench_args(ns)
    unknown = set(fields) - set(BenchArgs.model_fields)
    assert not unknown, unknown  # every flag names a field
    args = BenchArgs(**fields)
    assert (args.out_dir, args.rates, args.price_keys, args.request_timeout_s) == (
        str(tmp_path),
        [1.0, 2.0],
        ["ec2:g4dn.xlarge"],
        30.0,
    )
    assert args.mode == "open_loop"


def test_mcp_tool_parameters_are_benchargs_fields_and_one_spec():
    from gemma4_t4.bench.specs import AnySpec
    from gemma4_t4.mcp_server import run_benchmark as tool

    params = inspect.signature(tool, eval_str=True).parameters
    where = set(params) - {"spec"}
    assert where <= set(BenchArgs.model_fields), where - set(BenchArgs.model_fields)
    assert params["spec"].annotation == AnySpec | None


def _run_parser():
    parser = build_parser()
    bench = next(a for a in parser._subparsers._group_actions if "bench" in a.choices).choices["bench"]
    return next(a for a in bench._subparsers._group_actions if "run" in a.choices).choices["run"]


# what the command itself does around the run (not benchmark options)
COMMAND_FLAGS = {"help", "json", "debug", "no_plots"}


def test_every_user_option_has_exactly_one_generated_flag():
    actions = [a for a in _run_parser()._actions if a.dest not in COMMAND_FLAGS]
    by_field = {}
    for action in actions:
        assert action.dest in BenchOptions.model_fields, f"{action.option_strings} names no field"
        by_field.setdefault(action.dest, []).extend(action.option_strings)
    users = {name for name in BenchOptions.model_fields if is_user_option(name)}
    assert users == set(by_field), users ^ set(by_field)
    for name, flags in by_field.items():
        assert flags == [flag_name(name)], (name, flags)
        assert BenchOptions.model_fields[name].description, f"{name} has no help"
    # not user options, by their own metadata: the program sets them
    assert set(BenchOptions.model_fields) - users == {"server_launch", "progress"}
    assert BenchArgs.model_fields.keys() == BenchOptions.model_fields.keys()  # BenchArgs adds rules only


def test_every_flag_spelt_before_still_parses():
    spelt = {
        "--base-url",
        "--model",
        "--workload",
        "--method",
        "--series-lens",
        "--request-timeout",
        "--out",
        "--api",
        "--concurrency",
        "--rate",
        "--arrival",
        "--max-in-flight",
        "--sweep",
        "--input-len",
        "--input-lens",
        "--output-len",
        "--num-prompts",
        "--warmup",
        "--prefix-len",
        "--groups",
        "--seed",
        "--nonce",
        "--max-num-seqs",
        "--gpu",
        "--bytes-per-token",
        "--model-format",
        "--price",
        "--tokenizer",
        "--api-key",
        "--label",
        "--overwrite",
        "--no-plots",
        "--json",
        "--debug",
    }
    known = {flag for action in _run_parser()._actions for flag in action.option_strings}
    assert spelt <= known, spelt - known


def test_generated_flags_follow_the_field_types(tmp_path):
    base = ("--base-url", "http://127.0.0.1:8000", "--model", "m", "--out", str(tmp_path))
    ns = _parse(
        *base,
        "--workload",
        "ttft",
        "--input-lens",
        "16,32",
        "--price",
        "a",
        "--price",
        "b",
        "--api",
        "chat",
        "--bytes-per-token",
        "1.5",
        "--no-sample-metrics",
        "--overwrite",
        "--api-key",
        "k",
    )
    fields = bench_args(ns)
    assert (fields["input_lens"], fields["price_keys"], fields["api"]) == ([16, 32], ["a", "b"], "chat")
    assert (fields["bytes_per_token"], fields["sample_metrics"], fields["overwrite"]) == (1.5, False, True)
    assert BenchArgs(**fields).api_key.get_secret_value() == "k"
    plain = bench_args(_parse(*base, "--workload", "decode"))
    # a flag not given leaves its field to BenchArgs (workload-dependent defaults)
    assert "input_len" not in plain and "warmup" not in plain and plain["sample_metrics"] is True
    for bad in (
        ("--workload", "nope"),
        ("--workload", "decode", "--arrival", "burst"),
        ("--workload", "decode", "--concurrency", "1,x"),
        ("--workload", "decode", "--seed", "s"),
    ):
        with pytest.raises(SystemExit):
            _parse(*base, *bad)
    required = {a.dest for a in _run_parser()._actions if a.required}
    assert required == {n for n, f in BenchOptions.model_fields.items() if f.is_required()}


def test_help_reads_from_the_field_descriptions(capsys):
    with pytest.raises(SystemExit):
        cli_main(["bench", "run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for phrase in (
        "--out DIR results directory",
        "--rate REQ_PER_S",
        "--concurrency N,...",
        "--workload {decode,ttft,prefix,answers,load}",
        "--price KEY price key",
        "--request-timeout S a request not finished after S seconds fails as 'timeout' (default 600)",
        "--no-sample-metrics turn off: sample the server's /metrics",
    ):
        assert phrase in text, phrase


def test_every_spec_field_is_a_benchargs_field_of_the_same_type():
    for spec in SPECS:
        for name, field in spec.model_fields.items():
            if name == "kind":
                continue
            assert name in BenchArgs.model_fields, f"{spec.__name__}.{name} is not a BenchArgs field"
            declared = BenchArgs.model_fields[name].annotation
            # a spec may require what BenchArgs leaves optional (OpenLoopSpec.rates), nothing else
            assert field.annotation in (declared, *get_args(declared)), (
                spec.__name__,
                name,
                field.annotation,
            )
        assert spec.workload in WORKLOAD_CHOICES and spec.method in METHODS


def test_defaults_follow_the_workload_and_bad_values_name_the_fix(tmp_path):
    base = ("http://127.0.0.1:8000", "m")
    answers = build_args(*base, "answers", tmp_path)
    assert (answers.api, answers.concurrency, answers.output_len) == ("chat", [1], 32)
    ttft = build_args(*base, "ttft", tmp_path, input_len=300)
    assert ttft.input_lens == [300] and ttft.api == "completions"
    prefix = build_args(*base, "prefix", tmp_path, input_len=400)
    assert (prefix.prefix_len, prefix.groups, prefix.num_prompts) == (300, 4, 32)
    series = build_args(*base, "decode", tmp_path, method="series")
    assert (series.mode, series.series_lens, series.num_prompts, series.concurrency) == (
        "series_decode",
        [16, 512],
        8,
        [1],
    )
    load = build_args(*base, "load", tmp_path)
    assert (load.concurrency, load.output_len) == ([1, 2, 4, 8, 16], 256)
    # a dumped BenchArgs validates again to the same (nothing hidden outside the fields)
    for args in (answers, ttft, prefix, series, load, build_args(*base, "decode", tmp_path, sweep=2)):
        assert BenchArgs.model_validate(args.model_dump()) == args
    for opts, match in [
        ({"method": "series", "rates": [1.0]}, "series"),
        ({"series_lens": [512, 16], "method": "series"}, "SHORT,LONG"),
        ({"concurrency": [0]}, "at least 1"),
        ({"warmup": -1}, "negative"),
        ({"request_timeout_s": -2}, "request-timeout"),
    ]:
        with pytest.raises(Gemma4T4Error, match=match) as err:
            build_args(*base, "decode", tmp_path, **opts)
        assert err.value.fix
    assert set(WORKLOAD_CHOICES) < set(WORKLOADS) and {"open_loop", "sweep", "series_decode"} <= set(
        WORKLOADS
    )


def test_series_decode_metric_is_the_wall_time_difference():
    def rec(i, wall_s):
        return RequestRecord(
            request_id=f"r{i}",
            send_s=0.0,
            first_content_s=0.05,
            last_choice_s=wall_s,
            end_s=wall_s,
            chunk_times_s=[0.05, wall_s],
            completion_tokens=2,
        )

    short = [rec(0, 0.20), rec(1, 0.22), rec(2, 0.21)]
    long = [rec(3, 5.16), rec(4, 5.21), rec(5, 5.17)]
    sd = series_decode(short, long, 16, 512)
    assert sd.wall_short_ms == pytest.approx(210) and sd.wall_long_ms == pytest.approx(5170)
    assert sd.decode_tok_s == pytest.approx(496 / 4.96)  # 100 tok/s
    assert sd.ci_low <= sd.decode_tok_s <= sd.ci_high and len(sd.samples) == 3
    assert series_decode(short, [], 16, 512).decode_tok_s is None
    assert series_decode(long, short, 16, 512).decode_tok_s is None  # long faster than short: no figure


def test_series_method_and_load_test_on_the_fake_server(fake, tmp_path, capsys):
    code = cli_main(
        [
            "bench",
            "run",
            "--base-url",
            fake.base_url,
            "--model",
            "fake-model",
            "--workload",
            "decode",
            "--method",
            "series",
            "--series-lens",
            "4,20",
            "--input-len",
            "32",
            "--out",
            str(tmp_path / "series"),
            "--no-plots",
            "--json",
        ]
    )
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    sd = data["run"]["series_decode"]
    # (20 - 4) tokens over the median walls' difference; the long requests wait >= 16 x 4 ms more
    # than the fake's first token (how close to 250 tok/s it comes out times this machine: not asserted)
    assert sd["wall_long_ms"] >= 16 * 4.0 and sd["wall_long_ms"] > sd["wall_short_ms"]
    assert sd["decode_tok_s"] == pytest.approx(16 / ((sd["wall_long_ms"] - sd["wall_short_ms"]) / 1000))
    assert [c["num_prompts"] for c in data["cells"]] == [8, 8] and [
        c["concurrency"] for c in data["cells"]
    ] == [1, 1]
    load = run_benchmark(
        fake.base_url,
        "fake-model",
        "load",
        tmp_path / "load",
        concurrency=[1, 4],
        input_len=32,
        output_len=8,
        warmup=0,
        progress=False,
    )
    assert [c.concurrency for c in load.cells] == [1, 4] and [c.completed for c in load.cells] == [1, 4]
    records = load.measured(load.cells[1].cell)
    assert len({r.prompt_tokens for r in records}) == 1 and load.cells[1].meta == {"shared_prompt": True}
    assert set(load.throughput_by_concurrency()) == {1, 4}


def test_compare_headline_per_model_with_the_published_row(tmp_path, capsys):
    slow = FakeServerState(default=FakeScript(ttft_s=0.02, gap_s=0.008))
    fast = FakeServerState(default=FakeScript(ttft_s=0.01, gap_s=0.004))
    for side, state in (("t4", slow), ("l4", fast)):
        with FakeServer(free_port(), state, model="gemma-4-E2B-it") as server:
            for workload, extra in (
                ("decode", {"method": "series", "series_lens": [4, 36], "num_prompts": 4}),
                ("answers", {"output_len": 4}),
            ):
                run_benchmark(
                    server.base_url,
                    "gemma-4-E2B-it",
                    workload,
                    tmp_path / side / workload,
                    input_len=32,
                    warmup=0,
                    gpu=side,
                    progress=False,
                    **extra,
                )
    suite = compare_suites(tmp_path / "t4", tmp_path / "l4")
    (h,) = suite.headlines
    assert h.model == "gemma-4-E2B-it" and h.decode_method == "series"
    # A/B of the series' per-pair decode speeds (8 vs 4 ms a token injected; the size of the ratio
    # times this machine, so only its arithmetic is asserted)
    assert h.decode_ratio == pytest.approx(h.decode_a / h.decode_b) and h.decode_ci_low <= h.decode_ci_high
    assert h.answers.identical == 20 and h.published.published and h.published.t4_tok_s == 108.5
    capsys.readouterr()
    assert cli_main(["bench", "compare", str(tmp_path / "t4"), str(tmp_path / "l4")]) == 0
    text = capsys.readouterr().out
    assert "decode tok/s (series)" in text and "identical answers: 20/20" in text
    assert "published (gemma-4-E2B emb4, not our measurement)" in text
    assert published_decode("some-other-model") is None


def test_notebook_benchmark_calls_are_typed_specs_run_on_an_endpoint():
    """The notebooks benchmark through ``run(endpoint, SPEC, out_dir, ...)`` only: no keyword bag of
    BenchArgs fields, every spec built from its own class (whose fields the signature check binds)."""
    import ast
    import inspect
    from pathlib import Path

    from gemma4_t4.bench import specs

    spec_names = {s.__name__ for s in specs.SPECS}
    run_params = set(inspect.signature(specs.run).parameters)
    runs = built = 0
    for path in sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] != "code":
                continue
            source = "".join(line for line in cell["source"] if not line.lstrip().startswith(("%", "!")))
            for node in ast.walk(ast.parse(source)):
                name = getattr(getattr(node, "func", None), "id", None)
                if isinstance(node, ast.Call) and name == "run_benchmark":
                    raise AssertionError(f"{path.name}: run_benchmark(**options) instead of run(endpoint, spec, ...)")
                if isinstance(node, ast.Call) and name == "run":
                    runs += 1
                    assert len(node.args) == 3 and {k.arg for k in node.keywords} <= run_params, ast.unparse(node)
                if isinstance(node, ast.Call) and name in spec_names:
                    built += 1
    assert runs >= 8 and built >= 5, (runs, built)
