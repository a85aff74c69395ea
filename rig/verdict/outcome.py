"""RunOutcome: everything a run produced, as the verdict stage hands it to the report (which
only renders it): the frames every report file shows are computed here, once. rig/run/conclude.py
builds it from the run's state."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from rig.manifest_record import RunManifest
from rig.records import CompletionKey, LevelFault, RequestRecord, ServerDelta, TokenLogprob
from rig.serve.logs import JIT_COMPILE
from rig.verdict.accuracy import AccuracyResult
from rig.verdict.compare import PairResult
from rig.verdict.drift import DriftResult
from rig.verdict.gates import SideKernel, Verdict
from rig.verdict.initial_state import ChunkedPrefill
from rig.verdict.metrics import request_frame, summary_frame
from rig.verdict.perf import perf_result
from rig.verdict.perf_records import PerfResult
from rig.verdict.self_check import SelfCheck
from rig.verdict.speed import SpeedDesign


@dataclass
class RunOutcome:
    """Everything a run produced; the report stage only renders it."""

    run_id: str
    run_dir: Path
    scenario_name: str
    manifest: RunManifest
    records: list[RequestRecord]
    pairs: list[PairResult]
    drift: list[DriftResult]
    server_deltas: list[ServerDelta]
    faults: list[LevelFault]
    kernels: dict[str, SideKernel]
    verdict: Verdict
    aa_pairs: list[PairResult] | None = None
    aa_drift: list[DriftResult] | None = None
    self_check: SelfCheck | None = None  # control.self_check: shown, never gated
    timings: dict[str, float] = field(default_factory=dict)
    # rig.verdict.perf.perf_result, with the A/A floor when it ran; the records' alone if not given
    perf: PerfResult | None = None
    error: str | None = None
    prompt_categories: dict[str, str] = field(default_factory=dict)  # prompt id -> category
    speed: SpeedDesign = field(default_factory=lambda: SpeedDesign(True))
    comparison: str = ""  # "A/A: ..." for a reference against itself
    load_schedule: str = ""  # when each side's timed requests ran (LoadSchedule.describe)
    reference_source: str = ""  # where the reference's results came from, when not this run
    # Each side's teacher-forced replay along the reference completions (drift.forced_positions)
    replayed: dict[str, dict[CompletionKey, list[TokenLogprob]]] = field(default_factory=dict)
    chunked_prefill: ChunkedPrefill | None = None  # each prompt's chunks at the step budget
    accuracy: AccuracyResult | None = None  # the accuracy block's paired scores
    requests: pd.DataFrame = field(init=False)  # one row per request, vllm bench's metrics
    summary: pd.DataFrame = field(init=False)  # per side, level and repeat

    def __post_init__(self) -> None:
        self.requests = request_frame(self.records)
        self.summary = summary_frame(self.records, self.pairs)
        if self.perf is None:
            self.perf = perf_result(self.records)

    @property
    def compiled_blocks(self) -> list[tuple[int, int, str]]:
        """(level, repeat, server) of the blocks in which a server compiled a kernel (its
        counters or vLLM's log said so): their time holds the compilation."""
        blocks = {(f.level, f.repeat, f.server) for f in self.faults if f.kind == JIT_COMPILE}
        blocks |= {(d.level, d.repeat, d.server) for d in self.server_deltas if d.compiled}
        return sorted(blocks)
