"""A level's requests sent from this machine, or on a Ray cluster from each replica pair's own
node (rig.serve.ray_pairs): the pair's client times its servers where they run, and its records
come back here, to the journal, as the level's would from one machine."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from rig.load.engine import run_level
from rig.records import RequestRecord, SideJob
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
        replica: partial(run_level, pair_jobs, concurrency, **options)
        for replica, pair_jobs in by_pair.items()
    }
    answers = run_on_pair_nodes(servers, calls)
    by_side: dict[str, list[RequestRecord]] = {}
    for replica in by_pair:
        for side, records in answers[replica].items():
            by_side.setdefault(side, []).extend(records)
            for record in records if on_record is not None else ():
                on_record(record)
    return by_side
