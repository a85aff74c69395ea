"""`rig compare RUN_A RUN_B`: two stored runs compared request by request, without a server.
Reads each run's requests.jsonl and replay.jsonl and hands them to rig.verdict.compare, which
only computes; `rig bisect` finds the pair to bisect the same way. Speed per level follows the
text (rig/run/compare_speed.py), worded only for one run's own two sides."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from rig.load.replay_records import REPLAY_FILE, read_replay
from rig.records import REQUESTS_FILE, ExitCode, RequestRecord, Side, read_records
from rig.run.compare_speed import compared_design, speed_lines
from rig.scenario.gates_config import GatesConfig
from rig.verdict.compare import PairResult, compare_pairs


def side_records(run_dir: Path, side: str) -> list[RequestRecord]:
    """The timed records of one side of a stored run."""
    path = Path(run_dir) / REQUESTS_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such results file (is {run_dir} a rig run folder?)")
    chosen = [r for r in read_records(path) if r.side == side and not r.warmup]
    if not chosen:
        raise ValueError(f"{path}: no records for side {side!r}")
    return chosen


def run_pairs(run_dir: Path, near_tie_margin: float, max_tokens: int | None) -> list[PairResult]:
    """One stored run's own pairs, reference against candidate, as its verdict compared them."""
    replayed = read_replay(Path(run_dir) / REPLAY_FILE)
    return compare_pairs(
        side_records(run_dir, Side.REFERENCE),
        side_records(run_dir, Side.CANDIDATE),
        near_tie_margin,
        max_tokens,
        replayed,
    )


def main(argv: list[str] | None = None) -> int:
    """Compare stored runs without any server: side A of RUN_A against side B of RUN_B, text
    and speed. Exit 0 only when every pair is identical or a near-tie (a failed request proves
    nothing); speed, as in a run, never changes the exit code."""
    parser = argparse.ArgumentParser(
        prog="python -m rig.run.compare_runs",
        description="Compare two stored rig runs, request by request.",
    )
    parser.add_argument("run_a", type=Path)
    parser.add_argument("run_b", type=Path)
    parser.add_argument("--side-a", default=Side.REFERENCE)
    parser.add_argument("--side-b", default=Side.CANDIDATE)
    parser.add_argument(
        "--near-tie-margin",
        type=float,
        default=GatesConfig.model_fields["near_tie_margin"].default,
        help="nats (default %(default)s, as gates.near_tie_margin)",
    )
    args = parser.parse_args(argv)
    try:
        reference = side_records(args.run_a, args.side_a)
        candidate = side_records(args.run_b, args.side_b)
        if args.side_b == args.side_a:  # two runs' same side: keep their replays apart
            candidate = [replace(r, side=f"{r.side} (B)") for r in candidate]
        # A side's replay follows its run's reference completions: it serves wherever the
        # other run's reference wrote the same completion.
        replayed = {
            args.side_a: read_replay(args.run_a / REPLAY_FILE).get(args.side_a, {}),
            candidate[0].side: read_replay(args.run_b / REPLAY_FILE).get(args.side_b, {}),
        }
        pairs = compare_pairs(reference, candidate, args.near_tie_margin, replayed=replayed)
        design = compared_design(args.run_a, args.run_b, args.side_a, args.side_b)
    except (OSError, ValueError) as exc:
        print(f"rig: error: {exc}", file=sys.stderr)
        return ExitCode.ERROR
    identical = sum(p.identical for p in pairs)
    near = sum(1 for p in pairs if p.near_tie)
    variants = sum(p.reference_variant for p in pairs)
    substantive = sum(p.substantive for p in pairs)
    unclassified = sum(p.unclassified for p in pairs)
    unanswered = sum(1 for p in pairs if not p.identical and p.divergence is None)
    print(
        f"{args.run_a}:{args.side_a} vs {args.run_b}:{args.side_b}: {len(pairs)} pairs, "
        f"{identical} identical, {near} near-tie, {variants} reference variant, "
        f"{substantive} substantive, "
        f"{unclassified} unclassified (no replay margin), {unanswered} with a failed request"
    )
    for pair in [p for p in pairs if not p.identical][:10]:
        d = pair.divergence
        where = f"token {d.token_index} ({d.kind}, margin {d.reference_margin})" if d else "-"
        print(f"  {pair.request_id} {pair.prompt_id}: {where}")
    print("\n".join(speed_lines(reference, candidate, design)))
    if substantive or unanswered:
        return ExitCode.FAILED
    return ExitCode.INVALID if unclassified else ExitCode.PASS


if __name__ == "__main__":
    sys.exit(main())
