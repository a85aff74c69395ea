"""The PyTorch nsR kernel: its block inverse, its accuracy, and vLLM's CPU op contract."""

import pytest
import torch

from kernels.accuracy import gdn_error
from kernels.cases import (
    CORRELATED_BOUNDS,
    CPU_SHAPE,
    RANDOM_BOUNDS,
    correlated_key_inputs,
    random_inputs,
)
from kernels.check import within_bounds
from kernels.ns_torch import (
    NsCpuOp,
    chunk_gated_delta_rule,
    chunk_gdn_ns,
    ns_block_inverse,
    unit_lower_inverse,
)
from kernels.recurrence import gdn_recurrence
from kernels.runners import run_cpu_op


def correlated_strict_lower(beta: float = 0.9) -> torch.Tensor:
    keys = correlated_key_inputs(CPU_SHAPE).k[:, 0].float()
    return torch.tril(beta * keys @ keys.T, -1)


def test_ns_block_inverse_converges_with_rounds():
    block = correlated_strict_lower()[:16, :16]
    exact = torch.linalg.inv(torch.eye(16, dtype=torch.float64) + block.double())
    errors = [(ns_block_inverse(block, r).double() - exact).abs().max() for r in (2, 3, 4)]
    assert errors[0] > errors[1] > errors[2]
    assert errors[1] > 0.5  # 3 BF16 rounds: exact in theory, far off in BF16
    assert errors[2] < 0.05


def test_unit_lower_inverse_inverts_64x64():
    strict_lower = torch.tril(
        0.1 * torch.randn(3, 64, 64, generator=torch.Generator().manual_seed(0)), -1
    )
    inverse = unit_lower_inverse(strict_lower, 4)
    identity = inverse @ (torch.eye(64) + strict_lower)
    assert (identity - torch.eye(64)).abs().max() < 2e-2
    assert torch.equal(inverse.triu(1), torch.zeros_like(inverse))


@pytest.mark.parametrize("lengths", [[1000], [1, 63, 64, 65, 0, 130], [5] * 40])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_ns4_matches_recurrence(lengths, state_dtype):
    inputs = random_inputs(lengths, CPU_SHAPE, state_dtype, seed=len(lengths))
    error = gdn_error(chunk_gdn_ns(inputs, 4), gdn_recurrence(inputs))
    assert within_bounds(error, RANDOM_BOUNDS, judge_state=True), error


def test_correlated_keys_break_ns3_not_ns4():
    inputs = correlated_key_inputs(CPU_SHAPE)
    truth = gdn_recurrence(inputs)
    ns3 = gdn_error(chunk_gdn_ns(inputs, 3), truth)
    ns4 = gdn_error(chunk_gdn_ns(inputs, 4), truth)
    assert ns3.output.max_abs > 0.1 and not within_bounds(ns3, CORRELATED_BOUNDS, True)
    assert ns4.output.max_abs < 0.1 and within_bounds(ns4, CORRELATED_BOUNDS, True)


def cpu_op_args(inputs, pool, indices, **overrides):
    args = dict(
        query=inputs.q.unsqueeze(0),
        key=inputs.k.unsqueeze(0),
        value=inputs.v.unsqueeze(0),
        g=inputs.g.unsqueeze(0),
        beta=inputs.beta.unsqueeze(0),
        initial_state=pool,
        output_final_state=True,
        cu_seqlens=inputs.cu_seqlens,
        head_first=False,
        use_qk_l2norm_in_kernel=True,
        initial_state_indices=indices,
    )
    return args | overrides


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_cpu_op_updates_only_the_indexed_slots_in_place(state_dtype):
    inputs = random_inputs([70, 3], CPU_SHAPE, state_dtype, seed=8)
    pool = torch.randn(4, *inputs.initial_state.shape[1:]).to(state_dtype)
    indices = torch.tensor([3, 1], dtype=torch.int32)
    pool[indices.long()] = inputs.initial_state
    before = pool.clone()
    out, returned = NsCpuOp(4)(**cpu_op_args(inputs, pool, indices, output_final_state=False))
    assert returned is pool and pool.dtype == state_dtype
    assert out.shape == (1, 73, CPU_SHAPE.value_heads, CPU_SHAPE.head_dim)
    assert out.dtype == inputs.q.dtype
    assert torch.equal(pool[[0, 2]], before[[0, 2]])
    expected_out, expected_final = chunk_gdn_ns(inputs, 4)
    tolerance = 1e-5 if state_dtype == torch.float32 else 1e-2
    assert torch.allclose(pool[indices.long()].float(), expected_final, atol=tolerance)
    assert torch.allclose(out[0].float(), expected_out, atol=1e-2)


def test_cpu_op_agrees_with_vllms_op():
    ops = pytest.importorskip("vllm._custom_ops")
    inputs = random_inputs([200, 17, 64], CPU_SHAPE, torch.float32, seed=9)
    ours = run_cpu_op(NsCpuOp(4), inputs)
    theirs = run_cpu_op(ops.chunk_gated_delta_rule_cpu, inputs)
    assert ours[0].shape == theirs[0].shape and ours[0].dtype == theirs[0].dtype
    error = gdn_error(ours, theirs)
    assert error.output.head_rel_l2 < 1e-2 and error.state.head_rel_l2 < 1e-2, error


@pytest.mark.parametrize(
    "overrides",
    [
        {"head_first": True},
        {"g": "bf16"},
        {"beta": "fp32"},
        {"cu_seqlens": "int64"},
        {"initial_state": "fp64"},
    ],
)
def test_cpu_op_rejects_what_vllms_op_rejects(overrides):
    ops = pytest.importorskip("vllm._custom_ops")
    inputs = random_inputs([10], CPU_SHAPE, torch.float32, seed=10)
    pool = torch.zeros(2, *inputs.initial_state.shape[1:])
    args = cpu_op_args(inputs, pool, torch.tensor([1], dtype=torch.int32))
    changes = {
        "bf16": lambda t: t.bfloat16(),
        "fp32": lambda t: t.float(),
        "int64": lambda t: t.long(),
        "fp64": lambda t: t.double(),
    }
    for name, change in overrides.items():
        args[name] = change if isinstance(change, bool) else changes[change](args[name])
    with pytest.raises(RuntimeError):
        ops.chunk_gated_delta_rule_cpu(**args)
    with pytest.raises(RuntimeError):
        NsCpuOp(4)(**args)


def test_fla_contract_uses_v_first_states_and_fills_core_attn_out():
    inputs = random_inputs([50, 80], CPU_SHAPE, torch.float32, seed=11)
    expected_out, expected_final = chunk_gdn_ns(inputs, 4)
    buffer = torch.full((140, *inputs.v.shape[1:]), torch.nan).to(inputs.v.dtype)
    out, final = chunk_gated_delta_rule(
        inputs.q.unsqueeze(0),
        inputs.k.unsqueeze(0),
        inputs.v.unsqueeze(0),
        inputs.g.unsqueeze(0),
        inputs.beta.unsqueeze(0),
        initial_state=inputs.initial_state.transpose(-1, -2).contiguous(),
        output_final_state=True,
        cu_seqlens=inputs.cu_seqlens,
        use_qk_l2norm_in_kernel=True,
        core_attn_out=buffer,
        l2norm_eps=inputs.eps,
    )
    assert out.data_ptr() == buffer.data_ptr()
    assert torch.equal(out[0], expected_out.to(out.dtype))
    assert buffer[130:].isnan().all()
    assert torch.equal(final, expected_final.transpose(-1, -2))
