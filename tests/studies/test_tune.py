"""``gemma4-t4 tune`` on a stand-in T4 host (a stand-in ``nvidia-smi`` on PATH) with recorded
measurements (an injected server factory and benchmark runner returning typed results): the dry-run
plan, the profile a tune writes, ``serve start --target t4 --print-command`` following it, a profile
from another vLLM or GPU ignored with the message, and an interrupted tune leaving no profile."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import signal
from pathlib import Path

import pytest

from gemma4_t4.bench.results import BenchRun, RunInfo
from gemma4_t4.bench.schemas import CellSummary, LatencyStats, SpecDecode
from gemma4_t4.cli import main
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation import signals
from gemma4_t4.serving import launch_profile
from gemma4_t4.studies import tune

MODEL = "google/gemma-4-E2B-it-qat-w4a16-ct"
GPU = "Tesla T4"
# recorded per-stream decode tok/s (median, 95 % interval half-width) for each drafter setting
RECORDED = {
    1: {None: (100.0, 3.0), 1: (112.0, 3.0), 2: (124.0, 3.0), 3: (131.0, 3.0), 4: (127.0, 3.0), 5: (121.0, 3.0),
        6: (116.0, 3.0)},
    8: {None: (50.0, 2.0), 1: (49.0, 2.0), 2: (51.0, 2.0), 3: (48.0, 2.0), 4: (46.0, 2.0), 5: (45.0, 2.0),
        6: (44.0, 2.0)},
}  # fmt: skip

SMI = """#!/bin/sh
for a in "$@"; do case "$a" in --query-gpu=*) echo "0, {name}, 15360, 7.5, 535.183.01, 1590, 70.00"; exit 0;; esac; done
echo "| NVIDIA-SMI 535.183.01   Driver Version: 535.183.01   CUDA Version: 12.2 |"
"""


@pytest.fixture
def t4_host(tmp_path, monkeypatch) -> Path:
    """A stand-in T4 (nvidia-smi first on PATH) and a private cache; returns the cache folder."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(SMI.format(name=GPU))
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    cache = tmp_path / "cache"
    monkeypatch.setenv("GEMMA4_T4_CACHE_DIR", str(cache))
    return cache


class FakeServers:
    """The server factory's stand-in: records each launch's drafter and whether it was stopped."""

    def __init__(self) -> None:
        self.launches: list[dict[str, object]] = []

    @contextlib.contextmanager
    def __call__(self, config):
        launch = {"draft": config.draft, "n": config.num_draft_tokens, "running": True}
        self.launches.append(launch)
        try:
            yield type("Server", (), {"base_url": "http://127.0.0.1:9"})()
        finally:
            launch["running"] = False


def recorded_runner(interrupt_at: int | None = None):
    calls = []

    def run(args) -> BenchRun:
        calls.append(args)
        if interrupt_at is not None and len(calls) == interrupt_at:
            os.kill(os.getpid(), signal.SIGTERM)  # a real SIGTERM mid-tune
        c = args.spec.concurrency[0]
        n = None if "off" in args.out_dir else int(Path(args.out_dir).name.split("=")[1].split("-")[0])
        median, half = RECORDED[c][n]
        cell = CellSummary(
            cell=f"c{c}", workload="decode", concurrency=c, completed=args.spec.num_prompts,
            per_stream_tok_s=LatencyStats(n=args.spec.num_prompts, median=median, ci_low=median - half,
                                          ci_high=median + half),
            output_throughput_tok_s=median * c,
            spec_decode=None if n is None else SpecDecode(acceptance_rate=0.7, mean_accepted_length=1 + 0.7 * n,
                                                          source="/metrics"),
        )  # fmt: skip
        return BenchRun(
            dir=Path(args.out_dir), run=RunInfo(workload="decode", model=args.model), cells=[cell]
        )

    run.calls = calls
    return run


def verdict_source(tmp_path: Path):
    def source(key, work_dir):
        path = tmp_path / "prefill-verdict.json"
        heads = {"512": {"use_route": True, "min_tokens": 0, "why": "1.4-2.1x faster, error within 1.5x"}}
        path.write_text(json.dumps({"key": {"gpu": key.gpu}, "heads": heads}))
        return launch_profile.prefill_choice(path)

    return source


def _key():
    return launch_profile.host_key(MODEL, gpu_name=lambda: GPU)


def _tune(tmp_path, servers=None, runner=None):
    return tune.tune(
        MODEL, _key(), work_dir=tmp_path / "work",
        server_factory=servers or FakeServers(), bench_runner=runner or recorded_runner(),
        prefill_source=verdict_source(tmp_path), today=lambda: datetime.date(2026, 12, 1),
    )  # fmt: skip


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_dry_run_prints_the_plan_and_starts_nothing(t4_host, tmp_path, capsys):
    work = tmp_path / "work"
    code, out, _ = _cli(capsys, "tune", "--model", MODEL, "--dry-run", "--work-dir", str(work))
    assert code == 0, out
    assert f"tune plan for {MODEL} on {GPU}" in out and "nothing started" in out
    assert "google/gemma-4-E2B-it-qat-q4_0-unquantized-assistant" in out  # the drafter the on-cells use
    assert "7 server launches" in out and "prefill route: bench-prefill" in out
    code, out, _ = _cli(capsys, "tune", "--model", MODEL, "--dry-run", "--json")
    data = json.loads(out)
    cells = data["plan"]["cells"]
    assert data["started"] is False
    assert {(c["draft"], c["num_draft_tokens"], c["concurrency"]) for c in cells} == {
        ("off", None, 1), ("off", None, 8), *(("auto", n, c) for n in range(1, 7) for c in (1, 8))
    }  # fmt: skip
    assert all(c["workload"] == "decode" and c["estimated_s"] > 0 for c in cells)
    assert not work.exists() and not t4_host.exists()
    code, _, err = _cli(capsys, "tune", "--model", MODEL, "--dry-run", "--minutes", "1")
    assert code == 2 and "--minutes" in err and "fix:" in err
    for nonsense in ("nan", "inf", "-1", "0"):
        code, _, err = _cli(capsys, "tune", "--model", MODEL, "--dry-run", "--minutes", nonsense)
        assert code == 2 and "must be a positive number" in err, err


def test_tune_without_a_gpu_says_where_to_run_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi anywhere
    code, _, err = _cli(capsys, "tune", "--model", MODEL, "--dry-run")
    assert code == 2 and "nvidia-smi shows none" in err and "fix:" in err


def test_a_tune_writes_one_profile_with_the_measured_choices(t4_host, tmp_path):
    servers, runner = FakeServers(), recorded_runner()
    profile, path = _tune(tmp_path, servers, runner)
    assert path.parent == t4_host / "tune" and path.is_file()
    assert [f.name for f in path.parent.iterdir()] == [path.name]  # no temporary left behind
    # one launch per setting, each stopped; the launch's own drafter setting
    assert [(s["draft"], s["n"]) for s in servers.launches] == [("off", 3)] + [
        ("auto", n) for n in range(1, 7)
    ]
    assert not any(s["running"] for s in servers.launches)
    assert len(runner.calls) == 14 and {a.workload for a in runner.calls} == {"decode"}
    single, batch = profile.choice(1), profile.choice(8)
    assert (single.draft, single.num_draft_tokens, single.speedup) == ("auto", 3, 1.31)
    assert single.speedup_ci_low == pytest.approx(128 / 103, abs=1e-3)  # on's low / off's high > 1
    assert batch.draft == "off" and "not beyond noise" in batch.why  # N=2 at c=8 is 1.02x, inside noise
    assert profile.prefill.route_on and "head 512" in profile.prefill.why
    stored = json.loads(path.read_text())
    assert stored["key"] == _key().model_dump() and stored["measured_on"] == "2026-12-01"
    assert {c["num_draft_tokens"]: c["acceptance_rate"] for c in stored["cells"] if c["concurrency"] == 1}[
        3
    ] == 0.7


def test_serve_start_follows_the_profile_measured_here(t4_host, tmp_path, capsys):
    _tune(tmp_path)
    code, out, _ = _cli(capsys, "serve", "start", "--target", "t4", "--print-command", "--work-dir",
                        str(tmp_path / "w"), "--json")  # fmt: skip
    data = json.loads(out)
    assert code == 0
    assert data["speculative_config"]["num_speculative_tokens"] == 3
    reason = data["chosen_by"]["draft"]
    assert reason.startswith(f"measured here on {GPU} on 2026-12-01: drafter N=3, 1.31x at c=1")
    assert "off at c=8" in reason and "prefill route on" in reason
    # an explicit --draft wins over the profile
    code, out, _ = _cli(
        capsys, "serve", "start", "--target", "t4", "--print-command", "--draft", "off", "--json"
    )
    assert json.loads(out)["speculative_config"] is None


def test_without_a_profile_the_launch_says_what_tune_would_measure(t4_host, capsys):
    code, out, _ = _cli(capsys, "serve", "start", "--target", "t4", "--print-command")
    assert code == 0
    assert "no tune profile: drafter off (safe default)" in out and "gemma4-t4 tune --model" in out
    assert "--speculative-config" not in out.split("\n")[1]


@pytest.mark.parametrize(("field", "other"), [("vllm", "0.31.0"), ("gpu", "NVIDIA L4")])
def test_a_profile_from_another_vllm_or_gpu_is_ignored_with_the_message(
    t4_host, tmp_path, capsys, field, other
):
    profile, path = _tune(tmp_path)
    foreign = profile.model_copy(update={"key": profile.key.model_copy(update={field: other})})
    path.unlink()
    from gemma4_t4.foundation.atomic import atomic_write_json

    atomic_write_json(launch_profile.profile_path(foreign.key), foreign.model_dump(mode="json"))
    code, out, _ = _cli(capsys, "serve", "start", "--target", "t4", "--print-command", "--json")
    data = json.loads(out)
    assert code == 0 and data["speculative_config"] is None
    here = profile.key.vllm if field == "vllm" else GPU
    assert (
        f"tune profile ignored, measured with another {field} {other} (here {here})"
        in data["chosen_by"]["draft"]
    )


@pytest.mark.parametrize("stop", ["sigterm", "ctrl-c"])
def test_an_interrupted_tune_leaves_no_profile_and_no_server(t4_host, tmp_path, stop):
    servers = FakeServers()
    runner = recorded_runner(interrupt_at=5) if stop == "sigterm" else recorded_runner()
    if stop == "ctrl-c":
        original = runner

        def runner(args):  # noqa: F811 - Ctrl-C on the fifth measurement
            if len(original.calls) == 4:
                raise KeyboardInterrupt
            return original(args)

    with pytest.raises(KeyboardInterrupt) as raised, signals.orderly_stop(redeliver=False):
        _tune(tmp_path, servers, runner)
    if stop == "sigterm":
        assert isinstance(raised.value, signals.Terminated)
    assert len(servers.launches) == 3 and not any(s["running"] for s in servers.launches)
    assert not (t4_host / "tune").exists() or not any((t4_host / "tune").iterdir())


def test_a_flushed_stream_is_named_not_tuned_on(t4_host, tmp_path):
    """A server that sent each answer in one flush gives no per-stream rate: tune says so, by the
    flush, instead of comparing empty figures."""
    from gemma4_t4.bench.schemas import BufferedDelivery

    def flushed(args) -> BenchRun:
        cell = CellSummary(cell="c1", workload="decode", concurrency=args.spec.concurrency[0], completed=4,
                           buffered=BufferedDelivery(requests=4, completed=4, tokens=32, span_ms=0.25))
        return BenchRun(dir=Path(args.out_dir), run=RunInfo(workload="decode", model=args.model), cells=[cell])

    with pytest.raises(Gemma4T4Error, match="32 tokens in one flush") as refused:
        _tune(tmp_path, runner=flushed)
    assert "streams its tokens" in refused.value.fix
