"""The Triton nsR's launch rules, decided on the host (no GPU needed): when the walk computes
the output itself, and how many columns of V a walk program takes."""

import pytest
import torch

from kernels import ns_triton

H200_SMS = 132
CUDA = torch.device("cuda", 0)  # only its type and index are read


@pytest.fixture
def h200(monkeypatch):
    monkeypatch.setattr(ns_triton, "_multiprocessors", lambda index: H200_SMS)


@pytest.mark.parametrize(
    ("num_seqs", "fused"),
    [(1, False), (2, False), (4, False), (5, True), (8, True), (64, True)],
)
def test_output_is_fused_once_walk_programs_fill_every_sm_twice(h200, num_seqs, fused):
    """32 value heads, V = 128: 64 walk programs per sequence at 64 columns; 264 fill 132 SMs
    twice, so 5 sequences and more (the bench's 8x1K and 64x128) take the fused walk."""
    assert ns_triton._fuse_output(num_seqs * 32, 128, CUDA) is fused


def test_output_is_never_fused_on_cpu():
    assert not ns_triton._fuse_output(10_000, 128, torch.device("cpu"))


@pytest.mark.parametrize(
    ("num_seqs", "fused", "block_v"),
    [(1, False, 32), (2, False, 32), (3, False, 64), (1, True, 64), (64, True, 64)],
)
def test_walk_columns_follow_occupancy(h200, num_seqs, fused, block_v):
    """32-column programs while 64-column ones would leave SMs idle; 64 when fused."""
    assert ns_triton._walk_block_v(num_seqs * 32, 128, fused, CUDA) == block_v


@pytest.mark.parametrize("forced", [True, False])
def test_the_module_setting_overrides_the_rule(monkeypatch, forced):
    monkeypatch.setattr(ns_triton, "FUSED_OUTPUT", forced)
    t, h, hv, d = 64, 1, 2, 64
    launch = ns_triton.Launch(
        torch.zeros(1, t, h, d, dtype=torch.bfloat16),
        torch.zeros(1, t, h, d, dtype=torch.bfloat16),
        torch.zeros(1, t, hv, d, dtype=torch.bfloat16),
        torch.zeros(1, t, hv),
        torch.zeros(1, t, hv),
    )
    assert launch.fused_output is forced
