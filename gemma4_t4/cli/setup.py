"""``gemma4-t4 setup [--dry-run]``: install the vLLM + torch build this host's GPU and driver run."""

from __future__ import annotations

import argparse

from gemma4_t4.cli import Output, add_command


def _setup(args: argparse.Namespace) -> Output:
    from gemma4_t4 import env
    from gemma4_t4.jsonable import to_jsonable
    from gemma4_t4.setup import apply_setup, plan_setup

    # a shell command: nothing is loaded yet in the Python that will use the install
    plan = plan_setup(env.probe(), vllm_version=args.vllm)
    data = to_jsonable(plan) | {"commands": plan.commands, "index_urls": plan.index_urls,
                                "dry_run": args.dry_run, "applied": False}
    if args.dry_run or not plan.needed:
        hint = "\n(dry run: nothing installed; run without --dry-run to install)" if plan.needed else ""
        return Output(data, plan.summary() + hint)
    result = apply_setup(plan)
    data.update(applied=result.applied, restart=result.restart, message=result.message,
                output_tail=result.output_tail)
    return Output(data, plan.summary() + "\n" + result.message)


def register(subparsers: argparse._SubParsersAction) -> None:
    from gemma4_t4.setup import PROVEN_VLLM

    p = add_command(subparsers, "setup", _setup,
                    "install the vLLM and torch builds this host runs (GPU, driver, Colab aware)",
                    description="Read the host (GPU, compute capability, driver, Colab, installed torch/vLLM) "
                    f"and install vLLM {PROVEN_VLLM} in the CUDA build the driver runs (cu130 for driver >= 580, "
                    "else vLLM's CUDA 12 build), with the matching torch from PyTorch's index; vLLM's CPU "
                    "build where there is no GPU. --dry-run prints the exact pip commands and indexes.")
    p.add_argument("--dry-run", action="store_true", help="print the plan and its pip commands; install nothing")
    p.add_argument("--vllm", default=PROVEN_VLLM, help=f"vLLM release to install (default {PROVEN_VLLM})")
