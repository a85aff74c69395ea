"""The Triton nsR on CPU through Triton's interpreter (small shapes, K=V=64 and 128, both walks:
k-first with programs of 16 to 64 columns of V and v-first, varlen with a one-token and an
empty sequence) against the float64 recurrence and the PyTorch nsR, and the ns3/ns4 control.
The cases run in one child process: TRITON_INTERPRET must be set before the kernels are
defined."""

import json
import subprocess
import sys

import pytest

from tests.kernels.triton_interpreter import CASES


@pytest.fixture(scope="module")
def errors() -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "tests.kernels.triton_interpreter"],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("label", [c[0] for c in CASES if c[1] != "correlated"])
def test_walk_matches_recurrence_and_torch(errors, label):
    """Bounds: ~5x what the kernel reaches here (BF16 operands, K=64)."""
    for against in ("truth", "torch"):
        output, state, finite = errors[label][against]
        assert finite and output < 5e-3 and state < 5e-2, (against, errors[label])


def test_correlated_keys_break_ns3_and_not_ns4(errors):
    assert errors["correlated-ns4"]["truth"][0] < 0.1, errors["correlated-ns4"]
    assert errors["correlated-ns3"]["truth"][0] > 0.1, errors["correlated-ns3"]
