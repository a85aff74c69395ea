"""pandas frames from the request records: one row per request, one per (side, level), and the
candidate-vs-reference deltas, using vLLM's benchmark definitions so numbers line up with
`vllm bench serve` (TTFT at the first non-empty choices; TPOT = (E2EL - TTFT)/(tokens - 1)).

With repeats, each level's metric is computed per repeat; the spread across repeats is the noise
band, and a delta smaller than the band is reported as noise, not as a gain or a loss.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd

from rig.compare import PairResult
from rig.records import RequestRecord

PERCENTILES = (50, 90, 99)
# (metric, True when lower is better) for the delta table
DELTA_METRICS = {
    "ttft_mean_ms": True,
    "tpot_mean_ms": True,
    "e2el_mean_ms": True,
    "request_throughput": False,
    "output_throughput": False,
    "total_throughput": False,
}


def request_frame(records: Iterable[RequestRecord]) -> pd.DataFrame:
    rows = []
    for r in records:
        ok = r.error is None
        tpot = None
        if ok and r.e2el_s is not None and r.ttft_s is not None and (r.output_tokens or 0) > 1:
            tpot = (r.e2el_s - r.ttft_s) / (r.output_tokens - 1)
        rows.append(
            {
                "side": r.side,
                "replica": r.replica,
                "level": r.level,
                "repeat": r.repeat,
                "index": r.index,
                "request_id": r.request_id,
                "prompt_id": r.prompt_id,
                "cache_salt": r.cache_salt,
                "ok": ok,
                "error": r.error or "",
                "http_status": r.http_status,
                "finish_reason": r.finish_reason,
                "prompt_tokens": r.prompt_tokens,
                "output_tokens": r.output_tokens,
                "sent_at": r.sent_at,
                "ttft_ms": _ms(r.ttft_s),
                "tpot_ms": _ms(tpot),
                "itl_mean_ms": _ms(float(np.mean(r.itl_s))) if r.itl_s else None,
                "e2el_ms": _ms(r.e2el_s),
                "finished_at": r.sent_at + r.e2el_s if r.e2el_s is not None else None,
                "text": r.text,
            }
        )
    return pd.DataFrame(rows)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def _level_stats(group: pd.DataFrame, itl_ms: list[float]) -> dict:
    ok = group[group["ok"]]
    stats: dict = {
        "requests": len(group),
        "ok": int(ok.shape[0]),
        "failed": int((~group["ok"]).sum()),
    }
    for metric in ("ttft_ms", "tpot_ms", "e2el_ms"):
        values = ok[metric].dropna().to_numpy(dtype=float)
        name = metric.removesuffix("_ms")
        stats[f"{name}_mean_ms"] = float(values.mean()) if values.size else np.nan
        for p in PERCENTILES:
            stats[f"{name}_p{p}_ms"] = float(np.percentile(values, p)) if values.size else np.nan
    itl = np.asarray(itl_ms, dtype=float)
    stats["itl_mean_ms"] = float(itl.mean()) if itl.size else np.nan
    for p in PERCENTILES:
        stats[f"itl_p{p}_ms"] = float(np.percentile(itl, p)) if itl.size else np.nan
    finished = ok["finished_at"].dropna()
    duration = float(finished.max() - group["sent_at"].min()) if not finished.empty else np.nan
    output_tokens = float(ok["output_tokens"].fillna(0).sum())
    prompt_tokens = float(ok["prompt_tokens"].fillna(0).sum())
    stats["duration_s"] = duration
    stats["request_throughput"] = ok.shape[0] / duration if duration and duration > 0 else np.nan
    stats["output_throughput"] = output_tokens / duration if duration and duration > 0 else np.nan
    stats["total_throughput"] = (
        (output_tokens + prompt_tokens) / duration if duration and duration > 0 else np.nan
    )
    return stats


def summary_frame(
    records: list[RequestRecord], pairs: list[PairResult] | None = None
) -> pd.DataFrame:
    """One row per (side, level, repeat), with match counts on the candidate rows."""
    frame = request_frame(records)
    if frame.empty:
        return pd.DataFrame()
    itl_by_key: dict[tuple, list[float]] = {}
    for r in records:
        if r.error is None:
            itl_by_key.setdefault((r.side, r.level, r.repeat), []).extend(x * 1000 for x in r.itl_s)
    rows = []
    for (side, level, repeat), group in frame.groupby(["side", "level", "repeat"], sort=True):
        row = {"side": side, "level": level, "repeat": repeat}
        row.update(_level_stats(group, itl_by_key.get((side, level, repeat), [])))
        rows.append(row)
    summary = pd.DataFrame(rows)
    if pairs:
        matches = pd.DataFrame(
            [{"level": p.level, "repeat": p.repeat, "identical": p.identical} for p in pairs]
        )
        counts = matches.groupby(["level", "repeat"])["identical"].agg(["sum", "count"])
        summary = summary.merge(
            counts.rename(columns={"sum": "matches", "count": "pairs"}).reset_index(),
            on=["level", "repeat"],
            how="left",
        )
    return summary


def delta_frame(summary: pd.DataFrame, reference: str = "reference", candidate: str = "candidate"):
    """Candidate vs reference per level, in percent (positive = candidate better), with the
    repeat-to-repeat spread of each side and a verdict word: better, worse or noise."""
    if summary.empty or not {reference, candidate} <= set(summary["side"]):
        return pd.DataFrame()
    rows = []
    for level, group in summary.groupby("level", sort=True):
        ref = group[group["side"] == reference]
        cand = group[group["side"] == candidate]
        row: dict = {"level": level, "repeats": int(min(len(ref), len(cand)))}
        for metric, lower_is_better in DELTA_METRICS.items():
            ref_mean, cand_mean = ref[metric].mean(), cand[metric].mean()
            if not (np.isfinite(ref_mean) and np.isfinite(cand_mean)) or ref_mean == 0:
                row[f"{metric}_delta_pct"] = np.nan
                row[f"{metric}_verdict"] = "n/a"
                continue
            change = (cand_mean - ref_mean) / ref_mean * 100.0
            gain = -change if lower_is_better else change
            spread = max(_spread_pct(ref[metric]), _spread_pct(cand[metric]))
            row[f"{metric}_delta_pct"] = gain
            row[f"{metric}_spread_pct"] = spread
            if len(ref) < 2 or len(cand) < 2:
                row[f"{metric}_verdict"] = "single run"
            elif abs(gain) <= spread:
                row[f"{metric}_verdict"] = "noise"
            else:
                row[f"{metric}_verdict"] = "better" if gain > 0 else "worse"
        rows.append(row)
    return pd.DataFrame(rows)


def _spread_pct(values: pd.Series) -> float:
    values = values.dropna()
    if len(values) < 2 or values.mean() == 0:
        return 0.0
    return float((values.max() - values.min()) / abs(values.mean()) * 100.0)
