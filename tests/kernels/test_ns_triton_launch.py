"""The Triton nsR's launch rule, decided on the host (no GPU needed): how many columns of V a
walk program takes."""

import pytest
import torch

from kernels import ns_triton

H200_SMS = 132
CUDA = torch.device("cuda", 0)  # only its type and index are read


@pytest.fixture
def h200(monkeypatch):
    monkeypatch.setattr(ns_triton, "_multiprocessors", lambda index: H200_SMS)


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
