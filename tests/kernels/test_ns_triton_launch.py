"""The Triton nsR's launch rule, decided on the host (no GPU needed): which walk runs and how
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
    ("num_seqs", "num_value_heads", "head_v_dim", "layout"),
    [
        (1, 32, 128, ("k-first", 32)),  # 128 programs at 32 columns: one wave
        (2, 32, 128, ("k-first", 64)),  # 32 columns would take two waves, 64 one
        (4, 32, 128, ("v-first", 64)),  # 128 v-first programs: one wave, k-first two or more
        (5, 32, 128, ("v-first", 64)),
        (64, 32, 128, ("v-first", 64)),
        (1, 64, 128, ("k-first", 64)),  # Qwen3.5 on one GPU: 64 value heads
        (1, 32, 64, ("k-first", 32)),
        (4, 32, 64, ("k-first", 64)),
        (132, 1, 128, ("v-first", 64)),
        (33, 1, 128, ("k-first", 32)),
    ],
)
def test_the_walk_layout_takes_the_fewest_waves_then_the_least_work_per_program(
    h200, num_seqs, num_value_heads, head_v_dim, layout
):
    assert ns_triton._walk_layout(num_seqs, num_value_heads, head_v_dim, CUDA) == layout


def test_k_first_walk_on_cpu_at_64_columns_at_most():
    cpu = torch.device("cpu")
    assert ns_triton._walk_layout(64, 32, 128, cpu) == ("k-first", 64)
    assert ns_triton._walk_layout(1, 4, 32, cpu) == ("k-first", 32)


def test_an_unknown_walk_form_is_refused(monkeypatch):
    monkeypatch.setattr(ns_triton, "WALK_FORM", "diagonal")
    x = torch.zeros(1, 64, 1, 64)
    with pytest.raises(ValueError, match="k-first or v-first, not 'diagonal'"):
        ns_triton.Launch(x, x, x, torch.zeros(1, 64, 1), torch.zeros(1, 64, 1))
