"""The inputs of one GDN prefill call, in one layout shared by every implementation here.

vLLM's CPU op and FLA's kernel take the same tensors in different wrappings (batch dim of 1,
a state pool with indices vs gathered states, K-first vs V-first state layout). Each adapter
converts to this record once, so kernels, the float64 recurrence, capture files and replay
all agree on what a tensor means.
"""

from dataclasses import dataclass, replace

import torch


@dataclass(frozen=True)
class GdnInputs:
    """One varlen GDN prefill batch.

    q, k: [T, H, K]; v: [T, HV, V] with HV a multiple of H (value head i reads key head
    i // (HV // H)); g: [T, HV] log decay; beta: [T, HV]; initial_state: [N, HV, K, V], one state
    per sequence, K-first (S^T k predicts v); cu_seqlens: [N + 1] token offsets.
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    initial_state: torch.Tensor
    cu_seqlens: torch.Tensor
    use_qk_l2norm: bool
    eps: float
    scale: float

    @property
    def num_tokens(self) -> int:
        return self.q.shape[0]

    @property
    def num_seqs(self) -> int:
        return self.cu_seqlens.numel() - 1

    @property
    def num_value_heads(self) -> int:
        return self.v.shape[1]

    def to(self, device: torch.device | str) -> "GdnInputs":
        return replace(
            self,
            q=self.q.to(device),
            k=self.k.to(device),
            v=self.v.to(device),
            g=self.g.to(device),
            beta=self.beta.to(device),
            initial_state=self.initial_state.to(device),
            cu_seqlens=self.cu_seqlens.to(device),
        )

    def with_state_dtype(self, dtype: torch.dtype) -> "GdnInputs":
        return replace(self, initial_state=self.initial_state.to(dtype))


def default_scale(head_k_dim: int) -> float:
    return head_k_dim**-0.5
