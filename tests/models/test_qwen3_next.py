"""The plain-torch Qwen3-Next forward: its chunked gated delta rule is the token-by-token
recurrence across chunk boundaries, and every GDN layer hands over what the kernel is given."""

import dataclasses

import torch

from kernels.cases import Shape, random_inputs
from kernels.recurrence import gdn_recurrence, l2_normalise
from rig.models import qwen3_next
from rig.models.qwen3_next import ModelShape, hf_config
from rig.models.tiny_lm import TinyLmRecipe, initial_weights

# tiny-lm's shape (hidden 128, vocab 1024) with its untrained initial weights
SHAPE = TinyLmRecipe(corpus_sha256="-", generator_sha256="-", libraries="-")


def test_the_chunked_delta_rule_is_the_recurrence_across_chunks():
    """150 tokens: two whole chunks of 64 and a short one, from a zero state."""
    inputs = random_inputs([150], Shape(heads=2, value_heads=4, head_dim=16), torch.float64, 0)
    inputs = dataclasses.replace(inputs, initial_state=torch.zeros_like(inputs.initial_state))
    q, k = (l2_normalise(t.double(), inputs.eps) for t in (inputs.q, inputs.k))
    q, k = (t.repeat_interleave(2, dim=1) for t in (q * inputs.scale, k))
    chunked = qwen3_next._gated_delta_rule(
        *(t[None].double() for t in (q, k, inputs.v, inputs.beta, inputs.g))
    )[0]
    exact, _ = gdn_recurrence(inputs)
    assert torch.allclose(chunked, exact, rtol=1e-9, atol=1e-9)


def test_forward_hands_over_each_gdn_layers_kernel_inputs():
    assert hf_config(SHAPE)["layer_types"] == list(SHAPE.layer_types)
    weights = initial_weights(SHAPE, torch.Generator().manual_seed(1))
    captured: list[qwen3_next.GdnKernelInputs] = []
    hidden = qwen3_next.forward(weights, SHAPE, torch.tensor([[1, 2, 3, 4, 5]]), captured)
    assert hidden.shape == (1, 5, SHAPE.hidden_size) and torch.isfinite(hidden).all()
    gdn_layers = [i for i, kind in enumerate(SHAPE.layer_types) if kind == "linear_attention"]
    assert [c.layer for c in captured] == gdn_layers
    key_heads, value_heads = SHAPE.linear_num_key_heads, SHAPE.linear_num_value_heads
    for inputs in captured:
        assert inputs.key.shape == (5, key_heads, SHAPE.linear_head_dim)
        assert inputs.value.shape == (5, value_heads, SHAPE.linear_head_dim)
        assert torch.allclose(inputs.key.norm(dim=-1), torch.ones(5, key_heads), atol=1e-5)
        assert (inputs.g <= 0).all() and ((inputs.beta > 0) & (inputs.beta < 1)).all()


def test_layer_types_follow_the_full_attention_interval_as_hugging_face_derives_them():
    from transformers import Qwen3NextConfig

    for layers, interval in ((4, 2), (8, 4), (3, 5)):
        shape = ModelShape(num_hidden_layers=layers, full_attention_interval=interval)
        config = Qwen3NextConfig(num_hidden_layers=layers, full_attention_interval=interval)
        assert list(shape.layer_types) == config.layer_types
        assert hf_config(shape)["layer_types"] == config.layer_types
    assert ModelShape().layer_types == ("linear_attention", "full_attention") * 2
