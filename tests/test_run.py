"""The run stage's own decisions, without servers (tests/e2e/ drives whole runs)."""

import pytest

import rig.run
from rig.drift import ForcedSequence
from rig.hardware import Hardware
from rig.report import LevelFault
from rig.run import (
    AA_SIDE,
    FAULTS_FILE,
    Round,
    Runner,
    _check_resumable,
    _cost_comparison,
    append_jsonl,
    is_aa_run,
    phase_rounds,
)
from rig.scenario import Scenario, ScenarioError
from rig.server_plan import plan_servers
from rig.servers import Server


def scenario(**overrides) -> Scenario:
    data = {"name": "t", "workload": {"prompts": [{"long_tokens": [100]}], "concurrency": [1]}}
    data.update(overrides)
    return Scenario.model_validate(data)


def test_aa_run_means_identically_configured_sides():
    assert is_aa_run(scenario())
    assert not is_aa_run(scenario(candidate={"kernel": "ns4"}))
    assert not is_aa_run(scenario(candidate={"env": {"X": "1"}}))


def test_resume_only_continues_the_same_scenario(tmp_path):
    with pytest.raises(ScenarioError, match="no interrupted run"):
        _check_resumable(tmp_path, scenario())
    (tmp_path / "scenario.resolved.json").write_text(scenario().model_dump_json())
    _check_resumable(tmp_path, scenario())
    with pytest.raises(ScenarioError, match=r"differs.*'candidate'"):
        _check_resumable(tmp_path, scenario(candidate={"kernel": "ns3"}))


def test_cost_comparison_puts_both_runs_side_by_side():
    first = {"wall_s": 100.0, "reference_server_s": 90.0, "candidate_server_s": 90.0}
    now = {"wall_s": 50.0, "candidate_server_s": 45.0}
    line = _cost_comparison(first, now)
    assert "wall 50.0 s vs 100.0 s" in line and "(0.50x)" in line
    assert "server time 45.0 s vs 180.0 s (0.25x)" in line


def test_resume_keeps_finished_levels_and_their_faults_but_not_a_level_whose_server_died(
    tmp_path, make_record
):
    run = scenario(workload={"prompts": [{"long_tokens": [100]}], "concurrency": [1, 2]})
    plan = plan_servers(run, "/m", tmp_path, Hardware(gpu_count=0, cpu_ids=(0, 1)))
    with open(tmp_path / "requests.jsonl", "w", encoding="utf-8") as handle:
        for level in (1, 2):
            for side in ("reference", "candidate"):
                record = make_record(side, f"c{level}-r0-0000", level=level)
                handle.write(record.to_json() + "\n")
    append_jsonl(tmp_path / FAULTS_FILE, LevelFault("candidate", 1, "traceback", "Traceback"))
    append_jsonl(tmp_path / FAULTS_FILE, LevelFault("candidate", 2, "server_died", "exit 9"))
    runner = Runner(run, "r", tmp_path, plan, "/m", cache=None, resume=True)
    assert runner.done_levels == {(1, 0)}
    assert [f.kind for f in runner.state.faults] == ["traceback"]
    assert {r.level for r in runner.state.records} == {1}
    assert "server_died" not in (tmp_path / FAULTS_FILE).read_text()
    runner.sink.close()


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
def scheduled(monkeypatch, tmp_path):
    """A Runner whose servers, levels, drift replay and A/A control only note that they ran."""
    events: list = []
    monkeypatch.setattr(rig.run, "ServerSet", lambda *a: FakeServerSet(events, *a))
    monkeypatch.setattr(
        Runner,
        "run_one_level",
        lambda self, servers, targets, level, repeat: events.append(
            ("level", *servers, f"C{level}", f"r{repeat}")
        ),
    )
    monkeypatch.setattr(Runner, "run_drift", lambda self, pair: events.append(("drift", *pair)))
    monkeypatch.setattr(Runner, "run_aa", lambda self, reference: events.append(("aa",)))
    monkeypatch.setattr(Runner, "read_proofs", lambda self, servers: None)

    def make(cores: tuple[int, ...], done: set | None = None) -> Runner:
        workload = {
            "prompts": [{"long_tokens": [100]}],
            "concurrency": [1, 4],
            "repeats": 2,
            "warmup_requests": 0,
        }
        run = scenario(workload=workload, candidate={"kernel": "ns4"}, control={"aa": True})
        plan = plan_servers(run, "/m", tmp_path, Hardware(gpu_count=0, cpu_ids=cores))
        runner = Runner(run, "r", tmp_path, plan, "/m", cache=None)
        runner.done_levels = done or set()
        events.clear()
        runner.run_phases()
        runner.sink.close()
        return runner

    return make, events


def test_sequential_sides_interleave_their_repeats_restarting_the_servers(scheduled):
    make, events = scheduled
    runner = make(cores=(0,))  # one core: the sides one after the other
    assert runner.plan.placement.mode == "sequential"
    ref, cand = "reference", "candidate"
    assert events == [
        ("start", ref), ("level", ref, "C1", "r0"), ("level", ref, "C4", "r0"),
        ("drift", ref), ("aa",), ("stop", ref),
        ("start", cand), ("level", cand, "C1", "r0"), ("level", cand, "C4", "r0"),
        ("drift", cand), ("stop", cand),
        ("start", ref), ("level", ref, "C1", "r1"), ("level", ref, "C4", "r1"), ("stop", ref),
        ("start", cand), ("level", cand, "C1", "r1"), ("level", cand, "C4", "r1"), ("stop", cand),
    ]  # fmt: skip
    assert [(s["servers"], s["levels"]) for s in runner.state.schedule] == [
        ([ref], [[1, 0], [4, 0]]),
        ([cand], [[1, 0], [4, 0]]),
        ([ref], [[1, 1], [4, 1]]),
        ([cand], [[1, 1], [4, 1]]),
    ]
    assert set(runner.state.timings) == {
        f"{s}_{t}_s" for s in (ref, cand) for t in ("startup", "server")
    }


def test_sides_at_once_run_every_repeat_of_a_level_back_to_back_on_one_start(scheduled):
    make, events = scheduled
    runner = make(cores=(0, 1))
    assert runner.plan.placement.mode == "simultaneous"
    levels = [e[-2:] for e in events if e[0] == "level"]
    assert levels == [("C1", "r0"), ("C1", "r1"), ("C4", "r0"), ("C4", "r1")]
    assert [e[0] for e in events].count("start") == 1


def test_resumed_interleaved_run_starts_only_the_rounds_it_still_needs(scheduled):
    make, events = scheduled
    make(cores=(0,), done={(1, 0), (4, 0), (1, 1)})
    assert [e for e in events if e[0] in ("start", "level", "drift")] == [
        ("start", "reference"), ("level", "reference", "C4", "r1"), ("drift", "reference"),
        ("start", "candidate"), ("level", "candidate", "C4", "r1"), ("drift", "candidate"),
    ]  # fmt: skip
    make(cores=(0,), done={(c, r) for c in (1, 4) for r in (0, 1)})
    # every level kept: each side starts once more, last, for its drift replay (and the A/A)
    assert [e for e in events if e[0] != "stop"] == [
        ("start", "reference"), ("drift", "reference"), ("aa",),
        ("start", "candidate"), ("drift", "candidate"),
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


def test_the_reference_replays_every_completion_another_side_its_sample_and_divergences(
    tmp_path, make_record
):
    """The reference's replay must hold the margins of any divergence a later candidate shows
    (golden cache, sides one after the other); the others replay what their verdict reads."""
    run = scenario(drift={"max_requests": 1})
    plan = plan_servers(run, "/m", tmp_path, Hardware(gpu_count=0, cpu_ids=(0, 1)))
    runner = Runner(run, "r", tmp_path, plan, "/m", cache=None)
    texts = {"q0": "a", "q1": "b", "q2": "c"}
    for i, (request, text) in enumerate(texts.items()):
        reference = make_record("reference", request, text, prompt_id=f"p{i}", token_ids=[i])
        runner.state.records.append(reference)
        runner.state.sequences.append(ForcedSequence(f"p{i}", (9,), (i,)))
        other = "changed" if request == "q2" else text
        runner.state.records.append(make_record("candidate", request, other, token_ids=[7]))
        if request != "q0":
            runner.state.aa_records.append(make_record(AA_SIDE, request, text, token_ids=[i]))
    runner.state.aa_records[0] = make_record(AA_SIDE, "q1", "other", token_ids=[5])
    assert runner.replay_indices("reference") == [0, 1, 2]
    assert runner.replay_indices("candidate") == [0, 2]
    assert runner.replay_indices(AA_SIDE) == [0, 1]
    runner.sink.close()
