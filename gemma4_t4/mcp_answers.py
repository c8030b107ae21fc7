"""What the MCP tools answer (``mcp_server``): one result model per tool, each field what an assistant reads,
and a local server's chat request, its failure as the user should see it (its own reason, the fix that
matches it)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

from pydantic import BaseModel, Field

from gemma4_t4.errors import Gemma4T4Error, user_error
from gemma4_t4.host.smi import GPUInfo
from gemma4_t4.sagemaker.build import BuildRecord, BuildResult
from gemma4_t4.sagemaker.config import ConfigSummary
from gemma4_t4.sagemaker.deploy import DeployResult
from gemma4_t4.sagemaker.ops import EndpointStatus, EndpointSummary, InvokeResult, parse_chat_response
from gemma4_t4.sagemaker.quotas import QuotaRow
from gemma4_t4.serving.server import ServerStatus
from gemma4_t4.turing import filepatch
from gemma4_t4.turing import state as turing_state
from gemma4_t4.turing import verify as turing_verify


class HelpResult(BaseModel):
    workflow: list[str]
    tools: dict[str, str]
    cli: list[str]
    notes: list[str]


class Refusable(BaseModel):
    """A tool that bills, deletes or changes something: refused (and why) until its call may act."""

    refused: bool
    reason: str | None = None


class QuotaResult(BaseModel):
    rows: list[QuotaRow]
    picked: dict[str, str | None]
    summary: str


class ConfigResult(BaseModel):
    valid: bool
    problem: str | None = None
    fix: str | None = None
    config: ConfigSummary | None = None  # None when the config is not valid
    cost: str = ""
    usd_per_hour: float | None = None
    budget: str = ""  # the worst case within budget_usd
    aws_cli: list[str] = []


class DeployToolResult(Refusable):
    cost: str = ""
    aws_cli: list[str] = []
    deployment: DeployResult | None = None
    next_step: str | None = None


class DeleteToolResult(Refusable):
    deleted: list[str] = []
    already_absent: list[str] = []
    would_run: list[str] = []
    kept: list[str] = Field([], description="configs/models another endpoint still uses, and which")


class StatusToolResult(BaseModel):
    endpoint: EndpointStatus
    deployment_watch: DeployResult | None = None


class QueryResult(InvokeResult):
    """A reply, and which server or endpoint gave it."""

    target: str


class EndpointsResult(BaseModel):
    endpoints: list[EndpointSummary]
    count: int


class ServerToolResult(Refusable):
    refused: bool = False  # only stop_vllm_server is ever refused
    servers: list[ServerStatus] = []
    summary: str = ""


class GpuArchResult(BaseModel):
    gpus: list[GPUInfo]
    compute_capability: str | None = None
    arch: str | None = None
    torch_arch_flags: str | None = None
    smem_per_block_optin: int | None = None
    needs_turing_fix: bool | None = Field(None, description="None on a host without a GPU")
    cuda_probe_error: str | None = None
    summary: str


class TuringCheckResult(BaseModel):
    status: turing_state.TuringStatus
    ok: bool = Field(description="the fix reaches vLLM (and, with functional=True, the sm_75 compile proves it)")
    summary: str
    verify: turing_verify.VerifyReport | None = Field(
        None, description="the sm_75 proof (functional=True); its launches are only the ones that fail"
    )


class TuringPatchResult(Refusable):
    would: list[str] = []
    status: turing_state.TuringStatus
    result: filepatch.FilePatchResult | None = None
    message: str | None = None


class BuiltImage(BuildRecord):
    """What build_t4_image answers after a build: the image's record, and the resources it
    created or found already there."""

    created: list[str]
    reused: list[str]


class BuildImageResult(Refusable):
    cost: str = ""
    aws_cli: list[str] = []
    build: BuiltImage | BuildResult | None = None  # the record of the image, or the failed build


def tool_error_text(exc: BaseException) -> str:
    """What a failed tool answers: the error's type, its one-line message and the fix."""
    error = user_error(exc)
    # another exception's message already starts with its type's name
    head = error.message if error is not exc else f"{type(error).__name__}: {error.message}"
    return head + (f"\n  fix: {error.fix}" if error.fix else "")


def server_reason(body: bytes) -> str:
    """The reason in an OpenAI-compatible error body (vLLM: {"error": {"message": ...}}), else its text."""
    text = body.decode("utf-8", "replace").strip()
    try:
        data = json.loads(text)
    except ValueError:
        return " ".join(text.split())[:500] or "(empty body)"
    error = data.get("error", data) if isinstance(data, dict) else data
    if isinstance(error, dict):
        return str(error.get("message") or error.get("detail") or error)[:500]
    return str(error)[:500]


def http_error(base_url: str, status: int, body: bytes) -> Gemma4T4Error:
    """A failed request as the user should see it: the server's own reason and the fix that matches it."""
    reason = server_reason(body)
    lowered = reason.lower()
    if status == 400 and any(k in lowered for k in ("context length", "max_model_len", "max_tokens",
                                                    "maximum context", "too long")):
        fix = "shorten the prompt or lower max_tokens: prompt + max_tokens must fit the server's max_model_len"
    elif status in (400, 422):
        fix = "change the request as the server's reason says (prompt, max_tokens, temperature)"
    elif status == 404:
        fix = "the server does not serve that model or path: check base_url (http://HOST:PORT) with server_status"
    elif status == 401:
        fix = "the server needs an API key: start it without one for local use, or query it through the CLI"
    else:
        fix = "the server failed while answering: read its log tail with server_status, restart it if it died"
    return Gemma4T4Error(f"{base_url} answered HTTP {status}: {reason}", fix=fix)


def served_model(base_url: str) -> str:
    """The first model a local server serves (clear error if it is unreachable or serves none)."""
    from gemma4_t4.bench.telemetry import check_reachable  # loads the bench package (~1 s): only when asked

    if base_url.startswith("sagemaker://"):
        raise Gemma4T4Error("a SageMaker endpoint cannot be asked which model it serves",
                            fix="pass model=<the endpoint's served model name>")
    return check_reachable(base_url).models[0]  # it refuses a server that serves none


def local_chat(base_url: str, prompt: str, max_tokens: int, temperature: float,
                model: str | None = None) -> QueryResult:
    """One non-streaming chat request to a local vLLM server (/v1/chat/completions)."""
    if model is None:
        model = served_model(base_url)
    payload = {"model": model, "messages": [{"role": "user", "content": prompt}],
               "max_tokens": max_tokens, "temperature": temperature}
    request = urllib.request.Request(base_url.rstrip("/") + "/v1/chat/completions",
                                     data=json.dumps(payload).encode(),
                                     headers={"Content-Type": "application/json"})
    start = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:  # the server answered: keep its reason
        raise http_error(base_url, exc.code, exc.read()) from None
    except (urllib.error.URLError, OSError) as exc:
        raise Gemma4T4Error(f"no answer from {base_url}: {exc}",
                            fix="check server_status; start one with start_vllm_server") from exc
    text, finish, usage = parse_chat_response(body)
    return QueryResult(target=base_url, text=text, latency_s=round(time.perf_counter() - start, 3),
                       finish_reason=finish, usage=usage)
