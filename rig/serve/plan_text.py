"""The resolved plan as `--plan` prints it: the model and its preset, the machine, the
tensor-parallel size and why, the placement and why, both sides' argv and env, the levels, and
a rough time estimate that counts every server start."""

from __future__ import annotations

import shlex

from rig.scenario.config import SIDES, Scenario
from rig.serve.placement import phase_rounds
from rig.serve.plan import LaunchPlan
from rig.serve.preflight import GIB, Preflight

# Rough serving speeds for the plan's time estimate: per generated token and per start.
SECONDS_PER_TOKEN = {"gpu": 0.02, "cpu": 0.05}
STARTUP_S = {"gpu": 120.0, "cpu": 30.0}


def request_count(scenario: Scenario, prompt_count: int) -> int:
    workload = scenario.workload
    per_level = workload.requests_per_level or prompt_count
    return per_level * len(workload.concurrency) * workload.repeats


def server_starts(checked: Preflight) -> int:
    """How often servers start: once per round of rig/serve/placement.phase_rounds (with the
    sides in turn and several repeats, every repeat restarts both)."""
    return len(phase_rounds(checked.plan.phases, checked.scenario.workload.repeats))


def expected_duration_s(checked: Preflight, prompt_count: int) -> float:
    """A rough lower bound: every server start, then each phase's levels in waves of C at an
    assumed per-token speed (the plan prints the assumptions)."""
    workload = checked.scenario.workload
    kind = "gpu" if checked.hardware.gpu_count else "cpu"
    per_level = workload.requests_per_level or prompt_count
    waves = sum(-(-per_level // c) for c in workload.concurrency) * workload.repeats
    load = waves * workload.max_tokens * SECONDS_PER_TOKEN[kind]
    return server_starts(checked) * STARTUP_S[kind] + len(checked.plan.phases) * load


def _model_line(checked: Preflight) -> str:
    scenario, model = checked.scenario, checked.scenario.model
    preset = f", preset {model.preset}" if model.preset else ""
    if model.preset and checked.model.source == "local":  # its config.json matched
        preset = f" matches preset {model.preset}"
    size = f", {checked.model.weights_bytes / GIB:.1f} GiB" if checked.model.weights_bytes else ""
    backends = {side: scenario.backend_of(side) for side in SIDES}
    backend = (
        f"GDN prefill backend {backends['reference']} on both sides"
        if len(set(backends.values())) == 1
        else ", ".join(f"{side} GDN prefill backend {b}" for side, b in backends.items())
    )
    return f"model: {model.name}{preset} ({checked.model.source}{size}); {backend}"


def _machine_lines(checked: Preflight) -> list[str]:
    hardware, plan = checked.hardware, checked.plan
    gpus = f"{hardware.gpu_count} GPU(s)" if hardware.gpu_count else "no GPU"
    if hardware.gpu_count and hardware.gpu_gib is not None:
        gpus += f" of {hardware.gpu_gib:.0f} GiB" + ("" if hardware.assumed else " free")
    assumed = " (assumed)" if hardware.assumed else ""
    tp = checked.tensor_parallel
    return [
        f"machine: {gpus}{assumed}; placement: {plan.placement.describe()}",
        *([f"tensor parallel: {tp.describe()}"] if tp is not None else []),
        "phases: " + " then ".join("[" + ", ".join(phase) + "]" for phase in plan.phases),
        *(
            f"{side} install ({install.kind}): {install.facts.describe()}"
            for side, install in checked.installs.items()
            if install.kind != "attached"
        ),
    ]


def _server_lines(plan: LaunchPlan) -> list[str]:
    lines = []
    for label, server in plan.servers.items():
        lines.append(f"{label} ({server.devices}):")
        if server.url:
            lines.append(f"  attach to {server.url}")
            continue
        lines.append("  argv: " + shlex.join(server.argv))
        env = " ".join(f"{k}={v}" for k, v in sorted(server.redacted_env().items()))
        lines.append(f"  env: {env}")
    return lines


def _load_lines(checked: Preflight, prompt_count: int) -> list[str]:
    scenario, plan = checked.scenario, checked.plan
    workload = scenario.workload
    kind = "gpu" if checked.hardware.gpu_count else "cpu"
    total = request_count(scenario, prompt_count)
    return [
        f"levels: C={workload.concurrency}, {workload.requests_per_level or prompt_count} "
        f"requests per level per side, {workload.repeats} repeat(s), {total} requests per side"
        + (f", sharded over {plan.replicas} pairs" if plan.replicas > 1 else ""),
        f"timing: {plan.load_schedule(workload).describe()}"
        + (
            f"; blocks added until every headline interval is within "
            f"±{workload.speed_resolution_pct:g} % or {workload.speed_budget_s:g} s of load "
            f"(the first {workload.repeats} fix the spread)"
            if workload.speed_resolution_pct is not None
            else ""
        ),
        f"expected duration: at least {expected_duration_s(checked, prompt_count) / 60:.0f} min "
        f"(assumes {server_starts(checked)} server start(s) of {STARTUP_S[kind]:.0f} s and "
        f"{SECONDS_PER_TOKEN[kind] * 1000:.0f} ms per token, {workload.max_tokens} tokens)",
    ]


def render_plan(checked: Preflight, prompt_count: int) -> str:
    """The resolved plan, as `--plan` prints it."""
    return "\n".join(
        [
            f"plan: {checked.scenario.name}",
            _model_line(checked),
            *_machine_lines(checked),
            *_server_lines(checked.plan),
            *_load_lines(checked, prompt_count),
            *checked.notes,
        ]
    )
