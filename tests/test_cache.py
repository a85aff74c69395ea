"""The golden cache key: it follows the reference's configuration, never shows its secrets."""

import json

from rig.cache import golden_key
from rig.hardware import Hardware
from rig.prompts import ChatMessage, Prompt
from rig.scenario import Scenario
from rig.server_plan import plan_servers


def key_of(tmp_path, api_key: str | None) -> tuple[str, dict]:
    scenario = Scenario.model_validate(
        {
            "name": "t",
            "workload": {"prompts": [{"long_tokens": [10]}], "concurrency": [1]},
            "reference": {"api_key": api_key, "env": {"HF_TOKEN": "hf_secret"}},
        }
    )
    plan = plan_servers(scenario, "org/model", tmp_path, Hardware(gpu_count=0, cpu_ids=(0, 1)))
    prompts = [Prompt(id="p", messages=(ChatMessage("user", "hello"),), source="test")]
    return golden_key(scenario, plan.servers["reference"], "org/model", prompts)


def test_the_key_changes_with_the_api_key_but_its_fields_never_hold_it(tmp_path):
    key, fields = key_of(tmp_path, "sk-first")
    other, _ = key_of(tmp_path, "sk-second")
    assert key != other
    stored = json.dumps(fields)
    assert "sk-first" not in stored and "hf_secret" not in stored
    assert fields["env"]["VLLM_API_KEY"].startswith("sha256:")
