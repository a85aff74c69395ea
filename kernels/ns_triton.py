"""The nsR chunked GDN prefill in Triton for NVIDIA GPUs, behind FLA's calling contract.

`chunk_gated_delta_rule` takes what vLLM's CUDA path passes to FLA's `chunk_gated_delta_rule`
(q/k [B, T, H, K], v [B, T, HV, V], g and beta [B, T, HV], states [N, HV, V, K] V-first as
vLLM keeps them, cu_seqlens, precomputed chunk_indices and chunk_offsets, optional
core_attn_out) and returns (o [B, T, HV, V], final state [N, HV, V, K] float32 or None).

This file is the host side (shapes, buffers, launch settings, the choice of walk); the
kernels it launches are in kernels/ns_triton_device.py. Two launches, no host sync when vLLM's
chunk metadata is given:
  1. `wy_kernel`, one program per (chunk, value head): chunk-local cumulative decay G, the
     within-chunk A, its unit lower-triangular inverse (BF16 Newton-Schulz on the 16x16
     diagonal blocks -- the nsR rounds -- then a Neumann series over the off-diagonal blocks,
     exact after 3 terms because they are strictly block-lower), the WY vectors w and u, the
     causal P = scale q k^T exp(G_i - G_j), and the per-row scales the walk applies.
  2. `walk_kernel`, the only sequential walk over chunks, three dots per chunk ([w; q] h as
     one 128-row product, P v_new, k^T v_new), loads software-pipelined; no chunk state or
     v_new leaves the program. Two forms (`_walk_layout`): k-first holds h [K, BV] and splits
     V in BV columns, so that one long sequence still fills the GPU; v-first holds h^T
     [V, K], whose dots all take it (and v_new) from registers, for many sequences.
The launch settings below are what the H200 bench picked (kernels/README.md); kernels/bench.py
times the alternatives. Dots take BF16 operands with FP32 accumulation, as FLA's do, the
Neumann products included (`NEUMANN_PRECISION`; TF32 is one of the bench's variants).
"""

import functools

import torch
import triton

from kernels.ns_triton_device import walk_kernel, wy_kernel

CHUNK = 64
WY_NUM_WARPS = 4
NEUMANN_PRECISION = "bf16"
WALK_FORM = None  # None: by waves (_walk_layout); "k-first" or "v-first"
WALK_BLOCK_V = None  # k-first walk's columns of V; None: by waves (_walk_layout)
WALK_NUM_WARPS = 4  # k-first walk
WALK_STAGES = 3  # k-first walk
V_FIRST_STAGES = 3  # v-first walk (all of V per program, 4 warps per 64 columns)


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
        wy_kernel[(self.num_chunks, self.shapes["HV"])](
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
        walk_kernel[(head_v_dim // block_v, self.num_seqs, self.shapes["HV"])](
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
