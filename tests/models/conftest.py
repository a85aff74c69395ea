"""The tiny model, built once a module, and what its tests and its variants' share."""

from pathlib import Path

import pytest
import torch

from rig.models.tiny_model import ensure_tiny_model


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    return ensure_tiny_model(tmp_path_factory.mktemp("tiny-cache"))


@pytest.fixture(scope="module")
def tokenizer(built):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(built / "tokenizer.json"))


def ring_continuation(successor: torch.Tensor, last_token: int, length: int) -> list[int]:
    """The greedy text the construction writes after `last_token`: its successor ring."""
    tokens = [int(successor[last_token])]
    while len(tokens) < length:
        tokens.append(int(successor[tokens[-1]]))
    return tokens
