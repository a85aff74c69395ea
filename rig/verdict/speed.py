"""Is it faster? Only where the run's design can say: both sides measured in this run, under
the same conditions, with repeats. Then a speed word (`faster`, `slower`, `within noise`) for
the headline metrics, with family-wise control over those metrics and the levels (Bonferroni:
an A/A run calls any of them faster or slower in at most 5% of runs at the default rate);
otherwise the numbers without a word, and the headline says why: `not measured (single run)`,
or `not comparable (reference from the golden cache, ...)`, measured at another time.

With one repeat there is no run-to-run variation to judge a change by (a paired bootstrap over
requests holds only request-to-request variation, and called identical kernels 32% slower on
TTFT); a reference from the golden cache was measured at another time, on another machine load.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass

import pandas as pd

from rig.verdict.perf import CANDIDATE, FASTER, NOISE, PERF_METRICS, SLOWER
from rig.verdict.student_t import t_quantile

# The metrics that get a word, and so make up the family: latency at first token, per token
# and end to end, and the throughput of the whole level. The others are shown, not judged.
HEADLINE_METRICS = ("mean_ttft_ms", "mean_tpot_ms", "mean_e2el_ms", "total_token_throughput")
FAMILY_CONFIDENCE = 0.95
NOT_JUDGED = "not judged"  # the word of a metric outside the family
METRIC_NAMES = {"total_token_throughput": "throughput", "mean_ttft_ms": "TTFT"}


@dataclass(frozen=True)
class SpeedDesign:
    """Whether this run's design supports a speed word; `reason` says why not."""

    measured: bool
    reason: str = ""
    family_confidence: float = FAMILY_CONFIDENCE

    @property
    def word(self) -> str:
        """What stands in every metric's word when the design gives none."""
        return self.reason.split(" (")[0]

    def interval_confidence(self, levels: int) -> float:
        """Each interval's confidence, so that the family (headline metrics x levels) keeps
        `family_confidence`."""
        return 1 - (1 - self.family_confidence) / (len(HEADLINE_METRICS) * max(levels, 1))

    def describe(self, levels: int) -> str:
        each = self.interval_confidence(levels)
        return (
            f"family-wise {self.family_confidence:.0%} over {len(HEADLINE_METRICS)} metrics x "
            f"{levels} level(s), each interval at {each:.2%}"
        )


def speed_design(
    repeats: int, golden_run: str | None, golden_stored: str | None = None
) -> SpeedDesign:
    """The design of a run: a reference from the golden cache is not comparable; one repeat
    is not a measurement of speed; repeats of both sides in this run are."""
    if golden_run is not None:
        when = f", stored {golden_stored}" if golden_stored else ""
        return SpeedDesign(
            False,
            f"not comparable (reference from the golden cache: run {golden_run}{when}; "
            "--no-cache measures both sides in this run)",
        )
    if repeats < 2:
        return SpeedDesign(
            False, "not measured (single run: set workload.repeats to 2 or more for a word)"
        )
    return SpeedDesign(True)


def apply_design(frame: pd.DataFrame, design: SpeedDesign) -> pd.DataFrame:
    """The candidate rows' words as the design allows: none where it gives no word, none for
    metrics outside the family."""
    if frame.empty:
        return frame
    frame = frame.copy()
    rows = frame["comparison"] == CANDIDATE
    for metric in PERF_METRICS:
        column = f"{metric}_word"
        if not design.measured:
            frame.loc[rows, column] = design.word
        elif metric not in HEADLINE_METRICS:
            frame.loc[rows, column] = NOT_JUDGED
    return frame


def _levels_text(levels: list[int]) -> str:
    return f"C{levels[0]}" if len(levels) == 1 else f"C{levels[0]}-C{levels[-1]}"


def _metric_headline(rows: pd.DataFrame, metric: str) -> str:
    name = METRIC_NAMES[metric]
    judged = rows[rows[f"{metric}_word"].isin([FASTER, SLOWER])]
    quiet = sorted(int(level) for level in rows.loc[rows[f"{metric}_word"] == NOISE, "level"])
    parts = [
        f"{row[f'{metric}_change_pct']:+.1f} % [{row[f'{metric}_ci_low_pct']:+.1f}, "
        f"{row[f'{metric}_ci_high_pct']:+.1f}] {row[f'{metric}_word']} at C{int(row['level'])}"
        for _, row in judged.iterrows()
    ]
    if quiet:
        parts.append(f"within noise at {_levels_text(quiet)}" if parts else "within noise")
    return f"{name} " + ("; ".join(parts) if parts else "n/a")


def speed_headline(frame: pd.DataFrame, design: SpeedDesign) -> str:
    """One line: `speed: throughput +8.5 % [+3.1, +14.2] faster at C16, within noise at
    C1-C4; TTFT within noise (family-wise 95% ...)`, or why there is no word."""
    rows = frame[frame["comparison"] == CANDIDATE] if not frame.empty else frame
    if not design.measured:
        return f"speed: {design.reason}"
    if rows.empty:
        return "speed: n/a (no level finished on both sides)"
    parts = [_metric_headline(rows, metric) for metric in METRIC_NAMES]
    return f"speed: {'; '.join(parts)} ({design.describe(len(rows))})"


def repeats_for(
    effect_pct: float,
    spread_pct: float,
    levels: int,
    family_confidence: float = FAMILY_CONFIDENCE,
    most: int = 100,
) -> int | None:
    """The fewest repeats whose family-wise interval (Student's t on log ratios) is narrower,
    either side of the point, than `effect_pct`, when one repeat's ratio varies by
    `spread_pct` (its standard deviation, in percent): a change that size then gets a word.
    None when even `most` repeats are not enough."""
    design = SpeedDesign(True, family_confidence=family_confidence)
    quantile_at = 1 - (1 - design.interval_confidence(levels)) / 2
    spread, effect = math.log1p(spread_pct / 100), math.log1p(effect_pct / 100)
    for repeats in range(2, most + 1):
        if t_quantile(quantile_at, repeats - 1) * spread / math.sqrt(repeats) < effect:
            return repeats
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rig.verdict.speed", description="repeats a scenario needs for a speed word"
    )
    parser.add_argument("--effect", type=float, default=8.0, help="change to resolve, %%")
    parser.add_argument("--spread", type=float, required=True, help="one repeat's sd, %%")
    parser.add_argument("--levels", type=int, required=True)
    args = parser.parse_args(argv)
    repeats = repeats_for(args.effect, args.spread, args.levels)
    design = SpeedDesign(True)
    print(
        f"{repeats or 'more than 100'} repeats resolve a {args.effect:g}% change at a per-repeat "
        f"spread of {args.spread:g}% ({design.describe(args.levels)})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
