"""A paced OpenAI-compatible streaming stub: the ground truth for the load engine's clock.

A real vLLM server cannot say when it really sent each token, so the client's timing error cannot
be measured against it. This stub can: it sends the first token `ttft` after it has read a
request and then one token every `itl`, stamps every SSE event with its own send time
(`stub_sent`, `time.perf_counter()`, which on Linux is CLOCK_MONOTONIC and therefore comparable
across processes on one machine) and keeps a log of every request. A request's arrival is the
time the kernel received its first bytes (the same recvmsg time stamps as rig.http_client), so
a busy stub does not shift it; a send is stamped right before the bytes go to the socket.

It also injects the faults the rig must survive (HTTP errors, hangs, malformed SSE, dropped
connections, invalid UTF-8, U+FFFD, repetition, empty output, divergence), chosen per request by
the body field `stub_fault` or per arrival index by the server option `--fault INDEX=KIND`.

Output is a deterministic function of the prompt, so two stubs answer a request identically
(unless told to diverge). /metrics imitates vLLM's prefix-cache counters: a request without a
`cache_salt` whose prompt was seen before counts as a full hit. /stub/log, /stub/reset,
/stub/hold and /stub/release serve benchmarks.

It speaks just enough HTTP/1.1 for OpenAI clients (keep-alive, Content-Length request bodies,
chunked responses) on raw sockets: an HTTP framework would read the socket for it and hide the
kernel's time stamps. Not a model of vLLM's performance: only of its wire format and of a
perfectly paced server.

    python -m rig.stub_server --port 8001 --ttft-ms 50 --itl-ms 20 --tokens 32
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import struct
import threading
import time
import zlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from http import HTTPStatus
from typing import Literal

from rig.http_client import enable_receive_stamps, recv_stamped

FaultKind = Literal[
    "http_409",
    "http_429",
    "http_500",
    "hang",  # never answers
    "stall",  # sends the first token, then nothing, connection kept open
    "malformed_sse",  # an event whose data is not JSON, after the first token
    "drop",  # resets the connection half way through the stream
    "invalid_utf8",  # raw invalid UTF-8 bytes inside one event's JSON string
    "replacement_char",  # one token whose text is U+FFFD (valid protocol, bad content)
    "repetition",  # the same token until max_tokens, finish_reason "length"
    "empty",  # no tokens at all, finish_reason "stop"
    "diverge",  # different tokens from the middle of the output on
]
FAULT_KINDS: tuple[str, ...] = FaultKind.__args__  # type: ignore[attr-defined]
VOCAB_SIZE = 1000
_MAX_REQUEST_BYTES = 64 * 1024 * 1024


def token_text(token_id: int) -> str:
    return f" w{token_id}"


@dataclass(frozen=True)
class StubConfig:
    ttft_s: float = 0.05
    itl_s: float = 0.02
    output_tokens: int = 32  # unless the request's max_tokens is smaller
    model: str = "stub"
    faults: dict[int, str] = field(default_factory=dict)  # arrival index -> fault kind
    engines: int = 1  # label sets on /metrics, to exercise summing over them


@dataclass
class StubRequestLog:
    """What the stub knows about one request; `sent` holds the stamp of every choices event."""

    index: int  # arrival order, from 0
    key: str  # X-Request-Id header, else the body's cache_salt, else "stub-<index>"
    path: str
    arrived: float  # when the kernel received the request's first bytes
    read: float | None = None  # when the stub had parsed it: the schedule starts here
    cache_salt: str | None = None
    fault: str | None = None
    body: dict | None = None
    sent: list[float] = field(default_factory=list)
    finished: float | None = None  # stream complete, or the stub gave up (disconnect)
    disconnected: bool = False
    held: bool = False  # parked by /stub/hold; `read` is then the release time


@dataclass
class _Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    arrived: float


class _ClientGone(Exception):
    """The client closed its connection while the stub was still answering."""


class _Wire:
    """One accepted connection: requests read with the kernel's arrival stamp, responses
    written in HTTP/1.1 framing."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.loop = asyncio.get_running_loop()
        self._buffer = b""
        self._buffer_since = 0.0  # arrival stamp of the oldest unread byte
        self._eof = False
        self._readable = asyncio.Event()
        self.on_eof: asyncio.Task | None = None  # cancelled when the client goes away
        self.loop.add_reader(sock.fileno(), self._read)

    def _read(self) -> None:
        while not self._eof:
            try:
                data, stamp, _ = recv_stamped(self.sock)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data = b""
            if not data:
                self._eof = True
                self.loop.remove_reader(self.sock.fileno())
                if self.on_eof is not None:
                    self.on_eof.cancel()
            elif not self._buffer:
                self._buffer_since = stamp
            self._buffer += data
            self._readable.set()

    async def read_request(self) -> _Request | None:
        """The next request, or None once the client has closed the connection."""
        while True:
            head_end = self._buffer.find(b"\r\n\r\n")
            if head_end >= 0:
                request = self._parse(head_end)
                if request is not None:
                    return request
            if self._eof:
                return None
            if len(self._buffer) > _MAX_REQUEST_BYTES:
                raise ValueError("request too large")
            self._readable.clear()
            await self._readable.wait()

    def _parse(self, head_end: int) -> _Request | None:
        request_line, *lines = self._buffer[:head_end].decode("latin-1").split("\r\n")
        headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        end = head_end + 4 + length
        if len(self._buffer) < end:
            return None
        method, target, _ = request_line.split(" ", 2)
        body, self._buffer = self._buffer[head_end + 4 : end], self._buffer[end:]
        arrived = self._buffer_since  # the next request's bytes, if any, came with this read
        return _Request(method, target.split("?", 1)[0], headers, body, arrived)

    async def send(self, data: bytes) -> float:
        """Write bytes; returns the perf_counter stamp taken right before."""
        stamp = time.perf_counter()
        try:
            await self.loop.sock_sendall(self.sock, data)
        except OSError as exc:
            raise _ClientGone from exc
        return stamp

    async def respond(self, status: int, body: bytes, content_type: str) -> None:
        reason = HTTPStatus(status).phrase
        head = (
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        await self.send(head.encode() + body)

    async def start_stream(self) -> None:
        head = (
            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        await self.send(head.encode())

    async def send_chunk(self, data: bytes) -> float:
        return await self.send(b"%x\r\n%s\r\n" % (len(data), data))

    def reset(self) -> None:
        """Close with a TCP reset, as a crashed server would."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close()

    def close(self) -> None:
        if not self._eof:
            self._eof = True
            self.loop.remove_reader(self.sock.fileno())
        self.sock.close()


class StubServer:
    """The stub on the running event loop; `start()` binds and returns the port."""

    def __init__(self, config: StubConfig) -> None:
        self.config = config
        self.log: list[StubRequestLog] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.port: int | None = None
        self._seen_prompts: set[tuple[str | None, str]] = set()
        self._queries = [0.0] * config.engines
        self._hits = [0.0] * config.engines
        self._gate = asyncio.Event()  # cleared by /stub/hold: requests wait for /stub/release
        self._gate.set()
        self._listener: socket.socket | None = None
        self._tasks: set[asyncio.Task] = set()

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, port))
        listener.listen(4096)
        listener.setblocking(False)
        self._listener = listener
        self.port = listener.getsockname()[1]
        self._spawn(self._accept_forever())
        return self.port

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._listener is not None:
            self._listener.close()
            self._listener = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def reset(self) -> None:
        self.log.clear()
        self.max_in_flight = self.in_flight
        self._seen_prompts.clear()

    def _spawn(self, coroutine) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _accept_forever(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._listener is not None
        while True:
            sock, _ = await loop.sock_accept(self._listener)
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            enable_receive_stamps(sock)
            self._spawn(self._serve(sock))

    async def _serve(self, sock: socket.socket) -> None:
        wire = _Wire(sock)
        try:
            while (request := await wire.read_request()) is not None:
                if not await self._route(wire, request):
                    break
        except (asyncio.CancelledError, _ClientGone, ValueError):
            pass
        finally:
            wire.close()

    async def _route(self, wire: _Wire, request: _Request) -> bool:
        """Answer one request; False when the connection must not be reused."""
        route = (request.method, request.path)
        if request.method == "POST" and request.path in ("/v1/completions", "/v1/chat/completions"):
            return await self._generate(wire, request)
        if route == ("GET", "/metrics"):
            await wire.respond(200, self._metrics_text().encode(), "text/plain; version=0.0.4")
        elif route == ("GET", "/health"):
            await wire.respond(200, b"", "text/plain")
        elif route == ("GET", "/v1/models"):
            await _json(wire, 200, {"object": "list", "data": [{"id": self.config.model}]})
        elif route == ("GET", "/stub/log"):
            log = [asdict(e) for e in self.log]
            await _json(wire, 200, {"max_in_flight": self.max_in_flight, "requests": log})
        elif route == ("POST", "/stub/reset"):
            self.reset()
            await wire.respond(200, b"", "text/plain")
        elif route == ("POST", "/stub/hold"):  # for clients without a start barrier of
            self._gate.clear()  # their own (vllm bench serve): start them together
            await wire.respond(200, b"", "text/plain")
        elif route == ("POST", "/stub/release"):
            self._gate.set()
            await wire.respond(200, b"", "text/plain")
        else:
            await _json(wire, 404, {"error": {"message": f"no route {route}", "code": 404}})
        return True

    async def _generate(self, wire: _Wire, request: _Request) -> bool:
        entry = StubRequestLog(
            index=len(self.log), key="", path=request.path, arrived=request.arrived
        )
        self.log.append(entry)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        wire.on_eof = asyncio.current_task()
        try:
            return await self._answer(wire, request, entry)
        except (asyncio.CancelledError, _ClientGone):
            entry.disconnected = True
            return False
        finally:
            wire.on_eof = None
            self.in_flight -= 1
            entry.finished = time.perf_counter()

    async def _answer(self, wire: _Wire, request: _Request, entry: StubRequestLog) -> bool:
        body = json.loads(request.body)
        if not self._gate.is_set():
            entry.held = True
            await self._gate.wait()
        entry.read = time.perf_counter()
        entry.body = body
        entry.cache_salt = body.get("cache_salt")
        entry.key = request.headers.get("x-request-id") or entry.cache_salt or f"stub-{entry.index}"
        entry.fault = fault = body.get("stub_fault") or self.config.faults.get(entry.index)
        if fault is not None and fault not in FAULT_KINDS:
            await _error(wire, 400, f"unknown stub_fault {fault!r}; known: {FAULT_KINDS}")
            return True
        if fault in ("http_409", "http_429", "http_500"):
            await _error(wire, int(fault[5:]), f"stub fault {fault}")
            return True
        if fault == "hang":
            await asyncio.sleep(3600)

        chat = request.path.endswith("/chat/completions")
        prompt_key = json.dumps(body.get("messages") if chat else body.get("prompt"))
        prompt_tokens = _count_prompt_tokens(body, chat)
        self._count_prefix_cache(entry.index, entry.cache_salt, prompt_key, prompt_tokens)
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or 16
        n_tokens = min(max_tokens, self.config.output_tokens)
        token_ids, finish_reason = _plan_tokens(prompt_key, n_tokens, max_tokens, fault)
        if not body.get("stream"):
            answer = _full_response(body, chat, token_ids, finish_reason, prompt_tokens)
            await _json(wire, 200, answer | {"model": self.config.model})
            return True

        await wire.start_stream()
        writer = _EventWriter(wire, entry, body, chat, self.config.model)
        first_due = entry.read + self.config.ttft_s
        if not token_ids:
            await _sleep_until(first_due)
            await writer.send({"role": "assistant", "content": ""} if chat else "", "stop")
        for i, token_id in enumerate(token_ids):
            await _sleep_until(first_due + i * self.config.itl_s)
            if chat and i == 0:
                await writer.send({"role": "assistant", "content": ""}, None)
            if fault == "stall" and i == 1:
                await asyncio.sleep(3600)
            if fault == "drop" and i == len(token_ids) // 2:
                entry.disconnected = True
                wire.reset()
                return False
            if fault == "malformed_sse" and i == 1:
                await wire.send_chunk(b'data: {"choices": [{"text": "unterminated\n\n')
            last = i == len(token_ids) - 1
            await writer.send_token(token_id, finish_reason if last else None, fault)
        if (body.get("stream_options") or {}).get("include_usage"):
            await writer.send_usage(prompt_tokens, len(token_ids))
        await wire.send_chunk(b"data: [DONE]\n\n")
        await wire.send(b"0\r\n\r\n")
        return True

    def _count_prefix_cache(
        self, index: int, salt: str | None, prompt_key: str, prompt_tokens: int
    ) -> None:
        engine = index % self.config.engines
        self._queries[engine] += prompt_tokens
        if (salt, prompt_key) in self._seen_prompts:
            self._hits[engine] += prompt_tokens
        self._seen_prompts.add((salt, prompt_key))

    def _metrics_text(self) -> str:
        lines = []
        for name, values in (
            ("vllm:prefix_cache_queries_total", self._queries),
            ("vllm:prefix_cache_hits_total", self._hits),
        ):
            lines += [f"# HELP {name} stub counter", f"# TYPE {name} counter"]
            for engine, value in enumerate(values):
                labels = f'engine="{engine}",model_name="{self.config.model}"'
                lines.append(f"{name}{{{labels}}} {value}")
        return "\n".join(lines) + "\n"


class _EventWriter:
    """Builds vLLM-shaped SSE chunks; the send stamp goes in last, right before the write."""

    def __init__(
        self, wire: _Wire, entry: StubRequestLog, body: dict, chat: bool, model: str
    ) -> None:
        self.wire = wire
        self.entry = entry
        self.body = body
        self.chat = chat
        self.model = model
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-stub-{entry.index}"
        self.as_ids = bool(body.get("return_tokens_as_token_ids"))
        logprobs = body.get("logprobs")
        if chat:
            self.top_k = int(body.get("top_logprobs") or 0) if logprobs else -1
        else:
            self.top_k = int(logprobs) if logprobs is not None else -1
        self.emitted_chars = 0
        self.tokens_sent = 0

    async def send_token(self, token_id: int, finish_reason: str | None, fault: str | None) -> None:
        first = self.tokens_sent == 0
        text = "\ufffd" if fault == "replacement_char" and first else token_text(token_id)
        delta: dict | str = {"content": text} if self.chat else text
        extra = {"token_ids": [token_id]} if self.body.get("return_token_ids") else {}
        if self.top_k >= 0:
            extra["logprobs"] = self._logprobs(token_id, text)
        await self.send(delta, finish_reason, extra, corrupt=fault == "invalid_utf8" and first)
        self.tokens_sent += 1
        self.emitted_chars += len(text)

    async def send(
        self,
        delta: dict | str,
        finish_reason: str | None,
        extra: dict | None = None,
        corrupt: bool = False,
    ) -> None:
        choice: dict = {"index": 0}
        choice.update({"delta": delta} if self.chat else {"text": delta})
        choice.update(extra or {})
        choice["finish_reason"] = finish_reason
        payload = json.dumps(self._chunk([choice])).encode()
        if corrupt:  # bytes that are not UTF-8, inside the text's JSON string
            field_start = b'"content": "' if self.chat else b'"text": "'
            payload = payload.replace(field_start, field_start + b"\xff\xfe", 1)
        self.entry.sent.append(await self._send_stamped(payload))

    async def send_usage(self, prompt_tokens: int, completion_tokens: int) -> None:
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        await self._send_stamped(json.dumps(self._chunk([]) | {"usage": usage}).encode())

    def _chunk(self, choices: list[dict]) -> dict:
        return {
            "id": self.id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": choices,
        }

    async def _send_stamped(self, payload: bytes) -> float:
        stamp = time.perf_counter()
        event = b'data: %s, "stub_sent": %r}\n\n' % (payload[:-1], stamp)
        await self.wire.send_chunk(event)
        return stamp

    def _logprobs(self, token_id: int, text: str) -> dict:
        """The chosen token at a fixed logprob and `top_k` lower-ranked neighbours."""
        top = [((token_id + j) % VOCAB_SIZE, -0.25 - j) for j in range(self.top_k)]

        def name(tid: int) -> str:
            return f"token_id:{tid}" if self.as_ids else token_text(tid)

        if self.chat:
            alternatives = [
                {"token": name(t), "logprob": lp, "bytes": list(token_text(t).encode())}
                for t, lp in top
            ]
            chosen = {"token": name(token_id), "logprob": -0.25, "bytes": list(text.encode())}
            return {"content": [chosen | {"top_logprobs": alternatives}]}
        return {
            "text_offset": [self.emitted_chars],
            "token_logprobs": [-0.25],
            "tokens": [name(token_id)],
            "top_logprobs": [{name(t): lp for t, lp in top}],
        }


def _plan_tokens(
    prompt_key: str, n_tokens: int, max_tokens: int, fault: str | None
) -> tuple[list[int], str]:
    """Token ids and finish reason: a deterministic function of the prompt and the fault."""
    seed = zlib.crc32(prompt_key.encode())
    if fault == "empty":
        return [], "stop"
    if fault == "repetition":
        return [seed % VOCAB_SIZE] * max_tokens, "length"
    ids = [(seed + 7919 * i) % VOCAB_SIZE for i in range(n_tokens)]
    if fault == "diverge":
        ids = ids[: n_tokens // 2] + [(t + 1) % VOCAB_SIZE for t in ids[n_tokens // 2 :]]
    return ids, "length" if n_tokens == max_tokens else "stop"


def _count_prompt_tokens(body: dict, chat: bool) -> int:
    if chat:
        return sum(len(str(m.get("content", "")).split()) for m in body.get("messages") or [])
    prompt = body.get("prompt")
    return len(prompt) if isinstance(prompt, list) else len(str(prompt or "").split())


def _full_response(
    body: dict, chat: bool, token_ids: list[int], finish_reason: str, prompt_tokens: int
) -> dict:
    text = "".join(token_text(t) for t in token_ids)
    choice: dict = {"index": 0, "finish_reason": finish_reason}
    choice.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
    if body.get("return_token_ids"):
        choice["token_ids"] = token_ids
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": len(token_ids),
        "total_tokens": prompt_tokens + len(token_ids),
    }
    return {"id": "stub", "choices": [choice], "usage": usage}


async def _json(wire: _Wire, status: int, payload: dict) -> None:
    await wire.respond(status, json.dumps(payload).encode(), "application/json")


async def _error(wire: _Wire, status: int, message: str) -> None:
    await _json(wire, status, {"error": {"message": message, "type": "StubError", "code": status}})


async def _sleep_until(deadline: float) -> None:
    delay = deadline - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)


@contextlib.contextmanager
def serve_in_thread(config: StubConfig) -> Iterator[StubServer]:
    """Run a stub on its own event loop in a daemon thread, for tests in the caller's process."""
    loop = asyncio.new_event_loop()
    started = threading.Event()
    holder: list[StubServer] = []

    def run() -> None:
        asyncio.set_event_loop(loop)
        server = StubServer(config)
        holder.append(server)
        loop.run_until_complete(server.start())
        started.set()
        loop.run_forever()
        loop.run_until_complete(server.stop())
        loop.close()

    thread = threading.Thread(target=run, name="stub-server", daemon=True)
    thread.start()
    if not started.wait(timeout=30):
        raise RuntimeError("the stub server did not start within 30 s")
    try:
        yield holder[0]
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)


def _parse_fault(text: str) -> tuple[int, str]:
    index, _, kind = text.partition("=")
    if kind not in FAULT_KINDS:
        raise argparse.ArgumentTypeError(f"--fault {text!r}: kind must be one of {FAULT_KINDS}")
    return int(index), kind


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rig.stub_server", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    parser.add_argument("--ttft-ms", type=float, default=50.0)
    parser.add_argument("--itl-ms", type=float, default=20.0)
    parser.add_argument("--tokens", type=int, default=32, help="output tokens per request")
    parser.add_argument("--model", default="stub")
    parser.add_argument("--engines", type=int, default=1, help="label sets on /metrics")
    parser.add_argument(
        "--fault", type=_parse_fault, action="append", default=[], metavar="INDEX=KIND"
    )
    args = parser.parse_args(argv)
    config = StubConfig(
        ttft_s=args.ttft_ms / 1000,
        itl_s=args.itl_ms / 1000,
        output_tokens=args.tokens,
        model=args.model,
        faults=dict(args.fault),
        engines=args.engines,
    )

    async def serve() -> None:
        server = StubServer(config)
        port = await server.start(args.host, args.port)
        print(f"stub listening on http://{args.host}:{port}", flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await server.stop()

    try:
        import uvloop  # a faster loop keeps the stub on its schedule at high event rates

        run = uvloop.run
    except ImportError:
        run = asyncio.run
    with contextlib.suppress(KeyboardInterrupt):
        run(serve())


if __name__ == "__main__":
    main()
