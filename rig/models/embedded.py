"""The embedded models by name: what `model.name: tiny | tiny-lm | tiny-gdn | tiny-qwen35 |
qwen35-control | qwen35-deep` means, and the one place that builds them (on first use, cached by
their params' hash). The builders are imported only when one is needed: they pull in torch and
tokenizers."""

from __future__ import annotations

import importlib
from pathlib import Path

EMBEDDED_MODELS: dict[str, str] = {  # name -> "module:builder"
    "tiny": "rig.models.tiny_model:ensure_tiny_model",
    "tiny-lm": "rig.models.tiny_lm:ensure_tiny_lm",
    "tiny-gdn": "rig.models.tiny_gdn:ensure_tiny_gdn_model",
    "tiny-qwen35": "rig.models.tiny_qwen35:ensure_tiny_qwen35_model",
    "qwen35-control": "rig.models.qwen35_control:ensure_qwen35_control_model",
    "qwen35-deep": "rig.models.qwen35_deep:ensure_qwen35_deep_model",
}


def is_embedded(name: str) -> bool:
    """A model the rig builds itself, not a path or hub id."""
    return name in EMBEDDED_MODELS


def ensure_embedded_model(name: str) -> Path:
    """The folder of embedded model `name` (a key of EMBEDDED_MODELS), built on first use."""
    module, builder = EMBEDDED_MODELS[name].split(":")
    return getattr(importlib.import_module(module), builder)()
