"""The Triton nsR on CPU through Triton's interpreter (small shapes, K=V=64): the segmented
state walk against the float64 recurrence and the PyTorch nsR, and the ns3/ns4 control.
Each case runs in its own process because TRITON_INTERPRET must be set before the kernels
are defined."""

import json
import subprocess
import sys

import pytest


def interpreted(case: str, rounds: int, segment: int) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "tests.kernels.triton_interpreter", case, str(rounds), str(segment)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    ("lengths", "segment"),
    [("1,63,64,65,200", 2), ("1", 1), ("700,130,5", 3), ("700,130,5", 64)],
)
def test_segmented_walk_matches_recurrence_and_torch(lengths, segment):
    errors = interpreted(lengths, 4, segment)
    output_vs_truth, state_vs_truth = errors["truth"]
    output_vs_torch, state_vs_torch = errors["torch"]
    assert output_vs_truth < 2e-2 and state_vs_truth < 0.1, errors
    assert output_vs_torch < 2e-2 and state_vs_torch < 0.1, errors


def test_correlated_keys_break_ns3_and_not_ns4():
    assert interpreted("correlated", 4, 1)["truth"][0] < 0.1
    assert interpreted("correlated", 3, 1)["truth"][0] > 0.1
