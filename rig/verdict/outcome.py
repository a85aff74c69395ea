"""RunOutcome: everything a run produced, as the verdict stage hands it to the report (which
only renders it). rig/run/conclude.py builds it from the run's state."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from rig.records import CompletionKey, LevelFault, RequestRecord, ServerDelta, TokenLogprob
from rig.verdict.compare import PairResult
from rig.verdict.drift import DriftResult
from rig.verdict.gates import SideKernel, Verdict
from rig.verdict.speed import SpeedDesign


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
    server_deltas: list[ServerDelta]
    faults: list[LevelFault]
    kernels: dict[str, SideKernel]
    verdict: Verdict
    aa_pairs: list[PairResult] | None = None
    aa_drift: list[DriftResult] | None = None
    timings: dict[str, float] = field(default_factory=dict)
    perf: pd.DataFrame | None = None  # rig.verdict.perf.perf_frame, with the A/A floor when it ran
    error: str | None = None
    prompt_categories: dict[str, str] = field(default_factory=dict)  # prompt id -> category
    speed: SpeedDesign = field(default_factory=lambda: SpeedDesign(True))
    comparison: str = ""  # "A/A: ..." for a reference against itself
    load_schedule: str = ""  # when each side's timed requests ran (LoadSchedule.describe)
    reference_source: str = ""  # where the reference's results came from, when not this run
    # Each side's teacher-forced replay along the reference completions (drift.forced_positions)
    replayed: dict[str, dict[CompletionKey, list[TokenLogprob]]] = field(default_factory=dict)
