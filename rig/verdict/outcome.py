"""RunOutcome: everything a run produced, as the verdict stage hands it to the report (which
only renders it): everything a report file shows (each block's numbers, the speed line and the
lines under the word, the prefix-cache hits by turn, the bench/ results) is computed here, once,
so that summary.md, report.html, manifest.json and the CSV files cannot disagree.
rig/run/conclude.py builds it from the run's state."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rig.manifest_record import RunManifest
from rig.records import (
    JIT_COMPILE,
    CompletionKey,
    LevelFault,
    RequestRecord,
    ServerDelta,
    TokenLogprob,
)
from rig.verdict.accuracy import ACCURACY_REPEAT, AccuracyResult
from rig.verdict.compare import PairResult
from rig.verdict.drift import DriftResult
from rig.verdict.evidence import SideKernel
from rig.verdict.initial_state import ChunkedPrefill
from rig.verdict.metrics import (
    BlockSummary,
    LevelSide,
    bench_results,
    block_summaries,
    level_sides,
)
from rig.verdict.perf import perf_result
from rig.verdict.perf_records import PerfResult
from rig.verdict.prefix_hits import TurnHits, hits_by_turn
from rig.verdict.profile_report import ProfileResult
from rig.verdict.self_check import SelfCheck
from rig.verdict.sensitivity import ProfiledShare, profiled_share
from rig.verdict.speed import SpeedDesign, speed_headline
from rig.verdict.words import Verdict


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
    profile: ProfileResult | None = None  # the profiled block's kernel tables (`profile:`)
    # Computed from the above, once: what every report file shows.
    blocks: tuple[BlockSummary, ...] = field(init=False)  # per side, level and repeat
    level_sides: tuple[LevelSide, ...] = field(init=False)  # per level and side
    speed_line: str = field(init=False)  # the speed headline (manifest.json's "speed")
    headline: tuple[str, ...] = field(init=False)  # the lines under the verdict's word
    turn_hits: tuple[TurnHits, ...] = field(init=False)  # a conversation's cached tokens
    bench: dict[str, dict] = field(init=False)  # bench/<name>: vllm bench serve's layout

    def __post_init__(self) -> None:
        if self.perf is None:
            self.perf = perf_result(self.records)
        self.blocks = block_summaries(self.records, self.pairs)
        self.level_sides = level_sides(self.blocks)
        self.speed_line = speed_headline(self.perf, self.speed)
        self.headline = self._headline()
        self.turn_hits = tuple(hits_by_turn(self.records))
        timed = [r for r in self.records if r.task is None]  # no graded question is timed
        timed_blocks = tuple(b for b in self.blocks if b.repeat != ACCURACY_REPEAT)
        self.bench = bench_results(timed, timed_blocks, self.manifest)

    def _headline(self) -> tuple[str, ...]:
        """The speed line, what the kernel's own time (and the profiled share) predicts, the kind of
        comparison, the reference's source, the candidate self-check: under the word."""
        predicted = (lc.sensitivity for lc in self.perf.candidate)
        texts = (
            self.speed_line,
            *(found.describe() for found in predicted if found is not None),
            self.profiled_share.describe() if self.profiled_share is not None else "",
            f"timing: {self.load_schedule}" if self.load_schedule else "",
            self.comparison,
            self.reference_source,
            self.self_check.describe() if self.self_check is not None else "",
        )
        return tuple(text for text in texts if text)

    @property
    def profiled_share(self) -> ProfiledShare | None:
        """What the profiled GDN share predicts at its level, beside what was measured."""
        return profiled_share(self.profile, self.perf)

    @property
    def compiled_blocks(self) -> list[tuple[int, int, str]]:
        """(level, repeat, server) of the blocks in which a server compiled a kernel (its
        counters or vLLM's log said so): their time holds the compilation."""
        blocks = {(f.level, f.repeat, f.server) for f in self.faults if f.kind == JIT_COMPILE}
        blocks |= {(d.level, d.repeat, d.server) for d in self.server_deltas if d.compiled}
        return sorted(blocks)
