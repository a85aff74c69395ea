"""Which sequences of a GDN prefill call start from a state an earlier step left: the evidence
that a run exercised the path a chunked prefill's later chunks and a prefix-cache hit take.

vLLM hands the op one state per sequence and zeroes it where the sequence has none
(vllm/model_executor/layers/mamba/, vLLM 0.32-0.33): on CPU, ops/cpu/gdn_attention.py zeroes
the pool slots of the sequences without `has_initial_state` and passes the whole pool with
`initial_state_indices`; on CUDA, gdn/qwen_gdn_linear_attn.py gathers
`ssm_state[prefill_state_indices]` and zeroes the rows without `prefill_has_initial_state`. So
a sequence continues an earlier state exactly when its state is not all zeros. The tally is
one any-nonzero reduction per sequence, made before the op (the CPU op overwrites the pool in
place) and outside the call's timing; on CUDA it stays on the device until the counter reads
it back (kernels/prefill_counter.py), so no call waits for the GPU.
"""

import torch


def state_tally(states: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """[5] int64 on the states' device, kernels.proof.TALLY_FIELDS, for one call: `states`
    [N, ...] the state each sequence starts from, `lengths` [N] its tokens in this call."""
    continued = states.reshape(states.shape[0], -1).any(dim=1).to(torch.int64)
    lengths = lengths.to(torch.int64)
    count = continued.sum()
    return torch.stack(
        [
            (count > 0).to(torch.int64),
            count,
            (continued * lengths).sum(),
            torch.full_like(count, states.shape[0]),
            lengths.sum(),
        ]
    )


def _lengths(cu_seqlens: torch.Tensor) -> torch.Tensor:
    return cu_seqlens[1:] - cu_seqlens[:-1]


def cpu_op_tally(
    initial_state: torch.Tensor, cu_seqlens: torch.Tensor, initial_state_indices: torch.Tensor
) -> torch.Tensor:
    """The tally of a `chunk_gated_delta_rule_cpu` call: the pool's slots at the indices."""
    states = initial_state.index_select(0, initial_state_indices.long())
    return state_tally(states, _lengths(cu_seqlens))


def fla_call_tally(
    q: torch.Tensor, initial_state: torch.Tensor | None, cu_seqlens: torch.Tensor | None
) -> torch.Tensor | None:
    """The tally of an FLA-contract call (states gathered per sequence); None without states."""
    if initial_state is None:
        return None
    if cu_seqlens is None:  # a batch of equal sequences
        lengths = torch.full((q.shape[0],), q.shape[1], device=q.device, dtype=torch.int64)
    else:
        lengths = _lengths(cu_seqlens)
    return state_tally(initial_state, lengths)
