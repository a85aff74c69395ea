"""`tiny-lm`: an embedded Qwen3-Next model trained here to behave like a small language model.

The constructed `tiny` model (models/tiny_model.py) proves the control but is a poor test subject
for the rest: its next token depends on the last token only and its greedy margins are ~11
nats, so every chat prompt gets the same completion and no correct kernel ever meets a
near-tie. This model is trained instead, deterministically on CPU in a few minutes, on a text
that ships with every CPython: the interpreter's own help topics (`pydoc_data.topics`, the
language reference behind `help("if")`), cut into paragraphs and laid out as chat turns (a
paragraph as the user's turn, the next one as the assistant's), so chat prompts are in its
format and its continuation depends on the whole prompt.

One GDN layer stays in the Newton-Schulz failure regime, planted and frozen during training:
the embedding's dimension REGIME_DIM holds a constant, the first GDN layer's key rows read that
constant (plus a small fixed token-dependent spread) through a convolution that passes only the
current token, its beta rows map the constant to ~logit(0.9), and A_log = -30 makes g ~ 0. Keys
of a chunk then have a mean cosine ~0.998 and three BF16 Newton-Schulz rounds blow up, while
everything else in the layer (queries, values, gates, output) is trained.

The training forward is rig.models.qwen3_next.forward (vLLM's Qwen3-Next math in float32, the GDN
recurrence exact), so the served BF16 model computes what was trained.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

import tokenizers
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from rig.models import tiny_model
from rig.models.checkpoint import (
    SPECIAL_TOKENS,
    ensure_built,
    sources_sha256,
    torch_threads,
    train_tokenizer,
    write_checkpoint,
)
from rig.models.qwen3_next import ModelShape, forward
from rig.models.tiny_model import REGIME_DIM

DEFAULT_CACHE_ROOT = Path(".cache/tiny-lm")
RECIPE_FILE = "tiny_lm_recipe.json"
REGIME_LAYER = 0  # the GDN layer planted in the failure regime
IGNORED = -100  # cross_entropy's ignore_index
USER_TURN = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"


class TinyLmRecipe(ModelShape):
    """Every input of the build; equal recipes give bit-identical files on the same machine.

    The corpus, the source of this module and of the tiny model's generator and the library
    versions are inputs too, so an upgrade or a code change never serves a stale cached model.
    """

    corpus_sha256: str
    generator_sha256: str
    libraries: str
    seed: int = 0
    vocab_size: int = 1024
    hidden_size: int = 128
    num_attention_heads: int = 2
    num_key_value_heads: int = 1
    linear_num_key_heads: int = 1
    linear_num_value_heads: int = 2
    linear_head_dim: int = 64
    moe_intermediate_size: int = 64
    threads: int = 1  # one thread: deterministic, and robust on a shared two-core machine
    steps: int = 450
    batch_size: int = 8
    sequence_length: int = 128
    learning_rate: float = 3e-3
    warmup_steps: int = 20
    regime_constant: float = 8.0  # embedding value of REGIME_DIM for every token
    key_spread: float = 0.05  # token-dependent part of the planted keys (cosine ~0.998)
    beta: float = 0.9
    a_log: float = -30.0  # g = -exp(a_log) * softplus(0) ~ -6e-14: no decay


def corpus_paragraphs() -> list[str]:
    """The help topics of this Python installation, paragraph by paragraph, in topic order."""
    from pydoc_data.topics import topics

    paragraphs = []
    for name in sorted(topics):
        for block in topics[name].split("\n\n"):
            text = block.strip("\n")
            if len(text.strip()) >= 40:
                paragraphs.append(text)
    return paragraphs


def default_recipe() -> TinyLmRecipe:
    corpus = hashlib.sha256("\0".join(corpus_paragraphs()).encode()).hexdigest()
    return TinyLmRecipe(
        corpus_sha256=corpus,
        generator_sha256=sources_sha256(__name__, *tiny_model.GENERATOR_MODULES),
        libraries=f"torch {torch.__version__}, tokenizers {tokenizers.__version__}",
    )


def training_stream(tokenizer: Tokenizer, paragraphs: list[str]) -> torch.Tensor:
    """Token ids of the whole corpus as chat exchanges: paragraph i asks, paragraph i+1 answers."""
    ids: list[int] = []
    for question, answer in zip(paragraphs[::2], paragraphs[1::2], strict=False):
        ids += tokenizer.encode(USER_TURN.format(question) + answer + "<|im_end|>\n").ids
    return torch.tensor(ids)


# --- weights -------------------------------------------------------------------------------


def initial_weights(recipe: TinyLmRecipe, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Random float32 weights in the Hugging Face layout, the regime layer planted."""
    hidden = recipe.hidden_size
    writer_std = 1 / math.sqrt(2 * recipe.num_hidden_layers)

    def normal(*shape: int, std: float | None = None) -> torch.Tensor:
        scale = shape[-1] ** -0.5 if std is None else std
        return torch.randn(*shape, generator=generator) * scale

    embeddings = normal(recipe.vocab_size, hidden, std=1.0)
    embeddings[:, REGIME_DIM] = recipe.regime_constant
    weights = {
        "model.embed_tokens.weight": embeddings,
        "model.norm.weight": torch.zeros(hidden),
        "lm_head.weight": normal(recipe.vocab_size, hidden),
    }
    k_size, v_size = recipe.linear_head_dim, recipe.linear_head_dim
    key_heads, value_heads = recipe.linear_num_key_heads, recipe.linear_num_value_heads
    for index, layer_type in enumerate(recipe.layer_types):
        prefix = f"model.layers.{index}"
        weights[f"{prefix}.input_layernorm.weight"] = torch.zeros(hidden)
        weights[f"{prefix}.post_attention_layernorm.weight"] = torch.zeros(hidden)
        if layer_type == "linear_attention":
            gdn = f"{prefix}.linear_attn"
            conv_channels = 2 * key_heads * k_size + value_heads * v_size
            qkvz_rows = 2 * key_heads * k_size + 2 * value_heads * v_size
            weights[f"{gdn}.in_proj_qkvz.weight"] = normal(qkvz_rows, hidden)
            weights[f"{gdn}.in_proj_ba.weight"] = normal(2 * value_heads, hidden)
            weights[f"{gdn}.conv1d.weight"] = normal(conv_channels, 1, 4, std=0.5)
            decay_rate = torch.empty(value_heads).uniform_(1, 16, generator=generator)
            weights[f"{gdn}.A_log"] = decay_rate.log()
            weights[f"{gdn}.dt_bias"] = torch.zeros(value_heads)
            weights[f"{gdn}.norm.weight"] = torch.ones(v_size)
            weights[f"{gdn}.out_proj.weight"] = normal(hidden, value_heads * v_size) * writer_std
        else:
            attn = f"{prefix}.self_attn"
            q_size = recipe.num_attention_heads * recipe.head_dim
            kv_size = recipe.num_key_value_heads * recipe.head_dim
            weights[f"{attn}.q_proj.weight"] = normal(2 * q_size, hidden)
            weights[f"{attn}.k_proj.weight"] = normal(kv_size, hidden)
            weights[f"{attn}.v_proj.weight"] = normal(kv_size, hidden)
            weights[f"{attn}.o_proj.weight"] = normal(hidden, q_size) * writer_std
            weights[f"{attn}.q_norm.weight"] = torch.zeros(recipe.head_dim)
            weights[f"{attn}.k_norm.weight"] = torch.zeros(recipe.head_dim)
        mlp = f"{prefix}.mlp"
        inner = recipe.moe_intermediate_size
        weights[f"{mlp}.gate.weight"] = normal(recipe.num_experts, hidden)
        weights[f"{mlp}.shared_expert_gate.weight"] = normal(1, hidden)
        experts = [f"{mlp}.experts.{e}" for e in range(recipe.num_experts)]
        for expert in [*experts, f"{mlp}.shared_expert"]:
            weights[f"{expert}.gate_proj.weight"] = normal(inner, hidden)
            weights[f"{expert}.up_proj.weight"] = normal(inner, hidden)
            weights[f"{expert}.down_proj.weight"] = normal(hidden, inner) * writer_std
    for name, (mask, value) in planted_regime(recipe, weights, generator).items():
        weights[name] = torch.where(mask, value, weights[name])
    return weights


def planted_regime(
    recipe: TinyLmRecipe, weights: dict[str, torch.Tensor], generator: torch.Generator
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """name -> (mask, values) of the entries that put GDN layer REGIME_LAYER in the NS failure
    regime; training restores them after every step.

    The layer's input is the RMS-normalised embedding, whose REGIME_DIM entry is about
    regime_constant / rms(embedding) = `nominal` for every token.
    """
    hidden, k_size = recipe.hidden_size, recipe.linear_head_dim
    key_heads, value_heads = recipe.linear_num_key_heads, recipe.linear_num_value_heads
    v_per_k = value_heads // key_heads
    nominal = recipe.regime_constant / math.sqrt((recipe.regime_constant**2 + hidden - 1) / hidden)
    prefix = f"model.layers.{REGIME_LAYER}"
    gdn = f"{prefix}.linear_attn"
    planted: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def plant(name: str, mask: torch.Tensor, value: torch.Tensor) -> None:
        planted[name] = (mask, value)

    embeddings = weights["model.embed_tokens.weight"]
    mask = torch.zeros_like(embeddings, dtype=torch.bool)
    mask[:, REGIME_DIM] = True
    plant("model.embed_tokens.weight", mask, torch.full_like(embeddings, recipe.regime_constant))
    norm = weights[f"{prefix}.input_layernorm.weight"]
    mask = torch.zeros_like(norm, dtype=torch.bool)
    mask[REGIME_DIM] = True
    plant(f"{prefix}.input_layernorm.weight", mask, torch.zeros_like(norm))

    qkvz = weights[f"{gdn}.in_proj_qkvz.weight"]
    plant(f"{gdn}.in_proj_qkvz.weight", *_planted_keys(recipe, qkvz, nominal, generator))

    ba = weights[f"{gdn}.in_proj_ba.weight"]
    value = torch.zeros_like(ba)
    for group in range(key_heads):
        b_rows = slice(group * 2 * v_per_k, group * 2 * v_per_k + v_per_k)
        value[b_rows, REGIME_DIM] = math.log(recipe.beta / (1 - recipe.beta)) / nominal
    plant(f"{gdn}.in_proj_ba.weight", torch.ones_like(ba, dtype=torch.bool), value)

    conv = weights[f"{gdn}.conv1d.weight"]
    mask, value = torch.zeros_like(conv, dtype=torch.bool), torch.zeros_like(conv)
    key_channels = slice(key_heads * k_size, 2 * key_heads * k_size)
    mask[key_channels] = True
    value[key_channels, 0, -1] = 1.0  # keys see the current token only
    plant(f"{gdn}.conv1d.weight", mask, value)
    for name, fill in (("A_log", recipe.a_log), ("dt_bias", 0.0)):
        tensor = weights[f"{gdn}.{name}"]
        plant(
            f"{gdn}.{name}",
            torch.ones_like(tensor, dtype=torch.bool),
            torch.full_like(tensor, fill),
        )
    return planted


def _planted_keys(
    recipe: TinyLmRecipe, qkvz: torch.Tensor, nominal: float, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """(mask, values) of in_proj_qkvz's key rows: each group's keys read the regime dimension
    (about `nominal` in every token's input) as 1, plus a seeded token-dependent spread over
    the other dimensions, drawn a group at a time (planted_regime's only draws)."""
    hidden, k_size = recipe.hidden_size, recipe.linear_head_dim
    key_heads = recipe.linear_num_key_heads
    group_rows = qkvz.shape[0] // key_heads
    mask, value = torch.zeros_like(qkvz, dtype=torch.bool), torch.zeros_like(qkvz)
    others = [d for d in range(hidden) if d != REGIME_DIM]
    for group in range(key_heads):
        rows = slice(group * group_rows + k_size, group * group_rows + 2 * k_size)
        mask[rows] = True
        value[rows, REGIME_DIM] = 1 / nominal
        spread = torch.randn(k_size, len(others), generator=generator)
        value[rows, others] = recipe.key_spread * spread / math.sqrt(len(others))
    return mask, value


# --- training ------------------------------------------------------------------------------


def train(
    recipe: TinyLmRecipe,
    stream: torch.Tensor,
    silent_ids: list[int],
    progress: Callable[[str], None],
) -> dict[str, torch.Tensor]:
    """Next-token training of every weight but the planted ones; float32, fixed seed and
    threads, so the same recipe on the same machine gives the same weights.

    Tokens in `silent_ids` (the chat markup, end of turn included) are never a target, so the
    model never writes them: every greedy completion runs to max_tokens, and a near-tie flip
    can never turn into "one side stopped, the other ran on".
    """
    torch.manual_seed(recipe.seed)
    generator = torch.Generator().manual_seed(recipe.seed)
    weights = initial_weights(recipe, generator)
    planted = planted_regime(recipe, weights, torch.Generator().manual_seed(recipe.seed + 1))
    for name, (mask, value) in planted.items():
        weights[name] = torch.where(mask, value, weights[name])
    params = {name: tensor.requires_grad_(True) for name, tensor in weights.items()}
    optimizer = torch.optim.AdamW(
        params.values(), lr=recipe.learning_rate, betas=(0.9, 0.95), weight_decay=0.0
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: _lr_factor(recipe, step))
    windows = len(stream) - recipe.sequence_length - 1
    silent = torch.tensor(silent_ids)
    started = time.monotonic()
    for step in range(recipe.steps):
        starts = torch.randint(windows, (recipe.batch_size,), generator=generator)
        batch = torch.stack([stream[s : s + recipe.sequence_length + 1] for s in starts])
        hidden = forward(params, recipe, batch[:, :-1])
        logits = hidden @ params["lm_head.weight"].T
        targets = batch[:, 1:].masked_fill(torch.isin(batch[:, 1:], silent), IGNORED)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORED)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params.values(), 1.0)
        optimizer.step()
        schedule.step()
        with torch.no_grad():
            for name, (mask, value) in planted.items():
                params[name].copy_(torch.where(mask, value, params[name]))
        if step % 25 == 0 or step == recipe.steps - 1:
            elapsed = time.monotonic() - started
            progress(f"step {step + 1}/{recipe.steps} loss {loss.item():.3f} ({elapsed:.0f} s)")
    return {name: tensor.detach() for name, tensor in params.items()}


def _lr_factor(recipe: TinyLmRecipe, step: int) -> float:
    """Linear warm-up, then cosine decay to a tenth."""
    if step < recipe.warmup_steps:
        return (step + 1) / recipe.warmup_steps
    done = (step - recipe.warmup_steps) / max(1, recipe.steps - recipe.warmup_steps)
    return 0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, done)))


# --- build and cache -----------------------------------------------------------------------


def build_tiny_lm(out_dir: Path, recipe: TinyLmRecipe) -> Path:
    """Tokenizer, training and checkpoint of the tiny LM into out_dir (created if missing)."""
    paragraphs = corpus_paragraphs()
    digest = hashlib.sha256("\0".join(paragraphs).encode()).hexdigest()
    if digest != recipe.corpus_sha256:
        raise ValueError("the corpus of this Python installation does not match the recipe")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    _progress(f"training a {recipe.vocab_size}-token BPE on {len(paragraphs)} paragraphs")
    tokenizer = train_tokenizer(paragraphs, recipe.vocab_size)
    stream = training_stream(tokenizer, paragraphs)
    _progress(f"training on {len(stream)} tokens, {recipe.threads} threads")
    silent = [tokenizer.token_to_id(token) for token in SPECIAL_TOKENS]
    with torch_threads(recipe.threads):
        weights = train(recipe, stream, silent, _progress)
    served = {name: t.to(torch.bfloat16).contiguous() for name, t in weights.items()}
    write_checkpoint(out_dir, recipe, tokenizer, served, RECIPE_FILE)
    _progress(f"built in {time.monotonic() - started:.1f} s: {out_dir}")
    return out_dir


def ensure_tiny_lm(cache_root: Path = DEFAULT_CACHE_ROOT) -> Path:
    """The tiny LM, trained on first use and cached by a hash of its recipe."""
    recipe = default_recipe()
    return ensure_built(Path(cache_root) / recipe.key(), lambda out: build_tiny_lm(out, recipe))


def load_recipe(model_dir: Path) -> TinyLmRecipe:
    return TinyLmRecipe.model_validate_json((Path(model_dir) / RECIPE_FILE).read_text())


def _progress(message: str) -> None:
    print(f"[tiny-lm] {message}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cache_root", nargs="?", type=Path, default=DEFAULT_CACHE_ROOT)
    args = parser.parse_args(argv)
    print(ensure_tiny_lm(args.cache_root))


if __name__ == "__main__":
    main()
