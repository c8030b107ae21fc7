"""The workload registry and what every workload class shares: the base class, its mixins (a field
several workloads take is declared once, here), the :func:`workload` decorator and the ways a spec
is chosen (by kind, from the CLI's flags, from a notebook's parameters). The workloads themselves
are in :mod:`gemma4_t4.bench.specs`, one class each.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, ClassVar, Literal, TypeVar, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetPydanticSchema,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)

from gemma4_t4.bench.cells import Cell, RunOptions, request_specs, warm_count
from gemma4_t4.bench.schemas import BenchModel, CellSummary, RequestRecord
from gemma4_t4.errors import Gemma4T4Error

if TYPE_CHECKING:
    from gemma4_t4.bench.prompts import PromptFactory

Value = int | float | str | list[int] | list[float] | None
Values = dict[str, Value]
VENUES = ("t4", "cpu", "sagemaker")

# Bounds of what one run may ask for (Field limits, so the MCP schema carries them too). Far above
# any real measurement (the series: 8 prompts a cell, c <= 16), low enough that a typo (1e9 prompts,
# c = 100000) is refused at once instead of building prompts, or sending them, for days.
MAX_STREAMS = 1024  # concurrent requests (vLLM's --max-num-seqs tops out in the hundreds)
MAX_PROMPTS = 10_000  # measured (or warm-up) requests per cell
MAX_TOKENS = 1_048_576  # prompt or output tokens: no served context is longer
MAX_RATES = 64  # open-loop rates (or sweep steps) in one run


class SpecRefused(Gemma4T4Error, ValueError):
    """A spec refused: an unknown field, a wrong type, or a rule of its workload. Also a
    ValueError, so that a spec inside another model (the MCP tool's arguments) is refused as
    pydantic's ValidationError, naming what is wrong, instead of escaping it."""


# ---------------------------------------------------------------- the registry

REGISTRY: dict[str, type[WorkloadSpec]] = {}
S = TypeVar("S", bound="WorkloadSpec")


def workload(kind: str) -> Callable[[type[S]], type[S]]:
    """Register a workload class under ``kind`` (its ``kind`` field, the discriminator the MCP
    tool and the CLI's ``--workload`` choose it by)."""

    def register(cls: type[S]) -> type[S]:
        if kind in REGISTRY:
            raise TypeError(f"workload {kind!r} is registered twice ({REGISTRY[kind].__name__}, {cls.__name__})")
        registered = create_model(  # the same class with its kind as a Literal field
            cls.__name__,
            __base__=cls,
            __module__=cls.__module__,
            __doc__=cls.__doc__,
            kind=(Literal[kind], kind),  # type: ignore[valid-type]
        )
        registered.__qualname__ = cls.__qualname__
        if "workload" not in vars(cls):  # what the results call it: its kind, unless the class names another
            registered.workload = kind
        REGISTRY[kind] = registered
        return registered

    return register


def any_spec() -> object:
    """The union of every registered workload, told apart by ``kind`` (read when a schema is made,
    so a workload registered later is in it)."""
    return Annotated[Union[tuple(REGISTRY.values())], Field(discriminator="kind")]  # noqa: UP007 - built at run time


# ---------------------------------------------------------------- papermill's forms of a list


def as_list(value: object, cast: type, owner: str, field: str, param: str) -> object:
    """A list field given one number (``-p CONCURRENCY 4``) or as text (``-p CONCURRENCY "[1, 4]"``,
    ``"1,4"``, ``"1 4"``): read as the list it plainly means; anything else refused with the forms."""
    if value is None or isinstance(value, list):
        return value
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return [value]
    if isinstance(value, str):
        words = [w for w in re.split(r"[,\s]+", value.strip().removeprefix("[").removesuffix("]")) if w]
        try:
            return [cast(w) for w in words]
        except ValueError:
            pass
    kind = "integers" if cast is int else "numbers"
    raise SpecRefused(
        f"{owner}.{field}: cannot read {value!r} as a list of {kind}",
        fix=f'give {field} as a list ([1, 4]), one number (4), or the text "[1, 4]", "1,4" or "1 4"; '
        f'with papermill: -p {param} 4 or -y "{param}: [1, 4]"',
    )


# ---------------------------------------------------------------- fields every workload shares


class WorkloadSpec(BaseModel):
    """Fields every workload shares. Unknown fields and wrong types are refused, naming the field."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str  # set by @workload: the registry entry, the discriminator of AnySpec
    workload: ClassVar[str]  # what the results call it: its kind unless declared (open loop and sweep are decode runs)
    api: ClassVar[str] = "completions"  # the API it speaks unless the run chooses
    prompts: ClassVar[bool] = True  # needs exact-length prompts (a tokenizer)
    defaults: ClassVar[Values] = {}  # the value of a field left out
    venues: ClassVar[dict[str, Values]] = {}  # a venue's values where they differ from the defaults
    params: ClassVar[dict[str, str]] = {}  # a notebook parameter -> the field it sets

    output_len: int | None = Field(None, ge=1, le=MAX_TOKENS, description="output tokens (ignore_eos)")
    num_prompts: int | None = Field(None, ge=1, le=MAX_PROMPTS, description="measured requests per cell")
    warmup: int = Field(
        2, ge=0, le=MAX_PROMPTS, description="warm-up requests per cell, at least what the cell has in flight"
    )
    seed: int = Field(0, description="seed of the prompts' words")
    nonce: str | None = Field(None, description="reproduce a run's exact prompts (see its run.json)")

    def __init__(self, **fields: object) -> None:
        try:
            super().__init__(**fields)
        except ValidationError as exc:
            refused = exc.errors()[0].get("ctx", {}).get("error")
            if isinstance(refused, SpecRefused):  # a rule of the workload: already one line with its fix
                raise refused from None
            raise spec_error(type(self), exc) from None

    @model_validator(mode="before")
    @classmethod
    def _fill_defaults(cls, data: object) -> object:
        if not isinstance(data, dict):
            return data
        given = {k: v for k, v in data.items() if v is not None}
        return cls.derived(cls.defaults | given)

    # papermill's forms of every list field (each declared by the workloads that take it), read once here
    @field_validator("concurrency", "input_lens", "series_lens", "rates", mode="before", check_fields=False)
    @classmethod
    def _read_lists(cls, value: object, info: ValidationInfo) -> object:
        field = str(info.field_name)
        param = next((p for p, f in cls.params.items() if f == field), field.upper())  # its notebook parameter
        return as_list(value, float if field == "rates" else int, cls.__name__, field, param)

    @classmethod
    def derived(cls, data: Values) -> Values:
        """Defaults that follow from other fields (a prefix is 3/4 of the prompt)."""
        return data

    def pace(self) -> list[tuple[int, float]]:
        """Its open-loop cells known before the run, as (requests, the rate they are sent at): how long
        the run takes at the least; none where only the server's speed would tell (a closed loop)."""
        return []

    @classmethod
    def for_venue(cls: type[S], venue: str, **given: object) -> S:
        """This workload with ``given`` (``None``: the venue's value, else its default) on ``venue``
        (t4, cpu, sagemaker) — what a notebook builds."""
        if venue not in VENUES:
            raise Gemma4T4Error(f"unknown venue {venue!r}", fix=f"use one of: {', '.join(VENUES)}")
        # a field neither names is filled from ``defaults`` by _fill_defaults, as for any spec
        return cls(**cls.venues.get(venue, {}) | {k: v for k, v in given.items() if v is not None})

    def prompt_lens(self) -> list[int]:
        """The prompt lengths this workload sends (checked against the server's max_model_len)."""
        length = getattr(self, "input_len", None)
        return [length] if length else []

    def longest_output(self) -> int:
        return self.output_len or 0

    def unique_cell(
        self, run: RunOptions, factory: PromptFactory | None, name: str, variant: str, c: int, n: int,
        length: int | None = None, output_len: int | None = None, warm: int | None = None, **cell: object,
    ) -> Cell:
        """A cell of ``n`` unique prompts at concurrency ``c``, warmed up first with ``warm`` prompts;
        ``length``/``output_len`` where they are not this workload's ``input_len``/``output_len``,
        ``cell``: the open loop's rate and arrival."""
        length = length or getattr(self, "input_len", None)
        out = output_len or self.output_len
        # c = 100000 with 2 prompts has 2 in flight: its warm-up is 2 prompts, not 100000 to tokenize
        warm = warm_count(self.warmup, min(c, n)) if warm is None else warm
        specs = request_specs(factory.unique(name, n, length), name, run.api, out)
        warm_specs = request_specs(factory.unique(f"w-{name}", warm, length), f"w-{name}", run.api, out)
        return Cell(name, self.workload, variant, c, length, out, specs, warm_specs, **cell)

    def cells(self, run: RunOptions, factory: PromptFactory | None) -> list[Cell]:
        """Every cell known before anything is measured, prompts included."""
        raise NotImplementedError(f"{type(self).__name__} builds no cells")

    def follow(
        self, run: RunOptions, factory: PromptFactory | None, done: list[CellSummary]
    ) -> tuple[list[Cell], dict[str, BenchModel]]:
        """After a cell is measured: more cells, and fields for run.json (none by default)."""
        return [], {}

    def finish(self, cells: list[Cell], measured: dict[str, list[RequestRecord]]) -> dict[str, BenchModel]:
        """After every cell: fields for run.json computed from the records (none by default)."""
        return {}


# a spec of any registered workload, as a parameter type (the MCP tool's ``spec``): its schema is
# made from the registry when a model using it is built, so a workload registered later is in it
AnySpec = Annotated[WorkloadSpec, GetPydanticSchema(lambda _source, handler: handler(any_spec()))]


class Streams(WorkloadSpec):
    concurrency: list[Annotated[int, Field(ge=1, le=MAX_STREAMS)]] | None = Field(
        None, min_length=1, description="closed-loop streams per cell, e.g. 1,2,4,8,16"
    )


class PromptLen(WorkloadSpec):
    input_len: int | None = Field(None, ge=1, le=MAX_TOKENS, description="prompt tokens")


class Arrivals(WorkloadSpec):
    arrival: Literal["poisson", "constant"] = Field(
        "poisson", description="open loop: Poisson (default) or evenly spaced arrivals"
    )
    max_in_flight: int = Field(
        256, ge=1, le=MAX_STREAMS, description="open loop: requests the client keeps in flight at most"
    )

    def prompts_at(self, rate: float) -> int:
        """Requests of an open-loop cell at ``rate``: ``num_prompts``, else ~30 s of arrivals (16-256)."""
        return self.num_prompts or max(16, min(256, round(30 * rate)))


# ---------------------------------------------------------------- choosing a spec


def spec_error(spec: type[WorkloadSpec], exc: ValidationError) -> SpecRefused:
    """One line naming the field a spec refused (an unknown name, or a wrong type)."""
    what, first = spec.__name__, exc.errors()[0]
    field = ".".join(str(p) for p in first["loc"]) or "fields"
    if first["type"] == "extra_forbidden":
        owners = [kind for kind, registered in REGISTRY.items() if field in registered.model_fields]
        where = f" (a field of the {', '.join(owners)} workload{'s' if len(owners) > 1 else ''})" if owners else ""
        return SpecRefused(
            f"{what} has no field {field!r}{where}", fix=f"{what} takes: {', '.join(sorted(set(spec.model_fields) - {'kind'}))}"
        )
    bound = _BOUNDS.get(first["type"], "").format(**first.get("ctx", {}))
    if bound:  # a value outside its Field limits: say the limit, not pydantic's sentence
        where = field if "." not in field else f"each of {field.split('.')[0]}"
        return SpecRefused(f"{what}.{field} = {first['input']!r} must be {bound}", fix=f"give {where} {bound}")
    return SpecRefused(f"{what}.{field}: {first['msg']}", fix=f"give {field} as the type {what} declares")


# pydantic's error types of a Field limit -> the limit in words (its ctx holds the bound)
_BOUNDS = {
    "greater_than_equal": "at least {ge}", "greater_than": "above {gt}", "less_than_equal": "at most {le}",
    "less_than": "below {lt}", "too_long": "at most {max_length} values", "too_short": "at least {min_length} value(s)",
    "finite_number": "a finite number",
}  # fmt: skip


def spec_for(kind: str, **fields: object) -> WorkloadSpec:
    """The spec of registry entry ``kind`` (decode, open_loop, sweep, series_decode, ttft, prefix,
    answers, load, or any registered later) with ``fields``."""
    if kind not in REGISTRY:
        raise Gemma4T4Error(f"unknown workload {kind!r}", fix=f"use one of: {', '.join(REGISTRY)}")
    return REGISTRY[kind](**fields)


def spec_from_options(workload: str, method: str | None = None, **fields: object) -> WorkloadSpec:
    """The spec the CLI's flags (or :func:`~gemma4_t4.bench.workloads.run_benchmark`'s options)
    name: ``--workload decode`` with ``--rate`` is an open-loop run, with ``--sweep`` a sweep, with
    ``--method series`` the series' decode; ``--input-len`` of a ttft run is its one length."""
    given = {k: v for k, v in fields.items() if v is not None}
    if "sweep" in given and (workload != "decode" or "rates" in given or "concurrency" in given):
        raise Gemma4T4Error(
            "--sweep is for the decode workload and chooses its own rates",
            fix="use --workload decode and drop --rate/--concurrency",
        )
    if "rates" in given and workload not in ("decode", "open_loop"):
        raise Gemma4T4Error(
            f"--rate is for the decode workload, not {workload}", fix="drop --rate, or use --workload decode"
        )
    if method == "series":
        if workload != "decode" or "rates" in given or "sweep" in given:
            raise Gemma4T4Error(
                "--method series is a decode method (8 prompts at c=1)",
                fix="use --workload decode without --rate/--sweep",
            )
        workload = "series_decode"
    elif method not in (None, "vllm"):
        raise Gemma4T4Error(f"unknown method {method!r}", fix="use --method vllm or --method series")
    if workload == "decode" and "sweep" in given:
        workload = "sweep"
    elif workload == "decode" and "rates" in given:
        workload = "open_loop"
    if workload == "ttft" and "input_len" in given:
        given.setdefault("input_lens", [given.pop("input_len")])
    return spec_for(workload, **given)


def notebook_params(venue: str, **values: object) -> dict[str, object]:
    """A notebook's workload parameters (``CONCURRENCY``, ``TTFT_INPUT_LENS``, ...), each read by
    the workload class that declares it (its ``params``): ``None`` takes the venue's value, anything
    else is read as that class reads it (papermill's ``-p`` forms included) or refused, named."""
    out = {}
    for name, value in values.items():
        owner = next((c for c in REGISTRY.values() if name in c.params), None)
        if owner is None:
            raise Gemma4T4Error(f"{name} is no workload parameter", fix=f"set {name} in the parameters cell")
        field = owner.params[name]
        out[name] = getattr(owner.for_venue(venue, **{field: value}), field)
    return out


