"""The verdict's words, and the record every gate returns: what each gate module builds and
rig.verdict.gates turns into the word."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


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
