"""Error metrics: worst element, worst head, non-finite values."""

import math

import torch

from kernels.accuracy import gdn_error, tensor_error


def test_head_rel_l2_is_the_worst_head():
    expected = torch.ones(10, 3, 4)
    actual = expected.clone()
    actual[:, 1] += 0.5  # head 1: relative L2 0.5
    actual[0, 2, 0] += 2.0  # head 2: one big element
    error = tensor_error(actual, expected)
    assert math.isclose(error.max_abs, 2.0)
    assert math.isclose(error.head_rel_l2, 0.5)
    assert error.finite


def test_nan_is_not_finite_and_infinitely_wrong():
    expected = torch.zeros(4, 2, 2)
    actual = expected.clone()
    actual[1, 0, 1] = torch.nan
    error = tensor_error(actual, expected)
    assert not error.finite and math.isinf(error.max_abs) and math.isinf(error.head_rel_l2)


def test_zero_reference_head_counts_absolute_norm():
    expected = torch.zeros(3, 1, 2)
    actual = torch.full((3, 1, 2), 0.5)
    assert math.isclose(tensor_error(actual, expected).head_rel_l2, math.sqrt(6 * 0.25))


def test_gdn_error_covers_output_and_state():
    out, state = torch.randn(5, 2, 3), torch.randn(1, 2, 3, 3)
    bad_state = state.clone()
    bad_state[0, 0, 0, 0] = math.inf
    error = gdn_error((out, bad_state), (out, state))
    assert error.output.max_abs == 0 and error.output.finite
    assert not error.state.finite and not error.finite
