"""An exact, honest serving benchmark for OpenAI-compatible servers (vLLM first).

Notebook API::

    from gemma4_t4.bench import run_benchmark, load_run, plot_run, compare_runs
    run = run_benchmark("http://127.0.0.1:8000", "gemma-4-E2B-it", "decode", "results/t4-qat",
                        concurrency=[1, 8], input_len=512, output_len=128, gpu="t4")
    print(run.table()); plot_run(run); print(compare_runs("results/t4-bf16", run).text())
    run.per_stream_by_concurrency(); run.cell(workload="decode", concurrency=8).ttft_ms.median

``base_url`` may also be ``sagemaker://REGION/ENDPOINT`` (see ``gemma4_t4.bench.backends``).

Metric definitions are in ``gemma4_t4.bench.metrics`` and docs/benchmarks.md.
"""

from __future__ import annotations

import importlib
from typing import Any

# names -> defining module, imported on first use: importing the package (e.g. for its schemas)
# stays cheap; aiohttp, boto3 and matplotlib load only when a run, a backend or a plot needs them
_EXPORTS = {
    "WORKLOADS": "workloads",
    "BenchArgs": "workloads",
    "run_benchmark": "workloads",
    "AnswerComparison": "answers",
    "compare_answers": "answers",
    "RunComparison": "compare",
    "compare_runs": "compare",
    "compare_suites": "compare",
    "plot_compare": "plots",
    "plot_run": "plots",
    "BenchRun": "results",
    "format_cells": "results",
    "load_run": "results",
    "CellSummary": "schemas",
    "RequestRecord": "schemas",
    "RunInfo": "schemas",
    "RunReport": "schemas",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f"gemma4_t4.bench.{_EXPORTS[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'gemma4_t4.bench' has no attribute {name!r}")
