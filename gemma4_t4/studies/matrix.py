"""The matrix run: for each model in turn, deploy an endpoint, run the workload specs on it, delete
it, under a hard budget.

The shared :class:`~gemma4_t4.venues.endpoint.Budget` refuses the next endpoint when its estimate does
not fit what is left and deletes a live one the moment the budget is spent. Whatever happens (a failed
deploy or measurement, Ctrl-C, SIGTERM, SIGHUP), the ``with`` block deletes every endpoint the run
created before the exception leaves. The specs are checked before anything is deployed.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from gemma4_t4.bench.specs import WorkloadSpec
from gemma4_t4.bench.specs import run as run_spec
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.sagemaker.aws import note_undone
from gemma4_t4.sagemaker.config import DeployConfig
from gemma4_t4.sagemaker.cost import usd
from gemma4_t4.sagemaker.deploy import DeployFailed, describe_deleted
from gemma4_t4.venues.endpoint import (
    DEPLOY_MINUTES,
    MEASURE_MINUTES,
    Budget,
    BudgetRefused,
    Endpoint,
    hourly_rate,
)
from gemma4_t4.venues.parameters import is_real_number
from gemma4_t4.venues.parts import endpoint_name

if TYPE_CHECKING:
    from gemma4_t4.bench.results import BenchRun

# A custom measurement of one endpoint (instead of running the specs): the endpoint, its results
# folder -> whatever it measured (kept as the entry's ``result``).
Measure = Callable[[Endpoint, Path], object]

# a workload label becomes a folder name: letters, digits, dot, dash and underscore
_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class EndpointHandling:
    """How each endpoint of a run is deployed and measured, the same for every endpoint: one value
    that the matrix and the Parts 2-4 functions take and pass on whole.

    ``client``: the SageMaker client (default: boto3's for the config's region); ``poll_s``: seconds
    between deploy status polls; ``watch_s``: seconds between the budget watch's looks at what is
    spent; ``progress``: print deploy, upload and benchmark progress; ``overwrite``: replace a
    results folder a previous run left; ``request_timeout_s``: each benchmark request's limit (None:
    none). Checked when built, so a wrong value is refused before anything is deployed."""

    client: object = None
    poll_s: float = 15.0
    watch_s: float = 5.0
    progress: bool = True
    overwrite: bool = False
    request_timeout_s: float | None = 600.0

    def __post_init__(self) -> None:
        _check_seconds("poll_s", self.poll_s, zero_ok=True, example="poll_s=15")
        # the budget watch sleeps watch_s between looks: 0 would spin a core while the endpoint is up
        _check_seconds("watch_s", self.watch_s, zero_ok=False, example="watch_s=5")
        if self.request_timeout_s is not None:
            _check_seconds("request_timeout_s", self.request_timeout_s, zero_ok=False,
                           example="request_timeout_s=600, or None for no limit")


def _check_seconds(name: str, value: object, *, zero_ok: bool, example: str) -> None:
    """A finite number of seconds above 0 (or 0 itself where ``zero_ok``); NaN, inf, bools refused."""
    if is_real_number(value) or (zero_ok and type(value) in (int, float) and value == 0):
        return
    least = "0 or more" if zero_ok else "more than 0"
    raise Gemma4T4Error(f"{name} {value!r} must be a number of seconds, {least}", fix=f"e.g. {example}")


def check_specs(specs: Mapping[str, WorkloadSpec]) -> dict[str, WorkloadSpec]:
    """The workload specs by label, refused before anything is deployed: none at all, a label that is
    not a plain folder name, or a value that is not a spec (named)."""
    if not isinstance(specs, Mapping) or not specs:
        raise Gemma4T4Error(
            "no workload to measure: specs must map labels to workload specs",
            fix='pass e.g. specs={"decode": DecodeSpec(concurrency=[1, 8])} (gemma4_t4.bench.specs)',
        )
    for label, spec in specs.items():
        if not isinstance(label, str) or not _LABEL.match(label):
            raise Gemma4T4Error(f"workload label {label!r} is not a plain folder name",
                                fix="use letters, digits, '.', '-' or '_', e.g. 'decode' or 'ttft-long'")
        if not isinstance(spec, WorkloadSpec):
            raise Gemma4T4Error(
                f"specs[{label!r}] is a {type(spec).__name__}, not a workload spec",
                fix="build it from gemma4_t4.bench.specs, e.g. DecodeSpec(concurrency=[1, 8]) or TTFTSpec()",
            )
    return dict(specs)


def over_budget_warning(plan: MatrixResult, budget_usd: float) -> str | None:
    """A warning when the plan's estimate exceeds the budget: which models the run would skip."""
    if plan.estimate_usd <= budget_usd:
        return None
    # the models run in order, so those that fit are the ones whose running total stays within the budget
    fits = sum(total <= budget_usd for total in itertools.accumulate(e.estimate_usd for e in plan.entries))
    return (
        f"the estimate ~{usd(plan.estimate_usd)} exceeds the budget {usd(budget_usd)}: only the first {fits} of "
        f"{len(plan.entries)} model(s) fit; the run stops before the rest (raise --budget-usd or drop models)"
    )


@dataclass
class MatrixEntry:
    model_id: str
    endpoint: str
    status: str  # planned | measured | deploy failed | measure failed | stopped: budget | skipped: budget
    estimate_usd: float
    cost_usd: float = 0.0
    elapsed_s: float = 0.0
    out_dir: str | None = None  # a folder of results directories, one per workload label
    error: str | None = None
    runs: dict[str, BenchRun] = field(default_factory=dict)  # workload label -> its run
    result: object = None  # what a custom ``measure`` returned
    instance_type: str = ""


@dataclass
class MatrixResult:
    instance_type: str
    region: str
    budget_usd: float
    usd_per_hour: float
    entries: list[MatrixEntry] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    stopped_reason: str | None = None

    @property
    def spent_usd(self) -> float:
        return round(sum(e.cost_usd for e in self.entries), 4)

    @property
    def estimate_usd(self) -> float:
        return round(sum(e.estimate_usd for e in self.entries), 4)


def matrix_configs(models: Sequence[str], base: DeployConfig) -> list[DeployConfig]:
    """``base`` once per model, each endpoint named after its model (the matrix run's configs)."""
    return [base.replaced(model_id=m, name=endpoint_name("g4-matrix", m)) for m in models]


def configs_plan(configs: Sequence[DeployConfig]) -> MatrixResult:
    """The cost estimate per endpoint (validated; nothing is called), for the minutes
    ``Endpoint.sagemaker`` prices an endpoint for when the budget admits it."""
    if not configs:
        raise Gemma4T4Error("nothing to deploy", fix="pass at least one model")
    names = [c.name for c in configs]
    if len(set(names)) != len(names):
        raise Gemma4T4Error(f"two endpoints share a name: {names}",
                            fix="give each model its own endpoint name")
    plan = MatrixResult(configs[0].instance_type, configs[0].region, 0.0, hourly_rate(configs[0]))
    for config in configs:
        estimate = round(hourly_rate(config) * (DEPLOY_MINUTES + MEASURE_MINUTES) / 60.0, 4)
        plan.entries.append(MatrixEntry(config.model_id, config.name, "planned", estimate,
                                        instance_type=config.instance_type))
    return plan


def _measure_entry(endpoint: Endpoint, entry_dir: Path, entry: MatrixEntry, checked: Mapping[str, WorkloadSpec],
                   measure: Measure | None, how: EndpointHandling) -> None:
    """Measure one deployed endpoint: the custom ``measure``, else every spec into ``entry_dir/LABEL``."""
    if measure is not None:
        entry.result = measure(endpoint, entry_dir)
        return
    for label, spec in checked.items():
        entry.runs[label] = run_spec(endpoint, spec, entry_dir / label, overwrite=how.overwrite,
                                     progress=how.progress, request_timeout_s=how.request_timeout_s)


def run_configs(configs: Sequence[DeployConfig], specs: Mapping[str, WorkloadSpec], *, budget: Budget | float,
                out_dir: str | Path, measure: Measure | None = None, tokenizer: str | None = None,
                how: EndpointHandling = EndpointHandling()) -> MatrixResult:
    """For each config in turn (one region): deploy its endpoint, run every spec on it into
    ``out_dir/ENDPOINT/LABEL``, delete it. ``budget``: a :class:`Budget` (shared with whatever else
    it is given to) or a number of USD. ``measure``: a custom measurement instead of the specs
    (which are still checked). ``tokenizer``: a local tokenizer for every endpoint (default: each
    config's model id). ``how``: how each endpoint is deployed and measured. Every spec and
    config is checked before the first deploy."""
    checked = check_specs(specs)
    if not isinstance(budget, Budget):
        budget = Budget(budget)
    plan = configs_plan(configs)
    result = dataclasses.replace(plan, budget_usd=budget.usd, entries=[])
    out = Path(out_dir)

    for planned, config in zip(plan.entries, configs, strict=True):
        entry = dataclasses.replace(planned, status="skipped: budget")
        result.entries.append(entry)
        if result.stopped_reason:
            continue
        entry_dir = out / entry.endpoint
        spent_before, started = budget.spent_usd, time.monotonic()
        endpoint: Endpoint | None = None
        try:
            try:
                endpoint = Endpoint.sagemaker(config, budget=budget, tokenizer=tokenizer, client=how.client,
                                              poll_s=how.poll_s, progress=how.progress, watch_s=how.watch_s)
            except BudgetRefused as exc:
                result.stopped_reason = exc.message
                continue
            except DeployFailed as exc:
                entry.status, entry.error = "deploy failed", str(exc)
                continue
            with endpoint:
                entry.out_dir = str(entry_dir)
                try:
                    _measure_entry(endpoint, entry_dir, entry, checked, measure, how)
                    entry.status = "measured"
                except Exception as exc:  # noqa: BLE001 - recorded; the block deletes the endpoint
                    entry.status, entry.error = "measure failed", f"{type(exc).__name__}: {exc}"
        except KeyboardInterrupt as exc:  # the `with` block deleted the endpoint; an interrupted
            # deploy has noted its own rollback (then `endpoint` is None)
            if endpoint is not None and endpoint.deleted:
                note_undone(exc, f"deleted {describe_deleted(endpoint.deleted)} in {config.region}")
            raise
        finally:
            # what this entry cost, deploy-and-rollback included (the budget closed the endpoint)
            entry.cost_usd = round(max(0.0, budget.spent_usd - spent_before), 4)
            entry.elapsed_s = round(time.monotonic() - started, 2)
            if endpoint is not None:
                result.deleted += endpoint.deleted
        if endpoint is not None and endpoint.stopped_reason:
            entry.status = "stopped: budget"
            result.stopped_reason = endpoint.stopped_reason
    return result
