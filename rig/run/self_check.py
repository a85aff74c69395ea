"""The candidate self-check's load (control.self_check): the candidate's highest level sent
again to the candidate server one request at a time, then the answers that differ from the
batched ones teacher-forced there alone, for the margin where they part
(rig/verdict/self_check.py compares them)."""

from __future__ import annotations

from rig.load.engine import run_level
from rig.load.replay_client import forced_sequences, replay_forced
from rig.records import RequestRecord, Side, SideJob
from rig.run.state import RunContext, RunState, finished
from rig.scenario.config import Scenario
from rig.scenario.workload import level_requests, tokenize_body
from rig.serve.servers import Server
from rig.verdict.drift import forced_positions
from rig.verdict.self_check import ALONE_SIDE


def self_check_level(scenario: Scenario) -> int:
    """The level the self-check sends again alone: the highest, where batches are fullest."""
    return max(scenario.workload.concurrency)


def batched_answers(state: RunState, level: int) -> list[RequestRecord]:
    """The candidate's measured answers at `level` in its first block."""
    return [
        r
        for r in state.records
        if r.side == Side.CANDIDATE
        and r.level == level
        and r.repeat == 0
        and not r.warmup
        and finished(r)
    ]


def run_self_check(ctx: RunContext, state: RunState, candidate: Server) -> None:
    """Each request of the highest level alone (C=1) on the candidate server; its own cache
    salts, so no answer is read from the batched run's cache."""
    workload = ctx.scenario.workload
    level = self_check_level(ctx.scenario)
    batched = {r.request_id: r for r in batched_answers(state, level)}
    target = candidate.target(side=ALONE_SIDE)
    specs = [
        spec
        for spec in level_requests(
            workload, ctx.prompts, level=level, repeat=0, side=ALONE_SIDE, run_id=ctx.run_id
        )
        if spec.request_id in batched
    ]
    print(f"rig: candidate self-check, {len(specs)} requests of C={level} alone", flush=True)
    results = run_level([SideJob(target, specs)], 1, timeout_s=workload.timeout_s)
    state.alone_records = [r for r in results[ALONE_SIDE] if finished(r)]
    differing = [
        batched[r.request_id]
        for r in state.alone_records
        if r.error is None and batched[r.request_id].text != r.text
    ]
    if not differing or not ctx.scenario.drift.enabled:
        return
    bodies = {p.id: tokenize_body(p, workload) for p in ctx.prompts}
    sequences = forced_sequences(differing, bodies, target)
    answers = replay_forced(
        sequences,
        [target],
        salt_prefix=f"{ctx.run_id}.self-check",
        top_k=ctx.scenario.drift.top_logprobs,
    )[ALONE_SIDE]
    state.alone_replayed = forced_positions(sequences, dict(enumerate(answers)))
