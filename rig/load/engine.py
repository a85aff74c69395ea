"""Load: send the same ordered greedy requests to every side at once and time each token.

Requests go over rig.load.http_client, which reads the kernel's receive time stamp of every read,
so a busy client does not inflate the latencies it reports: against the paced stub its p99
TTFT error at C=200 on both sides is about 0.02 ms, where aiohttp's is 130 ms and httpx's
seconds (benchmarks/README.md). rig.load.sse builds each body and folds the answer into a record.

Where there are cores for it, each side (reference, candidate, ...) is driven by its own spawned
process with its own event loop. One loop on one core keeps the time stamps exact up to ~23k
token events/s; two sides at C=200 with a 20 ms inter-token gap already send 20k, and a GPU
server can go faster. Apart, each side gets a core and cannot delay the other's sends; with
fewer than two cores per side one loop does better (`run_level(isolation=...)`). The caller's
main module must be importable without side effects (spawn re-imports it): guard scripts with
`if __name__ == "__main__":`.

A failed request becomes a record with `error` set (rig.records); only a crash of the client
itself raises.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import queue
import signal
import time
import traceback
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import numpy as np

from rig.load.http_client import ConnectionPool
from rig.load.request import send_request
from rig.records import (
    ErrorKind,
    RequestRecord,
    RequestSpec,
    SideJob,
    empty_record,
    server_label,
)

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

    def finish(record: RequestRecord) -> None:
        emitted.add(record.request_id)
        try:
            emit(record)
        except Exception as exc:  # raised from the side below, not lost inside a task
            emit_errors.append(exc)

    def stop_if_emit_failed() -> None:
        if emit_errors:
            raise emit_errors[0]

    async def one(spec: RequestSpec) -> None:
        try:
            finish(await send_request(pool, job.target, spec, timeout_s))
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

    async def dispatch(specs: list[RequestSpec], paced: bool) -> None:
        began = time.perf_counter()
        for i, spec in enumerate(specs):
            if paced and offsets is not None:
                await asyncio.sleep(max(0.0, began + offsets[i] - time.perf_counter()))
            await slots.acquire()
            stop_if_emit_failed()
            task = asyncio.create_task(one(spec))
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
        while in_flight:
            await asyncio.wait(set(in_flight), return_when=asyncio.FIRST_COMPLETED)
            stop_if_emit_failed()

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
    outnumber the cores leave sockets unread for whole scheduler slices; one side alone (a
    block of the alternating schedule) runs inline: it has no other side to be kept from, and a
    spawned process costs a second or two per block.

    `on_record` runs in the caller's process as each record completes (warm-up records
    included, flagged `warmup`). Ctrl-C cancels the requests in flight (their records get a
    "cancelled" error and still reach `on_record`), stops the workers and re-raises
    KeyboardInterrupt.
    """
    check_jobs(jobs, concurrency)
    measured_counts = {len([s for s in job.specs if not s.warmup]) for job in jobs}
    offsets = arrival_offsets(max(measured_counts, default=0), request_rate, burstiness, seed)
    total = sum(len(job.specs) for job in jobs)
    records: dict[str, dict[str, RequestRecord]] = {job.target.label: {} for job in jobs}
    bar = progress_bar(total, concurrency, progress)

    def collect(record: RequestRecord) -> None:
        records[server_label(record.side, record.replica)][record.request_id] = record
        if on_record is not None:
            on_record(record)
        if bar is not None:
            bar.update(1)

    try:
        if isolation == "auto":
            apart = len(jobs) > 1 and _cores() >= 2 * len(jobs)
            isolation = "process" if apart else "inline"
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


def check_jobs(jobs: list[SideJob], concurrency: int) -> None:
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


def progress_bar(total: int, concurrency: int, enabled: bool):
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

    event_loop_runner()(main())


def event_loop_runner() -> Callable:
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
        event_loop_runner()(main())
    except Exception:
        messages.put(("failed", side, traceback.format_exc()))
    else:
        messages.put(("done", side, None))
