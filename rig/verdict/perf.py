"""The performance verdict: per level and metric, the candidate/reference ratio with an interval
that fits how the load was scheduled, and a word for it (`faster`, `slower`, `within noise`).

Metric names and definitions are `vllm bench serve`'s (mean TTFT over requests, TPOT =
(E2EL - TTFT)/(tokens - 1) per request, ITL over every inter-token gap, throughputs over the
block's wall time), computed once per block: one side's run of one (level, repeat). Request i is
the same prompt on both sides, so every comparison is paired (rig.verdict.intervals has the
units: the block pair, or at a level whose requests ran pair by pair, the request pair).

Left out of every interval: blocks in which a server compiled a kernel (their time holds the
compilation; the load stage ran another block instead), cancelled and warm-up requests. A level
where some pair's outputs differ in length, or one side failed, did unequal work: its ratios are
shown with no interval and no word. One block pair is no measurement of speed: no interval.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

import numpy as np

from rig.records import RequestRecord, ServerDelta, Side, duration_s
from rig.verdict.intervals import (
    LogEstimate,
    SumRatio,
    TimingDesign,
    block_estimate,
    pair_estimate,
)
from rig.verdict.perf_records import (
    BLOCK,
    CLIENT_METRICS,
    FASTER,
    HEADLINE_METRICS,
    NOISE,
    ONE_BLOCK,
    PAIR,
    SLOWER,
    UNEQUAL,
    Comparison,
    LevelComparison,
    Metric,
    MetricComparison,
    PerfResult,
)
from rig.verdict.planted import PlantedDelay, planted_share
from rig.verdict.sensitivity import level_sensitivity
from rig.verdict.server_side import server_comparisons

CONFIDENCE = 0.95
FIXED = TimingDesign()  # a fixed number of blocks, every block kept, blocks as units


@dataclass(frozen=True)
class RepeatArrays:
    """One block: one side's requests of one (level, repeat), by request index (the position in
    the level's ordered requests, the same prompt on both sides); NaN where a request failed."""

    ttft_ms: np.ndarray  # also NaN where a request wrote nothing
    tpot_ms: np.ndarray  # also NaN where a request has fewer than two tokens
    e2el_ms: np.ndarray
    itl_sum_ms: np.ndarray
    itl_count: np.ndarray
    output_tokens: np.ndarray
    prompt_tokens: np.ndarray
    duration_s: float
    completed: int  # RequestRecord.completed


def repeat_arrays(records: list[RequestRecord], size: int) -> RepeatArrays | None:
    ok = [r for r in records if r.completed]
    if not ok:
        return None
    arrays = {name: np.full(size, np.nan) for name in ("ttft", "e2el", "itl", "n_itl", "out", "in")}
    for r in ok:
        arrays["ttft"][r.index] = math.nan if r.ttft_s is None else r.ttft_s * 1000
        arrays["e2el"][r.index] = math.nan if r.e2el_s is None else r.e2el_s * 1000
        arrays["itl"][r.index] = sum(r.itl_s) * 1000
        arrays["n_itl"][r.index] = len(r.itl_s)
        arrays["out"][r.index] = r.output_tokens or 0
        arrays["in"][r.index] = r.prompt_tokens or 0
    tpot = np.full(size, np.nan)
    for r in ok:
        if r.tpot_s is not None:
            tpot[r.index] = r.tpot_s * 1000
    return RepeatArrays(
        ttft_ms=arrays["ttft"],
        tpot_ms=tpot,
        e2el_ms=arrays["e2el"],
        itl_sum_ms=arrays["itl"],
        itl_count=arrays["n_itl"],
        output_tokens=arrays["out"],
        prompt_tokens=arrays["in"],
        duration_s=duration_s(records) or math.nan,
        completed=len(ok),
    )


def block_metrics(a: RepeatArrays) -> dict[Metric, float]:
    """Every metric of one block."""
    valid = ~np.isnan(a.ttft_ms)
    duration = a.duration_s if a.duration_s > 0 else math.nan
    out, prompt = np.nansum(a.output_tokens), np.nansum(a.prompt_tokens)
    with np.errstate(invalid="ignore", divide="ignore"):
        return {
            Metric.MEAN_TTFT: float(np.nanmean(a.ttft_ms)) if valid.any() else math.nan,
            Metric.MEDIAN_TTFT: _percentile(a.ttft_ms, 50),
            Metric.P99_TTFT: _percentile(a.ttft_ms, 99),
            Metric.MEAN_TPOT: _mean(a.tpot_ms),
            Metric.MEAN_ITL: float(np.nansum(a.itl_sum_ms) / np.nansum(a.itl_count)),
            Metric.MEAN_E2EL: _mean(a.e2el_ms),
            Metric.REQUEST_THROUGHPUT: float(a.completed / duration),
            Metric.OUTPUT_THROUGHPUT: float(out / duration),
            Metric.TOTAL_TOKEN_THROUGHPUT: float((out + prompt) / duration),
        }


def _mean(values: np.ndarray) -> float:
    finite = values[~np.isnan(values)]
    return float(finite.mean()) if finite.size else math.nan


def _percentile(values: np.ndarray, q: float) -> float:
    finite = values[~np.isnan(values)]
    return float(np.percentile(finite, q)) if finite.size else math.nan


@dataclass
class LevelBlocks:
    """The block pairs both sides ran at one level, in repeat order, and what was left out."""

    level: int
    pairs: list[tuple[int, RepeatArrays, RepeatArrays]] = field(default_factory=list)
    excluded: list[int] = field(default_factory=list)  # repeats with a JIT compilation

    @property
    def unequal_pairs(self) -> int:
        """Request pairs where one side failed or the outputs differ in length."""
        count = 0
        for _, ref, cand in self.pairs:
            failed = np.isnan(ref.ttft_ms) | np.isnan(cand.ttft_ms)
            count += int((failed | (ref.output_tokens != cand.output_tokens)).sum())
        return count


def paired_levels(
    reference: list[RequestRecord],
    candidate: list[RequestRecord],
    excluded: frozenset[tuple[int, int]] = frozenset(),
) -> dict[int, LevelBlocks]:
    """Per level, the (level, repeat) blocks both sides ran, as arrays of one size."""
    groups: dict[tuple[str, int, int], list[RequestRecord]] = {}
    for side, records in ((Side.REFERENCE, reference), (Side.CANDIDATE, candidate)):
        for r in records:
            if not r.warmup and not r.cancelled:
                groups.setdefault((side, r.level, r.repeat), []).append(r)
    levels: dict[int, LevelBlocks] = {}
    for (side, level, repeat), ref_records in sorted(groups.items()):
        cand_records = groups.get((Side.CANDIDATE, level, repeat))
        if side != Side.REFERENCE or cand_records is None:
            continue
        blocks = levels.setdefault(level, LevelBlocks(level))
        if (level, repeat) in excluded:
            blocks.excluded.append(repeat)
            continue
        size = 1 + max(r.index for r in ref_records + cand_records)
        ref, cand = repeat_arrays(ref_records, size), repeat_arrays(cand_records, size)
        if ref is not None and cand is not None:
            blocks.pairs.append((repeat, ref, cand))
    return levels


def block_estimates(blocks: LevelBlocks, stage_one: int | None) -> dict[Metric, LogEstimate]:
    """Per metric, from each block pair's ratio of the two blocks' metrics."""
    per_block = [(block_metrics(ref), block_metrics(cand)) for _, ref, cand in blocks.pairs]
    estimates = {}
    for metric in CLIENT_METRICS:
        with np.errstate(invalid="ignore", divide="ignore"):
            logs = np.log(np.array([c[metric] / r[metric] for r, c in per_block]))
        estimate = block_estimate(logs, stage_one)
        if estimate is not None:
            estimates[metric] = estimate
    return estimates


# Metrics that are ratios of sums over request pairs, for levels measured pair by pair:
# (candidate's numerator, candidate's denominator) per pair, the reference's the same. A
# throughput at C=1 is tokens over the time spent serving them (the sum of E2EL).
_PAIR_TERMS = {
    Metric.MEAN_TTFT: ("ttft_ms", None),
    Metric.MEAN_TPOT: ("tpot_ms", None),
    Metric.MEAN_ITL: ("itl_sum_ms", "itl_count"),
    Metric.MEAN_E2EL: ("e2el_ms", None),
    Metric.REQUEST_THROUGHPUT: (None, "e2el_ms"),
    Metric.OUTPUT_THROUGHPUT: ("output_tokens", "e2el_ms"),
    Metric.TOTAL_TOKEN_THROUGHPUT: ("total_tokens", "e2el_ms"),
}


def _pair_column(arrays: list[RepeatArrays], name: str | None) -> np.ndarray:
    if name is None:
        return np.concatenate([np.where(np.isnan(a.ttft_ms), np.nan, 1.0) for a in arrays])
    if name == "total_tokens":
        return np.concatenate([a.output_tokens + a.prompt_tokens for a in arrays])
    return np.concatenate([getattr(a, name) for a in arrays])


def pair_estimates(blocks: LevelBlocks, stage_one: int | None) -> dict[Metric, LogEstimate]:
    """Per metric, a ratio of sums over the request pairs of every block, in the order they
    ran; stage one is the pairs of the first `stage_one` blocks."""
    refs = [ref for _, ref, _ in blocks.pairs]
    cands = [cand for _, _, cand in blocks.pairs]
    stage_pairs = sum(a.ttft_ms.size for a in refs[:stage_one]) if stage_one else None
    estimates = {}
    for metric, (numerator, denominator) in _PAIR_TERMS.items():
        terms = []
        for sign, arrays in ((1, cands), (-1, refs)):
            terms.append((sign, _pair_column(arrays, numerator)))
            if denominator is not None:
                terms.append((-sign, _pair_column(arrays, denominator)))
        estimate = pair_estimate(SumRatio(tuple(terms)), _valid_before(terms, stage_pairs))
        if estimate is not None:
            estimates[metric] = estimate
    return estimates


def _valid_before(terms: list[tuple[int, np.ndarray]], position: int | None) -> int | None:
    """How many usable pairs lie before `position` (stage one counted in usable pairs)."""
    if position is None:
        return None
    valid = np.ones(terms[0][1].size, dtype=bool)
    for _, values in terms:
        valid &= np.isfinite(values)
    return int(valid[:position].sum())


def _estimates(blocks: LevelBlocks, timing: TimingDesign, stage_one: int | None):
    if blocks.level in timing.pair_levels:
        return pair_estimates(blocks, stage_one)
    return block_estimates(blocks, stage_one)


def blocks_needed(blocks: LevelBlocks, timing: TimingDesign, confidence: float) -> int | None:
    """Stein's second stage: the block pairs every headline interval needs to be within
    ±timing.resolution_pct, from the stage-one blocks; None before stage one is done."""
    stage_one = timing.stage_one_blocks
    if stage_one is None or timing.resolution_pct is None or len(blocks.pairs) < stage_one:
        return None
    estimates = _estimates(blocks, timing, stage_one)
    half = math.log1p(timing.resolution_pct / 100)
    needed = [estimates[m].units_for(half, confidence) for m in HEADLINE_METRICS if m in estimates]
    if not needed or 0 in needed:
        return None
    if blocks.level in timing.pair_levels:  # units are pairs: in blocks of the pairs they hold
        per_block = max(1, estimates[HEADLINE_METRICS[0]].units // len(blocks.pairs))
        return math.ceil(max(needed) / per_block)
    return max(needed)


def level_estimates(blocks: LevelBlocks, timing: TimingDesign) -> dict[Metric, LogEstimate]:
    """The level's estimates in the unit its schedule allows; a sequential design's spread is
    stage one's, also where the budget ended before Stein's rule was met (its coverage holds
    over every stage one: taking all blocks' spread only where stage one looked wide would
    leave the narrow ones uncompensated, 7-9 % misses at a stated 5 % in the simulation)."""
    return _estimates(blocks, timing, timing.stage_one_blocks)


def word(lower_is_better: bool, low: float, high: float) -> str:
    """faster / slower / within noise from the ratio's interval (candidate / reference)."""
    if not (np.isfinite(low) and np.isfinite(high)):
        return "n/a"
    if high < 1:
        return FASTER if lower_is_better else SLOWER
    if low > 1:
        return SLOWER if lower_is_better else FASTER
    return NOISE


def _point_ratios(blocks: LevelBlocks) -> dict[Metric, float]:
    """Each metric's ratio of the two sides' block means (no interval)."""
    per_block = [(block_metrics(ref), block_metrics(cand)) for _, ref, cand in blocks.pairs]
    with np.errstate(invalid="ignore", divide="ignore"):
        return {
            m: float(np.nanmean([c[m] for _, c in per_block]))
            / float(np.nanmean([r[m] for r, _ in per_block]))
            for m in CLIENT_METRICS
        }


def _level_metrics(
    blocks: LevelBlocks, unequal: int, timing: TimingDesign, confidence: float
) -> tuple[MetricComparison, ...]:
    estimates = {} if unequal else level_estimates(blocks, timing)
    points = _point_ratios(blocks)
    metrics = []
    for metric in CLIENT_METRICS:
        estimate = estimates.get(metric)
        if unequal or estimate is None:
            text = UNEQUAL if unequal else ONE_BLOCK
            metrics.append(
                MetricComparison.from_bounds(
                    blocks.level, metric, points[metric], math.nan, math.nan, text
                )
            )
            continue
        ratio, low, high = estimate.interval(confidence)
        if len(blocks.pairs) < 2:
            low = high = math.nan
        text = word(metric.lower_is_better, low, high) if np.isfinite(low) else ONE_BLOCK
        metrics.append(MetricComparison.from_bounds(blocks.level, metric, ratio, low, high, text))
    return tuple(metrics)


def compare_levels(
    reference: Iterable[RequestRecord],
    candidate: Iterable[RequestRecord],
    comparison: Comparison = Comparison.CANDIDATE,
    confidence: float = CONFIDENCE,
    timing: TimingDesign = FIXED,
) -> tuple[LevelComparison, ...]:
    """One LevelComparison per level both sides ran: its unit, blocks and the pairs that did
    unequal work, and per client metric the ratio candidate / reference, its interval and
    its word."""
    levels = paired_levels(list(reference), list(candidate), timing.excluded)
    compared = []
    for level, blocks in levels.items():
        if not blocks.pairs:
            continue
        unequal = blocks.unequal_pairs
        compared.append(
            LevelComparison(
                comparison=comparison,
                level=level,
                unit=PAIR if level in timing.pair_levels else BLOCK,
                repeats=len(blocks.pairs),
                excluded_blocks=len(blocks.excluded),
                requests=int(sum(np.sum(~np.isnan(cand.ttft_ms)) for _, _, cand in blocks.pairs)),
                unequal_pairs=unequal,
                metrics=_level_metrics(blocks, unequal, timing, confidence),
            )
        )
    return tuple(compared)


def perf_result(
    records: Iterable[RequestRecord],
    aa_records: Iterable[RequestRecord] = (),
    aa_concurrency: int | None = None,
    planted: PlantedDelay | None = None,
    confidence: float = CONFIDENCE,
    timing: TimingDesign = FIXED,
    deltas: Iterable[ServerDelta] = (),
) -> PerfResult:
    """The run's candidate-vs-reference comparison from its timed, finished requests, with the
    servers' own timings beside it (server_side.py), and, when the A/A control ran at one of the
    levels' concurrencies, the A/A performance floor: the reference server's replay of a
    level's requests against that level's first repeat (same kernel, same concurrency; one
    block, so a ratio with no interval). With a planted delay, what it planted (planted.py)."""
    records = list(records)
    deltas = list(deltas)
    finished = [r for r in records if not r.cancelled]
    reference = [r for r in finished if r.side == Side.REFERENCE]
    candidate = [r for r in finished if r.side == Side.CANDIDATE]
    levels = []
    for compared in compare_levels(reference, candidate, confidence=confidence, timing=timing):
        server = server_comparisons(deltas, compared.level, timing, confidence)
        compared = replace(compared, metrics=compared.metrics + server)
        if planted is not None:
            share = planted_share(compared, records, planted, timing.excluded)
            compared = replace(compared, planted=share)
        sensitivity = level_sensitivity(compared, records, deltas, timing.excluded)
        levels.append(replace(compared, sensitivity=sensitivity))
    replay = [replace(r, level=aa_concurrency) for r in aa_records]
    baseline = [r for r in reference if r.level == aa_concurrency and r.repeat == 0]
    if replay and baseline:
        levels += compare_levels(baseline, replay, comparison=Comparison.AA, confidence=confidence)
    return PerfResult(tuple(levels))
