"""The trained embedded model: reproducible, cached by its recipe, laid out as vLLM serves it,
and its planted GDN layer in the Newton-Schulz failure regime.

A few training steps stand in for the full recipe here (the layout, the regime and the
determinism do not depend on the step count); tests/e2e/test_lm_control.py serves the real one.
"""

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from tokenizers import Tokenizer

from rig.models import tiny_lm
from rig.models.checkpoint import load_weights
from rig.models.qwen3_next import GdnKernelInputs
from tests.gdn_layers import newton_schulz_errors

SHORT = {"steps": 3}


@pytest.fixture(scope="module")
def recipe() -> tiny_lm.TinyLmRecipe:
    return tiny_lm.default_recipe().model_copy(update=SHORT)


@pytest.fixture(scope="module")
def built(tmp_path_factory, recipe) -> Path:
    return tiny_lm.build_tiny_lm(tmp_path_factory.mktemp("lm") / recipe.key(), recipe)


def _planted_layer_inputs(built: Path, text: str) -> GdnKernelInputs:
    tokenizer = Tokenizer.from_file(str(built / "tokenizer.json"))
    ids = tokenizer.encode(text).ids
    captured: list[GdnKernelInputs] = []
    weights = load_weights(built)
    tiny_lm.forward(weights, tiny_lm.load_recipe(built), torch.tensor([ids]), captured)
    return next(c for c in captured if c.layer == tiny_lm.REGIME_LAYER)


def _corpus_text(paragraphs: int = 12) -> str:
    return "\n\n".join(tiny_lm.corpus_paragraphs()[:paragraphs])


def test_same_recipe_gives_bit_identical_files(built, recipe, tmp_path):
    rebuilt = tiny_lm.build_tiny_lm(tmp_path / "again", recipe)
    names = sorted(p.name for p in built.iterdir())
    assert names == sorted(p.name for p in rebuilt.iterdir())
    for name in names:
        assert (built / name).read_bytes() == (rebuilt / name).read_bytes(), name


def test_cache_is_keyed_by_the_recipe_and_reused(tmp_path, monkeypatch, recipe):
    monkeypatch.setattr(tiny_lm, "default_recipe", lambda: recipe)
    first = tiny_lm.ensure_tiny_lm(tmp_path)
    assert first.name == recipe.key()
    assert tiny_lm.load_recipe(first) == recipe

    def no_rebuild(*args, **kwargs):
        raise AssertionError("a cached model was trained again")

    monkeypatch.setattr(tiny_lm, "build_tiny_lm", no_rebuild)
    assert tiny_lm.ensure_tiny_lm(tmp_path) == first
    assert recipe.model_copy(update={"steps": 4}).key() != recipe.key()


def test_the_recipe_hashes_the_corpus_sources_and_libraries():
    recipe = tiny_lm.default_recipe()
    assert len(recipe.corpus_sha256) == len(recipe.generator_sha256) == 64
    assert torch.__version__ in recipe.libraries
    assert recipe.threads >= 1 and recipe.seed == 0


def test_checkpoint_is_a_bf16_qwen3_next_with_gdn_attention_and_moe(built):
    config = json.loads((built / "config.json").read_text())
    assert config["architectures"] == ["Qwen3NextForCausalLM"]
    assert "linear_attention" in config["layer_types"]
    assert "full_attention" in config["layer_types"]
    assert config["num_experts"] >= 2 and config["mlp_only_layers"] == []
    assert config["linear_key_head_dim"] in (64, 128)
    assert config["linear_value_head_dim"] in (64, 128)
    with safe_open(str(built / "model.safetensors"), "pt") as weights:
        names = weights.keys()
        assert names and all(weights.get_tensor(n).dtype == torch.bfloat16 for n in names)


def test_chat_turns_are_in_the_training_format(built):
    tokenizer = Tokenizer.from_file(str(built / "tokenizer.json"))
    stream = tiny_lm.training_stream(tokenizer, tiny_lm.corpus_paragraphs()[:4])
    text = tokenizer.decode(stream.tolist(), skip_special_tokens=False)
    assert text.startswith("<|im_start|>user\n")
    assert text.count("<|im_start|>assistant\n") == 2


def _mean_pairwise_cosine_per_chunk(key: torch.Tensor, chunk: int = 64) -> torch.Tensor:
    full = key[: key.shape[0] // chunk * chunk].unflatten(0, (-1, chunk)).transpose(1, 2)
    gram = full @ full.transpose(-1, -2)
    return (gram.sum((-1, -2)) - gram.diagonal(dim1=-2, dim2=-1).sum(-1)) / (chunk * (chunk - 1))


def test_the_planted_layer_is_in_the_failure_regime_after_training(built):
    layer = _planted_layer_inputs(built, _corpus_text())
    cosine = _mean_pairwise_cosine_per_chunk(layer.key)
    assert cosine.numel() >= 4
    assert cosine.min() >= 0.95 and cosine.max() < 0.99999
    assert layer.beta.min() >= 0.8 and layer.beta.max() <= 0.96
    assert layer.g.abs().max() < 1e-6


def test_ns3_breaks_and_ns4_holds_on_the_planted_layer(built):
    layer = _planted_layer_inputs(built, _corpus_text())
    errors = newton_schulz_errors(layer)
    assert errors[4] < 0.05
    assert errors[3] > 10
