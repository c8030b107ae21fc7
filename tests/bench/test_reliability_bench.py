"""The benchmark as a careless or hostile user meets it: hung servers, SIGTERM, empty model lists,
an --out that is a file, malformed URLs, secrets, old and new results files. Against the bench
FAKE server (real HTTP, scripted replies); every refusal is one line with a fix, never a traceback."""

import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from fakes.bench_cli_args import bench_run_argv
from fakes.bench_runs import save_run
from fakes.fake_openai_server import FakeScript, FakeServer, FakeServerState

from gemma4_t4.bench import load_run, run_benchmark
from gemma4_t4.bench.results import BenchRun
from gemma4_t4.bench.schemas import SCHEMA
from gemma4_t4.cli import main as cli_main
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation.secrets import mask as redact
from gemma4_t4.serving.server_state import free_port

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "bench_results_v1"
REPO = Path(__file__).resolve().parents[2]


def _one_line_error(capsys, code, *needles):
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and "Traceback" not in err, err
    message, fix = err.strip().split("\n  fix: ")
    assert "\n" not in message and fix
    for needle in needles:
        assert needle in err, err
    return err


def test_a_server_that_accepts_but_never_answers_fails_each_request_at_the_timeout(tmp_path):
    with FakeServer(free_port(), FakeServerState(default=FakeScript(hang_s=30.0))) as server:
        run = run_benchmark(
            server.base_url,
            "fake-model",
            "decode",
            tmp_path / "hung",
            concurrency=[2],
            input_len=16,
            output_len=4,
            num_prompts=4,
            warmup=0,
            request_timeout_s=0.5,
            progress=False,
        )
    cell = run.cells[0]
    assert (cell.completed, cell.failed, cell.errors) == (0, 4, {"timeout": 4})
    # every request failed as a timeout: the 30 s hang was cut at 0.5 s (had the timeout not fired,
    # the fake would have answered after 30 s and the requests would have completed)
    assert run.status == "complete with failures"
    assert run.run.config["request_timeout_s"] == 0.5


def test_request_timeout_flag_is_validated(capsys, tmp_path):
    code = cli_main(
        [
            *bench_run_argv("http://127.0.0.1:9", "m", "decode"),
            "--out",
            str(tmp_path / "x"),
            "--request-timeout",
            "0",
        ]
    )
    _one_line_error(capsys, code, "--request-timeout")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_stop_signal_while_another_task_runs_cancels_the_run_and_leaves_no_task_traceback(caplog, sig):
    """The signal arrives while a task the run never awaits is running (as aiohttp's request writer
    does): it must cancel the run and surface as Terminated, not be kept by that task and printed by
    asyncio as "Task exception was never retrieved" (which a bench run's stderr showed under SIGTERM)."""
    import asyncio
    import gc

    from gemma4_t4.foundation import signals

    async def run() -> None:
        async def writer() -> None:
            os.kill(os.getpid(), sig)  # delivered while this task, not the run, is running
            await asyncio.sleep(30)

        background = asyncio.get_running_loop().create_task(writer())  # noqa: F841  (never awaited)
        await asyncio.sleep(30)

    started, signum, during_cleanup = time.monotonic(), None, None
    try:
        with signals.orderly_stop(redeliver=False):
            try:
                signals.run_to_completion(run)
            finally:  # the run's own cleanup, still inside the block: a second signal is ignored there
                during_cleanup = signal.getsignal(sig)
    except signals.Terminated as exc:
        signum = exc.signum
    assert during_cleanup is signal.SIG_IGN, during_cleanup
    gc.collect()  # the exception and its frames are gone: a task that kept the signal logs it now
    assert signum == sig and time.monotonic() - started < 10
    assert "never retrieved" not in caplog.text, caplog.text
    assert signal.getsignal(sig) is signal.SIG_DFL, "the default action is back after the block"


def test_sigterm_finalises_the_run_like_ctrl_c(tmp_path, fake_server_process):
    base_url = fake_server_process("--ttft", "0.3", "--gap", "0.05")
    out = tmp_path / "term"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    bench = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gemma4_t4",
            *bench_run_argv(base_url, "fake-model", "decode"),
            "--concurrency",
            "1",
            "--input-len",
            "16",
            "--output-len",
            "8",
            "--num-prompts",
            "40",
            "--warmup",
            "0",
            "--out",
            str(out),
            "--no-plots",
            "--json",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # wait until some requests are on disk
            records = out / "records.jsonl"
            if records.exists() and records.read_text().count("\n") >= 2:
                break
            time.sleep(0.1)
        bench.send_signal(signal.SIGTERM)
        _, err = bench.communicate(timeout=30)
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait(10)
    assert bench.returncode != 0 and b"Traceback" not in err, err
    run = load_run(out)
    assert run.status == "interrupted (SIGTERM)" and run.run.finished_at
    cell = run.cells[0]
    assert cell.partial and 2 <= cell.completed < 40


class _EmptyModels(http.server.BaseHTTPRequestHandler):
    """A server that is up but lists no model (vLLM still loading behind a proxy, or a misconfigured one)."""

    def do_GET(self):  # noqa: N802 - http.server's name
        body = json.dumps({"object": "list", "data": []}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_empty_model_list_is_a_one_line_error(capsys, tmp_path):
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _EmptyModels)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        code = cli_main(
            [
                *bench_run_argv(f"http://127.0.0.1:{httpd.server_port}", "m", "decode"),
                "--out",
                str(tmp_path / "x"),
            ]
        )
    finally:
        httpd.shutdown()
    _one_line_error(capsys, code, "lists no model", "serve status")
    assert not (tmp_path / "x").exists()


def test_out_that_is_a_file_is_refused_and_left_alone(capsys, tmp_path):
    target = tmp_path / "notes.txt"
    target.write_text("keep me")
    with FakeServer(free_port()) as server:
        code = cli_main(
            [
                *bench_run_argv(server.base_url, "fake-model", "answers"),
                "--out",
                str(target),
            ]
        )
    _one_line_error(capsys, code, "is a file")
    assert target.read_text() == "keep me"


@pytest.mark.parametrize(
    "url, needle",
    [
        ("http://127.0.0.1:8000 ", "space"),
        ("http://127.0.0.1 :8000", "space"),
        ("127.0.0.1:8000", "http"),
        ("sagemaker://us-east-2", "REGION/ENDPOINT"),
    ],
)
def test_malformed_base_urls_are_one_line_errors(capsys, tmp_path, url, needle):
    code = cli_main(
        [
            *bench_run_argv(url, "m", "decode"),
            "--out",
            str(tmp_path / "x"),
        ]
    )
    _one_line_error(capsys, code, needle)
    assert not (tmp_path / "x").exists()


def test_secrets_never_reach_the_results(tmp_path):
    key, launch_key = "sk-bench-4f9a1c", "vllm-key-77b2e0"
    launch = {
        "command": ["vllm", "serve", "m", "--api-key", launch_key, f"--api-key={launch_key}"],
        "env": {"VLLM_API_KEY": launch_key, "HF_TOKEN": launch_key},
        "config": {"max_num_seqs": 4},
    }
    with FakeServer(free_port()) as server:
        run = run_benchmark(
            server.base_url,
            "fake-model",
            "answers",
            tmp_path / "s",
            api_key=key,
            server_launch=launch,
            output_len=4,
            progress=False,
        )
    stored = "".join(p.read_text() for p in (tmp_path / "s").iterdir())
    assert key not in stored and launch_key not in stored
    assert key not in run.report().model_dump_json() and run.run.config["api_key_used"] is True
    assert run.cells[0].max_num_seqs == 4  # the launch record still did its job
    assert redact(["--api-key", "x", "--port", "1", "--hf-token=y"]) == [
        "--api-key",
        "***",
        "--port",
        "1",
        "--hf-token=***",
    ]
    assert redact({"prompt_tokens": 5, "completion_tokens": 3}) == {
        "prompt_tokens": 5,
        "completion_tokens": 3,
    }


def test_results_written_by_the_previous_version_still_load(tmp_path):
    """tests/data/bench_results_v1 was written by the dict-based results code before the models."""
    decode = load_run(FIXTURE / "decode")
    assert decode.status == "complete" and decode.run.label == "fixture"
    assert [c.concurrency for c in decode.cells] == [1, 2] and decode.cells[0].completed == 3
    assert decode.cells[0].derived.roofline.ceiling_tok_s == pytest.approx(171.9, abs=0.1)
    assert set(decode.per_stream_by_concurrency()) == {1, 2}
    assert decode.cell(concurrency=2).ttft_ms.median > 0
    assert len(decode.measured(decode.cells[0].cell)) == 3
    open_loop = load_run(FIXTURE / "open-loop")
    assert open_loop.cells[0].open_loop.offered_rate_rps == 20.0
    answers = load_run(FIXTURE / "answers")
    assert len(answers.answers()) == 20 and answers.answers()[0].question.startswith("What is the capital")
    # a round trip through the models keeps every field name the old files had
    copy = save_run(decode, tmp_path / "copy")
    old = json.loads((FIXTURE / "decode" / "summary.json").read_text())
    new = json.loads((copy / "summary.json").read_text())
    assert set(old["cells"][0]) <= set(new["cells"][0]) and new["schema"] == SCHEMA
    assert BenchRun.load(copy).cells == decode.cells


@pytest.mark.parametrize(
    "schema, needle, fix",
    [
        ("gemma4_t4.bench/2", "version 2", "upgrade"),
        ("gemma4_t4.bench/0", "version 0", "re-run"),
        ("somebody-else/1", "schema", "gemma4-t4 bench run"),
    ],
)
def test_other_results_versions_are_refused_clearly(tmp_path, schema, needle, fix):
    copy = save_run(load_run(FIXTURE / "decode"), tmp_path / "r")
    data = json.loads((copy / "summary.json").read_text())
    (copy / "summary.json").write_text(json.dumps(data | {"schema": schema}))
    with pytest.raises(Gemma4T4Error, match=needle) as err:
        load_run(copy)
    assert fix in err.value.fix


def test_edited_results_fail_validation_with_the_field_named(tmp_path):
    copy = save_run(load_run(FIXTURE / "decode"), tmp_path / "r")
    data = json.loads((copy / "summary.json").read_text())
    data["cells"][0]["completed"] = "many"
    (copy / "summary.json").write_text(json.dumps(data))
    with pytest.raises(Gemma4T4Error, match=r"cells\.0\.completed"):
        load_run(copy)
    (copy / "summary.json").write_text("[1, 2]")
    with pytest.raises(Gemma4T4Error, match="not a JSON object"):
        load_run(copy)


def test_results_are_models_and_a_newer_writers_fields_survive_in_model_extra(tmp_path):
    copy = save_run(load_run(FIXTURE / "decode"), tmp_path / "r")
    data = json.loads((copy / "summary.json").read_text())
    data["cells"][0]["joules_per_token"] = 0.25  # a field a newer writer added, here and in a nested model
    data["cells"][0]["ttft_ms"]["p999"] = 41.5
    (copy / "summary.json").write_text(json.dumps(data))
    cell = load_run(copy).cells[0]
    assert cell.model_extra == {"joules_per_token": 0.25} and cell.ttft_ms.model_extra == {"p999": 41.5}
    # read as models: no dict look-alike that would hide a misspelt field behind a None
    with pytest.raises(TypeError, match="not subscriptable"):
        cell["workload"]  # noqa: B018
    assert not hasattr(cell, "get") and not hasattr(cell.ttft_ms, "keys")
    again = json.loads((save_run(load_run(copy), tmp_path / "again") / "summary.json").read_text())
    assert again["cells"][0]["joules_per_token"] == 0.25 and again["cells"][0]["ttft_ms"]["p999"] == 41.5


def test_a_signal_handler_of_the_callers_own_is_left_to_run_inside_run_to_completion():
    """Only orderly_stop's handler is taken over: a caller's own SIGHUP handler still runs, and the run goes on."""
    import asyncio

    from gemma4_t4.foundation import signals

    seen: list[int] = []

    async def run() -> str:
        os.kill(os.getpid(), signal.SIGHUP)
        await asyncio.sleep(0.05)
        return "done"

    previous = signal.signal(signal.SIGHUP, lambda signum, _frame: seen.append(signum))
    try:
        assert signals.run_to_completion(run) == "done" and seen == [signal.SIGHUP]
    finally:
        signal.signal(signal.SIGHUP, previous)
