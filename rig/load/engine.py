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

One side's loop (in order, C in flight, paced or in gated waves) is rig.load.side. A failed
request becomes a record with `error` set (rig.records); only a crash of the client itself
raises.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import queue
import signal
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from rig.load.http_client import ConnectionPool
from rig.load.side import arrival_offsets, drive_side
from rig.load.waves import ServerGate
from rig.records import RequestRecord, SideJob, server_label


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
    waves: bool = False,
) -> dict[str, list[RequestRecord]]:
    """Drive every side at the same time; records come back per side in spec order. `waves`:
    each server's requests go in gated waves of its concurrency (rig.load.waves).

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

    Eleven parameters, all but the first two keywords with defaults: each is one knob of a
    level's load, passed through by pair_load, the replay, bisect, the self-check and the
    benchmarks, each setting the few it needs.
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
        drive = SideDrive(concurrency, timeout_s, offsets, level_timeout_s, waves)
        if isolation == "inline":
            _run_inline(jobs, drive, collect)
        else:
            _run_in_processes(jobs, drive, collect)
    finally:
        if bar is not None:
            bar.close()
    return _in_spec_order(jobs, records)


def _in_spec_order(
    jobs: list[SideJob], records: dict[str, dict[str, RequestRecord]]
) -> dict[str, list[RequestRecord]]:
    """Each side's records (`records`: by server label, then request id) in its jobs' spec
    order, whatever order they completed in; a side's replicas one after the other."""
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


# The level first, then what is left of it: a long level's bar says when it will end.
BAR_FORMAT = (
    "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} req [{elapsed} elapsed, ETA {remaining}]"
)


def progress_bar(total: int, concurrency: int, enabled: bool):
    """A level's bar on the console, named by its concurrency, with the time it has left
    (tqdm's estimate from the rate so far)."""
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=f"C={concurrency}", bar_format=BAR_FORMAT, leave=False)


@dataclass(frozen=True)
class SideDrive:
    """How every side of a level is driven (drive_side's arguments but the job's own)."""

    concurrency: int
    timeout_s: float
    offsets: list[float] | None
    level_timeout_s: float | None
    waves: bool

    def drive(
        self,
        job: SideJob,
        emit: Callable[[RequestRecord], None],
        before_measured: Callable[[], Awaitable[Any]],
    ) -> Awaitable[None]:
        return drive_side(
            job,
            self.concurrency,
            self.timeout_s,
            emit,
            offsets=self.offsets,
            level_timeout_s=self.level_timeout_s,
            before_measured=before_measured,
            gate=ServerGate(job.target) if self.waves else None,
        )


def _run_inline(jobs: list[SideJob], drive: SideDrive, collect) -> None:
    async def main() -> None:
        barrier = asyncio.Barrier(len(jobs))
        await asyncio.gather(*(drive.drive(job, collect, barrier.wait) for job in jobs))

    event_loop_runner()(main())


def event_loop_runner() -> Callable:
    """uvloop where installed (vLLM depends on it): it roughly halves the client's per-event
    cost and so its timing error under load."""
    try:
        import uvloop

        return uvloop.run
    except ImportError:
        return asyncio.run


def _run_in_processes(jobs: list[SideJob], drive: SideDrive, collect) -> None:
    context = multiprocessing.get_context("spawn")
    messages = context.Queue()
    stop = context.Event()
    barrier = context.Barrier(len(jobs))
    workers = [
        context.Process(
            target=_side_worker,
            args=(job, drive, messages, stop, barrier),
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


def _side_worker(job, drive: SideDrive, messages, stop, barrier):
    """One side in its own process: Ctrl-C is the parent's to handle, it tells us via `stop`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    side = job.target.label

    async def main() -> None:
        loop = asyncio.get_running_loop()

        async def wait_for_peers() -> None:
            await loop.run_in_executor(None, barrier.wait)

        task = asyncio.create_task(
            drive.drive(job, lambda record: messages.put(("record", side, record)), wait_for_peers)
        )
        while not task.done():
            await asyncio.wait([task], timeout=0.05)
            if stop.is_set() and not task.done():
                task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    try:
        event_loop_runner()(main())
    except Exception:
        messages.put(("failed", side, traceback.format_exc()))
    else:
        messages.put(("done", side, None))
