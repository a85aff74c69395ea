"""The outcome from a run's state, without servers: kernels per side, the planted delay, the
evidence the gates read, and the verdict and speed line of the outcome."""

import rig.run.conclude
from kernels.proof import InitialStateCounts, KernelProof
from rig.records import JIT_COMPILE, LevelFault, ServerDelta
from rig.run.cache import GoldenEntry
from rig.run.conclude import (
    build_outcome,
    candidate_should_run,
    gdn_backends,
    installs_seen,
    is_aa_run,
    planted_delay,
    proof_not_asked,
    run_evidence,
    side_kernels,
)
from rig.run.load_phase import timing_design
from rig.run.state import RunState
from rig.verdict.evidence import SideKernel
from rig.verdict.perf_records import Metric
from tests.run_fakes import run_context, scenario


def proof(kernel: str, calls: int, origin: str = "metrics") -> KernelProof:
    counts = InitialStateCounts(calls // 2, calls, 10 * calls, 2 * calls, 30 * calls)
    return KernelProof(
        (kernel,), (kernel,), ("sha",), calls, (1,), None, origin=origin, initial_state=counts
    )


def test_aa_run_means_identically_configured_sides():
    assert is_aa_run(scenario())
    assert not is_aa_run(scenario(candidate={"kernel": "ns4"}))
    assert not is_aa_run(scenario(candidate={"env": {"X": "1"}}))


def test_side_kernels_join_a_sides_servers_and_take_a_cached_reference(tmp_path, monkeypatch):
    ctx = run_context(tmp_path, candidate={"kernel": "ns4"})
    monkeypatch.setattr(
        rig.run.conclude, "read_kernel_proof", lambda log, stats: proof("ns4", 7, "log")
    )
    proofs = {"reference": proof("vllm-cpu-native", 5)}
    kernels = side_kernels(ctx.plan, proofs, None)
    assert kernels["reference"] == SideKernel(
        "reference",
        "vllm-cpu-native",
        5,
        "reference (metrics): " + proofs["reference"].describe(),
        proofs["reference"].source_sha256,
        InitialStateCounts(2, 5, 50, 10, 150),
    )
    assert (kernels["candidate"].kernel, kernels["candidate"].calls) == ("ns4", 7)  # from its log
    cached = SideKernel("reference", "vllm-triton", 99, "cached")
    golden = GoldenEntry("first", [], [], {}, cached, {})
    assert side_kernels(ctx.plan, proofs, golden)["reference"] is cached
    assert gdn_backends(proofs)["reference"]["ran"] == "vllm-cpu-native"


def test_planted_delay_counts_the_candidates_calls_per_level_or_gives_up(tmp_path):
    ctx = run_context(tmp_path, candidate={"kernel": "ref+delay-5ms"})
    deltas = [
        ServerDelta("candidate", 1, 0, 1.0, 0.0, 10),
        ServerDelta("reference", 1, 0, 1.0, 0.0, 10),
        ServerDelta("candidate", 1, 1, 1.0, 0.0, 12),
    ]
    delay = planted_delay("ref+delay-5ms", ctx.plan, deltas)
    assert (delay.delay_ms, delay.calls) == (5.0, {(1, 0): 10, (1, 1): 12})
    assert planted_delay("ns4", ctx.plan, deltas) is None
    unknown = [*deltas, ServerDelta("candidate", 2, 0, 1.0, 0.0, None)]
    assert planted_delay("ref+delay-5ms", ctx.plan, unknown) is None


def test_outcome_compares_only_pairs_both_sides_finished(tmp_path, make_record):
    ctx = run_context(tmp_path, candidate={"kernel": "ns4"}, drift={"enabled": False})
    state = RunState()
    for request in ("q0", "q1", "q2"):
        state.records.append(make_record("reference", request))
    state.records.append(make_record("candidate", "q0"))
    state.records.append(make_record("candidate", "q1", error="cancelled: interrupted"))
    kernels = {
        "reference": SideKernel("reference", "vllm-cpu-native", 3),
        "candidate": SideKernel("candidate", "ns4", 3),
    }
    outcome = build_outcome(ctx, state, kernels, "interrupted (Ctrl-C or SIGTERM)")
    assert [p.request_id for p in outcome.pairs] == ["q0"]
    assert not outcome.verdict.passed
    assert outcome.verdict.failed_gates[-1].name == "run completed"
    assert outcome.manifest.schedule == [] and outcome.records is state.records
    assert outcome.aa_pairs is None and outcome.drift == []


def test_the_evidence_holds_what_the_gates_read_from_the_state(tmp_path, make_record):
    """Only pairs both sides finished; a JIT compile in a server's log is no fault the gates
    count; what the scenario asks of the kernels; the speed before any design words it."""
    ctx = run_context(tmp_path, candidate={"kernel": "ns4"}, drift={"enabled": False},
                      workload=ONE_LEVEL)  # fmt: skip
    state = timed_blocks(make_record)
    state.records.append(make_record("reference", "late"))
    state.faults += [
        LevelFault("candidate", 1, JIT_COMPILE, "compiled during inference"),
        LevelFault("candidate", 1, "traceback", "Traceback (most recent call last)"),
    ]
    evidence = run_evidence(ctx, state, KERNELS, {}, timing_design(ctx, [], state.faults))
    assert len(evidence.pairs) == len(evidence.candidate) == len(evidence.reference) == 12
    assert "late" not in {r.request_id for r in evidence.reference}
    assert evidence.log_faults == 1
    assert (evidence.requested_kernel, evidence.is_aa, evidence.proof_not_asked) == (
        "ns4",
        False,
        None,
    )
    assert evidence.aa_pairs is None and evidence.self_check is None and evidence.levels == 1
    assert evidence.installs is None  # both sides share this interpreter's installation
    assert [level.level for level in evidence.perf.levels] == [1]
    assert installs_seen(ctx.scenario, ctx.plan, {}) is None


def test_what_the_candidate_must_have_run_and_whether_a_proof_is_asked():
    assert candidate_should_run(scenario(candidate={"kernel": "pkg.mod:fn"})) == "pkg.mod:fn"
    backend = scenario(candidate={"gdn_prefill_backend": "cutedsl"})
    assert candidate_should_run(backend) == "vllm-cutedsl"
    assert candidate_should_run(scenario()) is None  # any kernel but the reference's
    assert proof_not_asked(scenario()) is None
    off = scenario(gates={"require_candidate_kernel": False})
    assert proof_not_asked(off) == "gates.require_candidate_kernel: false"
    stock = scenario(candidate={"url": "http://h:1", "proof": "none"})
    assert proof_not_asked(stock) == "candidate.proof: none"


def test_another_install_is_not_an_aa_run():
    assert is_aa_run(scenario())
    assert not is_aa_run(scenario(candidate={"python": "/venvs/branch/bin/python"}))
    assert not is_aa_run(scenario(candidate={"gdn_prefill_backend": "flashinfer"}))


def timed_blocks(
    make_record, candidate_text: str = "same", repeats: int = 3, slower: float = 1.0
) -> RunState:
    """Both sides, `repeats` blocks of 4 requests at C=1; the candidate answers candidate_text,
    its times `slower` times the reference's (and 1 % more each block, so that the blocks'
    ratios spread)."""
    state = RunState()
    for repeat in range(repeats):
        for index in range(4):
            for side, text in (("reference", "same"), ("candidate", candidate_text)):
                f = slower * (1 + 0.01 * repeat) if side == "candidate" else 1.0
                state.records.append(
                    make_record(side, f"c1-r{repeat}-{index:04d}", text, index=index,
                                repeat=repeat, sent_at=100.0 * repeat + index, ttft_s=0.05 * f,
                                itl_s=[0.01 * f], e2el_s=0.06 * f, output_tokens=2,
                                prompt_tokens=9)
                )  # fmt: skip
    return state


KERNELS = {
    "reference": SideKernel("reference", "vllm-cpu-native", 12),
    "candidate": SideKernel("candidate", "ns4", 12),
}


def test_an_interrupted_run_gets_no_speed_word(tmp_path, make_record):
    ctx = run_context(
        tmp_path, candidate={"kernel": "ns4"}, drift={"enabled": False},
        workload={"prompts": [{"long_tokens": [100]}], "concurrency": [1], "repeats": 3},
    )  # fmt: skip
    outcome = build_outcome(ctx, timed_blocks(make_record), KERNELS, "interrupted (Ctrl-C)")
    assert not outcome.speed.measured
    assert outcome.speed.reason.startswith("not measured (the run did not complete: interrupted")
    words = {outcome.perf.get(1, m).word for m in (Metric.MEAN_TTFT, Metric.MEAN_E2EL)}
    assert words == {"not measured"}


def test_a_candidate_that_is_not_equivalent_gets_no_speed_word(tmp_path, make_record):
    ctx = run_context(
        tmp_path, candidate={"kernel": "ns4"}, drift={"enabled": False},
        workload={"prompts": [{"long_tokens": [100]}], "concurrency": [1], "repeats": 3},
    )  # fmt: skip
    outcome = build_outcome(ctx, timed_blocks(make_record, "other"), KERNELS, None)
    assert outcome.verdict.word == "text differs, unclassified"  # drift off: no margin
    assert outcome.speed.reason == (
        "not comparable (outputs differ: texts part where no margin was measured)"
    )
    passing = build_outcome(ctx, timed_blocks(make_record), KERNELS, None)
    assert passing.verdict.word == "identical" and passing.speed.measured
    assert passing.load_schedule == "sides timed together: each side on its own hardware"


ONE_LEVEL = {"prompts": [{"long_tokens": [100]}], "concurrency": [1], "repeats": 3}
BOUND = {"max_perf_regression_pct": 5}


def performance(outcome):
    return next(g for g in outcome.verdict.gates if g.name == "performance")


def test_a_measured_slowdown_beyond_the_bound_fails_the_run(tmp_path, make_record):
    """Both sides measured here, three blocks: a 50 % slower candidate fails the performance
    gate (exit 1, the word unchanged), which names the metric, the level and the confidence
    its intervals have (one level: each at 98.75 %)."""
    ctx = run_context(tmp_path, candidate={"kernel": "ns4"}, drift={"enabled": False},
                      workload=ONE_LEVEL, gates=BOUND)  # fmt: skip
    outcome = build_outcome(ctx, timed_blocks(make_record, slower=1.5), KERNELS, None)
    assert outcome.speed.measured and outcome.verdict.word == "identical"
    gate = performance(outcome)
    assert not gate.passed and outcome.verdict.exit_code() == 1
    assert gate.detail.startswith("worst: ")
    assert " at C=1, +" in gate.detail and "% slower at its interval's better bound" in gate.detail
    assert "each interval at 98.75%" in gate.detail and "95% CI" not in gate.detail


def test_a_golden_cache_reference_cannot_fail_on_speed(tmp_path, make_record):
    """The same slowdown against a reference from the golden cache: the speed line says "not
    comparable", and so does the gate, which passes."""
    ctx = run_context(tmp_path, candidate={"kernel": "ns4"}, drift={"enabled": False},
                      workload=ONE_LEVEL, gates=BOUND)  # fmt: skip
    cached = GoldenEntry("first", [], [], {}, KERNELS["reference"], {}, "2026-12-01T00:00Z")
    state = timed_blocks(make_record, slower=1.5)
    outcome = build_outcome(ctx, state, KERNELS, None, golden=cached, golden_key="k")
    assert not outcome.speed.measured
    gate = performance(outcome)
    assert gate.passed and outcome.verdict.passed and outcome.verdict.exit_code() == 0
    assert gate.detail.startswith(
        "nothing judged: speed not comparable (reference from the golden cache: run first"
    )


def test_an_aa_run_cannot_fail_on_speed(tmp_path, make_record):
    """Reference against reference: a change is an A/A asymmetry, never slower."""
    ctx = run_context(tmp_path, drift={"enabled": False}, workload=ONE_LEVEL, gates=BOUND)
    same = {side: SideKernel(side, "vllm-cpu-native", 12) for side in ("reference", "candidate")}
    outcome = build_outcome(ctx, timed_blocks(make_record, slower=1.5), same, None)
    assert outcome.speed.measured and outcome.speed.aa_run
    gate = performance(outcome)
    assert gate.passed and outcome.verdict.passed
    assert "A/A run" in gate.detail
