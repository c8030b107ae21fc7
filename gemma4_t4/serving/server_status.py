"""A vLLM server as its records on disk show it, read by any process: where it serves, whether it is
alive, what its supervisor recorded and what :class:`ServerStatus` that adds up to. The files are
:mod:`gemma4_t4.serving.server_state`'s; :class:`gemma4_t4.serving.server.VLLMServer` starts and stops
the server on top of this.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal, Self, cast

from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation import secrets
from gemma4_t4.foundation.atomic import UnreadableJSON, read_json_object
from gemma4_t4.foundation.launch_record import LaunchRecord, ProcessInfo
from gemma4_t4.serving.server_config import ServerConfig, server_tmp_dir
from gemma4_t4.serving.server_state import (
    ServerLock,
    ServerOwner,
    UnreadableState,
    read_json,
    serve_command,
    state_path,
)
from gemma4_t4.serving.supervisor import ExitRecord, SupervisorRecord, http_status, pid_alive, signal_name


@dataclass
class ServerStatus:
    # unreadable: its state file holds nothing readable (reason says why, hint how to clear it)
    state: Literal[
        "not started", "starting", "running", "dead", "stopped", "restarting", "unsupervised", "unreadable"
    ]
    pid: int | None = None
    base_url: str = ""
    healthy: bool = False
    exit_code: int | None = None  # vLLM's own code; negative: killed by that signal
    log_path: str | None = None
    log_tail: str | None = None
    port: int | None = None
    model: str | None = None
    target: str | None = None
    exit_signal: str | None = None
    hint: str | None = None
    started_at: float | None = None
    engine: str | None = None  # the supervisor's view: starting / healthy / dead / restarting
    reason: str | None = None  # why the engine died, read from the log
    restarts: int = 0
    survivors: list[ProcessInfo] = field(default_factory=list)  # processes of the server still running
    owner: ServerOwner | None = None  # who started it (e.g. an MCP server), if recorded

    def summary(self) -> str:
        if self.state == "unreadable":
            return f"unreadable: {self.reason}\n  hint: {self.hint}"
        label = "unsupervised, still serving" if self.state == "unsupervised" else self.state
        line = f"{label}: {self.model or '?'} ({self.target}) at {self.base_url}"
        if self.pid:
            line += f", pid {self.pid}"
        if self.exit_code is not None:
            line += f", exit code {self.exit_code}" + (f" ({self.exit_signal})" if self.exit_signal else "")
        if self.restarts:
            line += f", restarted {self.restarts}x"
        if self.reason:
            line += f"\n  engine died: {self.reason}"
        if self.survivors:
            line += "\n  survivors: " + ", ".join(f"{p['name']} pid {p['pid']}" for p in self.survivors)
        if self.owner:
            line += f"\n  owner: {self.owner.get('kind', '?')} pid {self.owner.get('pid')}" + (
                "" if self.owner.get("alive", True) else " (gone)"
            )
        if self.log_path:
            line += f"\n  log: {self.log_path}"
        if self.hint:
            line += f"\n  hint: {self.hint}"
        if self.log_tail:
            line += "\n--- log tail ---\n" + self.log_tail
        return line


def orderly_stop(exit_info: ExitRecord) -> bool:
    """The supervisor ended because it was told to stop (a signal, its owner gone), not because the
    engine died. Records written before ``orderly_stop`` existed: a signal and no engine death."""
    if "orderly_stop" in exit_info:
        return bool(exit_info["orderly_stop"])
    return bool(exit_info.get("terminated_by")) and not exit_info.get("engine_dead_reason")


def death_hint(exit_code: int | None, reason: str | None = None) -> str:
    if reason and "Illegal instruction" in reason:
        return (
            "the CPU rejected an instruction vLLM's kernel used (docs/serving.md); start it again "
            "without --dtype so the attention probe picks a path that works here"
        )
    if exit_code == -signal.SIGKILL:
        return (
            "killed by SIGKILL: usually the kernel's out-of-memory killer during weight loading "
            "(check `dmesg | grep -i oom`); add swap with `gemma4-t4 swap create --size 16G`"
        )
    if exit_code is not None and exit_code < 0:
        return f"killed by {signal.Signals(-exit_code).name}"
    if reason:
        return "the engine died (reason above, details in the log tail); --restart-on-crash N restarts it"
    return "vLLM exited on its own; the log tail shows why"


class RecordedServer:
    """A server known by its config and its records: what ``serve status`` and ``serve stop`` read."""

    def __init__(self, config: ServerConfig):
        self.config = config
        self.process: subprocess.Popen | None = None  # set when this process started it
        work = Path(config.work_dir)
        self.log_path = work / "logs" / f"vllm-{config.port}.log"
        self.state_path = state_path(work, config.port)
        self.exit_path = self.state_path.with_suffix(".exit.json")  # servers/server-<port>.exit.json
        self.super_path = self.state_path.with_suffix(".super.json")
        self.launch_record: LaunchRecord | None = None
        self.owner: ServerOwner | None = None  # set before start() to record who owns the server
        self._stopped = False
        self.pid: int | None = None  # the supervisor's
        self.pid_create_time: float | None = None  # with the pid, what identifies this very server
        self._locks: list[ServerLock] = []
        self._secrets: list[str] = []

    @property
    def base_url(self) -> str:
        host = f"[{self.config.host}]" if ":" in self.config.host else self.config.host
        return f"http://{host}:{self.config.port}"

    def _serve(self, action: str) -> str:
        """The ``gemma4-t4 serve ACTION`` command a hint prints for this server (its --work-dir included)."""
        return serve_command(action, self.config.port, self.config.work_dir)

    def _alive(self) -> bool:
        if self.process is not None:
            return self.process.poll() is None
        return pid_alive(self.pid, self.pid_create_time)

    def _supervisor_record(self) -> SupervisorRecord:
        data = cast(SupervisorRecord, read_json(self.super_path) or {})
        if self.pid is not None and data.get("supervisor_pid") not in (None, self.pid):
            return {}  # another (older or adopting) supervisor's record
        return data

    def survivors(self) -> list[ProcessInfo]:
        """Processes recorded for this server (API server, EngineCore, Worker) that still run."""
        data = cast(SupervisorRecord, read_json(self.super_path) or {})
        return [
            info
            for info in data.get("children", [])
            if info.get("pid") != self.pid and pid_alive(info.get("pid"), info.get("create_time"))
        ]

    def healthy(self) -> bool:
        return http_status(self.base_url + "/health") == 200

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        tail = "\n".join(text.splitlines()[-lines:])
        return secrets.mask_text(tail, [*self._secrets, self.config.api_key])

    def _exit_info(self) -> ExitRecord:
        info = cast("ExitRecord | None", read_json(self.exit_path))
        return info if info is not None and info.get("pid") == self.pid else {}

    def _exit_code(self) -> int | None:
        """vLLM's exit code as the supervisor recorded it (negative: the signal that killed it)."""
        info = self._exit_info()
        if info:
            return info.get("exit_code")
        if self.process is not None and self.process.returncode is not None:
            code = self.process.returncode  # the supervisor itself died; report what we have
            return 128 - code if code > 128 else code
        return None

    def status(self) -> ServerStatus:
        """What the server is doing now: never started, supervised, or its supervisor ended."""
        record = self._supervisor_record()
        base = ServerStatus(
            state="not started",
            pid=self.pid,
            base_url=self.base_url,
            log_path=str(self.log_path) if self.pid is not None else None,
            port=self.config.port,
            model=self.config.model,
            target=self.config.target,
            started_at=(self.launch_record or {}).get("started_at"),
            engine=record.get("engine"),
            reason=record.get("engine_dead_reason"),
            restarts=int(record.get("restarts") or 0),
            owner=self._owner_status(),
        )
        if self.pid is None:
            return base
        if self._alive():
            return self._supervised_status(base, record)
        return self._ended_status(base)

    def _owner_status(self) -> ServerOwner | None:
        if not self.owner:
            return None
        alive = pid_alive(self.owner.get("pid"), self.owner.get("create_time"))
        return cast(ServerOwner, dict(self.owner, alive=alive))

    def _supervised_status(self, base: ServerStatus, record: SupervisorRecord) -> ServerStatus:
        """The supervisor runs: the engine's state as it records it, else /health decides."""
        engine = record.get("engine")
        if engine == "restarting":
            return replace(
                base,
                state="restarting",
                log_tail=self.log_tail(),
                survivors=self.survivors(),
                hint=f"restart {base.restarts + 1} of {record.get('restart_on_crash')} follows",
            )
        if engine == "dead":
            # the supervisor is still stopping what is left: its history already holds vLLM's code
            history = record.get("history") or []
            code = history[-1].get("exit_code") if history else None
            return replace(
                base,
                state="dead",
                exit_code=code,
                exit_signal=signal_name(code),
                log_tail=self.log_tail(),
                survivors=self.survivors(),
                hint=f"{death_hint(code, base.reason)} (the supervisor is stopping what is left of it)",
            )
        healthy = self.healthy()
        return replace(base, state="running" if healthy else "starting", healthy=healthy)

    def _ended_status(self, base: ServerStatus) -> ServerStatus:
        """The supervisor is gone: stopped, dead (code and reason), unsupervised, or dead with survivors."""
        survivors = self.survivors()
        if survivors and self.healthy():  # the supervisor died; vLLM did not
            return replace(
                base,
                state="unsupervised",
                healthy=True,
                survivors=survivors,
                hint=f"its supervisor (pid {self.pid}) is gone: {self._serve('adopt')} re-supervises it, "
                f"{self._serve('stop')} stops it",
            )
        code = self._exit_code()
        ended = replace(base, exit_code=code, exit_signal=signal_name(code))
        if survivors:
            return replace(
                ended,
                state="dead",
                log_tail=self.log_tail(),
                survivors=survivors,
                hint=f"{len(survivors)} of its processes still run: {self._serve('stop')} (or a new serve "
                "start on the port) kills them",
            )
        self._release_locks()  # its locks died with it
        exit_info = self._exit_info()
        reason = exit_info.get("engine_dead_reason") or base.reason
        if exit_info.get("owner_exited"):
            owner = self.owner or {}
            return replace(
                ended,
                state="stopped",
                reason=reason,
                hint=f"stopped by its supervisor when its owner ({owner.get('kind', '?')} pid "
                f"{owner.get('pid')}) exited",
            )
        if self._stopped or self._recorded_as_stopped():
            self._stopped = True
            return replace(ended, state="stopped", reason=reason)
        if orderly_stop(exit_info):  # its owner's stop was cut short before recording it: still a stop
            self._stopped = True
            return replace(
                ended,
                state="stopped",
                hint=f"stopped by {exit_info.get('terminated_by')} sent to its processes (an orderly stop, "
                "not a crash)",
            )
        return replace(
            ended, state="dead", reason=reason, log_tail=self.log_tail(), hint=death_hint(code, reason)
        )

    def _recorded_as_stopped(self) -> bool:
        """Another process stopped this server (its state file says so, for this pid)."""
        recorded = read_json(self.state_path) or {}
        return recorded.get("pid") == self.pid and recorded.get("state") == "stopped"

    def _release_locks(self) -> None:
        for lock in self._locks:
            lock.release(pid=self.pid)
        # every path that ends a server releases its locks: the socket folder made outside work_dir
        # for a deep one goes too, once empty (another server of the same work_dir may still use it)
        tmp = server_tmp_dir(Path(self.config.work_dir))
        if tmp != Path(self.config.work_dir).resolve() / "tmp":
            with contextlib.suppress(OSError):
                tmp.rmdir()

    @classmethod
    def from_state(cls, path: str | Path) -> Self:
        try:
            data = read_json_object(path)
        except FileNotFoundError:
            raise Gemma4T4Error(
                f"no server state at {path}",
                fix=f"{serve_command('status', None, Path(path).parent.parent)} lists the servers this work dir knows",
            ) from None
        except UnreadableJSON as exc:
            raise UnreadableState(Path(path), str(exc)) from None
        try:
            # the API key is masked on disk: a server read back has none (its /health needs none)
            config = ServerConfig.model_validate({**data["config"], "api_key": None})
        except (KeyError, TypeError, Gemma4T4Error) as exc:  # a setting refused is a Gemma4T4Error
            raise UnreadableState(Path(path), f"no readable config ({type(exc).__name__})") from exc
        server = cls(config)
        server.pid = data.get("pid")
        server.pid_create_time = data.get("pid_create_time")
        server.launch_record = cast("LaunchRecord | None", data.get("launch_record"))
        server.owner = cast("ServerOwner | None", data.get("owner"))
        server._stopped = data.get("state") == "stopped"
        server._locks = [ServerLock(Path(p)) for p in data.get("lock_paths", [])]
        return server
