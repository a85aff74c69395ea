"""The Ray cluster under `placement.backend: ray`: this process connected to it as its driver,
and its live nodes as the plan places pairs on them (rig.serve.ray_pairs runs the pairs).

Ray is an optional extra (`pip install 'rig[ray]'`): it is imported only here, and only when a
scenario asks for it.
"""

from __future__ import annotations

import contextlib
import signal
import socket
from pathlib import Path
from typing import Any

from rig.interrupts import INTERRUPTS
from rig.serve.placement import ClusterNode

REPO = Path(__file__).resolve().parents[2]  # the checkout the actors import the rig from
RAY_MISSING = "placement.backend=ray needs Ray on this machine: pip install 'rig[ray]'"
CONNECT_TIMEOUT_S = 5.0  # for the cluster's address to answer at all
NODE_PROBE_S = 20.0  # for a node to run an empty task (a worker may have to start there)


class ClusterUnavailable(RuntimeError):
    """No Ray cluster to place on; the message is one line meant for the user."""


def ray_module() -> Any:
    try:
        import ray
    except ImportError:
        raise ClusterUnavailable(RAY_MISSING) from None
    return ray


def connect(address: str) -> Any:
    """This process as the cluster's driver (once), with the rig's own interrupt handlers kept:
    ray.init replaces SIGTERM's with one that exits without stopping anything."""
    ray = ray_module()
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
        raise ClusterUnavailable(f"placement.ray_address={address}: {first_line(exc)}") from None
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    return ray


def first_line(exc: BaseException) -> str:
    """An exception's first line (Ray's run over many), or its type's name if it says nothing."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


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


def node_answers(node_id: str) -> bool:
    """Whether a node still runs a task. Ray declares a lost node dead only once its health
    checks have timed out, and its actors' deaths are known before that, so a node it still
    counts as alive is asked to run an empty task (pending on a lost node until the timeout)."""
    ray = ray_module()
    if not any(node["NodeID"] == node_id and node["Alive"] for node in ray.nodes()):
        return False
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    there = NodeAffinitySchedulingStrategy(node_id, soft=False)
    probe = ray.remote(num_cpus=0, max_retries=0)(_nothing).options(scheduling_strategy=there)
    ref = probe.remote()
    try:
        ray.get(ref, timeout=NODE_PROBE_S)
        return True
    except ray.exceptions.RayError:  # timed out, or unschedulable there
        with contextlib.suppress(Exception):
            ray.cancel(ref)  # pending: no force (forcing a finished task aborts Ray 2.60's driver)
        return False


def _nothing() -> None:
    """The probe node_answers runs."""


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
