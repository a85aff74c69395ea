"""The nsR chunked GDN prefill in Triton for NVIDIA GPUs, behind FLA's calling contract.

`chunk_gated_delta_rule` takes what vLLM's CUDA path passes to FLA's `chunk_gated_delta_rule`
(q/k [B, T, H, K], v [B, T, HV, V], g and beta [B, T, HV], states [N, HV, V, K] V-first as
vLLM keeps them, cu_seqlens, precomputed chunk_indices and chunk_offsets, optional
core_attn_out) and returns (o [B, T, HV, V], final state [N, HV, V, K] float32 or None).

Two launches, no host sync when vLLM's chunk metadata is given:
  1. `_wy_kernel`, one program per (chunk, value head): chunk-local cumulative decay G, the
     within-chunk A, its unit lower-triangular inverse (BF16 Newton-Schulz on the 16x16
     diagonal blocks -- the nsR rounds -- then a Neumann series over the off-diagonal blocks,
     exact after 3 terms because they are strictly block-lower), the WY vectors w and u, the
     causal P = scale q k^T exp(G_i - G_j), and the per-row scales the walk applies.
  2. The only sequential walk over chunks, three dots per chunk ([w; q] h as one 128-row
     product, P v_new, k^T v_new), loads software-pipelined; no chunk state or v_new leaves
     the program. Two forms (`_walk_layout`): k-first holds h [K, BV] and splits V in BV
     columns, so that one long sequence still fills the GPU; v-first holds h^T [V, K], whose
     dots all take it (and v_new) from registers, for many sequences.
The launch settings below are what the H200 bench picked (kernels/README.md); kernels/bench.py
times the alternatives. Dots take BF16 operands with FP32 accumulation, as FLA's do, the
Neumann products included (`NEUMANN_PRECISION`; TF32 is one of the bench's variants).
"""

import functools

import torch
import triton
import triton.language as tl

CHUNK = 64
WY_NUM_WARPS = 4
NEUMANN_PRECISION = "bf16"
WALK_FORM = None  # None: by waves (_walk_layout); "k-first" or "v-first"
WALK_BLOCK_V = None  # k-first walk's columns of V; None: by waves (_walk_layout)
WALK_NUM_WARPS = 4  # k-first walk
WALK_STAGES = 3  # k-first walk
V_FIRST_STAGES = 3  # v-first walk (all of V per program, 4 warps per 64 columns)


@triton.jit
def _unit_lower_inverse(strict_lower, NS_ROUNDS: tl.constexpr, PRECISION: tl.constexpr):
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
def _wy_kernel(
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
    inverse = _unit_lower_inverse(strict_lower * beta[:, None], NS_ROUNDS, PRECISION)
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
def _walk_kernel(
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


def prepare_chunk_indices(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """[num_chunks, 2] (sequence, chunk within sequence), FLA's layout; syncs with the host."""
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).cpu()
    counts = ((lengths + CHUNK - 1) // CHUNK).tolist()
    pairs = [(seq, chunk) for seq, count in enumerate(counts) for chunk in range(count)]
    indices = torch.tensor(pairs, dtype=torch.int32).reshape(-1, 2)
    return indices.to(cu_seqlens.device)


class Launch:
    """One call's buffers and its two launches, so that the bench can time each stage."""

    def __init__(
        self,
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
    ) -> None:
        batch, seq_len, num_heads, head_k_dim = q.shape
        num_value_heads, head_v_dim = v.shape[2], v.shape[3]
        if (
            num_value_heads % num_heads
            or head_k_dim not in (64, 128)
            or head_v_dim not in (64, 128)
        ):
            raise ValueError(f"unsupported GDN shapes q={tuple(q.shape)} v={tuple(v.shape)}")
        if cu_seqlens is None:
            cu_seqlens = torch.arange(0, batch + 1, device=q.device, dtype=torch.int32) * seq_len
        elif batch != 1:
            raise ValueError("with cu_seqlens the batch size must be 1")
        if chunk_indices is None:
            chunk_indices = prepare_chunk_indices(cu_seqlens)
        if chunk_offsets is None:
            chunks_per_seq = (cu_seqlens[1:] - cu_seqlens[:-1] + CHUNK - 1) // CHUNK
            chunk_offsets = torch.nn.functional.pad(torch.cumsum(chunks_per_seq, 0), (1, 0))
        num_tokens = batch * seq_len
        self.out_shape = (batch, seq_len, num_value_heads, head_v_dim)
        self.out_dtype = q.dtype
        self.q, self.k, self.v = (
            x.reshape(num_tokens, x.shape[2], x.shape[3]).contiguous() for x in (q, k, v)
        )
        self.g = g.reshape(num_tokens, num_value_heads).contiguous()
        self.beta = beta.reshape(num_tokens, num_value_heads).contiguous()
        self.cu_seqlens = cu_seqlens
        self.chunk_indices = chunk_indices.contiguous()
        self.chunk_offsets = chunk_offsets.contiguous()
        self.scale = head_k_dim**-0.5 if scale is None else scale
        self.num_seqs = cu_seqlens.numel() - 1
        self.num_chunks = chunk_indices.shape[0]
        device = q.device
        tiles = (self.num_chunks, num_value_heads)  # chunk-major: one block per chunk and head
        self.w = torch.empty(*tiles, CHUNK, head_k_dim, device=device, dtype=torch.bfloat16)
        walk_form, block_v = _walk_layout(self.num_seqs, num_value_heads, head_v_dim, device)
        walk_form = WALK_FORM or walk_form
        if walk_form not in ("k-first", "v-first"):
            raise ValueError(f"WALK_FORM must be k-first or v-first, not {walk_form!r}")
        self.v_first = walk_form == "v-first"
        self.k_first_block_v = WALK_BLOCK_V or block_v
        u_tile = (head_v_dim, CHUNK) if self.v_first else (CHUNK, head_v_dim)
        self.u = torch.empty(*tiles, *u_tile, device=device, dtype=torch.bfloat16)
        self.causal = torch.empty(*tiles, CHUNK, CHUNK, device=device, dtype=torch.bfloat16)
        self.out_scale = torch.empty(*tiles, CHUNK, device=device)
        self.key_scale = torch.empty(*tiles, CHUNK, device=device)
        self.decay = torch.empty(*tiles, device=device)
        if core_attn_out is not None:
            self.o = core_attn_out.reshape(-1)[: self.v.numel()].view(self.v.shape)
        else:
            self.o = torch.empty_like(self.v)
        self.initial_state = initial_state.contiguous() if initial_state is not None else None
        self.final_state = (
            torch.empty(self.num_seqs, num_value_heads, head_v_dim, head_k_dim, device=device)
            if output_final_state
            else None
        )
        self.ns_rounds = ns_rounds
        self.eps = l2norm_eps
        self.use_l2norm = use_qk_l2norm_in_kernel
        self.shapes = dict(H=num_heads, HV=num_value_heads, K=head_k_dim, V=head_v_dim)

    def run_wy(self) -> None:
        _wy_kernel[(self.num_chunks, self.shapes["HV"])](
            self.q, self.k, self.v, self.g, self.beta, self.w, self.u, self.causal,
            self.out_scale, self.key_scale, self.decay, self.cu_seqlens, self.chunk_indices,
            self.scale, self.eps, **self.shapes, NS_ROUNDS=self.ns_rounds,
            USE_L2NORM=self.use_l2norm, PRECISION=NEUMANN_PRECISION,
            U_TRANSPOSED=self.v_first, num_warps=WY_NUM_WARPS,
        )  # fmt: skip

    def run_walk(self) -> None:
        head_v_dim = self.shapes["V"]
        if self.v_first:
            block_v, stages, warps = head_v_dim, V_FIRST_STAGES, 4 * head_v_dim // 64
        else:
            block_v, stages, warps = self.k_first_block_v, WALK_STAGES, WALK_NUM_WARPS
        placeholder = self.decay  # never read or written when its flag is off
        _walk_kernel[(head_v_dim // block_v, self.num_seqs, self.shapes["HV"])](
            self.q, self.k, self.w, self.u, self.causal, self.out_scale, self.key_scale,
            self.decay, placeholder if self.initial_state is None else self.initial_state,
            placeholder if self.final_state is None else self.final_state,
            self.o, self.cu_seqlens, self.chunk_offsets, **self.shapes, BV=block_v,
            HAS_INITIAL_STATE=self.initial_state is not None,
            STORE_FINAL_STATE=self.final_state is not None, STAGES=stages, V_FIRST=self.v_first,
            num_warps=warps,
        )  # fmt: skip

    def result(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.o.view(self.out_shape).to(self.out_dtype), self.final_state


def chunk_gated_delta_rule(*args, **kwargs) -> tuple[torch.Tensor, torch.Tensor | None]:
    """nsR GDN prefill with the arguments and results of vLLM's FLA `chunk_gated_delta_rule`
    (see `Launch`; chunk_indices [chunks, 2] and chunk_offsets [N + 1] are FLA's chunk
    metadata, computed here when absent, chunk_indices with a host sync)."""
    launch = Launch(*args, **kwargs)
    launch.run_wy()
    launch.run_walk()
    return launch.result()


def _walk_layout(
    num_seqs: int, num_value_heads: int, head_v_dim: int, device: torch.device
) -> tuple[str, int]:
    """The walk's form and a k-first walk's columns of V, by waves. Every walk program fills
    an SM's shared memory, so programs past the SM count wait for a second wave, which costs
    more than a wider program does. Of the layouts with the fewest waves, the one with the
    least work per program: k-first at 32 columns, at 64, then v-first (all of V, one program
    per sequence and value head, the fewest programs). H200 bench, graph replays of the whole
    call, 32 / 64 columns / v-first: 8K 288 / 334 / 394 us, 2 x 8K 579 / 472 / 519, 4 x 4K
    585 / 483 / 435. On CPU (the interpreter): k-first, 64 columns at most."""
    if device.type != "cuda":
        return "k-first", min(64, head_v_dim)
    programs = num_seqs * num_value_heads
    sms = _multiprocessors(device)
    fewest_waves = triton.cdiv(programs, sms)
    for block_v in (32, 64):
        if (
            block_v <= head_v_dim
            and triton.cdiv(programs * (head_v_dim // block_v), sms) == fewest_waves
        ):
            return "k-first", block_v
    return "v-first", min(64, head_v_dim)  # the columns a forced k-first walk takes


@functools.cache
def _multiprocessors(device: torch.device) -> int:
    index = device.index if device.index is not None else 0
    return torch.cuda.get_device_properties(index).multi_processor_count
