"""The performance verdict: per level and metric, the candidate/reference ratio with a 95%
interval, and a word for it (`faster`, `slower`, `within noise`).

Metric names and definitions are `vllm bench serve`'s (mean TTFT over requests, TPOT =
(E2EL - TTFT)/(tokens - 1) per request, ITL over every inter-token gap, throughputs over the
level's wall time). Request i is the same prompt on both sides, so every comparison is paired.

With two or more repeats, the repeat is the unit: each repeat gives one ratio per metric (the
same prompts on both sides, so the prompt mix cancels), and the interval is Student's t over
the repeats' log ratios, centred on their geometric mean. It holds the variation between
repeats that a resampling of a few repeats misses: the performance control measured the
earlier bootstrap over requests and repeats calling 15-20% of A/A throughputs `faster` or
`slower` with 3-5 repeats (tests/verdict/test_perf.py simulates it). With one repeat, a paired
bootstrap over request positions (the same draws for both sides): it covers request-to-request
variation only, and a throughput, one number per repeat, has no interval (`single run`). A
change whose interval includes 1 is `within noise`.

A candidate slowed on purpose (`ref+delay-<N>ms`: N ms after every GDN prefill call) gets the
change it planted next to what was measured: at C=1 the requests run one at a time and every
GDN prefill call belongs to one request's prefill, before its first token, so each request's
TTFT and E2EL grow by N ms x its calls; the calls are counted on the candidate's /metrics around
each level, the reference's mean TTFT/E2EL is measured in the same run.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from rig.records import RequestRecord
from rig.verdict.student_t import t_quantile

RESAMPLES = 2000
SEED = 20261130
CONFIDENCE = 0.95
# vllm bench serve's names, and True where lower is better (latency), False for throughput.
PERF_METRICS = {
    "mean_ttft_ms": True,
    "median_ttft_ms": True,
    "p99_ttft_ms": True,
    "mean_tpot_ms": True,
    "mean_itl_ms": True,
    "mean_e2el_ms": True,
    "request_throughput": False,
    "output_throughput": False,
    "total_token_throughput": False,
}
FASTER, SLOWER, NOISE = "faster", "slower", "within noise"
SINGLE = "single run"  # a throughput's word with one repeat: no interval to judge


@dataclass(frozen=True)
class RepeatArrays:
    """One repeat of one side at one level, by request index (the position in the level's
    ordered requests, the same prompt on both sides); NaN where a request failed."""

    ttft_ms: np.ndarray
    tpot_ms: np.ndarray  # also NaN where a request has fewer than two tokens
    e2el_ms: np.ndarray
    itl_sum_ms: np.ndarray
    itl_count: np.ndarray
    output_tokens: np.ndarray
    prompt_tokens: np.ndarray
    duration_s: float


def repeat_arrays(records: list[RequestRecord], size: int) -> RepeatArrays | None:
    ok = [r for r in records if r.error is None and r.ttft_s is not None and r.e2el_s is not None]
    if not ok:
        return None
    arrays = {name: np.full(size, np.nan) for name in ("ttft", "e2el", "itl", "n_itl", "out", "in")}
    for r in ok:
        arrays["ttft"][r.index] = r.ttft_s * 1000
        arrays["e2el"][r.index] = r.e2el_s * 1000
        arrays["itl"][r.index] = sum(r.itl_s) * 1000
        arrays["n_itl"][r.index] = len(r.itl_s)
        arrays["out"][r.index] = r.output_tokens or 0
        arrays["in"][r.index] = r.prompt_tokens or 0
    out = arrays["out"]
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out > 1, (arrays["e2el"] - arrays["ttft"]) / (out - 1), np.nan)
    duration = max(r.sent_at + r.e2el_s for r in ok) - min(r.sent_at for r in records)
    return RepeatArrays(
        ttft_ms=arrays["ttft"],
        tpot_ms=tpot,
        e2el_ms=arrays["e2el"],
        itl_sum_ms=arrays["itl"],
        itl_count=arrays["n_itl"],
        output_tokens=out,
        prompt_tokens=arrays["in"],
        duration_s=duration,
    )


def _nanmean(values: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.nansum(values, axis=1) / (~np.isnan(values)).sum(axis=1)


def _metrics(a: RepeatArrays, idx: np.ndarray) -> dict[str, np.ndarray]:
    """Every metric of one repeat, one value per row of idx (resamples x request indices)."""
    ttft, tpot, e2el = a.ttft_ms[idx], a.tpot_ms[idx], a.e2el_ms[idx]
    duration = a.duration_s if a.duration_s > 0 else np.nan
    out, prompt = np.nansum(a.output_tokens[idx], axis=1), np.nansum(a.prompt_tokens[idx], axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        itl_mean = np.nansum(a.itl_sum_ms[idx], axis=1) / np.nansum(a.itl_count[idx], axis=1)
    completed = (~np.isnan(ttft)).sum(axis=1)
    return {
        "mean_ttft_ms": _nanmean(ttft),
        "median_ttft_ms": _nanpercentile(ttft, 50),
        "p99_ttft_ms": _nanpercentile(ttft, 99),
        "mean_tpot_ms": _nanmean(tpot),
        "mean_itl_ms": itl_mean,
        "mean_e2el_ms": _nanmean(e2el),
        "request_throughput": completed / duration,
        "output_throughput": out / duration,
        "total_token_throughput": (out + prompt) / duration,
    }


def _nanpercentile(values: np.ndarray, q: float) -> np.ndarray:
    """Per row, ignoring NaN; NaN sorts last, so each row's valid values come first."""
    ordered = np.sort(values, axis=1)
    valid = (~np.isnan(values)).sum(axis=1)
    position = (np.maximum(valid, 1) - 1) * q / 100
    low = np.floor(position).astype(int)
    high = np.minimum(low + 1, np.maximum(valid - 1, 0))
    rows = np.arange(values.shape[0])
    below, above = ordered[rows, low], ordered[rows, high]
    result = below + (above - below) * (position - low)
    return np.where(valid > 0, result, np.nan)


def paired_bootstrap(
    ref: RepeatArrays, cand: RepeatArrays, rng: np.random.Generator, resamples: int = RESAMPLES
) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """One repeat: point ratios (candidate / reference) and their paired bootstrap, the same
    request positions (the same prompts) drawn for both sides, so the prompt mix cancels and
    what varies is how each side served them."""
    whole = np.arange(ref.ttft_ms.size)[None, :]
    idx = rng.integers(0, ref.ttft_ms.size, size=(resamples, ref.ttft_ms.size))
    ref_whole, cand_whole = _metrics(ref, whole), _metrics(cand, whole)
    ref_drawn, cand_drawn = _metrics(ref, idx), _metrics(cand, idx)
    with np.errstate(invalid="ignore", divide="ignore"):
        points = {m: float(cand_whole[m][0] / ref_whole[m][0]) for m in PERF_METRICS}
        ratios = {m: cand_drawn[m] / ref_drawn[m] for m in PERF_METRICS}
    return points, ratios


def repeat_ratios(pairs: list[tuple[RepeatArrays, RepeatArrays]]) -> dict[str, np.ndarray]:
    """Per metric, each repeat's candidate / reference ratio over all its requests."""
    ratios: dict[str, list[float]] = {metric: [] for metric in PERF_METRICS}
    for ref, cand in pairs:
        whole = np.arange(ref.ttft_ms.size)[None, :]
        ref_metrics, cand_metrics = _metrics(ref, whole), _metrics(cand, whole)
        for metric in PERF_METRICS:
            with np.errstate(invalid="ignore", divide="ignore"):
                ratios[metric].append(float(cand_metrics[metric][0] / ref_metrics[metric][0]))
    return {metric: np.array(values) for metric, values in ratios.items()}


def t_interval(ratios: np.ndarray, confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """(geometric mean, low, high) of per-repeat ratios: Student's t interval on the log scale;
    NaN where fewer than two repeats give a positive, finite ratio."""
    logs = np.log(ratios[np.isfinite(ratios) & (ratios > 0)])
    if logs.size < 2:
        return (float(np.exp(logs.mean())) if logs.size else np.nan), np.nan, np.nan
    centre = logs.mean()
    quantile = t_quantile(1 - (1 - confidence) / 2, logs.size - 1)
    half = quantile * logs.std(ddof=1) / np.sqrt(logs.size)
    return float(np.exp(centre)), float(np.exp(centre - half)), float(np.exp(centre + half))


def word(lower_is_better: bool, low: float, high: float) -> str:
    """faster / slower / within noise from the ratio's interval (candidate / reference)."""
    if not (np.isfinite(low) and np.isfinite(high)):
        return "n/a"
    if high < 1:
        return FASTER if lower_is_better else SLOWER
    if low > 1:
        return SLOWER if lower_is_better else FASTER
    return NOISE


def compare_levels(
    reference: Iterable[RequestRecord],
    candidate: Iterable[RequestRecord],
    comparison: str = "candidate/reference",  # or "A/A"
    seed: int = SEED,
    confidence: float = CONFIDENCE,
) -> pd.DataFrame:
    """One row per level both sides ran: per metric `<m>_ratio` (candidate / reference), its
    interval `<m>_ci_low` / `<m>_ci_high`, the same as percent change (candidate - reference,
    relative: `<m>_change_pct`, `<m>_ci_low_pct`, `<m>_ci_high_pct`) and `<m>_word`."""
    levels = _paired_levels(list(reference), list(candidate))
    rng = np.random.default_rng(seed)
    alpha = (1 - confidence) / 2 * 100
    rows = []
    for level, pairs in levels.items():
        if len(pairs) == 1:
            points, boot = paired_bootstrap(*pairs[0], rng)
        else:
            per_repeat = repeat_ratios(pairs)
        row: dict = {
            "comparison": comparison,
            "level": level,
            "repeats": len(pairs),
            "requests": int(sum(np.sum(~np.isnan(cand.ttft_ms)) for _, cand in pairs)),
        }
        for metric, lower_is_better in PERF_METRICS.items():
            if len(pairs) > 1:
                ratio, low, high = t_interval(per_repeat[metric], confidence)
            else:
                ratio, ratios = points[metric], boot[metric]
                ratios = ratios[np.isfinite(ratios)]
                low, high = (
                    np.percentile(ratios, [alpha, 100 - alpha]) if ratios.size else (np.nan, np.nan)
                )
                if not lower_is_better:
                    low = high = np.nan  # one repeat: a throughput has no run-to-run variation
            row[f"{metric}_ratio"] = ratio
            row[f"{metric}_ci_low"] = low
            row[f"{metric}_ci_high"] = high
            row[f"{metric}_change_pct"] = (ratio - 1) * 100
            row[f"{metric}_ci_low_pct"] = (low - 1) * 100
            row[f"{metric}_ci_high_pct"] = (high - 1) * 100
            row[f"{metric}_word"] = (
                word(lower_is_better, low, high) if np.isfinite(low) or lower_is_better else SINGLE
            )
        rows.append(row)
    return pd.DataFrame(rows)


def _paired_levels(
    reference: list[RequestRecord], candidate: list[RequestRecord]
) -> dict[int, list[tuple[RepeatArrays, RepeatArrays]]]:
    """Per level, the repeats both sides ran, as (reference, candidate) arrays of one size."""
    groups: dict[tuple[str, int, int], list[RequestRecord]] = {}
    for side, records in (("reference", reference), ("candidate", candidate)):
        for r in records:
            if not r.warmup:
                groups.setdefault((side, r.level, r.repeat), []).append(r)
    levels: dict[int, list[tuple[RepeatArrays, RepeatArrays]]] = {}
    for (side, level, repeat), ref_records in sorted(groups.items()):
        cand_records = groups.get(("candidate", level, repeat))
        if side != "reference" or cand_records is None:
            continue
        size = 1 + max(r.index for r in ref_records + cand_records)
        ref, cand = repeat_arrays(ref_records, size), repeat_arrays(cand_records, size)
        if ref is not None and cand is not None:
            levels.setdefault(level, []).append((ref, cand))
    return levels


def worst_slowdown_pct(row: pd.Series, metric: str) -> float:
    """The smallest slowdown, in percent, the interval allows (its bound nearest to no change,
    oriented so that positive = slower): the performance gate fails only when this exceeds
    the allowed regression, i.e. when the whole interval is worse than the bound."""
    if PERF_METRICS[metric]:
        return float(row[f"{metric}_ci_low_pct"])
    return float(-row[f"{metric}_ci_high_pct"])


CANDIDATE, AA = "candidate/reference", "A/A"


def perf_frame(
    records: Iterable[RequestRecord],
    aa_records: Iterable[RequestRecord] = (),
    aa_concurrency: int | None = None,
    planted: PlantedDelay | None = None,
    confidence: float = CONFIDENCE,
) -> pd.DataFrame:
    """The run's candidate-vs-reference comparison from its timed, finished requests, and, when
    the A/A control ran at one of the levels' concurrencies, the A/A performance floor: the
    reference server's replay of a level's requests against that level's first repeat (same
    kernel, same concurrency: what identical kernels measure as a change). With a planted
    delay, what it planted (add_planted)."""
    records = list(records)
    finished = [r for r in records if not r.cancelled]
    reference = [r for r in finished if r.side == "reference"]
    candidate = [r for r in finished if r.side == "candidate"]
    frame = compare_levels(reference, candidate, confidence=confidence)
    if planted is not None and not frame.empty:
        frame = add_planted(frame, records, planted)
    replay = [replace(r, level=aa_concurrency) for r in aa_records]
    baseline = [r for r in reference if r.level == aa_concurrency and r.repeat == 0]
    if replay and baseline:
        floor = compare_levels(baseline, replay, comparison=AA, confidence=confidence)
        frame = pd.concat([frame, floor], ignore_index=True) if not frame.empty else floor
    return frame


PLANTED_METRICS = ("mean_ttft_ms", "mean_e2el_ms")  # grow by the same time per request


@dataclass(frozen=True)
class PlantedDelay:
    """The candidate's planted delay and the GDN prefill calls its servers made in each
    (level, repeat), from their /metrics before and after the level."""

    kernel: str
    delay_ms: float
    calls: dict[tuple[int, int], int]


def add_planted(
    frame: pd.DataFrame, records: Iterable[RequestRecord], planted: PlantedDelay
) -> pd.DataFrame:
    """Candidate rows at C=1 get what the delay planted: `planted_delay_ms` per call,
    `planted_calls_per_request`, `planted_ms_per_request` (delay x calls / requests), and per
    metric of PLANTED_METRICS `<m>_planted_pct` (that time over the reference's mean, in
    percent) and `<m>_planted_inside_ci` (whether the interval holds it). Other levels batch
    several requests' prefills into one call: nothing is claimed there."""
    timed = [r for r in records if not r.warmup and not r.cancelled]
    frame = frame.copy()
    for index, row in frame.iterrows():
        if row["comparison"] != CANDIDATE or row["level"] != 1:
            continue
        level = int(row["level"])
        repeats = sorted(rep for (lvl, rep) in planted.calls if lvl == level)
        requests = sum(
            1 for r in timed if r.side == "candidate" and r.level == level and r.repeat in repeats
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
    field = {"mean_ttft_ms": "ttft_s", "mean_e2el_ms": "e2el_s"}[metric]
    means = []
    for repeat in repeats:
        values = [
            getattr(r, field)
            for r in records
            if r.side == "reference" and (r.level, r.repeat) == (level, repeat) and r.error is None
        ]
        if values:
            means.append(1000 * float(np.mean(values)))
    return float(np.mean(means)) if means else float("nan")


def candidate_rows(frame: pd.DataFrame) -> pd.DataFrame:
    if frame.empty or "comparison" not in frame.columns:
        return frame
    return frame[frame["comparison"] == CANDIDATE]
