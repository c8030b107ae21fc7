"""The ``bench run`` command line the bench tests start from (server, model and workload first)."""

from __future__ import annotations


def bench_run_argv(base_url: str, model: str, workload: str, *flags: str) -> list[str]:
    return ["bench", "run", "--base-url", base_url, "--model", model, "--workload", workload, *flags]
