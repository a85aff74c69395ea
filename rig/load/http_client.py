"""A small HTTP/1.1 client on raw sockets that stamps every read with the kernel's receive time.

Why not aiohttp (or httpx): a Python client time-stamps a token when its code gets to it, and
vLLM sends a token to all C streams at once, so the last of 200 is stamped after the client
has processed the 199 before it (tens of ms at C=200, benchmarks/README.md). Here the socket
is read with recvmsg and SO_TIMESTAMPNS, so each read carries the time the kernel received the
data, whatever the client was busy with. The send time is taken right before the request
goes to the socket. Plain HTTP only: TLS would hide the time stamps.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import struct
import time
import urllib.parse
from collections.abc import Callable
from typing import Literal


class MalformedResponse(ValueError):
    """The server's answer is not HTTP/1.1."""


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
            offset = _wall_minus_perf_counter()
            return data, min(seconds + nanoseconds * 1e-9 - offset, read_at), read_at
    return data, read_at, read_at


def _wall_minus_perf_counter() -> float:
    """CLOCK_REALTIME minus perf_counter, from the tightest of three readings of the wall clock
    each bracketed by two of perf_counter: a thread switch inside one bracket (another thread
    holding the GIL for milliseconds) would otherwise shift the offset by half its length."""
    best_width, best_offset = float("inf"), 0.0
    for _ in range(3):
        before = time.perf_counter()
        wall = time.time()
        after = time.perf_counter()
        if after - before < best_width:
            best_width, best_offset = after - before, wall - (before + after) / 2
    return best_offset


def _number(text: str, base: int, what: str) -> int:
    """A number the server sent; MalformedResponse (the server's fault) when it is none."""
    try:
        return int(text, base)
    except ValueError:
        raise MalformedResponse(f"{what} is not a number: {text[:40]!r}") from None


class HttpResponse:
    """Incremental HTTP/1.1 response parser: status and headers, then the body (chunked,
    Content-Length or until close) handed to `on_body` piece by piece with its time stamp."""

    def __init__(
        self,
        on_body: Callable[[bytes, float], None],
        on_head: Callable[[], None] | None = None,
    ) -> None:
        self.on_body = on_body
        self.on_head = on_head  # called once the status line and headers are in
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
        status = parts[1] if len(parts) > 1 else ""
        if not parts[0].startswith("HTTP/") or not (status.isascii() and status.isdigit()):
            raise MalformedResponse(f"not an HTTP response: {status_line[:80]!r}")
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
            self._remaining = _number(headers["content-length"], 10, "Content-Length")
            self.complete = self._remaining == 0
        else:
            self._framing = "close"
            self.keep_alive = False
        if self.on_head is not None:
            self.on_head()
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
            size = _number(line.split(b";", 1)[0].strip().decode("latin-1"), 16, "chunk size")
            self._remaining = size
            self._chunk_state = "data" if size else "trailer"


class Connection:
    """One keep-alive connection, read with recvmsg from the event loop's reader callback."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.reusable = True

    @classmethod
    async def open(cls, address: tuple) -> Connection:
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

    async def exchange(self, request: bytes, response: HttpResponse) -> None:
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

    def _readable(self, response: HttpResponse, finished: asyncio.Future) -> None:
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
        self._idle: list[tuple[Connection, float]] = []  # with the time it went idle

    async def acquire(self, fresh: bool = False) -> tuple[Connection, bool]:
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
        return await Connection.open(self._address), False

    def release(self, connection: Connection) -> None:
        if connection.reusable:
            self._idle.append((connection, time.monotonic()))
        else:
            connection.close()

    def close(self) -> None:
        while self._idle:
            self._idle.pop()[0].close()
