"""A FAKE Service Quotas endpoint for offline runs (tests, CPU notebooks): moto lacks SageMaker's
Service Quotas, so this HTTP server answers ``ListServiceQuotas`` (JSON 1.1), the one call the package makes,
with configured values per region (read from the SigV4 credential scope); boto3 reaches it through
``AWS_ENDPOINT_URL_SERVICE_QUOTAS``. Its quota codes (``L-FAKE…``) are made up: lookups go by name.
"""

from __future__ import annotations

import json
import re

from gemma4_t4.foundation.jsonable import JSONObject
from gemma4_t4.standins.server import StandInHandler, StandInServer

_SCOPE = re.compile(r"Credential=[^/]+/\d{8}/(?P<region>[a-z0-9-]+)/")
_JSON = {"Content-Type": "application/x-amz-json-1.1"}


class _Handler(StandInHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server naming
        length = int(self.headers.get("Content-Length") or 0)
        request = json.loads(self.rfile.read(length) or b"{}")
        target = (self.headers.get("X-Amz-Target") or "").split(".")[-1]
        match = _SCOPE.search(self.headers.get("Authorization") or "")
        region = match["region"] if match else "us-east-1"
        quotas = self.server.standin.quota_list(region) if request.get("ServiceCode") == "sagemaker" else []
        if target == "ListServiceQuotas":  # one page: a region holds a handful of quotas, far below its 100
            self.send_json(200, {"Quotas": quotas}, _JSON)
        else:
            self.send_json(400, {"__type": "UnknownOperationException", "message": target}, _JSON)


class FakeServiceQuotas(StandInServer):
    """``FakeServiceQuotas({"us-east-2": {"ml.g4dn.xlarge": 2}}).start()`` -> http://127.0.0.1:PORT."""

    handler = _Handler
    thread_name = "fake-service-quotas"

    def __init__(self, quotas: dict[str, dict[str, float]]):
        self.quotas = quotas  # changed between calls, never during one

    def quota_list(self, region: str) -> list[JSONObject]:
        """The region's quotas as ListServiceQuotas answers them (the fields the fake fills)."""
        out: list[JSONObject] = []
        for i, (instance, value) in enumerate(sorted(self.quotas.get(region, {}).items())):
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
