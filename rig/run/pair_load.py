"""A level's requests sent from this machine, or on a Ray cluster from each replica pair's own
node (rig.serve.ray_pairs): the pair's client times its servers where they run, and each record
streams back here, to the journal, as it finishes, as a level's would on one machine. A timed
block sends its share at once, in gated waves, or as request pairs back to back."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from rig.load.engine import run_level
from rig.load.pairs import run_pairs
from rig.records import RequestRecord, Side, SideJob
from rig.scenario.config import WorkloadConfig
from rig.serve.ray_pairs import on_ray, run_on_pair_nodes
from rig.serve.servers import Server


def send_level(
    servers: dict[str, Server],
    concurrency: int,
    jobs: list[SideJob],
    *,
    on_record: Callable[[RequestRecord], None] | None = None,
    **options,
) -> dict[str, list[RequestRecord]]:
    """run_level's answer (records per side, in spec order) for `servers`' jobs."""
    if not on_ray(servers):
        return run_level(jobs, concurrency, on_record=on_record, **options)
    by_pair: dict[int, list[SideJob]] = {}
    for job in jobs:
        by_pair.setdefault(job.target.replica, []).append(job)
    options["progress"] = False  # a bar on a node's log helps no one
    calls = {
        replica: partial(_pair_level, pair_jobs, concurrency, options)
        for replica, pair_jobs in by_pair.items()
    }
    answers = run_on_pair_nodes(servers, calls, on_record or _ignore)
    by_side: dict[str, list[RequestRecord]] = {}
    for replica in by_pair:
        for side, records in answers[replica].items():
            by_side.setdefault(side, []).extend(records)
    return by_side


def block_sender(
    servers: dict[str, Server],
    workload: WorkloadConfig,
    level: int,
    repeat: int,
    on_record: Callable[[RequestRecord], None],
    pairs: bool = False,
    waves: bool = False,
) -> Callable[[list[SideJob]], dict[str, list[RequestRecord]]]:
    """How one timed block of `servers` sends its jobs, as a function of them (run_turns sends a
    round at a time): with `pairs`, request pairs back to back, the reference first in even
    repeats; else at the level's concurrency, in gated waves with `waves`."""

    def send(jobs: list[SideJob]) -> dict[str, list[RequestRecord]]:
        if pairs:
            ordered = sorted(jobs, key=lambda job: job.target.side != Side.REFERENCE)
            return run_pairs(
                (ordered[0], ordered[1]),
                timeout_s=workload.timeout_s,
                on_record=on_record,
                level_timeout_s=workload.level_timeout_s,
                flip=repeat % 2 == 1,
            )
        return send_level(
            servers,
            level,
            jobs,
            timeout_s=workload.timeout_s,
            request_rate=workload.request_rate,
            burstiness=workload.burstiness,
            on_record=on_record,
            level_timeout_s=workload.level_timeout_s,
            seed=workload.seed,
            waves=waves,
        )

    return send


def _pair_level(
    jobs: list[SideJob], concurrency: int, options: dict, emit: Callable[[RequestRecord], None]
) -> dict[str, list[RequestRecord]]:
    """On a pair's node: run_level over the pair's jobs, each record emitted as it finishes."""
    return run_level(jobs, concurrency, on_record=emit, **options)


def _ignore(record: RequestRecord) -> None:
    """No journal to stream to."""
