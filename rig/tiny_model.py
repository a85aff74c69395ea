"""The embedded tiny GDN model: a Qwen3-Next checkpoint generated locally, nothing downloaded.

`make e2e` without a GPU serves this model on vLLM's CPU build and runs the rig's control
experiment: reference vs reference and reference vs candidate `ns4` must agree, reference vs `ns3`
(a chunked GDN prefill whose BF16 Newton-Schulz block inverse stops one round short) must not.
A trained toy model cannot carry that control: its greedy text is full of near-ties that benign
rounding flips, and the text barely depends on the GDN layers. So the weights are constructed,
not trained, to make three properties hold by design:

- Failure regime. One residual dimension holds a constant that no layer writes to. Every GDN
  layer reads its keys, queries, beta and z gate from that dimension only (plus a small
  token-dependent spread on the keys), so after the kernel's L2 norm the keys of a chunk are
  highly correlated (mean cosine ~0.999, not 1), beta is ~0.9 and the decay g is ~0
  (A_log = -30): the inputs on which three BF16 Newton-Schulz rounds blow up.
- Text through the GDN layers. Each token's embedding is a random code. Both GDN layers carry the
  code through their values (as +/- SiLU pairs, which sum back to a linear map) and write it
  back with weight -2, so the residual stream holds -code after the first GDN layer and +code
  after the second. The LM head predicts a fixed successor of the current token from +code, so
  a corrupted GDN output in either layer changes the next token outright.
- Wide margins. The successor function walks a ring through every printable token, so greedy
  text never loops, never ends early and never contains U+FFFD, and the LM head reads
  near-orthogonal codes: the top-1/top-2 logit margin is 7-12 nats at every generated token.

Attention and MoE layers are small random perturbations: they run (vLLM needs them) without
deciding the text. The tokenizer is a byte-level BPE trained on the prompts the scenarios send,
so a prompt change rebuilds the model (the corpus hash is one of the parameters).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import tokenizers
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from rig.prompts import build_long_prompt, load_prompts

REPO_ROOT = Path(__file__).resolve().parents[1]
PROMPTS_FILE = REPO_ROOT / "prompts" / "prompts.jsonl"
DEFAULT_CACHE_ROOT = Path(".cache/tiny-model")
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
LAYER_TYPES = ("linear_attention", "full_attention", "linear_attention", "full_attention")
PARAMS_FILE = "tiny_model_params.json"
REGIME_DIM = 0  # the residual dimension that holds the constant the GDN layers read

# Qwen-style chat markup. `enable_thinking` is accepted and ignored: the model has no thinking
# mode, and clients that always send the flag must get the same prompt either way.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


class ModelShape(BaseModel):
    """The Qwen3-Next architecture numbers of an embedded model: what config.json and the
    reference forward read. Defaults are the constructed tiny model's."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    vocab_size: int = 4096
    hidden_size: int = 256
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64
    linear_num_key_heads: int = 2
    linear_num_value_heads: int = 4
    linear_head_dim: int = 128
    num_experts: int = 4
    num_experts_per_tok: int = 2
    moe_intermediate_size: int = 128
    max_position_embeddings: int = 16384

    def key(self) -> str:
        """Cache key: a hash of every field."""
        blob = json.dumps(self.model_dump(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


class TinyModelParams(ModelShape):
    """Every input of the generator; equal params give bit-identical files.

    The generator's own source and library versions are inputs too, so a code change or an
    upgrade never serves a stale cached model (a rebuild takes about a second).
    """

    corpus_sha256: str
    generator_sha256: str
    libraries: str
    seed: int = 0
    beta: float = 0.9  # GDN write strength of every token
    a_log: float = -30.0  # g = -exp(a_log) * softplus(dt_bias) ~ -6e-14: no decay
    key_spread: float = 0.02  # token-dependent part of the keys; more leaks into long prompts
    value_gain: float = 1.0  # code -> GDN value pre-activation
    gate_z: float = 4.0  # z pre-activation, read from the regime dimension
    gdn_write: float = -2.0  # GDN output = gdn_write * input code: flips the residual's sign
    side_scale: float = 0.05  # output scale of attention and MoE relative to the residual
    logit_scale: float = 20.0  # logit of the predicted token; margins are ~half of it


def corpus_texts(prompts_file: Path = PROMPTS_FILE) -> list[str]:
    """What the scenarios send: every prompt of the prompt file and the generated long prompts."""
    texts = [prompt.text for prompt in load_prompts(prompts_file)]
    texts += [build_long_prompt(tokens, seed=0).text for tokens in (1000, 4000, 10000)]
    return texts


def corpus_sha256(texts: list[str]) -> str:
    digest = hashlib.sha256()
    for text in texts:
        digest.update(hashlib.sha256(text.encode()).digest())
    return digest.hexdigest()


def default_params(prompts_file: Path = PROMPTS_FILE) -> TinyModelParams:
    return TinyModelParams(
        corpus_sha256=corpus_sha256(corpus_texts(prompts_file)),
        generator_sha256=hashlib.sha256(Path(__file__).read_bytes()).hexdigest(),
        libraries=f"torch {torch.__version__}, tokenizers {tokenizers.__version__}",
    )


# --- tokenizer -----------------------------------------------------------------------------


def train_tokenizer(texts: list[str], vocab_size: int) -> Tokenizer:
    """Byte-level BPE (any UTF-8 input encodes) with Qwen's special tokens first."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer


def write_tokenizer_files(tokenizer: Tokenizer, out_dir: Path) -> None:
    tokenizer.save(str(out_dir / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 16384,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_bos_token": False,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    _write_json(out_dir / "tokenizer_config.json", config)


def printable_token_ids(tokenizer: Tokenizer) -> list[int]:
    """Tokens that decode on their own to printable text: the only ones the model writes."""
    specials = {tokenizer.token_to_id(token) for token in SPECIAL_TOKENS}
    found = []
    for token_id in range(tokenizer.get_vocab_size()):
        text = tokenizer.decode([token_id])
        if token_id in specials or not text or "\ufffd" in text:
            continue
        if all(ch.isprintable() or ch in " \n\t" for ch in text):
            found.append(token_id)
    return found


# --- config and weights --------------------------------------------------------------------


def hf_config(params: ModelShape) -> dict:
    """config.json of a Qwen3NextForCausalLM with every layer MoE (vLLM needs one at least)."""
    return {
        "architectures": ["Qwen3NextForCausalLM"],
        "model_type": "qwen3_next",
        "dtype": "bfloat16",
        "vocab_size": params.vocab_size,
        "hidden_size": params.hidden_size,
        "num_hidden_layers": len(LAYER_TYPES),
        "layer_types": list(LAYER_TYPES),
        "full_attention_interval": 2,
        "num_attention_heads": params.num_attention_heads,
        "num_key_value_heads": params.num_key_value_heads,
        "head_dim": params.head_dim,
        "partial_rotary_factor": 0.25,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.25,
        },
        "max_position_embeddings": params.max_position_embeddings,
        "linear_num_key_heads": params.linear_num_key_heads,
        "linear_num_value_heads": params.linear_num_value_heads,
        "linear_key_head_dim": params.linear_head_dim,
        "linear_value_head_dim": params.linear_head_dim,
        "linear_conv_kernel_dim": 4,
        "num_experts": params.num_experts,
        "num_experts_per_tok": params.num_experts_per_tok,
        "moe_intermediate_size": params.moe_intermediate_size,
        "shared_expert_intermediate_size": params.moe_intermediate_size,
        "intermediate_size": params.moe_intermediate_size,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "bos_token_id": None,
        "eos_token_id": 2,
        "pad_token_id": 0,
    }


def construct_weights(params: TinyModelParams, tokenizer: Tokenizer) -> dict[str, torch.Tensor]:
    """All weights in the Hugging Face Qwen3-Next layout (BF16), LM head included."""
    generator = torch.Generator().manual_seed(params.seed)
    weights = _body_weights(params, generator)
    successor = successor_map(params, tokenizer)
    features = readout_features(params, weights)
    lm_head = torch.zeros(params.vocab_size, params.hidden_size)
    # Final-norm states have norm sqrt(hidden): a clean token's successor gets ~logit_scale.
    rows = params.logit_scale / math.sqrt(params.hidden_size) * features[: len(successor)]
    lm_head.index_add_(0, successor, rows)
    weights["lm_head.weight"] = lm_head
    return {name: tensor.to(torch.bfloat16).contiguous() for name, tensor in weights.items()}


def successor_map(params: TinyModelParams, tokenizer: Tokenizer) -> torch.Tensor:
    """The next token the model predicts after each token of the tokenizer's vocabulary.

    Printable tokens form one ring in a seeded random order; every other token (special,
    partial UTF-8) leads into the ring at a seeded random place.
    """
    generator = torch.Generator().manual_seed(params.seed + 1)
    ring = torch.tensor(printable_token_ids(tokenizer))
    ring = ring[torch.randperm(len(ring), generator=generator)]
    successor = ring[torch.randint(len(ring), (tokenizer.get_vocab_size(),), generator=generator)]
    successor[ring] = torch.roll(ring, -1)
    return successor


def _body_weights(params: TinyModelParams, generator: torch.Generator) -> dict[str, torch.Tensor]:
    hidden = params.hidden_size

    def normal(*shape: int, std: float) -> torch.Tensor:
        return torch.randn(*shape, generator=generator) * std

    def writer(rows: int, cols: int) -> torch.Tensor:
        """A small random map into the residual stream that leaves the regime dimension alone."""
        weight = normal(rows, cols, std=params.side_scale / math.sqrt(cols))
        weight[REGIME_DIM] = 0.0
        return weight

    weights = {
        "model.embed_tokens.weight": token_embeddings(params, generator),
        "model.norm.weight": torch.zeros(hidden),
    }
    for index, layer_type in enumerate(LAYER_TYPES):
        prefix = f"model.layers.{index}"
        weights[f"{prefix}.input_layernorm.weight"] = torch.zeros(hidden)
        weights[f"{prefix}.post_attention_layernorm.weight"] = torch.zeros(hidden)
        if layer_type == "linear_attention":
            weights.update(_gdn_weights(params, generator, f"{prefix}.linear_attn"))
        else:
            q_size = params.num_attention_heads * params.head_dim
            kv_size = params.num_key_value_heads * params.head_dim
            attn = f"{prefix}.self_attn"
            weights[f"{attn}.q_proj.weight"] = normal(2 * q_size, hidden, std=hidden**-0.5)
            weights[f"{attn}.k_proj.weight"] = normal(kv_size, hidden, std=hidden**-0.5)
            weights[f"{attn}.v_proj.weight"] = normal(kv_size, hidden, std=hidden**-0.5)
            weights[f"{attn}.o_proj.weight"] = writer(hidden, q_size)
            weights[f"{attn}.q_norm.weight"] = torch.zeros(params.head_dim)
            weights[f"{attn}.k_norm.weight"] = torch.zeros(params.head_dim)
        mlp = f"{prefix}.mlp"
        inner = params.moe_intermediate_size
        weights[f"{mlp}.gate.weight"] = normal(params.num_experts, hidden, std=hidden**-0.5)
        weights[f"{mlp}.shared_expert_gate.weight"] = normal(1, hidden, std=hidden**-0.5)
        experts = [f"{mlp}.experts.{e}" for e in range(params.num_experts)]
        for expert in [*experts, f"{mlp}.shared_expert"]:
            weights[f"{expert}.gate_proj.weight"] = normal(inner, hidden, std=hidden**-0.5)
            weights[f"{expert}.up_proj.weight"] = normal(inner, hidden, std=hidden**-0.5)
            weights[f"{expert}.down_proj.weight"] = writer(hidden, inner)
    return weights


def code_slices(params: TinyModelParams) -> list[torch.Tensor]:
    """Residual dimensions carried by each GDN value head (64 per head, the regime one excluded)."""
    pairs = params.linear_head_dim // 2
    dims = [d for d in range(params.hidden_size) if d != REGIME_DIM]
    heads = range(params.linear_num_value_heads)
    return [torch.tensor(dims[h * pairs : (h + 1) * pairs]) for h in heads]


def token_embeddings(params: TinyModelParams, generator: torch.Generator) -> torch.Tensor:
    """Random codes, every value head's slice scaled to unit RMS, and the regime constant 1."""
    codes = torch.randn(params.vocab_size, params.hidden_size, generator=generator)
    for dims in code_slices(params):
        codes[:, dims] *= math.sqrt(len(dims)) / codes[:, dims].norm(dim=1, keepdim=True)
    codes[:, REGIME_DIM] = 1.0
    return codes


def _gdn_weights(params: TinyModelParams, generator: torch.Generator, prefix: str) -> dict:
    """A GDN layer in the Newton-Schulz failure regime that writes gdn_write * its input code.

    Inputs arrive RMS-normalised, so the regime dimension reads ~1 and a code slice has unit RMS.
    """
    hidden, head_dim = params.hidden_size, params.linear_head_dim
    k_heads, v_heads = params.linear_num_key_heads, params.linear_num_value_heads
    v_per_k = v_heads // k_heads
    pairs = head_dim // 2
    slices = code_slices(params)
    code_dims = torch.tensor([d for d in range(hidden) if d != REGIME_DIM])

    group_rows = 2 * head_dim + 2 * v_per_k * head_dim
    qkvz = torch.zeros(k_heads * group_rows, hidden)
    ba = torch.zeros(k_heads * 2 * v_per_k, hidden)
    for group in range(k_heads):
        base = group * group_rows
        query = slice(base, base + head_dim)
        key = slice(base + head_dim, base + 2 * head_dim)
        qkvz[query, REGIME_DIM] = 1.0
        qkvz[key, REGIME_DIM] = 1.0
        spread = torch.randn(head_dim, len(code_dims), generator=generator)
        qkvz[key.start : key.stop, code_dims] = (
            params.key_spread * spread / math.sqrt(len(code_dims))
        )
        for local in range(v_per_k):
            head = group * v_per_k + local
            value = base + 2 * head_dim + local * head_dim
            gate = base + 2 * head_dim + v_per_k * head_dim + local * head_dim
            dims = slices[head]
            rows = torch.arange(len(dims))
            qkvz[value + rows, dims] = params.value_gain
            qkvz[value + pairs + rows, dims] = -params.value_gain
            qkvz[gate : gate + head_dim, REGIME_DIM] = params.gate_z
            ba[group * 2 * v_per_k + local, REGIME_DIM] = math.log(params.beta / (1 - params.beta))

    # Scale so that one token's output is gdn_write * its code: the gated RMS norm leaves each
    # head at RMS(silu(+-value_gain * code)) / (value_gain * silu(gate_z)) of the code.
    probe = torch.randn(4096, pairs, generator=generator)
    probe *= math.sqrt(pairs) / probe.norm(dim=1, keepdim=True)
    pair_rms = (
        (F.silu(params.value_gain * probe) ** 2 + F.silu(-params.value_gain * probe) ** 2)
        .mean(dim=1)
        .div(2)
        .sqrt()
        .mean()
    )
    scale = (
        params.gdn_write
        * float(pair_rms)
        / (params.value_gain * float(F.silu(torch.tensor(params.gate_z))))
    )
    out_proj = torch.zeros(hidden, v_heads * head_dim)
    for head, dims in enumerate(slices):
        rows = torch.arange(len(dims))
        out_proj[dims, head * head_dim + rows] = scale
        out_proj[dims, head * head_dim + pairs + rows] = -scale

    conv = torch.zeros(2 * k_heads * head_dim + v_heads * head_dim, 1, 4)
    conv[:, 0, -1] = 1.0  # every channel passes the current token only
    return {
        f"{prefix}.in_proj_qkvz.weight": qkvz,
        f"{prefix}.in_proj_ba.weight": ba,
        f"{prefix}.conv1d.weight": conv,
        f"{prefix}.A_log": torch.full((v_heads,), params.a_log),
        f"{prefix}.dt_bias": torch.zeros(v_heads),
        f"{prefix}.norm.weight": torch.ones(head_dim),
        f"{prefix}.out_proj.weight": out_proj,
    }


# --- reference forward (plain torch, float32) ------------------------------------------------


@dataclass(frozen=True)
class GdnKernelInputs:
    """What one GDN layer hands the chunked prefill kernel for one sequence (the L2 norm of q
    and k, which the kernel does itself, already applied)."""

    layer: int
    query: torch.Tensor  # [tokens, key heads, head dim]
    key: torch.Tensor  # [tokens, key heads, head dim]
    value: torch.Tensor  # [tokens, value heads, head dim]
    beta: torch.Tensor  # [tokens, value heads]
    g: torch.Tensor  # [tokens, value heads], log decay


def forward(
    weights: dict[str, torch.Tensor],
    params: ModelShape,
    token_ids: torch.Tensor,
    captured: list[GdnKernelInputs] | None = None,
) -> torch.Tensor:
    """Final-norm hidden states [batch, tokens, hidden] of token_ids [batch, tokens].

    Mirrors vLLM's Qwen3-Next math (Gemma-style 1+w RMS norms, interleaved GDN projections,
    SiLU short convolution, gated delta rule, gated RMS norm, partial NeoX RoPE, top-k MoE with
    a gated shared expert). It sets the LM head at build time and lets tests and measurements
    see what the GDN kernel is given; served prompt logprobs agree to ~0.05 nats (BF16).
    """
    w = {name: tensor.float() for name, tensor in weights.items()}
    residual = w["model.embed_tokens.weight"][token_ids]
    for index, layer_type in enumerate(LAYER_TYPES):
        prefix = f"model.layers.{index}"
        x = _rms_norm(residual, w[f"{prefix}.input_layernorm.weight"])
        if layer_type == "linear_attention":
            residual = residual + _gdn(w, params, f"{prefix}.linear_attn", x, index, captured)
        else:
            residual = residual + _attention(w, params, f"{prefix}.self_attn", x)
        x = _rms_norm(residual, w[f"{prefix}.post_attention_layernorm.weight"])
        residual = residual + _moe(w, params, f"{prefix}.mlp", x)
    return _rms_norm(residual, w["model.norm.weight"])


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, offset: float = 1.0) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * (offset + weight)


def _gdn(w, params, prefix, x, layer, captured) -> torch.Tensor:
    batch, tokens, _ = x.shape
    k_heads, v_heads, dim = (
        params.linear_num_key_heads,
        params.linear_num_value_heads,
        params.linear_head_dim,
    )
    v_per_k = v_heads // k_heads
    qkvz = (x @ w[f"{prefix}.in_proj_qkvz.weight"].T).view(batch, tokens, k_heads, -1)
    ba = (x @ w[f"{prefix}.in_proj_ba.weight"].T).view(batch, tokens, k_heads, -1)
    q, k, v, z = qkvz.split([dim, dim, v_per_k * dim, v_per_k * dim], dim=-1)
    b, a = ba.split([v_per_k, v_per_k], dim=-1)
    mixed = torch.cat([q.flatten(2), k.flatten(2), v.flatten(2)], dim=-1)
    conv = w[f"{prefix}.conv1d.weight"][:, 0, :]
    padded = F.pad(mixed.transpose(1, 2), (conv.shape[1] - 1, 0))
    mixed = F.silu(F.conv1d(padded, conv.unsqueeze(1), groups=conv.shape[0])).transpose(1, 2)
    q, k, v = mixed.split([k_heads * dim, k_heads * dim, v_heads * dim], dim=-1)
    q = F.normalize(q.view(batch, tokens, k_heads, dim), dim=-1, eps=1e-6)
    k = F.normalize(k.view(batch, tokens, k_heads, dim), dim=-1, eps=1e-6)
    v = v.view(batch, tokens, v_heads, dim)
    beta = torch.sigmoid(b.reshape(batch, tokens, v_heads))
    g = -w[f"{prefix}.A_log"].exp() * F.softplus(
        a.reshape(batch, tokens, v_heads) + w[f"{prefix}.dt_bias"]
    )
    if captured is not None:
        captured.extend(
            GdnKernelInputs(layer, q[i], k[i], v[i], beta[i], g[i]) for i in range(batch)
        )
    q = q.repeat_interleave(v_per_k, dim=2) * dim**-0.5
    k = k.repeat_interleave(v_per_k, dim=2)
    out = _gated_delta_rule(q, k, v, beta, g).float()
    gated = _rms_norm(out, w[f"{prefix}.norm.weight"], offset=0.0) * F.silu(z.reshape(out.shape))
    return gated.flatten(2) @ w[f"{prefix}.out_proj.weight"].T


def _gated_delta_rule(q, k, v, beta, g, chunk: int = 64) -> torch.Tensor:
    """Exact (float64) chunked gated delta rule from a zero state; inputs [batch, tokens, heads, .].

    Within a chunk, with cumulative log decay G, the delta rule's corrections solve the unit
    lower-triangular system (I + strictly_lower(beta_i k_i.k_j e^(G_i-G_j))) d = beta (v - e^G k S),
    done here by a float64 triangular solve: no inverse approximation to get wrong.
    """
    q, k, v, beta, g = (t.double().transpose(1, 2) for t in (q, k, v, beta, g))
    batch, heads, tokens, dim = k.shape
    state = None  # zero before the first chunk
    out = torch.empty_like(v)
    for start in range(0, tokens, chunk):
        span = slice(start, min(start + chunk, tokens))
        qc, kc, vc, bc = q[:, :, span], k[:, :, span], v[:, :, span], beta[:, :, span, None]
        cum = g[:, :, span].cumsum(-1)
        n = cum.shape[-1]
        causal = torch.ones(n, n, dtype=torch.bool).tril()
        decay = (cum[..., :, None] - cum[..., None, :]).masked_fill(~causal, -math.inf).exp()
        system = torch.eye(n, dtype=torch.float64) + (
            bc * (kc @ kc.transpose(-1, -2)) * decay
        ).tril(-1)
        rhs = torch.cat([bc * vc, bc * cum.exp()[..., None] * kc], dim=-1)
        solved = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
        delta, correction = solved.split([vc.shape[-1], dim], dim=-1)
        if state is not None:
            delta = delta - correction @ state
        out[:, :, span] = ((qc @ kc.transpose(-1, -2)) * decay) @ delta
        if state is not None:
            out[:, :, span] += cum.exp()[..., None] * (qc @ state)
        if span.stop < tokens:
            last = cum[..., -1:]
            carried = ((last - cum).exp()[..., None] * kc).transpose(-1, -2) @ delta
            state = carried if state is None else last.exp()[..., None] * state + carried
    return out.transpose(1, 2)


def _attention(w, params, prefix, x) -> torch.Tensor:
    batch, tokens, _ = x.shape
    heads, kv_heads, dim = params.num_attention_heads, params.num_key_value_heads, params.head_dim
    q, gate = (x @ w[f"{prefix}.q_proj.weight"].T).view(batch, tokens, heads, 2 * dim).chunk(2, -1)
    k = (x @ w[f"{prefix}.k_proj.weight"].T).view(batch, tokens, kv_heads, dim)
    v = (x @ w[f"{prefix}.v_proj.weight"].T).view(batch, tokens, kv_heads, dim)
    q, k = (
        _rope(_rms_norm(q, w[f"{prefix}.q_norm.weight"])),
        _rope(_rms_norm(k, w[f"{prefix}.k_norm.weight"])),
    )
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=True
    ).transpose(1, 2)
    out = out * torch.sigmoid(gate)
    return out.flatten(2) @ w[f"{prefix}.o_proj.weight"].T


def _rope(x: torch.Tensor, rotary_dim: int = 16, theta: float = 10000.0) -> torch.Tensor:
    """NeoX-style rotary embedding on the first rotary_dim dims of each head (factor 0.25)."""
    positions = torch.arange(x.shape[1], dtype=torch.float32)
    inv_freq = theta ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim)
    angles = positions[:, None] * inv_freq[None, :]
    cos, sin = angles.cos()[None, :, None, :], angles.sin()[None, :, None, :]
    half = rotary_dim // 2
    x1, x2, rest = x[..., :half], x[..., half:rotary_dim], x[..., rotary_dim:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], dim=-1)


def _moe(w, params, prefix, x) -> torch.Tensor:
    def mlp(name: str) -> torch.Tensor:
        hidden = F.silu(x @ w[f"{name}.gate_proj.weight"].T) * (x @ w[f"{name}.up_proj.weight"].T)
        return hidden @ w[f"{name}.down_proj.weight"].T

    probs = torch.softmax(x @ w[f"{prefix}.gate.weight"].T, dim=-1)
    top, chosen = probs.topk(params.num_experts_per_tok, dim=-1)
    routing = torch.zeros_like(probs).scatter(-1, chosen, top / top.sum(-1, keepdim=True))
    out = sum(
        routing[..., e, None] * mlp(f"{prefix}.experts.{e}") for e in range(params.num_experts)
    )
    shared = torch.sigmoid(x @ w[f"{prefix}.shared_expert_gate.weight"].T)
    return out + shared * mlp(f"{prefix}.shared_expert")


def readout_features(params: TinyModelParams, weights: dict[str, torch.Tensor]) -> torch.Tensor:
    """Unit, centred final hidden state of each token of the vocabulary seen on its own.

    The LM head row of a token's successor is logit_scale times this vector, so the served
    model's own numerics (BF16 weights, normalisations) set the readout, not a formula. In running
    text the state also holds ~10% of the previous token and a little attention context, which
    costs a little of the margin.
    """
    served = {name: tensor.to(torch.bfloat16) for name, tensor in weights.items()}
    features = forward(served, params, torch.arange(params.vocab_size)[:, None])[:, 0]
    return F.normalize(features - features.mean(dim=0), dim=-1)


# --- build and cache -----------------------------------------------------------------------


def build_tiny_model(
    out_dir: Path, params: TinyModelParams, texts: list[str] | None = None
) -> Path:
    """Write config, tokenizer and weights of the tiny model into out_dir (created if missing).

    `texts` is the tokenizer corpus; it must hash to params.corpus_sha256 (default: the repo's).
    """
    texts = corpus_texts() if texts is None else texts
    if corpus_sha256(texts) != params.corpus_sha256:
        raise ValueError("tokenizer corpus does not match params.corpus_sha256")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    _progress(f"training a {params.vocab_size}-token byte-level BPE on {len(texts)} texts")
    tokenizer = train_tokenizer(texts, params.vocab_size)
    _progress(f"constructing weights (seed {params.seed})")
    weights = construct_weights(params, tokenizer)
    write_checkpoint(out_dir, params, tokenizer, weights, PARAMS_FILE)
    _progress(f"built in {time.monotonic() - started:.1f} s: {out_dir}")
    return out_dir


def write_checkpoint(
    out_dir: Path,
    shape: ModelShape,
    tokenizer: Tokenizer,
    weights: dict[str, torch.Tensor],
    params_file: str,
) -> None:
    """Everything vLLM loads (config, tokenizer, BF16 safetensors) plus the params that made it."""
    write_tokenizer_files(tokenizer, out_dir)
    save_file(weights, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    _write_json(out_dir / "config.json", hf_config(shape))
    _write_json(
        out_dir / "generation_config.json",
        {"eos_token_id": [2, 0], "pad_token_id": 0, "do_sample": False},
    )
    _write_json(out_dir / params_file, shape.model_dump())


def ensure_tiny_model(cache_root: Path = DEFAULT_CACHE_ROOT) -> Path:
    """The tiny model for the current prompts, built on first use and cached by params hash."""
    params = default_params()
    return ensure_built(Path(cache_root) / params.key(), lambda out: build_tiny_model(out, params))


def ensure_built(final: Path, build: Callable[[Path], object]) -> Path:
    """`final` if it holds a model, else build(staging folder) and rename it to `final`.

    The build goes to a private temporary folder renamed into place at the end, so an
    interrupted build never leaves a half model behind and concurrent builds do not collide.
    """
    if (final / "model.safetensors").exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = final.parent / f".{final.name}.{os.getpid()}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        build(staging)
        try:
            staging.rename(final)
        except OSError:
            if not (final / "model.safetensors").exists():
                raise  # a concurrent build that won the rename is fine, anything else is not
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final


def load_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(Path(model_dir) / "model.safetensors"))


def load_params(model_dir: Path) -> TinyModelParams:
    return TinyModelParams.model_validate_json((Path(model_dir) / PARAMS_FILE).read_text())


def _write_json(path: Path, content: dict) -> None:
    path.write_text(json.dumps(content, indent=2, sort_keys=True) + "\n")


def _progress(message: str) -> None:
    print(f"[tiny-model] {message}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "cache_root",
        nargs="?",
        type=Path,
        default=DEFAULT_CACHE_ROOT,
        help="cache folder; the model lands in a sub-folder named by the params hash",
    )
    args = parser.parse_args(argv)
    print(ensure_tiny_model(args.cache_root))


if __name__ == "__main__":
    main()
