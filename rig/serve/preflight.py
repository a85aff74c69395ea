"""Preflight: everything that can be known before a server starts, checked in seconds.

The model (embedded, local path or Hugging Face cache; the rig starts no download, and one that
did not finish is named, rig/serve/weights.py), the vLLM installation of each side
(rig/serve/installs.py: there, supported, the rig's plugin and the user's kernel loading in it,
no undeclared difference
between the sides), the GPUs a placement needs and their free memory
against the checkpoint's size, the GDN backends' importability, the ports. Every problem found
goes into one line, so a user on the wrong machine learns all of it at once. `python -m rig.run
SCENARIO --plan` prints the resolved plan after these checks (rig/serve/plan_text.py) and starts
nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rig.models.embedded import builder_module, ensure_embedded_model, is_built, is_embedded
from rig.scenario.config import SIDES, Scenario
from rig.serve.hardware import Hardware
from rig.serve.installs import InstallError, SideInstall, resolve_installs
from rig.serve.placement import ClusterNode, PlacementError
from rig.serve.plan import LaunchPlan, plan_servers, tensor_parallel
from rig.serve.ray_cluster import ClusterUnavailable, cluster_nodes
from rig.serve.servers import ServerError, ensure_port_free
from rig.serve.sizing import TensorParallel, size_tensor_parallel
from rig.serve.skew import install_skew
from rig.serve.weights import checkpoint_bytes, hf_cache_snapshot, hf_hub_cache, missing_shards

GIB = 2**30
GPU_RESERVE_GIB = 2.0  # CUDA context, activations, a minimal KV cache per server


class PreflightError(ValueError):
    """What keeps the run from starting; one line meant for the user."""


@dataclass(frozen=True)
class ModelLocation:
    """Where the servers will load the model from, and how big its weights are."""

    path: str  # what `vllm serve` gets: a local folder or a hub id
    source: str  # "embedded", "local", "hf-cache", or "unverified"
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
    tensor_parallel: TensorParallel | None = None  # None: no server is started


def declared_bytes(scenario: Scenario) -> int | None:
    """The weights' size the scenario (its preset) declares, for want of a checkpoint."""
    return int(scenario.model.weights_gib * GIB) if scenario.model.weights_gib else None


def _complete(folder: Path, what: str, how: str) -> None:
    """PreflightError naming the shards a download left out, before vLLM trips on them."""
    missing = missing_shards(folder)
    if missing is not None:
        raise PreflightError(
            f"{what} is incomplete: {missing.describe()}; finish the download: {how}"
        )


def _local_model(path: Path) -> ModelLocation:
    if not (path / "config.json").exists():
        raise PreflightError(
            f"model path {path} has no config.json, so it holds no checkpoint (download one "
            f"into it: hf download HUB_ID --local-dir {path})"
        )
    _complete(path, f"model path {path}", f"hf download HUB_ID --local-dir {path}")
    return ModelLocation(str(path.resolve()), "local", checkpoint_bytes(path))


def locate_model(scenario: Scenario, check_hub: bool = True, build: bool = True) -> ModelLocation:
    """Find the model without loading it: PreflightError when it cannot be had, or when the
    download that brought it did not finish. An embedded model is built first unless `build`
    is off (--plan), which gives the folder it would be built in."""
    name = scenario.model.name
    declared = declared_bytes(scenario)
    if is_embedded(name):
        folder = ensure_embedded_model(name, build=build)
        if not is_built(folder):
            note = (
                f"{name} is not built yet; the run builds it first "
                f"(python -m {builder_module(name)} builds it alone)"
            )
            return ModelLocation(str(folder), "embedded, not built", None, note)
        return ModelLocation(str(folder), "embedded", checkpoint_bytes(folder))
    path = Path(name).expanduser()
    if path.exists():
        return _local_model(path)
    if name.startswith(("/", "./", "../", "~")) or name.count("/") > 1:
        raise PreflightError(f"model path {name} does not exist")
    snapshot = hf_cache_snapshot(name)
    if snapshot is not None:
        what = f"model {name}: its Hugging Face cache snapshot {snapshot}"
        _complete(snapshot, what, f"hf download {name}")
        return ModelLocation(name, "hf-cache", checkpoint_bytes(snapshot) or declared)
    if not check_hub:
        return ModelLocation(name, "unverified", declared, "not looked up (another node)")
    raise PreflightError(
        f"model {name}: weights not in the Hugging Face cache ({hf_hub_cache()}), and the rig "
        f"starts no download at run time; download them first (hf download {name}; or with "
        "--local-dir DIR, then --set model.name=DIR)"
    )


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
    """Weights per GPU (split by tensor parallelism) against each server's GPUs' free memory,
    times the servers that hold those GPUs at the same time (a phase's; sides in turn take
    the same GPUs one after the other)."""
    problems = []
    tp = tensor_parallel(scenario)
    phase_of = {label: phase for phase in plan.phases for label in phase}
    for slot in plan.placement.slots:
        together = phase_of.get(slot.label, ())
        sharing = sum(
            1 for s in plan.placement.slots if s.label in together and set(s.gpus) & set(slot.gpus)
        )
        need = (weights / tp + GPU_RESERVE_GIB * GIB) * sharing
        short = [g for g in slot.gpus if need > hardware.gpu_free_mib[g] * 2**20]
        if not short:
            continue
        free = min(hardware.gpu_free_mib[g] for g in short) * 2**20
        assumed = " (assumed)" if hardware.assumed else ""
        at_once = f", {sharing} servers at once" if sharing > 1 else ""
        problems.append(
            f"GPU {hardware.visible_devices(tuple(short))} {'has' if len(short) == 1 else 'have'} "
            f"{free / GIB:.0f} GiB free{assumed}, {slot.label} needs about {need / GIB:.0f} GiB "
            f"on each ({weights / GIB:.0f} GiB of weights over TP{tp}{at_once})"
        )
    return problems


def model_copies(weights: int | None, hardware: Hardware, tp: int) -> int:
    """How many servers of this model fit on one group of TP GPUs, with room to run each; 1
    when the size or the free memory is unknown (no sharing on a guess)."""
    if weights is None or len(hardware.gpu_free_mib) < tp:
        return 1
    per_server = weights / tp + GPU_RESERVE_GIB * GIB
    return max(1, int(min(hardware.gpu_free_mib[:tp]) * 2**20 // per_server))


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


def _model_problem(scenario: Scenario, exc: Exception, hardware: Hardware) -> str:
    where = " (--assume-gpus)" if hardware.assumed else ""
    preset = f" (preset {scenario.model.preset})" if scenario.model.preset else ""
    return f"{scenario.model.name}{preset}: {exc}{where}"


def _locate(
    scenario: Scenario, hardware: Hardware, launched: list[str], problems: list, build: bool
) -> ModelLocation:
    if not launched:
        return ModelLocation(scenario.model.name, "attached", note="served by attached servers")
    try:
        return locate_model(scenario, check_hub=not hardware.assumed, build=build)
    except PreflightError as exc:  # its declared size still says what it would need
        problems.append(str(exc))
        return ModelLocation(scenario.model.name, "missing", declared_bytes(scenario))


def _sized(scenario: Scenario, tp: TensorParallel | None) -> Scenario:
    """The scenario with the size its servers get written in (what the run records)."""
    if tp is None:
        return scenario
    model = scenario.model.model_copy(update={"tensor_parallel_size": tp.size})
    return scenario.model_copy(update={"model": model})


def _memory(scenario: Scenario, plan: LaunchPlan, hardware: Hardware, model: ModelLocation):
    """The plan's servers against their GPUs' free memory, or a note on why not checked."""
    if not hardware.gpu_count:
        return [], []
    if not hardware.gpu_free_mib:
        how = ": --assume-gpu-gib" if hardware.assumed else ""
        return [], [f"GPU memory: not checked (unknown{how})"]
    if model.weights_bytes is None:
        return [], ["GPU memory: not checked (checkpoint size unknown)"]
    return check_memory(scenario, plan, hardware, model.weights_bytes), []


def _port_problems(scenario: Scenario, plan: LaunchPlan, hardware: Hardware) -> list[str]:
    """Explicit ports taken here; on Ray, each node checks its own at start."""
    if hardware.assumed or scenario.placement.backend != "local":
        return []
    problems = []
    for server in plan.servers.values():
        if server.url is None and scenario.side(server.side).port is not None:
            try:
                ensure_port_free(server.port, server.host)
            except ServerError as exc:
                problems.append(str(exc))
    return problems


def preflight(
    scenario: Scenario,
    run_dir: Path,
    hardware: Hardware,
    sides: tuple[str, ...] = SIDES,
    build_model: bool = True,
) -> Preflight:
    """All checks; raises PreflightError with every problem in one line. The Preflight's
    scenario holds the tensor-parallel size its servers get. `build_model` off (--plan): an
    embedded model not built yet is planned from the folder it would be built in."""
    problems: list[str] = []
    installs: dict[str, SideInstall] = {}
    try:
        installs = resolve_installs(scenario, sides)
    except InstallError as exc:
        problems.append(str(exc))
    problems += install_skew(scenario, installs)
    launched = [side for side in sides if scenario.side(side).url is None]
    model = _locate(scenario, hardware, launched, problems, build_model)
    notes = [f"model: {model.note}"] if model.note else []
    problems += check_backends(scenario, installs, hardware)
    nodes, cluster_problem = ray_nodes(scenario)
    problems += [cluster_problem] if cluster_problem else []
    tp = None
    try:
        tp = (
            size_tensor_parallel(scenario, hardware, model.weights_bytes, nodes)
            if launched
            else None
        )
    except PlacementError as exc:
        problems.append(_model_problem(scenario, exc, hardware))
    scenario = _sized(scenario, tp)
    plan = None
    if (tp or not launched) and len(installs) == len(sides) and cluster_problem is None:
        try:
            copies = model_copies(model.weights_bytes, hardware, tensor_parallel(scenario))
            plan = plan_servers(
                scenario,
                model.path,
                run_dir,
                hardware,
                sides,
                copies=copies,
                installs=installs,
                nodes=nodes,
            )
        except PlacementError as exc:
            problems.append(_model_problem(scenario, exc, hardware))
    if plan is not None:
        memory_problems, memory_notes = _memory(scenario, plan, hardware, model)
        problems += memory_problems + _port_problems(scenario, plan, hardware)
        notes += memory_notes
    if problems or plan is None:
        raise PreflightError("; ".join(problems) or "no placement")
    return Preflight(scenario, hardware, model, plan, installs, notes, tp)
