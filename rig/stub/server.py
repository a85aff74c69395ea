"""A paced OpenAI-compatible streaming stub: the ground truth for the load engine's clock.

A real vLLM server cannot say when it really sent each token, so the client's timing error cannot
be measured against it. This stub can: it sends the first token `ttft` after it has read a
request and then one token every `itl`, stamps every SSE event with its own send time
(`stub_sent`, `time.perf_counter()`, which on Linux is CLOCK_MONOTONIC and therefore comparable
across processes on one machine) and keeps a log of every request. A request's arrival is the
time the kernel received its first bytes (the same recvmsg time stamps as rig.load.http_client), so
a busy stub does not shift it; a send is stamped right before the bytes go to the socket.

It also injects the faults the rig must survive (HTTP errors, hangs, malformed SSE, dropped
connections, invalid UTF-8, U+FFFD, repetition, empty output, divergence), chosen per request by
the body field `stub_fault` or per arrival index by the server option `--fault INDEX=KIND`.
`--answers FILE` scripts what a completion whose prompt ends a given way says (graded questions).

Output is a deterministic function of the prompt, so two stubs answer a request identically
(unless told to diverge); so is the teacher-forced replay (/tokenize, `prompt_logprobs`), which
`--replay-delay-ms` slows down so that a test can interrupt a run inside it. /metrics imitates
vLLM's prefix-cache counters: a request without a `cache_salt` whose prompt was seen before
counts as a full hit. /pause (keep mode), /resume and /is_paused imitate vLLM's scheduler
pause (VLLM_SERVER_DEV_MODE): a streamed request's head goes out, its tokens wait for /resume.
/stub/log, /stub/reset, /stub/hold and /stub/release serve benchmarks.

It speaks just enough HTTP/1.1 for OpenAI clients (rig.stub.wire); what it says is in
rig.stub.answers. Not a model of vLLM's performance: only of its wire format and of a
perfectly paced server.

    python -m rig.stub.server --port 8001 --ttft-ms 50 --itl-ms 20 --tokens 32
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rig.load.http_client import enable_receive_stamps
from rig.stub.answers import (
    FAULT_KINDS,
    EventWriter,
    answer_tokens,
    count_prompt_tokens,
    full_response,
    tokenize,
)
from rig.stub.wire import ClientGone, HttpRequest, Wire, send_error, send_json


@dataclass(frozen=True)
class StubConfig:
    ttft_s: float = 0.05
    itl_s: float = 0.02
    output_tokens: int = 32  # unless the request's max_tokens is smaller
    model: str = "stub"
    faults: dict[int, str] = field(default_factory=dict)  # arrival index -> fault kind
    engines: int = 1  # label sets on /metrics, to exercise summing over them
    replay_delay_s: float = 0.0  # before answering a prompt_logprobs (teacher-forced) request
    answers: dict[str, str] = field(default_factory=dict)  # prompt suffix -> scripted text


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
    held: bool = False  # parked by /stub/hold or /pause; `read` is then the release time


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
        self._running = asyncio.Event()  # cleared by /pause: vLLM's scheduler pause (keep mode)
        self._running.set()
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
        wire = Wire(sock)
        try:
            while (request := await wire.read_request()) is not None:
                if not await self._route(wire, request):
                    break
        except (asyncio.CancelledError, ClientGone, ValueError):
            pass
        finally:
            wire.close()

    async def _route(self, wire: Wire, request: HttpRequest) -> bool:
        """Answer one request; False when the connection must not be reused."""
        route = (request.method, request.path)
        if request.method == "POST" and request.path in ("/v1/completions", "/v1/chat/completions"):
            return await self._generate(wire, request)
        if route == ("GET", "/metrics"):
            await wire.respond(200, self._metrics_text().encode(), "text/plain; version=0.0.4")
        elif route == ("POST", "/tokenize"):
            tokens = tokenize(json.loads(request.body))
            await send_json(wire, 200, {"count": len(tokens), "tokens": tokens})
        elif route == ("GET", "/health"):
            await wire.respond(200, b"", "text/plain")
        elif route == ("GET", "/v1/models"):
            await send_json(wire, 200, {"object": "list", "data": [{"id": self.config.model}]})
        elif route == ("GET", "/stub/log"):
            log = [asdict(e) for e in self.log]
            await send_json(wire, 200, {"max_in_flight": self.max_in_flight, "requests": log})
        elif route == ("POST", "/stub/reset"):
            self.reset()
            await wire.respond(200, b"", "text/plain")
        elif route == ("POST", "/stub/hold"):  # for clients without a start barrier of
            self._gate.clear()  # their own (vllm bench serve): start them together
            await wire.respond(200, b"", "text/plain")
        elif route == ("POST", "/stub/release"):
            self._gate.set()
            await wire.respond(200, b"", "text/plain")
        elif route == ("POST", "/pause"):
            self._running.clear()
            await send_json(wire, 200, {"status": "paused"})
        elif route == ("POST", "/resume"):
            self._running.set()
            await send_json(wire, 200, {"status": "resumed"})
        elif route == ("GET", "/is_paused"):
            await send_json(wire, 200, {"is_paused": not self._running.is_set()})
        else:
            await send_json(wire, 404, {"error": {"message": f"no route {route}", "code": 404}})
        return True

    async def _generate(self, wire: Wire, request: HttpRequest) -> bool:
        entry = StubRequestLog(
            index=len(self.log), key="", path=request.path, arrived=request.arrived
        )
        self.log.append(entry)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        wire.on_eof = asyncio.current_task()
        try:
            return await self._answer(wire, request, entry)
        except (asyncio.CancelledError, ClientGone):
            entry.disconnected = True
            return False
        finally:
            wire.on_eof = None
            self.in_flight -= 1
            entry.finished = time.perf_counter()

    async def _answer(self, wire: Wire, request: HttpRequest, entry: StubRequestLog) -> bool:
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
            await send_error(wire, 400, f"unknown stub_fault {fault!r}; known: {FAULT_KINDS}")
            return True
        if fault in ("http_409", "http_429", "http_500"):
            await send_error(wire, int(fault[5:]), f"stub fault {fault}")
            return True
        if fault == "hang":
            await asyncio.sleep(3600)
        return await self._complete(wire, entry, body, request.path.endswith("/chat/completions"))

    async def _complete(self, wire: Wire, entry: StubRequestLog, body: dict, chat: bool) -> bool:
        """Say what a request that got past its faults gets: whole, or streamed on schedule."""
        fault = entry.fault
        prompt_key = json.dumps(body.get("messages") if chat else body.get("prompt"))
        prompt_tokens = count_prompt_tokens(body, chat)
        self._count_prefix_cache(entry.index, entry.cache_salt, prompt_key, prompt_tokens)
        token_ids, texts, finish_reason = answer_tokens(
            body, chat, prompt_key, fault, self.config.output_tokens, self.config.answers
        )
        if body.get("prompt_logprobs") is not None:
            await asyncio.sleep(self.config.replay_delay_s)
        if not body.get("stream"):
            answer = full_response(body, chat, token_ids, finish_reason, prompt_tokens)
            await send_json(wire, 200, answer | {"model": self.config.model})
            return True

        await wire.start_stream()
        if not self._running.is_set():  # like vLLM: the head is out, the scheduler holds it
            entry.held = True
            await self._running.wait()
            entry.read = time.perf_counter()
        writer = EventWriter(wire, entry.index, entry.sent, body, chat, self.config.model)
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
            text = texts[i] if texts else None
            await writer.send_token(token_id, finish_reason if last else None, fault, text)
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
    parser = argparse.ArgumentParser(prog="python -m rig.stub.server", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    parser.add_argument("--ttft-ms", type=float, default=50.0)
    parser.add_argument("--itl-ms", type=float, default=20.0)
    parser.add_argument("--tokens", type=int, default=32, help="output tokens per request")
    parser.add_argument("--model", default="stub")
    parser.add_argument("--engines", type=int, default=1, help="label sets on /metrics")
    parser.add_argument(
        "--replay-delay-ms",
        type=float,
        default=0.0,
        help="delay before answering each prompt_logprobs (teacher-forced replay) request",
    )
    parser.add_argument("--answers", type=Path, help="JSON: prompt suffix -> scripted answer")
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
        replay_delay_s=args.replay_delay_ms / 1000,
        answers=json.loads(args.answers.read_text()) if args.answers else {},
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
