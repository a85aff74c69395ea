"""Time the Triton nsR prefill against FLA at Qwen3.5's GDN shapes (per TP2 rank: 8 key heads,
32 value heads, K = V = 128) on a CUDA GPU. One run; the numbers that matter are the ratios.

    python -m kernels.bench [--csv PATH] [--variants split,split-bv16]

Both kernels get the same inputs as vLLM's CUDA path gives them: pre-normalised q/k (no
in-kernel L2 norm), FP32 log decays, V-first FP32 states for nsR (FLA: K-first, its default),
precomputed chunk indices. Times are medians of triton.testing.do_bench.
"""

import argparse
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd
import torch

from kernels import ns_triton
from kernels.cases import Shape

QWEN35_SHAPE = Shape(heads=8, value_heads=32, head_dim=128)
WORKLOADS = {"2k": [2048], "8k": [8192], "16k": [16384], "64x128": [128] * 64}


# Launch settings tried for ns4 (module attributes of kernels/ns_triton.py); ns3 runs with
# the defaults, to price the extra NS round.
VARIANTS = {
    "split": {},
    "split-stages1": {"STATE_STAGES": 1},
    "split-bv16": {"STATE_BLOCK_V": 16},
    "split-state2warps": {"STATE_NUM_WARPS": 2},
    "split-out8warps": {"OUTPUT_NUM_WARPS": 8},
}


@dataclass(frozen=True)
class Timing:
    workload: str
    kernel: str
    variant: str
    median_us: float
    fla_over_kernel: float


def bench_inputs(lengths: list[int], shape: Shape, seed: int = 0) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    t, h, hv, d = sum(lengths), shape.heads, shape.value_heads, shape.head_dim

    def randn(*size):
        return torch.randn(*size, generator=gen, device="cuda")

    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device="cuda")
    return {
        "q": torch.nn.functional.normalize(randn(1, t, h, d), dim=-1).bfloat16(),
        "k": torch.nn.functional.normalize(randn(1, t, h, d), dim=-1).bfloat16(),
        "v": randn(1, t, hv, d).bfloat16(),
        "g": torch.nn.functional.logsigmoid(randn(1, t, hv) + 4.0),
        "beta": torch.sigmoid(randn(1, t, hv)).bfloat16(),
        "state": 0.1 * randn(len(lengths), hv, d, d),
        "cu_seqlens": cu.to(torch.int32),
        "chunk_indices": ns_triton.prepare_chunk_indices(cu.to(torch.int32)),
        "chunk_offsets": torch.nn.functional.pad(
            torch.cumsum((cu[1:] - cu[:-1] + 63) // 64, 0), (1, 0)
        ),
    }


def median_us(function) -> float:
    import triton.testing

    return 1000.0 * triton.testing.do_bench(function, warmup=50, rep=300, return_mode="median")


def run_bench(variants: list[str]) -> list[Timing]:
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_chunk

    defaults = {name: getattr(ns_triton, name) for v in VARIANTS.values() for name in v}
    timings = []
    for workload, lengths in WORKLOADS.items():
        x = bench_inputs(lengths, QWEN35_SHAPE)
        fla_indices = x["chunk_indices"].long()

        def fla(x=x, fla_indices=fla_indices):
            return fla_chunk(
                x["q"], x["k"], x["v"], x["g"], x["beta"],
                initial_state=x["state"], output_final_state=True,
                cu_seqlens=x["cu_seqlens"].long(), chunk_indices=fla_indices,
            )  # fmt: skip

        fla_us = median_us(fla)
        timings.append(Timing(workload, "fla", "-", fla_us, 1.0))
        runs = [(4, v) for v in variants] + [(3, "split")]
        for rounds, variant in runs:
            for name, value in {**defaults, **VARIANTS[variant]}.items():
                setattr(ns_triton, name, value)

            def candidate(x=x, rounds=rounds):
                return ns_triton.chunk_gated_delta_rule(
                    x["q"], x["k"], x["v"], x["g"], x["beta"],
                    initial_state=x["state"], output_final_state=True,
                    cu_seqlens=x["cu_seqlens"], chunk_indices=x["chunk_indices"],
                    chunk_offsets=x["chunk_offsets"], ns_rounds=rounds,
                )  # fmt: skip

            us = median_us(candidate)
            timings.append(Timing(workload, f"ns{rounds}", variant, us, fla_us / us))
    for name, value in defaults.items():
        setattr(ns_triton, name, value)
    return timings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernels.bench", description=__doc__)
    parser.add_argument("--csv", type=Path, default=Path("results/kernels/bench.csv"))
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"of {', '.join(VARIANTS)}")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    frame = pd.DataFrame(asdict(t) for t in run_bench(args.variants.split(",")))
    args.csv.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(args.csv, index=False)
    print(f"{torch.cuda.get_device_name()}; shapes H=8 HV=32 K=V=128")
    print(frame.to_string(index=False, float_format="%.3g"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
