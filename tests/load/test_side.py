"""One side's loop, piece by piece: a wave's arrivals, one record per spec however the level
ends, and the error kept from a task raised from the side (the loop end to end: test_engine.py
and test_waves.py)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from rig.load.side import SideRun, _Arrivals, drive_side
from rig.records import ServerTarget, SideJob
from rig.stub.server import serve_in_thread
from tests.stub_requests import FAST, spec


def test_a_wave_is_in_once_every_request_arrived_or_ended():
    async def check() -> None:
        arrivals = _Arrivals([spec(0), spec(1)])
        arrivals.arrived("r0")
        arrivals.arrived("r0")  # a head, then the end of the same request
        assert not arrivals.all_in.is_set()
        arrivals.arrived("r1")
        assert arrivals.all_in.is_set()

    asyncio.run(check())


def test_an_expired_level_records_each_spec_once_in_flight_or_never_sent():
    """C=1 and a hanging first request: it is in flight at the deadline, the rest never went."""
    records = []
    with serve_in_thread(replace(FAST, faults={0: "hang"})) as stub:
        job = SideJob(ServerTarget("reference", stub.url, "stub"), [spec(i) for i in range(3)])
        asyncio.run(drive_side(job, 1, 10, records.append, level_timeout_s=0.3))
    assert sorted(r.request_id for r in records) == ["r0", "r1", "r2"]
    assert all(r.error.startswith("timeout") and "level deadline" in r.error for r in records)


def test_an_emit_error_from_a_task_stops_the_side_with_that_error():
    class Full(OSError):
        pass

    def emit(record):
        raise Full("no space left")

    async def check(url: str) -> None:
        side = SideRun(SideJob(ServerTarget("reference", url, "stub"), []), 2, 10, emit, None)
        await side.start(spec(0))
        with pytest.raises(Full):
            await side.drain()
        with pytest.raises(Full):  # and nothing more is sent
            await side.start(spec(1))
        await side.cancel_in_flight()
        side.pool.close()

    with serve_in_thread(FAST) as stub:
        asyncio.run(check(stub.url))
        assert [entry.key for entry in stub.log] == ["r0"]
