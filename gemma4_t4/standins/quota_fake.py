"""A FAKE Service Quotas endpoint for offline runs (tests, CPU notebooks): moto lacks SageMaker's
Service Quotas, so this HTTP server answers ``ListServiceQuotas`` and ``GetServiceQuota`` (JSON 1.1)
with configured values per region (read from the SigV4 credential scope); boto3 reaches it through
``AWS_ENDPOINT_URL_SERVICE_QUOTAS``. Its quota codes (``L-FAKE…``) are made up: lookups go by name.
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, NotRequired, TypedDict

from gemma4_t4.foundation.jsonable import JSONObject

_SCOPE = re.compile(r"Credential=[^/]+/\d{8}/(?P<region>[a-z0-9-]+)/")


class QuotaCall(TypedDict):
    region: str
    target: str  # the X-Amz-Target operation


class ServiceQuota(TypedDict):
    """One quota as Service Quotas' ListServiceQuotas answers it (the fields the fake fills)."""

    ServiceCode: str
    ServiceName: str
    QuotaArn: NotRequired[str]
    QuotaCode: str
    QuotaName: str
    Value: float
    Unit: NotRequired[str]
    Adjustable: bool
    GlobalQuota: NotRequired[bool]


class FakeServiceQuotas:
    """``FakeServiceQuotas({"us-east-2": {"ml.g4dn.xlarge": 2}})`` -> http://127.0.0.1:PORT."""

    def __init__(self, quotas: dict[str, dict[str, float]] | None = None, host: str = "127.0.0.1",
                 port: int = 0):
        self.quotas: dict[str, dict[str, float]] = quotas or {}
        self.requests: list[QuotaCall] = []  # every call, for assertions
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer((host, port), self._handler())
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def _quota_list(self, region: str) -> list[ServiceQuota]:
        with self._lock:
            values = dict(self.quotas.get(region, {}))
        out: list[ServiceQuota] = []
        for i, (instance, value) in enumerate(sorted(values.items())):
            code = f"L-FAKE{i:04d}"
            out.append({
                "ServiceCode": "sagemaker", "ServiceName": "Amazon SageMaker",
                "QuotaArn": f"arn:aws:servicequotas:{region}:123456789012:sagemaker/{code}",
                "QuotaCode": code,
                "QuotaName": f"{instance} for endpoint usage", "Value": float(value), "Unit": "None",
                "Adjustable": True, "GlobalQuota": False})
        # a neighbour every real account has, so lookups must match by name
        out.append({"ServiceCode": "sagemaker", "ServiceName": "Amazon SageMaker", "QuotaCode": "L-FAKE9999",
                    "QuotaName": "ml.g4dn.xlarge for training job usage", "Value": 1.0, "Adjustable": True})
        return out

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

            def _reply(self, status: int, payload: JSONObject) -> None:
                body = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/x-amz-json-1.1")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:  # noqa: N802 - http.server naming
                length = int(self.headers.get("Content-Length") or 0)
                request = json.loads(self.rfile.read(length) or b"{}")
                target = (self.headers.get("X-Amz-Target") or "").split(".")[-1]
                match = _SCOPE.search(self.headers.get("Authorization") or "")
                region = match["region"] if match else "us-east-1"
                with fake._lock:
                    fake.requests.append({"region": region, "target": target})
                quotas = fake._quota_list(region) if request.get("ServiceCode") == "sagemaker" else []
                if target == "ListServiceQuotas":
                    start = int(request.get("NextToken") or 0)
                    size = int(request.get("MaxResults") or 100)
                    page = {"Quotas": quotas[start : start + size]}
                    if start + size < len(quotas):
                        page["NextToken"] = str(start + size)
                    self._reply(200, page)
                elif target == "GetServiceQuota":
                    hit = [q for q in quotas if q["QuotaCode"] == request.get("QuotaCode")]
                    if hit:
                        self._reply(200, {"Quota": hit[0]})
                    else:
                        self._reply(400, {"__type": "NoSuchResourceException", "message": "no such quota"})
                else:
                    self._reply(400, {"__type": "UnknownOperationException", "message": target})

        return Handler

    def start(self) -> FakeServiceQuotas:
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-service-quotas",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread:
            self._thread.join(timeout=5)

    def __enter__(self) -> FakeServiceQuotas:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
