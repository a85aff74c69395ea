from pathlib import Path

import pytest
import yaml

from rig import PROJECT_ROOT
from rig.scenario.config import TINY_MODEL, PromptSource, Scenario, ScenarioError
from rig.scenario.loader import apply_overrides, load_presets, load_scenario, parse_override
from rig.scenario.workload import resolve_prompts

REPO = PROJECT_ROOT
SHIPPED = sorted((REPO / "scenarios").glob("*.yaml"))

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
    monkeypatch.chdir(REPO)
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


def test_every_problem_is_listed_on_one_line(tmp_path):
    data = {"workload": {"prompts": [{"long_tokens": [10]}], "concurrency": [1], "bogus": 1}}
    data["model"] = {"dtype": 16}
    message = error_of(write(tmp_path, data))
    assert "unknown key 'workload.bogus'" in message
    assert "key 'model.dtype'" in message


def test_invalid_yaml_gives_the_line(tmp_path):
    path = write(tmp_path, "workload:\n  prompts: [1, 2\n  concurrency: [1]\n")
    message = error_of(path)
    assert "invalid YAML at line" in message


def test_tab_indentation_is_invalid_yaml(tmp_path):
    message = error_of(write(tmp_path, "workload:\n\tconcurrency: [1]\n"))
    assert "invalid YAML at line 2" in message


@pytest.mark.parametrize(("text", "kind"), [("- a\n- b\n", "list"), ("just words\n", "str")])
def test_non_mapping_is_rejected(tmp_path, text, kind):
    message = error_of(write(tmp_path, text))
    assert f"not a {kind}" in message


def test_empty_file_reports_the_missing_workload(tmp_path):
    assert "missing key 'workload'" in error_of(write(tmp_path, ""))


def test_missing_file(tmp_path):
    assert "not found" in error_of(tmp_path / "nope.yaml")


def test_directory_instead_of_a_file(tmp_path):
    assert "cannot read" in error_of(tmp_path)


def test_file_that_is_not_utf8(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("description: caf\xe9\n".encode("latin-1"))
    assert "UTF-8" in error_of(path)


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


def test_prompt_path_resolves_beside_the_scenario_file(tmp_path, monkeypatch):
    (tmp_path / "mine.jsonl").write_text('{"id": "a", "prompt": "x"}\n', encoding="utf-8")
    data = {"workload": {"prompts": [{"path": "mine.jsonl"}], "concurrency": [1]}}
    path = write(tmp_path, data)
    monkeypatch.chdir(REPO)  # the prompt file is not under the working directory
    scenario = load_scenario(path)
    assert scenario.workload.prompts[0].path == tmp_path / "mine.jsonl"


# --- model shorthand ---------------------------------------------------------------------------


def test_model_string_is_the_name(tmp_path):
    scenario = load_scenario(write(tmp_path, {**MINIMAL, "model": "Qwen/Qwen3.5-397B-A17B-FP8"}))
    assert scenario.model.name == "Qwen/Qwen3.5-397B-A17B-FP8"
    assert not scenario.model.is_tiny
    assert scenario.model.dtype == "bfloat16"  # the rest keeps its defaults


def test_model_shorthand_from_the_command_line(tmp_path):
    path = write(tmp_path, {**MINIMAL, "model": {"name": "tiny", "dtype": "float32"}})
    scenario = load_scenario(path, ["model=org/some-model"])
    assert scenario.model.name == "org/some-model"
    # --set model=X names the model: the file's other model keys stay (make e2e MODEL=... TP=2).
    assert scenario.model.dtype == "float32"


# --- --set overrides ---------------------------------------------------------------------------


def test_parse_override_types_values_as_yaml():
    assert parse_override("workload.max_tokens=64") == (["workload", "max_tokens"], 64)
    assert parse_override("drift.enabled=false") == (["drift", "enabled"], False)
    assert parse_override("workload.concurrency=[1, 8]") == (["workload", "concurrency"], [1, 8])
    assert parse_override("model.name=org/m") == (["model", "name"], "org/m")
    assert parse_override("a.b=") == (["a", "b"], "")
    assert parse_override("x=a=b") == (["x"], "a=b")


@pytest.mark.parametrize("text", ["noequals", "=5", "  =5"])
def test_parse_override_needs_a_key_and_an_equals_sign(text):
    with pytest.raises(ScenarioError, match="expected dotted.key=value"):
        parse_override(text)


def test_parse_override_rejects_invalid_yaml_values():
    with pytest.raises(ScenarioError, match="not valid YAML"):
        parse_override("workload.concurrency=[1, 2")


def test_overrides_beat_the_file(tmp_path):
    path = write(tmp_path, {**MINIMAL, "workload": {**MINIMAL["workload"], "max_tokens": 8}})
    scenario = load_scenario(
        path,
        ["workload.max_tokens=32", "workload.concurrency=[2, 4]", "gates.max_mean_drift=null"],
    )
    assert scenario.workload.max_tokens == 32
    assert scenario.workload.concurrency == [2, 4]
    assert scenario.gates.max_mean_drift is None


def test_later_override_wins():
    data = apply_overrides({}, ["a.b=1", "a.b=2"])
    assert data == {"a": {"b": 2}}


def test_overrides_create_missing_mappings(tmp_path):
    scenario = load_scenario(
        write(tmp_path, MINIMAL), ["candidate.env.RIG_GDN_KERNEL=ns3", "control.aa=true"]
    )
    assert scenario.candidate.env == {"RIG_GDN_KERNEL": "ns3"}
    assert scenario.control.aa is True


def test_override_fills_a_null_section(tmp_path):
    path = write(tmp_path, "drift:\nworkload: {prompts: [{long_tokens: [9]}], concurrency: [1]}\n")
    assert load_scenario(path, ["drift.max_requests=3"]).drift.max_requests == 3


def test_override_through_a_scalar_is_an_error(tmp_path):
    path = write(tmp_path, {**MINIMAL, "description": "text"})
    with pytest.raises(ScenarioError, match="'description' is not a mapping"):
        load_scenario(path, ["description.dtype=float16"])


def test_override_inside_a_model_given_by_name_alone(tmp_path):
    path = write(tmp_path, {**MINIMAL, "model": "org/m"})
    scenario = load_scenario(path, ["model.dtype=float16"])
    assert (scenario.model.name, scenario.model.dtype) == ("org/m", "float16")


def test_override_with_an_unknown_key_is_named(tmp_path):
    message = error_of(write(tmp_path, MINIMAL), ["workload.max_tokenz=3"])
    assert "unknown key 'workload.max_tokenz'" in message


def test_override_with_a_wrong_type_is_named(tmp_path):
    message = error_of(write(tmp_path, MINIMAL), ["workload.concurrency=[1, 0]"])
    assert "key 'workload.concurrency.1'" in message


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


def test_every_preset_validates_as_a_scenario_model(tmp_path):
    presets = load_presets()
    assert {"qwen3.5-397b-fp8", "qwen3-next-80b-instruct"} <= set(presets)
    for preset in presets.values():
        scenario = load_scenario(write(tmp_path, MINIMAL), [f"model={preset.model['name']}"])
        assert scenario.model.preset == preset.key


@pytest.mark.parametrize(
    "name", ["Qwen3.5-397B", "qwen3.5-397b", "Qwen/Qwen3.5-397B-A17B-FP8", "Qwen3.5-397B-A17B"]
)
def test_a_preset_name_resolves_to_the_hub_id_and_the_seeds_serving_setup(tmp_path, name):
    scenario = load_scenario(write(tmp_path, MINIMAL), [f"model={name}"])
    model = scenario.model
    assert model.name == "Qwen/Qwen3.5-397B-A17B-FP8"
    assert model.preset == "qwen3.5-397b-fp8"
    assert model.tensor_parallel_size == 2
    assert (model.max_num_batched_tokens, model.max_num_seqs) == (10240, 220)
    assert model.api_concurrency_limit == 256
    assert not any("speculative" in arg for arg in model.serve_args)  # MTP off
    assert scenario.workload.chat_template_kwargs == {"enable_thinking": False}


def test_set_beats_the_scenario_file_which_beats_the_preset(tmp_path):
    data = {**MINIMAL, "model": {"name": "Qwen3.5-397B", "max_num_seqs": 64}}
    path = write(tmp_path, data)
    scenario = load_scenario(path)
    assert scenario.model.max_num_seqs == 64 and scenario.model.tensor_parallel_size == 2
    scenario = load_scenario(path, ["model.tensor_parallel_size=4", "model.max_num_seqs=8"])
    assert (scenario.model.tensor_parallel_size, scenario.model.max_num_seqs) == (4, 8)
    # --set model=X names the model and keeps the other model keys of the file
    scenario = load_scenario(
        write(tmp_path, {**MINIMAL, "model": {"max_model_len": 512}}), ["model=Qwen3-Next-80B"]
    )
    assert scenario.model.name == "Qwen/Qwen3-Next-80B-A3B-Instruct"
    assert scenario.model.max_model_len == 512


def test_a_model_without_preset_is_taken_as_written(tmp_path):
    scenario = load_scenario(write(tmp_path, MINIMAL), ["model=org/other-model"])
    assert scenario.model.name == "org/other-model" and scenario.model.preset is None
    assert scenario.model.tensor_parallel_size == 1


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
