"""The stub's side of HTTP/1.1 on a raw socket: requests read with the kernel's receive time
stamp of their first bytes (the same recvmsg stamps as rig.load.http_client), keep-alive,
Content-Length request bodies, chunked responses and a TCP reset on demand. An HTTP framework
would read the socket for the stub and hide those stamps."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import time
from dataclasses import dataclass
from http import HTTPStatus

from rig.load.http_client import recv_stamped

MAX_REQUEST_BYTES = 64 * 1024 * 1024


@dataclass
class HttpRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    arrived: float


class ClientGone(Exception):
    """The client closed its connection while the stub was still answering."""


class Wire:
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

    async def read_request(self) -> HttpRequest | None:
        """The next request, or None once the client has closed the connection."""
        while True:
            head_end = self._buffer.find(b"\r\n\r\n")
            if head_end >= 0:
                request = self._parse(head_end)
                if request is not None:
                    return request
            if self._eof:
                return None
            if len(self._buffer) > MAX_REQUEST_BYTES:
                raise ValueError("request too large")
            self._readable.clear()
            await self._readable.wait()

    def _parse(self, head_end: int) -> HttpRequest | None:
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
        return HttpRequest(method, target.split("?", 1)[0], headers, body, arrived)

    async def send(self, data: bytes) -> float:
        """Write bytes; returns the perf_counter stamp taken right before."""
        stamp = time.perf_counter()
        try:
            await self.loop.sock_sendall(self.sock, data)
        except OSError as exc:
            raise ClientGone from exc
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


async def send_json(wire: Wire, status: int, payload: dict) -> None:
    await wire.respond(status, json.dumps(payload).encode(), "application/json")


async def send_error(wire: Wire, status: int, message: str) -> None:
    await send_json(
        wire, status, {"error": {"message": message, "type": "StubError", "code": status}}
    )
