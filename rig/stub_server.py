"""A paced OpenAI-compatible streaming stub: the ground truth for the load engine's clock.

A real vLLM server cannot say when it really sent each token, so the client's timing error cannot
be measured against it. This stub can: it sends the first token `ttft` after it has read a
request and then one token every `itl`, stamps every SSE event with its own send time
(`stub_sent`, `time.perf_counter()`, which on Linux is CLOCK_MONOTONIC and therefore comparable
across processes on one machine) and keeps a log of every request (arrival, body read, each send).
It also injects the faults the rig must survive (HTTP errors, hangs, malformed SSE, dropped
connections, invalid UTF-8, U+FFFD, repetition, empty output, divergence), chosen per request by
the body field `stub_fault` or per arrival index by the server option `--fault INDEX=KIND`.

Output is a deterministic function of the prompt, so two stubs answer a request identically
(unless told to diverge). /metrics imitates vLLM's prefix-cache counters: a request without a
`cache_salt` whose prompt was seen before counts as a full hit.

Not a model of vLLM's performance: only of its wire format and of a perfectly paced server.

    python -m rig.stub_server --port 8001 --ttft-ms 50 --itl-ms 20 --tokens 32
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import threading
import time
import zlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Literal

from aiohttp import web

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
    arrived: float  # perf_counter when the handler started (headers parsed)
    read: float | None = None  # perf_counter after the body was read and parsed
    cache_salt: str | None = None
    fault: str | None = None
    body: dict | None = None
    sent: list[float] = field(default_factory=list)
    finished: float | None = None  # stream complete, or the handler gave up (disconnect)
    disconnected: bool = False
    held: bool = False  # parked by /stub/hold; `read` is then the release time


class StubServer:
    """The stub as an aiohttp application; `start()` binds and returns the port."""

    def __init__(self, config: StubConfig) -> None:
        self.config = config
        self.log: list[StubRequestLog] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._seen_prompts: set[tuple[str | None, str]] = set()
        self._queries = [0.0] * config.engines
        self._hits = [0.0] * config.engines
        self._runner: web.AppRunner | None = None
        self._gate = asyncio.Event()  # cleared by hold(): requests wait until release()
        self._gate.set()
        self.port: int | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/completions", self._generate)
        app.router.add_post("/v1/chat/completions", self._generate)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/stub/log", self._get_log)
        app.router.add_post("/stub/reset", self._reset)
        app.router.add_post("/stub/hold", self._hold)
        app.router.add_post("/stub/release", self._release)
        return app

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        self._runner = web.AppRunner(
            self.app(), access_log=None, handler_cancellation=True, shutdown_timeout=1.0
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, backlog=1024)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def reset(self) -> None:
        self.log.clear()
        self.max_in_flight = self.in_flight
        self._seen_prompts.clear()

    # -- handlers ---------------------------------------------------------------------------------

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        entry = StubRequestLog(
            index=len(self.log), key="", path=request.path, arrived=time.perf_counter()
        )
        self.log.append(entry)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            # Let the other requests of a burst take their arrival stamps before this one is
            # set up, so that set-up work is not counted as the client's delay.
            await asyncio.sleep(0)
            return await self._answer(request, entry)
        except (asyncio.CancelledError, ConnectionResetError):
            entry.disconnected = True
            raise
        finally:
            self.in_flight -= 1
            entry.finished = time.perf_counter()

    async def _answer(self, request: web.Request, entry: StubRequestLog) -> web.StreamResponse:
        body = json.loads(await request.read())
        if not self._gate.is_set():
            entry.held = True
            await self._gate.wait()
        entry.read = time.perf_counter()
        entry.body = body
        entry.cache_salt = body.get("cache_salt")
        entry.key = request.headers.get("X-Request-Id") or entry.cache_salt or f"stub-{entry.index}"
        entry.fault = body.get("stub_fault") or self.config.faults.get(entry.index)
        fault = entry.fault
        if fault is not None and fault not in FAULT_KINDS:
            return _error(400, f"unknown stub_fault {fault!r}; known: {', '.join(FAULT_KINDS)}")
        if fault in ("http_409", "http_429", "http_500"):
            return _error(int(fault[5:]), f"stub fault {fault}")
        if fault == "hang":
            await asyncio.sleep(3600)

        chat = request.path.endswith("/chat/completions")
        prompt_key = json.dumps(body.get("messages") if chat else body.get("prompt"))
        prompt_tokens = _count_prompt_tokens(body, chat)
        self._count_prefix_cache(entry.index, entry.cache_salt, prompt_key, prompt_tokens)
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or 16
        plan = _plan_tokens(
            prompt_key, min(max_tokens, self.config.output_tokens), max_tokens, fault
        )
        token_ids, finish_reason = plan

        if not body.get("stream"):
            return web.json_response(
                _full_response(body, chat, token_ids, finish_reason, prompt_tokens, self.config)
            )

        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        writer = _EventWriter(response, entry, body, chat, self.config.model)
        first_due = entry.read + self.config.ttft_s
        if not token_ids:
            await _sleep_until(first_due)
        for i, token_id in enumerate(token_ids):
            await _sleep_until(first_due + i * self.config.itl_s)
            if chat and i == 0:
                await writer.send({"role": "assistant", "content": ""}, None, None)
            if fault == "stall" and i == 1:
                await asyncio.sleep(3600)
            if fault == "drop" and i == len(token_ids) // 2:
                assert request.transport is not None
                request.transport.abort()
                entry.disconnected = True
                return response
            if fault == "malformed_sse" and i == 1:
                await response.write(b'data: {"choices": [{"text": "unterminated\n\n')
            last = i == len(token_ids) - 1
            await writer.send_token(token_id, finish_reason if last else None, fault)
        if not token_ids:
            await writer.send({"role": "assistant", "content": ""} if chat else "", finish_reason)
        options = body.get("stream_options") or {}
        if options.get("include_usage"):
            await writer.send_usage(prompt_tokens, len(token_ids))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    def _count_prefix_cache(
        self, index: int, salt: str | None, prompt_key: str, prompt_tokens: int
    ) -> None:
        engine = index % self.config.engines
        self._queries[engine] += prompt_tokens
        if (salt, prompt_key) in self._seen_prompts:
            self._hits[engine] += prompt_tokens
        self._seen_prompts.add((salt, prompt_key))

    async def _metrics(self, request: web.Request) -> web.Response:
        lines = []
        for name, values in (
            ("vllm:prefix_cache_queries_total", self._queries),
            ("vllm:prefix_cache_hits_total", self._hits),
        ):
            lines += [f"# HELP {name} stub counter", f"# TYPE {name} counter"]
            for engine, value in enumerate(values):
                labels = f'engine="{engine}",model_name="{self.config.model}"'
                lines.append(f"{name}{{{labels}}} {value}")
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.config.model}]})

    async def _get_log(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"max_in_flight": self.max_in_flight, "requests": [asdict(e) for e in self.log]}
        )

    async def _reset(self, request: web.Request) -> web.Response:
        self.reset()
        return web.Response(text="")

    async def _hold(self, request: web.Request) -> web.Response:
        """Park new requests until /stub/release: lets a benchmark start clients that have no
        start barrier of their own (`vllm bench serve`) at the same moment."""
        self._gate.clear()
        return web.Response(text="")

    async def _release(self, request: web.Request) -> web.Response:
        self._gate.set()
        return web.Response(text="")


class _EventWriter:
    """Builds vLLM-shaped SSE chunks and stamps each one just before it is written."""

    def __init__(
        self,
        response: web.StreamResponse,
        entry: StubRequestLog,
        body: dict,
        chat: bool,
        model: str,
    ) -> None:
        self.response = response
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
        chunk = {
            "id": self.id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [choice],
        }
        sent = time.perf_counter()
        chunk["stub_sent"] = sent
        payload = json.dumps(chunk).encode()
        if corrupt:  # bytes that are not UTF-8, inside the text's JSON string
            field_start = b'"content": "' if self.chat else b'"text": "'
            payload = payload.replace(field_start, field_start + b"\xff\xfe", 1)
        self.entry.sent.append(sent)
        await self.response.write(b"data: " + payload + b"\n\n")

    async def send_usage(self, prompt_tokens: int, completion_tokens: int) -> None:
        chunk = {
            "id": self.id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
            "stub_sent": time.perf_counter(),
        }
        await self.response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")

    def _logprobs(self, token_id: int, text: str) -> dict:
        """The chosen token at a fixed logprob and `top_k` lower-ranked neighbours."""
        top = [(token_id, -0.25)] + [
            ((token_id + j) % VOCAB_SIZE, -0.25 - j) for j in range(1, self.top_k)
        ]
        top = top[: self.top_k]

        def name(tid: int) -> str:
            return f"token_id:{tid}" if self.as_ids else token_text(tid)

        if self.chat:
            return {
                "content": [
                    {
                        "token": name(token_id),
                        "logprob": -0.25,
                        "bytes": list(text.encode()),
                        "top_logprobs": [
                            {"token": name(t), "logprob": lp, "bytes": list(token_text(t).encode())}
                            for t, lp in top
                        ],
                    }
                ]
            }
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
    body: dict,
    chat: bool,
    token_ids: list[int],
    finish_reason: str,
    prompt_tokens: int,
    config: StubConfig,
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
    return {"id": "stub", "model": config.model, "choices": [choice], "usage": usage}


def _error(status: int, message: str) -> web.Response:
    return web.json_response(
        {"error": {"message": message, "type": "StubError", "code": status}}, status=status
    )


async def _sleep_until(deadline: float) -> None:
    delay = deadline - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)


@contextlib.contextmanager
def serve_in_thread(config: StubConfig) -> Iterator[StubServer]:
    """Run a stub on its own event loop in a daemon thread, for tests in the caller's process."""
    server = StubServer(config)
    loop = asyncio.new_event_loop()
    started = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
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
        yield server
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
    _run_forever(StubServer(config), args.host, args.port)


def _run_forever(server: StubServer, host: str, port: int) -> None:
    async def serve() -> None:
        bound = await server.start(host, port)
        print(f"stub listening on http://{host}:{bound}", flush=True)
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
