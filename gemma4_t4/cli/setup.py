"""``gemma4-t4 setup [--dry-run] [--vllm X] [--undo]``: install the vLLM + torch build this host's
GPU and driver run (a row of the install matrix), prove it, or put back what was there before."""

from __future__ import annotations

import argparse

from gemma4_t4.cli import Output, add_command
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.host.setup_plan import INSTALL_MATRIX, PROVEN_VLLM, known_vllm_versions


def _setup(args: argparse.Namespace) -> Output:
    # the capability modules are imported here, not at CLI start-up (env probes, pip machinery)
    from gemma4_t4.foundation.jsonable import to_jsonable
    from gemma4_t4.host import env
    from gemma4_t4.host.setup import apply_setup, undo_setup
    from gemma4_t4.host.setup_plan import plan_setup

    if args.undo:
        message = undo_setup(args.record, dry_run=args.dry_run)
        return Output({"undone": not args.dry_run, "dry_run": args.dry_run, "message": message}, message)
    if args.record:
        raise Gemma4T4Error("--record names the record --undo restores", fix="add --undo, or leave --record out")
    # a shell command: nothing is loaded yet in the Python that will use the install
    plan = plan_setup(env.probe(), vllm_version=args.vllm)
    data = to_jsonable(plan) | {
        "commands": plan.commands, "index_urls": plan.index_urls, "dry_run": args.dry_run, "applied": False,
    }
    if args.dry_run or not plan.needed:
        hint = "\n(dry run: nothing installed; run without --dry-run to install)" if plan.needed else ""
        return Output(data, plan.summary() + hint)
    result = apply_setup(plan)
    data.update(applied=result.applied, restart=result.restart, message=result.message,
                output_tail=result.output_tail, installed_route=result.route, record=result.record_path)
    return Output(data, plan.summary() + "\n" + result.message)


def register(subparsers: argparse._SubParsersAction) -> None:
    # the CUDA 12 row and its fallbacks as the matrix holds them (the help never names a stale build)
    cuda12 = [r for r in INSTALL_MATRIX if r.variant.startswith("cu12")]
    cuda13_driver = min(r.min_driver or 0 for r in INSTALL_MATRIX if r.variant.startswith("cu13"))
    fallback = f" ({', '.join(r.vllm_requirement for r in cuda12[1:])} as the fallback)" if cuda12[1:] else ""
    cuda12_text = (f"vLLM {cuda12[0].vllm_version}'s {cuda12[0].variant} build{fallback} on drivers "
                   f"{cuda12[0].min_driver}-{cuda13_driver - 1}"
                   if cuda12
                   else "no CUDA 12 build")

    p = add_command(
        subparsers, "setup", _setup,
        "install the vLLM and torch builds this host runs (GPU, driver, Colab aware)",
        description="Read the host (GPU, compute capability, driver, Colab, installed torch/vLLM) and "
        "install the install matrix's row for it (docs/install.md): vLLM "
        f"{PROVEN_VLLM} (CUDA 13) on a driver >= {cuda13_driver}, {cuda12_text}, "
        "vLLM's CPU build without a GPU; older drivers are refused. What pip replaces is recorded "
        "first, the install is proven in a fresh Python, and a failure puts the record back. "
        "--dry-run prints the exact pip commands and indexes.",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="print the plan and its pip commands; install nothing"
    )
    p.add_argument("--vllm",
                   help=f"vLLM release to install: one of {', '.join(known_vllm_versions())} "
                   "(default: the best the driver runs)")
    p.add_argument(
        "--undo", action="store_true",
        help="revert what this Python's latest setup install changed (with --dry-run: print the pip commands)",
    )
    p.add_argument("--record", metavar="PATH", help="with --undo: the setup record to restore")
