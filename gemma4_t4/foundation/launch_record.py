"""The vLLM settings, declared once (:class:`VLLMSettings`; the one flag builder reads them), and what a
launched vLLM server records about itself: its processes, its (masked) configuration and how it was started.
The server manager and the supervisor write these records; the benchmark stores them in its results. They
live here, below all three, so that reading a record never imports the code that launches servers.
"""

from __future__ import annotations

import argparse
import types
import typing
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal, NotRequired, Required, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo

from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation import secrets
from gemma4_t4.foundation.jsonable import TypedDict

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
DEFAULT_WORK_DIR = ".cache/gemma4_t4"
NAME_MAX = 255  # bytes in one file name (ext4, xfs, APFS): a longer part of a path is no folder


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
    is offered only where this says so, and with the setting's own limits (``setting(ge=..., le=...)``) and
    these stricter ones in its schema (the SDK refuses anything else)."""

    sets: Required[bool]
    why: Required[str]  # why it is offered within these bounds, or withheld
    ge: float
    le: float
    choices: list[str]  # an assistant picks one of these only
    keys: list[str]  # a mapping (a container environment): these keys only
    default: Any  # the MCP tool's default where it differs from the CLI's (a JSON value)
    sagemaker_only: str  # offered by the deploy tools only: why a local server's start tool withholds it


def assistant_sets(why: str = "", **bounds: Any) -> Assistant:
    """An assistant sets this, within ``bounds`` (ge, le: stricter than the setting's own; choices, keys, default,
    sagemaker_only)."""
    return Assistant(sets=True, why=why, **bounds)  # type: ignore[typeddict-item]


def assistant_never(why: str) -> Assistant:
    """An assistant never sets this: the MCP tools do not offer it (a person sets it through the CLI)."""
    return Assistant(sets=False, why=why)


def setting(default: Any, help: str, assistant: Assistant, ge: float | None = None, gt: float | None = None,
            le: float | None = None, **cli: Any) -> Any:
    """A setting a user sets, with its one-line help (``description``), its limits (``ge``, ``gt``, ``le``: the
    one declaration of them, which every config, flag and MCP parameter obeys) and its assistant boundary: the
    CLI's flag (``--field-name``, :func:`add_setting_flags`) and, where ``assistant`` allows it, the MCP tools'
    parameter (``mcp_boundary.takes_settings``) are generated from it. ``cli``: the flag's spelling where that is
    not enough: ``flag``, ``metavar``, ``choices`` (a Literal's are read from it), ``switches`` (flag -> the value it
    sets and its help), ``comma`` (a list typed comma-separated), ``resolved`` (left out, the config works it out: no
    default shown). ``fix``: what to do when a value breaks the limits, where more than "pass a value within them"."""
    return Field(default, description=help, ge=ge, gt=gt, le=le,
                 json_schema_extra=cli | {"assistant": assistant})  # copies a [] or {}


def limits(field: FieldInfo) -> str:
    """A setting's declared limits as a user reads them: ``in 0.1..0.99``, ``in (0, 168]``, ``>= 1``."""
    bound = {key: getattr(rule, key) for rule in field.metadata for key in ("ge", "gt", "le") if hasattr(rule, key)}
    if "le" not in bound:
        return f">= {bound['ge']}"
    return f"in ({bound['gt']}, {bound['le']}]" if "gt" in bound else f"in {bound['ge']}..{bound['le']}"


def refused_setting(model: type[BaseModel], error: Mapping[str, Any]) -> Gemma4T4Error:
    """Pydantic's refusal of a setting in the user's words: the setting, the value given and its limits."""
    if not error["loc"]:  # the whole input (not a mapping of settings), not one setting
        return Gemma4T4Error(f"{model.__name__}: {error['msg']}", fix="pass the settings as a mapping of names to values")
    name = str(error["loc"][0])
    field = model.model_fields[name]
    if error["type"] in ("greater_than", "greater_than_equal", "less_than_equal"):
        return Gemma4T4Error(f"{name}={error['input']!r} must be {limits(field)}", fix=declared(field).get(
            "fix", f"pass {name} {limits(field)}, or leave it out for its default"))
    return Gemma4T4Error(f"{name}={error['input']!r}: {error['msg']}",
                         fix=f"{name}: {field.description or field.annotation}")


def declared(field: FieldInfo) -> dict[str, Any]:
    """What :func:`setting` declared beside a field's help: its boundary and its flag's spelling."""
    return dict(field.json_schema_extra or {})  # type: ignore[arg-type]


def assistant_boundary(field: FieldInfo) -> Assistant | None:
    """The boundary a setting declares (None: none declared, which the MCP tools refuse to generate)."""
    return declared(field).get("assistant")


def user_settings(model: type[BaseModel]) -> dict[str, FieldInfo]:
    """The settings a user sets (declared with :func:`setting`), in the model's order: the one declaration the
    CLI's flags and the MCP tools' parameters are generated from."""
    return {name: field for name, field in model.model_fields.items() if field.description}


def offered_default(field: FieldInfo) -> Any:
    """What a user who passes nothing passes: None where the config works the value out (a required or resolved
    setting, an empty list or mapping), else the declared default."""
    left_out = field.is_required() or declared(field).get("resolved") or isinstance(field.default, (list, dict))
    return None if left_out else field.default


def help_for(model: type[BaseModel], name: str, default: object = None) -> str:
    """A setting's help and, where ``default`` is None, what the venue gives it then (the model's ``WHEN_UNSET``)."""
    text = str(model.model_fields[name].description)
    when = getattr(model, "WHEN_UNSET", {}).get(name)
    return f"{text} ({when})" if default is None and when else text


# The container variables an assistant may add (MCP deploy_endpoint's extra_env), each with the values it takes:
# vLLM switches the AWS container reads as SM_VLLM_*, none of which runs other code or fetches from elsewhere.
# Everything else (LD_PRELOAD, PYTHONPATH, HF_ENDPOINT, another SM_VLLM_*) is a person's, through the CLI's --env.
ASSISTANT_ENV = {
    "SM_VLLM_ENFORCE_EAGER": r"true|false",
    "SM_VLLM_ENABLE_PREFIX_CACHING": r"true|false",
    "SM_VLLM_MAX_NUM_BATCHED_TOKENS": r"[1-9][0-9]{0,6}",
    "SM_VLLM_BLOCK_SIZE": r"8|16|32|64|128",
    "SM_VLLM_SWAP_SPACE": r"[0-9]{1,3}",
}
_RAW_ARGS = "raw vLLM arguments pass every check (--trust-remote-code runs a model repository's code)"


class VLLMSettings(BaseModel):
    """The vLLM settings a local server (:class:`ServerSettings`) and a SageMaker endpoint
    (``sagemaker.config.DeployConfig``) share, each declared once: one default, one help, one boundary.
    None: the venue's default, which each fills where it is built (its ``WHEN_UNSET`` says which)."""

    served_model_name: str | None = setting(None, "the model's name in the API (default: the model folder's name)",
                                            assistant_sets("a name in the API, checked for shell syntax"))
    dtype: str | None = setting(None, "vLLM's --dtype (default float16 on a T4: Turing has no bf16; bfloat16 on "
                                "other GPUs; on cpu a probe of vLLM's attention picks bf16 or float32)",
                                assistant_sets(choices=["float16", "bfloat16", "float32"]))
    max_model_len: int | None = setting(None, "tokens per sequence, prompt + output",
                                        assistant_sets(ge=256, le=1_048_576), ge=1,
                                        fix="leave it out for the venue's default, or pass a context such as 4096 "
                                        "(a SageMaker endpoint needs at least 256)")
    max_num_seqs: int | None = setting(None, "concurrent sequences", assistant_sets(le=1024), ge=1,
                                       fix="leave it out for the venue's default, or pass a count such as 4")
    # 0: SageMaker's fit calculator picks (a local server: 1)
    tensor_parallel_size: int | None = setting(None, "GPUs per server: multi-GPU hosts, e.g. 4 on g4dn.12xlarge",
                                               assistant_sets(ge=1, le=8), ge=0)
    gpu_memory_utilization: float | None = setting(None, "share of GPU memory vLLM may take, 0.1..0.99",
                                                   assistant_sets(), ge=0.1, le=0.99, fix="use a value such as 0.90")
    extra_args: list[str] = setting([], "extra vLLM argument (repeatable; use --vllm-arg=--flag; SageMaker: sent as "
                                    "SM_VLLM_*)", assistant_never(_RAW_ARGS), flag="--vllm-arg", metavar="ARG")
    extra_env: dict[str, str] = setting({}, "extra environment for vLLM (repeatable; SageMaker: container variables, "
                                        "winning over everything derived)", assistant_sets(
        "vLLM switches only: LD_PRELOAD, PYTHONPATH or HF_ENDPOINT would change what runs or where weights come "
        "from", keys=list(ASSISTANT_ENV), sagemaker_only="an environment changes what runs (LD_PRELOAD, "
        "PYTHONPATH) and where weights come from (HF_ENDPOINT)"), flag="--env", metavar="KEY=VALUE")
    draft: str | None = setting("off", "speculative decoding: off; auto = Google's assistant for the target's size "
                                "and build where one is known and memory allows; self = the target as its own draft "
                                "model (a check); else an assistant's id (a local server: or folder)",
                                assistant_sets(), metavar="auto|off|self|MODEL")  # serving/speculative.py
    num_draft_tokens: int | None = setting(None, "tokens drafted per step, 1..16", assistant_sets(), ge=1, le=16,
                                           metavar="N", fix="use a small number such as 3 (fewer can win: each "
                                           "rejected draft costs a forward pass); --draft off turns drafting off")

    @property
    def gpu(self) -> str:
        """What the venue runs vLLM on: a GPU's short name (t4, l4, a10g...) or cpu. Its dtype default and the
        drafter's fit are judged for it."""
        raise NotImplementedError

    def resolved_dtype(self) -> str:
        """vLLM's --dtype: the one given, else float16 on a T4 (Turing has no bf16), else bfloat16."""
        return self.dtype or ("float16" if self.gpu == "t4" else "bfloat16")

    def __repr_args__(self) -> Any:
        # a config shown in a notebook cell, a log or a traceback never shows a secret: masked as its records are
        return secrets.mask(dict(super().__repr_args__())).items()

    def replaced(self, **changes: Any) -> Self:
        """A copy with ``changes``, built like a new config (checked, and its defaults filled, again)."""
        return type(self).model_validate(self.model_dump() | changes)

    @model_validator(mode="wrap")
    @classmethod
    def _in_the_users_words(cls, given: Any, build: Any) -> Any:
        """A config that breaks a setting's limits is never built, and never refused with pydantic's raw error:
        the CLI, the MCP tools and a notebook get a Gemma4T4Error naming the setting, its value and its limits."""
        try:
            return build(given)
        except ValidationError as exc:
            raise refused_setting(cls, exc.errors()[0]) from None

    @field_validator("model", "model_id", "draft", check_fields=False)
    @classmethod
    def _a_name_a_path_can_hold(cls, name: str | None, info: ValidationInfo) -> str | None:
        """A model (or drafter) is a hub id or a local folder: a part longer than a file name can be is neither,
        and looking for it on disk would fail with the filesystem's own error."""
        if name and any(len(part.encode()) > NAME_MAX for part in name.split("/")):
            raise Gemma4T4Error(f"{info.field_name} {name[:40]!r}... has a part longer than {NAME_MAX} bytes, "
                                "which is neither a hub id nor a folder name",
                                fix="pass a hub id such as google/gemma-4-E2B-it or the path of a local model folder")
        return name


_LOCAL = "the server binds 127.0.0.1 only"
_CLI_SWITCH = "a tri-state the CLI's switches set; an assistant's server takes the target's default"


class ServerSettings(VLLMSettings):
    """Every setting that decides how vLLM is launched: what a state file and a launch record store
    (secrets masked) and read back; ``serving.server_config.ServerConfig`` adds the target's defaults and
    checks. Those declared with :func:`setting` are the user's. A record from before speculative decoding
    reads back with the defaults (no drafter)."""

    model_config = ConfigDict(extra="ignore")  # a newer record's extra setting does not refuse an older one

    model: str = setting(..., "hub id or local folder", assistant_sets("the start gate checks what it serves"))
    # cpu runs anywhere: a GPU launch (and the T4 model's download) is asked for, never a default
    target: Literal["t4", "cpu"] = setting("cpu", "t4 (this GPU) or cpu", assistant_sets())
    host: str = setting(DEFAULT_HOST, "the address to bind: other than localhost needs --api-key",
                        assistant_never(_LOCAL + ": another address exposes it to the network"))
    # below 1024 needs root (vLLM never runs as root here); 0 ("any port") no state file, lock or /health wait names
    port: int = setting(DEFAULT_PORT, "TCP port, 1024..65535", assistant_sets("unprivileged ports only; none: a free "
                        "one", default=None), ge=1024, le=65535,
                        fix=f"use a port between 1024 and 65535, e.g. {DEFAULT_PORT}")
    enable_prefix_caching: bool = setting(True, "vLLM's prefix caching: a prefix seen before is not computed again",
                                          assistant_never(_CLI_SWITCH),
                                          switches={"--no-prefix-caching": (False, "off: every prompt computed in full")})
    enforce_eager: bool | None = setting(None, "eager mode: no CUDA graphs, no torch.compile", assistant_never(
        _CLI_SWITCH), switches={
        "--eager": (True, "no CUDA graphs (--enforce-eager; the cpu default)"),
        "--compile": (False, "use torch.compile/CUDA graphs (the t4 default; on cpu: slower start)")})
    max_num_batched_tokens: int | None = setting(None, "prefill chunk", assistant_sets(le=1_048_576), ge=1)
    # t4 only
    language_model_only: bool | None = setting(None, "text only: no vision/audio towers, their memory to KV",
                                               assistant_never(_CLI_SWITCH), switches={
        "--language-model-only": (True, "skip the vision/audio towers (the t4 default)"),
        "--multimodal": (False, "t4: keep the vision/audio towers")})
    # cpu only
    kv_cache_space_gib: int = setting(1, "cpu: KV cache GiB", assistant_sets(le=1024), ge=1, flag="--kv-cache-space",
                                      metavar="GIB")
    block_size: int | None = setting(None, "tokens per KV cache block (cpu default 32: vLLM's 128 makes prefix hits "
                                     "coarse)", assistant_sets(le=1024), ge=1)
    # masked ("***") in every stored record
    api_key: str | None = setting(None, "required when binding beyond localhost (or set GEMMA4_T4_API_KEY)",
                                  assistant_never(_LOCAL + ", which needs no key; a key an assistant types is in its "
                                                  "transcript"))
    work_dir: str = setting(DEFAULT_WORK_DIR, "logs, state, locks, temp files and vLLM caches stay here",
                            assistant_never("the MCP server's own ($GEMMA4_T4_WORK_DIR), set by whoever runs it"))
    python: str | None = setting(None, "interpreter with vLLM installed (default: this one)",
                                 assistant_never("another interpreter is another program"))
    restart_on_crash: int = setting(0, "restart a crashed vLLM up to N times, backoff 2, 4, 8 ... 60 s; 0: off",
                                    assistant_never("restarts run unattended after the tool returned; a person's "
                                                    "choice (serve start --restart-on-crash)"), ge=0, le=100,
                                    fix="use a small number such as 3",
                                    metavar="N")
    probe_cpu_attention: bool = True  # cpu, dtype unset: run the attention probe (gemma4_t4.turing.cpuattn)
    chosen_by: dict[str, str] = Field(default_factory=dict)  # why each default was chosen
    # a str, not a Literal: the drafter's plan refuses vLLM's model type gemma4_mtp with its own fix
    draft_method: str | None = setting(None, "mtp (an assistant drafts) or draft_model (a whole, smaller Gemma 4 "
                                       "drafts; the default with draft self)",
                                       assistant_sets(choices=["mtp", "draft_model"]), choices=("mtp", "draft_model"))

    @property
    def gpu(self) -> str:
        return self.target


def add_setting_flags(parser: argparse.ArgumentParser, model: type[BaseModel] | Mapping[str, FieldInfo],
                      skip: tuple[str, ...] = (), defaults: dict[str, Any] | None = None,
                      notes: Mapping[str, str] | None = None) -> None:
    """The one flag builder: each user setting of ``model`` (but ``skip``) as a flag with its declared help, and
    where its default is None what the venue gives it (:func:`help_for`). ``defaults``: a command's own default
    where it differs from the declaration's. :func:`read_setting_flags` reads them back.

    ``model`` may instead be the fields (name -> declaration) of models a command builds later from what it parsed
    (a benchmark's run options and workload fields): a flag not given parses as None, leaving its field to the
    model that takes it (the help shows that model's default); a required field's flag is required, but for a
    field with a note (the workloads that take it, ending its help), whose workload's rules decide."""
    later, notes = isinstance(model, Mapping), notes or {}
    for name, field in (model if later else user_settings(model)).items():
        meta = declared(field)
        if name in skip:
            continue
        if "switches" in meta:  # a tri-state: a flag for each value
            for flag, (value, text) in meta["switches"].items():
                parser.add_argument(flag, dest=name, action="append_const", const=value, help=text)
            continue
        kind, note, dashed = value_type(field.annotation), notes.get(name, ""), name.replace("_", "-")
        default = None if later else (defaults or {}).get(name, offered_default(field))
        text = str(field.description) if later else help_for(model, name, default)  # type: ignore[arg-type]
        if kind is bool:  # a switch; a setting on by default is turned off
            on = field.default is True
            parser.add_argument(meta.get("flag", f"--no-{dashed}" if on else f"--{dashed}"), dest=name,
                                action="store_false" if on else "store_true",
                                help=f"turn off: {text}{note}" if on else text + note)
            continue
        cli = {k: v for k, v in meta.items() if k in ("metavar", "choices")}
        if typing.get_origin(kind) is Literal:
            cli["choices"] = list(typing.get_args(kind))
        if "choices" in cli and not later:  # a setting's choice is taken in any case
            cli["type"], text = str.lower, f"{text}, any case"
        shown = (None if field.is_required() else field.default) if later else default
        if shown is not None:  # a benchmark's 600.0 reads 600
            text += f" (default {shown:g})" if later and isinstance(shown, float) else f" (default {shown})"
        text, flag = text + note, meta.get("flag", f"--{dashed}")
        item = typing.get_args(kind)[0] if typing.get_origin(kind) is list else None
        if typing.get_origin(item) is Annotated:  # list[Annotated[int, Field(le=...)]]: the limits are the field's
            item = typing.get_args(item)[0]
        if item in _ITEMS and (item is not str or meta.get("comma")):  # numbers, or strings declared comma-separated
            what, metavar = _ITEMS[item]
            cli.setdefault("metavar", f"{metavar or name.upper()},...")
            if item is not str:  # numbers may also come space-separated
                cli.update(nargs="+", action=_ListValues)
                text += "; comma- or space-separated"
            parser.add_argument(flag, dest=name, type=_comma_list(item, what), default=default, help=text, **cli)
        elif typing.get_origin(kind) in (list, dict):  # a flag per item (a mapping's: KEY=VALUE)
            parser.add_argument(flag, dest=name, action="append", help=text, **cli)
        else:
            if later and "choices" not in cli:  # a field's kind of value: a benchmark's flags name it
                cli.setdefault("metavar", _ITEMS.get(kind, ("", None))[1] or name.upper())
            cli.setdefault("type", str if kind is SecretStr or "choices" in cli else kind)
            parser.add_argument(flag, dest=name, default=default, help=text, **cli,
                                required=later and field.is_required() and name not in notes)


def value_type(annotation: Any) -> Any:
    """The type a setting takes, None aside: ``int | None`` -> int; ``list[str]`` stays."""
    union = isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union
    return next((t for t in typing.get_args(annotation) if t is not type(None)), annotation) if union else annotation


# a comma list's items: what an error calls them, and the flag's metavar (None: the field's name)
_ITEMS: dict[Any, tuple[str, str | None]] = {int: ("integer", "N"), float: ("number", "X"), str: ("value", None)}


def _comma_list(cast: Callable[[str], Any], what: str) -> Callable[[str], list[Any]]:
    """An argparse type for "1,2,4": a list of ``cast`` values, at least one."""

    def parse(text: str) -> list[Any]:
        try:
            values = [cast(v.strip()) for v in text.split(",") if v.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated {what}s, got {text!r}") from None
        if not values:
            raise argparse.ArgumentTypeError(f"expected at least one {what}")
        return values

    return parse


class _ListValues(argparse.Action):
    """A comma list takes its values comma-separated (``--concurrency 1,8``) or space-separated
    (``--concurrency 1 8``), or both; each word was already parsed by :func:`_comma_list`."""

    def __call__(self, parser: Any, namespace: argparse.Namespace, values: Any, option_string: Any = None) -> None:
        setattr(namespace, self.dest, [v for word in values for v in word])


def read_setting_flags(args: argparse.Namespace, model: type[BaseModel]) -> dict[str, Any]:
    """The settings :func:`add_setting_flags` parsed, as the model takes them; a tri-state, list or mapping not
    given is left out (its default); of two switches given, the first declared wins (--eager over --compile)."""
    given: dict[str, Any] = {}
    for name, field in user_settings(model).items():
        if not hasattr(args, name):
            continue
        value, switches = getattr(args, name), declared(field).get("switches")
        if switches:
            if value:
                given[name] = next(setting for setting, _ in switches.values() if setting in value)
        elif typing.get_origin(field.annotation) is dict:
            if value:
                given[name] = dict(_key_value(item) for item in value)
        elif value is not None or typing.get_origin(field.annotation) is not list:
            given[name] = value
    return given


def _key_value(item: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise Gemma4T4Error(f"--env expects KEY=VALUE, got {item.split('=')[0]!r}",
                            fix="e.g. --env VLLM_LOGGING_LEVEL=DEBUG (SageMaker: --env SM_VLLM_SEED=0)")
    return key.strip(), value


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
