"""The run stage's own decisions, without servers (tests/e2e/ drives whole runs)."""

import pytest

from rig.run import _check_resumable, _cost_comparison, is_aa_run
from rig.scenario import Scenario, ScenarioError


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
