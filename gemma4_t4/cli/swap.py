"""``gemma4-t4 swap status|create``: swap for loading Gemma 4's weights on small-RAM VMs."""

from __future__ import annotations

import argparse

from gemma4_t4.cli import Output, add_command, add_group
from gemma4_t4.host.swap import DEFAULT_SWAP_PATH, DEFAULT_SWAP_SIZE, create_swap, swap_status


def _status(args: argparse.Namespace) -> Output:
    status = swap_status()
    return Output(status, status.summary())


def _create(args: argparse.Namespace) -> Output:
    result = create_swap(size=args.size, path=args.path, persist=args.persist, dry_run=args.dry_run)
    return Output(result, result.summary())


def register(subparsers: argparse._SubParsersAction) -> None:
    sub = add_group(subparsers, "swap", "show swap, or add a swap file (vLLM's weight load needs RAM + swap)",
                    __doc__)
    add_command(sub, "status", _status, "active swap areas, RAM, and whether swap can be added here")
    p = add_command(sub, "create", _create, "create and enable a swap file (idempotent; needs root)")
    p.add_argument("--size", default=DEFAULT_SWAP_SIZE, help="e.g. 16G (default %(default)s)")
    p.add_argument("--path", default=DEFAULT_SWAP_PATH, help="default %(default)s")
    p.add_argument("--persist", action="store_true", help="also add it to /etc/fstab (backed up first)")
    p.add_argument("--dry-run", action="store_true", help="print the commands; change nothing")
