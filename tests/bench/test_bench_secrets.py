"""No secret in any bench result: a server that echoes what it was sent (the Authorization header, a
token from the environment) in its error bodies leaves none of it in records.jsonl, summary.json,
run.json, the --json output or an error message; the key can come from an environment variable,
out of the process list."""

from __future__ import annotations

import http.server
import json
import threading
from contextlib import contextmanager
from pathlib import Path

from fakes.bench_cli_args import bench_run_argv

from gemma4_t4.bench.args import API_KEY_ENV
from gemma4_t4.cli import main as cli_main

KEY = "K-4f9a1c"  # short and plain: no token pattern knows it, only the value itself hides it
HF = "abc123"  # a 6-character HF_TOKEN
AWS_ID = "AKIAABCDEFGHIJKLMNOP"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"


class _Echo(http.server.BaseHTTPRequestHandler):
    """Lists one model; fails every completion with HTTP 500, echoing the header and the tokens."""

    seen: list[str] = []

    def _reply(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):  # noqa: N802 - http.server's name
        if self.path == "/v1/models":
            self._reply(200, {"object": "list", "data": [{"id": "m", "max_model_len": 4096}]})
        else:
            self._reply(404, {"error": "no such route"})

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        header = self.headers.get("Authorization") or ""
        self.seen.append(header)
        key = header.removeprefix("Bearer ")
        message = f"got key {key} in header {header}; HF_TOKEN {HF}; aws {AWS_ID} {AWS_SECRET}"
        self._reply(500, {"error": {"message": message, "headers": {"authorization": header}}})

    def log_message(self, *args):
        pass


@contextmanager
def _echo_server():
    _Echo.seen = []
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_port}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def _leaks(text: str) -> list[str]:
    return [s for s in (KEY, HF, AWS_ID, AWS_SECRET, f"Bearer {KEY}") if s in text]


def _bench(base_url: str, out: Path, *flags: str) -> int:
    argv = bench_run_argv(base_url, "m", "answers", "--output-len", "4", "--warmup", "0", "--no-plots",
                          "--out", str(out), "--json", *flags)  # fmt: skip
    return cli_main(argv)


def test_a_server_echoing_the_key_leaves_it_nowhere(tmp_path, capsys, monkeypatch):
    """`HTTP 500 {"error": {"message": "got key K in header Bearer K"}}` once put the key in
    records.jsonl, summary.json (error_detail) and the --json output (error_examples)."""
    monkeypatch.setenv("HF_TOKEN", HF)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", AWS_SECRET)
    with _echo_server() as url:
        code = _bench(url, tmp_path / "r", "--api-key", KEY, "--label", f"run with {KEY}")
    out, err = capsys.readouterr()
    assert code == 1 and set(_Echo.seen) == {f"Bearer {KEY}"}  # the server got the key, and failed
    stored = {p.name: p.read_text() for p in (tmp_path / "r").iterdir()}
    assert {"records.jsonl", "summary.json", "run.json"} <= set(stored)
    assert {name: _leaks(text) for name, text in stored.items() if _leaks(text)} == {}
    assert _leaks(out + err) == []
    examples = json.loads(out)["cells"][0]["error_examples"]
    assert examples["http_500"].startswith('{"error": {"message": "got key *** in header Bearer ***')


def test_the_key_can_come_from_the_environment_out_of_the_process_list(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, KEY)
    with _echo_server() as url:
        code = _bench(url, tmp_path / "r")
    out, err = capsys.readouterr()
    assert code == 1 and set(_Echo.seen) == {f"Bearer {KEY}"}
    assert json.loads(out)["run"]["config"]["api_key_used"] is True
    stored = "".join(p.read_text() for p in (tmp_path / "r").iterdir())
    assert KEY not in stored + out + err
