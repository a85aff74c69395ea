"""The per-level part of report.html: the candidate's change against the reference with its 95%
interval and word, each side's latency and throughput (with the spread over repeats), and the
latency CDFs and throughput of every level as inline PNGs."""

from __future__ import annotations

import re

import pandas as pd

from rig.records import RequestRecord, Side
from rig.report.format import DASH, cell, esc, missing, number, table
from rig.report.plots import curve_figure, level_figure
from rig.verdict.perf_records import (
    CLIENT_METRICS,
    HEADLINE_METRICS,
    SERVER_METRICS,
    LevelComparison,
    MetricComparison,
    PerfResult,
)

# (column of summary.csv, header, unit) of the per-level table
LEVEL_COLUMNS = (
    ("mean_ttft_ms", "TTFT mean", "ms"),
    ("p99_ttft_ms", "TTFT p99", "ms"),
    ("mean_itl_ms", "ITL mean", "ms"),
    ("p99_itl_ms", "ITL p99", "ms"),
    ("mean_e2el_ms", "E2EL mean", "ms"),
    ("p99_e2el_ms", "E2EL p99", "ms"),
    ("output_throughput", "output", "tok/s"),
    ("total_token_throughput", "total", "tok/s"),
)


def _spread(values: pd.Series) -> float | None:
    values = values.dropna()
    if len(values) < 2 or values.mean() == 0:
        return None
    return float((values.max() - values.min()) / abs(values.mean()) * 100.0)


def _level_row(level: int, side: str, group: pd.DataFrame) -> str:
    """One side at one level; with repeats the mean over repeats and the spread below it."""
    cells = cell(level, level, "num") + cell(side, cls="nowrap")
    requests, ok = int(group["requests"].sum()), int(group["completed"].sum())
    cells += cell(f"{ok:,}/{requests:,}", ok, "num" + ("" if ok == requests else " bad"))
    if "matches" in group.columns and side == Side.CANDIDATE:
        matches, pairs = group["matches"].sum(min_count=1), group["pairs"].sum(min_count=1)
        text = DASH if missing(matches) else f"{int(matches):,}/{int(pairs):,}"
        cells += cell(text, matches, "num")
    else:
        cells += cell(DASH, None, "num")
    for column, _, unit in LEVEL_COLUMNS:
        if column not in group.columns:
            cells += cell(DASH, None, "num")
            continue
        mean = group[column].mean()
        spread = _spread(group[column])
        extra = f"<small>spread {number(spread, '%', 1)}</small>" if spread is not None else ""
        cells += cell(esc(number(mean, unit)) + extra, mean, "num", raw=True)
    return cells


def _interval(compared: MetricComparison) -> str:
    """The 95% interval of one change, in percent."""
    if compared.interval_pct is None:
        return ""
    low, high = compared.interval_pct
    return f"[{low:+.1f}, {high:+.1f}]"


def _delta_cell(compared: MetricComparison | None) -> str:
    if compared is None:
        return cell(DASH, None, "num")
    value, word = compared.change_pct, compared.word
    interval = _interval(compared)
    text = esc(number(value, "%", 1) if missing(value) else f"{value:+.1f} %")
    if interval:
        text += f"<small>{esc(interval)}</small>"
    if word and word != "n/a":  # a word may be a reason (not comparable: ...): it wraps
        text += f'<small class="word">{esc(word)}</small>'
    return cell(text, value, f"num delta-{re.sub(r'[^a-z]+', '-', word.lower())}", raw=True)


def _delta_row(level: LevelComparison) -> str:
    cells = cell(level.level, level.level, "num") + cell(level.comparison, cls="nowrap")
    unit = f"<small>unit: {esc(level.unit)}</small>"
    if level.excluded_blocks:
        unit += f"<small>{level.excluded_blocks} left out (JIT)</small>"
    cells += cell(f"{level.repeats}{unit}", level.repeats, "num", raw=True)
    for metric in CLIENT_METRICS:
        cells += _delta_cell(level.get(metric))
    return cells


def delta_table(levels: tuple[LevelComparison, ...]) -> str:
    """Candidate vs reference per level, each change with its 95% interval and its word."""
    rows = [_delta_row(level) for level in levels]
    return table(["level", "compared", "blocks"] + [m.label for m in CLIENT_METRICS], rows)


def _server_row(level: LevelComparison) -> str:
    cells = cell(level.level, level.level, "num")
    for metric in SERVER_METRICS:
        compared = level.get(metric)
        if compared is None:
            cells += cell(f"{DASH} → {DASH}", None, "num")
            continue
        value = compared.change_pct
        text = esc(f"{number(compared.reference, 'ms')} → {number(compared.candidate, 'ms')}")
        if not missing(value):
            text += f"<small>{esc(f'{value:+.1f} %')} {esc(_interval(compared))}</small>"
        cells += cell(text, value, "num", raw=True)
    return cells


def server_table(perf: PerfResult) -> str:
    """The servers' own timings per level, reference → candidate, and the change (not judged);
    empty when no server published the GDN prefill time."""
    if not any(level.get(SERVER_METRICS[0]) for level in perf.levels):
        return ""
    rows = [_server_row(level) for level in perf.candidate]
    return table(["level"] + [m.label for m in SERVER_METRICS], rows)


def _interval_note(outcome, perf: PerfResult) -> str:
    """What the words and intervals mean in this run (rig/verdict/speed.py's design)."""
    speed = outcome.speed
    if not speed.measured:
        return f"No speed word: {speed.reason}."
    levels = len({level.level for level in perf.levels})
    return (
        f"Words ({', '.join(HEADLINE_METRICS)}) at {speed.describe(levels)}: an interval that "
        "includes no change is within noise; the other metrics are shown, not judged."
    )


def _curve_points(summary: pd.DataFrame) -> dict[str, list[tuple[int, float, float, float]]]:
    means = summary.groupby(["side", "level"])[
        ["total_token_throughput", "mean_ttft_ms", "mean_e2el_ms"]
    ].mean()
    points: dict[str, list[tuple[int, float, float, float]]] = {}
    for (side, level), row in means.iterrows():
        values = (row["total_token_throughput"], row["mean_ttft_ms"], row["mean_e2el_ms"])
        if all(pd.notna(v) for v in values):
            points.setdefault(side, []).append((int(level), *(float(v) for v in values)))
    return points


def levels_section(outcome, summary: pd.DataFrame, perf: PerfResult) -> str:
    parts = ['<section id="levels"><h2>Per level</h2>']
    if summary.empty:
        parts.append("<p>No request finished.</p></section>")
        return "\n".join(parts)
    if perf.levels:
        parts += [
            "<h3>Candidate against reference</h3>",
            "<p>Change = candidate − reference, in percent of the reference (a positive "
            "latency change is slower, a positive throughput change faster), with its interval "
            "[low, high] over the units the schedule allows (block pairs, or request pairs "
            "where they ran back to back; none from one block). "
            + esc(_interval_note(outcome, perf))
            + " The A/A row (the reference server replaying a level's requests) is what "
            "identical kernels measure.</p>",
            delta_table(perf.levels),
        ]
        servers = server_table(perf)
        if servers:
            parts += [
                "<h3>The servers' own timings</h3>",
                "<p>From each server's /metrics around its blocks: the rig plugin's GDN prefill "
                "time per call, vLLM's prefill, decode and queue time per request; reference → "
                "candidate, and the change with its interval (not judged).</p>",
                servers,
            ]
    rows = [
        _level_row(level, side, group)
        for (level, side), group in summary.groupby(["level", "side"], sort=True)
    ]
    headers = ["level", "side", "ok", "identical"] + [
        f"{name} ({unit})" for _, name, unit in LEVEL_COLUMNS
    ]
    parts += ["<h3>Latency and throughput</h3>", table(headers, rows)]
    curve = curve_figure(_curve_points(summary))
    if curve:
        parts.append(
            f'<figure><img alt="throughput against latency across the levels" '
            f'src="data:image/png;base64,{curve}"><figcaption>Mean TTFT and E2EL against total '
            "throughput at each client concurrency (the mean over repeats), both sides: a "
            "faster side sits lower or further right.</figcaption></figure>"
        )
    by_level: dict[int, dict[str, list[RequestRecord]]] = {}
    for record in outcome.records:
        if not record.warmup:
            by_level.setdefault(record.level, {}).setdefault(record.side, []).append(record)
    for level in sorted(by_level):
        sides = dict(sorted(by_level[level].items(), key=lambda item: item[0] != Side.REFERENCE))
        level_rows = summary[summary["level"] == level]
        throughput = {
            side: level_rows[level_rows["side"] == side]["total_token_throughput"].tolist()
            for side in sides
        }
        repeats = int(level_rows["repeat"].nunique()) if "repeat" in level_rows else 1
        png = level_figure(sides, throughput)
        parts.append(
            f'<figure><img alt="latency distributions and throughput at concurrency {level}" '
            f'src="data:image/png;base64,{png}"><figcaption>Client concurrency {level}'
            f"{f', {repeats} repeats' if repeats > 1 else ''}: latency CDFs of every request "
            "(ITL: every inter-token gap) and total throughput of each repeat.</figcaption>"
            "</figure>"
        )
    parts.append("</section>")
    return "\n".join(parts)
