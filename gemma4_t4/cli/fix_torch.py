"""``gemma4-t4 fix-torch [--apply]``: install the torch build this host's install plan names, where
torch alone fixes the host (``--apply`` refuses, naming ``gemma4-t4 setup``, where it does not)."""

from __future__ import annotations

import argparse

from gemma4_t4.cli import Output, add_command
from gemma4_t4.foundation.signals import orderly_stop
from gemma4_t4.host.setup_plan import known_vllm_versions
from gemma4_t4.host.torchfix import apply_torch_fix, plan_torch_fix, torch_fix_dict


def _fix_torch(args: argparse.Namespace) -> Output:
    with orderly_stop():  # SIGTERM/SIGHUP stop the probed interpreter's process group, as Ctrl-C does
        plan = plan_torch_fix(vllm_version=args.vllm, python=args.python)
        data = {"plan": torch_fix_dict(plan), "applied": False}
        if not args.apply:
            hint = "\n(dry: nothing installed; add --apply to run it)" if plan.needed and plan.torch_alone else ""
            return Output(data, plan.summary() + hint)
        result = apply_torch_fix(plan)
    data.update(applied=result.applied, message=result.message, output_tail=result.output_tail)
    return Output(data, plan.summary() + "\n" + result.message)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = add_command(subparsers, "fix-torch", _fix_torch,
                    "print (or --apply) the pip command installing the torch build this host's install plan "
                    "names (the same plan as gemma4-t4 setup)")
    p.add_argument("--apply", action="store_true",
                   help="run the pip command (refused where vLLM must change too: then run gemma4-t4 setup)")
    p.add_argument("--vllm",
                   help=f"plan for this vLLM release: one of {', '.join(known_vllm_versions())} (default: the "
                        "installed one where the driver runs it, else the best the driver runs)")
    p.add_argument("--python", help="interpreter whose torch to fix (default: this one)")
