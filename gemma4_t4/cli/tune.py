"""``gemma4-t4 tune --model M [--dry-run] [--minutes N]``: measure this GPU's launch profile for a model.

Decode with the drafter off and on (N = 1..6) at 1 and 8 streams, and the prefill route's verdict;
one cached profile that ``serve start --target t4`` follows. ``--dry-run`` prints the plan and
starts nothing.
"""

from __future__ import annotations

import argparse

from gemma4_t4.cli import Output, add_command, stopping_in_order
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation.launch_record import DEFAULT_WORK_DIR
from gemma4_t4.serving.launch_profile import host_key
from gemma4_t4.serving.server_config import DEFAULT_T4_MODEL
from gemma4_t4.studies import tune


def register(subparsers: argparse._SubParsersAction) -> None:
    p = add_command(subparsers, "tune", _tune,
                    "measure the drafter (off, N=1..6 at 1 and 8 streams) and the prefill route on this GPU; "
                    "cache one launch profile that serve start --target t4 follows")
    p.add_argument("--model", default=DEFAULT_T4_MODEL, help=f"the model to tune (default {DEFAULT_T4_MODEL})")
    p.add_argument("--dry-run", action="store_true", help="print the plan of measurements; start nothing")
    p.add_argument("--minutes", type=float, default=tune.DEFAULT_MINUTES, metavar="N",
                   help=f"refuse a plan estimated to take longer (default {tune.DEFAULT_MINUTES:g})")
    p.add_argument(
        "--work-dir", default=DEFAULT_WORK_DIR, help="server logs and benchmark results (serve's default)"
    )


def _tune(args: argparse.Namespace) -> Output:
    key = host_key(args.model)
    if key is None:
        raise Gemma4T4Error(
            "tune measures on an NVIDIA GPU and nvidia-smi shows none here",
            fix="run gemma4-t4 tune on the GPU machine that will serve the model (gemma4-t4 doctor says why not)",
        )
    if args.dry_run:
        the_plan = tune.plan(args.model, key, args.minutes)
        return Output({"plan": the_plan, "estimated_s": the_plan.estimated_s, "started": False},
                      tune.plan_text(the_plan))
    with stopping_in_order(lambda _: "during tune: the server it started was stopped; no profile written"):
        profile, path = tune.tune(args.model, key, work_dir=args.work_dir, minutes=args.minutes)
    lines = [f"profile for {key.model} on {key.gpu} (vLLM {key.vllm}): {path}"]
    lines += [f"  {choice.why}" for choice in profile.choices] or [f"  {profile.drafter}"]
    lines.append(f"  prefill route {'on' if profile.prefill.route_on else 'off'}: {profile.prefill.why}")
    return Output({"profile": profile, "path": str(path)}, "\n".join(lines))
