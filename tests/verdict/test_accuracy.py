"""Paired accuracy: lm-eval's gsm8k extraction on fixed strings, the exact McNemar p-value
against a table worked by hand, Wilson's interval, planted flips counted and gated."""

from __future__ import annotations

import math

import pytest

from rig.records import Side
from rig.scenario.gates_config import GatesConfig
from rig.verdict.accuracy import (
    INVALID,
    accuracy_gate,
    accuracy_result,
    extract,
    is_right,
    mcnemar_p,
    wilson,
)
from rig.verdict.evidence import Evidence
from rig.verdict.gates import GATES, graded_accuracy
from tests.accuracy_builders import answer_record


@pytest.mark.parametrize(
    ("text", "strict", "flexible"),
    [
        (" She has 3 + 4 = 7 apples.\n#### 7", "7", "7"),
        (" It costs $1,250 in all.\n#### 1,250\n\n", "1,250", "1,250"),
        (" 12 minus 5 is 7, so the answer is 7.", INVALID, "7."),
        (" #### -3.5 and then 40", "-3.5", "40"),
        ("", INVALID, INVALID),
        (" no number here", INVALID, INVALID),
        (" 5 apples and 6 pears", INVALID, "6"),
        (" The total is $18.", INVALID, "$18."),
    ],
)
def test_extraction_follows_lm_evals_gsm8k_filters(text, strict, flexible):
    assert extract(text, "strict") == strict
    assert extract(text, "flexible") == flexible


@pytest.mark.parametrize(
    ("answer", "reference", "right"),
    [
        ("1,250", "It is 1250 in all.\n#### 1250", True),
        ("$18.", "#### 18", True),
        ("18.0", "#### 18", False),  # exact match: lm-eval compares strings
        ("7", "Worked answer.\n#### 7", True),
        (INVALID, "#### 7", False),
        ("-3", "#### -3", True),
    ],
)
def test_exact_match_ignores_what_lm_eval_ignores(answer, reference, right):
    assert is_right(answer, reference) is right


# (b, c) -> p: 2 * sum_{i <= min(b, c)} C(b + c, i) / 2^(b + c), worked by hand
MCNEMAR_TABLE = [
    ((0, 0), 1.0),
    ((3, 3), 1.0),
    ((9, 5), 2 * 3473 / 16384),  # 1 + 14 + 91 + 364 + 1001 + 2002 = 3473
    ((12, 2), 2 * 106 / 16384),  # 1 + 14 + 91
    ((2, 12), 2 * 106 / 16384),
    ((10, 0), 2 / 1024),
    ((20, 20), 1.0),
    ((1, 0), 1.0),
]


@pytest.mark.parametrize(("flips", "p"), MCNEMAR_TABLE)
def test_mcnemar_p_matches_the_table(flips, p):
    assert mcnemar_p(*flips) == pytest.approx(p, rel=1e-12)


def test_wilson_interval_matches_known_values():
    low, high = wilson(50, 100)
    assert (round(low, 4), round(high, 4)) == (0.4038, 0.5962)
    low, high = wilson(0, 10)
    assert low == 0.0 and high == pytest.approx(0.2775, abs=1e-4)
    assert wilson(0, 0) == (0.0, 1.0)


def planted(questions: int, right: set[int], lost: set[int], gained: set[int]):
    """The reference right on `right`; the candidate loses `lost` of them and gains `gained`."""
    targets = {f"q-{i}": f"Worked.\n#### {i + 100}" for i in range(questions)}
    records = []
    for i in range(questions):
        cand_right = (i in right and i not in lost) or i in gained
        records.append(
            answer_record(Side.REFERENCE, i, f" ...\n#### {i + 100 if i in right else 0}")
        )
        records.append(
            answer_record(Side.CANDIDATE, i, f" ...\n#### {i + 100 if cand_right else 0}")
        )
    return targets, records


def test_planted_flips_are_counted_both_ways_and_tested():
    right = set(range(60))
    targets, records = planted(100, right, lost=set(range(9)), gained={90, 91, 92, 93, 94})
    result = accuracy_result(targets, records, "q")
    assert (result.questions, result.unanswered) == (100, 0)
    assert (result.right(Side.REFERENCE), result.right(Side.CANDIDATE)) == (60, 56)
    assert (result.lost, result.gained) == (9, 5)
    assert result.p_value == pytest.approx(2 * 3473 / 16384)
    assert result.word == "no significant change" and not result.fails
    assert result.line() == (
        "accuracy: 60.0 % vs 56.0 % (-4.0 pt), flips 9 / 5, McNemar p = 0.42: no significant change"
    )
    assert accuracy_gate(result).passed


def test_a_significant_loss_beyond_the_allowed_drop_fails():
    targets, records = planted(100, set(range(60)), lost=set(range(12)), gained={90, 91})
    result = accuracy_result(targets, records, "q", max_drop_pt=5.0)
    assert (result.lost, result.gained) == (12, 2)
    assert result.p_value == pytest.approx(2 * 106 / 16384)
    assert result.word == "significant loss" and result.fails  # -10 pt beyond 5
    assert result.line().endswith("beyond the allowed 5 pt drop: FAIL")
    gate = accuracy_gate(result)
    assert not gate.passed and "significant loss" in gate.detail
    assert not accuracy_result(targets, records, "q", max_drop_pt=10.0).fails  # within it
    assert not accuracy_result(targets, records, "q", max_drop_pt=None).fails  # not gated


def test_a_significant_gain_never_fails():
    targets, records = planted(100, set(range(60)), lost=set(), gained=set(range(80, 95)))
    result = accuracy_result(targets, records, "q")
    assert result.word == "significant gain" and not result.fails


def test_questions_without_an_answer_on_both_sides_are_not_scored():
    targets, records = planted(10, set(range(10)), set(), set())
    records[1] = answer_record(Side.CANDIDATE, 0, "", error="timeout: no answer")
    result = accuracy_result(targets, records[:-2], "q")  # question 9: reference only
    assert (result.questions, result.unanswered) == (8, 2)
    empty = accuracy_result(targets, [], "q")
    assert math.isnan(empty.accuracy(Side.REFERENCE))
    assert not accuracy_gate(empty).passed


def test_decide_runs_the_accuracy_gate_where_the_questions_ran():
    targets, records = planted(100, set(range(60)), lost=set(range(12)), gained={90, 91})
    loss = accuracy_result(targets, records, "q", max_drop_pt=5.0)
    assert graded_accuracy in GATES
    assert not graded_accuracy(Evidence(GatesConfig(), [], {}, accuracy=loss)).passed
    assert graded_accuracy(Evidence(GatesConfig(), [], {})) is None
