"""What the kernel's own time predicts end to end, beside what was measured: whether this served
configuration lets the kernel show.

From the servers' GDN prefill time per call (CUDA events around every call, both sides), the
calls per request and the reference's own wall time per request, a level's prediction is what a
GPU-bound server would show if only the GDN calls changed: each request's calls take
`calls x (candidate - reference)` ms more, and the level's wall time grows by
`p = that / wall time per request`. So throughput changes by `-p / (1 + p)`, E2EL by `p`, and
TTFT by `p` too, except at C=1, where all of a request's GDN calls are its own prefill: there by
the added time over the reference's TTFT. The wall time per request is a request's E2EL at C=1
(one at a time) and, above it, each block's span over its requests. That span is Little's law
with the concurrency a block really held, where E2EL / C assumed C requests in flight
throughout: a block of 200 requests at C=200 drains from its first answer on and holds about
half that, and E2EL / C over-predicted a 0.66 ms-a-call GPU delay's throughput change there
twice over (-6.4 % against -3.0 % [-4.0, -2.0] measured, one H100, 2026-12-07).

Where the kernel's time per call moved beyond its interval and a headline metric did not follow
(the prediction lies outside its measured interval and its word is not the kernel's direction:
"within noise", or the other way), the server's steps are set by something else (the host's
launches and scheduling), and the speed word does not speak for the kernel.

With a profiled block (`profile:`), the share is measured instead: GDN prefill's part of the
reference's profiled step time (rig/verdict/profile.py), and `ProfiledShare` makes the same
prediction from it, shown beside the estimated one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from rig.records import RequestRecord, ServerDelta, Side, duration_s, side_of
from rig.verdict.perf_records import (
    KernelSensitivity,
    LevelComparison,
    Metric,
    PerfResult,
    Prediction,
)
from rig.verdict.profile_report import ProfileResult

# The headline metrics a prediction is made for (those the speed line words).
PREDICTED = (Metric.MEAN_TTFT, Metric.TOTAL_TOKEN_THROUGHPUT)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def _wall_ms_per_request(timed: list[RequestRecord], level: int) -> float:
    """The reference's wall time per request at a level (ms): at C=1 a request's E2EL (request
    pairs interleave the sides, so a block's span would hold the other side's time too); above,
    its blocks' spans over their requests, or E2EL / C where a block has no span."""
    e2el_ms = 1000 * _mean([r.e2el_s for r in timed if r.e2el_s is not None])
    if level == 1:
        return e2el_ms
    blocks: dict[int, list[RequestRecord]] = {}
    for record in timed:
        blocks.setdefault(record.repeat, []).append(record)
    spans = [duration_s(block) for block in blocks.values()]
    if any(span is None or span <= 0 for span in spans):
        return e2el_ms / level
    return 1000 * sum(spans) / len(timed)


def level_sensitivity(
    compared: LevelComparison,
    records: Iterable[RequestRecord],
    deltas: Iterable[ServerDelta],
    excluded: frozenset[tuple[int, int]] = frozenset(),
) -> KernelSensitivity | None:
    """The level's sensitivity; None where a side published no GDN time or no call was
    counted (an attached server without the plugin, vLLM's CPU build has it)."""
    kernel = compared.get(Metric.GDN_MS_PER_CALL)
    if kernel is None or kernel.reference is None or kernel.candidate is None:
        return None
    level = compared.level
    deltas = list(deltas)
    kept = {d.repeat for d in deltas if d.level == level and (level, d.repeat) not in excluded}
    calls = sum(
        d.gdn_prefill_calls or 0
        for d in deltas
        if d.level == level and d.repeat in kept and side_of(d.server) == Side.REFERENCE
    )
    timed = [
        r
        for r in records
        if r.side == Side.REFERENCE
        and r.level == level
        and r.repeat in kept
        and not r.warmup
        and r.error is None
    ]
    if not timed or not calls:
        return None
    per_request = calls / len(timed)
    wall_ms = _wall_ms_per_request(timed, level)
    ttft_ms = 1000 * _mean([r.ttft_s for r in timed if r.ttft_s is not None])
    added_ms = per_request * (kernel.candidate - kernel.reference)
    stretch = added_ms / wall_ms
    predicted = {
        Metric.MEAN_TTFT: 100 * (added_ms / ttft_ms if level == 1 else stretch),
        Metric.TOTAL_TOKEN_THROUGHPUT: -100 * stretch / (1 + stretch),
    }
    predictions = tuple(
        Prediction(metric, predicted[metric], measured)
        for metric in PREDICTED
        if (measured := compared.get(metric)) is not None
    )
    share = 100 * per_request * kernel.reference / wall_ms
    return KernelSensitivity(level, kernel, per_request, share, predictions)


def hidden_levels(levels: Iterable[LevelComparison]) -> list[int]:
    """The levels whose served configuration hides the kernel."""
    return [lc.level for lc in levels if lc.sensitivity is not None and lc.sensitivity.hides_kernel]


@dataclass(frozen=True)
class ProfiledShare:
    """The same prediction from the GDN share the profiled block measured: GDN prefill takes
    `share` of the reference's step time, and the candidate's calls take `ratio` times as long,
    so a step takes `1 + share x (ratio - 1)` times as long (TTFT and E2EL by that, throughput
    by its inverse). The share is of the profiled block's steps, at the profile's level."""

    level: int
    share_pct: float
    ratio: float  # candidate / reference GDN prefill time per call
    ratio_source: str  # the servers' call timing at the level, or the profile's own
    predictions: tuple[Prediction, ...]

    def describe(self) -> str:
        parts = [
            f"kernel at C{self.level}, from the profiled share: GDN prefill "
            f"{self.share_pct:.1f} % of the reference's profiled step time, the candidate's "
            f"{self.ratio:.3g}x a call ({self.ratio_source})"
        ]
        return "; ".join([*parts, *(p.describe() for p in self.predictions)])


def profiled_share(profile: ProfileResult | None, perf: PerfResult | None) -> ProfiledShare | None:
    """The measured-share prediction at the profile's level; None without a reference share, a
    ratio, or a measured metric there."""
    if profile is None or perf is None:
        return None
    reference = profile.table(Side.REFERENCE)
    share = reference.gdn_share_pct if reference is not None else None
    compared = perf.level(profile.level)
    if share is None or compared is None:
        return None
    kernel = compared.get(Metric.GDN_MS_PER_CALL)
    if kernel is not None and kernel.reference and kernel.candidate is not None:
        ratio, source = kernel.candidate / kernel.reference, "the servers' call timing"
    elif (ratio := profile.gdn_ratio_per_call()) is not None:
        source = "the profiled block's calls"
    else:
        return None
    stretch = share / 100 * (ratio - 1)
    predicted = {
        Metric.MEAN_TTFT: 100 * stretch,
        Metric.TOTAL_TOKEN_THROUGHPUT: -100 * stretch / (1 + stretch),
    }
    predictions = tuple(
        Prediction(metric, predicted[metric], measured)
        for metric in PREDICTED
        if (measured := compared.get(metric)) is not None
    )
    if not predictions:
        return None
    return ProfiledShare(profile.level, share, ratio, source, predictions)
