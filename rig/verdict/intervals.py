"""Intervals for a candidate / reference ratio, on the log scale, from units the schedule makes
independent: the block pair (one block of each side, ABBA-ordered: the ratio of their whole
metrics) or the request pair (one prompt sent to both sides back to back: a ratio of sums over
pairs, by linearisation). Requests inside one block are not independent (they share its batches
and its moment on the machine): treating them as units calls identical kernels different.

Two designs. Fixed: a given number of blocks, Student's t over the units. Sequential (a
resolution is asked for): Stein's two-stage procedure. The first blocks (stage one) fix the
spread; the units needed for the asked-for half-width follow from it; the interval over all
units uses stage one's spread and degrees of freedom, so its coverage holds whatever the
stopping rule did (stopping on the running spread, by contrast, stops when the spread happens to
look small and under-covers: two to three times the stated error rate in a simulation,
benchmarks/speed_simulation.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from rig.verdict.student_t import t_quantile


@dataclass(frozen=True)
class LogEstimate:
    """A log ratio and what its interval needs: the spread of one unit's contribution, its
    degrees of freedom, and the units the centre averages over."""

    centre: float
    spread: float
    df: int
    units: int

    def half_width(self, confidence: float) -> float:
        """Half the interval's width on the log scale; NaN without a spread."""
        if self.df < 1 or not math.isfinite(self.spread) or self.units < 1:
            return math.nan
        return t_quantile(1 - (1 - confidence) / 2, self.df) * self.spread / math.sqrt(self.units)

    def interval(self, confidence: float) -> tuple[float, float, float]:
        """(ratio, low, high) on the ratio scale."""
        half = self.half_width(confidence)
        return math.exp(self.centre), math.exp(self.centre - half), math.exp(self.centre + half)

    def units_for(self, half_width: float, confidence: float) -> int:
        """Stein's second stage: the units whose interval, at this spread and degrees of
        freedom, is no wider than `half_width` either side (log scale)."""
        if self.df < 1 or not math.isfinite(self.spread):
            return 0
        quantile = t_quantile(1 - (1 - confidence) / 2, self.df)
        return max(1, math.ceil((quantile * self.spread / half_width) ** 2))


def block_estimate(log_ratios: np.ndarray, stage_one: int | None = None) -> LogEstimate | None:
    """From one log ratio per block pair (finite ones only); `stage_one`: the first that many
    fix the spread (Stein), None: all of them."""
    values = log_ratios[np.isfinite(log_ratios)]
    if values.size == 0:
        return None
    first = values[:stage_one] if stage_one is not None else values
    spread = float(first.std(ddof=1)) if first.size >= 2 else math.nan
    return LogEstimate(float(values.mean()), spread, first.size - 1, int(values.size))


@dataclass(frozen=True)
class SumRatio:
    """A metric that is a ratio of sums over request pairs, e.g. mean TTFT = sum / count, or a
    throughput = tokens / busy time: log R = sum of sign * log(sum of term) over the terms,
    each term's values per pair (candidate terms carry +1 in the numerator, -1 in the
    denominator; the reference's the opposite)."""

    terms: tuple[tuple[int, np.ndarray], ...]  # (sign, one value per pair)


def _log_ratio(ratio: SumRatio, rows: np.ndarray) -> tuple[float, np.ndarray]:
    """The log ratio over `rows` of the pairs and each pair's contribution to it (its
    linearisation: sign * value / mean value, summed over the terms)."""
    centre, influence = 0.0, np.zeros(rows.size)
    for sign, values in ratio.terms:
        chosen = values[rows]
        mean = chosen.mean()
        if not mean > 0:
            return math.nan, influence
        centre += sign * math.log(mean)
        influence += sign * chosen / mean
    return centre, influence


def pair_estimate(ratio: SumRatio, stage_one_pairs: int | None = None) -> LogEstimate | None:
    """From request pairs in the order they ran; the pairs where any term is NaN (a failed or
    unequal request) are left out. `stage_one_pairs`: the first that many fix the spread."""
    valid = np.ones(ratio.terms[0][1].size, dtype=bool)
    for _, values in ratio.terms:
        valid &= np.isfinite(values)
    rows = np.flatnonzero(valid)
    if rows.size == 0:
        return None
    centre, _ = _log_ratio(ratio, rows)
    first = rows[:stage_one_pairs] if stage_one_pairs is not None else rows
    _, influence = _log_ratio(ratio, first)
    spread = float(influence.std(ddof=1)) if first.size >= 2 else math.nan
    return LogEstimate(centre, spread, first.size - 1, int(rows.size))


@dataclass(frozen=True)
class TimingDesign:
    """How the load stage measured: the levels whose request pairs ran back to back (their
    unit is the pair), the blocks left out for a JIT compilation, and for a sequential design
    the stage-one blocks that fix each interval's spread and the half-width asked for (None: a
    fixed number of blocks)."""

    pair_levels: frozenset[int] = frozenset()
    excluded: frozenset[tuple[int, int]] = frozenset()  # (level, repeat)
    stage_one_blocks: int | None = None
    resolution_pct: float | None = None
