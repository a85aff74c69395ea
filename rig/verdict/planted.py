"""A planted slowdown (`ref+delay-<N>ms`: vLLM's own kernel, N ms after every GDN prefill call)
measured, not assumed: the calls the candidate's servers counted, times N, per request, against
the reference's time in the same run, and whether the measured interval holds it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from rig.records import RequestRecord, Side

CANDIDATE = "candidate/reference"
PLANTED_METRICS = ("mean_ttft_ms", "mean_e2el_ms")  # grow by the same time per request


@dataclass(frozen=True)
class PlantedDelay:
    """The candidate's planted delay and the GDN prefill calls its servers made in each
    (level, repeat), from their /metrics before and after the level."""

    kernel: str
    delay_ms: float
    calls: dict[tuple[int, int], int]


def add_planted(
    frame: pd.DataFrame,
    records: Iterable[RequestRecord],
    planted: PlantedDelay,
    excluded: frozenset[tuple[int, int]] = frozenset(),
) -> pd.DataFrame:
    """Candidate rows at C=1 get what the delay planted: `planted_delay_ms` per call,
    `planted_calls_per_request`, `planted_ms_per_request` (delay x calls / requests), and per
    metric of PLANTED_METRICS `<m>_planted_pct` (that time over the reference's mean, in
    percent) and `<m>_planted_inside_ci` (whether the interval holds it). Other levels batch
    several requests' prefills into one call: nothing is claimed there. Blocks left out of
    the interval (`excluded`, a JIT compilation) are left out here too."""
    timed = [r for r in records if not r.warmup and not r.cancelled]
    frame = frame.copy()
    for index, row in frame.iterrows():
        if row["comparison"] != CANDIDATE or row["level"] != 1:
            continue
        level = int(row["level"])
        repeats = sorted(
            rep for (lvl, rep) in planted.calls if lvl == level and (lvl, rep) not in excluded
        )
        requests = sum(
            1
            for r in timed
            if r.side == Side.CANDIDATE and r.level == level and r.repeat in repeats
        )
        if not requests:
            continue
        calls = sum(planted.calls[(level, rep)] for rep in repeats)
        added_ms = planted.delay_ms * calls / requests
        frame.loc[index, "planted_delay_ms"] = planted.delay_ms
        frame.loc[index, "planted_ms_per_request"] = added_ms
        frame.loc[index, "planted_calls_per_request"] = calls / requests
        for metric in PLANTED_METRICS:
            reference = _reference_mean(timed, level, repeats, metric)
            pct = 100 * added_ms / reference
            low, high = row[f"{metric}_ci_low_pct"], row[f"{metric}_ci_high_pct"]
            frame.loc[index, f"{metric}_planted_pct"] = pct
            frame.loc[index, f"{metric}_planted_inside_ci"] = bool(low <= pct <= high)
    return frame


def _reference_mean(
    records: list[RequestRecord], level: int, repeats: list[int], metric: str
) -> float:
    """The reference's metric at a level, the mean over repeats of each repeat's mean (as the
    ratio's point estimate takes it)."""
    field_name = {"mean_ttft_ms": "ttft_s", "mean_e2el_ms": "e2el_s"}[metric]
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
