"""The verdict: which gates hold, and the word that goes first in every report.

Words: "identical"; "equivalent up to near-ties" (every text divergence sits at a reference
top-1/top-2 margin within the near-tie bound, drift under its threshold), with "within the A/A
noise floor" when an A/A control measured at least as many divergences; "NOT equivalent";
"INVALID" when the run cannot vouch for the kernel under test (it never ran, both sides ran
the same kernel, the reference ran another backend than requested, a prefix-cache hit skipped
prefills, or nothing was compared); and "INCOMPLETE" when the run did not complete (interrupted,
a server died) and the pairs it compared show no failure of the candidate. A failed
performance gate fails the run without changing the word.

A gate is a function of the run's Evidence (rig.verdict.evidence) that returns its Gate, or
None where it does not apply to this run (its key unset, its control not run). `decide` runs
the gates of GATES in order, which is the order every report lists them in, and takes the word
from the kinds of those that failed (rig.verdict.words.verdict_word). To add a gate:

1. write `def my_gate(evidence: Evidence) -> Gate | None` (here, or in its own verdict module
   beside the numbers it judges), with a unit test that calls it on an Evidence;
2. give Evidence a field for anything it reads that is not there yet, and have
   rig.run.conclude.run_evidence fill it;
3. add the function to GATES where its line should appear in the report; its GateKind says
   which word a failure gives (VALIDITY: INVALID, EQUIVALENCE: NOT equivalent).

The performance gate is the one exception: it judges what the speed design lets the speed
line word, and the design needs the word, so it comes after (`judge_speed`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from rig.verdict.accuracy import accuracy_gate
from rig.verdict.evidence import Evidence
from rig.verdict.initial_state import initial_state_gate
from rig.verdict.kernel_gates import kernel_proof, reference_backend
from rig.verdict.pathologies import pathologies_gate
from rig.verdict.perf_records import FASTER, HEADLINE_METRICS, NOISE, SLOWER, PerfResult
from rig.verdict.prefix_hits import conversation_hits_gate
from rig.verdict.self_check import self_check_gate
from rig.verdict.speed import SpeedDesign, apply_design
from rig.verdict.words import Counts, Gate, GateKind, Verdict, VerdictWord, verdict_word

GateRule = Callable[[Evidence], Gate | None]


def pairs_compared(evidence: Evidence) -> Gate:
    """No pair compared, nothing vouched for."""
    n = evidence.counts.pairs
    return Gate("pairs compared", n > 0, f"{n} request pairs compared", GateKind.VALIDITY)


def substantive_divergences(evidence: Evidence) -> Gate:
    c, g = evidence.counts, evidence.config
    detail = (
        f"{c.substantive} substantive (allowed {g.max_substantive_divergences}); "
        f"{c.near_tie} near-ties at margin <= {g.near_tie_margin}"
    )
    if c.reference_variant:
        detail += (
            f"; {c.reference_variant} reference variants (the candidate wrote what the reference "
            "wrote for the same prompt in another request)"
        )
    return Gate("substantive divergences", c.substantive <= g.max_substantive_divergences, detail)


def unclassified_divergences(evidence: Evidence) -> Gate:
    """Texts that part where no margin was measured: the run cannot call them near-ties or
    substantive, so it cannot pass them either."""
    unclassified = evidence.counts.unclassified
    detail = f"{unclassified} pairs differ where no measured logprob margin classifies them"
    if unclassified:
        detail += (
            " (the teacher-forced replay did not reach them: drift.enabled: false, or their "
            "replay failed); set drift.enabled: true to classify them"
        )
    return Gate("unclassified divergences", not unclassified, detail, GateKind.UNCLASSIFIED)


def pathologies(evidence: Evidence) -> Gate:
    """rig.verdict.pathologies: against the A/A control's rate where there is one."""
    e = evidence
    return pathologies_gate(e.pairs, e.aa_pairs, e.log_faults, e.config.max_pathologies)


def prefix_cache_hits(evidence: Evidence) -> Gate:
    """Hits mean some prefills never ran the kernel: nothing is vouched for. A conversation
    workload hits by design (`gates.min_prefix_cache_hits`): its gate (rig.verdict.prefix_hits)
    stands in this one's place."""
    g = evidence.config
    if g.min_prefix_cache_hits is not None:
        return conversation_hits_gate(
            evidence.reference, evidence.candidate, g.min_prefix_cache_hits
        )
    hits = evidence.prefix_cache_hits
    return Gate(
        "prefix-cache hits",
        hits <= g.max_prefix_cache_hits,
        f"{hits:g} hits (allowed {g.max_prefix_cache_hits})",
        GateKind.VALIDITY,
    )


def teacher_forced_drift(evidence: Evidence) -> Gate | None:
    """The replay's |Δlogprob| under each bound set; a failed replay fails it. None without
    a replay."""
    if not evidence.drift:
        return None
    c, g = evidence.counts, evidence.config
    bounds = (
        ("mean allowed", c.drift_mean, g.max_mean_drift),
        ("max allowed", c.drift_max, g.max_request_drift),
    )
    passed = c.drift_errors == 0
    detail = f"mean abs Δlogprob {c.drift_mean:.4f}, max {c.drift_max:.4f}"
    for words, value, bound in bounds:
        if bound is not None:
            passed = passed and value <= bound
            detail += f" ({words} {bound})"
    detail += f"; prompt positions mean {c.prompt_drift_mean:.4f}"
    if g.max_mean_prompt_drift is not None:
        passed = passed and c.prompt_drift_mean <= g.max_mean_prompt_drift
        detail += f" (allowed {g.max_mean_prompt_drift})"
    if c.drift_errors:
        detail += f"; {c.drift_errors} replays failed"
    return Gate("teacher-forced drift", passed, detail)


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


def drift_within_floor(evidence: Evidence) -> Gate | None:
    """`gates.max_drift_over_floor`: the mean drift within that many times the floor. None
    without a replay, the factor or a floor."""
    factor = evidence.config.max_drift_over_floor
    floor = drift_floor(evidence.aa_counts, evidence.config.calibration_drift)
    if not evidence.drift or floor is None or factor is None:
        return None
    drift_mean = evidence.counts.drift_mean
    ratio = drift_mean / floor.value if floor.value > 0 else math.inf
    return Gate(
        "drift within the floor",
        drift_mean <= factor * floor.value,
        f"mean drift {drift_mean:.4f} = {ratio:.2f}x the {floor.describe()} (allowed {factor:g}x)",
    )


def near_ties_beyond_aa(evidence: Evidence) -> Gate | None:
    """`gates.allow_near_ties_beyond_aa`: near-ties beyond those the A/A control measured.
    Reference variants count with them: the floor is every pair the A/A control saw differ.
    None without the control or the key."""
    aa, allowed = evidence.aa_counts, evidence.config.allow_near_ties_beyond_aa
    if aa is None or allowed < 0:
        return None
    floor = aa.pairs - aa.identical
    c = evidence.counts
    benign = c.near_tie + c.reference_variant
    named = f"{c.near_tie} near-ties" + (
        f" and {c.reference_variant} reference variants" if c.reference_variant else ""
    )
    return Gate(
        "near-ties beyond the A/A floor",
        benign - floor <= allowed,
        f"{named} vs A/A floor {floor} (allowed beyond: {allowed})",
    )


def vllm_installs(evidence: Evidence) -> Gate | None:
    """No vLLM release between the sides' installations that the scenario does not declare
    (preflight checks the probed ones; this catches containers and attached servers). None
    when both sides share one installation."""
    seen = evidence.installs
    if seen is None:
        return None
    detail = f"{seen.skew}; {seen.described}" if seen.skew else seen.described
    return Gate("vLLM installs", seen.skew is None, detail, GateKind.VALIDITY)


def initial_state(evidence: Evidence) -> Gate | None:
    """`gates.require_initial_state` (rig.verdict.initial_state)."""
    if not evidence.config.require_initial_state:
        return None
    return initial_state_gate(evidence.kernels)


def self_check(evidence: Evidence) -> Gate | None:
    """`gates.allow_self_check_beyond_aa` (rig.verdict.self_check); None when not gated."""
    allowed = evidence.config.allow_self_check_beyond_aa
    if allowed < 0:
        return None
    return self_check_gate(evidence.self_check, evidence.aa_pairs, allowed)


def graded_accuracy(evidence: Evidence) -> Gate | None:
    """rig.verdict.accuracy: a significant loss on the graded questions, where they ran."""
    return accuracy_gate(evidence.accuracy) if evidence.accuracy is not None else None


# The gates that make the word, in the order every report lists them.
GATES: tuple[GateRule, ...] = (
    pairs_compared,
    substantive_divergences,
    unclassified_divergences,
    pathologies,
    prefix_cache_hits,
    teacher_forced_drift,
    drift_within_floor,
    near_ties_beyond_aa,
    kernel_proof,
    reference_backend,
    vllm_installs,
    initial_state,
    graded_accuracy,
    self_check,
)


def decide(evidence: Evidence, gates: Sequence[GateRule] = GATES) -> Verdict:
    """Each gate that applies, in order, and the word. The performance gate comes after
    (`judge_speed`): it needs the speed design, which needs the word."""
    judged = tuple(gate for rule in gates if (gate := rule(evidence)) is not None)
    reason = evidence.proof_not_asked
    return Verdict(
        word=verdict_word(list(judged), evidence.counts, evidence.aa_counts),
        passed=all(gate.passed for gate in judged),
        gates=judged,
        counts=evidence.counts,
        aa_counts=evidence.aa_counts,
        notes=(f"No kernel proof was asked for ({reason}).",) if reason else (),
    )


def with_gate(verdict: Verdict, gate: Gate) -> Verdict:
    """The verdict with one more gate, judged after the word was known (the performance gate,
    whose kind never changes the word)."""
    gates = (*verdict.gates, gate)
    word = verdict_word(list(gates), verdict.counts, verdict.aa_counts)
    return replace(verdict, word=word, passed=verdict.passed and gate.passed, gates=gates)


def judge_speed(verdict: Verdict, evidence: Evidence, design: SpeedDesign) -> Verdict:
    """The verdict with the performance gate, where `gates.max_perf_regression_pct` is set
    and some level was timed."""
    allowed_pct, perf = evidence.config.max_perf_regression_pct, evidence.perf
    if allowed_pct is None or perf is None or not perf.levels:
        return verdict
    return with_gate(verdict, performance_gate(perf, design, allowed_pct, evidence.levels))


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


def failed_verdict(verdict: Verdict, error: str) -> Verdict:
    """The verdict of a run that did not complete: it cannot pass. Only what the candidate
    wrote in the pairs it compared (a substantive divergence) can make it NOT equivalent: the
    failed requests of a server that was stopped or died are the stop's doing, not the
    kernel's. Otherwise it is INCOMPLETE (exit 2, as for a run that could not be made),
    whichever side's server stopped it (the error names it), and says how far it got. INVALID
    stays INVALID."""
    c = verdict.counts
    compared = f"{c.pairs} pairs compared before it stopped: {c.divergences()}"
    gates = (*verdict.gates, Gate("run completed", False, f"{error.splitlines()[0]}; {compared}"))
    word = verdict.word
    diverged = word is VerdictWord.NOT_EQUIVALENT and c.substantive > 0
    if word is not VerdictWord.INVALID and not diverged:
        word = VerdictWord.INCOMPLETE
    return replace(verdict, word=word, passed=False, gates=gates)
