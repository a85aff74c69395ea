"""Run any GDN prefill implementation on a GdnInputs through the contract vLLM uses for it.

Candidates go through the same adapter that vLLM calls (the CPU op's state pool updated in
place, or FLA's contract with V-first states), so a check exercises the plugin's code path and
not a shortcut. Every runner returns (output [T, HV, V], final states [N, HV, K, V]).
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch

from kernels.functions import run_fla_contract
from kernels.gdn_inputs import GdnInputs
from kernels.recurrence import gdn_recurrence
from kernels.registry import resolve_kernel

GdnResult = tuple[torch.Tensor, torch.Tensor]
CpuOp = Callable[..., tuple[torch.Tensor, torch.Tensor]]

RECURRENCE = "recurrence-fp64"
VLLM_CPU_REFERENCE = "vllm-cpu-native"
FLA_REFERENCE = "fla"


@dataclass(frozen=True)
class KernelRunner:
    name: str
    run: Callable[[GdnInputs], GdnResult]


def run_cpu_op(op: CpuOp, inputs: GdnInputs) -> GdnResult:
    """Call a `chunk_gated_delta_rule_cpu`-shaped op with a state pool in which the sequences'
    slots are shuffled and interleaved with an untouched slot, as vLLM's cache would be."""
    num_seqs = inputs.num_seqs
    slots = torch.randperm(num_seqs + 1, generator=torch.Generator().manual_seed(num_seqs))
    indices = slots[:num_seqs].to(torch.int32)
    pool = torch.zeros(
        num_seqs + 1, *inputs.initial_state.shape[1:], dtype=inputs.initial_state.dtype
    )
    pool[indices.long()] = inputs.initial_state
    num_tokens, num_value_heads = inputs.g.shape
    out, returned_pool = op(
        inputs.q.unsqueeze(0),
        inputs.k.unsqueeze(0),
        inputs.v.unsqueeze(0),
        inputs.g.reshape(1, num_tokens, num_value_heads),
        inputs.beta.reshape(1, num_tokens, num_value_heads),
        pool,
        True,
        inputs.cu_seqlens.to(torch.int32),
        False,
        inputs.use_qk_l2norm,
        indices,
        inputs.eps,
    )
    if returned_pool is not pool:
        raise RuntimeError("the op must return the state pool it updated in place")
    return out[0], pool[indices.long()]


def candidate_runner(kernel_name: str, device: str) -> KernelRunner:
    """The candidate `kernel_name` (e.g. "ns4", or a user's `module:function`) as vLLM's CPU
    build or CUDA path would call it."""
    spec = resolve_kernel(kernel_name)
    if device == "cpu":
        op = spec.cpu_op()
        return KernelRunner(spec.name, lambda inputs: run_cpu_op(op, inputs))
    function = spec.fla_contract_function()
    return KernelRunner(spec.name, lambda inputs: run_fla_contract(function, inputs))


def reference_runner(device: str) -> KernelRunner | None:
    """vLLM's CPU op on CPU, FLA (fla-core) on CUDA; None when it is not installed here."""
    if device == "cpu":
        try:
            from vllm import _custom_ops
        except ImportError:
            return None
        return KernelRunner(
            VLLM_CPU_REFERENCE,
            lambda inputs: run_cpu_op(_custom_ops.chunk_gated_delta_rule_cpu, inputs),
        )
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_chunk
    except ImportError:
        return None

    def run_fla(inputs: GdnInputs) -> GdnResult:
        out, final_state = fla_chunk(
            q=inputs.q.unsqueeze(0),
            k=inputs.k.unsqueeze(0),
            v=inputs.v.unsqueeze(0),
            g=inputs.g.unsqueeze(0),
            beta=inputs.beta.unsqueeze(0),
            scale=inputs.scale,
            initial_state=inputs.initial_state.float(),
            output_final_state=True,
            cu_seqlens=inputs.cu_seqlens.long(),
            use_qk_l2norm_in_kernel=inputs.use_qk_l2norm,
        )
        return out[0], final_state

    return KernelRunner(FLA_REFERENCE, run_fla)


def recurrence_runner() -> KernelRunner:
    return KernelRunner(RECURRENCE, gdn_recurrence)
