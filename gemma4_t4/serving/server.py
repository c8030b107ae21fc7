"""One launch path for a vLLM OpenAI-compatible server: T4 (CUDA) and CPU targets.

Notebooks, the CLI and the MCP server all start vLLM through :func:`start_server` /
:class:`VLLMServer`, so flags never drift. It runs detached in its own process group, logs to a file,
is waited on through ``/health`` and stopped with SIGTERM then SIGKILL of the whole group. Its files
under ``work_dir``: :mod:`gemma4_t4.serving.server_state`.
"""

from __future__ import annotations

import contextlib
import os
import platform
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any, cast

import psutil

from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation import secrets
from gemma4_t4.foundation.atomic import atomic_write_json
from gemma4_t4.foundation.jsonable import to_jsonable
from gemma4_t4.foundation.launch_record import DEFAULT_WORK_DIR, LaunchRecord, ProcessInfo
from gemma4_t4.serving.gate import check_start
from gemma4_t4.serving.server_config import LaunchPlan, ServerConfig, plan_launch, server_tmp_dir
from gemma4_t4.serving.server_state import (
    LockOwner,
    ServerLock,
    ServerOwner,
    UnreadableState,
    lock_keys,
    machine_port_lock,
    masked_config,
    port_in_use,
    read_json,
    runtime_versions,
    serve_command,
    state_files,
    state_path,
)
from gemma4_t4.serving.server_status import RecordedServer, ServerStatus
from gemma4_t4.serving.supervisor import (
    SupervisorRecord,
    SupervisorSpec,
    pid_alive,
    process_create_time,
    stop_recorded,
)

STOP_GRACE_S = 30.0


class VLLMServer(RecordedServer):
    """A vLLM server subprocess: a context manager, or start()/stop(). ``attach(port, work_dir)``
    rebuilds one from its state file in another process (the CLI's ``serve stop|status|logs``)."""

    gate_result: Any = None  # set by start_server: what the start gate decided
    reaped: Sequence[ProcessInfo] = ()  # a dead predecessor's processes killed by start()
    _log_file: Any = None

    def _lock_owner(self, pid: int | None, create_time: float | None) -> LockOwner:
        """What this server's lock files hold: the process that holds them now."""
        config = self.config
        return {
            "pid": pid,
            "create_time": create_time,
            "port": config.port,
            "target": config.target,
            "log_path": str(self.log_path),
            "acquired_at": time.time(),
            "work_dir": str(Path(config.work_dir).resolve()),
        }

    def _spawn_supervisor(
        self, log: IO[bytes], command: list[str] | None = None, env: dict[str, str] | None = None, **more: Any
    ) -> subprocess.Popen:
        """Start the supervisor detached, in its own process group (a stop reaches EngineCore and workers):
        it runs vLLM's ``command`` (or, without one, adopts the processes ``more`` names), records its
        processes, watches the engine and records its exit, so a server that dies is reported as dead
        with its code and reason even by another process (serve status). Its spec says where its records
        go, and ``more``: its restarts, the owner it watches, the processes it adopts. The supervisor is
        then the server (its pid, and the holder of its locks)."""
        spec: SupervisorSpec = {
            "super_path": str(self.super_path),
            "exit_path": str(self.exit_path),
            "log_path": str(self.log_path),
            "base_url": self.base_url,
            "restart_on_crash": 0,
            **more,  # type: ignore[typeddict-item]
        }
        spec_path = self.state_path.with_suffix(".spec.json")
        atomic_write_json(spec_path, spec)
        with contextlib.suppress(FileNotFoundError):
            self.exit_path.unlink()
        args = [str(spec_path), "--", *command] if command else ["--adopt", str(spec_path)]
        process = subprocess.Popen(
            [sys.executable, "-m", "gemma4_t4.serving.supervisor", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        self.pid, self.pid_create_time = process.pid, process_create_time(process.pid)
        self._stopped = False
        owner = self._lock_owner(self.pid, self.pid_create_time)  # the locks pass to it (a new one after an adopt)
        for lock in self._locks:
            atomic_write_json(lock.path, owner)
        return process

    def start(self, wait: bool = True, timeout: float = 600.0) -> VLLMServer:
        config = self.config
        config.validate()
        if self._alive():
            raise Gemma4T4Error(f"server already running (pid {self.pid})", fix="stop() it first")
        if not _looks_like_hub_id(config.model) and not Path(config.model).exists():
            raise Gemma4T4Error(
                f"model path {config.model} does not exist",
                fix="build it first (gemma4-t4 tiny OUT) or pass a Hugging Face model id",
            )
        self._reap_predecessor()
        if port_in_use(config.host, config.port):
            raise Gemma4T4Error(
                f"port {config.port} on {config.host} is already in use",
                fix="stop whatever listens there (gemma4-t4 serve stop) or choose another --port",
            )
        work = Path(config.work_dir)
        for sub in ("logs", "tmp", "vllm-cache", "inductor-cache", "servers", "locks"):
            (work / sub).mkdir(parents=True, exist_ok=True)
        server_tmp_dir(work).mkdir(mode=0o700, parents=True, exist_ok=True)

        self._locks = []
        owner = self._lock_owner(os.getpid(), process_create_time(os.getpid()))
        try:
            for lock in [
                *(ServerLock(work / "locks" / f"{key}.lock") for key in lock_keys(config)),
                machine_port_lock(config.port),
            ]:
                lock.acquire(owner)
                self._locks.append(lock)
            self._launch()
        except BaseException:
            self._release_locks()
            raise
        if wait:
            try:
                self.wait_healthy(timeout=timeout)
            except BaseException:  # Ctrl-C, SIGTERM/SIGHUP (signals.orderly_stop), an exit: stop what started
                self.stop(grace=10.0)
                raise
        return self

    def _reap_predecessor(self) -> None:
        """A dead server recorded on this port may have left EngineCore / Worker running: kill them
        (one that still serves is left alone: the port check then refuses the start)."""
        try:
            old = VLLMServer.from_state(self.state_path)
        except (Gemma4T4Error, KeyError, TypeError):  # none recorded, or none readable
            return
        left = old.survivors()
        if (self.pid is not None and old.pid == self.pid) or old._alive() or not left:
            return
        if old.healthy():
            raise Gemma4T4Error(
                f"a server whose supervisor died still serves on port {self.config.port} "
                f"(pids {', '.join(str(p['pid']) for p in left)})",
                fix=f"{self._serve('adopt')} to keep it, or {self._serve('stop')}",
            )
        self.reaped = old.reap()

    def _launch(self) -> None:
        config = self.config
        plan = plan_launch(config)
        command, env = plan.command, plan.env
        self._secrets = secrets.secret_values(command, env, [config.api_key])
        with contextlib.suppress(FileNotFoundError):
            self.super_path.unlink()
        self._log_file = open(self.log_path, "wb")  # noqa: SIM115 - handed to the child, closed in stop()
        owner = self.owner or {}
        watched = (
            {"owner_pid": owner["pid"], "owner_create_time": owner.get("create_time")}
            if owner.get("stop_with_owner") and owner.get("pid")
            else {}
        )
        self.process = self._spawn_supervisor(
            self._log_file, command, env, restart_on_crash=config.restart_on_crash, **watched
        )
        self.launch_record = self._launch_record(plan)
        self._write_state("starting")

    def _launch_record(self, plan: LaunchPlan) -> LaunchRecord:
        """What served, as the state file and the benchmark record keep it: secrets masked."""
        return {
            "command": secrets.mask_argv(plan.command),
            "env": plan.launch_env(),
            "pid": self.pid,
            "pgid": self.pid,
            "started_at": time.time(),
            "config": masked_config(self.config).model_dump(mode="json"),
            "chosen_by": plan.chosen_by,
            "cpu_attention": plan.cpu_attention.model_dump(mode="json") if plan.cpu_attention else None,
            "reaped": list(self.reaped),
            "log_path": str(self.log_path),
            "versions": runtime_versions(),
            "versions_from": sys.executable,
            "host": {"hostname": platform.node(), "platform": platform.platform(), "cpu_count": os.cpu_count()},
            # the facts are in the gate's own report; keep the record small
            "gate": None
            if self.gate_result is None
            else {k: v for k, v in to_jsonable(self.gate_result).items() if k != "facts"},
        }

    def _write_state(self, state: str, **extra: Any) -> None:
        record = {
            "state": state,
            "pid": self.pid,
            "pid_create_time": self.pid_create_time,
            "port": self.config.port,
            "base_url": self.base_url,
            "target": self.config.target,
            "model": self.config.model,
            "log_path": str(self.log_path),
            "exit_path": str(self.exit_path),
            "super_path": str(self.super_path),
            "lock_paths": [str(lock.path) for lock in self._locks],
            "config": masked_config(self.config).model_dump(mode="json"),
            "launch_record": self.launch_record,
            "owner": self.owner,
            "updated_at": time.time(),
            **extra,
        }
        atomic_write_json(self.state_path, secrets.mask(record, self._secrets))

    def wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        # the first checks come quickly and back off to one a second: a server that is up within a second
        # (an adopted or already-loaded one) is not left waiting a whole interval
        delay = 0.05
        while time.monotonic() < deadline:
            if self.pid is None:
                raise Gemma4T4Error("server was never started", fix="call start()")
            if not self._alive():
                status = self.status()
                with contextlib.suppress(OSError):
                    self._write_state("dead", exit_code=status.exit_code)
                raise Gemma4T4Error(
                    f"vLLM exited with code {status.exit_code} before becoming healthy ({status.hint}).\n"
                    f"--- log tail ---\n{self.log_tail()}",
                    fix=f"read the full log at {self.log_path}",
                )
            if self.healthy():
                self._write_state("running")
                return
            time.sleep(delay)
            delay = min(1.0, delay * 2)
        tail = self.log_tail()
        self.stop()
        raise Gemma4T4Error(
            f"vLLM did not answer /health within {timeout:.0f} s; stopped it.\n--- log tail ---\n{tail}",
            fix="raise the timeout (first starts compile kernels) or read " + str(self.log_path),
        )

    def _wait_exit(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self._alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        return not self._alive()

    def _signal_group(self, sig: int) -> None:
        pid = self.pid
        if pid is None:
            return
        if self.process is None:
            # attached from a state file: only signal a group we can prove is ours
            if not pid_alive(pid, self.pid_create_time):
                return
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if os.getpgid(pid) != pid:
                    return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)

    def stop(self, grace: float = STOP_GRACE_S) -> int | None:
        """SIGTERM the whole process group, then SIGKILL after ``grace`` seconds; then any survivor."""
        if self.pid is None:
            return None
        if not self._alive():  # already exited: clean up, but a dead server stays reported as dead
            unsupervised = bool(self.survivors()) and self.healthy()
            self._clean_up(grace=min(grace, 10.0))
            if unsupervised:  # it was serving: this stop is a stop, not a crash
                self._stopped = True
                with contextlib.suppress(OSError):
                    self._write_state("stopped", stopped_at=time.time(), exit_code=None)
            return self._exit_code()
        self._stopped = True
        self._signal_group(signal.SIGTERM)
        if not self._wait_exit(grace):
            self._signal_group(signal.SIGKILL)
            self._wait_exit(10.0)
        # children (EngineCore, workers) share the group; make sure none outlive the parent
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        self._clean_up(grace=2.0)
        code = self._exit_code()
        with contextlib.suppress(OSError):
            self._write_state("stopped", stopped_at=time.time(), exit_code=code)
        return code

    def _clean_up(self, grace: float) -> None:
        self.reap(grace=grace)
        self._release_locks()
        if self._log_file is not None and not self._log_file.closed:
            self._log_file.close()

    def reap(self, grace: float = 5.0) -> list[ProcessInfo]:
        """Kill every recorded process of this server that still runs (SIGTERM, then SIGKILL)."""
        left = self.survivors()
        stop_recorded(left, grace)
        self._kill_leftovers()
        return left

    def _kill_leftovers(self) -> None:
        """SIGKILL processes left in the server's group (an EngineCore orphaned by a crash)."""
        if self.pid is None:
            return
        groups = {self.pid} | {
            p.get("pgid") for p in (read_json(self.super_path) or {}).get("children", []) if p.get("pgid")
        }
        for proc in psutil.process_iter(["pid", "create_time"]):
            with contextlib.suppress(ProcessLookupError, PermissionError, psutil.Error):
                if (
                    proc.pid != os.getpid()
                    and os.getpgid(proc.pid) in groups
                    and (
                        self.pid_create_time is None or proc.info["create_time"] >= self.pid_create_time - 1
                    )
                ):
                    proc.kill()

    def adopt(self) -> VLLMServer:
        """Start a new supervisor for a vLLM whose supervisor died but which still serves."""
        if self._alive():
            raise Gemma4T4Error(
                f"the server on port {self.config.port} is supervised (pid {self.pid})",
                fix=f"nothing to do; {self._serve('status')} shows it",
            )
        record = cast(SupervisorRecord, read_json(self.super_path) or {})
        left = self.survivors()
        api = [p for p in left if p.get("pid") == record.get("api_pid")]
        if not api or not self.healthy():
            raise Gemma4T4Error(
                f"nothing to adopt on port {self.config.port}: the server does not serve",
                fix=f"{self._serve('stop')} reaps what is left",
            )
        with open(self.log_path, "ab") as log:
            self._spawn_supervisor(log, children=left, api_pid=api[0]["pid"], api_create_time=api[0]["create_time"])
        self.process = None  # not waited on here: the new supervisor is detached like the first
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and self._supervisor_record().get("supervisor_pid") != self.pid:
            time.sleep(0.1)
        if self.launch_record is not None:
            self.launch_record["adopted_at"] = time.time()
        self._write_state("running", adopted=True)
        return self

    # a with block owns the server: the studies' default factories (tune, the TTFT route) rely on it
    def __enter__(self) -> VLLMServer:
        if self.pid is None:
            self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @classmethod
    def attach(cls, port: int | None = None, work_dir: str | Path = DEFAULT_WORK_DIR) -> VLLMServer:
        """The server recorded on ``port`` under ``work_dir`` (or the only live one there)."""
        if port is not None:
            path = state_path(work_dir, port)
            if not path.exists():
                raise Gemma4T4Error(
                    f"no server recorded on port {port} under {work_dir}",
                    fix=f"{serve_command('status', None, work_dir)} lists them; start one with gemma4-t4 serve start",
                )
            return cls.from_state(path)
        servers, unreadable = [], []
        for path in state_files(work_dir):
            try:
                servers.append(cls.from_state(path))
            except UnreadableState as exc:  # the others are still found (serve status names this one)
                unreadable.append(exc)
        if not servers and unreadable:
            raise unreadable[0]
        if not servers:
            raise Gemma4T4Error(
                f"no server recorded under {work_dir}",
                fix="start one with gemma4-t4 serve start (or pass the --work-dir it used)",
            )
        live = [s for s in servers if s._alive() or s.survivors()]
        candidates = live or [max(servers, key=lambda s: (s.launch_record or {}).get("started_at", 0))]
        if len(candidates) > 1:
            ports = ", ".join(str(s.config.port) for s in candidates)
            raise Gemma4T4Error(
                f"several servers run under {work_dir} (ports {ports})", fix="pass --port to choose one"
            )
        return candidates[0]


def list_servers(work_dir: str | Path) -> list[ServerStatus]:
    """Status of every server recorded under ``work_dir``; a state file that cannot be read is listed
    as ``unreadable``, named with its fix, and hides none of the others."""
    statuses = []
    for path in state_files(work_dir):
        try:
            statuses.append(VLLMServer.from_state(path).status())
        except UnreadableState as exc:
            statuses.append(
                ServerStatus(state="unreadable", port=exc.port, reason=exc.message, hint=exc.fix)
            )
    return statuses


def stop_server(port: int | None, work_dir: str | Path, grace: float = STOP_GRACE_S) -> ServerStatus:
    """Stop the server recorded under ``work_dir`` (any process may call this), survivors included."""
    server = VLLMServer.attach(port, work_dir)
    server.stop(grace=grace)
    return server.status()


def start_server(
    config: ServerConfig,
    force: bool = False,
    gate: bool = True,
    wait: bool = True,
    timeout: float = 600.0,
    probes: Any = None,
    owner: ServerOwner | None = None,
) -> VLLMServer:
    """Start vLLM in one call: the start gate (on cpu: only the int4-kernel check), then launch and wait.
    ``force=True`` launches past a refusal, warning; ``probes`` replaces the gate's fact collectors;
    ``owner`` (e.g. the MCP server that started it) is recorded in the state file."""
    config.validate()  # a bad port or length is refused before the gate probes anything
    server = VLLMServer(config)
    server.owner = owner
    if gate:
        server.gate_result = result = check_start(config, force=force, probes=probes)
        if result.forced:
            warnings.warn(result.override_warning(), stacklevel=2)
    return server.start(wait=wait, timeout=timeout)


def _looks_like_hub_id(model: str) -> bool:
    parts = model.split("/")
    return len(parts) == 2 and not model.startswith((".", "/")) and all(parts)
