"""Drift arithmetic on hand-made vectors, drift per replayed sequence, and which sequences a side
replays. The replay's client: tests/load/test_replay_client.py."""

import math

import pytest

from rig.records import ForcedLogprobs, ForcedSequence
from rig.verdict.drift import drift_between, drift_results, replay_selection

SEQUENCE = ForcedSequence("p0", prompt_token_ids=(10, 11, 12), completion_token_ids=(13, 14, 15))


# --- drift arithmetic --------------------------------------------------------------------------


def test_prompt_and_completion_positions_split_at_the_prompt_length():
    reference = [None, -1.0, -2.0, -0.5, -0.25, -1.0]
    candidate = [None, -1.5, -2.0, -0.75, -0.25, -2.0]
    result = drift_between(SEQUENCE, reference, candidate)
    # prompt positions 1, 2: |Δ| = 0.5, 0; completion positions 3, 4, 5: 0.25, 0, 1.0
    assert result.prompt_id == "p0"
    assert result.prompt_max_abs == pytest.approx(0.5)
    assert result.prompt_mean_abs == pytest.approx(0.25)
    assert result.completion_tokens == 3
    assert result.max_abs == pytest.approx(1.0)
    assert result.mean_abs == pytest.approx(1.25 / 3)
    # p99 of [0, 0.25, 1.0], linear: position 0.99 * 2 = 1.98 -> 0.25 + 0.98 * 0.75
    assert result.p99_abs == pytest.approx(0.985)
    assert result.nonfinite == 0
    assert result.error is None


def test_identical_vectors_have_zero_drift():
    vector = [None, -1.0, -2.0, -0.5, -0.25, -1.0]
    result = drift_between(SEQUENCE, vector, list(vector))
    assert (result.max_abs, result.mean_abs, result.p99_abs, result.prompt_max_abs) == (0, 0, 0, 0)
    assert result.completion_tokens == 3


def test_none_positions_are_skipped():
    reference = [None, -1.0, None, -0.5, None, -1.0]
    candidate = [None, -1.0, -9.0, -1.0, -0.25, -1.0]
    result = drift_between(SEQUENCE, reference, candidate)
    assert result.completion_tokens == 2  # positions 3 and 5
    assert result.max_abs == pytest.approx(0.5)
    assert result.mean_abs == pytest.approx(0.25)
    assert result.prompt_max_abs == 0.0  # position 2 is skipped, not a 9.0 drift


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
def test_non_finite_values_are_counted_not_averaged(bad):
    reference = [None, -1.0, -2.0, -0.5, -0.25, -1.0]
    candidate = [None, -1.0, -2.0, bad, -0.5, -1.0]
    result = drift_between(SEQUENCE, reference, candidate)
    assert result.nonfinite == 1
    assert result.completion_tokens == 2
    assert result.max_abs == pytest.approx(0.25)
    assert math.isfinite(result.mean_abs)


def test_vectors_of_unequal_length_compare_the_common_positions():
    reference = [None, -1.0, -2.0, -0.5, -0.25, -1.0]
    candidate = [None, -1.0, -2.0, -1.5]
    result = drift_between(SEQUENCE, reference, candidate)
    assert result.completion_tokens == 1
    assert result.max_abs == pytest.approx(1.0)


def test_no_completion_positions_gives_zero_drift():
    result = drift_between(SEQUENCE, [None, -1.0, -2.0], [None, -1.5, -2.0])
    assert result.completion_tokens == 0
    assert (result.max_abs, result.mean_abs) == (0.0, 0.0)
    assert result.prompt_max_abs == pytest.approx(0.5)


def test_p99_over_many_positions():
    sequence = ForcedSequence("p", prompt_token_ids=(1,), completion_token_ids=tuple(range(101)))
    reference = [None] + [0.0] * 101
    candidate = [None] + [-k / 100 for k in range(101)]  # |Δ| = 0.00, 0.01, ..., 1.00
    result = drift_between(sequence, reference, candidate)
    assert result.completion_tokens == 101
    assert result.p99_abs == pytest.approx(0.99)
    assert result.mean_abs == pytest.approx(0.5)
    assert result.max_abs == pytest.approx(1.0)


def test_drift_results_propagate_replay_errors():
    second = ForcedSequence("p1", (1, 2), (3,))
    reference = {
        0: ForcedLogprobs((None, -1.0, -2.0, -0.5, -0.25, -1.0)),
        1: ForcedLogprobs((None,)),
    }
    candidate = {
        0: ForcedLogprobs(error="RuntimeError: answered 500"),
        1: ForcedLogprobs((None, -1.0, -1.0)),
    }
    failed, measured = drift_results([SEQUENCE, second], reference, candidate)
    assert failed.error == "RuntimeError: answered 500"
    assert failed.prompt_id == "p0"
    assert failed.completion_tokens == 0
    assert math.isnan(failed.mean_abs) and math.isnan(failed.max_abs)
    assert measured.error is None and measured.prompt_id == "p1"


def test_drift_results_reference_error_wins_too():
    (result,) = drift_results(
        [SEQUENCE], {0: ForcedLogprobs(error="ref down")}, {0: ForcedLogprobs((None, -1.0))}
    )
    assert result.error == "ref down"


def test_drift_covers_the_sequences_both_sides_replayed():
    """The reference replays every completion; a candidate only some: drift is over those."""
    sequences = [SEQUENCE, ForcedSequence("p1", (1,), (2,)), ForcedSequence("p2", (1,), (3,))]
    reference = {i: ForcedLogprobs((None, -1.0)) for i in range(3)}
    candidate = {2: ForcedLogprobs((None, -1.5)), 0: ForcedLogprobs((None, -1.0))}
    results = drift_results(sequences, reference, candidate)
    assert [r.prompt_id for r in results] == ["p0", "p2"]
    assert drift_results(sequences, reference, {}) == []


# --- which sequences a side replays ---------------------------------------------------------------


def test_a_candidate_replays_the_drift_sample_and_its_divergent_pairs(make_record):
    reference = [
        make_record("reference", f"q{i}", text=f"t{i}", prompt_id=f"p{i}", token_ids=[i])
        for i in range(5)
    ]
    sequences = [ForcedSequence(f"p{i}", (9,), (i,)) for i in range(5)]
    candidate = [make_record("candidate", f"q{i}", text=f"t{i}", token_ids=[i]) for i in range(5)]
    candidate[3] = make_record("candidate", "q3", text="other", token_ids=[7])
    candidate[4] = make_record("candidate", "q4", text="", error="timeout: slow")
    assert replay_selection(sequences, reference, candidate, sample=2) == [0, 1, 3]
    assert replay_selection(sequences, reference, candidate, sample=None) == [0, 1, 2, 3, 4]
    assert replay_selection(sequences, reference, candidate[:3], sample=1) == [0]
