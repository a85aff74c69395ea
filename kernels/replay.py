"""Replay GDN prefill inputs captured from a live server (RIG_GDN_CAPTURE) through kernels.

    python -m kernels.replay DIR [--candidate ns4] [--device cpu|cuda] [--csv PATH]

Each capture runs through the candidate, the reference (vLLM's CPU op on CPU, FLA on CUDA)
and the float64 recurrence; rows give output/state max abs error and worst per-head relative
L2 for candidate and reference against the recurrence and candidate against reference, then
the worst value per layer. Non-finite results are flagged; the exit status is 1 when the
candidate produced any, or when DIR holds no capture.
"""

import argparse
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd
import torch

from kernels.accuracy import gdn_error
from kernels.capture import Capture, list_captures, load_capture
from kernels.runners import (
    KernelRunner,
    candidate_runner,
    recurrence_runner,
    reference_runner,
)


@dataclass(frozen=True)
class ReplayRow:
    layer: str
    call_index: int
    pid: int
    served_by: str
    tokens: int
    seqs: int
    kernel: str
    against: str
    output_max_abs: float
    output_head_rel_l2: float
    state_max_abs: float
    state_head_rel_l2: float
    finite: bool


def replay_capture(
    capture: Capture,
    device: str,
    candidate: KernelRunner,
    reference: KernelRunner | None,
    truth_runner: KernelRunner,
) -> list[ReplayRow]:
    inputs = capture.inputs.to(device)
    results = {truth_runner.name: truth_runner.run(inputs), candidate.name: candidate.run(inputs)}
    pairs = [(candidate.name, truth_runner.name)]
    if reference is not None:
        results[reference.name] = reference.run(inputs)
        pairs += [(reference.name, truth_runner.name), (candidate.name, reference.name)]
    rows = []
    for kernel, against in pairs:
        error = gdn_error(results[kernel], results[against])
        rows.append(
            ReplayRow(
                layer=capture.meta.layer,
                call_index=capture.meta.call_index,
                pid=capture.meta.pid,
                served_by=capture.meta.kernel,
                tokens=inputs.num_tokens,
                seqs=inputs.num_seqs,
                kernel=kernel,
                against=against,
                output_max_abs=error.output.max_abs,
                output_head_rel_l2=error.output.head_rel_l2,
                state_max_abs=error.state.max_abs,
                state_head_rel_l2=error.state.head_rel_l2,
                finite=error.finite,
            )
        )
    return rows


def replay_directory(directory: Path, candidate_name: str, device: str) -> list[ReplayRow]:
    candidate = candidate_runner(candidate_name, device)
    reference = reference_runner(device)
    truth = recurrence_runner()
    rows = []
    for path in list_captures(directory):
        rows.extend(replay_capture(load_capture(path), device, candidate, reference, truth))
    return rows


def per_layer_worst(frame: pd.DataFrame) -> pd.DataFrame:
    metrics = ["output_max_abs", "output_head_rel_l2", "state_max_abs", "state_head_rel_l2"]
    grouped = frame.groupby(["layer", "kernel", "against"], sort=True)
    worst = grouped[metrics].max()
    worst["finite"] = grouped["finite"].all()
    worst["calls"] = grouped.size()
    return worst.reset_index()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernels.replay", description=__doc__)
    parser.add_argument("directory", type=Path)
    parser.add_argument("--candidate", default="ns4")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--csv", type=Path, default=None, help="write per-capture rows here")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device visible")

    rows = replay_directory(args.directory, args.candidate, args.device)
    if not rows:
        print(f"no captures (*.safetensors) in {args.directory}", file=sys.stderr)
        return 1
    frame = pd.DataFrame([asdict(r) for r in rows])
    if args.csv is not None:
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        frame.to_csv(args.csv, index=False)
    with pd.option_context("display.width", 250, "display.max_rows", None):
        print(frame.to_string(index=False, float_format="%.3g"))
        print("\nworst per layer:")
        print(per_layer_worst(frame).to_string(index=False, float_format="%.3g"))
    nonfinite = frame[~frame.finite]
    for row in nonfinite.itertuples():
        print(f"NON-FINITE: {row.kernel} on {row.layer} call {row.call_index} (pid {row.pid})")
    return 1 if (nonfinite.kernel == args.candidate).any() else 0


if __name__ == "__main__":
    sys.exit(main())
