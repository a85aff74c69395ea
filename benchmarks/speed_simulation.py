"""Do the speed intervals keep their stated error rate? A deterministic simulation of two servers
sharing one GPU, timed under each schedule and judged with each unit the rig could use.

The machine: a speed that drifts over time (an AR(1) on the log scale, per block), requests
whose latency is their prompt's base time x that speed x noise, and, when both sides are timed
at once, contention: each block of a side runs with a random share of the GPU, and the other
side gets the rest (the two sides move in opposite directions, as measured on an H200). The
kernels are the same (A/A) unless an effect is planted on the candidate.

Designs (each row of the table):
  together, request units   both sides at once; every request pair an independent unit
  together, block units     both sides at once; Student's t over block pairs, fixed count
  alternate, block units    one side at a time, ABBA; Stein's two-stage design to a resolution
  alternate, running spread the same, but stopping on the running spread (not Stein): why not
  pairs, pair units         C=1, each prompt to both sides back to back; Stein on pairs
  Stein, budget             Stein's design whose budget often ends first (stage one's spread
                            still: the coverage holds over all stage ones, not each)

    python benchmarks/speed_simulation.py [--trials 2000] [--confidence 0.95]
        [--resolution 3] [--effect 0]

The rates are per interval at --confidence; the rig's words are family-wise (Bonferroni over
4 headline metrics x the levels), so each of its intervals sits at a higher confidence.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rig.verdict.intervals import SumRatio, block_estimate, pair_estimate  # noqa: E402

REQUESTS_PER_BLOCK = 32
STAGE_ONE_BLOCKS = 6
MOST_BLOCKS = 60
DRIFT_SD, DRIFT_KEEP = 0.03, 0.9  # the machine's log-speed: AR(1) per block
REQUEST_SD = 0.05  # one request's own noise, log scale
SHARE_SD = 0.15  # together: the spread of a side's share of the GPU in a block, log scale


@dataclass(frozen=True)
class Machine:
    """One simulated session: prompts' base latencies and the drifting speed."""

    rng: np.random.Generator
    base: np.ndarray

    @classmethod
    def new(cls, seed: int) -> Machine:
        rng = np.random.default_rng(seed)
        return cls(rng, np.exp(rng.normal(np.log(60.0), 0.5, REQUESTS_PER_BLOCK)))

    def speeds(self, blocks: int) -> np.ndarray:
        level, values = 0.0, []
        for _ in range(blocks):
            level = DRIFT_KEEP * level + self.rng.normal(0, DRIFT_SD)
            values.append(level)
        return np.exp(np.array(values))

    def block(self, speed: float, effect: float = 1.0, share: float = 1.0) -> np.ndarray:
        noise = np.exp(self.rng.normal(0, REQUEST_SD, self.base.size))
        return self.base * speed * effect * noise / share


def together(machine: Machine, blocks: int, effect: float) -> tuple[np.ndarray, np.ndarray]:
    """Both sides at once: each block's GPU split between them at random."""
    ref, cand = [], []
    for speed in machine.speeds(blocks):
        split = 1 / (1 + math.exp(machine.rng.normal(0, SHARE_SD)))
        ref.append(machine.block(speed, share=2 * split))
        cand.append(machine.block(speed, effect, share=2 * (1 - split)))
    return np.array(ref), np.array(cand)


def alternate(machine: Machine, blocks: int, effect: float) -> tuple[np.ndarray, np.ndarray]:
    """One side at a time, ABBA: each side's block at its own moment of the drift."""
    speeds = machine.speeds(2 * blocks)
    ref, cand = [], []
    for k in range(blocks):
        first, second = speeds[2 * k], speeds[2 * k + 1]
        ref_speed, cand_speed = (first, second) if k % 2 == 0 else (second, first)
        ref.append(machine.block(ref_speed))
        cand.append(machine.block(cand_speed, effect))
    return np.array(ref), np.array(cand)


def pairs(machine: Machine, blocks: int, effect: float) -> tuple[np.ndarray, np.ndarray]:
    """C=1, back to back: both halves of a pair at (nearly) the same moment."""
    speeds = machine.speeds(blocks)
    ref = np.array([machine.block(s) for s in speeds])
    cand = np.array([machine.block(s, effect) for s in speeds])
    return ref, cand


def block_logs(ref: np.ndarray, cand: np.ndarray) -> np.ndarray:
    return np.log(cand.mean(axis=1) / ref.mean(axis=1))


def request_interval(ref, cand, confidence) -> tuple[float, float, float]:
    """Every request pair an independent unit: what a naive interval does."""
    estimate = block_estimate(np.log(cand / ref).ravel())
    return estimate.interval(confidence)


def fixed_blocks(ref, cand, confidence) -> tuple[float, float, float]:
    return block_estimate(block_logs(ref, cand)).interval(confidence)


def _pair_estimate(ref: np.ndarray, cand: np.ndarray, stage_one_blocks: int | None):
    """Mean latency's ratio of sums over the request pairs of these blocks."""
    ratio = SumRatio(((1, cand.ravel()), (-1, ref.ravel())))
    stage_one = stage_one_blocks * ref.shape[1] if stage_one_blocks else None
    return pair_estimate(ratio, stage_one)


def stein(ref, cand, confidence, resolution, unit: str, budget: int = MOST_BLOCKS):
    """Stein's two-stage design: stage one's spread says how many blocks the asked-for
    half-width needs; the interval over them keeps stage one's spread, also where the budget
    ends first (as the rig does: taking every block's spread there would under-cover)."""
    half, first = math.log1p(resolution / 100), STAGE_ONE_BLOCKS
    if unit == "pair":
        pairs_needed = _pair_estimate(ref[:first], cand[:first], None).units_for(half, confidence)
        needed = max(first, math.ceil(pairs_needed / ref.shape[1]))
        blocks = min(budget, needed)
        return _pair_estimate(ref[:blocks], cand[:blocks], first).interval(confidence), blocks
    needed = max(
        first, block_estimate(block_logs(ref[:first], cand[:first])).units_for(half, confidence)
    )
    blocks = min(budget, needed)
    estimate = block_estimate(block_logs(ref[:blocks], cand[:blocks]), first)
    return estimate.interval(confidence), blocks


def running_spread(ref, cand, confidence, resolution):
    """Blocks added until the interval over all of them is as narrow as asked: it stops when
    the spread happens to look small, so its intervals are too narrow."""
    half, blocks = math.log1p(resolution / 100), STAGE_ONE_BLOCKS
    while blocks < MOST_BLOCKS:
        if block_estimate(block_logs(ref[:blocks], cand[:blocks])).half_width(confidence) <= half:
            break
        blocks += 1
    return block_estimate(block_logs(ref[:blocks], cand[:blocks])).interval(confidence), blocks


DESIGNS = {
    "together, request units": (together, "fixed-requests"),
    "together, block units": (together, "fixed-blocks"),
    "alternate, block units (Stein)": (alternate, "stein-blocks"),
    "alternate, running spread": (alternate, "running-blocks"),
    "pairs, pair units (Stein)": (pairs, "stein-pairs"),
    "alternate, Stein, budget of 10 blocks": (alternate, "stein-blocks-budget"),
}
BUDGET_BLOCKS = 10


@dataclass(frozen=True)
class Rates:
    design: str
    trials: int
    outside: int  # intervals that exclude the true ratio
    mean_half_width_pct: float
    mean_blocks: float

    @property
    def rate(self) -> float:
        return self.outside / self.trials


def simulate(design: str, trials: int, confidence: float, resolution: float, effect_pct: float,
             seed: int = 20261204) -> Rates:  # fmt: skip
    """Run `design` `trials` times; count the intervals that miss the true ratio."""
    schedule, judge = DESIGNS[design]
    effect = 1 + effect_pct / 100
    outside, widths, used = 0, [], []
    for trial in range(trials):
        machine = Machine.new(seed + trial)
        ref, cand = schedule(machine, MOST_BLOCKS, effect)
        blocks = STAGE_ONE_BLOCKS
        if judge == "fixed-requests":
            interval = request_interval(ref[:blocks], cand[:blocks], confidence)
        elif judge == "fixed-blocks":
            interval = fixed_blocks(ref[:blocks], cand[:blocks], confidence)
        elif judge == "running-blocks":
            interval, blocks = running_spread(ref, cand, confidence, resolution)
        else:
            unit = "pair" if judge == "stein-pairs" else "block"
            budget = BUDGET_BLOCKS if judge.endswith("budget") else MOST_BLOCKS
            interval, blocks = stein(ref, cand, confidence, resolution, unit, budget)
        _, low, high = interval
        outside += not (low <= effect <= high)
        widths.append(100 * (high - low) / 2)
        used.append(blocks)
    return Rates(design, trials, outside, float(np.mean(widths)), float(np.mean(used)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=2000)
    parser.add_argument("--confidence", type=float, default=0.95)
    parser.add_argument("--resolution", type=float, default=3.0, help="Stein's target, ±%%")
    parser.add_argument("--effect", type=float, default=0.0, help="planted on the candidate, %%")
    args = parser.parse_args(argv)
    print(
        f"{args.trials} simulated runs per design, true change {args.effect:+g} %, intervals at "
        f"{args.confidence:.0%}, resolution ±{args.resolution:g} %, stage one "
        f"{STAGE_ONE_BLOCKS} blocks of {REQUESTS_PER_BLOCK} requests\n"
    )
    print("| design | intervals missing the truth | stated | mean half-width | mean blocks |")
    print("|---|---:|---:|---:|---:|")
    for design in DESIGNS:
        rates = simulate(design, args.trials, args.confidence, args.resolution, args.effect)
        print(
            f"| {design} | {rates.rate:.1%} ({rates.outside}/{rates.trials}) | "
            f"{1 - args.confidence:.1%} | ±{rates.mean_half_width_pct:.2f} % | "
            f"{rates.mean_blocks:.1f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
