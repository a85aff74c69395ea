"""The nsR chunked GDN prefill in PyTorch: what vLLM's CPU build runs when a candidate is chosen.

Chunk size 64. Within a chunk, with G the cumulative log decay, the delta rule's WY form needs
the inverse of the unit lower-triangular matrix

    A = I + strictly_lower(beta_i * k_i.k_j * exp(G_i - G_j)).

Its four 16x16 diagonal blocks are inverted by R Newton-Schulz rounds from X0 = I - L with
every intermediate rounded to BF16 (BF16 operands, FP32 accumulation), the numerics of the
GPU kernel from the seeds whose 3 rounds broke a model on correlated keys and 4 fixed it. In
exact arithmetic 3 rounds are exact for 16x16 (the residual is L^(2^(R+1))); in BF16 they are
not. Everything else (block merge, WY form, the state recurrence across chunks) is FP32, so the
round count is the only thing that separates ns3 from ns4.

Work is batched across every chunk of every sequence and every head; only the recurrence is a
loop, over the chunk position, with all sequences that have a chunk there advanced together.
"""

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from kernels.gdn_inputs import GdnInputs

CHUNK = 64
BLOCK = 16


def round_bf16(x: torch.Tensor) -> torch.Tensor:
    """Round an FP32 tensor to BF16 and back: products of two such values are exact in FP32."""
    return x.to(torch.bfloat16).to(x.dtype)


def ns_block_inverse(strict_lower: torch.Tensor, rounds: int) -> torch.Tensor:
    """Inverse of I + L for [..., 16, 16] strictly lower L by `rounds` BF16 Newton-Schulz rounds."""
    eye = torch.eye(strict_lower.shape[-1], dtype=torch.float32, device=strict_lower.device)
    m = round_bf16(eye + strict_lower)
    x = round_bf16(eye - strict_lower)
    for _ in range(rounds):
        product = round_bf16(m @ x)
        x = round_bf16(x @ round_bf16(2 * eye - product))
    return x


def unit_lower_inverse(strict_lower: torch.Tensor, rounds: int) -> torch.Tensor:
    """Inverse of I + L for [..., 64, 64] strictly lower L.

    The 16x16 diagonal blocks D are inverted by NS; with N the strictly block-lower rest,
    (D + N)^-1 = (I + Z)^-1 D^-1 where Z = D^-1 N is nilpotent (Z^4 = 0 for four blocks), so
    the Neumann series I - Z + Z^2 - Z^3, summed in FP32, merges the blocks exactly.
    """
    size = strict_lower.shape[-1]
    num_blocks = size // BLOCK
    block_of = torch.arange(size, device=strict_lower.device) // BLOCK
    same_block = block_of[:, None] == block_of[None, :]
    spans = [slice(i * BLOCK, (i + 1) * BLOCK) for i in range(num_blocks)]
    diagonal = torch.stack([strict_lower[..., s, s] for s in spans], dim=-3)
    diagonal_inverse = ns_block_inverse(diagonal, rounds)
    block_inverse = torch.zeros_like(strict_lower)
    for i, s in enumerate(spans):
        block_inverse[..., s, s] = diagonal_inverse[..., i, :, :]
    eye = torch.eye(size, dtype=strict_lower.dtype, device=strict_lower.device)
    z = block_inverse @ torch.where(same_block, 0.0, strict_lower)
    series = eye - z
    for _ in range(num_blocks - 2):
        series = eye - z @ series
    return series @ block_inverse


@dataclass(frozen=True)
class ChunkLayout:
    """Where each token sits once sequences are cut into 64-token chunks.

    Chunks are numbered step-major over sequences sorted by chunk count (longest first), so
    the sequences that have a chunk at step s are a prefix of that order and their chunks a
    contiguous range: the recurrence then works on slices, never on gathered copies.
    """

    num_chunks: int
    order: torch.Tensor  # sequences, longest first
    active: list[int]  # sequences with a chunk at each step
    first: list[int]  # first chunk of each step
    slot_of_token: torch.Tensor  # [T]: chunk * 64 + row


def chunk_layout(cu_seqlens: torch.Tensor, device: torch.device) -> ChunkLayout:
    cu = cu_seqlens.long().cpu()
    lengths = cu[1:] - cu[:-1]
    chunks_per_seq = (lengths + CHUNK - 1) // CHUNK
    order = torch.argsort(chunks_per_seq, descending=True, stable=True)
    steps = int(chunks_per_seq.max()) if len(lengths) else 0
    active = [int((chunks_per_seq > step).sum()) for step in range(steps)]
    first = [sum(active[:step]) for step in range(steps)]
    num_chunks = int(chunks_per_seq.sum())
    step_of_chunk = torch.repeat_interleave(torch.arange(steps), torch.tensor(active, dtype=int))
    seq_of_chunk = order[torch.arange(num_chunks) - torch.tensor(first, dtype=int)[step_of_chunk]]
    token_of_slot = (
        cu[seq_of_chunk][:, None] + step_of_chunk[:, None] * CHUNK + torch.arange(CHUNK)[None, :]
    ).flatten()
    valid = token_of_slot < cu[seq_of_chunk + 1].repeat_interleave(CHUNK)
    slot_of_token = torch.empty(int(cu[-1]), dtype=torch.long)
    slot_of_token[token_of_slot[valid]] = torch.nonzero(valid).flatten()
    return ChunkLayout(num_chunks, order.to(device), active, first, slot_of_token.to(device))


def chunk_gdn_ns(inputs: GdnInputs, ns_rounds: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (output [T, HV, V], final states [N, HV, K, V]), both FP32."""
    device = inputs.q.device
    layout = chunk_layout(inputs.cu_seqlens, device)
    num_value_heads = inputs.v.shape[1]
    group = num_value_heads // inputs.q.shape[1]

    def chunked(x: torch.Tensor) -> torch.Tensor:
        """[T, heads, ...] -> FP32 [chunks, heads, 64, ...], zero rows past a sequence's end."""
        slots = x.new_zeros((layout.num_chunks * CHUNK, *x.shape[1:]), dtype=torch.float32)
        slots.index_copy_(0, layout.slot_of_token, x.float())
        return slots.unflatten(0, (layout.num_chunks, CHUNK)).transpose(1, 2).contiguous()

    qc, kc = chunked(inputs.q), chunked(inputs.k)
    if inputs.use_qk_l2norm:
        qc = qc * torch.rsqrt((qc * qc).sum(-1, keepdim=True) + inputs.eps)
        kc = kc * torch.rsqrt((kc * kc).sum(-1, keepdim=True) + inputs.eps)
    qc = qc.repeat_interleave(group, dim=1)
    kc = kc.repeat_interleave(group, dim=1)
    vc = chunked(inputs.v)
    beta = chunked(inputs.beta)
    cum_decay = torch.cumsum(chunked(inputs.g), dim=-1)

    rows = torch.arange(CHUNK, device=device)
    causal = rows[:, None] >= rows[None, :]
    strictly_causal = rows[:, None] > rows[None, :]
    log_decay = cum_decay[..., :, None] - cum_decay[..., None, :]
    decay = torch.exp(torch.where(causal, log_decay, -torch.inf))
    key_products = kc @ kc.transpose(-1, -2)
    strict_lower = torch.where(strictly_causal, key_products * decay, 0.0) * beta[..., :, None]
    inverse = unit_lower_inverse(strict_lower, ns_rounds)

    w = inverse @ (kc * (beta * torch.exp(cum_decay))[..., None])
    u = inverse @ (vc * beta[..., None])
    decayed_queries = qc * (torch.exp(cum_decay) * inputs.scale)[..., None]
    intra_chunk = (qc @ kc.transpose(-1, -2)) * decay * inputs.scale
    last_decay = cum_decay[..., -1:]
    keys_to_end = (kc * torch.exp(last_decay - cum_decay)[..., None]).transpose(-1, -2)
    chunk_decay = torch.exp(last_decay)[..., None]

    # The sequential part: each chunk's starting state and v_new; the output after, batched.
    state = inputs.initial_state.float()[layout.order]
    chunk_states = state.new_empty((layout.num_chunks, *state.shape[1:]))
    v_new = torch.empty_like(u)
    for active, first in zip(layout.active, layout.first, strict=True):
        chunk = slice(first, first + active)
        h = state[:active]
        chunk_states[chunk] = h
        v_new[chunk] = u[chunk] - w[chunk] @ h
        state[:active] = chunk_decay[chunk] * h + keys_to_end[chunk] @ v_new[chunk]
    final_state = torch.empty_like(state)
    final_state[layout.order] = state
    out_chunks = decayed_queries @ chunk_states + intra_chunk @ v_new
    out = out_chunks.transpose(1, 2).flatten(0, 1)
    return out.index_select(0, layout.slot_of_token), final_state


class NsCpuOp:
    """Drop-in for `vllm._custom_ops.chunk_gated_delta_rule_cpu` running nsR.

    Same contract as vLLM 0.32's op: query/key [1, T, H, K], value [1, T, HV, V], beta in the
    activations' dtype, g [1, T, HV] float32, cu_seqlens and initial_state_indices int32; the
    state pool [slots, HV, K, V] (fp16/bf16/fp32) is read at and written back to
    initial_state_indices in place, whatever output_final_state says; returns (output
    [1, T, HV, V] in the activations' dtype, the pool itself). `initial_state_fault`: a fault
    planted on the gathered states before the kernel reads them (kernels/registry.py).
    """

    def __init__(
        self,
        ns_rounds: int,
        initial_state_fault: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        self.ns_rounds = ns_rounds
        self.initial_state_fault = initial_state_fault

    def __call__(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        initial_state: torch.Tensor,
        output_final_state: bool,
        cu_seqlens: torch.Tensor,
        head_first: bool,
        use_qk_l2norm_in_kernel: bool,
        initial_state_indices: torch.Tensor,
        eps: float = 1e-5,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        inputs = cpu_op_inputs(
            query,
            key,
            value,
            g,
            beta,
            initial_state,
            cu_seqlens,
            head_first,
            use_qk_l2norm_in_kernel,
            initial_state_indices,
            eps,
        )
        if self.initial_state_fault is not None:
            inputs = replace(inputs, initial_state=self.initial_state_fault(inputs.initial_state))
        out, final_state = chunk_gdn_ns(inputs, self.ns_rounds)
        initial_state[initial_state_indices.long()] = final_state.to(initial_state.dtype)
        return out.to(query.dtype).unsqueeze(0), initial_state


def cpu_op_inputs(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor,
    cu_seqlens: torch.Tensor,
    head_first: bool,
    use_qk_l2norm_in_kernel: bool,
    initial_state_indices: torch.Tensor,
    eps: float,
) -> GdnInputs:
    """Validate arguments as vLLM's CPU op does and gather the per-sequence initial states."""
    if head_first:
        raise RuntimeError("chunk_gated_delta_rule_cpu: does not support head first")
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        raise RuntimeError("chunk_gated_delta_rule_cpu: query/key/value must be [1, T, heads, dim]")
    activation_dtypes = {query.dtype, key.dtype, value.dtype, beta.dtype}
    index_dtypes = {cu_seqlens.dtype, initial_state_indices.dtype}
    if len(activation_dtypes) != 1 or g.dtype != torch.float32 or index_dtypes != {torch.int32}:
        raise RuntimeError("Input tensor dtype mismatch")
    if initial_state.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise RuntimeError(
            "chunk_gated_delta_rule_cpu: initial_state dtype must be float16, bfloat16, or float32"
        )
    return GdnInputs(
        q=query[0],
        k=key[0],
        v=value[0],
        g=g.reshape(value.shape[1], value.shape[2]),
        beta=beta.reshape(value.shape[1], value.shape[2]),
        initial_state=initial_state[initial_state_indices.long()],
        cu_seqlens=cu_seqlens,
        use_qk_l2norm=use_qk_l2norm_in_kernel,
        eps=eps,
        scale=query.shape[-1] ** -0.5,
    )


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    chunk_indices: torch.Tensor | None = None,
    chunk_offsets: torch.Tensor | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    core_attn_out: torch.Tensor | None = None,
    *,
    ns_rounds: int = 4,
    l2norm_eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """nsR behind vLLM's FLA contract (V-first states [N, HV, V, K], FP32 final state), for
    tensors that are not on a GPU; kernels/ns_triton.py has the same signature for CUDA."""
    batch, seq_len, num_heads, head_k_dim = q.shape
    num_value_heads, head_v_dim = v.shape[2], v.shape[3]
    if cu_seqlens is None:
        cu_seqlens = torch.arange(0, batch + 1, dtype=torch.int32) * seq_len
    num_seqs = cu_seqlens.numel() - 1
    num_tokens = batch * seq_len
    if initial_state is None:
        states = torch.zeros(num_seqs, num_value_heads, head_k_dim, head_v_dim)
    else:
        states = initial_state.transpose(-1, -2)
    inputs = GdnInputs(
        q=q.reshape(num_tokens, num_heads, head_k_dim),
        k=k.reshape(num_tokens, num_heads, head_k_dim),
        v=v.reshape(num_tokens, num_value_heads, head_v_dim),
        g=g.reshape(num_tokens, num_value_heads),
        beta=beta.reshape(num_tokens, num_value_heads),
        initial_state=states,
        cu_seqlens=cu_seqlens,
        use_qk_l2norm=use_qk_l2norm_in_kernel,
        eps=l2norm_eps,
        scale=head_k_dim**-0.5 if scale is None else scale,
    )
    out, final_state = chunk_gdn_ns(inputs, ns_rounds)
    out = out.to(v.dtype).view(batch, seq_len, num_value_heads, head_v_dim)
    if core_attn_out is not None:
        core_attn_out.reshape(-1)[: out.numel()].copy_(out.reshape(-1))
        out = core_attn_out.reshape(-1)[: out.numel()].view(out.shape)
    final = final_state.transpose(-1, -2).contiguous() if output_final_state else None
    return out.to(q.dtype), final
