"""``gemma4-t4 bench``: run a serving benchmark, compare two runs, plot a run."""

from __future__ import annotations

import argparse

from gemma4_t4.cli import Output, add_command, add_group
from gemma4_t4.errors import Gemma4T4Error

WORKLOAD_CHOICES = (
    "decode",
    "ttft",
    "prefix",
    "answers",
    "load",
)  # gemma4_t4.bench.workloads (not imported: start-up)
# argparse dest -> BenchArgs field, where the flag's name differs from the field's
_RENAMED = {"out": "out_dir", "rate": "rates", "price": "price_keys", "request_timeout": "request_timeout_s"}
_NOT_ARGS = ("json", "no_plots", "debug", "_handler", "command", "bench_command")


def _comma_list(cast, what: str):
    """An argparse type for "1,2,4": a list of ``cast`` values, at least one."""

    def parse(text: str) -> list:
        try:
            values = [cast(v) for v in text.split(",") if v.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated {what}s, got {text!r}") from None
        if not values:
            raise argparse.ArgumentTypeError(f"expected at least one {what}")
        return values

    return parse


_ints = _comma_list(int, "integer")
_floats = _comma_list(float, "number")


def register(subparsers: argparse._SubParsersAction) -> None:
    sub = add_group(
        subparsers,
        "bench",
        "serving benchmarks: run, compare, plot",
        "Benchmark an OpenAI-compatible server (vLLM) or a SageMaker endpoint: decode throughput, "
        "TTFT vs input length, prefix caching, identical answers. Results go to a directory "
        "(records.jsonl, summary.json, summary.csv, PNG plots).",
    )

    run = add_command(
        sub,
        "run",
        _run,
        help="run one workload against a live server or SageMaker endpoint",
        description="Run one workload against a live server. --base-url is either an "
        "OpenAI-compatible server root (http://HOST:PORT) or a SageMaker endpoint, "
        "sagemaker://REGION/ENDPOINT: requests then go through boto3's sagemaker-runtime "
        "invoke_endpoint_with_response_stream (invoke_endpoint where the endpoint cannot "
        "stream), signed with your AWS credentials; pass --tokenizer for exact prompt "
        "lengths. AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME redirects the runtime (a local "
        "stand-in).",
    )
    run.add_argument(
        "--base-url",
        required=True,
        help="http://HOST:PORT (OpenAI-compatible) or sagemaker://REGION/ENDPOINT",
    )
    run.add_argument("--model", required=True, help="served model name")
    run.add_argument(
        "--workload",
        required=True,
        choices=list(WORKLOAD_CHOICES),
        help="decode | ttft | prefix | answers | load (the series' load test, c=1..16, one prompt)",
    )
    run.add_argument(
        "--method",
        choices=["vllm", "series"],
        default=None,
        help="decode: 'series' = the series' method, (512-16)/(wall512 - wall16), 8 prompts at c=1",
    )
    run.add_argument(
        "--series-lens",
        type=_ints,
        default=None,
        metavar="SHORT,LONG",
        help="series decode: the two output lengths (default 16,512)",
    )
    run.add_argument(
        "--request-timeout",
        type=float,
        default=None,
        metavar="S",
        help="a request not finished after S seconds fails as 'timeout' (default 600)",
    )
    run.add_argument("--out", required=True, help="results directory (must be new unless --overwrite)")
    run.add_argument(
        "--api",
        choices=["completions", "chat"],
        default=None,
        help="endpoint (default completions; answers default chat)",
    )
    run.add_argument("--concurrency", type=_ints, default=None, help="e.g. 1,2,4,8,16 (decode default)")
    run.add_argument(
        "--rate",
        type=_floats,
        default=None,
        metavar="REQ_PER_S",
        help="decode: open-loop cells at these offered rates instead, e.g. 0.5,1,2",
    )
    run.add_argument(
        "--arrival",
        choices=["poisson", "constant"],
        default=None,
        help="open loop: Poisson (default) or evenly spaced arrivals",
    )
    run.add_argument("--max-in-flight", type=int, default=None, help="open loop: client cap (default 256)")
    run.add_argument(
        "--sweep",
        type=int,
        default=None,
        metavar="N",
        help="decode: measure one-at-a-time and all-at-once, then N open-loop rates in between",
    )
    run.add_argument("--input-len", type=int, default=None, help="prompt tokens (ttft: one length)")
    run.add_argument("--input-lens", type=_ints, default=None, help="ttft lengths (default 256,...,4096)")
    run.add_argument("--output-len", type=int, default=None, help="output tokens (ignore_eos)")
    run.add_argument("--num-prompts", type=int, default=None, help="measured requests per cell")
    run.add_argument(
        "--warmup", type=int, default=2, help="warm-up requests per cell (at least the concurrency)"
    )
    run.add_argument("--prefix-len", type=int, default=None, help="prefix workload: shared tokens")
    run.add_argument("--groups", type=int, default=None, help="prefix workload: number of prefixes")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--nonce", default=None, help="reproduce a run's exact prompts (see its run.json)")
    run.add_argument(
        "--max-num-seqs",
        type=int,
        default=None,
        help="the server's max-num-seqs: cells above it are labelled queueing",
    )
    run.add_argument("--gpu", default=None, help="GPU key for roofline and cost, e.g. t4, l4")
    run.add_argument("--bytes-per-token", type=float, default=None, help="bytes read per decoded token")
    run.add_argument("--model-format", default=None, help="bf16 | qat | emb4 (bytes per token lookup)")
    run.add_argument(
        "--price",
        action="append",
        default=None,
        metavar="KEY",
        help="price key from gemma4_t4.hardware.PRICES (repeatable)",
    )
    run.add_argument(
        "--tokenizer", default=None, help="local tokenizer path when the server has no /tokenize"
    )
    run.add_argument("--api-key", default=None)
    run.add_argument("--label", default=None, help="a name for plots and comparisons")
    run.add_argument("--overwrite", action="store_true", help="replace results already in --out")
    run.add_argument("--no-plots", action="store_true")

    compare = add_command(
        sub,
        "compare",
        _compare,
        help="compare two results (B/A ratios; T4 vs L4 headline)",
        description="Compare two results directories cell by cell (B/A ratios with bootstrap "
        "intervals). Each of A and B may also be a folder of runs (e.g. one decode "
        "and one answers run per endpoint): then a headline per model is added — "
        "decode ratio with an interval, TTFT ratio, identical answers n/N with the "
        "first divergence, $/Mtok on each, and the series' published row.",
    )
    compare.add_argument("a", help="results directory (or a folder of them), e.g. the T4 run")
    compare.add_argument("b", help="results directory (or a folder of them), e.g. the L4 run")
    compare.add_argument("--plot", default=None, metavar="PNG", help="also write A/B bars to this file")

    plot = add_command(sub, "plot", _plot, help="write the PNG plots of a results directory")
    plot.add_argument("dir")


def bench_args(args: argparse.Namespace) -> dict:
    """BenchArgs fields from the parsed flags: the same names (a few flags are spelt shorter)."""
    fields = {
        _RENAMED.get(k, k): v for k, v in vars(args).items() if k not in _NOT_ARGS and not k.startswith("_")
    }
    fields["progress"] = not args.json
    return {k: v for k, v in fields.items() if v is not None}


def _run(args: argparse.Namespace) -> Output:
    from gemma4_t4.bench import plot_run, run_benchmark
    from gemma4_t4.bench.workloads import BenchArgs

    fields = bench_args(args)
    known = set(BenchArgs.model_fields)
    run = run_benchmark(
        fields.pop("base_url"),
        fields.pop("model"),
        fields.pop("workload"),
        fields.pop("out_dir"),
        **{k: v for k, v in fields.items() if k in known},
    )
    plots = [] if args.no_plots else plot_run(run)
    failed = run.failed
    ok = run.status == "complete"
    text = [run.table(), "", f"status: {run.status}; failed requests: {failed}", f"results: {run.dir}"]
    if run.run.series_decode and run.run.series_decode.decode_tok_s:
        sd = run.run.series_decode
        interval = f" [{sd.ci_low:.1f}, {sd.ci_high:.1f}]" if sd.ci_low is not None else ""
        text.insert(
            1,
            f"series decode: {sd.decode_tok_s:.1f} tok/s{interval} "
            f"= ({sd.long_tokens}-{sd.short_tokens}) / (wall{sd.long_tokens} - wall{sd.short_tokens})",
        )
    if run.run.error:
        text.append(f"stopped: {run.run.error}")
    text += [f"plot: {p}" for p in plots]
    data = {
        "status": run.status,
        "dir": str(run.dir),
        "failed": failed,
        "cells": [c.to_json() for c in run.cells],
        "plots": [str(p) for p in plots],
        "run": run.run.to_json(),
    }
    return Output(data, "\n".join(text), exit_code=0 if ok else 1)


def _compare(args: argparse.Namespace) -> Output:
    from gemma4_t4.bench import compare_runs, plot_compare
    from gemma4_t4.bench.compare import compare_suites, is_suite
    from gemma4_t4.figures import check_plot_path

    if args.plot:
        check_plot_path(args.plot)  # before any work: a bad name is refused, not found out at the end
    if is_suite(args.a) or is_suite(args.b):
        result = compare_suites(args.a, args.b)
        text = result.text()
    else:
        result = compare_runs(args.a, args.b)
        text = result.text()
        if args.plot:
            path = plot_compare(args.a, args.b, args.plot, comparison=result)
            text += f"\nplot: {path}" if path else "\nno comparable cells to plot"
    # exit 0 only for a real comparison: nothing matched, or a run that did not complete, is a failure
    problems = result.problems
    if problems:
        text += "\n\nnot a complete comparison:\n" + "\n".join(f"  {p}" for p in problems)
    return Output(result, text, exit_code=1 if problems else 0)


def _plot(args: argparse.Namespace) -> Output:
    from gemma4_t4.bench import plot_run

    paths = plot_run(args.dir)
    if not paths:
        raise Gemma4T4Error(
            f"nothing to plot in {args.dir}", fix="run a decode, ttft or prefix workload first"
        )
    return Output({"plots": [str(p) for p in paths]}, "\n".join(str(p) for p in paths))
