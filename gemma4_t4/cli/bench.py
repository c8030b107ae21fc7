"""``gemma4-t4 bench``: run a serving benchmark, compare two runs, plot a run."""

from __future__ import annotations

import argparse

from gemma4_t4.cli import Output, add_command, add_group
from gemma4_t4.errors import Gemma4T4Error


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
    sub = add_group(subparsers, "bench", "serving benchmarks: run, compare, plot",
                    "Benchmark an OpenAI-compatible server (vLLM): decode throughput, TTFT vs input length, "
                    "prefix caching, identical answers. Results go to a directory "
                    "(records.jsonl, summary.json, summary.csv, PNG plots).")

    run = add_command(sub, "run", _run, help="run one workload against a live server")
    run.add_argument("--base-url", required=True, help="server root, e.g. http://127.0.0.1:8000")
    run.add_argument("--model", required=True, help="served model name")
    run.add_argument("--workload", required=True, choices=["decode", "ttft", "prefix", "answers"])
    run.add_argument("--out", required=True, help="results directory (must be new unless --overwrite)")
    run.add_argument("--api", choices=["completions", "chat"], default=None,
                     help="endpoint (default completions; answers default chat)")
    run.add_argument("--concurrency", type=_ints, default=None, help="e.g. 1,2,4,8,16 (decode default)")
    run.add_argument("--rate", type=_floats, default=None, metavar="REQ_PER_S",
                     help="decode: open-loop cells at these offered rates instead, e.g. 0.5,1,2")
    run.add_argument("--arrival", choices=["poisson", "constant"], default=None,
                     help="open loop: Poisson (default) or evenly spaced arrivals")
    run.add_argument("--max-in-flight", type=int, default=None, help="open loop: client cap (default 256)")
    run.add_argument("--sweep", type=int, default=None, metavar="N",
                     help="decode: measure one-at-a-time and all-at-once, then N open-loop rates in between")
    run.add_argument("--input-len", type=int, default=None, help="prompt tokens (ttft: one length)")
    run.add_argument("--input-lens", type=_ints, default=None, help="ttft lengths (default 256,...,4096)")
    run.add_argument("--output-len", type=int, default=None, help="output tokens (ignore_eos)")
    run.add_argument("--num-prompts", type=int, default=None, help="measured requests per cell")
    run.add_argument("--warmup", type=int, default=2, help="warm-up requests per cell (at least the concurrency)")
    run.add_argument("--prefix-len", type=int, default=None, help="prefix workload: shared tokens")
    run.add_argument("--groups", type=int, default=None, help="prefix workload: number of prefixes")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--nonce", default=None, help="reproduce a run's exact prompts (see its run.json)")
    run.add_argument("--max-num-seqs", type=int, default=None,
                     help="the server's max-num-seqs: cells above it are labelled queueing")
    run.add_argument("--gpu", default=None, help="GPU key for roofline and cost, e.g. t4, l4")
    run.add_argument("--bytes-per-token", type=float, default=None, help="bytes read per decoded token")
    run.add_argument("--model-format", default=None, help="bf16 | qat | emb4 (bytes per token lookup)")
    run.add_argument("--price", action="append", default=None, metavar="KEY",
                     help="price key from gemma4_t4.hardware.PRICES (repeatable)")
    run.add_argument("--tokenizer", default=None, help="local tokenizer path when the server has no /tokenize")
    run.add_argument("--api-key", default=None)
    run.add_argument("--label", default=None, help="a name for plots and comparisons")
    run.add_argument("--overwrite", action="store_true", help="replace results already in --out")
    run.add_argument("--no-plots", action="store_true")

    compare = add_command(sub, "compare", _compare, help="compare two results directories (B/A ratios)")
    compare.add_argument("a")
    compare.add_argument("b")
    compare.add_argument("--plot", default=None, metavar="PNG", help="also write A/B bars to this file")

    plot = add_command(sub, "plot", _plot, help="write the PNG plots of a results directory")
    plot.add_argument("dir")


def _run(args: argparse.Namespace) -> Output:
    from gemma4_t4.bench import plot_run, run_benchmark

    opts = {
        "concurrency": args.concurrency, "rates": args.rate, "arrival": args.arrival,
        "max_in_flight": args.max_in_flight, "sweep": args.sweep, "input_len": args.input_len,
        "input_lens": args.input_lens,
        "output_len": args.output_len, "num_prompts": args.num_prompts, "warmup": args.warmup,
        "prefix_len": args.prefix_len, "groups": args.groups, "seed": args.seed, "nonce": args.nonce,
        "max_num_seqs": args.max_num_seqs, "gpu": args.gpu, "bytes_per_token": args.bytes_per_token,
        "model_format": args.model_format, "price_keys": args.price, "tokenizer": args.tokenizer,
        "api_key": args.api_key, "label": args.label, "overwrite": args.overwrite, "progress": not args.json,
    }
    if args.api:
        opts["api"] = args.api
    opts = {k: v for k, v in opts.items() if v is not None}
    run = run_benchmark(args.base_url, args.model, args.workload, args.out, **opts)
    plots = [] if args.no_plots else plot_run(run)
    failed = run.failed
    ok = run.status == "complete"
    text = [run.table(), "", f"status: {run.status}; failed requests: {failed}", f"results: {run.dir}"]
    text += [f"plot: {p}" for p in plots]
    data = {"status": run.status, "dir": str(run.dir), "failed": failed, "cells": run.cells,
            "plots": [str(p) for p in plots]}
    return Output(data, "\n".join(text), exit_code=0 if ok else 1)


def _compare(args: argparse.Namespace) -> Output:
    from gemma4_t4.bench import compare_runs, plot_compare

    result = compare_runs(args.a, args.b)
    text = result.text()
    if args.plot:
        path = plot_compare(args.a, args.b, args.plot, comparison=result)
        text += f"\nplot: {path}" if path else "\nno comparable cells to plot"
    return Output(result, text)


def _plot(args: argparse.Namespace) -> Output:
    from gemma4_t4.bench import plot_run

    paths = plot_run(args.dir)
    if not paths:
        raise Gemma4T4Error(f"nothing to plot in {args.dir}", fix="run a decode, ttft or prefix workload first")
    return Output({"plots": [str(p) for p in paths]}, "\n".join(str(p) for p in paths))



