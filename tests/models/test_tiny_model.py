"""The embedded tiny model: reproducible, cached safely, loadable, and built for the NS control;
and tiny-gdn, the same construction with the GDN layers of one TP2 rank of Qwen3.5-397B.

One build of each (~10 s) is shared by the whole module; the determinism tests make a second.
"""

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from rig import PROJECT_ROOT
from rig.models import qwen3_next, tiny_model
from rig.models.checkpoint import load_weights
from rig.models.embedded import is_embedded
from rig.models.qwen3_next import GdnKernelInputs
from rig.models.tiny_model import (
    REGIME_DIM,
    TINY_GDN_PARAMS,
    build_tiny_model,
    default_params,
    ensure_tiny_gdn_model,
    ensure_tiny_model,
    load_params,
)
from rig.scenario.loader import load_scenario
from rig.scenario.long_prompts import build_long_prompt
from rig.scenario.prompts import load_prompts
from rig.scenario.workload import resolve_prompts
from tests.gdn_layers import newton_schulz_errors


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    return ensure_tiny_model(tmp_path_factory.mktemp("tiny-cache"))


@pytest.fixture(scope="module")
def tokenizer(built):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(built / "tokenizer.json"))


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


def _ring_continuation(successor: torch.Tensor, last_token: int, length: int) -> list[int]:
    tokens = [int(successor[last_token])]
    while len(tokens) < length:
        tokens.append(int(successor[tokens[-1]]))
    return tokens


def test_greedy_text_walks_the_successor_ring_with_wide_margins(built, tokenizer):
    params, weights = load_params(built), load_weights(built)
    successor = tiny_model.successor_map(params, tokenizer)
    lm_head = weights["lm_head.weight"].float()
    texts = [p.text for p in load_prompts(tiny_model.PROMPTS_FILE)[:6]]
    texts.append(build_long_prompt(1000, seed=0).text)
    for text in texts:
        ids = tokenizer.encode(text).ids
        continuation = _ring_continuation(successor, ids[-1], 64)
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


# --- tiny-gdn: the same construction, GDN-heavy ----------------------------------------------

GDN_PREFILL_SCENARIO = PROJECT_ROOT / "scenarios" / "gpu-gdn-prefill.yaml"


@pytest.fixture(scope="module")
def gdn_built(tmp_path_factory) -> Path:
    return ensure_tiny_gdn_model(tmp_path_factory.mktemp("tiny-gdn-cache"))


def test_tiny_gdn_is_registered_and_cached_by_its_params(gdn_built):
    assert is_embedded("tiny-gdn")
    params = load_params(gdn_built)
    assert gdn_built.name == params.key() == default_params(**TINY_GDN_PARAMS).key()
    assert params.key() != default_params().key()


def test_tiny_gdn_has_the_gdn_shape_of_one_tp2_rank_of_qwen35_397b(gdn_built):
    config = json.loads((gdn_built / "config.json").read_text())
    assert (config["linear_num_key_heads"], config["linear_num_value_heads"]) == (8, 32)
    assert config["linear_key_head_dim"] == config["linear_value_head_dim"] == 128
    kinds = config["layer_types"]
    assert len(kinds) == config["num_hidden_layers"]
    assert kinds.count("linear_attention") == 6 and kinds.count("full_attention") == 2
    tokenizer_config = json.loads((gdn_built / "tokenizer_config.json").read_text())
    assert tokenizer_config["model_max_length"] == config["max_position_embeddings"] >= 32768
    hidden = config["hidden_size"]
    expected_shapes = {  # q, k: 8 x 128 each; v, z: 32 x 128 each
        "model.layers.0.linear_attn.in_proj_qkvz.weight": (8 * 128 * 2 + 32 * 128 * 2, hidden),
        "model.layers.0.linear_attn.in_proj_ba.weight": (64, hidden),
        "model.layers.0.linear_attn.conv1d.weight": (8 * 128 * 2 + 32 * 128, 1, 4),
        "model.layers.6.linear_attn.out_proj.weight": (hidden, 32 * 128),
        "model.layers.7.self_attn.o_proj.weight": (hidden, 256),
    }
    with safe_open(str(gdn_built / "model.safetensors"), "pt") as weights:
        for name, shape in expected_shapes.items():
            assert tuple(weights.get_slice(name).get_shape()) == shape, name
        names = list(weights.keys())
    gdn_layers = {name.split(".")[2] for name in names if ".linear_attn." in name}
    assert gdn_layers == {"0", "1", "2", "4", "5", "6"}


def test_tiny_gdn_runs_in_the_reference_forward_with_wide_greedy_margins(gdn_built):
    """Every GDN layer gets the kernel shape; greedy text walks the successor ring, as the
    tiny model's does, with margins wide enough that a kernel's rounding never flips a token."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(gdn_built / "tokenizer.json"))
    params, weights = load_params(gdn_built), load_weights(gdn_built)
    ids = tokenizer.encode(load_prompts(tiny_model.PROMPTS_FILE)[0].text).ids
    continuation = _ring_continuation(tiny_model.successor_map(params, tokenizer), ids[-1], 16)
    captured: list[GdnKernelInputs] = []
    tokens = torch.tensor([ids + continuation])
    hidden = qwen3_next.forward(weights, params, tokens, captured)[0]
    assert [c.layer for c in captured] == [0, 1, 2, 4, 5, 6]
    for inputs in captured:
        assert inputs.key.shape == (tokens.shape[1], 8, 128)
        assert inputs.value.shape == (tokens.shape[1], 32, 128)
    logits = hidden[len(ids) - 1 : -1] @ weights["lm_head.weight"].float().T
    top = logits.topk(2, dim=-1)
    assert top.indices[:, 0].tolist() == continuation
    assert (top.values[:, 0] - top.values[:, 1]).min() > 4.0


def test_tiny_gdn_same_params_give_bit_identical_files(gdn_built, tmp_path):
    rebuilt = build_tiny_model(tmp_path / "again", load_params(gdn_built))
    for path in sorted(gdn_built.iterdir()):
        assert path.read_bytes() == (rebuilt / path.name).read_bytes(), path.name


def test_the_gdn_prefill_scenario_sends_4k_8k_16k_token_prompts_that_fit(gdn_built):
    from tokenizers import Tokenizer

    loaded = load_scenario(GDN_PREFILL_SCENARIO)
    assert loaded.model.name == "tiny-gdn" and loaded.candidate.kernel == "ns4"
    assert loaded.reference.kernel is None
    tokenizer = Tokenizer.from_file(str(gdn_built / "tokenizer.json"))
    lengths = [len(tokenizer.encode(p.text).ids) for p in resolve_prompts(loaded.workload)]
    for wanted in (4096, 8192, 16384):
        band = [n for n in lengths if abs(n - wanted) <= 0.05 * wanted]
        assert len(band) >= 6, (wanted, lengths)
    assert len(lengths) == 24
    longest = max(lengths) + loaded.workload.max_tokens
    config = json.loads((gdn_built / "config.json").read_text())
    assert longest <= loaded.model.max_model_len <= config["max_position_embeddings"]
    assert loaded.model.max_num_batched_tokens >= max(lengths)  # one prefill step at C=1


# --- silent layers: a deeper model's GPU time, the shallower one's text -----------------------


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
        if name.endswith(tiny_model.WRITERS):
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
