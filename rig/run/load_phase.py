"""The load phase: every server warmed up, then each (level, repeat) sharded over the replica
pairs, with each level's server-log faults and prefix-cache deltas read around it."""

from __future__ import annotations

import asyncio

from rig.load.engine import run_level
from rig.load.prefix_cache import PrefixCacheCounters, read_prefix_cache_counters
from rig.records import LevelFault, PrefixCacheDelta, RequestRecord, ServerTarget, SideJob
from rig.run.state import RunContext, RunJournal
from rig.scenario.workload import level_requests, warmup_prompts
from rig.serve.logs import scan_log
from rig.serve.placement import shard
from rig.serve.servers import Server, ServerError

FAILED_IDS_SHOWN = 20


def server_targets(servers: dict[str, Server]) -> dict[str, ServerTarget]:
    """Load targets by server label."""
    return {label: server.target() for label, server in servers.items()}


def read_counters(targets: dict[str, ServerTarget]) -> dict[str, PrefixCacheCounters]:
    """Every server's prefix-cache (and GDN prefill) counters, read at once."""

    async def read_all():
        answers = await asyncio.gather(
            *(read_prefix_cache_counters(t.base_url, t.api_key) for t in targets.values())
        )
        return dict(zip(targets, answers, strict=True))

    return asyncio.run(read_all())


def warm_up(ctx: RunContext, targets: dict[str, ServerTarget]) -> None:
    """Untimed requests on every server before the first level; their records are not kept."""
    workload = ctx.scenario.workload
    warmup = warmup_prompts(workload, ctx.prompts)
    if not warmup:
        return
    jobs = [
        SideJob(
            target,
            level_requests(
                workload,
                warmup,
                level=0,
                repeat=0,
                side=target.side,
                run_id=ctx.run_id,
                tag=f"warmup{target.replica or ''}-",
                count=len(warmup),
            ),
        )
        for target in targets.values()
    ]
    print(f"rig: warm-up, {len(warmup)} untimed requests per server", flush=True)
    run_level(jobs, min(workload.concurrency), timeout_s=workload.timeout_s)


def run_load(
    ctx: RunContext,
    journal: RunJournal,
    servers: dict[str, Server],
    levels: list[tuple[int, int]],
) -> None:
    """Warm every server up, then run the (level, repeat) pairs in order."""
    targets = server_targets(servers)
    warm_up(ctx, targets)
    for level, repeat in levels:
        run_one_level(ctx, journal, servers, targets, level, repeat)


def level_jobs(
    ctx: RunContext, targets: dict[str, ServerTarget], level: int, repeat: int
) -> list[SideJob]:
    """Each server's share of a level: a side's ordered requests and its C are sharded over
    its replicas, request i on pair i % R, so both halves of a request pair meet on the
    same pair."""
    jobs = []
    for target in targets.values():
        specs = level_requests(
            ctx.scenario.workload,
            ctx.prompts,
            level=level,
            repeat=repeat,
            side=target.side,
            run_id=ctx.run_id,
        )
        replicas = len(ctx.plan.side_servers(target.side))
        shards = shard(len(specs), replicas, level)
        if target.replica < len(shards):
            indices, concurrency = shards[target.replica]
            jobs.append(SideJob(target, [specs[i] for i in indices], concurrency))
    return jobs


def failed_requests(records: list[RequestRecord], side: str, replica: int) -> str:
    """The ids of one server's failed requests, as a fault names them (the first few)."""
    failed = [
        r.request_id
        for r in records
        if r.error is not None and (r.side, r.replica) == (side, replica)
    ]
    shown = ",".join(failed[:FAILED_IDS_SHOWN])
    more = len(failed) - FAILED_IDS_SHOWN
    return shown + (f" (+{more})" if more > 0 else "")


def prefix_cache_delta(
    label: str,
    level: int,
    repeat: int,
    before: PrefixCacheCounters,
    after: PrefixCacheCounters,
) -> PrefixCacheDelta:
    """What one server counted during one level."""
    calls = (
        after.gdn_prefill_calls - before.gdn_prefill_calls
        if after.gdn_prefill_calls is not None and before.gdn_prefill_calls is not None
        else None
    )
    return PrefixCacheDelta(
        label,
        level,
        repeat,
        queries=after.queries - before.queries,
        hits=after.hits - before.hits,
        gdn_prefill_calls=calls,
    )


def run_one_level(
    ctx: RunContext,
    journal: RunJournal,
    servers: dict[str, Server],
    targets: dict[str, ServerTarget],
    level: int,
    repeat: int,
) -> None:
    """One (level, repeat) on every server; a server that died in it stops the run."""
    workload = ctx.scenario.workload
    state = journal.state
    before = read_counters(targets)
    offsets = {label: server.log_size() for label, server in servers.items()}
    results = run_level(
        level_jobs(ctx, targets, level, repeat),
        level,
        timeout_s=workload.timeout_s,
        request_rate=workload.request_rate,
        burstiness=workload.burstiness,
        on_record=journal.keep_record,
        level_timeout_s=workload.level_timeout_s,
        seed=workload.seed,
    )
    level_records = [record for side_records in results.values() for record in side_records]
    for label, server in servers.items():
        affected = failed_requests(level_records, server.plan.side, server.plan.replica)
        for fault in scan_log(label, server.log_text(offsets[label])):
            journal.record_fault(LevelFault(label, level, fault.kind, fault.line, affected, repeat))
        state.peak_rss_mb[label] = max(
            state.peak_rss_mb.get(label, 0.0), server.rss_bytes() / 2**20
        )
        if server.exited() is not None:
            died = f"exit code {server.exited()}"
            journal.record_fault(LevelFault(label, level, "server_died", died, affected, repeat))
            raise ServerError(
                f"{label} server died during level C={level}; log {server.plan.log_path}:\n"
                f"{server.log_tail()}"
            )
    after = read_counters(targets)
    for label in servers:
        journal.record_prefix_cache(
            prefix_cache_delta(label, level, repeat, before[label], after[label])
        )
