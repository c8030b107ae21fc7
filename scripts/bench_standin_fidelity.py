"""How closely ``sagemaker://`` (boto3 -> the package's SageMaker runtime STAND-IN -> a server)
reproduces plain HTTP's TTFT and TPOT readings: the same decode workload through both paths,
alternating rounds so a change in the machine's load hits both alike, printed side by side.

Servers: the bench's FAKE server with injected timings (always), and with ``--vllm`` one real
vLLM CPU server on the tiny random Gemma 4 (needs the cpu extra; minutes to start). Each line also
says how the flush rule (docs/benchmarks.md) classified the requests: vLLM's CPU build sends each
answer in one burst, so its TPOT is "not measured" on both paths and E2EL is the figure compared.

This is a measurement, not a test (wall-clock readings of real servers on a shared machine vary);
docs/sagemaker.md cites its output. Run heavy work one at a time:

    flock /tmp/gemma4_t4_heavy.lock python scripts/bench_standin_fidelity.py --vllm
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from gemma4_t4.bench import run_benchmark
from gemma4_t4.serving.server_state import free_port
from gemma4_t4.standins.runtime_standin import RuntimeStandIn

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the FAKE server lives with the tests that use it
from fake_openai_server import FakeScript, FakeServer, FakeServerState  # noqa: E402


def _aws_env(url: str) -> None:
    """Dummy credentials (the stand-in checks none) and the runtime override boto3 reads."""
    os.environ.update(
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_SESSION_TOKEN="testing",
        AWS_DEFAULT_REGION="us-east-2",
        AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME=url,
    )
    os.environ.pop("AWS_PROFILE", None)


def _line(kind: str, run) -> dict:
    (cell,) = run.cells
    flushed = cell.buffered
    row = {
        "path": kind,
        "ok": cell.completed,
        "failed": cell.failed,
        "ttft_ms": cell.ttft_ms.median,
        "tpot_ms": cell.tpot_ms.median,
        "e2el_ms": cell.e2el_ms.median,
        "out_tok_s": cell.output_throughput_tok_s,
        "flush": f"{flushed.requests}/{flushed.completed} flushed, span <= {flushed.span_ms:.3f} ms"
        if flushed
        else "streamed",
    }
    ttft = "-" if row["ttft_ms"] is None else f"{row['ttft_ms']:8.2f}"
    tpot = "not measured" if flushed else ("-" if row["tpot_ms"] is None else f"{row['tpot_ms']:8.3f}")
    print(
        f"  {kind:<10} ok {row['ok']}/{row['ok'] + row['failed']}  TTFT p50 {ttft} ms  TPOT p50 {tpot:>12}  "
        f"E2EL p50 {row['e2el_ms']:8.2f} ms  out {row['out_tok_s']:9.1f} tok/s  [{row['flush']}]",
        flush=True,
    )
    return row


def compare_paths(name: str, base_url: str, model: str, tokenizer: str, rounds: int, out: Path, **opts) -> None:
    print(f"\n{name}: {base_url}", flush=True)
    rows: dict[str, list[dict]] = {"http": [], "sagemaker": []}
    with RuntimeStandIn(base_url) as standin:
        _aws_env(standin.url)
        for round_ in range(rounds):
            for kind, url in (("http", base_url), ("sagemaker", "sagemaker://us-east-2/fidelity-ep")):
                run = run_benchmark(url, model, "decode", out / f"{name}-{kind}-{round_}", concurrency=[1],
                                    warmup=1, progress=False, tokenizer=tokenizer, **opts)
                rows[kind].append(_line(kind, run))
    print(f"  median over {rounds} rounds (sagemaker / http):")
    for metric in ("ttft_ms", "tpot_ms", "e2el_ms"):
        values = {k: [r[metric] for r in v if r[metric] is not None] for k, v in rows.items()}
        if not values["http"] or not values["sagemaker"]:
            print(f"    {metric:<8} not measured on both paths")
            continue
        h, s = statistics.median(values["http"]), statistics.median(values["sagemaker"])
        print(f"    {metric:<8} http {h:9.3f}  sagemaker {s:9.3f}  ratio {s / h:6.3f}  diff {s - h:+8.3f} ms")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--vllm", action="store_true", help="also measure a real vLLM CPU server (minutes)")
    parser.add_argument("--model-dir", default=str(REPO / ".cache" / "tests" / "models" / "tiny-gemma4"))
    args = parser.parse_args(argv)

    from gemma4_t4.catalog.tiny import ensure_tiny_gemma4

    tiny = ensure_tiny_gemma4(args.model_dir, variant="bf16")
    load = os.getloadavg()
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}  {platform.node()}  {platform.processor() or platform.machine()}  "
          f"{os.cpu_count()} cores  load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}  python {sys.version.split()[0]}")
    with tempfile.TemporaryDirectory(prefix="standin-fidelity-") as tmp:
        out = Path(tmp)
        state = FakeServerState(default=FakeScript(ttft_s=0.150, gap_s=0.015))
        with FakeServer(free_port(), state) as fake:
            compare_paths("fake (injected TTFT 150 ms, 15 ms a token)", fake.base_url, "fake-model", str(tiny),
                          args.rounds, out, input_len=16, output_len=12, num_prompts=6)
        if args.vllm:
            from gemma4_t4.serving.server import VLLMServer
            from gemma4_t4.serving.server_config import ServerConfig

            config = ServerConfig(model=str(tiny), served_model_name="tiny-gemma4", target="cpu", port=free_port(),
                                  max_model_len=2048, max_num_seqs=8, enable_prefix_caching=True,
                                  work_dir=str(out / "vllm"))
            server = VLLMServer(config)
            server.start(timeout=900)
            try:
                compare_paths("vLLM CPU, tiny random Gemma 4", server.base_url, "tiny-gemma4", str(tiny),
                              args.rounds, out, input_len=1024, output_len=24, num_prompts=4)
            finally:
                server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
