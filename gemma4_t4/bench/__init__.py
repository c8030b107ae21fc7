"""An exact, honest serving benchmark for OpenAI-compatible servers (vLLM first).

Notebook API: a typed spec says what to measure, an endpoint (``gemma4_t4.venues.endpoint``) where::

    from gemma4_t4 import bench, notebook as nb
    decode = bench.DecodeSpec(concurrency=[1, 8], input_len=512, output_len=128)  # refused here if wrong
    with nb.endpoint("t4", "google/gemma-4-E2B-it", "work", name="gemma4") as endpoint:
        result = bench.run(endpoint, decode, "results/t4-qat")
    print(result.table()); bench.plot_run(result); print(bench.compare_runs("results/t4-bf16", result))
    result.per_stream_by_concurrency(); result.cell(workload="decode", concurrency=8).ttft_ms.median

``run_benchmark(base_url, model, workload, out_dir, **fields)`` is the same run from ``BenchArgs``
fields (the CLI's ``bench run``).
``base_url`` may also be ``sagemaker://REGION/ENDPOINT`` (see ``gemma4_t4.bench.backends``).

Metric definitions are in ``gemma4_t4.bench.metrics`` and docs/benchmarks.md.
"""

from __future__ import annotations

import importlib
from typing import Any

# the workload classes register themselves when their module is read: read it with the package, so
# that the registry is whole whichever bench module a caller imports (pydantic only, no client)
from gemma4_t4.bench import specs as _workloads  # noqa: F401

# names -> defining module, imported on first use: importing the package (e.g. for its schemas)
# stays cheap; aiohttp, boto3 and matplotlib load only when a run, a backend or a plot needs them
_EXPORTS = {
    name: module
    for module, names in {
        "registry": ("REGISTRY", "workload"),
        "workloads": ("BenchArgs", "run_benchmark"),
        "answers": ("AnswerComparison", "compare_answers"),
        "compare": ("RunComparison", "compare_runs", "compare_suites"),
        "plots": ("plot_compare", "plot_run"),
        "results": ("BenchRun", "load_run"),
        "schemas": ("CellSummary", "RequestRecord", "RunInfo", "RunReport"),
        "specs": ("run", "AnswersSpec", "DecodeSpec", "LoadSpec", "OpenLoopSpec", "PrefixSpec",
                  "SeriesDecodeSpec", "SweepSpec", "TTFTSpec"),
    }.items()
    for name in names
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f"gemma4_t4.bench.{_EXPORTS[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'gemma4_t4.bench' has no attribute {name!r}")
