"""tiny-qwen35: reproducible, registered, at the declared Qwen3-Next widths, and built for the
NS control (every GDN layer in the failure regime, ns3 broken and ns4 not, wide margins).

The model lives in the repository's cache (.cache/tiny-qwen35), shared with the e2e test that
serves it; the determinism test builds it once more (~25-70 s on two cores).
"""

import json
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer

from rig import PROJECT_ROOT
from rig.models import qwen3_next, tiny_model
from rig.models.checkpoint import load_weights
from rig.models.embedded import is_embedded
from rig.models.qwen3_next import GdnKernelInputs
from rig.models.tiny_model import build_tiny_model, default_params, load_params
from rig.models.tiny_qwen35 import TINY_QWEN35_PARAMS, ensure_tiny_qwen35_model
from rig.scenario.loader import load_scenario
from rig.scenario.long_prompts import build_long_prompt
from rig.scenario.prompts import load_prompts
from rig.scenario.workload import resolve_prompts
from tests.gdn_layers import newton_schulz_errors

GPU_LONG_SCENARIO = PROJECT_ROOT / "scenarios" / "gpu-long.yaml"


@pytest.fixture(scope="module")
def built() -> Path:
    return ensure_tiny_qwen35_model()


@pytest.fixture(scope="module")
def config(built) -> dict:
    return json.loads((built / "config.json").read_text())


@pytest.fixture(scope="module")
def tokenizer(built) -> Tokenizer:
    return Tokenizer.from_file(str(built / "tokenizer.json"))


def test_same_params_give_bit_identical_files_on_another_thread_count(built, tmp_path):
    """The cache may hold a model another process built: at these widths float sums come out
    otherwise on another torch thread count, which the construction must not let through."""
    before = torch.get_num_threads()
    torch.set_num_threads(1 if before != 1 else 2)
    try:
        rebuilt = build_tiny_model(tmp_path / "again", load_params(built))
    finally:
        torch.set_num_threads(before)
    names = sorted(p.name for p in built.iterdir())
    assert names == sorted(p.name for p in rebuilt.iterdir())
    for name in names:
        assert (built / name).read_bytes() == (rebuilt / name).read_bytes(), name


def test_registered_and_cached_by_its_params(built):
    assert is_embedded("tiny-qwen35")
    assert built.name == load_params(built).key() == default_params(**TINY_QWEN35_PARAMS).key()


def test_config_has_qwen3_next_gdn_widths_and_the_3_to_1_layer_ratio(built, config):
    assert config["architectures"] == ["Qwen3NextForCausalLM"]
    assert (config["linear_num_key_heads"], config["linear_num_value_heads"]) == (16, 32)
    assert config["linear_key_head_dim"] == config["linear_value_head_dim"] == 128
    assert config["hidden_size"] == 2048
    attention = (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"])
    assert attention == (16, 2, 256)
    kinds = config["layer_types"]
    assert len(kinds) == config["num_hidden_layers"]
    assert kinds.count("linear_attention") == 3 * kinds.count("full_attention") > 0
    assert all(kind == "full_attention" for kind in kinds[3::4])
    tokenizer_config = json.loads((built / "tokenizer_config.json").read_text())
    assert tokenizer_config["model_max_length"] == config["max_position_embeddings"] == 32768
    size = (built / "model.safetensors").stat().st_size
    assert 0.2e9 < size < 1e9, size  # two copies on one GPU, two servers on a CI machine


def test_every_gdn_layer_is_in_the_failure_regime_and_ns3_breaks_where_ns4_holds(built, tokenizer):
    ids = tokenizer.encode(build_long_prompt(600, seed=0).text).ids
    captured: list[GdnKernelInputs] = []
    qwen3_next.forward(load_weights(built), load_params(built), torch.tensor([ids]), captured)
    assert [c.layer for c in captured] == [0, 1, 2]
    for layer in captured:
        assert layer.key.shape == (len(ids), 16, 128) and layer.value.shape == (len(ids), 32, 128)
        chunks = layer.key[: len(ids) // 64 * 64].unflatten(0, (-1, 64)).transpose(1, 2)
        gram = chunks @ chunks.transpose(-1, -2)
        cosine = (gram.sum((-1, -2)) - gram.diagonal(dim1=-2, dim2=-1).sum(-1)) / (64 * 63)
        assert cosine.min() >= 0.999 and cosine.max() < 0.99999, layer.layer
        assert layer.beta.min() >= 0.95 and layer.beta.max() <= 0.99, layer.layer
        assert layer.g.abs().max() < 1e-6, layer.layer
    errors = newton_schulz_errors(captured[0])
    assert errors[4] < 0.05
    assert errors[3] > 1e6


def test_greedy_text_walks_the_successor_ring_with_wide_margins(built, tokenizer):
    params, weights = load_params(built), load_weights(built)
    successor = tiny_model.successor_map(params, tokenizer)
    lm_head = weights["lm_head.weight"].float()
    texts = [p.text for p in load_prompts(tiny_model.PROMPTS_FILE)[:3]]
    texts.append(build_long_prompt(600, seed=1).text)
    ids = [tokenizer.encode(text).ids for text in texts]
    for prompt in ids:
        continuation = [int(successor[prompt[-1]])]
        while len(continuation) < 16:
            continuation.append(int(successor[continuation[-1]]))
        hidden = qwen3_next.forward(weights, params, torch.tensor([prompt + continuation]))[0]
        top = (hidden[len(prompt) - 1 : -1] @ lm_head.T).topk(2, dim=-1)
        assert top.indices[:, 0].tolist() == continuation
        assert (top.values[:, 0] - top.values[:, 1]).min() > 8.0


def test_the_long_scenario_sends_2k_8k_10k_token_prompts_that_fit(built, config, tokenizer):
    loaded = load_scenario(GPU_LONG_SCENARIO)
    assert loaded.model.name == "tiny-qwen35" and loaded.candidate.kernel == "ns4"
    assert loaded.reference.kernel is None
    prompts = resolve_prompts(loaded.workload)
    assert len({p.text for p in prompts}) == len(prompts) == 12
    lengths = [len(tokenizer.encode(p.text).ids) for p in prompts]
    for wanted in (2048, 8192, 10240):
        band = [n for n in lengths if abs(n - wanted) <= 0.05 * wanted]
        assert len(band) >= 4, (wanted, lengths)
    longest = max(lengths) + loaded.workload.max_tokens
    assert longest <= loaded.model.max_model_len <= config["max_position_embeddings"]
    assert loaded.model.max_num_batched_tokens >= max(lengths)  # one prefill step at C=1
    assert loaded.workload.concurrency == [1, 4, 16, 64] and loaded.workload.repeats >= 3
