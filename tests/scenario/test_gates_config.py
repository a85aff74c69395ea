"""The gates' keys: their defaults and the bounds a scenario cannot cross."""

import pytest
from pydantic import ValidationError

from rig.scenario.gates_config import GatesConfig


def test_the_defaults_fail_on_any_divergence_and_gate_drift_at_a_tenth_of_a_nat():
    gates = GatesConfig()
    assert gates.max_substantive_divergences == 0 and gates.max_mean_drift == 0.1
    assert gates.allow_near_ties_beyond_aa == -1 and gates.require_candidate_kernel


@pytest.mark.parametrize(
    "keys",
    [
        {"max_substantive_divergences": -1},
        {"near_tie_margin": -0.1},
        {"max_drift_over_floor": 0},
        {"min_prefix_cache_hits": 0},
        {"max_mean_drift": -1},
        {"bogus": 1},
    ],
)
def test_out_of_bounds_keys_are_errors(keys):
    with pytest.raises(ValidationError):
        GatesConfig.model_validate(keys)


def test_a_drift_gate_may_be_switched_off():
    assert GatesConfig(max_mean_drift=None).max_mean_drift is None
