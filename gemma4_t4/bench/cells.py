"""A cell (one measured condition: its requests and its warm-up requests) and the helpers each
workload (:mod:`gemma4_t4.bench.specs`) builds its cells with."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from gemma4_t4.bench.client import RequestSpec

if TYPE_CHECKING:
    from gemma4_t4.bench.prompts import Prompt, PromptFactory


class RunOptions(Protocol):
    """What a cell reads from the run (not the workload): the API it speaks."""

    api: str | None


@dataclass
class Cell:
    cell: str
    workload: str
    variant: str
    concurrency: int
    input_len: int | None
    output_len: int
    specs: list[RequestSpec]
    warmup_specs: list[RequestSpec]
    meta: dict[str, int | bool | str] = field(default_factory=dict)
    rate: float | None = None  # open loop: offered requests/s (concurrency is then the in-flight cap)
    arrival: str | None = None


def request_specs(prompts: list[Prompt], cell: str, api: str | None, output_len: int) -> list[RequestSpec]:
    """One greedy, exact-length request per prompt."""
    return [
        RequestSpec(
            f"{cell}-{i}", p.text, output_len, api=api, ignore_eos=True, temperature=0.0, input_len=p.tokens
        )
        for i, p in enumerate(prompts)
    ]


def warm_count(warmup: int, concurrency: int) -> int:
    # a full batch of warm-up requests: the first batch of a new size can stall on some backends.
    # ``concurrency`` is what the cell can have in flight: never more than its measured prompts
    return max(warmup, concurrency) if warmup > 0 else 0


def unique_cell(
    factory: PromptFactory,
    api: str | None,
    warmup: int,
    name: str,
    workload: str,
    variant: str,
    c: int,
    n: int,
    length: int,
    output_len: int,
    **extra: object,
) -> Cell:
    """A cell of ``n`` unique prompts of ``length`` tokens at concurrency ``c``, warmed up first."""
    warm = f"w-{name}"
    return Cell(
        name,
        workload,
        variant,
        c,
        length,
        output_len,
        request_specs(factory.unique(name, n, length), name, api, output_len),
        # c = 100000 with 2 prompts has 2 in flight: its warm-up is 2 prompts, not 100000 to tokenize
        request_specs(factory.unique(warm, warm_count(warmup, min(c, n)), length), warm, api, output_len),
        **extra,  # type: ignore[arg-type]
    )
