"""Pathologies judged like divergences (rig.verdict.pathologies).

The case behind the rule, rebuilt from its numbers (tiny-lm, scenarios/lm-control.yaml, ns4
against vLLM's kernel at C=4): 61 pairs identical, 39 near-ties, 0 substantive, and in one
near-tie pair (request c4-r0-0059, MT-bench prompt 90) the reference left a repeated sentence
at token 33 where the candidate, at a margin of 0.25 nats, went on repeating it. The A/A control
of that run had 36 near-ties and 1 substantive divergence among 100 pairs, and no pathology.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from rig.records import TokenLogprob
from rig.scenario.gates_config import GatesConfig
from rig.verdict.compare import Pathology, compare_pairs
from rig.verdict.pathologies import PATHOLOGY_FLOOR_ALPHA, fisher_greater, pathologies_gate
from tests.verdict.test_gates import gate, identical, pair, verdict

LM_CONTROL = GatesConfig(near_tie_margin=1.0)
SENTENCE = [7, 8, 9, 10]  # "There is a single value." as four tokens
FLIP_AT = 33


def looping_pair(make_record, request_id: str = "c4-r0-0059", margin: float = 0.25):
    """Both sides repeat the sentence up to token 33; there the reference leaves it (token 50)
    and the candidate, whose top-1 it was, goes on: a loop on the candidate only."""
    head = [101, 102, 103, 104, 105, 106, 107, 108, 109] + SENTENCE * 6  # 33 tokens
    reference_ids = head + list(range(50, 65))
    candidate_ids = head + (SENTENCE * 4)[: len(reference_ids) - len(head)]
    records = [
        make_record(
            side,
            request_id,
            " ".join(map(str, ids)),
            prompt_id="mt-bench-90",
            token_ids=ids,
            output_tokens=len(ids),
            finish_reason="length",
        )
        for side, ids in (("reference", reference_ids), ("candidate", candidate_ids))
    ]
    sure = [TokenLogprob(t, -0.01, {t: -0.01}) for t in reference_ids]
    at_flip = {
        "reference": TokenLogprob(50, -0.6, {50: -0.6, SENTENCE[0]: -0.6 - margin}),
        "candidate": TokenLogprob(50, -0.7, {SENTENCE[0]: -0.6, 50: -0.7}),
    }
    key = ("mt-bench-90", tuple(reference_ids))
    replayed = {
        side: {key: [*sure[:FLIP_AT], position, *sure[FLIP_AT + 1 :]]}
        for side, position in at_flip.items()
    }
    (result,) = compare_pairs(records[:1], records[1:], LM_CONTROL.near_tie_margin, 48, replayed)
    return result


def near_ties(n: int, prefix: str):
    return [pair(f"{prefix}{i}", "near_tie") for i in range(n)]


def lm_control_run(make_record):
    """The candidate's 100 pairs and the A/A control's 100, as that run had them."""
    candidate = identical(61) + near_ties(38, "t") + [looping_pair(make_record)]
    aa = identical(63) + near_ties(36, "a") + [pair("s", "substantive")]
    return candidate, aa


def test_the_loop_follows_a_near_tie_flip(make_record):
    looping = looping_pair(make_record)
    assert looping.near_tie and looping.divergence.token_index == FLIP_AT
    assert looping.divergence.reference_margin == pytest.approx(0.25)
    (loop,) = looping.gating_pathologies
    assert (loop.side, loop.kind) == ("candidate", "repetition_loop")
    assert looping.after_benign_flip(loop)


def test_a_loop_after_a_reference_variant_follows_a_benign_flip_too(make_record):
    looping = looping_pair(make_record)
    variant = replace(looping, divergence=replace(looping.divergence, kind="reference_variant"))
    (loop,) = variant.gating_pathologies
    assert variant.after_benign_flip(loop)
    substantive = replace(looping, divergence=replace(looping.divergence, kind="substantive"))
    assert not substantive.after_benign_flip(loop)


def test_a_loop_after_a_near_tie_counts_against_the_aa_rate_and_ns4_passes(make_record):
    candidate, aa = lm_control_run(make_record)
    result = verdict(candidate, gates=LM_CONTROL, aa_pairs=aa)
    found = gate(result, "pathologies")
    assert found.passed, found.detail
    shown = "1 after a near-tie or a reference variant, or of a kind the A/A control shows"
    assert shown in found.detail
    assert "1/100 pairs vs A/A 0/100" in found.detail and "p = 0.50" in found.detail
    assert result.passed and result.word == "equivalent up to near-ties"
    assert (result.counts.near_tie, result.counts.substantive, result.counts.pathologies) == (
        39,
        0,
        1,
    )


def test_without_an_aa_control_the_same_loop_still_fails(make_record):
    candidate, _ = lm_control_run(make_record)
    result = verdict(candidate, gates=LM_CONTROL)
    found = gate(result, "pathologies")
    assert not found.passed and "with no A/A control to judge them by" in found.detail
    assert result.word == "NOT equivalent"


def test_many_loops_after_near_ties_beyond_the_aa_rate_fail(make_record):
    loops = [looping_pair(make_record, f"c4-r0-{i:04d}") for i in range(6)]
    candidate = identical(61) + near_ties(33, "t") + loops
    _, aa = lm_control_run(make_record)
    result = verdict(candidate, gates=LM_CONTROL, aa_pairs=aa)
    found = gate(result, "pathologies")
    assert not found.passed and "6/100 pairs vs A/A 0/100" in found.detail
    assert fisher_greater(6, 100, 0, 100) < PATHOLOGY_FLOOR_ALPHA
    assert result.word == "NOT equivalent"


def test_a_pathology_with_no_divergence_before_it_still_fails(make_record):
    """The same texts, and the candidate's replay holds NaN logprobs: no flip to blame."""
    broken = Pathology("candidate", "nonfinite_logprobs", "3 positions with NaN/inf", True)
    candidate = identical(99) + [pair("n", None, (broken,))]
    _, aa = lm_control_run(make_record)
    found = gate(verdict(candidate, gates=LM_CONTROL, aa_pairs=aa), "pathologies")
    assert not found.passed and found.detail.startswith("1 candidate-only or transport")


def test_a_pathology_after_a_substantive_divergence_still_fails(make_record):
    loop = Pathology("candidate", "repetition_loop", "period 4 repeated 9x at the end", True)
    candidate = identical(99) + [pair("s", "substantive", (loop,))]
    _, aa = lm_control_run(make_record)
    result = verdict(candidate, gates=LM_CONTROL, aa_pairs=aa)
    assert not gate(result, "pathologies").passed and result.word == "NOT equivalent"


def test_a_kind_the_aa_control_shows_counts_against_its_rate(make_record):
    """An empty answer with no divergence before it, where the A/A control has one too."""
    empty = Pathology("candidate", "empty_output", "finish_reason=stop", True)
    candidate = identical(99) + [pair("e", None, (empty,))]
    aa = identical(99) + [pair("ae", None, (empty,))]
    found = gate(verdict(candidate, gates=LM_CONTROL, aa_pairs=aa), "pathologies")
    assert found.passed and "1/100 pairs vs A/A 1/100" in found.detail


def test_ns3s_failures_stay_not_equivalent(make_record):
    """ns3 on the same model: substantive divergences, a loop after each; A/A as for ns4."""
    loop = Pathology("candidate", "repetition_loop", "period 3 repeated 11x at the end", True)
    candidate = identical(70) + [pair(f"s{i}", "substantive", (loop,)) for i in range(30)]
    _, aa = lm_control_run(make_record)
    result = verdict(candidate, gates=LM_CONTROL, aa_pairs=aa)
    assert result.word == "NOT equivalent"
    assert gate(result, "pathologies").detail.startswith("30 candidate-only or transport")


def test_the_exact_test_against_known_values():
    """Fisher's tea-tasting table (3 of 4 against 1 of 4): one-sided p = 17/70."""
    assert fisher_greater(3, 4, 1, 4) == pytest.approx(17 / 70)
    assert fisher_greater(1, 100, 0, 100) == pytest.approx(0.5)
    assert fisher_greater(0, 100, 5, 100) == pytest.approx(1.0)
    assert fisher_greater(2, 10, 0, 10) == pytest.approx(90 / 380)


def test_no_pathology_no_floor():
    result = pathologies_gate(identical(3), identical(3), 0, 0)
    assert result.passed and result.detail.endswith("server-log faults (allowed 0)")
