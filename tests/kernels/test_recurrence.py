"""The float64 recurrence against closed forms and against itself, sequence by sequence."""

from dataclasses import replace

import torch

from kernels.cases import CPU_SHAPE, random_inputs
from kernels.recurrence import gdn_recurrence, l2_normalise


def test_no_write_no_decay_reads_the_initial_state():
    inputs = random_inputs([7], CPU_SHAPE, torch.float32, seed=1)
    inputs = replace(inputs, beta=torch.zeros_like(inputs.beta), g=torch.zeros_like(inputs.g))
    out, final = gdn_recurrence(inputs)
    q = l2_normalise(inputs.q.double(), inputs.eps)
    q = q.repeat_interleave(CPU_SHAPE.value_heads // CPU_SHAPE.heads, dim=1)
    expected = inputs.scale * torch.einsum("thk,hkv->thv", q, inputs.initial_state[0].double())
    assert torch.allclose(out, expected, atol=1e-12)
    assert torch.equal(final, inputs.initial_state.double())


def test_first_token_from_zero_state_is_beta_qk_v():
    inputs = random_inputs([1], CPU_SHAPE, torch.float32, seed=2)
    inputs = replace(inputs, initial_state=torch.zeros_like(inputs.initial_state))
    out, final = gdn_recurrence(inputs)
    group = CPU_SHAPE.value_heads // CPU_SHAPE.heads
    q = l2_normalise(inputs.q.double(), inputs.eps)[0].repeat_interleave(group, 0)
    k = l2_normalise(inputs.k.double(), inputs.eps)[0].repeat_interleave(group, 0)
    beta = inputs.beta.double()[0]
    v = inputs.v.double()[0]
    expected = inputs.scale * (beta * (q * k).sum(-1))[:, None] * v
    assert torch.allclose(out[0], expected, atol=1e-12)
    assert torch.allclose(final[0], beta[:, None, None] * k[:, :, None] * v[:, None, :])


def test_decay_alone_scales_the_state():
    inputs = random_inputs([5], CPU_SHAPE, torch.float32, seed=3)
    inputs = replace(inputs, beta=torch.zeros_like(inputs.beta))
    _, final = gdn_recurrence(inputs)
    factor = torch.exp(inputs.g.double().sum(0))
    assert torch.allclose(final[0], inputs.initial_state[0].double() * factor[:, None, None])


def test_varlen_batch_equals_each_sequence_alone():
    lengths = [3, 0, 9, 1]
    batch = random_inputs(lengths, CPU_SHAPE, torch.float32, seed=4)
    out, final = gdn_recurrence(batch)
    offsets = batch.cu_seqlens.tolist()
    for i, length in enumerate(lengths):
        tokens = slice(offsets[i], offsets[i + 1])
        alone = replace(
            batch,
            q=batch.q[tokens],
            k=batch.k[tokens],
            v=batch.v[tokens],
            g=batch.g[tokens],
            beta=batch.beta[tokens],
            initial_state=batch.initial_state[i : i + 1],
            cu_seqlens=torch.tensor([0, length], dtype=torch.int32),
        )
        alone_out, alone_final = gdn_recurrence(alone)
        assert torch.equal(out[tokens], alone_out)
        assert torch.equal(final[i], alone_final[0])


def test_value_heads_read_their_own_key_head():
    """Value head i reads key head i // (HV // H): zeroing key head 1 changes heads 2, 3 only."""
    inputs = random_inputs([6], CPU_SHAPE, torch.float32, seed=5)
    out, _ = gdn_recurrence(inputs)
    k = inputs.k.clone()
    k[:, 1] = 0
    changed, _ = gdn_recurrence(replace(inputs, k=k))
    same = (changed - out).abs().amax(dim=(0, 2)) == 0
    assert same.tolist() == [True, True, False, False]
