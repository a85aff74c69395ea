"""`python -m rig.run SCENARIO [--set key=value ...]`: the whole pipeline, and its exit code.

scenario -> servers -> load (paired, level by level) -> drift (teacher-forced, untimed)
-> compare -> metrics -> report. Exit 0 only when every gate holds; 1 when a gate fails;
2 when the run could not be made (bad input, a server that would not start).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import NoReturn

from kernels.proof import KernelProof, fetch_kernel_proof, read_kernel_proof
from kernels.registry import planted_delay_ms
from rig.cache import GoldenCache, GoldenEntry, golden_key
from rig.compare import compare_pairs
from rig.drift import (
    REPLAY_FILE,
    DriftResult,
    ForcedLogprobs,
    ForcedSequence,
    drift_results,
    forced_positions,
    forced_sequences,
    replay_forced,
    replay_selection,
    write_replay,
)
from rig.hardware import Hardware
from rig.interrupts import InterruptsDeferred, interrupts_raise
from rig.load import run_level
from rig.manifest import build_manifest
from rig.perf import PlantedDelay, perf_frame
from rig.placement import shard
from rig.prefix_cache import PrefixCacheCounters, read_prefix_cache_counters
from rig.preflight import PreflightError, preflight, render_plan
from rig.prompts import Prompt, PromptFileError
from rig.records import RequestRecord, ServerTarget, SideJob
from rig.report import LevelFault, PrefixCacheDelta, RunOutcome, remove_report, write_report
from rig.scenario import SIDES, Scenario, ScenarioError, load_scenario
from rig.server_logs import ADVISORY_LOG_KINDS, scan_log
from rig.server_plan import LaunchPlan
from rig.servers import Server, ServerError, ServerSet
from rig.verdict import Gate, SideKernel, Verdict, decide
from rig.workload import (
    WorkloadError,
    level_requests,
    resolve_prompts,
    tokenize_body,
    warmup_prompts,
)

EXIT_PASS, EXIT_GATE_FAILED, EXIT_ERROR = 0, 1, 2
AA_SIDE = "reference-aa"
PREFIX_CACHE_FILE = "prefix_cache.jsonl"
FAULTS_FILE = "faults.jsonl"
REPORT_NOTICE = "rig: interrupted while the report is written: finishing it (again to stop at once)"


def is_aa_run(scenario: Scenario) -> bool:
    """Reference against reference: both sides configured identically."""
    ref, cand = scenario.reference, scenario.candidate
    return (ref.kernel, ref.serve_args, ref.env) == (cand.kernel, cand.serve_args, cand.env)


class RecordSink:
    """Appends each record to requests.jsonl the moment it completes, so nothing is lost; a
    record the disk cannot take is cut back out, so the file holds whole lines only."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.handle = open(path, "ab", buffering=0)  # noqa: SIM115 - closed in close()

    def __call__(self, record: RequestRecord) -> None:
        # backslashreplace: a lone surrogate in model output must not lose the record
        data = memoryview((record.to_json() + "\n").encode("utf-8", errors="backslashreplace"))
        end = os.fstat(self.handle.fileno()).st_size
        try:
            while data:
                data = data[self.handle.write(data) :]
        except OSError as exc:
            os.ftruncate(self.handle.fileno(), end)
            raise OSError(exc.errno, f"{self.path}: {exc.strerror}") from None

    def close(self) -> None:
        self.handle.close()


def append_jsonl(path: Path, row: object) -> None:
    """One dataclass as one JSON line (the run's small side files, kept for --resume)."""
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(asdict(row)) + "\n")


def read_jsonl(path: Path, kind: type) -> list:
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    return [kind(**json.loads(line)) for line in lines if line]


@dataclass
class RunState:
    """What the phases accumulate for the compare/report stages."""

    records: list[RequestRecord] = field(default_factory=list)
    aa_records: list[RequestRecord] = field(default_factory=list)
    prefix_cache: list[PrefixCacheDelta] = field(default_factory=list)
    faults: list[LevelFault] = field(default_factory=list)
    sequences: list[ForcedSequence] = field(default_factory=list)
    forced: dict[str, dict[int, ForcedLogprobs]] = field(default_factory=dict)  # by sequence
    timings: dict[str, float] = field(default_factory=dict)
    peak_rss_mb: dict[str, float] = field(default_factory=dict)
    proofs: dict[str, KernelProof] = field(default_factory=dict)  # by server label
    schedule: list[dict] = field(default_factory=list)  # each start of servers, in order


@dataclass(frozen=True)
class Round:
    """One start of a phase's servers and the repeats they run before they stop."""

    servers: tuple[str, ...]
    repeats: tuple[int, ...]


def phase_rounds(phases: tuple[tuple[str, ...], ...], repeats: int) -> list[Round]:
    """Each phase once, running every repeat, when the sides run at the same time (one phase)
    or there is one repeat. With the sides one after the other and several repeats they are
    interleaved, reference r0, candidate r0, reference r1, ...: the servers restart for every
    repeat, so that a machine drifting over time slows both sides alike, not one."""
    if len(phases) < 2 or repeats < 2:
        return [Round(phase, tuple(range(repeats))) for phase in phases]
    return [Round(phase, (repeat,)) for repeat in range(repeats) for phase in phases]


def _counters(targets: dict[str, ServerTarget]) -> dict[str, PrefixCacheCounters]:
    async def read_all():
        answers = await asyncio.gather(
            *(read_prefix_cache_counters(t.base_url, t.api_key) for t in targets.values())
        )
        return dict(zip(targets, answers, strict=True))

    return asyncio.run(read_all())


class Runner:
    def __init__(
        self,
        scenario: Scenario,
        run_id: str,
        run_dir: Path,
        plan: LaunchPlan,
        model_path: str,
        cache: GoldenCache | None,
        resume: bool = False,
    ) -> None:
        self.scenario = scenario
        self.run_id = run_id
        self.run_dir = run_dir
        self.model_path = model_path
        self.prompts = resolve_prompts(scenario.workload)
        self.prompts_by_id: dict[str, Prompt] = {p.id: p for p in self.prompts}
        self.state = RunState()
        self.plan = plan
        self.done_levels: set[tuple[int, int]] = set()
        if resume:
            self.resume_from_disk()
            cache = None  # the interrupted run's own reference results are what count
        self.sink = RecordSink(run_dir / "requests.jsonl")
        self.cache = cache
        self.golden_key, self.golden_fields = golden_key(
            scenario, self.plan.servers["reference"], model_path, self.prompts
        )
        self.golden: GoldenEntry | None = None
        usable = (
            cache is not None
            and not scenario.control.aa
            and self.plan.servers["reference"].url is None
        )
        if usable:
            self.golden = cache.load(self.golden_key)
        if self.golden is not None:
            self.use_golden(self.golden)

    def resume_from_disk(self) -> None:
        """Keep the levels an interrupted run finished on every side; the others run again."""
        expected = self.scenario.workload.requests_per_level or len(self.prompts)
        records_path = self.run_dir / "requests.jsonl"
        records = []
        if records_path.exists():
            with open(records_path, encoding="utf-8") as handle:
                records = [RequestRecord.from_json(line) for line in handle if line.strip()]
        groups: dict[tuple[str, int, int], list[RequestRecord]] = {}
        for record in records:
            groups.setdefault((record.side, record.level, record.repeat), []).append(record)
        complete = {
            key
            for key, group in groups.items()
            if len(group) == expected and all(_finished(r) for r in group)
        }
        faults = read_jsonl(self.run_dir / FAULTS_FILE, LevelFault)
        died = {(f.level, f.repeat) for f in faults if f.kind == "server_died"}
        self.done_levels = {
            (level, repeat)
            for (_, level, repeat) in complete
            if all((side, level, repeat) in complete for side in SIDES)
            and (level, repeat) not in died
        }
        self.state.faults = [f for f in faults if (f.level, f.repeat) in self.done_levels]
        kept = [r for r in records if (r.level, r.repeat) in self.done_levels]
        with open(records_path, "w", encoding="utf-8", errors="backslashreplace") as handle:
            handle.writelines(record.to_json() + "\n" for record in kept)
        self.state.records = kept
        deltas = read_jsonl(self.run_dir / PREFIX_CACHE_FILE, PrefixCacheDelta)
        self.state.prefix_cache = [d for d in deltas if (d.level, d.repeat) in self.done_levels]
        for name, rows in ((PREFIX_CACHE_FILE, deltas), (FAULTS_FILE, faults)):
            kept_rows = [r for r in rows if (r.level, r.repeat) in self.done_levels]
            (self.run_dir / name).write_text(
                "".join(json.dumps(asdict(r)) + "\n" for r in kept_rows)
            )
        print(
            f"rig: resuming: {len(self.done_levels)} finished level(s) kept "
            f"({len(kept)} records), the rest run again",
            flush=True,
        )

    def use_golden(self, golden: GoldenEntry) -> None:
        """Take the reference side from the cache: only the candidate's server starts."""
        self.state.records += golden.records
        for record in golden.records:
            self.sink(record)
        self.state.sequences = golden.sequences
        self.state.forced["reference"] = golden.forced
        self.plan = self.plan.without("reference")

    def targets(self, servers: dict[str, Server]) -> dict[str, ServerTarget]:
        """Load targets by server label."""
        return {
            label: ServerTarget(
                s.plan.side, s.base_url, s.plan.served_model, s.plan.api_key, s.plan.replica
            )
            for label, s in servers.items()
        }

    def run_phases(self) -> None:
        """Start each round's servers, run its levels, read their kernel proof, stop them. A
        phase's drift replay and A/A control run in its first round with levels to run (its
        last round when every level is kept from an interrupted run)."""
        workload = self.scenario.workload
        rounds = phase_rounds(self.plan.phases, workload.repeats)
        extras_due = set(self.plan.phases)
        for index, planned in enumerate(rounds):
            levels = [
                (level, repeat)
                for level in workload.concurrency
                for repeat in planned.repeats
                if (level, repeat) not in self.done_levels
            ]
            last = all(later.servers != planned.servers for later in rounds[index + 1 :])
            extras = planned.servers in extras_due and bool(levels or last)
            if not levels and not extras:
                continue
            self.state.schedule.append(
                {"servers": list(planned.servers), "levels": [list(lr) for lr in levels]}
            )
            started = time.monotonic()
            plans = [self.plan.servers[label] for label in planned.servers]
            with ServerSet(plans, self.scenario.model.startup_timeout_s) as servers:
                ready = time.monotonic()
                for label in planned.servers:
                    self._add_timing(f"{label}_startup_s", ready - started)
                self.run_load(servers, levels)
                if extras:
                    extras_due.discard(planned.servers)
                    first_pair = {s.plan.side: s for s in servers.values() if s.plan.replica == 0}
                    self.run_drift(first_pair)
                    if self.scenario.control.aa and "reference" in first_pair:
                        self.run_aa(first_pair["reference"])
                self.read_proofs(servers)
                for label in planned.servers:
                    self._add_timing(f"{label}_server_s", time.monotonic() - started)

    def _add_timing(self, name: str, seconds: float) -> None:
        self.state.timings[name] = self.state.timings.get(name, 0.0) + seconds

    def read_proofs(self, servers: dict[str, Server]) -> None:
        """Each server's kernel proof from its /metrics while it still runs: the same way for
        servers the rig started and servers it attached to. For a server the rig started, its
        log and stats files stand in when /metrics has no evidence."""
        for label, server in servers.items():
            try:
                proof = fetch_kernel_proof(server.base_url, server.plan.api_key)
            except (OSError, ValueError) as exc:
                print(f"rig: no kernel proof on {label}'s /metrics ({exc})", flush=True)
                proof = None
            if (proof is None or not proof.marker_kernels) and server.plan.url is None:
                proof = read_kernel_proof(server.plan.log_path, server.plan.stats_dir)
            if proof is not None:
                earlier = self.state.proofs.get(label)
                # A log covers every start of the server (it is appended to); /metrics only
                # the one running now, so a restarted server's answers add up.
                if earlier is not None and proof.origin == "metrics":
                    proof = earlier.combined_with(proof)
                self.state.proofs[label] = proof

    def run_load(self, servers: dict[str, Server], levels: list[tuple[int, int]]) -> None:
        """Warm every server up, then run the (level, repeat) pairs in order."""
        workload = self.scenario.workload
        targets = self.targets(servers)
        warmup = warmup_prompts(workload, self.prompts)
        if warmup:
            jobs = [
                SideJob(
                    target,
                    level_requests(
                        workload,
                        warmup,
                        level=0,
                        repeat=0,
                        side=target.side,
                        run_id=self.run_id,
                        tag=f"warmup{target.replica or ''}-",
                        count=len(warmup),
                    ),
                )
                for target in targets.values()
            ]
            print(f"rig: warm-up, {len(warmup)} untimed requests per server", flush=True)
            run_level(jobs, min(workload.concurrency), timeout_s=workload.timeout_s)
        for level, repeat in levels:
            self.run_one_level(servers, targets, level, repeat)

    def run_one_level(
        self, servers: dict[str, Server], targets: dict[str, ServerTarget], level: int, repeat: int
    ) -> None:
        workload = self.scenario.workload
        before = _counters(targets)
        offsets = {label: server.log_size() for label, server in servers.items()}
        jobs = self.level_jobs(targets, level, repeat)
        results = run_level(
            jobs,
            level,
            timeout_s=workload.timeout_s,
            request_rate=workload.request_rate,
            burstiness=workload.burstiness,
            on_record=self.keep_record,
            level_timeout_s=workload.level_timeout_s,
            seed=workload.seed,
        )
        level_records = [record for side_records in results.values() for record in side_records]
        for label, server in servers.items():
            failed = [
                r.request_id
                for r in level_records
                if r.error is not None
                and (r.side, r.replica) == (server.plan.side, server.plan.replica)
            ]
            affected = ",".join(failed[:20]) + (
                f" (+{len(failed) - 20})" if len(failed) > 20 else ""
            )
            for fault in scan_log(label, server.log_text(offsets[label])):
                self.record_fault(
                    LevelFault(label, level, fault.kind, fault.line, affected, repeat)
                )
            self.state.peak_rss_mb[label] = max(
                self.state.peak_rss_mb.get(label, 0.0), server.rss_bytes() / 2**20
            )
            if server.exited() is not None:
                died = f"exit code {server.exited()}"
                self.record_fault(LevelFault(label, level, "server_died", died, affected, repeat))
                raise ServerError(
                    f"{label} server died during level C={level}; log {server.plan.log_path}:\n"
                    f"{server.log_tail()}"
                )
        after = _counters(targets)
        for label in servers:
            first, last = before[label], after[label]
            calls = (
                last.gdn_prefill_calls - first.gdn_prefill_calls
                if last.gdn_prefill_calls is not None and first.gdn_prefill_calls is not None
                else None
            )
            self.record_prefix_cache(
                PrefixCacheDelta(
                    label,
                    level,
                    repeat,
                    queries=last.queries - first.queries,
                    hits=last.hits - first.hits,
                    gdn_prefill_calls=calls,
                )
            )

    def level_jobs(self, targets: dict[str, ServerTarget], level: int, repeat: int) -> list:
        """Each server's share of a level: a side's ordered requests and its C are sharded over
        its replicas, request i on pair i % R, so both halves of a request pair meet on the
        same pair."""
        jobs = []
        for target in targets.values():
            specs = level_requests(
                self.scenario.workload,
                self.prompts,
                level=level,
                repeat=repeat,
                side=target.side,
                run_id=self.run_id,
            )
            replicas = len(self.plan.side_servers(target.side))
            shards = shard(len(specs), replicas, level)
            if target.replica < len(shards):
                indices, concurrency = shards[target.replica]
                jobs.append(SideJob(target, [specs[i] for i in indices], concurrency))
        return jobs

    def keep_record(self, record: RequestRecord) -> None:
        """On disk and in the run's state as it completes: an interrupted level still
        compares the pairs that finished."""
        self.sink(record)
        self.state.records.append(record)

    def record_fault(self, fault: LevelFault) -> None:
        self.state.faults.append(fault)
        append_jsonl(self.run_dir / FAULTS_FILE, fault)

    def record_prefix_cache(self, delta: PrefixCacheDelta) -> None:
        self.state.prefix_cache.append(delta)
        append_jsonl(self.run_dir / PREFIX_CACHE_FILE, delta)

    def run_drift(self, servers: dict[str, Server]) -> None:
        if not self.scenario.drift.enabled:
            return
        targets = self.targets(servers)
        if "reference" in targets and not self.state.sequences:
            bodies = {
                pid: tokenize_body(p, self.scenario.workload)
                for pid, p in self.prompts_by_id.items()
            }
            reference_records = [r for r in self.state.records if r.side == "reference"]
            self.state.sequences = forced_sequences(reference_records, bodies, targets["reference"])
        self.replay(targets, "drift")

    def replay_indices(self, side: str) -> list[int]:
        """Which of the sequences `side` replays. The reference: every completion it wrote
        (which pairs diverge is known only once the candidate ran, perhaps from the golden
        cache); another side: the drift's sample and the completions its pairs diverge from."""
        if side == "reference":
            return list(range(len(self.state.sequences)))
        records = self.state.aa_records if side == AA_SIDE else self.state.records
        return replay_selection(
            self.state.sequences,
            [r for r in self.state.records if r.side == "reference"],
            [r for r in records if r.side == side],
            self.scenario.drift.max_requests,
        )

    def replay(self, targets: dict[str, ServerTarget], tag: str, concurrency: int = 1) -> None:
        """Teacher-forced replay with top-k, untimed: what several sides replay, they replay
        together (one sequence at a time on all of them, unless `concurrency` lets the server
        batch them), the rest one side at a time."""
        sequences = self.state.sequences
        wanted = {side: self.replay_indices(side) for side in targets}
        shared = sorted(set.intersection(*(set(indices) for indices in wanted.values())))
        calls = [(f"{tag}", list(targets.values()), shared)] + [
            (f"{tag}-{side}", [targets[side]], sorted(set(indices) - set(shared)))
            for side, indices in wanted.items()
        ]
        counts = ", ".join(f"{side} {len(indices)}" for side, indices in wanted.items())
        print(f"rig: teacher-forced replay of {len(sequences)} sequences ({counts})", flush=True)
        for prefix, call_targets, indices in calls:
            if not indices:
                continue
            replayed = replay_forced(
                [sequences[i] for i in indices],
                call_targets,
                salt_prefix=f"{self.run_id}.{prefix}",
                top_k=self.scenario.drift.top_logprobs,
                concurrency=concurrency,
            )
            for side, answers in replayed.items():
                self.state.forced.setdefault(side, {}).update(zip(indices, answers, strict=True))

    @property
    def aa_concurrency(self) -> int:
        workload = self.scenario.workload
        return self.scenario.control.aa_concurrency or max(workload.concurrency)

    def run_aa(self, reference: Server) -> None:
        """Replay the reference's requests on the reference server in reverse order at another
        concurrency, and their teacher-forced sequences batched at that concurrency: the noise
        floor of identical kernels under other batch compositions (other decode batches, other
        chunked-prefill boundaries)."""
        workload = self.scenario.workload
        target = ServerTarget(
            AA_SIDE, reference.base_url, reference.plan.served_model, reference.plan.api_key
        )
        specs = level_requests(
            workload,
            self.prompts,
            level=workload.concurrency[0],
            repeat=0,
            side=AA_SIDE,
            run_id=self.run_id,
        )
        concurrency = self.aa_concurrency
        print(f"rig: A/A control, {len(specs)} requests at C={concurrency}", flush=True)
        results = run_level(
            [SideJob(target, list(reversed(specs)))], concurrency, timeout_s=workload.timeout_s
        )
        self.state.aa_records = results[AA_SIDE]
        if self.state.sequences:
            self.replay({AA_SIDE: target}, "aa-drift", concurrency)

    def store_golden(self) -> None:
        """Keep this run's reference results for the next candidate iteration."""
        reference = [r for r in self.state.records if r.side == "reference"]
        if (
            self.cache is None
            or self.golden is not None
            or self.plan.servers["reference"].url is not None  # not what the key describes
            or "reference" not in self.side_kernels
            or any(r.error is not None for r in reference)
        ):
            return  # only complete, clean reference results are worth reusing
        entry = GoldenEntry(
            source_run=self.run_id,
            records=reference,
            sequences=self.state.sequences,
            forced=self.state.forced.get("reference", {}),
            kernel=self.side_kernels["reference"],
            timings=dict(self.state.timings),
        )
        folder = self.cache.store(self.golden_key, self.golden_fields, entry)
        print(f"rig: reference results stored in the golden cache: {folder}", flush=True)

    @cached_property
    def side_kernels(self) -> dict[str, SideKernel]:
        """Which kernel each side ran, over all its servers; read once, after the run."""
        proofs = {}
        if self.golden is not None:
            proofs["reference"] = self.golden.kernel
        for side in SIDES:
            if side == "reference" and self.golden is not None:
                continue
            found = []
            for plan in self.plan.side_servers(side):
                proof = self.state.proofs.get(plan.label)
                if proof is None and plan.url is None:  # the server died before it was read
                    proof = read_kernel_proof(plan.log_path, plan.stats_dir)
                if proof is not None:
                    found.append((plan, proof))
            if not found:
                continue
            kernel = "+".join(dict.fromkeys(proof.kernel for _, proof in found))
            calls = sum(proof.calls for _, proof in found)
            detail = "; ".join(
                f"{plan.label} ({proof.origin}): {proof.describe()}" for plan, proof in found
            )
            proofs[side] = SideKernel(side, kernel, calls, detail)
        return proofs

    def gdn_backends(self) -> dict[str, dict]:
        """Per server: the GDN prefill backend asked for, what vLLM chose, what ran."""
        return {
            label: {
                "requested": proof.requested_backend,
                "vllm_chose": "+".join(proof.vllm_backends) or None,
                "ran": proof.backend,
                "evidence": proof.origin,
            }
            for label, proof in self.state.proofs.items()
        }

    def outcome(self, error: str | None) -> RunOutcome:
        scenario, state = self.scenario, self.state
        finished = [r for r in state.records if _finished(r)]
        reference = [r for r in finished if r.side == "reference"]
        candidate = [r for r in finished if r.side == "candidate"]
        answered = {r.request_id for r in candidate}
        reference = [r for r in reference if r.request_id in answered]
        replayed = {
            side: forced_positions(state.sequences, forced) for side, forced in state.forced.items()
        }
        pairs = compare_pairs(
            reference,
            candidate,
            scenario.gates.near_tie_margin,
            scenario.workload.max_tokens,
            replayed,
        )
        drift = self._drift("candidate")
        aa_pairs = aa_drift = None
        if state.aa_records:
            # The A/A replay reuses the first level's request ids, so it pairs by id.
            first_level = [r for r in reference if r.level == scenario.workload.concurrency[0]]
            aa_pairs = compare_pairs(
                [r for r in first_level if r.repeat == 0],
                state.aa_records,
                scenario.gates.near_tie_margin,
                scenario.workload.max_tokens,
                replayed,
            )
            aa_drift = self._drift(AA_SIDE)
        hits = sum(p.hits for p in state.prefix_cache)
        kernels = self.side_kernels
        perf = perf_frame(
            state.records, state.aa_records, self.aa_concurrency, self.planted_delay()
        )
        verdict = decide(
            scenario.gates,
            pairs,
            drift,
            hits,
            kernels,
            scenario.candidate.kernel,
            is_aa_run(scenario),
            log_faults=sum(f.kind not in ADVISORY_LOG_KINDS for f in state.faults),
            deltas=perf,
            aa_pairs=aa_pairs,
            aa_drift=aa_drift,
            reference_backend=scenario.model.gdn_prefill_backend,
        )
        if error is not None:
            verdict = _failed(verdict, error)
        return RunOutcome(
            run_id=self.run_id,
            run_dir=self.run_dir,
            scenario_name=scenario.name,
            manifest=build_manifest(scenario, self.plan, self.model_path)
            | {
                "server_peak_rss_mb": state.peak_rss_mb,
                "gdn_backends": self.gdn_backends(),
                "schedule": state.schedule,
            },
            records=state.records,
            pairs=pairs,
            drift=drift,
            prefix_cache=state.prefix_cache,
            faults=state.faults,
            kernels=kernels,
            verdict=verdict,
            aa_pairs=aa_pairs,
            aa_drift=aa_drift,
            timings=state.timings,
            perf=perf,
            error=error,
            prompt_categories={p.id: p.category for p in self.prompts if p.category},
            replayed={side: replayed[side] for side in SIDES if side in replayed},
        )

    def planted_delay(self) -> PlantedDelay | None:
        """The candidate's planted delay (`ref+delay-<N>ms`) and its servers' GDN prefill calls
        per level; None for any other candidate or when a server published no count."""
        kernel = self.scenario.candidate.kernel
        delay_ms = planted_delay_ms(kernel)
        calls: dict[tuple[int, int], int] = {}
        for delta in self.state.prefix_cache:
            plan = self.plan.servers.get(delta.side)
            if plan is None or plan.side != "candidate":
                continue
            if delta.gdn_prefill_calls is None:
                return None
            key = (delta.level, delta.repeat)
            calls[key] = calls.get(key, 0) + delta.gdn_prefill_calls
        return PlantedDelay(kernel, delay_ms, calls) if delay_ms and calls else None

    def _drift(self, side: str) -> list[DriftResult]:
        forced = self.state.forced
        if "reference" not in forced or side not in forced:
            return []
        return drift_results(self.state.sequences, forced["reference"], forced[side])


def _finished(record: RequestRecord) -> bool:
    """Not cut off by an interrupt: a cancelled request says nothing about either kernel."""
    return not (record.error or "").startswith("cancelled")


def _failed(verdict: Verdict, error: str) -> Verdict:
    """The verdict of a run that did not complete: it cannot pass."""
    gates = (*verdict.gates, Gate("run completed", False, error.splitlines()[0]))
    return Verdict(
        "NOT equivalent" if verdict.word != "INVALID" else verdict.word,
        False,
        gates,
        verdict.counts,
        verdict.aa_counts,
    )


def _server_time(timings: dict[str, float]) -> float:
    return sum(v for k, v in timings.items() if k.endswith("_server_s"))


def _cost_comparison(first: dict[str, float], now: dict[str, float]) -> str:
    """Wall time and server time of this run next to the run that filled the cache."""
    wall_ratio = now["wall_s"] / first["wall_s"] if first.get("wall_s") else float("nan")
    first_servers, servers = _server_time(first), _server_time(now)
    server_ratio = servers / first_servers if first_servers else float("nan")
    return (
        f"rig: cost of this verdict: wall {now['wall_s']:.1f} s vs {first.get('wall_s', 0):.1f} s "
        f"for the run that filled the cache ({wall_ratio:.2f}x); server time {servers:.1f} s vs "
        f"{first_servers:.1f} s ({server_ratio:.2f}x)"
    )


def _check_resumable(run_dir: Path, scenario: Scenario) -> None:
    """Resume only the same scenario: mixing results of two scenarios would mean nothing."""
    stored = run_dir / "scenario.resolved.json"
    if not stored.exists():
        raise ScenarioError(f"--resume: {run_dir} holds no interrupted run (no {stored.name})")
    before = json.loads(stored.read_text())
    now = json.loads(scenario.model_dump_json())
    if before != now:
        changed = sorted(k for k in now if before.get(k) != now.get(k))
        raise ScenarioError(f"--resume: the scenario differs from the interrupted run's: {changed}")


def _stop_reporting(run_dir: Path) -> NoReturn:
    """A second interrupt while the report is written: a report cut short is no report."""
    remove_report(run_dir)
    sys.stdout.flush()
    print(
        "rig: error: interrupted twice while the report was written: no report kept; every "
        f"record is in {run_dir / 'requests.jsonl'} (--resume writes the report)",
        file=sys.stderr,
        flush=True,
    )
    os._exit(EXIT_ERROR)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m rig.run", description=__doc__)
    parser.add_argument("scenario", type=Path, help="scenario YAML file")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a scenario key (dotted path), e.g. --set workload.max_tokens=32",
    )
    parser.add_argument("--run-id", help="name of the results folder (default: time + scenario)")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue the interrupted run named by --run-id: finished levels are kept",
    )
    parser.add_argument(
        "--no-cache",
        action="store_true",
        help="run the reference server even when the golden cache holds its results",
    )
    parser.add_argument(
        "--plan",
        action="store_true",
        help="run the preflight checks, print the resolved plan and exit without starting anything",
    )
    parser.add_argument(
        "--assume-gpus",
        type=int,
        metavar="N",
        help="with --plan: plan for a node with N GPUs (this machine's GPUs are not looked at)",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=Path(".cache/golden"),
        help="golden cache of reference results (default: .cache/golden)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    interrupts_raise()
    wall_start = time.monotonic()
    try:
        scenario = load_scenario(args.scenario, args.overrides)
        run_id = (
            args.run_id or scenario.run_id or f"{time.strftime('%Y%m%d-%H%M%S')}-{scenario.name}"
        )
        run_dir = scenario.results_dir / run_id
        if args.resume:
            if not (args.run_id or scenario.run_id):
                raise ScenarioError("--resume needs --run-id naming the interrupted run")
            _check_resumable(run_dir, scenario)
        elif run_dir.exists() and any(run_dir.iterdir()):
            raise ScenarioError(
                f"results folder {run_dir} already exists and is not empty (--resume continues it)"
            )
        if args.assume_gpus is not None and not args.plan:
            raise ScenarioError("--assume-gpus plans for another node: use it with --plan")
        if args.assume_gpus is not None and args.assume_gpus < 0:
            raise ScenarioError("--assume-gpus must be 0 or more")
        prompts = resolve_prompts(scenario.workload)
        hardware = Hardware.detect()
        if args.assume_gpus is not None:
            hardware = Hardware.assume_gpus(args.assume_gpus)
        checked = preflight(scenario, run_dir, hardware)
        if args.plan:
            print(render_plan(checked, len(prompts)))
            return EXIT_PASS
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ScenarioError(f"results folder {run_dir}: {exc.strerror}") from None
        cache = None if args.no_cache else GoldenCache(args.cache_dir)
        runner = Runner(
            scenario, run_id, run_dir, checked.plan, checked.model.path, cache, resume=args.resume
        )
        (run_dir / "scenario.resolved.json").write_text(scenario.model_dump_json(indent=2))
        servers = build_manifest(scenario, runner.plan, runner.model_path)["servers"]
        (run_dir / "servers.json").write_text(json.dumps(servers, indent=2))
    except (ScenarioError, PromptFileError, WorkloadError, PreflightError, ServerError) as exc:
        print(f"rig: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except OSError as exc:  # the results folder cannot be written
        print(f"rig: error: results folder {run_dir}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    mode = runner.plan.placement.describe()
    if runner.golden is not None:
        mode = f"reference from the golden cache (run {runner.golden.source_run})"
    print(
        f"rig: run {run_id}: {len(runner.prompts)} prompts, levels "
        f"{scenario.workload.concurrency}, sides {mode}; results in {run_dir}",
        flush=True,
    )
    error = None
    try:
        runner.run_phases()
    except ServerError as exc:
        error = str(exc)
    except KeyboardInterrupt:
        error = "interrupted (Ctrl-C or SIGTERM); servers stopped, partial results kept"
    except OSError as exc:  # the results folder stopped taking writes: no report can follow
        print(
            f"rig: error: writing the results failed ({exc}); servers stopped, the records "
            f"written so far are whole lines in {run_dir / 'requests.jsonl'}",
            file=sys.stderr,
        )
        return EXIT_ERROR
    finally:
        runner.sink.close()
    with InterruptsDeferred(REPORT_NOTICE, lambda: _stop_reporting(run_dir)):
        runner.state.timings["wall_s"] = time.monotonic() - wall_start
        if error is None:
            runner.store_golden()
        try:
            write_replay(run_dir / REPLAY_FILE, runner.state.sequences, runner.state.forced)
            outcome = runner.outcome(error)
            paths = write_report(outcome)
        except Exception as exc:  # the raw results are on disk; say where, keep the traceback
            (run_dir / "report-error.txt").write_text(traceback.format_exc())
            print(
                f"rig: error: building the report failed ({type(exc).__name__}: {exc}); raw "
                f"results kept in {run_dir / 'requests.jsonl'}, traceback in "
                f"{run_dir / 'report-error.txt'}",
                file=sys.stderr,
            )
            return EXIT_ERROR
    if runner.golden is not None:
        print(_cost_comparison(runner.golden.timings, runner.state.timings), flush=True)
    print((run_dir / "summary.md").read_text(encoding="utf-8"))
    print(f"rig: report: {paths['report.html']}")
    if error is not None:
        print(f"rig: error: {error}", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_PASS if outcome.verdict.passed else EXIT_GATE_FAILED


if __name__ == "__main__":
    sys.exit(main())
