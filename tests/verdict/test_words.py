"""The verdict's words and the gate record."""

from rig.verdict.words import Gate, GateKind, VerdictWord


def test_a_gate_is_an_equivalence_gate_unless_it_says_otherwise():
    gate = Gate("drift", False, "0.3 > 0.1")
    assert gate.kind is GateKind.EQUIVALENCE
    assert Gate("kernel", False, "none", GateKind.VALIDITY).kind == "validity"


def test_the_words_are_distinct_and_read_as_written():
    assert len({w.value for w in VerdictWord}) == len(VerdictWord)
    assert f"{VerdictWord.NOT_EQUIVALENT}" == "NOT equivalent"
    assert VerdictWord("INVALID") is VerdictWord.INVALID
