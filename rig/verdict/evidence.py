"""Evidence: everything the gates read about one run, in one record. rig.run.conclude assembles
it from the run's state; rig.verdict.gates.decide judges it. A gate reads this record and
nothing else, so a gate that needs something new adds a field here, and no signature changes."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

from kernels.proof import InitialStateCounts
from rig.records import RequestRecord
from rig.scenario.gates_config import GatesConfig
from rig.verdict.accuracy import AccuracyResult
from rig.verdict.compare import PairResult
from rig.verdict.drift import DriftResult
from rig.verdict.perf_records import PerfResult
from rig.verdict.self_check import SelfCheck
from rig.verdict.words import Counts


@dataclass(frozen=True)
class SideKernel:
    """Which GDN prefill kernel one side ran and how often (from the plugin's proof)."""

    side: str
    kernel: str | None
    calls: int
    detail: str = ""
    source_sha256: tuple[str, ...] = ()  # of the kernel(s) that ran: one name, two sources
    initial_state: InitialStateCounts | None = None  # None: not counted (an older proof)

    def same_kernel_as(self, other: SideKernel) -> bool:
        """The same kernel from the same source (a vLLM branch's FLA is not stock FLA)."""
        sources = bool(self.source_sha256) and bool(other.source_sha256)
        return self.kernel == other.kernel and (
            not sources or set(self.source_sha256) == set(other.source_sha256)
        )


@dataclass(frozen=True)
class InstallsSeen:
    """Two installations serve the sides: what served each (by the probe and by the servers'
    own word), and the vLLM release between them that the scenario does not declare (None:
    none). The run reads them off its plan; the verdict only judges them."""

    described: str
    skew: str | None = None


def count(
    pairs: list[PairResult], drift: list[DriftResult], prefix_cache_hits: float = 0.0
) -> Counts:
    measured = [d for d in drift if d.error is None]
    return Counts(
        pairs=len(pairs),
        identical=sum(1 for p in pairs if p.identical),
        near_tie=sum(1 for p in pairs if p.near_tie),
        substantive=sum(1 for p in pairs if p.substantive),
        pathologies=sum(len(p.gating_pathologies) for p in pairs),
        prefix_cache_hits=prefix_cache_hits,
        drift_mean=(sum(d.mean_abs for d in measured) / len(measured)) if measured else math.nan,
        drift_max=max((d.max_abs for d in measured), default=math.nan),
        drift_errors=len(drift) - len(measured),
        prompt_drift_mean=(
            sum(d.prompt_mean_abs for d in measured) / len(measured) if measured else math.nan
        ),
        unclassified=sum(1 for p in pairs if p.unclassified),
        reference_variant=sum(1 for p in pairs if p.reference_variant),
    )


@dataclass(frozen=True)
class Evidence:
    """One run, as the gates see it. `requested_kernel`: what the candidate must have run (a
    kernel's name, or vllm-<backend> for an in-tree backend; None: any but the reference's);
    `proof_not_asked`: why no kernel proof is asked for (None: it is); `reference_backend`: the
    backend the reference must have run (None: its proof is not read); `reference` and
    `candidate`: the finished records the pairs were made of; `perf`: the speed comparison
    before any design words it, over a family of `levels` levels."""

    config: GatesConfig
    pairs: list[PairResult]
    kernels: dict[str, SideKernel]
    drift: list[DriftResult] = field(default_factory=list)
    prefix_cache_hits: float = 0.0
    requested_kernel: str | None = None
    is_aa: bool = False
    log_faults: int = 0  # server-log faults that count against the pathologies gate
    aa_pairs: list[PairResult] | None = None  # None: no A/A control ran
    aa_drift: list[DriftResult] | None = None
    reference_backend: str | None = None
    proof_not_asked: str | None = None
    installs: InstallsSeen | None = None  # None: both sides share one installation
    self_check: SelfCheck | None = None  # None: the self-check did not run
    accuracy: AccuracyResult | None = None  # None: no accuracy block
    reference: list[RequestRecord] = field(default_factory=list)
    candidate: list[RequestRecord] = field(default_factory=list)
    perf: PerfResult | None = None
    levels: int = 1

    @cached_property
    def counts(self) -> Counts:
        return count(self.pairs, self.drift, self.prefix_cache_hits)

    @cached_property
    def aa_counts(self) -> Counts | None:
        return count(self.aa_pairs, self.aa_drift or []) if self.aa_pairs is not None else None
