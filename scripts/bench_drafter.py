"""Decode with the drafter off and on, on the embedded default (the tiny random Gemma 4 on vLLM's CPU build).

For each setup it starts one server, runs the decode workload at c=1 and c=8, stops the server, and
prints output tok/s, per-stream tok/s, median TPOT, and the acceptance and mean accepted length read from
``/metrics`` over each cell. Setups: the default tiny target with the drafter off and with the tiny random
assistant (MTP); and, since vLLM 0.32.0's draft-model drafter needs all layers in one KV cache group
(a Gemma 4 with sliding and full layers is refused), a tiny Gemma 4 with full attention throughout, off
and as its own draft model (``self``).

The tiny models have random weights: the tiny assistant's acceptance is near zero (it shows what a bad
drafter costs), the self-drafter's is 1 (it shows the ceiling of the plumbing). Neither says anything
about a T4 with Google's trained assistant.

Usage:
  python scripts/bench_drafter.py [--work-dir .cache/bench-drafter] [--num-draft-tokens 3] \\
      [--input-len 64] [--output-len 64] [--num-prompts 16]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gemma4_t4.bench import run_benchmark
from gemma4_t4.catalog.tiny import TinySpec, build_tiny_gemma4, ensure_tiny_gemma4
from gemma4_t4.foundation import signals
from gemma4_t4.foundation.table import format_table
from gemma4_t4.serving.server import VLLMServer
from gemma4_t4.serving.server_config import ServerConfig
from gemma4_t4.serving.server_state import free_port


def bench_one(label: str, target: Path, draft: str, args: argparse.Namespace) -> list[list[str]]:
    config = ServerConfig(model=str(target), served_model_name="tiny-gemma4", target="cpu", port=free_port(),
                          max_model_len=2048, max_num_seqs=8, work_dir=str(args.work_dir / "servers"),
                          draft=draft, num_draft_tokens=args.num_draft_tokens)
    server = VLLMServer(config)
    rows = []
    with signals.orderly_stop():  # Ctrl-C, SIGTERM or SIGHUP: the server below is stopped, never left running
        try:
            server.start(timeout=900)
            run = run_benchmark(server.base_url, "tiny-gemma4", "decode", args.work_dir / f"run-{label}",
                                concurrency=[1, 8], input_len=args.input_len, output_len=args.output_len,
                                num_prompts=args.num_prompts, warmup=2, progress=False, sample_metrics=False)
        finally:
            server.stop()
    for cell in run.cells:
        spec = cell.spec_decode
        rows.append([
            label, str(cell.concurrency), f"{cell.completed}/{cell.failed}",
            f"{cell.output_throughput_tok_s:.1f}", f"{cell.per_stream_tok_s.median:.1f}",
            f"{cell.tpot_ms.median:.2f}",
            "-" if spec is None or spec.acceptance_rate is None else f"{spec.acceptance_rate:.3f}",
            "-" if spec is None or spec.mean_accepted_length is None else f"{spec.mean_accepted_length:.3f}",
        ])
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work-dir", type=Path, default=Path(".cache/bench-drafter"))
    parser.add_argument("--num-draft-tokens", type=int, default=3)
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--setups", default="off,tiny assistant,all-full off,all-full self",
                        help="comma-separated, from: off, tiny assistant, all-full off, all-full self")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON too")
    args = parser.parse_args()
    args.work_dir = args.work_dir.resolve()
    target = ensure_tiny_gemma4(args.work_dir / "models" / "tiny-gemma4", variant="bf16")
    drafter = ensure_tiny_gemma4(args.work_dir / "models" / "tiny-gemma4-drafter", variant="drafter")
    all_full = args.work_dir / "models" / "tiny-gemma4-all-full"
    if not (all_full / "config.json").exists():
        build_tiny_gemma4(all_full, spec=TinySpec(full_attention_every=1), overwrite=True)
    setups = {
        "off": (target, "off"),
        "tiny assistant": (target, str(drafter)),
        "all-full off": (all_full, "off"),
        "all-full self": (all_full, "self"),
    }
    rows: list[list[str]] = []
    for label in args.setups.split(","):
        model, draft = setups[label.strip()]
        rows += bench_one(label.strip(), model, draft, args)
    header = ["drafter", "c", "ok/fail", "out tok/s", "stream tok/s", "TPOT ms", "acceptance", "mean acc len"]
    print(f"tiny Gemma 4 on vLLM CPU, decode {args.input_len} in / {args.output_len} out, "
          f"{args.num_prompts} prompts per cell, {args.num_draft_tokens} draft tokens")
    print(format_table(header, rows, right=range(1, len(header))))
    if args.json:
        print(json.dumps([dict(zip(header, row, strict=True)) for row in rows], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
