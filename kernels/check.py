"""Kernel-level checks: candidate vs reference vs the float64 recurrence, output and final state.

    python -m kernels.check [--device cpu|cuda] [--kernel ns4 | --kernel mypkg.gdn:chunk_fwd]
                            [--cases varlen,chunk] [--csv PATH] [--long-tokens N]

Every case of kernels/cases.py runs the candidate, the reference (vLLM's CPU op on CPU, FLA on
CUDA) and the case's controls (ns3 on correlated keys, the planted initial-state faults on the
initial-state cases) through the same adapters vLLM calls. Rows: candidate and reference
against the recurrence, candidate against the reference, per part (token windows, sequences)
and for the whole case. The gate: the candidate is within the case's bounds everywhere, every
control expected to fail is outside them and every one expected to pass inside; reference rows
are information. Prints the table, writes the CSV, exits 1 when a gate
fails.
"""

import argparse
import math
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd
import torch

from kernels.accuracy import GdnError, gdn_error
from kernels.cases import Bounds, CheckCase, Part, check_cases
from kernels.functions import KernelFunctionError
from kernels.registry import UnknownKernelError
from kernels.runners import (
    GdnResult,
    KernelRunner,
    candidate_runner,
    recurrence_runner,
    reference_runner,
)

WHOLE = "all"


@dataclass(frozen=True)
class CheckRow:
    device: str
    case: str
    part: str
    kernel: str
    against: str
    output_max_abs: float
    output_head_rel_l2: float
    state_max_abs: float
    state_head_rel_l2: float
    finite: bool
    expected: str  # "pass", "fail" (negative control) or "info"
    within_bounds: bool
    gate_ok: bool


def within_bounds(error: GdnError, bounds: Bounds, judge_state: bool) -> bool:
    output_ok = (
        error.output.max_abs <= bounds.output_max_abs
        and error.output.head_rel_l2 <= bounds.output_head_rel_l2
    )
    state_ok = not judge_state or (
        error.state.max_abs <= bounds.state_max_abs
        and error.state.head_rel_l2 <= bounds.state_head_rel_l2
    )
    return error.finite and output_ok and state_ok


def _part_of(result: GdnResult, part: Part) -> GdnResult:
    return result[0][part.tokens], result[1][part.seqs]


def compare_row(
    device: str,
    case: CheckCase,
    part: Part,
    kernel: str,
    against: str,
    actual: GdnResult,
    expected_result: GdnResult,
    expected: str,
) -> CheckRow:
    judge_state = part.seqs.stop > part.seqs.start
    error = gdn_error(_part_of(actual, part), _part_of(expected_result, part))
    within = within_bounds(error, case.bounds, judge_state)
    gate_ok = {"pass": within, "fail": not within, "info": True}[expected]
    return CheckRow(
        device=device,
        case=case.name,
        part=part.label,
        kernel=kernel,
        against=against,
        output_max_abs=error.output.max_abs,
        output_head_rel_l2=error.output.head_rel_l2,
        state_max_abs=error.state.max_abs if judge_state else math.nan,
        state_head_rel_l2=error.state.head_rel_l2 if judge_state else math.nan,
        finite=error.finite,
        expected=expected,
        within_bounds=within,
        gate_ok=gate_ok,
    )


def run_case(
    case: CheckCase,
    device: str,
    candidate: KernelRunner,
    reference: KernelRunner | None,
    truth_runner: KernelRunner,
) -> list[CheckRow]:
    inputs = case.inputs.to(device)
    truth = truth_runner.run(inputs)
    results = {candidate.name: candidate.run(inputs)}
    if reference is not None:
        results[reference.name] = reference.run(inputs)
    controls = [(name, expected) for name, expected in case.controls if name != candidate.name]
    for name, _ in controls:
        results[name] = candidate_runner(name, device).run(inputs)

    whole = Part(label=WHOLE, tokens=slice(None), seqs=slice(0, inputs.num_seqs))
    rows = []
    for part in (*case.parts, whole):

        def row(kernel: str, against: str, expected: str, part: Part = part) -> CheckRow:
            expected_result = truth if against == truth_runner.name else results[against]
            return compare_row(
                device, case, part, kernel, against, results[kernel], expected_result, expected
            )

        rows.append(row(candidate.name, truth_runner.name, "pass"))
        if reference is not None:
            rows.append(row(reference.name, truth_runner.name, "info"))
            rows.append(row(candidate.name, reference.name, "info"))
        if part is whole:
            rows.extend(row(name, truth_runner.name, expected) for name, expected in controls)
    return rows


def run_checks(
    device: str, candidate_name: str, case_filter: list[str], long_tokens: int | None
) -> list[CheckRow]:
    candidate = candidate_runner(candidate_name, device)
    reference = reference_runner(device)
    truth = recurrence_runner()
    rows = []
    for case in check_cases(device, long_tokens):
        if case_filter and not any(f in case.name for f in case_filter):
            continue
        rows.extend(run_case(case, device, candidate, reference, truth))
    return rows


def rows_frame(rows: list[CheckRow]) -> pd.DataFrame:
    return pd.DataFrame([asdict(r) for r in rows])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernels.check", description=__doc__)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument(
        "--kernel",
        "--candidate",
        dest="candidate",
        default="ns4",
        help="a kernel name (ns4) or your own FLA-contract function (module:function)",
    )
    parser.add_argument(
        "--cases", default="", help="comma-separated substrings of case names (default: all)"
    )
    parser.add_argument("--csv", type=Path, default=None, help="default results/kernels/...")
    parser.add_argument("--long-tokens", type=int, default=None, help="slow-decay case length")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device visible")

    try:
        rows = run_checks(
            args.device, args.candidate, [c for c in args.cases.split(",") if c], args.long_tokens
        )
    except (UnknownKernelError, KernelFunctionError) as error:
        parser.error(f"--kernel {args.candidate}: {error}")
    frame = rows_frame(rows)
    label = re.sub(r"[^\w.+-]", "_", args.candidate)
    csv_path = args.csv or Path("results/kernels") / f"check-{args.device}-{label}.csv"
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(csv_path, index=False)
    with pd.option_context("display.width", 250, "display.max_rows", None):
        print(frame.drop(columns=["device"]).to_string(index=False, float_format="%.3g"))
    failed = frame[~frame.gate_ok]
    print(f"\n{len(frame)} rows, {len(failed)} gate failures; CSV: {csv_path}")
    for row in failed.itertuples():
        print(
            f"GATE FAILED: {row.case} [{row.part}] {row.kernel} vs {row.against} "
            f"(expected {row.expected})"
        )
    return 1 if len(failed) else 0


if __name__ == "__main__":
    sys.exit(main())
