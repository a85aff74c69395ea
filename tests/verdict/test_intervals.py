"""Intervals on the log scale: block pairs by Student's t, request pairs by linearisation,
Stein's second stage from the first blocks' spread."""

import math

import numpy as np
import pytest

from rig.verdict.intervals import LogEstimate, SumRatio, block_estimate, pair_estimate


def test_block_estimate_averages_finite_log_ratios():
    estimate = block_estimate(np.log([1.1, 1.2, np.nan, 1.3]))
    assert estimate.units == 3 and estimate.df == 2
    ratio, low, high = estimate.interval(0.95)
    assert low < ratio < high and ratio == pytest.approx(math.exp(np.log([1.1, 1.2, 1.3]).mean()))


def test_one_block_has_no_spread_and_no_interval():
    estimate = block_estimate(np.array([0.1]))
    assert math.isnan(estimate.half_width(0.95)) and estimate.units_for(0.01, 0.95) == 0
    assert block_estimate(np.array([np.nan])) is None


def test_stage_one_fixes_the_spread():
    values = np.array([0.0, 0.02, 0.5, -0.5])
    assert block_estimate(values, stage_one=2).spread == pytest.approx(np.std([0, 0.02], ddof=1))


def test_stein_asks_for_more_units_for_a_narrower_interval():
    estimate = LogEstimate(0.0, 0.1, 4, 5)
    assert estimate.units_for(0.01, 0.95) > estimate.units_for(0.05, 0.95) >= 1


def test_a_ratio_of_sums_over_pairs():
    candidate, reference = np.array([2.0, 2.0, np.nan]), np.array([1.0, 1.0, 1.0])
    estimate = pair_estimate(SumRatio(((1, candidate), (-1, reference))))
    assert estimate.units == 2 and estimate.centre == pytest.approx(math.log(2))
    zero = pair_estimate(SumRatio(((1, np.zeros(2)), (-1, np.ones(2)))))
    assert math.isnan(zero.centre)
