"""tiny-gdn: the tiny model's construction with the GDN layers of one TP2 rank of Qwen3.5-397B
(rig/models/tiny_gdn.py). One build (~10 s) is shared by the module; the determinism test makes
a second."""

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
from rig.models.tiny_gdn import TINY_GDN_PARAMS, ensure_tiny_gdn_model
from rig.models.tiny_model import build_tiny_model, default_params, load_params
from rig.scenario.loader import load_scenario
from rig.scenario.prompts import load_prompts
from rig.scenario.workload import resolve_prompts
from tests.models.conftest import ring_continuation

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
    continuation = ring_continuation(tiny_model.successor_map(params, tokenizer), ids[-1], 16)
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
