"""What a launched vLLM server records about itself: its processes, its (masked) configuration and
how it was started. The server manager and the supervisor write these records; the benchmark stores
them in its results. They live here, below all three, so that reading a record never imports the
code that launches servers.
"""

from __future__ import annotations

from typing import Any, NotRequired

from gemma4_t4.cpuattn import ChoiceRecord
from gemma4_t4.jsonable import TypedDict


class ProcessInfo(TypedDict):
    """One process of a server, as the supervisor records it (and ``VLLMServer.survivors`` lists)."""

    pid: int
    create_time: float
    name: str  # APIServer, VLLM::EngineCore, ...
    pgid: int


class ServerConfigRecord(TypedDict):
    """A :class:`ServerConfig` as a state file and a launch record store it (``api_key`` masked,
    secrets in ``extra_args`` / ``extra_env`` masked); read back by field name."""

    model: str
    target: str
    served_model_name: str | None
    host: str
    port: int
    dtype: str | None
    max_model_len: int | None
    max_num_seqs: int | None
    enable_prefix_caching: bool
    enforce_eager: bool | None
    max_num_batched_tokens: int | None
    gpu_memory_utilization: float | None
    tensor_parallel_size: int
    language_model_only: bool | None
    kv_cache_space_gib: int
    block_size: int | None
    api_key: str | None
    extra_args: list[str]
    extra_env: dict[str, str]
    work_dir: str
    python: str | None
    restart_on_crash: int
    probe_cpu_attention: bool
    chosen_by: dict[str, str]
    draft: NotRequired[str]  # NotRequired: state files written before speculative decoding lack them
    num_draft_tokens: NotRequired[int]
    draft_method: NotRequired[str | None]


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
    config: ServerConfigRecord
    chosen_by: dict[str, str]
    cpu_attention: ChoiceRecord | None
    reaped: list[ProcessInfo]
    log_path: str
    versions: dict[str, str | None]
    versions_from: str
    host: HostRecord
    gate: Any  # the gate's result without its facts (None: no gate ran)
    adopted_at: NotRequired[float]
