"""The pathologies gate: a loop, an empty or runaway answer, a broken character or a failed
request, judged like divergences are.

One that follows a near-tie or reference-variant flip (rig.verdict.compare.TEXT_CONSEQUENCES
after another token) or is of a kind the A/A control shows too is what a correct kernel's bf16
noise can bring about: those count against the A/A control's rate, by a one-sided exact test.
Every other one (no divergence before it, after a substantive or unclassified one, a transport
failure) counts against `gates.max_pathologies`, as server-log faults do.
"""

from __future__ import annotations

import math

from rig.verdict.compare import PairResult
from rig.verdict.words import Gate

PATHOLOGY_FLOOR_ALPHA = 0.05  # fewer than this chance under the A/A control's rate: it fails


def fisher_greater(hits: int, trials: int, other_hits: int, other_trials: int) -> float:
    """One-sided exact (Fisher) p-value that `hits` of `trials` is a rate above `other_hits` of
    `other_trials`: the chance of at least `hits` when both are draws of one rate."""
    total, drawn = trials + other_trials, hits + other_hits
    denominator = math.comb(total, drawn)
    return (
        sum(
            math.comb(trials, k) * math.comb(other_trials, drawn - k)
            for k in range(hits, min(trials, drawn) + 1)
        )
        / denominator
    )


def pathologies_gate(
    pairs: list[PairResult],
    aa_pairs: list[PairResult] | None,
    log_faults: int,
    allowed: int,
) -> Gate:
    """The gate over the candidate's gating pathologies (module docstring); without an A/A
    control every one counts against `allowed`."""
    aa_found = [p for aa_pair in aa_pairs or [] for p in aa_pair.gating_pathologies]
    aa_kinds = {p.kind for p in aa_found}
    absolute, floored = 0, 0
    for result in pairs:
        for pathology in result.gating_pathologies:
            like_aa = pathology.kind in aa_kinds and not result.substantive
            if result.after_benign_flip(pathology) or like_aa:
                floored += 1
            else:
                absolute += 1
    detail = (
        f"{absolute + floored} candidate-only or transport pathologies, "
        f"{log_faults} server-log faults (allowed {allowed})"
    )
    if not floored:
        return Gate("pathologies", absolute + log_faults <= allowed, detail)
    if aa_pairs is None:
        detail += (
            f"; {floored} of them after a near-tie or a reference variant, with no A/A control "
            "to judge them by"
        )
        return Gate("pathologies", absolute + floored + log_faults <= allowed, detail)
    p_value = fisher_greater(floored, len(pairs), len(aa_found), len(aa_pairs))
    within = p_value >= PATHOLOGY_FLOOR_ALPHA
    detail = (
        f"{absolute} candidate-only or transport pathologies, {log_faults} server-log faults "
        f"(allowed {allowed}); {floored} after a near-tie or a reference variant, or of a kind "
        f"the A/A control shows: {floored}/{len(pairs)} pairs vs A/A "
        f"{len(aa_found)}/{len(aa_pairs)}, one-sided exact p = {p_value:.2f} "
        f"(fails below {PATHOLOGY_FLOOR_ALPHA})"
    )
    return Gate("pathologies", absolute + log_faults <= allowed and within, detail)
