"""One side's requests on the wire, from one event loop: in order, at most C in flight, paced by
arrival offsets or in gated waves (rig.load.waves); rig.load.engine runs the sides of a level.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from rig.load.http_client import ConnectionPool
from rig.load.request import send_request
from rig.load.waves import HEADS_WAIT_S, SETTLE_S, ServerGate, count_from_release
from rig.records import ErrorKind, RequestRecord, RequestSpec, SideJob, empty_record


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
    gate: ServerGate | None = None,
) -> None:
    """Send one side's specs in order with at most `concurrency` in flight: warm-up specs
    first, then `await before_measured()` (a start barrier across sides), then the measured
    specs, paced by `offsets` when given, or with a `gate` in waves of `concurrency` released
    at once (rig.load.waves).

    Every spec yields exactly one record through `emit`; when `level_timeout_s` runs out the
    requests in flight and those never sent get a "timeout" record. When `emit` fails (the
    records cannot be kept, e.g. the disk is full), or the client itself does (a bug of the
    rig's, never a server's), nothing more is sent and that error is raised.
    """
    warmups = [s for s in job.specs if s.warmup]
    measured = [s for s in job.specs if not s.warmup]
    pool = ConnectionPool(job.target.base_url)
    slots = asyncio.Semaphore(job.concurrency or concurrency)
    in_flight: set[asyncio.Task] = set()
    emitted: set[str] = set()
    level_expired = False
    expired_error = ErrorKind.TIMEOUT.error(f"level deadline of {level_timeout_s} s passed")

    emit_errors: list[Exception] = []
    released_at: dict[str, float] = {}  # request id -> its wave's release (perf_counter)

    def finish(record: RequestRecord) -> None:
        emitted.add(record.request_id)
        try:
            emit(record)
        except Exception as exc:  # raised from the side below, not lost inside a task
            emit_errors.append(exc)

    def stop_if_emit_failed() -> None:
        if emit_errors:
            raise emit_errors[0]

    async def one(spec: RequestSpec, on_head: Callable[[], None] | None) -> None:
        try:
            record = await send_request(pool, job.target, spec, timeout_s, on_head)
            if spec.request_id in released_at:
                count_from_release(record, released_at[spec.request_id])
            finish(record)
        except asyncio.CancelledError as exc:
            if (cancelled := getattr(exc, "record", None)) is not None:
                if level_expired:
                    cancelled.error = expired_error
                finish(cancelled)
            raise
        except Exception as exc:  # the rig's own bug (send_request records the server's)
            emit_errors.append(exc)
        finally:
            slots.release()

    async def start(spec: RequestSpec, on_head: Callable[[], None] | None = None) -> asyncio.Task:
        await slots.acquire()
        stop_if_emit_failed()
        task = asyncio.create_task(one(spec, on_head))
        in_flight.add(task)
        task.add_done_callback(in_flight.discard)
        return task

    async def drain() -> None:
        while in_flight:
            await asyncio.wait(set(in_flight), return_when=asyncio.FIRST_COMPLETED)
            stop_if_emit_failed()

    async def dispatch(specs: list[RequestSpec], paced: bool) -> None:
        if gate is not None:
            await dispatch_waves(specs, gate)
            return
        began = time.perf_counter()
        for i, spec in enumerate(specs):
            if paced and offsets is not None:
                await asyncio.sleep(max(0.0, began + offsets[i] - time.perf_counter()))
            await start(spec)
        await drain()

    async def send_wave(wave: list[RequestSpec], gate: ServerGate) -> None:
        """Pause the scheduler, send the wave, release it once every request is in."""
        waiting = {spec.request_id for spec in wave}
        all_in = asyncio.Event()

        def arrived(request_id: str) -> None:
            waiting.discard(request_id)
            if not waiting:
                all_in.set()

        gate.pause()
        try:
            for spec in wave:
                task = await start(spec, functools.partial(arrived, spec.request_id))
                task.add_done_callback(lambda _, request_id=spec.request_id: arrived(request_id))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(HEADS_WAIT_S):
                    await all_in.wait()
            await asyncio.sleep(SETTLE_S)
        finally:
            released = gate.resume()
            released_at.update(dict.fromkeys((spec.request_id for spec in wave), released))
        await drain()

    async def dispatch_waves(specs: list[RequestSpec], gate: ServerGate) -> None:
        size = job.concurrency or concurrency
        for first in range(0, len(specs), size):
            await send_wave(specs[first : first + size], gate)

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
                record = empty_record(job.target, spec)
                record.error = expired_error
                finish(record)
        stop_if_emit_failed()
    finally:
        for task in in_flight:
            task.cancel()
        await asyncio.gather(*in_flight, return_exceptions=True)
        pool.close()
