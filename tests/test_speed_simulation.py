"""benchmarks/speed_simulation.py: on a simulated shared GPU, the intervals the rig uses keep their
stated error rate, and the interval that treats requests as independent does not (the issue's
A/A example: +1.3 % [+0.4, +2.9] at C=16, a false `slower`)."""

import math
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from speed_simulation import simulate  # noqa: E402

TRIALS = 1500
STATED = 0.05
# The simulated rate may exceed the stated one by three binomial standard errors, no more.
ALLOWED = STATED + 3 * math.sqrt(STATED * (1 - STATED) / TRIALS)


def rate(design: str, effect_pct: float = 0.0):
    return simulate(design, TRIALS, 1 - STATED, resolution=3.0, effect_pct=effect_pct)


def test_requests_as_independent_units_miss_far_more_often_than_stated():
    assert rate("together, request units").rate > 0.3


def test_block_units_keep_the_stated_rate_with_the_sides_together_but_are_wide():
    together = rate("together, block units")
    assert together.rate <= ALLOWED
    assert together.mean_half_width_pct > 8


def test_steins_design_keeps_the_stated_rate_and_reaches_the_resolution():
    for design in ("alternate, block units (Stein)", "pairs, pair units (Stein)"):
        rates = rate(design)
        assert rates.rate <= ALLOWED, (design, rates)
        assert rates.mean_half_width_pct <= 3.0, (design, rates)


def test_a_planted_change_is_covered_as_often_as_no_change():
    assert rate("alternate, block units (Stein)", effect_pct=5).rate <= ALLOWED


def test_steins_interval_keeps_the_rate_when_the_budget_ends_first():
    rates = rate("alternate, Stein, budget of 10 blocks")
    assert rates.rate <= ALLOWED and rates.mean_blocks <= 10
