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

Its variants (tiny-gdn, tiny-qwen35, qwen35-control, qwen35-deep) are this construction at other
params, each in a module of its own.
"""

from __future__ import annotations

import hashlib
import math
import sys
import time
from pathlib import Path

import tokenizers
import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from tokenizers import Tokenizer

from rig import PROJECT_ROOT
from rig.models.checkpoint import (
    SPECIAL_TOKENS,
    ensure_built,
    sources_sha256,
    torch_threads,
    train_tokenizer,
    variant_command,
    write_checkpoint,
)
from rig.models.qwen3_next import ModelShape, forward
from rig.models.silent_layers import silent_layers
from rig.scenario.long_prompts import build_long_prompt
from rig.scenario.prompts import load_prompts

PROMPTS_FILE = PROJECT_ROOT / "prompts" / "prompts.jsonl"
DEFAULT_CACHE_ROOT = Path(".cache/tiny-model")
PARAMS_FILE = "tiny_model_params.json"
REGIME_DIM = 0  # the residual dimension that holds the constant the GDN layers read
# The generator's code: this module and what it builds with.
GENERATOR_MODULES = (
    __name__,
    "rig.models.qwen3_next",
    "rig.models.checkpoint",
    "rig.models.silent_layers",
)


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
    gdn_write: float = -2.0  # GDN output = gdn_write * input code; -2 flips the residual's sign
    side_scale: float = 0.05  # output scale of attention and MoE relative to the residual
    moe_write: float = 1.0  # the MoE's writes times this; 0: it computes and writes nothing
    logit_scale: float = 20.0  # logit of the predicted token; margins are ~half of it
    # The last `silent_layers` layers copy the first block's layers with every output projection
    # zero (GDN out_proj, attention o_proj, the experts' down_proj): they cost a deeper model's
    # GPU time, kernel calls included, and add exact zeros, so the text is the shallower one's.
    silent_layers: int = Field(0, ge=0)

    @model_validator(mode="after")
    def _silent_layers_copy_a_whole_block(self) -> TinyModelParams:
        if self.num_hidden_layers - self.silent_layers < self.full_attention_interval:
            raise ValueError(
                f"silent_layers {self.silent_layers} leaves fewer than one block of "
                f"{self.full_attention_interval} layers that write"
            )
        return self

    def writing(self) -> TinyModelParams:
        """The same model without its silent layers: the one that decides the text."""
        layers = self.num_hidden_layers - self.silent_layers
        return self.model_copy(update={"num_hidden_layers": layers, "silent_layers": 0})


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


def default_params(prompts_file: Path = PROMPTS_FILE, **overrides: float) -> TinyModelParams:
    """The tiny model's params; `overrides` replace fields (a variant's params)."""
    return TinyModelParams(
        corpus_sha256=corpus_sha256(corpus_texts(prompts_file)),
        generator_sha256=sources_sha256(*GENERATOR_MODULES),
        libraries=f"torch {torch.__version__}, tokenizers {tokenizers.__version__}",
        **overrides,
    )


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


def construct_weights(params: TinyModelParams, tokenizer: Tokenizer) -> dict[str, torch.Tensor]:
    """All weights in the Hugging Face Qwen3-Next layout (BF16), LM head included. The writing
    layers are drawn and read out alone, so silent layers change no other weight."""
    writing = params.writing()
    generator = torch.Generator().manual_seed(params.seed)
    weights = _body_weights(writing, generator)
    successor = successor_map(params, tokenizer)
    features = readout_features(writing, weights)
    lm_head = torch.zeros(params.vocab_size, params.hidden_size)
    # Final-norm states have norm sqrt(hidden): a clean token's successor gets ~logit_scale.
    rows = params.logit_scale / math.sqrt(params.hidden_size) * features[: len(successor)]
    lm_head.index_add_(0, successor, rows)
    weights["lm_head.weight"] = lm_head
    served = {name: tensor.to(torch.bfloat16).contiguous() for name, tensor in weights.items()}
    silent = range(writing.num_hidden_layers, params.num_hidden_layers)
    return served | silent_layers(served, silent, params.full_attention_interval)


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

    def writer(rows: int, cols: int, scale: float = 1.0) -> torch.Tensor:
        """A small random map into the residual stream that leaves the regime dimension alone."""
        weight = normal(rows, cols, std=scale * params.side_scale / math.sqrt(cols))
        weight[REGIME_DIM] = 0.0
        return weight

    weights = {
        "model.embed_tokens.weight": token_embeddings(params, generator),
        "model.norm.weight": torch.zeros(hidden),
    }
    for index, layer_type in enumerate(params.layer_types):
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
            weights[f"{expert}.down_proj.weight"] = writer(hidden, inner, params.moe_write)
    return weights


def code_slices(params: TinyModelParams) -> list[torch.Tensor]:
    """Residual dimensions that carry the code, half a GDN head dim (64) per slice, the regime
    one excluded: one slice per GDN value head, or fewer when the residual is too narrow for
    that many, and then value head h carries slice h mod their number."""
    pairs = params.linear_head_dim // 2
    dims = [d for d in range(params.hidden_size) if d != REGIME_DIM]
    count = min(params.linear_num_value_heads, -(-len(dims) // pairs))
    return [torch.tensor(dims[s * pairs : (s + 1) * pairs]) for s in range(count)]


def token_embeddings(params: TinyModelParams, generator: torch.Generator) -> torch.Tensor:
    """Random codes, every code slice scaled to unit RMS, and the regime constant 1."""
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
            dims = slices[head % len(slices)]
            rows = torch.arange(len(dims))
            qkvz[value + rows, dims] = params.value_gain
            qkvz[value + pairs + rows, dims] = -params.value_gain
            qkvz[gate : gate + head_dim, REGIME_DIM] = params.gate_z
            ba[group * 2 * v_per_k + local, REGIME_DIM] = math.log(params.beta / (1 - params.beta))

    scale = _gdn_write_scale(params, generator)  # its draws come after the keys' spread
    # Heads that carry the same slice each write their share of it.
    carriers = torch.arange(v_heads).remainder(len(slices)).bincount()
    out_proj = torch.zeros(hidden, v_heads * head_dim)
    for head in range(v_heads):
        dims = slices[head % len(slices)]
        share = scale / float(carriers[head % len(slices)])
        rows = torch.arange(len(dims))
        out_proj[dims, head * head_dim + rows] = share
        out_proj[dims, head * head_dim + pairs + rows] = -share

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


def _gdn_write_scale(params: TinyModelParams, generator: torch.Generator) -> float:
    """How strongly out_proj writes, so that one token's output is gdn_write * its code: the
    gated RMS norm leaves each head at RMS(silu(+-value_gain * code)) / (value_gain *
    silu(gate_z)) of the code, measured here on a seeded probe of unit-RMS codes."""
    pairs = params.linear_head_dim // 2
    probe = torch.randn(4096, pairs, generator=generator)
    probe *= math.sqrt(pairs) / probe.norm(dim=1, keepdim=True)
    pair_rms = (
        (F.silu(params.value_gain * probe) ** 2 + F.silu(-params.value_gain * probe) ** 2)
        .mean(dim=1)
        .div(2)
        .sqrt()
        .mean()
    )
    return (
        params.gdn_write
        * float(pair_rms)
        / (params.value_gain * float(F.silu(torch.tensor(params.gate_z))))
    )


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
    with torch_threads(1):
        weights = construct_weights(params, tokenizer)
    write_checkpoint(out_dir, params, tokenizer, weights, PARAMS_FILE)
    _progress(f"built in {time.monotonic() - started:.1f} s: {out_dir}")
    return out_dir


def ensure_tiny_model(
    cache_root: Path = DEFAULT_CACHE_ROOT, params: TinyModelParams | None = None
) -> Path:
    """The tiny model (or one of other `params`), built on first use and cached by params hash."""
    params = default_params() if params is None else params
    return ensure_built(Path(cache_root) / params.key(), lambda out: build_tiny_model(out, params))


def load_params(model_dir: Path) -> TinyModelParams:
    return TinyModelParams.model_validate_json((Path(model_dir) / PARAMS_FILE).read_text())


def _progress(message: str) -> None:
    print(f"[tiny-model] {message}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> None:
    variant_command(argv, __doc__.splitlines()[0], DEFAULT_CACHE_ROOT, ensure_tiny_model)


if __name__ == "__main__":
    main()
