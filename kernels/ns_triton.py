"""The nsR chunked GDN prefill in Triton for NVIDIA GPUs, behind FLA's calling contract.

`chunk_gated_delta_rule` takes what vLLM's CUDA path passes to FLA's `chunk_gated_delta_rule`
(q/k [B, T, H, K], v [B, T, HV, V], g and beta [B, T, HV], states [N, HV, V, K] V-first as
vLLM keeps them, cu_seqlens, precomputed chunk_indices and chunk_offsets, optional
core_attn_out) and returns (o [B, T, HV, V], final state [N, HV, V, K] float32 or None).

Two launches, no host sync when vLLM's chunk metadata is given:
  1. `_wy_kernel`, one program per (chunk, value head): chunk-local cumulative decay, the
     within-chunk A, its unit lower-triangular inverse (BF16 Newton-Schulz on the 16x16
     diagonal blocks -- the nsR rounds -- then a Neumann series over the off-diagonal blocks,
     exact after 3 terms because they are strictly block-lower), and the WY vectors w, u.
     Unless the walk computes the output itself, it also folds the output's chunk-local part
     into WY form: with P = causal(q k^T exp(G_i - G_j)) scale and v_new = u - w h, the output
     scale (exp(G) q h + P v_new) is (scale exp(G) q - P w) h + P u, so it stores
     q_folded = scale exp(G) q - P w and P.
  2. `_walk_kernel`, one program per (BV columns of V, sequence, value head): the only
     sequential walk over chunks. The FP32 state is held as two 64-row halves of K, so each
     chunk's products are two independent dot chains; loads feed the dots as BF16 and are
     software-pipelined (`WALK_STAGES`). Per chunk: v_new = u - w h and the output
     q_folded h + P u, which shares h's operand and is off the state's dependency chain;
     no chunk state or v_new leaves the program.
With many sequences (`_fuse_output`) the walk computes the output from q and k itself (q k^T
recomputed), which measured faster there than the fold's extra WY work.
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
WALK_BLOCK_V = None  # None: by occupancy (_walk_block_v)
WALK_NUM_WARPS = 4
WALK_STAGES = 3
FUSED_OUTPUT = None  # None: when enough walk programs share the GPU (_fuse_output)
FUSED_MIN_PROGRAMS_PER_SM = 2
FUSED_WALK_STAGES = 2


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
def _l2_normalised(x, eps):
    """Rows of a BF16 tile scaled to unit L2 norm (FP32 arithmetic, BF16 result)."""
    wide = x.to(tl.float32)
    return (wide * tl.rsqrt(tl.sum(wide * wide, axis=1) + eps)[:, None]).to(tl.bfloat16)


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
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, cum_decay_ptr, w_ptr, u_ptr, folded_q_ptr, causal_ptr,
    cu_seqlens_ptr, chunk_indices_ptr, scale, eps,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    NS_ROUNDS: tl.constexpr, USE_L2NORM: tl.constexpr, PRECISION: tl.constexpr,
    FOLD_OUTPUT: tl.constexpr,
):  # fmt: skip
    """Keys are loaded again after the inverse rather than held across it (L1/L2 hits): 166
    registers instead of 193 without the fold, so three programs share an SM (H200: 8K 134 ->
    113 us)."""
    chunk = tl.program_id(0)
    value_head = tl.program_id(1)
    key_head = value_head // (HV // H)
    rows, valid = _chunk_rows(cu_seqlens_ptr, chunk_indices_ptr, chunk)
    cols_k = tl.arange(0, K)
    cols_v = tl.arange(0, V)
    qk_offsets = (rows[:, None] * H + key_head) * K + cols_k[None, :]
    keys = _load_rows(k_ptr + qk_offsets, valid, USE_L2NORM, eps)
    g = tl.load(g_ptr + rows * HV + value_head, mask=valid, other=0.0).to(tl.float32)
    beta = tl.load(beta_ptr + rows * HV + value_head, mask=valid, other=0.0).to(tl.float32)
    cum_decay = tl.cumsum(g, axis=0)
    tl.store(cum_decay_ptr + rows * HV + value_head, cum_decay, mask=valid)

    r = tl.arange(0, 64)
    gate = tl.exp(cum_decay[:, None] - cum_decay[None, :])
    strict_lower = tl.where(r[:, None] > r[None, :], tl.dot(keys, tl.trans(keys)) * gate, 0.0)
    inverse = _unit_lower_inverse(strict_lower * beta[:, None], NS_ROUNDS, PRECISION)
    inverse = inverse.to(tl.bfloat16)
    keys = _load_rows(k_ptr + qk_offsets, valid, USE_L2NORM, eps)
    weighted_keys = (keys.to(tl.float32) * (beta * tl.exp(cum_decay))[:, None]).to(tl.bfloat16)
    w = tl.dot(inverse, weighted_keys).to(tl.bfloat16)
    w_offsets = (rows[:, None] * HV + value_head) * K + cols_k[None, :]
    tl.store(w_ptr + w_offsets, w, mask=valid[:, None])
    if FOLD_OUTPUT:
        queries = _load_rows(q_ptr + qk_offsets, valid, USE_L2NORM, eps)
        scores = tl.dot(queries, tl.trans(keys)) * (gate * scale)
        causal = tl.where(r[:, None] >= r[None, :], scores, 0.0).to(tl.bfloat16)
        folded_q = queries.to(tl.float32) * (scale * tl.exp(cum_decay))[:, None]
        folded_q -= tl.dot(causal, w)
        tl.store(folded_q_ptr + w_offsets, folded_q.to(tl.bfloat16), mask=valid[:, None])
        causal_tile = causal_ptr + (chunk.to(tl.int64) * HV + value_head) * 64 * 64
        tl.store(causal_tile + r[:, None] * 64 + r[None, :], causal)
    value_offsets = (rows[:, None] * HV + value_head) * V + cols_v[None, :]
    values = tl.load(v_ptr + value_offsets, mask=valid[:, None], other=0.0)
    u = tl.dot(inverse, (values.to(tl.float32) * beta[:, None]).to(tl.bfloat16))
    tl.store(u_ptr + value_offsets, u.to(tl.bfloat16), mask=valid[:, None])


@triton.jit
def _load_rows(pointers, valid, USE_L2NORM: tl.constexpr, eps):
    """A [64, K] BF16 tile of q or k, rows past the sequence zero, L2-normalised if asked."""
    rows = tl.load(pointers, mask=valid[:, None], other=0.0)
    if USE_L2NORM:
        rows = _l2_normalised(rows, eps)
    return rows


@triton.jit
def _walk_kernel(
    q_ptr, k_ptr, w_ptr, u_ptr, folded_q_ptr, causal_ptr, cum_decay_ptr, initial_state_ptr,
    final_state_ptr, o_ptr, cu_seqlens_ptr, chunk_offsets_ptr, scale, eps,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
    HAS_INITIAL_STATE: tl.constexpr, STORE_FINAL_STATE: tl.constexpr,
    USE_L2NORM: tl.constexpr, FUSED_OUTPUT: tl.constexpr, STAGES: tl.constexpr,
):  # fmt: skip
    """Per chunk: v_new = u - w h, the output, then h <- exp(G_last) h + k^T (exp(G_last - G)
    v_new).

    h is [K, BV] FP32 in two halves of 64 rows of K (the second unused when K = 64). The
    output is q_folded h + P u (both from the WY launch), or with FUSED_OUTPUT computed from q
    and k here: then the decay to the chunk's end scales k's rows (k's tile also feeds q k^T,
    and that measured faster), else v_new's, so that k feeds its dot as loaded."""
    v_block = tl.program_id(0)
    seq = tl.program_id(1).to(tl.int64)
    value_head = tl.program_id(2)
    key_head = value_head // (HV // H)
    bos = tl.load(cu_seqlens_ptr + seq).to(tl.int64)
    eos = tl.load(cu_seqlens_ptr + seq + 1).to(tl.int64)
    first_chunk = tl.load(chunk_offsets_ptr + seq).to(tl.int64)
    half = tl.arange(0, 64)
    cols_v = v_block * BV + tl.arange(0, BV)
    state_base = (seq * HV + value_head) * V * K  # [N, HV, V, K], V-first
    upper = tl.zeros([64, BV], dtype=tl.float32)
    lower = tl.zeros([64, BV], dtype=tl.float32)
    if HAS_INITIAL_STATE:
        upper = tl.load(initial_state_ptr + state_base + cols_v[None, :] * K + half[:, None])
        if K == 128:
            state_lower = cols_v[None, :] * K + 64 + half[:, None]
            lower = tl.load(initial_state_ptr + state_base + state_lower)
        upper = upper.to(tl.float32)
        lower = lower.to(tl.float32)

    for chunk in tl.range(0, tl.cdiv(eos - bos, 64), num_stages=STAGES):
        start = bos + chunk * 64
        rows = start + half
        valid = rows < eos
        last_decay = tl.load(cum_decay_ptr + tl.minimum(start + 63, eos - 1) * HV + value_head)
        cum_decay = tl.load(cum_decay_ptr + rows * HV + value_head, mask=valid, other=0.0)
        w_rows = w_ptr + (rows[:, None] * HV + value_head) * K
        k_rows = k_ptr + (rows[:, None] * H + key_head) * K
        v_offsets = (rows[:, None] * HV + value_head) * V + cols_v[None, :]
        w_upper = tl.load(w_rows + half[None, :], mask=valid[:, None], other=0.0)
        k_upper = tl.load(k_rows + half[None, :], mask=valid[:, None], other=0.0)
        u = tl.load(u_ptr + v_offsets, mask=valid[:, None], other=0.0)
        upper_bf16 = upper.to(tl.bfloat16)
        product = tl.dot(w_upper, upper_bf16)
        if not FUSED_OUTPUT:
            folded_rows = folded_q_ptr + (rows[:, None] * HV + value_head) * K
            folded_upper = tl.load(folded_rows + half[None, :], mask=valid[:, None], other=0.0)
            causal_tile = causal_ptr + ((first_chunk + chunk) * HV + value_head) * 64 * 64
            out = tl.dot(tl.load(causal_tile + half[:, None] * 64 + half[None, :]), u)
            out = tl.dot(folded_upper, upper_bf16, out)
        k_lower = k_upper  # K = 64: no second half, never read
        if K == 128:
            w_lower = tl.load(w_rows + 64 + half[None, :], mask=valid[:, None], other=0.0)
            k_lower = tl.load(k_rows + 64 + half[None, :], mask=valid[:, None], other=0.0)
            lower_bf16 = lower.to(tl.bfloat16)
            product = tl.dot(w_lower, lower_bf16, product)
            if not FUSED_OUTPUT:
                folded_lower = tl.load(
                    folded_rows + 64 + half[None, :], mask=valid[:, None], other=0.0
                )
                out = tl.dot(folded_lower, lower_bf16, out)
        key_norm = tl.full([64], 1.0, tl.float32)
        if USE_L2NORM:
            key_norm = _row_rsqrt_norm(k_upper, k_lower, K, eps)
        v_new_wide = u.to(tl.float32) - product
        v_new = v_new_wide.to(tl.bfloat16)
        if FUSED_OUTPUT:
            q_rows = q_ptr + (rows[:, None] * H + key_head) * K
            q_upper = tl.load(q_rows + half[None, :], mask=valid[:, None], other=0.0)
            inter = tl.dot(q_upper, upper_bf16)
            scores = tl.dot(q_upper, tl.trans(k_upper))
            q_lower = q_upper  # K = 64: never read
            if K == 128:
                q_lower = tl.load(q_rows + 64 + half[None, :], mask=valid[:, None], other=0.0)
                inter = tl.dot(q_lower, lower_bf16, inter)
                scores = tl.dot(q_lower, tl.trans(k_lower), scores)
            query_scale = tl.full([64], scale, tl.float32)
            if USE_L2NORM:
                query_scale = query_scale * _row_rsqrt_norm(q_upper, q_lower, K, eps)
            gate = tl.exp(cum_decay[:, None] - cum_decay[None, :]) * key_norm[None, :]
            masked = tl.where(half[:, None] >= half[None, :], scores * gate, 0.0)
            out = inter * tl.exp(cum_decay)[:, None] + tl.dot(masked.to(tl.bfloat16), v_new)
            out *= query_scale[:, None]
        tl.store(o_ptr + v_offsets, out.to(o_ptr.dtype.element_ty), mask=valid[:, None])
        row_scale = tl.exp(last_decay - cum_decay) * key_norm
        decay = tl.exp(last_decay)
        if FUSED_OUTPUT:
            k_to_end = (k_upper.to(tl.float32) * row_scale[:, None]).to(tl.bfloat16)
            upper = upper * decay + tl.dot(tl.trans(k_to_end), v_new)
            if K == 128:
                k_to_end = (k_lower.to(tl.float32) * row_scale[:, None]).to(tl.bfloat16)
                lower = lower * decay + tl.dot(tl.trans(k_to_end), v_new)
        else:
            v_to_end = (v_new_wide * row_scale[:, None]).to(tl.bfloat16)
            upper = upper * decay + tl.dot(tl.trans(k_upper), v_to_end)
            if K == 128:
                lower = lower * decay + tl.dot(tl.trans(k_lower), v_to_end)

    if STORE_FINAL_STATE:
        tl.store(final_state_ptr + state_base + cols_v[None, :] * K + half[:, None], upper)
        if K == 128:
            state_lower = cols_v[None, :] * K + 64 + half[:, None]
            tl.store(final_state_ptr + state_base + state_lower, lower)


@triton.jit
def _row_rsqrt_norm(upper, lower, K: tl.constexpr, eps):
    """1 / L2 norm of each row of a [64, K] BF16 tile given as its 64-column halves."""
    wide = upper.to(tl.float32)
    squares = tl.sum(wide * wide, axis=1)
    if K == 128:
        wide = lower.to(tl.float32)
        squares += tl.sum(wide * wide, axis=1)
    return tl.rsqrt(squares + eps)


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
        self.cum_decay = torch.empty(num_tokens, num_value_heads, device=device)
        self.w = torch.empty(
            num_tokens, num_value_heads, head_k_dim, device=device, dtype=torch.bfloat16
        )
        self.u = torch.empty(
            num_tokens, num_value_heads, head_v_dim, device=device, dtype=torch.bfloat16
        )
        self.fused_output = (
            FUSED_OUTPUT
            if FUSED_OUTPUT is not None
            else _fuse_output(self.num_seqs * num_value_heads, head_v_dim, device)
        )
        if self.fused_output:  # the walk computes the output from q and k: nothing folded
            self.folded_q = self.causal = self.cum_decay
        else:
            self.folded_q = torch.empty_like(self.w)
            self.causal = torch.empty(
                self.num_chunks, num_value_heads, CHUNK, CHUNK, device=device, dtype=torch.bfloat16
            )
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
        self.shapes = dict(
            H=num_heads,
            HV=num_value_heads,
            K=head_k_dim,
            V=head_v_dim,
            USE_L2NORM=use_qk_l2norm_in_kernel,
        )

    def run_wy(self) -> None:
        _wy_kernel[(self.num_chunks, self.shapes["HV"])](
            self.q, self.k, self.v, self.g, self.beta, self.cum_decay, self.w, self.u,
            self.folded_q, self.causal, self.cu_seqlens, self.chunk_indices, self.scale,
            self.eps, **self.shapes, NS_ROUNDS=self.ns_rounds, PRECISION=NEUMANN_PRECISION,
            FOLD_OUTPUT=not self.fused_output, num_warps=WY_NUM_WARPS,
        )  # fmt: skip

    def run_walk(self) -> None:
        head_v_dim = self.shapes["V"]
        block_v = WALK_BLOCK_V or _walk_block_v(
            self.num_seqs * self.shapes["HV"], head_v_dim, self.fused_output, self.q.device
        )
        placeholder = self.cum_decay  # never read or written when its flag is off
        _walk_kernel[(head_v_dim // block_v, self.num_seqs, self.shapes["HV"])](
            self.q, self.k, self.w, self.u, self.folded_q, self.causal, self.cum_decay,
            placeholder if self.initial_state is None else self.initial_state,
            placeholder if self.final_state is None else self.final_state,
            self.o, self.cu_seqlens, self.chunk_offsets, self.scale, self.eps, **self.shapes,
            BV=block_v, HAS_INITIAL_STATE=self.initial_state is not None,
            STORE_FINAL_STATE=self.final_state is not None, FUSED_OUTPUT=self.fused_output,
            STAGES=FUSED_WALK_STAGES if self.fused_output else WALK_STAGES,
            num_warps=WALK_NUM_WARPS,
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


def _walk_block_v(
    programs_per_block: int, head_v_dim: int, fused_output: bool, device: torch.device
) -> int:
    """Columns of V per walk program: 32 when 64-column programs would leave SMs idle (one
    long sequence), else 64 (fewer re-reads of k and w). Picked on the H200 bench."""
    if device.type != "cuda" or fused_output:
        return min(64, head_v_dim)
    return 32 if _wide_walk_programs_per_sm(programs_per_block, head_v_dim, device) < 1 else 64


def _fuse_output(programs_per_block: int, head_v_dim: int, device: torch.device) -> bool:
    """Output from q and k in the walk when 64-column walk programs fill every SM
    FUSED_MIN_PROGRAMS_PER_SM times over (many sequences): the walk's longer step is hidden by
    the other programs there, and the WY launch skips the fold (H200: 64x128 372 against 439
    us folded, 8x1K 295 against 322). One long sequence takes the fold (8K 362 against 387 us
    for the three launches this replaced)."""
    if device.type != "cuda":
        return False
    programs_per_sm = _wide_walk_programs_per_sm(programs_per_block, head_v_dim, device)
    return programs_per_sm >= FUSED_MIN_PROGRAMS_PER_SM


def _wide_walk_programs_per_sm(
    programs_per_block: int, head_v_dim: int, device: torch.device
) -> float:
    """Walk programs per SM at 64 columns of V each (programs_per_block: sequences x value
    heads), on CUDA device `device`."""
    sms = _multiprocessors(device.index if device.index is not None else 0)
    return programs_per_block * max(1, head_v_dim // 64) / sms


@functools.cache
def _multiprocessors(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count
