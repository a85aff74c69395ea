"""One greedy streamed request on the wire: its HTTP/1.1 bytes, every token stamped with the
kernel's receive time, and a record that says how it ended (ErrorKind) when it did not finish."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

from rig.load.http_client import ConnectionPool, HttpResponse
from rig.load.sse import PROTOCOL_ERRORS, StreamAccumulator, request_body
from rig.records import (
    ErrorKind,
    RequestRecord,
    RequestSpec,
    ServerTarget,
    empty_record,
)
from rig.secrets import auth_headers

_ERROR_BODY_CHARS = 300


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
    lines += [f"{name}: {value}" for name, value in auth_headers(target.api_key).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def send_request(
    pool: ConnectionPool,
    target: ServerTarget,
    spec: RequestSpec,
    timeout_s: float,
    on_head: Callable[[], None] | None = None,
) -> RequestRecord:
    """One streamed request; every failure ends up in the record's `error`, never raised.
    `on_head` runs when the response's head is in (rig.load.waves waits for it).

    Cancellation is the exception: the record is completed with a "cancelled" error and
    attached to the CancelledError (`.record`) for the caller to emit.
    """
    record = empty_record(target, spec)
    request = _http_request(pool, target, spec)
    stream = StreamAccumulator(record, time.perf_counter(), spec.sampling.top_logprobs > 0)
    error_body = bytearray()
    response = HttpResponse(lambda data, stamp: None)

    def on_body(data: bytes, stamp: float) -> None:
        if response.status == 200:
            stream.feed(data, stamp)
        elif len(error_body) < _ERROR_BODY_CHARS:
            error_body.extend(data)

    try:
        async with asyncio.timeout(timeout_s):
            for attempt in (1, 2):
                response = HttpResponse(on_body, on_head)
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
        if (error := _response_error(response, stream, error_body)) is not None:
            record.error = error
    except TimeoutError:
        record.error = ErrorKind.TIMEOUT.error(f"no complete response within {timeout_s} s")
    except OSError as exc:
        record.error = ErrorKind.CONNECTION.error(f"{type(exc).__name__}: {exc}")
    except PROTOCOL_ERRORS as exc:
        record.error = ErrorKind.MALFORMED_SSE.error(f"{type(exc).__name__}: {exc}")
    except asyncio.CancelledError as exc:
        record.error = ErrorKind.CANCELLED.error("the run was interrupted")
        exc.record = record  # type: ignore[attr-defined]
        raise
    finally:
        _finish_record(record, stream, response)
    return record


def _response_error(
    response: HttpResponse, stream: StreamAccumulator, error_body: bytearray
) -> str | None:
    """How a response that came back in time failed, or None: an HTTP error status, the first
    protocol problem in its stream, or a stream that ended before its [DONE]."""
    if response.status != 200:
        text = bytes(error_body).decode("utf-8", errors="replace")
        return ErrorKind.HTTP.error(text, response.status)
    if stream.problem is not None:
        return stream.problem
    if not stream.done:
        return ErrorKind.CONNECTION.error("the stream ended before data: [DONE]")
    return None


def _finish_record(
    record: RequestRecord, stream: StreamAccumulator, response: HttpResponse
) -> None:
    """On every exit, whatever ended the request: what the wire saw goes into the record, and
    its token times count from the moment the request was sent (where it was)."""
    record.http_status = response.status
    record.client_lag_s = response.read_lag
    if response.sent_at is not None:
        record.sent_monotonic = stream.start = response.sent_at
    stream.finish()
