from pathlib import Path

import pytest
import yaml

from rig import PROJECT_ROOT
from rig.scenario.config import TINY_MODEL, PromptSource, Scenario, ScenarioError
from rig.scenario.loader import load_scenario
from rig.scenario.workload import resolve_prompts

SHIPPED = sorted((PROJECT_ROOT / "scenarios").glob("*.yaml"))

MINIMAL = {"workload": {"prompts": [{"long_tokens": [100]}], "concurrency": [1]}}


def write(tmp_path: Path, data, name: str = "scn.yaml") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data), encoding="utf-8")
    return path


def error_of(path: Path, overrides: list[str] | None = None) -> str:
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path, overrides)
    message = str(caught.value)
    assert "\n" not in message
    assert str(path) in message
    return message


# --- shipped scenarios ------------------------------------------------------------------------


def test_scenarios_are_shipped():
    assert {p.stem for p in SHIPPED} >= {"smoke", "lowconc", "highconc"}


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_shipped_scenario_validates_and_its_prompts_resolve(path, monkeypatch):
    monkeypatch.chdir(PROJECT_ROOT)
    scenario = load_scenario(path)
    assert scenario.name == path.stem
    assert scenario.candidate.kernel  # every shipped scenario tests a candidate kernel
    for source in scenario.workload.prompts:
        assert source.path is None or source.path.exists()
    prompts = resolve_prompts(scenario.workload)
    assert len(prompts) == len({p.id for p in prompts}) > 0


def test_minimal_scenario_takes_the_defaults(tmp_path):
    scenario = load_scenario(write(tmp_path, MINIMAL, "mini.yaml"))
    assert scenario.name == "mini"
    assert scenario.model.name == TINY_MODEL and scenario.model.is_tiny
    assert scenario.workload.endpoint == "completions"
    assert scenario.candidate.kernel is None
    # timed requests as production sends them; the replay's top-k gives the margins
    assert (scenario.workload.top_logprobs, scenario.workload.ignore_eos) == (0, False)
    assert (scenario.drift.enabled, scenario.drift.top_logprobs) == (True, 5)


@pytest.mark.parametrize("value", [0, 21])
def test_replay_top_k_is_one_to_twenty(tmp_path, value):
    message = error_of(write(tmp_path, {**MINIMAL, "drift": {"top_logprobs": value}}))
    assert "drift.top_logprobs" in message


def test_name_in_the_file_beats_the_file_stem(tmp_path):
    assert load_scenario(write(tmp_path, {**MINIMAL, "name": "mine"})).name == "mine"


# --- one-line errors that name the file and the key --------------------------------------------


def test_unknown_key_is_named(tmp_path):
    data = {"workload": {**MINIMAL["workload"], "max_tokes": 5}}
    message = error_of(write(tmp_path, data))
    assert "unknown key 'workload.max_tokes'" in message


def test_unknown_top_level_key_is_named(tmp_path):
    message = error_of(write(tmp_path, {**MINIMAL, "gatez": {}}))
    assert "unknown key 'gatez'" in message


def test_wrong_type_is_named(tmp_path):
    data = {"workload": {**MINIMAL["workload"], "max_tokens": "many"}}
    message = error_of(write(tmp_path, data))
    assert "key 'workload.max_tokens'" in message
    assert "integer" in message


def test_wrong_type_inside_a_side_is_named(tmp_path):
    message = error_of(write(tmp_path, {**MINIMAL, "candidate": {"env": ["A=1"]}}))
    assert "key 'candidate.env'" in message


def test_missing_key_is_named(tmp_path):
    message = error_of(write(tmp_path, {"workload": {"prompts": [{"long_tokens": [10]}]}}))
    assert "missing key 'workload.concurrency'" in message


def test_missing_workload_is_named(tmp_path):
    assert "missing key 'workload'" in error_of(write(tmp_path, {"name": "x"}))


def test_concurrency_zero_is_rejected(tmp_path):
    data = {"workload": {"prompts": [{"long_tokens": [10]}], "concurrency": [4, 0]}}
    message = error_of(write(tmp_path, data))
    assert "key 'workload.concurrency.1'" in message


def test_empty_concurrency_list_is_rejected(tmp_path):
    data = {"workload": {"prompts": [{"long_tokens": [10]}], "concurrency": []}}
    assert "key 'workload.concurrency'" in error_of(write(tmp_path, data))


def test_blank_kernel_name_is_rejected(tmp_path):
    message = error_of(write(tmp_path, {**MINIMAL, "candidate": {"kernel": "  "}}))
    assert "key 'candidate.kernel'" in message


# --- prompt sources ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "source",
    [
        {},
        {"path": "p.jsonl", "long_tokens": [10]},
        {"path": "p.jsonl", "prompt_set": "mt-bench"},
        {"long_tokens": []},
    ],
    ids=["neither", "path-and-long", "path-and-set", "empty-long-list"],
)
def test_prompt_source_needs_exactly_one_kind(tmp_path, source):
    data = {"workload": {"prompts": [source], "concurrency": [1]}}
    message = error_of(write(tmp_path, data))
    assert "key 'workload.prompts.0'" in message
    assert "exactly one of 'path', 'prompt_set' or 'long_tokens'" in message


def test_prompt_source_model_accepts_each_kind_alone():
    assert PromptSource(path=Path("x.jsonl")).long_tokens == []
    assert PromptSource(long_tokens=[5]).path is None
    assert PromptSource(prompt_set="mt-bench", limit=50).path is None


def test_unknown_prompt_set_is_rejected_naming_the_known_ones(tmp_path):
    data = {"workload": {"prompts": [{"prompt_set": "mmlu"}], "concurrency": [1]}}
    message = error_of(write(tmp_path, data))
    assert "key 'workload.prompts.0.prompt_set'" in message
    assert "unknown prompt set 'mmlu'" in message and "mt-bench" in message


def test_non_positive_long_prompt_length_is_rejected(tmp_path):
    data = {"workload": {"prompts": [{"long_tokens": [10, 0]}], "concurrency": [1]}}
    assert "key 'workload.prompts.0.long_tokens.1'" in error_of(write(tmp_path, data))


# --- model shorthand ---------------------------------------------------------------------------


# --- --set overrides ---------------------------------------------------------------------------


def test_scenario_is_frozen(tmp_path):
    scenario = load_scenario(write(tmp_path, MINIMAL))
    with pytest.raises(ValueError):
        scenario.workload.max_tokens = 1
    assert isinstance(scenario, Scenario)


def test_side_lookup(tmp_path):
    scenario = load_scenario(write(tmp_path, {**MINIMAL, "candidate": {"kernel": "ns4"}}))
    assert scenario.side("candidate").kernel == "ns4"
    assert scenario.side("reference").kernel is None


# --- model presets ----------------------------------------------------------------------------


def test_concurrency_beyond_the_admitted_limit_is_refused(tmp_path):
    path = write(tmp_path, {**MINIMAL, "workload": {**MINIMAL["workload"], "concurrency": [300]}})
    assert "exceeds model.api_concurrency_limit 256" in error_of(path, ["model=Qwen3.5-397B"])


def test_gdn_prefill_backend_defaults_to_fla_and_takes_only_known_backends(tmp_path):
    path = write(tmp_path, MINIMAL)
    assert load_scenario(path).model.gdn_prefill_backend == "triton"
    assert load_scenario(path, ["model.gdn_prefill_backend=cutedsl"]).model.gdn_prefill_backend
    assert "gdn_prefill_backend" in error_of(path, ["model.gdn_prefill_backend=cuda"])


def test_api_key_is_a_secret_in_every_dump(tmp_path):
    data = {**MINIMAL, "candidate": {"api_key": "sk-secret", "env": {"HF_TOKEN": "hf_x"}}}
    scenario = load_scenario(write(tmp_path, data))
    assert scenario.candidate.api_key.get_secret_value() == "sk-secret"
    dumped = scenario.model_dump_json() + repr(scenario.candidate.api_key)
    assert "sk-secret" not in dumped and "hf_x" not in dumped


def test_a_secret_flag_in_serve_args_is_refused(tmp_path):
    data = {**MINIMAL, "reference": {"serve_args": ["--api-key", "sk-secret"]}}
    message = error_of(write(tmp_path, data))
    assert "reference.serve_args" in message and "VLLM_API_KEY" in message


def test_a_drift_floor_factor_needs_an_aa_control_or_a_calibration(tmp_path):
    data = {**MINIMAL, "gates": {"max_drift_over_floor": 3}}
    assert "gates.max_drift_over_floor needs a floor" in error_of(write(tmp_path, data))
    for extra in (
        {"control": {"aa": True}},
        {"gates": {"max_drift_over_floor": 3, "calibration_drift": 0.01}},
    ):
        assert load_scenario(write(tmp_path, {**data, **extra})).gates.max_drift_over_floor == 3


def test_waves_cannot_also_follow_a_request_rate(tmp_path):
    workload = {"prompts": [{"long_tokens": [10]}], "concurrency": [4], "arrival": "waves"}
    assert load_scenario(write(tmp_path, {"workload": workload})).workload.arrival == "waves"
    workload["request_rate"] = 5.0
    assert "cannot also follow request_rate" in error_of(write(tmp_path, {"workload": workload}))


def test_require_initial_state_is_a_bool_and_needs_both_sides_proof(tmp_path):
    path = write(tmp_path, {**MINIMAL, "gates": {"require_initial_state": True}})
    assert load_scenario(path).gates.require_initial_state
    assert not load_scenario(write(tmp_path, MINIMAL)).gates.require_initial_state
    assert "gates.require_initial_state" in error_of(
        write(tmp_path, {**MINIMAL, "gates": {"require_initial_state": "sometimes"}})
    )
    refused = {**MINIMAL, "gates": {"require_initial_state": True}, "reference": {"proof": "none"}}
    assert "needs both sides' kernel proof: reference.proof: none" in error_of(
        write(tmp_path, refused)
    )


def test_sides_serve_alike_unless_what_they_serve_differs():
    """Where a side runs and how it is reached do not make it serve differently; every other
    key does, a key added later included."""
    from rig.records import Side
    from rig.scenario.config import SideConfig

    base = SideConfig()
    for where in ({"gpus": [1]}, {"port": 8123}, {"proof": "none"}, {"vllm_version": "0.26.0"}):
        assert base.serves_like(SideConfig(**where)), where
    for served in ({"kernel": "ns4"}, {"env": {"X": "1"}}, {"serve_args": ["--seed", "1"]}):
        assert not base.serves_like(SideConfig(**served)), served
    workload = {"prompts": [{"long_tokens": [100]}], "concurrency": [1]}
    scenario = Scenario.model_validate(
        {"name": "t", "workload": workload, "candidate": {"kernel": "ns4"}}
    )
    assert (
        scenario.side(Side.CANDIDATE).kernel == "ns4" and scenario.side("reference").kernel is None
    )
    with pytest.raises(ValueError):
        scenario.side("reference-1")
