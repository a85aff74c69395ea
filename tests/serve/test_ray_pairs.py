"""Replica pairs on a Ray cluster, without one: the scenario's keys, pairs placed over nodes,
the plan --plan prints, and the one-line refusals (no Ray installed, too small a cluster, a
side attached by URL). tests/e2e/test_ray.py runs them on a real local cluster."""

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

import rig.serve.preflight as preflight_module
import rig.serve.ray_pairs as ray_pairs
from rig.scenario.config import Scenario
from rig.serve.hardware import Hardware
from rig.serve.placement import ClusterNode, PlacementError, place_on_nodes
from rig.serve.plan import free_port, plan_servers
from rig.serve.plan_text import render_plan
from rig.serve.preflight import PreflightError, preflight
from rig.serve.ray_cluster import RAY_MISSING, ClusterUnavailable, connect
from rig.serve.ray_pairs import LOST, WATCHDOG, RayServer, RecordSink
from tests.serve.test_preflight import own_install

SIDES = ("reference", "candidate")
CPU_NODES = (ClusterNode("a" * 56, "10.0.0.1", 2, 0), ClusterNode("b" * 56, "10.0.0.2", 2, 0))


def scenario(model: dict | None = None, reference: dict | None = None, **placement) -> Scenario:
    return Scenario.model_validate(
        {
            "name": "t",
            "model": {"name": "org/some-model", **(model or {})},
            "reference": reference or {},
            "candidate": {"kernel": "ns4"},
            "placement": {"backend": "ray", **placement},
            "workload": {"prompts": [{"long_tokens": [100]}], "concurrency": [1, 4]},
        }
    )


def test_the_backend_is_local_unless_asked_and_only_local_or_ray():
    data = {"name": "t", "workload": {"prompts": [{"long_tokens": [100]}], "concurrency": [1]}}
    default = Scenario.model_validate(data).placement
    assert (default.backend, default.ray_address) == ("local", "auto")
    assert scenario(ray_address="10.0.0.1:6379").placement.ray_address == "10.0.0.1:6379"
    with pytest.raises(ValidationError, match="backend"):
        scenario(backend="slurm")


def test_one_pair_per_node_by_default_its_sides_on_the_nodes_cores():
    placement = place_on_nodes(CPU_NODES, 1, SIDES, None)
    assert placement.replicas == 2 and placement.mode == "simultaneous"
    where = {slot.label: (slot.node.address, slot.cpus) for slot in placement.slots}
    assert where == {
        "reference": ("10.0.0.1", (0,)),
        "candidate": ("10.0.0.1", (1,)),
        "reference-1": ("10.0.0.2", (0,)),
        "candidate-1": ("10.0.0.2", (1,)),
    }
    assert placement.phases == (tuple(where),)


def test_pairs_spread_over_the_nodes_before_a_node_takes_a_second():
    big, small = ClusterNode("big", "10.0.0.1", 64, 16), ClusterNode("small", "10.0.0.2", 64, 8)
    placement = place_on_nodes((big, small), 4, SIDES, 3)
    nodes = {slot.replica: slot.node.node_id for slot in placement.slots}
    assert nodes == {0: "big", 1: "small", 2: "big"}
    assert {slot.gpu_count for slot in placement.slots} == {4}
    assert all(slot.gpus == () and slot.cpus == () for slot in placement.slots)  # Ray's GPUs


def test_a_cluster_too_small_for_the_pairs_is_one_line():
    with pytest.raises(PlacementError) as refused:
        place_on_nodes(CPU_NODES, 1, SIDES, 3)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("placement.backend=ray: 3 replica pairs need 2 x (1 CPU)")
    assert "the cluster holds 2" in message
    gpu_node = (ClusterNode("g", "10.0.0.3", 32, 4),)
    with pytest.raises(PlacementError, match="holds 0") as refused:
        place_on_nodes(gpu_node, 4, SIDES, None)  # two sides of TP4 need 8 GPUs on one node
    assert "spanning" not in str(refused.value)
    with pytest.raises(PlacementError, match="a side spanning nodes is not built"):
        place_on_nodes(gpu_node * 2, 8, SIDES, None)  # TP8 on nodes of 4 GPUs


def test_each_server_listens_on_its_nodes_address_with_no_gpus_pinned(tmp_path):
    plan = plan_servers(scenario(), "/m", tmp_path, Hardware(0, (0, 1)), nodes=CPU_NODES)
    second = plan.servers["candidate-1"]
    assert second.host == "10.0.0.2" and second.base_url.startswith("http://10.0.0.2:")
    assert second.argv[second.argv.index("--host") + 1] == "10.0.0.2"
    assert second.env["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    assert "CUDA_VISIBLE_DEVICES" not in second.env
    assert second.devices == "Ray node bbbbbbbb (10.0.0.2), pair 1: CPU cores 1"


def test_the_plan_shows_each_pair_on_its_node_without_starting_anything(tmp_path, monkeypatch):
    own_install(monkeypatch, plugin="installed", vllm="0.32.0")
    gpu_nodes = (
        ClusterNode("n1" * 28, "10.0.0.1", 96, 8),
        ClusterNode("n2" * 28, "10.0.0.2", 96, 8),
    )
    monkeypatch.setattr(preflight_module, "cluster_nodes", lambda address: gpu_nodes)
    tp4 = scenario(model={"tensor_parallel_size": 4})
    text = render_plan(preflight(tp4, tmp_path, Hardware.assume_gpus(0)), prompt_count=1)
    assert "2 replica pairs" in text and "sharded over 2 pairs" in text
    assert "candidate-1 (Ray node n2n2n2n2 (10.0.0.2), pair 1: 4 GPU(s) from Ray):" in text
    assert "reference: node n1n1n1n1 (10.0.0.1), 4 GPU(s) from Ray" in text


def test_preflight_refuses_a_small_cluster_and_an_attached_side_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(preflight_module, "cluster_nodes", lambda address: CPU_NODES[:1])
    with pytest.raises(PreflightError, match="2 replica pairs need") as refused:
        preflight(scenario(replicas=2), tmp_path, Hardware.assume_gpus(0))
    assert "\n" not in str(refused.value)
    attached = scenario(reference={"url": "http://10.0.0.9:8000"})
    with pytest.raises(PreflightError, match="reference.url attaches one"):
        preflight(attached, tmp_path, Hardware.assume_gpus(0))


def test_without_ray_installed_the_ray_backend_is_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    with pytest.raises(ClusterUnavailable, match="pip install 'rig\\[ray\\]'"):
        connect("auto")
    with pytest.raises(PreflightError) as refused:
        preflight(scenario(), tmp_path, Hardware.assume_gpus(0))
    assert RAY_MISSING in str(refused.value)


def test_the_watchdog_stops_a_servers_group_once_its_actor_is_gone():
    """What stands in for a server's actor dies without stopping it (the driver crashed): the
    server's whole process group goes within seconds, and so does the watchdog (detached: no
    child of the actor, whose children Ray ends with it)."""
    actor = subprocess.Popen(["sleep", "60"])
    server = subprocess.Popen(["sh", "-c", "sleep 60 & wait"], start_new_session=True)
    watch = [sys.executable, "-c", WATCHDOG, str(actor.pid), str(server.pid)]
    try:
        subprocess.run(watch, check=True, timeout=10)  # returns once the watchdog is detached
        time.sleep(1.5)
        assert server.poll() is None and watchdogs(watch)  # the actor lives: all left alone
        actor.kill()
        actor.wait()
        assert server.wait(timeout=10) == -signal.SIGTERM
        deadline = time.monotonic() + 10
        while watchdogs(watch) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not watchdogs(watch)
    finally:
        for process in (actor, server):
            if process.poll() is None:
                process.kill()
                process.wait()


def watchdogs(argv: list[str]) -> list[Path]:
    """Live processes running exactly `argv`."""
    wanted = "\0".join(argv).encode() + b"\0"
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if cmdline.read_bytes() == wanted and "Z" not in stat_state(cmdline.parent):
                found.append(cmdline.parent)
        except OSError:
            continue
    return found


def stat_state(proc: Path) -> str:
    return (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]


def test_an_address_where_nothing_listens_is_one_line_at_once():
    """ray.init waits on such an address for longer than 10 minutes."""
    closed = free_port()
    started = time.monotonic()
    with pytest.raises(ClusterUnavailable) as refused:
        connect(f"127.0.0.1:{closed}")
    assert str(refused.value) == (
        f"placement.ray_address=127.0.0.1:{closed}: nothing answers (Connection refused)"
    )
    assert time.monotonic() - started < 10


@pytest.mark.parametrize(
    ("code", "alive", "reason"),
    [
        (-9, True, "exit code -9"),  # the actor answers: the server itself died
        (LOST, True, "its Ray actor died"),
        (LOST, False, f"its Ray {CPU_NODES[1].describe()} was lost"),
    ],
)
def test_a_ray_servers_end_names_the_server_its_actor_or_its_node(
    tmp_path, monkeypatch, code, alive, reason
):
    plan = plan_servers(scenario(), "/m", tmp_path, Hardware(0, (0, 1)), nodes=CPU_NODES)
    server = RayServer(plan.servers["reference-1"], node=CPU_NODES[1])
    asked = []
    monkeypatch.setattr(ray_pairs, "node_answers", lambda node_id: asked.append(node_id) or alive)
    assert server.exit_reason(code) == reason
    assert asked == ([] if code != LOST else [CPU_NODES[1].node_id])


def test_the_record_sink_hands_over_each_record_once_in_the_order_sent():
    sink = RecordSink()
    for record in ("a", "b"):
        sink.put(record)
    assert sink.flush() is None
    assert sink.take() == ["a", "b"] and sink.take() == []
