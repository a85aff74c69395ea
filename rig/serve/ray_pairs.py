"""Replica pairs on a Ray cluster (`placement.backend: ray`).

Each pair gets a placement group (STRICT_PACK: both sides' resources on the node the plan chose
for it); each of its servers is started, watched and stopped by a Ray actor there that runs the
rig's own Server (the same argv, environment, vLLM entry, process group and log as a server on
this machine); the pair's load client runs there too (run_on_pair_nodes), so its timing stays on
the node. Journal, resume, golden cache, verdict and report stay here, on the driver.

Ray is an optional extra (`pip install 'rig[ray]'`), imported through rig.serve.ray_cluster only
when a scenario asks for it. Every node must see this checkout and the sides' interpreters at
the paths they have here (a shared file system, as on a Slurm allocation, or one image on
KubeRay).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from rig.interrupts import interrupts_held
from rig.serve.placement import ClusterNode, Placement, side_resources
from rig.serve.plan import ServerPlan
from rig.serve.ray_cluster import first_line, node_answers, ray_module
from rig.serve.servers import Server, ServerError

ASK_TIMEOUT_S = 60.0  # an actor that does not answer a question in this time counts as lost
STREAM_POLL_S = 0.5  # how often the driver takes in the records the pairs' clients sent
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


class PairLost(ServerError):
    """A pair's load client ended without an answer (its worker or node died), so the block's
    requests in flight there are lost; the caller names the server that went with it."""


class ServerProcess:
    """The actor on a pair's node: one server, run by the rig's own Server from the driver's
    working directory (argv's relative paths mean there what they mean on the driver) and with
    the driver's values of what Ray sets on its workers (`driver_env`; RAY_* dropped)."""

    def __init__(self, plan: ServerPlan, workdir: str, driver_env: dict[str, str]) -> None:
        os.chdir(workdir)
        self.driver_env = driver_env
        self.server = Server(plan)

    def start(self) -> int:
        """Start the server, and a watchdog that stops its process group if this actor dies
        without stopping it (a driver that crashed, a killed worker); returns the port it
        serves on (picked again here if the planned one was taken on this node)."""
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
        return self.server.plan.port

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
    node: ClusterNode | None = None  # the node its pair was placed on
    sink: Any = None  # the RecordSink its pair's client streams records to

    def _ask(self, method: str, *args: object, default: Any, timeout_s: float = ASK_TIMEOUT_S):
        ray = ray_module()
        try:
            return ray.get(getattr(self.actor, method).remote(*args), timeout=timeout_s)
        except ray.exceptions.RayError:
            return default

    def start(self) -> None:
        ray = ray_module()
        try:
            port = ray.get(self.actor.start.remote())
        except ray.exceptions.RayTaskError as exc:
            raise ServerError(f"{self.plan.label} on Ray: {exc.cause}") from None
        except ray.exceptions.RayError as exc:
            raise ServerError(f"{self.plan.label}: its Ray actor was lost ({exc})") from None
        if port != self.plan.port:
            self.plan = self.plan.with_port(port)

    def exited(self) -> int | None:
        return self._ask("exited", default=LOST)

    def exit_reason(self, code: int) -> str:
        """The server's exit code, or what took it: its actor, or the node under it."""
        if code != LOST:
            return f"exit code {code}"
        if self.node is not None and not node_answers(self.node.node_id):
            return f"its Ray {self.node.describe()} was lost"
        return "its Ray actor died"

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
            ray_module().kill(self.actor)


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
        self.sink: Any = None

    def __enter__(self) -> dict[str, Server]:
        try:
            self._open_sink()
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

    def _open_sink(self) -> None:
        """The RecordSink, on this (the driver's) node, so that it outlives any pair's node."""
        ray = ray_module()
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        sink = ray.remote(RecordSink).options(num_cpus=0, scheduling_strategy=here)
        with interrupts_held():
            self.sink = sink.remote()

    def _slots(self, replica: int):
        labels = [plan.label for plan in self.plans if plan.replica == replica]
        return [self.placement.slot(label) for label in labels]

    def _reserve(self, replica: int) -> None:
        """The pair's placement group on its planned node: one bundle per side, the first
        pinned to the node's address, the group aimed at the node itself (nodes of one
        machine share an address)."""
        ray = ray_module()
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
        ray = ray_module()
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
            actor = actor_class.remote(plan, os.getcwd(), _driver_env())
            server = RayServer(
                plan, actor=actor, group=group, node=slots[index].node, sink=self.sink
            )
            self.servers[plan.label] = server
        server.start()

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop()
        ray = ray_module()
        from ray.util.placement_group import remove_placement_group

        for group in self.groups.values():
            with contextlib.suppress(ray.exceptions.RayError):
                remove_placement_group(group)
        if self.sink is not None:
            with contextlib.suppress(Exception):
                ray.kill(self.sink)
        self.servers, self.groups, self.sink = {}, {}, None


def _driver_env() -> dict[str, str]:
    return {name: os.environ[name] for name in WORKER_ENV if name in os.environ}


def on_ray(servers: dict[str, Server]) -> bool:
    """Whether these servers run on a Ray cluster."""
    return any(isinstance(server, RayServer) for server in servers.values())


class RecordSink:
    """An actor on the driver's node that holds the records the pairs' clients send as each
    request finishes, until the driver takes them into its journal: an interrupt or a lost node
    then loses only the requests still in flight, as on one machine."""

    def __init__(self) -> None:
        self.records: list[Any] = []

    def put(self, record: Any) -> None:
        self.records.append(record)

    def flush(self) -> None:
        """Nothing: answered after every put its caller sent before (one caller's calls run in
        order)."""

    def take(self) -> list[Any]:
        taken, self.records = self.records, []
        return taken


def _streamed(sink: Any, call: Callable[[Callable[[Any], None]], T]) -> T:
    """On a pair's node: the pair's call, each record sent to the sink as it finishes (sent, not
    awaited, so the client's timing does not wait on the driver)."""
    answer = call(lambda record: sink.put.remote(record))
    ray_module().get(sink.flush.remote())
    return answer


def run_on_pair_nodes(
    servers: dict[str, Server],
    calls: dict[int, Callable[[Callable[[Any], None]], T]],
    on_record: Callable[[Any], None],
) -> dict[int, T]:
    """Each replica pair's call (by replica), run at once, each on its pair's node inside its
    placement group, with a function that streams a record back here to `on_record`; their
    answers come back here. An interrupt or a lost pair cancels the others, after taking in
    what they sent."""
    ray = ray_module()
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    ray_servers = [server for server in servers.values() if isinstance(server, RayServer)]
    groups = {server.plan.replica: server.group for server in ray_servers}
    sink = ray_servers[0].sink
    task = ray.remote(num_cpus=0, max_retries=0)(_streamed)
    refs = {
        replica: task.options(
            scheduling_strategy=PlacementGroupSchedulingStrategy(groups[replica], 0)
        ).remote(sink, call)
        for replica, call in calls.items()
    }
    answers: dict[int, T] = {}
    try:
        while len(answers) < len(refs):
            running = [ref for replica, ref in refs.items() if replica not in answers]
            done, _ = ray.wait(running, num_returns=1, timeout=STREAM_POLL_S)
            for record in ray.get(sink.take.remote()):
                on_record(record)
            for replica, ref in refs.items():
                if ref in done:
                    answers[replica] = _answer(ray, replica, ref)
        return answers
    except BaseException:  # a finished task is never cancelled: Ray 2.60's driver aborts on it
        with contextlib.suppress(Exception):
            for record in ray.get(sink.take.remote(), timeout=ASK_TIMEOUT_S):
                on_record(record)
        _, pending = ray.wait(list(refs.values()), num_returns=len(refs), timeout=0)
        for ref in pending:
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=True)
        raise


def _answer(ray: Any, replica: int, ref: Any) -> Any:
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        raise ServerError(f"a pair's load client failed on its node: {exc.cause}") from None
    except ray.exceptions.RayError as exc:
        raise PairLost(f"pair {replica}'s load client was lost: {first_line(exc)}") from None
