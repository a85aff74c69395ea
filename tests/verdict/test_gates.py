import math
from dataclasses import replace

import pytest

from rig.records import ExitCode
from rig.scenario.gates_config import GatesConfig
from rig.verdict.accuracy import accuracy_result
from rig.verdict.compare import Divergence, PairResult, Pathology
from rig.verdict.drift import DriftResult
from rig.verdict.evidence import Evidence, InstallsSeen, SideKernel, count
from rig.verdict.gates import (
    GATES,
    decide,
    drift_within_floor,
    failed_verdict,
    initial_state,
    judge_speed,
    near_ties_beyond_aa,
    pairs_compared,
    pathologies,
    performance_gate,
    prefix_cache_hits,
    self_check,
    substantive_divergences,
    teacher_forced_drift,
    unclassified_divergences,
    vllm_installs,
    with_gate,
)
from rig.verdict.perf_records import NOISE, SLOWER, UNEQUAL, Comparison, Metric, PerfResult
from rig.verdict.self_check import SelfCheck
from rig.verdict.speed import SpeedDesign, speed_design
from rig.verdict.words import Counts, Gate, GateKind, Verdict, VerdictWord, verdict_word
from tests.perf_builders import changed, perf_level

KERNELS = {
    "reference": SideKernel("reference", "fla", 12),
    "candidate": SideKernel("candidate", "ns4", 12),
}


def pair(
    request_id: str = "q0",
    kind: str | None = None,
    pathologies: tuple[Pathology, ...] = (),
    answered: bool = True,
) -> PairResult:
    """identical when kind is None and both sides answered; else a divergence of that kind."""
    divergence = None
    if kind is not None:
        divergence = Divergence(
            char_index=3,
            token_index=1,
            reference_excerpt="abc",
            candidate_excerpt="abd",
            reference_margin=0.1,
            kind=kind,
        )
    return PairResult(
        request_id=request_id,
        prompt_id="p",
        level=1,
        repeat=0,
        index=0,
        identical=answered and kind is None,
        divergence=divergence,
        pathologies=pathologies,
    )


def identical(n: int) -> list[PairResult]:
    return [pair(f"q{i}") for i in range(n)]


def drift(mean: float, maximum: float | None = None, error: str | None = None) -> DriftResult:
    peak = mean if maximum is None else maximum
    return DriftResult("p", 4, peak, mean, peak, 0.0, 0.0, 0, error)


def verdict(
    pairs,
    drift_results=(),
    *,
    hits=0.0,
    kernels=KERNELS,
    requested="ns4",
    is_aa=False,
    gates=None,
    **kwargs,
):
    """decide() on the Evidence of these pairs and drift; kwargs are Evidence's fields."""
    return decide(
        Evidence(
            config=gates or GatesConfig(),
            pairs=list(pairs),
            kernels=kernels,
            drift=list(drift_results),
            prefix_cache_hits=hits,
            requested_kernel=requested,
            is_aa=is_aa,
            **kwargs,
        )
    )


def gate(result, name: str):
    (found,) = [g for g in result.gates if g.name == name]
    return found


def gate_names(result) -> set[str]:
    return {g.name for g in result.gates}


# --- the words ---------------------------------------------------------------------------------


def test_all_identical_passes_as_identical():
    result = verdict(identical(5), [drift(0.01)])
    assert result.word == "identical"
    assert result.passed
    assert result.failed_gates == []
    assert (result.counts.pairs, result.counts.identical) == (5, 5)


def test_near_ties_pass_as_equivalent_up_to_near_ties():
    result = verdict(identical(3) + [pair("t", "near_tie")], [drift(0.01)])
    assert result.word == "equivalent up to near-ties"
    assert result.passed
    assert result.counts.near_tie == 1


def test_reference_variants_pass_under_their_own_word():
    result = verdict(identical(3) + [pair("v", "reference_variant")], [drift(0.01)])
    assert result.word == "equivalent up to the reference's own variation"
    assert result.passed and result.exit_code() == ExitCode.PASS
    assert (result.counts.reference_variant, result.counts.substantive) == (1, 0)
    assert "1 reference variants" in gate(result, "substantive divergences").detail
    both = verdict([pair("v", "reference_variant"), pair("t", "near_tie")], [drift(0.01)])
    assert both.word == "equivalent up to near-ties and the reference's own variation"


def test_a_substantive_divergence_beside_reference_variants_is_not_equivalent():
    result = verdict([pair("v", "reference_variant"), pair("s", "substantive")])
    assert result.word == "NOT equivalent" and not result.passed


def test_substantive_divergence_is_not_equivalent():
    result = verdict(identical(3) + [pair("s", "substantive")])
    assert result.word == "NOT equivalent"
    assert not result.passed
    assert [g.name for g in result.failed_gates] == ["substantive divergences"]


def test_an_unclassified_divergence_is_neither_substantive_nor_a_pass():
    result = verdict([pair("u", "unclassified"), pair("q")])
    assert (result.counts.substantive, result.counts.unclassified) == (0, 1)
    assert result.word == "text differs, unclassified" and not result.passed
    assert result.exit_code() == ExitCode.INVALID
    failed = gate(result, "unclassified divergences")
    assert not failed.passed and "set drift.enabled: true" in failed.detail
    assert gate(result, "substantive divergences").passed


def test_a_substantive_divergence_beside_unclassified_ones_is_not_equivalent():
    result = verdict([pair("u", "unclassified"), pair("s", "substantive")])
    assert result.word == "NOT equivalent" and result.exit_code() == ExitCode.FAILED


def test_candidate_kernel_never_run_is_invalid():
    kernels = {**KERNELS, "candidate": SideKernel("candidate", "ns4", 0)}
    result = verdict(identical(3), kernels=kernels)
    assert result.word == "INVALID"
    assert not result.passed
    assert "no prefill call" in gate(result, "candidate kernel active").detail


def test_candidate_serving_another_kernel_than_requested_is_invalid():
    kernels = {**KERNELS, "candidate": SideKernel("candidate", "fla", 12)}
    result = verdict(identical(3), kernels=kernels, requested="ns4")
    assert result.word == "INVALID"
    assert "never served" in gate(result, "candidate kernel active").detail


def test_both_sides_running_the_same_kernel_is_invalid():
    kernels = {
        "reference": SideKernel("reference", "ns4", 12),
        "candidate": SideKernel("candidate", "ns4", 12),
    }
    result = verdict(identical(3), kernels=kernels, requested=None)
    assert result.word == "INVALID"
    assert "same kernel" in gate(result, "candidate kernel active").detail


def test_missing_kernel_proof_is_invalid():
    result = verdict(identical(3), kernels={"reference": KERNELS["reference"]})
    assert result.word == "INVALID"


def test_invalid_beats_not_equivalent():
    kernels = {**KERNELS, "candidate": SideKernel("candidate", "ns4", 0)}
    result = verdict([pair("s", "substantive")], kernels=kernels)
    assert result.word == "INVALID"


def test_aa_run_passes_with_the_same_kernel_on_both_sides():
    kernels = {
        "reference": SideKernel("reference", "fla", 12),
        "candidate": SideKernel("candidate", "fla", 12),
    }
    result = verdict(identical(3), kernels=kernels, requested=None, is_aa=True)
    assert result.passed
    assert result.word == "identical"
    assert gate(result, "candidate kernel active").passed
    assert "A/A" in gate(result, "candidate kernel active").detail


def test_aa_run_with_different_kernels_is_invalid():
    result = verdict(identical(3), requested=None, is_aa=True)
    assert result.word == "INVALID"


def test_kernel_gate_can_be_switched_off():
    off = "gates.require_candidate_kernel: false"
    result = verdict(identical(2), kernels={}, proof_not_asked=off)
    assert "candidate kernel active" not in gate_names(result)
    assert result.passed


# --- gates -------------------------------------------------------------------------------------


def test_substantive_divergences_within_the_allowance_pass():
    gates = GatesConfig(max_substantive_divergences=1)
    result = verdict([pair("s", "substantive"), pair("q")], gates=gates)
    assert gate(result, "substantive divergences").passed
    assert result.passed


def test_candidate_only_pathology_fails():
    sick = Pathology("candidate", "empty_output", "finish_reason=stop", candidate_only=True)
    result = verdict([pair("q", pathologies=(sick,))])
    assert not gate(result, "pathologies").passed
    assert result.word == "NOT equivalent"
    assert result.counts.pathologies == 1


def test_pathology_shared_with_the_reference_does_not_fail():
    shared = (
        Pathology("reference", "repetition_loop", "period 1", candidate_only=False),
        Pathology("candidate", "repetition_loop", "period 1", candidate_only=False),
    )
    result = verdict([pair("q", pathologies=shared)])
    assert gate(result, "pathologies").passed
    assert result.counts.pathologies == 0


def test_transport_error_on_either_side_fails():
    timeout = Pathology("reference", "timeout", "timeout: slow", candidate_only=False)
    result = verdict([pair("q", pathologies=(timeout,), answered=False)])
    assert not gate(result, "pathologies").passed
    assert result.counts.pathologies == 1
    assert result.counts.identical == 0


def test_server_log_faults_fail_the_pathology_gate():
    result = verdict(identical(2), log_faults=1)
    assert not gate(result, "pathologies").passed
    assert "1 server-log faults" in gate(result, "pathologies").detail
    assert verdict(identical(2), log_faults=1, gates=GatesConfig(max_pathologies=1)).passed


def test_prefix_cache_hits_fail():
    result = verdict(identical(2), hits=3.0)
    assert not gate(result, "prefix-cache hits").passed
    assert not result.passed
    assert verdict(identical(2), hits=3.0, gates=GatesConfig(max_prefix_cache_hits=3)).passed


def test_drift_under_the_threshold_passes_and_over_it_fails():
    gates = GatesConfig(max_mean_drift=0.1)
    calm = verdict(identical(2), [drift(0.05), drift(0.10)], gates=gates)
    assert calm.counts.drift_mean == pytest.approx(0.075)
    assert gate(calm, "teacher-forced drift").passed
    moved = verdict(identical(2), [drift(0.05), drift(0.25)], gates=gates)
    assert moved.counts.drift_mean == pytest.approx(0.15)
    assert not gate(moved, "teacher-forced drift").passed
    assert moved.word == "NOT equivalent"


def test_per_request_drift_bound():
    gates = GatesConfig(max_mean_drift=None, max_request_drift=0.5)
    assert verdict(identical(1), [drift(0.01, maximum=0.4)], gates=gates).passed
    result = verdict(identical(1), [drift(0.01, maximum=0.6)], gates=gates)
    assert result.counts.drift_max == pytest.approx(0.6)
    assert not gate(result, "teacher-forced drift").passed


def test_failed_replay_fails_the_drift_gate():
    result = verdict(identical(1), [drift(0.01), drift(math.nan, error="RuntimeError: 500")])
    assert result.counts.drift_errors == 1
    assert result.counts.drift_mean == pytest.approx(0.01)  # failures are not averaged in
    assert not gate(result, "teacher-forced drift").passed
    assert "1 replays failed" in gate(result, "teacher-forced drift").detail


def test_all_replays_failed_fails_the_drift_gate():
    result = verdict(identical(1), [drift(math.nan, error="down")])
    assert math.isnan(result.counts.drift_mean)
    assert not gate(result, "teacher-forced drift").passed


def test_no_drift_results_no_drift_gate():
    assert "teacher-forced drift" not in gate_names(verdict(identical(1)))


def aa_pairs(total: int, differing: int) -> list[PairResult]:
    return identical(total - differing) + [pair(f"a{i}", "near_tie") for i in range(differing)]


def test_near_ties_within_the_aa_floor():
    result = verdict(
        identical(8) + [pair("t0", "near_tie"), pair("t1", "near_tie")], aa_pairs=aa_pairs(10, 2)
    )
    assert result.aa_counts.pairs == 10 and result.aa_counts.identical == 8
    assert result.word == "equivalent up to near-ties within the A/A noise floor"
    assert result.passed


def test_near_ties_beyond_the_aa_floor_gate():
    pairs = identical(7) + [pair(f"t{i}", "near_tie") for i in range(3)]
    gates = GatesConfig(allow_near_ties_beyond_aa=0)
    over = verdict(pairs, aa_pairs=aa_pairs(10, 2), gates=gates)
    assert not gate(over, "near-ties beyond the A/A floor").passed
    assert not over.passed
    assert over.word == "NOT equivalent"  # more near-ties than the A/A floor allows
    within = verdict(
        pairs, aa_pairs=aa_pairs(10, 2), gates=GatesConfig(allow_near_ties_beyond_aa=1)
    )
    assert gate(within, "near-ties beyond the A/A floor").passed


def test_aa_floor_gate_is_off_by_default():
    pairs = [pair(f"t{i}", "near_tie") for i in range(5)]
    result = verdict(pairs, aa_pairs=aa_pairs(10, 0))
    assert "near-ties beyond the A/A floor" not in gate_names(result)
    assert result.passed


FLOOR_GATE = "drift within the floor"


@pytest.mark.parametrize(
    ("aa_mean", "calibration", "floor", "names"),
    [
        (0.011, 0.0139, 0.0139, "A/A 0.0110, calibration 0.0139"),
        (0.02, 0.0139, 0.02, "A/A 0.0200, calibration 0.0139"),
        (0.0, 0.0139, 0.0139, "A/A 0.0000, calibration 0.0139"),
        (None, 0.0139, 0.0139, "A/A not measured, calibration 0.0139"),
        (0.011, None, 0.011, "A/A 0.0110, calibration not given"),
    ],
)
def test_the_drift_floor_is_the_larger_of_aa_and_calibration(aa_mean, calibration, floor, names):
    gates = GatesConfig(calibration_drift=calibration, max_drift_over_floor=2.0)
    aa = {} if aa_mean is None else {"aa_pairs": aa_pairs(4, 0), "aa_drift": [drift(aa_mean)]}
    inside = verdict(identical(4), [drift(floor * 1.9)], gates=gates, **aa)
    assert gate(inside, FLOOR_GATE).passed and inside.passed
    assert f"floor {floor:.4f} = max({names})" in gate(inside, FLOOR_GATE).detail
    assert "= 1.90x the floor" in gate(inside, FLOOR_GATE).detail
    beyond = verdict(identical(4), [drift(floor * 2.1)], gates=gates, **aa)
    assert not gate(beyond, FLOOR_GATE).passed
    assert beyond.word == "NOT equivalent"


def test_a_zero_floor_admits_only_zero_drift():
    gates = GatesConfig(max_drift_over_floor=3.0)
    aa = {"aa_pairs": aa_pairs(4, 0), "aa_drift": [drift(0.0)]}
    assert gate(verdict(identical(4), [drift(0.0)], gates=gates, **aa), FLOOR_GATE).passed
    failed = gate(verdict(identical(4), [drift(1e-4)], gates=gates, **aa), FLOOR_GATE)
    assert not failed.passed and "infx" in failed.detail


def test_no_floor_gate_without_its_factor_or_without_a_floor():
    aa = {"aa_pairs": aa_pairs(4, 0), "aa_drift": [drift(0.01)]}
    unset = verdict(identical(4), [drift(0.5)], gates=GatesConfig(calibration_drift=0.01), **aa)
    assert FLOOR_GATE not in gate_names(unset)
    no_floor = verdict(identical(4), [drift(0.5)], gates=GatesConfig(max_drift_over_floor=2.0))
    assert FLOOR_GATE not in gate_names(no_floor)


def changes(level: int, points: dict, comparison=Comparison.CANDIDATE, word: str = NOISE):
    """A level whose metrics changed by (point, low, high) percent, each with `word`."""
    metrics = [
        changed(level, m, point, (low, high), word) for m, (point, low, high) in points.items()
    ]
    return perf_level(level, *metrics, comparison=comparison)


MEASURED = SpeedDesign(True)
GATE = "performance"


def test_performance_gate_compares_the_interval_not_the_point():
    """C=4's TTFT is 8% slower at the point but its interval reaches +3%: only a bound past
    the allowed regression fails. Throughput is oriented the other way; output throughput is
    no headline metric, so its -30% is not judged."""
    deltas = PerfResult(
        (
            changes(1, {Metric.MEAN_TTFT: (1, -1, 2), Metric.TOTAL_TOKEN_THROUGHPUT: (0, -1, 1)}),
            changes(
                4,
                {
                    Metric.MEAN_TTFT: (8, 3, 13),
                    Metric.TOTAL_TOKEN_THROUGHPUT: (-9, -12, -6),
                    Metric.OUTPUT_THROUGHPUT: (-30, -35, -25),
                },
            ),
        )
    )
    failing = performance_gate(deltas, MEASURED, 5, levels=2)
    assert not failing.passed and failing.kind is GateKind.PERFORMANCE
    assert failing.detail == (
        "worst: total_token_throughput at C=4, +6.00% slower at its interval's better bound "
        "(fails above 5%; family-wise 95% over 4 metrics x 2 level(s), each interval at 99.38%)"
    )
    assert performance_gate(deltas, MEASURED, 7, levels=2).passed  # the point alone would fail
    assert GATE not in gate_names(verdict(identical(1)))  # decide() never adds it


def test_performance_gate_judges_nothing_the_speed_line_gives_no_word():
    """A golden-cache reference (or one block, an interrupted run, outputs that differ) gives
    no speed word, and an A/A run's changes are no kernel's: a 50% slowdown passes, and the
    detail says why nothing was judged."""
    slow = PerfResult((changes(1, {Metric.MEAN_TTFT: (50, 40, 60)}, word=SLOWER),))
    golden = speed_design(3, "first", "2026-12-01T00:00:00Z")
    cached = performance_gate(slow, golden, 5, levels=1)
    assert cached.passed
    assert cached.detail.startswith(
        "nothing judged: speed not comparable (reference from the golden cache: run first"
    )
    one_block = performance_gate(slow, speed_design(1, None), 5, levels=1)
    assert one_block.passed and "not measured (single run" in one_block.detail
    aa = performance_gate(slow, speed_design(3, None, aa_run=True), 5, levels=1)
    assert aa.passed and "A/A run" in aa.detail
    assert not performance_gate(slow, speed_design(3, None), 5, levels=1).passed


def test_performance_gate_skips_a_level_whose_work_differs():
    unequal = PerfResult((changes(1, {Metric.MEAN_TTFT: (50, 40, 60)}, word=UNEQUAL),))
    gate_ = performance_gate(unequal, MEASURED, 5, levels=1)
    assert gate_.passed and gate_.detail.startswith("nothing judged: no headline metric")
    assert "each interval at 98.75%" in gate_.detail


def test_a_gate_added_after_the_word_keeps_the_word_and_fails_the_run():
    passed = verdict(identical(2))
    slower = with_gate(passed, Gate(GATE, False, "slower", GateKind.PERFORMANCE))
    assert (slower.word, slower.passed) == ("identical", False)
    assert slower.exit_code() == ExitCode.FAILED
    assert with_gate(passed, Gate(GATE, True, "ok", GateKind.PERFORMANCE)).passed


def test_prefix_cache_hits_make_the_run_invalid():
    """A hit means some prefill never ran the kernel under test: the run vouches for nothing."""
    result = verdict(identical(3), hits=1.0)
    assert result.word == "INVALID"


def test_nothing_compared_is_invalid():
    result = verdict([])
    assert not gate(result, "pairs compared").passed
    assert result.word == "INVALID"
    assert not result.passed


def test_prompt_position_drift_gate():
    """Forced prompt positions show kernel error that wide completion margins hide."""
    noisy = DriftResult("p", 8, 0.0, 0.0, 0.0, 2.0, 0.6, 0)
    gates = GatesConfig(max_mean_prompt_drift=0.25)
    result = verdict(identical(1), [noisy], gates=gates)
    assert not gate(result, "teacher-forced drift").passed
    assert result.word == "NOT equivalent"
    assert verdict(identical(1), [noisy]).passed  # off by default


def test_a_reference_on_another_backend_than_requested_is_invalid():
    flashinfer = {
        "reference": SideKernel("reference", "vllm-flashinfer", 12),
        "candidate": SideKernel("candidate", "ns4", 12),
    }
    result = verdict(identical(3), kernels=flashinfer, reference_backend="triton")
    assert result.word == "INVALID" and not result.passed
    assert "requested triton (vllm-triton); reference ran vllm-flashinfer" in (
        gate(result, "reference backend").detail
    )
    fla = {**flashinfer, "reference": SideKernel("reference", "vllm-triton", 12)}
    assert verdict(identical(3), kernels=fla, reference_backend="triton").word == "identical"
    asked = verdict(identical(3), kernels=flashinfer, reference_backend="flashinfer")
    assert gate(asked, "reference backend").passed


def test_the_cpu_builds_one_op_is_the_reference_whatever_is_requested():
    cpu = {
        "reference": SideKernel("reference", "vllm-cpu-native", 12),
        "candidate": SideKernel("candidate", "ns4", 12),
    }
    assert gate(verdict(identical(2), kernels=cpu, reference_backend="triton"), "reference backend")


def test_an_aa_run_checks_the_backend_of_both_sides():
    aa = {
        "reference": SideKernel("reference", "vllm-triton", 12),
        "candidate": SideKernel("candidate", "vllm-flashinfer", 12),
    }
    result = verdict(
        identical(2), kernels=aa, requested=None, is_aa=True, reference_backend="triton"
    )
    assert result.word == "INVALID"
    assert "candidate ran vllm-flashinfer" in gate(result, "reference backend").detail


def test_the_word_follows_the_kind_of_the_failed_gate_not_its_name():
    counts = count(identical(2), [])
    assert verdict_word([Gate("any name", False, "", GateKind.VALIDITY)], counts, None) == (
        "INVALID"
    )
    assert verdict_word([Gate("any name", False, "")], counts, None) == "NOT equivalent"
    slower = [Gate("performance", False, "", GateKind.PERFORMANCE)]
    assert verdict_word(slower, counts, None) == "identical"


def test_performance_gate_reads_only_the_candidate_rows():
    deltas = PerfResult(
        (
            changes(4, {Metric.MEAN_TTFT: (0.0, -1.0, 1.0)}),
            changes(4, {Metric.MEAN_TTFT: (50.0, 40.0, 60.0)}, Comparison.AA),
        )
    )
    assert performance_gate(deltas, MEASURED, 5, levels=1).passed


def test_one_kernel_name_from_two_sources_is_a_candidate_of_its_own():
    """A vLLM branch that changed FLA's kernel runs `vllm-triton` from another source."""
    stock = SideKernel("reference", "vllm-triton", 12, source_sha256=("aaaa",))
    branch = SideKernel("candidate", "vllm-triton", 12, source_sha256=("bbbb",))
    result = verdict(
        identical(3), kernels={"reference": stock, "candidate": branch}, requested=None
    )
    kernel_gate = gate(result, "candidate kernel active")
    assert kernel_gate.passed and "from other sources (candidate bbbb, reference aaaa)" in (
        kernel_gate.detail
    )
    same = {"reference": stock, "candidate": replace(branch, source_sha256=("aaaa",))}
    assert verdict(identical(3), kernels=same, requested=None).word == "INVALID"


def test_exit_codes_tell_a_broken_setup_from_a_broken_kernel():
    assert verdict(identical(3)).exit_code() == ExitCode.PASS == 0
    assert verdict([pair("s", "substantive")]).exit_code() == ExitCode.FAILED == 1
    invalid = verdict(identical(3), hits=2.0)
    assert invalid.word == "INVALID" and invalid.exit_code() == ExitCode.INVALID == 3
    assert invalid.exit_code("the candidate server died") == ExitCode.ERROR == 2


# --- each gate on its own ------------------------------------------------------------------------


def evidence(pairs=(), drift_results=(), **fields) -> Evidence:
    fields.setdefault("config", GatesConfig())
    fields.setdefault("kernels", KERNELS)
    fields.setdefault("requested_kernel", "ns4")
    return Evidence(pairs=list(pairs), drift=list(drift_results), **fields)


def test_pairs_compared_is_a_validity_gate_on_the_pair_count():
    assert pairs_compared(evidence(identical(2))) == Gate(
        "pairs compared", True, "2 request pairs compared", GateKind.VALIDITY
    )
    assert not pairs_compared(evidence()).passed


def test_substantive_divergences_names_the_allowance_and_the_near_ties():
    found = substantive_divergences(evidence([pair("s", "substantive"), pair("t", "near_tie")]))
    assert not found.passed and found.kind is GateKind.EQUIVALENCE
    assert found.detail == "1 substantive (allowed 0); 1 near-ties at margin <= 0.25"
    allowed = evidence(
        [pair("s", "substantive")], config=GatesConfig(max_substantive_divergences=1)
    )
    assert substantive_divergences(allowed).passed


def test_unclassified_divergences_fail_with_how_to_classify_them():
    assert unclassified_divergences(evidence(identical(2))).passed
    found = unclassified_divergences(evidence([pair("u", "unclassified")]))
    assert not found.passed and found.kind is GateKind.UNCLASSIFIED
    assert found.detail.endswith("set drift.enabled: true to classify them")


def test_pathologies_counts_server_log_faults_against_the_allowance():
    assert pathologies(evidence(identical(2))).passed
    assert not pathologies(evidence(identical(2), log_faults=1)).passed
    assert pathologies(evidence(identical(2), log_faults=1, config=GatesConfig(max_pathologies=1)))


def test_prefix_cache_hits_without_and_with_a_conversation_workload(make_record):
    """Without `gates.min_prefix_cache_hits` any hit beyond the allowance is INVALID; with it
    the conversation gate judges the paired records' cached tokens, whatever the total."""
    hit = prefix_cache_hits(evidence(identical(2), prefix_cache_hits=2.0))
    assert hit == Gate("prefix-cache hits", False, "2 hits (allowed 0)", GateKind.VALIDITY)
    reference = [make_record("reference", "q0", cached_tokens=640, prompt_tokens=1400)]
    candidate = [make_record("candidate", "q0", cached_tokens=640, prompt_tokens=1400)]
    config = GatesConfig(min_prefix_cache_hits=600)
    by_design = evidence(
        identical(1),
        prefix_cache_hits=6400.0,
        config=config,
        reference=reference,
        candidate=candidate,
    )
    found = prefix_cache_hits(by_design)
    assert found.passed and found.detail.startswith("cached prompt tokens: reference 640")
    unequal = replace(by_design, candidate=[replace(candidate[0], cached_tokens=0)])
    assert not prefix_cache_hits(unequal).passed
    assert decide(unequal).word is VerdictWord.INVALID


def test_teacher_forced_drift_names_each_bound_it_checks():
    assert teacher_forced_drift(evidence(identical(1))) is None  # no replay, no gate
    config = GatesConfig(max_mean_drift=0.1, max_request_drift=0.5, max_mean_prompt_drift=0.25)
    found = teacher_forced_drift(evidence(identical(1), [drift(0.05, maximum=0.6)], config=config))
    assert not found.passed  # the max is over its bound
    assert found.detail == (
        "mean abs Δlogprob 0.0500, max 0.6000 (mean allowed 0.1) (max allowed 0.5); "
        "prompt positions mean 0.0000 (allowed 0.25)"
    )


def test_drift_within_floor_needs_a_replay_a_factor_and_a_floor():
    config = GatesConfig(calibration_drift=0.01, max_drift_over_floor=2.0)
    assert drift_within_floor(evidence(identical(1), config=config)) is None
    assert drift_within_floor(evidence(identical(1), [drift(0.01)])) is None
    assert drift_within_floor(evidence(identical(1), [drift(0.019)], config=config)).passed
    assert not drift_within_floor(evidence(identical(1), [drift(0.021)], config=config)).passed


def test_near_ties_beyond_aa_needs_the_control_and_its_key():
    near = [pair(f"t{i}", "near_tie") for i in range(3)]
    keyed = GatesConfig(allow_near_ties_beyond_aa=0)
    assert near_ties_beyond_aa(evidence(near, config=keyed)) is None  # no A/A control
    assert near_ties_beyond_aa(evidence(near, aa_pairs=aa_pairs(4, 1))) is None  # key unset
    found = near_ties_beyond_aa(evidence(near, aa_pairs=aa_pairs(4, 1), config=keyed))
    assert not found.passed and found.detail == ("3 near-ties vs A/A floor 1 (allowed beyond: 0)")
    both = [*near[:2], pair("v", "reference_variant")]
    found = near_ties_beyond_aa(evidence(both, aa_pairs=aa_pairs(4, 1), config=keyed))
    assert not found.passed  # a reference variant counts against the floor as a near-tie does
    assert found.detail == "2 near-ties and 1 reference variants vs A/A floor 1 (allowed beyond: 0)"


def test_vllm_installs_fails_on_a_skew_the_scenario_does_not_declare():
    assert vllm_installs(evidence(identical(1))) is None  # one installation
    seen = InstallsSeen("reference (venv): vLLM 0.1; candidate (venv): vLLM 0.2")
    assert vllm_installs(evidence(identical(1), installs=seen)).passed
    skewed = replace(seen, skew="vLLM 0.1 vs 0.2, not declared")
    found = vllm_installs(evidence(identical(1), installs=skewed))
    assert not found.passed and found.kind is GateKind.VALIDITY
    assert found.detail == f"vLLM 0.1 vs 0.2, not declared; {seen.described}"


def test_initial_state_only_where_the_scenario_asks_for_it():
    assert initial_state(evidence(identical(1))) is None
    asked = evidence(identical(1), config=GatesConfig(require_initial_state=True))
    found = initial_state(asked)  # KERNELS' proofs counted no initial state
    assert not found.passed and decide(asked).word is VerdictWord.INVALID


def test_self_check_only_where_gated_and_fails_without_its_controls():
    assert self_check(evidence(identical(1))) is None
    gated = GatesConfig(allow_self_check_beyond_aa=0)
    assert not self_check(evidence(identical(1), config=gated)).passed
    check = SelfCheck(4, 2, tuple(identical(2)), gated=True)
    held = evidence(identical(1), config=gated, self_check=check, aa_pairs=aa_pairs(2, 0))
    assert self_check(held).passed


def test_the_gates_run_in_the_order_the_reports_list_them():
    everything = GatesConfig(
        allow_near_ties_beyond_aa=1,
        allow_self_check_beyond_aa=1,
        max_drift_over_floor=2.0,
        require_initial_state=True,
    )
    full = evidence(
        identical(2),
        [drift(0.01)],
        config=everything,
        aa_pairs=aa_pairs(2, 0),
        aa_drift=[drift(0.01)],
        reference_backend="triton",
        installs=InstallsSeen("a; b"),
        accuracy=accuracy_result({}, [], "q"),
    )
    assert [g.name for g in decide(full).gates] == [
        "pairs compared",
        "substantive divergences",
        "unclassified divergences",
        "pathologies",
        "prefix-cache hits",
        "teacher-forced drift",
        "drift within the floor",
        "near-ties beyond the A/A floor",
        "candidate kernel active",
        "reference backend",
        "vLLM installs",
        "initial state exercised",
        "accuracy",
        "self-check beyond the A/A floor",
    ]
    assert len(GATES) == 14


def test_a_new_gate_is_a_function_and_a_line_in_the_list():
    """What rig.verdict.gates' docstring promises: decide runs any list of rules, a rule's
    None leaves no line, and the kind of a failed one picks the word."""

    def flips(e: Evidence) -> Gate | None:
        return Gate("answers flipped", len(e.pairs) < 3, f"{len(e.pairs)} pairs")

    def never(e: Evidence) -> Gate | None:
        return None

    two = evidence(identical(2))
    result = decide(two, (*GATES, flips, never))
    assert result.gates[-1] == Gate("answers flipped", True, "2 pairs") and result.passed
    failed = decide(evidence(identical(3)), (*GATES, flips))
    assert (failed.word, failed.passed) == (VerdictWord.NOT_EQUIVALENT, False)
    assert decide(two, (pairs_compared,)).gates == (pairs_compared(two),)


def test_judge_speed_adds_the_performance_gate_only_where_asked_and_timed():
    slow = PerfResult((changes(1, {Metric.MEAN_TTFT: (50, 40, 60)}, word=SLOWER),))
    timed = evidence(identical(2), perf=slow)
    before = decide(timed)
    assert judge_speed(before, timed, MEASURED) is before  # no max_perf_regression_pct
    asked = replace(timed, config=GatesConfig(max_perf_regression_pct=5))
    judged = judge_speed(decide(asked), asked, MEASURED)
    assert judged.gates[-1].name == GATE and not judged.passed and judged.word == "identical"
    untimed = replace(asked, perf=PerfResult(()))
    assert GATE not in gate_names(judge_speed(decide(untimed), untimed, MEASURED))


def test_a_run_that_did_not_complete_is_incomplete_unless_the_candidate_diverged():
    """Stopped after 224 of 384 pairs, all identical: INCOMPLETE (exit 2), with how far it got;
    a failed pathology gate from the stop's failed requests does not change that; substantive
    divergences among the compared pairs do; INVALID stays INVALID."""
    counts = Counts(224, 224, 0, 0, 0, 0.0, 0.0, 0.0, 0)
    passed = Verdict(VerdictWord.IDENTICAL, True, (Gate("text", True, "all"),), counts)
    failed = failed_verdict(passed, "interrupted (Ctrl-C)\nmore")
    assert (failed.word, failed.passed) == ("INCOMPLETE", False)
    assert failed.exit_code() == 2
    assert failed.gates[-1] == Gate(
        "run completed",
        False,
        "interrupted (Ctrl-C); 224 pairs compared before it stopped: 224 identical, 0 near-tie, "
        "0 substantive",
    )
    assert failed.counts is counts
    stopped = Verdict(VerdictWord.NOT_EQUIVALENT, False, (), replace(counts, pathologies=3))
    assert failed_verdict(stopped, "candidate server died").word == "INCOMPLETE"
    diverged = Verdict(VerdictWord.NOT_EQUIVALENT, False, (), replace(counts, substantive=2))
    assert failed_verdict(diverged, "interrupted").word == "NOT equivalent"
    invalid = Verdict(VerdictWord.INVALID, False, (), counts)
    assert failed_verdict(invalid, "x").word == "INVALID"
