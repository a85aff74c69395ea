"""The servers' own side of the timings, beside the client's: per level and side, from what each
server's /metrics counted during each block (ServerDelta), the GDN prefill time per call (the rig
plugin times every call) and vLLM's prefill, decode and queue time per request. The same units
and intervals as the client's metrics (the block pair: each server's counters cover its own
block, whatever the schedule); shown beside the headline, never judged."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from rig.records import ServerDelta, Side, side_of
from rig.verdict.intervals import TimingDesign, block_estimate
from rig.verdict.perf_records import NOT_JUDGED, Metric, MetricComparison


def _per(seconds: str, count: str) -> Callable[[list[ServerDelta]], float]:
    """Milliseconds per unit of one side's counters summed over its servers; NaN where a server
    did not publish them or counted none."""

    def value(deltas: list[ServerDelta]) -> float:
        pairs = [(getattr(d, seconds), getattr(d, count)) for d in deltas]
        if not pairs or any(s is None or n is None for s, n in pairs):
            return math.nan
        total = sum(n for _, n in pairs)
        return 1000 * sum(s for s, _ in pairs) / total if total > 0 else math.nan

    return value


SERVER_TIMINGS: dict[Metric, Callable[[list[ServerDelta]], float]] = {
    Metric.GDN_MS_PER_CALL: _per("gdn_seconds", "gdn_timed_calls"),
    Metric.SERVER_PREFILL: _per("prefill_seconds", "prefill_requests"),
    Metric.SERVER_DECODE: _per("decode_seconds", "decode_requests"),
    Metric.SERVER_QUEUE: _per("queue_seconds", "queue_requests"),
}


def side_blocks(
    deltas: list[ServerDelta], level: int, excluded: frozenset[tuple[int, int]]
) -> dict[int, dict[str, list[ServerDelta]]]:
    """Per repeat of `level` (in order, compiled blocks left out), each side's deltas."""
    blocks: dict[int, dict[str, list[ServerDelta]]] = {}
    for delta in deltas:
        if delta.level == level and (level, delta.repeat) not in excluded:
            blocks.setdefault(delta.repeat, {}).setdefault(side_of(delta.server), []).append(delta)
    return {repeat: blocks[repeat] for repeat in sorted(blocks)}


def server_comparisons(
    deltas: list[ServerDelta], level: int, timing: TimingDesign, confidence: float
) -> tuple[MetricComparison, ...]:
    """Per server metric both sides published at `level`: each side's mean over the blocks and
    the candidate/reference ratio with its interval over the block pairs (word: not judged)."""
    blocks = side_blocks(deltas, level, timing.excluded)
    both = [b for b in blocks.values() if Side.REFERENCE in b and Side.CANDIDATE in b]
    compared = []
    for metric, value in SERVER_TIMINGS.items():
        ref = np.array([value(b[Side.REFERENCE]) for b in both])
        cand = np.array([value(b[Side.CANDIDATE]) for b in both])
        if not np.isfinite(ref).any() or not np.isfinite(cand).any():
            continue
        with np.errstate(invalid="ignore", divide="ignore"):
            estimate = block_estimate(np.log(cand / ref), timing.stage_one_blocks)
        ratio, low, high = (
            estimate.interval(confidence)
            if estimate is not None and len(both) >= 2
            else (float(np.nanmean(cand) / np.nanmean(ref)), math.nan, math.nan)
        )
        compared.append(
            MetricComparison.from_bounds(
                level,
                metric,
                ratio,
                low,
                high,
                NOT_JUDGED,
                reference=float(np.nanmean(ref)),
                candidate=float(np.nanmean(cand)),
            )
        )
    return tuple(compared)
