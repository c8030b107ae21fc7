"""What a launched vLLM server records about itself: its processes, its (masked) configuration and
how it was started. The server manager and the supervisor write these records; the benchmark stores
them in its results. They live here, below all three, so that reading a record never imports the
code that launches servers.
"""

from __future__ import annotations

from typing import Any, NotRequired

from pydantic import BaseModel, ConfigDict, Field

from gemma4_t4.foundation.jsonable import TypedDict

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
DEFAULT_WORK_DIR = ".cache/gemma4_t4"


class ProbeResult(BaseModel):
    """One candidate's verdict from the CPU attention probe (:mod:`gemma4_t4.host.cpuattn`), stored in its
    cached verdict and in the launch record."""

    candidate: str  # a name from cpuattn.CANDIDATES
    dtype: str
    ok: bool
    returncode: int | None
    signal: str | None = None  # e.g. SIGILL: the op killed the probe process
    isa: str | None = None  # the attention kernel(s) vLLM used, as the probe saw it
    max_abs_err: float | None = None
    detail: str = ""
    seconds: float | None = None

    @property
    def unavailable(self) -> bool:
        """The probe could not run at all (no vLLM CPU in that interpreter): says nothing about the op."""
        return not self.ok and self.signal is None and self.max_abs_err is None


class Choice(BaseModel):
    """The attention path the CPU server uses: what the cache keeps (without ``cached``) and the
    launch record stores as ``cpu_attention``."""

    candidate: str
    dtype: str
    env: dict[str, str]  # set in the server's environment (read by every vLLM process)
    reason: str
    probes: list[ProbeResult] = Field(default_factory=list)
    cached: bool = False
    fingerprint_id: str | None = None


class ProcessInfo(TypedDict):
    """One process of a server, as the supervisor records it (and ``VLLMServer.survivors`` lists)."""

    pid: int
    create_time: float
    name: str  # APIServer, VLLM::EngineCore, ...
    pgid: int


class ServerSettings(BaseModel):
    """Every setting that decides how vLLM is launched: what a state file and a launch record store
    (secrets masked) and read back; ``serving.server_config.ServerConfig`` adds the target's defaults and
    checks. A record from before speculative decoding reads back with the defaults (no drafter)."""

    model_config = ConfigDict(extra="ignore")  # a newer record's extra setting does not refuse an older one

    model: str
    target: str = "cpu"  # "t4" or "cpu", checked by ServerConfig.validate (an error with a fix)
    served_model_name: str | None = None
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    dtype: str | None = None  # default: float16 on t4 (no bf16 on Turing); cpu: decided by a probe
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    enable_prefix_caching: bool = True
    enforce_eager: bool | None = None  # default: CUDA graphs on t4, eager on cpu
    max_num_batched_tokens: int | None = None
    # t4 only
    gpu_memory_utilization: float | None = None
    tensor_parallel_size: int = 1
    language_model_only: bool | None = None  # default: text only on t4 (the towers' memory goes to KV)
    # cpu only
    kv_cache_space_gib: int = 1
    block_size: int | None = None  # cpu default 32 (vLLM's CPU default 128 makes prefix hits coarse)
    api_key: str | None = None  # masked ("***") in every stored record
    extra_args: list[str] = Field(default_factory=list)
    extra_env: dict[str, str] = Field(default_factory=dict)
    work_dir: str = DEFAULT_WORK_DIR  # logs, state, locks, temp files and vLLM caches stay here
    python: str | None = None  # interpreter that has vLLM installed; default: this one
    restart_on_crash: int = 0  # restart a crashed vLLM up to N times (backoff 2, 4, 8 ... 60 s)
    probe_cpu_attention: bool = True  # cpu, dtype unset: run the attention probe (gemma4_t4.host.cpuattn)
    chosen_by: dict[str, str] = Field(default_factory=dict)  # why each default was chosen
    # speculative decoding (gemma4_t4/serving/speculative.py): off | auto | self | a drafter id or folder
    # None (the CLI's unset): on t4 the tune profile measured on this GPU decides (gemma4_t4/studies/tune.py)
    draft: str | None = "off"
    # None: the tune profile's N, else the assistant's untuned N for the target's size (ServerConfig fills it)
    num_draft_tokens: int | None = None
    draft_method: str | None = None  # None: mtp for a drafter, draft_model for self


class HostRecord(TypedDict):
    hostname: str
    platform: str
    cpu_count: int | None


class LaunchRecord(TypedDict):
    """How a server was started, as the state file and benchmark results record it (secrets masked)."""

    command: list[str]
    env: dict[str, str]
    pid: int | None
    pgid: int | None
    started_at: float
    config: ServerSettings  # secrets masked
    chosen_by: dict[str, str]
    cpu_attention: Choice | None
    reaped: list[ProcessInfo]
    log_path: str
    versions: dict[str, str | None]
    versions_from: str
    host: HostRecord
    gate: Any  # the gate's result without its facts (None: no gate ran)
    adopted_at: NotRequired[float]
