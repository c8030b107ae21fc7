"""A local STAND-IN for the SageMaker runtime API, so endpoint invocations get real replies offline.

moto answers ``InvokeEndpoint`` with canned bodies and lacks ``InvokeEndpointWithResponseStream``.
This HTTP server on 127.0.0.1 accepts both as botocore sends them, forwards the body to a real vLLM
server's ``/invocations`` (the AWS vLLM container's route) and frames a streamed reply as AWS
event-stream ``PayloadPart`` messages, one HTTP/1.1 chunk each, flushed as the container produces it,
so TTFT and TPOT through it are the backend's. Point boto3 at it with
``AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME``. Not SageMaker: no SigV4 check, no size or timeout limits;
with ``control_plane_url`` it refuses endpoints moto does not report InService, as the runtime does.
"""

from __future__ import annotations

import binascii
import http.client
import json
import re
import struct
import time
import urllib.parse
from collections import deque
from typing import Any

from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.standins.server import StandInHandler, StandInServer

STREAM_CONTENT_TYPE = "application/vnd.amazon.eventstream"
BACKEND_TIMEOUT_S = 600.0  # a long generation on a CPU backend still answers
_STRING = 7  # event-stream header value type: string
_VARIANT = {"x-Amzn-Invoked-Production-Variant": "AllTraffic"}  # the one variant a deploy makes


def _header(name: str, value: str) -> bytes:
    raw_name, raw_value = name.encode(), value.encode()
    return (struct.pack("!B", len(raw_name)) + raw_name
            + struct.pack("!BH", _STRING, len(raw_value)) + raw_value)


def event_message(headers: dict[str, str], payload: bytes) -> bytes:
    """One AWS event-stream message: prelude (lengths + CRC), headers, payload, message CRC."""
    encoded = b"".join(_header(k, v) for k, v in headers.items())
    total = 12 + len(encoded) + len(payload) + 4
    prelude = struct.pack("!II", total, len(encoded))
    prelude += struct.pack("!I", binascii.crc32(prelude) & 0xFFFFFFFF)
    body = prelude + encoded + payload
    return body + struct.pack("!I", binascii.crc32(body) & 0xFFFFFFFF)


def payload_part(data: bytes) -> bytes:
    return event_message(
        {":event-type": "PayloadPart", ":content-type": "application/octet-stream", ":message-type": "event"},
        data)


def model_stream_error(message: str) -> bytes:
    """An in-stream error event (the runtime's ModelStreamError)."""
    return event_message(
        {":exception-type": "ModelStreamError", ":content-type": "application/json", ":message-type": "exception"},
        json.dumps({"Message": message, "ErrorCode": "ModelStreamError"}).encode(),
    )


class _Handler(StandInHandler):
    # HTTP/1.1 chunked, as the real runtime answers: over HTTP/1.0 without a length botocore reads
    # 64 KiB blocks and every event of a short reply arrives at once (TTFT and TPOT meaningless).
    protocol_version = "HTTP/1.1"
    # and no Nagle: an event written before the headers' segment is acknowledged would wait for the
    # client's delayed ACK (up to 40 ms on Linux), added to TTFT
    disable_nagle_algorithm = True

    def _error(self, status: int, code: str, message: str, **extra: Any) -> None:
        self.send_json(status, {"message": message, **extra},
                       {"x-amzn-ErrorType": code, "Content-Type": "application/json"})

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        # read the body first, whatever the answer: on a kept-alive connection an unread body
        # would be taken for the next request
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        route = re.fullmatch(r"/?endpoints/([^/]+)/(invocations(-response-stream)?)/?",
                             urllib.parse.urlparse(self.path).path)
        if not route:
            self._error(404, "UnknownOperationException", f"no such runtime operation: {self.path}")
            return
        name = urllib.parse.unquote(route[1])
        problem = self.server.standin.endpoint_problem(name)
        if problem:
            self._error(400, "ValidationError", problem)
            return
        backend = self.server.standin.backend
        content_type = self.headers.get("Content-Type", "application/json")
        conn = self._backend()
        try:
            try:
                response = _forward(conn, backend, body, content_type)
            except (OSError, http.client.HTTPException):  # a kept-alive connection the backend closed
                conn.close()
                response = _forward(conn, backend, body, content_type)
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            self._error(424, "ModelError", f"the model container did not answer: {exc}", OriginalStatusCode=0)
            return
        try:
            if response.status >= 400:  # SageMaker wraps a container error in ModelError (HTTP 424), keeping it
                original = response.read().decode(errors="replace")[:2000]
                said = (f"Received client error from primary: {original}" if route[3]
                        else f'Received client error from primary with message "{original}"')
                self._error(424, "ModelError", said, OriginalStatusCode=response.status, OriginalMessage=original)
            elif not route[3]:  # not the streaming operation
                self.answer(200, {"Content-Type": response.getheader("Content-Type", "application/json"), **_VARIANT},
                            response.read())
            else:
                self._stream(response)
        finally:
            if not response.isclosed():  # not read to its end: the connection cannot carry another
                conn.close()

    def _backend(self) -> http.client.HTTPConnection:
        """One kept-alive connection to the backend for this client connection (as an HTTP client
        keeps one to vLLM): a new TCP connection per request would add to every TTFT."""
        if not hasattr(self, "_conn"):
            url = urllib.parse.urlparse(self.server.standin.backend)
            self._conn = http.client.HTTPConnection(url.hostname, url.port or 80, timeout=BACKEND_TIMEOUT_S)
        return self._conn

    def finish(self) -> None:
        if hasattr(self, "_conn"):
            self._conn.close()
        super().finish()

    def _stream(self, response: http.client.HTTPResponse) -> None:
        self.answer(200, {"Content-Type": STREAM_CONTENT_TYPE,
                          "X-Amzn-SageMaker-Content-Type": response.getheader("Content-Type", "text/event-stream"),
                          **_VARIANT, "Transfer-Encoding": "chunked"})
        try:
            # read1: whatever the container has sent so far (one SSE event or a few), never
            # waiting to fill a block, so each event is framed and flushed as it is produced
            while chunk := response.read1(65536):
                self._send_chunk(payload_part(chunk))
                self.server.standin.part_times.append(time.perf_counter())
        except OSError as exc:  # the backend died mid-stream: tell the client in-band, as SageMaker does
            try:
                self._send_chunk(model_stream_error(f"the model container stopped streaming: {exc}"))
            except OSError:  # the client is gone too: nobody left to tell
                self.close_connection = True
                return
        self.wfile.write(b"0\r\n\r\n")  # the last chunk: the stream ends, the connection stays
        self.wfile.flush()

    def _send_chunk(self, data: bytes) -> None:
        """One HTTP/1.1 chunk, written and flushed at once."""
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()


def _forward(conn: http.client.HTTPConnection, backend: str, body: bytes,
             content_type: str) -> http.client.HTTPResponse:
    path = urllib.parse.urlparse(backend).path.rstrip("/") + "/invocations"
    conn.request("POST", path, body=body, headers={"Content-Type": content_type, "Accept": "*/*"})
    return conn.getresponse()


class RuntimeStandIn(StandInServer):
    """STAND-IN SageMaker runtime on 127.0.0.1 in front of a real vLLM server: ``backend``, the base URL
    every endpoint's invocations go to."""

    handler = _Handler
    thread_name = "runtime stand-in"

    def __init__(self, backend: str, *, control_plane_url: str | None = None, region: str = "us-east-2"):
        if urllib.parse.urlparse(backend).scheme != "http":
            raise Gemma4T4Error(f"backend {backend!r} is not an http:// URL of a vLLM server",
                                fix="pass the server's base URL, e.g. http://127.0.0.1:8000")
        self.backend = backend
        self.control_plane_url = control_plane_url
        self.region = region
        # when each PayloadPart left (perf_counter, the clock the fake server logs its writes with):
        # what the timing-fidelity test holds against the backend's own write times
        self.part_times: deque[float] = deque(maxlen=100_000)
        self._sagemaker: Any = None

    @property
    def parts_sent(self) -> int:
        """PayloadParts sent (the last 100,000 counted)."""
        return len(self.part_times)

    def endpoint_problem(self, name: str) -> str | None:
        """Like the real runtime: an endpoint that is missing or not InService is refused (without a
        control plane to ask, every name is served)."""
        if not self.control_plane_url:
            return None
        if self._sagemaker is None:
            import boto3

            self._sagemaker = boto3.client(
                "sagemaker", region_name=self.region, endpoint_url=self.control_plane_url,
                aws_access_key_id="testing", aws_secret_access_key="testing")
        try:
            status = self._sagemaker.describe_endpoint(EndpointName=name).get("EndpointStatus")
        except Exception:  # noqa: BLE001 - any lookup failure reads as "not found", as on AWS
            return f"Endpoint {name} of account 123456789012 not found."
        return None if status == "InService" else f"Endpoint {name} is {status}, not InService."
