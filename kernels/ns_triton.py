"""The nsR chunked GDN prefill in Triton for NVIDIA GPUs, behind FLA's calling contract.

`chunk_gated_delta_rule` takes what vLLM's CUDA path passes to FLA's `chunk_gated_delta_rule`
(q/k [B, T, H, K], v [B, T, HV, V], g and beta [B, T, HV], states [N, HV, V, K] V-first as
vLLM keeps them, cu_seqlens, precomputed chunk_indices, optional core_attn_out) and returns
(o [B, T, HV, V], final state [N, HV, V, K] float32 or None).

Stages (`Launch.run_wy`, `run_state`, `run_output`), none of which syncs with the host:
  1. `_wy_kernel`, one program per (chunk, value head): chunk-local cumulative decay, the
     within-chunk A, its unit lower-triangular inverse (BF16 Newton-Schulz on the 16x16
     diagonal blocks, then a Neumann series over the off-diagonal blocks, exact after 3 terms
     because they are strictly block-lower), and the WY vectors w, u.
  2. The state walk h <- exp(G_last) h + k~^T (u - w h), cut into segments of S consecutive
     chunks of the batch's chunk list (S ~ sqrt(chunks), `segment_chunks`), so that its
     sequential path is ~2 S + chunks / S steps instead of chunks:
     `_transition_kernel` (segments in parallel): each segment's affine map h -> P h + b,
     walking [I | 0] as a [K, K + V] state; `_carry_kernel` (sequences in parallel): the
     state at each segment start, h <- P h + b in FP32; `_segment_walk_kernel` (segments in
     parallel): the walk from those states, storing each chunk's starting state (BF16) and
     v_new, and the final states. With one segment (short inputs) the walk is the plain
     sequential one and the carry kernel only gives sequences without tokens their state.
  3. `_output_kernel`, one program per (chunk, value head): the output, fully parallel.
(Doing the walk and the output in one pass moved fewer bytes but lengthened the sequential
path: 1.2-1.3x slower at 8K-16K tokens on an H200.)
Same numerics as kernels/ns_torch.py for the inverse; dots elsewhere take BF16 operands with
FP32 accumulation, as FLA's do; the segment maps P are walked like states (BF16 operands, FP32
state) and applied in FP32 (tf32x3).
"""

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

CHUNK = 64
# Launch settings; kernels/bench.py times the alternatives.
WY_NUM_WARPS = 4
WALK_NUM_WARPS = 4
CARRY_NUM_WARPS = 8
OUTPUT_NUM_WARPS = 4
WALK_STAGES = 2
BLOCK_V = 64  # state columns per program of the walk (fewer: more re-reads of k and w)
SEGMENT_CHUNKS = None  # chunks per segment of the walk; None: by size (segment_chunks)


@triton.jit
def _unit_lower_inverse(strict_lower, NS_ROUNDS: tl.constexpr):
    """Inverse of I + A for a 64x64 strictly lower A held in registers (FP32 in, FP32 out).

    Newton-Schulz on the block-diagonal part runs on the whole 64x64 tile: products of
    block-diagonal matrices stay block-diagonal, so this is the per-16x16-block iteration.
    """
    r = tl.arange(0, 64)
    eye = tl.where(r[:, None] == r[None, :], 1.0, 0.0)
    same_block = (r[:, None] // 16) == (r[None, :] // 16)
    within = tl.where(same_block, strict_lower, 0.0)
    across = tl.where(same_block, 0.0, strict_lower)
    m = (eye + within).to(tl.bfloat16)
    x = (eye - within).to(tl.bfloat16)
    for _ in tl.static_range(NS_ROUNDS):
        product = tl.dot(m, x).to(tl.bfloat16)
        x = tl.dot(x, (2.0 * eye - product.to(tl.float32)).to(tl.bfloat16)).to(tl.bfloat16)
    block_inverse = x.to(tl.float32)
    z = tl.dot(block_inverse, across, input_precision="tf32x3")
    series = eye - z
    series = eye - tl.dot(z, series, input_precision="tf32x3")
    series = eye - tl.dot(z, series, input_precision="tf32x3")
    return tl.dot(series, block_inverse, input_precision="tf32x3")


@triton.jit
def _load_rows(ptr, rows, valid, head, NUM_HEADS: tl.constexpr, DIM: tl.constexpr):
    """Rows [64, DIM] of token-major [T, NUM_HEADS, DIM] for one head, FP32, zero-padded."""
    cols = tl.arange(0, DIM)
    offsets = (rows[:, None] * NUM_HEADS + head) * DIM + cols[None, :]
    return tl.load(ptr + offsets, mask=valid[:, None], other=0.0).to(tl.float32)


@triton.jit
def _l2_normalise(x, eps):
    return x * tl.rsqrt(tl.sum(x * x, axis=1) + eps)[:, None]


@triton.jit
def _wy_kernel(
    k_ptr,
    v_ptr,
    g_ptr,
    beta_ptr,
    cum_decay_ptr,
    w_ptr,
    u_ptr,
    cu_seqlens_ptr,
    chunk_indices_ptr,
    eps,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    NS_ROUNDS: tl.constexpr,
    USE_L2NORM: tl.constexpr,
):
    chunk = tl.program_id(0)
    value_head = tl.program_id(1)
    key_head = value_head // (HV // H)
    seq = tl.load(chunk_indices_ptr + 2 * chunk).to(tl.int64)
    chunk_in_seq = tl.load(chunk_indices_ptr + 2 * chunk + 1).to(tl.int64)
    bos = tl.load(cu_seqlens_ptr + seq).to(tl.int64)
    eos = tl.load(cu_seqlens_ptr + seq + 1).to(tl.int64)
    r = tl.arange(0, 64)
    rows = bos + chunk_in_seq * 64 + r
    valid = rows < eos

    keys = _load_rows(k_ptr, rows, valid, key_head, H, K)
    if USE_L2NORM:
        keys = _l2_normalise(keys, eps)
    keys = keys.to(tl.bfloat16).to(tl.float32)
    values = _load_rows(v_ptr, rows, valid, value_head, HV, V)
    g = tl.load(g_ptr + rows * HV + value_head, mask=valid, other=0.0).to(tl.float32)
    beta = tl.load(beta_ptr + rows * HV + value_head, mask=valid, other=0.0).to(tl.float32)
    cum_decay = tl.cumsum(g, axis=0)
    tl.store(cum_decay_ptr + rows * HV + value_head, cum_decay, mask=valid)

    strictly_causal = r[:, None] > r[None, :]
    log_decay = tl.where(strictly_causal, cum_decay[:, None] - cum_decay[None, :], 0.0)
    key_products = tl.dot(keys.to(tl.bfloat16), tl.trans(keys.to(tl.bfloat16)))
    strict_lower = tl.where(strictly_causal, key_products * tl.exp(log_decay), 0.0)
    inverse = _unit_lower_inverse(strict_lower * beta[:, None], NS_ROUNDS).to(tl.bfloat16)

    w = tl.dot(inverse, (keys * (beta * tl.exp(cum_decay))[:, None]).to(tl.bfloat16))
    u = tl.dot(inverse, (values * beta[:, None]).to(tl.bfloat16))
    cols_k = tl.arange(0, K)
    cols_v = tl.arange(0, V)
    w_offsets = (rows[:, None] * HV + value_head) * K + cols_k[None, :]
    u_offsets = (rows[:, None] * HV + value_head) * V + cols_v[None, :]
    tl.store(w_ptr + w_offsets, w.to(tl.bfloat16), mask=valid[:, None])
    tl.store(u_ptr + u_offsets, u.to(tl.bfloat16), mask=valid[:, None])


@triton.jit
def _chunk_of(chunk_indices_ptr, cu_seqlens_ptr, chunk):
    """(sequence, first token, end of the sequence, is the sequence's first chunk) of a chunk."""
    seq = tl.load(chunk_indices_ptr + 2 * chunk).to(tl.int64)
    chunk_in_seq = tl.load(chunk_indices_ptr + 2 * chunk + 1).to(tl.int64)
    bos = tl.load(cu_seqlens_ptr + seq).to(tl.int64)
    eos = tl.load(cu_seqlens_ptr + seq + 1).to(tl.int64)
    return seq, bos + chunk_in_seq * 64, eos, chunk_in_seq == 0


@triton.jit
def _state_step(
    state,
    k_ptr,
    w_ptr,
    u_ptr,
    cum_decay_ptr,
    start,
    eos,
    key_head,
    value_head,
    u_cols,
    u_used,
    eps,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    USE_L2NORM: tl.constexpr,
):
    """One chunk of the recurrence on state columns [K, BV]: v_new = u - w h,
    h <- exp(G_last) h + (k exp(G_last - G))^T v_new. u_used masks columns whose u is zero.
    Returns (new state FP32, the state the chunk started from in BF16, v_new BF16)."""
    r = tl.arange(0, 64)
    rows = start + r
    valid = rows < eos
    last_decay = tl.load(cum_decay_ptr + tl.minimum(start + 63, eos - 1) * HV + value_head)
    cum_decay = tl.load(cum_decay_ptr + rows * HV + value_head, mask=valid, other=0.0)
    cum_decay = tl.where(valid, cum_decay, last_decay)
    keys = _load_rows(k_ptr, rows, valid, key_head, H, K)
    if USE_L2NORM:
        keys = _l2_normalise(keys, eps)
    keys = keys.to(tl.bfloat16).to(tl.float32)
    w = _load_rows(w_ptr, rows, valid, value_head, HV, K).to(tl.bfloat16)
    u_offsets = (rows[:, None] * HV + value_head) * V + u_cols[None, :]
    u = tl.load(u_ptr + u_offsets, mask=valid[:, None] & u_used[None, :], other=0.0)

    state_bf16 = state.to(tl.bfloat16)
    v_new = (u.to(tl.float32) - tl.dot(w, state_bf16)).to(tl.bfloat16)
    keys_to_end = (keys * tl.exp(last_decay - cum_decay)[:, None]).to(tl.bfloat16)
    state = state * tl.exp(last_decay) + tl.dot(tl.trans(keys_to_end), v_new)
    return state, state_bf16, v_new


@triton.jit
def _reset_at_sequence_start(
    state,
    initial_state_ptr,
    seq,
    seq_start,
    value_head,
    value_cols,
    cols_used,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    HAS_INITIAL_STATE: tl.constexpr,
):
    """The state a chunk starts from: the sequence's initial state (V-first [N, HV, V, K]; zero
    where cols_used is false or there is none) at its first chunk, `state` otherwise."""
    if HAS_INITIAL_STATE:
        rows_k = tl.arange(0, K)
        offsets = (seq * HV + value_head) * V * K + value_cols[None, :] * K + rows_k[:, None]
        at_start = (tl.zeros_like(state) + seq_start.to(tl.float32)) > 0
        mask = at_start & cols_used[None, :]
        initial = tl.load(initial_state_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    else:
        initial = tl.zeros_like(state)
    return tl.where(seq_start, initial, state)


@triton.jit
def _transition_kernel(
    k_ptr,
    w_ptr,
    u_ptr,
    cum_decay_ptr,
    initial_state_ptr,
    transitions_ptr,
    cu_seqlens_ptr,
    chunk_indices_ptr,
    num_chunks,
    segment_chunks,
    eps,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BV: tl.constexpr,
    HAS_INITIAL_STATE: tl.constexpr,
    USE_L2NORM: tl.constexpr,
    STAGES: tl.constexpr,
):
    """Chunk-parallel half of the state walk: over one segment of segment_chunks chunks, the
    affine map h_end = P h_start + b as columns [P | b] of a [K, K + V] state walked from
    [I | 0] (u = 0 in the P columns). A sequence that starts inside the segment resets the
    walk: P = 0 and b starts from that sequence's initial state. Only needed where a sequence
    runs on into the next segment; other programs skip the walk and store nothing."""
    col_block = tl.program_id(0)
    segment = tl.program_id(1)
    value_head = tl.program_id(2)
    key_head = value_head // (HV // H)
    rows_k = tl.arange(0, K)
    cols = col_block * BV + tl.arange(0, BV)
    is_value = cols >= K
    value_cols = tl.where(is_value, cols - K, 0)
    first = segment * segment_chunks
    end = tl.minimum(first + segment_chunks, num_chunks)
    next_chunk_in_seq = tl.load(chunk_indices_ptr + 2 * tl.minimum(end, num_chunks - 1) + 1)
    needed = (end < num_chunks) & (next_chunk_in_seq != 0)
    state = tl.where(rows_k[:, None] == cols[None, :], 1.0, 0.0)
    for chunk in tl.range(first, tl.where(needed, end, first), num_stages=STAGES):
        seq, start, eos, seq_start = _chunk_of(chunk_indices_ptr, cu_seqlens_ptr, chunk)
        state = _reset_at_sequence_start(
            state, initial_state_ptr, seq, seq_start, value_head, value_cols, is_value,
            HV, K, V, HAS_INITIAL_STATE,
        )  # fmt: skip
        state, _, _ = _state_step(
            state, k_ptr, w_ptr, u_ptr, cum_decay_ptr, start, eos, key_head, value_head,
            value_cols, is_value, eps, H, HV, K, V, USE_L2NORM,
        )  # fmt: skip
    offsets = (segment * HV + value_head) * K * (K + V) + rows_k[:, None] * (K + V) + cols[None, :]
    store = (tl.zeros([K, BV], dtype=tl.int32) + needed.to(tl.int32)) > 0
    tl.store(transitions_ptr + offsets, state, mask=store)


@triton.jit
def _carry_kernel(
    transitions_ptr,
    carry_ptr,
    initial_state_ptr,
    final_state_ptr,
    chunk_offsets_ptr,
    segment_chunks,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BV: tl.constexpr,
    HAS_INITIAL_STATE: tl.constexpr,
    STORE_FINAL_STATE: tl.constexpr,
):
    """Sequential half, one program per (BV columns, sequence, value head): the state at the
    start of every segment that begins inside the sequence, h <- P h + b (FP32, tf32x3), one
    step per segment (launched unpipelined: a 64 KB P per stage would not fit in shared
    memory). A sequence without tokens (no chunk walks it) gets its initial state as
    its final one."""
    v_block = tl.program_id(0)
    seq = tl.program_id(1).to(tl.int64)
    value_head = tl.program_id(2)
    first_chunk = tl.load(chunk_offsets_ptr + seq).to(tl.int64)
    end_chunk = tl.load(chunk_offsets_ptr + seq + 1).to(tl.int64)
    rows_k = tl.arange(0, K)
    cols = v_block * BV + tl.arange(0, BV)
    cols_k = tl.arange(0, K)
    transition_size = K * (K + V)
    b_offsets = rows_k[:, None] * (K + V) + K + cols[None, :]
    p_offsets = rows_k[:, None] * (K + V) + cols_k[None, :]
    carry_offsets = rows_k[:, None] * V + cols[None, :]
    first_segment = first_chunk // segment_chunks
    last_segment = (end_chunk - 1) // segment_chunks
    inner = (tl.zeros([K, BV], dtype=tl.int64) + last_segment) > first_segment
    first_offsets = (first_segment * HV + value_head) * transition_size + b_offsets
    state = tl.load(transitions_ptr + first_offsets, mask=inner, other=0.0)
    for segment in range(first_segment + 1, last_segment):
        tl.store(carry_ptr + (segment * HV + value_head) * K * V + carry_offsets, state)
        base = transitions_ptr + (segment * HV + value_head) * transition_size
        step = tl.load(base + p_offsets)
        state = tl.dot(step, state, input_precision="tf32x3") + tl.load(base + b_offsets)
    last_offsets = (last_segment * HV + value_head) * K * V + carry_offsets
    tl.store(carry_ptr + last_offsets, state, mask=inner)
    if STORE_FINAL_STATE:
        state_offsets = (seq * HV + value_head) * V * K + cols[None, :] * K + rows_k[:, None]
        no_tokens = (tl.zeros([K, BV], dtype=tl.int64) + end_chunk) == first_chunk
        initial = tl.zeros([K, BV], dtype=tl.float32)
        if HAS_INITIAL_STATE:
            initial = tl.load(initial_state_ptr + state_offsets, mask=no_tokens, other=0.0)
        tl.store(final_state_ptr + state_offsets, initial.to(tl.float32), mask=no_tokens)


@triton.jit
def _segment_walk_kernel(
    k_ptr,
    w_ptr,
    u_ptr,
    cum_decay_ptr,
    initial_state_ptr,
    carry_ptr,
    final_state_ptr,
    chunk_states_ptr,
    v_new_ptr,
    cu_seqlens_ptr,
    chunk_indices_ptr,
    num_chunks,
    segment_chunks,
    eps,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BV: tl.constexpr,
    HAS_CARRY: tl.constexpr,
    HAS_INITIAL_STATE: tl.constexpr,
    STORE_FINAL_STATE: tl.constexpr,
    USE_L2NORM: tl.constexpr,
    STAGES: tl.constexpr,
):
    """The state walk over one segment from its true starting state (the carry, or a
    sequence's initial state where one starts): stores each chunk's starting state (BF16,
    [chunks, HV, K, V]), v_new, and the final state of each sequence that ends here."""
    v_block = tl.program_id(0)
    segment = tl.program_id(1)
    value_head = tl.program_id(2)
    key_head = value_head // (HV // H)
    rows_k = tl.arange(0, K)
    cols = v_block * BV + tl.arange(0, BV)
    state = tl.zeros([K, BV], dtype=tl.float32)
    if HAS_CARRY:
        carry_offsets = (segment * HV + value_head) * K * V + rows_k[:, None] * V + cols[None, :]
        state = tl.load(carry_ptr + carry_offsets)
    first = segment * segment_chunks
    r = tl.arange(0, 64)
    all_cols = cols >= 0
    end = tl.minimum(first + segment_chunks, num_chunks)
    for chunk in tl.range(first, end, num_stages=STAGES):
        seq, start, eos, seq_start = _chunk_of(chunk_indices_ptr, cu_seqlens_ptr, chunk)
        state = _reset_at_sequence_start(
            state, initial_state_ptr, seq, seq_start, value_head, cols, all_cols,
            HV, K, V, HAS_INITIAL_STATE,
        )  # fmt: skip
        state, state_bf16, v_new = _state_step(
            state, k_ptr, w_ptr, u_ptr, cum_decay_ptr, start, eos, key_head, value_head,
            cols, all_cols, eps, H, HV, K, V, USE_L2NORM,
        )  # fmt: skip
        chunk_state_offsets = (
            (chunk * HV + value_head).to(tl.int64) * K * V + rows_k[:, None] * V + cols[None, :]
        )
        tl.store(chunk_states_ptr + chunk_state_offsets, state_bf16)
        rows = start + r
        v_new_offsets = (rows[:, None] * HV + value_head) * V + cols[None, :]
        tl.store(v_new_ptr + v_new_offsets, v_new, mask=(rows < eos)[:, None])
        if STORE_FINAL_STATE:
            state_offsets = (seq * HV + value_head) * V * K + cols[None, :] * K + rows_k[:, None]
            seq_end = (tl.zeros([K, BV], dtype=tl.int64) + start + 64) >= eos
            tl.store(final_state_ptr + state_offsets, state, mask=seq_end)


@triton.jit
def _output_kernel(
    q_ptr,
    k_ptr,
    cum_decay_ptr,
    chunk_states_ptr,
    v_new_ptr,
    o_ptr,
    cu_seqlens_ptr,
    chunk_indices_ptr,
    scale,
    eps,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    USE_L2NORM: tl.constexpr,
):
    """o = scale (exp(G) q h + causal(q k^T exp(G_i - G_j)) v_new), one chunk per program."""
    chunk = tl.program_id(0)
    value_head = tl.program_id(1)
    key_head = value_head // (HV // H)
    seq = tl.load(chunk_indices_ptr + 2 * chunk).to(tl.int64)
    chunk_in_seq = tl.load(chunk_indices_ptr + 2 * chunk + 1).to(tl.int64)
    bos = tl.load(cu_seqlens_ptr + seq).to(tl.int64)
    eos = tl.load(cu_seqlens_ptr + seq + 1).to(tl.int64)
    r = tl.arange(0, 64)
    start = bos + chunk_in_seq * 64
    rows = start + r
    valid = rows < eos
    last_decay = tl.load(cum_decay_ptr + tl.minimum(start + 63, eos - 1) * HV + value_head)
    cum_decay = tl.load(cum_decay_ptr + rows * HV + value_head, mask=valid, other=0.0)
    cum_decay = tl.where(valid, cum_decay, last_decay)
    queries = _load_rows(q_ptr, rows, valid, key_head, H, K)
    keys = _load_rows(k_ptr, rows, valid, key_head, H, K)
    if USE_L2NORM:
        queries = _l2_normalise(queries, eps)
        keys = _l2_normalise(keys, eps)
    queries = queries.to(tl.bfloat16)
    keys = keys.to(tl.bfloat16)
    v_new = _load_rows(v_new_ptr, rows, valid, value_head, HV, V).to(tl.bfloat16)
    cols_k = tl.arange(0, K)
    cols_v = tl.arange(0, V)
    chunk_state_offsets = (
        (chunk * HV + value_head).to(tl.int64) * K * V + cols_k[:, None] * V + cols_v[None, :]
    )
    chunk_state = tl.load(chunk_states_ptr + chunk_state_offsets)

    causal = r[:, None] >= r[None, :]
    log_decay = tl.where(causal, cum_decay[:, None] - cum_decay[None, :], 0.0)
    scores = tl.where(causal, tl.dot(queries, tl.trans(keys)) * tl.exp(log_decay), 0.0)
    out = tl.dot(queries, chunk_state) * tl.exp(cum_decay)[:, None]
    out = (out + tl.dot(scores.to(tl.bfloat16), v_new)) * scale
    o_offsets = (rows[:, None] * HV + value_head) * V + cols_v[None, :]
    tl.store(o_ptr + o_offsets, out.to(o_ptr.dtype.element_ty), mask=valid[:, None])


def prepare_chunk_indices(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """[num_chunks, 2] (sequence, chunk within sequence), FLA's layout; syncs with the host."""
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).cpu()
    counts = ((lengths + CHUNK - 1) // CHUNK).tolist()
    pairs = [(seq, chunk) for seq, count in enumerate(counts) for chunk in range(count)]
    indices = torch.tensor(pairs, dtype=torch.int32).reshape(-1, 2)
    return indices.to(cu_seqlens.device)


def segment_chunks(num_chunks: int, num_seqs: int) -> int:
    """Chunks per segment of the state walk, from sizes the host knows without a sync: about
    sqrt(chunks) (the walk's sequential path is ~2 S + chunks / S steps), no more than a
    sequence's average chunk count (short sequences are parallel already)."""
    if SEGMENT_CHUNKS is not None:
        return SEGMENT_CHUNKS
    average = triton.cdiv(num_chunks, max(num_seqs, 1))
    return max(1, min(triton.next_power_of_2(math.isqrt(max(num_chunks, 1))), average, 64))


@dataclass
class Launch:
    """One call's inputs, buffers and launch sizes; `run_*` are its three stages."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    o: torch.Tensor
    initial_state: torch.Tensor | None
    final_state: torch.Tensor | None
    cu_seqlens: torch.Tensor
    chunk_indices: torch.Tensor
    chunk_offsets: torch.Tensor
    scale: float
    eps: float
    ns_rounds: int
    use_l2norm: bool
    segment: int
    cum_decay: torch.Tensor
    w: torch.Tensor
    u: torch.Tensor
    v_new: torch.Tensor
    chunk_states: torch.Tensor
    transitions: torch.Tensor | None
    carry: torch.Tensor | None

    @property
    def num_chunks(self) -> int:
        return self.chunk_indices.shape[0]

    @property
    def num_segments(self) -> int:
        return triton.cdiv(self.num_chunks, self.segment)

    def shapes(self) -> dict:
        return dict(H=self.q.shape[1], HV=self.v.shape[1], K=self.q.shape[2], V=self.v.shape[2])

    def run_wy(self) -> None:
        _wy_kernel[(self.num_chunks, self.v.shape[1])](
            self.k, self.v, self.g, self.beta, self.cum_decay, self.w, self.u, self.cu_seqlens,
            self.chunk_indices, self.eps, **self.shapes(), NS_ROUNDS=self.ns_rounds,
            USE_L2NORM=self.use_l2norm, num_warps=WY_NUM_WARPS,
        )  # fmt: skip

    def run_state(self) -> None:
        """Segment transitions (when there is more than one segment), the carry across
        segments, the walk within segments."""
        shapes = self.shapes()
        hv, k_dim, v_dim = shapes["HV"], shapes["K"], shapes["V"]
        dummy = self.cum_decay
        initial = self.initial_state if self.initial_state is not None else dummy
        final = self.final_state if self.final_state is not None else dummy
        transitions = self.transitions if self.transitions is not None else dummy
        carry = self.carry if self.carry is not None else dummy
        has_initial = self.initial_state is not None
        store_final = self.final_state is not None
        walked = (self.k, self.w, self.u, self.cum_decay, initial)
        if self.transitions is not None:
            _transition_kernel[((k_dim + v_dim) // BLOCK_V, self.num_segments, hv)](
                *walked, transitions, self.cu_seqlens, self.chunk_indices, self.num_chunks,
                self.segment, self.eps, **shapes, BV=BLOCK_V, HAS_INITIAL_STATE=has_initial,
                USE_L2NORM=self.use_l2norm, STAGES=WALK_STAGES, num_warps=WALK_NUM_WARPS,
            )  # fmt: skip
        _carry_kernel[(v_dim // BLOCK_V, self.cu_seqlens.numel() - 1, hv)](
            transitions, carry, initial, final, self.chunk_offsets, self.segment, **shapes,
            BV=BLOCK_V, HAS_INITIAL_STATE=has_initial, STORE_FINAL_STATE=store_final,
            num_warps=CARRY_NUM_WARPS, num_stages=1,
        )  # fmt: skip
        _segment_walk_kernel[(v_dim // BLOCK_V, self.num_segments, hv)](
            *walked, carry, final, self.chunk_states, self.v_new, self.cu_seqlens,
            self.chunk_indices, self.num_chunks, self.segment, self.eps, **shapes, BV=BLOCK_V,
            HAS_CARRY=self.carry is not None, HAS_INITIAL_STATE=has_initial,
            STORE_FINAL_STATE=store_final, USE_L2NORM=self.use_l2norm, STAGES=WALK_STAGES,
            num_warps=WALK_NUM_WARPS,
        )  # fmt: skip

    def run_output(self) -> None:
        _output_kernel[(self.num_chunks, self.v.shape[1])](
            self.q, self.k, self.cum_decay, self.chunk_states, self.v_new, self.o,
            self.cu_seqlens, self.chunk_indices, self.scale, self.eps, **self.shapes(),
            USE_L2NORM=self.use_l2norm, num_warps=OUTPUT_NUM_WARPS,
        )  # fmt: skip


def prepare_launch(
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
) -> Launch:
    """Check shapes, flatten the batch, allocate every buffer; no host sync when chunk_indices
    is given."""
    batch, seq_len, num_heads, head_k_dim = q.shape
    num_value_heads, head_v_dim = v.shape[2], v.shape[3]
    if num_value_heads % num_heads or head_k_dim not in (64, 128) or head_v_dim not in (64, 128):
        raise ValueError(f"unsupported GDN shapes q={tuple(q.shape)} v={tuple(v.shape)}")
    if cu_seqlens is None:
        cu_seqlens = torch.arange(0, batch + 1, device=q.device, dtype=torch.int32) * seq_len
    elif batch != 1:
        raise ValueError("with cu_seqlens the batch size must be 1")
    num_seqs = cu_seqlens.numel() - 1
    if chunk_indices is None:
        chunk_indices = prepare_chunk_indices(cu_seqlens)
    if chunk_offsets is None:
        chunks_per_seq = (cu_seqlens[1:] - cu_seqlens[:-1] + CHUNK - 1) // CHUNK
        chunk_offsets = torch.nn.functional.pad(torch.cumsum(chunks_per_seq, 0), (1, 0))
    num_tokens = batch * seq_len
    q, k, v = (x.reshape(num_tokens, x.shape[2], x.shape[3]).contiguous() for x in (q, k, v))
    if core_attn_out is not None:
        o = core_attn_out.reshape(-1)[: v.numel()].view(v.shape)
    else:
        o = torch.empty_like(v)
    num_chunks = chunk_indices.shape[0]
    segment = segment_chunks(num_chunks, num_seqs)
    num_segments = triton.cdiv(num_chunks, segment)
    segmented = num_segments > 1

    def empty(*size, dtype=torch.float32):
        return torch.empty(*size, device=q.device, dtype=dtype)

    return Launch(
        q=q,
        k=k,
        v=v,
        g=g.reshape(num_tokens, num_value_heads).contiguous(),
        beta=beta.reshape(num_tokens, num_value_heads).contiguous(),
        o=o,
        initial_state=initial_state.contiguous() if initial_state is not None else None,
        final_state=(
            empty(num_seqs, num_value_heads, head_v_dim, head_k_dim) if output_final_state else None
        ),
        cu_seqlens=cu_seqlens,
        chunk_indices=chunk_indices.contiguous(),
        chunk_offsets=chunk_offsets.contiguous(),
        scale=head_k_dim**-0.5 if scale is None else scale,
        eps=l2norm_eps,
        ns_rounds=ns_rounds,
        use_l2norm=use_qk_l2norm_in_kernel,
        segment=segment,
        cum_decay=empty(num_tokens, num_value_heads),
        w=empty(num_tokens, num_value_heads, head_k_dim, dtype=torch.bfloat16),
        u=empty(num_tokens, num_value_heads, head_v_dim, dtype=torch.bfloat16),
        v_new=empty(num_tokens, num_value_heads, head_v_dim, dtype=torch.bfloat16),
        chunk_states=empty(
            num_chunks, num_value_heads, head_k_dim, head_v_dim, dtype=torch.bfloat16
        ),
        transitions=(
            empty(num_segments, num_value_heads, head_k_dim, head_k_dim + head_v_dim)
            if segmented
            else None
        ),
        carry=empty(num_segments, num_value_heads, head_k_dim, head_v_dim) if segmented else None,
    )


def chunk_gated_delta_rule(*args, **kwargs) -> tuple[torch.Tensor, torch.Tensor | None]:
    """nsR GDN prefill with the arguments and results of vLLM's FLA `chunk_gated_delta_rule`
    (see `prepare_launch` for the signature).

    chunk_indices [chunks, 2] and chunk_offsets [N + 1] are FLA's chunk metadata (vLLM
    precomputes them; computed here when absent, chunk_indices with a host sync).
    """
    launch = prepare_launch(*args, **kwargs)
    launch.run_wy()
    launch.run_state()
    launch.run_output()
    batch, seq_len = args[0].shape[:2] if args else kwargs["q"].shape[:2]
    out = launch.o.view(batch, seq_len, *launch.o.shape[1:])
    return out.to(launch.q.dtype), launch.final_state
