"""The load phase: each level warmed up at its own concurrency until no server compiles, then its
timed blocks in the schedule's order (rig.serve.placement.LoadSchedule), each server's log
faults and /metrics counters read around its block. A block in which a server compiled a kernel
runs again under a new repeat number (kept for the comparison of texts, in no speed interval).
With `workload.speed_resolution_pct`, blocks are added until the level's headline intervals are
that narrow, or the time budget ends."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable

from rig.interrupts import hold_at
from rig.load.server_metrics import (
    MetricsUnreadable,
    ServerCounters,
    read_server_counters,
    server_delta,
)
from rig.load.waves import GateUnavailable, ServerGate
from rig.records import (
    JIT_COMPILE,
    LevelFault,
    RequestRecord,
    RequestSpec,
    ServerTarget,
    Side,
    SideJob,
)
from rig.run.pair_load import block_sender, send_level
from rig.run.state import RunContext, RunJournal
from rig.run.turns import run_turns
from rig.scenario.config import SIDES
from rig.scenario.workload import level_requests
from rig.serve.logs import scan_log
from rig.serve.placement import LoadSchedule, shard
from rig.serve.ray_pairs import PairLost
from rig.serve.servers import Server, ServerError
from rig.verdict.intervals import TimingDesign
from rig.verdict.speed import SpeedDesign, level_resolution

FAILED_IDS_SHOWN = 20
WARMUP_PASSES = 3  # a level's warm-up runs again while a server compiles, at most this often
RERUNS_PER_LEVEL = 3  # blocks run again for a compilation, at most this many per level
DEATH_WAIT_S = 5.0  # how long a server whose /metrics stopped answering may take to exit


def server_targets(servers: dict[str, Server]) -> dict[str, ServerTarget]:
    """Load targets by server label."""
    return {label: server.target() for label, server in servers.items()}


def read_counters(targets: dict[str, ServerTarget]) -> dict[str, ServerCounters]:
    """Every server's /metrics counters, read at once."""

    async def read_all():
        answers = await asyncio.gather(
            *(read_server_counters(t.base_url, t.api_key) for t in targets.values())
        )
        return dict(zip(targets, answers, strict=True))

    return asyncio.run(read_all())


def timing_design(ctx: RunContext, state_deltas, state_faults) -> TimingDesign:
    """How this run measured speed: its schedule's pair levels, the blocks left out because a
    server compiled in them (its counters or vLLM's log said so), and the stage-one blocks of a
    sequential design."""
    workload = ctx.scenario.workload
    schedule = ctx.plan.load_schedule(workload)
    compiled = {(d.level, d.repeat) for d in state_deltas if d.compiled}
    compiled |= {(f.level, f.repeat) for f in state_faults if f.kind == JIT_COMPILE}
    sequential = workload.speed_resolution_pct is not None and schedule.kind != "apart"
    return TimingDesign(
        pair_levels=frozenset(schedule.pair_levels),
        excluded=frozenset(compiled),
        stage_one_blocks=workload.repeats if sequential else None,
        resolution_pct=workload.speed_resolution_pct if sequential else None,
    )


def counters(
    journal: RunJournal,
    servers: dict[str, Server],
    level: int,
    repeat: int,
    records: list[RequestRecord] | None = None,
) -> dict[str, ServerCounters]:
    """Every server's counters; a server whose /metrics stopped answering because it died
    stops the run as a dead server (named, its fault on disk), never as a disk error."""
    try:
        return read_counters(server_targets(servers))
    except MetricsUnreadable as exc:
        stop_if_died(journal, servers, level, repeat, records or [], wait_s=DEATH_WAIT_S)
        raise ServerError(f"/metrics could not be read during level C={level}: {exc}") from None


def stop_if_died(
    journal: RunJournal,
    servers: dict[str, Server],
    level: int,
    repeat: int,
    records: list[RequestRecord],
    wait_s: float = 0.0,
) -> None:
    """ServerError naming the first server that exited (waiting up to `wait_s` for one), with
    its fault on disk; nothing when every server runs."""
    deadline = time.monotonic() + wait_s
    while True:
        for label, server in servers.items():
            if (code := server.exited()) is not None:
                affected = failed_requests(records, server.plan.side, server.plan.replica)
                died = server.exit_reason(code)
                fault = LevelFault(label, level, "server_died", died, affected, repeat)
                journal.record_fault(fault)
                raise ServerError(
                    f"{label} server died during level C={level} ({died}); log "
                    f"{server.plan.log_path}:\n{server.log_tail()}"
                )
        if time.monotonic() >= deadline:
            return
        time.sleep(0.1)


def warm_up_level(
    ctx: RunContext,
    journal: RunJournal,
    servers: dict[str, Server],
    level: int,
    waves: bool = False,
) -> None:
    """Untimed requests at the level's concurrency on every server (all at once: nothing is
    timed; in gated waves where the level's blocks use them, so that the same batch shapes
    compile here), again while a server's counters show a JIT compilation; records are not
    kept."""
    targets = server_targets(servers)
    workload = ctx.scenario.workload
    whole = workload.requests_per_level or len(ctx.prompts)
    if workload.warmup_requests == 0:
        return
    hold_at("warm-up")
    count = max(workload.warmup_requests or whole, level)
    for number in range(WARMUP_PASSES):
        before = counters(journal, servers, level, 0)
        tag = f"warmup-p{number}-"
        print(f"rig: warm-up C={level}, pass {number + 1}: {count} untimed requests per side")
        send = functools.partial(
            send_level, servers, level, timeout_s=workload.timeout_s, progress=False, waves=waves
        )
        if ctx.conversations:
            run_turns(ctx, targets, level, 0, send, tag=tag)
        else:
            send(level_jobs(ctx, targets, level, repeat=0, tag=tag, count=count))
        after = counters(journal, servers, level, 0)
        compiled = [label for label in targets if _compiles(before[label], after[label])]
        if not compiled:
            return
        print(f"rig: warm-up C={level}: {', '.join(compiled)} compiled kernels", flush=True)


def _compiles(before: ServerCounters, after: ServerCounters) -> int:
    if before.jit_compiles is None or after.jit_compiles is None:
        return 0
    return after.jit_compiles - before.jit_compiles


def level_jobs(
    ctx: RunContext,
    targets: dict[str, ServerTarget],
    level: int,
    repeat: int,
    tag: str = "",
    count: int | None = None,
    requests: Callable[[str], list[RequestSpec]] | None = None,
) -> list[SideJob]:
    """Each server's share of a level (a side's `requests`, default the workload's): a side's
    ordered requests and its C are sharded over its replicas, request i on pair i % R, so
    both halves of a request pair meet on the same pair."""
    jobs = []
    for target in targets.values():
        if requests is not None:
            specs = requests(target.side)
        else:
            specs = level_requests(
                ctx.scenario.workload,
                ctx.prompts,
                level=level,
                repeat=repeat,
                side=target.side,
                run_id=ctx.run_id,
                tag=tag,
                count=count,
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


def run_block(
    ctx: RunContext,
    journal: RunJournal,
    servers: dict[str, Server],
    level: int,
    repeat: int,
    pairs: bool = False,
    waves: bool = False,
    requests: Callable[[str], list[RequestSpec]] | None = None,
) -> None:
    """One block: `servers`' share of one (level, repeat), at once (or, with `pairs`, request
    pairs back to back; with `waves`, in gated waves; `requests`: each side's, if not the
    workload's); a server that died in it stops the run. Eight parameters: the run's three
    (context, journal, servers), then which block and how it is sent."""
    workload = ctx.scenario.workload
    targets = server_targets(servers)
    hold_at("load")
    before = counters(journal, servers, level, repeat)
    offsets = {label: server.log_size() for label, server in servers.items()}
    started = time.time()
    send = block_sender(servers, workload, level, repeat, journal.keep_record, pairs, waves)
    try:
        if ctx.conversations and requests is None:
            level_records = run_turns(ctx, targets, level, repeat, send, journal.state)
        else:
            results = send(level_jobs(ctx, targets, level, repeat, requests=requests))
            level_records = [record for records in results.values() for record in records]
    except PairLost:  # the server that went with it names the fault
        stop_if_died(journal, servers, level, repeat, [], wait_s=DEATH_WAIT_S)
        raise
    ended = time.time()
    for label, server in servers.items():
        affected = failed_requests(level_records, server.plan.side, server.plan.replica)
        for fault in scan_log(label, server.log_text(offsets[label])):
            journal.record_fault(LevelFault(label, level, fault.kind, fault.line, affected, repeat))
        journal.state.peak_rss_mb[label] = max(
            journal.state.peak_rss_mb.get(label, 0.0), server.rss_bytes() / 2**20
        )
    stop_if_died(journal, servers, level, repeat, level_records)
    after = counters(journal, servers, level, repeat, level_records)
    for label in servers:
        journal.record_server_delta(
            server_delta(label, level, repeat, before[label], after[label], started, ended)
        )


def block_order(repeat: int) -> tuple[str, str]:
    """ABBA over block pairs: reference first in even repeats, candidate first in odd ones, so
    that a machine drifting over time slows both sides alike."""
    return (Side.REFERENCE, Side.CANDIDATE) if repeat % 2 == 0 else (Side.CANDIDATE, Side.REFERENCE)


def run_one_level(
    ctx: RunContext,
    journal: RunJournal,
    servers: dict[str, Server],
    schedule: LoadSchedule,
    level: int,
    repeat: int,
) -> None:
    """One (level, repeat) on every server, as the schedule times it."""
    sides = {server.plan.side for server in servers.values()}
    waves = schedule.in_waves(level)
    if schedule.kind != "alternate" or len(sides) < 2:
        run_block(ctx, journal, servers, level, repeat, waves=waves)
    elif level in schedule.pair_levels:
        run_block(ctx, journal, servers, level, repeat, pairs=True)
    else:
        for side in SIDES if ctx.conversations else block_order(repeat):  # turns: ref first
            own = {label: s for label, s in servers.items() if s.plan.side == side}
            run_block(ctx, journal, own, level, repeat, waves=waves)


def check_gates(servers: dict[str, Server]) -> None:
    """ServerError unless every server can hold a wave (arrival: waves)."""
    for target in server_targets(servers).values():
        try:
            ServerGate(target).check()
        except GateUnavailable as exc:
            raise ServerError(str(exc)) from None


def _compiled(journal: RunJournal, level: int, repeat: int) -> bool:
    state = journal.state
    return any(
        (d.level, d.repeat) == (level, repeat) and d.compiled for d in state.server_deltas
    ) or any((f.level, f.repeat) == (level, repeat) and f.kind == JIT_COMPILE for f in state.faults)


def _next_repeat(journal: RunJournal, level: int, planned: list[int]) -> int:
    done = [r.repeat for r in journal.state.records if r.level == level]
    return max([*done, *planned, -1]) + 1


def run_load(
    ctx: RunContext,
    journal: RunJournal,
    servers: dict[str, Server],
    levels: list[tuple[int, int]],
) -> None:
    """Each level warmed up, then its planned repeats, a block that compiled run again, and with
    a resolution asked for, more blocks until the level is resolved or its share of the budget
    ends: what is left of the budget, split evenly over the levels still to run (a level
    resolved early leaves its time to the others; the first level never takes all of it)."""
    workload = ctx.scenario.workload
    schedule = ctx.plan.load_schedule(workload)
    budget_ends = time.monotonic() + workload.speed_budget_s
    both = {server.plan.side for server in servers.values()} >= {Side.REFERENCE, Side.CANDIDATE}
    adaptive = both and schedule.kind != "apart"
    if any(schedule.in_waves(level) for level, _ in levels):
        check_gates(servers)
    order = list(dict.fromkeys(level for level, _ in levels))
    for position, level in enumerate(order):
        deadline = time.monotonic() + max(0.0, budget_ends - time.monotonic()) / (
            len(order) - position
        )
        planned = [repeat for lvl, repeat in levels if lvl == level]
        warm_up_level(ctx, journal, servers, level, waves=schedule.in_waves(level))
        queue, reruns = list(planned), 0
        while queue:
            repeat = queue.pop(0)
            run_one_level(ctx, journal, servers, schedule, level, repeat)
            if adaptive and _compiled(journal, level, repeat) and reruns < RERUNS_PER_LEVEL:
                reruns += 1
                again = _next_repeat(journal, level, queue)
                print(f"rig: C={level} block {repeat} compiled kernels: running block {again}")
                queue.append(again)
            if not queue and adaptive and workload.speed_resolution_pct is not None:
                more = _more_blocks(ctx, journal, level, deadline)
                if more:
                    queue.append(_next_repeat(journal, level, queue))


def _more_blocks(ctx: RunContext, journal: RunJournal, level: int, deadline: float) -> bool:
    """Whether the level needs another block pair for its resolution, with budget left."""
    workload = ctx.scenario.workload
    state = journal.state
    timing = timing_design(ctx, state.server_deltas, state.faults)
    done = [r for r in state.records if r.level == level]
    confidence = SpeedDesign(True).interval_confidence(len(workload.concurrency))
    status = level_resolution(
        [r for r in done if r.side == Side.REFERENCE],
        [r for r in done if r.side == Side.CANDIDATE],
        level,
        timing,
        confidence,
    )
    needed = "?" if status.blocks_needed is None else status.blocks_needed
    target = f"±{workload.speed_resolution_pct:g} %"
    if status.resolved:
        print(f"rig: C={level}: resolved to {target} in {status.blocks} block pairs", flush=True)
        return False
    if time.monotonic() >= deadline:
        print(
            f"rig: C={level}: its share of the {workload.speed_budget_s:g} s budget ended after "
            f"{status.blocks} block pairs ({target} needs {needed})",
            flush=True,
        )
        return False
    print(f"rig: C={level}: {status.blocks} block pairs, {target} needs {needed}", flush=True)
    return True
