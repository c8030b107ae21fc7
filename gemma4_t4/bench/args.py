"""The one declaration of every benchmark option: its name, type, default, help and command-line flag.

:class:`BenchOptions` declares the fields; :class:`~gemma4_t4.bench.workloads.BenchArgs` adds the
rules and the workload-dependent defaults (it needs the workload registry, so it lives with the
benchmark's client). Everything else is generated from these fields: ``gemma4-t4 bench run``'s
flags (a flag per field, ``--input-len`` for ``input_len``), the typed workload specs of
:mod:`gemma4_t4.bench.specs` (each a subset of these fields) and, through the specs, the MCP tool's
schema. This module stays light (pydantic only): the CLI reads it at start-up.

A field's command-line spelling, where it is not ``--field-name``, and whether it is an option at
all sit on the field itself (``json_schema_extra=cli(...)``).
"""

from __future__ import annotations

from typing import Literal, TypedDict

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from gemma4_t4.bench.schemas import RawJSON

# what a user chooses (--workload); the registry (bench.workloads.WORKLOADS) also holds the modes
# decode runs in (open loop, sweep, series decode)
WORKLOAD_CHOICES: tuple[str, ...] = ("decode", "ttft", "prefix", "answers", "load")
METHODS = ("vllm", "series")


class CliFlag(TypedDict, total=False):
    """How a field appears on ``bench run`` where the generated flag is not enough."""

    flag: str  # the flag's spelling when it is not --field-name (--out for out_dir)
    metavar: str
    repeatable: bool  # a list given once per value (--price A --price B), not comma-separated
    choices: list[str]  # a str field whose values a validator checks (workload)
    option: bool  # False: the program sets it (not a user option, no flag)


def cli(
    flag: str | None = None,
    metavar: str | None = None,
    repeatable: bool = False,
    choices: tuple[str, ...] = (),
    option: bool = True,
) -> CliFlag:
    """A field's command-line metadata (``Field(..., json_schema_extra=cli(flag="--rate"))``)."""
    meta = CliFlag()
    if flag is not None:
        meta["flag"] = flag
    if metavar is not None:
        meta["metavar"] = metavar
    if repeatable:
        meta["repeatable"] = True
    if choices:
        meta["choices"] = list(choices)
    if not option:
        meta["option"] = False
    return meta


def cli_flag(field_name: str) -> CliFlag:
    """The command-line metadata of ``field_name`` (empty where the generated flag is enough)."""
    extra = BenchOptions.model_fields[field_name].json_schema_extra
    return CliFlag(**extra) if isinstance(extra, dict) else CliFlag()  # type: ignore[typeddict-item]


def is_user_option(field_name: str) -> bool:
    return cli_flag(field_name).get("option", True)


def flag_name(field_name: str) -> str:
    """``--input-len`` for ``input_len``, or the field's own spelling (``--out`` for ``out_dir``);
    a ``True`` default is turned off with ``--no-NAME``."""
    meta = cli_flag(field_name)
    if "flag" in meta:
        return meta["flag"]
    dashed = field_name.replace("_", "-")
    return f"--no-{dashed}" if BenchOptions.model_fields[field_name].default is True else f"--{dashed}"


class BenchOptions(BaseModel):
    """Every option of one benchmark run, declared once. Not run directly: build a
    :class:`~gemma4_t4.bench.workloads.BenchArgs` (its rules, its workload-dependent defaults)."""

    model_config = ConfigDict(extra="forbid", validate_default=False)

    base_url: str = Field(
        description="http(s)://HOST:PORT of an OpenAI-compatible server, or sagemaker://REGION/ENDPOINT",
        json_schema_extra=cli(metavar="URL"),
    )
    model: str = Field(description="served model name", json_schema_extra=cli(metavar="NAME"))
    workload: str = Field(
        description="decode | ttft | prefix | answers | load (the series' load test: c=1..16, one prompt)",
        json_schema_extra=cli(choices=WORKLOAD_CHOICES),
    )
    out_dir: str = Field(
        description="results directory: new or empty; a folder holding anything needs --overwrite, which replaces only a bench run's files",
        json_schema_extra=cli(flag="--out", metavar="DIR"),
    )
    api: Literal["completions", "chat"] | None = Field(
        None, description="endpoint: completions (default) or chat (the answers workload's default)"
    )
    concurrency: list[int] | None = Field(None, description="closed-loop streams per cell, e.g. 1,2,4,8,16")
    rates: list[float] | None = Field(
        None,
        description="decode: open-loop cells at these offered requests/s instead, e.g. 0.5,1,2",
        json_schema_extra=cli(flag="--rate", metavar="REQ_PER_S"),
    )
    arrival: Literal["poisson", "constant"] | None = Field(
        None, description="open loop: Poisson (default) or evenly spaced arrivals"
    )
    max_in_flight: int = Field(256, description="open loop: requests the client keeps in flight at most")
    sweep: int | None = Field(
        None,
        description="decode: measure one-at-a-time and all-at-once, then N open-loop rates in between",
        json_schema_extra=cli(metavar="N"),
    )
    method: Literal["vllm", "series"] = Field(
        "vllm", description="decode: 'series' = the series' method, (L-S)/(wall_L - wall_S), 8 prompts at c=1"
    )
    series_lens: list[int] | None = Field(
        None,
        description="series decode: the short and long output tokens (default 16,512)",
        json_schema_extra=cli(metavar="SHORT,LONG"),
    )
    input_len: int | None = Field(None, description="prompt tokens (ttft: one length)")
    input_lens: list[int] | None = Field(None, description="ttft: prompt lengths (default 256,...,4096)")
    output_len: int | None = Field(None, description="output tokens (ignore_eos)")
    num_prompts: int | None = Field(None, description="measured requests per cell")
    warmup: int = Field(2, description="warm-up requests per cell, at least the concurrency")
    seed: int = Field(0, description="seed of the prompts' words")
    nonce: str | None = Field(None, description="reproduce a run's exact prompts (see its run.json)")
    prefix_len: int | None = Field(None, description="prefix workload: shared tokens (default 3/4 of input)")
    groups: int | None = Field(None, description="prefix workload: number of prefixes")
    max_num_seqs: int | None = Field(
        None, description="the server's max-num-seqs: cells above it are labelled queueing"
    )
    api_key: SecretStr | None = Field(
        None, description="bearer key of the server; never stored", json_schema_extra=cli(metavar="KEY")
    )
    tokenizer: str | None = Field(
        None,
        description="local tokenizer path, where the server has no /tokenize (a SageMaker endpoint)",
        json_schema_extra=cli(metavar="PATH"),
    )
    label: str | None = Field(None, description="a name for plots and comparisons")
    gpu: str | None = Field(None, description="GPU key for roofline and cost, e.g. t4, l4")
    bytes_per_token: float | None = Field(None, description="bytes read per decoded token (roofline)")
    model_format: str | None = Field(
        None, description="bf16 | qat | emb4: bytes per token from the catalogue"
    )
    price_keys: list[str] | None = Field(
        None,
        description="price key from gemma4_t4.hardware.PRICES (repeatable)",
        json_schema_extra=cli(flag="--price", metavar="KEY", repeatable=True),
    )
    server_launch: RawJSON | None = Field(
        None,
        description="the server's launch record (free-form; set by whoever launched it)",
        json_schema_extra=cli(option=False),
    )
    request_timeout_s: float | None = Field(
        600.0,
        description="a request not finished after S seconds fails as 'timeout'",
        json_schema_extra=cli(flag="--request-timeout", metavar="S"),
    )
    sample_metrics: bool = Field(True, description="sample the server's /metrics during each cell")
    progress: bool = Field(
        True, description="progress bars (the CLI: off with --json)", json_schema_extra=cli(option=False)
    )
    overwrite: bool = Field(False, description="replace the bench run already in the results directory (never a folder of other files)")
    stop_on_unreachable: bool = Field(
        True, description="stop the run when a cell fails and the server no longer answers"
    )
