"""`tiny-gdn`: the tiny model's construction (rig/models/tiny_model.py) at the GDN shape of one
TP2 rank of Qwen3.5-397B, six GDN layers to two attention layers, its 32 value heads sharing the
residual's four code slices: a model whose long-prompt prefill is mostly GDN work, so that a GDN
kernel's speed shows end to end on a GPU (scenarios/gpu-gdn-prefill.yaml). Built on first use or
by `python -m rig.models.tiny_gdn`, cached under .cache/tiny-gdn/<params hash>.
"""

from __future__ import annotations

from pathlib import Path

from rig.models.checkpoint import variant_command
from rig.models.tiny_model import default_params, ensure_tiny_model

TINY_GDN_CACHE_ROOT = Path(".cache/tiny-gdn")
# 8 key heads, 32 value heads, head dim 128, and positions for prompts of 16K tokens and more.
# Its GDN layers add the code instead of flipping its sign: a layer's gain depends a little on
# the code's amplitude, so six flips in a row cancel some tokens' code (features of distinct
# tokens at cosine 0.93), six additions do not.
TINY_GDN_PARAMS = {
    "linear_num_key_heads": 8,
    "linear_num_value_heads": 32,
    "linear_head_dim": 128,
    "num_hidden_layers": 8,
    "full_attention_interval": 4,
    "max_position_embeddings": 32768,
    "gdn_write": 1.0,
}


def ensure_tiny_gdn_model(cache_root: Path = TINY_GDN_CACHE_ROOT) -> Path:
    """tiny-gdn, built on first use and cached by params hash."""
    return ensure_tiny_model(cache_root, default_params(**TINY_GDN_PARAMS))


def main(argv: list[str] | None = None) -> None:
    variant_command(argv, __doc__.splitlines()[0], TINY_GDN_CACHE_ROOT, ensure_tiny_gdn_model)


if __name__ == "__main__":
    main()
