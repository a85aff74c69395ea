"""`qwen35-deep`: qwen35-control with three more blocks that compute in full and write nothing,
so that a decode step is the GPU's work too, as in a 60-layer production model.

On qwen35-control (one 3:1 block) the GPU was busy 19-46 % of each timed block of
scenarios/gpu-matrix.yaml at C=16 (one H100, 2026-12-07): with short chat prompts and 64 tokens
out, most steps are decode steps whose CUDA graph replay is shorter than the host's scheduling
and sampling around it, and the block-to-block spread was the host's (4-21 %). Here 16 layers
run a step (12 GDN layers, 4 attention, 16 MoE), four times qwen35-control's GPU work, while the
host's work per step stays; the 12 silent layers (tiny_model's `silent_layers`) copy the first
block with every output projection zero, so the served text is qwen35-control's bit for bit
(the reference forward's final states are identical) and ns3 is caught by the writing block as
before. 5.3 billion parameters, a 10.6 GB checkpoint: both sides still fit one H100. Whether the GPU
sets the pace on it has not been measured yet.
"""

from __future__ import annotations

from pathlib import Path

from rig.models.checkpoint import variant_command
from rig.models.qwen35_control import QWEN35_CONTROL_PARAMS
from rig.models.tiny_model import default_params, ensure_tiny_model

QWEN35_DEEP_CACHE_ROOT = Path(".cache/qwen35-deep")
QWEN35_DEEP_PARAMS = {**QWEN35_CONTROL_PARAMS, "num_hidden_layers": 16, "silent_layers": 12}


def ensure_qwen35_deep_model(cache_root: Path = QWEN35_DEEP_CACHE_ROOT) -> Path:
    """qwen35-deep, built on first use and cached by params hash."""
    return ensure_tiny_model(cache_root, default_params(**QWEN35_DEEP_PARAMS))


def main(argv: list[str] | None = None) -> None:
    variant_command(argv, __doc__.splitlines()[0], QWEN35_DEEP_CACHE_ROOT, ensure_qwen35_deep_model)


if __name__ == "__main__":
    main()
