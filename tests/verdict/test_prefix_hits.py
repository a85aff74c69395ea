"""The prefix-cache gate of conversation workloads: equal hits per request on both sides, a
floor per side, turns after a divergence left out of the equality, unreported counts fail."""

from __future__ import annotations

from rig.records import RequestRecord, ServerTarget, empty_record
from rig.verdict.prefix_hits import conversation_hits_gate, hits_by_turn
from rig.verdict.words import GateKind
from tests.stub_requests import spec


def record(side, index, turn, cached, text="same", conversation="a") -> RequestRecord:
    made = empty_record(ServerTarget(side, "http://127.0.0.1:1", "m"), spec(index))
    made.conversation_id, made.turn, made.cached_tokens, made.text = (
        conversation,
        turn,
        cached,
        text,
    )
    made.prompt_tokens = 1400
    return made


def sides(cached_ref, cached_cand, texts_cand=None):
    texts_cand = texts_cand or ["same"] * len(cached_cand)
    reference = [record("reference", i, i, c) for i, c in enumerate(cached_ref)]
    candidate = [
        record("candidate", i, i, c, t)
        for i, (c, t) in enumerate(zip(cached_cand, texts_cand, strict=True))
    ]
    return reference, candidate


def test_equal_hits_above_the_floor_pass():
    gate = conversation_hits_gate(*sides([0, 640, 1280], [0, 640, 1280]), floor=1920)
    assert gate.passed and gate.kind is GateKind.VALIDITY
    assert gate.detail.startswith("cached prompt tokens: reference 1,920, candidate 1,920 over 3")


def test_hits_below_the_floor_fail_on_either_side():
    gate = conversation_hits_gate(*sides([0, 640, 1280], [0, 640, 1280]), floor=2000)
    assert not gate.passed and "floor 2,000 per side" in gate.detail


def test_a_request_whose_hits_differ_fails_and_is_named():
    gate = conversation_hits_gate(*sides([0, 640, 1280], [0, 0, 1280]), floor=1)
    assert not gate.passed
    assert "1 requests differ: r1 (640 vs 0)" in gate.detail and "\n" not in gate.detail


def test_turns_after_a_divergence_are_not_held_equal():
    """The candidate's cache holds its own earlier answer there: its hits may fairly differ."""
    gate = conversation_hits_gate(
        *sides([0, 640, 1280], [0, 640, 0], ["same", "other", "same"]), floor=1
    )
    assert gate.passed and "1 turns after a divergence not held equal" in gate.detail
    gate = conversation_hits_gate(
        *sides([0, 640, 1280], [0, 0, 1280], ["other", "x", "y"]), floor=1
    )
    assert gate.passed  # turn 1 follows turn 0's divergence


def test_unreported_cached_tokens_or_no_pairs_fail():
    gate = conversation_hits_gate(*sides([0, 640], [0, None]), floor=1)
    assert not gate.passed and "1 of 4 responses report no cached tokens" in gate.detail
    assert "--enable-prompt-tokens-details" in gate.detail
    assert not conversation_hits_gate([], [], floor=1).passed


def test_hits_by_turn_sums_each_side_over_measured_finished_records():
    reference, candidate = sides([0, 640, 1280], [0, 640, 0])
    failed = record("candidate", 9, 2, 5000)
    failed.error = "timeout: x"
    rows = hits_by_turn([*reference, *candidate, failed])
    assert [(t.turn, t.requests, t.reference, t.candidate) for t in rows] == [
        (0, 1, 0, 0),
        (1, 1, 640, 640),
        (2, 1, 1280, 0),
    ]
    assert rows[0].prompt_tokens == 1400
    plain = empty_record(ServerTarget("reference", "http://127.0.0.1:1", "m"), spec(1))
    assert hits_by_turn([plain]) == []


def test_hits_by_turn_leaves_out_a_block_only_one_side_ran():
    """On the H200 the reference's C=4 block was run again after a JIT compile and the
    candidate's was not: counting it showed 93,024 against 62,016 where the gate saw equal
    hits."""
    reference, candidate = sides([0, 640], [0, 640])
    rerun = record("reference", 7, 1, 640)
    rows = hits_by_turn([*reference, *candidate, rerun])
    assert [(t.turn, t.requests, t.reference, t.candidate) for t in rows] == [
        (0, 1, 0, 0),
        (1, 1, 640, 640),
    ]
