"""The files of an embedded model and their cache: a byte-level BPE tokenizer with Qwen's chat
markup, config and BF16 safetensors as vLLM loads them, and a build that lands in its cache
folder whole or not at all."""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from rig.models.embedded import builds_allowed, is_built
from rig.models.qwen3_next import ModelShape, hf_config

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


# Qwen-style chat markup. `enable_thinking` is accepted and ignored: the model has no thinking
# mode, and clients that always send the flag must get the same prompt either way.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """Run a block on `threads` CPU threads, then give back the caller's count. Float
    reductions are summed in another order on another thread count, so weights built with a
    fixed count are the same bytes on every machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


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


def write_tokenizer_files(tokenizer: Tokenizer, out_dir: Path, max_length: int) -> None:
    tokenizer.save(str(out_dir / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": max_length,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_bos_token": False,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    write_json(out_dir / "tokenizer_config.json", config)


def write_checkpoint(
    out_dir: Path,
    shape: ModelShape,
    tokenizer: Tokenizer,
    weights: dict[str, torch.Tensor],
    params_file: str,
) -> None:
    """Everything vLLM loads (config, tokenizer, BF16 safetensors) plus the params that made it."""
    write_tokenizer_files(tokenizer, out_dir, shape.max_position_embeddings)
    save_file(weights, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    write_json(out_dir / "config.json", hf_config(shape))
    write_json(
        out_dir / "generation_config.json",
        {"eos_token_id": [2, 0], "pad_token_id": 0, "do_sample": False},
    )
    write_json(out_dir / params_file, shape.model_dump())


def ensure_built(final: Path, build: Callable[[Path], object]) -> Path:
    """`final` if it holds a model, else build(staging folder) and rename it to `final`.

    The build goes to a private temporary folder renamed into place at the end, so an
    interrupted build never leaves a half model behind and concurrent builds do not collide.
    """
    if is_built(final) or not builds_allowed():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = final.parent / f".{final.name}.{os.getpid()}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        build(staging)
        try:
            staging.rename(final)
        except OSError:
            if not is_built(final):
                raise  # a concurrent build that won the rename is fine, anything else is not
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final


def load_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(Path(model_dir) / "model.safetensors"))


def sources_sha256(*module_names: str) -> str:
    """A hash of the modules' source files: a generator's code is one of its inputs, so a code
    change never serves a stale cached model."""
    digest = hashlib.sha256()
    for name in module_names:
        digest.update(Path(importlib.import_module(name).__file__).read_bytes())
    return digest.hexdigest()


def write_json(path: Path, content: dict) -> None:
    path.write_text(json.dumps(content, indent=2, sort_keys=True) + "\n")


def variant_command(
    argv: list[str] | None, description: str, default_root: Path, ensure: Callable[[Path], Path]
) -> None:
    """`python -m rig.models.<variant> [CACHE_ROOT]` for a variant of this construction (its own
    params): build it, or find it built, and print its folder."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "cache_root",
        nargs="?",
        type=Path,
        default=default_root,
        help="cache folder; the model lands in a sub-folder named by the params hash "
        f"(default {default_root})",
    )
    print(ensure(parser.parse_args(argv).cache_root))
