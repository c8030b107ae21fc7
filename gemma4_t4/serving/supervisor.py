"""The supervisor: the small process that runs vLLM, watches its engine and records what happened.

``python -m gemma4_t4.serving.supervisor SPEC.json -- COMMAND...`` (the leader of the server's process
group) runs COMMAND and every second records every process under it with its start time in
``server-<port>.super.json`` (so ``serve status|stop`` find survivors even after a kill); it
watches the engine (``/health`` and ``/metrics`` failing after the server was up, or
``EngineDeadError`` / a dead worker in the log) and records why it died, read from the log; with
``restart_on_crash`` N > 0 it restarts vLLM up to N times (backing off 2, 4, 8 ... 60 s); at the end
it writes ``server-<port>.exit.json`` with vLLM's exit code and why. ``--adopt SPEC.json`` watches
the recorded processes of a vLLM whose supervisor died.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
from collections.abc import Iterable
from pathlib import Path
from typing import NotRequired

import psutil

from gemma4_t4.foundation.atomic import atomic_write_json
from gemma4_t4.foundation.jsonable import TypedDict
from gemma4_t4.foundation.launch_record import ProcessInfo
from gemma4_t4.foundation.net import http_get

POLL_S = 1.0
HEALTH_EVERY_S = 2.0
HEALTH_FAILURES = 3  # consecutive error answers from /health and /metrics that mean "engine dead"
SILENT_DEAD_S = 120.0  # no answer at all for this long (a hung API server); not less: a busy 2-core
# machine can time out a health check under load, and a false "dead" would kill a working server
BACKOFF_S = (2.0, 60.0)  # first wait, longest wait between restarts
DEAD_MARKERS = (
    "EngineDeadError", "died unexpectedly", "EngineCore encountered a fatal error", "Fatal Python error"
)


def engine_death_reason(log_text: str) -> str | None:
    """Why vLLM's engine died, from its log: the fatal signal and the op, or the first error line."""
    parts: list[str] = []
    fatal = re.search(r"Fatal Python error: (.+)", log_text)
    if fatal:
        what = fatal.group(1).strip()
        frames = "\n".join(log_text[fatal.end() :].splitlines()[1:30])  # the 29 lines after it
        ops = re.findall(r'File "[^"]*(?:_custom_ops|_ops)\.py", line \d+ in (\w+)', frames)
        op = next((o for o in ops if o != "__call__"), None)
        parts.append(f"{what} in {op}" if op else what)
    for pattern, label in (
        (r"Worker proc (\S+) died unexpectedly", "worker {0} died"),
        (r"(?:CUDA out of memory|OutOfMemoryError)", "out of GPU memory"),
        (r"EngineDeadError", "EngineDeadError"),
    ):
        found = re.search(pattern, log_text)  # the first line that says so
        if found:
            parts.append(label.format(*found.groups()))
    return "; ".join(dict.fromkeys(parts)) or None


def http_status(url: str) -> int | None:
    """The HTTP status ``url`` answers with; None when nothing answers."""
    try:
        return http_get(url)[0]
    except (OSError, urllib.error.URLError):
        return None


class SupervisorSpec(TypedDict):
    """``server-<port>.spec.json``: what the server hands its supervisor."""

    super_path: str
    exit_path: str
    log_path: str
    base_url: str
    restart_on_crash: int
    children: NotRequired[list[ProcessInfo]]  # adopting: the processes to watch
    api_pid: NotRequired[int]
    api_create_time: NotRequired[float]
    # the process that owns the server (a notebook kernel): when it is gone, the server stops
    owner_pid: NotRequired[int]
    owner_create_time: NotRequired[float | None]


class ExitEvent(TypedDict):
    """One end of vLLM under this supervisor (``history`` in the supervisor's record)."""

    ended_at: float
    exit_code: int | None
    reason: str | None


class SupervisorRecord(TypedDict, total=False):
    """``server-<port>.super.json``, kept by the supervisor while vLLM runs (read back by the server)."""

    supervisor_pid: int
    supervisor_create_time: float
    adopted: bool
    api_pid: int | None
    api_create_time: float | None
    children: list[ProcessInfo]
    engine: str  # starting / healthy / dead / restarting / stopped / exited
    engine_dead_reason: str | None
    restarts: int
    restart_on_crash: int
    history: list[ExitEvent]
    updated_at: float


class ExitRecord(TypedDict, total=False):
    """``server-<port>.exit.json``, written by the supervisor when it ends."""

    pid: int
    child_pid: int | None
    exit_code: int | None
    signal: str | None
    terminated_by: str | None
    engine_dead_reason: str | None
    restarts: int
    adopted: bool
    owner_exited: bool  # stopped because the process that owned it was gone
    # ended because it was told to (SIGTERM/SIGINT/SIGHUP to the server's processes, or its owner
    # gone) while the engine was not dead: a stop, not a crash, whatever code vLLM exited with
    # (vLLM turns SIGTERM into KeyboardInterrupt, so Python ends it "killed by SIGINT")
    orderly_stop: bool
    ended_at: float


def signal_name(exit_code: int | None) -> str | None:
    """The signal that killed vLLM, from its exit code (negative: killed by that signal)."""
    return signal.Signals(-exit_code).name if exit_code is not None and exit_code < 0 else None


def process_create_time(pid: int) -> float | None:
    """When ``pid`` started, or None if it is gone (or a zombie waiting to be reaped)."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc.create_time()
    except psutil.NoSuchProcess:
        return None
    except psutil.AccessDenied:
        return -1.0  # someone else's live process


def pid_alive(pid: int | None, create_time: float | None = None) -> bool:
    """True if ``pid`` runs and (when given) started at ``create_time``: a reused pid is not ours."""
    if not pid:
        return False
    started = process_create_time(pid)
    if started is None:
        return False
    return create_time is None or started < 0 or abs(started - create_time) < 1.0


def describe(proc: psutil.Process) -> ProcessInfo | None:
    with contextlib.suppress(psutil.Error):
        cmd = proc.cmdline()
        name = proc.name()
        if cmd and cmd[0].startswith("VLLM::"):
            name = cmd[0]
        elif "vllm.entrypoints.openai.api_server" in " ".join(cmd[:3]):
            name = "APIServer"
        return {"pid": proc.pid, "create_time": proc.create_time(), "name": name,
                "pgid": os.getpgid(proc.pid)}
    return None


def stop_recorded(recorded: Iterable[ProcessInfo], grace: float) -> None:
    """SIGTERM every recorded process that still runs as itself (a reused pid is another process),
    wait ``grace`` seconds, SIGKILL whoever is left."""
    procs = []
    for info in recorded:
        with contextlib.suppress(psutil.Error):
            if info["pid"] != os.getpid() and pid_alive(info["pid"], info["create_time"]):
                procs.append(psutil.Process(info["pid"]))
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=5)


class Supervisor:
    def __init__(self, spec: SupervisorSpec, command: list[str] | None):
        self.spec = spec
        self.command = command
        self.log_path = Path(spec["log_path"])
        self.base_url = spec["base_url"]
        self.restart_limit = int(spec.get("restart_on_crash") or 0)
        self.restarts = 0
        self.known: dict[int, ProcessInfo] = {}
        self.engine = "starting"
        self.reason: str | None = None
        self.history: list[ExitEvent] = []
        self.terminated: list[int] = []
        self.child: subprocess.Popen | None = None
        self.api_pid: int | None = None
        self.api_create_time: float | None = None
        self.log_offset = 0  # read up to here for the death markers
        self.run_offset = 0  # where this run of vLLM began writing
        self.last_write = 0.0
        self.owner_exited = False

    def write(self, force: bool = False) -> None:
        if not force and time.time() - self.last_write < 5.0:
            return
        self.last_write = time.time()
        record: SupervisorRecord = {
            "supervisor_pid": os.getpid(),
            "supervisor_create_time": psutil.Process().create_time(),
            "adopted": self.command is None,
            "api_pid": self.api_pid,
            "api_create_time": self.api_create_time,
            "children": list(self.known.values()),
            "engine": self.engine,
            "engine_dead_reason": self.reason,
            "restarts": self.restarts,
            "restart_on_crash": self.restart_limit,
            "history": self.history,
            "updated_at": time.time(),
        }
        atomic_write_json(self.spec["super_path"], record)

    def scan_children(self) -> None:
        found = []
        if self.command is not None:
            with contextlib.suppress(psutil.Error):
                found = psutil.Process().children(recursive=True)
        else:  # adopted: the recorded processes and whatever they spawn
            for info in list(self.known.values()):
                with contextlib.suppress(psutil.Error):
                    if pid_alive(info["pid"], info["create_time"]):
                        proc = psutil.Process(info["pid"])
                        found += [proc, *proc.children(recursive=True)]
        changed = False
        for proc in found:
            old = self.known.get(proc.pid)
            # vLLM renames its processes (VLLM::EngineCore) a moment after they start, and until then a
            # forked one shows the API server's command line: look again at all but the API server itself
            if old is None or not (old["name"].startswith("VLLM::") or proc.pid == self.api_pid):
                info = describe(proc)
                if info and info != old:
                    self.known[proc.pid] = info
                    changed = True
        self.write(force=changed)

    def read_log(self, offset: int) -> bytes:
        """vLLM's log from ``offset`` on (nothing while it cannot be read)."""
        with contextlib.suppress(OSError), open(self.log_path, "rb") as handle:
            handle.seek(offset)
            return handle.read()
        return b""

    def spawn(self) -> None:
        assert self.command is not None
        with contextlib.suppress(OSError):
            self.log_offset = self.run_offset = self.log_path.stat().st_size
        self.child = subprocess.Popen(self.command)
        self.api_pid = self.child.pid
        self.api_create_time = psutil.Process(self.child.pid).create_time()
        self.engine = "starting"
        self.reason = None
        self.scan_children()
        self.write(force=True)

    def api_alive(self) -> bool:
        if self.child is not None:
            return self.child.poll() is None
        return pid_alive(self.api_pid, self.api_create_time)

    def kill_tree(self, grace: float) -> None:
        """Stop what is left of this vLLM: API server and every recorded child."""
        stop_recorded(self.known.values(), grace)

    def check_owner(self) -> None:
        """The owner (a notebook kernel killed with SIGKILL never runs its atexit) is gone: stop,
        as if signalled. A pid reused by another process does not count as the owner."""
        owner = self.spec.get("owner_pid")
        if owner is None or self.owner_exited or pid_alive(owner, self.spec.get("owner_create_time")):
            return
        self.owner_exited = True
        self.terminated.append(signal.SIGTERM)

    def watch_once(self) -> bool:
        """One poll; True while vLLM (and its engine) is alive."""
        self.check_owner()
        if self.terminated:
            return False
        self.scan_children()
        new = self.read_log(self.log_offset)
        self.log_offset += len(new)
        if any(marker in new.decode(errors="replace") for marker in DEAD_MARKERS):
            self.marker = True
        if not self.api_alive():
            return False
        now = time.monotonic()
        if now - self.checked >= HEALTH_EVERY_S:
            self.checked = now
            health = http_status(self.base_url + "/health")
            if health == 200:
                if self.engine != "healthy":
                    self.engine = "healthy"
                    self.write(force=True)
                self.failures, self.silent_since = 0, None
            elif self.engine == "healthy":
                metrics = http_status(self.base_url + "/metrics")
                if metrics == 200:
                    self.failures, self.silent_since = 0, None
                elif health is None and metrics is None:
                    self.silent_since = self.silent_since or now
                else:
                    self.failures += 1
        if self.marker and self.engine == "healthy" or self.failures >= HEALTH_FAILURES:
            return False  # engine dead while the API process lingers: it would answer 500 forever
        return self.silent_since is None or time.monotonic() - self.silent_since <= SILENT_DEAD_S

    def run(self) -> int:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, lambda s, _f: self.terminated.append(s))
        if self.command is not None:
            self.spawn()
        else:
            self.adopt_recorded()
        while True:
            # the watch over one run of vLLM: last /health check, error answers in a row, a death marker
            # seen in the log, since when nothing answers at all
            self.checked, self.failures, self.marker, self.silent_since = 0.0, 0, False, None
            while not self.terminated and self.watch_once():
                time.sleep(POLL_S)
            if self.terminated:
                # a signal reached the whole group; an owner's exit reached nobody: stop vLLM here
                code = self.finish_child(grace=30.0, kill=self.owner_exited)
                break
            code = self.record_engine_death()
            if self.command is None or self.restarts >= self.restart_limit or not self.back_off():
                break
            self.restarts += 1
            self.known = {}
            self.spawn()
        self.kill_tree(grace=2.0)  # nothing of this server outlives its supervisor's record
        if self.engine != "dead":
            self.engine = "stopped" if self.terminated else "exited"
        self.write(force=True)
        self.write_exit(code)
        return 1 if code is None else code if code >= 0 else 128 - code

    def adopt_recorded(self) -> None:
        """Watch the processes a dead supervisor recorded, from the end of the log as it is now."""
        self.run_offset = self.log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        for info in self.spec.get("children", []):
            self.known[info["pid"]] = info
        self.api_pid, self.api_create_time = self.spec["api_pid"], self.spec["api_create_time"]
        self.engine = "healthy"
        self.write(force=True)

    def record_engine_death(self) -> int | None:
        """vLLM or its engine died on its own: stop what is left, record why; vLLM's exit code."""
        reason = engine_death_reason(self.read_log(self.run_offset).decode(errors="replace"))
        if self.api_alive():  # the engine died, the API server did not notice (or hangs)
            reason = reason or "/health and /metrics stopped answering"
        code = self.finish_child(grace=5.0, kill=True)
        self.kill_tree(grace=2.0)  # EngineCore / Worker left behind by a dead API server
        self.engine = "dead"
        self.reason = reason or (
            f"vLLM exited with code {code}" if code is not None else "the API server is gone"
        )
        self.history.append({"ended_at": time.time(), "exit_code": code, "reason": self.reason})
        return code

    def back_off(self) -> bool:
        """Wait before the next restart (2, 4, 8 ... 60 s); False when a stop came meanwhile."""
        wait = min(BACKOFF_S[0] * 2**self.restarts, BACKOFF_S[1])
        self.engine = "restarting"
        self.write(force=True)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and not self.terminated:
            self.check_owner()
            time.sleep(0.2)
        return not self.terminated

    def write_exit(self, code: int | None) -> None:
        ended: ExitRecord = {
            "pid": os.getpid(),
            "child_pid": self.api_pid,
            "exit_code": code,
            "signal": signal_name(code),
            "terminated_by": signal.Signals(self.terminated[0]).name if self.terminated else None,
            "engine_dead_reason": self.reason if self.engine == "dead" else None,
            "restarts": self.restarts,
            "adopted": self.command is None,
            "owner_exited": self.owner_exited,
            "orderly_stop": bool(self.terminated) and self.engine == "stopped",
            "ended_at": time.time(),
        }
        atomic_write_json(self.spec["exit_path"], ended)

    def finish_child(self, grace: float, kill: bool) -> int | None:
        """Wait for the API server to exit (``kill``: stop it first); its exit code when it is ours."""
        if kill and self.api_alive():
            self.kill_tree(grace=grace)
        if self.child is not None:
            try:
                return self.child.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.kill_tree(grace=2.0)
                return self.child.wait()
        # adopted: not our child, no exit code to read
        if self.terminated:
            self.kill_tree(grace=grace)
        return None


def main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[1] == "--":
        return Supervisor(json.loads(Path(argv[0]).read_text()), argv[2:]).run()
    if len(argv) == 2 and argv[0] == "--adopt":
        return Supervisor(json.loads(Path(argv[1]).read_text()), None).run()
    sys.stderr.write("usage: python -m gemma4_t4.serving.supervisor SPEC.json -- COMMAND... | --adopt SPEC.json\n")
    return 2


if __name__ == "__main__":  # pragma: no cover - exercised through VLLMServer in tests
    raise SystemExit(main(sys.argv[1:]))
