"""A FAULT-INJECTING stand-in for the SageMaker runtime API, for the benchmark's fault tests.

The package's own stand-in (``gemma4_t4.standins.runtime_standin``, used with moto and the real
vLLM server wherever a healthy endpoint is enough) forwards faithfully; this one adds, per
endpoint name, the faults a real endpoint shows and that stand-in cannot: throttle the first N
invocations, answer ModelError, refuse streaming (ValidationError), or disappear after N
invocations (an endpoint deleted or dead mid-benchmark). Like the package's, it forwards the
body to an upstream server's ``/invocations`` (the bench fake server's copy of vLLM's route)
and frames a streamed reply as AWS event-stream ``PayloadPart`` messages with the package's
framing (``runtime_standin.payload_part``), splitting each chunk in two so SSE lines cross
message boundaries as on AWS. Select it with ``AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME``. Unknown
endpoint names get the runtime's ValidationError.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from fakes.fake_openai_server import AppInThread
from gemma4_t4.standins.runtime_standin import STREAM_CONTENT_TYPE, payload_part


@dataclass
class Endpoint:
    upstream: str
    throttle_first: int = 0
    model_error: tuple[int, str] | None = None  # (container status, message) for every invocation
    model_error_first: int = 0  # ... only for the first N (then healthy)
    no_stream: bool = False
    dies_after: int | None = None
    invocations: int = 0
    log: list[str] = field(default_factory=list)


def _error(status: int, code: str, message: str, **extra: object) -> web.Response:
    return web.json_response({"message": message, **extra}, status=status, headers={"x-amzn-ErrorType": code})


class FaultInjectingStandIn(AppInThread):
    """The fault-injecting stand-in on its own event loop in a thread; ``url`` goes in AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME."""

    thread_name = "sagemaker-fault-standin"

    def __init__(self, port: int, endpoints: dict[str, Endpoint]):
        super().__init__(port)
        self.endpoints = endpoints

    @property
    def url(self) -> str:
        return self.base_url

    def build(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/endpoints/{name}/invocations", self._invoke)
        app.router.add_post("/endpoints/{name}/invocations-response-stream", self._invoke)
        return app

    async def _invoke(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        streaming = request.path.endswith("-response-stream")
        ep = self.endpoints.get(name)
        if ep is None or (ep.dies_after is not None and ep.invocations >= ep.dies_after):
            return _error(400, "ValidationError", f"Endpoint {name} of account 123456789012 not found.")
        ep.invocations += 1
        ep.log.append("stream" if streaming else "invoke")
        if ep.invocations <= ep.throttle_first:
            return _error(400, "ThrottlingException", "Rate exceeded")
        if ep.model_error and (not ep.model_error_first or ep.invocations <= ep.model_error_first):
            status, message = ep.model_error
            return _error(
                424,
                "ModelError",
                f'Received client error ({status}) from primary with message "{message}"',
                OriginalStatusCode=status,
                OriginalMessage=message,
                LogStreamArn="arn:aws:logs:us-east-2:123456789012:log-group:/aws/sagemaker/Endpoints/x",
            )
        if streaming and ep.no_stream:
            return _error(
                400, "ValidationError", "The container of this endpoint does not support streaming responses."
            )
        body = await request.read()
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                ep.upstream.rstrip("/") + "/invocations",
                data=body,
                headers={"Content-Type": "application/json"},
            ) as upstream,
        ):
            if upstream.status != 200:
                text = await upstream.text()
                return _error(
                    424,
                    "ModelError",
                    f"Received client error ({upstream.status})",
                    OriginalStatusCode=upstream.status,
                    OriginalMessage=text[:500],
                )
            if not streaming:
                return web.Response(
                    body=await upstream.read(),
                    content_type="application/json",
                    headers={"x-Amzn-Invoked-Production-Variant": "AllTraffic"},
                )
            response = web.StreamResponse(
                headers={
                    "Content-Type": STREAM_CONTENT_TYPE,
                    "x-Amzn-Invoked-Production-Variant": "AllTraffic",
                    "X-Amzn-SageMaker-Content-Type": "text/event-stream",
                }
            )
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                # split every chunk in two: SSE lines cross PayloadPart boundaries, as on AWS
                half = max(1, len(chunk) // 2)
                for piece in (chunk[:half], chunk[half:]):
                    if piece:
                        await response.write(payload_part(piece))
            await response.write_eof()
            return response


def aws_env(monkeypatch, url: str) -> None:
    """Dummy credentials and the runtime endpoint override (boto3's per-service variable)."""
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": "us-east-2",
        "AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME": url,
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
