"""Ground truth for GDN prefill: the gated delta rule, one token at a time, in float64.

Deliberately shares no code or formula with the chunked kernels: no chunking, no triangular
inverse, no WY form. Per value head, with the state S a K x V matrix:

    S <- exp(g_t) * S
    S <- S + beta_t * k_t (v_t - S^T k_t)^T
    o_t = scale * S^T q_t

Sequences of a varlen batch are advanced together, one position at a time, so a batch of 257
short sequences costs as many steps as its longest member.
"""

import torch

from kernels.gdn_inputs import GdnInputs


def l2_normalise(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(sum(x^2) + eps) over the last dim, as vLLM's CPU op and FLA's l2norm do it."""
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + eps)


def gdn_recurrence(inputs: GdnInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """(output [T, HV, V], final states [N, HV, K, V]), float64, on the inputs' device."""
    q = inputs.q.double()
    k = inputs.k.double()
    if inputs.use_qk_l2norm:
        q = l2_normalise(q, inputs.eps)
        k = l2_normalise(k, inputs.eps)
    v = inputs.v.double()
    g = inputs.g.double()
    beta = inputs.beta.double()
    num_value_heads = v.shape[1]
    group = num_value_heads // q.shape[1]
    q = q.repeat_interleave(group, dim=1)
    k = k.repeat_interleave(group, dim=1)

    starts = inputs.cu_seqlens[:-1].long().cpu()
    lengths = (inputs.cu_seqlens[1:] - inputs.cu_seqlens[:-1]).long().cpu()
    state = inputs.initial_state.double().clone()
    out = torch.zeros_like(v)
    for position in range(int(lengths.max().item()) if lengths.numel() else 0):
        active = torch.nonzero(lengths > position).flatten()
        tokens = (starts[active] + position).to(q.device)
        active = active.to(q.device)
        s = state[active] * torch.exp(g[tokens])[:, :, None, None]
        k_t = k[tokens]
        predicted = torch.einsum("nhk,nhkv->nhv", k_t, s)
        delta = (v[tokens] - predicted) * beta[tokens][:, :, None]
        s = s + torch.einsum("nhk,nhv->nhkv", k_t, delta)
        out[tokens] = inputs.scale * torch.einsum("nhk,nhkv->nhv", q[tokens], s)
        state[active] = s
    return out, state
