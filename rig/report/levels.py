"""The per-level part of report.html: the candidate's change against the reference with its 95%
interval and word, each side's latency and throughput (with the spread over repeats), and the
latency CDFs and throughput of every level as inline PNGs."""

from __future__ import annotations

import re

from rig.records import RequestRecord, Side
from rig.report.format import DASH, cell, esc, missing, number, table
from rig.report.plots import curve_figure, level_figure
from rig.verdict.metrics import BlockSummary, LevelSide
from rig.verdict.perf_records import (
    CLIENT_METRICS,
    HEADLINE_METRICS,
    SERVER_METRICS,
    LevelComparison,
    MetricComparison,
    PerfResult,
)

# (header, unit, the block's number) of the per-level table
LEVEL_COLUMNS = (
    ("TTFT mean", "ms", lambda b: b.ttft.mean),
    ("TTFT p99", "ms", lambda b: b.ttft.p99),
    ("ITL mean", "ms", lambda b: b.itl.mean),
    ("ITL p99", "ms", lambda b: b.itl.p99),
    ("E2EL mean", "ms", lambda b: b.e2el.mean),
    ("E2EL p99", "ms", lambda b: b.e2el.p99),
    ("output", "tok/s", lambda b: b.output_throughput),
    ("total", "tok/s", lambda b: b.total_token_throughput),
)


def _throughput(block: BlockSummary) -> float:
    return block.total_token_throughput


def _level_row(found: LevelSide) -> str:
    """One side at one level; with repeats the mean over repeats and the spread below it."""
    cells = cell(found.level, found.level, "num") + cell(found.side, cls="nowrap")
    requests, ok = found.requests, found.completed
    cells += cell(f"{ok:,}/{requests:,}", ok, "num" + ("" if ok == requests else " bad"))
    matches = found.matches
    if found.side == Side.CANDIDATE and matches is not None:
        cells += cell(f"{matches:,}/{found.pairs:,}", matches, "num")
    else:
        cells += cell(DASH, None, "num")
    for _, unit, value in LEVEL_COLUMNS:
        mean = found.mean(value)
        spread = found.spread(value)
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


def _curve_points(
    levels: tuple[LevelSide, ...],
) -> dict[str, list[tuple[int, float, float, float]]]:
    """Per side, by level: the mean total throughput, TTFT and E2EL over the repeats."""
    points: dict[str, list[tuple[int, float, float, float]]] = {}
    for found in sorted(levels, key=lambda ls: (ls.side, ls.level)):
        values = tuple(
            found.mean(value)
            for value in (_throughput, lambda b: b.ttft.mean, lambda b: b.e2el.mean)
        )
        if not any(missing(v) for v in values):
            points.setdefault(found.side, []).append((found.level, *values))
    return points


def _comparison_parts(outcome, perf: PerfResult) -> list[str]:
    """The candidate against the reference, and the servers' own timings where they published
    them: what the words of the run rest on."""
    parts = [
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
    return parts


def _level_figures(outcome) -> list[str]:
    """A figure per level, each side's latency CDFs and throughput of each repeat: the
    distributions behind the means of the table."""
    by_level: dict[int, dict[str, list[RequestRecord]]] = {}
    for record in outcome.records:
        if not record.warmup:
            by_level.setdefault(record.level, {}).setdefault(record.side, []).append(record)
    figures = []
    for level in sorted(by_level):
        sides = dict(sorted(by_level[level].items(), key=lambda item: item[0] != Side.REFERENCE))
        found = {ls.side: ls for ls in outcome.level_sides if ls.level == level}
        throughput = {
            side: found[side].values(_throughput) if side in found else [] for side in sides
        }
        repeats = len({b.repeat for ls in found.values() for b in ls.blocks}) or 1
        png = level_figure(sides, throughput)
        figures.append(
            f'<figure><img alt="latency distributions and throughput at concurrency {level}" '
            f'src="data:image/png;base64,{png}"><figcaption>Client concurrency {level}'
            f"{f', {repeats} repeats' if repeats > 1 else ''}: latency CDFs of every request "
            "(ITL: every inter-token gap) and total throughput of each repeat.</figcaption>"
            "</figure>"
        )
    return figures


def levels_section(outcome) -> str:
    perf: PerfResult = outcome.perf
    parts = ['<section id="levels"><h2>Per level</h2>']
    if not outcome.blocks:
        parts.append("<p>No request finished.</p></section>")
        return "\n".join(parts)
    if perf.levels:
        parts += _comparison_parts(outcome, perf)
    rows = [_level_row(found) for found in outcome.level_sides]
    headers = ["level", "side", "ok", "identical"] + [
        f"{name} ({unit})" for name, unit, _ in LEVEL_COLUMNS
    ]
    parts += ["<h3>Latency and throughput</h3>", table(headers, rows)]
    curve = curve_figure(_curve_points(outcome.level_sides))
    if curve:
        parts.append(
            f'<figure><img alt="throughput against latency across the levels" '
            f'src="data:image/png;base64,{curve}"><figcaption>Mean TTFT and E2EL against total '
            "throughput at each client concurrency (the mean over repeats), both sides: a "
            "faster side sits lower or further right.</figcaption></figure>"
        )
    parts += _level_figures(outcome)
    parts.append("</section>")
    return "\n".join(parts)
