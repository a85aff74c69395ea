"""The bad-input sweep of a server's answer on the wire: whatever bytes come back (a head, a
framing, a body, a close), send_request returns the request's record, never raises, and says
how the request ended when it did not finish."""

from __future__ import annotations

import asyncio
import json

from hypothesis import example, given, settings
from hypothesis import strategies as st

from rig.load.http_client import ConnectionPool
from rig.load.request import send_request
from rig.records import ServerTarget
from tests.stub_requests import spec

GOOD_BODY = (
    b'data: {"choices": [{"text": "hi", "token_ids": [1], "finish_reason": "stop"}]}\n\n'
    b"data: [DONE]\n\n"
)
STATUS = st.sampled_from((b"HTTP/1.1 200 OK", b"HTTP/1.1 500 Oops", b"HTTP/1.0 200")) | st.binary(
    max_size=20
)
HEADER = st.sampled_from(
    (
        b"Transfer-Encoding: chunked",
        b"Content-Length: 5",
        b"Content-Length: -1",
        b"Content-Length: x",
        b"Connection: close",
    )
) | st.binary(max_size=20).filter(lambda b: b"\r\n" not in b)
BODY = st.sampled_from((GOOD_BODY, b"", b"0\r\n\r\n", b"5\r\nhello\r\n0\r\n\r\n")) | st.binary(
    max_size=60
)


def _chunked(body: bytes) -> bytes:
    return f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n" if body else b"0\r\n\r\n"


RESPONSE = st.one_of(
    st.builds(
        lambda status, headers, body: (
            status + b"".join(b"\r\n" + h for h in headers) + b"\r\n\r\n" + body
        ),
        STATUS,
        st.lists(HEADER, max_size=3),
        BODY,
    ),
    BODY.map(
        lambda body: b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + _chunked(body)
    ),
    st.binary(max_size=80),
)


async def _exchange(answer: bytes):
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answer)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        target = ServerTarget("reference", f"http://127.0.0.1:{port}", "m")
        return await send_request(ConnectionPool(target.base_url), target, spec(0), timeout_s=2)
    finally:
        server.close()


@settings(max_examples=150)
@given(RESPONSE)
@example(b"HTTP/1.1 \xb200 OK\r\nContent-Length: 0\r\n\r\n")
@example(b"HTTP/1.1 200 OK\r\nContent-Length: \xc2\xb2\r\n\r\n")
@example(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + _chunked(GOOD_BODY))
def test_any_answer_gives_the_record(answer):
    record = asyncio.run(_exchange(answer))
    assert record.request_id == spec(0).request_id
    finished = record.error is None
    if finished:
        assert record.http_status == 200 and record.text is not None
    else:
        assert record.error.split(":")[0].split("_")[0] in {
            "http",
            "connection",
            "timeout",
            "malformed",
        }, record.error
    json.dumps(record.error)  # the error goes into records.jsonl as it is
