"""The scenario's `profile:` key: its level must be one the workload runs; the first by default."""

import pytest

from rig import PROJECT_ROOT
from rig.scenario.config import Scenario, ScenarioError
from rig.scenario.loader import load_scenario
from rig.scenario.profile_config import DEFAULT_PROFILE_REQUESTS, ProfileConfig, profile_level
from tests.scenario.test_config import MINIMAL, error_of, write


def test_a_level_the_workload_does_not_run_is_one_line(tmp_path):
    data = {**MINIMAL, "profile": {"level": 3}}
    message = error_of(write(tmp_path, data))
    assert "profile.level 3 is not a level of workload.concurrency" in message


def test_the_profile_defaults_to_the_first_level_and_a_few_requests(tmp_path):
    scenario = load_scenario(write(tmp_path, {**MINIMAL, "profile": {}}))
    assert scenario.profile == ProfileConfig()
    assert scenario.profile.requests == DEFAULT_PROFILE_REQUESTS
    first = scenario.workload.concurrency[0]
    assert profile_level(scenario.workload.concurrency, scenario.profile) == first
    assert profile_level([1, 4], ProfileConfig(level=4)) == 4


def test_no_profile_unless_asked(tmp_path):
    assert load_scenario(write(tmp_path, MINIMAL)).profile is None
    assert "profile" in Scenario.model_fields
    assert "requests" in error_of(write(tmp_path, {**MINIMAL, "profile": {"requests": 0}}))


def test_a_conversation_workload_is_not_profiled():
    shipped = PROJECT_ROOT / "scenarios" / "multi-turn.yaml"
    assert load_scenario(shipped).profile is None
    with pytest.raises(ScenarioError) as raised:
        load_scenario(shipped, ["profile={}"])
    assert "profile: a conversation's turns wait on each other's answers" in str(raised.value)
