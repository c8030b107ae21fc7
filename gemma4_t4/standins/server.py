"""What the two HTTP stand-ins share: a handler that answers JSON and keeps quiet, and a threading
server on a free port of 127.0.0.1, served from a daemon thread and used as a context."""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation.jsonable import JSONObject


class StandInHandler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, *args: Any) -> None:  # quiet: requests are the test's business
        pass

    def answer(self, status: int, headers: dict[str, str], body: bytes | None = None) -> None:
        """The status and headers, then the body with its length (None: the caller streams the body)."""
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        if body is not None:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body is not None:
            self.wfile.write(body)

    def send_json(self, status: int, payload: JSONObject, headers: dict[str, str]) -> None:
        self.answer(status, headers, json.dumps(payload).encode())


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    standin: Any  # the StandInServer subclass whose handler answers

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client closing its kept-alive connection is normal (boto3 does at exit): not worth a traceback."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class StandInServer:
    """Serves ``handler`` on 127.0.0.1 (a free port) from ``start()`` to ``stop()``, or as a context."""

    handler: type[StandInHandler]
    thread_name = "stand-in"

    _server: _Server | None = None
    _thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        if not self._server:
            raise Gemma4T4Error(f"the {self.thread_name} is not started", fix="call start() or use it as a context")
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> Self:
        self._server = _Server(("127.0.0.1", 0), self.handler)
        self._server.standin = self
        self._thread = threading.Thread(target=self._server.serve_forever, name=self.thread_name, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
