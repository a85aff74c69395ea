"""The performance verdict: per level and metric, the candidate/reference ratio with a bootstrap
95% interval over requests and repeats, and a word for it (`faster`, `slower`, `within noise`).

Metric names and definitions are `vllm bench serve`'s (mean TTFT over requests, TPOT =
(E2EL - TTFT)/(tokens - 1) per request, ITL over every inter-token gap, throughputs over the
level's wall time). The bootstrap resamples repeats, then requests within each repeat, on both
sides independently; a throughput keeps its repeat's wall time, so its interval covers the
token-count and repeat-to-repeat variation, not the timing jitter inside one repeat. The interval
is the noise floor: a change whose interval includes 1 is `within noise`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from rig.records import RequestRecord

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


@dataclass(frozen=True)
class RepeatArrays:
    """One repeat of one side at one level, per successful request."""

    ttft_ms: np.ndarray
    tpot_ms: np.ndarray  # NaN where a request has fewer than two tokens
    e2el_ms: np.ndarray
    itl_sum_ms: np.ndarray
    itl_count: np.ndarray
    output_tokens: np.ndarray
    prompt_tokens: np.ndarray
    duration_s: float


def repeat_arrays(records: list[RequestRecord]) -> RepeatArrays | None:
    ok = [r for r in records if r.error is None and r.ttft_s is not None and r.e2el_s is not None]
    if not ok:
        return None
    out = np.array([float(r.output_tokens or 0) for r in ok])
    ttft = np.array([r.ttft_s * 1000 for r in ok])
    e2el = np.array([r.e2el_s * 1000 for r in ok])
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out > 1, (e2el - ttft) / (out - 1), np.nan)
    ends = [r.sent_at + r.e2el_s for r in ok]
    duration = max(ends) - min(r.sent_at for r in records)
    return RepeatArrays(
        ttft_ms=ttft,
        tpot_ms=tpot,
        e2el_ms=e2el,
        itl_sum_ms=np.array([sum(r.itl_s) * 1000 for r in ok]),
        itl_count=np.array([float(len(r.itl_s)) for r in ok]),
        output_tokens=out,
        prompt_tokens=np.array([float(r.prompt_tokens or 0) for r in ok]),
        duration_s=duration,
    )


def _metrics(a: RepeatArrays, idx: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Every metric of one repeat; with idx (resamples x requests), one value per resample."""

    def pick(values: np.ndarray) -> np.ndarray:
        return values[None, :] if idx is None else values[idx]

    ttft, tpot, e2el = pick(a.ttft_ms), pick(a.tpot_ms), pick(a.e2el_ms)
    duration = a.duration_s if a.duration_s > 0 else np.nan
    out, prompt = pick(a.output_tokens).sum(axis=1), pick(a.prompt_tokens).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot_mean = np.nansum(tpot, axis=1) / (~np.isnan(tpot)).sum(axis=1)
        itl_mean = pick(a.itl_sum_ms).sum(axis=1) / pick(a.itl_count).sum(axis=1)
    return {
        "mean_ttft_ms": ttft.mean(axis=1),
        "median_ttft_ms": np.median(ttft, axis=1),
        "p99_ttft_ms": np.percentile(ttft, 99, axis=1),
        "mean_tpot_ms": tpot_mean,
        "mean_itl_ms": itl_mean,
        "mean_e2el_ms": e2el.mean(axis=1),
        "request_throughput": np.full(ttft.shape[0], ttft.shape[1] / duration),
        "output_throughput": out / duration,
        "total_token_throughput": (out + prompt) / duration,
    }


def side_estimates(
    repeats: list[RepeatArrays], rng: np.random.Generator, resamples: int = RESAMPLES
) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """Point estimates (mean over repeats) and their bootstrap distributions."""
    points = {m: float(np.mean([_metrics(a)[m][0] for a in repeats])) for m in PERF_METRICS}
    per_repeat = [
        _metrics(a, rng.integers(0, a.ttft_ms.size, size=(resamples, a.ttft_ms.size)))
        for a in repeats
    ]
    chosen = rng.integers(0, len(repeats), size=(resamples, len(repeats)))
    rows = np.arange(resamples)[:, None]
    boot = {
        m: np.stack([r[m] for r in per_repeat], axis=1)[rows, chosen].mean(axis=1)
        for m in PERF_METRICS
    }
    return points, boot


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
) -> pd.DataFrame:
    """One row per level both sides ran: per metric `<m>_ratio` (candidate / reference), its
    interval `<m>_ci_low` / `<m>_ci_high`, the same as percent change (candidate - reference,
    relative: `<m>_change_pct`, `<m>_ci_low_pct`, `<m>_ci_high_pct`) and `<m>_word`."""
    sides = {"reference": _by_level(reference), "candidate": _by_level(candidate)}
    rng = np.random.default_rng(seed)
    alpha = (1 - CONFIDENCE) / 2 * 100
    rows = []
    for level in sorted(set(sides["reference"]) & set(sides["candidate"])):
        ref_repeats, cand_repeats = sides["reference"][level], sides["candidate"][level]
        ref_points, ref_boot = side_estimates(ref_repeats, rng)
        cand_points, cand_boot = side_estimates(cand_repeats, rng)
        row: dict = {
            "comparison": comparison,
            "level": level,
            "repeats": min(len(ref_repeats), len(cand_repeats)),
            "requests": int(sum(a.ttft_ms.size for a in cand_repeats)),
        }
        for metric, lower_is_better in PERF_METRICS.items():
            with np.errstate(invalid="ignore", divide="ignore"):
                ratio = cand_points[metric] / ref_points[metric]
                ratios = cand_boot[metric] / ref_boot[metric]
            ratios = ratios[np.isfinite(ratios)]
            low, high = (
                np.percentile(ratios, [alpha, 100 - alpha]) if ratios.size else (np.nan, np.nan)
            )
            row[f"{metric}_ratio"] = ratio
            row[f"{metric}_ci_low"] = low
            row[f"{metric}_ci_high"] = high
            row[f"{metric}_change_pct"] = (ratio - 1) * 100
            row[f"{metric}_ci_low_pct"] = (low - 1) * 100
            row[f"{metric}_ci_high_pct"] = (high - 1) * 100
            row[f"{metric}_word"] = word(lower_is_better, low, high)
        rows.append(row)
    return pd.DataFrame(rows)


def _by_level(records: Iterable[RequestRecord]) -> dict[int, list[RepeatArrays]]:
    groups: dict[tuple[int, int], list[RequestRecord]] = {}
    for r in records:
        if not r.warmup:
            groups.setdefault((r.level, r.repeat), []).append(r)
    levels: dict[int, list[RepeatArrays]] = {}
    for (level, _), group in sorted(groups.items()):
        arrays = repeat_arrays(group)
        if arrays is not None:
            levels.setdefault(level, []).append(arrays)
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
) -> pd.DataFrame:
    """The run's candidate-vs-reference comparison from its timed, finished requests, and, when
    the A/A control ran at one of the levels' concurrencies, the A/A performance floor: the
    reference server's replay of a level's requests against that level's first repeat (same
    kernel, same concurrency: what identical kernels measure as a change)."""
    finished = [r for r in records if not (r.error or "").startswith("cancelled")]
    reference = [r for r in finished if r.side == "reference"]
    frame = compare_levels(reference, [r for r in finished if r.side == "candidate"])
    replay = [replace(r, level=aa_concurrency) for r in aa_records]
    baseline = [r for r in reference if r.level == aa_concurrency and r.repeat == 0]
    if replay and baseline:
        floor = compare_levels(baseline, replay, comparison=AA)
        frame = pd.concat([frame, floor], ignore_index=True) if not frame.empty else floor
    return frame


def candidate_rows(frame: pd.DataFrame) -> pd.DataFrame:
    if frame.empty or "comparison" not in frame.columns:
        return frame
    return frame[frame["comparison"] == CANDIDATE]
