"""``reap``: delete this project's endpoints whose lifetime tag has passed.

A crashed deploy in the reference billed for 36 minutes and one endpoint stayed ``Creating``
for 3.5 hours; every endpoint here carries an expiry tag that ``reap`` (run from cron, CI
or by hand) enforces.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, field

from gemma4_t4.sagemaker.aws import ClientFactory, client_factory
from gemma4_t4.sagemaker.cost import hours_between, parse_expiry
from gemma4_t4.sagemaker.image import US_REGIONS
from gemma4_t4.sagemaker.ops import delete_endpoint, list_endpoints


@dataclass
class ReapDecision:
    name: str
    region: str
    status: str
    expires_at: str | None
    action: str  # "delete" | "keep" | "deleted" | "failed"
    reason: str
    created_at: float | None = None  # the listed endpoint's CreationTime: what the delete checks


@dataclass
class ReapResult:
    dry_run: bool
    decisions: list[ReapDecision] = field(default_factory=list)

    @property
    def deleted(self) -> list[str]:
        return [d.name for d in self.decisions if d.action == "deleted"]

    @property
    def expired(self) -> list[str]:
        return [d.name for d in self.decisions if d.action in ("delete", "deleted", "failed")]


def reap(
    regions: Sequence[str] = US_REGIONS,
    *,
    dry_run: bool = False,
    now: dt.datetime | None = None,
    clients: ClientFactory | None = None,
) -> ReapResult:
    """Delete (endpoint, config, model of) every project endpoint past its expiry tag.

    Endpoints without the project tag are never touched; project endpoints without an expiry
    tag are reported and kept; one whose expiry tag does not parse is treated as expired (its
    lifetime was meant to be enforced, and keeping it would bill with no end).
    """
    now = now or dt.datetime.now(dt.UTC)
    make = clients or client_factory()
    result = ReapResult(dry_run)
    for endpoint in list_endpoints(regions, clients=make, project_only=True):
        expires = parse_expiry(endpoint.tags)
        if expires is None and endpoint.expires_at is None:
            action, why = "keep", "no expiry tag"
        elif expires is None:  # a lifetime was set but cannot be read: fail safe, stop the billing
            action = "delete"
            why = (f"expiry tag {endpoint.expires_at!r} does not parse (want YYYY-MM-DDTHH:MM:SSZ): "
                   "treated as expired")
        elif expires > now:
            action, why = "keep", f"{hours_between(now, expires):.2f} h left"
        else:
            action, why = "delete", f"expired {hours_between(expires, now):.2f} h ago"
        created = dt.datetime.fromisoformat(endpoint.created_at).timestamp() if endpoint.created_at else None
        decision = ReapDecision(endpoint.name, endpoint.region, endpoint.status, endpoint.expires_at, action, why,
                                created)
        result.decisions.append(decision)
        if action != "delete" or dry_run:
            continue
        try:
            # by identity: the endpoint listed, not whatever holds its name by now (another owner's re-creation)
            delete_endpoint(decision.name, decision.region, client=make("sagemaker", decision.region),
                            created_at=created)
            decision.action = "deleted"
        except Exception as exc:  # noqa: BLE001 - one failure must not stop the reaping of the rest
            decision.action, decision.reason = "failed", f"{why}; delete failed: {exc}"
    return result
