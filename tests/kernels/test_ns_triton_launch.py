"""The Triton nsR's launch rules, decided on the host (no GPU needed): which walk runs and how
many columns of V a k-first walk program takes."""

import pytest
import torch

from kernels import ns_triton

H200_SMS = 132
CUDA = torch.device("cuda", 0)  # only its type and index are read


@pytest.fixture
def h200(monkeypatch):
    monkeypatch.setattr(ns_triton, "_multiprocessors", lambda device: H200_SMS)


@pytest.mark.parametrize(
    ("num_seqs", "head_v_dim", "block_v"),
    [(1, 128, 32), (2, 128, 32), (3, 128, 64), (64, 128, 64), (1, 64, 32), (8, 64, 64)],
)
def test_walk_columns_follow_occupancy(h200, num_seqs, head_v_dim, block_v):
    """32 value heads: 32-column programs while 64-column ones would leave SMs idle."""
    assert ns_triton._walk_block_v(num_seqs * 32, head_v_dim, CUDA) == block_v


def test_walk_columns_on_cpu_are_64_at_most():
    assert ns_triton._walk_block_v(1, 128, torch.device("cpu")) == 64
    assert ns_triton._walk_block_v(1, 64, torch.device("cpu")) == 64


@pytest.mark.parametrize(
    ("num_seqs", "num_value_heads", "form"),
    [(1, 32, "k-first"), (4, 32, "k-first"), (5, 32, "v-first"), (64, 32, "v-first"),
     (132, 1, "v-first"), (131, 1, "k-first")],
)  # fmt: skip
def test_v_first_walk_once_one_program_per_sequence_and_head_fills_the_sms(
    h200, num_seqs, num_value_heads, form
):
    assert ns_triton._walk_form(num_seqs, num_value_heads, CUDA) == form


def test_k_first_walk_on_cpu():
    assert ns_triton._walk_form(64, 32, torch.device("cpu")) == "k-first"


def test_an_unknown_walk_form_is_refused(monkeypatch):
    monkeypatch.setattr(ns_triton, "WALK_FORM", "diagonal")
    x = torch.zeros(1, 64, 1, 64)
    with pytest.raises(ValueError, match="k-first or v-first, not 'diagonal'"):
        ns_triton.Launch(x, x, x, torch.zeros(1, 64, 1), torch.zeros(1, 64, 1))
