"""python -m kernels.replay on captured inputs: per-layer metrics, non-finite flags."""

from dataclasses import replace

import torch

from kernels.capture import CaptureWriter
from kernels.cases import CPU_SHAPE, correlated_key_inputs, random_inputs
from kernels.replay import main, replay_directory


def write_captures(directory, inputs_by_layer):
    writer = CaptureWriter(directory, calls_per_layer=4, kernel="vllm-cpu-native")
    for layer, inputs in inputs_by_layer.items():
        writer.save(layer, inputs)


def test_replay_reports_each_layer(tmp_path, capsys):
    write_captures(
        tmp_path,
        {
            "model.layers.0.linear_attn": random_inputs([40, 70], CPU_SHAPE, torch.bfloat16, 1),
            "model.layers.2.linear_attn": correlated_key_inputs(CPU_SHAPE),
        },
    )
    rows = replay_directory(tmp_path, "ns3", "cpu")
    worst = {(r.layer, r.kernel, r.against): r for r in rows}
    assert worst["model.layers.2.linear_attn", "ns3", "recurrence-fp64"].output_max_abs > 0.1
    assert worst["model.layers.0.linear_attn", "ns3", "recurrence-fp64"].output_max_abs < 0.01

    assert main([str(tmp_path), "--candidate", "ns4", "--csv", str(tmp_path / "r.csv")]) == 0
    out = capsys.readouterr().out
    assert "worst per layer" in out and "model.layers.2.linear_attn" in out
    assert (tmp_path / "r.csv").exists()


def test_non_finite_candidate_output_fails(tmp_path, capsys):
    inputs = random_inputs([20], CPU_SHAPE, torch.float32, 2)
    v = inputs.v.clone()
    v[3, 0, 0] = torch.inf
    write_captures(tmp_path, {"model.layers.0.linear_attn": replace(inputs, v=v)})
    assert main([str(tmp_path)]) == 1
    assert "NON-FINITE: ns4" in capsys.readouterr().out


def test_empty_directory_fails(tmp_path):
    assert main([str(tmp_path)]) == 1
