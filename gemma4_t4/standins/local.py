"""Offline AWS for tests and ``TARGET=cpu`` notebooks: a local moto server plus the FAKE Service
Quotas server, with the environment pointed at both and dummy credentials, so no call reaches AWS.

    with LocalAWS() as aws:
        deploy(DeployConfig(...))           # talks to moto
        aws.queue_chat_replies([...])       # what the "endpoint" will answer (canned), or
    with LocalAWS(runtime_backend="http://127.0.0.1:8000") as aws:
        invoke(...)                         # the runtime STAND-IN forwards to a real vLLM server

Stand-ins, named as such, for what moto cannot do: its CodeBuild runs no build, so
``seed_fixed_image`` puts the manifest ``build-image`` would have pushed into moto's ECR (at start
and after every reset); its runtime answers canned bodies and no streams, so ``runtime_backend``
starts :class:`~gemma4_t4.standins.runtime_standin.RuntimeStandIn` in front of a real vLLM server.
"""

from __future__ import annotations

import json
import logging
import os
import time
import urllib.request
from typing import Any

from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation.jsonable import JSONObject
from gemma4_t4.sagemaker.aws import client_factory
from gemma4_t4.sagemaker.config import ROLE_ENV
from gemma4_t4.sagemaker.image import T4_IMAGE_REPOSITORY, fixed_image_tag, t4_image_uri
from gemma4_t4.standins.quota_fake import FakeServiceQuotas
from gemma4_t4.standins.runtime_standin import RuntimeStandIn

FAKE_ROLE_ARN = "arn:aws:iam::123456789012:role/gemma4-t4-local-fake"
DEFAULT_QUOTAS: dict[str, dict[str, float]] = {
    "us-east-1": {"ml.g4dn.xlarge": 0, "ml.g6.xlarge": 0},
    "us-east-2": {"ml.g4dn.xlarge": 2, "ml.g6.xlarge": 1},
    "us-west-2": {"ml.g4dn.xlarge": 1, "ml.g6.xlarge": 0},
    "us-west-1": {"ml.g4dn.xlarge": 0, "ml.g6.xlarge": 0},
}
# Credentials env() does not set: dropped while started, so no real session or profile is mixed in.
_OTHER_CREDENTIAL_ENV = ("AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_PROFILE")


class LocalAWS:
    """Start moto + the quota fake on 127.0.0.1 (free ports) and point boto3 at them."""

    region = "us-east-2"

    def __init__(self, seed_fixed_image: bool = True, runtime_backend: str | None = None):
        self.seed_image = seed_fixed_image
        self.runtime_backend = runtime_backend
        self.runtime: Any = None
        self.moto: Any = None
        self.quota_fake: FakeServiceQuotas | None = None
        self.endpoint_url = ""
        self._saved_env: dict[str, str | None] = {}

    def env(self) -> dict[str, str]:
        """The variables that route boto3 here (for subprocesses such as the MCP server)."""
        if not self.quota_fake:
            raise Gemma4T4Error("LocalAWS is not started", fix="use it as a context manager or call start()")
        routes = {"AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME": self.runtime.url} if self.runtime else {}
        return {
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_ENDPOINT_URL_SERVICE_QUOTAS": self.quota_fake.url,
            **routes,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": self.region,
            "AWS_REGION": self.region,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,  # never fall back to a real profile
            "AWS_CONFIG_FILE": os.devnull,
            ROLE_ENV: FAKE_ROLE_ARN,
        }

    def start(self) -> LocalAWS:
        try:
            from moto.server import ThreadedMotoServer
        except ImportError as exc:
            raise Gemma4T4Error("moto is not installed", fix="pip install 'moto[server]'") from exc
        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        self.moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.moto.start()
        host, port = self.moto.get_host_and_port()
        self.endpoint_url = f"http://{host}:{port}"
        self.quota_fake = FakeServiceQuotas({r: dict(v) for r, v in DEFAULT_QUOTAS.items()}).start()
        if self.runtime_backend:
            self.runtime = RuntimeStandIn(self.runtime_backend, control_plane_url=self.endpoint_url,
                                          region=self.region).start()
        for key, value in self.env().items():
            self._saved_env[key] = os.environ.get(key)
            os.environ[key] = value
        for key in _OTHER_CREDENTIAL_ENV:
            self._saved_env[key] = os.environ.pop(key, None)
        if self.seed_image:
            self.seed_fixed_image()
        return self

    def stop(self) -> None:
        for key, value in self._saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._saved_env.clear()
        for server in (self.runtime, self.quota_fake, self.moto):
            if server:
                server.stop()
        self.runtime = self.quota_fake = self.moto = None

    def __enter__(self) -> LocalAWS:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def seed_fixed_image(self, region: str | None = None, tag: str | None = None) -> str:
        """STAND-IN for a finished ``build-image`` run: put the image manifest its ``docker push`` would
        have written into moto's ECR (``build_t4_image``'s ``on_build_succeeded`` hook). Returns the image URI."""
        region = region or self.region
        tag = tag or fixed_image_tag()
        ecr = client_factory()("ecr", region)  # moto's, through the environment start() set
        try:
            ecr.create_repository(repositoryName=T4_IMAGE_REPOSITORY)
        except ecr.exceptions.RepositoryAlreadyExistsException:
            pass
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
            "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "size": 2,
                       "digest": "sha256:" + "0" * 64},
            "layers": [],
            "annotations": {"stand-in": "gemma4_t4.standins.local.seed_fixed_image"},
        }
        try:
            ecr.put_image(repositoryName=T4_IMAGE_REPOSITORY, imageManifest=json.dumps(manifest),
                          imageTag=tag)
        except ecr.exceptions.ImageAlreadyExistsException:
            pass
        return t4_image_uri("123456789012", region, tag)

    def queue_chat_replies(self, texts: list[str]) -> None:
        """The next endpoint invocations (any endpoint) answer OpenAI chat-completion bodies, as the vLLM
        container returns them, whose assistant message is each text, in order (moto keys answers by
        request body: repeating an identical request returns the same answer)."""
        results = [{"Body": json.dumps(_chat_completion(text)), "ContentType": "application/json"} for text in texts]
        payload = {"account_id": "123456789012", "region": self.region, "results": results}
        request = urllib.request.Request(self.endpoint_url + "/moto-api/static/sagemaker/endpoint-results",
                                         data=json.dumps(payload).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()


def _chat_completion(text: str) -> JSONObject:
    words = max(1, len(text.split()))
    return {
        "id": "chatcmpl-local", "object": "chat.completion", "created": int(time.time()), "model": "gemma-4-E2B-it",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 12, "completion_tokens": words, "total_tokens": 12 + words},
    }
