"""Reports under results/<run-id>/: requests.csv, summary.csv (`vllm bench serve`'s metric names),
perf.csv (candidate/reference ratios with 95% intervals), bench/<side>-c<level>.json (`vllm bench
serve --save-result` layout), mismatches.csv, drift.csv, accuracy.csv (the accuracy block),
summary.md (short enough for a PR comment), report.html (self-contained, every model output
HTML-escaped), junit.xml (one test case per request pair) and manifest.json.

The verdict comes first everywhere; the evidence follows.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import xml.etree.ElementTree as ET
from dataclasses import asdict
from pathlib import Path

import pandas as pd

from rig.report.accuracy import accuracy_frame
from rig.report.html import render_html
from rig.report.markdown import render_markdown
from rig.report.mismatches import Decode
from rig.verdict.accuracy import ACCURACY_REPEAT
from rig.verdict.compare import PairResult
from rig.verdict.drift import DriftResult
from rig.verdict.metrics import bench_results
from rig.verdict.outcome import RunOutcome
from rig.verdict.perf_records import MetricComparison, PerfResult, PlantedShare
from rig.verdict.sensitivity import KernelSensitivity
from rig.verdict.speed import speed_headline

REPORT_FILES = (
    "requests.csv",
    "summary.csv",
    "perf.csv",
    "mismatches.csv",
    "drift.csv",
    "accuracy.csv",
    "summary.md",
    "report.html",
    "junit.xml",
    "manifest.json",
)


def seeds_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Per level and side: requests ok, matches, mean TTFT, mean latency, throughput."""
    if summary.empty:
        return pd.DataFrame()
    means = summary.groupby(["level", "side"], sort=True).agg(
        requests=("requests", "sum"),
        completed=("completed", "sum"),
        mean_ttft_ms=("mean_ttft_ms", "mean"),
        mean_e2el_ms=("mean_e2el_ms", "mean"),
        total_token_throughput=("total_token_throughput", "mean"),
        output_throughput=("output_throughput", "mean"),
    )
    if "matches" in summary.columns:
        means["matches"] = summary.groupby(["level", "side"])["matches"].sum(min_count=1)
    return means.reset_index()


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


def _planted_columns(planted: PlantedShare) -> dict[str, object]:
    columns: dict[str, object] = {
        "planted_delay_ms": planted.delay_ms,
        "planted_ms_per_request": planted.ms_per_request,
        "planted_calls_per_request": planted.calls_per_request,
    }
    for change in planted.changes:
        columns[f"{change.metric.value}_planted_pct"] = change.planted_pct
        columns[f"{change.metric.value}_planted_inside_ci"] = change.inside_interval
    return columns


def _sensitivity_columns(found: KernelSensitivity) -> dict[str, object]:
    columns: dict[str, object] = {
        "gdn_calls_per_request": found.calls_per_request,
        "gdn_share_pct": found.gdn_share_pct,
        "hides_kernel": found.hides_kernel,
    }
    for prediction in found.predictions:
        columns[f"{prediction.metric.value}_predicted_pct"] = prediction.predicted_pct
        columns[f"{prediction.metric.value}_predicted_inside_ci"] = prediction.inside
    return columns


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


def render_junit(outcome: RunOutcome) -> bytes:
    suite = ET.Element(
        "testsuite",
        name=f"rig.{outcome.scenario_name}",
        tests=str(len(outcome.pairs) + len(outcome.verdict.gates)),
        failures=str(
            sum(p.substantive or p.unclassified or bool(_gating(p)) for p in outcome.pairs)
            + len(outcome.verdict.failed_gates)
        ),
    )
    properties = ET.SubElement(suite, "properties")
    for name, value in (
        ("verdict", outcome.verdict.word),
        ("exit_code", str(int(outcome.verdict.exit_code(outcome.error)))),
    ):
        ET.SubElement(properties, "property", name=name, value=value)
    for gate in outcome.verdict.gates:
        case = ET.SubElement(suite, "testcase", classname="rig.gates", name=gate.name)
        if not gate.passed:
            ET.SubElement(case, "failure", message=_xml_safe(gate.detail))
    for pair in outcome.pairs:
        case = ET.SubElement(
            suite, "testcase", classname=f"rig.pairs.c{pair.level}", name=pair.request_id
        )
        problems = _gating(pair)
        if pair.substantive or pair.unclassified:
            d = pair.divergence
            what = "substantive divergence" if pair.substantive else "unclassified divergence"
            problems.insert(
                0,
                f"{what} at token {d.token_index}: "
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


def remove_report(run_dir: Path) -> None:
    """Take away a report whose writing was cut short: a run folder holds a whole report or none."""
    for name in REPORT_FILES:
        (run_dir / name).unlink(missing_ok=True)
    shutil.rmtree(run_dir / "bench", ignore_errors=True)


def write_report(outcome: RunOutcome, decode: Decode | None = None) -> dict[str, Path]:
    """Write every report file; returns name -> path. `decode` (token ids -> text) names and
    places tokens in report.html; without it the page shows token ids."""
    out = outcome.run_dir
    out.mkdir(parents=True, exist_ok=True)
    requests, summary = outcome.requests, outcome.summary
    perf = outcome.perf
    table = seeds_table(summary)
    drift = drift_frame(outcome.drift)
    mismatches = pd.DataFrame([p.as_row() for p in outcome.pairs if not p.identical])
    paths = {name: out / name for name in REPORT_FILES}
    requests.to_csv(paths["requests.csv"], index=False)
    summary.to_csv(paths["summary.csv"], index=False)
    perf_table(perf).to_csv(paths["perf.csv"], index=False)
    bench = out / "bench"
    bench.mkdir(exist_ok=True)
    timed = [r for r in outcome.records if r.task is None]  # the accuracy block is not timed
    untimed = summary[summary["repeat"] == ACCURACY_REPEAT] if not summary.empty else summary
    for name, result in bench_results(timed, summary.drop(untimed.index), outcome.manifest).items():
        (bench / name).write_text(json.dumps(result, indent=2, default=str), encoding="utf-8")
    mismatches.to_csv(paths["mismatches.csv"], index=False)
    drift.to_csv(paths["drift.csv"], index=False)
    accuracy_frame(outcome.accuracy, outcome.pairs).to_csv(paths["accuracy.csv"], index=False)
    paths["summary.md"].write_text(
        render_markdown(outcome, table), encoding="utf-8", errors="backslashreplace"
    )
    page = render_html(outcome, summary, perf, decode)
    paths["report.html"].write_text(page, encoding="utf-8", errors="backslashreplace")
    paths["junit.xml"].write_bytes(render_junit(outcome))
    manifest = outcome.manifest.to_json()
    manifest.update(
        verdict={
            "word": outcome.verdict.word,
            "passed": outcome.verdict.passed,
            "gates": [asdict(g) for g in outcome.verdict.gates],
            "counts": asdict(outcome.verdict.counts),
            "aa_counts": (asdict(outcome.verdict.aa_counts) if outcome.verdict.aa_counts else None),
        },
        kernels={side: asdict(k) for side, k in outcome.kernels.items()},
        timings=outcome.timings,
        speed=speed_headline(perf, outcome.speed),
        self_check=outcome.self_check.counts.as_dict() if outcome.self_check else None,
        error=outcome.error,
        exit_code=int(outcome.verdict.exit_code(outcome.error)),
    )
    paths["manifest.json"].write_text(json.dumps(manifest, indent=2, default=str), encoding="utf-8")
    return paths
