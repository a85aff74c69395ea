"""The candidate self-check: the candidate's answers at its highest level, written inside full
batches, against the same requests sent again one at a time to the same server.

One kernel wrote both, so whatever differs comes from the batch around a request, which is the
noise this candidate brings into every comparison at that level. It is shown next to the verdict
and never gated: vLLM cannot make a GDN model's output independent of its batch
(docs/scenarios.md, "Batch invariance"), so a correct kernel may move a near-tie here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from rig.records import RequestRecord
from rig.verdict.compare import PairResult, Replayed, compare_pairs

ALONE_SIDE = "candidate-alone"


@dataclass(frozen=True)
class SelfCheckCounts:
    level: int
    expected: int  # the level's requests the candidate answered in batches
    pairs: int  # of those, the ones also answered alone and compared
    identical: int
    near_tie: int
    substantive: int  # classified by the margin, or left unclassified (no replay)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class SelfCheck:
    level: int
    expected: int
    pairs: tuple[PairResult, ...]

    @property
    def counts(self) -> SelfCheckCounts:
        return SelfCheckCounts(
            level=self.level,
            expected=self.expected,
            pairs=len(self.pairs),
            identical=sum(p.identical for p in self.pairs),
            near_tie=sum(p.near_tie for p in self.pairs),
            substantive=sum(p.substantive for p in self.pairs),
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
                f"({c.near_tie} near-tie, {c.substantive} substantive)"
            )
        return f"{head}: {found}; shown, not gated (vLLM has no batch invariance for GDN)"


def self_check(
    batched: list[RequestRecord],
    alone: list[RequestRecord],
    level: int,
    near_tie_margin: float,
    max_tokens: int | None,
    replayed: Replayed | None = None,
) -> SelfCheck:
    """Pair the level's batched answers (repeat 0) with the alone ones by request id.
    `replayed`: the batched completions teacher-forced on the server alone, under both the
    candidate's side and ALONE_SIDE, for the margin at a divergence."""
    answered = {r.request_id for r in alone}
    compared = [r for r in batched if r.request_id in answered]
    pairs = compare_pairs(compared, alone, near_tie_margin, max_tokens, replayed)
    return SelfCheck(level=level, expected=len(batched), pairs=tuple(pairs))
