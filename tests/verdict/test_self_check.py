"""The candidate self-check: batched answers against the same requests alone, and a line that
says what was compared and never more."""

from rig.records import TokenLogprob
from rig.verdict.compare import compare_pairs
from rig.verdict.self_check import ALONE_SIDE, self_check, self_check_gate

MARGIN = 0.25
TIE = {3: -0.60, 9: -0.70}  # the candidate's own top-2 where its answers part: a near-tie
WIDE = {3: -0.1, 9: -2.5}


def batched_and_alone(make_record, alone_texts: list[str | None], batched: int = 4):
    """`batched` answers "a b c d" at C=4; alone_texts[i] is request i's alone answer (None:
    never answered alone)."""
    requests = [f"c4-r0-{i:04d}" for i in range(batched)]
    batch = [
        make_record("candidate", rid, "a b c d", token_ids=[1, 2, 3, 4], level=4)
        for rid in requests
    ]
    alone = [
        make_record(ALONE_SIDE, rid, text, token_ids=[1, 2, 3 if text == "a b c d" else 9, 4])
        for rid, text in zip(requests, alone_texts, strict=False)
        if text is not None
    ]
    return batch, alone


def replay_at_third_token(top: dict[int, float]) -> dict:
    """The batched completion teacher-forced alone, under both names (one replay serves both)."""
    positions = [
        TokenLogprob(1, -0.1, {1: -0.1}),
        TokenLogprob(2, -0.1, {2: -0.1}),
        TokenLogprob(3, top.get(3), top),
        TokenLogprob(4, -0.1, {4: -0.1}),
    ]
    replay = {("p0", (1, 2, 3, 4)): positions}
    return {"candidate": replay, ALONE_SIDE: replay}


def test_same_text_alone_and_batched_is_said_with_its_scope(make_record):
    batch, alone = batched_and_alone(make_record, ["a b c d"] * 4)
    check = self_check(batch, alone, 4, MARGIN, 4)
    c = check.counts
    assert (c.pairs, c.expected, c.identical, c.near_tie, c.substantive) == (4, 4, 4, 0, 0)
    line = check.describe()
    assert "C=4: 4 of 4 requests wrote the same text alone as inside batches" in line
    assert "not gated" in line and "cut short" not in line


def test_a_divergence_is_classified_by_the_candidates_own_margin(make_record):
    batch, alone = batched_and_alone(make_record, ["a b c d", "a b n d", "a b c d", "a b c d"])
    tie = self_check(batch, alone, 4, MARGIN, 4, replay_at_third_token(TIE)).counts
    assert (tie.identical, tie.near_tie, tie.substantive) == (3, 1, 0)
    wide = self_check(batch, alone, 4, MARGIN, 4, replay_at_third_token(WIDE))
    assert (wide.counts.near_tie, wide.counts.substantive) == (0, 1)
    assert "1 wrote other text alone than inside batches (0 near-tie, 1 substantive)" in (
        wide.describe()
    )


def test_an_alone_answer_some_batch_also_wrote_is_still_a_difference(make_record):
    """A kernel wrong only beside other sequences leaves some batched answers right: the alone
    answer matching one of them is the batch moving the text, what this check measures, so no
    reference variant here (the main comparison has them)."""
    batch, alone = batched_and_alone(make_record, ["a b c d", "a b n d", "a b c d", "a b c d"])
    batch[3].text, batch[3].token_ids = "a b n d", [1, 2, 9, 4]  # one batch wrote the alone text
    check = self_check(batch, alone, 4, MARGIN, 4, replay_at_third_token(WIDE))
    assert not any(p.reference_variant for p in check.pairs)
    c = check.counts
    assert (c.identical, c.substantive, c.unclassified) == (2, 1, 1)  # no replay of batch 3
    assert compare_pairs(batch, alone, MARGIN)[1].reference_variant  # the main rule would


def test_without_a_replay_a_divergence_stays_unclassified_and_is_counted_as_such(make_record):
    batch, alone = batched_and_alone(make_record, ["a b n d", "a b c d", "a b c d", "a b c d"])
    check = self_check(batch, alone, 4, MARGIN, 4)
    assert check.pairs[0].divergence.kind == "unclassified"
    assert (check.counts.substantive, check.counts.unclassified) == (0, 1)
    assert "(0 near-tie, 0 substantive, 1 unclassified)" in check.describe()


def test_a_check_cut_short_says_so_and_claims_only_what_it_compared(make_record):
    batch, alone = batched_and_alone(make_record, ["a b c d", "a b c d"])  # 2 of 4 answered
    line = self_check(batch, alone, 4, MARGIN, 4).describe()
    assert "2 of 4 requests (cut short) wrote the same text" in line
    nothing = self_check(batch, [], 4, MARGIN, 4)
    assert nothing.counts.pairs == 0
    assert nothing.describe().endswith("no request answered both ways, nothing compared")
    for text in (line, nothing.describe()):
        assert "identical" not in text and "equivalent" not in text and "invariant" not in text


def aa_pairs(make_record, differing: int, total: int = 4):
    """The A/A control's pairs: `differing` of `total` with other text."""
    ref = [make_record("reference", f"c1-r0-{i:04d}", "a b c d") for i in range(total)]
    replay = [
        make_record("reference-aa", f"c1-r0-{i:04d}", "a b n d" if i < differing else "a b c d")
        for i in range(total)
    ]
    return compare_pairs(ref, replay, MARGIN)


def test_the_gate_counts_the_candidates_differences_beyond_the_aa_floor(make_record):
    batch, alone = batched_and_alone(make_record, ["a b n d", "a b n d", "a b c d", "a b c d"])
    check = self_check(batch, alone, 4, MARGIN, 4, gated=True)
    assert "gated against the A/A floor" in check.describe()
    held = self_check_gate(check, aa_pairs(make_record, 1), allowed=1)
    assert held.passed and "2 of 4 requests differ" in held.detail and "A/A 1 of 4" in held.detail
    assert not self_check_gate(check, aa_pairs(make_record, 0), allowed=1).passed


def test_the_gate_fails_a_check_cut_short_or_missing(make_record):
    batch, alone = batched_and_alone(make_record, ["a b c d", "a b c d"])
    cut = self_check_gate(self_check(batch, alone, 4, MARGIN, 4), aa_pairs(make_record, 0), 5)
    assert not cut.passed and "cut short at 2 of 4" in cut.detail
    assert not self_check_gate(None, aa_pairs(make_record, 0), 5).passed
