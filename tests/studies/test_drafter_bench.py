"""The drafter step's orchestration (notebook 4), against the FAKE OpenAI server with injected
timings (tests/fakes/fake_openai_server.py): two launches (off, then the drafter), each stopped, the answers
compared, the speed-up from end-to-end tok/s, and a side whose runs failed shown as not measured."""

from __future__ import annotations

import os
import signal
import threading

import pytest
from fakes.fake_openai_server import FakeScript, FakeServer, FakeServerState

from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation import signals
from gemma4_t4.serving.server_config import ServerConfig
from gemma4_t4.serving.server_state import free_port
from gemma4_t4.studies.drafter_bench import drafter_on_off

# seconds between streamed tokens, drafter off and on: the drafter side answers faster per token (by how
# much is not asserted; each side's answers sleep 20 x 32 gaps, so the gaps are kept short)
GAPS = {False: 0.002, True: 0.001}


class FakeLaunch:
    """Stands in for a started VLLMServer: the drafter launch answers faster per token."""

    def __init__(self, config, gaps, started, status=200, flush=False):
        self.config = config
        gap = gaps[config.draft != "off"]
        script = FakeScript(ttft_s=0.01, gap_s=gap, http_status=status if config.draft != "off" else 200,
                            flush=flush)
        self.fake = FakeServer(free_port(), FakeServerState(default=script)).start()
        self.stopped = False
        started.append(self)

    @property
    def base_url(self):
        return self.fake.base_url

    def stop(self):
        self.fake.stop()
        self.stopped = True


def _config(model_dir):
    return ServerConfig(model=str(model_dir), target="cpu", served_model_name="fake-model", port=free_port(),
                        max_model_len=2048, work_dir="unused")


def test_off_then_on_each_stopped_with_speedup_and_answers(tiny_model_dir, tiny_drafter_dir, tmp_path):
    started = []
    # 64 tokens: a stream spans 63-126 ms, so a worker stalled a few ms on a busy machine still reads
    # it token by token (at 8 tokens, a stalled read once took a whole stream as one flush)
    result = drafter_on_off(_config(tiny_model_dir), str(tiny_drafter_dir), tmp_path, output_len=64, num_prompts=2,
                            start=lambda cfg: FakeLaunch(cfg, GAPS, started),
                            tokenizer=str(tiny_model_dir))
    assert [s.config.draft for s in started] == ["off", str(tiny_drafter_dir)]
    assert all(s.stopped for s in started) and started[0].config.port != started[1].config.port
    assert result.off.not_measured is None and result.on.not_measured is None
    # the speed-up is on / off end-to-end tok/s (how large it comes out times this machine: not asserted)
    assert result.off.tok_s > 0 and result.on.tok_s > 0
    assert result.speedup == pytest.approx(result.on.tok_s / result.off.tok_s)
    assert result.answers.measured and result.answers.total == 20
    assert result.on.acceptance_rate is None  # the fake exposes no spec-decode counters: none invented
    assert [r["drafter"] for r in result.table_rows()] == ["drafter off", f"drafter on ({tiny_drafter_dir})"]
    assert all(isinstance(side.tpot_ms, float) and side.tpot_ms > 0 for side in (result.off, result.on))


def test_answers_in_one_flush_have_no_streamed_tpot_only_the_reason(tiny_model_dir, tiny_drafter_dir, tmp_path):
    started = []
    result = drafter_on_off(_config(tiny_model_dir), str(tiny_drafter_dir), tmp_path, output_len=8, num_prompts=2,
                            start=lambda cfg: FakeLaunch(cfg, GAPS, started, flush=True),
                            tokenizer=str(tiny_model_dir))
    for side, row in zip((result.off, result.on), result.table_rows(), strict=True):
        assert side.tpot_ms.startswith("not measured: the server delivered 8 tokens in one flush"), side.tpot_ms
        assert row["streamed TPOT ms"] == side.tpot_ms
        assert side.tok_s > 0  # end-to-end tok/s times the whole generation: still a figure
    assert result.speedup == pytest.approx(result.on.tok_s / result.off.tok_s)


def test_a_failed_drafter_side_is_not_measured(tiny_model_dir, tiny_drafter_dir, tmp_path):
    started = []
    result = drafter_on_off(_config(tiny_model_dir), str(tiny_drafter_dir), tmp_path, output_len=4, num_prompts=2,
                            start=lambda cfg: FakeLaunch(cfg, {False: 0.002, True: 0.002}, started, status=500),
                            tokenizer=str(tiny_model_dir))
    assert all(s.stopped for s in started)
    assert result.on.not_measured and result.speedup is None
    assert not result.answers.measured and "not measured" in result.line()
    assert result.table_rows()[1]["tok/s (c=1)"].startswith("not measured")


def test_a_mismatched_drafter_is_refused_before_any_launch(tiny_model_dir, tmp_path):
    started = []
    with pytest.raises(Gemma4T4Error):
        drafter_on_off(_config(tiny_model_dir), str(tiny_model_dir), tmp_path,  # a target, not an assistant
                       start=lambda cfg: started.append(cfg))
    assert started == []


class RunningEndpoint:
    """Stands in for notebook 4's Endpoint: already serving, with ``url`` and ``stop()``; records when
    it was stopped relative to the launches."""

    def __init__(self, config, started):
        self.launch = FakeLaunch(config, GAPS, [])
        self.url = self.launch.base_url
        self.started = started
        self.launches_before_stop: int | None = None

    def stop(self):
        if self.launches_before_stop is None:
            self.launches_before_stop = len(self.started)
        self.launch.stop()


def test_a_running_server_without_a_drafter_is_the_off_side_and_stopped_before_the_drafter_starts(
    tiny_model_dir, tiny_drafter_dir, tmp_path
):
    started = []
    config = _config(tiny_model_dir).replaced(draft="off")
    running = RunningEndpoint(config, started)
    result = drafter_on_off(config, str(tiny_drafter_dir), tmp_path, output_len=8, num_prompts=2,
                            start=lambda cfg: FakeLaunch(cfg, GAPS, started),
                            tokenizer=str(tiny_model_dir), running=running)
    assert [s.config.draft for s in started] == [str(tiny_drafter_dir)]  # one launch: the drafter's
    assert running.launches_before_stop == 0 and running.launch.stopped and started[0].stopped
    assert result.off.not_measured is None and result.off.tok_s > 0
    assert result.off.decode.run.base_url == running.url  # measured on the running server
    assert result.answers.measured and result.answers.total == 20


def test_a_running_server_with_a_drafter_is_stopped_first_and_both_sides_launch(
    tiny_model_dir, tiny_drafter_dir, tmp_path
):
    started = []
    config = _config(tiny_model_dir).replaced(draft=str(tiny_drafter_dir))
    running = RunningEndpoint(config, started)
    result = drafter_on_off(config, str(tiny_drafter_dir), tmp_path, output_len=4, num_prompts=2,
                            start=lambda cfg: FakeLaunch(cfg, GAPS, started),
                            tokenizer=str(tiny_model_dir), running=running)
    assert running.launches_before_stop == 0  # freed before any launch (one GPU)
    assert [s.config.draft for s in started] == ["off", str(tiny_drafter_dir)] and all(s.stopped for s in started)
    assert result.off.decode.run.base_url == started[0].base_url


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_during_the_reused_off_side_stops_the_running_server_and_launches_nothing(
    tiny_model_dir, tiny_drafter_dir, tmp_path, signum
):
    started = []
    config = _config(tiny_model_dir).replaced(draft="off")
    running = RunningEndpoint(config, started)
    running.launch.fake.state.default = FakeScript(ttft_s=0.01, gap_s=0.05)  # ~3 s a request: the signal lands mid-run
    timer = threading.Timer(1.0, os.kill, (os.getpid(), signum))
    timer.start()
    try:
        with pytest.raises(signals.Terminated):
            drafter_on_off(config, str(tiny_drafter_dir), tmp_path, output_len=64, num_prompts=8,
                           start=lambda cfg: FakeLaunch(cfg, GAPS, started),
                           tokenizer=str(tiny_model_dir), running=running)
    finally:
        timer.cancel()
    assert running.launch.stopped and started == []
