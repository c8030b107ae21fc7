"""The cost guard's arithmetic: the estimated $/hour before deploying and the cost so far of a
running endpoint (``reaper.reap`` enforces the lifetime tags; it lives apart so that ``ops``
can use these figures without an import cycle)."""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass

from gemma4_t4.catalog.hardware import sagemaker_price
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation.table import Displayable
from gemma4_t4.sagemaker.config import EXPIRES_TAG, PROJECT_TAG, PROJECT_VALUE


def usd(amount: float) -> str:
    """An amount of USD as every cost and budget line shows it: cents from $1 up, and below $1 two
    significant digits (at least cents), so a small budget reads "$0.0001", never "$0.00"."""
    if not math.isfinite(amount):
        return f"${amount}"
    sign, amount = ("-" if amount < 0 else ""), abs(amount)
    if amount == 0 or amount >= 1:
        return f"{sign}${amount:.2f}"
    decimals = max(2, 1 - math.floor(math.log10(amount)))
    text = f"{amount:.{decimals}f}".rstrip("0")
    whole, _, cents = text.partition(".")
    return f"{sign}${whole}.{cents.ljust(2, '0')}"


@dataclass
class CostEstimate(Displayable):
    instance_type: str
    instance_count: int
    usd_per_hour: float | None  # None: no price in the table
    price_region: str | None
    source: str | None

    def caption(self) -> str:
        return f"Published on-demand price ({self.price_region or 'no region'})"

    def table_rows(self) -> list[dict[str, object]]:
        day = 24 * self.usd_per_hour if self.usd_per_hour is not None else None
        return [{"instance": self.instance_type, "$ / hour": self.usd_per_hour, "$ if forgotten for a day": day}]

    def line(self) -> str:
        if self.usd_per_hour is None:
            return f"{self.instance_type}: no price in gemma4_t4.catalog.hardware.PRICES; check the SageMaker pricing page"
        return (
            f"estimated cost: ${self.usd_per_hour:.3f}/hour for {self.instance_count}x {self.instance_type} "
            f"(on-demand, {self.price_region}; billed until the endpoint is deleted)"
        )


def estimate(instance_type: str, instance_count: int = 1) -> CostEstimate:
    price = sagemaker_price(instance_type)
    if price is None:
        return CostEstimate(instance_type, instance_count, None, None, None)
    return CostEstimate(
        instance_type, instance_count, price.usd_per_hour * instance_count, price.region, price.source
    )


def hours_between(start: dt.datetime, end: dt.datetime) -> float:
    return max(0.0, (end - start).total_seconds() / 3600.0)


def parse_expiry(tags: dict[str, str]) -> dt.datetime | None:
    raw = tags.get(EXPIRES_TAG)
    if not raw:
        return None
    try:  # what deploy writes (...Z), and any ISO 8601 time a user extends it with (+00:00, no zone = UTC)
        parsed = dt.datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


def is_ours(tags: dict[str, str]) -> bool:
    return tags.get(PROJECT_TAG) == PROJECT_VALUE


MAX_ASSISTANT_BUDGET_USD = 100.0  # the most one deploy through the MCP server may bill; a person's CLI has no cap


@dataclass
class BilledBound:
    """The worst case of one deployment: every instance it may run, for its whole lifetime, at the costliest
    price of its pool. What an assistant's deploy shows in its preview and must fit in its budget."""

    instance_type: str  # the costliest type of the pool
    instances: int
    hours: float
    usd_per_hour: float  # one instance of instance_type
    budget_usd: float

    @property
    def usd(self) -> float:
        return self.instances * self.hours * self.usd_per_hour

    def line(self) -> str:
        return (f"at most {self.instances}x {self.instance_type} x {self.hours:g} h x ${self.usd_per_hour:.3f}/h = "
                f"{usd(self.usd)}, within the budget of {usd(self.budget_usd)}")


def billed_bound(instance_types: list[str], instances: int, hours: float, budget_usd: float) -> BilledBound:
    """The bound of a deployment (instances x hours x price), refused where a type has no price (no budget can
    be enforced) or where it exceeds ``budget_usd``, before anything is created."""
    if not 0 < budget_usd <= MAX_ASSISTANT_BUDGET_USD:
        raise Gemma4T4Error(f"budget {budget_usd!r} must be in (0, {MAX_ASSISTANT_BUDGET_USD:g}] USD",
                            fix="pass budget_usd within it; a larger deployment is a person's (gemma4-t4 sagemaker deploy)")
    priced = []
    for instance_type in instance_types:
        price = sagemaker_price(instance_type)
        if price is None:
            raise Gemma4T4Error(f"no price for {instance_type}: a budget cannot be enforced",
                                fix="use an instance type listed in gemma4_t4.catalog.hardware.PRICES")
        priced.append((price.usd_per_hour, instance_type))
    rate, costliest = max(priced)
    bound = BilledBound(costliest, instances, hours, rate, budget_usd)
    if bound.usd > budget_usd:
        raise Gemma4T4Error(
            f"this deployment may bill {usd(bound.usd)} ({instances}x {costliest} x {hours:g} h x ${rate:.3f}/h), "
            f"over the budget of {usd(budget_usd)}",
            fix="lower ttl_hours or the instance count, or raise budget_usd (at most "
            f"{usd(MAX_ASSISTANT_BUDGET_USD)} through the MCP server)")
    return bound
