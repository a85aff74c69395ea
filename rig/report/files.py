"""Reports under results/<run-id>/: requests.csv, summary.csv (`vllm bench serve`'s metric names),
perf.csv (candidate/reference ratios with 95% intervals), bench/<side>-c<level>.json (`vllm bench
serve --save-result` layout), mismatches.csv, drift.csv, accuracy.csv (the accuracy block),
summary.md (short enough for a PR comment), report.html (self-contained, every model output
HTML-escaped), junit.xml (one test case per request pair) and manifest.json.

The verdict comes first everywhere; the evidence follows.
"""

from __future__ import annotations

import json
import re
import shutil
import xml.etree.ElementTree as ET
from dataclasses import asdict
from pathlib import Path

from rig.report.html import render_html
from rig.report.markdown import render_markdown
from rig.report.mismatches import Decode, label
from rig.report.tables import (
    accuracy_table,
    drift_table,
    mismatches_table,
    perf_table,
    profile_table,
    requests_table,
    summary_table,
)
from rig.verdict.compare import PairResult
from rig.verdict.outcome import RunOutcome

REPORT_FILES = (
    "requests.csv",
    "summary.csv",
    "perf.csv",
    "profile.csv",
    "mismatches.csv",
    "drift.csv",
    "accuracy.csv",
    "summary.md",
    "report.html",
    "junit.xml",
    "manifest.json",
)


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
            ).text = f"{label(pair)} at token {pair.divergence.token_index}"
    return ET.tostring(suite, encoding="utf-8", xml_declaration=True)


_XML_INVALID = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _xml_safe(text: str) -> str:
    """XML 1.0 cannot hold control characters or lone surrogates (a server's error body may
    carry ANSI colours); they become U+FFFD so CI can still parse the file."""
    return _XML_INVALID.sub("\ufffd", text)


def _gating(pair: PairResult) -> list[str]:
    """The pathologies that fail a pair, as text."""
    return [f"{p.side} {p.kind}: {p.detail}" for p in pair.gating_pathologies]


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
    paths = {name: out / name for name in REPORT_FILES}
    tables = {
        "accuracy.csv": accuracy_table(outcome.accuracy, outcome.pairs),
        "requests.csv": requests_table(outcome.records),
        "summary.csv": summary_table(outcome.blocks),
        "perf.csv": perf_table(outcome.perf),
        "profile.csv": profile_table(outcome.profile),
        "mismatches.csv": mismatches_table(outcome.pairs),
        "drift.csv": drift_table(outcome.drift),
    }
    for name, frame in tables.items():
        frame.to_csv(paths[name], index=False)
    bench = out / "bench"
    bench.mkdir(exist_ok=True)
    for name, result in outcome.bench.items():
        (bench / name).write_text(json.dumps(result, indent=2, default=str), encoding="utf-8")
    paths["summary.md"].write_text(
        render_markdown(outcome), encoding="utf-8", errors="backslashreplace"
    )
    page = render_html(outcome, decode)
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
        speed=outcome.speed_line,
        prefix_hits_by_turn=[asdict(turn) for turn in outcome.turn_hits],
        self_check=outcome.self_check.counts.as_dict() if outcome.self_check else None,
        error=outcome.error,
        exit_code=int(outcome.verdict.exit_code(outcome.error)),
    )
    paths["manifest.json"].write_text(json.dumps(manifest, indent=2, default=str), encoding="utf-8")
    return paths
