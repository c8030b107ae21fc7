"""``gemma4-t4 turing status|verify|bench-prefill|apply|revert``: the T4 attention fix and prefill route."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from gemma4_t4.cli import Output, add_command
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation.table import Table
from gemma4_t4.turing.filepatch import apply_file_patch, revert_file_patch
from gemma4_t4.turing.state import status
from gemma4_t4.turing.verify import VerifyReport, verify

if TYPE_CHECKING:  # the timing harness itself loads only when bench-prefill runs
    from gemma4_t4.turing.prefill_bench import PrefillBenchReport


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "turing", help="the T4 (sm_75) attention fix: status, offline proof, file patch",
        description="vLLM's attention kernel needs 98,304 B of shared memory for Gemma 4's head-512 layers; "
        "a T4 allows 65,536 B. This package's vLLM plugin caps the tile in every vLLM process. "
        "`verify` proves it offline by compiling vLLM's own kernel for the target; `apply`/`revert` "
        "patch vLLM's file where the package cannot be installed next to vLLM.",
    )
    commands = parser.add_subparsers(dest="turing_command", metavar="COMMAND", required=True)
    add_command(commands, "status", _status, help="is the fix registered / patched / active here?")

    verify = add_command(commands, "verify", _verify,
                         help="compile every Gemma 4 attention launch for a GPU target; check it fits")
    verify.add_argument("--arch", default="sm_75", help="target: sm_75 (T4, default), sm_80, sm_86, sm_89")
    verify.add_argument("--limit-bytes", type=int,
                        help="per-block shared-memory limit (default: the architecture's opt-in maximum)")
    verify.add_argument("--vllm-root", help="vLLM package folder (default: the installed vLLM)")
    verify.add_argument("--jobs", type=int, help="parallel compile processes (default: CPUs)")

    bench = add_command(commands, "bench-prefill", _bench_prefill,
                        help="time the tensor-core prefill route vs vLLM's Triton kernel on this GPU; cache the verdict")
    bench.add_argument("--lengths", default="512,1024,2048,4096", help="prompt lengths (comma list)")
    bench.add_argument("--models", default="e2b,e4b,12b", help="head configurations from these sizes")
    bench.add_argument("--out", default="bench_prefill", help="folder for bench_prefill.json and .png")
    bench.add_argument("--vllm-root", help="vLLM package folder (default: the installed vLLM)")
    bench.add_argument("--no-save-verdict", action="store_true", help="do not cache the verdict for the route")

    for name, handler, text in (
        ("apply", _apply, "patch vLLM's kernel file (backup + marker); for images without the plugin"),
        ("revert", _revert, "restore vLLM's original kernel file from the backup (checksum-verified)"),
    ):
        command = add_command(commands, name, handler, help=text)
        command.add_argument("--path",
                             help="the triton_unified_attention.py to change (default: the installed vLLM's)")


def _status(args: argparse.Namespace) -> Output:
    state = status()
    patch = state.file_patch
    lines = [
        f"vLLM:             {state.vllm_version or 'not installed'}",
        f"plugin:           {'registered' if state.plugin_registered else 'not registered'}"
        + ("" if state.plugin_enabled or not state.plugin_registered else f" but disabled ({state.disabled_reason})"),
        f"file patch:       {_patch_state(patch)}",
        f"active:           {'yes' if state.active else 'no'} - {state.summary}",
    ]
    return Output(state, "\n".join(lines))


def _patch_state(patch) -> str:
    if patch is None:
        return "n/a"
    if patch.patched:
        return f"patched (backup {'ok' if patch.backup_matches else 'MISSING or changed'}) {patch.path}"
    return f"not patched{' (apply would refuse: ' + patch.refusal + ')' if patch.refusal else ''} {patch.path}"


def _verify(args: argparse.Namespace) -> Output:
    report = verify(args.arch, limit_bytes=args.limit_bytes, vllm_root=args.vllm_root, jobs=args.jobs)
    return Output(report, verify_text(report), exit_code=0 if report.ok else 1)


def verify_text(report: VerifyReport) -> str:
    """The proof as the CLI prints it: the kernel and tile cap, the report's own table, the verdict."""
    model = {True: "matches every compile", False: "DISAGREES with a compile",
             None: "not checked (an estimate above sm_75)"}[report.model_exact]
    return "\n".join([
        f"vLLM {report.vllm_version} kernel {report.kernel_file}, Triton {report.triton_version}; "
        f"tile cap: {report.patch_action} ({report.patch_reason})", "", str(report), "",
        f"{report.changed_launches} launches re-tiled; {report.compiles} compiles in {report.seconds:.0f} s; "
        f"smem model {model}",
        "PASS: every patched launch fits" if report.ok
        else "FAIL: a patched launch exceeds the limit or the tile cap refused this vLLM",
    ])


def _bench_prefill(args: argparse.Namespace) -> Output:
    # lazy: the kernel timing harness (numerics, the offline kernel loader) loads only for turing bench-prefill
    from gemma4_t4.turing.prefill_bench import bench_prefill

    try:
        lengths = tuple(int(x) for x in args.lengths.split(",") if x.strip())
    except ValueError as exc:
        raise Gemma4T4Error(f"--lengths {args.lengths!r} is not a comma list of integers",
                            fix="e.g. --lengths 512,1024,2048,4096") from exc
    if not lengths or min(lengths) < 2:
        raise Gemma4T4Error(f"--lengths {args.lengths!r} needs prompt lengths of at least 2 tokens",
                            fix="e.g. --lengths 512,1024,2048,4096")
    models = tuple(m.strip() for m in args.models.split(",") if m.strip())
    report = bench_prefill(lengths, models, args.vllm_root, args.out, save_verdict=not args.no_save_verdict)
    return Output(report, bench_prefill_text(report, args.out))


def bench_prefill_text(report: PrefillBenchReport, out: str) -> str:
    """What bench-prefill prints: every measured step, the report's own verdict table, what it wrote."""
    key = report.key  # read like the report's caption reads it: a missing entry shows as "?"
    measured = Table(report.rows, title=f"measured: torch {key.get('torch', '?')}, Triton {key.get('triton', '?')}",
                     columns=["model", "layer", "head_size", "num_q_heads", "num_kv_heads", "seq_len", "triton_ms",
                              "route_ms", "speedup", "triton_max_abs_err", "route_max_abs_err"])
    saved = f"; verdict cached in {report.verdict_path}" if report.verdict_path else ""
    return f"{measured}\n\n{report}\n\nwrote {out}/bench_prefill.json, {report.plot}{saved}"


def _apply(args: argparse.Namespace) -> Output:
    result = apply_file_patch(args.path)
    return Output(result, f"{result.action}: {result.path}\n{result.message}")


def _revert(args: argparse.Namespace) -> Output:
    result = revert_file_patch(args.path)
    return Output(result, f"{result.action}: {result.path}\n{result.message}")
