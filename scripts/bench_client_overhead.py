"""How much the benchmark client itself costs and how exact its stamps are.

1. Throughput: chunks per second of client CPU time, against the FAKE server (a separate
   process) streaming as fast as it can. Target: >= 20,000 chunks/s on one core.
2. Timing error at 32 concurrent streams: the client's stamp of every chunk minus the time the
   fake server wrote it (both perf_counter, one system-wide clock). Target: < 1 ms.
3. Open-loop schedule: constant arrivals at 8 and 16 requests/s (0.3 s requests, so they
   overlap): how late each request left against its schedule, and the send rate achieved.
   Target: median lag < 25 ms, achieved rate within 25 % of the offered one.

Usage: python scripts/bench_client_overhead.py [--streams 32] [--tokens 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from gemma4_t4.bench.client import RequestSpec, closed_loop, make_session, send_request
from gemma4_t4.bench.metrics import percentile
from gemma4_t4.serving.server_state import free_port


def start_fake(port: int, *flags: str) -> subprocess.Popen:
    fake = Path(__file__).resolve().parents[1] / "tests" / "fake_openai_server.py"  # the tests' fake
    proc = subprocess.Popen([sys.executable, str(fake), "--port", str(port), *flags],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("fake server did not start")


async def run(base: str, specs: list[RequestSpec], concurrency: int):
    async with make_session(concurrency) as session:

        async def send(spec: RequestSpec):
            return await send_request(session, base, "fake-model", spec)

        return await closed_loop(send, specs, concurrency)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=2000, help="chunks per stream in the throughput test")
    parser.add_argument("--gap", type=float, default=0.02, help="seconds between chunks in the timing test")
    parser.add_argument("--timing-tokens", type=int, default=50)
    args = parser.parse_args()
    port = free_port()
    proc = start_fake(port)
    base = f"http://127.0.0.1:{port}"
    try:
        # 1. throughput: no injected delays, the server writes as fast as it can
        specs = [RequestSpec(f"t{i}", "x", args.tokens, extra_body={"fake": {"ttft_s": 0.0, "gap_s": 0.0}})
                 for i in range(args.streams)]
        cpu0, wall0 = time.process_time(), time.perf_counter()
        records = asyncio.run(run(base, specs, args.streams))
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        chunks = sum(len(r.chunk_times_s) for r in records)
        errors = sum(1 for r in records if r.error)
        print(f"throughput: {chunks} chunks in {wall:.2f} s wall, {cpu:.2f} s client CPU "
              f"-> {chunks / cpu:,.0f} chunks per client-CPU-second ({chunks / wall:,.0f}/s wall, "
              f"server on the same machine); errors {errors}")
        # 2. timing error at N concurrent streams with realistic pacing
        specs = [RequestSpec(f"e{i}", "x", args.timing_tokens,
                             extra_body={"fake": {"ttft_s": 0.05, "gap_s": args.gap}, "fake_id": f"e{i}"})
                 for i in range(args.streams)]
        records = asyncio.run(run(base, specs, args.streams))
        with urllib.request.urlopen(base + "/fake/log") as response:
            log = {e["id"]: e for e in json.loads(response.read()) if e.get("id")}
        deltas = []
        for r in records:
            truth = log[r.request_id]["writes_s"]
            deltas += [(c - w) * 1000 for c, w in zip(r.chunk_times_s, truth, strict=True)]
        ttft_err = [(r.first_token_s - log[r.request_id]["writes_s"][0]) * 1000 for r in records]
        print(f"timing error at {args.streams} streams over {len(deltas)} chunks (client stamp - server write): "
              f"median {percentile(deltas, 50):.3f} ms, p90 {percentile(deltas, 90):.3f} ms, "
              f"p99 {percentile(deltas, 99):.3f} ms, max {max(deltas):.3f} ms; "
              f"first-token median {percentile(ttft_err, 50):.3f} ms")
        # 3. the open loop's schedule against a server slower than the arrival gap
        import tempfile

        from gemma4_t4.bench import run_benchmark

        slow_port = free_port()
        slow = start_fake(slow_port, "--ttft", "0.15", "--gap", "0.02")  # 8 tokens: ~0.3 s a request
        try:
            with tempfile.TemporaryDirectory(prefix="open-loop-") as tmp:
                run_ = run_benchmark(f"http://127.0.0.1:{slow_port}", "fake-model", "decode", tmp, rates=[8.0, 16.0],
                                     arrival="constant", input_len=32, output_len=8, num_prompts=12, progress=False)
        finally:
            slow.terminate()
            slow.wait(10)
            for cell in run_.cells:
                ol = cell.open_loop
                print(f"open loop at {ol.offered_rate_rps:g} req/s: achieved {ol.achieved_send_rate_rps:.2f} req/s, "
                      f"send lag median {ol.send_lag_ms.median:.2f} ms, max {ol.send_lag_ms.max:.2f} ms, "
                      f"peak in flight {ol.peak_in_flight}")
    finally:
        proc.terminate()
        proc.wait(10)


if __name__ == "__main__":
    main()
