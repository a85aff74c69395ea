"""The device side of the Triton nsR (kernels/ns_triton.py): every `@triton.jit` function.

kernels/ns_triton.py holds the host side (FLA's calling contract, the buffers, the launch
settings the bench varies, the rule that picks the walk's form); this file holds what runs on
the GPU, so that the numerics of the two launches read in one place and nothing here touches
torch:
  `wy_kernel`    one program per (chunk, value head): everything of a chunk that does not
                 depend on the state, the block inverse (`unit_lower_inverse`) included.
  `walk_kernel`  the sequential walk over a sequence's chunks, k-first (`_k_first_chunk`) or
                 v-first (`_v_first_chunk`).
Launch settings arrive as constexpr arguments; nothing here reads module state.
"""

import triton
import triton.language as tl


@triton.jit
def unit_lower_inverse(strict_lower, NS_ROUNDS: tl.constexpr, PRECISION: tl.constexpr):
    """Inverse of I + A for a 64x64 strictly lower A held in registers (FP32 in, FP32 out).

    Newton-Schulz runs on the four 16x16 diagonal blocks as one batched [4, 16, 16] dot (on
    the H200 20 us faster at 8K than the same iteration on the block-diagonal 64x64 tile);
    the Neumann series then adds the blocks below the diagonal.
    """
    r = tl.arange(0, 64)
    eye = tl.where(r[:, None] == r[None, :], 1.0, 0.0)
    same_block = (r[:, None] // 16) == (r[None, :] // 16)
    across = tl.where(same_block, 0.0, strict_lower)
    block = tl.arange(0, 4)
    on_diagonal = block[:, None, None, None] == block[None, None, :, None]  # [4, 1, 4, 1]
    tiles = tl.reshape(strict_lower, [4, 16, 4, 16])  # (block row, row, block column, column)
    within = tl.sum(tl.where(on_diagonal, tiles, 0.0), axis=2)  # the diagonal blocks
    r16 = tl.arange(0, 16)
    eye16 = tl.where(r16[:, None] == r16[None, :], 1.0, 0.0)[None, :, :]
    m = (eye16 + within).to(tl.bfloat16)
    x = (eye16 - within).to(tl.bfloat16)
    for _ in tl.static_range(NS_ROUNDS):
        product = tl.dot(m, x).to(tl.bfloat16)
        x = tl.dot(x, (2.0 * eye16 - product.to(tl.float32)).to(tl.bfloat16)).to(tl.bfloat16)
    spread = tl.where(on_diagonal, x.to(tl.float32)[:, :, None, :], 0.0)
    block_inverse = tl.reshape(spread, [64, 64])
    z = _neumann_dot(block_inverse, across, PRECISION)
    series = eye - z
    series = eye - _neumann_dot(z, series, PRECISION)
    series = eye - _neumann_dot(z, series, PRECISION)
    return _neumann_dot(series, block_inverse, PRECISION)


@triton.jit
def _neumann_dot(a, b, PRECISION: tl.constexpr):
    """a @ b for FP32 tiles with FP32 accumulation: BF16 operands ("bf16") or tl.dot's
    input_precision ("tf32", "tf32x3", "ieee")."""
    if PRECISION == "bf16":
        product = tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16))
    else:
        product = tl.dot(a, b, input_precision=PRECISION)
    return product


@triton.jit
def _chunk_rows(cu_seqlens_ptr, chunk_indices_ptr, chunk):
    """(rows of this chunk, which of them are in the sequence) for chunk `chunk`."""
    seq = tl.load(chunk_indices_ptr + 2 * chunk).to(tl.int64)
    chunk_in_seq = tl.load(chunk_indices_ptr + 2 * chunk + 1).to(tl.int64)
    bos = tl.load(cu_seqlens_ptr + seq).to(tl.int64)
    eos = tl.load(cu_seqlens_ptr + seq + 1).to(tl.int64)
    rows = bos + chunk_in_seq * 64 + tl.arange(0, 64)
    return rows, rows < eos


@triton.jit
def wy_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, w_ptr, u_ptr, causal_ptr, out_scale_ptr,
    key_scale_ptr, decay_ptr, cu_seqlens_ptr, chunk_indices_ptr, scale, eps,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    NS_ROUNDS: tl.constexpr, USE_L2NORM: tl.constexpr, PRECISION: tl.constexpr,
    U_TRANSPOSED: tl.constexpr,
):  # fmt: skip
    """Everything of one chunk that does not depend on the state, written chunk-major (one
    contiguous block per chunk and value head, rows past the sequence zero), so that the walk
    loads whole tiles without masks; u as [64, V], or as u^T [V, 64] for the v-first walk.
    Keys are loaded again after the inverse rather than held across it (fewer registers, more
    programs per SM)."""
    chunk = tl.program_id(0)
    value_head = tl.program_id(1)
    key_head = value_head // (HV // H)
    tile = chunk.to(tl.int64) * HV + value_head
    rows, valid = _chunk_rows(cu_seqlens_ptr, chunk_indices_ptr, chunk)
    r = tl.arange(0, 64)
    cols_k = tl.arange(0, K)
    cols_v = tl.arange(0, V)
    qk_offsets = (rows[:, None] * H + key_head) * K + cols_k[None, :]
    keys, key_norm = _load_rows(k_ptr + qk_offsets, valid, USE_L2NORM, eps)
    queries, query_norm = _load_rows(q_ptr + qk_offsets, valid, USE_L2NORM, eps)
    g = tl.load(g_ptr + rows * HV + value_head, mask=valid, other=0.0).to(tl.float32)
    beta = tl.load(beta_ptr + rows * HV + value_head, mask=valid, other=0.0).to(tl.float32)
    cum_decay = tl.cumsum(g, axis=0)
    last_decay = tl.sum(g, axis=0)  # rows past the sequence add 0
    gate = tl.exp(cum_decay[:, None] - cum_decay[None, :])
    scores = tl.dot(queries, tl.trans(keys)) * (gate * scale)
    causal = tl.where(r[:, None] >= r[None, :], scores, 0.0).to(tl.bfloat16)
    tl.store(causal_ptr + tile * 64 * 64 + r[:, None] * 64 + r[None, :], causal)
    tl.store(out_scale_ptr + tile * 64 + r, scale * tl.exp(cum_decay) * query_norm)
    tl.store(key_scale_ptr + tile * 64 + r, tl.exp(last_decay - cum_decay) * key_norm)
    tl.store(decay_ptr + tile, tl.exp(last_decay))
    strict_lower = tl.where(r[:, None] > r[None, :], tl.dot(keys, tl.trans(keys)) * gate, 0.0)
    inverse = unit_lower_inverse(strict_lower * beta[:, None], NS_ROUNDS, PRECISION)
    inverse = inverse.to(tl.bfloat16)
    keys, _ = _load_rows(k_ptr + qk_offsets, valid, USE_L2NORM, eps)  # norms as above
    weighted_keys = (keys.to(tl.float32) * (beta * tl.exp(cum_decay))[:, None]).to(tl.bfloat16)
    w = tl.dot(inverse, weighted_keys)
    tl.store(w_ptr + tile * 64 * K + r[:, None] * K + cols_k[None, :], w.to(tl.bfloat16))
    values = tl.load(v_ptr + (rows[:, None] * HV + value_head) * V + cols_v[None, :],
                     mask=valid[:, None], other=0.0)  # fmt: skip
    u = tl.dot(inverse, (values.to(tl.float32) * beta[:, None]).to(tl.bfloat16))
    if U_TRANSPOSED:
        tl.store(u_ptr + tile * 64 * V + cols_v[None, :] * 64 + r[:, None], u.to(tl.bfloat16))
    else:
        tl.store(u_ptr + tile * 64 * V + r[:, None] * V + cols_v[None, :], u.to(tl.bfloat16))


@triton.jit
def _load_rows(pointers, valid, USE_L2NORM: tl.constexpr, eps):
    """A [64, K] BF16 tile of q or k, rows past the sequence zero, L2-normalised if asked, and
    the factor that normalised each row (1 without USE_L2NORM)."""
    rows = tl.load(pointers, mask=valid[:, None], other=0.0)
    norm = tl.full([64], 1.0, tl.float32)
    if USE_L2NORM:
        wide = rows.to(tl.float32)
        norm = tl.rsqrt(tl.sum(wide * wide, axis=1) + eps)
        rows = (wide * norm[:, None]).to(tl.bfloat16)
    return rows, norm


@triton.jit
def walk_kernel(
    q_ptr, k_ptr, w_ptr, u_ptr, causal_ptr, out_scale_ptr, key_scale_ptr, decay_ptr,
    initial_state_ptr, final_state_ptr, o_ptr, cu_seqlens_ptr, chunk_offsets_ptr,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
    HAS_INITIAL_STATE: tl.constexpr, STORE_FINAL_STATE: tl.constexpr, STAGES: tl.constexpr,
    V_FIRST: tl.constexpr,
):  # fmt: skip
    """The sequential walk over one sequence's chunks for BV columns of V of one value head,
    the FP32 state in registers: h [K, BV] (`_k_first_chunk`) or, with V_FIRST, h^T [BV, K]
    (`_v_first_chunk`, BV 64 or 128)."""
    seq = tl.program_id(1).to(tl.int64)
    value_head = tl.program_id(2)
    bos = tl.load(cu_seqlens_ptr + seq).to(tl.int64)
    eos = tl.load(cu_seqlens_ptr + seq + 1).to(tl.int64)
    first_chunk = tl.load(chunk_offsets_ptr + seq).to(tl.int64)
    cols_k = tl.arange(0, K)
    cols_v = tl.program_id(0) * BV + tl.arange(0, BV)
    state_offsets = (seq * HV + value_head) * V * K
    if V_FIRST:
        state_offsets += cols_v[:, None] * K + cols_k[None, :]
    else:
        state_offsets += cols_v[None, :] * K + cols_k[:, None]
    state = tl.zeros(state_offsets.shape, dtype=tl.float32)
    if HAS_INITIAL_STATE:
        state = tl.load(initial_state_ptr + state_offsets).to(tl.float32)

    for chunk in tl.range(0, tl.cdiv(eos - bos, 64), num_stages=STAGES):
        tile = (first_chunk + chunk) * HV + value_head
        rows, w_and_q, keys, causal, out_scale, key_scale, decay = _chunk_tiles(
            q_ptr, k_ptr, w_ptr, causal_ptr, out_scale_ptr, key_scale_ptr, decay_ptr,
            bos + chunk * 64, eos, tile, value_head // (HV // H), H, K,
        )  # fmt: skip
        o_rows = o_ptr + (rows * HV + value_head) * V
        if V_FIRST:
            u = tl.load(u_ptr + (tile * V + cols_v[:, None]) * 64 + tl.arange(0, 64)[None, :])
            state = _v_first_chunk(state, w_and_q, keys, u, causal, out_scale, key_scale, decay,
                                   o_rows, rows < eos, cols_v)  # fmt: skip
        else:
            u = tl.load(u_ptr + (tile * 64 + tl.arange(0, 64)[:, None]) * V + cols_v[None, :])
            state = _k_first_chunk(state, w_and_q, keys, u, causal, out_scale, key_scale, decay,
                                   o_rows, rows < eos, cols_v)  # fmt: skip

    if STORE_FINAL_STATE:
        tl.store(final_state_ptr + state_offsets, state)


@triton.jit
def _k_first_chunk(
    state, w_and_q, keys, u, causal, out_scale, key_scale, decay, o_rows, valid, cols_v
):  # fmt: skip
    """One chunk with h [K, BV] the FP32 state at its start; returns the state after it:
        [w h; q h] = [w; q] h                 one dot, w and q stacked into 128 rows
        v_new = u - w h
        o = out_scale (q h) + P v_new         out_scale = scale exp(G) (/ |q|)
        h <- decay h + k^T (key_scale v_new)  key_scale = exp(G_last - G) (/ |k|)
    Three dots, the fewest waits Triton's wgmma lowering allows here (it waits after each).
    wgmma reads its right operand from shared memory only: h, v_new and key_scale v_new are
    staged there. Splitting V in 32 or 64 columns keeps every SM busy on one long sequence."""
    BV: tl.constexpr = state.shape[1]
    stacked_product = tl.dot(w_and_q, state.to(tl.bfloat16))
    halves = tl.permute(tl.reshape(stacked_product, (2, 64, BV)), (1, 2, 0))
    w_state, q_state = tl.split(halves)
    v_new = u.to(tl.float32) - w_state
    out = q_state * out_scale[:, None] + tl.dot(causal, v_new.to(tl.bfloat16))
    tl.store(o_rows[:, None] + cols_v[None, :], out.to(o_rows.dtype.element_ty),
             mask=valid[:, None])  # fmt: skip
    v_to_end = (v_new * key_scale[:, None]).to(tl.bfloat16)
    return state * decay + tl.dot(tl.trans(keys), v_to_end)


@triton.jit
def _v_first_chunk(
    state, w_and_q, keys, u, causal, out_scale, key_scale, decay, o_rows, valid, cols_v
):  # fmt: skip
    """One chunk with S = h^T [BV, K] the FP32 state at its start (V-first, as vLLM keeps it)
    and u^T [BV, 64]; returns the state after it:
        [S w^T, S q^T] = S [w; q]^T            one dot, w and q stacked into 128 rows
        v_new^T = u^T - S w^T
        o^T = (S q^T) out_scale + v_new^T P^T  out_scale = scale exp(G) (/ |q|)
        S <- decay S + (v_new^T key_scale) k    key_scale = exp(G_last - G) (/ |k|)
    The state and v_new, computed in registers, are every dot's left operand, which wgmma reads
    from registers: only loaded tiles go through shared memory. wgmma needs 64 rows per
    warpgroup, so BV is 64 or 128: the form for many sequences, where one program per sequence
    and value head fills the GPU and each loaded tile serves all of V."""
    BV: tl.constexpr = state.shape[0]
    stacked_product = tl.dot(state.to(tl.bfloat16), tl.trans(w_and_q))
    halves = tl.permute(tl.reshape(stacked_product, (BV, 2, 64)), (0, 2, 1))
    w_state, q_state = tl.split(halves)
    v_new = u.to(tl.float32) - w_state
    out = q_state * out_scale[None, :] + tl.dot(v_new.to(tl.bfloat16), tl.trans(causal))
    tl.store(o_rows[None, :] + cols_v[:, None], out.to(o_rows.dtype.element_ty),
             mask=valid[None, :])  # fmt: skip
    v_to_end = (v_new * key_scale[None, :]).to(tl.bfloat16)
    return state * decay + tl.dot(v_to_end, keys)


@triton.jit
def _chunk_tiles(
    q_ptr, k_ptr, w_ptr, causal_ptr, out_scale_ptr, key_scale_ptr, decay_ptr, start, eos, tile,
    key_head, H: tl.constexpr, K: tl.constexpr,
):  # fmt: skip
    """The chunk's token rows and what both walks load for it besides u: [w; q] (stacked into
    128 rows by the load's row pointers), k, P, the row scales and the decay; rows past the
    sequence are zero."""
    r = tl.arange(0, 64)
    stacked = tl.arange(0, 128)
    is_w = stacked < 64
    cols_k = tl.arange(0, K)
    rows = start + r
    q_rows = start + stacked - 64
    stacked_rows = tl.where(
        is_w, w_ptr + (tile * 64 + stacked) * K, q_ptr + (q_rows * H + key_head) * K
    )
    w_and_q = tl.load(stacked_rows[:, None] + cols_k[None, :],
                      mask=(is_w | (q_rows < eos))[:, None], other=0.0)  # fmt: skip
    keys = tl.load(k_ptr + (rows[:, None] * H + key_head) * K + cols_k[None, :],
                   mask=(rows < eos)[:, None], other=0.0)  # fmt: skip
    causal = tl.load(causal_ptr + tile * 64 * 64 + r[:, None] * 64 + r[None, :])
    out_scale = tl.load(out_scale_ptr + tile * 64 + r)
    key_scale = tl.load(key_scale_ptr + tile * 64 + r)
    decay = tl.load(decay_ptr + tile)
    return rows, w_and_q, keys, causal, out_scale, key_scale, decay
