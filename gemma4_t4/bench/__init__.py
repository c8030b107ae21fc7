"""An exact, honest serving benchmark for OpenAI-compatible servers (vLLM first).

Notebook API::

    from gemma4_t4.bench import run_benchmark, load_run, plot_run, compare_runs
    run = run_benchmark("http://127.0.0.1:8000", "gemma-4-E2B-it", "decode", "results/t4-qat",
                        concurrency=[1, 8], input_len=512, output_len=128, gpu="t4")
    print(run.table()); plot_run(run); print(compare_runs("results/t4-bf16", run).text())

Metric definitions are in ``gemma4_t4.bench.metrics`` and docs/benchmarks.md.
"""

from __future__ import annotations

from gemma4_t4.bench.answers import AnswerComparison, compare_answers
from gemma4_t4.bench.compare import RunComparison, compare_runs
from gemma4_t4.bench.plots import plot_compare, plot_run
from gemma4_t4.bench.results import BenchRun, format_cells, load_run
from gemma4_t4.bench.workloads import WORKLOADS, BenchConfig, run_benchmark

__all__ = [
    "WORKLOADS",
    "AnswerComparison",
    "BenchConfig",
    "BenchRun",
    "RunComparison",
    "compare_answers",
    "compare_runs",
    "format_cells",
    "load_run",
    "plot_compare",
    "plot_run",
    "run_benchmark",
]
