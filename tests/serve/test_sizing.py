"""Tensor parallelism sized to the GPUs, without servers: the smallest power of two whose share
of the weights and the margin fits each GPU, both sides at once where 2 x TP GPUs exist, a size
the scenario sets kept or refused in one line, and the plan's time counting every start."""

import json

import pytest

import rig.serve.installs as installs_module
from rig import PROJECT_ROOT
from rig.scenario.config import Scenario
from rig.scenario.loader import load_scenario
from rig.serve.hardware import Hardware
from rig.serve.installs import InstallFacts
from rig.serve.placement import ClusterNode, PlacementError
from rig.serve.plan_text import STARTUP_S, expected_duration_s, render_plan, server_starts
from rig.serve.preflight import PreflightError, preflight
from rig.serve.sizing import size_tensor_parallel, tp_choices

GIB = 2**30
LOWCONC = PROJECT_ROOT / "scenarios" / "lowconc.yaml"


@pytest.fixture(autouse=True)
def supported_vllm(monkeypatch):
    found = InstallFacts(python="/venv/bin/python", vllm="0.32.0+cpu", plugin="installed")
    monkeypatch.setattr(installs_module, "own_facts", lambda: found)


def planned(tmp_path, model: str, gpus: int, gib: float | None, *sets: str):
    scenario = load_scenario(LOWCONC, [f"model={model}", *sets])
    return preflight(scenario, tmp_path, Hardware.assume_gpus(gpus, gib))


def test_the_sizes_tried_are_powers_of_two_that_divide_the_gpus():
    assert tp_choices(8) == [1, 2, 4, 8]
    assert tp_choices(6) == [1, 2]
    assert tp_choices(1) == [1] and tp_choices(0) == []


def test_eight_h200s_serve_qwen35_397b_at_tp4_both_sides_at_once(tmp_path):
    """370 GiB: TP2 puts 185 GiB on a 140 GiB GPU; TP4 92 GiB + 28 GiB of margin fits, and 8
    GPUs hold a TP4 server for each side."""
    checked = planned(tmp_path, "Qwen3.5-397B", 8, 140)
    assert checked.scenario.model.tensor_parallel_size == 4
    assert checked.plan.simultaneous and checked.plan.replicas == 1
    text = render_plan(checked, prompt_count=50)
    assert "--tensor-parallel-size 4" in text
    assert "tensor parallel: TP4 per server (sized: the smallest that fits GPUs of 140 GiB" in text
    assert "TP2 would need 213 GiB" in text
    assert "8 GPUs make 2 groups of TP4, one per server: all at once" in text
    assert "machine: 8 GPU(s) of 140 GiB (assumed)" in text


def test_eight_h100s_serve_it_at_tp8_the_sides_in_turn(tmp_path):
    checked = planned(tmp_path, "Qwen3.5-397B", 8, 80)
    assert checked.scenario.model.tensor_parallel_size == 8
    assert checked.plan.phases == (("reference",), ("candidate",))
    text = render_plan(checked, prompt_count=50)
    assert "8 GPUs make 1 group of TP8 for 2 servers" in text
    assert "one side after the other" in text


def test_four_b200_class_gpus_hold_tp2_where_the_weights_fit_them(tmp_path):
    """180 GiB GPUs: Qwen3-Next-80B (149 GiB) at TP2 on each pair, both at once; Qwen3.5-397B
    needs 185 GiB of weights a GPU at TP2, more than 180, so TP4 and the sides in turn."""
    next80 = planned(tmp_path, "Qwen3-Next-80B", 4, 180)
    assert next80.scenario.model.tensor_parallel_size == 2 and next80.plan.simultaneous
    big = planned(tmp_path, "Qwen3.5-397B", 4, 180)
    assert big.scenario.model.tensor_parallel_size == 4
    assert big.plan.phases == (("reference",), ("candidate",))


def test_too_little_memory_is_refused_in_one_line(tmp_path):
    with pytest.raises(PreflightError) as caught:
        planned(tmp_path, "Qwen3.5-397B", 8, 24)
    message = str(caught.value)
    assert "\n" not in message
    assert message == (
        "Qwen/Qwen3.5-397B-A17B-FP8 (preset qwen3.5-397b-fp8): 370 GiB of weights fit no "
        "tensor-parallel size on 8 GPU(s) of 24 GiB: TP8 needs 46 GiB of weights a GPU + the "
        "20% margin (5 GiB) = 51 GiB (--assume-gpus)"
    )


def test_a_size_the_user_sets_wins_and_is_refused_where_it_cannot_fit(tmp_path):
    kept = planned(tmp_path, "Qwen3.5-397B", 8, 80, "model.tensor_parallel_size=8")
    assert kept.tensor_parallel.how == "set" and kept.scenario.model.tensor_parallel_size == 8
    larger = planned(tmp_path, "Qwen3.5-397B", 8, 140, "model.tensor_parallel_size=8")
    assert larger.scenario.model.tensor_parallel_size == 8  # TP4 would do; the user's wins
    with pytest.raises(PreflightError, match=r"tensor_parallel_size=2 does not fit GPUs of 80 GiB: "
                       r"TP2 needs 185 GiB .* = 201 GiB \(TP8 fits\)") as caught:  # fmt: skip
        planned(tmp_path, "Qwen3.5-397B", 8, 80, "model.tensor_parallel_size=2")
    assert "\n" not in str(caught.value)


def test_assumed_gpus_of_unknown_memory_size_nothing(tmp_path):
    """Without --assume-gpu-gib a known checkpoint cannot be sized: say how to give it."""
    with pytest.raises(PreflightError, match="give --assume-gpu-gib G or set model.tensor"):
        planned(tmp_path, "Qwen3.5-397B", 8, None)
    set_tp = planned(tmp_path, "Qwen3.5-397B", 8, None, "model.tensor_parallel_size=4")
    assert "GPU memory: not checked (unknown: --assume-gpu-gib)" in set_tp.notes
    unknown_size = planned(tmp_path, "org/other-model", 8, None)
    assert unknown_size.tensor_parallel.describe() == (
        "TP1 per server (fixed: the checkpoint's size is unknown)"
    )


def test_a_machine_without_gpus_refuses_a_model_larger_than_its_memory(tmp_path):
    scenario = load_scenario(LOWCONC, ["model=Qwen3.5-397B"])
    cpu = Hardware(gpu_count=0, cpu_ids=(0, 1), memory_gib=32)
    with pytest.raises(PreflightError, match="370 GiB of weights need GPUs; this machine has none"):
        preflight(scenario, tmp_path, cpu)


def test_a_local_checkpoint_matching_a_preset_is_named_so_and_sized_by_its_index(tmp_path):
    folder = tmp_path / "x"
    folder.mkdir()
    config = {
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "text_config": {"hidden_size": 4096, "num_hidden_layers": 60, "num_experts": 512},
        "quantization_config": {"quant_method": "fp8"},
    }
    (folder / "config.json").write_text(json.dumps(config))
    index = {"metadata": {"total_size": 400 * GIB}, "weight_map": {}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    checked = planned(tmp_path / "run", str(folder), 8, 140)
    text = render_plan(checked, prompt_count=50)
    assert f"model: {folder} matches preset qwen3.5-397b-fp8 (local, 400.0 GiB)" in text
    assert checked.scenario.model.tensor_parallel_size == 4  # 100 + 28 GiB of 140


def test_the_time_estimate_counts_every_server_start(tmp_path):
    """Sides in turn restart for every repeat (rig/run/phases.py's rounds): six repeats are
    twelve starts; at once, one start runs every repeat."""
    in_turn = planned(tmp_path, "Qwen3.5-397B", 8, 80)
    assert server_starts(in_turn) == 2 * in_turn.scenario.workload.repeats == 12
    once = planned(tmp_path, "Qwen3.5-397B", 8, 80, "workload.repeats=1")
    assert server_starts(once) == 2
    load_once = expected_duration_s(once, 50) - 2 * STARTUP_S["gpu"]
    assert expected_duration_s(in_turn, 50) == pytest.approx(12 * STARTUP_S["gpu"] + 6 * load_once)
    at_once = planned(tmp_path, "Qwen3.5-397B", 8, 140)
    assert server_starts(at_once) == 1
    assert "12 server start(s) of 120 s" in render_plan(in_turn, prompt_count=50)


def test_a_ray_cluster_asks_for_the_size_of_a_known_checkpoint():
    """The driver sees a node's GPU count, not its memory: a checkpoint of known size needs
    the size set; an embedded model, built small, takes TP1."""
    workload = {"prompts": [{"long_tokens": [100]}], "concurrency": [1]}
    ray = {"backend": "ray"}
    node = (ClusterNode("n0", "10.0.0.1", cpus=32, gpus=8),)
    big = Scenario.model_validate(
        {"name": "t", "model": {"name": "org/m"}, "placement": ray, "workload": workload}
    )
    with pytest.raises(PlacementError, match="placement.backend=ray: set model.tensor_para"):
        size_tensor_parallel(big, Hardware.assume_gpus(0), 100 * GIB, node)
    tiny = Scenario.model_validate({"name": "t", "placement": ray, "workload": workload})
    assert size_tensor_parallel(tiny, Hardware.assume_gpus(0), GIB, node).size == 1
