"""The verdict's words: which word the kinds of the failed gates give, and each word's exit
code."""

from rig.records import ExitCode
from rig.verdict.words import Counts, Gate, GateKind, Verdict, VerdictWord, verdict_word

ALL_SAME = Counts(4, 4, 0, 0, 0, 0.0, 0.0, 0.0, 0)
NEAR = Counts(4, 3, 1, 0, 0, 0.0, 0.0, 0.0, 0)


def failed(kind: GateKind) -> Gate:
    return Gate("any", False, "", kind)


def test_the_first_failed_kind_in_rank_gives_the_word():
    kinds = [GateKind.UNCLASSIFIED, GateKind.EQUIVALENCE, GateKind.VALIDITY]
    assert verdict_word([failed(k) for k in kinds], ALL_SAME, None) is VerdictWord.INVALID
    assert verdict_word([failed(k) for k in kinds[:2]], ALL_SAME, None) == "NOT equivalent"
    assert verdict_word([failed(kinds[0])], ALL_SAME, None) is VerdictWord.UNCLASSIFIED
    assert verdict_word([failed(GateKind.PERFORMANCE)], ALL_SAME, None) is VerdictWord.IDENTICAL


def test_with_no_gate_failed_the_counts_give_the_word():
    assert verdict_word([], ALL_SAME, None) is VerdictWord.IDENTICAL
    assert verdict_word([], NEAR, None) is VerdictWord.NEAR_TIES
    assert verdict_word([], NEAR, NEAR) is VerdictWord.NEAR_TIES_IN_FLOOR
    assert verdict_word([], NEAR, ALL_SAME) is VerdictWord.NEAR_TIES
    variant = Counts(4, 3, 0, 0, 0, 0.0, 0.0, 0.0, 0, reference_variant=1)
    assert verdict_word([], variant, None) is VerdictWord.REFERENCE_VARIANTS
    both = Counts(4, 2, 1, 0, 0, 0.0, 0.0, 0.0, 0, reference_variant=1)
    assert verdict_word([], both, None) is VerdictWord.NEAR_TIES_AND_VARIANTS
    assert verdict_word([], both, both) is VerdictWord.NEAR_TIES_AND_VARIANTS  # floor: near-ties


def test_each_word_has_its_exit_code():
    def code(word: VerdictWord, passed: bool, error: str | None = None) -> ExitCode:
        return Verdict(word, passed, (), ALL_SAME).exit_code(error)

    assert code(VerdictWord.IDENTICAL, True) is ExitCode.PASS
    assert code(VerdictWord.IDENTICAL, False) is ExitCode.FAILED  # a failed performance gate
    assert code(VerdictWord.NOT_EQUIVALENT, False) is ExitCode.FAILED
    assert code(VerdictWord.INVALID, False) is ExitCode.INVALID
    assert code(VerdictWord.UNCLASSIFIED, False) is ExitCode.INVALID
    assert code(VerdictWord.INCOMPLETE, False) is ExitCode.ERROR
    assert code(VerdictWord.IDENTICAL, True, "server died") is ExitCode.ERROR


def test_a_gate_is_an_equivalence_gate_unless_it_says_otherwise():
    gate = Gate("drift", False, "0.3 > 0.1")
    assert gate.kind is GateKind.EQUIVALENCE
    assert Gate("kernel", False, "none", GateKind.VALIDITY).kind == "validity"


def test_the_words_are_distinct_and_read_as_written():
    assert len({w.value for w in VerdictWord}) == len(VerdictWord)
    assert f"{VerdictWord.NOT_EQUIVALENT}" == "NOT equivalent"
    assert VerdictWord("INVALID") is VerdictWord.INVALID


def test_every_report_words_the_pairs_alike():
    assert NEAR.divergences() == "3 identical, 1 near-tie, 0 substantive"
    variant = Counts(4, 2, 1, 0, 0, 0.0, 0.0, 0.0, 0, reference_variant=1)
    assert variant.divergences() == "2 identical, 1 near-tie, 1 reference variant, 0 substantive"
