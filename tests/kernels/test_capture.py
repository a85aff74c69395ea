"""Capture files: round trip, per-layer limits, and finding the calling layer's name."""

from dataclasses import fields

import torch

from kernels.capture import (
    UNKNOWN_LAYER,
    CaptureWriter,
    calling_layer_name,
    list_captures,
    load_capture,
)
from kernels.cases import CPU_SHAPE, random_inputs


class FakeLayer:
    prefix = "model.layers.4.linear_attn"


def kernel_call():
    return calling_layer_name()


def vllm_like_caller(layer):
    return kernel_call()


class VllmLikeModule:
    prefix = "model.layers.6.linear_attn"

    def forward(self):
        return kernel_call()


def test_layer_name_from_a_layer_or_self_in_the_callers():
    assert vllm_like_caller(FakeLayer()) == "model.layers.4.linear_attn"
    assert VllmLikeModule().forward() == "model.layers.6.linear_attn"
    assert kernel_call() == UNKNOWN_LAYER


def test_round_trip_and_per_layer_limit(tmp_path):
    inputs = random_inputs([5, 9], CPU_SHAPE, torch.bfloat16, seed=1)
    writer = CaptureWriter(tmp_path / "cap", calls_per_layer=2, kernel="ns4")
    for _ in range(3):
        for layer in ("model.layers.0.linear_attn", "model.layers.2.linear_attn"):
            if writer.wants(layer):
                writer.save(layer, inputs)
    paths = list_captures(tmp_path / "cap")
    assert len(paths) == 4
    capture = load_capture(paths[0])
    assert capture.meta.layer == "model.layers.0.linear_attn"
    assert capture.meta.kernel == "ns4" and capture.meta.call_index == 0
    for field in fields(inputs):
        original, loaded = getattr(inputs, field.name), getattr(capture.inputs, field.name)
        if isinstance(original, torch.Tensor):
            assert torch.equal(original, loaded) and original.dtype == loaded.dtype
        else:
            assert original == loaded
