"""The run's schedule without servers: which servers start when and what each start runs."""

import pytest

import rig.run.phases
from kernels.proof import KernelProof
from rig.load.server_metrics import MetricsUnreadable
from rig.run.phases import PhaseSteps, read_proofs, run_phases
from rig.run.state import RunState
from rig.serve.hardware import Hardware
from rig.serve.placement import Round, phase_rounds
from rig.serve.servers import Server
from tests.run_fakes import FakeServer, run_context


class FakeServerSet:
    """Stands in for ServerSet: notes each start and stop; its servers never run."""

    def __init__(self, events: list, plans: list, startup_timeout_s: float) -> None:
        self.events, self.plans = events, plans

    def __enter__(self) -> dict:
        self.events.append(("start", *(p.label for p in self.plans)))
        return {plan.label: Server(plan) for plan in self.plans}

    def __exit__(self, *exc_info) -> None:
        self.events.append(("stop", *(p.label for p in self.plans)))


@pytest.fixture
def scheduled(tmp_path):
    """Runs the schedule with steps that only note that they ran."""
    events: list = []

    def noting_load(servers, levels):
        for level, repeat in levels:
            events.append(("level", *servers, f"C{level}", f"r{repeat}"))

    steps = PhaseSteps(
        start=lambda *a: FakeServerSet(events, *a),
        load=noting_load,
        drift=lambda pair: events.append(("drift", *pair)),
        aa=lambda reference: events.append(("aa",)),
        self_check=lambda candidate: events.append(("self-check", candidate.plan.side)),
        proofs=lambda servers: None,
    )

    def make(cores: tuple[int, ...], done: frozenset = frozenset()):
        workload = {
            "prompts": [{"long_tokens": [100]}],
            "concurrency": [1, 4],
            "repeats": 2,
            "warmup_requests": 0,
        }
        ctx = run_context(
            tmp_path,
            Hardware(gpu_count=0, cpu_ids=cores),
            workload=workload,
            candidate={"kernel": "ns4"},
            control={"aa": True, "self_check": True},
        )
        state = RunState()
        events.clear()
        run_phases(ctx, done, state, steps)
        return ctx, state

    return make, events


def test_sequential_sides_interleave_their_repeats_restarting_the_servers(scheduled):
    make, events = scheduled
    ctx, state = make(cores=(0,))  # one core: the sides one after the other
    assert ctx.plan.placement.mode == "sequential"
    ref, cand = "reference", "candidate"
    assert events == [
        ("start", ref), ("level", ref, "C1", "r0"), ("level", ref, "C4", "r0"),
        ("drift", ref), ("aa",), ("stop", ref),
        ("start", cand), ("level", cand, "C1", "r0"), ("level", cand, "C4", "r0"),
        ("drift", cand), ("self-check", cand), ("stop", cand),
        ("start", ref), ("level", ref, "C1", "r1"), ("level", ref, "C4", "r1"), ("stop", ref),
        ("start", cand), ("level", cand, "C1", "r1"), ("level", cand, "C4", "r1"), ("stop", cand),
    ]  # fmt: skip
    assert [(s["servers"], s["levels"]) for s in state.schedule] == [
        ([ref], [[1, 0], [4, 0]]),
        ([cand], [[1, 0], [4, 0]]),
        ([ref], [[1, 1], [4, 1]]),
        ([cand], [[1, 1], [4, 1]]),
    ]
    assert set(state.timings) == {f"{s}_{t}_s" for s in (ref, cand) for t in ("startup", "server")}


def test_sides_at_once_run_every_repeat_of_a_level_back_to_back_on_one_start(scheduled):
    make, events = scheduled
    ctx, _ = make(cores=(0, 1))
    assert ctx.plan.placement.mode == "simultaneous"
    levels = [e[-2:] for e in events if e[0] == "level"]
    assert levels == [("C1", "r0"), ("C1", "r1"), ("C4", "r0"), ("C4", "r1")]
    assert [e[0] for e in events].count("start") == 1


def test_resumed_interleaved_run_starts_only_the_rounds_it_still_needs(scheduled):
    make, events = scheduled
    make(cores=(0,), done=frozenset({(1, 0), (4, 0), (1, 1)}))
    assert [e for e in events if e[0] in ("start", "level", "drift")] == [
        ("start", "reference"), ("level", "reference", "C4", "r1"), ("drift", "reference"),
        ("start", "candidate"), ("level", "candidate", "C4", "r1"), ("drift", "candidate"),
    ]  # fmt: skip
    make(cores=(0,), done=frozenset((c, r) for c in (1, 4) for r in (0, 1)))
    # every level kept: each side starts once more, last, for its drift replay (and the A/A)
    assert [e for e in events if e[0] != "stop"] == [
        ("start", "reference"), ("drift", "reference"), ("aa",),
        ("start", "candidate"), ("drift", "candidate"), ("self-check", "candidate"),
    ]  # fmt: skip


def test_phase_rounds():
    sides = (("reference",), ("candidate",))
    assert phase_rounds(sides, 1) == [Round(("reference",), (0,)), Round(("candidate",), (0,))]
    assert phase_rounds((("reference", "candidate"),), 3) == [
        Round(("reference", "candidate"), (0, 1, 2))
    ]
    assert [(r.servers[0], r.repeats) for r in phase_rounds(sides, 2)] == [
        ("reference", (0,)), ("candidate", (0,)), ("reference", (1,)), ("candidate", (1,)),
    ]  # fmt: skip


def proof(kernel: str, calls: int, origin: str) -> KernelProof:
    return KernelProof((kernel,), (kernel,), ("sha",), calls, (1,), None, origin=origin)


def test_a_restarted_servers_metrics_proofs_add_up_and_a_silent_one_falls_back_to_its_log(
    tmp_path, monkeypatch
):
    ctx = run_context(tmp_path, candidate={"kernel": "ns4"})
    servers = {label: FakeServer(plan) for label, plan in ctx.plan.servers.items()}
    metrics = {servers["reference"].base_url: proof("vllm-cpu-native", 5, "metrics")}

    def fetch(url, api_key):
        if url not in metrics:
            raise MetricsUnreadable("connection refused")
        return metrics[url]

    monkeypatch.setattr(rig.run.phases, "fetch_kernel_proof", fetch)
    monkeypatch.setattr(
        rig.run.phases, "read_kernel_proof", lambda log, stats: proof("ns4", 2, "log")
    )
    state = RunState()
    read_proofs(state, servers)
    read_proofs(state, servers)
    assert state.proofs["reference"].prefill_calls == 10  # two starts' /metrics, summed
    assert state.proofs["candidate"].origin == "log"
    assert state.proofs["candidate"].prefill_calls == 2  # a log covers every start already


def test_the_profiled_block_runs_once_per_server_after_its_last_timed_block(tmp_path):
    events: list = []
    steps = PhaseSteps(
        start=lambda *a: FakeServerSet(events, *a),
        load=lambda servers, levels: events.extend(("level", *servers) for _ in levels),
        drift=lambda pair: None,
        aa=lambda reference: None,
        self_check=lambda candidate: None,
        proofs=lambda servers: events.append(("proofs", *servers)),
        profile=lambda servers: events.append(("profile", *servers)),
    )
    workload = {"prompts": [{"long_tokens": [100]}], "concurrency": [1], "repeats": 2}
    ctx = run_context(tmp_path, Hardware(gpu_count=0, cpu_ids=(0,)), workload=workload)
    run_phases(ctx, frozenset(), RunState(), steps)
    ref, cand = "reference", "candidate"
    assert [e for e in events if e[0] != "proofs"] == [
        ("start", ref), ("level", ref), ("stop", ref),
        ("start", cand), ("level", cand), ("stop", cand),
        ("start", ref), ("level", ref), ("profile", ref), ("stop", ref),
        ("start", cand), ("level", cand), ("profile", cand), ("stop", cand),
    ]  # fmt: skip
    assert events.index(("profile", ref)) < len(events) - 1 - events[::-1].index(("proofs", ref))
