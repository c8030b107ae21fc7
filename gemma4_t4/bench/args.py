"""The run-level options of one benchmark run, declared once: name, type, default, help and flag.

What is measured is a workload class (:mod:`gemma4_t4.bench.specs`); ``gemma4-t4 bench run``'s flags
are generated from these fields and the workload classes' (``--input-len`` for ``input_len``; another
spelling, or no flag at all, sits on the field: ``json_schema_extra=CliFlag(...)``). Light (pydantic
only): the CLI reads it at start-up.
"""

from __future__ import annotations

from typing import TypedDict

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from gemma4_t4.bench.client import Api
from gemma4_t4.bench.schemas import RawJSON
from gemma4_t4.foundation.launch_record import declared

# decode's methods on the command line: --method series is the series_decode workload
METHODS = ("vllm", "series")
# where `bench run` reads the server's key when --api-key is not given: an argument is visible to
# every user of the host (ps, /proc/PID/cmdline), an environment variable only to its owner
API_KEY_ENV = "GEMMA4_T4_API_KEY"


class CliFlag(TypedDict, total=False):
    """How a field appears on ``bench run`` where the generated flag is not enough."""

    flag: str  # the flag's spelling when it is not --field-name (--out for out_dir)
    metavar: str
    option: bool  # False: the program sets it (not a user option, no flag)


def is_user_option(field_name: str) -> bool:
    """False for a run option the program sets (``CliFlag(option=False)``): it has no flag."""
    return declared(BenchOptions.model_fields[field_name]).get("option", True)


class BenchOptions(BaseModel):
    """Every run-level option of one benchmark run, declared once. Not run directly: build a
    :class:`~gemma4_t4.bench.workloads.BenchArgs` (these options, a workload spec, the rules)."""

    model_config = ConfigDict(extra="forbid", validate_default=False)

    base_url: str = Field(
        description="http(s)://HOST:PORT of an OpenAI-compatible server, or sagemaker://REGION/ENDPOINT",
        json_schema_extra=CliFlag(metavar="URL"),
    )
    model: str = Field(description="served model name", json_schema_extra=CliFlag(metavar="NAME"))
    out_dir: str = Field(
        description="results directory: new or empty; a folder holding anything needs --overwrite, which replaces only a bench run's files",
        json_schema_extra=CliFlag(flag="--out", metavar="DIR"),
    )
    api: Api | None = Field(
        None, description="endpoint: completions (default) or chat (the answers workload's default)"
    )
    max_num_seqs: int | None = Field(
        None, description="the server's max-num-seqs: cells above it are labelled queueing"
    )
    api_key: SecretStr | None = Field(
        None,
        description=f"bearer key of the server (bench run: else ${API_KEY_ENV}, kept out of the process list); "
        "never stored, and masked in every error a server sends back",
        json_schema_extra=CliFlag(metavar="KEY"),
    )
    tokenizer: str | None = Field(
        None,
        description="local tokenizer path, where the server has no /tokenize (a SageMaker endpoint)",
        json_schema_extra=CliFlag(metavar="PATH"),
    )
    label: str | None = Field(None, description="a name for plots and comparisons")
    gpu: str | None = Field(None, description="GPU key for roofline and cost, e.g. t4, l4")
    bytes_per_token: float | None = Field(None, description="bytes read per decoded token (roofline)")
    model_format: str | None = Field(
        None, description="bf16 | qat | emb4: bytes per token from the catalogue"
    )
    price_keys: list[str] | None = Field(
        None,
        description="price key from gemma4_t4.catalog.hardware.PRICES (repeatable)",
        json_schema_extra=CliFlag(flag="--price", metavar="KEY"),
    )
    server_launch: RawJSON | None = Field(
        None,
        description="the server's launch record (free-form; set by whoever launched it)",
        json_schema_extra=CliFlag(option=False),
    )
    request_timeout_s: float | None = Field(
        600.0,
        description="a request not finished after S seconds fails as 'timeout'",
        json_schema_extra=CliFlag(flag="--request-timeout", metavar="S"),
    )
    sample_metrics: bool = Field(True, description="sample the server's /metrics during each cell")
    progress: bool = Field(
        True, description="progress bars (the CLI: off with --json)", json_schema_extra=CliFlag(option=False)
    )
    overwrite: bool = Field(False, description="replace the bench run already in the results directory (never a folder of other files)")
    stop_on_unreachable: bool = Field(
        True, description="stop the run when a cell fails and the server no longer answers"
    )
