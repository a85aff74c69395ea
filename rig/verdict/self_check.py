"""The candidate self-check: the candidate's answers at its highest level, written inside full
batches, against the same requests sent again one at a time to the same server.

One kernel wrote both, so whatever differs comes from the batch around a request, which is the
noise this candidate brings into every comparison at that level. vLLM cannot make a GDN model's
output independent of its batch (docs/scenarios.md, "Batch invariance"), so a correct kernel
may move a near-tie here: the check is shown next to the verdict, and gated only against the
A/A control's count, the same alone-against-batched comparison made on the reference
(`gates.allow_self_check_beyond_aa`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from rig.records import RequestRecord
from rig.verdict.compare import PairResult, Replayed, compare_pairs
from rig.verdict.words import Gate

ALONE_SIDE = "candidate-alone"


@dataclass(frozen=True)
class SelfCheckCounts:
    level: int
    expected: int  # the level's requests the candidate answered in batches
    pairs: int  # of those, the ones also answered alone and compared
    identical: int
    near_tie: int
    substantive: int  # classified by the margin
    unclassified: int = 0  # no margin measured where the texts part (no replay of them)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class SelfCheck:
    level: int
    expected: int
    pairs: tuple[PairResult, ...]
    gated: bool = False  # gates.allow_self_check_beyond_aa: against the A/A control's count

    @property
    def counts(self) -> SelfCheckCounts:
        return SelfCheckCounts(
            level=self.level,
            expected=self.expected,
            pairs=len(self.pairs),
            identical=sum(p.identical for p in self.pairs),
            near_tie=sum(p.near_tie for p in self.pairs),
            substantive=sum(p.substantive for p in self.pairs),
            unclassified=sum(p.unclassified for p in self.pairs),
        )

    def describe(self) -> str:
        """One line; it says what was compared and no more (a cut-short check says so)."""
        c = self.counts
        head = f"candidate self-check at C={c.level}"
        if c.pairs == 0:
            return f"{head}: no request answered both ways, nothing compared"
        scope = f"{c.pairs} of {c.expected} requests"
        if c.pairs < c.expected:
            scope += " (cut short)"
        differ = c.pairs - c.identical
        if differ == 0:
            found = f"{scope} wrote the same text alone as inside batches"
        else:
            found = (
                f"{scope}: {differ} wrote other text alone than inside batches "
                f"({c.near_tie} near-tie, {c.substantive} substantive"
                + (f", {c.unclassified} unclassified" if c.unclassified else "")
                + ")"
            )
        if self.gated:
            return f"{head}: {found}; gated against the A/A floor (see the gates)"
        return f"{head}: {found}; shown, not gated (vLLM has no batch invariance for GDN)"


def self_check(
    batched: list[RequestRecord],
    alone: list[RequestRecord],
    level: int,
    near_tie_margin: float,
    max_tokens: int | None,
    replayed: Replayed | None = None,
    gated: bool = False,
) -> SelfCheck:
    """Pair the level's batched answers (repeat 0) with the alone ones by request id.
    `replayed`: the batched completions teacher-forced on the server alone, under both the
    candidate's side and ALONE_SIDE, for the margin at a divergence."""
    answered = {r.request_id for r in alone}
    compared = [r for r in batched if r.request_id in answered]
    # no reference variants: an answer that moves with its batch is what the check measures
    pairs = compare_pairs(
        compared, alone, near_tie_margin, max_tokens, replayed, reference_variants=False
    )
    return SelfCheck(level=level, expected=len(batched), pairs=tuple(pairs), gated=gated)


def self_check_gate(
    check: SelfCheck | None, aa_pairs: list[PairResult] | None, allowed: int
) -> Gate:
    """The candidate's alone-against-batched differences beyond the reference's (the A/A
    control sends the first level's requests again at the highest C: the same comparison the
    other way round). A check cut short, or without both controls, vouches for nothing."""
    name = "self-check beyond the A/A floor"
    if check is None or aa_pairs is None:
        return Gate(name, False, "the self-check or the A/A control did not run")
    c = check.counts
    floor = sum(not p.identical for p in aa_pairs)
    differ = c.pairs - c.identical
    detail = (
        f"{differ} of {c.pairs} requests differ alone vs inside batches on the candidate; "
        f"A/A {floor} of {len(aa_pairs)} on the reference (allowed beyond: {allowed})"
    )
    if c.pairs < c.expected:
        return Gate(name, False, f"{detail}; cut short at {c.pairs} of {c.expected}")
    return Gate(name, differ - floor <= allowed, detail)
