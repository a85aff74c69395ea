"""The run's outcome from its state: which kernel each side ran, the pairs compared, drift,
the controls and performance, assembled into the Evidence that rig.verdict.gates judges, and
the verdict with all of it into the record the report stage renders."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from kernels.backends import reference_kernel_name
from kernels.proof import InitialStateCounts, KernelProof, read_kernel_proof
from kernels.registry import planted_delay_ms
from rig.manifest_record import RunManifest
from rig.records import ADVISORY_LOG_KINDS, RequestRecord, ServerDelta, Side
from rig.report.mismatches import Decode
from rig.run.cache import GoldenEntry
from rig.run.load_phase import timing_design
from rig.run.profile_phase import read_profile
from rig.run.replay import AA_SIDE, aa_concurrency
from rig.run.self_check import batched_answers, self_check_level
from rig.run.state import RunContext, RunState, finished
from rig.scenario.config import SIDES, Scenario
from rig.serve.plan import LaunchPlan
from rig.serve.skew import served_skew
from rig.verdict.accuracy import AccuracyResult, accuracy_result
from rig.verdict.compare import PairResult, Replayed, compare_pairs
from rig.verdict.drift import DriftResult, drift_results, forced_positions
from rig.verdict.evidence import Evidence, InstallsSeen, SideKernel
from rig.verdict.gates import decide, failed_verdict, judge_speed
from rig.verdict.initial_state import chunked_prefill
from rig.verdict.intervals import TimingDesign
from rig.verdict.outcome import RunOutcome
from rig.verdict.perf import perf_result
from rig.verdict.perf_records import PerfResult
from rig.verdict.planted import PlantedDelay
from rig.verdict.self_check import ALONE_SIDE, SelfCheck, self_check
from rig.verdict.speed import SpeedDesign, apply_design, speed_design
from rig.verdict.words import VerdictWord

# Verdict words whose outputs differ beyond near-ties: no speed word compares such sides.
OUTPUTS_DIFFER = {
    VerdictWord.NOT_EQUIVALENT: "the candidate is NOT equivalent",
    VerdictWord.UNCLASSIFIED: "texts part where no margin was measured",
}


def is_aa_run(scenario: Scenario) -> bool:
    """Reference against reference: both sides served alike (same install, flags, kernel)."""
    return scenario.reference.serves_like(scenario.candidate)


def candidate_should_run(scenario: Scenario) -> str | None:
    """The kernel the candidate's proof must name: its kernel, or vllm-<backend> for an in-tree
    backend other than the reference's; None when any kernel but the reference's will do."""
    candidate = scenario.candidate
    if candidate.kernel is not None:
        return candidate.kernel
    backend = scenario.backend_of(Side.CANDIDATE)
    if backend != scenario.backend_of(Side.REFERENCE):
        return reference_kernel_name(backend)
    return None


def proof_not_asked(scenario: Scenario) -> str | None:
    """Why no kernel proof is asked of this run (None: it is)."""
    if not scenario.gates.require_candidate_kernel:
        return "gates.require_candidate_kernel: false"
    off = [side for side in SIDES if scenario.side(side).proof == "none"]
    return " and ".join(f"{side}.proof: none" for side in off) or None


def side_kernels(
    plan: LaunchPlan, proofs: dict[str, KernelProof], golden: GoldenEntry | None
) -> dict[str, SideKernel]:
    """Which kernel each side ran, over all its servers; read once, after the run (a server
    that died before its proof was read is read from its log)."""
    kernels = {}
    if golden is not None:
        kernels[Side.REFERENCE] = golden.kernel
    for side in SIDES:
        if side == Side.REFERENCE and golden is not None:
            continue
        found = []
        for server in plan.side_servers(side):
            proof = proofs.get(server.label)
            if proof is None and server.url is None:  # the server died before it was read
                proof = read_kernel_proof(server.log_path, server.stats_dir)
            if proof is not None:
                found.append((server, proof))
        if not found:
            continue
        kernel = "+".join(dict.fromkeys(proof.kernel for _, proof in found))
        calls = sum(proof.calls for _, proof in found)
        detail = "; ".join(
            f"{server.label} ({proof.origin}): {proof.describe()}" for server, proof in found
        )
        sources = tuple(dict.fromkeys(h for _, proof in found for h in proof.source_sha256))
        initial_state = sum((proof.initial_state for _, proof in found), InitialStateCounts())
        kernels[side] = SideKernel(side, kernel, calls, detail, sources, initial_state)
    return kernels


def gdn_backends(proofs: dict[str, KernelProof]) -> dict[str, dict]:
    """Per server: the GDN prefill backend asked for, what vLLM chose, what ran."""
    return {
        label: {
            "requested": proof.requested_backend,
            "vllm_chose": "+".join(proof.vllm_backends) or None,
            "ran": proof.backend,
            "evidence": proof.origin,
        }
        for label, proof in proofs.items()
    }


def planted_delay(
    kernel: str | None, plan: LaunchPlan, deltas: list[ServerDelta]
) -> PlantedDelay | None:
    """The candidate's planted delay (`ref+delay-<N>ms`) and its servers' GDN prefill calls
    per level; None for any other candidate or when a server published no count."""
    delay_ms = planted_delay_ms(kernel)
    calls: dict[tuple[int, int], int] = {}
    for delta in deltas:
        server = plan.servers.get(delta.server)
        if server is None or server.side != Side.CANDIDATE:
            continue
        if delta.gdn_prefill_calls is None:
            return None
        key = (delta.level, delta.repeat)
        calls[key] = calls.get(key, 0) + delta.gdn_prefill_calls
    return PlantedDelay(kernel, delay_ms, calls) if delay_ms and calls else None


def installs_seen(
    scenario: Scenario, plan: LaunchPlan, served: dict[str, str]
) -> InstallsSeen | None:
    """Where the sides are served by different installations: what served each, by the probe
    and by the servers' own word, and the vLLM release between them that the scenario does
    not declare (rig.verdict.gates.vllm_installs judges it). None when both sides share one
    installation."""
    first = {side: plan.side_servers(side)[0] for side in SIDES if plan.side_servers(side)}
    installs = {side: server.install for side, server in first.items() if server.install}
    if len({(i.kind, i.serve_prefix) for i in installs.values()}) < 2:
        return None
    versions = {
        side: served.get(server.label) or (server.install.facts.vllm if server.install else None)
        for side, server in first.items()
    }
    described = "; ".join(
        f"{side} ({install.kind}): "
        + (f"served vLLM {served[first[side].label]}; " if first[side].label in served else "")
        + install.facts.describe()
        for side, install in installs.items()
    )
    return InstallsSeen(described, served_skew(scenario, {s: v for s, v in versions.items() if v}))


def side_drift(state: RunState, side: str) -> list[DriftResult]:
    """`side`'s teacher-forced drift from the reference; empty unless both replayed."""
    forced = state.forced
    if Side.REFERENCE not in forced or side not in forced:
        return []
    return drift_results(state.sequences, forced[Side.REFERENCE], forced[side])


def model_decoder(model_path: str) -> Decode | None:
    """The served model's tokenizer as ids -> text, for the report to name and place the
    divergent token; None when the model folder has no tokenizer.json (the page shows token
    ids)."""
    path = Path(model_path) / "tokenizer.json"
    if not path.is_file():
        return None
    try:
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(path))
    except Exception:  # an unreadable tokenizer costs the token names, not the report
        return None
    return lambda ids: tokenizer.decode(list(ids), skip_special_tokens=False)


def run_speed_design(
    scenario: Scenario,
    timing: TimingDesign,
    word: str,
    error: str | None,
    golden_run: str | None = None,
    golden_stored: str | None = None,
) -> SpeedDesign:
    """What a run's design lets its speed line say, from what the run recorded: its verdict
    word, its error, where its reference came from; `rig compare` asks it of a stored run."""
    workload = scenario.workload
    return speed_design(
        workload.repeats,
        golden_run,
        golden_stored,
        interrupted=error.splitlines()[0] if error else None,
        outputs_differ=OUTPUTS_DIFFER.get(word),
        aa_run=is_aa_run(scenario),
        resolution_pct=workload.speed_resolution_pct if timing.stage_one_blocks else None,
        budget_s=workload.speed_budget_s,
    )


def paired_records(state: RunState) -> tuple[list[RequestRecord], list[RequestRecord]]:
    """The finished records of each side that make pairs: the candidate's, and the reference's
    that the candidate answered too."""
    finished_records = [r for r in state.records if finished(r)]
    candidate = [r for r in finished_records if r.side == Side.CANDIDATE]
    answered = {r.request_id for r in candidate}
    reference = [
        r for r in finished_records if r.side == Side.REFERENCE and r.request_id in answered
    ]
    return reference, candidate


def aa_control(
    scenario: Scenario, state: RunState, reference: list[RequestRecord], replayed: Replayed
) -> tuple[list[PairResult] | None, list[DriftResult] | None]:
    """The A/A control's pairs and drift; None, None when it did not run. The A/A replay
    reuses the first level's request ids, so it pairs by id."""
    if not state.aa_records:
        return None, None
    first_level = [r for r in reference if r.level == scenario.workload.concurrency[0]]
    aa_pairs = compare_pairs(
        [r for r in first_level if r.repeat == 0],
        state.aa_records,
        scenario.gates.near_tie_margin,
        scenario.workload.max_tokens,
        replayed,
    )
    return aa_pairs, side_drift(state, AA_SIDE)


def candidate_self_check(scenario: Scenario, state: RunState) -> SelfCheck | None:
    """The candidate's batched answers against the same requests alone; None when it did not
    run."""
    if not state.alone_records:
        return None
    level = self_check_level(scenario)
    return self_check(
        batched_answers(state, level),
        state.alone_records,
        level,
        scenario.gates.near_tie_margin,
        scenario.workload.max_tokens,
        {Side.CANDIDATE: state.alone_replayed, ALONE_SIDE: state.alone_replayed},
        gated=scenario.gates.allow_self_check_beyond_aa >= 0,
    )


def measured_perf(ctx: RunContext, state: RunState, timing: TimingDesign) -> PerfResult:
    """The speed comparison per level, before any design words it, with its intervals set for
    the family of the workload's levels."""
    scenario = ctx.scenario
    return perf_result(
        [r for r in state.records if r.task is None],  # the graded questions are not timed
        state.aa_records,
        aa_concurrency(scenario),
        planted_delay(scenario.candidate.kernel, ctx.plan, state.server_deltas),
        confidence=SpeedDesign(True).interval_confidence(len(scenario.workload.concurrency)),
        timing=timing,
        deltas=state.server_deltas,
    )


def question_scores(ctx: RunContext, records: list[RequestRecord]) -> AccuracyResult | None:
    """The accuracy block's paired scores; None without one."""
    block = ctx.scenario.accuracy
    if block is None:
        return None
    targets = {q.id: q.answer for q in ctx.questions}
    return accuracy_result(
        targets, records, block.source, block.answer, block.alpha, block.max_drop_pt
    )


def run_evidence(
    ctx: RunContext,
    state: RunState,
    kernels: dict[str, SideKernel],
    replayed: Replayed,
    timing: TimingDesign,
) -> Evidence:
    """Everything the gates read, from the run's state: the finished pairs compared, the
    drift, the controls, the kernels, what the scenario asks of them, and the speed."""
    scenario = ctx.scenario
    reference, candidate = paired_records(state)
    pairs = compare_pairs(
        reference,
        candidate,
        scenario.gates.near_tie_margin,
        scenario.workload.max_tokens,
        replayed,
    )
    aa_pairs, aa_drift = aa_control(scenario, state, reference, replayed)
    return Evidence(
        config=scenario.gates,
        pairs=pairs,
        kernels=kernels,
        drift=side_drift(state, Side.CANDIDATE),
        prefix_cache_hits=sum(p.hits for p in state.server_deltas),
        requested_kernel=candidate_should_run(scenario),
        is_aa=is_aa_run(scenario),
        log_faults=sum(f.kind not in ADVISORY_LOG_KINDS for f in state.faults),
        aa_pairs=aa_pairs,
        aa_drift=aa_drift,
        reference_backend=(
            scenario.backend_of(Side.REFERENCE) if scenario.reference.proof != "none" else None
        ),
        proof_not_asked=proof_not_asked(scenario),
        installs=installs_seen(scenario, ctx.plan, state.served_versions),
        self_check=candidate_self_check(scenario, state),
        accuracy=question_scores(ctx, [r for r in state.records if finished(r)]),
        reference=reference,
        candidate=candidate,
        perf=measured_perf(ctx, state, timing),
        levels=len(scenario.workload.concurrency),
    )


def run_manifest(
    ctx: RunContext, state: RunState, timing: TimingDesign, golden: GoldenEntry | None
) -> RunManifest:
    """The manifest as the run started it, with what the run found out."""
    return replace(
        ctx.manifest,
        server_peak_rss_mb=state.peak_rss_mb,
        gdn_backends=gdn_backends(state.proofs),
        served_vllm=state.served_versions,
        schedule=state.schedule,
        load_schedule=ctx.plan.load_schedule(ctx.scenario.workload).describe(),
        excluded_blocks=sorted([list(block) for block in timing.excluded]),
        pair_levels=sorted(timing.pair_levels),
        stage_one_blocks=timing.stage_one_blocks,
        golden_run=golden.source_run if golden is not None else None,
        golden_stored_at=golden.stored_at if golden is not None else None,
    )


def build_outcome(
    ctx: RunContext,
    state: RunState,
    kernels: dict[str, SideKernel],
    error: str | None,
    golden: GoldenEntry | None = None,
    golden_key: str = "",
) -> RunOutcome:
    """Assemble the run's evidence, have rig.verdict.gates judge it, gather what the report
    shows."""
    scenario = ctx.scenario
    replayed = {
        side: forced_positions(state.sequences, forced) for side, forced in state.forced.items()
    }
    timing = timing_design(ctx, state.server_deltas, state.faults)
    evidence = run_evidence(ctx, state, kernels, replayed, timing)
    manifest = run_manifest(ctx, state, timing, golden)
    verdict = decide(evidence)
    speed = run_speed_design(
        scenario, timing, verdict.word, error, manifest.golden_run, manifest.golden_stored_at
    )
    verdict = judge_speed(verdict, evidence, speed)
    return RunOutcome(
        run_id=ctx.run_id,
        run_dir=ctx.run_dir,
        scenario_name=scenario.name,
        manifest=manifest,
        records=state.records,
        pairs=evidence.pairs,
        drift=evidence.drift,
        server_deltas=state.server_deltas,
        faults=state.faults,
        kernels=kernels,
        verdict=verdict if error is None else failed_verdict(verdict, error),
        aa_pairs=evidence.aa_pairs,
        aa_drift=evidence.aa_drift,
        self_check=evidence.self_check,
        timings=state.timings,
        perf=apply_design(evidence.perf, speed),
        error=error,
        prompt_categories={p.id: p.category for p in ctx.prompts if p.category},
        replayed={side: replayed[side] for side in SIDES if side in replayed},
        accuracy=evidence.accuracy,
        chunked_prefill=chunked_prefill(state.records, scenario.model.max_num_batched_tokens),
        profile=read_profile(ctx.run_dir, scenario),
        speed=speed,
        comparison="A/A run: the reference against itself" if evidence.is_aa else "",
        load_schedule=manifest.load_schedule,
        reference_source=(
            f"Reference from the golden cache: run {golden.source_run}, stored "
            f"{golden.stored_at or 'at an unknown time'}, key {golden_key}"
            if golden is not None
            else ""
        ),
    )
