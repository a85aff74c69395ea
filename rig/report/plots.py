"""The figures of report.html, drawn with matplotlib into inline PNGs (no file, no network):
per level, both sides' latency distributions as CDFs and the throughput of every repeat; the
teacher-forced drift per sequence, candidate next to the A/A floor; each side's greedy margins
(how far the best token led its runner-up along the teacher-forced replay), where a correct
kernel may flip a token.

A CDF shows the whole distribution (tail included) of hundreds of requests in one small panel,
where a table of means and three percentiles hides how the two sides differ.
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rig.records import CompletionKey, RequestRecord, Side, TokenLogprob
from rig.verdict.drift import DriftResult
from rig.verdict.profile_report import GroupRow

SIDE_COLOURS = {Side.REFERENCE: "#1f5fa8", Side.CANDIDATE: "#c2381f", "A/A": "#7a7a7a"}
CDF_POINTS = 200  # a long distribution is drawn through this many quantiles
MARGIN_MARKS = (0.25, 1.0)  # nats: the shares of positions under these are printed per side
MARGIN_TICKS = (0, 0.25, 0.5, 1, 2, 5, 10, 20, 50, 100)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(figure) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    _pyplot().close(figure)
    return base64.b64encode(buffer.getvalue()).decode()


def _cdf(values: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """(x, F(x)) through at most CDF_POINTS quantiles of `values`."""
    data = np.sort(np.asarray(values, dtype=float))
    data = data[np.isfinite(data)]
    if data.size > CDF_POINTS:
        q = np.linspace(0.0, 1.0, CDF_POINTS)
        return np.quantile(data, q), q
    return data, np.arange(1, data.size + 1) / data.size


def _latencies_ms(records: list[RequestRecord]) -> dict[str, list[float]]:
    ok = [r for r in records if r.error is None]
    return {
        "TTFT": [r.ttft_s * 1000 for r in ok if r.ttft_s is not None],
        "ITL": [x * 1000 for r in ok for x in r.itl_s],
        "E2EL": [r.e2el_s * 1000 for r in ok if r.e2el_s is not None],
    }


def level_figure(
    records_by_side: dict[str, list[RequestRecord]], throughput: dict[str, list[float]]
) -> str:
    """One level: CDFs of TTFT, ITL and E2EL per side, and total tok/s of each repeat (dots)
    with their mean (bar). Returns a base64 PNG."""
    plt = _pyplot()
    figure, axes = plt.subplots(
        1, 4, figsize=(12.4, 2.5), gridspec_kw={"width_ratios": [3, 3, 3, 2]}
    )
    for side, records in records_by_side.items():
        colour = SIDE_COLOURS.get(side, "#333333")
        for axis, values in zip(axes[:3], _latencies_ms(records).values(), strict=True):
            if values:
                x, y = _cdf(values)
                axis.step(x, y, where="post", color=colour, label=side, linewidth=1.4)
    for axis, name in zip(axes[:3], ("TTFT", "ITL", "E2EL"), strict=True):
        axis.set_title(f"{name} (ms), CDF", fontsize=9)
        axis.set_ylim(0, 1.02)
        axis.grid(alpha=0.3)
        axis.tick_params(labelsize=8)
    axes[0].legend(fontsize=8, loc="lower right")
    bars = axes[3]
    for position, (side, values) in enumerate(throughput.items()):
        finite = [v for v in values if math.isfinite(v)]
        colour = SIDE_COLOURS.get(side, "#333333")
        if finite:
            bars.bar(position, float(np.mean(finite)), color=colour, alpha=0.35, width=0.6)
            bars.scatter([position] * len(finite), finite, color=colour, s=14, zorder=3)
    bars.set_xticks(range(len(throughput)), list(throughput), fontsize=8)
    bars.set_title("total tok/s per repeat", fontsize=9)
    bars.grid(alpha=0.3, axis="y")
    bars.tick_params(labelsize=8)
    figure.tight_layout()
    return _png(figure)


def drift_figure(
    candidate: list[DriftResult],
    aa: list[DriftResult] | None,
    thresholds: dict[str, float | None],
) -> str | None:
    """CDFs of each sequence's mean |Δlogprob| over completion and over prompt positions, for
    the candidate and (when measured) the A/A control, with the gate thresholds dashed."""
    measured = {Side.CANDIDATE: [d for d in candidate if d.error is None]}
    if aa is not None:
        measured["A/A"] = [d for d in aa if d.error is None]
    if not any(measured.values()):
        return None
    plt = _pyplot()
    figure, axes = plt.subplots(1, 2, figsize=(12.4, 2.6))
    panels = (
        ("completion positions: mean |Δlogprob| per sequence", "mean_abs", "max_mean_drift"),
        (
            "prompt positions: mean |Δlogprob| per sequence",
            "prompt_mean_abs",
            "max_mean_prompt_drift",
        ),
    )
    for axis, (title, attribute, gate) in zip(axes, panels, strict=True):
        drawn = False
        for side, results in measured.items():
            values = [getattr(d, attribute) for d in results]
            if values and any(v > 0 for v in values if math.isfinite(v)):
                x, y = _cdf(values)
                axis.step(x, y, where="post", color=SIDE_COLOURS[side], label=side, linewidth=1.4)
                drawn = True
        if not drawn:  # every sequence exactly 0: a log axis would show nothing at all
            axis.text(0.5, 0.5, "no drift: every sequence 0", ha="center", va="center",
                      transform=axis.transAxes, fontsize=11)  # fmt: skip
        if thresholds.get(gate) is not None:
            axis.axvline(
                thresholds[gate], color="#000000", linestyle="--", linewidth=1, label="gate"
            )
        axis.set_xscale("symlog", linthresh=1e-4)
        axis.set_xlim(left=0)
        axis.set_ylim(0, 1.02)
        axis.set_title(title + " (nats), CDF", fontsize=9)
        axis.grid(alpha=0.3)
        axis.tick_params(labelsize=8)
        if drawn:
            axis.legend(fontsize=8, loc="lower right")
    figure.tight_layout()
    return _png(figure)


def curve_figure(points: dict[str, list[tuple[int, float, float, float]]]) -> str | None:
    """Throughput against latency across the levels, one line per side through its points
    (concurrency, total tok/s, mean TTFT ms, mean E2EL ms), each marked with its C: the
    seeds' end-to-end table as a picture. None with fewer than one point per side."""
    if not any(points.values()):
        return None
    plt = _pyplot()
    figure, axes = plt.subplots(1, 2, figsize=(12.4, 3.0))
    for axis, column, name in ((axes[0], 2, "mean TTFT"), (axes[1], 3, "mean E2EL")):
        for side, rows in points.items():
            ordered = sorted(rows)
            x = [row[1] for row in ordered]
            y = [row[column] for row in ordered]
            colour = SIDE_COLOURS.get(side, "#333333")
            axis.plot(x, y, marker="o", color=colour, label=side, linewidth=1.4)
            for row in ordered:
                axis.annotate(f"C{row[0]}", (row[1], row[column]), fontsize=7,
                              textcoords="offset points", xytext=(4, 4))  # fmt: skip
        axis.set_xlabel("total tok/s", fontsize=8)
        axis.set_title(f"{name} (ms) against throughput", fontsize=9)
        axis.grid(alpha=0.3)
        axis.tick_params(labelsize=8)
        axis.legend(fontsize=8, loc="upper left")
    figure.tight_layout()
    return _png(figure)


@dataclass
class SideMargins:
    """One side's greedy margins (nats) at every replayed completion position that had a
    runner-up, and the share of those positions under each of MARGIN_MARKS."""

    side: str
    margins: list[float]
    shares: dict[float, float]


def position_margin(position: TokenLogprob) -> float | None:
    """How far the side's best token led its runner-up (top-1 minus top-2 of its top-k): the
    margin a greedy choice there had. None when the top-k has fewer than 2 finite entries
    (vLLM answers NaN as null, as it does for a broken kernel's output)."""
    values = sorted(
        (v for v in position.top.values() if v is not None and not math.isnan(v)), reverse=True
    )
    if len(values) < 2 or not math.isfinite(values[0]):
        return None
    return values[0] - values[1]


def side_margins(
    replayed: dict[str, dict[CompletionKey, Sequence[TokenLogprob]]],
) -> list[SideMargins]:
    """Per side (reference first), the margins along every completion it replayed (drift.py:
    the timed requests carry no logprobs). Empty when no position is measurable."""
    by_side: dict[str, list[float]] = {}
    for side, completions in replayed.items():
        measured = (position_margin(p) for positions in completions.values() for p in positions)
        by_side[side] = [m for m in measured if m is not None]
    return [
        SideMargins(
            side,
            margins,
            {mark: sum(m < mark for m in margins) / len(margins) for mark in MARGIN_MARKS},
        )
        for side, margins in sorted(by_side.items(), key=lambda item: item[0] != Side.REFERENCE)
        if margins
    ]


def margin_figure(measured: list[SideMargins], near_tie_margin: float | None) -> str | None:
    """CDF of each side's greedy margins on a symlog axis (linear near 0, where near-ties are),
    the gate's near_tie_margin dashed, each side's shares under MARGIN_MARKS in the legend."""
    if not measured:
        return None
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(12.4, 2.6))
    for side in measured:
        finite = [m for m in side.margins if math.isfinite(m)]
        shares = ", ".join(f"{share:.1%} < {mark:g}" for mark, share in side.shares.items())
        label = f"{side.side}: {shares} nats ({len(side.margins):,} positions)"
        if finite:
            x, y = _cdf(finite)
            # an infinite margin (runner-up at -inf) still counts: the curve ends below 1
            y = y * len(finite) / len(side.margins)
            axis.step(
                x,
                y,
                where="post",
                color=SIDE_COLOURS.get(side.side, "#333333"),
                label=label,
                linewidth=1.4,
            )
    if near_tie_margin is not None:
        axis.axvline(
            near_tie_margin,
            color="#000000",
            linestyle="--",
            linewidth=1,
            label=f"near_tie_margin {near_tie_margin:g}",
        )
    axis.set_xscale("symlog", linthresh=1.0)
    lowest = min((m for side in measured for m in side.margins if math.isfinite(m)), default=0.0)
    axis.set_xlim(left=min(0.0, lowest))  # a chosen token behind its runner-up stays in view
    highest = axis.get_xlim()[1]
    ticks = [t for t in MARGIN_TICKS if t <= highest]
    axis.set_xticks(ticks, [f"{t:g}" for t in ticks])
    axis.set_ylim(0, 1.02)
    axis.set_title(
        "greedy margin per replayed completion position: top-1 − top-2 logprob (nats), CDF",
        fontsize=9,
    )
    axis.grid(alpha=0.3)
    axis.tick_params(labelsize=8)
    axis.legend(fontsize=8, loc="lower right")
    figure.tight_layout()
    return _png(figure)


def profile_figure(groups: Sequence[GroupRow]) -> str | None:
    """The profiled block's kernel groups, both sides' share of their step time side by side:
    where each side's step went, GDN prefill's groups apart from the rest."""
    if not groups:
        return None
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(8.4, 0.5 + 0.42 * len(groups)))
    rows = np.arange(len(groups))
    height = 0.38
    for offset, side, attribute in (
        (-height / 2, Side.REFERENCE, "reference_share_pct"),
        (height / 2, Side.CANDIDATE, "candidate_share_pct"),
    ):
        values = [getattr(g, attribute) or 0.0 for g in groups]
        axis.barh(rows + offset, values, height, color=SIDE_COLOURS[side], label=side)
    axis.set_yticks(rows, [g.group for g in groups], fontsize=8)
    axis.invert_yaxis()
    axis.set_xlabel("% of the side's profiled step time", fontsize=8)
    axis.legend(fontsize=8, loc="lower right")
    figure.tight_layout()
    return _png(figure)
