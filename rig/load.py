"""Load: send the same ordered greedy requests to every side at once and time each token.

Requests go over a small HTTP/1.1 client that reads the kernel's receive time stamp of every
read (see "HTTP/1.1 with kernel receive time stamps" below), so a busy client does not inflate
the latencies it reports: against the paced stub its p99 TTFT error at C=200 on both sides is
about 0.02 ms, where aiohttp's is 130 ms and httpx's seconds (benchmarks/README.md).

Where there are cores for it, each side (reference, candidate, ...) is driven by its own spawned
process with its own event loop. One loop on one core keeps the time stamps exact up to ~23k
token events/s; two sides at C=200 with a 20 ms inter-token gap already send 20k, and a GPU
server can go faster. Apart, each side gets a core and cannot delay the other's sends; with
fewer than two cores per side one loop does better (`run_level(isolation=...)`). The caller's
main module must be importable without side effects (spawn re-imports it): guard scripts with
`if __name__ == "__main__":`.

Timing follows `vllm bench serve`, on the monotonic clock (`time.perf_counter`):
TTFT = first SSE message with non-empty `choices` minus the send time, ITL = gaps between
such messages, E2EL = last such message minus the send time.

A failed request becomes a record with `error` set ("<kind>: <detail>", kinds: timeout,
http_<status>, connection, malformed_sse, cancelled); only a crash of the client itself raises.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import itertools
import json
import multiprocessing
import os
import queue
import re
import signal
import socket
import struct
import time
import traceback
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import aiohttp
import numpy as np

from rig.placement import server_label

Endpoint = Literal["completions", "chat"]

MAX_CACHE_SALT_CHARS = 128
CACHE_SALT_FORBIDDEN = ("@", "/", "\\", "\x00")
_ERROR_BODY_CHARS = 300


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int
    seed: int = 0
    top_logprobs: int = 0  # 0: do not ask for logprobs
    chat_template_kwargs: dict | None = None  # e.g. {"enable_thinking": False}
    extra_body: dict = field(default_factory=dict)  # merged into the JSON body last


def validate_cache_salt(salt: str) -> None:
    """vLLM's rules (vllm.entrypoints.generate.base.protocol.validate_cache_salt)."""
    if not isinstance(salt, str) or not salt:
        raise ValueError(f"cache_salt must be a non-empty string, got {salt!r}")
    if len(salt) > MAX_CACHE_SALT_CHARS:
        raise ValueError(f"cache_salt {salt!r} is longer than {MAX_CACHE_SALT_CHARS} characters")
    if any(char in salt for char in CACHE_SALT_FORBIDDEN):
        raise ValueError(f"cache_salt {salt!r} contains one of '@', '/', '\\', NUL")


@dataclass(frozen=True)
class RequestSpec:
    request_id: str  # unique within the run
    prompt_id: str
    level: int  # the concurrency level this request belongs to
    repeat: int
    index: int  # position in the level's ordered list
    endpoint: Endpoint
    prompt: str | list[int] | None  # completions: text or token ids
    messages: tuple[dict, ...] | None  # chat
    cache_salt: str  # the caller guarantees uniqueness; vLLM's rules are checked here
    sampling: SamplingParams
    warmup: bool = False  # sent before the measured requests of its side; flagged in the record

    def __post_init__(self) -> None:
        validate_cache_salt(self.cache_salt)
        if self.endpoint == "completions" and self.prompt is None:
            raise ValueError(f"request {self.request_id}: a completions request needs a prompt")
        if self.endpoint == "chat" and not self.messages:
            raise ValueError(f"request {self.request_id}: a chat request needs messages")


@dataclass(frozen=True)
class ServerTarget:
    side: str  # "reference" | "candidate" | ...
    base_url: str  # http://127.0.0.1:PORT
    model: str  # served model name
    api_key: str | None = None
    replica: int = 0  # which reference/candidate pair this server belongs to

    @property
    def label(self) -> str:
        return server_label(self.side, self.replica)


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: dict[int, float]  # top-k alternatives: token id -> logprob


@dataclass
class RequestRecord:
    side: str
    request_id: str
    prompt_id: str
    level: int
    repeat: int
    index: int
    cache_salt: str
    sent_at: float  # wall clock (time.time()) when sent, for reports
    ttft_s: float | None
    itl_s: list[float]
    e2el_s: float | None
    text: str
    token_ids: list[int] | None
    finish_reason: str | None
    prompt_tokens: int | None
    output_tokens: int | None
    logprobs: list[TokenLogprob] | None
    http_status: int | None
    error: str | None  # None on success, else "<kind>: <detail>"
    sent_monotonic: float | None = None  # perf_counter when sent; same clock as the timings
    warmup: bool = False
    # The longest the client left received data unread. Time stamps are exact while it stays
    # below the server's inter-token gap; beyond that the kernel may merge two tokens' reads
    # and the earlier token takes the later one's time: the client was overloaded.
    client_lag_s: float | None = None
    replica: int = 0  # the replica pair that served it; a request pair never spans two

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False)

    @classmethod
    def from_json(cls, line: str) -> RequestRecord:
        data = json.loads(line)
        if data["logprobs"] is not None:
            data["logprobs"] = [
                TokenLogprob(
                    token_id=p["token_id"],
                    logprob=p["logprob"],
                    top={int(k): v for k, v in p["top"].items()},
                )
                for p in data["logprobs"]
            ]
        return cls(**data)


@dataclass(frozen=True)
class SideJob:
    target: ServerTarget
    specs: list[RequestSpec]  # sent in order, at most `concurrency` in flight
    concurrency: int | None = None  # this server's share of the level's C; None: all of it


@dataclass(frozen=True)
class PrefixCacheCounters:
    queries: float
    hits: float


# -- one request ---------------------------------------------------------------------------------


def request_body(spec: RequestSpec, model: str) -> dict[str, Any]:
    """The JSON body for one request: greedy, streamed, salted, token ids and usage returned."""
    sampling = spec.sampling
    body: dict[str, Any] = {"model": model}
    if spec.endpoint == "chat":
        body["messages"] = list(spec.messages or ())
        body["max_completion_tokens"] = sampling.max_tokens
    else:
        body["prompt"] = spec.prompt
        body["max_tokens"] = sampling.max_tokens
    body.update(
        temperature=0.0,
        seed=sampling.seed,
        stream=True,
        stream_options={"include_usage": True},
        cache_salt=spec.cache_salt,
        return_token_ids=True,
    )
    if sampling.top_logprobs > 0:
        body["return_tokens_as_token_ids"] = True
        if spec.endpoint == "chat":
            body.update(logprobs=True, top_logprobs=sampling.top_logprobs)
        else:
            body["logprobs"] = sampling.top_logprobs
    if spec.endpoint == "chat" and sampling.chat_template_kwargs is not None:
        body["chat_template_kwargs"] = sampling.chat_template_kwargs
    body.update(sampling.extra_body)
    return body


class _MalformedStream(Exception):
    """The server broke the SSE / JSON protocol; the request fails as malformed_sse."""


# What a response that breaks the protocol raises while it is parsed.
_PROTOCOL_ERRORS = (_MalformedStream, KeyError, TypeError, ValueError, AttributeError)


class _StreamAccumulator:
    """Folds the SSE messages of one response into a RequestRecord."""

    def __init__(self, record: RequestRecord, start: float, want_logprobs: bool) -> None:
        self.record = record
        self.start = start  # may be moved until finish(): times are kept absolute till then
        self.token_times: list[float] = []
        self.buffer = b""
        self.text_parts: list[str] = []
        self.token_ids: list[int] = []
        self.saw_token_ids = False
        self.logprobs: list[TokenLogprob] | None = [] if want_logprobs else None
        self.done = False
        self.problem: str | None = None  # first protocol problem seen; the stream is still read

    def feed(self, data: bytes, received: float) -> None:
        self.buffer += data
        while (end := self.buffer.find(b"\n\n")) >= 0:
            event, self.buffer = self.buffer[:end], self.buffer[end + 2 :]
            self._event(event, received)

    def finish(self) -> None:
        """Fill the record in; safe to call again (it is, on every exit of send_request)."""
        rest, self.buffer = self.buffer.strip(), b""
        if rest:  # a last event without its blank line
            try:
                self._event(rest, self.token_times[-1] if self.token_times else self.start)
            except _PROTOCOL_ERRORS as exc:
                self._problem(f"malformed_sse: {type(exc).__name__}: {exc}")
        record = self.record
        record.text = "".join(self.text_parts)
        record.token_ids = self.token_ids if self.saw_token_ids else None
        record.logprobs = self.logprobs
        times = self.token_times
        if times:
            record.ttft_s = times[0] - self.start
            record.itl_s = [later - earlier for earlier, later in itertools.pairwise(times)]
            record.e2el_s = times[-1] - self.start

    def _event(self, event: bytes, received: float) -> None:
        for line in event.split(b"\n"):
            line = line.rstrip(b"\r")
            if not line.startswith(b"data:"):
                continue  # comments (pings), event names, ids
            payload = line[5:].strip()
            if payload == b"[DONE]":
                self.done = True
                continue
            try:
                message = json.loads(payload)
            except UnicodeDecodeError:
                self._problem("malformed_sse: invalid UTF-8 in an event")
                message = json.loads(payload.decode("utf-8", errors="replace"))
            except ValueError as exc:
                self._problem(f"malformed_sse: event is not JSON ({exc}): {payload[:80]!r}")
                continue
            self._message(message, received)

    def _problem(self, detail: str) -> None:
        if self.problem is None:
            self.problem = detail

    def _message(self, message: dict, received: float) -> None:
        if not isinstance(message, dict):
            raise _MalformedStream(f"event is not a JSON object: {message!r:.80}")
        if error := message.get("error"):
            code = error.get("code") if isinstance(error, dict) else None
            detail = error.get("message") if isinstance(error, dict) else error
            kind = f"http_{code}" if isinstance(code, int) else "malformed_sse"
            self._problem(f"{kind}: error event in the stream: {detail}")
            return
        if usage := message.get("usage"):
            self.record.prompt_tokens = usage.get("prompt_tokens")
            self.record.output_tokens = usage.get("completion_tokens")
        choices = message.get("choices")
        if not choices:
            return
        record = self.record
        self.token_times.append(received)
        choice = choices[0]
        delta = choice.get("delta")
        text = choice.get("text") if delta is None else delta.get("content")
        if text:
            self.text_parts.append(text)
        if (ids := choice.get("token_ids")) is not None:
            self.saw_token_ids = True
            self.token_ids.extend(ids)
        if choice.get("finish_reason") is not None:
            record.finish_reason = choice["finish_reason"]
        if self.logprobs is not None and (logprobs := choice.get("logprobs")):
            self.logprobs.extend(_parse_logprobs(logprobs))


def _token_id(name: str) -> int:
    """vLLM names tokens "token_id:<id>" when asked with return_tokens_as_token_ids."""
    prefix, _, number = name.partition(":")
    if prefix != "token_id" or not number.lstrip("-").isdigit():
        raise _MalformedStream(f"logprob token {name!r} is not of the form 'token_id:<id>'")
    return int(number)


def _parse_logprobs(logprobs: dict) -> list[TokenLogprob]:
    if "content" in logprobs:  # chat
        return [
            TokenLogprob(
                token_id=_token_id(entry["token"]),
                logprob=entry["logprob"],
                top={_token_id(alt["token"]): alt["logprob"] for alt in entry["top_logprobs"]},
            )
            for entry in logprobs["content"] or []
        ]
    return [  # completions
        TokenLogprob(
            token_id=_token_id(token),
            logprob=logprob,
            top={_token_id(name): value for name, value in (top or {}).items()},
        )
        for token, logprob, top in zip(
            logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"], strict=True
        )
    ]


def _empty_record(target: ServerTarget, spec: RequestSpec) -> RequestRecord:
    return RequestRecord(
        side=target.side,
        replica=target.replica,
        request_id=spec.request_id,
        prompt_id=spec.prompt_id,
        level=spec.level,
        repeat=spec.repeat,
        index=spec.index,
        cache_salt=spec.cache_salt,
        sent_at=time.time(),
        ttft_s=None,
        itl_s=[],
        e2el_s=None,
        text="",
        token_ids=None,
        finish_reason=None,
        prompt_tokens=None,
        output_tokens=None,
        logprobs=None,
        http_status=None,
        error=None,
        warmup=spec.warmup,
    )


# -- HTTP/1.1 with kernel receive time stamps --------------------------------------------------
#
# Why not aiohttp (or httpx): a Python client time-stamps a token when its code gets to it, and
# vLLM sends a token to all C streams at once, so the last of 200 is stamped after the client
# has processed the 199 before it (tens of ms at C=200, benchmarks/README.md). Here the socket
# is read with recvmsg and SO_TIMESTAMPNS, so each read carries the time the kernel received the
# data, whatever the client was busy with. The send time is taken right before the request
# goes to the socket. Plain HTTP only: TLS would hide the time stamps.

_SO_TIMESTAMPNS = 35  # Linux; also the ancillary message type (SCM_TIMESTAMPNS)
_RECV_BYTES = 256 * 1024
_ANCILLARY_BYTES = socket.CMSG_SPACE(16)


def enable_receive_stamps(sock: socket.socket) -> None:
    """Ask the kernel to stamp received data (Linux); elsewhere reads are stamped on arrival
    in Python."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)


def recv_stamped(sock: socket.socket) -> tuple[bytes, float, float]:
    """One non-blocking read: the data, the time the kernel received it and the time it was
    read, both on perf_counter's clock. The kernel's stamp is CLOCK_REALTIME; it is moved over
    with the offset between the two clocks measured at the read, so a clock step can only
    touch that one read."""
    data, ancillary, _, _ = sock.recvmsg(_RECV_BYTES, _ANCILLARY_BYTES)
    read_at = time.perf_counter()
    for level, kind, raw in ancillary:
        if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and len(raw) >= 16:
            seconds, nanoseconds = struct.unpack("qq", raw[:16])
            wall = time.time()
            offset = wall - (read_at + time.perf_counter()) / 2  # wall read between the two
            return data, min(seconds + nanoseconds * 1e-9 - offset, read_at), read_at
    return data, read_at, read_at


class _HttpResponse:
    """Incremental HTTP/1.1 response parser: status and headers, then the body (chunked,
    Content-Length or until close) handed to `on_body` piece by piece with its time stamp."""

    def __init__(self, on_body: Callable[[bytes, float], None]) -> None:
        self.on_body = on_body
        self.status: int | None = None
        self.keep_alive = True
        self.complete = False
        self.received_any = False
        self.sent_at: float | None = None  # perf_counter right before the request was sent
        self.read_lag = 0.0  # longest wait between the kernel receiving data and us reading it
        self._pending = b""
        self._framing: Literal["chunked", "length", "close"] | None = None
        self._remaining = 0
        self._chunk_state: Literal["size", "data", "crlf", "trailer"] = "size"

    def feed(self, data: bytes, stamp: float) -> None:
        self.received_any = True
        self._pending += data
        if self._framing is None and not self._parse_head():
            return
        if self._framing == "chunked":
            self._feed_chunked(stamp)
        elif self._framing == "length":
            piece, self._pending = (
                self._pending[: self._remaining],
                self._pending[self._remaining :],
            )
            self._remaining -= len(piece)
            if piece:
                self.on_body(piece, stamp)
            self.complete = self._remaining == 0
        elif self._pending:
            piece, self._pending = self._pending, b""
            self.on_body(piece, stamp)

    def feed_eof(self) -> None:
        if self._framing == "close":
            self.complete = True
        else:
            raise ConnectionResetError("the server closed the connection mid-response")

    def _parse_head(self) -> bool:
        end = self._pending.find(b"\r\n\r\n")
        if end < 0:
            return False
        head, self._pending = self._pending[:end].decode("latin-1"), self._pending[end + 4 :]
        status_line, *header_lines = head.split("\r\n")
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
            raise _MalformedStream(f"not an HTTP response: {status_line[:80]!r}")
        self.status = int(parts[1])
        headers = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        self.keep_alive = headers.get("connection", "").lower() != "close"
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self._framing = "chunked"
        elif "content-length" in headers:
            self._framing = "length"
            self._remaining = int(headers["content-length"])
            self.complete = self._remaining == 0
        else:
            self._framing = "close"
            self.keep_alive = False
        return True

    def _feed_chunked(self, stamp: float) -> None:
        while not self.complete:
            if self._chunk_state == "data":
                piece = self._pending[: self._remaining]
                if not piece:
                    return
                self._pending = self._pending[len(piece) :]
                self._remaining -= len(piece)
                self.on_body(piece, stamp)
                if self._remaining == 0:
                    self._chunk_state = "crlf"
                continue
            if self._chunk_state == "crlf":
                if len(self._pending) < 2:
                    return
                self._pending = self._pending[2:]
                self._chunk_state = "size"
                continue
            end = self._pending.find(b"\r\n")
            if end < 0:
                return
            line, self._pending = self._pending[:end], self._pending[end + 2 :]
            if self._chunk_state == "trailer":
                self.complete = line == b""
                continue
            size = int(line.split(b";", 1)[0].strip() or b"x", 16)
            self._remaining = size
            self._chunk_state = "data" if size else "trailer"


class _Connection:
    """One keep-alive connection, read with recvmsg from the event loop's reader callback."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.reusable = True

    @classmethod
    async def open(cls, address: tuple) -> _Connection:
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            enable_receive_stamps(sock)
            await asyncio.get_running_loop().sock_connect(sock, address)
        except BaseException:
            sock.close()
            raise
        return cls(sock)

    async def exchange(self, request: bytes, response: _HttpResponse) -> None:
        """Send the request and read the whole response into `response`."""
        loop = asyncio.get_running_loop()
        finished = loop.create_future()
        loop.add_reader(self.sock.fileno(), self._readable, response, finished)
        try:
            response.sent_at = time.perf_counter()
            await loop.sock_sendall(self.sock, request)
            await finished
        except BaseException:
            self.reusable = False
            raise
        finally:
            loop.remove_reader(self.sock.fileno())
        self.reusable = response.keep_alive

    def _readable(self, response: _HttpResponse, finished: asyncio.Future) -> None:
        while not finished.done():
            try:
                data, stamp, read_at = recv_stamped(self.sock)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                finished.set_exception(exc)
                return
            response.read_lag = max(response.read_lag, read_at - stamp)
            try:
                if data:
                    response.feed(data, stamp)
                else:
                    response.feed_eof()
            except Exception as exc:
                finished.set_exception(exc)
                return
            if response.complete:
                finished.set_result(None)
            elif not data:
                return

    def close(self) -> None:
        self.reusable = False
        self.sock.close()


IDLE_REUSE_S = 2.0  # reuse a keep-alive connection only if it went idle this recently


class ConnectionPool:
    """Keep-alive connections to one server, at most as many as requests in flight."""

    def __init__(self, base_url: str) -> None:
        url = urllib.parse.urlsplit(base_url)
        if url.scheme != "http" or url.hostname is None:
            raise ValueError(
                f"{base_url!r}: the load client speaks plain http:// only (it reads kernel "
                "receive time stamps, which TLS would hide); put a plain-HTTP proxy in front"
            )
        self.host = url.hostname
        self.port = url.port or 80
        self.host_header = url.netloc
        self.path_prefix = url.path.rstrip("/")
        self._address: tuple | None = None
        self._idle: list[tuple[_Connection, float]] = []  # with the time it went idle

    async def acquire(self, fresh: bool = False) -> tuple[_Connection, bool]:
        """A connection and whether it was reused (then the server may have closed it)."""
        while self._idle and not fresh:
            connection, released_at = self._idle.pop()
            if time.monotonic() - released_at < IDLE_REUSE_S:
                return connection, True
            connection.close()  # the server has likely closed it (uvicorn: 5 s keep-alive)
        if self._address is None:
            try:
                ipaddress.ip_address(self.host)
                self._address = (self.host, self.port)
            except ValueError:  # a name: resolve it once (in a thread, so it costs time)
                infos = await asyncio.get_running_loop().getaddrinfo(
                    self.host, self.port, type=socket.SOCK_STREAM
                )
                self._address = infos[0][4]
        return await _Connection.open(self._address), False

    def release(self, connection: _Connection) -> None:
        if connection.reusable:
            self._idle.append((connection, time.monotonic()))
        else:
            connection.close()

    def close(self) -> None:
        while self._idle:
            self._idle.pop()[0].close()


def _http_request(pool: ConnectionPool, target: ServerTarget, spec: RequestSpec) -> bytes:
    path = pool.path_prefix + (
        "/v1/chat/completions" if spec.endpoint == "chat" else "/v1/completions"
    )
    body = json.dumps(request_body(spec, target.model)).encode()
    lines = [
        f"POST {path} HTTP/1.1",
        f"Host: {pool.host_header}",
        "Content-Type: application/json",
        "Accept: text/event-stream",
        f"Content-Length: {len(body)}",
        f"X-Request-Id: {spec.request_id}",
    ]
    if target.api_key:
        lines.append(f"Authorization: Bearer {target.api_key}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def send_request(
    pool: ConnectionPool, target: ServerTarget, spec: RequestSpec, timeout_s: float
) -> RequestRecord:
    """One streamed request; every failure ends up in the record's `error`, never raised.

    Cancellation is the exception: the record is completed with a "cancelled" error and
    attached to the CancelledError (`.record`) for the caller to emit.
    """
    record = _empty_record(target, spec)
    request = _http_request(pool, target, spec)
    stream = _StreamAccumulator(record, time.perf_counter(), spec.sampling.top_logprobs > 0)
    error_body = bytearray()
    response = _HttpResponse(lambda data, stamp: None)

    def on_body(data: bytes, stamp: float) -> None:
        if response.status == 200:
            stream.feed(data, stamp)
        elif len(error_body) < _ERROR_BODY_CHARS:
            error_body.extend(data)

    try:
        async with asyncio.timeout(timeout_s):
            for attempt in (1, 2):
                response = _HttpResponse(on_body)
                connection, reused = await pool.acquire(fresh=attempt > 1)
                try:
                    record.sent_at = time.time()
                    await connection.exchange(request, response)
                except OSError:
                    if reused and not response.received_any and attempt == 1:
                        # The server had closed this idle keep-alive connection; the others
                        # idle since the same moment are likely closed too: retry on a new one.
                        pool.close()
                        continue
                    raise
                finally:
                    pool.release(connection)
                break
        stream.start = response.sent_at  # type: ignore[assignment]  (set: it was sent)
        stream.finish()
        if response.status != 200:
            text = bytes(error_body).decode("utf-8", errors="replace")
            record.error = f"http_{response.status}: {text}"
        elif stream.problem is not None:
            record.error = stream.problem
        elif not stream.done:
            record.error = "connection: the stream ended before data: [DONE]"
    except TimeoutError:
        record.error = f"timeout: no complete response within {timeout_s} s"
    except OSError as exc:
        record.error = f"connection: {type(exc).__name__}: {exc}"
    except _PROTOCOL_ERRORS as exc:
        record.error = f"malformed_sse: {type(exc).__name__}: {exc}"
    except asyncio.CancelledError as exc:
        record.error = "cancelled: the run was interrupted"
        exc.record = record  # type: ignore[attr-defined]
        raise
    finally:
        record.http_status = response.status
        record.client_lag_s = response.read_lag
        if response.sent_at is not None:
            record.sent_monotonic = stream.start = response.sent_at
        stream.finish()
    return record


# -- one side -----------------------------------------------------------------------------------


def arrival_offsets(
    count: int, request_rate: float | None, burstiness: float, seed: int
) -> list[float] | None:
    """Send times relative to the first request, gamma-distributed gaps (Poisson at
    burstiness 1, like `vllm bench serve`); None means send as fast as concurrency allows.
    The same seed gives every side the same schedule."""
    if request_rate is None or request_rate == float("inf") or count == 0:
        return None
    if request_rate <= 0 or burstiness <= 0:
        raise ValueError("request_rate and burstiness must be positive")
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (request_rate * burstiness), size=count)
    gaps[0] = 0.0
    return np.cumsum(gaps).tolist()


async def drive_side(
    job: SideJob,
    concurrency: int,
    timeout_s: float,
    emit: Callable[[RequestRecord], None],
    *,
    offsets: list[float] | None = None,
    level_timeout_s: float | None = None,
    before_measured: Callable[[], Awaitable[Any]] | None = None,
) -> None:
    """Send one side's specs in order with at most `concurrency` in flight: warm-up specs
    first, then `await before_measured()` (a start barrier across sides), then the measured
    specs, paced by `offsets` when given.

    Every spec yields exactly one record through `emit`; when `level_timeout_s` runs out the
    requests in flight and those never sent get a "timeout" record.
    """
    warmups = [s for s in job.specs if s.warmup]
    measured = [s for s in job.specs if not s.warmup]
    pool = ConnectionPool(job.target.base_url)
    slots = asyncio.Semaphore(job.concurrency or concurrency)
    in_flight: set[asyncio.Task] = set()
    emitted: set[str] = set()
    level_expired = False
    expired_error = f"timeout: level deadline of {level_timeout_s} s passed"

    def finish(record: RequestRecord) -> None:
        emitted.add(record.request_id)
        emit(record)

    async def one(spec: RequestSpec) -> None:
        try:
            finish(await send_request(pool, job.target, spec, timeout_s))
        except asyncio.CancelledError as exc:
            if (cancelled := getattr(exc, "record", None)) is not None:
                if level_expired:
                    cancelled.error = expired_error
                finish(cancelled)
            raise
        finally:
            slots.release()

    async def dispatch(specs: list[RequestSpec], paced: bool) -> None:
        began = time.perf_counter()
        for i, spec in enumerate(specs):
            if paced and offsets is not None:
                await asyncio.sleep(max(0.0, began + offsets[i] - time.perf_counter()))
            await slots.acquire()
            task = asyncio.create_task(one(spec))
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
        while in_flight:
            await asyncio.wait(set(in_flight))

    async def run_all() -> None:
        await dispatch(warmups, paced=False)
        if before_measured is not None:
            await before_measured()
        await dispatch(measured, paced=True)

    try:
        async with asyncio.timeout(level_timeout_s):
            await run_all()
    except TimeoutError:
        level_expired = True
        for task in in_flight:
            task.cancel()
        await asyncio.gather(*in_flight, return_exceptions=True)
        for spec in job.specs:
            if spec.request_id not in emitted:
                record = _empty_record(job.target, spec)
                record.error = expired_error
                finish(record)
    finally:
        for task in in_flight:
            task.cancel()
        await asyncio.gather(*in_flight, return_exceptions=True)
        pool.close()


# -- a level: all sides at once -----------------------------------------------------------------


def run_level(
    jobs: list[SideJob],
    concurrency: int,
    *,
    timeout_s: float,
    request_rate: float | None = None,
    burstiness: float = 1.0,
    on_record: Callable[[RequestRecord], None] | None = None,
    progress: bool = True,
    level_timeout_s: float | None = None,
    seed: int = 0,
    isolation: Literal["auto", "process", "inline"] = "auto",
) -> dict[str, list[RequestRecord]]:
    """Drive every side at the same time; records come back per side in spec order.

    `isolation`: "process" drives each side from its own spawned process, "inline" all sides
    from one event loop in this process; "auto" takes processes when there are at least two
    cores per side (one for the side, one for what it talks to), because processes that
    outnumber the cores leave sockets unread for whole scheduler slices.

    `on_record` runs in the caller's process as each record completes (warm-up records
    included, flagged `warmup`). Ctrl-C cancels the requests in flight (their records get a
    "cancelled" error and still reach `on_record`), stops the workers and re-raises
    KeyboardInterrupt.
    """
    _check_jobs(jobs, concurrency)
    measured_counts = {len([s for s in job.specs if not s.warmup]) for job in jobs}
    offsets = arrival_offsets(max(measured_counts, default=0), request_rate, burstiness, seed)
    total = sum(len(job.specs) for job in jobs)
    records: dict[str, dict[str, RequestRecord]] = {job.target.label: {} for job in jobs}
    bar = _progress_bar(total, concurrency, progress)

    def collect(record: RequestRecord) -> None:
        records[server_label(record.side, record.replica)][record.request_id] = record
        if on_record is not None:
            on_record(record)
        if bar is not None:
            bar.update(1)

    try:
        if isolation == "auto":
            isolation = "process" if _cores() >= 2 * len(jobs) else "inline"
        if isolation == "inline":
            _run_inline(jobs, concurrency, timeout_s, offsets, level_timeout_s, collect)
        else:
            _run_in_processes(jobs, concurrency, timeout_s, offsets, level_timeout_s, collect)
    finally:
        if bar is not None:
            bar.close()
    by_side: dict[str, list[RequestRecord]] = {}
    for job in jobs:
        by_side.setdefault(job.target.side, []).extend(
            records[job.target.label][s.request_id] for s in job.specs
        )
    return by_side


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _check_jobs(jobs: list[SideJob], concurrency: int) -> None:
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")
    labels = [job.target.label for job in jobs]
    if len(set(labels)) != len(labels):
        raise ValueError(f"each server may appear once per level, got {labels}")
    if any(job.concurrency is not None and job.concurrency < 1 for job in jobs):
        raise ValueError("a server's share of the concurrency must be at least 1")
    for job in jobs:
        ConnectionPool(job.target.base_url)  # refuses what it cannot talk to
        for attribute in ("request_id", "cache_salt"):
            values = [getattr(spec, attribute) for spec in job.specs]
            if len(set(values)) != len(values):
                duplicate = next(v for v in values if values.count(v) > 1)
                raise ValueError(f"{job.target.side}: {attribute} {duplicate!r} is not unique")


def _progress_bar(total: int, concurrency: int, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=f"C={concurrency}", unit="req", leave=False)


def _run_inline(jobs, concurrency, timeout_s, offsets, level_timeout_s, collect) -> None:
    async def main() -> None:
        barrier = asyncio.Barrier(len(jobs))
        await asyncio.gather(
            *(
                drive_side(
                    job,
                    concurrency,
                    timeout_s,
                    collect,
                    offsets=offsets,
                    level_timeout_s=level_timeout_s,
                    before_measured=barrier.wait,
                )
                for job in jobs
            )
        )

    _event_loop_runner()(main())


def _event_loop_runner() -> Callable:
    """uvloop where installed (vLLM depends on it): it roughly halves the client's per-event
    cost and so its timing error under load."""
    try:
        import uvloop

        return uvloop.run
    except ImportError:
        return asyncio.run


def _run_in_processes(jobs, concurrency, timeout_s, offsets, level_timeout_s, collect) -> None:
    context = multiprocessing.get_context("spawn")
    messages = context.Queue()
    stop = context.Event()
    barrier = context.Barrier(len(jobs))
    workers = [
        context.Process(
            target=_side_worker,
            args=(job, concurrency, timeout_s, offsets, level_timeout_s, messages, stop, barrier),
            name=f"rig-load-{job.target.label}",
            daemon=True,
        )
        for job in jobs
    ]
    for worker in workers:
        worker.start()
    running = {job.target.label for job in jobs}
    failure: str | None = None
    interrupted = False
    try:
        while running:
            try:
                kind, side, payload = messages.get(timeout=0.2)
            except queue.Empty:
                dead = [w for w in workers if w.exitcode not in (None, 0)]
                if dead and failure is None:
                    failure = f"load worker {dead[0].name} died with exit code {dead[0].exitcode}"
                    stop.set()
                    barrier.abort()
                if dead and all(w.exitcode is not None for w in workers):
                    break
                continue
            except KeyboardInterrupt:
                interrupted = True
                stop.set()
                continue
            if kind == "record":
                collect(payload)
            elif kind == "failed":
                failure = failure or f"load worker for {side} failed:\n{payload}"
                stop.set()
                barrier.abort()
                running.discard(side)
            else:
                running.discard(side)
    finally:
        stop.set()
        for worker in workers:
            worker.join(timeout=10)
            if worker.is_alive():
                worker.kill()
    if interrupted:
        raise KeyboardInterrupt
    if failure is not None:
        raise RuntimeError(failure)


def _side_worker(job, concurrency, timeout_s, offsets, level_timeout_s, messages, stop, barrier):
    """One side in its own process: Ctrl-C is the parent's to handle, it tells us via `stop`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    side = job.target.label

    async def main() -> None:
        loop = asyncio.get_running_loop()

        async def wait_for_peers() -> None:
            await loop.run_in_executor(None, barrier.wait)

        drive = asyncio.create_task(
            drive_side(
                job,
                concurrency,
                timeout_s,
                lambda record: messages.put(("record", side, record)),
                offsets=offsets,
                level_timeout_s=level_timeout_s,
                before_measured=wait_for_peers,
            )
        )
        while not drive.done():
            await asyncio.wait([drive], timeout=0.05)
            if stop.is_set() and not drive.done():
                drive.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await drive

    try:
        _event_loop_runner()(main())
    except Exception:
        messages.put(("failed", side, traceback.format_exc()))
    else:
        messages.put(("done", side, None))


# -- prefix cache counters -----------------------------------------------------------------------

_COUNTER_LINE = re.compile(r"^(?P<name>[A-Za-z_:][\w:]*)(?:\{[^}]*\})?\s+(?P<value>\S+)")


async def read_prefix_cache_counters(
    base_url: str, api_key: str | None = None
) -> PrefixCacheCounters:
    """vLLM's prefix-cache counters from /metrics, summed over label sets (engines, models)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session,
        session.get(base_url.rstrip("/") + "/metrics", headers=headers) as response,
    ):
        response.raise_for_status()
        text = await response.text()
    return parse_prefix_cache_counters(text)


def parse_prefix_cache_counters(metrics_text: str) -> PrefixCacheCounters:
    totals = {"vllm:prefix_cache_queries_total": 0.0, "vllm:prefix_cache_hits_total": 0.0}
    found = set()
    for line in metrics_text.splitlines():
        match = _COUNTER_LINE.match(line)
        if match and match["name"] in totals:
            totals[match["name"]] += float(match["value"])
            found.add(match["name"])
    if len(found) != len(totals):
        missing = ", ".join(sorted(set(totals) - found))
        raise ValueError(f"/metrics has no {missing} (is this a vLLM server with prefix caching?)")
    return PrefixCacheCounters(
        queries=totals["vllm:prefix_cache_queries_total"],
        hits=totals["vllm:prefix_cache_hits_total"],
    )
