"""Reports under results/<run-id>/: requests.csv, summary.csv, mismatches.csv, drift.csv,
summary.md (short enough for a PR comment), report.html (self-contained, every model output
HTML-escaped), junit.xml (one test case per request pair) and manifest.json.

The verdict comes first everywhere; the evidence follows.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import re
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd

from rig.compare import PairResult
from rig.drift import DriftResult
from rig.metrics import delta_frame, request_frame, summary_frame
from rig.records import RequestRecord
from rig.verdict import SideKernel, Verdict

MISMATCHES_SHOWN = 20
REPORT_FILES = (
    "requests.csv",
    "summary.csv",
    "deltas.csv",
    "mismatches.csv",
    "drift.csv",
    "summary.md",
    "report.html",
    "junit.xml",
    "manifest.json",
)


@dataclass(frozen=True)
class PrefixCacheDelta:
    """Prefix-cache queries and hits one side's server counted during one level."""

    side: str
    level: int
    repeat: int
    queries: float
    hits: float


@dataclass(frozen=True)
class LevelFault:
    """A server-log fault (OOM, CUDA error, traceback, death) attributed to the level it hit."""

    side: str
    level: int | None
    kind: str
    line: str
    failed_requests: str = ""  # ids of that side's requests that failed in that level


@dataclass
class RunOutcome:
    """Everything a run produced; the report stage only renders it."""

    run_id: str
    run_dir: Path
    scenario_name: str
    manifest: dict
    records: list[RequestRecord]
    pairs: list[PairResult]
    drift: list[DriftResult]
    prefix_cache: list[PrefixCacheDelta]
    faults: list[LevelFault]
    kernels: dict[str, SideKernel]
    verdict: Verdict
    aa_pairs: list[PairResult] | None = None
    aa_drift: list[DriftResult] | None = None
    timings: dict[str, float] = field(default_factory=dict)
    error: str | None = None


def _fmt(value: float | None, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:.{digits}f}"


def seeds_table(summary: pd.DataFrame, deltas: pd.DataFrame) -> pd.DataFrame:
    """Per level and side: requests ok, matches, mean TTFT, mean latency, throughput, deltas."""
    if summary.empty:
        return pd.DataFrame()
    means = summary.groupby(["level", "side"], sort=True).agg(
        requests=("requests", "sum"),
        ok=("ok", "sum"),
        ttft_mean_ms=("ttft_mean_ms", "mean"),
        e2el_mean_ms=("e2el_mean_ms", "mean"),
        total_throughput=("total_throughput", "mean"),
        output_throughput=("output_throughput", "mean"),
    )
    if "matches" in summary.columns:
        means["matches"] = summary.groupby(["level", "side"])["matches"].sum(min_count=1)
    table = means.reset_index()
    if not deltas.empty:
        keep = ["level"] + [c for c in deltas.columns if c.endswith(("_delta_pct", "_verdict"))]
        table = table.merge(deltas[keep], on="level", how="left")
        reference_rows = table["side"] != "candidate"
        table.loc[reference_rows, [c for c in keep if c != "level"]] = None
    return table


def _verdict_lines(verdict: Verdict) -> list[str]:
    c = verdict.counts
    lines = [
        f"**Verdict: {verdict.word}** — {'PASS' if verdict.passed else 'FAIL'}",
        "",
        f"{c.pairs} pairs: {c.identical} identical, {c.near_tie} near-tie, "
        f"{c.substantive} substantive divergences; {c.pathologies} pathologies; "
        f"prefix-cache hits {c.prefix_cache_hits:g}; teacher-forced drift mean "
        f"{_fmt(c.drift_mean, 4)}, max {_fmt(c.drift_max, 4)}.",
    ]
    if verdict.aa_counts is not None:
        a = verdict.aa_counts
        lines.append(
            f"A/A noise floor: {a.pairs} pairs, {a.identical} identical, {a.near_tie} near-tie, "
            f"{a.substantive} substantive; drift mean {_fmt(a.drift_mean, 4)}, "
            f"max {_fmt(a.drift_max, 4)}."
        )
    lines += ["", "| gate | result | detail |", "|---|---|---|"]
    lines += [
        f"| {g.name} | {'pass' if g.passed else '**FAIL**'} | {g.detail} |" for g in verdict.gates
    ]
    return lines


def _markdown_table(frame: pd.DataFrame) -> list[str]:
    if frame.empty:
        return ["(no data)"]
    header = "| " + " | ".join(str(c) for c in frame.columns) + " |"
    rule = "|" + "---|" * len(frame.columns)
    rows = []
    for _, row in frame.iterrows():
        cells = []
        for value in row:
            if isinstance(value, float):
                cells.append(_fmt(value, 2))
            elif value is None:
                cells.append("–")
            else:
                cells.append(str(value).replace("|", "\\|"))
        rows.append("| " + " | ".join(cells) + " |")
    return [header, rule, *rows]


def render_markdown(outcome: RunOutcome, table: pd.DataFrame) -> str:
    lines = [f"## rig: {outcome.scenario_name} ({outcome.run_id})", ""]
    if outcome.error:
        lines += [f"**Run error:** {outcome.error}", ""]
    lines += _verdict_lines(outcome.verdict)
    kernels = ", ".join(
        f"{k.side}: {k.kernel} ({k.calls} prefill calls)" for k in outcome.kernels.values()
    )
    lines += ["", f"Kernels: {kernels or 'not proven'}", ""]
    columns = [
        c
        for c in (
            "level",
            "side",
            "ok",
            "requests",
            "matches",
            "ttft_mean_ms",
            "e2el_mean_ms",
            "total_throughput",
            "ttft_mean_ms_delta_pct",
            "e2el_mean_ms_delta_pct",
            "total_throughput_delta_pct",
        )
        if c in table.columns
    ]
    lines += _markdown_table(table[columns] if columns else table)
    mismatched = [p for p in outcome.pairs if not p.identical][:5]
    if mismatched:
        lines += ["", "First mismatches:", ""]
        for pair in mismatched:
            d = pair.divergence
            if d is None:
                lines.append(f"- `{pair.request_id}` ({pair.prompt_id}): {_pathology_text(pair)}")
                continue
            lines.append(
                f"- `{pair.request_id}` ({pair.prompt_id}) {d.kind} at token {d.token_index}, "
                f"margin {_fmt(d.reference_margin, 3)}: ref `{_inline(d.reference_excerpt)}` / "
                f"cand `{_inline(d.candidate_excerpt)}`"
            )
    return "\n".join(lines) + "\n"


def _inline(text: str) -> str:
    return text.replace("`", "'").replace("\n", "⏎")[-60:]


def _pathology_text(pair: PairResult) -> str:
    return "; ".join(f"{p.side} {p.kind}: {p.detail}" for p in pair.pathologies) or "mismatch"


def _plot_png(summary: pd.DataFrame) -> str | None:
    """Latency and throughput against concurrency for both sides, as an inline PNG."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    if summary.empty:
        return None
    means = summary.groupby(["side", "level"]).mean(numeric_only=True).reset_index()
    figure, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for side, group in means.groupby("side"):
        axes[0].plot(group["level"], group["ttft_mean_ms"], marker="o", label=side)
        axes[1].plot(group["level"], group["e2el_mean_ms"], marker="o", label=side)
        axes[2].plot(group["level"], group["total_throughput"], marker="o", label=side)
    for axis, title in zip(
        axes, ("mean TTFT (ms)", "mean latency (ms)", "total tok/s"), strict=True
    ):
        axis.set_title(title)
        axis.set_xlabel("client concurrency")
        axis.set_xscale("log", base=2)
        axis.grid(alpha=0.3)
        axis.legend()
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90)
    plt.close(figure)
    return base64.b64encode(buffer.getvalue()).decode()


def _html_table(frame: pd.DataFrame) -> str:
    if frame.empty:
        return "<p>(no data)</p>"
    return frame.to_html(index=False, escape=True, float_format=lambda v: f"{v:.2f}", na_rep="–")


def _side_by_side(pair: PairResult, records: dict[tuple[str, str], RequestRecord]) -> str:
    ref = records.get(("reference", pair.request_id))
    cand = records.get(("candidate", pair.request_id))
    d = pair.divergence
    cut = d.char_index if d is not None else 0

    def marked(record: RequestRecord | None) -> str:
        if record is None:
            return ""
        text = record.text
        return (
            html.escape(text[:cut])
            + "<mark>"
            + html.escape(text[cut : cut + 1] or "∅")
            + "</mark>"
            + html.escape(text[cut + 1 :])
        )

    facts = html.escape(_pathology_text(pair))
    if d is not None:
        facts = html.escape(
            f"{d.kind} at char {d.char_index}, token {d.token_index}; reference token "
            f"{d.reference_token_id} (logprob {_fmt(d.reference_logprob, 3)}), candidate token "
            f"{d.candidate_token_id} (logprob {_fmt(d.candidate_logprob, 3)}); reference margin "
            f"{_fmt(d.reference_margin, 3)}; candidate token rank in reference top-k "
            f"{d.candidate_token_rank_in_reference}, reference token rank in candidate top-k "
            f"{d.reference_token_rank_in_candidate}"
        )
    return (
        f"<h3>{html.escape(pair.request_id)} — {html.escape(pair.prompt_id)}</h3><p>{facts}</p>"
        f"<table class='diff'><tr><th>reference</th><th>candidate</th></tr>"
        f"<tr><td><pre>{marked(ref)}</pre></td><td><pre>{marked(cand)}</pre></td></tr></table>"
    )


def render_html(
    outcome: RunOutcome, table: pd.DataFrame, summary: pd.DataFrame, drift: pd.DataFrame
) -> str:
    verdict_md = "\n".join(_verdict_lines(outcome.verdict))
    verdict_html = "".join(
        f"<p>{html.escape(line)}</p>"
        for line in verdict_md.splitlines()
        if line and "|" not in line and not line.startswith("**Verdict")
    )
    gates = pd.DataFrame([asdict(g) for g in outcome.verdict.gates])
    plot = _plot_png(summary)
    records = {(r.side, r.request_id): r for r in outcome.records}
    mismatches = [p for p in outcome.pairs if not p.identical][:MISMATCHES_SHOWN]
    status = "PASS" if outcome.verdict.passed else "FAIL"
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>rig {html.escape(outcome.run_id)}</title>",
        "<style>body{font-family:sans-serif;margin:2em;max-width:1400px}"
        "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 6px}"
        ".diff td{vertical-align:top;width:50%}pre{white-space:pre-wrap;margin:0}"
        "mark{background:#f99}.pass{color:#070}.fail{color:#b00}</style></head><body>",
        f"<h1>rig: {html.escape(outcome.scenario_name)}</h1>",
        f"<h2 class='{'pass' if outcome.verdict.passed else 'fail'}'>"
        f"{html.escape(outcome.verdict.word)} — {status}</h2>",
    ]
    if outcome.error:
        parts.append(f"<p class='fail'>Run error: {html.escape(outcome.error)}</p>")
    parts += [verdict_html, "<h2>Gates</h2>", _html_table(gates)]
    kernels = pd.DataFrame([asdict(k) for k in outcome.kernels.values()])
    parts += ["<h2>Kernels</h2>", _html_table(kernels), "<h2>Per level</h2>", _html_table(table)]
    if plot:
        parts.append(
            f"<img alt='latency and throughput vs concurrency' src='data:image/png;base64,{plot}'>"
        )
    parts += ["<h2>Teacher-forced drift</h2>", _html_table(drift)]
    if outcome.prefix_cache:
        parts += [
            "<h2>Prefix cache</h2>",
            _html_table(pd.DataFrame([asdict(p) for p in outcome.prefix_cache])),
        ]
    if outcome.faults:
        parts += [
            "<h2>Server-log faults</h2>",
            _html_table(pd.DataFrame([asdict(f) for f in outcome.faults])),
        ]
    parts.append(f"<h2>Mismatches ({sum(not p.identical for p in outcome.pairs)})</h2>")
    parts += [_side_by_side(pair, records) for pair in mismatches]
    parts.append("</body></html>")
    return "\n".join(parts)


def render_junit(outcome: RunOutcome) -> bytes:
    suite = ET.Element(
        "testsuite",
        name=f"rig.{outcome.scenario_name}",
        tests=str(len(outcome.pairs) + len(outcome.verdict.gates)),
        failures=str(
            sum(p.substantive or bool(_gating(p)) for p in outcome.pairs)
            + len(outcome.verdict.failed_gates)
        ),
    )
    for gate in outcome.verdict.gates:
        case = ET.SubElement(suite, "testcase", classname="rig.gates", name=gate.name)
        if not gate.passed:
            ET.SubElement(case, "failure", message=_xml_safe(gate.detail))
    for pair in outcome.pairs:
        case = ET.SubElement(
            suite, "testcase", classname=f"rig.pairs.c{pair.level}", name=pair.request_id
        )
        problems = _gating(pair)
        if pair.substantive:
            d = pair.divergence
            problems.insert(
                0,
                f"substantive divergence at token {d.token_index}: "
                f"ref {d.reference_excerpt!r} / cand {d.candidate_excerpt!r}",
            )
        if problems:
            ET.SubElement(case, "failure", message=_xml_safe("; ".join(problems)[:2000]))
        elif pair.divergence is not None:
            ET.SubElement(
                case, "system-out"
            ).text = f"near-tie at token {pair.divergence.token_index}"
    return ET.tostring(suite, encoding="utf-8", xml_declaration=True)


_XML_INVALID = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _xml_safe(text: str) -> str:
    """XML 1.0 cannot hold control characters or lone surrogates (a server's error body may
    carry ANSI colours); they become U+FFFD so CI can still parse the file."""
    return _XML_INVALID.sub("\ufffd", text)


def _gating(pair: PairResult) -> list[str]:
    """The pathologies that fail a pair, as text."""
    return [f"{p.side} {p.kind}: {p.detail}" for p in pair.gating_pathologies]


def drift_frame(drift: list[DriftResult]) -> pd.DataFrame:
    return pd.DataFrame([asdict(d) for d in drift])


def write_report(outcome: RunOutcome) -> dict[str, Path]:
    """Write every report file; returns name -> path."""
    out = outcome.run_dir
    out.mkdir(parents=True, exist_ok=True)
    requests = request_frame(outcome.records)
    summary = summary_frame(outcome.records, outcome.pairs)
    deltas = delta_frame(summary)
    table = seeds_table(summary, deltas)
    drift = drift_frame(outcome.drift)
    mismatches = pd.DataFrame([p.as_row() for p in outcome.pairs if not p.identical])
    paths = {name: out / name for name in REPORT_FILES}
    requests.to_csv(paths["requests.csv"], index=False)
    summary.to_csv(paths["summary.csv"], index=False)
    deltas.to_csv(paths["deltas.csv"], index=False)
    mismatches.to_csv(paths["mismatches.csv"], index=False)
    drift.to_csv(paths["drift.csv"], index=False)
    paths["summary.md"].write_text(
        render_markdown(outcome, table), encoding="utf-8", errors="backslashreplace"
    )
    paths["report.html"].write_text(
        render_html(outcome, table, summary, drift), encoding="utf-8", errors="backslashreplace"
    )
    paths["junit.xml"].write_bytes(render_junit(outcome))
    manifest = dict(outcome.manifest)
    manifest.update(
        verdict={
            "word": outcome.verdict.word,
            "passed": outcome.verdict.passed,
            "gates": [asdict(g) for g in outcome.verdict.gates],
            "counts": asdict(outcome.verdict.counts),
        },
        kernels={side: asdict(k) for side, k in outcome.kernels.items()},
        timings=outcome.timings,
        error=outcome.error,
    )
    paths["manifest.json"].write_text(json.dumps(manifest, indent=2, default=str), encoding="utf-8")
    return paths
