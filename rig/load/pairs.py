"""Request pairs back to back: at C=1 on sides that share hardware, each prompt goes to one side
and then at once to the other, so that the pair is measured under the same conditions and the
pair, not the block, can be the unit of the speed interval (rig/verdict/intervals.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from rig.load.engine import check_jobs, event_loop_runner, progress_bar
from rig.load.http_client import ConnectionPool
from rig.load.request import send_request
from rig.records import ErrorKind, RequestRecord, SideJob, empty_record


async def drive_pairs(
    jobs: tuple[SideJob, SideJob],
    timeout_s: float,
    emit: Callable[[RequestRecord], None],
    *,
    level_timeout_s: float | None = None,
    flip: bool = False,
) -> None:
    """C=1, request pairs back to back: spec i of both jobs (the same prompt), one right after
    the other, the first job first when i is even and second when odd (`flip` swaps, so that
    consecutive blocks alternate too): ABBA over pairs, so that neither a machine drifting over
    time nor the place in a pair favours a side. Every spec yields one record through `emit`."""
    if len({len(job.specs) for job in jobs}) != 1:
        raise ValueError("request pairs need the same number of requests on both sides")
    pools = [ConnectionPool(job.target.base_url) for job in jobs]
    emitted: set[tuple[int, str]] = set()
    expired = ErrorKind.TIMEOUT.error(f"level deadline of {level_timeout_s} s passed")

    def finish(side: int, record: RequestRecord) -> None:
        emitted.add((side, record.request_id))
        emit(record)

    try:
        async with asyncio.timeout(level_timeout_s):
            for i in range(len(jobs[0].specs)):
                for side in (0, 1) if (i + flip) % 2 == 0 else (1, 0):
                    job = jobs[side]
                    try:
                        spec = job.specs[i]
                        record = await send_request(pools[side], job.target, spec, timeout_s)
                    except asyncio.CancelledError as exc:
                        if (cancelled := getattr(exc, "record", None)) is not None:
                            finish(side, cancelled)
                        raise
                    finish(side, record)
    except TimeoutError:
        for side, job in enumerate(jobs):
            for spec in job.specs:
                if (side, spec.request_id) not in emitted:
                    record = empty_record(job.target, spec)
                    record.error = expired
                    finish(side, record)
    finally:
        for pool in pools:
            pool.close()


def run_pairs(
    jobs: tuple[SideJob, SideJob],
    *,
    timeout_s: float,
    on_record: Callable[[RequestRecord], None] | None = None,
    level_timeout_s: float | None = None,
    flip: bool = False,
    progress: bool = True,
) -> dict[str, list[RequestRecord]]:
    """A C=1 level's request pairs back to back (drive_pairs), from one event loop in this
    process; records come back per side in spec order. Ctrl-C as in run_level."""
    check_jobs(list(jobs), 1)
    records: dict[str, dict[str, RequestRecord]] = {job.target.side: {} for job in jobs}
    bar = progress_bar(sum(len(job.specs) for job in jobs), 1, progress)

    def collect(record: RequestRecord) -> None:
        records[record.side][record.request_id] = record
        if on_record is not None:
            on_record(record)
        if bar is not None:
            bar.update(1)

    try:
        event_loop_runner()(
            drive_pairs(jobs, timeout_s, collect, level_timeout_s=level_timeout_s, flip=flip)
        )
    finally:
        if bar is not None:
            bar.close()
    return {
        job.target.side: [records[job.target.side][s.request_id] for s in job.specs] for job in jobs
    }
