"""The matrix run: for each model in turn, deploy an endpoint, measure it, delete it, under a
hard budget.

Before each deploy the next model's cost (startup + measurement at the instance's $/hour) is
checked against what is left of the budget; while an endpoint is up a watchdog adds its cost
second by second and deletes it the moment the budget is spent. Whatever happens (a failed
deploy, a failed measurement, Ctrl-C), every endpoint the run created is deleted before it
returns. The measurement goes through :func:`measure_endpoint`, the one adapter to
:mod:`gemma4_t4.bench`.
"""

from __future__ import annotations

import dataclasses
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.sagemaker.config import DeployConfig
from gemma4_t4.sagemaker.deploy import DeployFailed, deploy, deploy_cost
from gemma4_t4.sagemaker.ops import delete_endpoint

# A T4 endpoint took 13.2 min to InService in the series, an L4 ~10 min (reference_system.md).
DEPLOY_MINUTES = 15.0
MEASURE_MINUTES = 10.0


def sagemaker_url(region: str, endpoint: str) -> str:
    return f"sagemaker://{region}/{endpoint}"


def measure_endpoint(
    endpoint: str,
    region: str,
    out_dir: str | Path,
    *,
    model: str | None = None,
    workload: str = "decode",
    **opts: Any,
) -> Any:
    """The one call into the benchmark: ``run_benchmark`` against ``sagemaker://REGION/ENDPOINT``.

    ``model``: the Hugging Face id the endpoint serves. Requests name the model as the container
    serves it (``SM_VLLM_SERVED_MODEL_NAME``: ``served_model_name``, by default the id's last part),
    and exact-length prompts are built with that id's tokenizer unless ``tokenizer`` is given."""
    from gemma4_t4.bench import run_benchmark

    served = opts.pop("served_model_name", None) or (model.rsplit("/", 1)[-1] if model else endpoint)
    if model and "tokenizer" not in opts:
        opts["tokenizer"] = model
    return run_benchmark(sagemaker_url(region, endpoint), served, workload, out_dir, **opts)


def check_budget(budget_usd: float) -> None:
    """A hard budget is a positive, finite number of USD (NaN and inf are refused too)."""
    if not 0 < budget_usd < float("inf"):
        raise Gemma4T4Error(
            f"budget {budget_usd!r} must be a positive number of USD", fix="e.g. --budget-usd 5"
        )


def _served_name_opt(
    measure: Callable[..., object], config: DeployConfig, measure_opts: Mapping[str, object] | None
) -> dict[str, object]:
    # the default adapter names requests by the container's served name; a caller's own measure
    # function gets exactly the options it passed
    opts = dict(measure_opts or {})
    if measure is measure_endpoint and config.served_model_name:
        opts.setdefault("served_model_name", config.served_model_name)
    return opts


def over_budget_warning(plan: MatrixResult, budget_usd: float) -> str | None:
    """A warning when the plan's estimate exceeds the budget: which models the run would skip."""
    if plan.estimate_usd <= budget_usd:
        return None
    spent, fits = 0.0, 0
    for entry in plan.entries:
        if spent + entry.estimate_usd > budget_usd:
            break
        spent, fits = spent + entry.estimate_usd, fits + 1
    return (
        f"the estimate ~${plan.estimate_usd:.2f} exceeds the budget ${budget_usd:.2f}: only the first {fits} of "
        f"{len(plan.entries)} model(s) fit; the run stops before the rest (raise --budget-usd or drop models)"
    )


@dataclass
class MatrixEntry:
    model_id: str
    endpoint: str
    status: str  # measured | deploy failed | measure failed | stopped: budget | skipped: budget
    estimate_usd: float
    cost_usd: float = 0.0
    elapsed_s: float = 0.0
    out_dir: str | None = None
    error: str | None = None
    result: Any = None
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


def endpoint_name(prefix: str, model_id: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", model_id.rsplit("/", 1)[-1].lower()).strip("-")
    return f"{prefix}-{slug}"[:63].rstrip("-")


def matrix_configs(
    models: Sequence[str], base: DeployConfig, prefix: str = "g4-matrix"
) -> list[DeployConfig]:
    return [dataclasses.replace(base, model_id=m, name=endpoint_name(prefix, m)) for m in models]


def _rate(config: DeployConfig) -> float:
    rate = deploy_cost(config).usd_per_hour
    if rate is None:
        raise Gemma4T4Error(
            f"no price for {config.instance_type}: a budget cannot be enforced",
            fix="use an instance type listed in gemma4_t4.hardware.PRICES",
        )
    return rate


def configs_plan(
    configs: Sequence[DeployConfig],
    *,
    deploy_minutes: float = DEPLOY_MINUTES,
    measure_minutes: float = MEASURE_MINUTES,
) -> MatrixResult:
    """The cost estimate per endpoint (validated; nothing is called)."""
    if not configs:
        raise Gemma4T4Error("nothing to deploy", fix="pass at least one model")
    names = [c.name for c in configs]
    if len(set(names)) != len(names):
        raise Gemma4T4Error(
            f"two endpoints share a name: {names}", fix="give each model its own endpoint name"
        )
    plan = MatrixResult(configs[0].instance_type, configs[0].region, 0.0, _rate(configs[0]))
    for config in configs:
        config.validate(require_role=False)
        estimate = round(_rate(config) * (deploy_minutes + measure_minutes) / 60.0, 4)
        plan.entries.append(
            MatrixEntry(config.model_id, config.name, "planned", estimate, instance_type=config.instance_type)
        )
    return plan


def matrix_plan(
    models: Sequence[str],
    base: DeployConfig,
    *,
    prefix: str = "g4-matrix",
    deploy_minutes: float = DEPLOY_MINUTES,
    measure_minutes: float = MEASURE_MINUTES,
) -> MatrixResult:
    """The cost estimate per model (nothing is called)."""
    return configs_plan(
        matrix_configs(models, base, prefix), deploy_minutes=deploy_minutes, measure_minutes=measure_minutes
    )


class _Watchdog:
    """Adds the live endpoint's cost and deletes it when the budget is spent."""

    def __init__(
        self,
        stop_at_usd: float,
        rate: float,
        monotonic: Callable[[], float],
        on_over: Callable[[], None],
        poll_s: float,
    ):
        self.stop_at = stop_at_usd
        self.rate = rate
        self.monotonic = monotonic
        self.on_over = on_over
        self.poll_s = poll_s
        self.start = monotonic()
        self.tripped = False
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="matrix-budget", daemon=True)

    def cost(self) -> float:
        return self.rate * (self.monotonic() - self.start) / 3600.0

    def _run(self) -> None:
        while not self._done.wait(self.poll_s):
            if self.cost() >= self.stop_at:
                self.tripped = True
                self.on_over()
                return

    def __enter__(self) -> _Watchdog:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join(timeout=30)


def run_matrix(
    models: Sequence[str],
    base: DeployConfig,
    *,
    budget_usd: float,
    out_dir: str | Path,
    prefix: str = "g4-matrix",
    **kwargs: Any,
) -> MatrixResult:
    """Deploy, measure and delete each model's endpoint in turn; never spend past ``budget_usd``."""
    return run_configs(matrix_configs(models, base, prefix), budget_usd=budget_usd, out_dir=out_dir, **kwargs)


def run_configs(
    configs: Sequence[DeployConfig],
    *,
    budget_usd: float,
    out_dir: str | Path,
    measure: Callable[..., Any] = measure_endpoint,
    measure_opts: Mapping[str, Any] | None = None,
    deploy_kwargs: dict[str, Any] | None = None,
    deploy_minutes: float = DEPLOY_MINUTES,
    measure_minutes: float = MEASURE_MINUTES,
    client: Any = None,
    watch_s: float = 5.0,
    monotonic: Callable[[], float] = time.monotonic,
) -> MatrixResult:
    """Deploy, measure and delete each config's endpoint in turn (one region); budget-capped."""
    check_budget(budget_usd)
    plan = configs_plan(configs, deploy_minutes=deploy_minutes, measure_minutes=measure_minutes)
    by_name = {c.name: c for c in configs}
    base = configs[0]
    result = MatrixResult(base.instance_type, base.region, budget_usd, plan.usd_per_hour)
    out = Path(out_dir)
    live: list[str] = []
    lock = threading.Lock()

    def remove(name: str) -> None:
        with lock:
            if name not in live:
                return
            live.remove(name)
        deleted = delete_endpoint(name, by_name[name].region, client=client)
        result.deleted += deleted.deleted

    try:
        for planned in plan.entries:
            entry = dataclasses.replace(planned, status="skipped: budget")
            result.entries.append(entry)
            if result.stopped_reason:
                continue
            left = budget_usd - result.spent_usd
            if entry.estimate_usd > left:
                result.stopped_reason = (
                    f"{entry.model_id} would cost ~${entry.estimate_usd:.2f}, "
                    f"${left:.2f} of the budget is left"
                )
                continue
            config = by_name[entry.endpoint]
            entry.out_dir = str(out / entry.endpoint)
            with lock:
                live.append(entry.endpoint)
            watchdog = _Watchdog(left, _rate(config), monotonic, lambda n=entry.endpoint: remove(n), watch_s)
            try:
                with watchdog:
                    try:
                        deploy(config, client=client, progress=False, **(deploy_kwargs or {}))
                    except DeployFailed as exc:
                        entry.status, entry.error = "deploy failed", str(exc)
                        continue
                    try:
                        entry.result = measure(
                            entry.endpoint,
                            config.region,
                            entry.out_dir,
                            model=entry.model_id,
                            **_served_name_opt(measure, config, measure_opts),
                        )
                        entry.status = "measured"
                    except Exception as exc:  # noqa: BLE001 - recorded; the endpoint is deleted below
                        entry.status, entry.error = "measure failed", f"{type(exc).__name__}: {exc}"
            finally:
                entry.cost_usd = round(watchdog.cost(), 4)
                entry.elapsed_s = round(monotonic() - watchdog.start, 2)
                remove(entry.endpoint)
            if watchdog.tripped:
                entry.status = "stopped: budget"
                result.stopped_reason = (
                    f"budget ${budget_usd:.2f} spent while {entry.model_id} was up; deleted it"
                )
    finally:
        for name in list(live):  # Ctrl-C or an unexpected error: nothing stays billing
            remove(name)
    return result
