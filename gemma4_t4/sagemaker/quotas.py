"""SageMaker endpoint quotas, looked up by name ("ml.g4dn.xlarge for endpoint usage"): quota codes
differ between instance types and are no stable public contract. Regions are queried one after
another (parallel Service Quotas calls get throttled); the check is advisory (it cannot see
instances already in use by other endpoints)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation.table import Displayable
from gemma4_t4.sagemaker.aws import (
    ClientFactory,
    aws_error,
    aws_exceptions,
    client_factory,
    is_credentials_error,
)
from gemma4_t4.sagemaker.cli_recipe import ApiCall
from gemma4_t4.sagemaker.config import check_instance_types
from gemma4_t4.sagemaker.image import US_REGIONS, validate_region


def quota_name(instance_type: str) -> str:
    return f"{instance_type} for endpoint usage"


@dataclass
class QuotaRow:
    region: str
    instance_type: str
    quota_name: str
    value: float | None  # None: not found or the lookup failed
    quota_code: str | None = None
    adjustable: bool | None = None
    error: str | None = None

    @property
    def available(self) -> bool:
        return bool(self.value and self.value >= 1)


@dataclass
class QuotaReport(Displayable):
    rows: list[QuotaRow] = field(default_factory=list)

    columns = ("region", "instance_type", "value", "error")

    def caption(self) -> str:
        types = ", ".join(dict.fromkeys(r.instance_type for r in self.rows))
        return f"{types or 'no instance type'} for endpoint usage"

    def table_rows(self) -> list[QuotaRow]:
        return self.rows

    def notes(self) -> list[str]:
        """The learner's reading: which regions can host one endpoint, and what a 0 means."""
        lines = []
        for itype in dict.fromkeys(r.instance_type for r in self.rows):
            rows = [r for r in self.rows if r.instance_type == itype]
            ok = self.regions_with_capacity(itype)
            lines.append(f"{len(ok)} of {len(rows)} regions allow at least one {itype} endpoint"
                         f"{': ' + ', '.join(ok) if ok else ''}" + ("" if len(ok) == len(rows) else
                         "; a 0 or a failed lookup there needs a quota increase (Service Quotas) before a deploy"))
        return lines

    def regions_with_capacity(self, instance_type: str) -> list[str]:
        return [r.region for r in self.rows if r.instance_type == instance_type and r.available]

def quota_plan(instance_types: Sequence[str], regions: Sequence[str]) -> list[ApiCall]:
    note = f"look for: {', '.join(quota_name(t) for t in instance_types)}"
    return [ApiCall("service-quotas", "list_service_quotas", {"ServiceCode": "sagemaker"}, region, note=note)
            for region in regions]


def region_quotas(region: str, instance_types: Sequence[str], client: Any) -> list[QuotaRow]:
    """All wanted endpoint quotas in one region (one paginated list call)."""
    wanted = {quota_name(t): t for t in instance_types}
    found: dict[str, QuotaRow] = {}
    try:
        for page in client.get_paginator("list_service_quotas").paginate(ServiceCode="sagemaker"):
            for quota in page.get("Quotas", []):
                instance = wanted.get(quota.get("QuotaName", ""))
                if instance:
                    found[instance] = QuotaRow(region, instance, quota["QuotaName"], float(quota["Value"]),
                                               quota.get("QuotaCode"), quota.get("Adjustable"))
    except aws_exceptions() as exc:  # recorded per region; the other regions still answer
        if is_credentials_error(exc):  # ...unless the caller has no credentials: no region would answer
            raise aws_error(exc, "ListServiceQuotas") from exc
        message = str(aws_error(exc, "ListServiceQuotas")).splitlines()[0]
        return [QuotaRow(region, t, quota_name(t), None, error=message) for t in instance_types]
    return [found.get(t) or QuotaRow(region, t, quota_name(t), None, error="quota not listed in this region")
            for t in instance_types]


def check_quotas(instance_types: Sequence[str] = ("ml.g4dn.xlarge",), regions: Sequence[str] = US_REGIONS,
                 clients: ClientFactory | None = None) -> QuotaReport:
    """Endpoint quotas for each instance type in each region, queried sequentially."""
    for region in regions:
        validate_region(region)
    check_instance_types(instance_types)
    make = clients or client_factory()
    report = QuotaReport()
    for region in regions:
        report.rows += region_quotas(region, instance_types, make("service-quotas", region))
    return report


def pick_region(report: QuotaReport, instance_type: str, preferred: Sequence[str] = ()) -> str:
    """The first region (preferred first, then report order) with quota for ``instance_type``."""
    candidates = report.regions_with_capacity(instance_type)
    for region in [*preferred, *candidates]:
        if region in candidates:
            return region
    checked = sorted({r.region for r in report.rows if r.instance_type == instance_type})
    raise Gemma4T4Error(
        f"no quota for {quota_name(instance_type)!r} in any region checked ({', '.join(checked)})",
        fix=f"request an increase: aws service-quotas request-service-quota-increase --service-code sagemaker "
        f"--quota-code <code for '{quota_name(instance_type)}'> --desired-value 1 --region <region>, "
        "or try another instance type",
    )


def pick_regions(report: QuotaReport, instance_types: Sequence[str]) -> tuple[dict[str, str | None], dict[str, str]]:
    """Per instance type the region to deploy in (None where no region has quota) and, for those, why."""
    picked: dict[str, str | None] = {}
    why = {}
    for instance in instance_types:
        try:
            picked[instance] = pick_region(report, instance)
        except Gemma4T4Error as exc:
            picked[instance], why[instance] = None, str(exc)
    return picked, why
