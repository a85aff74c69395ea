"""Preflight: everything that can be known before a server starts, checked in seconds.

The model (embedded, local path, Hugging Face cache or hub), the vLLM installation of each side
(rig/serve/installs.py: there, supported, the rig's plugin and the user's kernel loading in it, no
undeclared difference between the sides), the GPUs a placement needs and their free memory
against the checkpoint's size, the GDN backends' importability, the ports. Every problem found
goes into one line, so a user on the wrong machine learns all of it at once. `python -m rig.run
SCENARIO --plan` prints the resolved plan after these checks and starts nothing.
"""

from __future__ import annotations

import json
import os
import shlex
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from rig.models.embedded import ensure_embedded_model, is_embedded
from rig.scenario.config import SIDES, Scenario
from rig.serve.hardware import Hardware
from rig.serve.installs import InstallError, SideInstall, resolve_installs
from rig.serve.placement import ClusterNode, PlacementError
from rig.serve.plan import LaunchPlan, plan_servers
from rig.serve.ray_cluster import ClusterUnavailable, cluster_nodes
from rig.serve.servers import ServerError, ensure_port_free
from rig.serve.skew import install_skew

GIB = 2**30
HUB_TIMEOUT_S = 4.0
GPU_RESERVE_GIB = 2.0  # CUDA context, activations, a minimal KV cache per server
# Rough serving speeds for the plan's time estimate: per generated token and per start.
SECONDS_PER_TOKEN = {"gpu": 0.02, "cpu": 0.05}
STARTUP_S = {"gpu": 120.0, "cpu": 30.0}


class PreflightError(ValueError):
    """What keeps the run from starting; one line meant for the user."""


@dataclass(frozen=True)
class ModelLocation:
    """Where the servers will load the model from, and how big its weights are."""

    path: str  # what `vllm serve` gets: a local folder or a hub id
    source: str  # "embedded", "local", "hf-cache", "hub", or "unverified"
    weights_bytes: int | None = None
    note: str = ""


@dataclass
class Preflight:
    scenario: Scenario
    hardware: Hardware
    model: ModelLocation
    plan: LaunchPlan
    installs: dict[str, SideInstall] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def checkpoint_bytes(folder: Path) -> int | None:
    """Size of a checkpoint's weights: its safetensors index's total, else the files' sizes."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            return int(json.loads(index.read_text())["metadata"]["total_size"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
    files = list(folder.glob("*.safetensors"))
    return sum(f.stat().st_size for f in files) if files else None


def hf_cache_snapshot(hub_id: str) -> Path | None:
    """The newest snapshot of `hub_id` in the Hugging Face cache that has a config.json."""
    root = os.environ.get("HF_HUB_CACHE") or os.path.join(
        os.environ.get("HF_HOME", os.path.expanduser("~/.cache/huggingface")), "hub"
    )
    snapshots = Path(root) / f"models--{hub_id.replace('/', '--')}" / "snapshots"
    found = [s for s in snapshots.glob("*") if (s / "config.json").is_file()]
    return max(found, key=lambda s: s.stat().st_mtime) if found else None


def hub_reachable(hub_id: str) -> tuple[bool, str]:
    """Whether the hub answers for this model id (offline settings count as unreachable)."""
    if os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("TRANSFORMERS_OFFLINE") == "1":
        return False, "HF_HUB_OFFLINE=1"
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    request = urllib.request.Request(f"{endpoint}/api/models/{hub_id}", method="HEAD")
    token = os.environ.get("HF_TOKEN")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=HUB_TIMEOUT_S):
            return True, ""
    except urllib.error.HTTPError as exc:
        return False, f"the hub answered HTTP {exc.code} for {hub_id}"
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return False, f"the hub is unreachable ({reason})"


def locate_model(scenario: Scenario, check_hub: bool = True) -> ModelLocation:
    """Find the model without loading it: PreflightError when it cannot be had."""
    name = scenario.model.name
    declared = int(scenario.model.weights_gib * GIB) if scenario.model.weights_gib else None
    if is_embedded(name):
        folder = ensure_embedded_model(name)
        return ModelLocation(str(folder), "embedded", checkpoint_bytes(folder))
    path = Path(name).expanduser()
    if path.exists():
        if not (path / "config.json").exists():
            raise PreflightError(f"model path {path} has no config.json")
        return ModelLocation(str(path.resolve()), "local", checkpoint_bytes(path))
    if name.startswith(("/", "./", "../", "~")) or name.count("/") > 1:
        raise PreflightError(f"model path {name} does not exist")
    snapshot = hf_cache_snapshot(name)
    if snapshot is not None:
        return ModelLocation(name, "hf-cache", checkpoint_bytes(snapshot) or declared)
    if not check_hub:
        return ModelLocation(name, "unverified", declared, "not looked up (another node)")
    reachable, why = hub_reachable(name)
    if not reachable:
        raise PreflightError(
            f"model {name}: weights not in the Hugging Face cache and {why}; download them "
            f"first (huggingface-cli download {name}) or pass a local path"
        )
    return ModelLocation(name, "hub", declared, "vLLM downloads it at start")


def check_backends(
    scenario: Scenario, installs: dict[str, SideInstall], hardware: Hardware
) -> list[str]:
    """A side asking for a GDN backend its install cannot import (flashinfer, cutedsl) would
    fall back to FLA with a warning: refuse it. The CPU build ignores the request."""
    problems = []
    modules = {"flashinfer": "flashinfer-python", "cutedsl": "nvidia-cutlass-dsl"}
    for side, install in installs.items():
        backend = scenario.backend_of(side)
        if not hardware.gpu_count or backend not in modules or not install.facts.probed:
            continue
        if not getattr(install.facts, backend):
            problems.append(
                f"{side}: GDN prefill backend {backend} is asked for, but its install "
                f"({install.facts.python}) cannot import it (pip install {modules[backend]}, "
                "or use triton = FLA)"
            )
    return problems


def check_memory(scenario: Scenario, plan: LaunchPlan, hardware: Hardware, weights: int) -> list:
    """Weights per GPU (split by tensor parallelism) against each server's GPUs' free memory."""
    problems = []
    tp = scenario.model.tensor_parallel_size
    for server in plan.servers.values():
        slot = next((s for s in plan.placement.slots if s.label == server.label), None)
        if slot is None or not slot.gpus:
            continue
        sharing = sum(1 for s in plan.placement.slots if set(s.gpus) & set(slot.gpus))
        need = weights / tp * sharing + GPU_RESERVE_GIB * GIB * sharing
        for gpu in slot.gpus:
            free = hardware.gpu_free_mib[gpu] * 2**20
            if need > free:
                problems.append(
                    f"GPU {hardware.visible_devices((gpu,))} has {free / GIB:.0f} GiB free, "
                    f"{server.label} needs about {need / GIB:.0f} GiB there "
                    f"({weights / GIB:.0f} GiB of weights over TP{tp})"
                )
    return list(dict.fromkeys(problems))


def model_copies(weights: int | None, hardware: Hardware, tp: int) -> int:
    """How many servers of this model fit on one group of TP GPUs, with room to run each; 1
    when the size or the free memory is unknown (no sharing on a guess)."""
    if weights is None or len(hardware.gpu_free_mib) < tp:
        return 1
    per_server = weights / tp + GPU_RESERVE_GIB * GIB
    return max(1, int(min(hardware.gpu_free_mib[:tp]) * 2**20 // per_server))


def needs_gpus(scenario: Scenario, hardware: Hardware) -> str | None:
    tp = scenario.model.tensor_parallel_size
    launched = [s for s in SIDES if scenario.side(s).url is None]
    here = scenario.placement.backend == "local"  # on Ray, the nodes' GPUs count
    if hardware.gpu_count == 0 and tp > 1 and launched and here:
        preset = f" (preset {scenario.model.preset})" if scenario.model.preset else ""
        return (
            f"{scenario.model.name}{preset} needs {tp} GPUs per side "
            f"(tensor_parallel_size={tp}); this machine has none"
        )
    return None


def ray_nodes(scenario: Scenario) -> tuple[tuple[ClusterNode, ...], str | None]:
    """The live nodes of the scenario's Ray cluster (none without `placement.backend: ray`),
    or why there are none to place on."""
    placement = scenario.placement
    if placement.backend != "ray":
        return (), None
    attached = [side for side in SIDES if scenario.side(side).url is not None]
    if attached:
        return (), f"placement.backend=ray starts every server; {attached[0]}.url attaches one"
    try:
        return cluster_nodes(placement.ray_address), None
    except ClusterUnavailable as exc:
        return (), str(exc)


def preflight(
    scenario: Scenario, run_dir: Path, hardware: Hardware, sides: tuple[str, ...] = SIDES
) -> Preflight:
    """All checks; raises PreflightError with every problem in one line."""
    problems: list[str] = []
    notes: list[str] = []
    installs: dict[str, SideInstall] = {}
    try:
        installs = resolve_installs(scenario, sides)
    except InstallError as exc:
        problems.append(str(exc))
    problems += install_skew(scenario, installs)
    gpu_problem = needs_gpus(scenario, hardware)
    if gpu_problem is not None:
        problems.append(gpu_problem)
    launched = [side for side in sides if scenario.side(side).url is None]
    try:
        model = (
            locate_model(scenario, check_hub=not hardware.assumed)
            if launched
            else ModelLocation(scenario.model.name, "attached", note="served by attached servers")
        )
    except PreflightError as exc:
        problems.append(str(exc))
        model = ModelLocation(scenario.model.name, "missing")
    if model.note:
        notes.append(f"model: {model.note}")
    problems += check_backends(scenario, installs, hardware)
    nodes, cluster_problem = ray_nodes(scenario)
    problems += [cluster_problem] if cluster_problem else []
    plan = None
    if gpu_problem is None and len(installs) == len(sides) and cluster_problem is None:
        tp = scenario.model.tensor_parallel_size
        try:
            plan = plan_servers(
                scenario,
                model.path,
                run_dir,
                hardware,
                sides,
                copies=model_copies(model.weights_bytes, hardware, tp),
                installs=installs,
                nodes=nodes,
            )
        except PlacementError as exc:
            where = " (--assume-gpus)" if hardware.assumed else ""
            preset = f" (preset {scenario.model.preset})" if scenario.model.preset else ""
            problems.append(f"{scenario.model.name}{preset}: {exc}{where}")
    if plan is not None and hardware.gpu_count:
        if hardware.assumed:
            notes.append("GPU memory: not checked (--assume-gpus plans for another node)")
        elif model.weights_bytes is None:
            notes.append("GPU memory: not checked (checkpoint size unknown)")
        else:
            problems += check_memory(scenario, plan, hardware, model.weights_bytes)
    if plan is not None and not hardware.assumed and scenario.placement.backend == "local":
        for server in plan.servers.values():  # on Ray, each node checks its own at start
            if server.url is None and scenario.side(server.side).port is not None:
                try:
                    ensure_port_free(server.port, server.host)
                except ServerError as exc:
                    problems.append(str(exc))
    if problems or plan is None:
        raise PreflightError("; ".join(problems) or "no placement")
    return Preflight(scenario, hardware, model, plan, installs, notes)


def request_count(scenario: Scenario, prompt_count: int) -> int:
    workload = scenario.workload
    per_level = workload.requests_per_level or prompt_count
    return per_level * len(workload.concurrency) * workload.repeats


def expected_duration_s(checked: Preflight, prompt_count: int) -> float:
    """A rough lower bound: server starts per phase, then each level's requests in waves of
    C at an assumed per-token speed (the plan prints the assumption)."""
    workload = checked.scenario.workload
    kind = "gpu" if checked.hardware.gpu_count else "cpu"
    per_level = workload.requests_per_level or prompt_count
    waves = sum(-(-per_level // c) for c in workload.concurrency) * workload.repeats
    load = waves * workload.max_tokens * SECONDS_PER_TOKEN[kind]
    return len(checked.plan.phases) * (STARTUP_S[kind] + load)


def render_plan(checked: Preflight, prompt_count: int) -> str:
    """The resolved plan, as `--plan` prints it."""
    scenario, plan = checked.scenario, checked.plan
    workload = scenario.workload
    model = scenario.model
    preset = f", preset {model.preset}" if model.preset else ""
    size = f", {checked.model.weights_bytes / GIB:.1f} GiB" if checked.model.weights_bytes else ""
    gpus = f"{checked.hardware.gpu_count} GPU(s)" if checked.hardware.gpu_count else "no GPU"
    assumed = " (assumed)" if checked.hardware.assumed else ""
    kind = "gpu" if checked.hardware.gpu_count else "cpu"
    backends = {side: scenario.backend_of(side) for side in SIDES}
    backend = (
        f"GDN prefill backend {backends['reference']} on both sides"
        if len(set(backends.values())) == 1
        else ", ".join(f"{side} GDN prefill backend {b}" for side, b in backends.items())
    )
    lines = [
        f"plan: {scenario.name}",
        f"model: {model.name}{preset} ({checked.model.source}{size}); {backend}",
        f"machine: {gpus}{assumed}; placement: {plan.placement.describe()}",
        "phases: " + " then ".join("[" + ", ".join(phase) + "]" for phase in plan.phases),
        *(
            f"{side} install ({install.kind}): {install.facts.describe()}"
            for side, install in checked.installs.items()
            if install.kind != "attached"
        ),
    ]
    for label, server in plan.servers.items():
        lines.append(f"{label} ({server.devices}):")
        if server.url:
            lines.append(f"  attach to {server.url}")
            continue
        lines.append("  argv: " + shlex.join(server.argv))
        env = " ".join(f"{k}={v}" for k, v in sorted(server.redacted_env().items()))
        lines.append(f"  env: {env}")
    total = request_count(scenario, prompt_count)
    lines += [
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
        f"(assumes {STARTUP_S[kind]:.0f} s per server start and "
        f"{SECONDS_PER_TOKEN[kind] * 1000:.0f} ms per token, {workload.max_tokens} tokens)",
        *checked.notes,
    ]
    return "\n".join(lines)
