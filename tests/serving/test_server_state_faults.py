"""A work dir's records when something broke them, and the commands its hints print (issue 41, lows).

One corrupt state file must not hide the other servers of its work dir, and its fix must not send the
user back to the command that failed; every printed fix carries the user's ``--work-dir``. Fast:
conftest's fake vLLM stands in for the server.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation.launch_record import DEFAULT_WORK_DIR
from gemma4_t4.serving.server import VLLMServer, list_servers
from gemma4_t4.serving.server_config import ServerConfig
from gemma4_t4.serving.server_state import free_port, machine_port_lock, pid_alive, state_path
from tests.serving.test_server_lifecycle import _config

REPO = Path(__file__).resolve().parents[2]

# what a state file can be after a full disk, a kill mid-write by an older version, or a hand edit
CORRUPT = {
    "empty": b"",
    "cut short": b'{"state": "runn',
    "not text": b"\xff\xfe\x00garbage",
    "a list": b"[]",
    "no config": b'{"pid": 12345, "state": "running"}',
}


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gemma4_t4", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=str(REPO), **(env or {})),
    )


def test_one_corrupt_state_file_leaves_the_other_servers_listed_and_is_named(fake_vllm, model_dir, tmp_path):
    work = tmp_path / "work"
    server = VLLMServer(_config(fake_vllm, model_dir, work, probe_cpu_attention=False))
    server.start(timeout=20)
    server.stop(grace=2)  # a stopped server stays recorded
    broken_port = free_port()
    broken = state_path(work, broken_port)
    for what, content in CORRUPT.items():
        broken.write_bytes(content)
        statuses = list_servers(work)  # before: one Gemma4T4Error for the whole work dir
        states = {s.port: s for s in statuses}
        assert states[server.config.port].state == "stopped", what
        bad = states[broken_port]
        assert bad.state == "unreadable" and str(broken) in bad.summary(), what
        assert "serve status" not in bad.hint and f"rm {broken}" in bad.hint, (what, bad.hint)
    done = _cli("serve", "status", "--work-dir", str(work))
    assert done.returncode == 1, done.stderr  # before: 2, "no readable server state …", nothing listed
    assert "stopped:" in done.stdout and str(broken) in done.stdout and "rm " in done.stdout


def test_a_corrupt_state_file_asked_for_by_port_names_itself_and_a_fix_that_does_not_loop(tmp_path):
    work = tmp_path / "work"
    broken = state_path(work, 8123)
    broken.parent.mkdir(parents=True)
    for what, content in CORRUPT.items():
        broken.write_bytes(content)
        with pytest.raises(Gemma4T4Error) as info:
            VLLMServer.attach(8123, work)
        assert str(broken) in info.value.message, what
        # before: "gemma4-t4 serve status lists the servers this work dir knows", which fails the same way
        assert "serve status" not in info.value.fix and f"rm {broken}" in info.value.fix, (
            what,
            info.value.fix,
        )
        with pytest.raises(Gemma4T4Error, match=str(broken)):
            VLLMServer.attach(None, work)  # the only record is that one: named too


def test_a_corrupt_state_files_fix_names_the_processes_its_supervisor_recorded_alive(tmp_path):
    work = tmp_path / "work"
    broken = state_path(work, 8124)
    broken.parent.mkdir(parents=True)
    broken.write_bytes(b"")
    me = psutil.Process()
    (broken.parent / "server-8124.super.json").write_text(
        json.dumps(
            {
                "supervisor_pid": me.pid,
                "children": [{"pid": me.pid, "create_time": me.create_time(), "name": "vllm"}],
            }
        )
    )
    (status,) = list_servers(work)
    assert f"pid {me.pid}" in status.hint and "before" in status.hint


def test_the_port_locks_fix_carries_the_holders_work_dir(fake_vllm, model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMA4_T4_CACHE_DIR", str(tmp_path / "cache"))
    first = VLLMServer(_config(fake_vllm, model_dir, tmp_path / "work A", probe_cpu_attention=False))
    # what a start in work A holds while its vLLM loads: the machine-wide port lock, naming this process
    lock = machine_port_lock(first.config.port)
    lock.acquire(first._lock_owner(os.getpid(), psutil.Process().create_time()))
    try:
        second = ServerConfig(
            model=str(model_dir),
            port=first.config.port,
            work_dir=str(tmp_path / "work B"),
            python=str(fake_vllm),
            probe_cpu_attention=False,
        )
        with pytest.raises(Gemma4T4Error, match=f"port-{first.config.port} is taken") as info:
            VLLMServer(second).start(timeout=20)
        # before: "gemma4-t4 serve stop --port P", which looks in the default work dir and finds nothing
        assert f"serve stop --port {first.config.port} --work-dir '{tmp_path / 'work A'}'" in info.value.fix
    finally:
        lock.release()


def test_the_supervisor_gone_hints_carry_the_work_dir(fake_vllm, model_dir, tmp_path):
    work = tmp_path / "work"
    server = VLLMServer(_config(fake_vllm, model_dir, work, probe_cpu_attention=False))
    server.start(timeout=20)
    api = None
    try:
        deadline = time.monotonic() + 20
        while api is None and time.monotonic() < deadline:
            record = json.loads(server.super_path.read_text()) if server.super_path.exists() else {}
            api = next((c for c in record.get("children", []) if c["pid"] == record.get("api_pid")), None)
            time.sleep(0.2)
        assert api is not None
        os.kill(server.pid, signal.SIGKILL)  # the supervisor dies; vLLM serves on
        server.process.wait()
        status = VLLMServer.attach(server.config.port, work).status()
        assert status.state == "unsupervised"
        # before: "gemma4-t4 serve adopt --port P …, serve stop --port P", the default work dir's commands
        port = server.config.port
        assert f"serve adopt --port {port} --work-dir {work}" in status.hint
        assert f"serve stop --port {port} --work-dir {work}" in status.hint
    finally:
        VLLMServer.attach(server.config.port, work).stop(grace=2)
        if api is not None and pid_alive(api["pid"], api["create_time"]):
            os.kill(api["pid"], signal.SIGKILL)


def test_a_port_with_no_server_in_another_work_dir_points_to_that_work_dirs_status(tmp_path, monkeypatch):
    work = tmp_path / "work"
    with pytest.raises(Gemma4T4Error, match="no server recorded on port 8125") as info:
        VLLMServer.attach(8125, work)
    assert f"gemma4-t4 serve status --work-dir {work}" in info.value.fix  # before: the default work dir's
    monkeypatch.chdir(tmp_path)  # the default work dir, given relative or absolute, needs no flag
    for default in (DEFAULT_WORK_DIR, tmp_path / DEFAULT_WORK_DIR):
        with pytest.raises(Gemma4T4Error) as info:
            VLLMServer.attach(8125, default)
        assert info.value.fix.startswith("gemma4-t4 serve status lists them"), info.value.fix
