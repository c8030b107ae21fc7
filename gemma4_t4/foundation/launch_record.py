"""What a launched vLLM server records about itself: its processes, its (masked) configuration and
how it was started. The server manager and the supervisor write these records; the benchmark stores
them in its results. They live here, below all three, so that reading a record never imports the
code that launches servers.
"""

from __future__ import annotations

from typing import Any, NotRequired, Required

from pydantic import BaseModel, ConfigDict, Field
from pydantic.fields import FieldInfo

from gemma4_t4.foundation.jsonable import TypedDict

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
DEFAULT_WORK_DIR = ".cache/gemma4_t4"


class ProbeResult(BaseModel):
    """One candidate's verdict from the CPU attention probe (:mod:`gemma4_t4.turing.cpuattn`), stored in its
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


class Assistant(TypedDict, total=False):
    """The assistant's boundary for one setting, declared beside it: whether an assistant (the MCP server's
    tools) may set it and within which bounds. The MCP tools' parameters are generated from it, so a setting
    is offered only where this says so, and with these limits in its schema (the SDK refuses anything else)."""

    sets: Required[bool]
    why: Required[str]  # why it is offered within these bounds, or withheld
    ge: float
    gt: float
    le: float
    choices: list[str]  # an assistant picks one of these only
    keys: list[str]  # a mapping (a container environment): these keys only
    default: Any  # the MCP tool's default where it differs from the CLI's (a JSON value)


def assistant_sets(why: str = "", **bounds: Any) -> Assistant:
    """An assistant sets this, within ``bounds`` (ge, gt, le, choices, keys, default)."""
    return Assistant(sets=True, why=why, **bounds)  # type: ignore[typeddict-item]


def assistant_never(why: str) -> Assistant:
    """An assistant never sets this: the MCP tools do not offer it (a person sets it through the CLI)."""
    return Assistant(sets=False, why=why)


def setting(default: Any, help: str, assistant: Assistant | None = None, **cli: Any) -> Any:
    """A setting a user sets, with its one-line help (``description``): ``serve start``'s flag (``--field-name``)
    and, where ``assistant`` allows it, the MCP start tool's parameter are generated from it. ``cli``: the flag's
    spelling where that is not enough: ``flag``, ``metavar``, ``choices``, or ``switches`` (flag -> the value it
    sets and its help). ``assistant``: the boundary decision, required (None fails the boundary's test)."""
    extra = cli | ({"assistant": assistant} if assistant is not None else {})
    return Field(default, description=help, json_schema_extra=extra or None)  # pydantic copies a [] or {} default


def assistant_boundary(field: FieldInfo) -> Assistant | None:
    """The boundary a setting declares (None: none declared, which the MCP tools refuse to generate)."""
    return (field.json_schema_extra or {}).get("assistant")  # type: ignore[union-attr,return-value]


_LOCAL = "the server binds 127.0.0.1 only"
_CLI_SWITCH = "a tri-state the CLI's switches set; an assistant's server takes the target's default"


class ServerSettings(BaseModel):
    """Every setting that decides how vLLM is launched: what a state file and a launch record store
    (secrets masked) and read back; ``serving.server_config.ServerConfig`` adds the target's defaults and
    checks. Those declared with :func:`setting` are the user's. A record from before speculative decoding
    reads back with the defaults (no drafter)."""

    model_config = ConfigDict(extra="ignore")  # a newer record's extra setting does not refuse an older one

    model: str = setting(..., "hub id or local folder", assistant_sets("the start gate checks what it serves"))
    target: str = setting("cpu", "t4 (this GPU) or cpu", assistant_sets(choices=["t4", "cpu"]),
                          choices=("t4", "cpu"))  # checked by ServerConfig.validate
    served_model_name: str | None = setting(None, "the model's name in the API (default: the model folder's name)",
                                            assistant_sets())
    host: str = setting(DEFAULT_HOST, "the address to bind: other than localhost needs --api-key",
                        assistant_never(_LOCAL + ": another address exposes it to the network"))
    port: int = setting(DEFAULT_PORT, "TCP port, 1024..65535",
                        assistant_sets("unprivileged ports only; none: a free one", ge=1024, le=65535, default=None))
    dtype: str | None = setting(None, "vLLM's --dtype (default float16 on t4, no bf16 on Turing; on cpu a probe of "
                                "vLLM's attention picks bf16 or float32)", assistant_sets())
    max_model_len: int | None = setting(None, "tokens per sequence, prompt + output",
                                        assistant_sets(gt=0, le=1_048_576, default=4096))
    max_num_seqs: int | None = setting(None, "concurrent sequences", assistant_sets(gt=0, le=1024, default=8))
    enable_prefix_caching: bool = setting(True, "vLLM's prefix caching: a prefix seen before is not computed again",
                                          assistant_never(_CLI_SWITCH),
                                          switches={"--no-prefix-caching": (False, "off: every prompt computed in full")})
    enforce_eager: bool | None = setting(None, "eager mode: no CUDA graphs, no torch.compile", assistant_never(
        _CLI_SWITCH), switches={
        "--eager": (True, "no CUDA graphs (--enforce-eager; the cpu default)"),
        "--compile": (False, "use torch.compile/CUDA graphs (the t4 default; on cpu: slower start)")})
    max_num_batched_tokens: int | None = setting(None, "prefill chunk", assistant_sets(gt=0, le=1_048_576))
    # t4 only
    gpu_memory_utilization: float | None = setting(None, "share of GPU memory vLLM may take, 0.1..0.99",
                                                   assistant_sets(ge=0.1, le=0.99))
    tensor_parallel_size: int = setting(1, "GPUs per server: multi-T4 hosts, e.g. 4 on g4dn.12xlarge",
                                        assistant_sets(ge=1, le=8))
    language_model_only: bool | None = setting(None, "text only: no vision/audio towers, their memory to KV",
                                               assistant_never(_CLI_SWITCH), switches={
        "--language-model-only": (True, "skip the vision/audio towers (the t4 default)"),
        "--multimodal": (False, "t4: keep the vision/audio towers")})
    # cpu only
    kv_cache_space_gib: int = setting(1, "cpu: KV cache GiB", assistant_sets(ge=1, le=1024), flag="--kv-cache-space",
                                      metavar="GIB")
    block_size: int | None = setting(None, "tokens per KV cache block (cpu default 32: vLLM's 128 makes prefix hits "
                                     "coarse)", assistant_sets(ge=1, le=1024))
    # masked ("***") in every stored record
    api_key: str | None = setting(None, "required when binding beyond localhost (or set GEMMA4_T4_API_KEY)",
                                  assistant_never(_LOCAL + ", which needs no key; a key an assistant types is in its "
                                                  "transcript"))
    extra_args: list[str] = setting([], "extra vLLM argument (repeatable; use --vllm-arg=--flag)", assistant_never(
        "raw vLLM arguments pass every check (--trust-remote-code runs a model repository's code)"),
                                    flag="--vllm-arg", metavar="ARG")
    extra_env: dict[str, str] = setting({}, "extra environment for vLLM (repeatable)", assistant_never(
        "an environment changes what runs (LD_PRELOAD, PYTHONPATH) and where weights come from (HF_ENDPOINT)"),
                                        flag="--env", metavar="KEY=VALUE")
    work_dir: str = setting(DEFAULT_WORK_DIR, "logs, state, locks, temp files and vLLM caches stay here",
                            assistant_never("the MCP server's own ($GEMMA4_T4_WORK_DIR), set by whoever runs it"))
    python: str | None = setting(None, "interpreter with vLLM installed (default: this one)",
                                 assistant_never("another interpreter is another program"))
    restart_on_crash: int = setting(0, "restart a crashed vLLM up to N times, backoff 2, 4, 8 ... 60 s; 0: off",
                                    assistant_never("restarts run unattended after the tool returned; a person's "
                                                    "choice (serve start --restart-on-crash)"), metavar="N")
    probe_cpu_attention: bool = True  # cpu, dtype unset: run the attention probe (gemma4_t4.turing.cpuattn)
    chosen_by: dict[str, str] = Field(default_factory=dict)  # why each default was chosen
    # speculative decoding: gemma4_t4/serving/speculative.py
    draft: str | None = setting("off", "speculative decoding: off; auto = Google's assistant for the target's size "
                                "and build where one is known and memory allows; self = the target as its own draft "
                                "model (a check); else an assistant's id or folder", assistant_sets(),
                                metavar="auto|off|self|MODEL")
    num_draft_tokens: int | None = setting(None, "tokens drafted per step, 1..16", assistant_sets(ge=1, le=16),
                                           metavar="N")
    draft_method: str | None = setting(None, "mtp (an assistant drafts) or draft_model (a whole, smaller Gemma 4 "
                                       "drafts; the default with draft self)",
                                       assistant_sets(choices=["mtp", "draft_model"]), choices=("mtp", "draft_model"))


def launch_settings() -> dict[str, FieldInfo]:
    """The settings a user sets (declared with :func:`setting`), in ServerSettings' order: the one
    declaration ``serve start``'s flags and the MCP start tool's parameters are generated from."""
    return {name: field for name, field in ServerSettings.model_fields.items() if field.description}


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
