"""``gemma4-t4 doctor``: what this machine is and what to fix before serving Gemma 4."""

from __future__ import annotations

import argparse

from gemma4_t4.cli import Output, add_command
from gemma4_t4.foundation.table import format_pairs, format_table
from gemma4_t4.host.env import EnvReport, doctor


def _fmt(value: object, unit: str = "") -> str:
    return "-" if value is None else f"{round(value, 2) if isinstance(value, float) else value}{unit}"


def report_text(report: EnvReport) -> str:
    f = report.facts
    gpu = ", ".join(f"{g.name} ({_fmt(g.memory_mib, ' MiB')}, cc {_fmt(g.compute_capability)})" for g in f.gpus)
    if len(f.gpus) > 1:  # which one setup, the gate and the notebooks plan for, and why
        choice = f.gpu_choice
        gpu += f"; used: {f'GPU {choice.gpu.index}' if choice.gpu else 'none'} ({choice.reason or choice.error})"
    torch = "-" if f.torch_version is None else f"{f.torch_version} ({'CUDA ' + f.torch_cuda if f.torch_cuda else 'CPU-only'})"
    smem = (f"{f.smem_per_block_optin:,} B" if f.smem_per_block_optin else f.cuda_probe_error or "-") \
        if f.smem_probed else "not probed (--smem initialises CUDA)"
    facts = [
        ("platform", f"{f.platform} ({f.platform_evidence})"),
        ("OS", f"{f.os}, kernel {f.kernel}, {f.machine}"), ("Python", f.python),
        ("GPU", gpu or ("none (nvidia-smi not found)" if not f.nvidia_smi else "none listed by nvidia-smi")),
        ("driver / CUDA", f"{_fmt(f.driver_version)} / {_fmt(f.driver_cuda_version)}"), ("torch", torch),
        ("smem per block", smem),
        ("RAM / available / swap", f"{_fmt(f.ram_total_gib)} / {_fmt(f.ram_available_gib)} / "
                                   f"{_fmt(f.swap_total_gib)} GiB"),
        ("vLLM", f"{f.vllm_distribution} {f.vllm_version}" if f.vllm_version else "not installed"),
        ("transformers", _fmt(f.transformers_version)),
        ("vLLM + transformers", f"{report.pair.status}: {report.pair.detail}"),
    ]
    facts += [(f"free disk {d.label}", f"{_fmt(d.free_gb, ' GB')}  {d.path}") for d in f.disks]
    text = format_pairs(facts)
    if report.problems:
        rows = []
        for p in report.problems:
            rows.append([p.severity.upper(), p.code, p.message])
            if p.fix:
                rows.append(["", "", f"fix: {p.fix}"])
        text += "\n\n" + format_table(["severity", "code", "problem / fix"], rows)
    verdict = "OK: no blocking problem" if report.ok else "NOT READY: fix the errors above"
    return f"{text}\n\n{verdict}"


def _doctor(args: argparse.Namespace) -> Output:
    report = doctor(smem=args.smem)
    return Output(report.to_dict(), report_text(report), 0 if report.ok else 1)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = add_command(subparsers, "doctor", _doctor, help="check this machine for Gemma 4 on vLLM (GPU, driver, torch, "
                    "versions, RAM, disk)",
                    description="Probe the host and list problems with their fixes. Exit code 1 when an error "
                                "blocks serving on this host.")
    p.add_argument("--smem", action="store_true",
                   help="also read max shared memory per block through torch (initialises CUDA)")
