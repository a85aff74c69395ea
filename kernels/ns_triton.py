"""The nsR chunked GDN prefill in Triton for NVIDIA GPUs, behind FLA's calling contract.

`chunk_gated_delta_rule` takes what vLLM's CUDA path passes to FLA's `chunk_gated_delta_rule`
(q/k [B, T, H, K], v [B, T, HV, V], g and beta [B, T, HV], states [N, HV, V, K] V-first as
vLLM keeps them, cu_seqlens, precomputed chunk_indices, optional core_attn_out) and returns
(o [B, T, HV, V], final state [N, HV, V, K] float32 or None).

Three launches:
  1. `_wy_kernel`, one program per (chunk, value head): chunk-local cumulative decay, the
     within-chunk A, its unit lower-triangular inverse (BF16 Newton-Schulz on the 16x16
     diagonal blocks, then a Neumann series over the off-diagonal blocks, exact after 3 terms
     because they are strictly block-lower), and the WY vectors w, u.
  2. `_state_kernel`, one program per (sequence, value head, BV columns of V): the only
     sequential walk over chunks, FP32 state in registers; stores each chunk's starting state
     (BF16) and v_new.
  3. `_output_kernel`, one program per (chunk, value head): the output, fully parallel.
(Doing 2 and 3 in one walk moved fewer bytes but lengthened the sequential path: 1.2-1.3x
slower at 8K-16K tokens on an H200, see kernels/bench.py.)
Same numerics as kernels/ns_torch.py for the inverse; dots elsewhere take BF16 operands with
FP32 accumulation, as FLA's do.
"""

import functools

import torch
import triton
import triton.language as tl

CHUNK = 64
# Launch settings; kernels/bench.py times the alternatives.
WY_NUM_WARPS = 4
STATE_NUM_WARPS = 4
OUTPUT_NUM_WARPS = 4
STATE_STAGES = 2
STATE_BLOCK_V = None  # None: by occupancy (_value_block)


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
def _state_kernel(
    k_ptr,
    w_ptr,
    u_ptr,
    cum_decay_ptr,
    initial_state_ptr,
    final_state_ptr,
    chunk_states_ptr,
    v_new_ptr,
    cu_seqlens_ptr,
    chunk_offsets_ptr,
    eps,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BV: tl.constexpr,
    HAS_INITIAL_STATE: tl.constexpr,
    STORE_FINAL_STATE: tl.constexpr,
    USE_L2NORM: tl.constexpr,
    STAGES: tl.constexpr,
):
    """The only sequential part: per chunk, v_new = u - w h and h <- decay h + k^T v_new.
    Stores h at each chunk's start (BF16, [chunks, HV, K, V]) and v_new for the output pass."""
    v_block = tl.program_id(0)
    seq = tl.program_id(1).to(tl.int64)
    value_head = tl.program_id(2)
    key_head = value_head // (HV // H)
    bos = tl.load(cu_seqlens_ptr + seq).to(tl.int64)
    eos = tl.load(cu_seqlens_ptr + seq + 1).to(tl.int64)
    first_chunk = tl.load(chunk_offsets_ptr + seq).to(tl.int64)
    cols_k = tl.arange(0, K)
    cols_v = v_block * BV + tl.arange(0, BV)
    state_offsets = (seq * HV + value_head) * V * K + cols_v[None, :] * K + cols_k[:, None]
    state = tl.zeros([K, BV], dtype=tl.float32)
    if HAS_INITIAL_STATE:
        state = tl.load(initial_state_ptr + state_offsets).to(tl.float32)

    r = tl.arange(0, 64)
    for chunk in tl.range(0, tl.cdiv(eos - bos, 64), num_stages=STAGES):
        start = bos + chunk * 64
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
        u_offsets = (rows[:, None] * HV + value_head) * V + cols_v[None, :]
        u = tl.load(u_ptr + u_offsets, mask=valid[:, None], other=0.0).to(tl.float32)

        state_bf16 = state.to(tl.bfloat16)
        chunk_state_offsets = (
            ((first_chunk + chunk) * HV + value_head) * K * V
            + cols_k[:, None] * V
            + cols_v[None, :]
        )
        tl.store(chunk_states_ptr + chunk_state_offsets, state_bf16)
        v_new = (u - tl.dot(w, state_bf16)).to(tl.bfloat16)
        tl.store(v_new_ptr + u_offsets, v_new, mask=valid[:, None])
        keys_to_end = (keys * tl.exp(last_decay - cum_decay)[:, None]).to(tl.bfloat16)
        state = state * tl.exp(last_decay) + tl.dot(tl.trans(keys_to_end), v_new)

    if STORE_FINAL_STATE:
        tl.store(final_state_ptr + state_offsets, state)


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
    chunk_state_offsets = (chunk * HV + value_head) * K * V + cols_k[:, None] * V + cols_v[None, :]
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
    """nsR GDN prefill with the arguments and results of vLLM's FLA `chunk_gated_delta_rule`.

    chunk_indices [chunks, 2] and chunk_offsets [N + 1] are FLA's chunk metadata (vLLM
    precomputes them; computed here when absent, chunk_indices with a host sync).
    """
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
    scale = head_k_dim**-0.5 if scale is None else scale
    num_tokens = batch * seq_len
    q, k, v = (x.reshape(num_tokens, x.shape[2], x.shape[3]).contiguous() for x in (q, k, v))
    g = g.reshape(num_tokens, num_value_heads).contiguous()
    beta = beta.reshape(num_tokens, num_value_heads).contiguous()
    chunk_indices = chunk_indices.contiguous()

    cum_decay = torch.empty(num_tokens, num_value_heads, device=q.device, dtype=torch.float32)
    w = torch.empty(num_tokens, num_value_heads, head_k_dim, device=q.device, dtype=torch.bfloat16)
    u = torch.empty(num_tokens, num_value_heads, head_v_dim, device=q.device, dtype=torch.bfloat16)
    _wy_kernel[(chunk_indices.shape[0], num_value_heads)](
        k,
        v,
        g,
        beta,
        cum_decay,
        w,
        u,
        cu_seqlens,
        chunk_indices,
        l2norm_eps,
        H=num_heads,
        HV=num_value_heads,
        K=head_k_dim,
        V=head_v_dim,
        NS_ROUNDS=ns_rounds,
        USE_L2NORM=use_qk_l2norm_in_kernel,
        num_warps=WY_NUM_WARPS,
    )

    if core_attn_out is not None:
        o = core_attn_out.reshape(-1)[: v.numel()].view(v.shape)
    else:
        o = torch.empty_like(v)
    final_state = (
        torch.empty(num_seqs, num_value_heads, head_v_dim, head_k_dim, device=q.device)
        if output_final_state
        else None
    )
    states_in = initial_state.contiguous() if initial_state is not None else cum_decay
    states_out = final_state if final_state is not None else cum_decay
    block_v = STATE_BLOCK_V or _value_block(num_seqs * num_value_heads, head_v_dim, q.device)
    state_grid = (head_v_dim // block_v, num_seqs, num_value_heads)
    flags = dict(
        H=num_heads,
        HV=num_value_heads,
        K=head_k_dim,
        V=head_v_dim,
        USE_L2NORM=use_qk_l2norm_in_kernel,
    )
    state_flags = dict(
        BV=block_v,
        HAS_INITIAL_STATE=initial_state is not None,
        STORE_FINAL_STATE=final_state is not None,
        num_warps=STATE_NUM_WARPS,
    )
    if chunk_offsets is None:
        chunks_per_seq = (cu_seqlens[1:] - cu_seqlens[:-1] + CHUNK - 1) // CHUNK
        chunk_offsets = torch.nn.functional.pad(torch.cumsum(chunks_per_seq, 0), (1, 0))
    num_chunks = chunk_indices.shape[0]
    chunk_states = torch.empty(
        num_chunks, num_value_heads, head_k_dim, head_v_dim, device=q.device, dtype=torch.bfloat16
    )
    v_new = torch.empty_like(u)
    _state_kernel[state_grid](
        k, w, u, cum_decay, states_in, states_out, chunk_states, v_new, cu_seqlens,
        chunk_offsets.contiguous(), l2norm_eps, **flags, **state_flags, STAGES=STATE_STAGES,
    )  # fmt: skip
    _output_kernel[(num_chunks, num_value_heads)](
        q, k, cum_decay, chunk_states, v_new, o, cu_seqlens, chunk_indices, scale, l2norm_eps,
        **flags, num_warps=OUTPUT_NUM_WARPS,
    )  # fmt: skip
    return o.view(batch, seq_len, num_value_heads, head_v_dim).to(q.dtype), final_state


def _value_block(programs_per_block: int, head_v_dim: int, device: torch.device) -> int:
    """Columns of V per program: narrower when few sequences x heads would leave SMs idle."""
    if device.type != "cuda":
        return head_v_dim
    sms = _multiprocessors(device.index if device.index is not None else 0)
    return 32 if programs_per_block * (head_v_dim // 64) < sms else 64


@functools.cache
def _multiprocessors(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count
