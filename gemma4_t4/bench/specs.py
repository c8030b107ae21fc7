"""What to measure, as typed workload specs, and :func:`run`: one spec on one served model.

A spec says *what* (decode at 1 and 8 streams, TTFT at these lengths, ...); the thing it runs on
says *where* (anything with the :class:`Served` attributes: :class:`gemma4_t4.endpoint.Endpoint`
for a local vLLM server or a SageMaker endpoint). Keeping the two apart lets a notebook or a
SageMaker experiment validate every spec before it starts a server or deploys a billed endpoint::

    decode = DecodeSpec(concurrency=[1, 8], input_len=512, output_len=128)   # refused here if wrong
    with nb.endpoint(TARGET, model, work_dir) as endpoint:
        result = run(endpoint, decode, "results/decode")

The fields are :class:`~gemma4_t4.bench.args.BenchOptions` fields (the one declaration of every
benchmark option: its type, default and help, which the CLI's flags are generated from); each spec
takes the ones its workload reads, and its validation is ``BenchArgs``'s own, so a spec accepted
here is a run ``BenchArgs`` accepts. The MCP tool ``run_benchmark`` takes one spec (:data:`AnySpec`):
its schema is these classes'.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, ClassVar, Literal, Protocol, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gemma4_t4.errors import Gemma4T4Error

# a placeholder where a spec is validated before anything serves it (never contacted)
_NOWHERE = "http://127.0.0.1:9"


class Served(Protocol):
    """What a spec runs on: an OpenAI-compatible server (``http://``) or a SageMaker endpoint
    (``sagemaker://REGION/NAME``), the model name it serves, and what the results should record."""

    @property
    def url(self) -> str: ...

    @property
    def served_name(self) -> str: ...

    @property
    def tokenizer(self) -> str | None: ...  # a local tokenizer (an endpoint has no /tokenize)

    @property
    def gpu(self) -> str | None: ...  # the hardware key for roofline and cost (t4, l4), if known

    @property
    def api_key(self) -> str | None: ...

    @property
    def max_num_seqs(self) -> int | None: ...


class SpecRefused(Gemma4T4Error, ValueError):
    """A spec refused: an unknown field, a wrong type, or a run BenchArgs would refuse. Also a
    ValueError, so that a spec inside another model (the MCP tool's arguments) is refused as
    pydantic's ValidationError, naming what is wrong, instead of escaping it."""


class WorkloadSpec(BaseModel):
    """Fields every workload shares. Unknown fields and wrong types are refused, naming the field."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str  # the registry entry (bench.workloads.WORKLOADS): the discriminator of AnySpec
    workload: ClassVar[str]  # BenchArgs.workload
    method: ClassVar[str] = "vllm"

    output_len: int | None = Field(None, description="output tokens (ignore_eos)")
    num_prompts: int | None = Field(None, description="measured requests per cell")
    warmup: int = Field(2, description="warm-up requests per cell (at least the concurrency)")
    seed: int = 0
    nonce: str | None = Field(None, description="reproduce a run's prompts; default fresh per run")

    def __init__(self, **fields: object) -> None:
        try:
            super().__init__(**fields)
        except ValidationError as exc:
            refused = exc.errors()[0].get("ctx", {}).get("error")
            if isinstance(refused, SpecRefused):  # the run's own rule, already one line with its fix
                raise refused from None
            raise spec_error(type(self).__name__, exc) from None

    @model_validator(mode="after")
    def _valid_as_a_run(self) -> WorkloadSpec:
        # the benchmark's client (~0.2 s of imports) loads when a spec is made, not when the CLI
        # or the MCP server starts (both read these classes for their schemas)
        from gemma4_t4.bench.workloads import build_args

        # BenchArgs holds the cross-field rules (prefix groups vs prompts, series lengths, ...)
        try:
            build_args(_NOWHERE, "validate", self.workload, ".", **self.bench_fields())
        except Gemma4T4Error as exc:
            raise SpecRefused(exc.message, fix=exc.fix) from None
        return self

    def bench_fields(self) -> dict[str, int | float | str | list[int] | list[float] | None]:
        """The BenchArgs fields this spec sets (what it leaves unset takes the workload's default)."""
        fields = self.model_dump(exclude={"kind"}, exclude_none=True)
        if self.method != "vllm":
            fields["method"] = self.method
        return fields


class DecodeSpec(WorkloadSpec):
    """Closed-loop decode: ``concurrency`` streams at once, unique prompts of ``input_len`` tokens."""

    kind: Literal["decode"] = "decode"
    workload: ClassVar[str] = "decode"
    concurrency: list[int] | None = Field(None, description="closed-loop streams per cell")
    input_len: int | None = Field(None, description="prompt tokens")


class OpenLoopSpec(WorkloadSpec):
    """Decode at offered request ``rates`` (requests/s), Poisson or constant arrivals."""

    kind: Literal["open_loop"] = "open_loop"
    workload: ClassVar[str] = "decode"
    rates: list[float] = Field(description="offered requests/s per cell")
    arrival: Literal["poisson", "constant"] | None = Field(None, description="arrivals (poisson)")
    max_in_flight: int = Field(256, description="requests the client keeps in flight at most")
    input_len: int | None = Field(None, description="prompt tokens")


class SweepSpec(WorkloadSpec):
    """One-at-a-time, all-at-once, then ``sweep`` rates in between (guidellm's sweep)."""

    kind: Literal["sweep"] = "sweep"
    workload: ClassVar[str] = "decode"
    sweep: int = Field(description="rates between the synchronous and the throughput runs")
    arrival: Literal["poisson", "constant"] | None = Field(None, description="arrivals (poisson)")
    max_in_flight: int = Field(256, description="requests the client keeps in flight at most")
    input_len: int | None = Field(None, description="prompt tokens")


class SeriesDecodeSpec(WorkloadSpec):
    """The series' decode figure: (L - S) / (wall_L - wall_S) from a short and a long output."""

    kind: Literal["series_decode"] = "series_decode"
    workload: ClassVar[str] = "decode"
    method: ClassVar[str] = "series"
    series_lens: list[int] | None = Field(None, description="short,long output tokens (16,512)")
    input_len: int | None = Field(None, description="prompt tokens")


class TTFTSpec(WorkloadSpec):
    """Time to first token as the prompt grows (one stream)."""

    kind: Literal["ttft"] = "ttft"
    workload: ClassVar[str] = "ttft"
    input_lens: list[int] | None = Field(None, description="prompt lengths")


class PrefixSpec(WorkloadSpec):
    """Prompts sharing ``groups`` prefixes of ``prefix_len`` tokens vs unique prompts; the prefix
    cache's hit rate where the server exposes /metrics."""

    kind: Literal["prefix"] = "prefix"
    workload: ClassVar[str] = "prefix"
    input_len: int | None = Field(None, description="prompt tokens")
    prefix_len: int | None = Field(None, description="shared tokens (default 3/4 of input)")
    groups: int | None = Field(None, description="number of prefixes")


class AnswersSpec(WorkloadSpec):
    """Fixed questions, greedy: what two servers' answers are compared on."""

    kind: Literal["answers"] = "answers"
    workload: ClassVar[str] = "answers"
    concurrency: list[int] | None = Field(None, description="closed-loop streams per cell")


class LoadSpec(WorkloadSpec):
    """The series' load test: ``c`` concurrent requests of one shared prompt."""

    kind: Literal["load"] = "load"
    workload: ClassVar[str] = "load"
    concurrency: list[int] | None = Field(None, description="closed-loop streams per cell")
    input_len: int | None = Field(None, description="prompt tokens")


SPECS: tuple[type[WorkloadSpec], ...] = (
    DecodeSpec,
    OpenLoopSpec,
    SweepSpec,
    SeriesDecodeSpec,
    TTFTSpec,
    PrefixSpec,
    AnswersSpec,
    LoadSpec,
)
AnySpec = Annotated[
    Union[DecodeSpec, OpenLoopSpec, SweepSpec, SeriesDecodeSpec, TTFTSpec, PrefixSpec, AnswersSpec, LoadSpec],  # noqa: UP007 - a discriminated union pydantic reads
    Field(discriminator="kind"),
]


@dataclass(frozen=True)
class ServedAt:
    """The plainest :class:`Served`: a server or endpoint known by its URL and served model name
    (what the MCP tool ``run_benchmark`` is given)."""

    url: str
    served_name: str
    tokenizer: str | None = None
    gpu: str | None = None
    api_key: str | None = None
    max_num_seqs: int | None = None


def spec_error(what: str, exc: ValidationError) -> SpecRefused:
    """One line naming the field a spec refused (an unknown name, or a wrong type)."""
    first = exc.errors()[0]
    field = ".".join(str(p) for p in first["loc"]) or "fields"
    if first["type"] == "extra_forbidden":
        return SpecRefused(
            f"{what} has no field {field!r}",
            fix=f"{what} takes: {', '.join(_field_names(what))}",
        )
    return SpecRefused(f"{what}.{field}: {first['msg']}", fix=f"give {field} as the type {what} declares")


def _field_names(what: str) -> list[str]:
    spec = next((s for s in SPECS if s.__name__ == what), None)
    return sorted(n for n in spec.model_fields if n != "kind") if spec else []


def spec_for(kind: str, **fields: object) -> WorkloadSpec:
    """The spec of registry entry ``kind`` (decode, open_loop, sweep, series_decode, ttft, prefix,
    answers, load) with ``fields``."""
    by_kind = {s.model_fields["kind"].default: s for s in SPECS}
    if kind not in by_kind:
        raise Gemma4T4Error(f"unknown workload {kind!r}", fix=f"use one of: {', '.join(by_kind)}")
    return by_kind[kind](**fields)


def run(
    served: Served,
    spec: WorkloadSpec,
    out_dir: str | Path,
    *,
    label: str | None = None,
    model_format: str | None = None,
    overwrite: bool = False,
    progress: bool = True,
    request_timeout_s: float | None = 600.0,
):
    """Run ``spec`` on ``served``; write a results directory under ``out_dir`` and return the
    :class:`~gemma4_t4.bench.results.BenchRun` (its ``.table()``, ``per_stream_by_concurrency()``,
    ``ttft_by_input_len()``, ``prefix_hit_rate()``, ...)."""
    if not isinstance(spec, WorkloadSpec):
        raise Gemma4T4Error(
            f"run() takes a workload spec, got {type(spec).__name__}",
            fix="pass e.g. DecodeSpec(concurrency=[1, 8]) from gemma4_t4.bench.specs",
        )
    from gemma4_t4.bench.workloads import BenchArgs, run_benchmark  # the client: only when a run starts

    args = BenchArgs(
        base_url=served.url,
        model=served.served_name,
        workload=spec.workload,
        out_dir=str(out_dir),
        tokenizer=served.tokenizer,
        gpu=served.gpu,
        api_key=served.api_key,
        max_num_seqs=served.max_num_seqs,
        label=label,
        model_format=model_format,
        overwrite=overwrite,
        progress=progress,
        request_timeout_s=request_timeout_s,
        **spec.bench_fields(),
    )
    return run_benchmark(args)
