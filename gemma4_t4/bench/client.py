"""Async streaming client for OpenAI-compatible ``/v1/completions`` and ``/v1/chat/completions``.

One request in, one :class:`RequestRecord` out, with ``time.perf_counter`` stamps (seconds on
the caller's clock) for: send, first byte, first chunk, first output token, first non-empty
content, every output chunk, the last chunk carrying ``choices`` and the end of the stream.
Token counts come from the server's ``usage`` (streamed with ``include_usage``); the record
says where its counts came from. Failures never raise: they are recorded with an error class.

Why "first output token" and not "first chunk": on chat endpoints vLLM sends a role-only
delta before any token exists, so "first chunk" understates TTFT. A chunk whose token decoded
to an incomplete UTF-8 character carries empty text but is still a generated token, so "first
non-empty content" can overstate it by a step; both stamps are kept.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Literal

from gemma4_t4.bench.schemas import RawJSON, RequestRecord

if TYPE_CHECKING:
    import aiohttp

Api = Literal["completions", "chat"]

ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


@dataclass
class RequestSpec:
    """What to send. ``input_len`` is the intended prompt length in tokens (for the record)."""

    request_id: str
    prompt: str
    max_tokens: int
    api: Api = "completions"
    ignore_eos: bool = True
    input_len: int | None = None
    extra_body: RawJSON = field(default_factory=dict)  # merged into the request body as is

    def payload(self, model: str, stream: bool = True) -> RawJSON:
        body: RawJSON = {
            "model": model, "max_tokens": self.max_tokens, "temperature": 0.0, "stream": stream  # greedy
        }
        if stream:
            body["stream_options"] = {"include_usage": True}
        if self.ignore_eos:
            body["ignore_eos"] = True  # vLLM extension; other servers ignore unknown fields
        if self.api == "chat":
            body["messages"] = [{"role": "user", "content": self.prompt}]
        else:
            body["prompt"] = self.prompt
        body.update(self.extra_body)
        return body


def _token_count(value: object) -> int | None:
    """A token count as a server should send it: a whole number >= 0 (12.0 counts as 12)."""
    if isinstance(value, float) and value.is_integer():  # (NaN and infinity are not integers)
        value = int(value)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def apply_usage(record: RequestRecord, usage: object) -> bool:
    """Copy a reply's ``usage`` onto the record; False (the request failed as ``bad_usage``, naming
    what the server sent) when a count is not a whole number >= 0 (NaN, -5, "12", ...) or the
    completion count exceeds max_tokens: a count like that would make every figure of the cell
    wrong, so it is a failed request, not a number to average."""
    if not isinstance(usage, dict):
        record.error, record.error_detail = "bad_usage", f"usage was {json.dumps(usage)[:200]}"
        return False
    details = usage.get("prompt_tokens_details") or {}
    fields = {
        "prompt_tokens": usage.get("prompt_tokens"),
        "completion_tokens": usage.get("completion_tokens"),
        "prompt_tokens_details.cached_tokens": details.get("cached_tokens") if isinstance(details, dict) else details,
    }
    counts: dict[str, int | None] = {}
    for name, value in fields.items():
        counts[name] = _token_count(value)  # (None: not sent)
        if value is not None and counts[name] is None:
            record.error = "bad_usage"
            record.error_detail = f"the server sent usage.{name} = {json.dumps(value)[:80]}, not a token count"
            return False
    completion = counts["completion_tokens"]
    if completion is not None and record.max_tokens > 0 and completion > record.max_tokens:
        record.error = "bad_usage"
        record.error_detail = (
            f"the server sent usage.completion_tokens = {completion}, more than the {record.max_tokens} asked for"
        )
        return False
    record.prompt_tokens = counts["prompt_tokens"]
    record.completion_tokens = completion
    record.cached_tokens = counts["prompt_tokens_details.cached_tokens"]
    record.token_source = "usage"
    return True


def _aiohttp() -> ModuleType:
    """aiohttp, imported when a request is made: it costs ~0.3 s, and every CLI command imports this
    module (through the workload classes) although few send a request."""
    import aiohttp

    return aiohttp


def _error_class(exc: BaseException) -> str:
    aiohttp = _aiohttp()
    if isinstance(exc, aiohttp.ClientConnectorError):
        return "connect_error"
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError | aiohttp.ClientOSError
                  | ConnectionResetError):
        return "disconnected"
    if isinstance(exc, TimeoutError):  # asyncio's and aiohttp's ServerTimeoutError included
        return "timeout"
    if isinstance(exc, aiohttp.ClientError):
        return "client_error"
    return type(exc).__name__


class StreamParser:
    """Reads an OpenAI SSE stream line by line into the :class:`RequestRecord` of ``spec``, sent at
    ``now`` (the same parser for every backend: vLLM's SageMaker ``/invocations`` streams the same
    ``data:`` lines)."""

    def __init__(self, spec: RequestSpec, now: float):
        self.record = RequestRecord(
            request_id=spec.request_id, api=spec.api, input_len_target=spec.input_len,
            max_tokens=spec.max_tokens, send_s=now,
        )
        self.chat = spec.api == "chat"
        self.texts: list[str] = []
        self.done = False
        self.last_choice_s: float | None = None  # set on the record once (a model setattr per chunk costs)

    def feed(self, raw: bytes, now: float) -> bool:
        """One line; False once the stream is over ([DONE] or an error)."""
        record = self.record
        if record.first_byte_s is None:
            record.first_byte_s = now
        if not raw.startswith(b"data:"):
            return True  # blank separators, SSE comments, event names
        payload = raw[5:].strip()
        if payload == b"[DONE]":
            self.done = True
            return False
        try:
            event = json.loads(payload)
            choices = event.get("choices")
        except (ValueError, AttributeError):
            record.error, record.error_detail = "malformed_sse", payload[:200].decode("utf-8", "replace")
            return False
        if "error" in event and not choices:
            record.error = "server_error_event"
            record.error_detail = json.dumps(event["error"])[:300]
            return False
        if choices:
            self._choice(choices[0], now)
        return apply_usage(record, event["usage"]) if event.get("usage") else True

    def _choice(self, choice: RawJSON, now: float) -> None:
        record = self.record
        if record.first_chunk_s is None:
            record.first_chunk_s = now
        self.last_choice_s = now
        if self.chat:
            delta = choice.get("delta") or {}
            piece = delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning")
            # a role-only delta (no text) is the preamble vLLM sends before any token
            is_token = bool(piece) or ("role" not in delta and "content" in delta)
        else:
            piece = choice.get("text")
            is_token = piece is not None
        if is_token:
            if record.first_token_s is None:
                record.first_token_s = now
            record.chunk_times_s.append(now)
        if piece:
            if record.first_content_s is None:
                record.first_content_s = now
            self.texts.append(piece)
        if choice.get("finish_reason"):
            record.finish_reason = choice["finish_reason"]

    def flush(self) -> RequestRecord:
        if self.last_choice_s is not None:
            self.record.last_choice_s = self.last_choice_s
        return self.record

    def finish(self, keep_text: bool, now: float) -> RequestRecord:
        """Close the record: end time, text, token-count fallback, the no-output check (and, for a
        record that was streamed, the check that the stream ended with [DONE])."""
        record = self.flush()
        if record.end_s is None:
            record.end_s = now
        if record.streamed is not False and record.error is None and not self.done:  # unset: checked
            record.error, record.error_detail = "truncated_stream", "the stream ended without [DONE]"
        text = "".join(self.texts)
        record.output_chars = len(text)
        if keep_text:
            record.text = text
        if record.error is None:
            if record.completion_tokens is None:
                # no usage: one token per output chunk is the best the stream says (flagged)
                record.completion_tokens = len(record.chunk_times_s)
                record.token_source = "chunks"
            if record.first_token_s is None and record.max_tokens > 0:
                record.error, record.error_detail = "no_output", "the stream carried no output tokens"
        return record


async def send_request(
    session: aiohttp.ClientSession,
    base_url: str,
    model: str,
    spec: RequestSpec,
    api_key: str | None = None,
    keep_text: bool = False,
    timeout_s: float | None = None,
) -> RequestRecord:
    """Stream one request over HTTP and record its timings. Never raises for server or network faults.
    ``timeout_s`` bounds the whole request (a server that accepts but never answers fails it)."""
    clock = time.perf_counter
    url = base_url.rstrip("/") + ENDPOINTS[spec.api]
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    body = json.dumps(spec.payload(model))
    parser = StreamParser(spec, clock())
    record = parser.record
    try:
        limit = _aiohttp().ClientTimeout(total=timeout_s, sock_connect=10.0) if timeout_s else None
        async with session.post(url, data=body, headers=headers, timeout=limit) as response:
            record.http_status = response.status
            if response.status != 200:
                detail = (await response.text())[:300]
                record.end_s = clock()
                record.error, record.error_detail = f"http_{response.status}", detail
                return record
            async for raw in response.content:
                if not parser.feed(raw, clock()):
                    break
        record.end_s = clock()
    except Exception as exc:  # noqa: BLE001 - every fault becomes a counted, classified failure
        record.end_s = clock()
        record.error, record.error_detail = _error_class(exc), f"{type(exc).__name__}: {exc}"[:300]
    record.streamed = True
    return parser.finish(keep_text, clock())


def make_session(concurrency: int, timeout_s: float | None = 600.0) -> aiohttp.ClientSession:
    """One pooled session for a run: enough connections for the concurrency, no total timeout."""
    aiohttp = _aiohttp()
    connector = aiohttp.TCPConnector(limit=max(1, concurrency), enable_cleanup_closed=True)
    timeout = aiohttp.ClientTimeout(sock_connect=10.0, sock_read=timeout_s)
    return aiohttp.ClientSession(connector=connector, timeout=timeout, read_bufsize=2**16)


Send = Callable[[RequestSpec], Awaitable[RequestRecord]]
OnRecord = Callable[[RequestRecord], None] | None


async def closed_loop(
    send: Send, specs: Sequence[RequestSpec], concurrency: int, on_record: OnRecord = None
) -> list[RequestRecord]:
    """Keep ``concurrency`` requests in flight until ``specs`` are done (closed loop), on any backend."""
    pending = enumerate(specs)  # shared by the workers: each takes the next spec when it is free
    results: list[RequestRecord | None] = [None] * len(specs)

    async def worker() -> None:
        for index, spec in pending:
            record = await send(spec)
            results[index] = record
            if on_record:
                on_record(record)

    await asyncio.gather(*(worker() for _ in range(max(1, min(concurrency, len(specs))))))
    return [r for r in results if r is not None]


async def open_loop(
    send: Send,
    specs: Sequence[RequestSpec],
    offsets: Sequence[float],
    max_in_flight: int,
    on_record: OnRecord = None,
) -> list[RequestRecord]:
    """Send ``specs[i]`` at start + ``offsets[i]`` whether or not earlier ones have finished (open
    loop: the load does not slow down when the server does). At most ``max_in_flight`` run at once;
    a request that finds the cap full waits (its record's ``send_s`` - ``scheduled_s`` says how long)."""
    gate = asyncio.Semaphore(max(1, max_in_flight))
    start = time.perf_counter()

    async def one(spec: RequestSpec, at: float) -> RequestRecord:
        async with gate:
            record = await send(spec)
        record.scheduled_s = at
        if on_record:
            on_record(record)
        return record

    tasks = []
    for spec, offset in zip(specs, offsets, strict=True):
        at = start + offset
        delay = at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(spec, at)))
    return list(await asyncio.gather(*tasks))  # in the order sent


def arrival_offsets(n: int, rate: float, arrival: str = "poisson", seed: int = 0) -> list[float]:
    """Send times, in seconds from the start, of ``n`` requests offered at ``rate`` per second:
    a Poisson process (exponential gaps from ``seed``, like real independent users) or evenly spaced."""
    if not rate > 0:
        raise ValueError(f"rate must be > 0 requests/s, got {rate}")
    if arrival == "constant":
        return [i / rate for i in range(n)]
    if arrival != "poisson":
        raise ValueError(f"arrival must be one of ('poisson', 'constant'), got {arrival!r}")
    rng = random.Random(seed)
    offsets, t = [], 0.0
    for _ in range(n):
        offsets.append(t)
        t += rng.expovariate(rate)
    return offsets
