"""A STAND-IN between the package and moto that keeps long AWS waits waiting, for the signal tests.

moto reports a new endpoint InService and a CodeBuild build SUCCEEDED on the first look, so a
deploy or a build never sits in its wait long enough to be signalled there. This proxy forwards
every request to moto unchanged and rewrites only two answers: DescribeEndpoint says
``Creating`` and BatchGetBuilds says ``IN_PROGRESS`` (phase BUILD). It records each operation
it forwarded (``X-Amz-Target``) with its request body, so a test can wait for an observable
point (the build started, the endpoint polled) and check what the package called afterwards
(StopBuild). Select it per service with ``AWS_ENDPOINT_URL_SAGEMAKER`` / ``AWS_ENDPOINT_URL_CODEBUILD``.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class StallProxy:
    def __init__(self, upstream: str):
        self.upstream = urllib.parse.urlsplit(upstream)
        self.calls: list[tuple[str, dict]] = []  # (operation, request body)
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                target = self.headers.get("X-Amz-Target", "")
                operation = target.rsplit(".", 1)[-1]
                try:
                    request = json.loads(body or b"{}")
                except ValueError:
                    request = {}
                with proxy._lock:
                    proxy.calls.append((operation, request))
                conn = http.client.HTTPConnection(proxy.upstream.hostname, proxy.upstream.port, timeout=30)
                headers = {
                    k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")
                }
                conn.request("POST", self.path, body=body, headers=headers)
                response = conn.getresponse()
                answer = response.read()
                if response.status == 200:
                    answer = proxy.rewrite(operation, answer)
                self.send_response(response.status)
                for key, value in response.getheaders():
                    if key.lower() not in (
                        "content-length",
                        "transfer-encoding",
                        "connection",
                        "date",
                        "server",
                    ):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)
                conn.close()

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="stall-proxy", daemon=True)

    @staticmethod
    def rewrite(operation: str, answer: bytes) -> bytes:
        data = json.loads(answer or b"{}")
        if operation == "DescribeEndpoint":
            data["EndpointStatus"] = "Creating"
        elif operation == "BatchGetBuilds":
            for build in data.get("builds", []):
                build.update(buildStatus="IN_PROGRESS", currentPhase="BUILD", phases=[])
        else:
            return answer
        return json.dumps(data, default=str).encode()

    def operations(self) -> list[str]:
        with self._lock:
            return [op for op, _ in self.calls]

    def requests(self, operation: str) -> list[dict]:
        with self._lock:
            return [body for op, body in self.calls if op == operation]

    def wait_for(self, operation: str, timeout: float = 120.0) -> dict:
        """Block until the package has called ``operation``; returns its first request body."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.requests(operation)
            if found:
                return found[0]
            time.sleep(0.05)
        raise AssertionError(f"{operation} never called within {timeout} s; saw {self.operations()}")

    def __enter__(self) -> StallProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(10)
