"""HTTP/1.1 framing whatever the read boundaries, and the keep-alive pool."""

from __future__ import annotations

import asyncio
import socket

import pytest

from rig.load import http_client
from rig.load.http_client import HttpResponse


def _body_of(response_bytes: bytes, step: int) -> tuple[bytes, HttpResponse]:
    pieces: list[bytes] = []
    response = HttpResponse(lambda data, stamp: pieces.append(data))
    for start in range(0, len(response_bytes), step):
        response.feed(response_bytes[start : start + step], 0.0)
    return b"".join(pieces), response


@pytest.mark.parametrize("step", [1, 3, 1000])
def test_chunked_bodies_decode_whatever_the_read_boundaries(step):
    raw = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5;ext=1\r\nhello\r\nA\r\n world 123\r\n0\r\nX-Trailer: t\r\n\r\n"
    )
    body, response = _body_of(raw, step)
    assert body == b"hello world 123"
    assert response.complete and response.keep_alive and response.status == 200


def test_content_length_and_close_delimited_bodies():
    body, response = _body_of(b"HTTP/1.1 429 Too\r\nContent-Length: 4\r\n\r\nbusy", 2)
    assert (body, response.status, response.complete) == (b"busy", 429, True)
    body, response = _body_of(b"HTTP/1.0 200 OK\r\nConnection: close\r\n\r\nabc", 2)
    assert body == b"abc" and not response.complete and not response.keep_alive
    response.feed_eof()
    assert response.complete


def test_eof_inside_a_chunked_body_is_an_error():
    _, response = _body_of(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel", 4)
    with pytest.raises(ConnectionResetError):
        response.feed_eof()


def test_pool_does_not_reuse_connections_idle_past_keep_alive(monkeypatch):
    """A keep-alive connection idle for longer than servers keep it open is not reused."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    pool = http_client.ConnectionPool(f"http://127.0.0.1:{listener.getsockname()[1]}")

    async def scenario() -> tuple[bool, bool, bool]:
        first, _ = await pool.acquire()
        pool.release(first)
        _, reused_recent = await pool.acquire()
        pool.release(_)
        monkeypatch.setattr(http_client, "IDLE_REUSE_S", 0.0)
        _, reused_stale = await pool.acquire()
        pool.release(_)
        monkeypatch.setattr(http_client, "IDLE_REUSE_S", 60.0)
        _, reused_fresh = await pool.acquire(fresh=True)
        return reused_recent, reused_stale, reused_fresh

    try:
        assert asyncio.run(scenario()) == (True, False, False)
    finally:
        pool.close()
        listener.close()


def test_clock_offset_comes_from_the_tightest_bracket(monkeypatch):
    """True offset 100 s. The first wall reading comes right away and a thread switch follows
    (its bracket spans 4 ms, so its midpoint is 2 ms late); the 1 us bracket after it is used."""
    perf_readings = iter([0.0, 0.004, 1.0, 1.000001, 2.0, 2.00001])
    wall_readings = iter([100.0, 101.0000005, 102.000005])
    monkeypatch.setattr(http_client.time, "perf_counter", lambda: next(perf_readings))
    monkeypatch.setattr(http_client.time, "time", lambda: next(wall_readings))
    assert http_client._wall_minus_perf_counter() == pytest.approx(100.0, abs=1e-9)


@pytest.mark.parametrize("status", [b"\xb200", b"2\xb90", b"", b"OK"])
def test_a_status_that_is_not_ascii_digits_is_malformed(status):
    with pytest.raises(http_client.MalformedResponse, match="not an HTTP response"):
        _body_of(b"HTTP/1.1 " + status + b" OK\r\nContent-Length: 0\r\n\r\n", 1000)
