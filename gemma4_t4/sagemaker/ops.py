"""Day-2 operations on an endpoint: status, list, CloudWatch logs, invoke (OpenAI chat
payload), streaming invoke, and an idempotent delete of endpoint, config and model."""

from __future__ import annotations

import datetime as dt
import itertools
import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, computed_field

from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation.jsonable import JSONObject, JSONValue, TypedDict
from gemma4_t4.foundation.table import Displayable
from gemma4_t4.sagemaker.aws import (
    ClientFactory,
    aws_call,
    aws_error,
    aws_exceptions,
    client_factory,
    error_code,
    is_not_found,
)
from gemma4_t4.sagemaker.cli_recipe import ApiCall
from gemma4_t4.sagemaker.config import AUTOSCALING_TAG, EXPIRES_TAG, PROJECT_TAG, PROJECT_VALUE
from gemma4_t4.sagemaker.cost import estimate, hours_between, is_ours
from gemma4_t4.sagemaker.image import US_REGIONS, validate_region

LOG_MILESTONES = ("Model loading took", "KV cache", "Maximum concurrency", "CUDA out of memory",
                  "Application startup complete", "Traceback", "Error", "error:")


def _client(service: str, region: str, client: Any = None) -> Any:
    validate_region(region)
    return client or client_factory()(service, region)


def _aware(value: Any) -> dt.datetime | None:
    if not isinstance(value, dt.datetime):
        return None
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)


# -- status -------------------------------------------------------------------------------
@dataclass
class EndpointStatus(Displayable):
    name: str
    region: str
    exists: bool
    status: str | None = None  # Creating | InService | Failed | Updating | Deleting | ...
    failure_reason: str | None = None
    config_name: str | None = None
    instance_types: list[str] = field(default_factory=list)
    placed_instance_type: str | None = None
    inference_ami_version: str | None = None
    images: list[str] = field(default_factory=list)
    created_at: str | None = None
    age_minutes: float | None = None
    expires_at: str | None = None
    usd_per_hour: float | None = None
    cost_so_far_usd: float | None = None
    advice: str | None = None

    columns = ("name", "region", "status", "instance_types", "inference_ami_version", "expires_at", "usd_per_hour",
               "age_minutes", "cost_so_far_usd", "failure_reason")

    def caption(self) -> str:
        return "Endpoint status" + (f": {self.advice}" if self.advice else "")

    def table_rows(self) -> list[EndpointStatus]:
        return [self]

    def notes(self) -> list[str]:
        """The learner's reading: is it serving, and what it costs while it stays."""
        if not self.exists:
            return [f"{self.name} does not exist in {self.region}: nothing bills for it."]
        price = f"${self.usd_per_hour:.2f}/h until deleted" if self.usd_per_hour else "priced at nothing known"
        expiry = f"; its expiry tag says {self.expires_at}" if self.expires_at else ""
        return [f"{self.status}: {price}{expiry}."]


def endpoint_status(name: str, region: str) -> EndpointStatus:
    sm = _client("sagemaker", region)
    desc = describe(sm, "endpoint", name)
    if desc is None:
        return EndpointStatus(name, region, False, advice="no such endpoint in this region")
    now = dt.datetime.now(dt.UTC)
    status = EndpointStatus(name, region, True, desc.get("EndpointStatus"), desc.get("FailureReason"),
                            desc.get("EndpointConfigName"))
    created = _aware(desc.get("CreationTime"))
    if created:
        status.created_at = created.isoformat()
        status.age_minutes = round((now - created).total_seconds() / 60.0, 1)
    for variant in desc.get("ProductionVariants", []):
        for image in variant.get("DeployedImages", []):
            status.images.append(image.get("ResolvedImage") or image.get("SpecifiedImage", ""))
        pools = variant.get("InstancePools") or []
        placed = [p.get("InstanceType") for p in pools if p.get("CurrentInstanceCount")]
        if placed:
            status.placed_instance_type = placed[0]
    if status.config_name:
        config = describe(sm, "endpoint-config", status.config_name)
        for variant in (config or {}).get("ProductionVariants", []):
            if variant.get("InstanceType"):
                status.instance_types.append(variant["InstanceType"])
            status.instance_types += [p["InstanceType"] for p in variant.get("InstancePools", [])]
            status.inference_ami_version = variant.get("InferenceAmiVersion")
    tags = _tags(sm, desc.get("EndpointArn"))
    status.expires_at = tags.get(EXPIRES_TAG)
    billed_type = status.placed_instance_type or (status.instance_types[0] if status.instance_types else None)
    if billed_type:
        status.usd_per_hour = estimate(billed_type).usd_per_hour
        if status.usd_per_hour is not None and created and status.status not in ("Failed", "Deleting"):
            status.cost_so_far_usd = round(status.usd_per_hour * hours_between(created, now), 3)
    status.advice = _advice(status)
    return status


def _advice(status: EndpointStatus) -> str | None:
    if status.status == "Failed":
        reason = status.failure_reason or ""
        if "CannotStartContainer" in reason:
            return ("the container never started: on g4dn with a CUDA 13 image set InferenceAmiVersion "
                    "al2023-ami-sagemaker-inference-gpu-4-1; delete the endpoint to stop billing")
        if "Capacity" in reason or "capacity" in reason:
            return "no capacity for this instance type here: try another region (deploy --failover)"
        return "read the logs (gemma4-t4 sagemaker logs NAME), then delete the endpoint"
    if status.status == "Creating" and status.age_minutes and status.age_minutes > 45:
        return (f"still Creating after {status.age_minutes:.0f} min (a T4 start takes ~13 min): "
                "check the logs; you are billed while it waits")
    if status.status == "InService":
        return "ready: invoke it, and delete it when done"
    return None


def _tags(sm: Any, arn: str | None) -> dict[str, str]:
    if not arn:
        return {}
    try:
        return {t["Key"]: t["Value"] for t in sm.list_tags(ResourceArn=arn).get("Tags", [])}
    except aws_exceptions():
        return {}


# -- list -----------------------------------------------------------------------------------
class EndpointSummary(BaseModel):
    """One endpoint as listed (what ``list_endpoints``, the CLI and the MCP tool show)."""

    name: str
    region: str
    status: str
    created_at: str | None = None
    tags: dict[str, str] = {}

    @computed_field
    @property
    def expires_at(self) -> str | None:
        return self.tags.get(EXPIRES_TAG)


def list_endpoints(regions: Sequence[str] = US_REGIONS, *, clients: ClientFactory | None = None,
                   project_only: bool = False) -> list[EndpointSummary]:
    """Endpoints in each region (sequentially); ``project_only`` keeps this project's tagged ones."""
    make = clients or client_factory()
    out: list[EndpointSummary] = []
    for region in regions:
        validate_region(region)
        sm = make("sagemaker", region)
        with aws_call(f"ListEndpoints in {region}"):
            for page in sm.get_paginator("list_endpoints").paginate():
                for ep in page.get("Endpoints", []):
                    tags = _tags(sm, ep.get("EndpointArn"))
                    if project_only and not is_ours(tags):
                        continue
                    created = _aware(ep.get("CreationTime"))
                    out.append(EndpointSummary(
                        name=ep["EndpointName"], region=region, status=ep.get("EndpointStatus", "?"),
                        created_at=created.isoformat() if created else None, tags=tags))
    return out


# -- logs -------------------------------------------------------------------------------------
@dataclass
class LogsResult:
    name: str
    region: str
    log_group: str
    found: bool
    lines: list[str] = field(default_factory=list)
    milestones: list[str] = field(default_factory=list)
    explanation: str | None = None


def log_group(name: str) -> str:
    return f"/aws/sagemaker/Endpoints/{name}"


def endpoint_logs(name: str, region: str, lines: int = 50) -> LogsResult:
    """The newest ``lines`` of the endpoint's CloudWatch logs, plus startup milestones."""
    logs = _client("logs", region)
    group = log_group(name)
    result = LogsResult(name, region, group, True)
    try:
        streams = logs.describe_log_streams(logGroupName=group, orderBy="LastEventTime", descending=True,
                                            limit=5).get("logStreams", [])
    except aws_exceptions() as exc:
        if error_code(exc) == "ResourceNotFoundException":
            result.found = False
            result.explanation = (
                "no log group: the container never started. Common causes: the image's CUDA needs a newer "
                "driver (set InferenceAmiVersion al2023-ami-sagemaker-inference-gpu-4-1 for cu130 images on "
                "g4dn), the image is in another region or account, or the instance was never placed (capacity)."
            )
            return result
        raise aws_error(exc, f"DescribeLogStreams {group}") from exc
    events: list[tuple[int, str]] = []
    for stream in streams:
        response = logs.get_log_events(logGroupName=group, logStreamName=stream["logStreamName"], limit=lines,
                                       startFromHead=False)
        events += [(e.get("timestamp", 0), e.get("message", "")) for e in response.get("events", [])]
    events.sort()
    result.lines = [m.rstrip("\n") for _, m in events[-lines:]]
    result.milestones = [m for _, m in events if any(k in m for k in LOG_MILESTONES)]
    if not streams:
        result.explanation = "log group exists but has no streams yet: the instance is still starting"
    return result


# -- invoke -------------------------------------------------------------------------------------
class ChatUsage(TypedDict, total=False):
    """The OpenAI ``usage`` block vLLM sends; fields a newer server adds are kept as they came."""

    __pydantic_config__ = {"extra": "allow"}  # pydantic reads this TypedDict's config from here

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: JSONObject | None  # {"cached_tokens": N} when prefix caching counts them


class InvokeResult(BaseModel):
    """One chat reply: its text, why it finished, the usage block and how long it took."""

    text: str
    latency_s: float
    finish_reason: str | None = None
    usage: ChatUsage | None = None


def chat_payload(prompt: str | None, max_tokens: int = 256, temperature: float = 0.0, stream: bool = False,
                 **extra: JSONValue) -> JSONObject:
    """The body of one OpenAI-style chat request, the prompt as the user's message (SageMaker passes it to vLLM
    as is). Extra request fields a caller adds (``top_p``, ``stop``, ``seed``) ride along as JSON."""
    if not prompt:
        raise Gemma4T4Error("nothing to send", fix="pass prompt='...'")
    payload: JSONObject = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                           "temperature": temperature}
    if stream:
        payload["stream"] = True
        payload["stream_options"] = {"include_usage": True}
    payload.update(extra)
    return payload


def parse_chat_response(body: bytes) -> tuple[str, str | None, ChatUsage | None]:
    """(text, finish_reason, usage) from the body of an OpenAI chat or completion response (a body that is not
    JSON: its text, as it came)."""
    try:
        data = json.loads(body)
    except ValueError:
        return body.decode(errors="replace"), None, None
    if not isinstance(data, dict) or not data.get("choices"):
        raise Gemma4T4Error(
            f"unexpected response from the endpoint: {str(data)[:300]}",
            fix="check the endpoint serves the vLLM OpenAI API (read its logs)",
        )
    choice = data["choices"][0]
    text = (choice.get("message") or {}).get("content")
    if text is None:
        text = choice.get("text", "")
    return text or "", choice.get("finish_reason"), data.get("usage")


def invoke_plan(name: str, region: str, payload: JSONObject) -> ApiCall:
    return ApiCall("sagemaker-runtime", "invoke_endpoint",
                   {"EndpointName": name, "ContentType": "application/json", "Body": json.dumps(payload)},
                   region, note="add --cli-binary-format raw-in-base64-out and an output file: /dev/stdout")


def invoke(name: str, region: str, prompt: str | None = None, *, max_tokens: int = 256, temperature: float = 0.0,
           **extra: JSONValue) -> InvokeResult:
    """One non-streaming OpenAI-style chat request to the endpoint."""
    runtime = _client("sagemaker-runtime", region)
    payload = chat_payload(prompt, max_tokens, temperature, **extra)
    start = time.perf_counter()
    with aws_call(f"InvokeEndpoint {name}"):  # the call the dry run shows, accepting JSON
        response = runtime.invoke_endpoint(**invoke_plan(name, region, payload).params, Accept="application/json")
    body = response["Body"].read()
    latency = time.perf_counter() - start  # the reply's time, not its parsing
    text, finish, usage = parse_chat_response(body)
    return InvokeResult(text=text, finish_reason=finish, usage=usage, latency_s=latency)


def stream_deltas(payload_parts: Iterator[bytes]) -> Iterator[JSONObject]:
    """OpenAI stream events (server-sent ``data:`` lines, split anywhere across SageMaker's PayloadParts)
    -> {"text": delta} / {"usage": {...}} items, each yielded as soon as its line is complete."""
    buffer = b""
    for part in itertools.chain(payload_parts, [b"\n"]):
        buffer += part
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            line = line.strip()
            data = line[5:].strip()
            if not line.startswith(b"data:") or data in (b"", b"[DONE]"):
                continue
            event = json.loads(data)
            for choice in event.get("choices") or []:
                delta = (choice.get("delta") or {}).get("content") or choice.get("text") or ""
                if delta:
                    yield {"text": delta}
            if event.get("usage"):
                yield {"usage": event["usage"]}


@dataclass
class StreamResult:
    text: str
    ttft_s: float | None
    total_s: float
    chunks: int
    usage: ChatUsage | None


def invoke_stream(name: str, region: str, prompt: str | None = None, *, max_tokens: int = 256,
                  on_text: Any = None, **extra: JSONValue) -> StreamResult:
    """Streaming chat via InvokeEndpointWithResponseStream; measures time to first token."""
    runtime = _client("sagemaker-runtime", region)
    payload = chat_payload(prompt, max_tokens, stream=True, **extra)
    start = time.perf_counter()
    with aws_call(f"InvokeEndpointWithResponseStream {name}"):
        response = runtime.invoke_endpoint_with_response_stream(**invoke_plan(name, region, payload).params)
    parts = (event["PayloadPart"]["Bytes"] for event in response["Body"] if "PayloadPart" in event)
    pieces: list[str] = []
    ttft = usage = None
    for item in stream_deltas(parts):
        if "text" in item:
            if ttft is None:
                ttft = time.perf_counter() - start
            pieces.append(item["text"])
            if on_text:
                on_text(item["text"])
        else:
            usage = item["usage"]
    return StreamResult("".join(pieces), ttft, time.perf_counter() - start, len(pieces), usage)


# -- delete -------------------------------------------------------------------------------------
@dataclass
class DeleteResult:
    name: str
    region: str
    deleted: list[str] = field(default_factory=list)  # "endpoint:NAME", "endpoint-config:NAME", "model:NAME"
    already_absent: list[str] = field(default_factory=list)
    dry_run: bool = False
    plan: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # "model:NAME (why it is kept)"


@dataclass
class DeletePlan:
    """What deleting one endpoint removes, and what it keeps and why. The dry run shows it and the
    real run executes it: :func:`plan_delete` is the one place it is decided."""

    resources: list[tuple[str, str]]
    kept: list[str] = field(default_factory=list)


def _config_models(sm: Any, config: str) -> list[str]:
    desc = describe(sm, "endpoint-config", config) or {}  # none: no models
    return sorted({v["ModelName"] for v in desc.get("ProductionVariants", []) if v.get("ModelName")})


def _other_endpoints_uses(sm: Any, name: str) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """(config -> other endpoints using it, model -> other endpoints whose config serves it)."""
    configs: dict[str, list[str]] = {}
    models: dict[str, list[str]] = {}
    with aws_call("ListEndpoints"):
        pages = list(sm.get_paginator("list_endpoints").paginate())
    for page in pages:
        for ep in page.get("Endpoints", []):
            other = ep["EndpointName"]
            if other == name:
                continue
            config = (describe(sm, "endpoint", other) or {}).get("EndpointConfigName")
            if config is None:
                continue
            configs.setdefault(config, []).append(other)
            for model in _config_models(sm, config):
                models.setdefault(model, []).append(other)
    return configs, models


# kind -> the call that describes one, the name's parameter, the ARN's field in the answer
_DESCRIBE = {
    "endpoint": ("describe_endpoint", "EndpointName", "EndpointArn"),
    "endpoint-config": ("describe_endpoint_config", "EndpointConfigName", "EndpointConfigArn"),
    "model": ("describe_model", "ModelName", "ModelArn"),
}


def describe(sm: Any, kind: str, name: str) -> JSONObject | None:
    """SageMaker's description of the ``kind`` resource called ``name``; None where none has that name."""
    operation, key, _ = _DESCRIBE[kind]
    try:
        return getattr(sm, operation)(**{key: name})
    except aws_exceptions() as exc:
        if is_not_found(exc):
            return None
        api_name = operation.title().replace("_", "")  # DescribeEndpointConfig, as AWS names it
        raise aws_error(exc, f"{api_name} {name}") from exc


def plan_delete(sm: Any, name: str, not_ours: bool = False) -> DeletePlan:
    """(kind, name) to delete, endpoint first, names from the live chain when it exists.

    Only what this project created (its ``project`` tag) is deleted: an endpoint without the tag is
    refused unless ``not_ours`` says to delete it anyway, and a config or model without it is kept
    and named. A config or model another endpoint still uses is kept too, named with the endpoints
    that use it (a shared model deleted under a live endpoint breaks its next update or scaling).
    An endpoint tagged as autoscaled gets its scalable target deregistered first (that also removes
    its scaling policies)."""
    config_name, models = name, [name]
    scaling: list[tuple[str, str]] = []
    desc = describe(sm, "endpoint", name)
    if desc is not None:
        config_name = desc.get("EndpointConfigName", name)
        tags = _tags(sm, desc.get("EndpointArn"))
        if not is_ours(tags) and not not_ours:
            raise Gemma4T4Error(
                f"endpoint {name} was not created by gemma4-t4 (no {PROJECT_TAG}={PROJECT_VALUE} tag): not deleted",
                fix=f"delete it with the AWS console or CLI, or with `gemma4-t4 sagemaker delete {name} --not-ours --yes` "
                "(the CLI only: the MCP delete_endpoint never deletes an endpoint this project did not create)",
            )
        if AUTOSCALING_TAG in tags:
            scaling = [("autoscaling", f"endpoint/{name}/variant/AllTraffic")]
    models = _config_models(sm, config_name) or models
    used_configs, used_models = _other_endpoints_uses(sm, name)
    plan = DeletePlan([*scaling, ("endpoint", name)])  # a missing one is reported as already absent
    for kind, resource, users in (
        ("endpoint-config", config_name, used_configs.get(config_name)),
        *[("model", m, used_models.get(m)) for m in models],
    ):
        desc = describe(sm, kind, resource)  # whether it carries this project's tag (None: it does not exist)
        ours = None if desc is None else is_ours(_tags(sm, desc.get(_DESCRIBE[kind][2])))
        if users:
            plan.kept.append(f"{kind}:{resource} (still used by endpoint {', '.join(sorted(users))})")
        elif ours is False and not not_ours:
            plan.kept.append(f"{kind}:{resource} (not created by gemma4-t4: no {PROJECT_TAG} tag)")
        else:
            plan.resources.append((kind, resource))
    return plan


SCALABLE = {"ServiceNamespace": "sagemaker", "ScalableDimension": "sagemaker:variant:DesiredInstanceCount"}


def _delete_call(kind: str, res: str, region: str | None) -> ApiCall:
    if kind == "autoscaling":
        return ApiCall("application-autoscaling", "deregister_scalable_target", {**SCALABLE, "ResourceId": res},
                       region, note="also removes the target-tracking policy")
    operation, key, _ = _DESCRIBE[kind]  # delete_endpoint takes what describe_endpoint does
    return ApiCall("sagemaker", operation.replace("describe_", "delete_"), {key: res}, region)


def delete_plan(resources: list[tuple[str, str]], region: str) -> list[ApiCall]:
    return [_delete_call(kind, res, region) for kind, res in resources]


def delete_resources(sm: Any, resources: list[tuple[str, str]], result: DeleteResult,
                     autoscaling_client: Any = None) -> None:
    for kind, res in resources:
        call = _delete_call(kind, res, None)
        operation, target = call.operation, sm
        if kind == "autoscaling":
            region = sm.meta.region_name if hasattr(sm, "meta") else None
            target = autoscaling_client or client_factory()("application-autoscaling", region)
        try:
            getattr(target, operation)(**call.params)
            result.deleted.append(f"{kind}:{res}")
        except aws_exceptions() as exc:
            if is_not_found(exc):
                result.already_absent.append(f"{kind}:{res}")
            else:
                raise aws_error(exc, f"{operation} {res}") from exc


def delete_endpoint(name: str, region: str, *, client: Any = None, dry_run: bool = False, not_ours: bool = False,
                    created_at: float | None = None) -> DeleteResult:
    """Delete autoscaling, endpoint, endpoint config and model(s). Safe to repeat: missing parts are
    reported. A config or model another endpoint uses is kept (``kept`` says why). The dry run reads
    the same chain (read-only calls) and lists exactly what the real run deletes. ``created_at``: the
    endpoint's CreationTime as recorded when it was seen (an automatic delete: the reaper, a rollback);
    an endpoint of that name created at another time is someone else's and is refused, not deleted."""
    result = DeleteResult(name, region, dry_run=dry_run)
    sm = _client("sagemaker", region, client)
    if created_at is not None:
        check_identity(sm, "endpoint", name, created_at)
    plan = plan_delete(sm, name, not_ours=not_ours)
    result.plan = [c.cli() for c in delete_plan(plan.resources, region)]
    result.kept = plan.kept
    if dry_run:
        return result
    delete_resources(sm, plan.resources, result)
    return result


# -- identity: an automatic delete removes only the resource it recorded ----------------------------
# A name is not an identity: between a create and its automatic delete (a watcher's rollback, the exit
# of the MCP server, the reaper) someone may delete the resource and create their own of the same name.
# The CreationTime SageMaker answered is the identity; both values come from AWS's clock, so they match
# to the microsecond, and a re-creation takes longer than this tolerance.
SAME_CREATION_S = 1.0


def created_at(sm: Any, kind: str, name: str) -> float | None:
    """The CreationTime (epoch seconds) of the ``kind`` resource called ``name``; None where none exists."""
    desc = describe(sm, kind, name)
    created = _aware(desc.get("CreationTime")) if desc else None
    return created.timestamp() if created else None


def same_creation(recorded: float, live: float | None) -> bool:
    """The one identity rule: the live resource is the recorded one (None: no resource has the name)."""
    return live is not None and abs(live - recorded) < SAME_CREATION_S


def check_identity(sm: Any, kind: str, name: str, recorded: float) -> bool:
    """True where the resource is the recorded one, False where none has the name; another resource of
    that name is refused (it was created at another time, by someone else)."""
    live = created_at(sm, kind, name)
    if live is None or same_creation(recorded, live):
        return live is not None
    when = dt.datetime.fromtimestamp(live, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    raise Gemma4T4Error(
        f"{kind} {name} was created {when}, not the one recorded: another owner re-created the name; not deleted",
        fix=f"delete it by hand if it is really unwanted: gemma4-t4 sagemaker delete {name} --yes",
    )
