"""Replica pairs on a Ray cluster (`placement.backend: ray`).

Each pair gets a placement group (STRICT_PACK: both sides' resources on the node the plan chose
for it); each of its servers is started, watched and stopped by a Ray actor there that runs the
rig's own Server (the same argv, environment, vLLM entry, process group and log as a server on
this machine); the pair's load client runs there too (run_on_pair_nodes), so its timing stays on
the node. Journal, resume, golden cache, verdict and report stay here, on the driver.

Ray is an optional extra (`pip install 'rig[ray]'`): it is imported only here, and only when a
scenario asks for it. Every node must see this checkout and the sides' interpreters at the paths
they have here (a shared file system, as on a Slurm allocation, or one image on KubeRay).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from rig.interrupts import INTERRUPTS, interrupts_held
from rig.serve.placement import ClusterNode, Placement, side_resources
from rig.serve.plan import ServerPlan
from rig.serve.servers import Server, ServerError

REPO = Path(__file__).resolve().parents[2]  # the checkout the actors import the rig from
RAY_MISSING = "placement.backend=ray needs Ray on this machine: pip install 'rig[ray]'"
CONNECT_TIMEOUT_S = 5.0  # for the cluster's address to answer at all
ASK_TIMEOUT_S = 60.0  # an actor that does not answer a question in this time counts as lost
LOST = -1  # the exit code a server reports when its actor or node is gone
WATCHDOG = """
import os, signal, sys, time
if os.fork():
    os._exit(0)  # no child of the actor's worker: Ray ends those with the worker
actor, group = map(int, sys.argv[1:])
def reaches(kill, target, signum=0):
    try:
        kill(target, signum)
        return True
    except ProcessLookupError:
        return False
while reaches(os.killpg, group) and reaches(os.kill, actor):
    time.sleep(1)
if reaches(os.killpg, group, signal.SIGTERM):
    deadline = time.monotonic() + 20
    while reaches(os.killpg, group) and time.monotonic() < deadline:
        time.sleep(0.5)
    reaches(os.killpg, group, signal.SIGKILL)
"""  # detached: outlives the actor's worker, ends when the server's group is gone
WORKER_ENV = ("OMP_NUM_THREADS", "PYTHONPATH")  # what Ray (or connect) sets on an actor's worker
T = TypeVar("T")


class ClusterUnavailable(RuntimeError):
    """No Ray cluster to place on; the message is one line meant for the user."""


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ClusterUnavailable(RAY_MISSING) from None
    return ray


def connect(address: str) -> Any:
    """This process as the cluster's driver (once), with the rig's own interrupt handlers kept:
    ray.init replaces SIGTERM's with one that exits without stopping anything."""
    ray = _ray()
    if ray.is_initialized():
        return ray
    _check_answers(address)
    handlers = {signum: signal.getsignal(signum) for signum in INTERRUPTS}
    try:
        ray.init(
            address=address,
            logging_level="ERROR",
            log_to_driver=False,
            runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}},
        )
    except (ConnectionError, RuntimeError, ValueError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ClusterUnavailable(f"placement.ray_address={address}: {reason}") from None
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    return ray


def _check_answers(address: str) -> None:
    """ClusterUnavailable unless something listens at a `host:port` address: ray.init waits on
    one that nothing answers for longer than 10 minutes."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "://" in address:
        return  # `auto`, or a ray:// client address: ray.init answers those itself
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        message = f"placement.ray_address={address}: nothing answers ({reason})"
        raise ClusterUnavailable(message) from None


def cluster_nodes(address: str) -> tuple[ClusterNode, ...]:
    """The cluster's live nodes, the head first, each with the CPUs and GPUs it declares."""
    ray = connect(address)
    alive = [node for node in ray.nodes() if node["Alive"]]
    alive.sort(key=lambda node: ("node:__internal_head__" not in node["Resources"], node["NodeID"]))
    return tuple(
        ClusterNode(
            node["NodeID"],
            node["NodeManagerAddress"],
            int(node["Resources"].get("CPU", 0)),
            int(node["Resources"].get("GPU", 0)),
        )
        for node in alive
    )


class ServerProcess:
    """The actor on a pair's node: one server, run by the rig's own Server from the driver's
    working directory (argv's relative paths mean there what they mean on the driver) and with
    the driver's values of what Ray sets on its workers (`driver_env`; RAY_* dropped)."""

    def __init__(self, plan: ServerPlan, workdir: str, driver_env: dict[str, str]) -> None:
        os.chdir(workdir)
        self.driver_env = driver_env
        self.server = Server(plan)

    def start(self) -> None:
        """Start the server, and a watchdog that stops its process group if this actor dies
        without stopping it (a driver that crashed, a killed worker)."""
        for name in [*WORKER_ENV, *(name for name in os.environ if name.startswith("RAY_"))]:
            os.environ.pop(name, None)  # the worker's: the server gets the driver's
        os.environ.update(self.driver_env)
        self.server.start()
        subprocess.run(
            [sys.executable, "-c", WATCHDOG, str(os.getpid()), str(self.server.process.pid)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            check=True,
        )

    def exited(self) -> int | None:
        return self.server.exited()

    def log_text(self, start: int) -> str:
        return self.server.log_text(start)

    def log_size(self) -> int:
        return self.server.log_size()

    def rss_bytes(self) -> int:
        return self.server.rss_bytes()

    def stop(self, grace_s: float) -> str:
        """Stop the server's process group; its whole (redacted) log, for a driver that does
        not share the node's file system."""
        self.server.stop(grace_s)
        return self.server.log_text()


@dataclass
class RayServer(Server):
    """The driver's handle on a server that an actor on its pair's node runs: the load phase
    asks it what it asks a local Server."""

    actor: Any = None
    group: Any = None  # its pair's placement group

    def _ask(self, method: str, *args: object, default: Any, timeout_s: float = ASK_TIMEOUT_S):
        ray = _ray()
        try:
            return ray.get(getattr(self.actor, method).remote(*args), timeout=timeout_s)
        except ray.exceptions.RayError:
            return default

    def start(self) -> None:
        ray = _ray()
        try:
            ray.get(self.actor.start.remote())
        except ray.exceptions.RayTaskError as exc:
            raise ServerError(f"{self.plan.label} on Ray: {exc.cause}") from None
        except ray.exceptions.RayError as exc:
            raise ServerError(f"{self.plan.label}: its Ray actor was lost ({exc})") from None

    def exited(self) -> int | None:
        return self._ask("exited", default=LOST)

    def log_text(self, start: int = 0) -> str:
        return self._ask("log_text", start, default="")

    def log_size(self) -> int:
        return self._ask("log_size", default=0)

    def rss_bytes(self) -> int:
        return self._ask("rss_bytes", default=0)

    def stop(self, grace_s: float = 20.0) -> None:
        """Stop the server through its actor, keep its log here, then end the actor."""
        text = self._ask("stop", grace_s, default=None, timeout_s=grace_s + ASK_TIMEOUT_S)
        if text is not None and not self.plan.log_path.exists():
            self.plan.log_path.parent.mkdir(parents=True, exist_ok=True)
            self.plan.log_path.write_text(text, encoding="utf-8")
        with contextlib.suppress(Exception):
            _ray().kill(self.actor)


class RayPairs:
    """Starts a phase's replica pairs on their nodes and guarantees that servers, actors and
    placement groups are gone on every exit path (what ServerSet is on one machine)."""

    def __init__(
        self, placement: Placement, plans: list[ServerPlan], startup_timeout_s: float
    ) -> None:
        self.placement = placement
        self.plans = plans
        self.startup_timeout_s = startup_timeout_s
        self.servers: dict[str, RayServer] = {}
        self.groups: dict[int, Any] = {}

    def __enter__(self) -> dict[str, Server]:
        try:
            for replica in sorted({plan.replica for plan in self.plans}):
                self._reserve(replica)
            for plan in self.plans:
                self._start(plan)
            for server in self.servers.values():
                server.wait_ready(self.startup_timeout_s)
        except BaseException:
            self.stop()
            raise
        return dict(self.servers)

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _slots(self, replica: int):
        labels = [plan.label for plan in self.plans if plan.replica == replica]
        return [self.placement.slot(label) for label in labels]

    def _reserve(self, replica: int) -> None:
        """The pair's placement group on its planned node: one bundle per side, the first
        pinned to the node's address, the group aimed at the node itself (nodes of one
        machine share an address)."""
        ray = _ray()
        from ray.util.placement_group import placement_group, placement_group_table

        slots = self._slots(replica)
        node = slots[0].node
        bundles = [side_resources(slot.gpu_count, slot.gpu_count > 0) for slot in slots]
        bundles[0][f"node:{node.address}"] = 0.001
        with interrupts_held():
            group = placement_group(bundles, "STRICT_PACK", _soft_target_node_id=node.node_id)
            self.groups[replica] = group
        try:
            ray.get(group.ready(), timeout=self.startup_timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise ServerError(
                f"Ray could not reserve pair {replica} ({bundles}) on {node.describe()} in "
                f"{self.startup_timeout_s:.0f} s"
            ) from None
        landed = placement_group_table(group)["bundles_to_node_id"][0]
        if landed != node.node_id:
            raise ServerError(
                f"Ray put pair {replica} on node {landed[:8]}, not on the planned "
                f"{node.describe()}: its servers would listen on the wrong address"
            )

    def _start(self, plan: ServerPlan) -> None:
        ray = _ray()
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        slots = self._slots(plan.replica)
        index = [slot.label for slot in slots].index(plan.label)
        group = self.groups[plan.replica]
        strategy = PlacementGroupSchedulingStrategy(group, index)
        gpus = slots[index].gpu_count
        need = side_resources(gpus, gpus > 0)
        actor_class = ray.remote(ServerProcess).options(
            num_cpus=need["CPU"], num_gpus=need.get("GPU", 0), scheduling_strategy=strategy
        )
        with interrupts_held():
            server = RayServer(
                plan, actor=actor_class.remote(plan, os.getcwd(), _driver_env()), group=group
            )
            self.servers[plan.label] = server
        server.start()

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop()
        ray = _ray()
        from ray.util.placement_group import remove_placement_group

        for group in self.groups.values():
            with contextlib.suppress(ray.exceptions.RayError):
                remove_placement_group(group)
        self.servers, self.groups = {}, {}


def _driver_env() -> dict[str, str]:
    return {name: os.environ[name] for name in WORKER_ENV if name in os.environ}


def on_ray(servers: dict[str, Server]) -> bool:
    """Whether these servers run on a Ray cluster."""
    return any(isinstance(server, RayServer) for server in servers.values())


def _call(function: Callable[[], T]) -> T:
    return function()


def run_on_pair_nodes(
    servers: dict[str, Server], calls: dict[int, Callable[[], T]]
) -> dict[int, T]:
    """Each replica pair's call (by replica), run at once, each on its pair's node inside its
    placement group; their answers come back here. An interrupt cancels them all."""
    ray = _ray()
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    groups = {server.plan.replica: server.group for server in servers.values()}
    task = ray.remote(num_cpus=0, max_retries=0)(_call)
    refs = {
        replica: task.options(
            scheduling_strategy=PlacementGroupSchedulingStrategy(groups[replica], 0)
        ).remote(call)
        for replica, call in calls.items()
    }
    try:
        return {replica: ray.get(ref) for replica, ref in refs.items()}
    except ray.exceptions.RayTaskError as exc:
        raise ServerError(f"a pair's load client failed on its node: {exc.cause}") from None
    except BaseException:  # a finished task is never cancelled: Ray 2.60's driver aborts on it
        _, pending = ray.wait(list(refs.values()), num_returns=len(refs), timeout=0)
        for ref in pending:
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=True)
        raise
