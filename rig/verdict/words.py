"""The verdict's words and its records: the Gate every gate returns, the Counts the word reads,
the Verdict the report receives, and how the word follows from the gates that failed."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

from rig.records import ExitCode


class GateKind(StrEnum):
    """What a failed gate says about the run, and so which word the verdict takes."""

    VALIDITY = "validity"  # the run cannot vouch for the kernel under test: INVALID
    EQUIVALENCE = "equivalence"  # the outputs differ beyond the bounds: NOT equivalent
    UNCLASSIFIED = "unclassified"  # texts differ where no margin was measured to judge them
    PERFORMANCE = "performance"  # fails the run, leaves the word alone


class VerdictWord(StrEnum):
    """The word that goes first in every report."""

    IDENTICAL = "identical"
    NEAR_TIES_IN_FLOOR = "equivalent up to near-ties within the A/A noise floor"
    NEAR_TIES = "equivalent up to near-ties"
    # every divergence is a near-tie or an answer the reference itself gave the same prompt
    NEAR_TIES_AND_VARIANTS = "equivalent up to near-ties and the reference's own variation"
    REFERENCE_VARIANTS = "equivalent up to the reference's own variation"
    NOT_EQUIVALENT = "NOT equivalent"
    UNCLASSIFIED = "text differs, unclassified"  # no margin measured where the texts part
    INVALID = "INVALID"
    INCOMPLETE = "INCOMPLETE"  # the run did not complete, and what it compared shows no failure


@dataclass(frozen=True)
class Gate:
    name: str
    passed: bool
    detail: str
    kind: GateKind = GateKind.EQUIVALENCE


@dataclass(frozen=True)
class Counts:
    """What the pairs and the replay came to, as the word and the reports read them."""

    pairs: int
    identical: int
    near_tie: int
    substantive: int
    pathologies: int
    prefix_cache_hits: float
    drift_mean: float
    drift_max: float
    drift_errors: int
    prompt_drift_mean: float = math.nan
    unclassified: int = 0
    reference_variant: int = 0  # the candidate wrote the reference's answer from another request

    def divergences(self) -> str:
        """How the pairs came out, in every report's words: `19 identical, 4 near-tie, 5
        reference variant, 0 substantive` (reference variants only where there are some)."""
        variants = f"{self.reference_variant} reference variant, " if self.reference_variant else ""
        return (
            f"{self.identical} identical, {self.near_tie} near-tie, {variants}"
            f"{self.substantive} substantive"
        )


@dataclass(frozen=True)
class Verdict:
    """The word, whether the run passed, and every gate line behind them, in report order."""

    word: VerdictWord
    passed: bool
    gates: tuple[Gate, ...]
    counts: Counts
    aa_counts: Counts | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def failed_gates(self) -> list[Gate]:
        return [gate for gate in self.gates if not gate.passed]

    def exit_code(self, error: str | None = None) -> ExitCode:
        """The run's exit code: 2 when it did not complete, else what the verdict says."""
        if error is not None or self.word is VerdictWord.INCOMPLETE:
            return ExitCode.ERROR
        if self.passed:
            return ExitCode.PASS
        undecided = (VerdictWord.INVALID, VerdictWord.UNCLASSIFIED)
        return ExitCode.INVALID if self.word in undecided else ExitCode.FAILED


def verdict_word(gates: list[Gate], counts: Counts, aa_counts: Counts | None) -> VerdictWord:
    """The word, from the kinds of the gates that failed and, when none did, the counts."""
    failed = {gate.kind for gate in gates if not gate.passed}
    if GateKind.VALIDITY in failed:
        return VerdictWord.INVALID
    if GateKind.EQUIVALENCE in failed:
        return VerdictWord.NOT_EQUIVALENT
    if GateKind.UNCLASSIFIED in failed:
        return VerdictWord.UNCLASSIFIED
    if counts.identical == counts.pairs and counts.pairs > 0:
        return VerdictWord.IDENTICAL
    if counts.reference_variant:
        if counts.near_tie:
            return VerdictWord.NEAR_TIES_AND_VARIANTS
        return VerdictWord.REFERENCE_VARIANTS
    if aa_counts is not None and counts.near_tie <= aa_counts.pairs - aa_counts.identical:
        return VerdictWord.NEAR_TIES_IN_FLOOR
    return VerdictWord.NEAR_TIES
