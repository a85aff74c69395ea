"""Time the Triton nsR prefill against FLA at Qwen3.5's GDN shapes (per TP2 rank: 8 key heads,
32 value heads, K = V = 128) on one CUDA GPU. One run; the numbers that matter are the ratios.

    python -m kernels.bench [--csv PATH] [--variants default,seg8,...] [--workloads 2k,8k,...]

Every kernel gets the inputs vLLM's CUDA path gives it: pre-normalised q/k (no in-kernel L2
norm), FP32 log decays, FP32 initial states, final states out, precomputed chunk metadata.
Kernels: FLA (fla-core), vLLM's own FLA copy where vLLM is importable, ns4 under launch-setting
variants of kernels/ns_triton.py (`default` is what the registry's ns4 runs), ns3 with the
defaults (the price of the 4th Newton-Schulz round), and ns4's two launches timed alone (the
WY launch, the walk with the output). Times are triton.testing.do_bench
medians with the 10th-90th percentile spread; the byte floor is each workload's fewest bytes
(q, k, v, g, beta, o, initial and final states) over the copy bandwidth measured at the start;
the staged floor adds what ns4's launches pass each other through memory (w, u, P, row scales
and decays), and FLA's GPU time over it is the best ratio this
design could reach. FLA and ns4 are also timed as CUDA-graph replays
(`graph_us`: GPU time without the host's launch cost, which varies between runs and is most
of FLA's time at 2K; L2 is not flushed between replays).
"""

import argparse
import importlib
import inspect
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd
import torch

from kernels import ns_triton
from kernels.cases import Shape

QWEN35_SHAPE = Shape(heads=8, value_heads=32, head_dim=128)
WORKLOADS = {
    "2k": [2048],
    "8k": [8192],
    "16k": [16384],
    "64x128": [128] * 64,
    "8x1k": [1024] * 8,
    "2x8k": [8192] * 2,  # a few long prompts prefilled in one step (serving at C = 2-4)
    "4x4k": [4096] * 4,
    "64k": [65536],  # last: the slowest to time
}
# Module attributes of kernels/ns_triton.py tried for ns4; "default" leaves them as they are.
VARIANTS = {
    "default": {},
    "neumann-tf32": {"NEUMANN_PRECISION": "tf32"},
    "neumann-tf32x3": {"NEUMANN_PRECISION": "tf32x3"},
    "wy-2warps": {"WY_NUM_WARPS": 2},
    "wy-8warps": {"WY_NUM_WARPS": 8},
    "walk-k-first": {"WALK_FORM": "k-first"},
    "walk-v-first": {"WALK_FORM": "v-first"},
    "walk-bv16": {"WALK_FORM": "k-first", "WALK_BLOCK_V": 16},
    "walk-bv32": {"WALK_FORM": "k-first", "WALK_BLOCK_V": 32},
    "walk-bv64": {"WALK_FORM": "k-first", "WALK_BLOCK_V": 64},
    "walk-stages2": {"WALK_FORM": "k-first", "WALK_STAGES": 2},
    "walk-stages4": {"WALK_FORM": "k-first", "WALK_STAGES": 4},
    "walk-8warps": {"WALK_FORM": "k-first", "WALK_NUM_WARPS": 8},
    "walk-bv64-8warps": {"WALK_FORM": "k-first", "WALK_BLOCK_V": 64, "WALK_NUM_WARPS": 8},
    "v-first-stages2": {"WALK_FORM": "v-first", "V_FIRST_STAGES": 2},
}
STAGES = ("run_wy", "run_walk")


@dataclass(frozen=True)
class Timing:
    workload: str
    kernel: str
    variant: str
    median_us: float
    p10_us: float
    p90_us: float
    floor_us: float
    fla_over_kernel: float
    graph_us: float = float("nan")
    staged_floor_us: float = float("nan")


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
        ).to(torch.int32),
    }


def floor_bytes(lengths: list[int], shape: Shape) -> int:
    """Each input read once, each output written once: q, k, v, g, beta, o, FP32 states."""
    t, h, hv, d = sum(lengths), shape.heads, shape.value_heads, shape.head_dim
    activations = 2 * t * h * d * 2 + 2 * t * hv * d * 2 + t * hv * (4 + 2)
    return activations + 2 * len(lengths) * hv * d * d * 4


def staged_floor_bytes(lengths: list[int], shape: Shape) -> int:
    """The bytes ns4's two launches move when every tensor each one reads or writes crosses
    memory once per launch: the intermediates (w, u, each chunk's 64 x 64 BF16 P, the row
    scales and chunk decays) as well as the inputs and outputs. Over the copy bandwidth, the
    fastest this design could run whatever its kernels' efficiency."""
    t, n, h, hv, d = sum(lengths), len(lengths), shape.heads, shape.value_heads, shape.head_dim
    chunks = sum(-(-length // 64) for length in lengths)
    key = t * h * d * 2  # q or k, BF16
    per_value_head = t * hv * d * 2  # v or o, BF16
    wy_vectors = 2 * chunks * 64 * hv * d * 2  # w and u, BF16, chunk-major: whole chunks
    causal = chunks * hv * 64 * 64 * 2
    scales = chunks * hv * (2 * 64 + 1) * 4  # output and key row scales, chunk decay
    states = 2 * n * hv * d * d * 4  # FP32 initial state read, final state written
    wy = 2 * key + per_value_head + t * hv * (4 + 2) + wy_vectors + causal + scales
    walk = 2 * key + wy_vectors + causal + scales + per_value_head + states
    return wy + walk


def times_us(function: Callable[[], object]) -> tuple[float, float, float]:
    """(median, 10th, 90th percentile) in microseconds."""
    import triton.testing

    samples = triton.testing.do_bench(function, warmup=25, rep=150, return_mode="all")
    quantiles = torch.tensor(samples).quantile(torch.tensor([0.5, 0.1, 0.9])).tolist()
    return tuple(1000.0 * q for q in quantiles)


def graph_time_us(function: Callable[[], object]) -> float:
    """Median of CUDA-graph replays in microseconds (NaN, with the reason printed, when the
    call cannot be captured, e.g. because it synchronises with the host)."""
    import triton.testing

    try:
        return 1000.0 * triton.testing.do_bench_cudagraph(function, rep=100, return_mode="median")
    except Exception as error:  # capture fails in many ways (host syncs, allocator state)
        print(f"graph capture failed: {type(error).__name__}: {error}", flush=True)
        return float("nan")


def copy_bandwidth() -> float:
    """Bytes per second of a 2 GiB device-to-device copy (read + write counted)."""
    source = torch.empty(1 << 30, dtype=torch.uint8, device="cuda").random_()
    target = torch.empty_like(source)
    median_us = times_us(lambda: target.copy_(source))[0]
    return 2 * source.numel() / (median_us * 1e-6)


# Where vLLM keeps its copy of FLA's ops: third_party from 0.26 on, layers/fla in 0.20-0.25.
VLLM_FLA_MODULES = (
    "vllm.third_party.flash_linear_attention.ops",
    "vllm.model_executor.layers.fla.ops",
)


def reference_kernels() -> dict[str, Callable | str]:
    """FLA (fla-core) and vLLM's FLA copy: the function, or why it is missing."""
    found: dict[str, Callable | str] = {}
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_chunk

        found["fla"] = fla_chunk
    except ImportError as error:
        found["fla"] = f"not importable: {error}"
    errors = []
    for name in VLLM_FLA_MODULES:
        try:
            found["vllm-fla"] = importlib.import_module(name).chunk_gated_delta_rule
            break
        except Exception as error:  # vLLM's import can fail in many ways on a bare machine
            errors.append(f"{name}: {type(error).__name__}: {error}")
    else:
        found["vllm-fla"] = "not importable: " + "; ".join(errors)
    return found


def reference_call(function: Callable, x: dict) -> Callable[[], object]:
    """A call of an FLA-shaped function with the metadata it accepts."""
    accepted = inspect.signature(function).parameters
    extra = {}
    if "chunk_indices" in accepted:
        extra["chunk_indices"] = x["chunk_indices"].long()
    if "chunk_offsets" in accepted:
        extra["chunk_offsets"] = x["chunk_offsets"].long()
    cu_seqlens = x["cu_seqlens"].long()
    return lambda: function(
        x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["state"],
        output_final_state=True, cu_seqlens=cu_seqlens, **extra,
    )  # fmt: skip


def candidate_arguments(x: dict, rounds: int) -> dict:
    """What vLLM's CUDA path passes: FP32 states in and out, precomputed chunk metadata."""
    return dict(
        q=x["q"], k=x["k"], v=x["v"], g=x["g"], beta=x["beta"], initial_state=x["state"],
        output_final_state=True, cu_seqlens=x["cu_seqlens"], chunk_indices=x["chunk_indices"],
        chunk_offsets=x["chunk_offsets"], ns_rounds=rounds,
    )  # fmt: skip


def candidate_launch(x: dict, rounds: int) -> ns_triton.Launch:
    return ns_triton.Launch(**candidate_arguments(x, rounds))


def candidate_call(x: dict, rounds: int) -> Callable[[], object]:
    return lambda: ns_triton.chunk_gated_delta_rule(**candidate_arguments(x, rounds))


def with_settings(settings: dict, function: Callable[[], object]) -> Callable[[], object]:
    """`function` run with kernels/ns_triton.py's module attributes set to `settings`."""

    def run():
        saved = {name: getattr(ns_triton, name) for name in settings}
        for name, value in settings.items():
            setattr(ns_triton, name, value)
        try:
            return function()
        finally:
            for name, value in saved.items():
                setattr(ns_triton, name, value)

    return run


def run_bench(workloads: list[str], variants: list[str], bandwidth: float) -> list[Timing]:
    references = reference_kernels()
    for name, found in references.items():
        if isinstance(found, str):
            print(f"{name}: {found}", flush=True)
    timings = []
    for workload in workloads:
        timings.extend(bench_workload(workload, references, variants, bandwidth))
        torch.cuda.empty_cache()
    return timings


def bench_workload(
    workload: str, references: dict, variants: list[str], bandwidth: float
) -> list[Timing]:
    lengths = WORKLOADS[workload]
    x = bench_inputs(lengths, QWEN35_SHAPE)
    floor_us = 1e6 * floor_bytes(lengths, QWEN35_SHAPE) / bandwidth
    launch = candidate_launch(x, 4)
    staged_bytes = staged_floor_bytes(lengths, QWEN35_SHAPE)
    staged_floor_us = 1e6 * staged_bytes / bandwidth
    timings = []

    def record(
        kernel: str, variant: str, function: Callable[[], object], graphed: bool = False
    ) -> None:
        """Time one kernel (also as graph replays when `graphed`); one that fails (compile,
        launch, import) is reported, not fatal, so that one GPU session times everything that
        does run."""
        try:
            median, p10, p90 = times_us(function)
        except Exception as error:
            print(f"{workload} {kernel} {variant} FAILED: {type(error).__name__}: {error}")
            return
        graph = graph_time_us(function) if graphed else float("nan")
        fla = [t.median_us for t in timings if t.kernel == "fla"]
        ratio = (fla[0] if fla else float("nan")) / median
        timings.append(
            Timing(
                workload, kernel, variant, median, p10, p90, floor_us, ratio, graph, staged_floor_us
            )
        )
        print(f"{workload:>7} {kernel:>13} {variant:>13} {median:9.1f} us", flush=True)

    for name, found in references.items():
        if not isinstance(found, str):
            record(name, "-", reference_call(found, x), graphed=True)
    for variant in variants:
        function = with_settings(VARIANTS[variant], candidate_call(x, 4))
        record("ns4", variant, function, graphed=True)
    record("ns3", "default", candidate_call(x, 3))
    for stage in STAGES:
        getattr(launch, stage)()
    for stage in STAGES:
        record(f"ns4:{stage.removeprefix('run_')}", "default", getattr(launch, stage))
    return timings


def summary(frame: pd.DataFrame) -> pd.DataFrame:
    """Per workload: FLA, vLLM's FLA, ns4 (default), its best variant, ns3, the floor."""
    rows = []
    stage_names = [f"ns4:{stage.removeprefix('run_')}" for stage in STAGES]
    for workload, group in frame.groupby("workload", sort=False):

        def median(
            kernel: str, variant: str | None = None, column: str = "median_us", group=group
        ) -> float:
            hit = group[(group.kernel == kernel) & ((variant is None) | (group.variant == variant))]
            return float(hit[column].iloc[0]) if len(hit) else float("nan")

        ns4 = group[group.kernel == "ns4"]
        ns4_us = ns4.graph_us.fillna(ns4.median_us)  # graph replays where captured
        best = ns4.loc[ns4_us.idxmin()]
        default = median("ns4", "default")
        fla_graph, ns4_graph = (
            median("fla", column="graph_us"),
            median("ns4", "default", "graph_us"),
        )
        rows.append(
            {
                "workload": workload,
                "floor_us": float(group.floor_us.iloc[0]),
                "fla_us": median("fla"),
                "vllm_fla_us": median("vllm-fla"),
                "ns4_us": default,
                "fla/ns4": median("fla") / default,
                "fla_graph_us": fla_graph,
                "ns4_graph_us": ns4_graph,
                "fla/ns4_graph": fla_graph / ns4_graph,
                "staged_floor_us": float(group.staged_floor_us.iloc[0]),
                "fla_graph/staged_floor": fla_graph / float(group.staged_floor_us.iloc[0]),
                "best_variant": best.variant,
                "best_us": float(ns4_us.min()),
                "ns3_us": median("ns3", "default"),
                "ns4/ns3": default / median("ns3", "default"),
                "wy/walk_us": "/".join(f"{median(name):.0f}" for name in stage_names),
            }
        )
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernels.bench", description=__doc__)
    parser.add_argument("--csv", type=Path, default=Path("results/kernels/bench.csv"))
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"of {', '.join(VARIANTS)}")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help=", ".join(WORKLOADS))
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    variants, workloads = args.variants.split(","), args.workloads.split(",")
    unknown = [v for v in variants if v not in VARIANTS] + [
        w for w in workloads if w not in WORKLOADS
    ]
    if unknown:
        parser.error(f"unknown variants/workloads: {', '.join(unknown)}")
    bandwidth = copy_bandwidth()
    frame = pd.DataFrame(asdict(t) for t in run_bench(workloads, variants, bandwidth))
    args.csv.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(args.csv, index=False)
    with pd.option_context("display.width", 250, "display.max_rows", None):
        print(frame.to_string(index=False, float_format="%.4g"))
        print(
            f"\n{torch.cuda.get_device_name()}; H=8 HV=32 K=V=128; copy bandwidth "
            f"{bandwidth / 1e12:.2f} TB/s; CSV: {args.csv}"
        )
        print(summary(frame).to_string(index=False, float_format="%.3g"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
