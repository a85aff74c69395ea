"""What the kernel's own time predicts end to end, beside what was measured: whether this served
configuration lets the kernel show.

From the servers' GDN prefill time per call (CUDA events around every call, both sides), the
calls per request and the reference's own end-to-end latency, a level's prediction is what a
GPU-bound server would show if only the GDN calls changed: each request's calls take
`calls x (candidate - reference)` ms more, and with C requests in flight the level's wall time
grows by `p = C x that / reference E2EL` (Little's law). So throughput changes by `-p / (1 + p)`,
E2EL by `p`, and TTFT by `p` too, except at C=1, where all of a request's GDN calls are its own
prefill: there by the added time over the reference's TTFT.

Where the kernel's time per call moved beyond its interval and a headline metric did not follow
(the prediction lies outside its measured interval and its word is not the kernel's direction:
"within noise", or the other way), the server's steps are set by something else (the host's
launches and scheduling), and the speed word does not speak for the kernel.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from rig.records import RequestRecord, ServerDelta, Side, side_of
from rig.verdict.perf_records import FASTER, SLOWER, LevelComparison, Metric, MetricComparison

# The headline metrics a prediction is made for (those the speed line words).
PREDICTED = (Metric.MEAN_TTFT, Metric.TOTAL_TOKEN_THROUGHPUT)


@dataclass(frozen=True)
class Prediction:
    """One metric's predicted change beside its measured one."""

    metric: Metric
    predicted_pct: float
    measured: MetricComparison

    @property
    def inside(self) -> bool:
        """The measured interval holds the prediction."""
        interval = self.measured.interval_pct
        return interval is not None and interval[0] <= self.predicted_pct <= interval[1]


@dataclass(frozen=True)
class KernelSensitivity:
    """A level's kernel time, its share, the end-to-end change it predicts and what came."""

    level: int
    kernel: MetricComparison  # GDN prefill per call, reference and candidate ms
    calls_per_request: float
    gdn_share_pct: float  # of the reference's wall time, C requests in flight
    predictions: tuple[Prediction, ...]

    @property
    def kernel_direction(self) -> str | None:
        """`slower` or `faster` where the per-call interval excludes no change, else None."""
        interval = self.kernel.interval
        if interval is None:
            return None
        if interval[0] > 1:
            return SLOWER
        if interval[1] < 1:
            return FASTER
        return None

    @property
    def hides_kernel(self) -> bool:
        """The kernel's time moved and a headline metric neither followed nor held the
        prediction."""
        direction = self.kernel_direction
        return direction is not None and any(
            not p.inside and p.measured.interval is not None and p.measured.word != direction
            for p in self.predictions
        )

    def describe(self) -> str:
        k = self.kernel
        interval = k.interval_pct
        moved = f" [{interval[0]:+.1f}, {interval[1]:+.1f}]" if interval else ""
        parts = [
            f"kernel at C{self.level}: GDN prefill {k.reference:.3g} -> {k.candidate:.3g} ms a "
            f"call ({k.change_pct:+.1f} %{moved}), {self.calls_per_request:.3g} calls a request, "
            f"{self.gdn_share_pct:.1f} % of the reference's time"
        ]
        for p in self.predictions:
            measured = p.measured.interval_pct
            shown = f"[{measured[0]:+.1f}, {measured[1]:+.1f}]" if measured else "no interval"
            parts.append(
                f"{p.metric.label} predicted {p.predicted_pct:+.1f} %, measured "
                f"{p.measured.change_pct:+.1f} % {shown}"
            )
        text = "; ".join(parts)
        if self.hides_kernel:
            text += (
                ": this served configuration hides the kernel (host-bound): its speed word "
                "does not speak for the kernel"
            )
        return text


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


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
    e2el_ms = 1000 * _mean([r.e2el_s for r in timed if r.e2el_s is not None])
    ttft_ms = 1000 * _mean([r.ttft_s for r in timed if r.ttft_s is not None])
    added_ms = per_request * (kernel.candidate - kernel.reference)
    stretch = level * added_ms / e2el_ms
    predicted = {
        Metric.MEAN_TTFT: 100 * (added_ms / ttft_ms if level == 1 else stretch),
        Metric.TOTAL_TOKEN_THROUGHPUT: -100 * stretch / (1 + stretch),
    }
    predictions = tuple(
        Prediction(metric, predicted[metric], measured)
        for metric in PREDICTED
        if (measured := compared.get(metric)) is not None
    )
    share = 100 * level * per_request * kernel.reference / e2el_ms
    return KernelSensitivity(level, kernel, per_request, share, predictions)


def hidden_levels(levels: Iterable[LevelComparison]) -> list[int]:
    """The levels whose served configuration hides the kernel."""
    return [lc.level for lc in levels if lc.sensitivity is not None and lc.sensitivity.hides_kernel]
