"""A cell (one measured condition: its requests and its warm-up requests) and the helpers each
workload (:mod:`gemma4_t4.bench.specs`) builds its cells with."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from gemma4_t4.bench.client import RequestSpec

if TYPE_CHECKING:
    from gemma4_t4.bench.prompts import Prompt


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
        RequestSpec(f"{cell}-{i}", p.text, output_len, api=api, input_len=p.tokens)
        for i, p in enumerate(prompts)
    ]


def warm_count(warmup: int, concurrency: int) -> int:
    # a full batch of warm-up requests: the first batch of a new size can stall on some backends.
    # ``concurrency`` is what the cell can have in flight: never more than its measured prompts
    return max(warmup, concurrency) if warmup > 0 else 0

