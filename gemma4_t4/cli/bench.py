"""``gemma4-t4 bench``: run a serving benchmark, compare two runs, plot a run."""

from __future__ import annotations

import argparse
import os

from pydantic.fields import FieldInfo

# the declarations alone (pydantic): the benchmark's client loads only when a run starts
from gemma4_t4.bench.args import API_KEY_ENV, METHODS, BenchOptions, is_user_option
from gemma4_t4.bench.compare import compare_suites, is_suite
from gemma4_t4.bench.registry import REGISTRY
from gemma4_t4.cli import Output, add_command, add_group
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation.figures import check_plot_path
from gemma4_t4.foundation.launch_record import add_setting_flags


def workload_fields() -> dict[str, tuple[FieldInfo, list[str]]]:
    """Every registered workload's fields: name -> (its declaration, the workloads that take it)."""
    fields: dict[str, tuple[FieldInfo, list[str]]] = {}
    for kind, spec in REGISTRY.items():
        for name, info in spec.model_fields.items():
            if name != "kind":
                fields.setdefault(name, (info, []))[1].append(kind)
    return fields


def option_flags(parser: argparse.ArgumentParser) -> None:
    """Add one flag per run option (BenchOptions) and per workload field (the registry) to
    ``parser``, ``--workload`` choosing among the registered workloads."""
    add_setting_flags(parser, {name: info for name, info in BenchOptions.model_fields.items() if is_user_option(name)})
    parser.add_argument(
        "--workload", required=True, choices=list(REGISTRY),
        help="what to measure (--workload decode with --rate is open_loop, with --sweep a sweep, with "
        "--method series series_decode); the [list] after a flag's help names the workloads that take it",
    )
    parser.add_argument(
        "--method", choices=list(METHODS),
        help="decode: 'series' = the series' method, (L-S)/(wall_L - wall_S), 8 prompts at c=1",
    )
    fields = workload_fields()
    add_setting_flags(parser, {name: info for name, (info, _) in fields.items()}, notes={
        name: " [every workload]" if len(kinds) == len(REGISTRY) else f" [{', '.join(kinds)}]"
        for name, (_, kinds) in fields.items()})


def register(subparsers: argparse._SubParsersAction) -> None:
    sub = add_group(
        subparsers, "bench", "serving benchmarks: run, compare, plot",
        "Benchmark an OpenAI-compatible server (vLLM) or a SageMaker endpoint: decode throughput, "
        "TTFT vs input length, prefix caching, identical answers. Results go to a directory "
        "(records.jsonl, summary.json, summary.csv, PNG plots).",
    )

    run = add_command(sub, "run", _run, help="run one workload against a live server or SageMaker endpoint",
                      description="Run one workload against a live server. --base-url is either an "
                      "OpenAI-compatible server root (http://HOST:PORT) or a SageMaker endpoint, "
                      "sagemaker://REGION/ENDPOINT: requests then go through boto3's sagemaker-runtime "
                      "invoke_endpoint_with_response_stream (invoke_endpoint where the endpoint cannot "
                      "stream), signed with your AWS credentials; pass --tokenizer for exact prompt "
                      "lengths. AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME redirects the runtime (a local "
                      "stand-in).")
    option_flags(run)
    run.add_argument("--no-plots", action="store_true", help="do not write the PNG plots after the run")

    compare = add_command(
        sub, "compare", _compare, help="compare two results (B/A ratios; T4 vs L4 headline)",
        description="Compare two results directories cell by cell (B/A ratios with bootstrap "
        "intervals). Each of A and B may also be a folder of runs (e.g. one decode "
        "and one answers run per endpoint): then a headline per model is added — "
        "decode ratio with an interval, TTFT ratio, identical answers n/N with the "
        "first divergence, $/Mtok on each, and the series' published row.",
    )
    compare.add_argument("a", help="results directory (or a folder of them), e.g. the T4 run")
    compare.add_argument("b", help="results directory (or a folder of them), e.g. the L4 run")
    compare.add_argument("--plot", metavar="PNG", help="also write A/B bars to this file")

    plot = add_command(sub, "plot", _plot, help="write the PNG plots of a results directory")
    plot.add_argument("dir")


def bench_args(args: argparse.Namespace) -> dict[str, object]:
    """Run options and workload fields from the parsed flags (each flag's dest is its field's
    name); a flag not given leaves its field to the workload's (or the run's) default."""
    names = set(BenchOptions.model_fields) | set(workload_fields()) | {"workload", "method"}
    fields = {k: v for k, v in vars(args).items() if k in names and v is not None}
    if "api_key" not in fields and os.environ.get(API_KEY_ENV):  # the key without it showing in ps
        fields["api_key"] = os.environ[API_KEY_ENV]
    fields["progress"] = not args.json
    return fields


def _run(args: argparse.Namespace) -> Output:
    # lazy: plots (matplotlib) load only for the bench command, not for every CLI start-up
    from gemma4_t4.bench import plot_run, run_benchmark

    fields = bench_args(args)
    run = run_benchmark(
        fields.pop("base_url"), fields.pop("model"), fields.pop("workload"), fields.pop("out_dir"), **fields
    )
    plots = [] if args.no_plots else plot_run(run)
    text = [run.table(), "", f"status: {run.status}; failed requests: {run.failed}", f"results: {run.dir}"]
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
        "status": run.status, "dir": str(run.dir), "failed": run.failed,
        "cells": [c.to_json() for c in run.cells], "plots": [str(p) for p in plots], "run": run.run.to_json(),
    }
    return Output(data, "\n".join(text), exit_code=0 if run.status == "complete" else 1)


def _compare(args: argparse.Namespace) -> Output:
    # lazy: plots (matplotlib) load only for bench compare, not for every CLI start-up
    from gemma4_t4.bench import compare_runs, plot_compare

    if args.plot:
        check_plot_path(args.plot)  # before any work: a bad name is refused, not found out at the end
    suites = is_suite(args.a) or is_suite(args.b)
    result = compare_suites(args.a, args.b) if suites else compare_runs(args.a, args.b)
    text = str(result)
    if args.plot and not suites:  # a folder of runs has no one pair of cells to plot
        path = plot_compare(args.a, args.b, args.plot, comparison=result)
        text += f"\nplot: {path}" if path else "\nno comparable cells to plot"
    # exit 0 only for a real comparison: nothing matched, or a run that did not complete, is a failure
    problems = result.problems
    if problems:
        text += "\n\nnot a complete comparison:\n" + "\n".join(f"  {p}" for p in problems)
    return Output(result, text, exit_code=1 if problems else 0)


def _plot(args: argparse.Namespace) -> Output:
    # lazy: plots (matplotlib) load only for bench plot, not for every CLI start-up
    from gemma4_t4.bench import plot_run

    paths = plot_run(args.dir)
    if not paths:
        raise Gemma4T4Error(
            f"nothing to plot in {args.dir}", fix="run a decode, ttft or prefix workload first"
        )
    return Output({"plots": [str(p) for p in paths]}, "\n".join(str(p) for p in paths))
