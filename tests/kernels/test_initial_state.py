"""The initial-state tally: which sequences of a call start from a non-zero state, read from the
CPU op's pool at its indices or from FLA-contract states, with their tokens."""

import torch

from kernels.initial_state import cpu_op_tally, fla_call_tally, state_tally


def test_a_sequence_continues_when_any_entry_of_its_state_is_non_zero():
    states = torch.zeros(3, 4, 8, 8)
    states[1, 3, 7, 7] = 1e-30  # one entry is enough
    tally = state_tally(states, torch.tensor([5, 7, 11]))
    assert tally.tolist() == [1, 1, 7, 3, 23]
    assert state_tally(torch.zeros(2, 4, 8, 8), torch.tensor([5, 6])).tolist() == [0, 0, 0, 2, 11]


def test_cpu_op_tally_reads_the_pool_at_the_indices_only():
    pool = torch.zeros(6, 4, 8, 8, dtype=torch.bfloat16)
    pool[0] = 1  # a slot of another request: not this call's
    pool[4] = -2
    indices = torch.tensor([4, 2], dtype=torch.int32)
    cu_seqlens = torch.tensor([0, 300, 364], dtype=torch.int32)
    assert cpu_op_tally(pool, cu_seqlens, indices).tolist() == [1, 1, 300, 2, 364]


def test_fla_call_tally_with_and_without_cu_seqlens():
    q = torch.zeros(1, 100, 2, 8)
    states = torch.zeros(2, 4, 8, 8)
    states[0] = 0.5
    cu_seqlens = torch.tensor([0, 64, 100], dtype=torch.int32)
    assert fla_call_tally(q, states, cu_seqlens).tolist() == [1, 1, 64, 2, 100]
    batched = torch.zeros(2, 50, 2, 8)
    assert fla_call_tally(batched, states, None).tolist() == [1, 1, 50, 2, 100]
    assert fla_call_tally(q, None, cu_seqlens) is None
