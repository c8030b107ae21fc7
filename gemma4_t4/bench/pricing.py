"""What a measured throughput costs: a run's best output tok/s priced at an hourly price, beside the
series' published SageMaker rows. Only a real Gemma 4 size measured on the GPU it is priced as gets a
price; a tiny random model's or a CPU's speed gets the reason it has none."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gemma4_t4.bench.published import L4_INSTANCE, SAGEMAKER_LOAD, T4_INSTANCE, measured_kind
from gemma4_t4.catalog.hardware import PRICES, price_key, usd_per_million_tokens
from gemma4_t4.foundation.table import Displayable


@dataclass
class MeasuredPrice:
    """$ per million output tokens at a run's best output tok/s, or why none is shown."""

    usd_per_mtok: float | None
    output_tok_s: float | None
    label: str  # what the row is: the price's instance, or why there is none

    def summary(self) -> float | str:
        """What a notebook summary shows: the price, or the reason there is none."""
        return self.usd_per_mtok if self.usd_per_mtok is not None else self.label


def measured_price(run: Any, price: Any) -> MeasuredPrice:
    """The run's best output tok/s priced at ``price`` (a :class:`gemma4_t4.catalog.hardware` price) —
    only for a real Gemma 4 size measured on the GPU it is priced as. A tiny random model, a CPU,
    or a run that did not record its kind gets no price, and the label says why (a tiny model's
    speed priced as a T4 would read as the cost of serving Gemma 4)."""
    done = run.require_complete("price")
    best = max((v for v in done.throughput_by_concurrency().values() if v), default=None)
    why = measured_kind(done).unpriced(price.gpu)
    if why or not best:
        return MeasuredPrice(None, best, why or "no $/Mtok: no output tok/s was measured")
    return MeasuredPrice(usd_per_million_tokens(price.usd_per_hour, best), best,
                         f"priced as {price.platform} {price.instance} ({price.gpu})")


@dataclass
class CostTable(Displayable):
    """$ per million output tokens at full utilisation: the series' published SageMaker rows (T4,
    L4) and this run's best output tok/s at ``price``, or why it has none (:func:`measured_price`)."""

    price: Any  # the hardware table's price this run is priced at
    measured: MeasuredPrice
    venue: str

    def caption(self) -> str:
        return "$ per million output tokens at full utilisation"

    def table_rows(self) -> list[dict[str, object]]:
        load = SAGEMAKER_LOAD[0]  # the series' c=16 figures of E2B emb4
        rows: list[dict[str, object]] = []
        for gpu, instance, tok_s in (("T4", T4_INSTANCE, load.t4_tok_s), ("L4", L4_INSTANCE, load.l4_tok_s)):
            usd_per_hour = PRICES[price_key("sagemaker", instance)].usd_per_hour
            rows.append({"source": f"published: SageMaker {instance} ({gpu}), E2B emb4, c={load.concurrency}",
                         "output tok/s": tok_s, "$/h": usd_per_hour,
                         "$ per million output tokens": usd_per_million_tokens(usd_per_hour, tok_s)})
        rows.append({"source": f"measured here ({self.venue}): {self.measured.label}",
                     "output tok/s": self.measured.output_tok_s, "$/h": self.price.usd_per_hour,
                     "$ per million output tokens": self.measured.summary()})
        return rows
