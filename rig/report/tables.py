"""The CSV tables at the report's edge, the one place pandas meets the typed records:
requests.csv, summary.csv (`vllm bench serve`'s names, BlockSummary.bench_stats), perf.csv
(perf_table, and read_perf_table, its inverse, for tools that read a stored run's perf back as
records), mismatches.csv, drift.csv, profile.csv and accuracy.csv. Everything shown is
computed in verdict/; these only lay it out in columns."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pandas as pd

from rig.records import RequestRecord
from rig.report.mismatches import label
from rig.verdict.accuracy import AccuracyResult
from rig.verdict.compare import PairResult
from rig.verdict.drift import DriftResult
from rig.verdict.metrics import BlockSummary
from rig.verdict.perf_records import (
    Comparison,
    KernelSensitivity,
    LevelComparison,
    Metric,
    MetricComparison,
    PerfResult,
    PlantedChange,
    PlantedShare,
    Prediction,
)
from rig.verdict.profile_report import PROFILE_COLUMNS, ProfileResult


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def requests_table(records: list[RequestRecord]) -> pd.DataFrame:
    """requests.csv: one row per request, its times in ms by vLLM's definitions."""
    rows = [
        {
            "side": r.side,
            "replica": r.replica,
            "level": r.level,
            "repeat": r.repeat,
            "index": r.index,
            "request_id": r.request_id,
            "prompt_id": r.prompt_id,
            "cache_salt": r.cache_salt,
            "ok": r.completed,
            "error": r.error or "",
            "http_status": r.http_status,
            "finish_reason": r.finish_reason,
            "prompt_tokens": r.prompt_tokens,
            "output_tokens": r.output_tokens,
            "sent_at": r.sent_at,
            "ttft_ms": _ms(r.ttft_s),
            "tpot_ms": _ms(r.tpot_s),
            "itl_mean_ms": _ms(float(np.mean(r.itl_s))) if r.itl_s else None,
            "e2el_ms": _ms(r.e2el_s),
            "finished_at": r.finished_at,
            "text": r.text,
        }
        for r in records
    ]
    return pd.DataFrame(rows)


def summary_table(blocks: tuple[BlockSummary, ...]) -> pd.DataFrame:
    """summary.csv: one row per (side, level, repeat) in `vllm bench serve`'s column names,
    with the identical pairs of its (level, repeat) where the run compared pairs."""
    paired = any(b.pairs is not None for b in blocks)
    rows = []
    for b in blocks:
        row = {"side": b.side, "level": b.level, "repeat": b.repeat, "requests": b.requests}
        row |= b.bench_stats()
        if paired:
            row |= {"matches": b.matches, "pairs": b.pairs}
        rows.append(row)
    return pd.DataFrame(rows)


def mismatches_table(pairs: list[PairResult]) -> pd.DataFrame:
    """mismatches.csv: every pair whose texts differ."""
    return pd.DataFrame([p.as_row() for p in pairs if not p.identical])


def accuracy_table(result: AccuracyResult | None, pairs: list[PairResult]) -> pd.DataFrame:
    """accuracy.csv: per question both sides' answers (strict and flexible), which the verdict
    scored right, the flip, and its request pair's first divergence and margin label."""
    if result is None:
        return pd.DataFrame()
    by_id = {p.request_id: p for p in pairs}
    rows = []
    for question in result.pairs:
        pair = by_id.get(question.request_id)
        d = pair.divergence if pair is not None else None
        rows.append(
            {
                "question_id": question.question_id,
                "request_id": question.request_id,
                "level": question.level,
                "target": question.target,
                "reference_strict": question.reference.strict,
                "reference_flexible": question.reference.flexible,
                "reference_right": question.reference.right,
                "candidate_strict": question.candidate.strict,
                "candidate_flexible": question.candidate.flexible,
                "candidate_right": question.candidate.right,
                "flip": question.flip,
                "pair_label": label(pair) if pair is not None and not pair.identical else "",
                "div_char_index": d.char_index if d else None,
                "div_token_index": d.token_index if d else None,
                "div_reference_margin": d.reference_margin if d else None,
            }
        )
    return pd.DataFrame(rows)


def profile_table(profile: ProfileResult | None) -> pd.DataFrame:
    """profile.csv: the profiled block's kernels and groups; its columns alone without one."""
    return pd.DataFrame(profile.rows() if profile is not None else [], columns=PROFILE_COLUMNS)


def drift_table(drift: list[DriftResult]) -> pd.DataFrame:
    return pd.DataFrame([asdict(d) for d in drift])


# --- perf.csv and back --------------------------------------------------------------------------


def _metric_columns(compared: MetricComparison) -> dict[str, object]:
    """One metric's perf.csv columns: each side's mean (a server metric), the ratio and its
    interval, the same as percent change, and the word."""
    stem = compared.metric.value
    low, high = compared.interval or (math.nan, math.nan)
    low_pct, high_pct = compared.interval_pct or (math.nan, math.nan)
    sides = (
        {f"{stem}_reference": compared.reference, f"{stem}_candidate": compared.candidate}
        if compared.metric.server_side
        else {}
    )
    return sides | {
        f"{stem}_ratio": compared.ratio,
        f"{stem}_ci_low": low,
        f"{stem}_ci_high": high,
        f"{stem}_change_pct": compared.change_pct,
        f"{stem}_ci_low_pct": low_pct,
        f"{stem}_ci_high_pct": high_pct,
        f"{stem}_word": compared.word,
    }


def _change_columns(what: str, changes: Iterable[tuple[Metric, float, bool]]) -> dict:
    """Per metric `<m>_<what>_pct` and whether the measured interval holds it."""
    columns: dict[str, object] = {}
    for metric, pct, inside in changes:
        columns[f"{metric.value}_{what}_pct"] = pct
        columns[f"{metric.value}_{what}_inside_ci"] = inside
    return columns


def _planted_columns(planted: PlantedShare) -> dict[str, object]:
    fixed = {
        "planted_delay_ms": planted.delay_ms,
        "planted_ms_per_request": planted.ms_per_request,
        "planted_calls_per_request": planted.calls_per_request,
    }
    changes = ((c.metric, c.planted_pct, c.inside_interval) for c in planted.changes)
    return fixed | _change_columns("planted", changes)


def _sensitivity_columns(found: KernelSensitivity) -> dict[str, object]:
    fixed = {
        "gdn_calls_per_request": found.calls_per_request,
        "gdn_share_pct": found.gdn_share_pct,
        "hides_kernel": found.hides_kernel,
    }
    changes = ((p.metric, p.predicted_pct, p.inside) for p in found.predictions)
    return fixed | _change_columns("predicted", changes)


def perf_table(perf: PerfResult) -> pd.DataFrame:
    """perf.csv, rendered from the typed records: one row per level and comparison, per metric
    `<m>_ratio` (candidate / reference), its interval `<m>_ci_low` / `<m>_ci_high`, the same
    as percent change (`<m>_change_pct`, `<m>_ci_low_pct`, `<m>_ci_high_pct`) and `<m>_word`;
    a server metric also each side's mean (`<m>_reference`, `<m>_candidate`); a planted
    slowdown what it planted; what the kernel's own time predicts (`<m>_predicted_pct`,
    `hides_kernel`: rig/verdict/sensitivity.py)."""
    rows = []
    for level in perf.levels:
        row: dict[str, object] = {
            "comparison": level.comparison.value,
            "level": level.level,
            "unit": level.unit,
            "repeats": level.repeats,
            "excluded_blocks": level.excluded_blocks,
            "requests": level.requests,
            "unequal_pairs": level.unequal_pairs,
        }
        for compared in level.metrics:
            row |= _metric_columns(compared)
        if level.planted is not None:
            row |= _planted_columns(level.planted)
        if level.sensitivity is not None:
            row |= _sensitivity_columns(level.sensitivity)
        rows.append(row)
    return pd.DataFrame(rows)


def _value(row: dict, column: str) -> float | None:
    """A number of the row, None where the column is absent or empty."""
    value = row.get(column)
    return None if value is None or pd.isna(value) else float(value)


def _flag(row: dict, column: str) -> bool:
    return row.get(column) in (True, "True")


def _read_metric(row: dict, level: int, metric: Metric) -> MetricComparison | None:
    stem = metric.value
    word = row.get(f"{stem}_word")
    if not isinstance(word, str):  # this level has no such metric
        return None
    low, high = _value(row, f"{stem}_ci_low"), _value(row, f"{stem}_ci_high")
    ratio = _value(row, f"{stem}_ratio")
    return MetricComparison(
        level,
        metric,
        math.nan if ratio is None else ratio,
        None if low is None or high is None else (low, high),
        word,
        _value(row, f"{stem}_reference"),
        _value(row, f"{stem}_candidate"),
    )


def _read_planted(row: dict) -> PlantedShare | None:
    if _value(row, "planted_delay_ms") is None:
        return None
    changes = tuple(
        PlantedChange(metric, pct, _flag(row, f"{metric.value}_planted_inside_ci"))
        for metric in Metric
        if (pct := _value(row, f"{metric.value}_planted_pct")) is not None
    )
    return PlantedShare(
        _value(row, "planted_delay_ms"),
        _value(row, "planted_ms_per_request"),
        _value(row, "planted_calls_per_request"),
        changes,
    )


def _read_sensitivity(row: dict, level: LevelComparison) -> KernelSensitivity | None:
    kernel = level.get(Metric.GDN_MS_PER_CALL)
    if kernel is None or _value(row, "gdn_calls_per_request") is None:
        return None
    predictions = tuple(
        Prediction(metric, pct, measured)
        for metric in Metric
        if (pct := _value(row, f"{metric.value}_predicted_pct")) is not None
        and (measured := level.get(metric)) is not None
    )
    return KernelSensitivity(
        level.level,
        kernel,
        _value(row, "gdn_calls_per_request"),
        _value(row, "gdn_share_pct"),
        predictions,
    )


def _read_level(row: dict) -> LevelComparison:
    level = int(row["level"])
    metrics = tuple(m for metric in Metric if (m := _read_metric(row, level, metric)))
    read = LevelComparison(
        comparison=Comparison(row["comparison"]),
        level=level,
        unit=row["unit"],
        repeats=int(row["repeats"]),
        excluded_blocks=int(row["excluded_blocks"]),
        requests=int(row["requests"]),
        unequal_pairs=int(row["unequal_pairs"]),
        metrics=metrics,
        planted=_read_planted(row),
    )
    return replace(read, sensitivity=_read_sensitivity(row, read))


def read_perf_table(path: Path) -> PerfResult:
    """A stored run's perf.csv as the records it was rendered from (perf_table's inverse,
    every float read back exactly); empty for a missing file or a run that compared nothing."""
    if not path.is_file() or not path.read_text(encoding="utf-8").strip():
        return PerfResult()
    # Only an empty cell is missing: a word may read "n/a", which pandas would take for NaN.
    frame = pd.read_csv(path, keep_default_na=False, na_values=[""])
    return PerfResult(tuple(_read_level(row) for row in frame.to_dict("records")))
