"""The verdict: which gates hold, and the word that goes first in every report.

Words: "identical"; "equivalent up to near-ties" (every text divergence sits at a reference
top-1/top-2 margin within the near-tie bound, drift under its threshold), with "within the A/A
noise floor" when an A/A control measured at least as many divergences; "NOT equivalent";
"INVALID" when the run cannot vouch for the kernel under test (it never ran, both sides ran
the same kernel, the reference ran another backend than requested, a prefix-cache hit skipped
prefills, or nothing was compared); and "INCOMPLETE" when the run did not complete (interrupted,
a server died) and the pairs it compared show no failure of the candidate. A failed
performance gate fails the run without changing the word.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from kernels.backends import CPU_NATIVE, reference_kernel_name
from kernels.proof import InitialStateCounts
from rig.records import ExitCode, Side
from rig.scenario.gates_config import GatesConfig
from rig.verdict.compare import PairResult
from rig.verdict.drift import DriftResult
from rig.verdict.pathologies import pathologies_gate
from rig.verdict.perf_records import FASTER, HEADLINE_METRICS, NOISE, SLOWER, PerfResult
from rig.verdict.speed import SpeedDesign, apply_design
from rig.verdict.words import Gate, GateKind, VerdictWord


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
class Counts:
    pairs: int
    identical: int
    near_tie: int
    substantive: int
    pathologies: int
    prefix_cache_hits: float
    drift_mean: float
    drift_max: float
    drift_errors: int
    prompt_drift_mean: float = math.nan
    unclassified: int = 0


@dataclass(frozen=True)
class Verdict:
    word: VerdictWord
    passed: bool
    gates: tuple[Gate, ...]
    counts: Counts
    aa_counts: Counts | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def failed_gates(self) -> list[Gate]:
        return [gate for gate in self.gates if not gate.passed]

    def exit_code(self, error: str | None = None) -> ExitCode:
        """The run's exit code: 2 when it did not complete, else what the verdict says."""
        if error is not None or self.word is VerdictWord.INCOMPLETE:
            return ExitCode.ERROR
        if self.passed:
            return ExitCode.PASS
        undecided = (VerdictWord.INVALID, VerdictWord.UNCLASSIFIED)
        return ExitCode.INVALID if self.word in undecided else ExitCode.FAILED


def count(
    pairs: list[PairResult], drift: list[DriftResult], prefix_cache_hits: float = 0.0
) -> Counts:
    near = sum(1 for p in pairs if p.near_tie)
    substantive = sum(1 for p in pairs if p.substantive)
    unclassified = sum(1 for p in pairs if p.unclassified)
    gating = sum(len(p.gating_pathologies) for p in pairs)
    measured = [d for d in drift if d.error is None]
    return Counts(
        pairs=len(pairs),
        identical=sum(1 for p in pairs if p.identical),
        near_tie=near,
        substantive=substantive,
        pathologies=gating,
        prefix_cache_hits=prefix_cache_hits,
        drift_mean=(sum(d.mean_abs for d in measured) / len(measured)) if measured else math.nan,
        drift_max=max((d.max_abs for d in measured), default=math.nan),
        drift_errors=len(drift) - len(measured),
        prompt_drift_mean=(
            sum(d.prompt_mean_abs for d in measured) / len(measured) if measured else math.nan
        ),
        unclassified=unclassified,
    )


def _kernel_gate(kernels: dict[str, SideKernel], requested: str | None, is_aa: bool) -> Gate:
    ref, cand = kernels.get(Side.REFERENCE), kernels.get(Side.CANDIDATE)
    if ref is None or cand is None:
        return Gate(
            "candidate kernel active",
            False,
            "no kernel proof for one of the sides",
            GateKind.VALIDITY,
        )
    seen = (
        f"candidate ran {cand.kernel} ({cand.calls} calls), "
        f"reference ran {ref.kernel} ({ref.calls} calls)"
    )
    if is_aa:
        ok = ref.kernel == cand.kernel
        return Gate("candidate kernel active", ok, f"A/A run: {seen}", GateKind.VALIDITY)
    same = cand.same_kernel_as(ref)
    if requested is not None and cand.kernel != requested:
        why = "the candidate kernel never served" + (
            " (both sides ran the same kernel)" if same else ""
        )
        return Gate(
            "candidate kernel active",
            False,
            f"candidate asked for {requested} but {seen}: {why}",
            GateKind.VALIDITY,
        )
    if cand.calls <= 0:
        return Gate(
            "candidate kernel active",
            False,
            f"{seen}: no prefill call reached it",
            GateKind.VALIDITY,
        )
    if same:
        return Gate(
            "candidate kernel active",
            False,
            f"both sides ran the same kernel: {seen} (comparing two vLLM installs or another "
            "op? set gates.require_candidate_kernel: false or candidate.proof: none)",
            GateKind.VALIDITY,
        )
    if ref.kernel == cand.kernel:
        hashes = (", ".join(h[:12] for h in k.source_sha256) for k in (cand, ref))
        seen += ", from other sources (candidate {}, reference {})".format(*hashes)
    return Gate("candidate kernel active", True, seen, GateKind.VALIDITY)


def _no_proof_gate(kernels: dict[str, SideKernel], reason: str) -> Gate:
    """A run that asks for no kernel proof (another op, two vLLM versions) is valid, and says
    so: its verdict is about the served text, not about which kernel ran."""
    seen = "; ".join(f"{k.side} ran {k.kernel} ({k.calls} calls)" for k in kernels.values())
    detail = f"no kernel proof was asked for ({reason})" + (f"; seen: {seen}" if seen else "")
    return Gate("kernel proof", True, detail, GateKind.VALIDITY)


# vLLM's CPU build has one GDN prefill op and ignores the backend asked for.
CPU_REFERENCE = reference_kernel_name(CPU_NATIVE)


def _reference_backend_gate(kernels: dict[str, SideKernel], backend: str, is_aa: bool) -> Gate:
    """The reference must be the backend the scenario asked for (FLA's Triton by default): on
    an H200, vLLM's own default is FlashInfer, and a fallback would silently change the
    yardstick."""
    wanted = reference_kernel_name(backend)
    sides = (Side.REFERENCE, Side.CANDIDATE) if is_aa else (Side.REFERENCE,)
    ran = {side: kernels[side].kernel for side in sides if side in kernels}
    wrong = {side: k for side, k in ran.items() if k not in (wanted, CPU_REFERENCE)}
    seen = ", ".join(f"{side} ran {kernel}" for side, kernel in ran.items()) or "no proof"
    detail = f"requested {backend} ({wanted}); {seen}"
    return Gate("reference backend", not wrong, detail, GateKind.VALIDITY)


def decide(
    gates_config: GatesConfig,
    pairs: list[PairResult],
    drift: list[DriftResult],
    prefix_cache_hits: float,
    kernels: dict[str, SideKernel],
    requested_kernel: str | None,
    is_aa: bool,
    log_faults: int = 0,
    aa_pairs: list[PairResult] | None = None,
    aa_drift: list[DriftResult] | None = None,
    reference_backend: str | None = None,
    proof_not_asked: str | None = None,
    extra_gates: tuple[Gate, ...] = (),
    prefix_gate: Gate | None = None,
) -> Verdict:
    """The gates and the word. `requested_kernel`: what the candidate must have run (a kernel's
    name, or vllm-<backend> for an in-tree backend); `proof_not_asked`: why no kernel proof is
    asked for, rig.run.conclude.proof_not_asked's one reading of the scenario (None: asked);
    `prefix_gate`: a conversation workload's (rig.verdict.prefix_hits), in place of "no hit".
    The performance gate comes after (`with_gate`): it needs the speed design, which needs
    the word."""
    counts = count(pairs, drift, prefix_cache_hits)
    aa_counts = count(aa_pairs, aa_drift or []) if aa_pairs is not None else None
    g = gates_config
    gates = [
        Gate(
            "pairs compared",
            counts.pairs > 0,
            f"{counts.pairs} request pairs compared",
            GateKind.VALIDITY,
        ),
        Gate(
            "substantive divergences",
            counts.substantive <= g.max_substantive_divergences,
            f"{counts.substantive} substantive (allowed {g.max_substantive_divergences}); "
            f"{counts.near_tie} near-ties at margin <= {g.near_tie_margin}",
        ),
        _unclassified_gate(counts.unclassified),
        pathologies_gate(pairs, aa_pairs, log_faults, g.max_pathologies),
        prefix_gate
        or Gate(
            "prefix-cache hits",
            prefix_cache_hits <= g.max_prefix_cache_hits,
            f"{prefix_cache_hits:g} hits (allowed {g.max_prefix_cache_hits})",
            # Prefix-cache hits mean some prefills never ran the kernel: nothing is vouched for.
            GateKind.VALIDITY,
        ),
    ]
    if drift:
        drift_ok = counts.drift_errors == 0
        detail = f"mean abs Δlogprob {counts.drift_mean:.4f}, max {counts.drift_max:.4f}"
        if g.max_mean_drift is not None:
            drift_ok = drift_ok and counts.drift_mean <= g.max_mean_drift
            detail += f" (mean allowed {g.max_mean_drift})"
        if g.max_request_drift is not None:
            drift_ok = drift_ok and counts.drift_max <= g.max_request_drift
            detail += f" (max allowed {g.max_request_drift})"
        detail += f"; prompt positions mean {counts.prompt_drift_mean:.4f}"
        if g.max_mean_prompt_drift is not None:
            drift_ok = drift_ok and counts.prompt_drift_mean <= g.max_mean_prompt_drift
            detail += f" (allowed {g.max_mean_prompt_drift})"
        if counts.drift_errors:
            detail += f"; {counts.drift_errors} replays failed"
        gates.append(Gate("teacher-forced drift", drift_ok, detail))
    floor = drift_floor(aa_counts, g.calibration_drift)
    if drift and floor is not None and g.max_drift_over_floor is not None:
        gates.append(_drift_floor_gate(counts.drift_mean, floor, g.max_drift_over_floor))
    if aa_counts is not None and g.allow_near_ties_beyond_aa >= 0:
        floor = aa_counts.pairs - aa_counts.identical
        beyond = counts.near_tie - floor
        gates.append(
            Gate(
                "near-ties beyond the A/A floor",
                beyond <= g.allow_near_ties_beyond_aa,
                f"{counts.near_tie} near-ties vs A/A floor {floor} "
                f"(allowed beyond: {g.allow_near_ties_beyond_aa})",
            )
        )
    if proof_not_asked is None:
        gates.append(_kernel_gate(kernels, requested_kernel, is_aa))
    else:
        gates.append(_no_proof_gate(kernels, proof_not_asked))
    if reference_backend is not None and kernels:
        gates.append(_reference_backend_gate(kernels, reference_backend, is_aa))
    gates += extra_gates
    passed = all(gate.passed for gate in gates)
    word = verdict_word(gates, counts, aa_counts)
    notes = (f"No kernel proof was asked for ({proof_not_asked}).",) if proof_not_asked else ()
    return Verdict(
        word=word,
        passed=passed,
        gates=tuple(gates),
        counts=counts,
        aa_counts=aa_counts,
        notes=notes,
    )


def _unclassified_gate(unclassified: int) -> Gate:
    """Texts that part where no margin was measured: the run cannot call them near-ties or
    substantive, so it cannot pass them either."""
    detail = f"{unclassified} pairs differ where no measured logprob margin classifies them"
    if unclassified:
        detail += (
            " (the teacher-forced replay did not reach them: drift.enabled: false, or their "
            "replay failed); set drift.enabled: true to classify them"
        )
    return Gate("unclassified divergences", not unclassified, detail, GateKind.UNCLASSIFIED)


def with_gate(verdict: Verdict, gate: Gate) -> Verdict:
    """The verdict with one more gate, judged after the word was known (the performance gate,
    whose kind never changes the word)."""
    gates = (*verdict.gates, gate)
    word = verdict_word(list(gates), verdict.counts, verdict.aa_counts)
    return replace(verdict, word=word, passed=verdict.passed and gate.passed, gates=gates)


def performance_gate(
    perf: PerfResult, design: SpeedDesign, allowed_pct: float, levels: int
) -> Gate:
    """`gates.max_perf_regression_pct` on what the speed line words and nothing else: no
    judgement where the design gives no word (a golden-cache reference, one block, an
    interrupted run, outputs that differ) or in an A/A run (a change there is no kernel's);
    else the headline metrics worded faster, slower or within noise at a level, failing only
    where a whole interval, at the family-wise level of `levels` levels, is more than the
    allowed regression slower: a point estimate inside the noise never fails a run."""
    if not design.measured:
        return Gate(
            "performance", True, f"nothing judged: speed {design.reason}", GateKind.PERFORMANCE
        )
    if design.aa_run:
        why = "nothing judged: an A/A run, whose changes are no kernel's (A/A asymmetry)"
        return Gate("performance", True, why, GateKind.PERFORMANCE)
    worded = [
        compared
        for level in apply_design(perf, design).candidate
        for compared in level.metrics
        if compared.metric in HEADLINE_METRICS
        and compared.word in (FASTER, SLOWER, NOISE)
        and compared.interval is not None
    ]
    family = design.describe(levels)
    if not worded:
        why = f"nothing judged: no headline metric has a speed word at any level ({family})"
        return Gate("performance", True, why, GateKind.PERFORMANCE)
    worst = max(worded, key=lambda compared: compared.least_slowdown_pct)
    slowdown = worst.least_slowdown_pct
    return Gate(
        "performance",
        not slowdown > allowed_pct,
        f"worst: {worst.metric} at C={worst.level}, {slowdown:+.2f}% slower at its interval's "
        f"better bound (fails above {allowed_pct:g}%; {family})",
        GateKind.PERFORMANCE,
    )


@dataclass(frozen=True)
class DriftFloor:
    """The drift a correct kernel may show: the larger of what identical kernels measured under
    other batch compositions (this run's A/A control) and what a known-correct other kernel
    measured against the reference (gates.calibration_drift, from a calibration run)."""

    aa: float | None
    calibration: float | None

    @property
    def value(self) -> float:
        return max(v for v in (self.aa, self.calibration) if v is not None)

    def describe(self) -> str:
        aa = "not measured" if self.aa is None else f"{self.aa:.4f}"
        calibration = "not given" if self.calibration is None else f"{self.calibration:.4f}"
        return f"floor {self.value:.4f} = max(A/A {aa}, calibration {calibration})"


def drift_floor(aa_counts: Counts | None, calibration: float | None) -> DriftFloor | None:
    """None when neither source is there; an A/A whose replays all failed does not count."""
    aa = aa_counts.drift_mean if aa_counts is not None else None
    if aa is not None and math.isnan(aa):
        aa = None
    if aa is None and calibration is None:
        return None
    return DriftFloor(aa, calibration)


def _drift_floor_gate(drift_mean: float, floor: DriftFloor, factor: float) -> Gate:
    passed = drift_mean <= factor * floor.value
    ratio = drift_mean / floor.value if floor.value > 0 else math.inf
    return Gate(
        "drift within the floor",
        passed,
        f"mean drift {drift_mean:.4f} = {ratio:.2f}x the {floor.describe()} (allowed {factor:g}x)",
    )


def verdict_word(gates: list[Gate], counts: Counts, aa_counts: Counts | None) -> VerdictWord:
    """The word, from the kinds of the gates that failed and, when none did, the counts."""
    failed = {gate.kind for gate in gates if not gate.passed}
    if GateKind.VALIDITY in failed:
        return VerdictWord.INVALID
    if GateKind.EQUIVALENCE in failed:
        return VerdictWord.NOT_EQUIVALENT
    if GateKind.UNCLASSIFIED in failed:
        return VerdictWord.UNCLASSIFIED
    if counts.identical == counts.pairs and counts.pairs > 0:
        return VerdictWord.IDENTICAL
    if aa_counts is not None and counts.near_tie <= aa_counts.pairs - aa_counts.identical:
        return VerdictWord.NEAR_TIES_IN_FLOOR
    return VerdictWord.NEAR_TIES
