"""Is it faster? Only where the run's design can say: both sides measured in this run, under
the same conditions, with two or more blocks per level, doing the same work. Then a speed word
(`faster`, `slower`, `within noise`) for the headline metrics, with family-wise control over
those metrics and the levels (Bonferroni: an A/A run calls any of them faster or slower in at
most 5% of runs at the default rate); otherwise the numbers without a word, and the headline says
why: `not measured` (a single block, an interrupted run), `not comparable` (a reference from the
golden cache, measured at another time; a candidate that is NOT equivalent, or a level whose
outputs differ in length: unequal work). In an A/A run a change is no kernel's: it is called an
`A/A asymmetry` (the schedule or the machine favours one side), never faster or slower.

With `workload.speed_resolution_pct`, the load stage adds blocks to a level until every headline
interval there is that narrow (Stein's two-stage design, rig/verdict/intervals.py), or its time
budget ends; the headline says which.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass, replace

import numpy as np

from rig.records import ExitCode, RequestRecord
from rig.verdict.intervals import TimingDesign
from rig.verdict.perf import blocks_needed, paired_levels
from rig.verdict.perf_records import (
    CLIENT_METRICS,
    FASTER,
    HEADLINE_METRICS,
    NOISE,
    NOT_JUDGED,
    ONE_BLOCK,
    SLOWER,
    UNEQUAL,
    Comparison,
    LevelComparison,
    Metric,
    MetricComparison,
    PerfResult,
)
from rig.verdict.sensitivity import hidden_levels
from rig.verdict.student_t import t_quantile

FAMILY_CONFIDENCE = 0.95
AA_ASYMMETRY = "A/A asymmetry"  # an A/A interval that excludes no change: not a kernel's doing
# The metrics the headline names, and the names it gives them.
METRIC_NAMES = {Metric.TOTAL_TOKEN_THROUGHPUT: "throughput", Metric.MEAN_TTFT: "TTFT"}
SHORT_NAMES = METRIC_NAMES | {Metric.MEAN_TPOT: "TPOT", Metric.MEAN_E2EL: "E2EL"}


@dataclass(frozen=True)
class SpeedDesign:
    """Whether this run's design supports a speed word (`reason` says why not), whether it is
    an A/A run, and the resolution its scenario asked for."""

    measured: bool
    reason: str = ""
    family_confidence: float = FAMILY_CONFIDENCE
    aa_run: bool = False
    resolution_pct: float | None = None
    budget_s: float | None = None

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
    blocks: int,
    golden_run: str | None,
    golden_stored: str | None = None,
    *,
    interrupted: str | None = None,
    outputs_differ: str | None = None,
    aa_run: bool = False,
    resolution_pct: float | None = None,
    budget_s: float | None = None,
) -> SpeedDesign:
    """The design of a run: a reference from the golden cache is not comparable, nor is a
    candidate whose outputs differ (`outputs_differ` says how); one block per level, or an
    interrupted run, is not a measurement of speed; two or more blocks of both sides in this
    run are."""
    extra = {"aa_run": aa_run, "resolution_pct": resolution_pct, "budget_s": budget_s}
    if golden_run is not None:
        when = f", stored {golden_stored}" if golden_stored else ""
        return SpeedDesign(
            False,
            f"not comparable (reference from the golden cache: run {golden_run}{when}; "
            "--no-cache measures both sides in this run)",
            **extra,
        )
    if outputs_differ is not None:
        return SpeedDesign(False, f"not comparable (outputs differ: {outputs_differ})", **extra)
    if interrupted is not None:
        return SpeedDesign(False, f"not measured (the run did not complete: {interrupted})")
    if blocks < 2 and resolution_pct is None:
        return SpeedDesign(
            False,
            "not measured (single run: set workload.repeats to 2 or more for a word)",
            **extra,
        )
    return SpeedDesign(True, **extra)


def _designed_word(compared: MetricComparison, design: SpeedDesign) -> str:
    if compared.metric not in CLIENT_METRICS:
        return compared.word
    if not design.measured:
        return design.word
    if compared.metric not in HEADLINE_METRICS:
        return NOT_JUDGED
    if design.aa_run and compared.word in (FASTER, SLOWER):
        return AA_ASYMMETRY
    return compared.word


def apply_design(perf: PerfResult, design: SpeedDesign) -> PerfResult:
    """The candidate levels' words as the design allows: none where it gives no word, none for
    metrics outside the family, and in an A/A run no faster or slower; no kernel sensitivity
    where the timings are not comparable (nothing measured to set it beside)."""
    levels = tuple(
        replace(
            level,
            metrics=tuple(replace(m, word=_designed_word(m, design)) for m in level.metrics),
            sensitivity=level.sensitivity if design.measured else None,
        )
        if level.comparison == Comparison.CANDIDATE
        else level
        for level in perf.levels
    )
    return PerfResult(levels)


def _levels_text(levels: list[int]) -> str:
    return f"C{levels[0]}" if len(levels) == 1 else f"C{levels[0]}-C{levels[-1]}"


def _metric_headline(levels: tuple[LevelComparison, ...], metric: Metric) -> str:
    compared = [c for level in levels if (c := level.get(metric)) is not None]
    parts = []
    for c in compared:
        if c.word in (FASTER, SLOWER, AA_ASYMMETRY):
            low, high = c.interval_pct or (math.nan, math.nan)
            parts.append(f"{c.change_pct:+.1f} % [{low:+.1f}, {high:+.1f}] {c.word} at C{c.level}")
    others = [
        f"{other} at {_levels_text(where)}"
        for other in (UNEQUAL, ONE_BLOCK)
        if (where := sorted(c.level for c in compared if c.word == other))
    ]
    quiet = sorted(c.level for c in compared if c.word == NOISE)
    if quiet:
        named = parts or others
        parts.append(f"within noise at {_levels_text(quiet)}" if named else "within noise")
    parts += others
    return f"{METRIC_NAMES[metric]} " + ("; ".join(parts) if parts else "n/a")


def _headline(level: LevelComparison) -> list[MetricComparison]:
    return [c for m in HEADLINE_METRICS if (c := level.get(m)) is not None]


def resolution_text(levels: tuple[LevelComparison, ...], design: SpeedDesign) -> str:
    """Whether each level's headline intervals came as narrow as the scenario asked."""
    if design.resolution_pct is None or not levels:
        return ""
    target = design.resolution_pct
    resolved, open_levels = [], []
    for level in levels:
        widths = {c.metric: c.half_width_pct for c in _headline(level)}
        widest = max(widths, key=lambda m: -math.inf if math.isnan(widths[m]) else widths[m])
        where = f"C{level.level} ({level.repeats} blocks)"
        if all(w <= target + 1e-9 for w in widths.values()):
            resolved.append(where)
        else:
            width = widths[widest]
            shown = f"±{width:.1f} %" if not math.isnan(width) else "no interval"
            open_levels.append(f"{where}: widest {SHORT_NAMES[widest]} {shown}")
    text = f"resolved to ±{target:g} % at {', '.join(resolved)}" if resolved else ""
    if open_levels:
        budget = f" within the {design.budget_s:g} s budget" if design.budget_s else ""
        text += ("; " if text else "") + f"not resolved to ±{target:g} %{budget} at "
        text += "; ".join(open_levels)
    return text


USEFUL_BOUND_PCT = 100.0  # a bound that leaves a doubling open says nothing worth a number


def noninferiority_text(levels: tuple[LevelComparison, ...], design: SpeedDesign) -> str:
    """`not slower than X %`: the largest slowdown any headline interval at any level leaves
    open, when every one of them has an interval (family-wise, as the words); none in an A/A
    run, which has no candidate."""
    bounds = [c.most_slowdown_pct for level in levels for c in _headline(level)]
    if design.aa_run or not bounds or any(not np.isfinite(b) for b in bounds):
        return ""
    if max(bounds) > USEFUL_BOUND_PCT:  # t with one or two degrees of freedom: say so instead
        fewest = min(level.repeats for level in levels)
        return f"no bound on a slowdown below +{USEFUL_BOUND_PCT:g} % from {fewest} blocks"
    return f"not slower than {max(bounds):+.1f} % on any headline metric at any level"


def speed_headline(perf: PerfResult, design: SpeedDesign) -> str:
    """One line: `speed: throughput +8.5 % [+3.1, +14.2] faster at C16, within noise at
    C1-C4; TTFT within noise (family-wise 95% ...)`, or why there is no word."""
    levels = perf.candidate
    if not design.measured:
        return f"speed: {design.reason}"
    if not levels:
        return "speed: n/a (no level finished on both sides)"
    parts = [_metric_headline(levels, metric) for metric in METRIC_NAMES]
    extra = [
        text for text in (resolution_text(levels, design), noninferiority_text(levels, design))
    ]
    hidden = hidden_levels(levels)
    if hidden:
        extra.append(
            f"this served configuration hides the kernel at {', '.join(f'C{c}' for c in hidden)}"
            " (its GDN time moved, the end-to-end time did not follow): these words do not "
            "speak for the kernel"
        )
    tail = "".join(f"; {text}" for text in extra if text)
    aa = "A/A run: " if design.aa_run else ""
    return f"speed: {aa}{'; '.join(parts)}{tail} ({design.describe(len(levels))})"


@dataclass(frozen=True)
class LevelResolution:
    """Where a level stands against the asked-for resolution: the block pairs it kept, the
    block pairs Stein's second stage asks for (None before stage one is done), and whether the
    level is resolved."""

    level: int
    blocks: int
    blocks_needed: int | None

    @property
    def resolved(self) -> bool:
        return self.blocks_needed is not None and self.blocks >= max(2, self.blocks_needed)


def level_resolution(
    reference: list[RequestRecord],
    candidate: list[RequestRecord],
    level: int,
    timing: TimingDesign,
    confidence: float,
) -> LevelResolution:
    """How many block pairs `level` needs for every headline interval to be within
    ±timing.resolution_pct, from its stage-one blocks (timing.stage_one_blocks)."""
    blocks = paired_levels(reference, candidate, timing.excluded).get(level)
    if blocks is None or blocks.unequal_pairs:
        return LevelResolution(level, len(blocks.pairs) if blocks else 0, None)
    return LevelResolution(level, len(blocks.pairs), blocks_needed(blocks, timing, confidence))


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
    return ExitCode.PASS


if __name__ == "__main__":
    sys.exit(main())
