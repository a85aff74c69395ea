"""Silent layers: a deeper model's GPU time with a shallower model's text.

A silent layer copies a writing layer of its kind and zeroes every output projection, the only
weights that write into the residual stream. Its kernels run on the inputs a writing layer sees
(the GDN prefill among them, called once more per layer), and it adds exact zeros, so every
hidden state, logit and greedy token is the shallower model's. tiny_model builds the last
`silent_layers` layers this way (qwen35-deep: rig/models/qwen35_deep.py).
"""

from __future__ import annotations

import torch

# Output projections, the only weights that write into the residual stream
WRITERS = ("linear_attn.out_proj.weight", "self_attn.o_proj.weight", "down_proj.weight")


def silent_layers(
    weights: dict[str, torch.Tensor], indices: range, block: int
) -> dict[str, torch.Tensor]:
    """Layers `indices`, each a copy of layer index mod `block` (the first block's layer of its
    kind) with its WRITERS zero."""
    silent = {}
    for index in indices:
        source = f"model.layers.{index % block}."
        for name, tensor in weights.items():
            if name.startswith(source):
                copied = f"model.layers.{index}.{name.removeprefix(source)}"
                writes = name.endswith(WRITERS)
                silent[copied] = torch.zeros_like(tensor) if writes else tensor.clone()
    return silent
