"""Where requests go: an OpenAI-compatible HTTP server, or a SageMaker endpoint. As in guidellm, a
*backend* sends one request and returns its record (both the same :class:`RequestRecord`, from the
same SSE parser); ``client.closed_loop`` / ``client.open_loop`` decide when.

``sagemaker://REGION/ENDPOINT`` reaches the SageMaker runtime through boto3's normal endpoint
resolution (``AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME`` points it at a local stand-in), SigV4-signed
by boto3. The body is vLLM's SageMaker ``/invocations`` body (an OpenAI completions or chat
request); a streamed reply is the same SSE lines, split into ``PayloadPart`` byte chunks.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from functools import cached_property, partial
from typing import Any
from urllib.parse import urlsplit

from gemma4_t4.bench import telemetry
from gemma4_t4.bench.client import (
    RequestSpec,
    StreamParser,
    apply_usage,
    make_session,
    send_request,
)
from gemma4_t4.bench.prompts import HFTokenizer, ServerTokenizer, Tokenizer
from gemma4_t4.bench.registry import MAX_STREAMS
from gemma4_t4.bench.schemas import RequestRecord, ServerInfo
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation.jsonable import JSONObject
from gemma4_t4.foundation.launch_record import LaunchRecord

SAGEMAKER_SCHEME = "sagemaker://"
# the runtime's own faults before any output: nothing was generated for us, so a retry is safe
RETRYABLE = frozenset({
    "ThrottlingException", "ServiceUnavailable", "InternalFailure", "ModelNotReadyException",
    "InternalDependencyException",
})
RETRYABLE_MODEL_STATUS = frozenset({429, 503})


def parse_base_url(url: str) -> tuple[str, str, str]:
    """(kind, a, b): ("http", root URL, "") or ("sagemaker", region, endpoint). One-line errors."""
    if not url.strip():
        raise Gemma4T4Error("--base-url is empty", fix="pass e.g. --base-url http://127.0.0.1:8000")
    if any(c.isspace() for c in url):
        raise Gemma4T4Error(
            f"--base-url {url!r} contains a space",
            fix="remove the spaces, e.g. --base-url http://127.0.0.1:8000",
        )
    if url.startswith(SAGEMAKER_SCHEME):
        parts = url.removeprefix(SAGEMAKER_SCHEME).strip("/").split("/")
        if (
            len(parts) != 2
            or not re.fullmatch(r"[a-z]{2}(-[a-z]+)+-\d", parts[0])
            or not re.fullmatch(r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}", parts[1])
        ):
            raise Gemma4T4Error(
                f"--base-url {url!r} is not sagemaker://REGION/ENDPOINT",
                fix="use e.g. --base-url sagemaker://us-east-2/gemma4-e2b-t4",
            )
        return "sagemaker", parts[0], parts[1]
    split = urlsplit(url)
    if split.scheme not in ("http", "https") or not split.hostname:
        raise Gemma4T4Error(
            f"--base-url {url!r} is not an http(s) URL or sagemaker://REGION/ENDPOINT",
            fix="use e.g. --base-url http://127.0.0.1:8000 or sagemaker://us-east-2/ENDPOINT",
        )
    try:
        split.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise Gemma4T4Error(f"--base-url {url!r} has an invalid port", fix="use a port 1-65535") from None
    return "http", url.rstrip("/"), ""


def backend_for(url: str, api_key: str | None = None, request_timeout_s: float | None = None) -> Backend:
    kind, a, b = parse_base_url(url)
    if kind == "sagemaker":
        return SageMakerBackend(a, b, request_timeout_s=request_timeout_s)
    return OpenAIHTTPBackend(a, api_key=api_key, request_timeout_s=request_timeout_s)


# ---------------------------------------------------------------- OpenAI-compatible HTTP


@dataclass
class OpenAIHTTPBackend:
    url: str
    api_key: str | None = None
    request_timeout_s: float | None = None
    kind: str = "openai-http"

    def check(self, model: str | None) -> ServerInfo:
        return telemetry.check_reachable(self.url, model, self.api_key)

    def scrape(self) -> telemetry.MetricsSnapshot | None:
        return telemetry.scrape(self.url, self.api_key)

    def tokenizer(self, model: str, local: str | None) -> Tokenizer:
        return HFTokenizer(local) if local else ServerTokenizer(self.url, model, self.api_key)

    def environment(self, model: str, launch: LaunchRecord | None) -> JSONObject:
        """Client host, server version and config, GPUs: stored in every result."""
        server = {
            "base_url": self.url, "model": model, "version": telemetry.server_version(self.url, self.api_key),
            "cache_config": telemetry.cache_config(self.scrape()), "launch": launch,
        }
        return telemetry.environment_record(server, telemetry.gpu_inventory())

    def sampler(self) -> telemetry.MetricsSampler:
        return telemetry.MetricsSampler(self.url, self.api_key)

    @contextlib.asynccontextmanager
    async def sender(
        self, model: str, concurrency: int, keep_text: bool
    ) -> AsyncIterator[Callable[[RequestSpec], Any]]:
        async with make_session(concurrency, self.request_timeout_s) as session:
            # send(spec): send_request's remaining argument
            yield partial(send_request, session, self.url, model, api_key=self.api_key, keep_text=keep_text,
                          timeout_s=self.request_timeout_s)


# ---------------------------------------------------------------- SageMaker runtime


@dataclass
class SageMakerBackend:
    region: str
    endpoint: str
    request_timeout_s: float | None = None
    retries: int = 3
    backoff_s: float = 0.5
    stream: bool = True  # set False once the endpoint says it cannot stream
    kind: str = "sagemaker"

    @property
    def url(self) -> str:
        return f"{SAGEMAKER_SCHEME}{self.region}/{self.endpoint}"

    @cached_property
    def _runtime(self) -> Any:
        import boto3
        from botocore.config import Config

        # our loop owns retries (and records them); boto3 only signs and sends. The pool holds as
        # many connections as a run may have in flight; urllib3 opens them only as they are needed.
        config = Config(
            region_name=self.region, max_pool_connections=MAX_STREAMS, connect_timeout=10,
            read_timeout=self.request_timeout_s or 600, retries={"total_max_attempts": 1},
        )
        return boto3.client("sagemaker-runtime", config=config)

    def check(self, model: str | None) -> ServerInfo:
        """One tiny non-streamed completion: the endpoint exists, answers, and serves ``model``."""
        spec = RequestSpec("probe", "Reply with one word: are you ready?", 1, ignore_eos=False)
        record = self._invoke(spec, model or "", keep_text=False, stream=False)
        if record.error:
            detail = record.error_detail or record.error
            if record.error in _FIXES:  # the endpoint was not reached: each of these has its fix
                raise Gemma4T4Error(
                    f"cannot reach the SageMaker endpoint {self.url}: {detail}", fix=_FIXES[record.error]
                )
            if "does not exist" in detail and model:
                raise Gemma4T4Error(
                    f"the endpoint {self.endpoint} does not serve {model!r}: {detail}",
                    fix="pass --model with the endpoint's served model name",
                )
            raise Gemma4T4Error(
                f"the SageMaker endpoint {self.url} failed a 1-token probe: {detail}",
                fix="check the endpoint's logs (gemma4-t4 sagemaker logs)",
            )
        return ServerInfo(models=[model], backend=self.kind)

    def scrape(self) -> telemetry.MetricsSnapshot | None:
        return None  # an endpoint exposes no /metrics

    def sampler(self) -> None:
        return None

    def tokenizer(self, model: str, local: str | None) -> Tokenizer:
        if not local:
            raise Gemma4T4Error(
                "a SageMaker endpoint has no /tokenize, so prompts of exact length need a local tokenizer",
                fix="pass --tokenizer PATH (the model's folder or a copy of its tokenizer files)",
            )
        return HFTokenizer(local)

    def environment(self, model: str, launch: LaunchRecord | None) -> JSONObject:
        server = {"backend": self.kind, "region": self.region, "endpoint": self.endpoint,
                                         "model": model, "launch": launch}
        return telemetry.environment_record(server, [])  # the endpoint's GPUs are not this host's

    @contextlib.asynccontextmanager
    async def sender(
        self, model: str, concurrency: int, keep_text: bool
    ) -> AsyncIterator[Callable[[RequestSpec], Any]]:
        # boto3 is blocking: one thread per request in flight, sharing one client made here first
        self._runtime  # noqa: B018
        pool = concurrent.futures.ThreadPoolExecutor(max(1, concurrency), thread_name_prefix="sagemaker")
        loop = asyncio.get_running_loop()
        try:
            yield lambda spec: loop.run_in_executor(pool, self._invoke, spec, model, keep_text)
        finally:
            pool.shutdown(wait=False, cancel_futures=True)  # finalise first; threads end on their own

    def _invoke(self, spec: RequestSpec, model: str, keep_text: bool, stream: bool | None = None) -> RequestRecord:
        """One request; retries what is safe to retry; never raises for endpoint or network faults."""
        stream = self.stream if stream is None else stream
        attempt = 0
        while True:
            attempt += 1
            record = self._attempt(spec, model, keep_text, stream)
            record.attempts = attempt
            if record.error == "stream_unsupported" and stream:
                self.stream = stream = False  # the endpoint said so: every later request is non-streamed
                continue
            retryable = (record.error or "").startswith("retryable:")
            if not retryable or attempt > self.retries:
                record.error = record.error and record.error.removeprefix("retryable:")
                return record
            time.sleep(self.backoff_s * 2 ** (attempt - 1))

    def _attempt(self, spec: RequestSpec, model: str, keep_text: bool, stream: bool) -> RequestRecord:
        from botocore.exceptions import BotoCoreError, ClientError

        clock = time.perf_counter
        client = self._runtime
        # a non-streamed reply is asked for as one JSON body
        invoke = (
            client.invoke_endpoint_with_response_stream
            if stream
            else partial(client.invoke_endpoint, Accept="application/json")
        )
        body = json.dumps(spec.payload(model, stream=stream))
        parser = StreamParser(spec, clock())
        record = parser.record
        try:
            response = invoke(EndpointName=self.endpoint, Body=body, ContentType="application/json")
            record.http_status = _http_status(response)
            if stream:
                buffer = b""
                for event in response["Body"]:
                    part = event.get("PayloadPart")
                    if not part:
                        continue
                    now = clock()
                    buffer += part.get("Bytes") or b""
                    *lines, buffer = buffer.split(b"\n")
                    if not all(parser.feed(line, now) for line in lines):
                        break
                if buffer and not parser.done and record.error is None:
                    parser.feed(buffer, clock())
            else:
                _read_whole(parser, response["Body"].read(), clock())
        except Exception as exc:  # noqa: BLE001 - every fault becomes a counted, classified failure
            name = type(exc).__name__
            if isinstance(exc, ClientError):
                record.error, detail = _client_error(record, exc)
            elif isinstance(exc, BotoCoreError):  # named as the HTTP client names the same fault
                record.error, detail = _BOTOCORE_CLASSES.get(name) or _snake(name), f"{name}: {exc}"
            else:
                record.error, detail = name, f"{name}: {exc}"
            record.error_detail = detail[:300]
        record.streamed = stream
        if record.error:
            record.end_s = clock()
            return parser.flush()
        return parser.finish(keep_text, clock())


_FIXES = {
    "no_credentials": "configure AWS credentials (aws configure, or AWS_PROFILE / AWS_ACCESS_KEY_ID)",
    "endpoint_not_found": "check the region and endpoint name (gemma4-t4 sagemaker status)",
    "connect_error": "check the region, your network, and AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME if set",
    "timeout": "raise --request-timeout, or check the endpoint's logs",
}


def _http_status(response: dict) -> int | None:
    return (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")


def _read_whole(parser: StreamParser, payload: bytes, now: float) -> None:
    """A non-streamed completion: one JSON body. No TTFT exists; E2EL and the answer do."""
    record = parser.record
    record.first_byte_s = now
    try:
        data = json.loads(payload)
        choice = (data.get("choices") or [{}])[0]
    except (ValueError, AttributeError, IndexError):
        record.error, record.error_detail = "malformed_response", payload[:200].decode("utf-8", "replace")
        return
    text = choice.get("text")
    if text is None:
        text = (choice.get("message") or {}).get("content")
    record.first_chunk_s = record.first_token_s = record.last_choice_s = now
    record.chunk_times_s = [now]
    if text:
        parser.texts.append(text)
    record.finish_reason = choice.get("finish_reason")
    if data.get("usage"):
        apply_usage(record, data["usage"])


def _client_error(record: RequestRecord, exc: Exception) -> tuple[str, str]:
    """The error class and detail of a botocore ClientError; sets the record's HTTP status."""
    response = getattr(exc, "response", None) or {}
    error = response.get("Error") or {}
    code, message = str(error.get("Code") or type(exc).__name__), str(error.get("Message") or exc)
    record.http_status = _http_status(response)
    lowered = message.lower()
    if code == "ModelError":
        original = response.get("OriginalStatusCode")
        record.http_status = original or record.http_status
        detail = f"ModelError (container status {original}): {response.get('OriginalMessage') or message}"
        return ("retryable:" if original in RETRYABLE_MODEL_STATUS else "") + "model_error", detail
    if code in RETRYABLE:
        return f"retryable:{_snake(code)}", f"{code}: {message}"
    if code == "ValidationError" and "stream" in lowered and "support" in lowered:
        return "stream_unsupported", message
    if code == "ValidationError" and "not found" in lowered:
        return "endpoint_not_found", message
    # ModelStreamError, InternalStreamFailure, ...: the code names it
    return _snake(code), f"{code}: {message}"


# botocore's exceptions -> the error classes the HTTP client records too
_BOTOCORE_CLASSES = {
    "NoCredentialsError": "no_credentials", "PartialCredentialsError": "no_credentials",
    "ReadTimeoutError": "timeout", "ConnectTimeoutError": "timeout", "EndpointConnectionError": "connect_error",
    "ConnectionClosedError": "disconnected", "ResponseStreamingError": "disconnected",
    "IncompleteReadError": "disconnected",
}  # fmt: skip


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name.removesuffix("Exception")).lower()


# where requests go (``backend_for`` chooses by the URL): both take the same calls
Backend = OpenAIHTTPBackend | SageMakerBackend
