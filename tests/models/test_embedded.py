"""The embedded models by name: every name has a builder, and only those names are embedded."""

import importlib

from rig.models.embedded import EMBEDDED_MODELS, is_embedded
from rig.scenario import config as scenario


def test_every_embedded_model_name_has_a_builder():
    for name, target in EMBEDDED_MODELS.items():
        module, builder = target.split(":")
        assert callable(getattr(importlib.import_module(module), builder)), name
    assert is_embedded("tiny-lm") and not scenario.ModelConfig(name="tiny-lm").is_tiny
    assert not is_embedded("Qwen/Qwen3-Next-80B-A3B-Instruct")
