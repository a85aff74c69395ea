"""The per-level part of report.html: the candidate's change against the reference with its 95%
interval and word, each side's latency and throughput (with the spread over repeats), and the
latency CDFs and throughput of every level as inline PNGs."""

from __future__ import annotations

import re

import pandas as pd

from rig.records import RequestRecord, Side
from rig.report.format import DASH, cell, esc, missing, number, table
from rig.report.plots import curve_figure, level_figure
from rig.verdict.perf import CANDIDATE
from rig.verdict.speed import HEADLINE_METRICS

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
# (column stem of perf.csv, header) of the candidate-vs-reference table
DELTA_COLUMNS = (
    ("mean_ttft_ms", "TTFT mean"),
    ("median_ttft_ms", "TTFT median"),
    ("p99_ttft_ms", "TTFT p99"),
    ("mean_tpot_ms", "TPOT mean"),
    ("mean_itl_ms", "ITL mean"),
    ("mean_e2el_ms", "E2EL mean"),
    ("request_throughput", "requests/s"),
    ("output_throughput", "output tok/s"),
    ("total_token_throughput", "total tok/s"),
)
# The servers' own timings per block (rig/verdict/server_side.py): each side's mean, the change.
SERVER_COLUMNS = (
    ("gdn_ms_per_call", "GDN prefill per call"),
    ("server_prefill_ms", "prefill per request"),
    ("server_decode_ms", "decode per request"),
    ("server_queue_ms", "queue per request"),
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


def _interval(row: pd.Series, metric: str) -> str:
    """The 95% interval of one change (`<metric>_ci_low_pct` / `_ci_high_pct`)."""
    low, high = row.get(f"{metric}_ci_low_pct"), row.get(f"{metric}_ci_high_pct")
    if not missing(low) and not missing(high):
        return f"[{low:+.1f}, {high:+.1f}]"
    return ""


def _delta_row(row: pd.Series) -> str:
    level = int(row["level"])
    cells = cell(level, level, "num") + cell(row.get("comparison", ""), cls="nowrap")
    blocks = int(row.get("repeats", 1))
    unit = f"<small>unit: {esc(row['unit'])}</small>" if not missing(row.get("unit")) else ""
    left_out = row.get("excluded_blocks")
    if not missing(left_out) and left_out:
        unit += f"<small>{int(left_out)} left out (JIT)</small>"
    cells += cell(f"{blocks}{unit}", blocks, "num", raw=True)
    for metric, _ in DELTA_COLUMNS:
        value = row.get(f"{metric}_change_pct")
        word = str(row.get(f"{metric}_word", ""))
        interval = _interval(row, metric)
        text = esc(number(value, "%", 1) if missing(value) else f"{value:+.1f} %")
        if interval:
            text += f"<small>{esc(interval)}</small>"
        if word and word != "n/a":  # a word may be a reason (not comparable: ...): it wraps
            text += f'<small class="word">{esc(word)}</small>'
        cells += cell(text, value, f"num delta-{re.sub(r'[^a-z]+', '-', word.lower())}", raw=True)
    return cells


def delta_table(deltas: pd.DataFrame) -> str:
    """Candidate vs reference per level, each change with its 95% interval and its word."""
    rows = [_delta_row(row) for _, row in deltas.iterrows()]
    return table(["level", "compared", "blocks"] + [name for _, name in DELTA_COLUMNS], rows)


def _server_row(row: pd.Series) -> str:
    level = int(row["level"])
    cells = cell(level, level, "num")
    for metric, _ in SERVER_COLUMNS:
        ref, cand = row.get(f"{metric}_reference"), row.get(f"{metric}_candidate")
        value = row.get(f"{metric}_change_pct")
        text = esc(f"{number(ref, 'ms')} → {number(cand, 'ms')}")
        if not missing(value):
            text += f"<small>{esc(f'{value:+.1f} %')} {esc(_interval(row, metric))}</small>"
        cells += cell(text, value, "num", raw=True)
    return cells


def server_table(deltas: pd.DataFrame) -> str:
    """The servers' own timings per level, reference → candidate, and the change (not judged);
    empty when no server published them."""
    if deltas.empty or f"{SERVER_COLUMNS[0][0]}_reference" not in deltas.columns:
        return ""
    rows = [_server_row(row) for _, row in deltas.iterrows() if row["comparison"] == CANDIDATE]
    return table(["level"] + [name for _, name in SERVER_COLUMNS], rows)


def _interval_note(outcome, deltas: pd.DataFrame) -> str:
    """What the words and intervals mean in this run (rig/verdict/speed.py's design)."""
    speed = outcome.speed
    if not speed.measured:
        return f"No speed word: {speed.reason}."
    levels = int(deltas["level"].nunique())
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


def levels_section(outcome, summary: pd.DataFrame, deltas: pd.DataFrame) -> str:
    parts = ['<section id="levels"><h2>Per level</h2>']
    if summary.empty:
        parts.append("<p>No request finished.</p></section>")
        return "\n".join(parts)
    if not deltas.empty:
        parts += [
            "<h3>Candidate against reference</h3>",
            "<p>Change = candidate − reference, in percent of the reference (a positive "
            "latency change is slower, a positive throughput change faster), with its interval "
            "[low, high] over the units the schedule allows (block pairs, or request pairs "
            "where they ran back to back; none from one block). "
            + esc(_interval_note(outcome, deltas))
            + " The A/A row (the reference server replaying a level's requests) is what "
            "identical kernels measure.</p>",
            delta_table(deltas),
        ]
        servers = server_table(deltas)
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
