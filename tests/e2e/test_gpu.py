"""The control on real GPUs with vLLM's CUDA build (run on the device machine: `pytest -m gpu
tests/e2e`): A/A, ns4 and ns3 on two GPUs with both sides at once and on one GPU shared by both
sides, a GPU capture replayed through the kernels, tensor parallelism 2 with the sides one after
the other, and two replica pairs sharing two GPUs. FLA (`--gdn-prefill-backend triton`) is the
reference by construction, so every run's manifest must say `vllm-triton` for the reference."""

from __future__ import annotations

import csv
import subprocess
import sys

import pytest

from rig.records import ServerDelta
from rig.run.state import SERVER_COUNTERS_FILE, read_jsonl
from rig.serve.hardware import visible_gpus

from .conftest import EQUIVALENT_WORDS, REPO, RigRun, rig_processes

pytestmark = pytest.mark.gpu


def needs_gpus(count: int) -> tuple[str, ...]:
    found, _ = visible_gpus()
    if len(found) < count:
        pytest.skip(f"needs {count} GPUs, {len(found)} visible")
    return found


def passed(run: RigRun) -> str:
    return run.stdout[-3000:] + run.stderr[-3000:]


def kernel_of(run: RigRun, side: str) -> dict:
    return run.manifest()["kernels"][side]


def servers_of(run: RigRun) -> dict:
    return run.manifest()["servers"]


def assert_fla_reference(run: RigRun) -> None:
    reference = kernel_of(run, "reference")
    assert reference["kernel"] == "vllm-triton", reference
    assert reference["calls"] > 0
    gates = {g["name"]: g for g in run.manifest()["verdict"]["gates"]}
    assert gates["reference backend"]["passed"], gates["reference backend"]


# --- two GPUs, both sides at once -------------------------------------------------------------


@pytest.fixture(scope="module")
def two_gpus_ns4(run_rig) -> RigRun:
    needs_gpus(2)
    return run_rig(name="gpu2-ns4")


@pytest.fixture(scope="module")
def two_gpus_aa(two_gpus_ns4, run_rig) -> RigRun:
    return run_rig("--set", "candidate.kernel=null", name="gpu2-aa")


@pytest.fixture(scope="module")
def two_gpus_ns3(two_gpus_ns4, run_rig) -> RigRun:
    return run_rig("--set", "candidate.kernel=ns3", name="gpu2-ns3")


def test_two_gpus_ns4_runs_both_sides_at_once_against_fla(two_gpus_ns4):
    run = two_gpus_ns4
    assert run.returncode == 0, passed(run)
    verdict = run.manifest()["verdict"]
    assert verdict["word"] in EQUIVALENT_WORDS
    assert verdict["counts"]["substantive"] == 0
    assert run.manifest()["placement"]["mode"] == "simultaneous"
    devices = {
        servers_of(run)[s]["env"]["CUDA_VISIBLE_DEVICES"] for s in ("reference", "candidate")
    }
    assert len(devices) == 2
    assert_fla_reference(run)
    assert kernel_of(run, "candidate")["kernel"] == "ns4"
    assert "Using Triton/FLA GDN prefill kernel" in run.read("server-reference.log")


def test_two_gpus_reference_against_itself_is_identical(two_gpus_aa):
    run = two_gpus_aa
    assert run.returncode == 0, passed(run)
    assert run.manifest()["verdict"]["word"] == "identical"
    assert kernel_of(run, "candidate")["kernel"] == "vllm-triton"
    assert_fla_reference(run)


def test_two_gpus_ns3_is_not_equivalent(two_gpus_ns3):
    run = two_gpus_ns3
    assert run.returncode == 1, passed(run)
    verdict = run.manifest()["verdict"]
    assert verdict["word"] == "NOT equivalent"
    assert verdict["counts"]["substantive"] > 0
    assert kernel_of(run, "candidate")["kernel"] == "ns3"
    assert_fla_reference(run)
    assert rig_processes() == []


# --- one GPU shared by both sides, and a capture replayed --------------------------------------


@pytest.fixture(scope="module")
def one_gpu(tmp_path_factory) -> dict[str, str]:
    return {"CUDA_VISIBLE_DEVICES": needs_gpus(1)[0]}


@pytest.fixture(scope="module")
def capture_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("capture")


@pytest.fixture(scope="module")
def one_gpu_ns4(run_rig, one_gpu, capture_dir) -> RigRun:
    capture = f"candidate.env.RIG_GDN_CAPTURE={capture_dir}"
    return run_rig("--set", capture, name="gpu1-ns4", env=one_gpu)


@pytest.fixture(scope="module")
def one_gpu_aa(one_gpu_ns4, run_rig, one_gpu) -> RigRun:
    return run_rig("--set", "candidate.kernel=null", name="gpu1-aa", env=one_gpu)


@pytest.fixture(scope="module")
def one_gpu_ns3(one_gpu_ns4, run_rig, one_gpu) -> RigRun:
    return run_rig("--set", "candidate.kernel=ns3", name="gpu1-ns3", env=one_gpu)


def test_one_gpu_is_shared_by_both_sides_and_ns4_passes(one_gpu_ns4):
    run = one_gpu_ns4
    assert run.returncode == 0, passed(run)
    placement = run.manifest()["placement"]
    assert placement["mode"] == "shared" and placement["phases"] == [["reference", "candidate"]]
    for side in ("reference", "candidate"):
        argv = servers_of(run)[side]["argv"]
        assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.44"
    assert_fla_reference(run)
    assert kernel_of(run, "candidate")["kernel"] == "ns4"


def test_one_gpu_aa_identical_and_ns3_not_equivalent(one_gpu_aa, one_gpu_ns3):
    assert one_gpu_aa.returncode == 0, passed(one_gpu_aa)
    assert one_gpu_aa.manifest()["verdict"]["word"] == "identical"
    assert one_gpu_ns3.returncode == 1, passed(one_gpu_ns3)
    assert one_gpu_ns3.manifest()["verdict"]["word"] == "NOT equivalent"
    assert_fla_reference(one_gpu_ns3)


def test_a_gpu_capture_replays_through_the_kernels(one_gpu_ns4, capture_dir, tmp_path):
    captures = sorted(capture_dir.glob("*.safetensors"))
    assert captures, "the candidate server captured no GDN prefill call"
    table = tmp_path / "replay.csv"
    replay = subprocess.run(
        [sys.executable, "-m", "kernels.replay", str(capture_dir), "--device", "cuda"]
        + ["--csv", str(table)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert replay.returncode == 0, replay.stdout[-2000:] + replay.stderr[-2000:]
    with open(table, encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert {row["kernel"] for row in rows} >= {"ns4"}
    assert all(row["finite"] == "True" for row in rows if row["kernel"] == "ns4")
    worst = max(float(r["output_head_rel_l2"]) for r in rows if r["kernel"] == "ns4")
    assert worst < 0.05


# --- tensor parallelism 2, and replica pairs ---------------------------------------------------


def test_tp2_sides_one_after_the_other_prove_the_kernel_on_every_rank(run_rig):
    needs_gpus(2)
    run = run_rig(
        "--no-cache",
        "--set",
        "model.tensor_parallel_size=2",
        "--set",
        "placement.share_gpus=false",
        name="gpu2-tp2",
    )
    assert run.returncode == 0, passed(run)
    manifest = run.manifest()
    assert manifest["placement"]["mode"] == "sequential"
    assert manifest["placement"]["phases"] == [["reference"], ["candidate"]]
    assert_fla_reference(run)
    for side in ("reference", "candidate"):
        pids = kernel_of(run, side)["detail"].split("pids [", 1)[1].split("]", 1)[0]
        assert len(pids.split(",")) == 2, kernel_of(run, side)  # one worker per rank


def test_two_replica_pairs_share_two_gpus_and_shard_the_requests(run_rig):
    needs_gpus(2)
    run = run_rig("--no-cache", "--set", "placement.replicas=2", name="gpu2-replicas")
    assert run.returncode == 0, passed(run)
    manifest = run.manifest()
    assert manifest["placement"]["replicas"] == 2
    assert set(manifest["servers"]) == {"reference", "candidate", "reference-1", "candidate-1"}
    with open(run.run_dir / "requests.csv", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    replica_of = {}
    for row in rows:
        replica_of.setdefault(row["request_id"], set()).add(row["replica"])
    assert all(len(replicas) == 1 for replicas in replica_of.values())
    assert {r for replicas in replica_of.values() for r in replicas} == {"0", "1"}
    deltas = read_jsonl(run.run_dir / SERVER_COUNTERS_FILE, ServerDelta)
    assert {d.server for d in deltas} == {"reference", "candidate", "reference-1", "candidate-1"}
    assert all(d.hits == 0 for d in deltas)
    assert manifest["verdict"]["counts"]["prefix_cache_hits"] == 0
    assert_fla_reference(run)
