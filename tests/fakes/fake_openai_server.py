"""A FAKE OpenAI-compatible streaming server with injected timings, for testing the client.

It generates nothing: each response is a scripted stream (:class:`FakeScript`, per request as
``"fake"`` in the body, or the server's default). It logs when it wrote each chunk (``perf_counter``,
the client's clock on Linux; ``GET /fake/log``), so a test compares what the client measured with
what the server did. It also answers ``/invocations``, ``/health``, ``/v1/models``, ``/metrics``,
``/tokenize`` and ``/detokenize`` (one token per character), so the whole benchmark runs against it.
Standalone: ``python tests/fakes/fake_openai_server.py --port N``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import TypedDict

from aiohttp import web

from gemma4_t4.bench.schemas import RawJSON


class WriteLog(TypedDict):
    """What the fake wrote for one request, and when (perf_counter seconds; GET /fake/log)."""

    received_s: float
    writes_s: list[float]
    role_s: float | None
    tokens: int
    id: str | None  # the request's fake_id


class ChatDelta(TypedDict, total=False):
    role: str
    content: str | None


@dataclass
class FakeScript:
    """How one fake response behaves. Times in seconds."""

    ttft_s: float = 0.05
    gap_s: float = 0.01
    tokens: int | None = None  # default: the request's max_tokens
    tokens_per_chunk: int = 1
    role_chunk: bool = True  # chat only: vLLM's role-only first delta
    role_chunk_delay_s: float = 0.0
    usage: bool = True
    usage_fields: RawJSON | None = None  # merged into the usage sent (a bogus count: {"completion_tokens": NaN})
    malformed_after_chunks: int | None = None
    http_status: int = 200
    prompt_tokens: int | None = None  # default: prompt length in characters
    hang_s: float = 0.0  # accept the request, then say nothing for this long (a hung server)
    flush: bool = False  # generate, then send every chunk in one write (as vLLM's CPU build at times does)


@dataclass
class FakeServerState:
    default: FakeScript = field(default_factory=FakeScript)
    exit_after_requests: int | None = None  # os._exit when this many requests have started
    requests: int = 0
    log: list[WriteLog] = field(default_factory=list)  # what the fake wrote when (GET /fake/log)
    queries: int = 0
    hits: int = 0
    # lock step: when set, every token chunk after the first waits for one release (30 s at most),
    # so a test can prove each chunk reached it before the next existed (no buffering in between)
    lockstep: threading.Semaphore | None = None


STATE_KEY = web.AppKey("state", FakeServerState)
MODEL_KEY = web.AppKey("model", str)


def _script_for(state: FakeServerState, body: RawJSON) -> FakeScript:
    overrides = body.get("fake") or {}
    return FakeScript(**(asdict(state.default) | overrides))


def _chunk(chat: bool, text: str | None, finish: str | None, role: bool = False) -> bytes:
    if chat:
        delta: ChatDelta = {"role": "assistant", "content": ""} if role else {"content": text}
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        obj = {"id": "fake", "object": "chat.completion.chunk", "choices": [choice]}
    else:
        choices = [{"index": 0, "text": text, "finish_reason": finish}]
        obj = {"id": "fake", "object": "text_completion", "choices": choices}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _usage(prompt_tokens: int, n_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": n_tokens, "total_tokens": prompt_tokens + n_tokens}


async def _whole_completion(script: FakeScript, entry: WriteLog, chat: bool, prompt_tokens: int,
                            n_tokens: int) -> web.Response:
    """The completion in one body after the time its tokens would have streamed."""
    await asyncio.sleep(script.ttft_s + script.gap_s * max(0, n_tokens - 1))
    text = "ab" * n_tokens
    choice = {"index": 0, "finish_reason": "length"} | (
        {"message": {"role": "assistant", "content": text}} if chat else {"text": text}
    )
    entry["writes_s"].append(time.perf_counter())
    return web.json_response({"id": "fake", "choices": [choice], "usage": _usage(prompt_tokens, n_tokens)})


async def _stream(request: web.Request, chat: bool) -> web.StreamResponse:
    state: FakeServerState = request.app[STATE_KEY]
    received = time.perf_counter()
    body = await request.json()
    state.requests += 1
    if state.exit_after_requests is not None and state.requests > state.exit_after_requests:
        os._exit(3)  # simulate a crash: no response, connections reset
    script = _script_for(state, body)
    if script.hang_s:
        await asyncio.sleep(script.hang_s)
    if script.http_status != 200:
        return web.json_response({"error": {"message": "fake failure"}}, status=script.http_status)
    messages = "".join(m.get("content", "") for m in body.get("messages", []))
    prompt = messages if chat else body.get("prompt")
    prompt_tokens = script.prompt_tokens if script.prompt_tokens is not None else len(prompt or "")
    n_tokens = script.tokens if script.tokens is not None else int(body.get("max_tokens") or 16)
    state.queries += prompt_tokens
    entry: WriteLog = {
        "received_s": received, "writes_s": [], "role_s": None, "tokens": n_tokens, "id": body.get("fake_id")
    }
    state.log.append(entry)
    if body.get("stream") is False:  # a whole completion, as SageMaker's non-streamed invoke gets it
        return await _whole_completion(script, entry, chat, prompt_tokens, n_tokens)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    if chat and script.role_chunk:
        await asyncio.sleep(script.role_chunk_delay_s)
        await response.write(_chunk(chat, None, None, role=True))
        entry["role_s"] = time.perf_counter()
    sent = chunk_index = 0
    target = received + script.ttft_s
    if script.flush:
        await asyncio.sleep(max(0.0, target - time.perf_counter()))
        pieces = [_chunk(chat, "ab", "length" if k == n_tokens - 1 else None) for k in range(n_tokens)]
        await response.write(b"".join(pieces))
        entry["writes_s"].append(time.perf_counter())
        sent = n_tokens
    while sent < n_tokens:
        if state.lockstep is not None and chunk_index > 0:
            step = state.lockstep
            if not await asyncio.get_running_loop().run_in_executor(None, step.acquire, True, 30.0):
                await response.write_eof()  # nobody released: the stream ends short (the test sees it)
                return response
            target = time.perf_counter()
        delay = target - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if script.malformed_after_chunks is not None and chunk_index >= script.malformed_after_chunks:
            await response.write(b'data: {"choices": [ {"text": broken\n\n')
            entry["writes_s"].append(time.perf_counter())
            await response.write_eof()
            return response
        take = min(script.tokens_per_chunk, n_tokens - sent)
        sent += take
        finish = "length" if sent >= n_tokens else None
        await response.write(_chunk(chat, "ab" * take, finish))
        entry["writes_s"].append(time.perf_counter())
        chunk_index += 1
        target += script.gap_s
    if script.usage:
        usage = _usage(prompt_tokens, n_tokens) | {"prompt_tokens_details": {"cached_tokens": 0}} | (
            script.usage_fields or {})
        event = {"id": "fake", "choices": [], "usage": usage}
        await response.write(b"data: " + json.dumps(event).encode() + b"\n\n")
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


async def _completions(request: web.Request) -> web.StreamResponse:
    return await _stream(request, chat=False)


async def _chat(request: web.Request) -> web.StreamResponse:
    return await _stream(request, chat=True)


async def _invocations(request: web.Request) -> web.StreamResponse:
    """vLLM's SageMaker route: a chat body has ``messages``, a completion body ``prompt``."""
    body = await request.json()
    return await _stream(request, chat="messages" in body)


async def _health(request: web.Request) -> web.Response:
    return web.Response(text="")


async def _models(request: web.Request) -> web.Response:
    return web.json_response(
        {"object": "list", "data": [{"id": request.app[MODEL_KEY], "object": "model", "max_model_len": 8192}]}
    )


async def _metrics(request: web.Request) -> web.Response:
    state: FakeServerState = request.app[STATE_KEY]
    name = request.app[MODEL_KEY]
    text = (
        f'vllm:prefix_cache_queries_total{{engine="0",model_name="{name}"}} {float(state.queries)}\n'
        f'vllm:prefix_cache_hits_total{{engine="0",model_name="{name}"}} {float(state.hits)}\n'
        f'vllm:num_requests_running{{engine="0",model_name="{name}"}} 0.0\n'
        f'vllm:num_requests_waiting{{engine="0",model_name="{name}"}} 0.0\n'
        f'vllm:cache_config_info{{block_size="32",enable_prefix_caching="False",engine="0"}} 1.0\n'
    )
    return web.Response(text=text)


async def _tokenize(request: web.Request) -> web.Response:
    body = await request.json()
    if "messages" in body:
        text = "".join(m.get("content", "") for m in body["messages"])
        tokens = [2] + [ord(c) for c in text] + [7, 7]  # a fake template: bos + content + 2 markers
    else:
        tokens = [ord(c) for c in body.get("prompt", "")]
    return web.json_response({"count": len(tokens), "tokens": tokens, "max_model_len": 8192})


async def _detokenize(request: web.Request) -> web.Response:
    body = await request.json()
    return web.json_response({"prompt": "".join(chr(t) for t in body.get("tokens", []))})


async def _log(request: web.Request) -> web.Response:
    return web.json_response(request.app[STATE_KEY].log)


async def _version(request: web.Request) -> web.Response:
    return web.json_response({"version": "fake"})


def build_app(state: FakeServerState | None = None, model: str = "fake-model") -> web.Application:
    app = web.Application()
    app[STATE_KEY] = state or FakeServerState()
    app[MODEL_KEY] = model
    posts = {"/v1/completions": _completions, "/v1/chat/completions": _chat, "/invocations": _invocations,
             "/tokenize": _tokenize, "/detokenize": _detokenize}
    gets = {"/health": _health, "/ping": _health, "/v1/models": _models, "/metrics": _metrics,
            "/version": _version, "/fake/log": _log}
    app.router.add_routes([web.post(p, h) for p, h in posts.items()])
    app.router.add_routes([web.get(p, h) for p, h in gets.items()])
    return app


class AppInThread:
    """An aiohttp app (from :meth:`build`) served on 127.0.0.1:``port`` by its own event loop in a
    background thread, for in-process tests; ``with`` starts and stops it."""

    thread_name = "aiohttp-app"
    # how long stop() lets in-flight requests finish before they are cancelled: aiohttp's own default
    # (60 s) outlasts stop()'s 10 s join whenever a request hangs on purpose, so every such stop took 10 s
    stop_grace_s = 1.0

    def __init__(self, port: int):
        self.port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def build(self) -> web.Application:
        raise NotImplementedError

    def start(self):
        def serve() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            self._runner = web.AppRunner(self.build(), access_log=None, shutdown_timeout=self.stop_grace_s)
            loop.run_until_complete(self._runner.setup())
            loop.run_until_complete(web.TCPSite(self._runner, "127.0.0.1", self.port).start())
            self._ready.set()
            loop.run_forever()
            loop.run_until_complete(self._runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=serve, name=self.thread_name, daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError(f"{self.thread_name} did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class FakeServer(AppInThread):
    """The fake server on its own event loop in a background thread (in-process tests)."""

    thread_name = "fake-openai-server"

    def __init__(self, port: int, state: FakeServerState | None = None, model: str = "fake-model"):
        super().__init__(port)
        self.state = state or FakeServerState()
        self.model = model

    def build(self) -> web.Application:
        return build_app(self.state, self.model)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="FAKE OpenAI-compatible SSE server with injected timings")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", default="fake-model")
    parser.add_argument("--ttft", type=float, default=0.05)
    parser.add_argument("--gap", type=float, default=0.01)
    parser.add_argument("--tokens-per-chunk", type=int, default=1)
    parser.add_argument("--exit-after-requests", type=int, default=None)
    parser.add_argument("--hang", type=float, default=0.0, help="accept each request, then stall this long")
    args = parser.parse_args(argv)
    state = FakeServerState(
        default=FakeScript(
            ttft_s=args.ttft, gap_s=args.gap, tokens_per_chunk=args.tokens_per_chunk, hang_s=args.hang
        ),
        exit_after_requests=args.exit_after_requests,
    )
    web.run_app(
        build_app(state, args.model),
        host="127.0.0.1",
        port=args.port,
        access_log=None,
        print=lambda *_: print(f"fake server on 127.0.0.1:{args.port}", flush=True),
    )


if __name__ == "__main__":
    main()
