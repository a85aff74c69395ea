"""The scenario's accuracy block: defaults, bounds, unknown keys."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rig.scenario.accuracy_config import GSM8K_STOP, AccuracyConfig
from rig.scenario.config import Scenario


def scenario(**accuracy) -> Scenario:
    return Scenario.model_validate(
        {
            "name": "t",
            "workload": {"prompts": [{"long_tokens": [10]}], "concurrency": [1, 4]},
            "accuracy": accuracy,
        }
    )


def test_defaults_are_lm_evals_gsm8k_task():
    block = scenario().accuracy
    assert block == AccuracyConfig()
    assert (block.task, block.shots, block.answer, block.questions) == ("gsm8k", 5, "strict", None)
    assert tuple(block.stop) == GSM8K_STOP and block.source == "gsm8k"
    assert scenario(path="mine.jsonl").accuracy.source == "mine.jsonl"


@pytest.mark.parametrize(
    "bad",
    [{"shots": 6}, {"task": "mmlu"}, {"answer": "loose"}, {"alpha": 1.5}, {"max_drop": 1}],
)
def test_bad_keys_are_rejected(bad):
    with pytest.raises(ValidationError):
        scenario(**bad)
