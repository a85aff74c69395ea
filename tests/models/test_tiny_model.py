"""The embedded tiny model: reproducible, cached safely, loadable, and built for the NS control.

One build (~10 s) is shared by the whole module; the determinism test makes a second.
"""

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from rig.models import qwen3_next, tiny_model
from rig.models.checkpoint import load_weights
from rig.models.qwen3_next import GdnKernelInputs
from rig.models.tiny_model import (
    REGIME_DIM,
    build_tiny_model,
    default_params,
    ensure_tiny_model,
    load_params,
)
from rig.scenario.long_prompts import build_long_prompt
from rig.scenario.prompts import load_prompts
from tests.gdn_layers import newton_schulz_errors
from tests.models.conftest import ring_continuation


def _gdn_inputs(built: Path, token_ids: list[int]) -> list[GdnKernelInputs]:
    captured: list[GdnKernelInputs] = []
    qwen3_next.forward(load_weights(built), load_params(built), torch.tensor([token_ids]), captured)
    return captured


def test_same_params_give_bit_identical_files(built, tmp_path):
    rebuilt = build_tiny_model(tmp_path / "again", load_params(built))
    names = sorted(p.name for p in built.iterdir())
    assert names == sorted(p.name for p in rebuilt.iterdir())
    for name in names:
        assert (built / name).read_bytes() == (rebuilt / name).read_bytes(), name


def test_cache_is_keyed_by_params_and_reused(built, monkeypatch):
    assert built.name == default_params().key()

    def no_rebuild(*args, **kwargs):
        raise AssertionError("a cached model was rebuilt")

    monkeypatch.setattr(tiny_model, "build_tiny_model", no_rebuild)
    assert ensure_tiny_model(built.parent) == built


def test_interrupted_build_leaves_nothing_behind(tmp_path, monkeypatch):
    def interrupted(out_dir: Path, params):
        out_dir.mkdir(parents=True)
        (out_dir / "model.safetensors").write_bytes(b"half a model")
        raise KeyboardInterrupt

    monkeypatch.setattr(tiny_model, "build_tiny_model", interrupted)
    with pytest.raises(KeyboardInterrupt):
        ensure_tiny_model(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_prompt_change_changes_the_cache_key(tmp_path):
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_text(json.dumps({"id": "p", "prompt": "Hello there."}) + "\n")
    second.write_text(json.dumps({"id": "p", "prompt": "Hello there!"}) + "\n")
    assert default_params(first).key() != default_params(second).key()


def test_checkpoint_has_the_layout_vllm_serves(built):
    config = json.loads((built / "config.json").read_text())
    assert config["architectures"] == ["Qwen3NextForCausalLM"]
    assert config["layer_types"] == [
        "linear_attention",
        "full_attention",
        "linear_attention",
        "full_attention",
    ]
    assert config["max_position_embeddings"] >= 12288
    expected_shapes = {
        "model.embed_tokens.weight": (4096, 256),
        "lm_head.weight": (4096, 256),
        "model.layers.0.linear_attn.in_proj_qkvz.weight": (1536, 256),
        "model.layers.0.linear_attn.in_proj_ba.weight": (8, 256),
        "model.layers.0.linear_attn.conv1d.weight": (1024, 1, 4),
        "model.layers.0.linear_attn.out_proj.weight": (256, 512),
        "model.layers.1.self_attn.q_proj.weight": (512, 256),
        "model.layers.1.self_attn.k_proj.weight": (128, 256),
        "model.layers.3.mlp.experts.3.down_proj.weight": (256, 128),
        "model.layers.3.mlp.shared_expert_gate.weight": (1, 256),
    }
    with safe_open(str(built / "model.safetensors"), "pt") as weights:
        names = set(weights.keys())
        for name, shape in expected_shapes.items():
            assert tuple(weights.get_slice(name).get_shape()) == shape, name
        assert all(weights.get_tensor(n).dtype == torch.bfloat16 for n in names)
        writers = [
            n for n in names if n.endswith(("out_proj.weight", "o_proj.weight", "down_proj.weight"))
        ]
        assert len(writers) == 2 + 2 + 4 * 5
        for name in writers:  # nothing may overwrite the constant the GDN layers read
            assert weights.get_tensor(name)[REGIME_DIM].count_nonzero() == 0, name


def test_tokenizer_loads_in_transformers_with_a_qwen_chat_template(built):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(built)
    config = json.loads((built / "config.json").read_text())
    assert len(tokenizer) <= config["vocab_size"]
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") == config["eos_token_id"]
    text = "Grüße, 世界! 🏕️ \t  x"
    assert tokenizer.decode(tokenizer.encode(text)) == text
    messages = [{"role": "user", "content": "Hi"}]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    for thinking in (True, False):
        assert rendered == tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, enable_thinking=thinking
        )


def _mean_pairwise_cosine_per_chunk(key: torch.Tensor, chunk: int = 64) -> torch.Tensor:
    """[chunks, key heads] mean cosine between distinct keys of a chunk (keys are unit)."""
    full = key[: key.shape[0] // chunk * chunk].unflatten(0, (-1, chunk)).transpose(1, 2)
    gram = full @ full.transpose(-1, -2)
    return (gram.sum((-1, -2)) - gram.diagonal(dim1=-2, dim2=-1).sum(-1)) / (chunk * (chunk - 1))


def test_both_gdn_layers_are_in_the_newton_schulz_failure_regime(built, tokenizer):
    ids = tokenizer.encode(build_long_prompt(1000, seed=0).text).ids
    captured = _gdn_inputs(built, ids)
    assert [c.layer for c in captured] == [0, 2]
    for layer in captured:
        cosine = _mean_pairwise_cosine_per_chunk(layer.key)
        assert cosine.numel() >= 8 and cosine.min() >= 0.95, layer.layer
        assert cosine.max() < 0.99999, "keys must be correlated, not identical"
        assert layer.beta.min() >= 0.85 and layer.beta.max() <= 0.95, layer.layer
        assert layer.g.abs().max() < 1e-6, layer.layer


def test_ns3_breaks_and_ns4_holds_on_the_first_gdn_layer(built, tokenizer):
    ids = tokenizer.encode(build_long_prompt(1000, seed=0).text).ids
    first = _gdn_inputs(built, ids)[0]
    errors = newton_schulz_errors(first)
    assert errors[4] < 0.05
    assert errors[3] > 100


def test_greedy_text_walks_the_successor_ring_with_wide_margins(built, tokenizer):
    params, weights = load_params(built), load_weights(built)
    successor = tiny_model.successor_map(params, tokenizer)
    lm_head = weights["lm_head.weight"].float()
    texts = [p.text for p in load_prompts(tiny_model.PROMPTS_FILE)[:6]]
    texts.append(build_long_prompt(1000, seed=0).text)
    for text in texts:
        ids = tokenizer.encode(text).ids
        continuation = ring_continuation(successor, ids[-1], 64)
        hidden = qwen3_next.forward(weights, params, torch.tensor([ids + continuation]))[0]
        logits = hidden[len(ids) - 1 : -1] @ lm_head.T
        top = logits.topk(2, dim=-1)
        assert top.indices[:, 0].tolist() == continuation
        assert (top.values[:, 0] - top.values[:, 1]).min() > 4.0
        decoded = tokenizer.decode(continuation)
        assert "\ufffd" not in decoded and decoded.strip()
        assert len(set(continuation)) == len(continuation)


def test_the_next_token_is_decided_by_the_gdn_layers(built, tokenizer, monkeypatch):
    params, weights = load_params(built), load_weights(built)
    successor = tiny_model.successor_map(params, tokenizer)
    ids = tokenizer.encode(load_prompts(tiny_model.PROMPTS_FILE)[0].text).ids
    batch = torch.tensor([ids])
    lm_head = weights["lm_head.weight"].float()
    intact = (qwen3_next.forward(weights, params, batch)[0] @ lm_head.T).argmax(-1)
    assert intact.tolist() == successor[ids].tolist()

    exact = qwen3_next._gated_delta_rule
    calls = []

    def second_layer_silenced(q, k, v, beta, g):
        calls.append(None)
        out = exact(q, k, v, beta, g)
        return out if len(calls) == 1 else torch.zeros_like(out)

    monkeypatch.setattr(qwen3_next, "_gated_delta_rule", second_layer_silenced)
    broken = (qwen3_next.forward(weights, params, batch)[0] @ lm_head.T).argmax(-1)
    assert (broken != intact).float().mean() > 0.9
