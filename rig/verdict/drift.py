"""Drift from the teacher-forced replay (rig.load.replay_client): per side and position, the
logprob of the forced token and the side's top-k there, turned into numbers. No I/O: it computes
on the answers it is given.

Drift compares the logprob each side gives the same next token: text equality hides small bugs
(a broken kernel can still pick the same greedy tokens) and exaggerates benign ones (a bf16
near-tie flips a token). The top-k are the margin evidence: where a pair's texts first part,
both sides have seen the same prefix (the reference's), so the reference completion's replay
holds both sides' top-k at the divergent token (compare.py classifies it from them) and every
position's greedy margin (the report's margin CDF). The timed requests carry no logprobs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from rig.records import CompletionKey, ForcedLogprobs, ForcedSequence, RequestRecord, TokenLogprob


@dataclass(frozen=True)
class DriftResult:
    """|Δ logprob| of the forced tokens between the sides: completion positions gate the run,
    prompt positions show how much the prefill itself moved."""

    prompt_id: str
    completion_tokens: int
    max_abs: float
    mean_abs: float
    p99_abs: float
    prompt_max_abs: float
    prompt_mean_abs: float
    nonfinite: int
    error: str | None = None


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def drift_between(
    sequence: ForcedSequence, reference: list[float | None], candidate: list[float | None]
) -> DriftResult:
    """Compare two prompt_logprobs vectors over the same forced sequence."""
    prompt_len = len(sequence.prompt_token_ids)
    deltas_prompt, deltas_completion, nonfinite = [], [], 0
    for position in range(1, min(len(reference), len(candidate))):
        a, b = reference[position], candidate[position]
        if a is None or b is None:
            continue
        if not (math.isfinite(a) and math.isfinite(b)):
            nonfinite += 1
            continue
        (deltas_completion if position >= prompt_len else deltas_prompt).append(abs(a - b))
    completion = deltas_completion or [0.0]
    prompt = deltas_prompt or [0.0]
    return DriftResult(
        prompt_id=sequence.prompt_id,
        completion_tokens=len(deltas_completion),
        max_abs=max(completion),
        mean_abs=sum(completion) / len(completion),
        p99_abs=_quantile(completion, 0.99),
        prompt_max_abs=max(prompt),
        prompt_mean_abs=sum(prompt) / len(prompt),
        nonfinite=nonfinite,
    )


def replay_selection(
    sequences: list[ForcedSequence],
    reference: Iterable[RequestRecord],
    side: Iterable[RequestRecord],
    sample: int | None,
) -> list[int]:
    """Which sequences a side other than the reference replays: the drift's sample (the first
    `sample`, all when None) and the reference completion of every pair whose texts differ, so
    that each divergence has both sides' top-k."""
    index = {sequence.key: i for i, sequence in enumerate(sequences)}
    wanted = set(range(len(sequences) if sample is None else min(sample, len(sequences))))
    by_id = {r.request_id: r for r in reference if r.error is None and r.token_ids}
    for record in side:
        ref = by_id.get(record.request_id)
        if ref is not None and record.error is None and record.text != ref.text:
            found = index.get((ref.prompt_id, tuple(ref.token_ids)))
            if found is not None:
                wanted.add(found)
    return sorted(wanted)


def drift_results(
    sequences: list[ForcedSequence],
    reference: dict[int, ForcedLogprobs],
    candidate: dict[int, ForcedLogprobs],
) -> list[DriftResult]:
    """One result per sequence both sides replayed (by index into `sequences`)."""
    results = []
    for index in sorted(reference.keys() & candidate.keys()):
        sequence, ref, cand = sequences[index], reference[index], candidate[index]
        error = ref.error or cand.error
        if error is not None:
            nan = math.nan
            results.append(DriftResult(sequence.prompt_id, 0, nan, nan, nan, nan, nan, 0, error))
        else:
            results.append(drift_between(sequence, list(ref.logprobs), list(cand.logprobs)))
    return results


def forced_positions(
    sequences: list[ForcedSequence], forced: dict[int, ForcedLogprobs]
) -> dict[CompletionKey, list[TokenLogprob]]:
    """One side's replay along each reference completion it replayed: position i holds the
    forced token i, the logprob this side gives it, and this side's top-k there."""
    positions = {}
    for index, answer in forced.items():
        if answer.error is not None:
            continue
        sequence = sequences[index]
        start = len(sequence.prompt_token_ids)
        positions[sequence.key] = [
            TokenLogprob(
                token_id=token,
                logprob=answer.logprobs[start + i] if start + i < len(answer.logprobs) else None,
                top=top,
            )
            for i, (token, top) in enumerate(
                zip(sequence.completion_token_ids, answer.top, strict=False)
            )
        ]
    return positions
