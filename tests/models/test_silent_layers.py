"""Silent layers (rig/models/silent_layers.py): a deeper model's GPU time, the shallower one's
text, checked on the tiny model with two more blocks that compute and write nothing."""

import json
from pathlib import Path

import pytest
import torch

from rig.models import qwen3_next, tiny_model
from rig.models.checkpoint import load_weights
from rig.models.qwen3_next import GdnKernelInputs
from rig.models.silent_layers import WRITERS
from rig.models.tiny_model import default_params, ensure_tiny_model, load_params
from rig.scenario.prompts import load_prompts


@pytest.fixture(scope="module")
def deep_built(tmp_path_factory, built) -> Path:
    """The tiny model with two more blocks (four layers) that compute and write nothing."""
    shallow = load_params(built)
    deep = default_params(num_hidden_layers=shallow.num_hidden_layers + 4, silent_layers=4)
    return ensure_tiny_model(tmp_path_factory.mktemp("tiny-deep"), deep)


def test_silent_layers_leave_every_writing_weight_as_it_was(built, deep_built):
    shallow, deep = load_weights(built), load_weights(deep_built)
    params = load_params(deep_built)
    assert params.writing().num_hidden_layers == load_params(built).num_hidden_layers
    for name, tensor in shallow.items():
        assert torch.equal(deep[name], tensor), name
    first_silent = params.num_hidden_layers - params.silent_layers
    silent = [n for n in deep if n not in shallow]
    assert {int(n.split(".")[2]) for n in silent} == set(range(first_silent, 8))
    for name in silent:
        index = int(name.split(".")[2])
        source = name.replace(f"layers.{index}.", f"layers.{index % 2}.", 1)
        if name.endswith(WRITERS):
            assert not deep[name].any(), name
        else:
            assert torch.equal(deep[name], shallow[source]), name
    config = json.loads((deep_built / "config.json").read_text())
    assert config["num_hidden_layers"] == 8
    assert config["layer_types"] == list(params.layer_types)


def test_silent_layers_change_no_hidden_state(built, deep_built, tokenizer):
    """Every layer runs (the GDN rule included), and the final states are bit-identical."""
    ids = tokenizer.encode(load_prompts(tiny_model.PROMPTS_FILE)[0].text).ids
    batch = torch.tensor([ids])
    shallow = qwen3_next.forward(load_weights(built), load_params(built), batch)
    captured: list[GdnKernelInputs] = []
    deep = qwen3_next.forward(load_weights(deep_built), load_params(deep_built), batch, captured)
    assert torch.equal(deep, shallow)
    assert len(captured) == 4  # two writing GDN layers and two silent ones


def test_silent_layers_must_leave_a_writing_block():
    with pytest.raises(ValueError, match="fewer than one block"):
        default_params(num_hidden_layers=4, silent_layers=3)
