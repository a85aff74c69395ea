"""Real `vllm serve` processes for the two sides: planned from the scenario, started from argv
lists on loopback, health-polled, logged to the run folder, and always stopped.

Each server runs in its own process group (vLLM forks an engine core and a worker), so stopping
a side stops its whole tree. Both sides run at once when the machine has room for two: on GPU,
disjoint CUDA_VISIBLE_DEVICES sets of the tensor-parallel size; on CPU, disjoint cores through
VLLM_CPU_OMP_THREADS_BIND (by default both workers bind core 0). Otherwise one after the other.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import SecretStr

from kernels.backends import gdn_backend_args
from kernels.proof import KERNEL_ENV
from kernels.proof import STATS_DIR_ENV as STATS_ENV
from rig.placement import Placement, Slot, place_on_cpus, place_on_gpus, server_label
from rig.scenario import SIDES, Scenario
from rig.secrets import API_KEY_ENV, auth_headers, redact_env, redact_file, redact_text, reveal
from rig.vllm_entry import installed_vllm_version

LOG_TAIL_LINES = 40


class ServerError(RuntimeError):
    """A server that cannot be started or used; the message includes its log tail."""


@dataclass(frozen=True)
class Hardware:
    """What this machine offers the servers (or, with --assume-gpus, what a plan assumes)."""

    gpu_count: int
    cpu_ids: tuple[int, ...]
    memory_gib: float = 0.0
    gpu_ids: tuple[str, ...] = ()  # as a child's CUDA_VISIBLE_DEVICES must name them
    gpu_free_mib: tuple[int, ...] = ()  # per GPU, empty when unknown
    assumed: bool = False

    @classmethod
    def detect(cls) -> Hardware:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        gpu_ids, free = visible_gpus()
        return cls(
            gpu_count=len(gpu_ids),
            cpu_ids=tuple(sorted(os.sched_getaffinity(0))),
            memory_gib=pages / 2**30,
            gpu_ids=gpu_ids,
            gpu_free_mib=free,
        )

    @classmethod
    def assume_gpus(cls, count: int) -> Hardware:
        """A node this process is not on: `count` GPUs of unknown free memory."""
        return cls(
            gpu_count=count,
            cpu_ids=tuple(range(os.cpu_count() or 1)),
            gpu_ids=tuple(str(i) for i in range(count)),
            assumed=True,
        )

    def kv_cache_gib(self, servers: int) -> int:
        """A CPU server's KV cache: a third of the memory shared by the servers, 1..32 GiB."""
        return max(1, min(32, int(self.memory_gib / 3 / max(servers, 1))))

    def visible_devices(self, gpus: tuple[int, ...]) -> str:
        """CUDA_VISIBLE_DEVICES for a child given indices into the GPUs this process sees."""
        ids = self.gpu_ids or tuple(str(i) for i in range(self.gpu_count))
        return ",".join(ids[g] for g in gpus)


def query_gpus(fields: str) -> list[list[str]]:
    """nvidia-smi's answer for `fields` (e.g. "index,memory.free"), one row per GPU of the
    machine; no rows when there is no NVIDIA GPU."""
    try:
        listing = subprocess.run(
            ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [[part.strip() for part in line.split(",")] for line in listing.splitlines() if line]


def visible_gpus() -> tuple[tuple[str, ...], tuple[int, ...]]:
    """GPU ids a child must be given (honouring this process's CUDA_VISIBLE_DEVICES) and their
    free memory in MiB."""
    rows = query_gpus("index,uuid,memory.free")
    by_name = {row[0]: row for row in rows} | {row[1]: row for row in rows}
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    names = [v.strip() for v in visible.split(",") if v.strip()] if visible is not None else None
    chosen = [by_name[n] for n in names if n in by_name] if names is not None else rows
    return tuple(row[0] for row in chosen), tuple(int(float(row[2])) for row in chosen)


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

    @property
    def label(self) -> str:
        return server_label(self.side, self.replica)

    @property
    def base_url(self) -> str:
        return self.url.rstrip("/") if self.url else f"http://{self.host}:{self.port}"

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


def ensure_port_free(port: int, host: str = "127.0.0.1") -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            raise ServerError(f"port {port} on {host} is already in use") from None


def place(
    scenario: Scenario, hardware: Hardware, launched: tuple[str, ...], copies: int
) -> Placement:
    """The placement of the launched sides: the scenario's explicit GPUs, else the rules of
    rig.placement. A side attached by URL keeps the others to a single pair."""
    model, placement = scenario.model, scenario.placement
    if hardware.gpu_count == 0:
        return place_on_cpus(hardware.cpu_ids, launched)
    explicit = [scenario.side(side).gpus for side in launched]
    if launched and all(explicit):
        pairs = zip(launched, explicit, strict=True)
        slots = tuple(Slot(side, 0, tuple(gpus)) for side, gpus in pairs)
        overlap = len({g for gpus in explicit for g in gpus}) < sum(map(len, explicit))
        phases = tuple((s.label,) for s in slots) if overlap else (tuple(launched),)
        return Placement("sequential" if overlap else "simultaneous", 1, slots, phases)
    attached = len(launched) < len(SIDES) and any(scenario.side(s).url for s in SIDES)
    return place_on_gpus(
        hardware.gpu_count,
        model.tensor_parallel_size,
        launched,
        copies=copies,
        replicas=1 if attached else placement.replicas,
        share=placement.share_gpus,
    )


def serve_argv(scenario: Scenario, model_path: str, served_model: str, port: int) -> list[str]:
    """The `vllm serve` command line both sides share (per-side extras are appended)."""
    model = scenario.model
    argv = [
        sys.executable,
        "-m",
        "rig.vllm_entry",
        "serve",
        model_path,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--served-model-name",
        served_model,
        "--dtype",
        model.dtype,
        "--tensor-parallel-size",
        str(model.tensor_parallel_size),
        "--seed",
        str(scenario.workload.seed),
        *gdn_backend_args(installed_vllm_version(), model.gdn_prefill_backend),
    ]
    flags = {
        "--max-model-len": model.max_model_len,
        "--max-num-batched-tokens": model.max_num_batched_tokens,
        "--max-num-seqs": model.max_num_seqs,
    }
    for flag, value in flags.items():
        if value is not None:
            argv += [flag, str(value)]
    if model.enforce_eager:
        argv.append("--enforce-eager")
    return argv


def shared_env(scenario: Scenario, hardware: Hardware) -> dict[str, str]:
    """Environment both sides get: the scenario's, plus what vLLM's CUDA build needs to run
    without flashinfer (its sampler imports it unless told not to)."""
    env = dict(scenario.model.env)
    if hardware.gpu_count > 0 and not flashinfer_importable():
        env.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    return env


def flashinfer_importable() -> bool:
    return importlib.util.find_spec("flashinfer") is not None


def plan_servers(
    scenario: Scenario,
    model_path: str,
    run_dir: Path,
    hardware: Hardware,
    sides: tuple[str, ...] = SIDES,
    copies: int = 1,
) -> LaunchPlan:
    """Build identical argv/env for each server, differing only in what the scenario declares
    for a side and in where the placement puts it."""
    model = scenario.model
    served_model = model.served_name or (f"rig-{model.name}" if model.is_embedded else model.name)
    attached = [side for side in sides if scenario.side(side).url is not None]
    launched = tuple(side for side in sides if side not in attached)
    placement = place(scenario, hardware, launched, copies)
    slots = [*placement.slots, *(Slot(side, 0) for side in attached)]
    servers: dict[str, ServerPlan] = {}
    for slot in slots:
        config = scenario.side(slot.side)
        stats_dir = run_dir / "kernel-stats" / slot.label
        env = shared_env(scenario, hardware)
        env.update(config.env)
        env[STATS_ENV] = str(stats_dir.resolve())
        if config.kernel is not None:
            env[KERNEL_ENV] = config.kernel
        if config.api_key is not None:
            env[API_KEY_ENV] = config.api_key.get_secret_value()  # argv is readable in ps
        if slot.gpus:
            env.setdefault("CUDA_VISIBLE_DEVICES", hardware.visible_devices(slot.gpus))
        elif slot.cpus:
            env.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, slot.cpus)))
        if hardware.gpu_count == 0 and config.url is None:
            # vLLM's CPU build reserves most of the machine's memory for each server otherwise.
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(hardware.kv_cache_gib(len(launched))))
        port = (config.port + slot.replica) if config.port else free_port()
        argv = serve_argv(scenario, model_path, served_model, port)
        memory = slot.gpu_memory_fraction or model.gpu_memory_utilization
        if memory is not None:
            argv += ["--gpu-memory-utilization", f"{memory:g}"]
        argv += [*model.serve_args, *config.serve_args]
        plan = ServerPlan(
            side=slot.side,
            argv=tuple(argv),
            env=env,
            host="127.0.0.1",
            port=port,
            log_path=run_dir / f"server-{slot.label}.log",
            stats_dir=stats_dir,
            served_model=served_model,
            kernel=config.kernel,
            url=config.url,
            api_key=config.api_key,
            replica=slot.replica,
            devices="attached" if config.url else _devices(slot, hardware),
        )
        servers[plan.label] = plan
    phases = placement.phases
    if attached:  # always reachable: they join the first phase
        first = phases[0] if phases else ()
        phases = ((*first, *attached), *phases[1:])
    return LaunchPlan(servers=servers, phases=phases, placement=placement)


def _devices(slot: Slot, hardware: Hardware) -> str:
    if slot.gpus:
        text = f"GPU {hardware.visible_devices(slot.gpus)}"
        if slot.gpu_memory_fraction is not None:
            text += f" (shared, {slot.gpu_memory_fraction:.0%} of memory)"
        return text
    return f"CPU cores {','.join(map(str, slot.cpus))}" if slot.cpus else "CPU"


@dataclass
class Server:
    """One running (or attached) side."""

    plan: ServerPlan
    process: subprocess.Popen | None = None
    tmpdir: Path | None = None
    _log_file: object | None = field(default=None, repr=False)

    @property
    def base_url(self) -> str:
        return self.plan.base_url

    def start(self) -> None:
        if self.plan.url is not None:
            return
        ensure_port_free(self.plan.port, self.plan.host)
        self.plan.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.plan.stats_dir.mkdir(parents=True, exist_ok=True)
        # vLLM's IPC sockets and vllm_dist_* files go to TMPDIR; a private one is removed on stop.
        self.tmpdir = Path(tempfile.mkdtemp(prefix=f"rig-{self.plan.side[:3]}-"))
        env = {**os.environ, **self.plan.env, "TMPDIR": str(self.tmpdir)}
        env.setdefault("PYTHONUNBUFFERED", "1")
        self._log_file = open(self.plan.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            list(self.plan.argv),
            env=env,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def exited(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def log_text(self, start: int = 0) -> str:
        try:
            with open(self.plan.log_path, "rb") as handle:
                handle.seek(start)
                text = handle.read().decode("utf-8", errors="replace")
            return redact_text(text, self.plan.secrets)
        except FileNotFoundError:
            return ""

    def log_size(self) -> int:
        try:
            return self.plan.log_path.stat().st_size
        except FileNotFoundError:
            return 0

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def rss_bytes(self) -> int:
        """Resident memory of the server's whole process group (API server, engine, worker)."""
        if self.process is None:
            return 0
        total = 0
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            # after the command: state ppid pgrp ...; rss (pages) is field 24 of the full line
            if int(fields[2]) == self.process.pid:
                total += int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
        return total

    def wait_ready(self, timeout_s: float) -> None:
        """Poll /health until it answers 200; fail with the log tail if the server dies first."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            code = self.exited()
            if code is not None:
                raise ServerError(
                    f"{self.plan.side} server exited with code {code} before it was ready"
                    f"{root_cause(self.log_text())}; log {self.plan.log_path}:\n{self.log_tail()}"
                )
            if self.healthy():
                return
            time.sleep(0.5)
        raise ServerError(
            f"{self.plan.side} server not ready after {timeout_s:.0f} s; "
            f"log {self.plan.log_path}:\n{self.log_tail()}"
        )

    def healthy(self) -> bool:
        request = urllib.request.Request(
            f"{self.base_url}/health", headers=auth_headers(self.plan.api_key)
        )
        try:
            with urllib.request.urlopen(request, timeout=2) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM the whole process group, then SIGKILL what is left after the grace period."""
        if self.process is not None and self.process.poll() is None:
            _signal_group(self.process.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=grace_s)
        if self.process is not None:
            # The group may outlive its leader (engine core, worker): always sweep it.
            _signal_group(self.process.pid, signal.SIGKILL)
            self.process.wait()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
            redact_file(self.plan.log_path, self.plan.secrets)
        if self.tmpdir is not None:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            self.tmpdir = None


_ERROR_LINE = re.compile(r"(?:^|\] )(\w+(?:Error|Exception)): (.+)")
_WRAPPER_ERRORS = ("Engine core initialization failed", "WorkerProc failed")


def root_cause(log: str) -> str:
    """': <the first exception message in the log>', skipping vLLM's wrapper errors."""
    for line in log.splitlines():
        found = _ERROR_LINE.search(line)
        if found and not any(wrapper in line for wrapper in _WRAPPER_ERRORS):
            return f": {found.group(1)}: {found.group(2)[:300]}"
    return ""


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


class ServerSet:
    """Starts a phase's servers together and guarantees they are stopped on every exit path."""

    def __init__(self, plans: list[ServerPlan], startup_timeout_s: float) -> None:
        self.servers = {plan.label: Server(plan) for plan in plans}
        self.startup_timeout_s = startup_timeout_s

    def __enter__(self) -> dict[str, Server]:
        try:
            for server in self.servers.values():
                server.start()
            for server in self.servers.values():
                server.wait_ready(self.startup_timeout_s)
        except BaseException:
            self.stop()
            raise
        return self.servers

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop()


JIT_COMPILE = "jit_compile"
LOG_FAULTS = {
    "out_of_memory": re.compile(r"out of memory|OutOfMemoryError|Cannot allocate memory", re.I),
    "cuda_error": re.compile(r"CUDA error|cudaError|illegal memory access|device-side assert"),
    "traceback": re.compile(r"^Traceback \(most recent call last\)", re.M),
    "engine_dead": re.compile(r"EngineDeadError|EngineCore encountered a fatal error"),
    # vllm.utils.jit_monitor: a kernel compiled while serving. Not a fault of the kernel, but the
    # level's timings include the compilation: the report flags that level.
    JIT_COMPILE: re.compile(r"during inference: .*consider extending warmup"),
}
ADVISORY_LOG_KINDS = frozenset({JIT_COMPILE})  # flagged in the report, no gate counts them


@dataclass(frozen=True)
class LogFault:
    side: str
    kind: str
    line: str


def scan_log(side: str, text: str) -> list[LogFault]:
    """Faults in a slice of a server log (the slice written during one level)."""
    faults = []
    for line in text.splitlines():
        for kind, pattern in LOG_FAULTS.items():
            if pattern.search(line):
                faults.append(LogFault(side=side, kind=kind, line=line.strip()[:300]))
    return faults
