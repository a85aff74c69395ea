"""The Triton nsR kernel on a CUDA GPU: accuracy against the float64 recurrence, the seeds'
correlated-key regression, agreement with the PyTorch nsR and with FLA, and FLA's contract."""

import pytest
import torch

from kernels.accuracy import gdn_error
from kernels.cases import (
    CORRELATED_BOUNDS,
    GPU_SHAPE,
    LONG_BOUNDS,
    RANDOM_BOUNDS,
    correlated_key_inputs,
    random_inputs,
    varlen_lengths,
)
from kernels.check import within_bounds
from kernels.ns_torch import chunk_gdn_ns, unit_lower_inverse
from kernels.recurrence import gdn_recurrence
from kernels.runners import candidate_runner, reference_runner

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.mark.parametrize("num_seqs", [1, 5, 257])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_ns4_matches_recurrence_on_varlen_batches(num_seqs, state_dtype):
    inputs = random_inputs(
        varlen_lengths(num_seqs, seed=num_seqs), GPU_SHAPE, state_dtype, seed=100 + num_seqs
    ).to("cuda")
    error = gdn_error(candidate_runner("ns4", "cuda").run(inputs), gdn_recurrence(inputs))
    assert within_bounds(error, RANDOM_BOUNDS, judge_state=True), error


@pytest.mark.parametrize(
    ("form", "block_v"),
    [("k-first", 16), ("k-first", 32), ("k-first", 64), ("k-first", None), ("v-first", None)],
)
def test_walk_matches_recurrence_at_every_column_block(form, block_v, monkeypatch):
    """Long and short sequences in one batch, slow decay so that the state carries far."""
    from kernels import ns_triton

    monkeypatch.setattr(ns_triton, "WALK_FORM", form)
    monkeypatch.setattr(ns_triton, "WALK_BLOCK_V", block_v)
    lengths = [1000, 1, 300, 2000, 64]
    inputs = random_inputs(
        lengths, GPU_SHAPE, torch.float32, seed=21, log_decay_range=(1e-4, 1e-2)
    ).to("cuda")
    error = gdn_error(candidate_runner("ns4", "cuda").run(inputs), gdn_recurrence(inputs))
    assert within_bounds(error, LONG_BOUNDS, judge_state=True), error


def test_no_host_sync_with_chunk_metadata_and_an_empty_sequence():
    from kernels.ns_triton import chunk_gated_delta_rule, prepare_chunk_indices

    inputs = random_inputs([700, 0, 90], GPU_SHAPE, torch.bfloat16, seed=22).to("cuda")
    chunk_indices = prepare_chunk_indices(inputs.cu_seqlens)
    chunk_offsets = torch.tensor([0, 11, 11, 13], device="cuda", dtype=torch.int32)
    v_first = inputs.initial_state.transpose(-1, -2).contiguous()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out, final = chunk_gated_delta_rule(
            inputs.q.unsqueeze(0), inputs.k.unsqueeze(0), inputs.v.unsqueeze(0),
            inputs.g.unsqueeze(0), inputs.beta.unsqueeze(0), scale=inputs.scale,
            initial_state=v_first, output_final_state=True, cu_seqlens=inputs.cu_seqlens,
            chunk_indices=chunk_indices, chunk_offsets=chunk_offsets,
            use_qk_l2norm_in_kernel=True,
        )  # fmt: skip
    finally:
        torch.cuda.set_sync_debug_mode("default")
    error = gdn_error((out[0], final.transpose(-1, -2)), gdn_recurrence(inputs))
    assert within_bounds(error, RANDOM_BOUNDS, judge_state=True), error
    assert torch.equal(final[1], v_first[1].float())


def test_correlated_keys_break_ns3_and_not_ns4():
    inputs = correlated_key_inputs(GPU_SHAPE).to("cuda")
    truth = gdn_recurrence(inputs)
    ns3 = gdn_error(candidate_runner("ns3", "cuda").run(inputs), truth)
    ns4 = gdn_error(candidate_runner("ns4", "cuda").run(inputs), truth)
    assert ns4.finite and ns4.output.max_abs < 0.1, ns4
    assert within_bounds(ns4, CORRELATED_BOUNDS, judge_state=True), ns4
    assert not within_bounds(ns3, CORRELATED_BOUNDS, judge_state=True), ns3


def test_triton_block_inverse_is_the_pytorch_one():
    """The NS inverse inside the Triton kernel against kernels/ns_torch.py on the same A."""
    import triton
    import triton.language as tl

    from kernels.ns_triton import NEUMANN_PRECISION
    from kernels.ns_triton_device import unit_lower_inverse as triton_unit_lower_inverse

    @triton.jit
    def invert(a_ptr, out_ptr, ROUNDS: tl.constexpr, PRECISION: tl.constexpr):
        r = tl.arange(0, 64)
        offsets = tl.program_id(0) * 64 * 64 + r[:, None] * 64 + r[None, :]
        inverse = triton_unit_lower_inverse(tl.load(a_ptr + offsets), ROUNDS, PRECISION)
        tl.store(out_ptr + offsets, inverse)

    inputs = correlated_key_inputs(GPU_SHAPE)
    keys = inputs.k[:, 0].float()
    strict_lower = torch.tril(0.9 * keys @ keys.T, -1)
    a = torch.stack([strict_lower, strict_lower * 0.5]).cuda().contiguous()
    exact = torch.linalg.inv(torch.eye(64, dtype=torch.float64) + a.double().cpu())
    for rounds in (3, 4):
        out = torch.empty_like(a)
        invert[(a.shape[0],)](a, out, ROUNDS=rounds, PRECISION=NEUMANN_PRECISION)
        reference = unit_lower_inverse(a, rounds)
        scale = reference.abs().max()
        assert (out - reference).abs().max() <= 1e-2 * scale
        error = (out.double().cpu() - exact).abs().max()
        assert (error > 0.5) if rounds == 3 else (error < 0.05), (rounds, error)


def test_triton_agrees_with_pytorch_ns4():
    inputs = random_inputs(varlen_lengths(5, seed=5), GPU_SHAPE, torch.float32, seed=3).to("cuda")
    triton_result = candidate_runner("ns4", "cuda").run(inputs)
    torch_result = chunk_gdn_ns(inputs, 4)
    error = gdn_error(triton_result, torch_result)
    assert error.output.head_rel_l2 < 1e-2 and error.state.head_rel_l2 < 1e-2, error


def test_triton_agrees_with_fla():
    fla = reference_runner("cuda")
    if fla is None:
        pytest.skip("fla-core is not installed")
    inputs = random_inputs(varlen_lengths(5, seed=5), GPU_SHAPE, torch.float32, seed=4).to("cuda")
    truth = gdn_recurrence(inputs)
    assert within_bounds(gdn_error(fla.run(inputs), truth), RANDOM_BOUNDS, judge_state=True)
    error = gdn_error(candidate_runner("ns4", "cuda").run(inputs), fla.run(inputs))
    assert error.output.head_rel_l2 < 1e-2 and error.state.head_rel_l2 < 1e-2, error


def test_fla_contract_options():
    from kernels.ns_triton import chunk_gated_delta_rule, prepare_chunk_indices

    inputs = random_inputs([100, 200], GPU_SHAPE, torch.float32, seed=9).to("cuda")
    args = dict(
        q=inputs.q.unsqueeze(0),
        k=inputs.k.unsqueeze(0),
        v=inputs.v.unsqueeze(0),
        g=inputs.g.unsqueeze(0),
        beta=inputs.beta.unsqueeze(0),
        cu_seqlens=inputs.cu_seqlens,
        use_qk_l2norm_in_kernel=True,
    )
    v_first = inputs.initial_state.transpose(-1, -2).contiguous()
    out, final = chunk_gated_delta_rule(**args, initial_state=v_first, output_final_state=True)
    assert out.shape == inputs.v.unsqueeze(0).shape and out.dtype == inputs.q.dtype
    assert final.shape == v_first.shape and final.dtype == torch.float32

    buffer = torch.full((inputs.num_tokens + 7, *inputs.v.shape[1:]), torch.nan, device="cuda")
    buffer = buffer.to(inputs.v.dtype)
    into, none = chunk_gated_delta_rule(
        **args,
        initial_state=v_first,
        output_final_state=False,
        chunk_indices=prepare_chunk_indices(inputs.cu_seqlens),
        chunk_offsets=torch.tensor([0, 2, 6], device="cuda"),
        core_attn_out=buffer,
    )
    assert none is None
    assert into.data_ptr() == buffer.data_ptr()
    assert torch.equal(into, out)

    zero_out, zero_final = chunk_gated_delta_rule(**args, output_final_state=True)
    zeros = torch.zeros_like(v_first)
    again_out, again_final = chunk_gated_delta_rule(
        **args, initial_state=zeros, output_final_state=True
    )
    assert torch.equal(zero_out, again_out) and torch.equal(zero_final, again_final)

    # equal-length batch without cu_seqlens == the same sequences as varlen
    batch = random_inputs([128, 128], GPU_SHAPE, torch.float32, seed=10).to("cuda")
    batched, batched_final = chunk_gated_delta_rule(
        batch.q.view(2, 128, *batch.q.shape[1:]),
        batch.k.view(2, 128, *batch.k.shape[1:]),
        batch.v.view(2, 128, *batch.v.shape[1:]),
        batch.g.view(2, 128, -1),
        batch.beta.view(2, 128, -1),
        initial_state=batch.initial_state.transpose(-1, -2).contiguous(),
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )
    flat, flat_final = chunk_gated_delta_rule(
        batch.q.unsqueeze(0),
        batch.k.unsqueeze(0),
        batch.v.unsqueeze(0),
        batch.g.unsqueeze(0),
        batch.beta.unsqueeze(0),
        initial_state=batch.initial_state.transpose(-1, -2).contiguous(),
        output_final_state=True,
        cu_seqlens=batch.cu_seqlens,
        use_qk_l2norm_in_kernel=True,
    )
    assert torch.equal(batched.reshape(flat.shape), flat) and torch.equal(batched_final, flat_final)
