"""The run stage's own decisions, without servers (tests/e2e/ drives whole runs)."""

import pytest

from rig.drift import ForcedSequence
from rig.hardware import Hardware
from rig.report import LevelFault
from rig.run import (
    AA_SIDE,
    FAULTS_FILE,
    Runner,
    _check_resumable,
    _cost_comparison,
    append_jsonl,
    is_aa_run,
)
from rig.scenario import Scenario, ScenarioError
from rig.server_plan import plan_servers


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
