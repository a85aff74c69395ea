"""The Qwen3-Next architecture of the embedded models: their shape, the config.json vLLM reads,
and a plain-torch float32 forward that mirrors vLLM's math. The tiny model sets its LM head
with this forward, tiny-lm trains through it, and tests read what the GDN kernel is given."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field


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
    num_hidden_layers: int = Field(4, ge=1)
    full_attention_interval: int = Field(2, ge=1)  # every n-th layer is full attention

    @property
    def layer_types(self) -> tuple[str, ...]:
        """Each layer's kind, as Hugging Face's Qwen3NextConfig derives them from the interval."""
        return tuple(
            "full_attention"
            if (index + 1) % self.full_attention_interval == 0
            else "linear_attention"
            for index in range(self.num_hidden_layers)
        )

    def key(self) -> str:
        """Cache key: a hash of every field."""
        blob = json.dumps(self.model_dump(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def hf_config(params: ModelShape) -> dict:
    """config.json of a Qwen3NextForCausalLM with every layer MoE (vLLM needs one at least)."""
    return {
        "architectures": ["Qwen3NextForCausalLM"],
        "model_type": "qwen3_next",
        "dtype": "bfloat16",
        "vocab_size": params.vocab_size,
        "hidden_size": params.hidden_size,
        "num_hidden_layers": params.num_hidden_layers,
        "layer_types": list(params.layer_types),
        "full_attention_interval": params.full_attention_interval,
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
    for index, layer_type in enumerate(params.layer_types):
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
