"""Preflight without servers: where the model comes from and how big it is, GPUs against the
placement, free memory against the weights, vLLM's version, ports, and the printed plan."""

import json
import socket

import pytest

import rig.serve.installs as installs_module
from rig.scenario.config import Scenario
from rig.serve.hardware import Hardware
from rig.serve.installs import InstallFacts
from rig.serve.plan_text import render_plan
from rig.serve.preflight import PreflightError, locate_model, model_copies, preflight

GIB = 2**30


def scenario(model=None, **overrides) -> Scenario:
    data = {
        "name": "t",
        "model": model or {"name": "org/some-model"},
        "candidate": {"kernel": "ns4"},
        "workload": {"prompts": [{"long_tokens": [100]}], "concurrency": [1, 4]},
    }
    data.update(overrides)
    return Scenario.model_validate(data)


def gpus(count: int, free_gib: float) -> Hardware:
    return Hardware(
        gpu_count=count,
        cpu_ids=(0, 1),
        gpu_ids=tuple(str(i) for i in range(count)),
        gpu_free_mib=tuple(int(free_gib * 1024) for _ in range(count)),
    )


@pytest.fixture
def local_model(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    return folder


def own_install(monkeypatch, **facts) -> None:
    """The rig's own environment as the probe would find it."""
    found = InstallFacts(**{"python": "/venv/bin/python", "vllm": "0.32.0+cpu", **facts})
    monkeypatch.setattr(installs_module, "own_facts", lambda: found)


@pytest.fixture(autouse=True)
def supported_vllm(monkeypatch):
    own_install(monkeypatch, plugin="installed")


def shards(folder, names, present):
    """A checkpoint's index naming `names`, of which only `present` were downloaded."""
    weight_map = {f"layer.{i}": name for i, name in enumerate(names)}
    index = {"metadata": {"total_size": 1000}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    for name in present:
        (folder / name).write_bytes(b"x")


def test_missing_paths_and_folders_without_config_are_refused(tmp_path):
    with pytest.raises(PreflightError, match="does not exist"):
        locate_model(scenario({"name": "./no/such/model"}))
    (tmp_path / "weights").mkdir()
    with pytest.raises(PreflightError, match="no config.json, so it holds no checkpoint") as caught:
        locate_model(scenario({"name": str(tmp_path / "weights")}))
    assert "\n" not in str(caught.value) and "--local-dir" in str(caught.value)


def test_a_local_folder_missing_shards_is_named_with_a_count_and_an_example(local_model):
    names = [f"model-0000{i}-of-00004.safetensors" for i in range(1, 5)]
    shards(local_model, names, present=names[:1])
    with pytest.raises(PreflightError) as caught:
        locate_model(scenario({"name": str(local_model)}))
    message = str(caught.value)
    assert "\n" not in message
    assert f"model path {local_model} is incomplete: 3 of 4 shards" in message
    assert "(e.g. model-00002-of-00004.safetensors)" in message
    for name in names[1:]:
        (local_model / name).write_bytes(b"x")
    assert locate_model(scenario({"name": str(local_model)})).weights_bytes == 1000


def test_a_partial_download_stops_preflight_in_one_line_before_any_server(local_model, tmp_path):
    shards(local_model, ["a.safetensors", "b.safetensors"], present=["a.safetensors"])
    with pytest.raises(PreflightError) as caught:
        preflight(scenario({"name": str(local_model)}), tmp_path / "run", gpus(1, free_gib=80))
    assert "\n" not in str(caught.value) and "1 of 2 shards" in str(caught.value)


def test_a_hub_id_is_found_in_the_hf_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    snapshot = tmp_path / "models--org--some-model" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (snapshot / "model.safetensors").write_bytes(b"x" * 64)
    found = locate_model(scenario())
    assert (found.path, found.source, found.weights_bytes) == ("org/some-model", "hf-cache", 64)


def test_a_cache_snapshot_whose_blobs_never_arrived_is_incomplete(tmp_path, monkeypatch):
    """The cache links a snapshot's files to blobs; a shard still downloading has no link, a
    link to a blob that is gone points nowhere: both count as missing."""
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    snapshot = tmp_path / "hub" / "models--org--some-model" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    shards(snapshot, ["a.safetensors", "b.safetensors", "c.safetensors"], ["a.safetensors"])
    (snapshot / "b.safetensors").symlink_to(tmp_path / "hub" / "blobs" / "gone")
    with pytest.raises(PreflightError) as caught:
        locate_model(scenario())
    message = str(caught.value)
    assert f"org/some-model: its Hugging Face cache snapshot {snapshot} is incomplete" in message
    assert "2 of 3 shards" in message and "(e.g. b.safetensors)" in message
    assert "hf download org/some-model" in message


@pytest.mark.parametrize("offline", ["1", None])
def test_a_hub_id_not_in_the_cache_is_refused_online_or_offline(tmp_path, monkeypatch, offline):
    """The rig starts no download: a hub id the cache lacks is refused in one line whether or
    not the hub could be reached, instead of two servers fetching it inside their timeout."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    if offline:
        monkeypatch.setenv("HF_HUB_OFFLINE", offline)
    else:
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(PreflightError) as caught:
        locate_model(scenario())
    message = str(caught.value)
    assert "\n" not in message and f"not in the Hugging Face cache ({tmp_path})" in message
    assert "starts no download" in message and "hf download org/some-model" in message
    assert locate_model(scenario(), check_hub=False).source == "unverified"


def test_a_tp2_preset_on_a_machine_without_gpus_names_what_is_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tp2 = scenario({"name": "Qwen/Qwen3.5-397B-A17B-FP8", "tensor_parallel_size": 2})
    with pytest.raises(PreflightError) as caught:
        preflight(tp2, tmp_path / "run", Hardware(gpu_count=0, cpu_ids=(0, 1)))
    message = str(caught.value)
    assert "\n" not in message
    assert "needs 2 GPUs per side" in message and "has none" in message
    assert "not in the Hugging Face cache" in message


def test_assumed_gpus_plan_replica_pairs_or_stop_on_too_few(tmp_path):
    tp2 = scenario({"name": "org/some-model", "tensor_parallel_size": 2})
    eight = preflight(tp2, tmp_path, Hardware.assume_gpus(8))
    assert eight.plan.replicas == 2 and eight.plan.simultaneous
    two = preflight(tp2, tmp_path, Hardware.assume_gpus(2))
    assert two.plan.phases == (("reference",), ("candidate",))
    with pytest.raises(PreflightError, match="needs 2 GPUs per side; 1 available"):
        preflight(tp2, tmp_path, Hardware.assume_gpus(1))


def test_weights_larger_than_free_memory_are_refused(local_model, tmp_path):
    """150 GiB on GPUs with 100 GiB free: TP1 as set is refused, the size that fits named;
    unset, the plan takes TP2 and runs the sides in turn on two GPUs."""
    index = {"metadata": {"total_size": 150 * GIB}}
    (local_model / "model.safetensors.index.json").write_text(json.dumps(index))
    tp1 = scenario({"name": str(local_model), "tensor_parallel_size": 1})
    with pytest.raises(PreflightError, match=r"tensor_parallel_size=1 does not fit .*\(TP2 fits\)"):
        preflight(tp1, tmp_path, gpus(2, free_gib=100))
    sized = preflight(scenario({"name": str(local_model)}), tmp_path, gpus(2, free_gib=100))
    assert sized.scenario.model.tensor_parallel_size == 2
    assert sized.plan.phases == (("reference",), ("candidate",))
    tp2 = scenario({"name": str(local_model), "tensor_parallel_size": 2})
    assert preflight(tp2, tmp_path, gpus(4, free_gib=100)).plan.simultaneous


def test_servers_in_turn_on_the_same_gpus_are_not_counted_as_sharing_them(local_model, tmp_path):
    """60 GiB of weights on one GPU of 80: the sides run in turn there, each with the GPU to
    itself, so the memory check counts one server, not two."""
    index = {"metadata": {"total_size": 60 * GIB}}
    (local_model / "model.safetensors.index.json").write_text(json.dumps(index))
    one = scenario({"name": str(local_model), "tensor_parallel_size": 1})
    checked = preflight(one, tmp_path, gpus(1, free_gib=80))
    assert checked.plan.placement.mode == "sequential"


def test_one_gpu_is_shared_only_when_the_model_fits_twice(local_model, tmp_path):
    (local_model / "model.safetensors").write_bytes(b"x" * 1024)
    small = preflight(scenario({"name": str(local_model)}), tmp_path, gpus(1, free_gib=140))
    assert small.plan.placement.mode == "shared"
    argv = small.plan.servers["reference"].argv
    assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.44"
    assert model_copies(100 * GIB, gpus(1, free_gib=140), tp=1) == 1
    assert model_copies(10 * GIB, gpus(1, free_gib=140), tp=1) == 11
    assert model_copies(None, gpus(1, free_gib=140), tp=1) == 1


def test_an_unsupported_vllm_is_named_with_the_other_problems(tmp_path, monkeypatch):
    own_install(monkeypatch, vllm="0.19.0", plugin="installed")
    with pytest.raises(PreflightError) as caught:
        preflight(scenario({"name": "./missing"}), tmp_path, Hardware(gpu_count=0, cpu_ids=(0,)))
    assert "vLLM 0.19.0 is not supported" in str(caught.value)
    assert "model path ./missing does not exist" in str(caught.value)


def test_a_taken_port_is_found_before_any_server_starts(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        taken = scenario(reference={"port": port})
        with pytest.raises(PreflightError, match=f"port {port} on 127.0.0.1 is already in use"):
            preflight(taken, tmp_path, Hardware(gpu_count=0, cpu_ids=(0, 1)))


def test_flashinfer_backend_without_flashinfer_stops(tmp_path, monkeypatch):
    own_install(monkeypatch, plugin="installed", flashinfer=False)
    wanted = scenario({"name": "org/some-model", "gdn_prefill_backend": "flashinfer"})
    with pytest.raises(PreflightError, match="flashinfer is asked for, but its install"):
        preflight(wanted, tmp_path, Hardware.assume_gpus(2))


def test_the_plan_shows_argv_env_gpus_levels_and_duration(tmp_path):
    tp2 = scenario(
        {"name": "org/some-model", "tensor_parallel_size": 2, "max_num_seqs": 220},
        workload={
            "prompts": [{"long_tokens": [100]}],
            "concurrency": [16, 200],
            "requests_per_level": 200,
        },
    )
    text = render_plan(preflight(tp2, tmp_path, Hardware.assume_gpus(8)), prompt_count=1)
    assert "2 replica pairs" in text and "candidate-1 (GPU 6,7)" in text
    assert "--max-num-seqs 220" in text and "--gdn-prefill-backend triton" in text
    assert "RIG_GDN_KERNEL=ns4" in text
    assert "400 requests per side, sharded over 2 pairs" in text
    assert "expected duration: at least" in text


def test_servers_attached_by_url_need_no_local_model(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    both = scenario(reference={"url": "http://10.0.0.1:8000"}, candidate={"url": "http://x:1"})
    checked = preflight(both, tmp_path, Hardware(gpu_count=0, cpu_ids=(0, 1)))
    assert checked.model.source == "attached"
    assert {p.devices for p in checked.plan.servers.values()} == {"attached"}


def test_a_plan_builds_no_embedded_model_and_says_the_run_will(tmp_path, monkeypatch):
    """--plan on a machine where qwen35-deep (a 10.6 GB build, 18 GB of RAM) was never built:
    the plan answers at once with the folder the run would build it in, and builds nothing."""
    monkeypatch.chdir(tmp_path)  # the embedded models' caches are under ./.cache
    deep = scenario({"name": "qwen35-deep"})
    located = locate_model(deep, build=False)
    assert located.source == "embedded, not built" and located.weights_bytes is None
    assert located.path.startswith(".cache/qwen35-deep/")
    assert "python -m rig.models.qwen35_deep" in located.note
    assert not (tmp_path / ".cache").exists()
    text = render_plan(preflight(deep, tmp_path / "run", gpus(1, 70), build_model=False), 1)
    assert "model: qwen35-deep (embedded, not built)" in text
    assert "the run builds it first" in text
    assert not (tmp_path / ".cache").exists()
