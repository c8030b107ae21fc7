"""This client vs ``vllm bench serve`` on the same workload and the same live vLLM server.

Runs the two tools alternately (A B A B ...) on fixed-length prompts with ignore_eos and
prints the median TTFT, median TPOT and output tok/s of each, and their ratios. ``vllm bench``
runs through ``gemma4_t4.bench.vllm_cli`` (the CPU build's ``vllm`` script is broken).

Usage:
  python scripts/bench_vs_vllm.py --base-url http://127.0.0.1:8000 --model tiny-gemma4 \\
      --tokenizer models/tiny-gemma4 --concurrency 1,4 --input-len 128 --output-len 32 --num-prompts 32
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from gemma4_t4.bench import run_benchmark


def ours(args, concurrency: int, out: Path) -> dict[str, float]:
    run = run_benchmark(args.base_url, args.model, "decode", out, concurrency=[concurrency],
                        input_len=args.input_len, output_len=args.output_len, num_prompts=args.num_prompts,
                        warmup=max(2, concurrency), progress=False, sample_metrics=False)
    cell = run.cells[0]
    return {"ttft": cell.ttft_ms.median, "tpot": cell.tpot_ms.median,
            "tput": cell.output_throughput_tok_s, "failed": cell.failed}


def vllm_bench(args, concurrency: int, out: Path, seed: int) -> dict[str, float]:
    cmd = [sys.executable, "-m", "gemma4_t4.bench.vllm_cli", "bench", "serve", "--backend", "openai",
           "--base-url", args.base_url, "--endpoint", "/v1/completions", "--model", args.model,
           "--tokenizer", args.tokenizer, "--dataset-name", "random", "--random-input-len", str(args.input_len),
           "--random-output-len", str(args.output_len), "--random-range-ratio", "0", "--num-prompts",
           str(args.num_prompts), "--max-concurrency", str(concurrency), "--ignore-eos", "--seed", str(seed),
           "--num-warmups", str(max(2, concurrency)), "--percentile-metrics", "ttft,tpot,itl,e2el",
           "--save-result", "--result-dir", str(out.parent), "--result-filename", out.name]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0 or not out.exists():
        raise SystemExit(f"vllm bench serve failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    data = json.loads(out.read_text())
    return {"ttft": data["median_ttft_ms"], "tpot": data["median_tpot_ms"], "tput": data["output_throughput"],
            "failed": data.get("num_prompts", args.num_prompts) - data.get("completed", 0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--tokenizer", required=True, help="the served model's directory (vllm bench needs it)")
    parser.add_argument("--concurrency", default="1,4")
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-vs-vllm-"))
    print(f"workload: random fixed-length prompts, in {args.input_len} / out {args.output_len}, ignore_eos, "
          f"{args.num_prompts} prompts per run, {args.repeats} alternating repeats per tool")
    print(f"{'c':>3} {'tool':<18} {'TTFT p50 ms':>12} {'TPOT p50 ms':>12} {'out tok/s':>10}")
    for c in [int(x) for x in args.concurrency.split(",")]:
        results: dict[str, list[dict[str, float]]] = {"gemma4_t4.bench": [], "vllm bench serve": []}
        for i in range(args.repeats):
            results["gemma4_t4.bench"].append(ours(args, c, work / f"ours-c{c}-{i}"))
            results["vllm bench serve"].append(vllm_bench(args, c, work / f"vllm-c{c}-{i}.json", seed=1000 + i))
        medians = {}
        for tool, runs in results.items():
            medians[tool] = {k: statistics.median(r[k] for r in runs) for k in ("ttft", "tpot", "tput")}
            m = medians[tool]
            print(f"{c:>3} {tool:<18} {m['ttft']:>12.2f} {m['tpot']:>12.3f} {m['tput']:>10.1f}   "
                  f"runs: TTFT {[round(r['ttft'], 1) for r in runs]} TPOT {[round(r['tpot'], 2) for r in runs]}")
        a, b = medians["gemma4_t4.bench"], medians["vllm bench serve"]
        print(f"{c:>3} {'ours / vllm':<18} {a['ttft'] / b['ttft']:>12.3f} {a['tpot'] / b['tpot']:>12.3f} "
              f"{a['tput'] / b['tput']:>10.3f}")


if __name__ == "__main__":
    main()
