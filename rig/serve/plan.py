"""The plan of the servers a run starts or attaches to: identical `vllm serve` argv and
environment for both sides except what the scenario declares for one, where the placement puts
each server, and the phases in which they run.

Both sides run at once when the machine has room for two: on GPU, disjoint CUDA_VISIBLE_DEVICES
sets of the tensor-parallel size; on CPU, disjoint cores through VLLM_CPU_OMP_THREADS_BIND (by
default both workers bind core 0). Otherwise one after the other.
"""

from __future__ import annotations

import importlib.util
import socket
from dataclasses import dataclass, replace
from pathlib import Path

from pydantic import SecretStr

from kernels.backends import GDN_BACKEND_FLAG, gdn_backend_args
from kernels.proof import KERNEL_ENV
from kernels.proof import STATS_DIR_ENV as STATS_ENV
from rig.models.embedded import is_embedded
from rig.records import server_label
from rig.scenario.config import SIDES, Scenario, WorkloadConfig
from rig.secrets import API_KEY_ENV, redact_env, reveal
from rig.serve.hardware import Hardware
from rig.serve.installs import SideInstall, container_argv, resolve_installs
from rig.serve.placement import (
    ClusterNode,
    LoadSchedule,
    Placement,
    Slot,
    describe_devices,
    load_schedule,
    place_on_cpus,
    place_on_gpus,
    place_on_nodes,
)
from rig.serve.profiler_flags import profile_dir, profiler_args
from rig.serve.side_caches import cache_env

GATE_ENV = "VLLM_SERVER_DEV_MODE"  # serves /pause and /resume, which arrival: waves uses


def tensor_parallel(scenario: Scenario) -> int:
    """The servers' tensor-parallel size: as set, or as preflight sized it; 1 for a plan made
    without preflight (a unit test; a stored run's scenario holds the size it ran with)."""
    return scenario.model.tensor_parallel_size or 1


def eager(scenario: Scenario, hardware: Hardware) -> bool:
    """`model.enforce_eager`, else eager on CPU and compiled on a GPU. vllm-cpu compiles for
    about 40 s more per server start (62 s against 22 s on two cores) and the CPU runs are
    controls of text, not of speed; on a GPU, production serves with torch.compile and CUDA
    graphs, and a speed word must be about that (eager, the host's launches hide the kernel)."""
    if scenario.model.enforce_eager is not None:
        return scenario.model.enforce_eager
    return hardware.gpu_count == 0


@dataclass(frozen=True)
class ServerPlan:
    """Everything needed to start (or attach to) one server, recorded in the manifest."""

    side: str
    argv: tuple[str, ...]
    env: dict[str, str]  # only what the rig sets on top of the inherited environment
    host: str
    port: int
    log_path: Path
    stats_dir: Path
    served_model: str
    kernel: str | None
    url: str | None = None
    api_key: SecretStr | None = None  # also in env as VLLM_API_KEY, never in argv
    replica: int = 0
    devices: str = ""  # what the placement gave it, in words
    install: SideInstall | None = None  # what serves it (rig/serve/installs.py)
    launcher: tuple[str, ...] = ()  # the start of argv that runs `vllm serve`
    cleanup: tuple[str, ...] = ()  # run after the server stops (a container's removal)
    port_fixed: bool = False  # the scenario's `port`; else the rig's pick, free when planned

    def with_port(self, port: int) -> ServerPlan:
        """The same server on another port (argv's --port follows)."""
        argv = list(self.argv)
        argv[argv.index("--port") + 1] = str(port)
        return replace(self, port=port, argv=tuple(argv))

    @property
    def serve_args(self) -> tuple[str, ...]:
        """argv after the launcher: the model and the flags."""
        return self.argv[len(self.launcher) :]

    @property
    def label(self) -> str:
        return server_label(self.side, self.replica)

    @property
    def base_url(self) -> str:
        return self.url.rstrip("/") if self.url else f"http://{self.host}:{self.port}"

    @property
    def gpu_ids(self) -> frozenset[str]:
        """The GPUs the placement gave this server (its CUDA_VISIBLE_DEVICES), none on CPU."""
        visible = self.env.get("CUDA_VISIBLE_DEVICES", "")
        return frozenset(gpu.strip() for gpu in visible.split(",") if gpu.strip())

    def redacted_env(self) -> dict[str, str]:
        return redact_env(self.env)

    @property
    def secrets(self) -> list[str]:
        """Values that must not reach a file or a message: the side's API key."""
        return [key] if (key := reveal(self.api_key)) else []


@dataclass(frozen=True)
class LaunchPlan:
    """The servers to start, grouped into phases: servers in one phase run at the same time."""

    servers: dict[str, ServerPlan]  # by label: "reference", "candidate", "reference-1", ...
    phases: tuple[tuple[str, ...], ...]
    placement: Placement

    @property
    def simultaneous(self) -> bool:
        return len(self.phases) == 1 and len(self.phases[0]) > 1

    @property
    def replicas(self) -> int:
        return self.placement.replicas

    def load_schedule(self, workload: WorkloadConfig) -> LoadSchedule:
        """When each side's timed requests run, on these servers (placement.py's rules)."""
        started = {label for phase in self.phases for label in phase}
        sides = {plan.side for label, plan in self.servers.items() if label in started}
        return load_schedule(
            workload.schedule,
            self.placement.mode,
            len(sides),
            workload.concurrency,
            paced=workload.request_rate is not None,
            waves=workload.arrival == "waves",
        )

    def side_servers(self, side: str) -> list[ServerPlan]:
        """One side's servers, replica 0 first."""
        return sorted(
            (plan for plan in self.servers.values() if plan.side == side),
            key=lambda plan: plan.replica,
        )

    def without(self, side: str) -> LaunchPlan:
        """The plan with one side's servers left out (its results come from elsewhere)."""
        phases = tuple(
            kept
            for kept in (tuple(s for s in p if self.servers[s].side != side) for p in self.phases)
            if kept
        )
        return LaunchPlan(self.servers, phases, self.placement)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def place(
    scenario: Scenario,
    hardware: Hardware,
    launched: tuple[str, ...],
    copies: int,
    nodes: tuple[ClusterNode, ...] = (),
) -> Placement:
    """The placement of the launched sides: over a Ray cluster's `nodes`, the scenario's
    explicit GPUs, else the rules of rig.serve.placement. A side attached by URL keeps the
    others to a single pair."""
    placement = scenario.placement
    if placement.backend == "ray":
        return place_on_nodes(nodes, tensor_parallel(scenario), launched, placement.replicas)
    if hardware.gpu_count == 0:
        return place_on_cpus(hardware.cpu_ids, launched)
    explicit = [scenario.side(side).gpus for side in launched]
    if launched and all(explicit):
        pairs = zip(launched, explicit, strict=True)
        slots = tuple(Slot(side, 0, tuple(gpus)) for side, gpus in pairs)
        overlap = len({g for gpus in explicit for g in gpus}) < sum(map(len, explicit))
        phases = tuple((s.label,) for s in slots) if overlap else (tuple(launched),)
        mode = "sequential" if overlap else "simultaneous"
        why = "the sides' gpus overlap: in turn" if overlap else "the sides' own gpus: at once"
        return Placement(mode, 1, slots, phases, why)
    attached = len(launched) < len(SIDES) and any(scenario.side(s).url for s in SIDES)
    return place_on_gpus(
        hardware.gpu_count,
        tensor_parallel(scenario),
        launched,
        copies=copies,
        replicas=1 if attached else placement.replicas,
        share=placement.share_gpus,
    )


def serve_argv(
    scenario: Scenario,
    side: str,
    install: SideInstall,
    model_path: str,
    served_model: str,
    port: int,
    host: str = "127.0.0.1",
    enforce_eager: bool = True,
) -> list[str]:
    """The `vllm serve` command line both sides share, after the side's install's launcher
    (per-side extras are appended). Eight parameters, each one fact of the server's line that
    plan_servers has already worked out; a record of them would only be built to be unpacked."""
    model = scenario.model
    argv = [
        model_path,
        "--host",
        host,
        "--port",
        str(port),
        "--served-model-name",
        served_model,
        "--dtype",
        model.dtype,
        "--tensor-parallel-size",
        str(tensor_parallel(scenario)),
        "--seed",
        str(scenario.workload.seed),
        "--enable-prompt-tokens-details",  # each request's cached tokens, in its usage
        *backend_args(install, scenario.backend_of(side)),
    ]
    flags = {
        "--max-model-len": model.max_model_len,
        "--max-num-batched-tokens": model.max_num_batched_tokens,
        "--max-num-seqs": model.max_num_seqs,
    }
    for flag, value in flags.items():
        if value is not None:
            argv += [flag, str(value)]
    if scenario.gates.min_prefix_cache_hits is not None:
        # vLLM's CUDA build leaves prefix caching off for hybrid models unless asked (0.26.0:
        # `default_prefix_caching = ... and not is_hybrid`); hits are what this scenario tests.
        argv.append("--enable-prefix-caching")
    if enforce_eager:
        argv.append("--enforce-eager")
    return argv


def backend_args(install: SideInstall, backend: str) -> list[str]:
    """--gdn-prefill-backend as the side's vLLM takes it; a container's version is unknown
    until it runs, and every supported vLLM takes the flag."""
    if install.facts.vllm is None:
        return [GDN_BACKEND_FLAG, backend]
    return gdn_backend_args(install.facts.vllm, backend)


def shared_env(
    scenario: Scenario, hardware: Hardware, installs: dict[str, SideInstall]
) -> dict[str, str]:
    """Environment both sides get: the scenario's, plus what vLLM's CUDA build needs to run
    without flashinfer (its sampler imports it unless told not to) where a side lacks it."""
    env = dict(scenario.model.env)
    lacking = any(
        not (install.facts.flashinfer if install.facts.probed else True)
        for install in installs.values()
        if install.kind != "attached"
    )
    if hardware.gpu_count > 0 and (lacking or not flashinfer_importable()):
        env.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    return env


def flashinfer_importable() -> bool:
    return importlib.util.find_spec("flashinfer") is not None


def side_env(
    scenario: Scenario,
    slot: Slot,
    hardware: Hardware,
    installs: dict[str, SideInstall],
    launched: int,
    eager_mode: bool,
) -> dict[str, str]:
    """The server's environment: the shared one, then the side's and its install's, then what
    its slot and the scenario add (its kernel, its devices or cores, its caches)."""
    config = scenario.side(slot.side)
    env = shared_env(scenario, hardware, installs)
    env.update(config.env)
    env.update(installs[slot.side].env)
    if config.kernel is not None:
        env[KERNEL_ENV] = config.kernel
    if scenario.workload.arrival == "waves":
        env[GATE_ENV] = "1"
    if config.api_key is not None:
        env[API_KEY_ENV] = config.api_key.get_secret_value()  # argv is readable in ps
    if slot.gpus:
        env.setdefault("CUDA_VISIBLE_DEVICES", hardware.visible_devices(slot.gpus))
    elif slot.cpus:
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, slot.cpus)))
    if config.url is None and hardware.gpu_count == 0:
        # vLLM's CPU build reserves most of the machine's memory for each server otherwise.
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(hardware.kv_cache_gib(launched)))
    if config.url is None and (not eager_mode or slot.node is None):
        # eager, only on this machine: a Ray node's home need not be this machine's
        env.update(cache_env(scenario, slot.side, env, eager_mode))
    return env


def plan_servers(
    scenario: Scenario,
    model_path: str,
    run_dir: Path,
    hardware: Hardware,
    sides: tuple[str, ...] = SIDES,
    copies: int = 1,
    installs: dict[str, SideInstall] | None = None,
    nodes: tuple[ClusterNode, ...] = (),
) -> LaunchPlan:
    """Build identical argv/env for each server, differing only in what the scenario declares
    for a side (its install among them: probed here unless given) and in where the placement
    puts it (with `placement.backend: ray`, on which of the cluster's `nodes`, serving on the
    node's address). Eight parameters: the four every plan needs, then four with defaults that
    only preflight (installs, nodes), replica pairs (copies) and one-side plans (sides) set."""
    installs = installs if installs is not None else resolve_installs(scenario, sides)
    attached = [side for side in sides if scenario.side(side).url is not None]
    launched = tuple(side for side in sides if side not in attached)
    placement = place(scenario, hardware, launched, copies, nodes)
    slots = [*placement.slots, *(Slot(side, 0) for side in attached)]
    servers: dict[str, ServerPlan] = {}
    for slot in slots:
        plan = _server_plan(scenario, slot, hardware, installs, len(launched), model_path, run_dir)
        servers[plan.label] = plan
    phases = placement.phases
    if attached:  # always reachable: they join the first phase
        first = phases[0] if phases else ()
        phases = ((*first, *attached), *phases[1:])
    return LaunchPlan(servers=servers, phases=phases, placement=placement)


def _server_plan(
    scenario: Scenario,
    slot: Slot,
    hardware: Hardware,
    installs: dict[str, SideInstall],
    launched: int,
    model_path: str,
    run_dir: Path,
) -> ServerPlan:
    """One slot's server: what every server shares, then what its side and its slot add
    (`launched`: how many sides this machine starts, which split its memory)."""
    model = scenario.model
    served_model = model.served_name or (
        f"rig-{model.name}" if is_embedded(model.name) else model.name
    )
    eager_mode = eager(scenario, hardware)
    config = scenario.side(slot.side)
    stats_dir = run_dir / "kernel-stats" / slot.label
    install = installs[slot.side]
    env = side_env(scenario, slot, hardware, installs, launched, eager_mode)
    env[STATS_ENV] = str(stats_dir.resolve())
    host = slot.node.address if slot.node else "127.0.0.1"
    # free here; on a Ray node taken there, its server's start says so in one line
    port = (config.port + slot.replica) if config.port else free_port()
    prefix, cleanup = container_argv(install, list(env), f"rig-{slot.label}-{port}")
    served = serve_argv(
        scenario, slot.side, install, model_path, served_model, port, host, eager_mode
    )
    argv = [*prefix, *served]
    memory = slot.gpu_memory_fraction or model.gpu_memory_utilization
    if memory is not None:
        argv += ["--gpu-memory-utilization", f"{memory:g}"]
    if scenario.profile is not None and config.url is None:  # its own folder, as its port
        argv += profiler_args(profile_dir(run_dir, slot.label))
    argv += [*model.serve_args, *config.serve_args]
    return ServerPlan(
        side=slot.side,
        argv=tuple(argv),
        env=env,
        host=host,
        port=port,
        log_path=run_dir / f"server-{slot.label}.log",
        stats_dir=stats_dir,
        served_model=served_model,
        kernel=config.kernel,
        url=config.url,
        api_key=config.api_key,
        replica=slot.replica,
        devices="attached" if config.url else describe_devices(slot, hardware),
        install=install,
        launcher=prefix,
        cleanup=cleanup,
        port_fixed=config.port is not None,
    )
