"""What a plan is sized against: an assumed node, the KV cache of CPU servers, the devices a
child is given, and the GPUs nvidia-smi shows through CUDA_VISIBLE_DEVICES."""

from rig.serve import hardware
from rig.serve.hardware import Hardware


def test_an_assumed_node_has_its_gpus_and_their_memory():
    node = Hardware.assume_gpus(4, 80)
    assert node.assumed and node.gpu_count == 4 and node.gpu_ids == ("0", "1", "2", "3")
    assert node.gpu_gib == 80
    assert Hardware.assume_gpus(2).gpu_gib is None  # unknown: nothing sized against it


def test_the_least_free_gpu_sets_the_gib():
    assert Hardware(2, (0,), gpu_free_mib=(2048, 1024)).gpu_gib == 1


def test_a_cpu_servers_kv_cache_is_a_third_of_the_memory_shared_within_1_to_32_gib():
    assert Hardware(0, (0,), memory_gib=60).kv_cache_gib(2) == 10
    assert Hardware(0, (0,), memory_gib=1).kv_cache_gib(4) == 1
    assert Hardware(0, (0,), memory_gib=1000).kv_cache_gib(1) == 32


def test_visible_devices_name_the_ids_this_process_sees():
    node = Hardware(2, (0,), gpu_ids=("GPU-a", "GPU-b"))
    assert node.visible_devices((1, 0)) == "GPU-b,GPU-a"
    assert Hardware(3, (0,)).visible_devices((2,)) == "2"


def test_visible_gpus_honour_cuda_visible_devices(monkeypatch):
    rows = [["0", "GPU-a", "100"], ["1", "GPU-b", "200.0"]]
    monkeypatch.setattr(hardware, "query_gpus", lambda fields: rows)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-b")
    assert hardware.visible_gpus() == (("1",), (200,))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert hardware.visible_gpus() == (("0", "1"), (100, 200))


def test_no_nvidia_smi_is_no_gpu(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert hardware.query_gpus("index") == []
