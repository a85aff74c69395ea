import gzip
import math
from pathlib import Path

import pytest

from rig.load.replay_records import read_replay
from rig.records import TokenLogprob, is_transport_error, read_records
from rig.scenario.config import SIDES
from rig.verdict.compare import (
    EXCERPT_CHARS,
    PairResult,
    Pathology,
    compare_pairs,
    content_pathologies,
    first_divergence,
    pair_pathologies,
)

MARGIN = 0.25


def position(token_id: int, top: dict[int, float]) -> TokenLogprob:
    """One replayed position: the forced token, the logprob this side gives it, its top-k."""
    return TokenLogprob(token_id=token_id, logprob=top.get(token_id), top=top)


def pair_at_third_token(make_record, ref_top: dict[int, float], cand_top: dict[int, float]):
    """Reference writes tokens 1 2 3 4, candidate 1 2 9 4: they part at token index 2. Both
    sides replayed the reference's completion: `ref_top` and `cand_top` are each side's top-k
    at the divergent token. Returns (reference, candidate, replayed)."""
    ref = make_record("reference", text="one two three four", token_ids=[1, 2, 3, 4])
    cand = make_record("candidate", text="one two nine four", token_ids=[1, 2, 9, 4])
    same = [position(1, {1: -0.1, 8: -3.0}), position(2, {2: -0.2, 8: -2.5})]
    replayed = {
        side: {("p0", (1, 2, 3, 4)): [*same, position(3, top), position(4, {4: -0.1})]}
        for side, top in (("reference", ref_top), ("candidate", cand_top))
    }
    return ref, cand, replayed


# --- where the texts part ----------------------------------------------------------------------


def test_identical_texts_have_no_divergence(make_record):
    ref = make_record("reference", text="same", token_ids=[1, 2])
    cand = make_record("candidate", text="same", token_ids=[1, 3])  # only the text counts
    assert first_divergence(ref, cand, MARGIN) is None


def test_char_and_token_index_of_the_first_difference(make_record):
    ref, cand, replayed = pair_at_third_token(
        make_record, {3: -0.5, 9: -0.75}, {9: -0.25, 3: -0.625}
    )
    divergence = first_divergence(ref, cand, MARGIN, replayed)
    assert divergence.char_index == len("one two ")
    assert divergence.token_index == 2
    assert divergence.reference_token_id == 3
    assert divergence.candidate_token_id == 9
    assert divergence.reference_logprob == -0.5  # the reference's own token, on the reference
    assert divergence.candidate_logprob == -0.25  # the candidate's own token, on the candidate
    assert divergence.reference_top == {3: -0.5, 9: -0.75}
    assert divergence.candidate_top == {9: -0.25, 3: -0.625}


def test_excerpts_show_the_text_around_the_divergence(make_record):
    before, after = "x" * 100, "y" * 100
    ref = make_record("reference", text=before + "A" + after)
    cand = make_record("candidate", text=before + "B" + after)
    divergence = first_divergence(ref, cand, MARGIN)
    assert divergence.char_index == 100
    context = "x" * EXCERPT_CHARS
    assert divergence.reference_excerpt.startswith(context + "A")
    assert divergence.candidate_excerpt.startswith(context + "B")
    assert divergence.reference_excerpt.strip("xy") == "A"
    assert len(divergence.reference_excerpt) <= 2 * EXCERPT_CHARS + 1


def test_excerpt_at_the_start_of_the_text(make_record):
    divergence = first_divergence(
        make_record("reference", text="Alpha"), make_record("candidate", text="Beta"), MARGIN
    )
    assert divergence.char_index == 0
    assert (divergence.reference_excerpt, divergence.candidate_excerpt) == ("Alpha", "Beta")


def test_one_text_a_prefix_of_the_other(make_record):
    ref = make_record("reference", text="abc", token_ids=[1, 2])
    cand = make_record("candidate", text="abcdef", token_ids=[1, 2, 3])
    divergence = first_divergence(ref, cand, MARGIN)
    assert divergence.char_index == 3
    assert divergence.token_index == 2
    assert divergence.reference_token_id is None
    assert divergence.candidate_token_id == 3


def test_without_token_ids_only_the_char_index_is_known(make_record):
    divergence = first_divergence(
        make_record("reference", text="ab"), make_record("candidate", text="ac"), MARGIN
    )
    assert (divergence.char_index, divergence.token_index) == (1, None)
    assert divergence.kind == "unclassified"


def test_same_token_ids_but_different_text(make_record):
    ref = make_record("reference", text="ab", token_ids=[1, 2])
    cand = make_record("candidate", text="a b", token_ids=[1, 2])
    divergence = first_divergence(ref, cand, MARGIN)
    assert divergence.token_index is None
    assert divergence.kind == "unclassified"


# --- near-tie or substantive -------------------------------------------------------------------


def test_near_tie_when_both_tokens_are_in_each_others_top_k_and_the_margin_is_small(make_record):
    ref, cand, replayed = pair_at_third_token(
        make_record, {3: -0.60, 9: -0.70, 5: -3.0}, {9: -0.65, 3: -0.68, 5: -3.0}
    )
    divergence = first_divergence(ref, cand, MARGIN, replayed)
    assert divergence.kind == "near_tie"
    assert divergence.reference_margin == pytest.approx(0.10)
    assert divergence.candidate_token_rank_in_reference == 2
    assert divergence.reference_token_rank_in_candidate == 2


def test_margin_at_the_bound_is_a_near_tie_and_above_it_substantive(make_record):
    # -0.5 and -0.75 are exact in binary, so the margin is exactly 0.25.
    ref, cand, replayed = pair_at_third_token(make_record, {3: -0.5, 9: -0.75}, {9: -0.5, 3: -0.75})
    assert first_divergence(ref, cand, 0.25, replayed).kind == "near_tie"
    assert first_divergence(ref, cand, 0.2, replayed).kind == "substantive"


def test_wide_margin_is_substantive(make_record):
    ref, cand, replayed = pair_at_third_token(make_record, {3: -0.1, 9: -2.5}, {9: -0.4, 3: -0.5})
    divergence = first_divergence(ref, cand, MARGIN, replayed)
    assert divergence.kind == "substantive"
    assert divergence.reference_margin == pytest.approx(2.4)


def test_candidate_token_outside_the_reference_top_k_is_substantive(make_record):
    ref, cand, replayed = pair_at_third_token(make_record, {3: -0.50, 7: -0.55}, {9: -0.5, 3: -0.6})
    divergence = first_divergence(ref, cand, MARGIN, replayed)
    assert divergence.candidate_token_rank_in_reference is None
    assert divergence.kind == "substantive"


def test_reference_token_outside_the_candidate_top_k_is_substantive(make_record):
    ref, cand, replayed = pair_at_third_token(make_record, {3: -0.50, 9: -0.55}, {9: -0.5, 7: -0.6})
    divergence = first_divergence(ref, cand, MARGIN, replayed)
    assert divergence.reference_token_rank_in_candidate is None
    assert divergence.kind == "substantive"


@pytest.mark.parametrize("missing", ["reference", "candidate", "both"])
def test_a_side_that_did_not_replay_leaves_the_divergence_unclassified(make_record, missing):
    ref, cand, replayed = pair_at_third_token(make_record, {3: -0.5, 9: -0.6}, {9: -0.5, 3: -0.6})
    for side in ("reference", "candidate"):
        if missing in (side, "both"):
            del replayed[side]
    divergence = first_divergence(ref, cand, MARGIN, replayed)
    assert divergence.token_index == 2
    assert divergence.kind == "unclassified"
    assert first_divergence(ref, cand, MARGIN).kind == "unclassified"  # no replay at all


def test_a_replay_shorter_than_the_divergence_leaves_it_unclassified(make_record):
    ref, cand, replayed = pair_at_third_token(make_record, {3: -0.5, 9: -0.6}, {9: -0.5, 3: -0.6})
    (key,) = replayed["candidate"]
    replayed["candidate"][key] = replayed["candidate"][key][:2]
    assert first_divergence(ref, cand, MARGIN, replayed).kind == "unclassified"


def test_the_replay_is_found_by_the_reference_completion(make_record):
    """Another completion of the same prompt (another level's answer) is not this pair's."""
    ref, cand, replayed = pair_at_third_token(make_record, {3: -0.5, 9: -0.6}, {9: -0.5, 3: -0.6})
    for side in replayed.values():
        side[("p0", (1, 2, 3, 5))] = side.pop(("p0", (1, 2, 3, 4)))
    assert first_divergence(ref, cand, MARGIN, replayed).kind == "unclassified"
    ref.token_ids = [1, 2, 3, 5]
    assert first_divergence(ref, cand, MARGIN, replayed).kind == "near_tie"


def test_timed_logprobs_are_not_read(make_record):
    """One source of margins: a record's own logprobs (when a scenario asks for them) leave
    the classification to the replay."""
    ref, cand, replayed = pair_at_third_token(make_record, {3: -0.1, 9: -2.5}, {9: -0.4, 3: -0.5})
    ref.logprobs = [position(t, {t: -0.5, 9 if t == 3 else 3: -0.55}) for t in ref.token_ids]
    cand.logprobs = [position(t, {t: -0.5, 3 if t == 9 else 9: -0.55}) for t in cand.token_ids]
    assert first_divergence(ref, cand, MARGIN, replayed).kind == "substantive"


def test_the_references_replay_alone_rules_a_near_tie_out(make_record):
    """The candidate's replay failed (vLLM refuses NaN logprobs): where the reference was sure
    (its top-k lacks the candidate's token, or its margin is past the bound) the divergence is
    substantive; where the reference alone allows a near-tie it stays unclassified."""
    sure = {3: -0.01, 5: -6.0}
    ref, cand, replayed = pair_at_third_token(make_record, sure, {})
    only_reference = {"reference": replayed["reference"]}
    assert first_divergence(ref, cand, MARGIN, only_reference).kind == "substantive"
    close = {3: -0.5, 9: -0.6}
    ref, cand, replayed = pair_at_third_token(make_record, close, {})
    only_reference = {"reference": replayed["reference"]}
    assert first_divergence(ref, cand, MARGIN, only_reference).kind == "unclassified"


def test_a_divergence_with_no_margin_is_unclassified_never_substantive_or_near_tie(make_record):
    ref = make_record("reference", text="ab")
    cand = make_record("candidate", text="ac")
    (pair,) = compare_pairs([ref], [cand], MARGIN)
    assert pair.divergence.kind == "unclassified"
    assert pair.unclassified and not pair.substantive and not pair.near_tie


# --- pathologies of one response ---------------------------------------------------------------


def kinds(found) -> list[str]:
    return [kind for kind, _ in found]


def test_clean_response_has_no_pathologies(make_record):
    record = make_record(text="A normal answer, with punctuation.", token_ids=list(range(10)))
    assert content_pathologies(record, max_tokens=64) == []


def test_empty_output(make_record):
    found = content_pathologies(make_record(text="", finish_reason="stop"), None)
    assert kinds(found) == ["empty_output"]


def test_replacement_characters_are_counted(make_record):
    found = dict(content_pathologies(make_record(text="ab\ufffdc\ufffd"), None))
    assert found["replacement_char"].startswith("2 ")


def test_lone_surrogate_is_invalid_utf8(make_record):
    assert kinds(content_pathologies(make_record(text="ok \udc80 ok"), None)) == ["invalid_utf8"]


def test_valid_astral_characters_are_not_surrogates(make_record):
    assert content_pathologies(make_record(text="emoji 😀 and 𝄞"), None) == []


@pytest.mark.parametrize(
    ("token_ids", "text"),
    [
        ([5, 6, 7, 8] * 10, "x"),  # period 4, 10 times
        (list(range(100, 120)) + [42] * 32, "x"),  # period 1, exactly 32 at the end
        (list(range(200, 230)) + list(range(16)) * 4, "x"),  # period 16, 4 times
        (None, "intro " + "ab" * 20),  # no token ids: characters
    ],
    ids=["period-4", "period-1-at-32", "period-16-x4", "chars"],
)
def test_repetition_loop_is_found(make_record, token_ids, text):
    found = dict(content_pathologies(make_record(text=text, token_ids=token_ids), None))
    assert "repetition_loop" in found


@pytest.mark.parametrize(
    ("token_ids", "text"),
    [
        (list(range(64)), "x"),  # nothing repeats
        (list(range(100, 120)) + [42] * 31, "x"),  # 31 repeats: under 32 tokens
        ([7] * 20, "x"),  # too short to tell
        (list(range(300, 316)) * 3, "x"),  # period 16 only 3 times
        ([1, 2] * 30 + list(range(50, 90)), "x"),  # a loop that ended
        (None, "The quick brown fox jumps over the lazy dog near the river bank."),
    ],
    ids=["distinct", "31-same", "short", "period-16-x3", "loop-then-recovery", "prose"],
)
def test_no_repetition_loop(make_record, token_ids, text):
    found = dict(content_pathologies(make_record(text=text, token_ids=token_ids), None))
    assert "repetition_loop" not in found


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        ("timeout: no complete response within 5 s", "timeout"),
        ("http_500: Internal Server Error", "http_500"),
        ("http_429: too many requests", "http_429"),
        ("connection: ClientConnectorError: refused", "connection"),
        ("malformed_sse: event is not JSON", "malformed_sse"),
        ("cancelled: the run was interrupted", "cancelled"),
    ],
)
def test_transport_errors_are_the_only_pathology(make_record, error, kind):
    found = content_pathologies(make_record(text="", error=error), None)
    assert found == [(kind, error)]
    assert is_transport_error(kind)


def test_content_pathologies_are_not_transport_errors():
    for kind in ("empty_output", "replacement_char", "invalid_utf8", "repetition_loop"):
        assert not is_transport_error(kind)


def test_length_overrun(make_record):
    record = make_record(output_tokens=65)
    assert kinds(content_pathologies(record, max_tokens=64)) == ["length_overrun"]
    assert content_pathologies(make_record(output_tokens=64), max_tokens=64) == []
    assert content_pathologies(record, max_tokens=None) == []


# --- pathologies of a pair ---------------------------------------------------------------------


def test_candidate_only_pathology_is_flagged(make_record):
    found = pair_pathologies(make_record("reference"), make_record("candidate", text=""), None)
    assert [(p.side, p.kind, p.candidate_only) for p in found] == [
        ("candidate", "empty_output", True)
    ]


def test_pathology_on_both_sides_is_not_candidate_only(make_record):
    found = pair_pathologies(
        make_record("reference", text=""), make_record("candidate", text=""), None
    )
    assert [(p.side, p.candidate_only) for p in found] == [
        ("reference", False),
        ("candidate", False),
    ]


def test_length_runaway_when_only_the_candidate_hits_max_tokens(make_record):
    found = pair_pathologies(
        make_record("reference", finish_reason="stop"),
        make_record("candidate", finish_reason="length"),
        None,
    )
    assert [(p.side, p.kind, p.candidate_only) for p in found] == [
        ("candidate", "length_runaway", True)
    ]


@pytest.mark.parametrize(("ref_finish", "cand_finish"), [("length", "stop"), ("length", "length")])
def test_no_length_runaway_otherwise(make_record, ref_finish, cand_finish):
    found = pair_pathologies(
        make_record("reference", finish_reason=ref_finish),
        make_record("candidate", finish_reason=cand_finish),
        None,
    )
    assert found == ()


def test_candidate_transport_error_is_candidate_only(make_record):
    found = pair_pathologies(
        make_record("reference"), make_record("candidate", error="http_500: boom"), None
    )
    assert [(p.kind, p.candidate_only) for p in found] == [("http_500", True)]


def test_nonfinite_logprobs_in_the_candidates_replay_are_a_candidate_pathology(make_record):
    """vLLM sends a broken kernel's NaN as null, read as NaN (rig.load.replay_client)."""
    ref, cand, replayed = pair_at_third_token(make_record, {3: -0.5, 9: -0.6}, {9: -0.5, 3: -0.6})
    cand.text = ref.text
    key = ("p0", (1, 2, 3, 4))
    replayed["candidate"][key][1] = position(2, {2: math.nan, 8: -2.5})
    found = pair_pathologies(ref, cand, None, replayed)
    assert [(p.side, p.kind, p.candidate_only) for p in found] == [
        ("candidate", "nonfinite_logprobs", True)
    ]
    assert found[0].detail.startswith("1 positions")
    assert pair_pathologies(ref, cand, None) == ()  # without a replay nothing to tell


def test_gating_pathologies_are_candidate_only_or_transport_errors():
    shared = Pathology("reference", "empty_output", "", candidate_only=False)
    transport = Pathology("reference", "timeout", "", candidate_only=False)
    sick = Pathology("candidate", "replacement_char", "", candidate_only=True)
    pair = PairResult("q", "p", 1, 0, 0, True, None, (shared, transport, sick))
    assert pair.gating_pathologies == [transport, sick]


# --- pairing -----------------------------------------------------------------------------------


def test_pairs_by_request_id_not_by_position(make_record):
    reference = [make_record("reference", f"q{i}", text=f"answer {i}") for i in range(3)]
    candidate = [make_record("candidate", f"q{i}", text=f"answer {i}") for i in (2, 0, 1)]
    pairs = compare_pairs(reference, candidate, MARGIN)
    assert [p.request_id for p in pairs] == ["q0", "q1", "q2"]
    assert all(p.identical for p in pairs)


def test_a_differing_pair_is_not_identical(make_record):
    reference = [make_record("reference", "q0", text="a"), make_record("reference", "q1")]
    candidate = [make_record("candidate", "q0", text="b"), make_record("candidate", "q1")]
    first, second = compare_pairs(reference, candidate, MARGIN)
    assert not first.identical and first.divergence.char_index == 0
    assert second.identical and second.divergence is None


def test_missing_candidate_result_is_an_error(make_record):
    reference = [make_record("reference", "q0"), make_record("reference", "q1")]
    with pytest.raises(ValueError, match="q1"):
        compare_pairs(reference, [make_record("candidate", "q0")], MARGIN)


def test_failed_request_is_never_identical_and_has_no_divergence(make_record):
    ref = make_record("reference", "q0", text="", error="timeout: slow")
    cand = make_record("candidate", "q0", text="", error="timeout: slow")
    (pair,) = compare_pairs([ref], [cand], MARGIN)
    assert not pair.identical
    assert pair.divergence is None
    assert not pair.substantive
    assert {p.kind for p in pair.pathologies} == {"timeout"}


def test_pair_keeps_the_request_coordinates(make_record):
    ref = make_record("reference", "c8-r1-0003", prompt_id="math-01", level=8, repeat=1, index=3)
    cand = make_record("candidate", "c8-r1-0003", prompt_id="math-01", level=8, repeat=1, index=3)
    (pair,) = compare_pairs([ref], [cand], MARGIN)
    assert (pair.prompt_id, pair.level, pair.repeat, pair.index) == ("math-01", 8, 1, 3)


def test_as_row_flattens_the_divergence(make_record):
    ref, cand, replayed = pair_at_third_token(make_record, {3: -0.5, 9: -0.6}, {9: -0.5, 3: -0.6})
    cand.text = ""  # an empty candidate is also a pathology
    cand.token_ids = [1, 2, 9, 4]
    (pair,) = compare_pairs([ref], [cand], MARGIN, replayed=replayed)
    row = pair.as_row()
    assert row["div_reference_margin"] == pytest.approx(0.1)
    assert "div_reference_top" not in row and "div_candidate_top" not in row
    assert row["divergence_kind"] == pair.divergence.kind
    assert row["div_char_index"] == 0
    assert row["div_token_index"] == 2
    assert row["pathologies"] == "candidate:empty_output"


# --- the reference's own variation ---------------------------------------------------------------


def long_prompt_run(make_record, candidate_text: str):
    """What qwen35-control did on one H100 (2026-12-07): the reference answered a 7,960-token
    prompt `A...` in 39 requests and `B...` in one (c144-r3), its replay putting B 0.44 nats
    over A at token 0. Returns the pairs, the B request's last."""
    reference, candidate = [], []
    for i, ref_text in enumerate(["Aaa"] * 3 + ["Bbb"]):
        fields = {"prompt_id": "long-10000-0", "prompt_tokens": 7960, "token_ids": None}
        reference.append(make_record("reference", f"q{i}", text=ref_text, **fields))
        candidate.append(make_record("candidate", f"q{i}", text=candidate_text, **fields))
    return compare_pairs(reference, candidate, MARGIN)


def test_the_references_own_answer_to_the_prompt_is_a_reference_variant(make_record):
    *same, flipped = long_prompt_run(make_record, candidate_text="Aaa")
    assert all(p.identical for p in same)
    assert flipped.reference_variant and not flipped.substantive
    assert flipped.divergence.char_index == 0


def test_a_reference_variant_outranks_a_wide_replay_margin(make_record):
    ref, cand, replayed = pair_at_third_token(make_record, {3: -0.51, 9: -0.95}, {9: -0.6})
    assert first_divergence(ref, cand, MARGIN, replayed).kind == "substantive"
    elsewhere = make_record("reference", "c1-r1-0000", text=cand.text, token_ids=cand.token_ids)
    again = make_record("candidate", "c1-r1-0000", text=cand.text, token_ids=cand.token_ids)
    flipped, _ = compare_pairs([ref, elsewhere], [cand, again], MARGIN, replayed=replayed)
    assert flipped.divergence.kind == "reference_variant"
    assert flipped.divergence.reference_margin == pytest.approx(0.44)  # still shown


def test_an_answer_the_reference_never_gave_the_prompt_stays_substantive(make_record):
    """ns3's empty answers, or text the reference wrote for another prompt only."""
    *_, flipped = long_prompt_run(make_record, candidate_text="")
    assert not flipped.reference_variant
    other = {"request_id": "q9", "prompt_id": "another", "text": "Ccc"}
    reference = [make_record("reference", "q0", text="Aaa"), make_record("reference", **other)]
    candidate = [make_record("candidate", "q0", text="Ccc"), make_record("candidate", **other)]
    pair, _ = compare_pairs(reference, candidate, MARGIN)
    assert pair.divergence.kind == "unclassified"


@pytest.mark.parametrize(
    "fields",
    [
        {"prompt_tokens": 7961},  # another prompt under the same id
        {"error": "timeout: slow"},  # a failed request wrote nothing
    ],
)
def test_only_answered_requests_of_the_same_prompt_count(make_record, fields):
    ref = make_record("reference", "q0", text="Aaa", prompt_tokens=7960)
    other = make_record("reference", "q1", text="Bbb", **{"prompt_tokens": 7960, **fields})
    cand = make_record("candidate", "q0", text="Bbb", prompt_tokens=7960)
    same = make_record("candidate", "q1", text="Bbb", prompt_tokens=7960)
    (pair, _) = compare_pairs([ref, other], [cand, same], MARGIN)
    assert not pair.reference_variant


def test_a_conversation_turn_is_never_a_reference_variant(make_record):
    """A later turn's prompt holds its own side's earlier answers: the same id, other text."""
    turn = {"conversation_id": "c0", "turn": 1}
    ref = make_record("reference", "q0", text="Aaa", **turn)
    other = make_record("reference", "q1", text="Bbb", **turn)
    cand = make_record("candidate", "q0", text="Bbb", **turn)
    same = make_record("candidate", "q1", text="Bbb", **turn)
    (pair, _) = compare_pairs([ref, other], [cand, same], MARGIN)
    assert not pair.reference_variant


FLIP = Path(__file__).parent / "data" / "h100-long-prompt-flip"


def test_the_h100_matrix_flips_were_the_references_own(tmp_path):
    """data/h100-long-prompt-flip: the timed records and replays of the two ~8K-token prompts of
    scenarios/gpu-matrix.yaml (FLA against ns4, qwen35-control, one H100, 2026-12-07; inter-token
    times and logprobs dropped). FLA answered each prompt one way in 39 blocks and the other in
    one; ns4 always the first way. The margin alone made one of the two flips substantive."""
    for name in ("requests.jsonl", "replay.jsonl"):
        (tmp_path / name).write_bytes(gzip.decompress((FLIP / f"{name}.gz").read_bytes()))
    records = read_records(tmp_path / "requests.jsonl")
    reference, candidate = ([r for r in records if r.side == side] for side in SIDES)
    replayed = read_replay(tmp_path / "replay.jsonl")
    pairs = compare_pairs(reference, candidate, MARGIN, 64, replayed)
    flipped = [p for p in pairs if not p.identical]
    assert len(pairs) == 78 and [p.request_id for p in flipped] == ["c144-r3-0113", "c192-r1-0116"]
    assert all(p.reference_variant for p in flipped)
    by_margin = compare_pairs(reference, candidate, MARGIN, 64, replayed, reference_variants=False)
    kinds = sorted(p.divergence.kind for p in by_margin if not p.identical)
    assert kinds == ["near_tie", "substantive"]
    assert max(p.divergence.reference_margin for p in by_margin if p.divergence) == 0.4375
