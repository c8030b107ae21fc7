"""Deploy the typed config as model -> endpoint config -> endpoint, wait for InService, and on ANY
failure (an exception, ``Failed``, the timeout, Ctrl-C) delete exactly what this deploy created, so a
failed start stops billing at once. ``deploy_with_failover`` tries regions in order."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation.table import Displayable
from gemma4_t4.sagemaker import image as image_module
from gemma4_t4.sagemaker.aws import (
    ClientFactory,
    Clock,
    Sleep,
    aws_error,
    aws_exceptions,
    client_factory,
    error_code,
    error_message,
    note_undone,
    sleep_ticking,
)
from gemma4_t4.sagemaker.cli_recipe import ApiCall
from gemma4_t4.sagemaker.config import SCALING_METRIC, DeployConfig
from gemma4_t4.sagemaker.cost import estimate
from gemma4_t4.sagemaker.image import US_REGIONS, find_fixed_image
from gemma4_t4.sagemaker.ops import (
    SCALABLE,
    DeleteResult,
    check_identity,
    created_at,
    delete_resources,
    describe,
)
from gemma4_t4.sagemaker.quotas import quota_name, region_quotas

# Capacity-type failures: worth trying another region. Anything else (a bad model, OOM) would
# fail the same way everywhere.
# Matched case-blind as substrings: "capacity" covers InsufficientInstanceCapacity and "insufficient capacity".
CAPACITY_MARKERS = ("ResourceLimitExceeded", "capacity", "quota")


@dataclass
class TimelineEvent:
    t_s: float  # seconds since the deploy started
    stage: str
    detail: str = ""


@dataclass
class DeployResult(Displayable):
    name: str
    region: str
    status: str  # InService | Creating (wait=False) | Failed | TimedOut | Error
    success: bool
    elapsed_s: float = 0.0
    created: list[str] = field(default_factory=list)  # "model:NAME", ...
    # "model:NAME" -> its CreationTime (epoch s) as SageMaker answered right after the create: the identity
    # every automatic delete checks (a name alone may by then be someone else's resource)
    created_at: dict[str, float] = field(default_factory=dict)
    rolled_back: list[str] = field(default_factory=list)
    failure_reason: str | None = None
    usd_per_hour: float | None = None
    cost_line: str = ""
    timeline: list[TimelineEvent] = field(default_factory=list)
    plan: list[str] = field(default_factory=list)  # equivalent aws CLI commands

    def caption(self) -> str:
        failed = f": {self.failure_reason}" if self.failure_reason else ""
        return f"{self.name}: {self.status} in {self.elapsed_s:.1f} s{failed}"

    def table_rows(self) -> list[TimelineEvent]:
        return self.timeline

    def notes(self) -> list[str]:
        """The learner's reading: what the status and the time it took mean."""
        if not self.success:
            return [f"{self.status}: nothing is left billing from this deploy (rolled back: "
                    f"{', '.join(self.rolled_back) or 'nothing'})."]
        made = f"{len(self.created)} resources created ({', '.join(c.split(':')[0] for c in self.created)})"
        if self.elapsed_s < 60:
            return [f"{self.status} after {self.elapsed_s:.0f} s, {made}. A real endpoint takes 10-15 minutes to "
                    "come up, so seconds mean a local stand-in answered: the calls are real, the GPU is not."]
        return [f"{self.status} after {self.elapsed_s / 60:.1f} min, {made}; it bills from now until deleted."]


class DeployFailed(Gemma4T4Error):
    """The deploy failed and was rolled back; ``result`` has the timeline and what was deleted."""

    def __init__(self, result: DeployResult, fix: str | None = None):
        rolled = ", ".join(result.rolled_back) or "nothing"
        super().__init__(f"deploy of {result.name} in {result.region} ended {result.status}: "
                         f"{result.failure_reason}; rolled back: {rolled}", fix=fix)
        self.result = result


def deployment_calls(config: DeployConfig, now: dt.datetime | None = None) -> list[ApiCall]:
    """The three create calls, with exactly the parameters ``deploy`` sends."""
    tags = config.resource_tags(now)
    region = config.region
    role = config.resolved_role() or "arn:aws:iam::<ACCOUNT>:role/<SageMakerExecutionRole>"
    model = {"ModelName": config.name, "ExecutionRoleArn": role,
             "PrimaryContainer": config.primary_container(), "Tags": tags}
    endpoint_config = {"EndpointConfigName": config.name, "ProductionVariants": [config.production_variant()],
                       "Tags": tags}
    return [
        ApiCall("sagemaker", "create_model", model, region,
                note=f"model {config.model_data_s3_uri or config.model_id} in the vLLM container"),
        ApiCall("sagemaker", "create_endpoint_config", endpoint_config, region,
                note="instance, driver (InferenceAmiVersion) and startup timeouts"),
        ApiCall("sagemaker", "create_endpoint",
                {"EndpointName": config.name, "EndpointConfigName": config.name, "Tags": tags}, region,
                note=deploy_cost(config).line()),
        *autoscaling_calls(config),
    ]


def deploy_cost(config: DeployConfig):
    """The $/hour estimate; with autoscaling, at the maximum instance count (the worst case)."""
    return estimate(config.instance_type, config.billed_instances_at_most)


def autoscaling_calls(config: DeployConfig) -> list[ApiCall]:
    """Register the variant with Application Auto Scaling and a target-tracking policy."""
    if not config.autoscaling:
        return []
    resource = {**SCALABLE, "ResourceId": config.scaling_resource_id()}
    tracking = {"TargetValue": config.scaling_target,
                "PredefinedMetricSpecification": {"PredefinedMetricType": SCALING_METRIC},
                "ScaleInCooldown": config.scale_in_cooldown_s,
                "ScaleOutCooldown": config.scale_out_cooldown_s}
    policy = {"PolicyName": f"{config.name}-invocations", **resource, "PolicyType": "TargetTrackingScaling",
              "TargetTrackingScalingPolicyConfiguration": tracking}
    return [
        ApiCall("application-autoscaling", "register_scalable_target",
                {**resource, "MinCapacity": config.initial_instances,
                 "MaxCapacity": config.billed_instances_at_most}, config.region,
                note=f"scale {config.initial_instances}..{config.billed_instances_at_most} instances "
                "(after InService)"),
        ApiCall("application-autoscaling", "put_scaling_policy", policy, config.region,
                note="target tracking on invocations per instance, with cooldowns"),
    ]


def deployment_plan(config: DeployConfig) -> list[str]:
    """Dry run: the equivalent aws CLI commands (nothing is called)."""
    commands = [c.cli() for c in deployment_calls(config)]
    if config.needs_fixed_image and config.image_uri is None:
        # A dry run calls nothing, so it names the tag build-image writes; deploy looks it up.
        lookup = ApiCall(
            "ecr", "describe_images",
            {"RepositoryName": image_module.T4_IMAGE_REPOSITORY, "Filter": {"tagStatus": "TAGGED"}},
            config.region,
            note="T4: the newest fixed image in your ECR (tag <base DLC tag>-g4t4-<version>) replaces "
            "<ACCOUNT>/...; none there = refused (build it: gemma4-t4 sagemaker build-image)",
        )
        commands[0] = lookup.cli() + "\n" + commands[0]  # one step: find the image, create the model
    commands.append(
        "# wait for InService (a T4 start takes ~13 min)\n"
        f"aws sagemaker wait endpoint-in-service --region {config.region} --endpoint-name {config.name}"
    )
    return commands


class _Timeline:
    """Records a deploy's events on its result, timed from when the deploy began."""

    def __init__(self, result: DeployResult, monotonic: Clock):
        self.result, self.monotonic = result, monotonic
        self.start = monotonic()

    def elapsed(self) -> float:
        return round(self.monotonic() - self.start, 2)

    def __call__(self, stage: str, detail: str) -> None:
        self.result.timeline.append(TimelineEvent(self.elapsed(), stage, detail))


def rollback(sm: Any, created: list[str], created_at: dict[str, float] | None = None,
             autoscaling_client: Any = None) -> list[str]:
    """Delete what ``created`` lists, endpoint first (reverse creation order). Returns what went, and
    "left alone: ..." for each resource whose name now belongs to another (its CreationTime is not the
    one ``created_at`` recorded: someone deleted this deploy's and created their own).
    ``autoscaling_client``: the client that registered a scalable target (the deploy's session or
    profile); without it the process's default credentials are asked, which may not see the target."""
    kinds = {"autoscaling": -1, "endpoint": 0, "endpoint-config": 1, "model": 2}
    resources = sorted((tuple(c.split(":", 1)) for c in created), key=lambda r: kinds[r[0]])
    result, left_alone = DeleteResult("", ""), []
    for kind, name in resources:
        # a scalable target (endpoint/NAME/variant/...) is its endpoint's: the endpoint's identity decides
        owner = ("endpoint", name.split("/")[1]) if kind == "autoscaling" else (kind, name)
        recorded = (created_at or {}).get(":".join(owner))
        try:
            if recorded is not None and not check_identity(sm, *owner, recorded) and kind != "autoscaling":
                result.already_absent.append(f"{kind}:{name}")
                continue
            delete_resources(sm, [(kind, name)], result, autoscaling_client)
        except Gemma4T4Error as exc:  # keep going: the other resources must still be deleted
            if "not the one recorded" in exc.message:
                left_alone.append(f"{kind}:{name}")
                continue
            result.already_absent.append(f"{kind}:{name} (delete failed: {exc.message})")
    gone = result.deleted + [a for a in result.already_absent if "delete failed" not in a]
    return gone + [f"left alone: {r} (re-created by another owner since this deploy)" for r in left_alone]


def describe_deleted(resources: Sequence[str]) -> str:
    """``["endpoint:a", "endpoint-config:a", "model:a"]`` as "endpoint a, endpoint config a, model a"."""
    return ", ".join(r.replace("endpoint-config:", "endpoint config ").replace(":", " ", 1) for r in resources)


def with_fixed_image(config: DeployConfig, ecr_client: Any) -> DeployConfig:
    """A T4 config without an image gets the newest fixed image in its region's ECR (or is refused)."""
    if not config.needs_fixed_image or config.image_uri:
        return config
    found = find_fixed_image(config.region, ecr_client=ecr_client)
    return config.replaced(image_uri=found.image_uri)


def check_model_data(s3: Any, uri: str) -> None:
    """Refuse ``model_data_s3_uri`` unless its bucket exists and the folder holds config.json: an
    endpoint pointed at nothing fails only after ~10 billed minutes of container start."""
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    key = prefix + "config.json"
    try:
        s3.head_object(Bucket=bucket, Key=key)
    except aws_exceptions() as exc:
        code = error_code(exc)
        if code in ("404", "NoSuchKey", "NotFound", "NoSuchBucket"):
            try:
                s3.head_bucket(Bucket=bucket)
                missing = f"s3://{bucket}/{key} does not exist"
            except aws_exceptions():
                missing = f"bucket {bucket!r} does not exist (or is not yours)"
            raise Gemma4T4Error(
                f"model data {uri}: {missing}; nothing was created",
                fix="upload the model folder first (deploy --model-dir DIR does it) or fix --model-data",
            ) from exc
        raise aws_error(exc, f"HeadObject s3://{bucket}/{key}") from exc


def register_autoscaling(config: DeployConfig, aas: Any, result: DeployResult, event: _Timeline) -> None:
    """Register the scalable target and its policy (the endpoint must be InService first)."""
    for call in autoscaling_calls(config):
        try:
            getattr(aas, call.operation)(**call.params)
        except aws_exceptions() as exc:
            result.failure_reason = f"{call.operation}: {error_code(exc)}: {error_message(exc)}"
            raise _Failure from exc
        if call.operation == "register_scalable_target":
            result.created.insert(0, f"autoscaling:{config.scaling_resource_id()}")
        event(call.operation, call.note or "")


def deploy(config: DeployConfig, *, client: Any = None, session: Any = None, wait: bool = True,
           timeout_s: float | None = None, poll_s: float = 15.0, progress: bool = True,
           sleep: Sleep = time.sleep,
           monotonic: Clock = time.monotonic, ecr_client: Any = None,
           autoscaling_client: Any = None, s3_client: Any = None) -> DeployResult:
    """Create model, endpoint config and endpoint; wait for InService; roll back on failure.

    A T4 without ``image_uri`` gets the newest fixed image in the region's ECR (refused when none);
    ``timeout_s`` defaults to the container startup timeout plus 15 minutes for placement. Raises
    :class:`DeployFailed` (after rolling back); validation errors come before any AWS call."""
    config.check_role()
    cost = deploy_cost(config)
    result = DeployResult(config.name, config.region, "Error", False, usd_per_hour=cost.usd_per_hour,
                          cost_line=cost.line())
    event = _Timeline(result, monotonic)

    make = client_factory(session)
    sm = client or make("sagemaker", config.region)

    def aas() -> Any:  # one application-autoscaling client (the factory caches it), made on first use: it
        # registers a scalable target and, through the same session, deregisters it in a rollback
        return autoscaling_client or make("application-autoscaling", config.region)

    config = with_fixed_image(config, ecr_client or make("ecr", config.region))
    if config.model_data_s3_uri:
        check_model_data(s3_client or make("s3", config.region), config.model_data_s3_uri)
    calls = deployment_calls(config)
    result.plan = [c.cli() for c in calls]
    event("validated", f"{cost.line()}; image {config.resolved_image()}")
    _refuse_existing(sm, config)
    try:
        _create(sm, [c for c in calls if c.service == "sagemaker"], config.name, result, event)
        if wait:
            _wait_and_scale(sm, config, result, event, aas, timeout_s, poll_s, progress, sleep)
        else:
            result.status = "Creating"
        result.success = True
        return result
    except BaseException as exc:
        _roll_back(exc, sm, result, event, aas() if any(c.startswith("autoscaling:") for c in result.created) else None)
        result.elapsed_s = event.elapsed()
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise DeployFailed(result, fix=(exc.fix if isinstance(exc, _Failure) else None) or _fix_for(result)) from exc
    finally:
        result.elapsed_s = event.elapsed()


def _wait_and_scale(sm: Any, config: DeployConfig | None, result: DeployResult, event: _Timeline,
                    aas: Callable[[], Any], timeout_s: float | None, poll_s: float, progress: bool,
                    sleep: Sleep) -> None:
    """Wait for InService (a Failed or timed-out endpoint raises _Failure), then register autoscaling.
    ``timeout_s`` defaults to the container startup timeout plus 15 minutes for placement."""
    timeout = timeout_s if timeout_s is not None else config.startup_timeout_s + 900
    final = wait_in_service(sm, result.name, timeout, poll_s, progress, event, sleep, event.monotonic)
    result.status = final["status"]
    result.failure_reason = final.get("reason")
    if result.status != "InService":
        raise _Failure(_fix_for(result))
    event("InService", f"after {event.elapsed():.0f} s")
    if config is not None and config.autoscaling:
        register_autoscaling(config, aas(), result, event)


class _Failure(Exception):
    """Internal: a handled failure whose reason is already on the result, with its fix."""

    def __init__(self, fix: str | None = None):
        super().__init__(fix)
        self.fix = fix


def _create(sm: Any, create_calls: list, name: str, result: DeployResult, event: _Timeline) -> None:
    """Make the model, endpoint config and endpoint in turn, recording each on ``result``."""
    for call in create_calls:
        try:
            getattr(sm, call.operation)(**call.params)
        except aws_exceptions() as exc:
            result.failure_reason = f"{error_code(exc)}: {error_message(exc)}"
            event("error", f"{call.operation}: {result.failure_reason}")
            raise _Failure(aws_error(exc, call.operation).fix) from exc
        kind = call.operation.removeprefix("create_").replace("_", "-")  # as rollback names it
        result.created.append(f"{kind}:{name}")
        try:  # the identity every automatic delete checks; unreadable: the rollback falls back to the name
            when = created_at(sm, kind, name)
            if when is not None:
                result.created_at[f"{kind}:{name}"] = when
        except Gemma4T4Error:
            pass
        event(call.operation, name)


def _refuse_existing(sm: Any, config: DeployConfig) -> None:
    """Refuse to touch resources this deploy did not create."""
    for kind in ("endpoint", "endpoint-config", "model"):
        if describe(sm, kind, config.name) is not None:
            raise Gemma4T4Error(
                f"{kind} {config.name!r} already exists in {config.region}; deploy never overwrites",
                fix=f"delete it first (gemma4-t4 sagemaker delete {config.name} --region {config.region} --yes) "
                "or choose another --name",
            )


def _roll_back(exc: BaseException, sm: Any, result: DeployResult, event: _Timeline,
               autoscaling_client: Any = None) -> None:
    """A deploy failed (or was interrupted) with ``exc``: record why and delete what it created."""
    if not isinstance(exc, _Failure):
        result.failure_reason = result.failure_reason or f"{type(exc).__name__}: {exc}"
    if result.status in ("Error", "Creating", "InService"):
        result.status = "Interrupted" if isinstance(exc, KeyboardInterrupt) else "Error"
    result.rolled_back = rollback(sm, result.created, result.created_at, autoscaling_client)
    event("rolled back", ", ".join(result.rolled_back) or "nothing created")
    if isinstance(exc, KeyboardInterrupt) and result.rolled_back:
        note_undone(exc, f"deleted {describe_deleted(result.rolled_back)} in {result.region}")


def _fix_for(result: DeployResult) -> str:
    reason = result.failure_reason or ""
    if "CannotStartContainer" in reason:
        return "the container never started: check inference_ami_version matches the image's CUDA"
    if is_capacity_failure(reason):
        return "try another region (deploy --failover) or another instance type"
    if result.status == "TimedOut":
        return "raise the timeout or read the logs (gemma4-t4 sagemaker logs); the endpoint was deleted"
    return "read the logs (gemma4-t4 sagemaker logs NAME) before retrying"


def wait_in_service(sm: Any, name: str, timeout_s: float, poll_s: float = 15.0, progress: bool = True,
                    event: Callable[[str, str], None] | None = None,
                    sleep: Sleep = time.sleep,
                    monotonic: Clock = time.monotonic) -> dict[str, str]:
    """Poll DescribeEndpoint until InService, Failed or the timeout: its ``status`` (InService, Failed, TimedOut
    or Error) and, but for InService, the ``reason``. The bar counts the time waited,
    every second between polls, so an interrupted wait shows the true figure."""
    from tqdm.auto import tqdm

    start = monotonic()
    last = None
    with tqdm(total=int(timeout_s), desc=name, disable=not progress, leave=True,
              bar_format="{desc}: {postfix} | {n}/{total} s of the timeout") as bar:

        def tick() -> None:
            bar.n = min(int(monotonic() - start), int(timeout_s))
            bar.refresh()

        try:
            while True:
                try:
                    desc = sm.describe_endpoint(EndpointName=name)
                except aws_exceptions() as exc:
                    if error_code(exc) == "ThrottlingException":
                        desc = {"EndpointStatus": last or "Creating"}
                    else:
                        return {"status": "Error", "reason": f"{error_code(exc)}: {error_message(exc)}"}
                status = desc.get("EndpointStatus", "?")
                elapsed = monotonic() - start
                bar.set_postfix_str(status, refresh=False)
                tick()
                if status != last and event:
                    event(f"status {status}", desc.get("FailureReason") or "")
                last = status
                if status == "InService":
                    return {"status": status}
                if status in ("Failed", "OutOfService", "Deleting", "RollingBack"):
                    return {"status": "Failed", "reason": desc.get("FailureReason") or status}
                if elapsed >= timeout_s:
                    return {"status": "TimedOut", "reason": f"still {status} after {elapsed:.0f} s"}
                sleep_ticking(sleep, min(poll_s, max(0.0, timeout_s - elapsed)) or poll_s, tick)
        finally:
            tick()  # an interrupted wait closes its bar on the time really waited, not the last poll's


# -- region failover ------------------------------------------------------------------------------
@dataclass
class FailoverAttempt:
    region: str
    outcome: str  # "InService" | "skipped: no quota" | "capacity" | "failed"
    started_at: str
    elapsed_s: float
    reason: str | None = None
    timeline: list[TimelineEvent] = field(default_factory=list)
    rolled_back: list[str] = field(default_factory=list)


@dataclass
class FailoverResult:
    success: bool
    region: str | None
    attempts: list[FailoverAttempt] = field(default_factory=list)
    deployment: DeployResult | None = None


def is_capacity_failure(reason: str | None) -> bool:
    text = (reason or "").lower()
    return any(marker.lower() in text for marker in CAPACITY_MARKERS)


def deploy_with_failover(config: DeployConfig, regions: Sequence[str] = US_REGIONS, *,
                         clients: ClientFactory | None = None, check_quota: bool = True,
                         **deploy_kwargs: Any) -> FailoverResult:
    """Try ``regions`` in order; move on after no quota or a capacity failure, stop on others."""
    make = clients or client_factory()
    attempts = [config.replaced(region=region) for region in regions]  # each checked when built, before any call
    config.check_role()
    outcome = FailoverResult(False, None)
    for attempt_config in attempts:
        region = attempt_config.region
        started = dt.datetime.now(dt.UTC).isoformat()
        t0 = time.monotonic()
        if check_quota:
            rows = region_quotas(region, attempt_config.instance_types, make("service-quotas", region))
            if not any(r.available for r in rows):
                reasons = "; ".join(
                    f"{r.instance_type}={r.value if r.value is not None else r.error}" for r in rows)
                outcome.attempts.append(FailoverAttempt(region, "skipped: no quota", started, 0.0, reasons))
                continue
        try:
            result = deploy(attempt_config, client=make("sagemaker", region), ecr_client=make("ecr", region),
                            **deploy_kwargs)
        except DeployFailed as exc:
            result = exc.result
        capacity = not result.success and is_capacity_failure(result.failure_reason)
        ended = result.status if result.success else "capacity" if capacity else "failed"
        outcome.attempts.append(FailoverAttempt(region, ended, started, round(time.monotonic() - t0, 2),
                                                result.failure_reason, result.timeline, result.rolled_back))
        if result.success:
            outcome.success, outcome.region, outcome.deployment = True, region, result
        if not capacity:
            return outcome
    if outcome.attempts and all(a.outcome == "skipped: no quota" for a in outcome.attempts):
        raise Gemma4T4Error(
            f"no quota for {quota_name(config.instance_type)!r} in any region tried "
            f"({', '.join(a.region for a in outcome.attempts)}); nothing was created",
            fix="request a quota increase in Service Quotas (new accounts often have 0), "
            "or add --fallback-instance-types",
        )
    return outcome


# -- background watch (deploy without blocking the caller) ----------------------------------------
@dataclass(eq=False, repr=False)  # its config holds secrets, and its client is no value to show
class DeploymentWatcher:
    """Wait for an endpoint created with ``deploy(wait=False)`` in a background thread and roll
    it back on Failed or timeout, so a caller that returned at ``Creating`` (an MCP tool, a
    notebook cell) still never leaves a crashed endpoint billing."""

    sm: Any
    result: DeployResult
    timeout_s: float
    poll_s: float = 15.0
    config: DeployConfig | None = None
    autoscaling_client: Any = None

    def __post_init__(self) -> None:
        self.done = threading.Event()
        self._timeline = _Timeline(self.result, time.monotonic)
        if self.autoscaling_client is None and self.config and self.config.autoscaling:
            # made here, not on first use: the rollback deregisters with the client the scaling used
            self.autoscaling_client = client_factory()("application-autoscaling", self.result.region)

    def start(self) -> DeploymentWatcher:
        threading.Thread(target=self._run, name=f"watch-{self.result.name}", daemon=True).start()
        return self

    def _run(self) -> None:
        """The blocking deploy's wait, scaling and rollback, in this thread and without a bar."""
        try:
            _wait_and_scale(self.sm, self.config, self.result, self._timeline, lambda: self.autoscaling_client,
                            self.timeout_s, self.poll_s, False, time.sleep)
            self.result.success = True
        except Exception as exc:  # noqa: BLE001 - reported on the result, then rolled back
            self.result.success = False
            _roll_back(exc, self.sm, self.result, self._timeline, self.autoscaling_client)
        self.result.elapsed_s = self._timeline.elapsed()
        self.done.set()

    def wait(self, timeout: float | None = None) -> DeployResult:
        self.done.wait(timeout)
        return self.result


def deploy_in_background(config: DeployConfig, *, client: Any = None, session: Any = None,
                         timeout_s: float | None = None, poll_s: float = 15.0) -> DeploymentWatcher:
    """Create the resources now (rolled back if a create fails), then watch in the background."""
    sm = client or client_factory(session)("sagemaker", config.region)
    result = deploy(config, client=sm, session=session, wait=False, progress=False)
    timeout = timeout_s if timeout_s is not None else config.startup_timeout_s + 900
    # the watcher registers autoscaling (and rolls it back) through the caller's session, as the deploy did
    aas = client_factory(session)("application-autoscaling", config.region) if config.autoscaling else None
    return DeploymentWatcher(sm, result, timeout, poll_s, config=config, autoscaling_client=aas).start()


# -- the one deploy flow (CLI sagemaker deploy, MCP deploy_endpoint) -------------------------------------
@dataclass
class DeployRun:
    """One deploy request through :func:`run_deploy`: the plan and cost it showed and, when it acted, the
    deployment (a failover's attempts, a watched one's result), or the failure it rolled back."""

    plan: list[str]
    cost: str
    result: DeployResult | FailoverResult | None = None
    watcher: DeploymentWatcher | None = None
    failed: DeployFailed | None = None


def run_deploy(config: DeployConfig, *, act: bool, bound: Callable[[DeployConfig], str] | None = None,
               failover: Sequence[str] = (), background: bool = False, client: Any = None,
               announce: Callable[[str], None] | None = None, **deploy_kwargs: Any) -> DeployRun:
    """The one deploy flow the CLI and the MCP tools share. Validate (once: the config is frozen) and plan, which
    is all a dry run or an unconfirmed call answers; ``bound``: the caller's own limit (an assistant's budget),
    refused or stated after the cost. With ``act``: the role too, then deploy in ``failover``'s regions, in the
    ``background`` (returns at Creating, watched until InService), or waiting (``deploy_kwargs``)."""
    for region in failover:  # a dry run refuses a region the real run would (e.g. a typo)
        image_module.validate_region(region)
    run = DeployRun(deployment_plan(config), deploy_cost(config).line())
    if bound:
        run.cost += "; " + bound(config)
    if not act:
        return run
    config.check_role()
    if announce:
        announce(run.cost)
    try:
        if failover:
            run.result = deploy_with_failover(config, failover, **deploy_kwargs)
        elif background:
            run.watcher = deploy_in_background(config, client=client, timeout_s=deploy_kwargs.get("timeout_s"))
            run.result = run.watcher.result
        else:
            run.result = deploy(config, **deploy_kwargs)
    except DeployFailed as exc:
        run.result, run.failed = exc.result, exc
    return run
