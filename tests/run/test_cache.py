"""The golden cache: its key follows the reference's configuration and never shows its secrets;
an entry keeps what the verdict needs of the reference, its replay's top-k included."""

import json

from rig.run.cache import ENTRY_FORMAT, GoldenCache, GoldenEntry, golden_key
from rig.scenario.config import Scenario
from rig.scenario.prompts import ChatMessage, Prompt
from rig.serve.hardware import Hardware
from rig.serve.plan import plan_servers
from rig.verdict.drift import ForcedLogprobs, ForcedSequence
from rig.verdict.gates import SideKernel


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


def test_an_entry_keeps_the_references_replay_with_its_top_k(tmp_path, make_record):
    """A later candidate's divergences are classified from the cached reference replay."""
    sequences = [ForcedSequence("p", (1, 2), (3, 4)), ForcedSequence("q", (1,), (5,))]
    forced = {
        0: ForcedLogprobs((None, -1.0, -0.5, -0.25), ({3: -0.5, 9: -0.75}, {4: -0.25, 8: -2.0})),
        1: ForcedLogprobs(error="RuntimeError: answered 500"),
    }
    entry = GoldenEntry(
        source_run="run-1",
        records=[make_record("reference", "q0", token_ids=[3, 4])],
        sequences=sequences,
        forced=forced,
        kernel=SideKernel("reference", "vllm-cpu-native", 4),
        timings={"wall_s": 1.0},
    )
    cache = GoldenCache(tmp_path / "golden")
    cache.store("k", {"model": "m"}, entry)
    back = cache.load("k")
    assert back.forced == forced  # int token ids survive JSON
    assert back.sequences == sequences and back.records == entry.records
    assert cache.load("other") is None


def test_the_key_follows_the_replay_top_k_and_the_entry_format(tmp_path):
    _, fields = key_of(tmp_path, None)
    assert fields["drift"]["top_logprobs"] == 5
    assert fields["entry_format"] == ENTRY_FORMAT >= 2


def test_how_speed_is_measured_is_not_part_of_the_key(tmp_path):
    """The schedule, the resolution, its budget and the warm-up change how the sides are timed,
    not what the reference writes: a candidate run with other speed settings still hits."""

    def key(**workload) -> str:
        scenario = Scenario.model_validate(
            {
                "name": "t",
                "workload": {"prompts": [{"long_tokens": [10]}], "concurrency": [1]} | workload,
            }
        )
        hardware = Hardware(gpu_count=0, cpu_ids=(0, 1))
        plan = plan_servers(scenario, "org/model", tmp_path, hardware)
        prompt = Prompt(id="p", messages=(ChatMessage("user", "hi"),), source="test")
        return golden_key(scenario, plan.servers["reference"], "org/model", [prompt])[0]

    speed = {"schedule": "alternate", "speed_resolution_pct": 3, "repeats": 6}
    assert key(repeats=6) == key(**speed) == key(repeats=6, warmup_requests=0)
    assert key(repeats=6) != key(repeats=6, max_tokens=9)
