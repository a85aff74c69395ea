"""`qwen35-control`: a GPU-bound control model at Qwen3.5-397B-A17B's per-layer shapes, on which
the kernel's speed shows end to end and the NS3/NS4 control still holds.

Qwen3.5-397B-A17B's layer, as its model card gives it (Hugging Face, Qwen/Qwen3.5-397B-A17B,
repeated in mlx-community/Qwen3.5-397B-A17B-4bit's card): hidden size 4,096; 15 blocks of three
Gated DeltaNet layers and one full-attention layer, every layer with an MoE feed-forward; GDN
16 query/key heads and 64 value heads of dimension 128; attention 32 query heads, 2 KV heads,
head dimension 256; 512 experts of intermediate size 1,024, 10 routed and one shared per token.

Here: one such block (4 layers), and 16 experts of which 10 route (the same compute per token as
the real model, a 32nd of its expert weights): 1.35 billion parameters, 2.7 GB of BF16, so both
sides fit on one GPU.
At 8K-12K-token prompts a prefill step is then the GPU's work (an MoE layer alone is ~2.8
TFLOP at 10K tokens), not the host's launches, and the GDN prefill is a few percent of it, as
in production.

The control's margins come from tiny_model's construction at these widths (the first GDN layer
in the Newton-Schulz failure regime, the text carried through the GDN layers' codes, the LM head
reading them). The MoE writes nothing (`moe_write: 0`: its down projections are zero): it costs
all of its GPU time and adds no rounding to the residual, so the greedy margins are those of the
construction, not of a random MLP's noise. A random MLP of this size broke them: on one H100
(2026-12-06) the A/A control differed on 10 of 192 pairs at C=64.
"""

from __future__ import annotations

from pathlib import Path

from rig.models.checkpoint import variant_command
from rig.models.tiny_model import default_params, ensure_tiny_model

QWEN35_CONTROL_CACHE_ROOT = Path(".cache/qwen35-control")
QWEN35_CONTROL_PARAMS = {
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 64,
    "linear_head_dim": 128,
    "num_experts": 16,
    "num_experts_per_tok": 10,
    "moe_intermediate_size": 1024,
    "num_hidden_layers": 4,
    "full_attention_interval": 4,
    "max_position_embeddings": 32768,
    "beta": 0.97,  # tiny-qwen35's: ns3's state walk blows up at these widths, ns4's does not
    "moe_write": 0.0,
}


def ensure_qwen35_control_model(cache_root: Path = QWEN35_CONTROL_CACHE_ROOT) -> Path:
    """qwen35-control, built on first use and cached by params hash."""
    return ensure_tiny_model(cache_root, default_params(**QWEN35_CONTROL_PARAMS))


def main(argv: list[str] | None = None) -> None:
    variant_command(
        argv, __doc__.splitlines()[0], QWEN35_CONTROL_CACHE_ROOT, ensure_qwen35_control_model
    )


if __name__ == "__main__":
    main()
