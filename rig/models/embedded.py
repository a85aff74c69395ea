"""The embedded models by name: what `model.name: tiny | tiny-lm | tiny-gdn | tiny-qwen35 |
qwen35-control | qwen35-deep` means, and the one place that builds them (on first use, cached by
their params' hash). The builders are imported only when one is needed: they pull in torch and
tokenizers."""

from __future__ import annotations

import contextvars
import importlib
from collections.abc import Iterator
from contextlib import contextmanager
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


# Off inside `without_builds()`: `--plan` asks where a model is, and must not spend minutes (or
# 18 GB of RAM, for qwen35-deep) building it.
_BUILDS = contextvars.ContextVar("rig_model_builds", default=True)


@contextmanager
def without_builds() -> Iterator[None]:
    """Inside it, a builder returns the folder its model would be built in, built or not."""
    token = _BUILDS.set(False)
    try:
        yield
    finally:
        _BUILDS.reset(token)


def builds_allowed() -> bool:
    return _BUILDS.get()


def is_built(folder: Path) -> bool:
    """The folder holds a whole model (a build lands in it whole or not at all)."""
    return (folder / "model.safetensors").exists()


def builder_module(name: str) -> str:
    """The module that builds embedded model `name` (`python -m` it to build it alone)."""
    return EMBEDDED_MODELS[name].split(":")[0]


def ensure_embedded_model(name: str, build: bool = True) -> Path:
    """The folder of embedded model `name` (a key of EMBEDDED_MODELS), built on first use; with
    `build` off, the folder it is or would be built in (`is_built` tells which)."""
    module, builder = EMBEDDED_MODELS[name].split(":")
    ensure = getattr(importlib.import_module(module), builder)
    if build:
        return ensure()
    with without_builds():
        return ensure()
