"""The run's schedule: which servers start when, and what each start runs before they stop
(load levels, then on a phase's first start the drift replay, the A/A control and the
candidate self-check)."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

from kernels.proof import read_kernel_proof
from rig.load.server_metrics import MetricsUnreadable, fetch_kernel_proof, served_version
from rig.records import Side
from rig.run.accuracy import timed_levels
from rig.run.state import RunContext, RunState
from rig.serve.placement import phase_rounds
from rig.serve.plan import ServerPlan
from rig.serve.servers import Server


@dataclass(frozen=True)
class PhaseSteps:
    """What a round does with its servers, each step bound to the run's inputs."""

    start: Callable[[list[ServerPlan], float], AbstractContextManager[dict[str, Server]]]
    load: Callable[[dict[str, Server], list[tuple[int, int]]], None]
    drift: Callable[[dict[str, Server]], None]  # the round's first replica pair, by side
    aa: Callable[[Server], None]  # the reference server of that pair
    self_check: Callable[[Server], None]  # the candidate server of that pair
    proofs: Callable[[dict[str, Server]], None]
    profile: Callable[[dict[str, Server]], None] = lambda servers: None  # their last round's


def run_phases(
    ctx: RunContext, done_levels: frozenset[tuple[int, int]], state: RunState, steps: PhaseSteps
) -> None:
    """Start each round's servers, run its levels, read their kernel proof, stop them. A
    phase's drift replay and A/A control run in its first round with levels to run (its
    last round when every level is kept from an interrupted run)."""
    plan, scenario = ctx.plan, ctx.scenario
    rounds = phase_rounds(plan.phases, scenario.workload.repeats)
    extras_due = set(plan.phases)
    for index, planned in enumerate(rounds):
        levels = [
            (level, repeat)
            for level in timed_levels(scenario)
            for repeat in planned.repeats
            if (level, repeat) not in done_levels
        ]
        last = all(later.servers != planned.servers for later in rounds[index + 1 :])
        extras = planned.servers in extras_due and bool(levels or last)
        if not levels and not extras:
            continue
        state.schedule.append(
            {"servers": list(planned.servers), "levels": [list(lr) for lr in levels]}
        )
        started = time.monotonic()
        plans = [plan.servers[label] for label in planned.servers]
        with steps.start(plans, scenario.model.startup_timeout_s) as servers:
            ready = time.monotonic()
            for label in planned.servers:
                state.add_timing(f"{label}_startup_s", ready - started)
            steps.load(servers, levels)
            if extras:
                extras_due.discard(planned.servers)
                first_pair = {s.plan.side: s for s in servers.values() if s.plan.replica == 0}
                steps.drift(first_pair)
                if scenario.control.aa and Side.REFERENCE in first_pair:
                    steps.aa(first_pair[Side.REFERENCE])
                if scenario.control.self_check and Side.CANDIDATE in first_pair:
                    steps.self_check(first_pair[Side.CANDIDATE])
            if last:  # after every timed block of these servers, counted in none
                steps.profile(servers)
            steps.proofs(servers)
            for label in planned.servers:
                state.add_timing(f"{label}_server_s", time.monotonic() - started)


def read_proofs(state: RunState, servers: dict[str, Server]) -> None:
    """Each server's kernel proof from its /metrics while it still runs: the same way for
    servers the rig started and servers it attached to. For a server the rig started, its
    log and stats files stand in when /metrics has no evidence. Its vLLM version too, as the
    server says it (GET /version): the only word on a container's or an attached server's."""
    for label, server in servers.items():
        version = served_version(server.base_url, server.plan.api_key)
        if version is not None:
            state.served_versions[label] = version
        try:
            proof = fetch_kernel_proof(server.base_url, server.plan.api_key)
        except MetricsUnreadable as exc:
            print(f"rig: no kernel proof on {label}'s /metrics ({exc})", flush=True)
            proof = None
        if (proof is None or not proof.marker_kernels) and server.plan.url is None:
            proof = read_kernel_proof(server.plan.log_path, server.plan.stats_dir)
        if proof is not None:
            earlier = state.proofs.get(label)
            # A log covers every start of the server (it is appended to); /metrics only
            # the one running now, so a restarted server's answers add up.
            if earlier is not None and proof.origin == "metrics":
                proof = earlier.combined_with(proof)
            state.proofs[label] = proof
