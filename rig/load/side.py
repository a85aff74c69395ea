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


class _Arrivals:
    """A wave's requests whose heads have not come back yet; `all_in` is set once each has
    (or its request ended)."""

    def __init__(self, wave: list[RequestSpec]) -> None:
        self.waiting = {spec.request_id for spec in wave}
        self.all_in = asyncio.Event()

    def arrived(self, request_id: str) -> None:
        self.waiting.discard(request_id)
        if not self.waiting:
            self.all_in.set()


class SideRun:
    """One side's level in flight: its connections, its C slots, the requests in flight and the
    records emitted, so that every spec yields exactly one record however the level ends."""

    def __init__(
        self,
        job: SideJob,
        concurrency: int,
        timeout_s: float,
        emit: Callable[[RequestRecord], None],
        level_timeout_s: float | None,
    ) -> None:
        self.job = job
        self.size = job.concurrency or concurrency
        self.timeout_s = timeout_s
        self.emit = emit
        self.pool = ConnectionPool(job.target.base_url)
        self.slots = asyncio.Semaphore(self.size)
        self.in_flight: set[asyncio.Task] = set()
        self.emitted: set[str] = set()
        self.expired = False
        self.expired_error = ErrorKind.TIMEOUT.error(
            f"level deadline of {level_timeout_s} s passed"
        )
        self.errors: list[Exception] = []  # emit's, or the rig's own, raised from the side
        self.released_at: dict[str, float] = {}  # request id -> its wave's release

    def finish(self, record: RequestRecord) -> None:
        """Emit a spec's one record; emit's error is kept, not lost inside a task."""
        self.emitted.add(record.request_id)
        try:
            self.emit(record)
        except Exception as exc:
            self.errors.append(exc)

    def raise_kept_error(self) -> None:
        if self.errors:
            raise self.errors[0]

    async def _send(self, spec: RequestSpec, on_head: Callable[[], None] | None) -> None:
        try:
            record = await send_request(self.pool, self.job.target, spec, self.timeout_s, on_head)
            if spec.request_id in self.released_at:
                count_from_release(record, self.released_at[spec.request_id])
            self.finish(record)
        except asyncio.CancelledError as exc:
            if (cancelled := getattr(exc, "record", None)) is not None:
                if self.expired:
                    cancelled.error = self.expired_error
                self.finish(cancelled)
            raise
        except Exception as exc:  # the rig's own bug (send_request records the server's)
            self.errors.append(exc)
        finally:
            self.slots.release()

    async def start(
        self, spec: RequestSpec, on_head: Callable[[], None] | None = None
    ) -> asyncio.Task:
        """Send `spec` once a slot is free; nothing more is sent after a kept error."""
        await self.slots.acquire()
        self.raise_kept_error()
        task = asyncio.create_task(self._send(spec, on_head))
        self.in_flight.add(task)
        task.add_done_callback(self.in_flight.discard)
        return task

    async def drain(self) -> None:
        while self.in_flight:
            await asyncio.wait(set(self.in_flight), return_when=asyncio.FIRST_COMPLETED)
            self.raise_kept_error()

    async def paced(self, specs: list[RequestSpec], offsets: list[float] | None) -> None:
        """Send in order, each at its offset from the first when offsets are given."""
        began = time.perf_counter()
        for i, spec in enumerate(specs):
            if offsets is not None:
                await asyncio.sleep(max(0.0, began + offsets[i] - time.perf_counter()))
            await self.start(spec)
        await self.drain()

    async def in_waves(self, specs: list[RequestSpec], gate: ServerGate) -> None:
        for first in range(0, len(specs), self.size):
            await self.wave(specs[first : first + self.size], gate)

    async def wave(self, wave: list[RequestSpec], gate: ServerGate) -> None:
        """Pause the scheduler, send the wave, release it once every request is in."""
        arrivals = _Arrivals(wave)
        gate.pause()
        try:
            for spec in wave:
                task = await self.start(spec, functools.partial(arrivals.arrived, spec.request_id))
                task.add_done_callback(lambda _, rid=spec.request_id: arrivals.arrived(rid))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(HEADS_WAIT_S):
                    await arrivals.all_in.wait()
            await asyncio.sleep(SETTLE_S)
        finally:
            released = gate.resume()
            self.released_at.update(dict.fromkeys((spec.request_id for spec in wave), released))
        await self.drain()

    async def expire(self) -> None:
        """The level's deadline passed: the requests in flight and those never sent get a
        timeout record."""
        self.expired = True
        await self.cancel_in_flight()
        for spec in self.job.specs:
            if spec.request_id not in self.emitted:
                record = empty_record(self.job.target, spec)
                record.error = self.expired_error
                self.finish(record)
        self.raise_kept_error()

    async def cancel_in_flight(self) -> None:
        for task in self.in_flight:
            task.cancel()
        await asyncio.gather(*self.in_flight, return_exceptions=True)


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
    side = SideRun(job, concurrency, timeout_s, emit, level_timeout_s)

    async def send(specs: list[RequestSpec], pacing: list[float] | None) -> None:
        await (side.in_waves(specs, gate) if gate is not None else side.paced(specs, pacing))

    try:
        async with asyncio.timeout(level_timeout_s):
            await send([s for s in job.specs if s.warmup], None)
            if before_measured is not None:
                await before_measured()
            await send([s for s in job.specs if not s.warmup], offsets)
    except TimeoutError:
        await side.expire()
    finally:
        await side.cancel_in_flight()
        side.pool.close()
