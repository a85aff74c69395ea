"""A planted slowdown (`ref+delay-<N>ms`: vLLM's own kernel, N ms after every GDN prefill call)
measured, not assumed: the calls the candidate's servers counted, times N, per request, against
the reference's time in the same run, and whether the measured interval holds it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from rig.records import RequestRecord, Side
from rig.verdict.perf_records import (
    Comparison,
    LevelComparison,
    Metric,
    PlantedChange,
    PlantedShare,
)

# The metrics that grow by the same time per request, and the request's field each is a mean of.
PLANTED_METRICS = {Metric.MEAN_TTFT: "ttft_s", Metric.MEAN_E2EL: "e2el_s"}


@dataclass(frozen=True)
class PlantedDelay:
    """The candidate's planted delay and the GDN prefill calls its servers made in each
    (level, repeat), from their /metrics before and after the level."""

    kernel: str
    delay_ms: float
    calls: dict[tuple[int, int], int]


def planted_share(
    compared: LevelComparison,
    records: Iterable[RequestRecord],
    planted: PlantedDelay,
    excluded: frozenset[tuple[int, int]] = frozenset(),
) -> PlantedShare | None:
    """What the delay planted at the candidate's C=1 level: the delay per call, the calls per
    request, the time per request (delay x calls / requests), and per metric of
    PLANTED_METRICS that time over the reference's mean, in percent, and whether the interval
    holds it. Other levels batch several requests' prefills into one call: nothing is claimed
    there (None). Blocks left out of the interval (`excluded`, a JIT compilation) are left out
    here too."""
    level = compared.level
    if compared.comparison != Comparison.CANDIDATE or level != 1:
        return None
    timed = [r for r in records if not r.warmup and not r.cancelled]
    repeats = sorted(
        rep for (lvl, rep) in planted.calls if lvl == level and (lvl, rep) not in excluded
    )
    requests = sum(
        1 for r in timed if r.side == Side.CANDIDATE and r.level == level and r.repeat in repeats
    )
    if not requests:
        return None
    calls = sum(planted.calls[(level, rep)] for rep in repeats)
    added_ms = planted.delay_ms * calls / requests
    changes = []
    for metric, field_name in PLANTED_METRICS.items():
        pct = 100 * added_ms / _reference_mean(timed, level, repeats, field_name)
        measured = compared.get(metric)
        interval = measured.interval_pct if measured is not None else None
        inside = interval is not None and bool(interval[0] <= pct <= interval[1])
        changes.append(PlantedChange(metric, pct, inside))
    return PlantedShare(planted.delay_ms, added_ms, calls / requests, tuple(changes))


def _reference_mean(
    records: list[RequestRecord], level: int, repeats: list[int], field_name: str
) -> float:
    """The reference's `field_name` at a level, in ms: the mean over repeats of each repeat's
    mean (as the ratio's point estimate takes it)."""
    means = []
    for repeat in repeats:
        values = [
            getattr(r, field_name)
            for r in records
            if r.side == Side.REFERENCE
            and (r.level, r.repeat) == (level, repeat)
            and r.error is None
        ]
        if values:
            means.append(1000 * float(np.mean(values)))
    return float(np.mean(means)) if means else float("nan")
