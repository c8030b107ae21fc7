"""Server lifecycle faults, fast: a fake vLLM executable (conftest's ``fake_vllm``) stands in where the
real server can't be made to die on cue (it answers /health, then exits with a chosen code). The real
vLLM CPU server is exercised in test_server_cpu.py and test_server_cli.py."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import psutil
import pytest

from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.serving.server import VLLMServer, list_servers, stop_server
from gemma4_t4.serving.server_config import ServerConfig, build_command
from gemma4_t4.serving.server_state import ServerLock, free_port, lock_keys


def _config(fake: Path, model: Path, work: Path, mode: str = "serve", **kw) -> ServerConfig:
    return ServerConfig(
        model=str(model),
        port=free_port(),
        work_dir=str(work),
        python=str(fake),
        extra_env={"FAKE_VLLM_MODE": mode},
        **kw,
    )


def _wait_state(server: VLLMServer, state: str, timeout: float = 15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = server.status()
        # "dead" is final once the supervisor has cleaned up (before that the hint says it is stopping)
        if status.state == state and "stopping what is left" not in (status.hint or ""):
            return status
        time.sleep(0.2)
    raise AssertionError(f"never reached {state}: {server.status()}")


def test_dies_mid_run_is_reported_dead_with_exit_code_and_log_tail(fake_vllm, model_dir, tmp_path):
    server = VLLMServer(_config(fake_vllm, model_dir, tmp_path / "work", mode="die:1.5"))
    server.start(timeout=20)
    try:
        assert server.status().state == "running"
        status = _wait_state(server, "dead")
        assert status.exit_code == 7
        assert "fake EngineCore died unexpectedly" in status.log_tail
        assert status.hint and "log" in status.hint
        # another process (here: a fresh object from the state file) sees the same
        other = VLLMServer.attach(server.config.port, tmp_path / "work").status()
        assert (other.state, other.exit_code) == ("dead", 7)
        assert "fake EngineCore died" in other.log_tail
        assert not list((tmp_path / "work" / "locks").glob("*.lock")), "a dead server's locks are released"
        assert server.stop() == 7 and server.status().state == "dead", "stop() does not hide a crash"
    finally:
        server.stop(grace=2)


def test_exit_before_healthy_raises_with_log_tail_and_frees_locks(fake_vllm, model_dir, tmp_path):
    server = VLLMServer(_config(fake_vllm, model_dir, tmp_path / "work", mode="fail"))
    with pytest.raises(Gemma4T4Error) as info:
        server.start(timeout=20)
    message = str(info.value)
    assert "exited with code 1" in message
    assert "fake vllm could not load the model" in message  # the log tail
    assert str(server.log_path) in message
    assert not list((tmp_path / "work" / "locks").glob("*.lock"))
    assert json.loads(server.state_path.read_text())["state"] == "dead"


def test_missing_model_path_is_named_before_launch(tmp_path):
    missing = tmp_path / "no-such-model"
    server = VLLMServer(ServerConfig(model=str(missing), port=free_port(), work_dir=str(tmp_path / "w")))
    with pytest.raises(Gemma4T4Error) as info:
        server.start()
    assert str(missing) in str(info.value) and info.value.fix
    assert server.pid is None


def test_port_in_use_is_refused(model_dir, tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        server = VLLMServer(ServerConfig(model=str(model_dir), port=port, work_dir=str(tmp_path / "w")))
        with pytest.raises(Gemma4T4Error, match=f"port {port} .* already in use"):
            server.start()
    assert server.pid is None


def test_stop_from_another_process_state_and_lock(fake_vllm, model_dir, tmp_path):
    work = tmp_path / "work"
    server = VLLMServer(_config(fake_vllm, model_dir, work, target="cpu"))
    server.start(timeout=20)
    try:
        assert [s.state for s in list_servers(work)] == ["running"]
        lock = ServerLock(work / "locks" / f"port-{server.config.port}.lock")
        assert lock.holder()["pid"] == server.pid
        record = server.launch_record
        assert record["command"][1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
        assert {"vllm", "torch", "transformers", "python"} <= set(record["versions"])
        assert record["env"]["VLLM_TARGET_DEVICE"] == "cpu"
        # stop_server is what `gemma4-t4 serve stop` calls from a separate process
        status = stop_server(server.config.port, work, grace=5)
        assert status.state == "stopped" and status.exit_code is not None
        assert lock.holder() is None and not lock.path.exists()
        assert server.status().state == "stopped"  # the launching object agrees
    finally:
        server.stop(grace=2)


def test_a_with_block_starts_the_server_and_stops_it_on_leaving(fake_vllm, model_dir, tmp_path):
    """The studies' default factories (the TTFT route's VLLMServer, tune's start_server) hand their server
    to a with block: entering starts one not yet started, leaving stops it, an exception included."""
    work = tmp_path / "work"
    with pytest.raises(RuntimeError, match="inside the block"), VLLMServer(
        _config(fake_vllm, model_dir, work, target="cpu")
    ) as server:
        assert server.status().state == "running" and server.healthy()
        raise RuntimeError("inside the block")
    assert server.status().state == "stopped" and not server.survivors()


def test_gpu_lock_refuses_a_second_server_and_stale_lock_is_taken_over(fake_vllm, model_dir, tmp_path):
    work = tmp_path / "work"
    first = _config(fake_vllm, model_dir, work, target="t4", extra_args=[])
    first.extra_env["CUDA_VISIBLE_DEVICES"] = "0"
    assert lock_keys(first) == [f"port-{first.port}", "gpu-0"]
    server = VLLMServer(first)
    server.start(timeout=20)
    try:
        second = _config(fake_vllm, model_dir, work, target="t4")
        second.extra_env["CUDA_VISIBLE_DEVICES"] = "0"
        with pytest.raises(Gemma4T4Error, match=f"gpu-0 is taken by server pid {server.pid}") as info:
            VLLMServer(second).start(timeout=20)
        assert f"serve stop --port {first.port}" in info.value.fix
    finally:
        server.stop(grace=2)
    # a lock left by a process that no longer exists is stale
    stale = ServerLock(work / "locks" / "gpu-0.lock")
    stale.path.write_text(json.dumps({"pid": 2**22 - 3, "create_time": 1.0, "port": 1}))
    third = _config(fake_vllm, model_dir, work, target="t4")
    third.extra_env["CUDA_VISIBLE_DEVICES"] = "0"
    server = VLLMServer(third)
    server.start(timeout=20)
    try:
        assert ServerLock(stale.path).holder()["pid"] == server.pid
    finally:
        server.stop(grace=2)


def test_api_key_is_masked_in_records(fake_vllm, model_dir, tmp_path):
    server = VLLMServer(_config(fake_vllm, model_dir, tmp_path / "work", api_key="s3cret"))
    server.start(timeout=20)
    try:
        assert "s3cret" not in json.dumps(server.launch_record)
        assert "s3cret" not in server.state_path.read_text()
        # the key went to vLLM as VLLM_API_KEY (masked in the record), never in argv (ps shows argv)
        assert "--api-key" not in server.launch_record["command"]
        assert server.launch_record["env"]["VLLM_API_KEY"] == "***"
        assert "s3cret" not in " ".join(psutil.Process(server.pid).cmdline())
    finally:
        server.stop(grace=2)


def test_t4_command_flags():
    config = ServerConfig(
        model="google/gemma-4-E2B-it",
        target="t4",
        tensor_parallel_size=4,
        language_model_only=True,
        enable_prefix_caching=False,
        enforce_eager=False,
    )
    cmd = build_command(config)
    assert cmd[cmd.index("--dtype") + 1] == "float16"
    assert cmd[cmd.index("--tensor-parallel-size") + 1] == "4"
    assert "--language-model-only" in cmd and "--no-enable-prefix-caching" in cmd
    assert "--enforce-eager" not in cmd and "--block-size" not in cmd
    assert cmd[cmd.index("--gpu-memory-utilization") + 1] == "0.9"


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"target": "t4", "dtype": "bfloat16"}, "no bf16"),
        ({"host": "0.0.0.0"}, "without an API key"),
        ({"port": 0}, "port=0 must be in 1024..65535"),
        ({"target": "a100"}, "target='a100': Input should be 't4' or 'cpu'"),
    ],
)
def test_bad_config_is_refused(kwargs, match):
    with pytest.raises(Gemma4T4Error, match=match):
        build_command(ServerConfig(model="m/x", **kwargs))


def test_attach_without_a_recorded_server_names_the_fix(tmp_path):
    with pytest.raises(Gemma4T4Error) as info:
        VLLMServer.attach(work_dir=tmp_path)
    assert "serve start" in info.value.fix
    assert os.listdir(tmp_path) == []


def test_a_signalled_stop_reads_as_stopped_and_a_crash_still_as_dead(fake_vllm, model_dir, tmp_path):
    """An owner (the MCP server) SIGTERMs the server's processes and is itself ended before it records
    the stop: vLLM turns SIGTERM into KeyboardInterrupt and exits "killed by SIGINT". The supervisor
    was told to stop, so `serve status` says stopped (exit 0). vLLM killed on its own is still dead."""
    import signal
    import subprocess
    import sys

    from conftest import FAKE_VLLM

    like_vllm = tmp_path / "fake_vllm_sigint"  # the FAKE vLLM, ending on SIGTERM the way vLLM does
    like_vllm.write_text(FAKE_VLLM.format(python=sys.executable).replace(
        "import http.server, os, sys, threading, time",
        "import http.server, os, signal, sys, threading, time\n"
        "def _stop(*_):\n    raise KeyboardInterrupt('terminated')\n"
        "signal.signal(signal.SIGTERM, _stop)",
    ))
    like_vllm.chmod(0o755)
    work = tmp_path / "work"

    def status_cli(port: int) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "gemma4_t4", "serve", "status", "--port", str(port),
                               "--work-dir", str(work)], capture_output=True, text=True, timeout=120)

    server = VLLMServer(_config(like_vllm, model_dir, work))
    server.start(timeout=20)
    try:
        os.killpg(server.pid, signal.SIGTERM)  # the owner's stop, cut short before it wrote "stopped"
        server.process.wait(30)
        status = VLLMServer.attach(server.config.port, work).status()
        assert status.exit_signal == "SIGINT"  # what vLLM's own exit looks like
        done = status_cli(server.config.port)
        assert done.returncode == 0 and done.stdout.startswith("stopped"), done.stdout
        assert "orderly stop" in done.stdout and "killed by" not in done.stdout
    finally:
        server.stop(grace=2)

    crashed = VLLMServer(_config(fake_vllm, model_dir, work))
    crashed.start(timeout=20)
    try:
        api = next(p for p in psutil.Process(crashed.pid).children() if p.pid != crashed.pid)
        api.kill()  # nobody asked it to stop: a crash
        _wait_state(crashed, "dead")
        done = status_cli(crashed.config.port)
        assert done.returncode == 1 and done.stdout.startswith("dead") and "SIGKILL" in done.stdout, done.stdout
    finally:
        crashed.stop(grace=2)
