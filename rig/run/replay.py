"""The untimed phases after a round's load: the teacher-forced replay (drift and the margins
behind every divergence) and the A/A control on the reference server."""

from __future__ import annotations

from rig.interrupts import hold_at
from rig.load.engine import run_level
from rig.load.replay_client import forced_sequences, replay_forced
from rig.records import ServerTarget, Side, SideJob
from rig.run.load_phase import server_targets
from rig.run.state import RunContext, RunState
from rig.run.turns import turn_bodies
from rig.scenario.accuracy_tasks import tokenize_bodies
from rig.scenario.config import Scenario
from rig.scenario.workload import level_requests, tokenize_body
from rig.serve.servers import Server
from rig.verdict.drift import replay_selection

AA_SIDE = "reference-aa"


def aa_concurrency(scenario: Scenario) -> int:
    """The A/A control's C: its own, else the highest level's."""
    return scenario.control.aa_concurrency or max(scenario.workload.concurrency)


def run_drift(ctx: RunContext, state: RunState, servers: dict[str, Server]) -> None:
    """Replay the reference's completions teacher-forced on the round's first pair; the
    sequences are built from the reference's records the first time a reference runs."""
    if not ctx.scenario.drift.enabled:
        return
    hold_at("replay")
    targets = server_targets(servers)
    if Side.REFERENCE in targets and not state.sequences:
        bodies = {p.id: tokenize_body(p, ctx.scenario.workload) for p in ctx.prompts}
        if ctx.scenario.accuracy is not None:
            bodies |= tokenize_bodies(list(ctx.questions), ctx.scenario.accuracy.shots)
        reference_records = [r for r in state.records if r.side == Side.REFERENCE]
        bodies |= turn_bodies(ctx, reference_records, tokenize_body)
        state.sequences = forced_sequences(reference_records, bodies, targets[Side.REFERENCE])
    replay(ctx, state, targets, "drift")


def replay_indices(state: RunState, side: str, max_requests: int | None) -> list[int]:
    """Which of the sequences `side` replays. The reference: every completion it wrote
    (which pairs diverge is known only once the candidate ran, perhaps from the golden
    cache); another side: the drift's sample and the completions its pairs diverge from."""
    if side == Side.REFERENCE:
        return list(range(len(state.sequences)))
    records = state.aa_records if side == AA_SIDE else state.records
    return replay_selection(
        state.sequences,
        [r for r in state.records if r.side == Side.REFERENCE],
        [r for r in records if r.side == side],
        max_requests,
    )


def replay(
    ctx: RunContext,
    state: RunState,
    targets: dict[str, ServerTarget],
    tag: str,
    concurrency: int = 1,
) -> None:
    """Teacher-forced replay with top-k, untimed: what several sides replay, they replay
    together (one sequence at a time on all of them, unless `concurrency` lets the server
    batch them), the rest one side at a time."""
    sequences = state.sequences
    max_requests = ctx.scenario.drift.max_requests
    wanted = {side: replay_indices(state, side, max_requests) for side in targets}
    shared = sorted(set.intersection(*(set(indices) for indices in wanted.values())))
    calls = [(f"{tag}", list(targets.values()), shared)] + [
        (f"{tag}-{side}", [targets[side]], sorted(set(indices) - set(shared)))
        for side, indices in wanted.items()
    ]
    counts = ", ".join(f"{side} {len(indices)}" for side, indices in wanted.items())
    print(f"rig: teacher-forced replay of {len(sequences)} sequences ({counts})", flush=True)
    for prefix, call_targets, indices in calls:
        if not indices:
            continue
        replayed = replay_forced(
            [sequences[i] for i in indices],
            call_targets,
            salt_prefix=f"{ctx.run_id}.{prefix}",
            top_k=ctx.scenario.drift.top_logprobs,
            concurrency=concurrency,
        )
        for side, answers in replayed.items():
            state.forced.setdefault(side, {}).update(zip(indices, answers, strict=True))


def run_aa(ctx: RunContext, state: RunState, reference: Server) -> None:
    """Replay the reference's requests on the reference server in reverse order at another
    concurrency, and their teacher-forced sequences batched at that concurrency: the noise
    floor of identical kernels under other batch compositions (other decode batches, other
    chunked-prefill boundaries)."""
    workload = ctx.scenario.workload
    target = reference.target(side=AA_SIDE)
    specs = level_requests(
        workload,
        ctx.prompts,
        level=workload.concurrency[0],
        repeat=0,
        side=AA_SIDE,
        run_id=ctx.run_id,
    )
    concurrency = aa_concurrency(ctx.scenario)
    print(f"rig: A/A control, {len(specs)} requests at C={concurrency}", flush=True)
    results = run_level(
        [SideJob(target, list(reversed(specs)))], concurrency, timeout_s=workload.timeout_s
    )
    state.aa_records = results[AA_SIDE]
    if state.sequences:
        replay(ctx, state, {AA_SIDE: target}, "aa-drift", concurrency)
