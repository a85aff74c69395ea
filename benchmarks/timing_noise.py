"""How steady is this machine, with no server on it? The same fixed unit of work, timed many
times back to back, in three kinds: host only (a Python loop: the CPU the scheduler and the
client run on), launch-bound (many tiny CUDA kernels: what a tiny model's GDN prefill is), and
GPU-bound (large matmuls). Each kind runs on every core the process may use, then pinned to one
core. A block pair of the speed verdict compares two such units; their spread here is the floor
under the spread a speed run can reach (docs/perf-control.md). Prints, per kind and pinning:
the units' median time, their coefficient of variation, the spread of the log ratio of two
adjacent units (what an A/A block pair sees) and the lag-1 correlation of the units.

    python benchmarks/timing_noise.py [--units 120] [--unit-ms 300]
"""

import argparse
import math
import os
import statistics
import time

import torch


def host_unit(iterations: int) -> None:
    total = 0
    for index in range(iterations):
        total += index * index % 7


def launch_unit(iterations: int, tensor: torch.Tensor) -> None:
    for _ in range(iterations):
        tensor.add_(1.0)
    torch.cuda.synchronize()


def gpu_unit(iterations: int, matrix: torch.Tensor) -> None:
    for _ in range(iterations):
        torch.mm(matrix, matrix)
    torch.cuda.synchronize()


def calibrated(unit, unit_ms: float) -> int:
    """The iteration count that makes one unit last about `unit_ms`."""
    iterations = 16
    while True:
        start = time.perf_counter()
        unit(iterations)
        elapsed_ms = 1000 * (time.perf_counter() - start)
        if elapsed_ms > unit_ms / 4:
            return max(1, round(iterations * unit_ms / elapsed_ms))
        iterations *= 4


def spread(times: list[float]) -> tuple[float, float, float, float]:
    """Median (ms), CV (%), SD of adjacent units' log ratio (%), lag-1 correlation."""
    logs = [math.log(t) for t in times]
    pairs = [logs[i + 1] - logs[i] for i in range(0, len(logs) - 1, 2)]
    mean = statistics.fmean(logs)
    numerator = sum((a - mean) * (b - mean) for a, b in zip(logs, logs[1:], strict=False))
    denominator = sum((a - mean) ** 2 for a in logs)
    return (
        1000 * statistics.median(times),
        100 * statistics.stdev(times) / statistics.fmean(times),
        100 * statistics.stdev(pairs),
        numerator / denominator if denominator else 0.0,
    )


def measure(unit, units: int) -> list[float]:
    unit()
    times = []
    for _ in range(units):
        start = time.perf_counter()
        unit()
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--units", type=int, default=120)
    parser.add_argument("--unit-ms", type=float, default=300.0)
    args = parser.parse_args()
    kinds = {"host": host_unit}
    if torch.cuda.is_available():
        tensor = torch.zeros(16, device="cuda")
        matrix = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        kinds["launch-bound"] = lambda n: launch_unit(n, tensor)
        kinds["gpu-bound"] = lambda n: gpu_unit(n, matrix)
    all_cores = os.sched_getaffinity(0)
    print(f"cores: {len(all_cores)}; {args.units} units of ~{args.unit_ms:g} ms per row")
    print("| kind | cores | median ms | CV % | adjacent log-ratio SD % | lag-1 corr |")
    print("|---|---|---|---|---|---|")
    for pinning, cores in (("all", all_cores), ("one", {max(all_cores)})):
        os.sched_setaffinity(0, cores)
        for name, unit in kinds.items():
            iterations = calibrated(unit, args.unit_ms)
            times = measure(lambda unit=unit, n=iterations: unit(n), args.units)
            median, cv, pair_sd, lag1 = spread(times)
            print(
                f"| {name} | {pinning} | {median:.1f} | {cv:.2f} | {pair_sd:.2f} | {lag1:+.2f} |",
                flush=True,
            )
    os.sched_setaffinity(0, all_cores)


if __name__ == "__main__":
    main()
