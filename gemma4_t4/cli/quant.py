"""``gemma4-t4 grid-check | grid-compare | repack | requant-awq``: thin adapters over gemma4_t4.quant."""

from __future__ import annotations

import argparse

from gemma4_t4.cli import Output, add_command


def _grid_check(args: argparse.Namespace) -> Output:
    # lazy: numpy and numba load only for the quant commands, not for every CLI start-up
    from gemma4_t4.quant import grid_check

    report = grid_check(args.checkpoint, tensors=args.tensor or None, group_size=args.group_size,
                        tol=args.tol, progress=not args.json and not args.quiet)
    return Output(report, str(report), exit_code=0 if report.on_grid else 1)


def _grid_compare(args: argparse.Namespace) -> Output:
    # lazy: numpy and numba load only for the quant commands
    from gemma4_t4.quant import grid_compare

    r = grid_compare(args.ref, args.other, group_size=args.group_size, modules=args.tensor or None,
                     progress=not args.json, max_changed_pct=args.max_changed_pct)
    return Output(r, str(r), exit_code=0 if r.within_tolerance else 1)


def _repack(args: argparse.Namespace) -> Output:
    # lazy: numpy and numba load only for the quant commands
    from gemma4_t4.quant import repack

    r = repack(args.src, args.dst, emb4=args.emb4, scale_dtype=args.scale_dtype, group_size=args.group_size,
               allow_requant=args.allow_requant, overwrite=args.overwrite, progress=not args.json,
               compare_scale_dtypes=args.compare_scale_dtypes)
    return Output(r, str(r))


def _requant_awq(args: argparse.Namespace) -> Output:
    # lazy: numpy and numba load only for the quant commands
    from gemma4_t4.quant import awq_requantize

    r = awq_requantize(args.src, args.dst, group_size=args.group_size, scale_dtype=args.scale_dtype,
                       overwrite=args.overwrite, progress=not args.json)
    return Output(r, str(r))


def register(subparsers: argparse._SubParsersAction) -> None:
    p = add_command(subparsers, "grid-check", _grid_check,
                    help="check every 2-D weight of a safetensors checkpoint against the int4 QAT grid",
                    description="Stream a (sharded) safetensors checkpoint, local or an http(s) folder URL "
                    "(range requests), and report which weights sit on the symmetric int4 group lattice. "
                    "Exit code 1 when any tensor is off grid or holds NaN/Inf, or when nothing could be checked; "
                    "tensors it cannot check (3-D, width not a multiple of the group size, zero-size) are named.")
    p.add_argument("checkpoint", help="folder, .safetensors file, or http(s):// folder URL")
    p.add_argument("--tensor", action="append", metavar="NAME", help="only this tensor (repeatable)")
    p.add_argument("--group-size", type=int, default=32)
    p.add_argument("--tol", type=float, default=0.05, help="tolerance in levels (default 0.05)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")

    p = add_command(subparsers, "grid-compare", _grid_compare,
                    help="compare two builds of the same weights (levels changed, bit-identical values)",
                    description="Count the weights OTHER moved to another level of REF's int4 lattice. Exit code 1 "
                    "when more than --max-changed-pct of them changed or nothing could be compared; NaN/Inf in "
                    "either build is refused (exit code 2), naming each module.")
    p.add_argument("ref", help="reference build (e.g. the bf16 QAT checkpoint)")
    p.add_argument("other", help="build to compare (our repack, a w4a16 build, an AWQ build)")
    p.add_argument("--tensor", action="append", metavar="MODULE", help="only this module (repeatable)")
    p.add_argument("--group-size", type=int, default=32, help="REF's group size when REF is dense")
    p.add_argument("--max-changed-pct", type=float, default=0.0, metavar="PCT",
                   help="levels-changed tolerance in %% of REF's lattice weights (default 0: a lossless repack "
                   "changes none; AWQ-style builds change most)")

    for name, handler, text, group_size in (
        ("repack", _repack, "repack a QAT checkpoint into compressed-tensors int4 without changing any level", 32),
        ("requant-awq", _requant_awq, "AWQ-style baseline build (asymmetric, zero point, group 128) for comparison",
         128),
    ):  # the two builds: a source, a new folder, its group size and scale dtype
        p = add_command(subparsers, name, handler, help=text)
        p.add_argument("src")
        p.add_argument("dst")
        p.add_argument("--scale-dtype", choices=["fp16", "bf16"], default="fp16",
                       help="fp16 (default: T4 has no bf16 and keeps more values bit-identical) or bf16")
        p.add_argument("--group-size", type=int, default=group_size)
        p.add_argument("--overwrite", action="store_true",
                       help="replace an existing DST (atomically; only a folder gemma4-t4 wrote)")
    repack = subparsers.choices["repack"]
    repack.add_argument("--emb4", action="store_true",
                        help="also pack embed_tokens and embed_tokens_per_layer and write an untied 4-bit lm_head")
    repack.add_argument("--allow-requant", action="store_true",
                        help="round off-grid groups instead of refusing (their values change)")
    repack.add_argument("--compare-scale-dtypes", action="store_true",
                        help="also count the values the other scale dtype would keep bit-identical (slower; "
                        "grid-check always reports both)")
