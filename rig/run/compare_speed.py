"""`rig compare`'s speed: per level, RUN_B's candidate against RUN_A's reference through
rig.verdict.perf, worded only where the run's own speed line would word it. Two stored runs were
measured at different times, so the machine may have changed under them between the two: only
one run's own reference and candidate get a word, under that run's refusals as its manifest.json
recorded them (rig.run.conclude.run_speed_design: a golden-cache reference, outputs that differ,
an interrupted run, one block, an A/A run). Elsewhere the lines show the changes without a word.

A run's own two sides show the records its report rendered, read back from its perf.csv (the
numbers report.html and summary.md show, by construction); only two runs, other sides, or a run
whose report was never written are compared afresh through rig.verdict.perf.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from rig.records import RequestRecord, Side
from rig.report.tables import read_perf_table
from rig.run.conclude import run_speed_design
from rig.scenario.config import Scenario
from rig.verdict.intervals import TimingDesign
from rig.verdict.perf import compare_levels
from rig.verdict.perf_records import (
    BLOCK,
    HEADLINE_METRICS,
    LevelComparison,
    MetricComparison,
    PerfResult,
)
from rig.verdict.speed import SHORT_NAMES, SpeedDesign, apply_design

MANIFEST_FILE = "manifest.json"
PERF_FILE = "perf.csv"
TWO_RUNS = (
    "not comparable (two runs, measured at different times; a speed word needs both sides "
    "measured in one run: rig compare RUN RUN)"
)
OTHER_SIDES = "not comparable (a speed word compares one run's reference with its candidate)"
NO_MANIFEST = "not measured (no manifest.json: the run's report was never written)"
UNRECORDED = (
    "not comparable (manifest.json does not record where the reference came from or how the "
    "run was timed: written by an older rig)"
)


@dataclass(frozen=True)
class StoredDesign:
    """How a stored run measured speed, as its manifest.json says: what its speed line could
    word, the timing its intervals follow, and the levels its family of intervals spans."""

    speed: SpeedDesign
    timing: TimingDesign = TimingDesign()
    levels: int = 1
    shown: tuple[LevelComparison, ...] | None = None  # what the run's own report showed

    @property
    def confidence(self) -> float:
        """Each interval's, as the run's own speed line set it."""
        return self.speed.interval_confidence(self.levels)


def stored_design(run_dir: Path) -> StoredDesign:
    """The design a finished run's speed line had, rebuilt from its manifest.json."""
    path = Path(run_dir) / MANIFEST_FILE
    if not path.is_file():
        return StoredDesign(SpeedDesign(False, NO_MANIFEST))
    manifest = json.loads(path.read_text(encoding="utf-8"))
    if "golden_run" not in manifest:
        return StoredDesign(SpeedDesign(False, UNRECORDED))
    scenario = Scenario.model_validate(manifest["scenario"])
    stage_one = manifest.get("stage_one_blocks")
    timing = TimingDesign(
        pair_levels=frozenset(manifest.get("pair_levels", ())),
        excluded=frozenset(tuple(block) for block in manifest.get("excluded_blocks", ())),
        stage_one_blocks=stage_one,
        resolution_pct=scenario.workload.speed_resolution_pct if stage_one else None,
    )
    speed = run_speed_design(
        scenario,
        timing,
        manifest.get("verdict", {}).get("word", ""),
        manifest.get("error"),
        manifest.get("golden_run"),
        manifest.get("golden_stored_at"),
    )
    return StoredDesign(speed, timing, len(scenario.workload.concurrency))


def compared_design(run_a: Path, run_b: Path, side_a: str, side_b: str) -> StoredDesign:
    """The design two sides' speed is compared under: one run's own; for two runs none, the
    blocks either run left out (a JIT compilation) still left out of the changes shown."""
    if Path(run_a).resolve() != Path(run_b).resolve():
        excluded = stored_design(run_a).timing.excluded | stored_design(run_b).timing.excluded
        return StoredDesign(SpeedDesign(False, TWO_RUNS), TimingDesign(excluded=excluded))
    if (side_a, side_b) != (Side.REFERENCE, Side.CANDIDATE):
        return StoredDesign(SpeedDesign(False, OTHER_SIDES))
    return replace(stored_design(run_a), shown=shown_levels(run_a))


def shown_levels(run_dir: Path) -> tuple[LevelComparison, ...] | None:
    """The candidate's levels as the run's report showed them (its perf.csv, worded by its
    own design); None where the report was never written."""
    path = Path(run_dir) / PERF_FILE
    if not path.is_file() or not (Path(run_dir) / MANIFEST_FILE).is_file():
        return None
    try:
        return read_perf_table(path).candidate
    except (KeyError, ValueError):  # an older rig's columns: compared afresh instead
        return None


def _metric_text(compared: MetricComparison, worded: bool) -> str:
    text = f"{SHORT_NAMES[compared.metric]} {compared.change_pct:+.1f} %"
    if not worded:
        return text
    interval = compared.interval_pct
    shown = f" [{interval[0]:+.1f}, {interval[1]:+.1f}]" if interval else ""
    return f"{text}{shown} {compared.word}"


def level_line(level: LevelComparison, design: SpeedDesign) -> str:
    """One level: each headline metric's change, with its interval and word where the design
    gives one, else the design's word once."""
    metrics = [m for metric in HEADLINE_METRICS if (m := level.get(metric)) is not None]
    units = (
        f"{level.repeats} block pairs" if level.unit == BLOCK else f"{level.requests} request pairs"
    )
    where = f"  C{level.level} ({units}): "
    if design.measured:
        return where + "; ".join(_metric_text(m, True) for m in metrics)
    return where + ", ".join(_metric_text(m, False) for m in metrics) + f": {design.word}"


def speed_lines(
    reference: list[RequestRecord], candidate: list[RequestRecord], stored: StoredDesign
) -> list[str]:
    """The speed heading, then one line per level both sides ran: as the run's report showed
    them where it did, else compared here."""
    design = stored.speed
    levels = stored.shown
    if levels is None:
        raw = compare_levels(
            [r for r in reference if not r.cancelled],
            [r for r in candidate if not r.cancelled],
            confidence=stored.confidence,
            timing=stored.timing,
        )
        levels = apply_design(PerfResult(raw), design).candidate
    if not levels:
        return ["speed: n/a (no level ran on both sides)"]
    aa = "A/A run: " if design.aa_run else ""
    said = design.describe(stored.levels) if design.measured else design.reason
    return [f"speed: {aa}{said}", *(level_line(level, design) for level in levels)]
