"""A GDN layer's inputs from the tiny models' reference forward, as the kernels take them."""

import math

import torch

from kernels.gdn_inputs import GdnInputs, default_scale
from kernels.ns_torch import chunk_gdn_ns
from kernels.recurrence import gdn_recurrence
from rig.models.qwen3_next import GdnKernelInputs


def as_kernel_inputs(layer: GdnKernelInputs) -> GdnInputs:
    """One sequence from a zero state; q and k are L2-normalised by the kernel, as vLLM asks."""
    value_heads, key_dim = layer.value.shape[1], layer.key.shape[-1]
    return GdnInputs(
        q=layer.query,
        k=layer.key,
        v=layer.value,
        g=layer.g,
        beta=layer.beta,
        initial_state=torch.zeros(1, value_heads, key_dim, layer.value.shape[-1]),
        cu_seqlens=torch.tensor([0, layer.key.shape[0]]),
        use_qk_l2norm=True,
        eps=1e-6,
        scale=default_scale(key_dim),
    )


def newton_schulz_errors(layer: GdnKernelInputs) -> dict[int, float]:
    """Per NS round count (4, 3): the PyTorch nsR's largest output error against the float64
    recurrence, over the recurrence's largest output; infinite where the output is not finite."""
    inputs = as_kernel_inputs(layer)
    exact, _ = gdn_recurrence(inputs)
    scale = exact.abs().max()
    errors = {}
    for rounds in (4, 3):
        out, _ = chunk_gdn_ns(inputs, ns_rounds=rounds)
        finite = bool(torch.isfinite(out).all())
        errors[rounds] = float((out - exact).abs().max() / scale) if finite else math.inf
    return errors
