"""The MCP server (``gemma4-t4 mcp``, stdio): SageMaker lifecycle and local serving tools for an assistant.

Each tool is a thin adapter over a package function, declared once with ``@tool(...)`` (its annotations
and whether it needs ``confirm=True``: :data:`REGISTRY`). Billing or destructive tools only describe what
they would do unless ``confirm=True``. The adapter runs the tool in a thread and is the one error boundary:
every failure answers its message and a fix (the traceback goes to stderr with ``GEMMA4_T4_DEBUG=1``),
and secret values are scrubbed from every answer. The benchmark and torch load inside the tools that use
them, so the server starts fast; SageMaker functions are imported under other names where they share
the tool's name.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import Field, TypeAdapter

from gemma4_t4.bench import registry as bench_registry
from gemma4_t4.bench import specs as bench_specs  # the spec classes: the benchmark's client loads in a run
from gemma4_t4.bench.registry import AnySpec
from gemma4_t4.bench.schemas import RunReport
from gemma4_t4.errors import Gemma4T4Error, debug_enabled
from gemma4_t4.foundation import secrets, signals
from gemma4_t4.foundation.jsonable import to_jsonable
from gemma4_t4.host import env, smi
from gemma4_t4.mcp_answers import (
    BuildImageResult,
    BuiltImage,
    ConfigResult,
    DeleteToolResult,
    DeployToolResult,
    EndpointsResult,
    GpuArchResult,
    HelpResult,
    QueryResult,
    QuotaResult,
    ServerToolResult,
    StatusToolResult,
    TuringCheckResult,
    TuringPatchResult,
    local_chat,
    served_model,
    tool_error_text,
)
from gemma4_t4.mcp_boundary import (
    DEFAULT_BUDGET_USD,
    REGISTRY,
    BudgetUSD,
    Confirm,
    Region,
    Seconds,
    Temperature,
    Tokens,
    ToolFunction,
    UserPort,
    assistant_deploy,
    offered,
    strict_arguments,
    takes_settings,
    tool,
)
from gemma4_t4.sagemaker import quotas  # sagemaker.* import no AWS SDK: boto3 loads at a tool's first call
from gemma4_t4.sagemaker.build import (
    BUILD_TIMEOUT_MINUTES,
    BuildFailed,
    build_cost,
    build_plan,
    build_record,
)
from gemma4_t4.sagemaker.build import build_t4_image as build
from gemma4_t4.sagemaker.config import DeployConfig, default_region, validate_name
from gemma4_t4.sagemaker.deploy import deploy_cost, deployment_plan, rollback, run_deploy
from gemma4_t4.sagemaker.health import HealthReport, check_health
from gemma4_t4.sagemaker.image import US_REGIONS, ImageResult, resolve_dlc_tag
from gemma4_t4.sagemaker.image import find_vllm_image as find
from gemma4_t4.sagemaker.ops import (
    LogsResult,
    endpoint_logs,
    endpoint_status,
    invoke,
)
from gemma4_t4.sagemaker.ops import delete_endpoint as delete
from gemma4_t4.sagemaker.ops import list_endpoints as list_all
from gemma4_t4.serving.server import (
    DEFAULT_WORK_DIR,
    VLLMServer,
    list_servers,
    start_server,
    stop_server,
)
from gemma4_t4.serving.server_config import ServerConfig
from gemma4_t4.serving.server_state import free_port
from gemma4_t4.turing import filepatch
from gemma4_t4.turing import state as turing_state
from gemma4_t4.turing import verify as turing_verify

try:
    from mcp.server import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp.server.mcpserver.tools import Tool
    from mcp.types import ToolAnnotations
except ImportError as exc:  # pragma: no cover - the mcp extra is optional
    raise Gemma4T4Error("the MCP SDK is not installed", fix="pip install 'gemma4-t4[mcp]'") from exc

WORK_DIR_ENV = "GEMMA4_T4_WORK_DIR"
READ_ONLY = ToolAnnotations(read_only_hint=True, destructive_hint=False, open_world_hint=True)
LOCAL_READ_ONLY = ToolAnnotations(read_only_hint=True, destructive_hint=False, open_world_hint=False)
CREATES = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False,
                          open_world_hint=True)
DESTRUCTIVE = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True,
                              open_world_hint=True)

log = logging.getLogger("gemma4_t4.mcp")


def _adapter(fn: ToolFunction, interruptible: bool = False) -> ToolFunction:
    """Run ``fn`` in a worker thread, turn every exception into a tool error, scrub secrets. ``interruptible``:
    a shutdown does not wait for it (it has nothing billed to roll back)."""
    signature = inspect.signature(fn, eval_str=True)
    return_type = signature.return_annotation

    def call(*args: Any, **kwargs: Any) -> Any:
        with _INTERRUPTIBLE if interruptible else _IN_FLIGHT:
            return fn(*args, **kwargs)

    @functools.wraps(fn)
    async def run_tool(*args: Any, **kwargs: Any) -> Any:
        import anyio  # the mcp extra brings it; not a base dependency, so imported where it runs

        try:
            result = await anyio.to_thread.run_sync(functools.partial(call, *args, **kwargs))
        except KeyboardInterrupt as exc:  # cancelled by the server's shutdown, after the tool's own cleanup
            raise ToolError(f"cancelled: the MCP server is shutting down ({exc}); "
                            "what this call had created was rolled back") from None
        except Exception as exc:  # the boundary: no tool answers a bare "Error executing tool"
            if debug_enabled():
                log.error("tool %s failed", fn.__name__, exc_info=exc)
            raise ToolError(secrets.mask(tool_error_text(exc), secrets.known_values())) from None
        plain = to_jsonable(result)
        scrubbed = secrets.mask(plain, secrets.known_values())
        if scrubbed != plain:
            return TypeAdapter(return_type).validate_python(scrubbed)
        return result

    run_tool.__signature__ = signature  # type: ignore[attr-defined]
    return run_tool


class _InFlight:
    """Tool calls running in worker threads: a shutdown waits for those ``counted`` to finish their cleanup
    (a deploy's rollback, a stopped build); one not counted (a benchmark) ends with the process."""

    def __init__(self, counted: bool = True) -> None:
        self._count = 0
        self._idle = threading.Condition()
        self._counted = counted

    def __enter__(self) -> None:
        if _SHUTDOWN.is_set():
            raise Gemma4T4Error("the MCP server is shutting down", fix="start it again and repeat the call")
        with self._idle:
            self._count += self._counted

    def __exit__(self, *exc: object) -> None:
        with self._idle:
            self._count -= self._counted
            self._idle.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        with self._idle:
            return self._idle.wait_for(lambda: self._count == 0, timeout)


_IN_FLIGHT = _InFlight()
# A benchmark holds nothing billed of its own (an endpoint it measures is watched by its own deploy): a shutdown
# cancels it with the process rather than waiting up to SHUTDOWN_GRACE_S for its requests to end.
_INTERRUPTIBLE = _InFlight(counted=False)
_SHUTDOWN = threading.Event()  # set by SIGTERM/SIGHUP: waits inside tools end at once
_STOP_SIGNAL: list[int] = [signal.SIGTERM]
SHUTDOWN_GRACE_S = 600.0  # how long a shutdown waits for in-flight tools to roll back


def _cancellable_sleep(seconds: float) -> None:
    """The sleep between polls of billing work (deploy, build): the server's shutdown ends it by raising
    ``signals.Terminated``, so the caller's Ctrl-C cleanup (rollback, stop the build) runs in its thread.
    Every caller passes a number (a poll interval); ``float`` refuses None, which ``Event.wait`` would
    take as a wait without end."""
    if _SHUTDOWN.wait(float(seconds)):
        raise signals.Terminated(_STOP_SIGNAL[0])


def _work_dir() -> str:
    return os.environ.get(WORK_DIR_ENV, DEFAULT_WORK_DIR)


@dataclass
class _Watches:
    """Deployments returned at Creating, watched in this process until InService (:func:`_settle_watches`)."""

    by_key: dict[tuple[str, str], Any] = field(default_factory=dict)
    # region -> the SageMaker client a watched deploy uses (None: boto3's); a test hands in a stand-in
    client: Callable[[str], Any] | None = None


_WATCHES = _Watches()


def _settle_watches() -> None:
    """At exit, delete what each unwatched deploy_endpoint(wait=False) created unless one last look finds
    it InService (then it is the user's, kept); every decision goes to the server's log (stderr)."""
    for (region, name), watcher in list(_WATCHES.by_key.items()):
        if watcher.done.is_set():  # InService (kept) or already rolled back by the watch itself
            continue
        if _WATCHES.by_key.pop((region, name), None) is None:  # settled already (the other exit path)
            continue
        try:
            status = watcher.sm.describe_endpoint(EndpointName=name).get("EndpointStatus", "?")
        except Exception as exc:  # noqa: BLE001 - unknown state: deleted like one not yet InService
            status = f"unknown ({type(exc).__name__})"
        if status == "InService":
            log.warning("exiting: endpoint %s in %s is InService and stays (it bills until deleted or its "
                        "expiry tag's reap; delete_endpoint deletes it)", name, region)
            continue
        try:  # by the CreationTime recorded at create: a name re-created by another owner is left alone
            gone = rollback(watcher.sm, watcher.result.created, watcher.result.created_at)
        except Exception as exc:  # noqa: BLE001 - said in the log, with the command that finishes the job
            log.error("exiting: could not delete endpoint %s in %s (%s): %s; run gemma4-t4 sagemaker delete %s "
                      "--region %s --yes", name, region, status, secrets.mask(str(exc), secrets.known_values()), name,
                      region)
            continue
        watcher.result.rolled_back = gone
        if any(g.startswith("left alone: endpoint:") for g in gone):
            log.warning("exiting: endpoint %s in %s was deleted and re-created by another owner since this "
                        "deploy: left alone (%s)", name, region, ", ".join(gone))
            continue
        watcher.result.status, watcher.result.success = "Deleted at exit", False
        log.warning("exiting: deleted endpoint %s in %s (%s, not yet InService: nothing would watch it after "
                    "this exit): %s", name, region, status, ", ".join(gone) or "nothing left")


# -- SageMaker tools ---------------------------------------------------------------------------------
@tool(LOCAL_READ_ONLY)
def get_help() -> HelpResult:
    """How to use these tools: the order of work, every tool, and the CLI equivalents."""
    return HelpResult(
        workflow=[
            "1. check_quotas: find a region with '<instance> for endpoint usage' quota (new accounts often have 0)",
            "2. find_vllm_image: the AWS vLLM container for that region and the driver (AMI) it needs; on a T4, "
            "build_t4_image(confirm=True) once per region (the stock container crashes on Turing)",
            "3. get_deployment_config: validate the config, see $/hour and the equivalent aws CLI",
            "4. deploy_endpoint(confirm=True): create model, endpoint config, endpoint (billing starts)",
            "5. get_endpoint_status / get_endpoint_logs until InService (a T4 start takes ~13 min)",
            "6. verify_model_health, then query_model",
            "7. delete_endpoint(confirm=True) when done (endpoints bill by the hour)",
            "Local: check_environment, verify_gpu_arch, verify_turing_patch / apply_turing_patch(confirm=True), "
            "start_vllm_server, server_status, query_model(base_url=...), run_benchmark, "
            "stop_vllm_server(confirm=True)",
            "run_benchmark(base_url, spec={\"kind\": KIND, ...}): KIND is one of "
            + ", ".join(bench_registry.REGISTRY)
            + "; the other fields are that spec's (its schema lists them; an unknown one is refused, named)",
        ],
        tools={name: (spec.fn.__doc__ or "").strip().splitlines()[0] for name, spec in REGISTRY.items()},
        cli=["gemma4-t4 sagemaker quotas", "gemma4-t4 sagemaker image --region us-east-2",
             "gemma4-t4 sagemaker deploy --dry-run", "gemma4-t4 sagemaker deploy --name NAME",
             "gemma4-t4 sagemaker status NAME", "gemma4-t4 sagemaker logs NAME",
             "gemma4-t4 sagemaker invoke NAME --prompt '...' [--stream]",
             "gemma4-t4 sagemaker delete NAME --yes", "gemma4-t4 sagemaker reap --yes"],
        notes=["Destructive or billing tools need confirm=True; without it they describe what they would do.",
               "Every endpoint carries an expiry tag; `gemma4-t4 sagemaker reap` deletes endpoints past it.",
               "A failed or timed-out deploy deletes what it created.",
               "An assistant's boundary (docs/sagemaker.md): priced instance types, a budget_usd per deploy "
               "(default $10, at most $100), allow-listed SM_VLLM_* switches only, no raw vLLM arguments, "
               "image, role, host, API key or interpreter; null means a setting's default."],
    )


@tool(READ_ONLY)
def check_quotas(instance_types: list[str] | None = None, regions: list[str] | None = None) -> QuotaResult:
    """Endpoint quotas by name across regions (sequential), and the region to deploy in."""
    types = instance_types or ["ml.g4dn.xlarge"]
    report = quotas.check_quotas(types, regions or US_REGIONS)
    picked, why = quotas.pick_regions(report, types)
    summary = "; ".join(f"{t}: {r or 'no region with quota'}" for t, r in picked.items())
    return QuotaResult(rows=report.rows, picked=picked, summary="\n".join([summary, *why.values()]))


@tool(READ_ONLY)
def find_vllm_image(region: Region = None, tag: str | None = None, latest: bool = False,
                    instance_type: str = "ml.g4dn.xlarge") -> ImageResult:
    """The AWS vLLM container image for a region (pinned tag or newest in the registry) and its AMI.
    Refuses a tag that is not a pinned AWS vLLM tag (latest, a path)."""
    region = default_region(region)
    # a tag that is not a pinned AWS vLLM tag is refused
    return find(region, tag, query_registry=latest, instance_type=instance_type)


@tool(LOCAL_READ_ONLY)
@takes_settings(offered(DeployConfig, sagemaker=True))
def get_deployment_config(*, budget_usd: BudgetUSD = DEFAULT_BUDGET_USD, **settings: object) -> ConfigResult:
    """Validate a deployment config (no AWS calls): container env, AMI, $/hour, the budget's bound and the aws
    CLI recipe. Without image_tag it plans with the recorded DLC tag (deploy_endpoint looks up the newest).
    Invalid, as deploy_endpoint refuses it: an unpriced instance type, a bound (instances x ttl_hours x $/hour)
    over budget_usd, a container variable outside the allow-list, an AMI the image cannot run on."""
    try:
        config = DeployConfig.from_settings(**settings)
        plan = deployment_plan(config)
        bound = assistant_deploy(config, budget_usd)
    except Gemma4T4Error as exc:
        return ConfigResult(valid=False, problem=exc.message, fix=exc.fix)
    cost = deploy_cost(config)
    return ConfigResult(valid=True, config=config.summary(), cost=cost.line(), usd_per_hour=cost.usd_per_hour,
                        budget=bound.line(), aws_cli=plan)


@tool(CREATES, confirm=True)
@takes_settings(offered(DeployConfig, sagemaker=True))
def deploy_endpoint(*, wait: bool = False, timeout_s: Seconds | None = None, budget_usd: BudgetUSD = DEFAULT_BUDGET_USD,
                    confirm: Confirm = False, **settings: object) -> DeployToolResult:
    """Deploy to a SageMaker endpoint (billing starts). Needs confirm=True; without it, returns the plan and the
    budget's bound. Refused before anything is billed: an instance type without a price, a worst case
    (instances x ttl_hours x $/hour) over budget_usd, a container variable outside the allow-list (no
    LD_PRELOAD, PYTHONPATH, HF_ENDPOINT), an AMI the image cannot run on; raw vLLM arguments, another image
    or role and an unfixed T4 image are not parameters at all (docs/sagemaker.md: the assistant's boundary).

    wait=False returns at Creating and keeps watching while this MCP server runs: a Failed or timed-out
    endpoint is deleted. When the MCP server exits (its client closes, SIGTERM) before the endpoint is
    InService, the endpoint is deleted with its config and model, so nothing bills unwatched; one
    already InService stays (expiry tag; delete_endpoint deletes it). Its log says which.
    On a T4 an image without the Turing fix is refused; with no image_uri the newest fixed image
    in the region's ECR is used (build it with build_t4_image).
    """
    config = DeployConfig.from_settings(look_up_image_tag=True, **settings)  # no tag: the registry's newest
    # a shutdown ends a wait and rolls back what this deploy created; wait=False: watched while this server runs
    run = run_deploy(config, act=confirm, bound=lambda c: assistant_deploy(c, budget_usd).line(),
                     background=not wait, client=_WATCHES.client(config.region) if _WATCHES.client else None,
                     timeout_s=timeout_s, progress=False, sleep=_cancellable_sleep)
    if not confirm:
        return DeployToolResult(refused=True, cost=run.cost, aws_cli=run.plan,
                                reason="deploying creates billed resources: call again with confirm=True")
    if run.watcher:
        _WATCHES.by_key[(config.region, config.name)] = run.watcher
    next_step = ("read get_endpoint_logs; what was created has been deleted" if run.failed
                 else "poll get_endpoint_status until InService, then verify_model_health")
    return DeployToolResult(refused=False, reason=str(run.failed) if run.failed else None, cost=run.cost,
                            aws_cli=run.plan, deployment=run.result, next_step=next_step)


@tool(DESTRUCTIVE, confirm=True)
def build_t4_image(region: Region = None, base_tag: str | None = None, confirm: Confirm = False,
                   budget_usd: BudgetUSD = DEFAULT_BUDGET_USD) -> BuildImageResult:
    """Build the fixed T4 image in AWS CodeBuild and push it to your ECR (bills). Needs confirm=True.
    Refuses a budget_usd below the build's worst case (CodeBuild stops it at its timeout)."""
    region = default_region(region)
    tag = resolve_dlc_tag(region, base_tag).tag  # newest in the registry, else the labelled fallback
    plan = build_plan(region, tag)  # validates region and tag before anything else
    # The project's timeout bounds the compute billed, so the worst case is known before the build starts.
    worst = build_cost(BUILD_TIMEOUT_MINUTES).build_usd
    cost = f"{build_cost().line()}; at most ${worst:.2f} of compute (stopped at {BUILD_TIMEOUT_MINUTES} min)"
    if worst > budget_usd or not confirm:
        return BuildImageResult(refused=True, cost=cost, aws_cli=plan, reason=(
            f"the build may bill up to ${worst:.2f}, over budget_usd=${budget_usd:.2f}: call again with budget_usd "
            f"of at least {worst:.2f}" if worst > budget_usd else "building creates ECR, S3, IAM and CodeBuild "
            "resources and bills: call again with confirm=True"))
    try:
        result = build(region, tag, progress=False, sleep=_cancellable_sleep)  # a shutdown stops the build
    except BuildFailed as exc:
        return BuildImageResult(refused=False, reason=str(exc), cost=cost, build=exc.result)
    return BuildImageResult(refused=False, cost=cost, build=BuiltImage(
        **build_record(result), created=result.created, reused=result.reused))


@tool(READ_ONLY)
def get_endpoint_status(name: str, region: Region = None) -> StatusToolResult:
    """Endpoint status, failure reason, instance, AMI, age, expiry, cost so far and advice."""
    validate_name(name)
    region = default_region(region)
    watch = _WATCHES.by_key.get((region, name))
    return StatusToolResult(endpoint=endpoint_status(name, region),
                            deployment_watch=watch.result if watch else None)


@tool(READ_ONLY)
def list_endpoints(regions: list[str] | None = None, include_untagged: bool = False) -> EndpointsResult:
    """Endpoints across regions (this project's tagged ones unless include_untagged)."""
    found = list_all(regions or US_REGIONS, project_only=not include_untagged)
    return EndpointsResult(endpoints=found, count=len(found))


@tool(READ_ONLY)
def get_endpoint_logs(name: str, region: Region = None,
                      lines: Annotated[int, Field(ge=1, le=10_000)] = 50) -> LogsResult:
    """The endpoint's CloudWatch log tail and startup milestones; explains a missing log group.
    Refuses a name outside SageMaker's name rule (a path such as ../../x)."""
    validate_name(name)
    region = default_region(region)
    return endpoint_logs(name, region, lines=lines)


def _target(endpoint_name: str | None, base_url: str | None) -> None:
    if bool(endpoint_name) == bool(base_url):
        raise Gemma4T4Error("say where to send the request",
                            fix="pass endpoint_name (SageMaker) or base_url (local vLLM), not both")


@tool(READ_ONLY)
def query_model(prompt: str, endpoint_name: str | None = None, region: Region = None,
                base_url: str | None = None, max_tokens: Tokens = 256, temperature: Temperature = 0.0) -> QueryResult:
    """Send one chat prompt to a SageMaker endpoint (endpoint_name) or a local vLLM server (base_url)."""
    region = default_region(region)
    _target(endpoint_name, base_url)
    if base_url:
        return local_chat(base_url, prompt, max_tokens, temperature)
    result = invoke(endpoint_name, region, prompt, max_tokens=max_tokens, temperature=temperature)
    return QueryResult(**result.model_dump() | {"target": f"sagemaker:{region}/{endpoint_name}",
                                                "latency_s": round(result.latency_s, 3)})


@tool(READ_ONLY)
def verify_model_health(endpoint_name: str | None = None, region: Region = None,
                        base_url: str | None = None) -> HealthReport:
    """A real generation check: known-answer prompts; degenerate or repetitive replies fail."""
    _target(endpoint_name, base_url)  # query_model resolves the region

    def ask(prompt: str) -> str:
        return query_model(prompt, endpoint_name, region, base_url, max_tokens=32).text

    return check_health(ask)


@tool(DESTRUCTIVE, confirm=True)
def delete_endpoint(name: str, region: Region = None, confirm: Confirm = False) -> DeleteToolResult:
    """Delete endpoint, endpoint config and model (idempotent). Needs confirm=True. Refuses an endpoint this
    project did not create (no project tag): a person deletes that with the CLI (sagemaker delete --not-ours)."""
    validate_name(name)
    region = default_region(region)
    result = delete(name, region, dry_run=not confirm)  # the dry run reads what the real one would delete
    return DeleteToolResult(refused=not confirm, deleted=result.deleted, already_absent=result.already_absent,
                            would_run=result.plan, kept=result.kept, reason=None if confirm else
                            f"deleting {name} in {region} is irreversible: call again with confirm=True")


# -- local machine tools ---------------------------------------------------------------------------------
@tool(LOCAL_READ_ONLY)
def check_environment(probe_shared_memory: bool = False) -> env.EnvReport:
    """Doctor: Python, torch, vLLM, GPU, driver, RAM/swap, disk, and the problems to fix first."""
    return env.doctor(smem=probe_shared_memory)


def _torch_arch_flags() -> str | None:
    try:
        import torch  # only here: torch is seconds of import, and absent on many hosts
    except ImportError:
        return None
    return getattr(torch._C, "_cuda_getArchFlags", lambda: "")() or None


@tool(LOCAL_READ_ONLY)
def verify_gpu_arch() -> GpuArchResult:
    """Is this GPU sm_75 (T4), does torch carry its kernels, and does Gemma 4 need the Turing fix here?"""
    facts = env.probe(smem=True)  # initialises CUDA through torch only when a GPU is present
    arch_flags = _torch_arch_flags()
    capability = facts.compute_capability
    cap = smi.parse_capability(capability)
    needs = facts.turing_fix_needed()
    arch = turing_verify.arch_name(cap) if cap else None
    if not facts.gpus:
        summary = "no NVIDIA GPU visible (CPU host): the Turing fix is not needed here"
    elif arch and arch_flags is not None and arch not in arch_flags:
        summary = f"torch was built without {arch} kernels ({arch_flags}): install a CUDA torch that has them"
    else:
        smem = f"{facts.smem_per_block_optin} B" if facts.smem_per_block_optin else "not readable"
        gpu = facts.gpu_choice.gpu
        used = (f"{gpu.name} ({facts.gpu_choice.reason})" if gpu is not None
                else f"no GPU chosen ({facts.gpu_choice.error})")
        summary = (f"{used} ({arch}); shared memory per block {smem}; "
                   f"Gemma 4 {'needs' if needs else 'does not need'} the Turing fix")
    return GpuArchResult(gpus=facts.gpus, compute_capability=capability, arch=arch, torch_arch_flags=arch_flags,
                         smem_per_block_optin=facts.smem_per_block_optin, needs_turing_fix=needs,
                         cuda_probe_error=facts.cuda_probe_error, summary=summary)


@tool(LOCAL_READ_ONLY)
def verify_turing_patch(functional: bool = False, arch: str = "sm_75") -> TuringCheckResult:
    """Does the Turing fix reach vLLM (plugin or file patch)? functional=True compiles vLLM's kernel for arch."""
    state = turing_state.status()
    result = TuringCheckResult(status=state, ok=state.active, summary=state.summary)
    if functional:
        verified = turing_verify.verify(arch)
        result.verify = verified.model_copy(update={"launches": verified.failures()})
        result.ok = bool(verified.ok and state.active)
    return result


@tool(DESTRUCTIVE, confirm=True)
def apply_turing_patch(revert: bool = False, confirm: Confirm = False) -> TuringPatchResult:
    """Make the Turing fix reach vLLM (file patch with backup when the plugin cannot); revert=True undoes it.

    Needs confirm=True. When the installed plugin already reaches vLLM nothing is changed.
    """
    state = turing_state.status()
    if not confirm:
        would = ["restore vLLM's kernel file from its backup"] if revert else (
            ["nothing: the plugin already reaches every vLLM process"] if state.active
            else ["patch vLLM's attention kernel file (a backup is kept; revert=True restores it)"])
        return TuringPatchResult(refused=True, reason="this changes the installed vLLM: call again with confirm=True",
                                 would=would, status=state)
    if state.active and not revert:
        return TuringPatchResult(refused=False, status=state, message="already active: " + state.summary)
    done = filepatch.revert_file_patch() if revert else filepatch.apply_file_patch()
    return TuringPatchResult(refused=False, result=done, status=turing_state.status())


@tool(CREATES)
@takes_settings(offered(ServerConfig, sagemaker=False))
def start_vllm_server(*, timeout_s: Annotated[Seconds, Field(description="how long to wait for /health")] = 600.0,
                      **settings: object) -> ServerToolResult:
    """Start vLLM on 127.0.0.1 (free port by default) through the start gate; waits for /health.
    The settings are serve start's (docs/serving.md) that an assistant may set, each described and bounded in
    the schema; never another host, an API key, another interpreter, raw vLLM arguments or environment, another
    work dir or unattended restarts (not parameters: the start gate checks the rest)."""
    config = ServerConfig(**settings | {"port": settings.get("port") or free_port(), "work_dir": _work_dir()})
    # owned by this MCP server: recorded in the state file, stopped when it exits (docs/serving.md)
    owner = {"kind": "mcp-server", "pid": os.getpid(), "create_time": _own_create_time(),
             "on_exit": "stopped by the MCP server when it exits"}
    server = start_server(config, wait=False, owner=owner)
    _OWNED.append(server)  # owned from its launch: an exit during the wait below still stops it
    server.wait_healthy(timeout=timeout_s)
    status = server.status()
    return ServerToolResult(servers=[status], summary=status.summary())


_OWNED: list[Any] = []  # vLLM servers started by this MCP server


def _owned_server(port: int | None) -> int:
    """The port of a server this MCP server started (``port``, or the only one it started); others refused."""
    ports = [server.config.port for server in _OWNED]
    if port is None and len(ports) == 1:
        return ports[0]
    if port in ports:
        return port
    raise Gemma4T4Error(
        f"the server on port {port} was not started by this MCP server: not stopped" if port is not None else
        f"say which server to stop: this MCP server started {len(ports)} ({', '.join(map(str, ports)) or 'none'})",
        fix="stop servers started otherwise with gemma4-t4 serve stop --port PORT; pass port= of one started here")


def _own_create_time() -> float | None:
    import psutil

    return psutil.Process().create_time()


def _stop_owned() -> None:
    """Stop every vLLM server this MCP server started (at its exit: none outlives it)."""
    while _OWNED:
        with contextlib.suppress(Exception):
            _OWNED.pop().stop(grace=10.0)


@tool(DESTRUCTIVE, confirm=True)
def stop_vllm_server(port: UserPort | None = None, confirm: Confirm = False) -> ServerToolResult:
    """Stop a vLLM server this MCP server started (SIGTERM, then SIGKILL). Needs confirm=True.
    Refused for a server started otherwise (the CLI, a notebook, another MCP server): it is not this one's."""
    port = _owned_server(port)
    if not confirm:
        target = VLLMServer.attach(port, _work_dir())
        return ServerToolResult(refused=True, servers=[target.status()],
                                reason="stopping drops in-flight requests: call again with confirm=True")
    status = stop_server(port, _work_dir())
    _OWNED[:] = [server for server in _OWNED if server.config.port != port]
    return ServerToolResult(servers=[status], summary=status.summary())


@tool(LOCAL_READ_ONLY)
def server_status() -> ServerToolResult:
    """Every vLLM server this work directory knows: state, pid, URL, health, log tail if it died."""
    servers = list_servers(_work_dir())
    return ServerToolResult(servers=servers,
                            summary="\n".join(s.summary() for s in servers) or "no servers recorded")


@tool(CREATES, interruptible=True)
def run_benchmark(base_url: str, spec: AnySpec | None = None, model: str | None = None,
                  out_dir: str | None = None, request_timeout_s: Seconds | None = None) -> RunReport:
    """Benchmark a running OpenAI-compatible server or sagemaker://REGION/ENDPOINT (TTFT, TPOT, throughput);
    writes a results dir. spec = what to measure, chosen by its kind (default {"kind": "decode"}); the schema
    holds every registered workload (decode, open_loop, sweep, series_decode, ttft, prefix, answers, load, ...)
    with its description, its fields and their defaults; a null field means its default, an unknown one is
    refused. The MCP server's shutdown (SIGTERM) cancels a running benchmark; its results dir stays partial."""
    if model is None:
        model = served_model(base_url)
    chosen = spec or bench_specs.DecodeSpec()
    out = out_dir or os.path.join(_work_dir(), "bench", f"{chosen.kind}-{time.strftime('%Y%m%d-%H%M%S')}")
    timeout = {} if request_timeout_s is None else {"request_timeout_s": request_timeout_s}
    served = bench_specs.ServedAt(base_url, model)
    return bench_specs.run(served, chosen, out, progress=False, **timeout).report()


def build_server() -> MCPServer:
    tools = []
    for name, spec in REGISTRY.items():
        annotations = spec.annotations.model_copy(update={"title": name.replace("_", " ").capitalize()})
        tools.append(strict_arguments(
            Tool.from_function(_adapter(spec.fn, spec.interruptible), name=name, title=annotations.title, annotations=annotations)))
    return MCPServer(
        "gemma4-t4", log_level="WARNING",
        instructions="Deploy and serve Gemma 4 on NVIDIA T4 GPUs (SageMaker and local vLLM). Start with get_help. "
        "Tools that bill or delete need confirm=True.", tools=tools,
    )


def main() -> None:
    # stdout is the protocol channel: nothing else may print there. Keep library logs quiet
    # (botocore at DEBUG would log request signing details).
    logging.basicConfig(level=logging.WARNING)
    for noisy in ("botocore", "boto3", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # SIGTERM and SIGHUP (the one signal rule, gemma4_t4.foundation.signals) shut the server down in order:
    # cancel in-flight work (a deploy rolls back what it created, a build is stopped), stop the vLLM
    # servers it started, then exit. The event loop cannot do it: it waits on its stdin reader.
    for sig in signals.STOP_SIGNALS:
        signal.signal(sig, _on_stop_signal)
    try:
        build_server().run()
    finally:
        _stop_owned()
        _settle_watches()


def _on_stop_signal(signum: int, _frame: object) -> None:
    for sig in signals.STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)  # a second signal must not cut the cleanup short
    _STOP_SIGNAL[0] = signum
    _SHUTDOWN.set()
    threading.Thread(target=_shut_down, name="mcp-shutdown", daemon=False).start()


def _shut_down() -> None:
    log.warning("%s: cancelling in-flight tools and stopping owned servers", signal.Signals(_STOP_SIGNAL[0]).name)
    _stop_owned()  # a health wait on a stopped server ends at once
    if not _IN_FLIGHT.wait_idle(SHUTDOWN_GRACE_S):
        log.error("tools still running after %.0f s; exiting anyway", SHUTDOWN_GRACE_S)
    _stop_owned()
    _settle_watches()
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    os._exit(0)  # like a closed stdin: the client asked the server to end


if __name__ == "__main__":
    main()
