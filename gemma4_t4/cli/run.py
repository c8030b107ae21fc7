"""``gemma4-t4 run``: execute the four notebooks headlessly and write the report index."""

from __future__ import annotations

import argparse
from pathlib import Path

from gemma4_t4.cli import Output, add_command
from gemma4_t4.foundation import signals
from gemma4_t4.pipeline import AUTO, NOTEBOOKS_DIR, TARGETS, run_pipeline


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = add_command(
        subparsers, "run", _run,
        help="execute the notebooks with papermill into OUT/notebooks and write OUT/index.md",
        description="Execute the four notebooks headlessly (papermill) with the parameters of "
        "notebooks/params/TARGET.yaml, export them to HTML and write a report index. "
        "--target wins over a params file (a params file naming another TARGET is refused). "
        "The notebooks installed with the package run unless --notebooks DIR names others. TARGET=cpu needs no GPU and no AWS (tiny Gemma 4 on vLLM's CPU build, moto for AWS).",
    )
    parser.add_argument(
        "--target",
        type=str.lower,  # T4, CPU: a choice is the same word in any case
        choices=(AUTO, *TARGETS), default=AUTO,
        help="where the notebooks run (default auto: t4 where an NVIDIA GPU is found, else cpu)",
    )
    parser.add_argument("--out", default="build", help="output folder (default build)")
    parser.add_argument("--only", action="append", metavar="PART",
                        help="run only this part number, e.g. --only 02 (repeatable)")
    parser.add_argument(
        "--notebooks", metavar="DIR",
        help="folder holding the NN_*.ipynb notebooks and params/ (default: the notebooks installed with "
        "the package)",
    )
    parser.add_argument("--no-html", action="store_true", help="skip the HTML export")
    parser.add_argument("--cell-timeout", type=float, help="seconds allowed per cell")


def _run(args: argparse.Namespace) -> Output:
    notebooks = Path(args.notebooks) if args.notebooks else NOTEBOOKS_DIR
    # SIGTERM/SIGHUP unwind like Ctrl-C: papermill shuts its kernel down, and a server the kernel
    # started stops with the kernel (its supervisor watches the kernel's pid: docs/serving.md)
    with signals.orderly_stop():
        report = run_pipeline(
            target=args.target, notebooks_dir=notebooks, params_dir=notebooks / "params", out=args.out,
            only=args.only, export_html=not args.no_html, progress=not args.json,
            cell_timeout=args.cell_timeout, log=(lambda _msg: None) if args.json else print,
        )
    lines = ["", f"{'part':<5}{'status':<9}{'time':>7}  notebook"]
    for run in report.runs:
        lines.append(f"{run.number:<5}{run.status:<9}{run.seconds:>6.0f}s  {run.executed or run.error}")
    if report.missing:
        lines.append(
            f"missing notebooks: {', '.join(report.missing)} (nothing was faked; add them under notebooks/)"
        )
    if report.failed:
        lines.append(
            f"failed notebooks: {', '.join(report.failed)} (see the executed copies for the failing cell)"
        )
    lines.append(f"report: {report.index_md}")
    return Output(report, "\n".join(lines), exit_code=0 if report.ok else 1)
